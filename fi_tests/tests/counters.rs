//! Counters bound to an endpoint count completed sends and receives (and
//! errors), and fi_cntr_wait drives progress until the threshold is reached —
//! the fabtests fi_rdm_cntr_pingpong pattern: no CQ at all.
use fi_tests::*;
use std::ptr::null_mut;

struct CntrEp {
    _info: Info,
    fabric: *mut fi::fid_fabric,
    domain: *mut fi::fid_domain,
    av: *mut fi::fid_av,
    tx: *mut fi::fid_cntr,
    rx: *mut fi::fid_cntr,
    ep: *mut fi::fid_ep,
}

impl CntrEp {
    fn open() -> CntrEp {
        CntrEp::open_with(fi::FI_WAIT_UNSPEC)
    }

    fn open_with(wait_obj: fi::fi_wait_obj) -> CntrEp {
        CntrEp::open_on("udp", wait_obj)
    }

    fn open_on(domain: &str, wait_obj: fi::fi_wait_obj) -> CntrEp {
        let mut h = Hints::rdm();
        h.set_domain_name(domain);
        let info = getinfo(None, None, 0, Some(&h)).unwrap();
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        unsafe {
            let mut fabric = null_mut();
            assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
            let mut domain = null_mut();
            assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
            let mut a = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
            let mut av = null_mut();
            assert_eq!(fi::fi_av_open(domain, &mut a, &mut av, null_mut()), 0);
            let mut ca = fi::fi_cntr_attr { events: fi::FI_CNTR_EVENTS_COMP, wait_obj, ..Default::default() };
            let (mut tx, mut rx) = (null_mut(), null_mut());
            assert_eq!(fi::fi_cntr_open(domain, &mut ca, &mut tx, null_mut()), 0);
            assert_eq!(fi::fi_cntr_open(domain, &mut ca, &mut rx, null_mut()), 0);
            let mut ep = null_mut();
            assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
            assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
            assert_eq!(fi::fi_ep_bind(ep, &mut (*tx).fid, fi::FI_SEND as u64), 0);
            assert_eq!(fi::fi_ep_bind(ep, &mut (*rx).fid, fi::FI_RECV as u64), 0);
            assert_eq!(fi::fi_enable(ep), 0);
            CntrEp { _info: info, fabric, domain, av, tx, rx, ep }
        }
    }

    fn name(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let mut len = buf.len();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr() as *mut _, &mut len) }, 0);
        buf.truncate(len);
        buf
    }
}

impl Drop for CntrEp {
    fn drop(&mut self) {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(fi::fi_close(&mut (*self.ep).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.tx).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.rx).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.av).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.domain).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.fabric).fid), 0);
        }
    }
}

/// An inject to a shared-memory peer completes in the call (the small-message
/// path writes it into the peer's ring): the send counter still counts it,
/// though no CQ entry is ever made for an inject.
#[test]
fn injects_over_shared_memory_count_on_the_send_counter() {
    init();
    let a = CntrEp::open_on("shm", fi::FI_WAIT_UNSPEC);
    let b = CntrEp::open_on("shm", fi::FI_WAIT_UNSPEC);
    let mut b_at_a = 0u64;
    let name = b.name();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_av_insert(a.av, name.as_ptr() as *const _, 1, &mut b_at_a, 0, null_mut()) }, 1);
    let mut bufs = [[0u8; 8]; 10];
    for buf in bufs.iter_mut() {
        assert_eq!(
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            unsafe { fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()) },
            0
        );
    }
    // One at a time, each received and the sender's progress driven before
    // the next: the small-message path is taken only by a send with nothing
    // else pending, so that all but the first take it.
    for i in 0..10u8 {
        let body = [i; 8];
        // SAFETY: a libfabric call on objects this test opened and still holds; the inject copies the buffer before it returns.
        assert_eq!(unsafe { fi::fi_inject(a.ep, body.as_ptr() as *const _, 8, b_at_a) }, 0);
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_cntr_wait(b.rx, i as u64 + 1, 10_000) }, 0);
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_cntr_wait(a.tx, i as u64 + 1, 10_000) }, 0, "inject {i} not counted");
    }
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_read(a.tx) }, 10);
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(buf, &[i as u8; 8]);
    }
}

