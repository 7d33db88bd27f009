//! Data exchange between two endpoints in one process, through the public API:
//! send/recv, tagged with wildcards, remote CQ data, truncation, cancel, send to
//! self, zero-byte and multi-datagram messages, on every device.
use fi_tests::*;
use std::ptr::null_mut;

fn pair(domain: &str) -> (Stack, Stack, u64, u64) {
    let a = Stack::open(Some(domain), fi::FI_AV_MAP);
    let b = Stack::open(Some(domain), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    let a_at_b = b.insert(&a.name());
    (a, b, b_at_a, a_at_b)
}

fn ctx(v: &mut u64) -> *mut libc::c_void {
    v as *mut u64 as *mut libc::c_void
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn msg_roundtrip(domain: &str) {
    let (a, b, b_at_a, a_at_b) = pair(domain);
    for (i, len) in [0usize, 1, 100, 1400, 1500, 4000, 9000, 65536, 300_000].into_iter().enumerate() {
        let data = pattern(len, i as u8);
        let mut rbuf = vec![0u8; len + 16];
        let (mut rctx, mut sctx) = (1u64, 2u64);
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(
                fi::fi_recv(b.ep, rbuf.as_mut_ptr() as *mut _, rbuf.len(), null_mut(), FI_ADDR_UNSPEC, ctx(&mut rctx)),
                0
            );
            assert_eq!(fi::fi_send(a.ep, data.as_ptr() as *const _, len, null_mut(), b_at_a, ctx(&mut sctx)), 0);
        }
        let rc = b.wait_cq(&[&a]).expect("recv completion");
        assert_eq!(rc.op_context, ctx(&mut rctx));
        assert_eq!(rc.len, len);
        assert_ne!(rc.flags & (fi::FI_RECV | fi::FI_MSG) as u64, 0);
        assert_eq!(&rbuf[..len], &data[..], "len {len}");
        let sc = a.wait_cq(&[&b]).expect("send completion");
        assert_eq!(sc.op_context, ctx(&mut sctx));
        assert_ne!(sc.flags & fi::FI_SEND as u64, 0);
    }
    // And back the other way, with remote CQ data.
    let mut rbuf = [0u8; 8];
    let mut rctx = 3u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(a.ep, rbuf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, ctx(&mut rctx)), 0);
        assert_eq!(
            fi::fi_senddata(b.ep, b"12345678".as_ptr() as *const _, 8, null_mut(), 0xfeed_beef, a_at_b, null_mut()),
            0
        );
    }
    let rc = a.wait_cq(&[&b]).unwrap();
    assert_ne!(rc.flags & fi::FI_REMOTE_CQ_DATA as u64, 0);
    assert_eq!(rc.data, 0xfeed_beef);
    assert_eq!(&rbuf, b"12345678");
    b.wait_cq(&[&a]).unwrap();
}

#[test]
fn msg_roundtrip_udp() {
    msg_roundtrip("udp");
}

#[test]
fn msg_roundtrip_shm() {
    msg_roundtrip("shm");
}

#[test]
fn msg_roundtrip_auto() {
    msg_roundtrip("auto");
}

#[test]
fn tagged_matching_with_ignore_mask_and_unexpected_messages() {
    for dev in ["udp", "shm", "auto"] {
        tagged_matching_with_ignore_mask_and_unexpected_messages_on(dev);
    }
}

