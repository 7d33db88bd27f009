//! # mr_cache — memory registrations for rdmx
//!
//! Three parts:
//! - the key table behind `fi_mr_reg` ([`KeyTable`]): provider-chosen or
//!   user-chosen keys mapped to exactly the registered segments, with the access
//!   checks of RMA emulation. Its segments are watched by the unmap monitor:
//!   memory the application unmaps while its registration is still open is
//!   revoked, so a remote access through the key fails instead of writing into
//!   a hole (a crash of the target) or into whatever is mapped there now (a
//!   NIC's registration pins the old pages and never reaches new memory
//!   either);
//! - the registration cache ([`cache::MrCache`]): interval lookup, reference
//!   counts, an LRU of unused entries under count and byte limits, and
//!   invalidation of unmapped ranges, over a device [`cache::Registrar`];
//! - the unmap monitor ([`monitor::Monitor`]): userfaultfd events of unmapped
//!   and dropped pages, and the argument why no lookup returns a registration
//!   of memory unmapped before it began.
#![forbid(unsafe_code)]

pub mod cache;
pub mod monitor;
mod watch;

use monitor::{Changes, Monitor};
use std::collections::HashMap;

/// One contiguous range of the application's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub addr: u64,
    pub len: u64,
}

/// One registration: exactly its segments, never the span between them (a peer
/// holding the key must not reach memory the application did not register).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// In registration order: without `FI_MR_VIRT_ADDR` the registration's byte
    /// space is these segments back to back.
    pub segments: Vec<Segment>,
    pub access: u64,
    /// Without `FI_MR_VIRT_ADDR`: the remote address of the registration's first
    /// byte (`fi_mr_reg`'s `offset`); remote address `a` names byte `a - offset`.
    pub offset: u64,
    /// The jobs (their keys) whose peers may reach it, when the registration
    /// names them (`FI_AV_AUTH_KEY` domains); `None`: every job the
    /// endpoint serves.
    pub reachable_by: Option<Vec<u64>>,
}

impl Region {
    /// A one-segment registration at offset 0.
    pub fn contiguous(addr: u64, len: u64, access: u64) -> Region {
        Region { segments: vec![Segment { addr, len }], access, offset: 0, reachable_by: None }
    }

