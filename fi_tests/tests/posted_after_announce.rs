//! A receive posted after a long message's announcement (rendezvous RTS) already
//! arrived must complete on the receiver's own progress: the pull it starts
//! needs no further input. (It once waited for the next datagram, a sender's
//! keepalive up to half a second later: 250 ms per 64 KiB message under MPI.)
//! The sender is not progressed at all here, and no progress thread runs.
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

#[test]
fn a_receive_posted_for_an_announced_message_completes_without_more_input() {
    // SAFETY: set before libfabric is loaded in this test process (one test).
    unsafe { std::env::set_var("FI_RDMX_PROGRESS_THREAD", "0") };
    init();
    let a = Stack::open(Some("shm"), fi::FI_AV_MAP);
    let b = Stack::open(Some("shm"), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    a.insert(&a.name());
    b.insert(&a.name());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let mut back = vec![0u8; data.len()];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_tsend(a.ep, data.as_ptr() as *const _, data.len(), null_mut(), b_at_a, 5, null_mut()), 0)
    };
    // Wait until the announcement is at b, unexpected (b's peeks progress b
    // only): the receive below is then surely posted after it, which is the
    // case this test is about.
    assert_eq!(b.peek_tagged(5, &[], Duration::from_secs(30)), data.len(), "the announcement's length");
    // SAFETY: as above.
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, back.as_mut_ptr() as *mut _, back.len(), null_mut(), FI_ADDR_UNSPEC, 5, 0, null_mut()),
            0
        )
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: as above.
        let n = unsafe { fi::fi_cq_read(b.cq, &mut e as *mut _ as *mut _, 1) };
        if n == 1 {
            assert_eq!(e.len, data.len());
            break;
        }
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
        assert!(Instant::now() < deadline, "the receive waits for input that will not come");
    }
    assert!(back == data);
    // The sender completes once it is progressed (the Fin waits for it).
    a.wait_cq(&[&b]).expect("send completion");
}
