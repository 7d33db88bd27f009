//! Endpoints (`FI_EP_RDM`, and `FI_EP_DGRAM` through the same objects and
//! tables: the profile's type selects the message engine's datagram mode in
//! [`crate::core`]): the object, binding, enabling, addressing, options, and
//! the translation of the application's buffers and descriptors that every
//! operation family shares. The operation tables live by family:
//! [`crate::ep_msg`] (message and tagged), [`crate::ep_rma`] (RMA and atomics).
use crate::addr::ADDR_LEN;
use crate::args::{UserBuf, UserIov};
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

pub(crate) type Ctx = *mut libc::c_void;
pub(crate) type Desc = *mut libc::c_void;
pub(crate) type DescV = *mut *mut libc::c_void;

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
        // The endpoint lives in its domain's device family, and takes its
        // jobs the way its domain does: from the AV's keys under
        // FI_AV_AUTH_KEY, where its own auth_key must be NULL (fi_endpoint(3)).
        profile.device = d.profile.device;
        profile.av_auth_key = d.profile.av_auth_key;
        if profile.av_auth_key && profile.auth_key.is_some() {
            return Err(Error::Inval("an endpoint of an FI_AV_AUTH_KEY domain takes its keys from its AV: auth_key must be NULL"));
        }
        let virt = d.profile.mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0 || d.profile.mr_mode == fi::FI_MR_BASIC as i32;
        let shared = EpShared::new(profile, &*d.devices, d.mr_keys.clone(), d.mr_cache.clone(), virt)?;
        d.children.get();
        let ep = fid::leak(Ep {
            fid: fi::fid_ep {
                fid: fid::new_fid(fi::FI_CLASS_EP, context, &EP_FI_OPS),
                ops: &EP_OPS as *const _ as *mut _,
                cm: &CM_OPS as *const _ as *mut _,
                msg: &crate::ep_msg::MSG_OPS as *const _ as *mut _,
                rma: &crate::ep_rma::RMA_OPS as *const _ as *mut _,
                tagged: &crate::ep_msg::TAGGED_OPS as *const _ as *mut _,
                atomic: &crate::ep_rma::ATOMIC_OPS as *const _ as *mut _,
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
            // The AV keys it served may be removed once no endpoint does.
            if let (Some(r), Some(av)) = (&st.running, &st.av) {
                let mut t = av.write();
                for &k in &r.job_keys {
                    t.use_key(k, false);
                }
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
                // SAFETY: class checked; av_ref checks it is an rdmx AV.
                let av = unsafe { crate::av::av_ref(bfid as *mut fi::fid_av) }?;
                if bound.av.is_some() {
                    return Err(Error::Inval("an AV is already bound"));
                }
                if av.keyed() != st.profile.av_auth_key {
                    return Err(Error::Inval("an AV of FI_AV_AUTH_KEY binds only to an endpoint of such a domain, and only it"));
                }
                av.bound.get();
                bound.av = Some(av);
                st.av_generation = Some(av.table.read().generation_handle());
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

// ---- the application's arguments, shared by every operation family ----

/// # Safety
/// `iov` is null or valid for `count` entries.
pub(crate) unsafe fn user_iov(iov: *const fi::iovec, count: usize) -> Result<UserIov> {
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
pub(crate) unsafe fn single(buf: *const libc::c_void, len: usize) -> Result<UserIov> {
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
pub(crate) unsafe fn descs(desc: DescV, count: usize) -> [usize; info::IOV_LIMIT] {
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

pub(crate) fn one_desc(desc: Desc) -> [usize; info::IOV_LIMIT] {
    let mut out = [0usize; info::IOV_LIMIT];
    out[0] = desc as usize;
    out
}
