//! `FI_INJECT` as a flag of `fi_tsendmsg` hands the buffer back at return
//! (fi_msg(3): "the data buffer may be reused immediately"), whatever the
//! protocol thresholds: with both rendezvous thresholds below the message size
//! the send went by rendezvous before, and the receiver read the buffer after
//! the call returned (it got what the application wrote there afterwards).
//! The send still completes on the CQ like any `fi_tsendmsg`. And `FI_INJECT`
//! beyond `inject_size` is refused with `-FI_EINVAL`.
//!
//! Its own binary: the thresholds are set for the whole process before
//! libfabric loads rdmx.
use fi_tests::*;
use std::ptr::null_mut;

fn check(domain: &str) {
    let a = Stack::open(Some(domain), fi::FI_AV_MAP);
    let b = Stack::open(Some(domain), fi::FI_AV_MAP);
    let to_b = a.insert(&b.name());
    const LEN: usize = 2048;
    let mut rbuf = vec![0u8; LEN];
    let mut sbuf = vec![0xAAu8; LEN];
    let mut ctx = 0u64;
    // SAFETY: libfabric calls on objects this test opened and still holds;
    // `rbuf` outlives the receive, `sbuf` the call (the point of the test).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, rbuf.as_mut_ptr() as *mut _, LEN, null_mut(), FI_ADDR_UNSPEC, 9, 0, null_mut()),
            0
        );
        let iov = fi::iovec { iov_base: sbuf.as_mut_ptr() as *mut _, iov_len: LEN };
        let msg = fi::fi_msg_tagged {
            msg_iov: &iov,
            desc: null_mut(),
            iov_count: 1,
            addr: to_b,
            tag: 9,
            ignore: 0,
            context: &mut ctx as *mut u64 as *mut _,
            data: 0,
        };
        assert_eq!(fi::fi_tsendmsg(a.ep, &msg, fi::FI_INJECT as u64), 0, "{domain}: fi_tsendmsg(FI_INJECT)");
    }
    // The application reuses its buffer at once.
    sbuf.fill(0x55);
    let mut sent = false;
    let mut received = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(sent && received) {
        assert!(std::time::Instant::now() < deadline, "{domain}: sent {sent} received {received}");
        for s in [&a, &b] {
            if let Some(c) = s.poll_cq(std::time::Duration::from_millis(1)) {
                let c = c.unwrap_or_else(|e| panic!("{domain}: error completion {}", e.err));
                if c.flags & fi::FI_SEND as u64 != 0 {
                    assert_eq!(c.op_context, &mut ctx as *mut u64 as *mut _, "{domain}: the send's own context");
                    sent = true;
                } else {
                    assert_eq!(c.len, LEN);
                    received = true;
                }
            }
        }
    }
    assert!(
        rbuf.iter().all(|&x| x == 0xAA),
        "{domain}: the receiver got bytes written after fi_tsendmsg(FI_INJECT) returned"
    );
    // Beyond inject_size (4096 by default): refused, as fi_inject is.
    let big = vec![0u8; 8192];
    // SAFETY: as above.
    unsafe {
        let iov = fi::iovec { iov_base: big.as_ptr() as *mut _, iov_len: big.len() };
        let msg = fi::fi_msg_tagged {
            msg_iov: &iov,
            desc: null_mut(),
            iov_count: 1,
            addr: to_b,
            tag: 9,
            ignore: 0,
            context: null_mut(),
            data: 0,
        };
        assert_eq!(
            fi::fi_tsendmsg(a.ep, &msg, fi::FI_INJECT as u64),
            neg(fi::FI_EINVAL) as isize,
            "{domain}: FI_INJECT beyond inject_size"
        );
    }
}

#[test]
fn a_flagged_inject_never_reads_the_buffer_after_return() {
    // SAFETY: before any thread of this binary calls into libfabric.
    unsafe {
        std::env::set_var("FI_RDMX_RNDV_THRESHOLD", "1024");
        std::env::set_var("FI_RDMX_WINDOW_THRESHOLD", "1024");
    }
    init();
    for domain in ["shm", "udp", "auto"] {
        check(domain);
    }
}
