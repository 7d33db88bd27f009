//! The cache against the real kernel: every way memory can go away behind the
//! cache's back (munmap, mmap over it, mremap, madvise(DONTNEED), a large
//! malloc buffer freed and allocated again) makes the next lookup miss, never
//! return the old registration; memory the monitor cannot watch is never
//! cached; and threads that map, look up and unmap concurrently never see a
//! registration of memory unmapped before their lookup began.
//!
//! brk shrinking has its own binary (tests/brk.rs): it needs the allocator off
//! the heap.
use mr_cache::cache::{CacheConfig, EntryId, MrCache, Registrar};
use mr_cache::monitor::Monitor;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const PAGE: usize = 4096;

/// A registrar that reads the first 8 bytes of what it registers (the
/// mapping's identity, written there by the tests) and refuses what is not
/// mapped or not readable, as a NIC would.
#[derive(Default)]
struct Recorder {
    next: u64,
    live: HashMap<u64, (u64, u64)>,
}

impl Registrar for Recorder {
    type Handle = u64;
    type Error = ();
    fn register(&mut self, addr: u64, len: u64, _access: u64) -> Result<u64, ()> {
        if !mapped(addr, len) {
            return Err(());
        }
        let identity = read_identity(addr).ok_or(())?;
        self.next += 1;
        self.live.insert(self.next, (addr, identity));
        Ok(self.next)
    }
    fn deregister(&mut self, h: u64) {
        assert!(self.live.remove(&h).is_some());
    }
}

/// The first 8 bytes at `addr`, read by the kernel (so memory unmapped or made
/// inaccessible meanwhile is an error, not a crash).
fn read_identity(addr: u64) -> Option<u64> {
    let mut out = 0u64;
    let local = libc::iovec { iov_base: (&mut out as *mut u64).cast(), iov_len: 8 };
    let remote = libc::iovec { iov_base: addr as *mut _, iov_len: 8 };
    // SAFETY: writes 8 bytes into `out`; the remote side is checked by the kernel.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    (n == 8).then_some(out)
}

/// Whether every page of the range is mapped (mincore fails with ENOMEM on a
/// hole).
fn mapped(addr: u64, len: u64) -> bool {
    let start = addr & !(PAGE as u64 - 1);
    let pages = (addr + len - start).div_ceil(PAGE as u64) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables; `vec` has one byte per page.
    unsafe { libc::mincore(start as *mut _, pages * PAGE, vec.as_mut_ptr()) == 0 }
}

fn cache() -> MrCache<Recorder> {
    let monitor = Monitor::global();
    assert_eq!(
        monitor.unavailable_reason(),
        None,
        "these tests need userfaultfd (root, or vm.unprivileged_userfaultfd=1, or a kernel >= 5.11)"
    );
    MrCache::new(Recorder::default(), CacheConfig::default(), monitor)
}

