//! Rules of the libfabric man pages (fi_getinfo(3), fi_endpoint(3), fi_av(3))
//! that rdmx broke, one test each, driven only through the public API. Each
//! failed before its fix; the man page sentence is quoted in the test's comment.
use fi_tests::*;
use std::ptr::null_mut;

fn ep_type(i: &fi::fi_info) -> fi::fi_ep_type {
    // SAFETY: an fi_info that fi_getinfo returned; its attrs are valid.
    unsafe { (*i.ep_attr).type_ }
}

fn tx_rx_caps(i: &fi::fi_info) -> (u64, u64) {
    // SAFETY: an fi_info that fi_getinfo returned; its attrs are valid.
    unsafe { ((*i.tx_attr).caps, (*i.rx_attr).caps) }
}

/// fi_getinfo(3): "If neither node, service or hints are provided, then
/// fi_getinfo simply returns the list all available communication
/// interfaces" — rdmx's RDM endpoints (first: the reliable, highest
/// performing one) and its DGRAM endpoints.
#[test]
fn getinfo_without_hints_lists_every_endpoint_type() {
    let info = getinfo(None, None, 0, None).expect("NULL hints");
    let types: Vec<fi::fi_ep_type> = info.iter().map(ep_type).collect();
    assert_eq!(types.first(), Some(&fi::FI_EP_RDM), "RDM first: {types:?}");
    assert!(types.contains(&fi::FI_EP_DGRAM), "DGRAM endpoints missing: {types:?}");
    // Hints that name no type still mean the reliable endpoint only (MPI
    // libraries spread ranks over the entries they get).
    let info = getinfo(None, None, 0, Some(&Hints::new())).unwrap();
    assert!(info.iter().all(|i| ep_type(i) == fi::FI_EP_RDM));
}

/// fi_endpoint(3), tx/rx attributes: "The capabilities must be a subset of
/// those requested of the associated endpoint." (rx_attr->caps carried
/// FI_SOURCE_ERR, which info->caps does not report unasked; fabtests'
/// fi_getinfo_test "capability with no hints" checks exactly this.)
#[test]
fn tx_and_rx_caps_are_subsets_of_the_info_caps() {
    let check = |info: &Info, what: &str| {
        for i in info.iter() {
            let (tx, rx) = tx_rx_caps(i);
            assert_eq!(tx & !i.caps, 0, "{what}: tx_attr caps beyond info caps: {:#x}", tx & !i.caps);
            assert_eq!(rx & !i.caps, 0, "{what}: rx_attr caps beyond info caps: {:#x}", rx & !i.caps);
        }
    };
    check(&getinfo(None, None, 0, None).unwrap(), "no hints");
    check(&getinfo(None, None, 0, Some(&Hints::rdm())).unwrap(), "rdm hints");
    let mut h = Hints::rdm();
    h.get().caps |= fi::FI_SOURCE | fi::FI_SOURCE_ERR;
    check(&getinfo(None, None, 0, Some(&h)).unwrap(), "FI_SOURCE_ERR");
}