fn tagged_matching_with_ignore_mask_and_unexpected_messages_on(dev: &str) {
    let (a, b, b_at_a, _) = pair(dev);
    // Three messages arrive before any receive is posted (unexpected).
    for tag in [0x10u64, 0x21, 0x32] {
        let v = tag.to_le_bytes();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(fi::fi_tsend(a.ep, v.as_ptr() as *const _, 8, null_mut(), b_at_a, tag, null_mut()), 0);
        }
        a.wait_cq(&[&b]).unwrap();
    }
    for _ in 0..20 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    // Exact match takes 0x21 even though 0x10 is older.
    let mut buf = [0u8; 8];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, 0x21, 0, null_mut()),
            0
        )
    };
    let c = b.wait_cq(&[&a]).unwrap();
    assert_eq!((c.tag, u64::from_le_bytes(buf)), (0x21, 0x21));
    assert_ne!(c.flags & fi::FI_TAGGED as u64, 0);
    // Wildcard on the low nibble takes the oldest remaining one (0x10).
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, 0x30, 0x3f, null_mut()),
            0
        )
    };
    assert_eq!(b.wait_cq(&[&a]).unwrap().tag, 0x10);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, 0, u64::MAX, null_mut()),
            0
        )
    };
    assert_eq!(b.wait_cq(&[&a]).unwrap().tag, 0x32);
    // An untagged receive never matches a tagged send.
    let mut rctx = 9u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, ctx(&mut rctx)), 0);
        assert_eq!(fi::fi_tsend(a.ep, buf.as_ptr() as *const _, 8, null_mut(), b_at_a, 5, null_mut()), 0);
    }
    a.wait_cq(&[&b]).unwrap();
    let mut e = fi::fi_cq_tagged_entry::default();
    for _ in 0..50 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_cq_read(b.cq, &mut e as *mut _ as *mut _, 1) }, -(fi::FI_EAGAIN as isize));
    }
    // Cancel that untagged receive.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_cancel(&mut (*b.ep).fid, ctx(&mut rctx)), 0) };
    let err = b.wait_cq(&[&a]).unwrap_err();
    assert_eq!(err.err, fi::FI_ECANCELED as i32);
    assert_eq!(err.op_context, ctx(&mut rctx));
    assert_ne!(err.flags & fi::FI_RECV as u64, 0);
}

#[test]
fn truncation_reports_etrunc_with_olen() {
    for dev in ["udp", "shm", "auto"] {
        truncation_reports_etrunc_with_olen_on(dev);
    }
}

fn truncation_reports_etrunc_with_olen_on(dev: &str) {
    let (a, b, b_at_a, _) = pair(dev);
    let data = pattern(1000, 7);
    let mut small = [0u8; 100];
    let mut rctx = 5u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, small.as_mut_ptr() as *mut _, 100, null_mut(), FI_ADDR_UNSPEC, 1, 0, ctx(&mut rctx)),
            0
        );
        assert_eq!(fi::fi_tsend(a.ep, data.as_ptr() as *const _, 1000, null_mut(), b_at_a, 1, null_mut()), 0);
    }
    let err = b.wait_cq(&[&a]).unwrap_err();
    assert_eq!(err.err, fi::FI_ETRUNC as i32);
    assert_eq!(err.olen, 900);
    assert_eq!(err.len, 100);
    assert_eq!(err.op_context, ctx(&mut rctx));
    assert_eq!(&small[..], &data[..100]);
}

#[test]
fn send_to_self_and_inject_and_fi_source() {
    let s = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let me = s.insert(&s.name());
    let mut buf = [0u8; 5];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(s.ep, buf.as_mut_ptr() as *mut _, 5, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_inject(s.ep, b"hello".as_ptr() as *const _, 5, me), 0);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut e = fi::fi_cq_tagged_entry::default();
        let mut src = 0u64;
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let n = unsafe { fi::fi_cq_readfrom(s.cq, &mut e as *mut _ as *mut _, 1, &mut src) };
        if n == 1 {
            assert_ne!(e.flags & fi::FI_RECV as u64, 0, "inject generates no send completion");
            assert_eq!(src, me, "FI_SOURCE names the sender's fi_addr");
            break;
        }
        assert!(std::time::Instant::now() < deadline);
    }
    assert_eq!(&buf, b"hello");
    // Inject larger than inject_size is refused.
    let big = vec![0u8; 1 << 20];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_inject(s.ep, big.as_ptr() as *const _, big.len(), me), -(fi::FI_EINVAL as isize)) };
}

