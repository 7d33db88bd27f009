//! Object lifecycle and error codes for bad arguments, through the public API.
use fi_tests::*;
use std::ptr::null_mut;

unsafe fn close(f: *mut fi::fid) -> i32 {
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { fi::fi_close(f) }
}

#[test]
fn every_object_opens_binds_enables_and_closes_and_parents_with_children_are_busy() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut eq_attr = fi::fi_eq_attr { wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
        let mut eq = null_mut();
        assert_eq!(fi::fi_eq_open(fabric, &mut eq_attr, &mut eq, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        // A fabric with a live domain (and EQ) cannot close.
        assert_eq!(close(&mut (*fabric).fid), neg(fi::FI_EBUSY));

        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
        let mut av = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_CONTEXT, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut cntr_attr =
            fi::fi_cntr_attr { events: fi::FI_CNTR_EVENTS_COMP, wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
        let mut cntr = null_mut();
        assert_eq!(fi::fi_cntr_open(domain, &mut cntr_attr, &mut cntr, null_mut()), 0);
        let mut buf = [0u8; 64];
        let mut mr = null_mut();
        assert_eq!(
            fi::fi_mr_reg(
                domain,
                buf.as_mut_ptr() as *const _,
                64,
                (fi::FI_SEND | fi::FI_RECV) as u64,
                0,
                7,
                0,
                &mut mr,
                null_mut()
            ),
            0
        );
        let mut mr2 = null_mut();
        assert_eq!(
            fi::fi_mr_reg(domain, buf.as_mut_ptr() as *const _, 64, fi::FI_SEND as u64, 0, 7, 0, &mut mr2, null_mut()),
            neg(fi::FI_ENOKEY),
            "user keys are unique"
        );
        assert_eq!(fi::fi_mr_key(mr), 7);

        let mut ep = null_mut();
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        // Enabling without an AV is refused.
        assert_eq!(fi::fi_enable(ep), neg(fi::FI_EINVAL));
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), neg(fi::FI_EINVAL), "second AV");
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cntr).fid, (fi::FI_SEND | fi::FI_RECV) as u64), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*eq).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*mr).fid, 0), neg(fi::FI_EINVAL), "an MR does not bind to an RDM endpoint");
        assert_eq!(fi::fi_enable(ep), 0);

        // Bound objects are busy while the endpoint lives.
        assert_eq!(close(&mut (*av).fid), neg(fi::FI_EBUSY));
        assert_eq!(close(&mut (*cq).fid), neg(fi::FI_EBUSY));
        assert_eq!(close(&mut (*cntr).fid), neg(fi::FI_EBUSY));
        assert_eq!(close(&mut (*domain).fid), neg(fi::FI_EBUSY));

        // Empty reads.
        let mut e = fi::fi_cq_entry::default();
        assert_eq!(fi::fi_cq_read(cq, &mut e as *mut _ as *mut _, 1), -(fi::FI_EAGAIN as isize));
        assert_eq!(fi::fi_cq_read(cq, null_mut(), 0), -(fi::FI_EAGAIN as isize), "progress-only read");
        let mut err = fi::fi_cq_err_entry::default();
        assert_eq!(fi::fi_cq_readerr(cq, &mut err, 0), -(fi::FI_EAGAIN as isize));
        assert_eq!(fi::fi_cq_sread(cq, &mut e as *mut _ as *mut _, 1, std::ptr::null(), 10), -(fi::FI_EAGAIN as isize));
        assert_eq!(fi::fi_cntr_read(cntr), 0);
        assert_eq!(fi::fi_cntr_add(cntr, 5), 0);
        assert_eq!(fi::fi_cntr_read(cntr), 5);
        assert_eq!(fi::fi_cntr_wait(cntr, 5, 10), 0);
        assert_eq!(fi::fi_cntr_wait(cntr, 6, 10), neg(fi::FI_ETIMEDOUT));
        assert_eq!(fi::fi_cntr_seterr(cntr, 2), 0);
        assert_eq!(fi::fi_cntr_readerr(cntr), 2);

        // Cancel of something never posted.
        let mut ctx = 0u64;
        assert_eq!(fi::fi_cancel(&mut (*ep).fid, &mut ctx as *mut _ as *mut _), -(fi::FI_ENOENT as isize));
        // Options.
        let v: usize = 4096;
        assert_eq!(
            fi::fi_setopt(
                &mut (*ep).fid,
                fi::FI_OPT_ENDPOINT as i32,
                fi::FI_OPT_MIN_MULTI_RECV as i32,
                &v as *const _ as *const _,
                8
            ),
            0
        );
        let mut got: usize = 0;
        let mut len: usize = 8;
        assert_eq!(
            fi::fi_getopt(
                &mut (*ep).fid,
                fi::FI_OPT_ENDPOINT as i32,
                fi::FI_OPT_MIN_MULTI_RECV as i32,
                &mut got as *mut _ as *mut _,
                &mut len
            ),
            0
        );
        assert_eq!(got, 4096);
        assert_eq!(
            fi::fi_setopt(&mut (*ep).fid, fi::FI_OPT_ENDPOINT as i32, 9999, &v as *const _ as *const _, 8),
            neg(fi::FI_ENOPROTOOPT)
        );
        // Unsupported operations answer -FI_ENOSYS instead of crashing.
        assert_eq!(fi::fi_shutdown(ep, 0), neg(fi::FI_ENOSYS));
        // RMA on an endpoint whose info did not ask for FI_RMA.
        assert_eq!(
            fi::fi_read(ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), 0, 0, 0, null_mut()),
            -(fi::FI_EOPNOTSUPP as isize)
        );
        // getname with a short buffer.
        let mut small = [0u8; 8];
        let mut len = small.len();
        assert_eq!(fi::fi_getname(&mut (*ep).fid, small.as_mut_ptr() as *mut _, &mut len), neg(fi::FI_ETOOSMALL));
        assert_eq!(len, 64);
        // Sending to an fi_addr that is not in the AV.
        assert_eq!(
            fi::fi_send(ep, buf.as_ptr() as *const _, 8, null_mut(), 1234, null_mut()),
            -(fi::FI_EINVAL as isize)
        );

        // EQ: write then read back.
        let msg = *b"hello-eq";
        assert_eq!(fi::fi_eq_write(eq, 42, msg.as_ptr() as *const _, 8, 0), 8);
        let mut ev = 0u32;
        let mut out = [0u8; 8];
        assert_eq!(fi::fi_eq_read(eq, &mut ev, out.as_mut_ptr() as *mut _, 8, 0), 8);
        assert_eq!((ev, out), (42, msg));
        assert_eq!(fi::fi_eq_sread(eq, &mut ev, out.as_mut_ptr() as *mut _, 8, 10, 0), -(fi::FI_EAGAIN as isize));

        // Close in a legal order.
        assert_eq!(close(&mut (*ep).fid), 0);
        assert_eq!(close(&mut (*mr).fid), 0);
        assert_eq!(close(&mut (*cntr).fid), 0);
        assert_eq!(close(&mut (*av).fid), 0);
        assert_eq!(close(&mut (*cq).fid), 0);
        assert_eq!(close(&mut (*eq).fid), 0);
        assert_eq!(close(&mut (*domain).fid), 0);
        assert_eq!(close(&mut (*fabric).fid), 0);
    }
}

