//! The registration cache: a lookup of `(address, length, access)` that returns
//! a cached registration covering the request, so the data path pays a device
//! registration (tens of microseconds on a NIC) once per buffer, not per
//! message.
//!
//! Policy:
//! - **Coverage, no merging.** A request is served by any valid cached entry
//!   whose range covers it and whose access includes the requested access. When
//!   none does, exactly the requested range is registered as a new entry;
//!   overlapping entries coexist. (Merging would register memory the
//!   application never asked for, and a merged entry's lifetime would tie
//!   unrelated buffers together.)
//! - **References.** [`MrCache::acquire`] returns an entry in use;
//!   [`MrCache::release`] gives it back. Only unused entries are evicted.
//! - **LRU and limits.** Unused entries are kept, least recently released
//!   first out, while the cache holds at most `max_count` entries and
//!   `max_bytes` bytes; entries in use count toward the limits but are never
//!   evicted (the limits may be exceeded while they are in use).
//! - **A cap on one entry.** A request longer than `max_entry_bytes` is
//!   registered for that use only and deregistered at its release, never
//!   cached: one huge buffer (a large alltoall's) would otherwise push every
//!   smaller, reused registration out of the byte limit, and the next round
//!   would register them all again (EFA's lesson: large alltoalls thrash a
//!   cache that keeps everything).
//! - **Invalidation.** [`MrCache::invalidate`] (called by the unmap monitor for
//!   every unmap, remap and `MADV_DONTNEED` of a range) removes every entry that
//!   overlaps the range from the index at once, so no later lookup can return
//!   it; an entry still in use is deregistered when its last user releases it
//!   (deferred deregistration).
//!
//! - **Only watched memory is cached.** On a miss the cache asks the unmap
//!   [`Monitor`] to watch the range *before* registering it (an unmap between
//!   the two is then reported, never missed); memory the monitor cannot watch
//!   is registered for this use only and deregistered at its release.
//!
//! The guarantee that matters: **a lookup never returns a registration whose
//! pages were unmapped before the lookup began.** Every acquire and release
//! first applies the monitor's log of unmapped ranges; the monitor module
//! explains why an unmap that returned before the lookup began is always in
//! that log by then. Invalidation removes entries from the index under the
//! same `&mut self` a lookup needs, so a lookup sees the index with or without
//! an entry, never half of an update.
use slab::Slab;
use std::collections::BTreeMap;

use crate::monitor::{Changes, Monitor};

/// The device side: registers and deregisters memory. Verbs, SRD and the
/// emulated RMA keys implement it; tests use a model.
pub trait Registrar {
    type Handle;
    type Error;
    fn register(&mut self, addr: u64, len: u64, access: u64) -> Result<Self::Handle, Self::Error>;
    fn deregister(&mut self, handle: Self::Handle);
    /// Whether `error` says a limit was reached (the pinned-memory limit, the
    /// device's table of registrations full: `ENOMEM`, `EAGAIN`), which giving
    /// back unused registrations may cure. Other failures (an address that is
    /// not mapped) leave the cache as it is.
    fn exhausted(error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    /// Off: every acquire registers and every release deregisters.
    pub enabled: bool,
    pub max_count: usize,
    pub max_bytes: u64,
    /// Longest registration the cache keeps; longer ones are per use.
    pub max_entry_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        // One entry may take an eighth of the bytes: a buffer that large is
        // rare enough that registering it per use costs little against its
        // transfer, and it cannot evict more than an eighth of the cache.
        CacheConfig { enabled: true, max_count: 1024, max_bytes: 1 << 30, max_entry_bytes: 1 << 27 }
    }
}

/// Counters (monotonic but `bytes_cached`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub invalidations: u64,
    /// Times the cache fell behind the monitor's log and dropped everything.
    pub flushes: u64,
    /// Registrations of memory the monitor cannot watch (registered per use).
    pub uncached: u64,
    /// Registrations longer than `max_entry_bytes` (registered per use).
    pub oversize: u64,
    /// Registrations the device refused (memlock or device limits, `ENOMEM`),
    /// the retry after evicting the unused entries included.
    pub register_failures: u64,
    /// Bytes of the entries in the cache now.
    pub bytes_cached: u64,
}

/// An entry handed out by [`MrCache::acquire`]; give it back with
/// [`MrCache::release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId(usize);

