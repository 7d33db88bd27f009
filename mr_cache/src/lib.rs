//! # mr_cache — memory registrations for rdmx
//!
//! Today: the key table behind `fi_mr_reg` ([`KeyTable`]): provider-chosen or
//! user-chosen keys mapped to registered ranges, with access checks used by RMA
//! emulation. The interval cache with LRU and userfaultfd invalidation (ROADMAP) will
//! sit beside it; registration goes through this crate so that it can.
#![forbid(unsafe_code)]

use std::collections::HashMap;

/// One registered range of the application's address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub addr: u64,
    pub len: u64,
    pub access: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MrError {
    #[error("key {0:#x} is already in use")]
    KeyInUse(u64),
    #[error("no registration with key {0:#x}")]
    NoKey(u64),
    #[error("access [{addr:#x}, +{len}) is outside the registration")]
    OutOfRange { addr: u64, len: u64 },
    #[error("registration does not allow this access")]
    Access,
}

/// Keys to registered regions.
#[derive(Debug, Default)]
pub struct KeyTable {
    regions: HashMap<u64, Region>,
    next_key: u64,
}

impl KeyTable {
    pub fn new() -> Self {
        KeyTable { regions: HashMap::new(), next_key: 1 }
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
        self.regions.insert(key, region);
        Ok(key)
    }

    pub fn remove(&mut self, key: u64) -> Result<Region, MrError> {
        self.regions.remove(&key).ok_or(MrError::NoKey(key))
    }

    /// The registration behind `key`.
    pub fn get(&self, key: u64) -> Option<Region> {
        self.regions.get(&key).copied()
    }

    /// Checks that `[addr, addr+len)` lies inside the region of `key` and that the
    /// region allows `access`; returns the region.
    pub fn check(&self, key: u64, addr: u64, len: u64, access: u64) -> Result<Region, MrError> {
        let r = self.regions.get(&key).ok_or(MrError::NoKey(key))?;
        if r.access & access != access {
            return Err(MrError::Access);
        }
        let end = addr.checked_add(len).ok_or(MrError::OutOfRange { addr, len })?;
        if addr < r.addr || end > r.addr.saturating_add(r.len) {
            return Err(MrError::OutOfRange { addr, len });
        }
        Ok(*r)
    }

    pub fn len(&self) -> usize {
        self.regions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_must_be_unique_and_ranges_are_checked() {
        let mut t = KeyTable::new();
        let r = Region { addr: 0x1000, len: 0x100, access: 3 };
        assert_eq!(t.insert(r, Some(7)), Ok(7));
        assert_eq!(t.insert(r, Some(7)), Err(MrError::KeyInUse(7)));
        let k = t.insert(r, None).expect("prov key");
        assert_ne!(k, 7);
        assert!(t.check(7, 0x1000, 0x100, 1).is_ok());
        assert_eq!(t.check(7, 0x1001, 0x100, 1), Err(MrError::OutOfRange { addr: 0x1001, len: 0x100 }));
        assert_eq!(t.check(7, 0x1000, 1, 4), Err(MrError::Access));
        assert_eq!(t.check(99, 0x1000, 1, 1), Err(MrError::NoKey(99)));
        assert_eq!(t.remove(7).map(|r| r.len), Ok(0x100));
        assert_eq!(t.remove(7), Err(MrError::NoKey(7)));
    }
}