#[test]
fn selective_completion_only_reports_flagged_operations() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info_a = getinfo(None, None, 0, Some(&h)).unwrap();
    let info_b = getinfo(None, None, 0, Some(&h)).unwrap();
    let a = Stack::open_with(info_a, fi::FI_AV_MAP, fi::FI_SELECTIVE_COMPLETION);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let _ = info_b;
    let b_at_a = a.insert(&b.name());
    let mut rbuf = [0u8; 4];
    let mut c1 = 1u64;
    let mut c2 = 2u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(b.ep, rbuf.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_recv(b.ep, rbuf.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        // fi_send uses the EP's default op_flags (no FI_COMPLETION): silent.
        assert_eq!(fi::fi_send(a.ep, b"abcd".as_ptr() as *const _, 4, null_mut(), b_at_a, ctx(&mut c1)), 0);
        let iov = fi::iovec { iov_base: b"efgh".as_ptr() as *mut _, iov_len: 4 };
        let msg =
            fi::fi_msg { msg_iov: &iov, desc: null_mut(), iov_count: 1, addr: b_at_a, context: ctx(&mut c2), data: 0 };
        assert_eq!(fi::fi_sendmsg(a.ep, &msg, fi::FI_COMPLETION as u64), 0);
    }
    b.wait_cq(&[&a]).unwrap();
    b.wait_cq(&[&a]).unwrap();
    let c = a.wait_cq(&[&b]).unwrap();
    assert_eq!(c.op_context, ctx(&mut c2), "only the FI_COMPLETION send is reported");
}

fn keyed(key: u8) -> Stack {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        let k = libc::malloc(1) as *mut u8;
        *k = key;
        h.ep().auth_key = k;
        h.ep().auth_key_size = 1;
    }
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    Stack::open_with(info, fi::FI_AV_MAP, 0)
}

#[test]
fn job_keys_isolate_endpoints() {
    let a = keyed(1);
    let b = keyed(2);
    let c = keyed(1);
    let b_at_a = a.insert(&b.name());
    let c_at_a = a.insert(&c.name());
    let mut rb = [0u8; 4];
    let mut rc = [0u8; 4];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(b.ep, rb.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_recv(c.ep, rc.as_mut_ptr() as *mut _, 4, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, b"key1".as_ptr() as *const _, 4, null_mut(), b_at_a, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, b"key1".as_ptr() as *const _, 4, null_mut(), c_at_a, null_mut()), 0);
    }
    // Same key: delivered.
    c.wait_cq(&[&a]).unwrap();
    assert_eq!(&rc, b"key1");
    // Other key: never delivered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
    while std::time::Instant::now() < deadline {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        assert_eq!(unsafe { fi::fi_cq_read(b.cq, &mut e as *mut _ as *mut _, 1) }, -(fi::FI_EAGAIN as isize));
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(a.cq, null_mut(), 0) };
    }
    assert_eq!(&rb, &[0u8; 4]);
}

#[test]
fn peek_claim_discard_and_multi_recv() {
    for dev in ["udp", "shm", "auto"] {
        peek_claim_discard_and_multi_recv_on(dev);
    }
}