/// fi_getinfo(3): FI_RMA_EVENT "Requests that an endpoint support the
/// generation of completion events when it is the target of an RMA and/or
/// atomic operation. This flag requires that FI_REMOTE_READ and/or
/// FI_REMOTE_WRITE be enabled." rdmx's targets count served requests on
/// counters bound with FI_REMOTE_READ/FI_REMOTE_WRITE, so the capability is
/// offered with RMA or atomics (it was -FI_ENODATA) and refused without them.
#[test]
fn fi_rma_event_is_offered_with_rma_and_counts_at_the_target() {
    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_RDM;
    h.get().caps = fi::FI_MSG as u64 | fi::FI_RMA as u64 | fi::FI_RMA_EVENT;
    let info = getinfo(None, None, 0, Some(&h)).expect("FI_RMA_EVENT with FI_RMA");
    assert_ne!(info.first().caps & fi::FI_RMA_EVENT, 0);
    assert_ne!(tx_rx_caps(info.first()).1 & fi::FI_RMA_EVENT, 0, "an rx capability");
    let none = getinfo(None, None, 0, None).unwrap();
    assert_ne!(none.first().caps & fi::FI_RMA_EVENT, 0, "part of the full capabilities");

    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_RDM;
    h.get().caps = fi::FI_MSG as u64 | fi::FI_RMA_EVENT;
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)), "nothing to be the target of");
    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_RDM;
    h.get().caps = (fi::FI_MSG | fi::FI_RMA) as u64;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    assert_ne!(info.first().caps & fi::FI_RMA_EVENT, 0, "secondary, reported unasked: it costs nothing");
    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_RDM;
    h.get().caps = (fi::FI_RMA | fi::FI_WRITE | fi::FI_READ) as u64;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    assert_eq!(info.first().caps & fi::FI_RMA_EVENT, 0, "an initiator-only endpoint is never a target");

    // The fabtests fi_rdm_rma_event pattern: the target counts a remote write
    // on a counter bound with FI_REMOTE_WRITE.
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= fi::FI_RMA as u64;
    let origin = Stack::open_with(getinfo(None, None, 0, Some(&h)).unwrap(), fi::FI_AV_TABLE, 0);
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= fi::FI_RMA as u64 | fi::FI_RMA_EVENT;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: libfabric calls on objects this test opens and closes; every
    // buffer outlives the operations on it.
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_TABLE, ..Default::default() };
        let mut av = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, size: 16, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut ca =
            fi::fi_cntr_attr { events: fi::FI_CNTR_EVENTS_COMP, wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
        let mut cntr = null_mut();
        assert_eq!(fi::fi_cntr_open(domain, &mut ca, &mut cntr, null_mut()), 0);
        let mut ep = null_mut();
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cntr).fid, fi::FI_REMOTE_WRITE as u64), 0);
        assert_eq!(fi::fi_enable(ep), 0);
        let mut mem = vec![0u8; 64];
        let mut mr = null_mut();
        let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        assert_eq!(
            fi::fi_mr_reg(domain, mem.as_mut_ptr() as *const _, mem.len(), access, 0, 7, 0, &mut mr, null_mut()),
            0
        );
        let key = fi::fi_mr_key(mr);
        let mut name = vec![0u8; 64];
        let mut len = name.len();
        assert_eq!(fi::fi_getname(&mut (*ep).fid, name.as_mut_ptr() as *mut _, &mut len), 0);
        let peer = origin.insert(&name[..len]);
        let src = [0x5au8; 16];
        // Offsets: no FI_MR_VIRT_ADDR was asked for.
        loop {
            let r = fi::fi_write(origin.ep, src.as_ptr() as *const _, src.len(), null_mut(), peer, 8, key, null_mut());
            if r == 0 {
                break;
            }
            assert_eq!(r, -(fi::FI_EAGAIN as isize));
        }
        assert!(origin.wait_cq(&[]).is_ok(), "the write completes");
        assert_eq!(fi::fi_cntr_wait(cntr, 1, 5000), 0, "the target's FI_REMOTE_WRITE counter counted it");
        assert_eq!(&mem[8..24], &src);
        assert_eq!(fi::fi_close(&mut (*mr).fid), 0);
        assert_eq!(fi::fi_close(&mut (*ep).fid), 0);
        assert_eq!(fi::fi_close(&mut (*cntr).fid), 0);
        assert_eq!(fi::fi_close(&mut (*cq).fid), 0);
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}

fn open_domain() -> (Info, *mut fi::fid_fabric, *mut fi::fid_domain) {
    let info = getinfo(None, None, 0, Some(&Hints::rdm())).unwrap();
    // SAFETY: libfabric calls with the info this function owns.
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        (info, fabric, domain)
    }
}

