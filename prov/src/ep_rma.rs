//! The RMA and atomic operation tables of an endpoint (`fi_read`,
//! `fi_write`, `fi_atomic`, `fi_fetch_atomic`, `fi_compare_atomic`, ...),
//! emulated over messages ([`crate::rma`]): each validates the application's
//! arguments and hands one typed request to the endpoint's runtime.
use crate::args::{UserBuf, UserIov};
use crate::entry::{entry, non_null};
use crate::ep::{single, user_iov, Ctx, Desc, DescV, Ep};
use crate::error::{Error, Result};
use crate::info;
use crate::rma::{one, RmaArgs};
use libfabric_sys as fi;

pub(crate) static RMA_OPS: fi::fi_ops_rma = fi::fi_ops_rma {
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

pub(crate) static ATOMIC_OPS: fi::fi_ops_atomic = fi::fi_ops_atomic {
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
fn do_rma(
    ep: &Ep,
    write: bool,
    iov: UserIov,
    peer: u64,
    addr: u64,
    key: u64,
    data: Option<u64>,
    context: Ctx,
    flags: Option<u64>,
    inject: bool,
) -> Result<isize> {
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
