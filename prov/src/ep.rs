//! Endpoints (`FI_EP_RDM`, and `FI_EP_DGRAM` through the same objects and
//! tables: the profile's type selects the message engine's datagram mode in
//! [`crate::core`]): binding, enabling, addressing, and the message and tagged
//! operation tables. Each operation validates its arguments here and hands a
//! typed request to [`crate::core`].
use crate::addr::ADDR_LEN;
use crate::args::{RecvArgs, SendArgs, UserBuf, UserIov};
use crate::av::Av;
use crate::cntr::Cntr;
use crate::core::{CqBinding, EpShared};
use crate::cq::Cq;
use crate::domain::{self, Domain};
use crate::entry::{entry, entry_unsupported, non_null, Out};
use crate::eq::Eq;
use crate::error::{Error, Result};
use crate::fid::{self, FidObject};
use crate::info;
use libfabric_sys as fi;
use parking_lot::Mutex;
use rndv::MsgKind;
use std::sync::Arc;

/// What the endpoint is bound to, so close can release the references.
#[derive(Default)]
struct Bound {
    av: Option<*const Av>,
    cqs: Vec<*const Cq>,
    cntrs: Vec<*const Cntr>,
    eq: Option<*const Eq>,
}

#[repr(C)]
pub struct Ep {
    pub fid: fi::fid_ep,
    domain: *const Domain,
    pub shared: Arc<EpShared>,
    bound: Mutex<Bound>,
}

// SAFETY: #[repr(C)] with fid_ep first.
unsafe impl FidObject for Ep {
    const CLASS: u32 = fi::FI_CLASS_EP;
}

static EP_FI_OPS: fi::fi_ops = fid::fi_ops(ep_close, Some(ep_bind), Some(ep_control));

static EP_OPS: fi::fi_ops_ep = fi::fi_ops_ep {
    size: std::mem::size_of::<fi::fi_ops_ep>(),
    cancel: Some(ep_cancel),
    getopt: Some(ep_getopt),
    setopt: Some(ep_setopt),
    tx_ctx: Some(no_tx_ctx),
    rx_ctx: Some(no_rx_ctx),
    rx_size_left: Some(no_size_left),
    tx_size_left: Some(no_size_left),
};

static CM_OPS: fi::fi_ops_cm = fi::fi_ops_cm {
    size: std::mem::size_of::<fi::fi_ops_cm>(),
    setname: Some(no_setname),
    getname: Some(ep_getname),
    getpeer: Some(no_getpeer),
    connect: Some(no_connect),
    listen: Some(no_listen),
    accept: Some(no_accept),
    reject: Some(no_reject),
    shutdown: Some(no_shutdown),
    join: Some(no_join),
};

static MSG_OPS: fi::fi_ops_msg = fi::fi_ops_msg {
    size: std::mem::size_of::<fi::fi_ops_msg>(),
    recv: Some(msg_recv),
    recvv: Some(msg_recvv),
    recvmsg: Some(msg_recvmsg),
    send: Some(msg_send),
    sendv: Some(msg_sendv),
    sendmsg: Some(msg_sendmsg),
    inject: Some(msg_inject),
    senddata: Some(msg_senddata),
    injectdata: Some(msg_injectdata),
};

static TAGGED_OPS: fi::fi_ops_tagged = fi::fi_ops_tagged {
    size: std::mem::size_of::<fi::fi_ops_tagged>(),
    recv: Some(tagged_recv),
    recvv: Some(tagged_recvv),
    recvmsg: Some(tagged_recvmsg),
    send: Some(tagged_send),
    sendv: Some(tagged_sendv),
    sendmsg: Some(tagged_sendmsg),
    inject: Some(tagged_inject),
    senddata: Some(tagged_senddata),
    injectdata: Some(tagged_injectdata),
};

static RMA_OPS: fi::fi_ops_rma = fi::fi_ops_rma {
    size: std::mem::size_of::<fi::fi_ops_rma>(),
    read: Some(rma_read),
    readv: Some(rma_readv),
    readmsg: Some(rma_readmsg),
    write: Some(rma_write),
    writev: Some(rma_writev),
    writemsg: Some(rma_writemsg),
    inject: Some(rma_inject),
    writedata: Some(rma_writedata),
    injectdata: Some(rma_injectdata),
};

static ATOMIC_OPS: fi::fi_ops_atomic = fi::fi_ops_atomic {
    size: std::mem::size_of::<fi::fi_ops_atomic>(),
    write: Some(atomic_write),
    writev: Some(atomic_writev),
    writemsg: Some(atomic_writemsg),
    inject: Some(atomic_inject),
    readwrite: Some(atomic_readwrite),
    readwritev: Some(atomic_readwritev),
    readwritemsg: Some(atomic_readwritemsg),
    compwrite: Some(atomic_compwrite),
    compwritev: Some(atomic_compwritev),
    compwritemsg: Some(atomic_compwritemsg),
    writevalid: Some(atomic_writevalid),
    readwritevalid: Some(atomic_readwritevalid),
    compwritevalid: Some(atomic_compwritevalid),
};

static COLLECTIVE_OPS: fi::fi_ops_collective = fi::fi_ops_collective {
    size: std::mem::size_of::<fi::fi_ops_collective>(),
    barrier: Some(no_barrier),
    broadcast: Some(no_broadcast),
    alltoall: Some(no_alltoall),
    allreduce: Some(no_allreduce),
    allgather: Some(no_allgather),
    reduce_scatter: Some(no_reduce_scatter),
    reduce: Some(no_reduce),
    scatter: Some(no_scatter),
    gather: Some(no_gather),
    msg: Some(no_coll_msg),
    barrier2: Some(no_barrier2),
};

type Ctx = *mut libc::c_void;
type Desc = *mut libc::c_void;
type DescV = *mut *mut libc::c_void;