fn close_domain(fabric: *mut fi::fid_fabric, domain: *mut fi::fid_domain) {
    // SAFETY: objects opened by open_domain, nothing else open on them.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}

/// fi_av(3), FI_AV_UNSPEC: "Provider will choose its preferred AV type. The
/// AV type used will be returned through the type field in fi_av_attr."
#[test]
fn av_open_returns_the_type_it_chose_for_unspec() {
    let (_info, fabric, domain) = open_domain();
    let mut attr = fi::fi_av_attr { type_: fi::FI_AV_UNSPEC, ..Default::default() };
    let mut av = null_mut();
    // SAFETY: libfabric calls on objects this test opened; attr outlives the call.
    unsafe {
        assert_eq!(fi::fi_av_open(domain, &mut attr, &mut av, null_mut()), 0);
        assert!(attr.type_ == fi::FI_AV_MAP || attr.type_ == fi::FI_AV_TABLE, "type left as {}", attr.type_);
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
    }
    close_domain(fabric, domain);
}

/// fi_av(3), FI_SYNC_ERR: "the context parameter of insertion calls references
/// an array of integers ... The resulting status of attempting to insert each
/// address will be written to the corresponding array location. Successful
/// insertions will be updated to 0. Failures will contain a fabric errno
/// code." (rdmx accepted the flag and wrote nothing.)
#[test]
fn av_insert_with_fi_sync_err_reports_each_address() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let good = s.name();
    let mut addrs = good.clone();
    addrs.extend(std::iter::repeat_n(0xffu8, good.len())); // not an rdmx address
    addrs.extend_from_slice(&good);
    let mut status = [-77 as libc::c_int; 3];
    let mut fa = [0u64; 3];
    // SAFETY: three packed addresses, three fi_addr slots and three status ints,
    // all alive across the call.
    let n = unsafe {
        fi::fi_av_insert(
            s.av,
            addrs.as_ptr() as *const _,
            3,
            fa.as_mut_ptr(),
            fi::FI_SYNC_ERR,
            status.as_mut_ptr() as *mut _,
        )
    };
    assert_eq!(n, 2, "two of three inserted");
    assert_eq!(status[0], 0);
    assert_ne!(status[1], 0, "the bad address has an error code");
    assert!(status[1] != -77, "status of the bad address written");
    assert_eq!(status[2], 0);
    assert_eq!(fa[1], FI_ADDR_NOTAVAIL);
    // SAFETY: as above; a NULL status array with FI_SYNC_ERR is refused.
    let r =
        unsafe { fi::fi_av_insert(s.av, good.as_ptr() as *const _, 1, fa.as_mut_ptr(), fi::FI_SYNC_ERR, null_mut()) };
    assert_eq!(r, neg(fi::FI_EINVAL));
}

/// fi_endpoint(3), fi_control: "FI_GETOPSFLAG – uint64_t *flags: Used to
/// retrieve the current value of flags associated with the data transfer
/// operations ... FI_SETOPSFLAG: Used to change the data transfer operation
/// flags ... The given flags will override the previous transmit and receive
/// attributes." (Both were -FI_ENOSYS.) Set FI_COMPLETION on an endpoint bound
/// with FI_SELECTIVE_COMPLETION: plain fi_send/fi_recv then report completions.
#[test]
fn ep_control_gets_and_sets_the_default_operation_flags() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.tx().op_flags = fi::FI_TRANSMIT_COMPLETE as u64;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    let s = Stack::open_with(info, fi::FI_AV_TABLE, fi::FI_SELECTIVE_COMPLETION);
    let me = s.insert(&s.name());
    // SAFETY: libfabric calls on objects this test opened; every buffer and
    // context outlives the call and its completion.
    unsafe {
        let mut flags = fi::FI_TRANSMIT as u64;
        assert_eq!(fi::fi_control(&mut (*s.ep).fid, fi::FI_GETOPSFLAG as i32, &mut flags as *mut u64 as *mut _), 0);
        assert_eq!(flags, fi::FI_TRANSMIT_COMPLETE as u64, "the tx op_flags the info carried");
        let mut both = (fi::FI_TRANSMIT | fi::FI_RECV) as u64;
        assert_eq!(
            fi::fi_control(&mut (*s.ep).fid, fi::FI_GETOPSFLAG as i32, &mut both as *mut u64 as *mut _),
            neg(fi::FI_EBADFLAGS),
            "one direction at a time"
        );

        let mut tx = (fi::FI_TRANSMIT | fi::FI_COMPLETION) as u64;
        assert_eq!(fi::fi_control(&mut (*s.ep).fid, fi::FI_SETOPSFLAG as i32, &mut tx as *mut u64 as *mut _), 0);
        let mut rx = (fi::FI_RECV | fi::FI_COMPLETION) as u64;
        assert_eq!(fi::fi_control(&mut (*s.ep).fid, fi::FI_SETOPSFLAG as i32, &mut rx as *mut u64 as *mut _), 0);
        let mut got = fi::FI_RECV as u64;
        assert_eq!(fi::fi_control(&mut (*s.ep).fid, fi::FI_GETOPSFLAG as i32, &mut got as *mut u64 as *mut _), 0);
        assert_eq!(got, fi::FI_COMPLETION as u64);

        let mut rbuf = [0u8; 8];
        let sbuf = *b"opsflags";
        let (mut rctx, mut sctx) = (fi::fi_context::default(), fi::fi_context::default());
        assert_eq!(
            fi::fi_recv(
                s.ep,
                rbuf.as_mut_ptr() as *mut _,
                8,
                null_mut(),
                FI_ADDR_UNSPEC,
                &mut rctx as *mut _ as *mut _
            ),
            0
        );
        assert_eq!(fi::fi_send(s.ep, sbuf.as_ptr() as *const _, 8, null_mut(), me, &mut sctx as *mut _ as *mut _), 0);
        let mut seen = Vec::new();
        for _ in 0..2 {
            let e = s.wait_cq(&[]).expect("a completion per operation");
            seen.push(e.op_context as usize);
        }
        seen.sort();
        let mut want = vec![&mut rctx as *mut _ as usize, &mut sctx as *mut _ as usize];
        want.sort();
        assert_eq!(seen, want);
        assert_eq!(rbuf, sbuf);
    }
}

