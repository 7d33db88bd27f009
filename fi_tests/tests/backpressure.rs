//! Unexpected messages are buffered up to FI_RDMX_UNEXPECTED_LIMIT bytes; beyond
//! it the receiver stops accepting and senders wait. Nothing is dropped: once
//! receives are posted, every message arrives intact and in order.
use fi_tests::*;
use std::ptr::null_mut;

#[test]
fn unexpected_memory_limit_applies_back_pressure_without_loss() {
    // SAFETY: before the first libfabric call of this test binary (one test).
    unsafe { std::env::set_var("FI_RDMX_UNEXPECTED_LIMIT", "65536") };
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    const N: usize = 64;
    const LEN: usize = 16384;
    let bodies: Vec<Vec<u8>> = (0..N).map(|i| vec![i as u8; LEN]).collect();
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
        }
    }
    // Let both sides progress for a while with no receive posted.
    let mut done = 0;
    let until = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while std::time::Instant::now() < until {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        if unsafe { fi::fi_cq_read(a.cq, &mut e as *mut _ as *mut _, 1) } == 1 {
            done += 1;
        }
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    assert!(done < N, "all {N} sends completed: the receiver buffered {} bytes past its limit", N * LEN);
    // Now receive everything, in order.
    let mut buf = vec![0u8; LEN];
    for (i, body) in bodies.iter().enumerate() {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, LEN, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0) };
        let c = b.wait_cq(&[&a]).expect("receive");
        assert_eq!(c.len, LEN);
        assert!(buf == *body, "message {i} corrupted or out of order");
    }
    while done < N {
        a.wait_cq(&[&b]).expect("send completion");
        done += 1;
    }
}