#[test]
fn bad_arguments_get_errors_not_crashes() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut cq_attr = fi::fi_cq_attr { format: 77, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), neg(fi::FI_EINVAL));
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_TABLE, ..Default::default() };
        let mut av = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        // A garbage address is not inserted; fi_addr says NOTAVAIL.
        let garbage = [0xffu8; 48];
        let mut fa = 0u64;
        assert_eq!(fi::fi_av_insert(av, garbage.as_ptr() as *const _, 1, &mut fa, 0, null_mut()), 0);
        assert_eq!(fa, FI_ADDR_NOTAVAIL);
        assert_eq!(fi::fi_av_insert(av, std::ptr::null(), 1, &mut fa, 0, null_mut()), neg(fi::FI_EINVAL));
        // Named (shared) AVs are not supported.
        let name = c"FI_NAMED_AV_0\n";
        let mut named = fi::fi_av_attr {
            type_: fi::FI_AV_TABLE,
            name: name.as_ptr(),
            flags: fi::FI_READ as u64,
            ..Default::default()
        };
        let mut av2 = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut named, &mut av2, null_mut()), neg(fi::FI_ENOSYS));
        // Unsupported opens answer ENOSYS.
        let mut sep = null_mut();
        assert_eq!(fi::fi_scalable_ep(domain, info.0, &mut sep, null_mut()), neg(fi::FI_ENOSYS));
        let mut pep = null_mut();
        assert_eq!(fi::fi_passive_ep(fabric, info.0, &mut pep, null_mut()), neg(fi::FI_ENOSYS));
        assert_eq!(fi::fi_close(&mut (*av).fid), 0);
        assert_eq!(fi::fi_close(&mut (*domain).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}

#[test]
fn av_insert_lookup_remove_reinsert_and_straddr() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let me = s.name();
    let a0 = s.insert(&me);
    let a1 = s.insert(&me);
    assert_eq!((a0, a1), (0, 1), "FI_AV_TABLE indices are consecutive");
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        let mut back = [0u8; 64];
        let mut len = back.len();
        assert_eq!(fi::fi_av_lookup(s.av, a1, back.as_mut_ptr() as *mut _, &mut len), 0);
        assert_eq!(&back[..], &me[..]);
        let mut rm = a0;
        assert_eq!(fi::fi_av_remove(s.av, &mut rm, 1, 0), 0);
        assert_eq!(fi::fi_av_lookup(s.av, a0, back.as_mut_ptr() as *mut _, &mut len), neg(fi::FI_EINVAL));
        assert_eq!(s.insert(&me), 0, "the freed slot is reused");
        let mut buf = [0 as libc::c_char; 128];
        let mut blen = buf.len();
        fi::fi_av_straddr(s.av, me.as_ptr() as *const _, buf.as_mut_ptr(), &mut blen);
        let text = std::ffi::CStr::from_ptr(buf.as_ptr()).to_string_lossy();
        assert!(text.starts_with("rdmx://"), "{text}");
    }
}