#[test]
fn send_and_receive_counters_without_a_cq() {
    init();
    let a = CntrEp::open();
    let b = CntrEp::open();
    let mut b_at_a = 0u64;
    let name = b.name();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_av_insert(a.av, name.as_ptr() as *const _, 1, &mut b_at_a, 0, null_mut()) }, 1);
    let mut bufs = vec![[0u8; 32]; 10];
    for buf in bufs.iter_mut() {
        assert_eq!(
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            unsafe { fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, 32, null_mut(), FI_ADDR_UNSPEC, null_mut()) },
            0
        );
    }
    for i in 0..10u8 {
        let body = [i; 32];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_send(a.ep, body.as_ptr() as *const _, 32, null_mut(), b_at_a, null_mut()) }, 0);
    }
    // The receiver's wait drives its progress; the sender's completes on acks.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_wait(b.rx, 10, 10_000) }, 0);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_wait(a.tx, 10, 10_000) }, 0);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_read(b.rx) }, 10);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_read(a.tx) }, 10);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cntr_readerr(a.tx) }, 0);
    for (i, buf) in bufs.iter().enumerate() {
        assert_eq!(buf, &[i as u8; 32]);
    }
    // A truncated receive counts as an error.
    let mut small = [0u8; 4];
    assert_eq!(
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_recv(b.ep, small.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()) },
        0
    );
    let body = [9u8; 32];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_send(a.ep, body.as_ptr() as *const _, 32, null_mut(), b_at_a, null_mut()) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    while unsafe { fi::fi_cntr_readerr(b.rx) } == 0 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cntr_read(a.tx) };
        assert!(std::time::Instant::now() < deadline, "truncation never counted");
    }
}

#[test]
fn counter_wait_fd_wakes_when_the_counter_moves() {
    init();
    let a = CntrEp::open();
    let b = CntrEp::open_with(fi::FI_WAIT_FD);
    let mut b_at_a = 0u64;
    let name = b.name();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_av_insert(a.av, name.as_ptr() as *const _, 1, &mut b_at_a, 0, null_mut()) }, 1);
    let mut fd: libc::c_int = -1;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_control(&mut (*b.rx).fid, fi::FI_GETWAIT as i32, &mut fd as *mut _ as *mut _), 0);
        assert!(fd >= 0);
        let mut fids = [&mut (*b.rx).fid as *mut fi::fid];
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*b._info.0).fabric_attr, &mut fabric, null_mut()), 0);
        assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), 0);
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, 50), 0, "quiet before any event");
        let mut buf = [0u8; 8];
        assert_eq!(fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, b"counted!".as_ptr() as *const _, 8, null_mut(), b_at_a, null_mut()), 0);
        let mut woke = false;
        for _ in 0..100 {
            fi::fi_cntr_read(a.tx);
            if libc::poll(&mut pfd, 1, 20) > 0 {
                woke = true;
                break;
            }
        }
        assert!(woke, "the counter fd never became readable");
        assert_eq!(
            fi::fi_trywait(fabric, fids.as_mut_ptr(), 1),
            -(fi::FI_EAGAIN as i32),
            "counter moved since last read"
        );
        assert_eq!(fi::fi_cntr_read(b.rx), 1);
        assert_eq!(&buf, b"counted!");
        assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}

/// Readable within `ms` milliseconds.
fn readable(fd: libc::c_int, ms: i32) -> bool {
    let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, ms) > 0 }
}