struct Entry<H> {
    addr: u64,
    len: u64,
    access: u64,
    handle: Option<H>,
    refs: u32,
    /// Still in the index (not invalidated).
    indexed: bool,
    /// The monitor watches its pages for it (unwatch when it goes).
    watched: bool,
    /// Links in the LRU list of unused entries (intrusive: O(1) moves).
    in_lru: bool,
    prev: Option<usize>,
    next: Option<usize>,
}

pub struct MrCache<R: Registrar> {
    reg: R,
    cfg: CacheConfig,
    entries: Slab<Entry<R::Handle>>,
    /// Indexed entries by start address (several may share a start).
    by_start: BTreeMap<(u64, usize), ()>,
    /// Longest indexed entry: how far left a covering entry can start.
    max_len: u64,
    /// Unused indexed entries, least recently released at the head.
    lru_head: Option<usize>,
    lru_tail: Option<usize>,
    count: usize,
    stats: CacheStats,
    monitor: &'static Monitor,
    /// How far into the monitor's log this cache has applied.
    seen: u64,
}

impl<R: Registrar> MrCache<R> {
    /// A cache over `reg`, told of unmaps by `monitor` (normally
    /// [`Monitor::global`]).
    pub fn new(reg: R, cfg: CacheConfig, monitor: &'static Monitor) -> Self {
        MrCache {
            seen: monitor.position(),
            monitor,
            reg,
            cfg,
            entries: Slab::new(),
            by_start: BTreeMap::new(),
            max_len: 0,
            lru_head: None,
            lru_tail: None,
            count: 0,
            stats: CacheStats::default(),
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn registrar(&self) -> &R {
        &self.reg
    }

    /// Entries in the cache (in use or not), not counting invalidated ones
    /// still in use.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The device handle of an acquired entry.
    pub fn handle(&self, id: EntryId) -> Option<&R::Handle> {
        self.entries.get(id.0).and_then(|e| e.handle.as_ref())
    }

    /// The range an acquired entry covers.
    pub fn range(&self, id: EntryId) -> Option<(u64, u64)> {
        self.entries.get(id.0).map(|e| (e.addr, e.len))
    }

    /// A registration covering `[addr, addr+len)` with at least `access`: a
    /// cached one (a hit), or a new one (a miss).
    pub fn acquire(&mut self, addr: u64, len: u64, access: u64) -> Result<EntryId, R::Error> {
        self.sync();
        let end = addr.saturating_add(len);
        if self.cfg.enabled {
            let lo = addr.saturating_sub(self.max_len);
            let found = self.by_start.range((lo, 0)..=(addr, usize::MAX)).rev().map(|(&(_, id), _)| id).find(|&id| {
                let e = &self.entries[id];
                e.addr <= addr && e.addr.saturating_add(e.len) >= end && e.access & access == access
            });
            if let Some(id) = found {
                self.lru_unlink(id);
                self.entries[id].refs += 1;
                self.stats.hits += 1;
                return Ok(EntryId(id));
            }
        }
        self.stats.misses += 1;
        // Watch first: an unmap from here on is in the log, so the next lookup
        // drops this entry if it races with the registration below.
        let oversize = len > self.cfg.max_entry_bytes;
        let watched = self.cfg.enabled && !oversize && self.monitor.watch(addr, len);
        let handle = match self.register_evicting(addr, len, access) {
            Ok(h) => h,
            Err(e) => {
                if watched {
                    self.monitor.unwatch(addr, len);
                }
                return Err(e);
            }
        };
        if self.cfg.enabled && oversize {
            self.stats.oversize += 1;
        } else if self.cfg.enabled && !watched {
            self.stats.uncached += 1;
        }
        let id = self.entries.insert(Entry {
            addr,
            len,
            access,
            handle: Some(handle),
            refs: 1,
            indexed: watched,
            watched,
            in_lru: false,
            prev: None,
            next: None,
        });
        if watched {
            self.by_start.insert((addr, id), ());
            self.max_len = self.max_len.max(len);
            self.count += 1;
            self.stats.bytes_cached += len;
            self.evict();
        }
        Ok(EntryId(id))
    }

    /// Gives back an acquired entry. An unused entry stays cached (LRU) unless
    /// it was invalidated or the cache is off, then it is deregistered now.
    pub fn release(&mut self, id: EntryId) {
        self.sync();
        let Some(e) = self.entries.get_mut(id.0) else { return };
        if e.refs == 0 {
            return;
        }
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        if !e.indexed {
            self.drop_entry(id.0);
            return;
        }
        self.lru_push_back(id.0);
        self.evict();
    }

    /// Removes every entry overlapping `[addr, addr+len)` (unmapped or remapped
    /// memory): no later lookup returns it; unused ones are deregistered now,
    /// used ones at their last release.
    pub fn invalidate(&mut self, addr: u64, len: u64) {
        let end = addr.saturating_add(len);
        let lo = addr.saturating_sub(self.max_len);
        let hit: Vec<usize> = self
            .by_start
            .range((lo, 0)..(end, 0))
            .map(|(&(_, id), _)| id)
            .filter(|&id| {
                let e = &self.entries[id];
                e.addr < end && e.addr.saturating_add(e.len) > addr
            })
            .collect();
        for id in hit {
            self.unindex(id);
            self.stats.invalidations += 1;
            if self.entries[id].refs == 0 {
                self.drop_entry(id);
            }
        }
    }

    /// Applies the monitor's log: drops entries over memory unmapped since the
    /// last call. Acquire and release call it; call it when idle to give back
    /// registrations of freed memory sooner.
    pub fn sync(&mut self) {
        if !self.monitor.may_have_changes(self.seen) {
            return;
        }
        // On the stack, not under any lock: invalidating deregisters, and that
        // may free (and so unmap) memory, which must not happen while the
        // monitor's log is locked (see the monitor module on deadlocks).
        let mut buf = [(0, 0); crate::monitor::LOG_CAPACITY];
        match self.monitor.changes_since(&mut self.seen, &mut buf) {
            None => {}
            Some(Changes::Ranges(len)) => {
                for &(start, end) in &buf[..len] {
                    self.invalidate(start, end.saturating_sub(start));
                }
            }
            Some(Changes::Everything) => {
                self.stats.flushes += 1;
                self.invalidate(0, u64::MAX);
            }
        }
    }

    /// Registers with the device; when it refuses for a limit reached
    /// ([`Registrar::exhausted`]: memlock or device limit, `ENOMEM`) and unused
    /// registrations are cached, gives all of them back and tries once more: pinned memory nobody uses must never
    /// make a transfer fail. The caller falls back (a windowed rendezvous)
    /// only when that fails too.
    fn register_evicting(&mut self, addr: u64, len: u64, access: u64) -> Result<R::Handle, R::Error> {
        let first = match self.reg.register(addr, len, access) {
            Ok(h) => return Ok(h),
            Err(e) => e,
        };
        self.stats.register_failures += 1;
        if self.lru_head.is_none() || !R::exhausted(&first) {
            return Err(first);
        }
        while let Some(id) = self.lru_head {
            self.unindex(id);
            self.drop_entry(id);
            self.stats.evictions += 1;
        }
        self.reg.register(addr, len, access).inspect_err(|_| self.stats.register_failures += 1)
    }

    /// Evicts least recently released unused entries while over a limit.
    fn evict(&mut self) {
        while self.count > self.cfg.max_count || self.stats.bytes_cached > self.cfg.max_bytes {
            let Some(id) = self.lru_head else { break };
            self.unindex(id);
            self.drop_entry(id);
            self.stats.evictions += 1;
        }
    }

    fn unindex(&mut self, id: usize) {
        let e = &mut self.entries[id];
        if !e.indexed {
            return;
        }
        e.indexed = false;
        let (addr, len) = (e.addr, e.len);
        self.lru_unlink(id);
        self.by_start.remove(&(addr, id));
        self.count -= 1;
        self.stats.bytes_cached -= len;
    }

    fn lru_push_back(&mut self, id: usize) {
        let tail = self.lru_tail;
        let e = &mut self.entries[id];
        e.in_lru = true;
        e.prev = tail;
        e.next = None;
        match tail {
            Some(t) => self.entries[t].next = Some(id),
            None => self.lru_head = Some(id),
        }
        self.lru_tail = Some(id);
    }

    fn lru_unlink(&mut self, id: usize) {
        let e = &mut self.entries[id];
        if !e.in_lru {
            return;
        }
        e.in_lru = false;
        let (prev, next) = (e.prev.take(), e.next.take());
        match prev {
            Some(p) => self.entries[p].next = next,
            None => self.lru_head = next,
        }
        match next {
            Some(n) => self.entries[n].prev = prev,
            None => self.lru_tail = prev,
        }
    }

    fn drop_entry(&mut self, id: usize) {
        let e = self.entries.remove(id);
        if e.watched {
            self.monitor.unwatch(e.addr, e.len);
        }
        if let Some(h) = e.handle {
            self.reg.deregister(h);
        }
    }
}

impl<R: Registrar> Drop for MrCache<R> {
    /// Deregisters every entry and stops watching its pages (the owner drops
    /// the cache when nothing uses its registrations any more).
    fn drop(&mut self) {
        for e in self.entries.drain() {
            if e.watched {
                self.monitor.unwatch(e.addr, e.len);
            }
            if let Some(h) = e.handle {
                self.reg.deregister(h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    /// A registrar that tracks live handles and their ranges.
    #[derive(Default)]
    struct Model {
        next: u64,
        live: std::collections::HashMap<u64, (u64, u64, u64)>,
        registered: u64,
        /// At most this many live registrations (a device's or memlock's limit).
        limit: Option<usize>,
    }

    impl Registrar for Model {
        type Handle = u64;
        type Error = ();
        fn register(&mut self, addr: u64, len: u64, access: u64) -> Result<u64, ()> {
            if self.limit.is_some_and(|l| self.live.len() >= l) {
                return Err(());
            }
            self.next += 1;
            self.registered += 1;
            self.live.insert(self.next, (addr, len, access));
            Ok(self.next)
        }
        fn deregister(&mut self, h: u64) {
            assert!(self.live.remove(&h).is_some(), "handle {h} deregistered twice or never registered");
        }
        /// The model fails only at its limit.
        fn exhausted(_: &()) -> bool {
            true
        }
    }

    /// A monitor that watches everything and reports only what a test records.
    fn manual() -> &'static Monitor {
        Box::leak(Box::new(Monitor::manual()))
    }

    #[test]
    fn hit_miss_cover_and_access() {
        let mut c = MrCache::new(Model::default(), CacheConfig::default(), manual());
        let a = c.acquire(0x1000, 0x1000, 1).unwrap();
        c.release(a);
        let b = c.acquire(0x1100, 0x100, 1).unwrap();
        assert_eq!(a, b, "covered: a hit");
        assert_eq!(c.stats().hits, 1);
        let d = c.acquire(0x1100, 0x100, 3).unwrap();
        assert_ne!(d, b, "more access: a new registration");
        let e = c.acquire(0x1f00, 0x200, 1).unwrap();
        assert_ne!(e, b, "past the end: a new registration");
        assert_eq!(c.registrar().live.len(), 3);
    }

    #[test]
    fn invalidation_hides_entries_at_once_and_defers_deregistration_of_used_ones() {
        let mut c = MrCache::new(Model::default(), CacheConfig::default(), manual());
        let used = c.acquire(0x1000, 0x1000, 1).unwrap();
        let idle = c.acquire(0x4000, 0x1000, 1).unwrap();
        c.release(idle);
        c.invalidate(0x1800, 0x3000); // overlaps both
        assert_eq!(c.registrar().live.len(), 1, "the unused one is gone now");
        let again = c.acquire(0x1000, 0x100, 1).unwrap();
        assert_ne!(again, used, "an invalidated entry is never returned");
        c.release(used);
        assert_eq!(c.registrar().live.len(), 1, "the used one went at its release");
        assert_eq!(c.stats().invalidations, 2);
    }

    #[test]
    fn limits_evict_least_recently_released_unused_entries_only() {
        let mut c = MrCache::new(
            Model::default(),
            CacheConfig { enabled: true, max_count: 2, max_bytes: u64::MAX, max_entry_bytes: u64::MAX },
            manual(),
        );
        let held = c.acquire(0, 10, 1).unwrap();
        let a = c.acquire(100, 10, 1).unwrap();
        let b = c.acquire(200, 10, 1).unwrap();
        c.release(a);
        c.release(b);
        // Over the limit by one: `a` (released first) goes, `held` stays.
        assert_eq!(c.len(), 2);
        assert_eq!(c.stats().evictions, 1);
        assert_eq!(c.acquire(205, 1, 1).unwrap(), b, "b is still cached");
        assert!(c.handle(held).is_some());
    }

    #[test]
    fn a_refused_registration_evicts_the_unused_entries_and_retries() {
        let model = Model { limit: Some(2), ..Model::default() };
        let mut c = MrCache::new(model, CacheConfig::default(), manual());
        let a = c.acquire(0, 10, 1).unwrap();
        let b = c.acquire(100, 10, 1).unwrap();
        // Both in use: the device is full and nothing may be given back.
        assert!(c.acquire(200, 10, 1).is_err());
        assert_eq!((c.stats().register_failures, c.stats().evictions), (1, 0));
        assert!(c.handle(a).is_some() && c.handle(b).is_some(), "entries in use are never evicted");
        // One released: the next miss evicts it and registers.
        c.release(a);
        let d = c.acquire(300, 10, 1).expect("registered after evicting the unused entry");
        assert_eq!((c.stats().register_failures, c.stats().evictions), (2, 1));
        assert_eq!(c.registrar().live.len(), 2);
        assert!(c.handle(b).is_some() && c.handle(d).is_some());
        assert_ne!(c.acquire(5, 1, 1).ok(), Some(a), "the evicted entry is not served any more");
    }

    /// A registration longer than the cap serves its one use and goes at
    /// its release: it never pushes the reused small entries out.
    #[test]
    fn one_registration_longer_than_the_cap_is_per_use_and_evicts_nothing() {
        let cfg = CacheConfig { enabled: true, max_count: 4, max_bytes: 100, max_entry_bytes: 50 };
        let mut c = MrCache::new(Model::default(), cfg, manual());
        let small = c.acquire(0, 40, 1).unwrap();
        c.release(small);
        let big = c.acquire(1000, 80, 1).unwrap();
        assert_eq!(c.registrar().live.len(), 2);
        c.release(big);
        assert_eq!(c.registrar().live.len(), 1, "the long one is deregistered at its release");
        let big_again = c.acquire(1000, 80, 1).unwrap();
        c.release(big_again);
        assert_eq!(c.acquire(10, 10, 1).unwrap(), small, "the small entry survived both");
        let s = c.stats();
        assert_eq!((s.oversize, s.misses, s.hits, s.evictions, s.bytes_cached), (2, 3, 1, 0, 40));
        // At the cap exactly: cached.
        let at_cap = c.acquire(2000, 50, 1).unwrap();
        c.release(at_cap);
        assert_eq!(c.acquire(2000, 50, 1).unwrap(), at_cap);
    }

    #[test]
    fn unmaps_in_the_log_reach_the_next_lookup_and_a_cache_far_behind_flushes() {
        let monitor = manual();
        let mut c = MrCache::new(Model::default(), CacheConfig::default(), monitor);
        let a = c.acquire(0x1000, 0x1000, 1).unwrap();
        let first = *c.handle(a).unwrap();
        c.release(a);
        monitor.record(0x1000, 0x2000);
        let b = c.acquire(0x1000, 0x1000, 1).unwrap();
        assert_ne!(*c.handle(b).unwrap(), first, "the unmap was applied before the lookup: a new registration");
        assert_eq!(c.stats().invalidations, 1);
        c.release(b);
        for i in 0..=crate::monitor::LOG_CAPACITY as u64 {
            monitor.record(0x100000 + i * 0x1000, 0x100000 + (i + 1) * 0x1000);
        }
        c.sync();
        assert_eq!((c.stats().flushes, c.len()), (1, 0), "more than a ring behind: everything goes");
        assert!(c.registrar().live.is_empty());
    }

    #[test]
    fn without_a_monitor_nothing_is_cached() {
        let monitor: &'static Monitor = Box::leak(Box::new(Monitor::unavailable("test".into())));
        let mut c = MrCache::new(Model::default(), CacheConfig::default(), monitor);
        let a = c.acquire(0x1000, 0x1000, 1).unwrap();
        assert_eq!(c.registrar().live.len(), 1);
        c.release(a);
        assert!(c.registrar().live.is_empty(), "deregistered at its release");
        let b = c.acquire(0x1000, 0x1000, 1).unwrap();
        c.release(b);
        let st = c.stats();
        assert_eq!((st.hits, st.misses, st.uncached, c.len()), (0, 2, 2, 0));
    }

    #[test]
    fn watches_follow_the_entries() {
        let monitor = manual();
        let mut c = MrCache::new(
            Model::default(),
            CacheConfig { enabled: true, max_count: 1, max_bytes: u64::MAX, max_entry_bytes: u64::MAX },
            monitor,
        );
        let a = c.acquire(0x1000, 0x1000, 1).unwrap();
        let b = c.acquire(0x1800, 0x2000, 3).unwrap();
        assert_eq!(monitor.watched_runs(), 3, "0x1000.., 0x2000.. (both), 0x4000 end");
        c.release(a);
        c.release(b); // over the count limit: `a` goes
        assert_eq!(monitor.watched_runs(), 2, "only b's pages stay watched");
        let _b_again = c.acquire(0x1800, 0x100, 1).unwrap();
        drop(c);
        assert_eq!(monitor.watched_runs(), 0, "dropping the cache unwatches everything");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Acquire { page: u8, pages: u8, access: u8 },
        Release(u8),
        Invalidate { page: u8, pages: u8 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..32, 1u8..6, 1u8..4).prop_map(|(page, pages, access)| Op::Acquire { page, pages, access }),
            any::<u8>().prop_map(Op::Release),
            (0u8..32, 1u8..8).prop_map(|(page, pages)| Op::Invalidate { page, pages }),
        ]
    }

    proptest! {
        /// Against a naive model: every returned entry covers the request with
        /// the access asked for, and no returned entry overlaps memory
        /// invalidated after it was registered; in-use handles are never
        /// deregistered; the count limit holds whenever unused entries could be
        /// evicted; at the end every handle is deregistered exactly once.
        #[test]
        fn agrees_with_a_naive_model(ops in proptest::collection::vec(op(), 1..200), max_count in 1usize..8, max_entry_pages in 1u64..8) {
            const PAGE: u64 = 4096;
            let monitor = manual();
            let mut c = MrCache::new(Model::default(), CacheConfig { enabled: true, max_count, max_bytes: u64::MAX, max_entry_bytes: max_entry_pages * PAGE }, monitor);
            // Handle -> the invalidation generation when it was registered.
            let mut born: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
            // Invalidations: (generation, start, end).
            let mut invals: Vec<(u64, u64, u64)> = Vec::new();
            let mut held: Vec<EntryId> = Vec::new();
            for op in ops {
                match op {
                    Op::Acquire { page, pages, access } => {
                        let (addr, len, access) = (page as u64 * PAGE, pages as u64 * PAGE, access as u64);
                        let before = c.registrar().registered;
                        let id = c.acquire(addr, len, access).unwrap();
                        let h = *c.handle(id).unwrap();
                        if c.registrar().registered > before {
                            born.insert(h, invals.len() as u64);
                        }
                        let (ea, el, eacc) = c.registrar().live[&h];
                        prop_assert!(ea <= addr && ea + el >= addr + len, "does not cover");
                        prop_assert_eq!(eacc & access, access);
                        for &(g, s, e) in &invals {
                            if g >= born[&h] {
                                prop_assert!(!(ea < e && ea + el > s), "returned a registration invalidated after it was made");
                            }
                        }
                        held.push(id);
                    }
                    Op::Release(i) => {
                        if !held.is_empty() {
                            let id = held.remove(i as usize % held.len());
                            c.release(id);
                        }
                    }
                    Op::Invalidate { page, pages } => {
                        // As the kernel reports it: through the monitor's log,
                        // applied by the next acquire or release.
                        let (s, len) = (page as u64 * PAGE, pages as u64 * PAGE);
                        monitor.record(s, s + len);
                        invals.push((invals.len() as u64, s, s + len));
                    }
                }
                // In-use entries keep their handles.
                for id in &held {
                    let h = *c.handle(*id).unwrap();
                    prop_assert!(c.registrar().live.contains_key(&h));
                }
                let in_use: HashSet<EntryId> = held.iter().copied().collect();
                prop_assert!(c.len() <= max_count.max(in_use.len()), "count {} over limit {} with {} in use", c.len(), max_count, in_use.len());
            }
            for id in held.drain(..) {
                c.release(id);
            }
            c.invalidate(0, u64::MAX / 2);
            prop_assert!(c.registrar().live.is_empty(), "leaked registrations: {:?}", c.registrar().live);
        }
    }
}
