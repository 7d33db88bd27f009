//! Shared memory's small-message path (the sender writes header and payload
//! straight into the receiver's ring; no sequence number, no acknowledgement)
//! under the two faults of issue 35 that only a real ring shows: the ring full
//! and a flood of unexpected messages.
//!
//! One sender floods one receiver with `N` small tagged messages, each a
//! different length and body, through the public libfabric API:
//!
//! 1. **Ring full.** The application does not call into the receiver (only
//!    its progress thread serves it, once the application has been quiet for
//!    a while). Its ring holds `DEFAULT_SLOTS` (256) datagrams; beyond that
//!    the sender's messages must wait in the sender (queued in its engine,
//!    held by the receiver's window) and, once that queue is full, `fi_tsend`
//!    must say `-FI_EAGAIN`: never an error, never a crash, never unbounded
//!    queueing. (With the receiver's pause disabled, its progress thread takes
//!    the whole flood and the test fails here.)
//! 2. **Unexpected flood.** The receiver progresses with no receive posted,
//!    with an unexpected-message limit far below the flood: it must stop taking
//!    messages once it holds more than the limit (the zero-window
//!    acknowledgement stops the sender's small-message path), and hold at most
//!    the limit plus what the ring and one progress round carried
//!    (`unexpected_bytes_max` of its `FI_RDMX_STATS` document).
//! 3. **Nothing lost.** Receives are then posted one at a time with a wildcard
//!    tag: the i-th receive gets message i, tag, length and bytes, and every
//!    send completes without error.
//!
//! The sender's document must show that the small-message path was taken
//! (`direct_written`) and that the flood went beyond it, so the test checks
//! the path switch both ways (fast, held back, fast again) and not only one.
//! Run over the `shm` domain and over the default domain (`auto`, which takes
//! shared memory for a peer on this host).
use fi_tests::stats_docs::{close_document, refusing_since, unix_ms};
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// The receiver's unexpected-message limit (FI_RDMX_UNEXPECTED_LIMIT; the
/// provider takes no less than 64 KiB).
const LIMIT: usize = 64 << 10;
/// Messages of the flood.
const N: usize = 12_000;
const MAX_LEN: usize = 200;
/// Datagrams the receiver's ring holds (`devices::shm::DEFAULT_SLOTS`). The one
/// constant copied here: importing it would link rdma-core into fi_tests, which
/// `prov/tests/crate_graph.rs` forbids; `ring_slots_match_the_device` holds the
/// two equal by reading the device's source.
const RING_SLOTS: usize = 256;
/// Datagrams one progress round hands the engines (rndv `Endpoint::progress`:
/// `RX_ROUNDS` batches of `RX_BATCH`); the limit is checked after each round.
const ROUND_DATAGRAMS: usize = rndv::endpoint::RX_ROUNDS * rndv::endpoint::RX_BATCH;
/// Datagrams the sender pulls from its engine per batch (rndv `TX_BATCH`);
/// it checks the receiver's flag before each.
const TX_BATCH: usize = rndv::endpoint::TX_BATCH;
/// The message engine's header, which the bytes held count with each
/// message.
const MSG_HEADER: usize = rndv::HEADER_LEN;
/// Messages the receiver may take beyond the limit: the rest of the round
/// that crossed it; then, paused, the DIRECT packets in its ring; then what
/// the sender wrote before it saw the ring's flag: the batch it was writing
/// and one it had just pulled, and the one message of a send in progress.
const OVER: usize = ROUND_DATAGRAMS + RING_SLOTS + 2 * TX_BATCH + 1;

fn len_of(i: usize) -> usize {
    1 + (i * 37) % MAX_LEN
}

fn body_of(i: usize) -> Vec<u8> {
    (0..len_of(i)).map(|k| (i.wrapping_mul(31) + k * 7) as u8).collect()
}

/// The bytes the receiver may hold: the limit, then the largest `OVER`
/// consecutive messages of the flood, each with its header.
fn most_held() -> usize {
    let held = |i: usize| len_of(i) + MSG_HEADER;
    let mut window: usize = (0..OVER).map(held).sum();
    let mut most = window;
    for i in OVER..N {
        window = window + held(i) - held(i - OVER);
        most = most.max(window);
    }
    LIMIT + most
}

