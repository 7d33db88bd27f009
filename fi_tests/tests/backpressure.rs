//! Unexpected messages are buffered up to FI_RDMX_UNEXPECTED_LIMIT bytes; beyond
//! it the receiver stops accepting and senders wait. Nothing is dropped: once
//! receives are posted, every message arrives intact and in order.
//!
//! How many bytes the receiver holds is read at the sender: over UDP a send
//! completes only once the receiver's provider has processed the message — with
//! no receive posted, once it holds it as unexpected (`prov/src/core.rs`,
//! `progress`: acknowledgements leave only after the message engine ran). So at
//! every moment (completed sends − receives taken) × LEN is a lower bound of
//! the unexpected bytes held, and the test bounds it by what the code
//! guarantees:
//!
//! - the receiver stops accepting once it holds more than the limit
//!   (`rndv/src/engine/mod.rs`, `update_backpressure`: paused while held >
//!   limit), but it checks that after each progress round, and one round feeds
//!   the rdm engine up to 4 × 64 datagrams (`rndv/src/endpoint.rs`, `progress`), each at
//!   most `FI_RDMX_UDP_MTU` (1472) bytes. So held ≤ limit + 256 × 1472 + one
//!   message begun in an earlier round. (Segments released from the reorder
//!   buffer in that round would add to it; loopback does not reorder.)
//! - it takes messages until it holds more than the limit, so at least
//!   limit / (LEN + header) + 1 complete before it pauses;
//! - it resumes only once it holds at most half the limit (same function).
//!
//! The receiver's `FI_RDMX_STATS` interval documents say when it refuses new
//! messages (`refusing_messages`): the test waits for that, not for a quiet
//! spell.
use fi_tests::stats_docs::{documents_of, received_from_first_peer};
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const LIMIT: usize = 1 << 20;
const LEN: usize = 16384;
const N: usize = 128;
/// Datagrams one progress round hands the rdm engine before the message
/// engine checks the limit again (rndv `Endpoint::progress`: `RX_ROUNDS`
/// batches of `RX_BATCH`).
const ROUND_DATAGRAMS: usize = rndv::endpoint::RX_ROUNDS * rndv::endpoint::RX_BATCH;
/// `FI_RDMX_UDP_MTU`'s default: no datagram carries more.
const MTU: usize = 1472;
/// More than the message engine adds to each message (its header), which the
/// receiver counts in the bytes it holds.
const HEADER_MAX: usize = 256;
/// Messages the receiver may hold: the limit, one round, one message begun before.
const MOST: usize = (LIMIT + ROUND_DATAGRAMS * MTU + LEN + HEADER_MAX) / LEN;
/// Messages it takes before it may pause (it holds more than the limit then).
const LEAST: usize = LIMIT / (LEN + HEADER_MAX) + 1;
// Room to tell the bounds apart, and messages left over once the receiver pauses.
const _: () = assert!(LEAST < MOST && MOST < N);

/// Counts the send completions `a` has queued; an error fails the test.
fn drain(a: &Stack, done: &mut usize) {
    loop {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: a libfabric call on objects this test opened and still holds; `e` outlives the call.
        let n = unsafe { fi::fi_cq_read(a.cq, &mut e as *mut _ as *mut _, 1) };
        if n == 1 {
            *done += 1;
            continue;
        }
        if n == -(fi::FI_EAVAIL as isize) {
            let mut err = fi::fi_cq_err_entry::default();
            // SAFETY: as above.
            assert_eq!(unsafe { fi::fi_cq_readerr(a.cq, &mut err, 0) }, 1);
            panic!("a send failed: error {}", err.err);
        }
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
        return;
    }
}

