//! A peer that is gone: its UDP port is closed, so the kernel answers our
//! datagrams with ICMP port unreachable. The application must see an error it can
//! act on, quickly (not at the 30 s peer timeout), and never an error entry
//! without the failed operation's context (OpenMPI dereferences it).
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

fn ctx(v: &mut u64) -> *mut libc::c_void {
    v as *mut u64 as *mut libc::c_void
}

/// The name of an endpoint that was opened and closed again: nobody listens there.
fn dead_peer_name() -> Vec<u8> {
    let gone = Stack::open(Some("udp"), fi::FI_AV_MAP);
    gone.name()
}

#[test]
fn send_and_directed_receive_to_a_closed_port_fail_by_icmp_not_the_peer_timeout() {
    init();
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let dead_name = dead_peer_name();
    let dead = a.insert(&dead_name);
    // The peer as fi_av_straddr names it: host id, UDP address, incarnation.
    let mut buf = vec![0 as libc::c_char; 256];
    let mut len = buf.len();
    // SAFETY: a libfabric call on the AV this test opened, with a buffer of `len` bytes and a whole address.
    let uri = unsafe {
        std::ffi::CStr::from_ptr(fi::fi_av_straddr(a.av, dead_name.as_ptr() as *const _, buf.as_mut_ptr(), &mut len))
    }
    .to_string_lossy()
    .into_owned();
    let (mut rctx, mut sctx) = (11u64, 22u64);
    let mut rbuf = vec![0u8; 64];
    let started = Instant::now();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(a.ep, rbuf.as_mut_ptr() as *mut _, rbuf.len(), null_mut(), dead, ctx(&mut rctx)), 0);
        assert_eq!(fi::fi_send(a.ep, b"anyone?".as_ptr() as *const _, 7, null_mut(), dead, ctx(&mut sctx)), 0);
    }
    let mut errs = Vec::new();
    while errs.len() < 2 {
        match a.wait_cq(&[]) {
            Err(e) => errs.push(e),
            Ok(c) => panic!("unexpected success {c:?}"),
        }
    }
    let took = started.elapsed();
    // fi_cq_strerror names the peer, from the last error entry's err_data.
    let last = errs.last().unwrap();
    // SAFETY: a NUL-terminated string libfabric (or the test) owns and keeps alive here.
    let text =
        unsafe { std::ffi::CStr::from_ptr(fi::fi_cq_strerror(a.cq, last.prov_errno, last.err_data, null_mut(), 0)) }
            .to_string_lossy()
            .into_owned();
    // It says why, and names the whole peer (its AV address: host id and
    // incarnation included, not only what its datagrams came from).
    assert!(text.contains(&format!("(peer {uri})")), "strerror does not name {uri}: {text}");
    assert!(text.contains("reported the peer unreachable"), "strerror does not say why: {text}");
    assert_ne!(last.prov_errno, last.err, "prov_errno carries the precise reason");
    // A sixth of the peer timeout in force (rdmx's default): ICMP failed the
    // peer, not the timeout; a ratio, not a guess at a loaded machine's speed.
    let bound = rndv::EndpointConfig::default().peer_timeout / 6;
    assert!(took < bound, "ICMP unreachable should fail the peer at once, took {took:?} (bound {bound:?})");
    let send = errs.iter().find(|e| e.op_context == ctx(&mut sctx)).expect("send error entry carries its context");
    assert_ne!(send.flags & fi::FI_SEND as u64, 0);
    let recv = errs.iter().find(|e| e.op_context == ctx(&mut rctx)).expect("receive error entry carries its context");
    assert_eq!(recv.err, fi::FI_EHOSTUNREACH as i32);
    assert_ne!(recv.flags & fi::FI_RECV as u64, 0);
    // Nothing else is queued: in particular no entry without a context.
    let mut e = fi::fi_cq_tagged_entry::default();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_cq_read(a.cq, &mut e as *mut _ as *mut _, 1) }, -(fi::FI_EAGAIN as isize));
}

#[test]
fn failed_inject_goes_to_the_eq_never_to_the_cq_without_context() {
    init();
    let a = Stack::open_with_eq(Some("udp"), fi::FI_AV_MAP);
    let dead = a.insert(&dead_peer_name());
    let eq = a.eq;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_inject(a.ep, b"fire and forget".as_ptr() as *const _, 15, dead), 0);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut eq_errs = Vec::new();
    while eq_errs.len() < 2 && Instant::now() < deadline {
        let mut c = fi::fi_cq_tagged_entry::default();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let n = unsafe { fi::fi_cq_read(a.cq, &mut c as *mut _ as *mut _, 1) };
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "an inject must produce no CQ entry, error or not");
        let mut ev = 0u32;
        let mut buf = [0u8; 64];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let r = unsafe { fi::fi_eq_read(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 0) };
        if r == -(fi::FI_EAVAIL as isize) {
            let mut err = fi::fi_eq_err_entry::default();
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            assert_eq!(unsafe { fi::fi_eq_readerr(eq, &mut err, 0) }, 1);
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            assert_eq!(err.fid, unsafe { &mut (*a.ep).fid } as *mut fi::fid, "the error names the endpoint");
            eq_errs.push(err.err);
        } else {
            assert_eq!(r, -(fi::FI_EAGAIN as isize));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    // One for the failed inject, one naming the peer's failure.
    assert_eq!(eq_errs, [fi::FI_EHOSTUNREACH as i32; 2], "EQ errors");
}
