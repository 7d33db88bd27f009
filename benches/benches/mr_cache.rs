//! The registration cache's costs with 10,000 cached entries: a hit (the data
//! path's common case), a miss plus insert (with an immediate release), and an
//! invalidation of one page. The registrar does nothing, so these are the
//! cache's own costs. `cargo bench -p rdmx-benches --bench mr_cache`.
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use mr_cache::cache::{CacheConfig, MrCache, Registrar};

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

fn filled() -> MrCache<Null> {
    let mut c = MrCache::new(Null(0), CacheConfig { enabled: true, max_count: 20_000, max_bytes: u64::MAX });
    for i in 0..N {
        let id = c.acquire(i * 4 * PAGE, 2 * PAGE, 3).unwrap();
        c.release(id);
    }
    c
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("mr_cache_10k");
    let mut cache = filled();
    let mut i = 0u64;
    g.bench_function("hit", |b| {
        b.iter(|| {
            i = (i + 7919) % N;
            let id = cache.acquire(black_box(i * 4 * PAGE + 100), 1000, 1).unwrap();
            cache.release(id);
        })
    });
    let mut cache = filled();
    let mut j = 0u64;
    g.bench_function("miss_insert_release", |b| {
        b.iter(|| {
            j += 1;
            // A range no entry covers (the odd pages between entries).
            let addr = (N * 4 + j) * 4 * PAGE;
            let id = cache.acquire(black_box(addr), PAGE, 1).unwrap();
            cache.release(id);
        })
    });
    let mut cache = filled();
    let mut k = 0u64;
    g.bench_function("invalidate_one_page", |b| {
        b.iter(|| {
            k = (k + 7919) % N;
            cache.invalidate(black_box(k * 4 * PAGE), PAGE);
            let id = cache.acquire(k * 4 * PAGE, 2 * PAGE, 3).unwrap();
            cache.release(id);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
