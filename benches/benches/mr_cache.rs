//! The registration cache's costs with 10,000 cached entries over real memory
//! watched by the unmap monitor (userfaultfd):
//! - `hit`: acquire + release of a cached registration (the data path's
//!   common case; includes applying the monitor's log, empty here);
//! - `miss_insert_release`: a new registration, including the monitor's
//!   userfaultfd registration of its pages and the eviction of the least
//!   recently used entry with the unregistration of its pages (the registrar
//!   itself does nothing, so this is the cache's own price on top of the
//!   device's);
//! - `unmap_remap_watched` vs `unmap_remap_unwatched`: what the application
//!   pays when it unmaps memory the cache watches (its `munmap` waits until the
//!   monitor thread has read the event) against the same on memory nobody
//!   watches; the invalidation itself happens at the next acquire, included in
//!   the watched case.
//!
//! `cargo bench -p rdmx-benches --bench mr_cache`; the medians are in
//! target/criterion/mr_cache_10k/*/new/estimates.json.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use mr_cache::cache::{CacheConfig, MrCache, Registrar};
use mr_cache::monitor::Monitor;

struct Null(u64);

impl Registrar for Null {
    type Handle = u64;
    type Error = ();
    fn register(&mut self, _: u64, _: u64, _: u64) -> Result<u64, ()> {
        self.0 += 1;
        Ok(self.0)
    }
    fn deregister(&mut self, _: u64) {}
}

const PAGE: u64 = 4096;
const N: u64 = 10_000;

/// Address space for the entries (untouched, so it costs no memory).
fn region(bytes: u64) -> u64 {
    // SAFETY: a fresh anonymous mapping nobody else knows about.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    p as u64
}

fn remap_page(addr: u64) {
    // SAFETY: replaces one page of the bench's own mapping (an implicit unmap).
    let p = unsafe {
        libc::mmap(
            addr as *mut _,
            PAGE as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    assert_eq!(p as u64, addr);
}

/// A cache holding N entries, at most `N` (so a miss evicts the least recently
/// used: its pages are unwatched, and the kernel's map count stays bounded).
fn filled(base: u64) -> MrCache<Null> {
    let monitor = Monitor::global();
    assert_eq!(monitor.unavailable_reason(), None, "the bench needs userfaultfd");
    let mut c = MrCache::new(
        Null(0),
        CacheConfig { enabled: true, max_count: N as usize, max_bytes: u64::MAX, max_entry_bytes: u64::MAX },
        monitor,
    );
    for i in 0..N {
        let id = c.acquire(base + i * 4 * PAGE, 2 * PAGE, 3).unwrap();
        c.release(id);
    }
    assert_eq!(c.len(), N as usize);
    c
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("mr_cache_10k");
    let base = region(N * 4 * PAGE);
    let mut cache = filled(base);
    let mut i = 0u64;
    g.bench_function("hit", |b| {
        b.iter(|| {
            i = (i + 7919) % N;
            let id = cache.acquire(black_box(base + i * 4 * PAGE + 100), 1000, 1).unwrap();
            cache.release(id);
        })
    });
    assert_eq!(cache.stats().misses, N, "every lookup above hit");
    drop(cache);
    // Misses over fresh address space: each a new watched entry, and the
    // eviction (and unwatching) of the least recently used one.
    let spare = region(1 << 34);
    let mut j = 0u64;
    let mut cache = filled(base);
    g.bench_function("miss_insert_release", |b| {
        b.iter(|| {
            j += 1;
            let addr = spare + (j % (1 << 21)) * 2 * PAGE;
            let id = cache.acquire(black_box(addr), PAGE, 1).unwrap();
            cache.release(id);
        })
    });
    drop(cache);
    let mut cache = filled(base);
    let mut k = 0u64;
    g.bench_function("unmap_remap_watched", |b| {
        b.iter(|| {
            k = (k + 7919) % N;
            let addr = base + k * 4 * PAGE;
            remap_page(addr);
            // The next lookup applies the invalidation and registers again.
            let id = cache.acquire(addr, 2 * PAGE, 3).unwrap();
            cache.release(id);
        })
    });
    assert!(cache.stats().invalidations > 0);
    drop(cache);
    let plain = region(N * 4 * PAGE);
    let mut m = 0u64;
    g.bench_function("unmap_remap_unwatched", |b| {
        b.iter(|| {
            m = (m + 7919) % N;
            remap_page(black_box(plain + m * 4 * PAGE));
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