/// Asserts the receiver holds no more than the bound: `done` messages were
/// processed by it, `received` taken out by receives.
fn check_held(done: usize, received: usize, when: &str) {
    let held = done.saturating_sub(received);
    assert!(
        held <= MOST,
        "{when}: the receiver holds at least {held} unexpected messages of {LEN} bytes ({} bytes) with a limit of {LIMIT}; the bound is {MOST} (limit + {ROUND_DATAGRAMS} datagrams of {MTU} bytes + one message)",
        held * LEN
    );
}

#[test]
fn unexpected_memory_limit_applies_back_pressure_without_loss() {
    let stats = std::env::temp_dir().join(format!("rdmx-backpressure-{}.jsonl", unique_tag()));
    let _ = std::fs::remove_file(&stats);
    // SAFETY: before the first libfabric call of this test binary (one test).
    unsafe {
        std::env::set_var("FI_RDMX_UNEXPECTED_LIMIT", LIMIT.to_string());
        // Interval documents: the receiver says when it refuses new messages.
        std::env::set_var("FI_RDMX_STATS", &stats);
        std::env::set_var("FI_RDMX_STATS_INTERVAL", "20");
    }
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    let bodies: Vec<Vec<u8>> = (0..N).map(|i| vec![i as u8; LEN]).collect();
    let mut done = 0usize;
    for body in &bodies {
        loop {
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            let r = unsafe { fi::fi_send(a.ep, body.as_ptr() as *const _, LEN, null_mut(), b_at_a, null_mut()) };
            if r == 0 {
                break;
            }
            assert_eq!(r, -(fi::FI_EAGAIN as isize));
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
            drain(&a, &mut done);
        }
        drain(&a, &mut done);
        check_held(done, 0, "while sending");
    }

    // No receive posted: both sides progress until the receiver says (its
    // interval document) that it refuses new messages, holding its limit,
    // and every message it took has completed at the sender (the count in
    // the document equals ours: no acknowledgement still on its way).
    let deadline = Instant::now() + Duration::from_secs(30);
    let b_uri = b.uri();
    let mut looked = Instant::now();
    loop {
        drain(&a, &mut done);
        check_held(done, 0, "with no receive posted");
        // The file grows by a document every 20 ms: read it every 10.
        if done >= LEAST && looked.elapsed() >= Duration::from_millis(10) {
            looked = Instant::now();
            let settled = documents_of(&stats, &b_uri)
                .last()
                .is_some_and(|d| d["refusing_messages"] == true && received_from_first_peer(d) == done as u64);
            if settled {
                break;
            }
        }
        assert!(Instant::now() < deadline, "the receiver accepted only {done} messages of {LEN} bytes within 30 s: it stopped before holding more than its limit of {LIMIT} bytes ({LEAST} messages)");
        // SAFETY: a libfabric call on objects this test opened and still holds.
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    let settled = done;
    println!("{settled} of {N} messages of {LEN} bytes held with a limit of {LIMIT} bytes (bounds {LEAST}..={MOST})");

    // Now receive everything, in order. The receiver resumes only once it
    // holds at most half its limit: when the sender first completes more, the
    // receiver had taken `settled - held` messages with held ≤ LIMIT / 2.
    let mut buf = vec![0u8; LEN];
    let mut resumed = false;
    for (i, body) in bodies.iter().enumerate() {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, LEN, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0)
        };
        let c = b.wait_cq(&[&a]).expect("receive");
        assert_eq!(c.len, LEN);
        assert!(buf == *body, "message {i} corrupted or out of order");
        drain(&a, &mut done);
        check_held(done, i + 1, &format!("after {} receives", i + 1));
        if !resumed && done > settled {
            resumed = true;
            let still_held = settled.saturating_sub(i + 1) * LEN;
            assert!(
                still_held <= LIMIT / 2,
                "the receiver resumed with at least {still_held} bytes unexpected (after {} receives), more than half its limit of {LIMIT}",
                i + 1
            );
        }
    }
    while done < N {
        a.wait_cq(&[&b]).expect("send completion");
        done += 1;
    }
    let _ = std::fs::remove_file(&stats);
}