fn map(len: usize, at: Option<usize>) -> usize {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: an anonymous mapping; with MAP_FIXED only over memory the test
    // itself mapped at `at`.
    let p = unsafe { libc::mmap(at.unwrap_or(0) as *mut _, len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

/// Reserves address space (no access), at `at` over the test's own mapping.
fn reserve(len: usize, at: Option<usize>) -> usize {
    let flags =
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | if at.is_some() { libc::MAP_FIXED } else { 0 };
    // SAFETY: anonymous; with MAP_FIXED only over the test's own reservation.
    let p = unsafe { libc::mmap(at.unwrap_or(0) as *mut _, len, libc::PROT_NONE, flags, -1, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p as usize
}

fn unmap(addr: usize, len: usize) {
    // SAFETY: the test mapped `addr..addr+len` and nothing refers to it.
    assert_eq!(unsafe { libc::munmap(addr as *mut _, len) }, 0);
}

fn stamp(addr: usize, identity: u64) {
    // SAFETY: addr is the start of a writable mapping of at least a page.
    unsafe { std::ptr::write_volatile(addr as *mut u64, identity) };
}

fn identity_of(c: &MrCache<Recorder>, id: EntryId) -> u64 {
    c.registrar().live[c.handle(id).unwrap()].1
}

/// Acquires and releases `[addr, addr+len)`: the identity the registration
/// returned was made of, and whether it was a hit.
fn lookup(c: &mut MrCache<Recorder>, addr: usize, len: usize) -> (u64, bool) {
    let hits = c.stats().hits;
    let id = c.acquire(addr as u64, len as u64, 1).expect("mapped");
    let identity = identity_of(c, id);
    c.release(id);
    (identity, c.stats().hits > hits)
}

/// The cache drops what overlaps `[addr, addr+len)` only when it learns of an
/// unmap; after an unmap returned, a lookup at that address (whatever is
/// mapped there now: nothing, new memory of the test, or another thread's
/// mapping) must never be a hit.
fn never_a_hit(c: &mut MrCache<Recorder>, addr: usize, len: usize) {
    let hits = c.stats().hits;
    if let Ok(id) = c.acquire(addr as u64, len as u64, 1) {
        c.release(id);
    }
    assert_eq!(c.stats().hits, hits, "a hit on memory unmapped before the lookup");
}

/// Applies what the monitor logged and returns the invalidations so far.
fn invalidations(c: &mut MrCache<Recorder>) -> u64 {
    c.sync();
    c.stats().invalidations
}

// No scenario maps anything again at an address it has just unmapped: another
// thread of the process (the monitor's own thread starting, the harness, an
// allocator arena) may take that address first, and then such a test fails
// without a defect. Where a scenario needs new memory at the same address it
// replaces the old mapping in one call (mmap(MAP_FIXED) or mremap onto it),
// which the kernel does under its mmap lock: no other thread can come between.

fn munmap_drops_the_entry_at_once() {
    let mut c = cache();
    let len = 16 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    assert_eq!(lookup(&mut c, a, len), (1, false));
    assert_eq!(lookup(&mut c, a + PAGE, PAGE), (1, true), "a hit while it lives");
    let before = invalidations(&mut c);
    let live = c.registrar().live.len();
    unmap(a, len);
    // The unmap returned: the monitor has read its event (the kernel waited
    // for that), so the next sync drops the entry and deregisters it.
    assert_eq!(invalidations(&mut c), before + 1, "the unmap was seen before munmap returned");
    assert_eq!(c.registrar().live.len(), live - 1, "its registration is given back");
    never_a_hit(&mut c, a, len);
}

fn munmap_then_new_memory_at_the_same_address_misses() {
    // The address comes back atomically: a mapping the test made elsewhere is
    // moved onto it with mremap, which unmaps what was there in the same call
    // (reported like munmap).
    let mut c = cache();
    let len = 16 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    assert_eq!(lookup(&mut c, a, len), (1, false));
    let fresh = map(len, None);
    stamp(fresh, 2);
    // SAFETY: moves the test's own mapping `fresh` onto the test's own `a`.
    let p = unsafe {
        libc::mremap(fresh as *mut _, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, a as *mut libc::c_void)
    };
    assert_eq!(p as usize, a);
    assert_eq!(lookup(&mut c, a, len), (2, false), "never the old registration");
    unmap(a, len);
}

fn unmapping_one_page_of_an_entry_drops_it() {
    let mut c = cache();
    let len = 8 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    lookup(&mut c, a, len);
    assert!(lookup(&mut c, a, 3 * PAGE).1, "the entry covers its first pages");
    unmap(a + 3 * PAGE, PAGE);
    // The pages before the hole are still mapped, and the whole entry must be
    // gone: a hit there would be the old entry.
    assert_eq!(lookup(&mut c, a, 3 * PAGE), (1, false));
    unmap(a, 3 * PAGE);
    unmap(a + 4 * PAGE, 4 * PAGE);
}

fn mmap_fixed_over_it_misses() {
    let mut c = cache();
    let len = 4 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    lookup(&mut c, a, len);
    map(len, Some(a)); // replaces the mapping: an implicit unmap
    stamp(a, 2);
    assert_eq!(lookup(&mut c, a, len), (2, false));
    unmap(a, len);
}

fn mremap_moving_or_shrinking_misses() {
    let mut c = cache();
    let len = 8 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    lookup(&mut c, a, len);
    // Shrink in place: the tail goes, and with it the entry (its first half
    // is still mapped, so a hit there would be the old entry).
    // SAFETY: our mapping; shrinking in place keeps `a`.
    let p = unsafe { libc::mremap(a as *mut _, len, 4 * PAGE, 0) };
    assert_eq!(p as usize, a);
    assert_eq!(lookup(&mut c, a, 4 * PAGE), (1, false), "shrunk: a miss");
    // Move it elsewhere: a miss at the new address, never a hit at the old.
    assert!(lookup(&mut c, a, 4 * PAGE).1);
    let dest = map(4 * PAGE, None);
    let before = invalidations(&mut c);
    // SAFETY: moves our mapping onto `dest`, our mapping too (replaced).
    let p = unsafe {
        libc::mremap(
            a as *mut _,
            4 * PAGE,
            4 * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dest as *mut libc::c_void,
        )
    };
    assert_eq!(p as usize, dest);
    assert_eq!(invalidations(&mut c), before + 1, "the move was seen before mremap returned");
    never_a_hit(&mut c, a, 4 * PAGE);
    assert_eq!(lookup(&mut c, dest, 4 * PAGE), (1, false), "a new registration at the new address");
    unmap(dest, 4 * PAGE);
}

fn madvise_dontneed_misses() {
    let mut c = cache();
    let len = 4 * PAGE;
    let a = map(len, None);
    stamp(a, 1);
    lookup(&mut c, a, len);
    // SAFETY: our mapping; its pages become zero-fill-on-demand.
    assert_eq!(unsafe { libc::madvise(a as *mut _, len, libc::MADV_DONTNEED) }, 0);
    assert_eq!(
        lookup(&mut c, a, len),
        (0, false),
        "the pages were dropped: a new registration of the new (zero) pages"
    );
    unmap(a, len);
}

fn a_large_malloc_buffer_freed_and_allocated_again_misses() {
    let mut c = cache();
    // Above glibc's largest dynamic mmap threshold (32 MiB): always its own
    // mapping, unmapped by free. glibc usually gives the same address back
    // (the case that matters: an MPI buffer freed and allocated again), but
    // another thread may have taken part of it meanwhile, so the test does not
    // require it: the free must have dropped the entry either way.
    let len = 40 << 20;
    let mut first = vec![0u8; len];
    first[..8].copy_from_slice(&1u64.to_ne_bytes());
    let a = first.as_ptr() as usize;
    assert_eq!(lookup(&mut c, a, len), (1, false));
    let before = invalidations(&mut c);
    drop(first);
    assert_eq!(invalidations(&mut c), before + 1, "free unmapped it, and the cache saw it");
    let mut second = vec![0u8; len];
    second[..8].copy_from_slice(&2u64.to_ne_bytes());
    let b = second.as_ptr() as usize;
    assert_eq!(
        lookup(&mut c, b, len),
        (2, false),
        "freed and allocated again: a new registration (same address: {})",
        a == b
    );
}

fn file_backed_memory_is_registered_per_use_never_cached() {
    let mut c = cache();
    let path = std::env::temp_dir().join(format!("rdmx-mr-cache-test-{}", std::process::id()));
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    file.set_len(4 * PAGE as u64).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: maps our own file, private, read-write.
    let a = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(a, libc::MAP_FAILED);
    let a = a as usize;
    stamp(a, 7);
    let before = c.stats();
    assert_eq!(lookup(&mut c, a, PAGE), (7, false));
    assert_eq!(lookup(&mut c, a, PAGE), (7, false), "a miss every time");
    assert_eq!(c.stats().uncached - before.uncached, 2);
    assert!(c.registrar().live.is_empty(), "deregistered at each release");
    unmap(a, 4 * PAGE);
    std::fs::remove_file(&path).unwrap();
}

/// Spins until `done`; a partner thread that failed never gets there, so give
/// up (and fail) after a while instead of hanging.
fn wait_for(done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "the partner thread stopped (see its failure above)");
        std::thread::yield_now();
    }
}

/// Threads map, look up and unmap concurrently. A mapper maps its slot with
/// a new identity, lets lookers register it, unmaps it, and only then tells
/// them; a looker told of the unmap must miss (its registration fails: the
/// memory is gone) — a hit would be a registration of unmapped memory. Other
/// lookups race with the unmaps on purpose.
fn concurrent_map_lookup_unmap_never_returns_an_unmapped_registration() {
    const SLOTS: usize = 3;
    const ROUNDS: u64 = 300;
    let len = 4 * PAGE;
    let shared = Arc::new(Mutex::new(cache()));
    // The slots' address space stays reserved (PROT_NONE) so that nothing else
    // lands there; "unmapping" a slot maps the reservation back over it (an
    // implicit unmap, reported like munmap).
    let region = reserve(SLOTS * len, None);
    // Per slot: the identity mapped now (0: none) and the last one unmapped.
    let mapped_now: Arc<Vec<AtomicU64>> = Arc::new((0..SLOTS).map(|_| AtomicU64::new(0)).collect());
    let unmapped: Arc<Vec<AtomicU64>> = Arc::new((0..SLOTS).map(|_| AtomicU64::new(0)).collect());
    let acks: Arc<Vec<AtomicU64>> = Arc::new((0..SLOTS).map(|_| AtomicU64::new(0)).collect());
    let mut threads = Vec::new();
    for slot in 0..SLOTS {
        let (shared, mapped_now, unmapped, acks) = (shared.clone(), mapped_now.clone(), unmapped.clone(), acks.clone());
        let addr = region + slot * len;
        threads.push(std::thread::spawn(move || {
            for round in 1..=ROUNDS {
                let identity = (slot as u64) << 32 | round;
                // Under the cache lock, so that a racing registration (which
                // reads the memory) never reads it half-made or unmapped; the
                // unmap below under that lock also shows that unmapping while
                // the cache is locked cannot deadlock with the monitor.
                {
                    let _c = shared.lock().unwrap();
                    map(len, Some(addr));
                    stamp(addr, identity);
                }
                mapped_now[slot].store(identity, Ordering::Release);
                // The looker registers it (it must still be mapped then).
                wait_for(|| acks[slot].load(Ordering::Acquire) == identity);
                mapped_now[slot].store(0, Ordering::Release);
                {
                    let _c = shared.lock().unwrap();
                    reserve(len, Some(addr));
                }
                unmapped[slot].store(identity, Ordering::Release);
                wait_for(|| acks[slot].load(Ordering::Acquire) == !identity);
            }
        }));
    }
    let checks = Arc::new(AtomicU64::new(0));
    for slot in 0..SLOTS {
        let (shared, mapped_now, unmapped, acks, checks) =
            (shared.clone(), mapped_now.clone(), unmapped.clone(), acks.clone(), checks.clone());
        let addr = region + slot * len;
        threads.push(std::thread::spawn(move || {
            for round in 1..=ROUNDS {
                let identity = (slot as u64) << 32 | round;
                wait_for(|| mapped_now[slot].load(Ordering::Acquire) == identity);
                {
                    let mut c = shared.lock().unwrap();
                    let id = c.acquire(addr as u64, len as u64, 1).expect("mapped: registers");
                    assert_eq!(identity_of(&c, id), identity, "slot {slot} round {round}: a registration of an earlier mapping");
                    c.release(id);
                }
                acks[slot].store(identity, Ordering::Release);
                wait_for(|| unmapped[slot].load(Ordering::Acquire) == identity);
                {
                    let mut c = shared.lock().unwrap();
                    let r = c.acquire(addr as u64, len as u64, 1);
                    assert!(r.is_err(), "slot {slot} round {round}: a lookup after the unmap returned a registration of unmapped memory");
                }
                checks.fetch_add(2, Ordering::Relaxed);
                acks[slot].store(!identity, Ordering::Release);
            }
        }));
    }
    // A thread that looks up every slot all the time, racing with the unmaps:
    // whatever it gets must be of a mapping that existed (identity nonzero).
    let stop = Arc::new(AtomicU64::new(0));
    let racer = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while stop.load(Ordering::Acquire) == 0 {
                for slot in 0..SLOTS {
                    let mut c = shared.lock().unwrap();
                    if let Ok(id) = c.acquire((region + slot * len) as u64, len as u64, 1) {
                        assert_ne!(identity_of(&c, id), 0);
                        c.release(id);
                        n += 1;
                    }
                }
            }
            n
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    stop.store(1, Ordering::Release);
    let raced = racer.join().unwrap();
    let c = shared.lock().unwrap();
    assert_eq!(checks.load(Ordering::Relaxed), 2 * SLOTS as u64 * ROUNDS);
    unmap(region, SLOTS * len);
    assert!(c.stats().invalidations >= SLOTS as u64 * ROUNDS, "every unmap dropped an entry: {:?}", c.stats());
    eprintln!("stress: {} checked lookups, {raced} racing lookups, {:?}", 2 * SLOTS as u64 * ROUNDS, c.stats());
}

#[test]
fn munmap_drops_the_entry() {
    munmap_drops_the_entry_at_once();
}

#[test]
fn munmap_then_new_memory_at_the_same_address() {
    munmap_then_new_memory_at_the_same_address_misses();
}

#[test]
fn unmapping_one_page() {
    unmapping_one_page_of_an_entry_drops_it();
}

#[test]
fn mmap_fixed_over_it() {
    mmap_fixed_over_it_misses();
}

#[test]
fn mremap_moving_or_shrinking() {
    mremap_moving_or_shrinking_misses();
}

#[test]
fn madvise_dontneed() {
    madvise_dontneed_misses();
}

#[test]
fn a_large_malloc_buffer_freed_and_allocated_again() {
    a_large_malloc_buffer_freed_and_allocated_again_misses();
}

#[test]
fn file_backed_memory() {
    file_backed_memory_is_registered_per_use_never_cached();
}

#[test]
fn concurrent_map_lookup_unmap() {
    concurrent_map_lookup_unmap_never_returns_an_unmapped_registration();
}