/// fi_av(3), fi_av_lookup: "If the actual address is larger than what can fit
/// into the buffer, it will be truncated. On output, addrlen is set to the size
/// of the buffer needed to store the address" — a truncation, not an error
/// (rdmx returned -FI_ETOOSMALL; libfabric's util AVs, under tcp;ofi_rxm, 0).
#[test]
fn av_lookup_truncates_into_a_short_buffer_and_says_the_size() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let name = s.name();
    let fa = s.insert(&name);
    let mut small = [0u8; 4];
    let mut len = small.len();
    // SAFETY: a 4-byte buffer with its length; both outlive the call.
    assert_eq!(unsafe { fi::fi_av_lookup(s.av, fa, small.as_mut_ptr() as *mut _, &mut len) }, 0);
    assert_eq!(len, name.len(), "the size needed");
    assert_eq!(small, name[..4], "the first bytes");
    let mut size_only = 0usize;
    // SAFETY: a zero-length buffer: nothing is written through the pointer.
    assert_eq!(unsafe { fi::fi_av_lookup(s.av, fa, null_mut(), &mut size_only) }, 0);
    assert_eq!(size_only, name.len());
}

/// Several registrations in one operation (fi_msg(3)/fi_rma(3): `desc` holds
/// one descriptor per iov entry): with FI_MR_LOCAL, an fi_sendv / fi_recvv /
/// fi_writev whose iov entries lie in different registrations moves every
/// byte to its place. rdmx needs no local registration, so this documents
/// that the descriptor arrays are read per entry and accepted, not a fix.
#[test]
fn several_registrations_in_one_operation() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= fi::FI_RMA as u64;
    h.dom().mr_mode = (fi::FI_MR_LOCAL | fi::FI_MR_PROV_KEY | fi::FI_MR_VIRT_ADDR | fi::FI_MR_ALLOCATED) as i32;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    let me = s.insert(&s.name());
    let reg = |buf: &mut [u8], access: u64| -> *mut fi::fid_mr {
        let mut mr = null_mut();
        assert_eq!(
            // SAFETY: the buffer outlives the registration (closed below).
            unsafe {
                fi::fi_mr_reg(s.domain, buf.as_mut_ptr() as *const _, buf.len(), access, 0, 0, 0, &mut mr, null_mut())
            },
            0
        );
        mr
    };
    let (mut a, mut b) = (vec![1u8; 100], vec![2u8; 300]);
    let (mut r1, mut r2) = (vec![0u8; 150], vec![0u8; 250]);
    let mut target = vec![0u8; 400];
    let local = (fi::FI_SEND | fi::FI_RECV | fi::FI_WRITE) as u64;
    let mrs = [
        reg(&mut a, local),
        reg(&mut b, local),
        reg(&mut r1, local),
        reg(&mut r2, local),
        reg(&mut target, fi::FI_REMOTE_WRITE as u64),
    ];
    // SAFETY: every buffer, iov, descriptor array and context outlives its
    // operation's completion (waited for below).
    unsafe {
        let mut desc: Vec<*mut libc::c_void> = mrs.iter().map(|&m| fi::fi_mr_desc(m)).collect();
        let siov = [
            fi::iovec { iov_base: a.as_mut_ptr() as *mut _, iov_len: a.len() },
            fi::iovec { iov_base: b.as_mut_ptr() as *mut _, iov_len: b.len() },
        ];
        let riov = [
            fi::iovec { iov_base: r1.as_mut_ptr() as *mut _, iov_len: r1.len() },
            fi::iovec { iov_base: r2.as_mut_ptr() as *mut _, iov_len: r2.len() },
        ];
        assert_eq!(fi::fi_recvv(s.ep, riov.as_ptr(), desc[2..4].as_mut_ptr(), 2, FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_sendv(s.ep, siov.as_ptr(), desc[0..2].as_mut_ptr(), 2, me, null_mut()), 0);
        s.wait_cq(&[]).expect("first completion");
        s.wait_cq(&[]).expect("second completion");
        let want: Vec<u8> = a.iter().chain(b.iter()).copied().collect();
        let got: Vec<u8> = r1.iter().chain(r2.iter()).copied().collect();
        assert_eq!(got, want, "sendv/recvv across four registrations");
        let key = fi::fi_mr_key(mrs[4]);
        assert_eq!(
            fi::fi_writev(s.ep, siov.as_ptr(), desc[0..2].as_mut_ptr(), 2, me, target.as_ptr() as u64, key, null_mut()),
            0
        );
        s.wait_cq(&[]).expect("the write completes");
        assert_eq!(target, want, "writev from two registrations into a third");
        for m in mrs {
            assert_eq!(fi::fi_close(&mut (*m).fid), 0);
        }
    }
}