    /// Bytes registered (the sum of the segments).
    pub fn len(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces of local memory that remote access `[addr, addr+len)` touches,
    /// in order; an error unless every byte is inside a segment. With
    /// `virt_addr`, `addr` is a virtual address and must lie in the segments
    /// themselves (one contiguous piece); otherwise it is `offset` plus a
    /// position in the segments laid back to back, and may span several.
    pub fn resolve(&self, addr: u64, len: u64, virt_addr: bool) -> Result<Vec<Segment>, MrError> {
        let out_of_range = MrError::OutOfRange { addr, len };
        let end = addr.checked_add(len).ok_or(out_of_range.clone())?;
        if len == 0 {
            return Ok(Vec::new());
        }
        if virt_addr {
            // Segments may overlap or come in any order: covered iff, walking from
            // `addr`, some segment always extends the covered prefix.
            let mut covered = addr;
            loop {
                let next = self
                    .segments
                    .iter()
                    .filter(|s| s.addr <= covered && s.addr.saturating_add(s.len) > covered)
                    .map(|s| s.addr.saturating_add(s.len))
                    .max();
                match next {
                    Some(e) if e >= end => return Ok(vec![Segment { addr, len }]),
                    Some(e) => covered = e,
                    None => return Err(out_of_range),
                }
            }
        }
        let mut pos = addr.checked_sub(self.offset).ok_or(out_of_range.clone())?;
        let mut left = len;
        let mut pieces = Vec::new();
        for s in &self.segments {
            if left == 0 {
                break;
            }
            if pos >= s.len {
                pos -= s.len;
                continue;
            }
            let n = (s.len - pos).min(left);
            pieces.push(Segment { addr: s.addr + pos, len: n });
            left -= n;
            pos = 0;
        }
        if left > 0 {
            return Err(out_of_range);
        }
        Ok(pieces)
    }
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum MrError {
    #[error("key {0:#x} is already in use")]
    KeyInUse(u64),
    #[error("no registration with key {0:#x}")]
    NoKey(u64),
    #[error("access [{addr:#x}, +{len}) is outside the registration")]
    OutOfRange { addr: u64, len: u64 },
    #[error("registration does not allow this access")]
    Access,
    #[error("the memory of key {0:#x} was unmapped while registered")]
    Unmapped(u64),
}

/// A registration in the table, with what the monitor knows of its memory.
#[derive(Debug)]
struct Registered {
    region: Region,
    /// Segments the monitor watches (unwatch them at removal).
    watched: Vec<Segment>,
    /// Some of its memory was unmapped: every access through the key fails.
    unmapped: bool,
}

/// Keys to registered regions.
pub struct KeyTable {
    regions: HashMap<u64, Registered>,
    next_key: u64,
    monitor: &'static Monitor,
    /// How far into the monitor's log this table has applied.
    seen: u64,
    /// Registrations revoked because their memory was unmapped.
    revoked_by_unmap: u64,
}

impl KeyTable {
    /// An empty table whose registrations `monitor` watches (normally
    /// [`Monitor::global`]).
    pub fn new(monitor: &'static Monitor) -> Self {
        KeyTable { regions: HashMap::new(), next_key: 1, seen: monitor.position(), monitor, revoked_by_unmap: 0 }
    }

    /// Registers `region`. With `requested_key` the user chooses the key (must be
    /// unique); without it the table picks one.
    pub fn insert(&mut self, region: Region, requested_key: Option<u64>) -> Result<u64, MrError> {
        let key = match requested_key {
            Some(k) => {
                if self.regions.contains_key(&k) {
                    return Err(MrError::KeyInUse(k));
                }
                k
            }
            None => {
                while self.regions.contains_key(&self.next_key) {
                    self.next_key = self.next_key.wrapping_add(1);
                }
                let k = self.next_key;
                self.next_key = self.next_key.wrapping_add(1);
                k
            }
        };
        // Memory the monitor cannot watch (file-backed mappings, a kernel
        // without userfaultfd) is registered all the same, unprotected as
        // before: unmapping it under an open registration is the
        // application's error, which libfabric leaves undefined.
        let watched: Vec<Segment> =
            region.segments.iter().copied().filter(|s| self.monitor.watch(s.addr, s.len)).collect();
        self.regions.insert(key, Registered { region, watched, unmapped: false });
        Ok(key)
    }

    /// A non-empty segment of `key`'s registration that the unmap monitor
    /// does not watch (file-backed, watched by another userfaultfd, or no
    /// monitor at all): unmapping it while registered will not revoke the key.
    pub fn unwatched_segment(&self, key: u64) -> Option<Segment> {
        let r = self.regions.get(&key)?;
        r.region.segments.iter().find(|s| s.len > 0 && !r.watched.contains(s)).copied()
    }

    pub fn remove(&mut self, key: u64) -> Result<Region, MrError> {
        let r = self.regions.remove(&key).ok_or(MrError::NoKey(key))?;
        for s in &r.watched {
            self.monitor.unwatch(s.addr, s.len);
        }
        Ok(r.region)
    }

    /// The registration behind `key`.
    pub fn get(&self, key: u64) -> Option<&Region> {
        self.regions.get(&key).map(|r| &r.region)
    }

    /// Checks a remote access through `key`: the registration allows `access`,
    /// covers every byte of `[addr, addr+len)` (see [`Region::resolve`]), and
    /// none of its memory was unmapped before this check began (the monitor's
    /// log is applied first, with the argument of the monitor module).
    /// Returns the local pieces to copy to or from, in order.
    pub fn check(
        &mut self,
        key: u64,
        addr: u64,
        len: u64,
        access: u64,
        virt_addr: bool,
    ) -> Result<Vec<Segment>, MrError> {
        self.sync();
        let r = self.regions.get(&key).ok_or(MrError::NoKey(key))?;
        if r.unmapped {
            return Err(MrError::Unmapped(key));
        }
        if r.region.access & access != access {
            return Err(MrError::Access);
        }
        r.region.resolve(addr, len, virt_addr)
    }

    /// Applies the monitor's log: registrations overlapping unmapped memory are
    /// revoked (the key stays taken until the application closes it).
    pub fn sync(&mut self) {
        if !self.monitor.may_have_changes(self.seen) {
            return;
        }
        let mut buf = [(0, 0); monitor::LOG_CAPACITY];
        let ranges: &[(u64, u64)] = match self.monitor.changes_since(&mut self.seen, &mut buf) {
            None => return,
            Some(Changes::Ranges(n)) => &buf[..n],
            Some(Changes::Everything) => &[(0, u64::MAX)],
        };
        for r in self.regions.values_mut() {
            if r.unmapped {
                continue;
            }
            let hit = r
                .watched
                .iter()
                .any(|s| ranges.iter().any(|&(start, end)| s.addr < end && s.addr.saturating_add(s.len) > start));
            if hit {
                r.unmapped = true;
                self.revoked_by_unmap += 1;
            }
        }
    }

    /// Registrations revoked because their memory was unmapped.
    pub fn revoked_by_unmap(&self) -> u64 {
        self.revoked_by_unmap
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

impl Drop for KeyTable {
    fn drop(&mut self) {
        for r in self.regions.values() {
            for s in &r.watched {
                self.monitor.unwatch(s.addr, s.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manual() -> &'static Monitor {
        Box::leak(Box::new(Monitor::manual()))
    }

    #[test]
    fn user_keys_must_be_unique_and_ranges_are_checked() {
        let mut t = KeyTable::new(manual());
        let r = Region::contiguous(0x1000, 0x100, 3);
        assert_eq!(t.insert(r.clone(), Some(7)), Ok(7));
        assert_eq!(t.insert(r.clone(), Some(7)), Err(MrError::KeyInUse(7)));
        let k = t.insert(r, None).expect("prov key");
        assert_ne!(k, 7);
        assert!(t.check(7, 0x1000, 0x100, 1, true).is_ok());
        assert_eq!(t.check(7, 0x1001, 0x100, 1, true), Err(MrError::OutOfRange { addr: 0x1001, len: 0x100 }));
        assert_eq!(t.check(7, 0x1000, 1, 4, true), Err(MrError::Access));
        assert_eq!(t.check(99, 0x1000, 1, 1, true), Err(MrError::NoKey(99)));
        assert_eq!(t.remove(7).map(|r| r.len()), Ok(0x100));
        assert_eq!(t.remove(7), Err(MrError::NoKey(7)));
    }

    #[test]
    fn an_unmap_of_any_segment_revokes_the_key_until_it_is_closed() {
        let monitor = manual();
        let mut t = KeyTable::new(monitor);
        let k = t.insert(two_segments(), None).unwrap();
        let other = t.insert(Region::contiguous(0x8000, 0x1000, 3), None).unwrap();
        assert!(t.check(k, 0x1000, 0x10, 1, true).is_ok());
        monitor.record(0x3000, 0x4000); // the second segment's page
        assert_eq!(
            t.check(k, 0x1000, 0x10, 1, true),
            Err(MrError::Unmapped(k)),
            "the whole key, not just that segment"
        );
        assert!(t.check(other, 0x8000, 0x10, 1, true).is_ok(), "other keys are untouched");
        assert_eq!(t.revoked_by_unmap(), 1);
        assert_eq!(
            t.insert(Region::contiguous(0, 1, 1), Some(k)),
            Err(MrError::KeyInUse(k)),
            "still the application's key"
        );
        assert!(t.remove(k).is_ok());
        assert_eq!(monitor.watched_runs(), 2, "only `other`'s pages stay watched");
    }

    fn two_segments() -> Region {
        Region {
            segments: vec![Segment { addr: 0x1000, len: 0x100 }, Segment { addr: 0x3000, len: 0x80 }],
            access: 3,
            offset: 0,
            reachable_by: None,
        }
    }

    #[test]
    fn virtual_addresses_reach_only_the_segments_never_the_gap() {
        let r = two_segments();
        assert_eq!(r.resolve(0x1000, 0x100, true), Ok(vec![Segment { addr: 0x1000, len: 0x100 }]));
        assert_eq!(r.resolve(0x3010, 0x70, true), Ok(vec![Segment { addr: 0x3010, len: 0x70 }]));
        // The gap between the segments, and accesses that straddle into it.
        for (a, l) in [(0x1100, 1), (0x2000, 0x10), (0x10f0, 0x20), (0x2ff0, 0x20), (0x3070, 0x20)] {
            assert_eq!(r.resolve(a, l, true), Err(MrError::OutOfRange { addr: a, len: l }), "{a:#x}+{l:#x}");
        }
        // Adjacent or overlapping segments cover their union.
        let joined = Region {
            segments: vec![
                Segment { addr: 0x2000, len: 0x100 },
                Segment { addr: 0x1f80, len: 0x80 },
                Segment { addr: 0x2080, len: 0x100 },
            ],
            access: 3,
            offset: 0,
            reachable_by: None,
        };
        assert_eq!(joined.resolve(0x1f80, 0x200, true), Ok(vec![Segment { addr: 0x1f80, len: 0x200 }]));
        assert!(joined.resolve(0x1f80, 0x201, true).is_err());
    }

    #[test]
    fn offsets_address_the_segments_back_to_back_from_the_requested_offset() {
        let mut r = two_segments();
        r.offset = 0x10_000;
        assert_eq!(r.resolve(0x10_000, 0x10, false), Ok(vec![Segment { addr: 0x1000, len: 0x10 }]));
        assert_eq!(
            r.resolve(0x10_0f0, 0x20, false),
            Ok(vec![Segment { addr: 0x10f0, len: 0x10 }, Segment { addr: 0x3000, len: 0x10 }]),
            "an access spanning the boundary continues in the next segment, skipping the gap"
        );
        assert_eq!(r.resolve(0x10_100, 0x80, false), Ok(vec![Segment { addr: 0x3000, len: 0x80 }]));
        assert!(r.resolve(0x10_100, 0x81, false).is_err(), "past the last segment");
        assert!(r.resolve(0xffff, 1, false).is_err(), "below the offset");
        assert_eq!(r.resolve(u64::MAX, 2, false), Err(MrError::OutOfRange { addr: u64::MAX, len: 2 }));
    }
}
