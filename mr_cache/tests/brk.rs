//! brk shrinking under a cached registration: the next lookup misses. The heap
//! end belongs to malloc, so the test runs in a child process whose malloc
//! keeps off the heap (`glibc.malloc.mmap_threshold=0`: every allocation is
//! its own mapping).
use mr_cache::cache::{CacheConfig, MrCache, Registrar};
use mr_cache::monitor::Monitor;

const PAGE: usize = 4096;

#[derive(Default)]
struct Recorder {
    next: u64,
    identities: std::collections::HashMap<u64, u64>,
}

impl Registrar for Recorder {
    type Handle = u64;
    type Error = ();
    fn register(&mut self, addr: u64, _len: u64, _access: u64) -> Result<u64, ()> {
        self.next += 1;
        // SAFETY: the test registers only heap pages it just grew and stamped.
        let identity = unsafe { std::ptr::read_volatile(addr as *const u64) };
        self.identities.insert(self.next, identity);
        Ok(self.next)
    }
    fn deregister(&mut self, h: u64) {
        self.identities.remove(&h);
    }
}

fn sbrk(delta: isize) -> usize {
    // SAFETY: in the child the allocator does not use the heap (see the
    // module docs), so moving the break touches only the test's own pages.
    let p = unsafe { libc::sbrk(delta) };
    assert_ne!(p as isize, -1, "sbrk({delta})");
    p as usize
}

#[test]
fn brk_shrink_then_grow_misses() {
    if std::env::var_os("RDMX_BRK_CHILD").is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "brk_shrink_then_grow_misses", "--nocapture", "--test-threads=1"])
            .env("RDMX_BRK_CHILD", "1")
            .env("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=0")
            .status()
            .unwrap();
        assert!(status.success(), "the child failed: {status}");
        return;
    }
    let monitor = Monitor::global();
    assert_eq!(monitor.unavailable_reason(), None);
    let mut c = MrCache::new(Recorder::default(), CacheConfig::default(), monitor);
    let len = 16 * PAGE;
    // Page-align the break, then grow the heap by `len`.
    let cur = sbrk(0);
    sbrk((cur.next_multiple_of(PAGE) - cur) as isize);
    let a = sbrk(len as isize);
    assert_eq!(a % PAGE, 0);
    let stamp = |v: u64| {
        // SAFETY: `a..a+len` is heap the test grew.
        unsafe { std::ptr::write_volatile(a as *mut u64, v) }
    };
    stamp(1);
    let id = c.acquire(a as u64, len as u64, 1).unwrap();
    assert_eq!(c.registrar().identities[c.handle(id).unwrap()], 1);
    c.release(id);
    let id = c.acquire(a as u64, len as u64, 1).unwrap();
    c.release(id);
    assert_eq!(c.stats().hits, 1, "a hit while the heap holds it");
    sbrk(-(len as isize));
    assert_eq!(sbrk(len as isize), a);
    stamp(2);
    let id = c.acquire(a as u64, len as u64, 1).unwrap();
    assert_eq!(c.registrar().identities[c.handle(id).unwrap()], 2, "the heap shrank under it: a new registration");
    assert_eq!(c.stats().invalidations, 1);
    c.release(id);
}
