//! Poll sets as fi_poll(3) defines them: fi_poll drives progress of the CQs in
//! the set and reports the context of each that has entries; a CQ in a set
//! cannot close (-FI_EBUSY) until fi_poll_del. It was -FI_ENOSYS before.
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

#[test]
fn fi_poll_reports_the_cq_with_entries() {
    init();
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    let mut pollset = null_mut();
    let mut attr = fi::fi_poll_attr { flags: 0 };
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call.
    unsafe {
        assert_eq!(fi::fi_poll_open(b.domain, &mut attr, &mut pollset), 0);
        assert_eq!(fi::fi_poll_add(pollset, &mut (*b.cq).fid, 0), 0);
        assert_eq!(fi::fi_poll_add(pollset, &mut (*b.cq).fid, 0), neg(fi::FI_EINVAL), "added twice");
    }
    let mut ctx: [*mut libc::c_void; 4] = [null_mut(); 4];
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_poll(pollset, ctx.as_mut_ptr(), 4) }, 0, "nothing yet");
    let mut rbuf = [0u8; 8];
    // SAFETY: as above.
    unsafe {
        assert_eq!(fi::fi_recv(b.ep, rbuf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, b"polled!!".as_ptr() as *const _, 8, null_mut(), b_at_a, null_mut()), 0);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // fi_poll progresses b; a is progressed by its send completion read.
        // SAFETY: as above.
        unsafe { fi::fi_cq_read(a.cq, null_mut(), 0) };
        // SAFETY: as above.
        let n = unsafe { fi::fi_poll(pollset, ctx.as_mut_ptr(), 4) };
        if n == 1 {
            // SAFETY: as above: the CQ's fid context.
            assert_eq!(ctx[0], unsafe { (*b.cq).fid.context });
            break;
        }
        assert_eq!(n, 0);
        assert!(Instant::now() < deadline, "fi_poll never reported the receive");
    }
    assert_eq!(&rbuf, b"polled!!");
    // SAFETY: as above.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*b.cq).fid), neg(fi::FI_EBUSY), "a CQ in a poll set is busy");
        assert_eq!(fi::fi_poll_del(pollset, &mut (*b.cq).fid, 0), 0);
        assert_eq!(fi::fi_close(&mut (*pollset).fid), 0);
    }
}
