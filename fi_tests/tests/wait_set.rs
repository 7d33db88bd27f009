//! Wait sets as fi_wait(3) defines them: a CQ, a counter and an EQ opened with
//! `wait_obj = FI_WAIT_SET` on one set; `fi_wait` returns 0 as soon as any of
//! them has something (progressing the CQ's endpoint itself) and
//! `-FI_ETIMEDOUT` otherwise; `fi_control(FI_GETWAIT)` hands out an fd that
//! turns readable when data arrives (after `fi_trywait` said sleeping is safe);
//! the set cannot close before its members. It was -FI_ENOSYS before.
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

/// `fi_wait`, and how long it took.
fn wait(set: *mut fi::fid_wait, ms: i32) -> (i32, Duration) {
    let t = Instant::now();
    // SAFETY: a libfabric call on a wait set this test opened and still holds.
    let r = unsafe { fi::fi_wait(set, ms) };
    (r, t.elapsed())
}

#[test]
fn fi_wait_wakes_for_cq_counter_and_eq_members_and_times_out_otherwise() {
    init();
    let sender = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
    let (mut fabric, mut domain, mut set, mut av, mut cq, mut cntr, mut eq, mut ep) =
        (null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut(), null_mut());
    // SAFETY: libfabric calls on objects this test opens here and holds until the end; every attr outlives its call.
    unsafe {
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut wa = fi::fi_wait_attr { wait_obj: fi::FI_WAIT_MUTEX_COND, flags: 0 };
        assert_eq!(
            fi::fi_wait_open(fabric, &mut wa, &mut set),
            neg(fi::FI_ENOSYS),
            "mutex/cond wait sets are not offered"
        );
        wa.wait_obj = fi::FI_WAIT_FD;
        assert_eq!(fi::fi_wait_open(fabric, &mut wa, &mut set), 0, "fi_wait_open");
        let mut cq_attr = fi::fi_cq_attr {
            format: fi::FI_CQ_FORMAT_TAGGED,
            size: 64,
            wait_obj: fi::FI_WAIT_SET,
            wait_set: set,
            ..Default::default()
        };
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut ca = fi::fi_cntr_attr {
            events: fi::FI_CNTR_EVENTS_COMP,
            wait_obj: fi::FI_WAIT_SET,
            wait_set: set,
            ..Default::default()
        };
        assert_eq!(fi::fi_cntr_open(domain, &mut ca, &mut cntr, null_mut()), 0);
        let mut ea = fi::fi_eq_attr { size: 16, wait_obj: fi::FI_WAIT_SET, wait_set: set, ..Default::default() };
        assert_eq!(fi::fi_eq_open(fabric, &mut ea, &mut eq, null_mut()), 0);
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cntr).fid, fi::FI_RECV as u64), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*eq).fid, 0), 0);
        assert_eq!(fi::fi_enable(ep), 0);
    }
    let mut fd: libc::c_int = -1;
    let mut obj: fi::fi_wait_obj = fi::FI_WAIT_NONE;
    // SAFETY: as above; the out-arguments are locals of the right types.
    unsafe {
        assert_eq!(fi::fi_control(&mut (*set).fid, fi::FI_GETWAIT as i32, &mut fd as *mut _ as *mut _), 0);
        assert_eq!(fi::fi_control(&mut (*set).fid, fi::FI_GETWAITOBJ as i32, &mut obj as *mut _ as *mut _), 0);
    }
    assert!(fd >= 0 && obj == fi::FI_WAIT_FD, "fd {fd}, wait obj {obj}");

    // Nothing yet: the timeout.
    let (r, took) = wait(set, 100);
    assert_eq!(r, neg(fi::FI_ETIMEDOUT));
    assert!(took >= Duration::from_millis(100), "{took:?}");

    // A message: fi_wait progresses the receiver and returns for its CQ entry.
    let mut ep_name = vec![0u8; 64];
    let mut len = ep_name.len();
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_getname(&mut (*ep).fid, ep_name.as_mut_ptr() as *mut _, &mut len) }, 0);
    let dest = sender.insert(&ep_name[..len]);
    let mut rbuf = [0u8; 8];
    let mut sends = 0;
    let mut send = |msg: &[u8; 8]| {
        // SAFETY: the sender's objects; `msg` is copied (a completion is read below).
        assert_eq!(unsafe { fi::fi_send(sender.ep, msg.as_ptr() as *const _, 8, null_mut(), dest, null_mut()) }, 0);
        sends += 1;
    };
    // SAFETY: `rbuf` outlives the receive (read below).
    assert_eq!(unsafe { fi::fi_recv(ep, rbuf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()) }, 0);
    send(b"waitset1");
    let (r, took) = wait(set, 5000);
    assert_eq!(r, 0, "fi_wait after {took:?}");
    let mut e = fi::fi_cq_tagged_entry::default();
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_cq_read(cq, &mut e as *mut _ as *mut _, 1) }, 1);
    assert_eq!(&rbuf, b"waitset1");
    // The counter moved and was not read yet: still something.
    assert_eq!(wait(set, 0).0, 0, "the counter changed unseen");
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_cntr_read(cntr) }, 1);
    assert_eq!(wait(set, 50).0, neg(fi::FI_ETIMEDOUT), "everything seen");

    // The fd: after fi_trywait, it turns readable when the next message arrives.
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_recv(ep, rbuf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()) }, 0);
    let mut fids = [set as *mut fi::fid];
    // SAFETY: as above; `fids` holds our wait set's fid.
    assert_eq!(unsafe { fi::fi_trywait(fabric, fids.as_mut_ptr(), 1) }, 0, "nothing pending: sleeping is safe");
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "the wait set's fd is readable with nothing to report");
    send(b"waitset2");
    // SAFETY: one valid pollfd.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "the wait set's fd never turned readable");
    assert_eq!(wait(set, 5000).0, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_cq_read(cq, &mut e as *mut _ as *mut _, 1) }, 1);
    assert_eq!(&rbuf, b"waitset2");
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_cntr_read(cntr) }, 2);

    // An EQ event.
    let entry = [0u8; 8];
    // SAFETY: as above; `entry` is copied by the write.
    assert_eq!(unsafe { fi::fi_eq_write(eq, fi::FI_NOTIFY, entry.as_ptr() as *const _, 8, 0) }, 8);
    assert_eq!(wait(set, 1000).0, 0, "the EQ has an event");
    let (mut ev, mut buf) = (0u32, [0u8; 64]);
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_eq_read(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 0) }, 8);
    assert_eq!(wait(set, 50).0, neg(fi::FI_ETIMEDOUT));

    // The sender's completions (it progresses on its own reads).
    for _ in 0..sends {
        sender.wait_cq(&[]).expect("send completion");
    }
    // SAFETY: closing what this test opened, members before their set.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*set).fid), neg(fi::FI_EBUSY), "a set with members is busy");
        assert_eq!(fi::fi_close(&mut (*ep).fid), 0);
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
        assert_eq!(fi::fi_close(&mut (*cq).fid), 0);
        assert_eq!(fi::fi_close(&mut (*cntr).fid), 0);
        assert_eq!(fi::fi_close(&mut (*eq).fid), 0);
        assert_eq!(fi::fi_close(&mut (*set).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}