/// fi_cntr_add, fi_cntr_set, fi_cntr_adderr and fi_cntr_seterr move the counter
/// as a completion does: its FI_WAIT_FD fd turns readable and fi_trywait says
/// not to sleep, until the application reads the counter; and a wait set the
/// counter belongs to wakes (fi_wait returns 0, the set's fd turns readable).
#[test]
fn every_way_to_change_a_counter_wakes_its_fd_and_its_wait_set() {
    init();
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    type Change = unsafe extern "C" fn(*mut fi::fid_cntr, u64) -> i32;
    let changes: [(&str, Change, bool); 4] = [
        ("fi_cntr_add", fi::fi_cntr_add, false),
        ("fi_cntr_set", fi::fi_cntr_set, false),
        ("fi_cntr_adderr", fi::fi_cntr_adderr, true),
        ("fi_cntr_seterr", fi::fi_cntr_seterr, true),
    ];
    // SAFETY: libfabric calls on objects this test opens here and closes at the end.
    unsafe {
        let (mut fabric, mut domain, mut set) = (null_mut(), null_mut(), null_mut());
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut wa = fi::fi_wait_attr { wait_obj: fi::FI_WAIT_FD, flags: 0 };
        assert_eq!(fi::fi_wait_open(fabric, &mut wa, &mut set), 0);
        let mut set_fd: libc::c_int = -1;
        assert_eq!(fi::fi_control(&mut (*set).fid, fi::FI_GETWAIT as i32, &mut set_fd as *mut _ as *mut _), 0);
        let mut with_fd =
            fi::fi_cntr_attr { events: fi::FI_CNTR_EVENTS_COMP, wait_obj: fi::FI_WAIT_FD, ..Default::default() };
        let mut in_set = fi::fi_cntr_attr {
            events: fi::FI_CNTR_EVENTS_COMP,
            wait_obj: fi::FI_WAIT_SET,
            wait_set: set,
            ..Default::default()
        };
        let (mut c, mut s) = (null_mut(), null_mut());
        assert_eq!(fi::fi_cntr_open(domain, &mut with_fd, &mut c, null_mut()), 0);
        assert_eq!(fi::fi_cntr_open(domain, &mut in_set, &mut s, null_mut()), 0);
        let mut fd: libc::c_int = -1;
        assert_eq!(fi::fi_control(&mut (*c).fid, fi::FI_GETWAIT as i32, &mut fd as *mut _ as *mut _), 0);
        let mut fids = [&mut (*c).fid as *mut fi::fid];
        for (i, (name, change, errors)) in changes.into_iter().enumerate() {
            let value = 10 + i as u64;
            assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), 0, "{name}: quiet before");
            assert!(!readable(fd, 0), "{name}: quiet before");
            assert_eq!(fi::fi_wait(set, 0), neg(fi::FI_ETIMEDOUT), "{name}: the set is quiet before");
            assert_eq!(change(c, value), 0);
            assert_eq!(change(s, value), 0);
            assert!(readable(fd, 1000), "{name}: the counter's fd stayed quiet");
            assert_eq!(
                fi::fi_trywait(fabric, fids.as_mut_ptr(), 1),
                neg(fi::FI_EAGAIN),
                "{name}: fi_trywait would let a waiter sleep through it"
            );
            assert!(readable(set_fd, 1000), "{name}: the wait set's fd stayed quiet");
            assert_eq!(fi::fi_wait(set, 1000), 0, "{name}: fi_wait missed it");
            // Reading the counter clears both.
            let read: unsafe extern "C" fn(*mut fi::fid_cntr) -> u64 =
                if errors { fi::fi_cntr_readerr } else { fi::fi_cntr_read };
            assert!(read(c) >= value && read(s) >= value, "{name}: the value");
            assert!(!readable(fd, 0), "{name}: still readable after the read");
        }
        assert_eq!(fi::fi_close(&mut (*c).fid), 0);
        assert_eq!(fi::fi_close(&mut (*s).fid), 0);
        assert_eq!(fi::fi_close(&mut (*set).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}