/// Every permutation of closing AV, CQ, counter and EQ after the endpoint, and
/// opening them in the reverse order, works; the domain and fabric close last.
#[test]
fn objects_close_in_any_legal_order() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    let orders: [[usize; 4]; 6] = [[0, 1, 2, 3], [3, 2, 1, 0], [1, 0, 3, 2], [2, 3, 0, 1], [0, 2, 1, 3], [3, 1, 2, 0]];
    for order in orders {
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        unsafe {
            let mut fabric = null_mut();
            assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
            let mut domain = null_mut();
            assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
            let mut fids: [*mut fi::fid; 4] = [null_mut(); 4];
            // Open in the reverse of the close order.
            for &k in order.iter().rev() {
                fids[k] = match k {
                    0 => {
                        let mut a = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
                        let mut av = null_mut();
                        assert_eq!(fi::fi_av_open(domain, &mut a, &mut av, null_mut()), 0);
                        &mut (*av).fid
                    }
                    1 => {
                        let mut a = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_MSG, ..Default::default() };
                        let mut cq = null_mut();
                        assert_eq!(fi::fi_cq_open(domain, &mut a, &mut cq, null_mut()), 0);
                        &mut (*cq).fid
                    }
                    2 => {
                        let mut a = fi::fi_cntr_attr::default();
                        let mut c = null_mut();
                        assert_eq!(fi::fi_cntr_open(domain, &mut a, &mut c, null_mut()), 0);
                        &mut (*c).fid
                    }
                    _ => {
                        let mut a = fi::fi_eq_attr::default();
                        let mut eq = null_mut();
                        assert_eq!(fi::fi_eq_open(fabric, &mut a, &mut eq, null_mut()), 0);
                        &mut (*eq).fid
                    }
                };
            }
            let mut ep = null_mut();
            assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
            assert_eq!(fi::fi_ep_bind(ep, fids[0], 0), 0);
            assert_eq!(fi::fi_ep_bind(ep, fids[1], (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
            assert_eq!(fi::fi_ep_bind(ep, fids[2], (fi::FI_SEND | fi::FI_RECV) as u64), 0);
            assert_eq!(fi::fi_ep_bind(ep, fids[3], 0), 0);
            assert_eq!(fi::fi_enable(ep), 0);
            for &k in &order {
                assert_eq!(close(fids[k]), neg(fi::FI_EBUSY), "bound object {k} closed under a live endpoint");
            }
            assert_eq!(close(&mut (*ep).fid), 0);
            for &k in &order {
                assert_eq!(close(fids[k]), 0, "order {order:?}");
            }
            assert_eq!(close(&mut (*domain).fid), 0);
            assert_eq!(close(&mut (*fabric).fid), 0);
        }
    }
}
