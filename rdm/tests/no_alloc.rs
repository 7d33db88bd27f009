//! The per-message path of the engine allocates nothing once its pools are warm:
//! queueing a message, segmenting, transmitting, receiving, delivering, acking
//! and completing reuse pooled buffers (DEVELOPERS.md: hot paths do no
//! allocation). A counting global allocator watches a two-engine exchange.
use rdm::engine::{Engine, EngineConfig, Event};
use rdm::Instant;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the thread that runs the exchange: only its allocations count.
    /// The test harness's main thread allocates while the test runs (it set
    /// up its channel's wait context the first time it blocked, 48 bytes),
    /// which made a global count fail about one run in five.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: no count (and no panic) while the thread's locals are torn down.
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as ours.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

/// Sends `count` messages of `len` bytes from a to b, moving every datagram by
/// hand; returns the allocations counted meanwhile.
fn exchange(a: &mut Engine, b: &mut Engine, t: &mut Instant, count: usize, len: usize, wire: &mut [u8]) -> u64 {
    let (addr_a, addr_b) = (rdm::simnet::addr(1), rdm::simnet::addr(2));
    let to_b = a.peer(addr_b);
    let payload = [7u8; 65536];
    COUNTED.with(|c| c.set(true));
    let before = ALLOCS.load(Ordering::Relaxed);
    let mut done = 0;
    let mut sent = 0;
    while done < count {
        *t = *t + Duration::from_micros(1);
        if sent < count && a.send(*t, to_b, &[&payload[..len]], sent as u64).is_ok() {
            sent += 1;
        }
        while let Some(tx) = a.poll_transmit(*t, wire) {
            assert_eq!(tx.dst, addr_b);
            b.handle_datagram(*t, addr_a, &wire[..tx.len]);
        }
        while let Some(ev) = b.poll_event() {
            if let Event::Delivered { msg, .. } = ev {
                assert_eq!(msg.len(), len);
                b.recycle(msg);
            }
        }
        while let Some(tx) = b.poll_transmit(*t, wire) {
            a.handle_datagram(*t, addr_b, &wire[..tx.len]);
        }
        while let Some(ev) = a.poll_event() {
            if let Event::SendComplete { .. } = ev {
                done += 1;
            }
        }
        // As the provider does every progress round (drops stale timer entries).
        let _ = (a.next_timeout(), b.next_timeout());
    }
    let n = ALLOCS.load(Ordering::Relaxed) - before;
    COUNTED.with(|c| c.set(false));
    n
}

#[test]
fn warm_message_path_allocates_nothing() {
    for (reliable, len) in [(false, 64), (false, 5000), (true, 64), (true, 30000)] {
        let cfg = |inc| EngineConfig { incarnation: inc, mtu: 1472, reliable, ..EngineConfig::default() };
        let mut a = Engine::new(cfg(1));
        let mut b = Engine::new(cfg(2));
        let mut t = Instant::from_nanos(1_000_000);
        let mut wire = vec![0u8; 2048];
        exchange(&mut a, &mut b, &mut t, 300, len, &mut wire);
        let n = exchange(&mut a, &mut b, &mut t, 2000, len, &mut wire);
        assert_eq!(n, 0, "{n} allocations for 2000 warm messages of {len} bytes (reliable device: {reliable})");
    }
}
