//! API misuse: every wrong call gets a documented negative `-FI_E*` return,
//! never a crash, and the endpoint keeps working afterwards. Each line of the
//! faults table in docs/reliability.md is a check here.
use fi_tests::*;
use std::ptr::{null, null_mut};

/// Sends `len` bytes from `a` to `b` and receives them (0 = works).
fn exchange(a: &Stack, b: &Stack, to: u64, len: usize) {
    let out = vec![7u8; len];
    let mut got = vec![0u8; len.max(1)];
    // SAFETY: libfabric calls on objects this test opened; buffers outlive the completions waited for.
    unsafe {
        assert_eq!(fi::fi_recv(b.ep, got.as_mut_ptr() as *mut _, len, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, out.as_ptr() as *const _, len, null_mut(), to, null_mut()), 0);
    }
    a.wait_cq(&[b]).expect("send");
    b.wait_cq(&[a]).expect("recv");
    assert_eq!(&got[..len], &out[..]);
}

#[test]
fn data_path_misuse_gets_errors_and_the_endpoint_keeps_working() {
    init();
    // A receive buffer for a directed receive that must be refused; declared
    // before the endpoints so that it would outlive them if it were not.
    let mut stray = [0u8; 8];
    let a = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let b = Stack::open(Some("udp"), fi::FI_AV_MAP);
    let to_b = a.insert(&b.name());
    let data = [1u8; 64];
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let (inject_size, max_msg) =
        unsafe { ((*a.info.first().tx_attr).inject_size, (*a.info.first().ep_attr).max_msg_size) };
    // SAFETY: libfabric calls with deliberately bad arguments on objects this test opened; rdmx must check them.
    unsafe {
        // NULL buffer with a length.
        assert_eq!(
            fi::fi_send(a.ep, null(), 8, null_mut(), to_b, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "NULL send buffer"
        );
        assert_eq!(
            fi::fi_recv(b.ep, null_mut(), 8, null_mut(), FI_ADDR_UNSPEC, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "NULL receive buffer"
        );
        // Larger than max_msg_size, and inject above inject_size.
        assert_eq!(
            fi::fi_send(a.ep, data.as_ptr() as *const _, max_msg + 1, null_mut(), to_b, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "beyond max_msg_size"
        );
        let big = vec![0u8; inject_size + 1];
        assert_eq!(
            fi::fi_inject(a.ep, big.as_ptr() as *const _, big.len(), to_b),
            neg(fi::FI_EINVAL) as isize,
            "inject beyond inject_size"
        );
        // Addresses that name nothing: -FI_EINVAL (docs/reliability.md, faults
        // table, API misuse row; prov/src/core.rs `peer_for`: "destination not in the AV", which
        // every send, inject and directed receive goes through).
        assert_eq!(
            fi::fi_send(a.ep, data.as_ptr() as *const _, 8, null_mut(), FI_ADDR_NOTAVAIL, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "FI_ADDR_NOTAVAIL"
        );
        assert_eq!(
            fi::fi_send(a.ep, data.as_ptr() as *const _, 8, null_mut(), 12345, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "an fi_addr never inserted"
        );
        assert_eq!(
            fi::fi_tsend(a.ep, data.as_ptr() as *const _, 8, null_mut(), FI_ADDR_NOTAVAIL, 7, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "tagged send to FI_ADDR_NOTAVAIL"
        );
        assert_eq!(
            fi::fi_inject(a.ep, data.as_ptr() as *const _, 8, 12345),
            neg(fi::FI_EINVAL) as isize,
            "inject to an fi_addr never inserted"
        );
        // b's AV is empty: a receive directed at any fi_addr names nothing.
        assert_eq!(
            fi::fi_recv(b.ep, stray.as_mut_ptr() as *mut _, 8, null_mut(), 12345, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "receive directed at an fi_addr never inserted"
        );
        // A flag libfabric does not define.
        let iov = libc::iovec { iov_base: data.as_ptr() as *mut _, iov_len: 8 };
        let msg = fi::fi_msg {
            msg_iov: &iov as *const _ as *const _,
            desc: null_mut(),
            iov_count: 1,
            addr: to_b,
            context: null_mut(),
            data: 0,
        };
        assert_eq!(fi::fi_sendmsg(a.ep, &msg, 1u64 << 61), neg(fi::FI_EBADFLAGS) as isize, "unknown flag");
        // More iov entries than iov_limit.
        let many = vec![iov; 1024];
        let msg = fi::fi_msg {
            msg_iov: many.as_ptr() as *const _,
            desc: null_mut(),
            iov_count: many.len(),
            addr: to_b,
            context: null_mut(),
            data: 0,
        };
        assert_eq!(fi::fi_sendmsg(a.ep, &msg, 0), neg(fi::FI_EINVAL) as isize, "iov_count beyond iov_limit");
        // NULL CQ buffer.
        assert_eq!(fi::fi_cq_read(a.cq, null_mut(), 1), neg(fi::FI_EINVAL) as isize, "NULL CQ buffer");
        // NULL out-pointers.
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, ..Default::default() };
        assert_eq!(fi::fi_cq_open(a.domain, &mut cq_attr, null_mut(), null_mut()), neg(fi::FI_EINVAL), "NULL cq out");
        assert_eq!(fi::fi_endpoint(a.domain, a.info.0, null_mut(), null_mut()), neg(fi::FI_EINVAL), "NULL ep out");
        // Unknown flags at open and registration.
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, flags: 1u64 << 61, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(
            fi::fi_cq_open(a.domain, &mut cq_attr, &mut cq, null_mut()),
            neg(fi::FI_EBADFLAGS),
            "unknown CQ flag"
        );
        let mut mr = null_mut();
        assert_eq!(
            fi::fi_mr_reg(
                a.domain,
                data.as_ptr() as *const _,
                64,
                fi::FI_REMOTE_READ as u64,
                0,
                0,
                1u64 << 61,
                &mut mr,
                null_mut()
            ),
            neg(fi::FI_EBADFLAGS),
            "unknown MR flag"
        );
        // A registration whose range wraps the address space.
        assert_eq!(
            fi::fi_mr_reg(
                a.domain,
                usize::MAX as *const _,
                4096,
                fi::FI_REMOTE_READ as u64,
                0,
                0,
                0,
                &mut mr,
                null_mut()
            ),
            neg(fi::FI_EINVAL),
            "wrapping MR range"
        );
    }
    // An address removed from the AV names nothing any more, even after
    // traffic to it (the endpoint's cache of resolved addresses must forget it).
    let again = a.insert(&b.name());
    exchange(&a, &b, again, 8);
    let mut gone = again;
    // SAFETY: libfabric calls on objects this test opened; `gone` is one fi_addr.
    unsafe {
        assert_eq!(fi::fi_av_remove(a.av, &mut gone, 1, 0), 0);
        assert_eq!(
            fi::fi_send(a.ep, data.as_ptr() as *const _, 8, null_mut(), again, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "an fi_addr removed from the AV"
        );
    }
    // Zero-length messages are legal, and everything above left the endpoints working.
    exchange(&a, &b, to_b, 0);
    exchange(&a, &b, to_b, 100_000);
}

#[test]
fn posting_beyond_the_receive_queue_depth_gets_eagain() {
    init();
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.rx().size = 8;
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
    // SAFETY: fields of an fi_info that fi_getinfo returned.
    let depth = unsafe { (*info.first().rx_attr).size };
    let s = Stack::open_with(info, fi::FI_AV_MAP, 0);
    let mut buf = vec![0u8; 16];
    let mut posted = 0usize;
    let ret = loop {
        // SAFETY: a libfabric call on objects this test opened; `buf` outlives the endpoint (receives are never matched).
        let r = unsafe { fi::fi_recv(s.ep, buf.as_mut_ptr() as *mut _, 16, null_mut(), FI_ADDR_UNSPEC, null_mut()) };
        if r != 0 || posted > 100_000 {
            break r;
        }
        posted += 1;
    };
    assert_eq!(ret, neg(fi::FI_EAGAIN) as isize, "after {posted} receives (rx size {depth})");
    assert!(posted >= depth, "refused before the advertised depth: {posted} < {depth}");
    drop(s);
    drop(buf);
}

#[test]
fn wrong_close_order_and_double_close_get_errors() {
    init();
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: libfabric calls on objects this test opened; the double closes
    // and calls on closed objects are the misuse under test (rdmx keeps closed
    // objects' memory as husks that answer -FI_EINVAL).
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
        let mut av = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        let mut ep = null_mut();
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
        assert_eq!(fi::fi_enable(ep), 0);
        let mut mr = null_mut();
        let buf = [0u8; 64];
        assert_eq!(
            fi::fi_mr_reg(
                domain,
                buf.as_ptr() as *const _,
                64,
                fi::FI_REMOTE_READ as u64,
                0,
                0,
                0,
                &mut mr,
                null_mut()
            ),
            0
        );
        // Parents before children: busy.
        assert_eq!(fi::fi_close(&mut (*domain).fid), neg(fi::FI_EBUSY), "domain with children");
        assert_eq!(fi::fi_close(&mut (*fabric).fid), neg(fi::FI_EBUSY), "fabric with a domain");
        assert_eq!(fi::fi_close(&mut (*cq).fid), neg(fi::FI_EBUSY), "CQ bound to an endpoint");
        // Double close and calls on closed objects.
        assert_eq!(fi::fi_close(&mut (*mr).fid), 0);
        assert_eq!(fi::fi_close(&mut (*mr).fid), neg(fi::FI_EINVAL), "MR closed twice");
        assert_eq!(fi::fi_close(&mut (*ep).fid), 0);
        assert_eq!(fi::fi_close(&mut (*ep).fid), neg(fi::FI_EINVAL), "endpoint closed twice");
        assert_eq!(
            fi::fi_send(ep, buf.as_ptr() as *const _, 8, null_mut(), 0, null_mut()),
            neg(fi::FI_EINVAL) as isize,
            "send on a closed endpoint"
        );
        assert_eq!(fi::fi_enable(ep), neg(fi::FI_EINVAL), "enable a closed endpoint");
        assert_eq!(fi::fi_close(&mut (*cq).fid), 0);
        assert_eq!(fi::fi_cq_read(cq, null_mut(), 0), neg(fi::FI_EINVAL) as isize, "read a closed CQ");
        assert_eq!(fi::fi_close(&mut (*cq).fid), neg(fi::FI_EINVAL), "CQ closed twice");
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
        assert_eq!(fi::fi_close(&mut (*av).fid), neg(fi::FI_EINVAL), "AV closed twice");
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), neg(fi::FI_EINVAL), "domain closed twice");
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), neg(fi::FI_EINVAL), "fabric closed twice");
    }
}
