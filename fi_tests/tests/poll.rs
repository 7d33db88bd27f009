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

/// The contexts one `fi_poll` call returns, with room for `room`.
fn poll(set: *mut fi::fid_poll, room: usize) -> Vec<usize> {
    let mut ctx: Vec<*mut libc::c_void> = vec![null_mut(); room.max(1)];
    // SAFETY: a poll set this test opened and still holds; `ctx` has room for `room` contexts.
    let n = unsafe { fi::fi_poll(set, ctx.as_mut_ptr(), room as i32) };
    assert!(n >= 0 && n as usize <= room, "fi_poll returned {n}");
    ctx[..n as usize].iter().map(|&p| p as usize).collect()
}

/// A counter in a poll set (fi_poll(3): "The context associated with a counter
/// will be returned if the counter's success value or error value have changed
/// since the last time fi_poll, fi_cntr_set, or fi_cntr_add were called"; rdmx:
/// prov/src/poll.rs, `poll_poll`, compares with the (value, errors) it last
/// reported). The counter counts an endpoint's receives (FI_RECV) and fi_poll
/// is what progresses that endpoint: nothing before a message, the counter's
/// own context (the one given to fi_cntr_open) once a receive completed,
/// nothing again until the next change — reading the counter neither reports
/// nor hides a change — and the error count moves it too.
#[test]
fn fi_poll_reports_a_counter_that_moved() {
    const ONE: &[u8; 32] = b"counter in a poll set, message 1";
    const TWO: &[u8; 32] = b"counter in a poll set, message 2";
    const THREE: &[u8; 32] = b"counter in a poll set, truncated";
    init();
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
    // The counter's context: what fi_poll must hand back.
    let mut marker = 0xC0_u64;
    let cntr_ctx = &mut marker as *mut u64 as *mut libc::c_void;
    let (mut fabric, mut domain, mut av, mut cntr, mut ep, mut set) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    // SAFETY: libfabric calls on objects this test opens here and holds until the end; every attr outlives its call.
    unsafe {
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        let mut ca =
            fi::fi_cntr_attr { events: fi::FI_CNTR_EVENTS_COMP, wait_obj: fi::FI_WAIT_NONE, ..Default::default() };
        assert_eq!(fi::fi_cntr_open(domain, &mut ca, &mut cntr, cntr_ctx), 0);
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cntr).fid, fi::FI_RECV as u64), 0);
        assert_eq!(fi::fi_enable(ep), 0);
        let mut attr = fi::fi_poll_attr { flags: 0 };
        assert_eq!(fi::fi_poll_open(domain, &mut attr, &mut set), 0);
        assert_eq!(fi::fi_poll_add(set, &mut (*cntr).fid, 0), 0);
        assert_eq!(fi::fi_poll_add(set, &mut (*cntr).fid, 0), neg(fi::FI_EINVAL), "added twice");
    }
    let mut name = vec![0u8; 64];
    let mut len = name.len();
    // SAFETY: as above; `name` has `len` bytes of room.
    assert_eq!(unsafe { fi::fi_getname(&mut (*ep).fid, name.as_mut_ptr() as *mut _, &mut len) }, 0);
    let dest = a.insert(&name[..len]);
    let send = |body: &'static [u8; 32]| {
        // SAFETY: the sender's objects; `body` is static.
        let r = unsafe { fi::fi_send(a.ep, body.as_ptr() as *const _, body.len(), null_mut(), dest, null_mut()) };
        assert_eq!(r, 0);
    };
    // fi_poll until it reports something (it progresses the receiver; the
    // sender progresses on its CQ reads, whose send completions stay queued).
    let until_reported = |what: &str| -> Vec<usize> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // SAFETY: the sender's CQ; a zero-count read only drives progress.
            unsafe { fi::fi_cq_read(a.cq, null_mut(), 0) };
            let got = poll(set, 4);
            if !got.is_empty() {
                return got;
            }
            assert!(Instant::now() < deadline, "fi_poll never reported the counter after {what}");
        }
    };
    let ctx = cntr_ctx as usize;

    assert_eq!(poll(set, 4), Vec::<usize>::new(), "nothing happened yet");

    // A receive completes: fi_poll returns the counter's context, once.
    let mut rbuf = [0u8; 32];
    // SAFETY: `rbuf` outlives the receive (its completion is waited for below).
    assert_eq!(unsafe { fi::fi_recv(ep, rbuf.as_mut_ptr() as *mut _, 32, null_mut(), FI_ADDR_UNSPEC, null_mut()) }, 0);
    send(ONE);
    assert_eq!(until_reported("the first receive"), vec![ctx], "the counter's fi_cntr_open context");
    // SAFETY: the counter this test opened.
    assert_eq!(unsafe { (fi::fi_cntr_read(cntr), fi::fi_cntr_readerr(cntr)) }, (1, 0));
    assert_eq!(&rbuf, ONE);
    assert_eq!(poll(set, 4), Vec::<usize>::new(), "reported already; nothing changed since");

    // The next receive, noticed through fi_cntr_read first: the read does not
    // consume the change fi_poll has to report (fi_poll(3) resets on fi_poll,
    // fi_cntr_set and fi_cntr_add only).
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_recv(ep, rbuf.as_mut_ptr() as *mut _, 32, null_mut(), FI_ADDR_UNSPEC, null_mut()) }, 0);
    send(TWO);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: the counter this test opened; its read drives the receiver's progress.
        let value = unsafe { fi::fi_cntr_read(cntr) };
        if value >= 2 {
            break;
        }
        // SAFETY: the sender's CQ; a zero-count read only drives progress.
        unsafe { fi::fi_cq_read(a.cq, null_mut(), 0) };
        assert!(Instant::now() < deadline, "the second receive never counted");
    }
    assert_eq!(&rbuf, TWO);
    assert_eq!(poll(set, 4), vec![ctx], "a change already read with fi_cntr_read is still reported");
    assert_eq!(poll(set, 4), Vec::<usize>::new(), "and only once");

    // A truncated receive moves the error count only: reported as well.
    let mut small = [0u8; 4];
    // SAFETY: `small` outlives the receive (its error is waited for below).
    assert_eq!(unsafe { fi::fi_recv(ep, small.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()) }, 0);
    send(THREE);
    assert_eq!(until_reported("a truncated receive"), vec![ctx]);
    // SAFETY: as above.
    assert_eq!(unsafe { (fi::fi_cntr_read(cntr), fi::fi_cntr_readerr(cntr)) }, (2, 1));
    assert_eq!(poll(set, 4), Vec::<usize>::new());

    for _ in 0..3 {
        a.wait_cq(&[]).expect("send completion");
    }
    // SAFETY: closing what this test opened. With the endpoint closed, only
    // the poll set still holds the counter.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*ep).fid), 0);
        assert_eq!(fi::fi_close(&mut (*cntr).fid), neg(fi::FI_EBUSY), "a counter in a poll set is busy");
        assert_eq!(fi::fi_poll_del(set, &mut (*cntr).fid, 0), 0);
        assert_eq!(fi::fi_close(&mut (*cntr).fid), 0);
        assert_eq!(fi::fi_close(&mut (*set).fid), 0);
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}