entry_unsupported! {
    fn no_tx_ctx(sep: *mut fi::fid_ep, index: i32, attr: *mut fi::fi_tx_attr, tx_ep: *mut *mut fi::fid_ep, context: Ctx) -> i32 = Error::NoSys;
    fn no_rx_ctx(sep: *mut fi::fid_ep, index: i32, attr: *mut fi::fi_rx_attr, rx_ep: *mut *mut fi::fid_ep, context: Ctx) -> i32 = Error::NoSys;
    fn no_size_left(ep: *mut fi::fid_ep) -> isize = Error::NoSys;
    fn no_setname(fid: fi::fid_t, addr: *mut libc::c_void, addrlen: usize) -> i32 = Error::NoSys;
    fn no_getpeer(ep: *mut fi::fid_ep, addr: *mut libc::c_void, addrlen: *mut usize) -> i32 = Error::NoSys;
    fn no_connect(ep: *mut fi::fid_ep, addr: *const libc::c_void, param: *const libc::c_void, paramlen: usize) -> i32 = Error::NoSys;
    fn no_listen(pep: *mut fi::fid_pep) -> i32 = Error::NoSys;
    fn no_accept(ep: *mut fi::fid_ep, param: *const libc::c_void, paramlen: usize) -> i32 = Error::NoSys;
    fn no_reject(pep: *mut fi::fid_pep, handle: fi::fid_t, param: *const libc::c_void, paramlen: usize) -> i32 = Error::NoSys;
    fn no_shutdown(ep: *mut fi::fid_ep, flags: u64) -> i32 = Error::NoSys;
    fn no_join(ep: *mut fi::fid_ep, addr: *const libc::c_void, flags: u64, mc: *mut *mut fi::fid_mc, context: Ctx) -> i32 = Error::NoSys;
    fn no_barrier(ep: *mut fi::fid_ep, coll_addr: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_broadcast(ep: *mut fi::fid_ep, buf: *mut libc::c_void, count: usize, desc: Desc, coll_addr: u64, root_addr: u64, datatype: fi::fi_datatype, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_alltoall(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, datatype: fi::fi_datatype, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_allreduce(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, datatype: fi::fi_datatype, op: fi::fi_op, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_allgather(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, datatype: fi::fi_datatype, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_reduce_scatter(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, datatype: fi::fi_datatype, op: fi::fi_op, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_reduce(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, root_addr: u64, datatype: fi::fi_datatype, op: fi::fi_op, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_scatter(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, root_addr: u64, datatype: fi::fi_datatype, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_gather(ep: *mut fi::fid_ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, coll_addr: u64, root_addr: u64, datatype: fi::fi_datatype, flags: u64, context: Ctx) -> isize = Error::NoSys;
    fn no_coll_msg(ep: *mut fi::fid_ep, msg: *const fi::fi_msg_collective, resultv: *mut fi::fi_ioc, result_desc: DescV, result_count: usize, flags: u64) -> isize = Error::NoSys;
    fn no_barrier2(ep: *mut fi::fid_ep, coll_addr: u64, flags: u64, context: Ctx) -> isize = Error::NoSys;
}

entry! {
    /// `fi_endpoint`.
    fn rdmx_endpoint(domain: *mut fi::fid_domain, info: *mut fi::fi_info, out: *mut *mut fi::fid_ep => Out<*mut fi::fid_ep>, context: Ctx) -> i32 {
        non_null!(info);
        // SAFETY: our domain.
        let d = unsafe { domain::domain_ref(domain) }?;
        // SAFETY: the application's info (normally from fi_getinfo).
        let mut profile = unsafe { info::profile_from_info(info, d.api_version()) }?;
        // SAFETY: checked non-null.
        let ep_type = unsafe { (*info).ep_attr.as_ref().map(|a| a.type_) }.unwrap_or(fi::FI_EP_RDM);
        if ep_type != fi::FI_EP_RDM && ep_type != fi::FI_EP_DGRAM {
            return Err(Error::Inval("rdmx endpoints are FI_EP_RDM or FI_EP_DGRAM"));
        }
        // The endpoint lives in its domain's device family.
        profile.device = d.profile.device;
        let virt = d.profile.mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0 || d.profile.mr_mode == fi::FI_MR_BASIC as i32;
        let shared = EpShared::new(profile, &*d.devices, d.mr_keys.clone(), d.mr_cache.clone(), virt)?;
        d.children.get();
        let ep = fid::leak(Ep {
            fid: fi::fid_ep {
                fid: fid::new_fid(fi::FI_CLASS_EP, context, &EP_FI_OPS),
                ops: &EP_OPS as *const _ as *mut _,
                cm: &CM_OPS as *const _ as *mut _,
                msg: &MSG_OPS as *const _ as *mut _,
                rma: &RMA_OPS as *const _ as *mut _,
                tagged: &TAGGED_OPS as *const _ as *mut _,
                atomic: &ATOMIC_OPS as *const _ as *mut _,
                collective: &COLLECTIVE_OPS as *const _ as *mut _,
            },
            domain: d,
            shared,
            bound: Mutex::new(Bound::default()),
        });
        out.set(ep as *mut fi::fid_ep);
        Ok(0)
    }
}

entry! {
    fn ep_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        ep.shared.stop_progress_thread();
        {
            let mut st = ep.shared.lock();
            // Flush what the engine still holds (acks, last sends) once more.
            st.flush_on_close();
            if let Some(b) = &st.tx_cq {
                b.cq.detach(&ep.shared);
            }
            if let Some(b) = &st.rx_cq {
                b.cq.detach(&ep.shared);
            }
            for c in [&st.send_cntr, &st.recv_cntr, &st.read_cntr, &st.write_cntr, &st.rread_cntr, &st.rwrite_cntr].into_iter().flatten() {
                c.detach(&ep.shared);
            }
            st.running = None;
            st.tx_cq = None;
            st.rx_cq = None;
            st.send_cntr = None;
            st.recv_cntr = None;
            st.read_cntr = None;
            st.write_cntr = None;
            st.rread_cntr = None;
            st.rwrite_cntr = None;
            st.av = None;
        }
        let b = std::mem::take(&mut *ep.bound.lock());
        // SAFETY: bound objects cannot close while bound (their Refs are non-zero),
        // so these pointers are alive.
        unsafe {
            if let Some(av) = b.av {
                (*av).bound.put();
            }
            for cq in b.cqs {
                (*cq).bound.put();
            }
            for c in b.cntrs {
                (*c).bound.put();
            }
            if let Some(eq) = b.eq {
                (*eq).bound.put();
            }
            (*ep.domain).children.put();
        }
        // SAFETY: created by fid::leak in rdmx_endpoint.
        unsafe { fid::retire(ep as *const Ep) };
        Ok(0)
    }
}

entry! {
    fn ep_bind(f: *mut fi::fid, bfid: *mut fi::fid, flags: u64) -> i32 {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        non_null!(bfid);
        // SAFETY: checked non-null; every fid starts with its class.
        let class = unsafe { (*bfid).fclass } as u32;
        let mut st = ep.shared.lock();
        if st.running.is_some() {
            return Err(Error::OpNotSupp);
        }
        let mut bound = ep.bound.lock();
        match class {
            fi::FI_CLASS_AV => {
                // SAFETY: class checked.
                let av = unsafe { Av::from_fid(bfid) }?;
                if bound.av.is_some() {
                    return Err(Error::Inval("an AV is already bound"));
                }
                av.bound.get();
                bound.av = Some(av);
                st.av = Some(av.table.clone());
            }
            fi::FI_CLASS_CQ => {
                // SAFETY: class checked.
                let cq = unsafe { Cq::from_fid(bfid) }?;
                let known = (fi::FI_TRANSMIT | fi::FI_RECV) as u64 | fi::FI_SELECTIVE_COMPLETION;
                if flags & !known != 0 {
                    return Err(Error::BadFlags);
                }
                if flags & (fi::FI_TRANSMIT | fi::FI_RECV) as u64 == 0 {
                    return Err(Error::Inval("bind a CQ with FI_TRANSMIT and/or FI_RECV"));
                }
                let selective = flags & fi::FI_SELECTIVE_COMPLETION != 0;
                let b = CqBinding { cq: cq.shared.clone(), selective };
                if flags & fi::FI_TRANSMIT as u64 != 0 {
                    if st.tx_cq.is_some() {
                        return Err(Error::Inval("a transmit CQ is already bound"));
                    }
                    st.tx_cq = Some(b.clone());
                }
                if flags & fi::FI_RECV as u64 != 0 {
                    if st.rx_cq.is_some() {
                        return Err(Error::Inval("a receive CQ is already bound"));
                    }
                    st.rx_cq = Some(b);
                }
                cq.shared.attach(&ep.shared);
                if let (Some(w), Some(fd)) = (&cq.shared.wait, st.device.as_ref().and_then(|d| d.wait_fd())) {
                    w.add(fd);
                }
                cq.bound.get();
                bound.cqs.push(cq);
            }
            fi::FI_CLASS_CNTR => {
                // SAFETY: class checked.
                let c = unsafe { Cntr::from_fid(bfid) }?;
                let known = (fi::FI_SEND | fi::FI_RECV | fi::FI_READ | fi::FI_WRITE | fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
                if flags & !known != 0 || flags == 0 {
                    return Err(Error::BadFlags);
                }
                if flags & fi::FI_SEND as u64 != 0 {
                    st.send_cntr = Some(c.shared.clone());
                }
                if flags & fi::FI_RECV as u64 != 0 {
                    st.recv_cntr = Some(c.shared.clone());
                }
                if flags & fi::FI_READ as u64 != 0 {
                    st.read_cntr = Some(c.shared.clone());
                }
                if flags & fi::FI_WRITE as u64 != 0 {
                    st.write_cntr = Some(c.shared.clone());
                }
                if flags & fi::FI_REMOTE_READ as u64 != 0 {
                    st.rread_cntr = Some(c.shared.clone());
                }
                if flags & fi::FI_REMOTE_WRITE as u64 != 0 {
                    st.rwrite_cntr = Some(c.shared.clone());
                }
                c.shared.attach(&ep.shared);
                if let (Some(w), Some(fd)) = (&c.shared.wait, st.device.as_ref().and_then(|d| d.wait_fd())) {
                    w.add(fd);
                }
                c.bound.get();
                bound.cntrs.push(c);
            }
            fi::FI_CLASS_EQ => {
                // SAFETY: class checked.
                let eq = unsafe { Eq::from_fid(bfid) }?;
                if bound.eq.is_none() {
                    eq.bound.get();
                    bound.eq = Some(eq);
                    st.eq = Some((eq.shared.clone(), &ep.fid as *const _ as usize));
                }
            }
            _ => return Err(Error::Inval("cannot bind this object to an endpoint")),
        }
        Ok(0)
    }
}

entry! {
    fn ep_control(f: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        match command as u32 {
            fi::FI_ENABLE => {
                ep.shared.enable()?;
                Ok(0)
            }
            // fi_endpoint(3): the argument is a uint64_t * holding FI_TRANSMIT
            // or FI_RECV (not both); GET returns that direction's default
            // operation flags, SET replaces them with the other bits given.
            fi::FI_GETOPSFLAG | fi::FI_SETOPSFLAG => {
                non_null!(arg);
                // SAFETY: checked non-null; the argument is a uint64_t *.
                let given = unsafe { std::ptr::read_unaligned(arg as *const u64) };
                let dir = given & (fi::FI_TRANSMIT | fi::FI_RECV) as u64;
                let transmit = dir == fi::FI_TRANSMIT as u64;
                if !transmit && dir != fi::FI_RECV as u64 {
                    return Err(Error::BadFlags);
                }
                let mut st = ep.shared.lock();
                if command as u32 == fi::FI_GETOPSFLAG {
                    let v = if transmit { st.profile.tx_op_flags } else { st.profile.rx_op_flags };
                    // SAFETY: as above.
                    unsafe { std::ptr::write_unaligned(arg as *mut u64, v) };
                    return Ok(0);
                }
                let v = given & !dir;
                if v & !info::op_flags_allowed(st.profile.ep_type, transmit) != 0 {
                    return Err(Error::BadFlags);
                }
                if transmit {
                    st.profile.tx_op_flags = v;
                } else {
                    st.profile.rx_op_flags = v;
                }
                Ok(0)
            }
            _ => Err(Error::NoSys),
        }
    }
}

entry! {
    fn ep_getname(f: fi::fid_t, addr: *mut libc::c_void, addrlen: *mut usize) -> i32 {
        non_null!(addrlen);
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        let bytes = ep.shared.lock().local.encode();
        // SAFETY: checked non-null.
        let have = unsafe { *addrlen };
        // SAFETY: checked non-null.
        unsafe { *addrlen = ADDR_LEN };
        if have < ADDR_LEN {
            return Err(Error::TooSmall);
        }
        non_null!(addr);
        // SAFETY: the application's buffer holds `have >= ADDR_LEN` bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, ADDR_LEN) };
        Ok(0)
    }
}

entry! {
    fn ep_cancel(f: fi::fid_t, context: *mut libc::c_void) -> isize {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        ep.shared.lock().cancel(context as usize)?;
        Ok(0)
    }
}

entry! {
    fn ep_getopt(f: fi::fid_t, level: i32, optname: i32, optval: *mut libc::c_void, optlen: *mut usize) -> i32 {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        if level != fi::FI_OPT_ENDPOINT as i32 {
            return Err(Error::NoProtoOpt);
        }
        match optname as u32 {
            fi::FI_OPT_MIN_MULTI_RECV => {
                non_null!(optval, optlen);
                let v = ep.shared.lock().min_multi_recv;
                // SAFETY: checked non-null; the option is a size_t.
                unsafe {
                    *(optval as *mut usize) = v;
                    *optlen = std::mem::size_of::<usize>();
                }
                Ok(0)
            }
            _ => Err(Error::NoProtoOpt),
        }
    }
}

/// fi_endpoint(3) options newer than 1.17's headers, by value.
/// `FI_OPT_CUDA_API_PERMITTED` (1.18): rdmx never calls CUDA (no `FI_HMEM`),
/// so there is nothing to permit or forbid, and like tcp, udp and rxd it
/// answers `-FI_ENOPROTOOPT` (the page's `-FI_EOPNOTSUPP` is for providers
/// whose CUDA support needs the API). `FI_OPT_SHARED_MEMORY_PERMITTED`
/// (1.21): an auto domain's shared-memory path is chosen per peer when the
/// endpoint opens, and turning it off per endpoint is not offered
/// (`FI_RDMX_DEVICE=udp` is the process-wide way); `-FI_ENOPROTOOPT` too.
const OPT_CUDA_API_PERMITTED: u32 = 10;
const OPT_SHARED_MEMORY_PERMITTED: u32 = 11;

entry! {
    fn ep_setopt(f: fi::fid_t, level: i32, optname: i32, optval: *const libc::c_void, optlen: usize) -> i32 {
        // SAFETY: our fid.
        let ep = unsafe { Ep::from_fid(f) }?;
        if level != fi::FI_OPT_ENDPOINT as i32 {
            return Err(Error::NoProtoOpt);
        }
        match optname as u32 {
            fi::FI_OPT_MIN_MULTI_RECV => {
                non_null!(optval);
                if optlen != std::mem::size_of::<usize>() {
                    return Err(Error::Inval("FI_OPT_MIN_MULTI_RECV is a size_t"));
                }
                // SAFETY: checked non-null and size.
                let v = unsafe { std::ptr::read_unaligned(optval as *const usize) };
                let mut st = ep.shared.lock();
                st.min_multi_recv = v;
                if let Some(r) = st.running.as_mut() {
                    r.ep.set_min_multi_recv(v);
                }
                Ok(0)
            }
            OPT_CUDA_API_PERMITTED | OPT_SHARED_MEMORY_PERMITTED => Err(Error::NoProtoOpt),
            _ => Err(Error::NoProtoOpt),
        }
    }
}

// ---- message and tagged operations ----

/// # Safety
/// `iov` is null or valid for `count` entries.
unsafe fn user_iov(iov: *const fi::iovec, count: usize) -> Result<UserIov> {
    if count > info::IOV_LIMIT {
        return Err(Error::Inval("iov count above iov_limit"));
    }
    let mut out = UserIov { count, ..UserIov::default() };
    if count == 0 {
        return Ok(out);
    }
    non_null!(iov);
    // SAFETY: per contract.
    let s = unsafe { std::slice::from_raw_parts(iov, count) };
    for (o, v) in out.bufs.iter_mut().zip(s) {
        if v.iov_base.is_null() && v.iov_len != 0 {
            return Err(Error::Inval("NULL iov_base with non-zero length"));
        }
        // SAFETY: an entry of the application's iov (this function's contract).
        *o = unsafe { UserBuf::new(v.iov_base as usize, v.iov_len) };
    }
    Ok(out)
}

/// # Safety
/// `buf` is null (with `len` 0) or the application's buffer of `len` bytes,
/// valid as long as libfabric's contract for the operation requires.
unsafe fn single(buf: *const libc::c_void, len: usize) -> Result<UserIov> {
    if buf.is_null() && len != 0 {
        return Err(Error::Inval("NULL buffer with non-zero length"));
    }
    let mut out = UserIov { count: 1, ..UserIov::default() };
    // SAFETY: per this function's contract.
    out.bufs[0] = unsafe { UserBuf::new(buf as usize, len) };
    Ok(out)
}

/// The descriptors of a send's buffers, as addresses (0: none). They are
/// never dereferenced: the domain's registration cache looks them up.
///
/// # Safety
/// `desc` is null or the application's descriptor array of `count` entries.
unsafe fn descs(desc: DescV, count: usize) -> [usize; info::IOV_LIMIT] {
    let mut out = [0usize; info::IOV_LIMIT];
    if !desc.is_null() {
        // SAFETY: per contract (count is checked against the iov limit by
        // user_iov before the send goes anywhere; only that many are read).
        let s = unsafe { std::slice::from_raw_parts(desc as *const *mut libc::c_void, count.min(info::IOV_LIMIT)) };
        for (o, d) in out.iter_mut().zip(s) {
            *o = *d as usize;
        }
    }
    out
}

fn one_desc(desc: Desc) -> [usize; info::IOV_LIMIT] {
    let mut out = [0usize; info::IOV_LIMIT];
    out[0] = desc as usize;
    out
}

#[allow(clippy::too_many_arguments)]
fn do_send(ep: &Ep, kind: MsgKind, iov: UserIov, desc: [usize; info::IOV_LIMIT], dest: u64, tag: u64, data: Option<u64>, context: Ctx, flags: Option<u64>, inject: bool) -> Result<isize> {
    let mut st = ep.shared.lock();
    let flags = flags.unwrap_or(st.profile.tx_op_flags);
    let mut slices: [&[u8]; info::IOV_LIMIT] = [&[]; info::IOV_LIMIT];
    for (s, b) in slices.iter_mut().zip(&iov.bufs[..iov.count]) {
        if !b.is_empty() {
            // SAFETY: a UserBuf is the application's buffer of `len` bytes (its
            // constructor's contract), valid for the call.
            *s = unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.len()) };
        }
    }
    st.send(SendArgs {
        kind,
        dest,
        payload: &slices[..iov.count],
        desc,
        tag,
        data,
        context: context as usize,
        flags,
        inject,
    })?;
    Ok(0)
}

#[allow(clippy::too_many_arguments)] // the union of the fi_recv family's arguments
fn do_recv(ep: &Ep, kind: MsgKind, iov: UserIov, src: u64, tag: u64, ignore: u64, context: Ctx, flags: Option<u64>) -> Result<isize> {
    let mut st = ep.shared.lock();
    let flags = flags.unwrap_or(st.profile.rx_op_flags);
    let supported = (fi::FI_COMPLETION | fi::FI_MORE | fi::FI_MULTI_RECV | fi::FI_PEEK) as u64 | fi::FI_CLAIM | fi::FI_DISCARD;
    if flags & !supported != 0 {
        return Err(Error::BadFlags);
    }
    st.post_recv(RecvArgs { kind, src, iov, tag, ignore, context: context as usize, flags })?;
    Ok(0)
}

const SEND_MSG_FLAGS: u64 = (fi::FI_COMPLETION
    | fi::FI_INJECT
    | fi::FI_INJECT_COMPLETE
    | fi::FI_TRANSMIT_COMPLETE
    | fi::FI_DELIVERY_COMPLETE
    | fi::FI_REMOTE_CQ_DATA
    | fi::FI_MORE
    | fi::FI_FENCE) as u64;

/// The `fi_msg` / `fi_msg_tagged` fields the two-sided `*msg` calls read.
trait TwoSidedMsg {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64);
    fn desc(&self) -> DescV;
}

impl TwoSidedMsg for fi::fi_msg {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64) {
        (self.msg_iov, self.iov_count, self.addr, self.context, self.data, 0, 0)
    }
    fn desc(&self) -> DescV {
        self.desc
    }
}

impl TwoSidedMsg for fi::fi_msg_tagged {
    fn parts(&self) -> (*const fi::iovec, usize, u64, Ctx, u64, u64, u64) {
        (self.msg_iov, self.iov_count, self.addr, self.context, self.data, self.tag, self.ignore)
    }
    fn desc(&self) -> DescV {
        self.desc
    }
}

/// The nine send/receive entry points of one two-sided family, from one
/// definition: `FI_MSG` (no tag arguments) and `FI_TAGGED` (`tag` for sends,
/// `tag, ignore` for receives, inserted before the context as in libfabric's
/// prototypes). Every variant lands in [`do_send`] / [`do_recv`].
macro_rules! two_sided_family {
    (
        kind: $kind:expr, msg: $msg:ty,
        send_tag: [$($st:ident: $stt:ty),*] => $tag:expr,
        recv_tag: [$($rt:ident: $rtt:ty),*] => ($rtag:expr, $rignore:expr),
        $recv:ident, $recvv:ident, $recvmsg:ident, $send:ident, $sendv:ident, $sendmsg:ident, $inject:ident, $senddata:ident, $injectdata:ident
    ) => {
        entry! {
            fn $recv(ep: *mut fi::fid_ep => &Ep, buf: *mut libc::c_void, len: usize, desc: Desc, src: u64, $($rt: $rtt,)* context: Ctx) -> isize {
                let _ = desc;
                // SAFETY: the application's buffer of `len` bytes, valid until the
                // receive completes (libfabric's contract for posted buffers).
                let iov = unsafe { single(buf, len) }?;
                do_recv(ep, $kind, iov, src, $rtag, $rignore, context, None)
            }
        }
        entry! {
            fn $recvv(ep: *mut fi::fid_ep => &Ep, iov: *const fi::iovec, desc: DescV, count: usize, src: u64, $($rt: $rtt,)* context: Ctx) -> isize {
                let _ = desc;
                // SAFETY: the application's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                do_recv(ep, $kind, iov, src, $rtag, $rignore, context, None)
            }
        }
        entry! {
            fn $recvmsg(ep: *mut fi::fid_ep => &Ep, msg: *const $msg, flags: u64) -> isize {
                non_null!(msg);
                // SAFETY: checked non-null; the application's message.
                let (iov, count, addr, context, _, tag, ignore) = unsafe { &*msg }.parts();
                // SAFETY: the message's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                do_recv(ep, $kind, iov, addr, tag, ignore, context, Some(flags))
            }
        }
        entry! {
            fn $send(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, desc: Desc, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: the application's buffer of `len` bytes, valid for the
                // call (the engine copies it, or keeps it until the send completes).
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, one_desc(desc), dest, $tag, None, context, None, false)
            }
        }
        entry! {
            fn $sendv(ep: *mut fi::fid_ep => &Ep, iov: *const fi::iovec, desc: DescV, count: usize, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: the application's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                // SAFETY: its descriptor array has as many entries, or is null.
                let desc = unsafe { descs(desc, iov.count) };
                do_send(ep, $kind, iov, desc, dest, $tag, None, context, None, false)
            }
        }
        entry! {
            fn $sendmsg(ep: *mut fi::fid_ep => &Ep, msg: *const $msg, flags: u64) -> isize {
                non_null!(msg);
                if flags & !SEND_MSG_FLAGS != 0 {
                    return Err(Error::BadFlags);
                }
                // SAFETY: checked non-null; the application's message.
                let m = unsafe { &*msg };
                let (iov, count, addr, context, data, tag, _) = m.parts();
                // SAFETY: the message's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                // SAFETY: the message's descriptor array has as many entries, or is null.
                let desc = unsafe { descs(m.desc(), iov.count) };
                let data = (flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(data);
                do_send(ep, $kind, iov, desc, addr, tag, data, context, Some(flags), false)
            }
        }
        entry! {
            fn $inject(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, dest: u64, $($st: $stt),*) -> isize {
                // SAFETY: the application's buffer of `len` bytes, valid for the call
                // (an inject is copied before it returns).
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, [0; info::IOV_LIMIT], dest, $tag, None, std::ptr::null_mut(), Some(0), true)
            }
        }
        entry! {
            fn $senddata(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, desc: Desc, data: u64, dest: u64, $($st: $stt,)* context: Ctx) -> isize {
                // SAFETY: as for the plain send.
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, one_desc(desc), dest, $tag, Some(data), context, None, false)
            }
        }
        entry! {
            fn $injectdata(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, len: usize, data: u64, dest: u64, $($st: $stt),*) -> isize {
                // SAFETY: as for the plain inject.
                let iov = unsafe { single(buf, len) }?;
                do_send(ep, $kind, iov, [0; info::IOV_LIMIT], dest, $tag, Some(data), std::ptr::null_mut(), Some(0), true)
            }
        }
    };
}

two_sided_family! {
    kind: MsgKind::Msg, msg: fi::fi_msg,
    send_tag: [] => 0,
    recv_tag: [] => (0, 0),
    msg_recv, msg_recvv, msg_recvmsg, msg_send, msg_sendv, msg_sendmsg, msg_inject, msg_senddata, msg_injectdata
}

two_sided_family! {
    kind: MsgKind::Tagged, msg: fi::fi_msg_tagged,
    send_tag: [tag: u64] => tag,
    recv_tag: [tag: u64, ignore: u64] => (tag, ignore),
    tagged_recv, tagged_recvv, tagged_recvmsg, tagged_send, tagged_sendv, tagged_sendmsg, tagged_inject, tagged_senddata, tagged_injectdata
}

// ---- RMA and atomics (emulated over messages, see crate::rma) ----

use crate::rma::{one, RmaArgs};

/// # Safety
/// `iov` is valid for `count` entries of application memory.
unsafe fn iov_slices<'a>(iov: &UserIov) -> [&'a [u8]; info::IOV_LIMIT] {
    let mut out: [&[u8]; info::IOV_LIMIT] = [&[]; info::IOV_LIMIT];
    for (o, b) in out.iter_mut().zip(&iov.bufs[..iov.count]) {
        if !b.is_empty() {
            // SAFETY: per contract.
            *o = unsafe { std::slice::from_raw_parts(b.ptr() as *const u8, b.len()) };
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn do_rma(ep: &Ep, write: bool, iov: UserIov, peer: u64, addr: u64, key: u64, data: Option<u64>, context: Ctx, flags: Option<u64>, inject: bool) -> Result<isize> {
    let mut st = ep.shared.lock();
    if st.profile.caps & fi::FI_RMA as u64 == 0 {
        return Err(Error::OpNotSupp);
    }
    let flags = flags.unwrap_or(st.profile.tx_op_flags);
    // SAFETY: the application's buffers, valid for the call (writes are copied
    // before return; read destinations stay valid until completion per API).
    let slices = unsafe { iov_slices(&iov) };
    let args = RmaArgs {
        peer_addr: peer,
        key,
        addr,
        context: context as usize,
        flags,
        inject,
        payload: if write { &slices[..iov.count] } else { &[] },
        compare: &[],
        result: if write { UserIov::default() } else { iov },
    };
    if write {
        st.rma_write(args, data)?;
    } else {
        st.rma_read(args)?;
    }
    Ok(0)
}

/// # Safety
/// `msg` is a valid fi_msg_rma.
unsafe fn rma_msg(msg: *const fi::fi_msg_rma) -> Result<(UserIov, u64, u64, u64, Ctx, u64)> {
    non_null!(msg);
    // SAFETY: checked non-null.
    let m = unsafe { &*msg };
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(Error::Inval("rdmx takes exactly one rma_iov"));
    }
    // SAFETY: the message's arrays.
    let (iov, r) = unsafe { (user_iov(m.msg_iov, m.iov_count)?, &*m.rma_iov) };
    if r.len != iov.total() {
        return Err(Error::Inval("rma_iov length differs from the local iov"));
    }
    Ok((iov, m.addr, r.addr, r.key, m.context, m.data))
}

/// The RMA entry points from one definition: each reads its arguments into a
/// gather/scatter list and lands in [`do_rma`] (`write` = direction, `data` =
/// remote CQ data, `inject` = no completion).
macro_rules! rma_op {
    ($name:ident(buf: $buft:ty, len: usize $(, desc: $desc:ident: Desc)?, $(data: $data:ident,)? peer: $peer:ident, addr: u64, key: u64 $(, context: $ctx:ident)?) => write: $write:expr, inject: $inject:expr) => {
        entry! {
            fn $name(ep: *mut fi::fid_ep => &Ep, buf: $buft, len: usize, $($desc: Desc,)? $($data: u64,)? $peer: u64, addr: u64, key: u64 $(, $ctx: Ctx)?) -> isize {
                $(let _ = $desc;)?
                // SAFETY: the application's buffer of `len` bytes, valid for the call
                // (a write is copied) or until the read completes (its target), by
                // libfabric's contract.
                let iov = unsafe { single(buf as *const libc::c_void, len) }?;
                // The context if the call has one (injects do not), the CQ data
                // likewise: the first of each list.
                let context: Ctx = [$($ctx,)? std::ptr::null_mut()][0];
                let data: Option<u64> = [$(Some($data),)? None][0];
                let flags = if $inject { Some(0) } else { None };
                do_rma(ep, $write, iov, $peer, addr, key, data, context, flags, $inject)
            }
        }
    };
    ($name:ident(iov, peer: $peer:ident) => write: $write:expr) => {
        entry! {
            fn $name(ep: *mut fi::fid_ep => &Ep, iov: *const fi::iovec, desc: DescV, count: usize, $peer: u64, addr: u64, key: u64, context: Ctx) -> isize {
                let _ = desc;
                // SAFETY: the application's iov array of `count` entries.
                let iov = unsafe { user_iov(iov, count) }?;
                do_rma(ep, $write, iov, $peer, addr, key, None, context, None, false)
            }
        }
    };
    ($name:ident(msg) => write: $write:expr) => {
        entry! {
            fn $name(ep: *mut fi::fid_ep => &Ep, msg: *const fi::fi_msg_rma, flags: u64) -> isize {
                // SAFETY: the application's message.
                let (iov, peer, addr, key, ctx, data) = unsafe { rma_msg(msg) }?;
                let data = ($write && flags & fi::FI_REMOTE_CQ_DATA as u64 != 0).then_some(data);
                do_rma(ep, $write, iov, peer, addr, key, data, ctx, Some(flags), false)
            }
        }
    };
}

rma_op!(rma_read(buf: *mut libc::c_void, len: usize, desc: desc: Desc, peer: src, addr: u64, key: u64, context: context) => write: false, inject: false);
rma_op!(rma_readv(iov, peer: src) => write: false);
rma_op!(rma_readmsg(msg) => write: false);
rma_op!(rma_write(buf: *const libc::c_void, len: usize, desc: desc: Desc, peer: dest, addr: u64, key: u64, context: context) => write: true, inject: false);
rma_op!(rma_writev(iov, peer: dest) => write: true);
rma_op!(rma_writemsg(msg) => write: true);
rma_op!(rma_inject(buf: *const libc::c_void, len: usize, peer: dest, addr: u64, key: u64) => write: true, inject: true);
rma_op!(rma_writedata(buf: *const libc::c_void, len: usize, desc: desc: Desc, data: data, peer: dest, addr: u64, key: u64, context: context) => write: true, inject: false);
rma_op!(rma_injectdata(buf: *const libc::c_void, len: usize, data: data, peer: dest, addr: u64, key: u64) => write: true, inject: true);

/// One atomic operation, from any of the fi_atomic entry points.
struct AtomicCall {
    operand: UserIov,
    compare: UserIov,
    result: Option<UserIov>,
    peer: u64,
    addr: u64,
    key: u64,
    datatype: fi::fi_datatype,
    op: fi::fi_op,
    count: usize,
    context: Ctx,
    flags: Option<u64>,
    inject: bool,
}

fn do_atomic(ep: &Ep, c: AtomicCall) -> Result<isize> {
    let mut st = ep.shared.lock();
    if st.profile.caps & fi::FI_ATOMIC as u64 == 0 {
        return Err(Error::OpNotSupp);
    }
    let flags = c.flags.unwrap_or(st.profile.tx_op_flags);
    // SAFETY: operand / compare buffers are the application's, valid for the call
    // (copied into the request before return).
    let (ops, cmp) = unsafe { (iov_slices(&c.operand), iov_slices(&c.compare)) };
    let fetch = c.result.is_some();
    let args = RmaArgs {
        peer_addr: c.peer,
        key: c.key,
        addr: c.addr,
        context: c.context as usize,
        flags,
        inject: c.inject,
        payload: &ops[..c.operand.count],
        compare: &cmp[..c.compare.count],
        result: c.result.unwrap_or_default(),
    };
    st.atomic(args, c.datatype, c.op, c.count, fetch)?;
    Ok(0)
}

fn dt_size(datatype: fi::fi_datatype) -> Result<usize> {
    crate::rma::datatype_from_fi(datatype).map(|d| d.size()).ok_or(Error::OpNotSupp)
}

/// # Safety
/// `ioc` is valid for `count` entries.
unsafe fn ioc_iov(ioc: *const fi::fi_ioc, count: usize, datatype: fi::fi_datatype) -> Result<(UserIov, usize)> {
    if count > info::IOV_LIMIT {
        return Err(Error::Inval("ioc count"));
    }
    let size = dt_size(datatype)?;
    let mut out = UserIov { count, ..UserIov::default() };
    if count == 0 {
        return Ok((out, 0));
    }
    non_null!(ioc);
    // SAFETY: per contract.
    let s = unsafe { std::slice::from_raw_parts(ioc, count) };
    let mut elems = 0;
    for (o, v) in out.bufs.iter_mut().zip(s) {
        // SAFETY: an entry of the application's ioc (this function's contract).
        *o = unsafe { UserBuf::new(v.addr as usize, v.count * size) };
        elems += v.count;
    }
    Ok((out, elems))
}

/// # Safety
/// `msg` is a valid fi_msg_atomic.
unsafe fn atomic_msg(msg: *const fi::fi_msg_atomic) -> Result<(UserIov, usize, &'static fi::fi_msg_atomic, u64, u64)> {
    non_null!(msg);
    // SAFETY: checked non-null; the reference does not outlive the call in practice.
    let m: &'static fi::fi_msg_atomic = unsafe { &*msg };
    if m.rma_iov_count != 1 || m.rma_iov.is_null() {
        return Err(Error::Inval("rdmx takes exactly one rma_iov"));
    }
    // SAFETY: the message's arrays.
    let (iov, n) = unsafe { ioc_iov(m.msg_iov, m.iov_count, m.datatype)? };
    // SAFETY: checked non-null.
    let r = unsafe { &*m.rma_iov };
    Ok((iov, n, m, r.addr, r.key))
}

entry! {
    fn atomic_write(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, count: usize, desc: Desc, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = desc;
        // SAFETY: the application's operand buffer, valid for the call (copied).
        let operand = unsafe { single(buf, count * dt_size(datatype)?) }?;
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: None, peer: dest, addr, key, datatype, op, count, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_writev(ep: *mut fi::fid_ep => &Ep, iov: *const fi::fi_ioc, desc: DescV, count: usize, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = desc;
        // SAFETY: the application's ioc array.
        let (operand, n) = unsafe { ioc_iov(iov, count, datatype) }?;
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: None, peer: dest, addr, key, datatype, op, count: n, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_writemsg(ep: *mut fi::fid_ep => &Ep, msg: *const fi::fi_msg_atomic, flags: u64) -> isize {
        // SAFETY: the application's message.
        let (operand, n, m, addr, key) = unsafe { atomic_msg(msg) }?;
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: None, peer: m.addr, addr, key, datatype: m.datatype, op: m.op, count: n, context: m.context, flags: Some(flags), inject: false })
    }
}

entry! {
    fn atomic_inject(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, count: usize, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op) -> isize {
        // SAFETY: the application's operand buffer, valid for the call (copied).
        let operand = unsafe { single(buf, count * dt_size(datatype)?) }?;
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: None, peer: dest, addr, key, datatype, op, count, context: std::ptr::null_mut(), flags: Some(0), inject: true })
    }
}

entry! {
    fn atomic_readwrite(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, count: usize, desc: Desc, result: *mut libc::c_void, result_desc: Desc, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = (desc, result_desc);
        let size = count * dt_size(datatype)?;
        // SAFETY: the application's operand buffer, valid for the call (copied).
        let operand = if op == fi::FI_ATOMIC_READ { UserIov::default() } else { unsafe { single(buf, size) }? };
        non_null!(result);
        // SAFETY: the application's result buffer of `size` bytes, valid until the
        // atomic completes (libfabric's contract).
        let result_iov = unsafe { one(result as usize, size) };
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: Some(result_iov), peer: dest, addr, key, datatype, op, count, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_readwritev(ep: *mut fi::fid_ep => &Ep, iov: *const fi::fi_ioc, desc: DescV, count: usize, resultv: *mut fi::fi_ioc, result_desc: DescV, result_count: usize, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = (desc, result_desc);
        // SAFETY: the application's ioc arrays.
        let (operand, n) = unsafe { ioc_iov(iov, count, datatype) }?;
        // SAFETY: as above.
        let (result, rn) = unsafe { ioc_iov(resultv, result_count, datatype) }?;
        let n = if op == fi::FI_ATOMIC_READ { rn } else { n };
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: Some(result), peer: dest, addr, key, datatype, op, count: n, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_readwritemsg(ep: *mut fi::fid_ep => &Ep, msg: *const fi::fi_msg_atomic, resultv: *mut fi::fi_ioc, result_desc: DescV, result_count: usize, flags: u64) -> isize {
        let _ = result_desc;
        // SAFETY: the application's message and result array.
        let (operand, n, m, addr, key) = unsafe { atomic_msg(msg) }?;
        // SAFETY: as above.
        let (result, rn) = unsafe { ioc_iov(resultv, result_count, m.datatype) }?;
        let n = if m.op == fi::FI_ATOMIC_READ { rn } else { n };
        do_atomic(ep, AtomicCall { operand, compare: UserIov::default(), result: Some(result), peer: m.addr, addr, key, datatype: m.datatype, op: m.op, count: n, context: m.context, flags: Some(flags), inject: false })
    }
}

entry! {
    fn atomic_compwrite(ep: *mut fi::fid_ep => &Ep, buf: *const libc::c_void, count: usize, desc: Desc, compare: *const libc::c_void, compare_desc: Desc, result: *mut libc::c_void, result_desc: Desc, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = (desc, compare_desc, result_desc);
        let size = count * dt_size(datatype)?;
        non_null!(result);
        // SAFETY: the application's result buffer of `size` bytes, valid until the
        // atomic completes (libfabric's contract).
        let result_iov = unsafe { one(result as usize, size) };
        // SAFETY: the operand and compare buffers, valid for the call (copied).
        let (operand, compare_iov) = unsafe { (single(buf, size)?, single(compare, size)?) };
        do_atomic(ep, AtomicCall { operand, compare: compare_iov, result: Some(result_iov), peer: dest, addr, key, datatype, op, count, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_compwritev(ep: *mut fi::fid_ep => &Ep, iov: *const fi::fi_ioc, desc: DescV, count: usize, comparev: *const fi::fi_ioc, compare_desc: DescV, compare_count: usize, resultv: *mut fi::fi_ioc, result_desc: DescV, result_count: usize, dest: u64, addr: u64, key: u64, datatype: fi::fi_datatype, op: fi::fi_op, context: Ctx) -> isize {
        let _ = (desc, compare_desc, result_desc);
        // SAFETY: the application's ioc arrays.
        let ((operand, n), (compare, _), (result, _)) = unsafe {
            (ioc_iov(iov, count, datatype)?, ioc_iov(comparev, compare_count, datatype)?, ioc_iov(resultv, result_count, datatype)?)
        };
        do_atomic(ep, AtomicCall { operand, compare, result: Some(result), peer: dest, addr, key, datatype, op, count: n, context, flags: None, inject: false })
    }
}

entry! {
    fn atomic_compwritemsg(ep: *mut fi::fid_ep => &Ep, msg: *const fi::fi_msg_atomic, comparev: *const fi::fi_ioc, compare_desc: DescV, compare_count: usize, resultv: *mut fi::fi_ioc, result_desc: DescV, result_count: usize, flags: u64) -> isize {
        let _ = (compare_desc, result_desc);
        // SAFETY: the application's message and arrays.
        let (operand, n, m, addr, key) = unsafe { atomic_msg(msg) }?;
        // SAFETY: as above.
        let ((compare, _), (result, _)) = unsafe { (ioc_iov(comparev, compare_count, m.datatype)?, ioc_iov(resultv, result_count, m.datatype)?) };
        do_atomic(ep, AtomicCall { operand, compare, result: Some(result), peer: m.addr, addr, key, datatype: m.datatype, op: m.op, count: n, context: m.context, flags: Some(flags), inject: false })
    }
}

fn valid_count(_ep: &Ep, datatype: fi::fi_datatype, op: fi::fi_op, count: *mut usize, flags: u64) -> Result<i32> {
    let (n, _) = crate::domain::atomic_count(datatype, op, flags)?;
    if !count.is_null() {
        // SAFETY: checked non-null.
        unsafe { *count = n };
    }
    Ok(0)
}

entry! {
    fn atomic_writevalid(ep: *mut fi::fid_ep => &Ep, datatype: fi::fi_datatype, op: fi::fi_op, count: *mut usize) -> i32 {
        valid_count(ep, datatype, op, count, 0)
    }
}

entry! {
    fn atomic_readwritevalid(ep: *mut fi::fid_ep => &Ep, datatype: fi::fi_datatype, op: fi::fi_op, count: *mut usize) -> i32 {
        valid_count(ep, datatype, op, count, fi::FI_FETCH_ATOMIC)
    }
}

entry! {
    fn atomic_compwritevalid(ep: *mut fi::fid_ep => &Ep, datatype: fi::fi_datatype, op: fi::fi_op, count: *mut usize) -> i32 {
        valid_count(ep, datatype, op, count, fi::FI_COMPARE_ATOMIC)
    }
}