/// Reads every send completion `a` has; an error fails the test.
fn drain_sends(a: &Stack, done: &mut usize) {
    while let Some(c) = a.poll_cq(Duration::ZERO) {
        match c {
            Ok(_) => *done += 1,
            Err(e) => panic!("a send failed: error {} (prov_errno {})", e.err, e.prov_errno),
        }
    }
}

fn progress(s: &Stack) {
    // SAFETY: a zero-count read on a CQ this test opened only drives progress.
    unsafe { fi::fi_cq_read(s.cq, null_mut(), 0) };
}

/// `tsend` of message `i`: 0 or `-FI_EAGAIN`, anything else fails the test.
fn send(a: &Stack, to: u64, i: usize, body: &[u8]) -> bool {
    // SAFETY: a libfabric call on objects this test opened; `body` lives until the whole flood has completed.
    let r = unsafe { fi::fi_tsend(a.ep, body.as_ptr() as *const _, body.len(), null_mut(), to, i as u64, null_mut()) };
    if r == 0 {
        return true;
    }
    assert_eq!(r, -(fi::FI_EAGAIN as isize), "fi_tsend of message {i}");
    false
}

fn flood(domain: Option<&str>, stats: &std::path::Path) {
    let what = domain.unwrap_or("the default domain");
    let a = Stack::open(domain, fi::FI_AV_MAP);
    let b = Stack::open(domain, fi::FI_AV_MAP);
    let (a_uri, b_uri) = (a.uri(), b.uri());
    let b_at_a = a.insert(&b.name());
    let a_at_b = b.insert(&a.name());
    let bodies: Vec<Vec<u8>> = (0..N).map(body_of).collect();
    let mut done = 0usize;

    // 0. One message each way: the small-message path is open only to a peer
    //    whose incarnation has been heard (it then knows no older message of
    //    ours can still be on its way).
    let mut one = [0u8; 1];
    for (to, from, at) in [(&b, &a, b_at_a), (&a, &b, a_at_b)] {
        // SAFETY: libfabric calls on objects this test opened; `one` outlives both completions (awaited below).
        unsafe {
            assert_eq!(
                fi::fi_trecv(to.ep, one.as_mut_ptr() as *mut _, 1, null_mut(), FI_ADDR_UNSPEC, 0, u64::MAX, null_mut()),
                0
            );
            assert_eq!(fi::fi_tsend(from.ep, one.as_ptr() as *const _, 1, null_mut(), at, u64::MAX, null_mut()), 0);
        }
        to.wait_cq(&[from]).expect("warm-up receive");
        from.wait_cq(&[to]).expect("warm-up send");
    }

    // 1. The receiver's application is idle (its progress thread serves it
    //    once it has been quiet a while) and the sender's only sends: no
    //    completion read, no progress but what fi_tsend itself makes.
    let mut sent = 0usize;
    while sent < N && send(&a, b_at_a, sent, &bodies[sent]) {
        sent += 1;
    }
    println!("{what}: {sent} of {N} messages accepted before the first -FI_EAGAIN, with the receiver idle");
    assert!(
        sent >= RING_SLOTS,
        "{what}: -FI_EAGAIN after {sent} messages, before the receiver's ring ({RING_SLOTS} slots) was full"
    );
    assert!(sent < N, "{what}: all {N} messages ({} bytes) accepted with the receiver at a limit of {LIMIT} bytes: queued or taken without bound", bodies.iter().map(Vec::len).sum::<usize>());

    // 2. The receiver's application polls its completion queue with no
    //    receive posted; the sender's still only sends. The flood goes on as
    //    the receiver makes room, until the receiver says (its interval
    //    document, written after the sender's last accepted message) that it
    //    refuses new messages: it holds its limit.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_sent_ms = unix_ms();
    let mut looked = Instant::now();
    loop {
        progress(&b);
        while sent < N && send(&a, b_at_a, sent, &bodies[sent]) {
            sent += 1;
            last_sent_ms = unix_ms();
        }
        // The file grows by a document every 20 ms: read it every 10.
        if looked.elapsed() >= Duration::from_millis(10) {
            looked = Instant::now();
            if refusing_since(stats, &b_uri, last_sent_ms) {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the receiver did not refuse new messages within 60 s ({sent} sent)"
        );
    }
    println!("{what}: settled with {sent} of {N} sent, no receive posted");
    assert!(sent < N, "{what}: the receiver took all {N} messages unexpected with a limit of {LIMIT} bytes");

    // 3. Receive everything, in order, while the sender sends the rest.
    let mut buf = vec![0u8; MAX_LEN];
    for (i, body) in bodies.iter().enumerate() {
        // SAFETY: a libfabric call on objects this test opened; `buf` outlives the receive's completion (awaited below).
        let r = unsafe {
            fi::fi_trecv(b.ep, buf.as_mut_ptr() as *mut _, MAX_LEN, null_mut(), FI_ADDR_UNSPEC, 0, u64::MAX, null_mut())
        };
        assert_eq!(r, 0, "fi_trecv {i}");
        let deadline = Instant::now() + Duration::from_secs(20);
        let c = loop {
            while sent < N && send(&a, b_at_a, sent, &bodies[sent]) {
                sent += 1;
            }
            drain_sends(&a, &mut done);
            if let Some(c) = b.poll_cq(Duration::ZERO) {
                break c.unwrap_or_else(|e| panic!("{what}: receive {i} failed: error {}", e.err));
            }
            assert!(
                Instant::now() < deadline,
                "{what}: receive {i} not completed within 20 s ({sent} sent, {done} completed)"
            );
        };
        assert_eq!((c.tag, c.len), (i as u64, body.len()), "{what}: receive {i} got another message (tag, length)");
        assert!(buf[..body.len()] == body[..], "{what}: message {i} corrupted");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while done < N {
        drain_sends(&a, &mut done);
        progress(&b);
        assert!(Instant::now() < deadline, "{what}: {done} of {N} sends completed");
    }
    drop(a);
    drop(b);

    let sender = close_document(stats, &a_uri);
    let receiver = close_document(stats, &b_uri);
    let written = sender["counters"]["direct_written"].as_u64().unwrap();
    let direct = sender["counters"]["direct_sent"].as_u64().unwrap();
    let held_max = receiver["unexpected_bytes_max"].as_u64().unwrap() as usize;
    let most = most_held();
    println!("{what}: direct_written {written}, direct_sent {direct}, packets_sent {}, unexpected_bytes_max {held_max} (bound {most})", sender["counters"]["packets_sent"]);
    assert!(written >= RING_SLOTS as u64, "{what}: only {written} messages took the small-message path");
    assert!(
        written < N as u64,
        "{what}: every message took the small-message path, though the receiver's ring was full"
    );
    assert!(
        held_max > LIMIT,
        "{what}: the receiver never held its limit ({held_max} of {LIMIT} bytes): the flood did not reach it"
    );
    assert!(held_max <= most, "{what}: the receiver held {held_max} unexpected bytes with a limit of {LIMIT}; the bound is {most} (the limit and {OVER} messages)");
}

#[test]
fn a_flood_of_small_messages_over_shared_memory_is_held_back_and_lost_nowhere() {
    let stats = std::env::temp_dir().join(format!("rdmx-shm-flood-{}.jsonl", unique_tag()));
    let _ = std::fs::remove_file(&stats);
    // SAFETY: before the first libfabric call of this test binary (one test).
    unsafe {
        std::env::set_var("FI_RDMX_UNEXPECTED_LIMIT", LIMIT.to_string());
        std::env::set_var("FI_RDMX_STATS", &stats);
        // Interval documents: the receiver says when it refuses new messages.
        std::env::set_var("FI_RDMX_STATS_INTERVAL", "20");
    }
    init();
    flood(Some("shm"), &stats);
    flood(None, &stats);
    let _ = std::fs::remove_file(&stats);
}

/// The ring size this test's bound assumes is the shm device's default
/// (`pub const DEFAULT_SLOTS: usize = N;` in the device's sources).
#[test]
fn ring_slots_match_the_device() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../devices/src");
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let src = std::fs::read_to_string(&p).unwrap();
                for l in src.lines() {
                    if let Some(v) = l.trim().strip_prefix("pub const DEFAULT_SLOTS: usize = ") {
                        found.push(v.trim_end_matches(';').replace('_', "").parse::<usize>().unwrap());
                    }
                }
            }
        }
    }
    assert_eq!(found, vec![RING_SLOTS], "devices' DEFAULT_SLOTS vs this test's RING_SLOTS");
}