/// fi_getinfo(3), FI_FENCE: "Indicates that the endpoint support the FI_FENCE
/// flag on data transfer operations. Support requires tracking that all
/// previous transmit requests to a specified remote endpoint complete prior to
/// initiating the fenced operation." rdmx accepted the flag without reporting
/// the capability (a hint asking for it got -FI_ENODATA); its per-peer order
/// gives the guarantee: a fenced read posted right after a write, without
/// waiting, reads what the write wrote.
#[test]
fn fi_fence_is_offered_and_a_fenced_read_sees_the_write_before_it() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= fi::FI_RMA as u64 | fi::FI_FENCE as u64;
    let info = getinfo(None, None, 0, Some(&h)).expect("FI_FENCE");
    assert_ne!(info.first().caps & fi::FI_FENCE as u64, 0);
    assert_ne!(tx_rx_caps(info.first()).0 & fi::FI_FENCE as u64, 0, "a tx capability");
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    let me = s.insert(&s.name());
    let mut target = vec![0u8; 64];
    let mut mr = null_mut();
    // SAFETY: libfabric calls on objects this test opened; buffers, iovs and
    // messages outlive their operations' completions (waited for below).
    unsafe {
        let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        assert_eq!(
            fi::fi_mr_reg(
                s.domain,
                target.as_mut_ptr() as *const _,
                target.len(),
                access,
                0,
                11,
                0,
                &mut mr,
                null_mut()
            ),
            0
        );
        let key = fi::fi_mr_key(mr);
        let src = [0xc3u8; 32];
        let mut back = [0u8; 32];
        assert_eq!(fi::fi_write(s.ep, src.as_ptr() as *const _, 32, null_mut(), me, 16, key, null_mut()), 0);
        let iov = fi::iovec { iov_base: back.as_mut_ptr() as *mut _, iov_len: 32 };
        let rma = fi::fi_rma_iov { addr: 16, len: 32, key };
        let msg = fi::fi_msg_rma {
            msg_iov: &iov,
            desc: null_mut(),
            iov_count: 1,
            addr: me,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: null_mut(),
            data: 0,
        };
        assert_eq!(fi::fi_readmsg(s.ep, &msg, (fi::FI_FENCE | fi::FI_COMPLETION) as u64), 0);
        s.wait_cq(&[]).expect("write");
        s.wait_cq(&[]).expect("fenced read");
        assert_eq!(back, src);
        assert_eq!(fi::fi_close(&mut (*mr).fid), 0);
    }
}