fn peek_claim_discard_and_multi_recv_on(dev: &str) {
    let (a, b, b_at_a, _) = pair(dev);
    // Two unexpected tagged messages.
    for (tag, body) in [(7u64, b"seven"), (8u64, b"eight")] {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_tsend(a.ep, body.as_ptr() as *const _, 5, null_mut(), b_at_a, tag, null_mut()), 0) };
        a.wait_cq(&[&b]).unwrap();
    }
    for _ in 0..20 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    let mut ctx1 = 1u64;
    let peek = |tag: u64, flags: u64, ctx: *mut libc::c_void, buf: *mut u8| {
        let iov = fi::iovec { iov_base: buf as *mut _, iov_len: if buf.is_null() { 0 } else { 5 } };
        let msg = fi::fi_msg_tagged {
            msg_iov: &iov,
            desc: null_mut(),
            iov_count: if buf.is_null() { 0 } else { 1 },
            addr: FI_ADDR_UNSPEC,
            tag,
            ignore: 0,
            context: ctx,
            data: 0,
        };
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_trecvmsg(b.ep, &msg, flags) }
    };
    // A miss: FI_ENOMSG at once.
    assert_eq!(peek(99, fi::FI_PEEK as u64, ctx(&mut ctx1), null_mut()), 0);
    let e = b.wait_cq(&[&a]).unwrap_err();
    assert_eq!(e.err, fi::FI_ENOMSG as i32);
    // A hit reports length and tag without consuming.
    assert_eq!(peek(7, fi::FI_PEEK as u64, ctx(&mut ctx1), null_mut()), 0);
    let c = b.wait_cq(&[&a]).unwrap();
    assert_eq!((c.len, c.tag), (5, 7));
    // PEEK|CLAIM reserves it; a CLAIM receive with the same context gets it.
    assert_eq!(peek(7, fi::FI_PEEK as u64 | fi::FI_CLAIM, ctx(&mut ctx1), null_mut()), 0);
    b.wait_cq(&[&a]).unwrap();
    let mut buf = [0u8; 5];
    assert_eq!(peek(7, fi::FI_CLAIM, ctx(&mut ctx1), buf.as_mut_ptr()), 0);
    let c = b.wait_cq(&[&a]).unwrap();
    assert_eq!((c.len, &buf), (5, b"seven"));
    // PEEK|DISCARD drops the other one.
    assert_eq!(peek(8, fi::FI_PEEK as u64 | fi::FI_DISCARD, ctx(&mut ctx1), null_mut()), 0);
    b.wait_cq(&[&a]).unwrap();
    assert_eq!(peek(8, fi::FI_PEEK as u64, ctx(&mut ctx1), null_mut()), 0);
    assert_eq!(b.wait_cq(&[&a]).unwrap_err().err, fi::FI_ENOMSG as i32);

    // Multi-receive: one 64-byte buffer takes 16-byte messages back to back and
    // is released when less than FI_OPT_MIN_MULTI_RECV (16) bytes remain.
    let min: usize = 16;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_setopt(
                &mut (*b.ep).fid,
                fi::FI_OPT_ENDPOINT as i32,
                fi::FI_OPT_MIN_MULTI_RECV as i32,
                &min as *const _ as *const _,
                8
            ),
            0
        );
    }
    let mut big = [0u8; 64];
    let mut mctx = 5u64;
    let iov = fi::iovec { iov_base: big.as_mut_ptr() as *mut _, iov_len: 64 };
    let msg = fi::fi_msg {
        msg_iov: &iov,
        desc: null_mut(),
        iov_count: 1,
        addr: FI_ADDR_UNSPEC,
        context: ctx(&mut mctx),
        data: 0,
    };
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_recvmsg(b.ep, &msg, fi::FI_MULTI_RECV as u64), 0) };
    for i in 0..4u8 {
        let body = [i; 16];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_send(a.ep, body.as_ptr() as *const _, 16, null_mut(), b_at_a, null_mut()), 0) };
    }
    let mut released = false;
    for i in 0..4usize {
        let c = b.wait_cq(&[&a]).unwrap();
        assert_eq!(c.len, 16);
        assert_eq!(c.buf as usize, big.as_ptr() as usize + 16 * i, "message {i} lands right after the previous one");
        released |= c.flags & fi::FI_MULTI_RECV as u64 != 0;
    }
    assert!(released, "the buffer was released with FI_MULTI_RECV");
    assert_eq!(&big[48..64], &[3u8; 16]);
}

#[test]
fn source_err_reports_unknown_senders_with_their_address() {
    let a = Stack::open_caps(Some("udp"), fi::FI_AV_MAP, fi::FI_SOURCE | fi::FI_SOURCE_ERR, 0);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let a_at_b = b.insert(&a.name());
    let mut buf = [0u8; 8];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(a.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(b.ep, b"who am i".as_ptr() as *const _, 8, null_mut(), a_at_b, null_mut()), 0);
    }
    let e = a.wait_cq(&[&b]).unwrap_err();
    assert_eq!(e.err, fi::FI_EADDRNOTAVAIL as i32);
    assert_eq!(e.err_data_size, 64);
    assert_eq!(&buf, b"who am i", "the data is delivered with the error entry");
    // The reported address is insertable, and names the sender from then on.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let addr = unsafe { std::slice::from_raw_parts(e.err_data as *const u8, 64) }.to_vec();
    let b_at_a = a.insert(&addr);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_recv(a.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(b.ep, b"known me".as_ptr() as *const _, 8, null_mut(), a_at_b, null_mut()), 0);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut c = fi::fi_cq_tagged_entry::default();
        let mut src = 0u64;
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let n = unsafe { fi::fi_cq_readfrom(a.cq, &mut c as *mut _ as *mut _, 1, &mut src) };
        if n == 1 {
            if c.flags & fi::FI_RECV as u64 != 0 {
                assert_eq!(src, b_at_a);
                break;
            }
            continue;
        }
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "unexpected error entry");
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
        assert!(std::time::Instant::now() < deadline);
    }
    assert_eq!(&buf, b"known me");
}
