//! Completion queues. Endpoints push [`Completion`](crate::cq_queue::Completion)s; `fi_cq_read*` drives the
//! progress of every endpoint bound to the CQ (manual progress) and then copies
//! entries out in the CQ's format. The queue grows as needed: with
//! `FI_RM_ENABLED` a completion is never dropped.
use crate::cq_queue::CqShared;
use crate::domain::{self, Domain};
use crate::entry::{entry, non_null, Out};
use crate::error::{Error, Result};
use crate::fid::{self, FidObject, Refs};
use crate::progress;
use crate::wait_fd::WaitFd;
use libfabric_sys as fi;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[repr(C)]
pub struct Cq {
    pub fid: fi::fid_cq,
    domain: *const Domain,
    pub bound: Refs,
    pub shared: Arc<CqShared>,
    /// The wait set this CQ belongs to (`FI_WAIT_SET`), released at close.
    wait_set: Option<Arc<crate::wait::WaitSetShared>>,
    /// What `fi_control(FI_GETWAITOBJ)` answers ([`wait_obj_of`]); `None`: no
    /// wait object (`FI_WAIT_NONE`).
    wait_obj: Option<fi::fi_wait_obj>,
}

/// The wait object a CQ opened with `wait_obj` has, as `FI_GETWAITOBJ`
/// names it (fi_cq(3), documented from 2.4): `FI_WAIT_FD` where
/// `FI_GETWAIT` hands out an fd (`FI_WAIT_FD`, and a wait set's member,
/// whose own fd the set watches); `FI_WAIT_YIELD` for `FI_WAIT_YIELD` and
/// `FI_WAIT_UNSPEC`, which rdmx serves alike, inside `fi_cq_sread`, with
/// nothing for the application to wait on itself; none for `FI_WAIT_NONE`.
fn wait_obj_of(wait_obj: fi::fi_wait_obj) -> Option<fi::fi_wait_obj> {
    match wait_obj {
        fi::FI_WAIT_FD | fi::FI_WAIT_SET => Some(fi::FI_WAIT_FD),
        fi::FI_WAIT_YIELD | fi::FI_WAIT_UNSPEC => Some(fi::FI_WAIT_YIELD),
        _ => None,
    }
}

// SAFETY: #[repr(C)] with fid_cq first.
unsafe impl FidObject for Cq {
    const CLASS: u32 = fi::FI_CLASS_CQ;
}

static CQ_FI_OPS: fi::fi_ops = fid::fi_ops(cq_close, None, Some(cq_control));
static CQ_OPS: fi::fi_ops_cq = fi::fi_ops_cq {
    size: std::mem::size_of::<fi::fi_ops_cq>(),
    read: Some(cq_read),
    readfrom: Some(cq_readfrom),
    readerr: Some(cq_readerr),
    sread: Some(cq_sread),
    sreadfrom: Some(cq_sreadfrom),
    signal: Some(cq_signal),
    strerror: Some(cq_strerror),
};

entry! {
    fn rdmx_cq_open(domain: *mut fi::fid_domain, attr: *mut fi::fi_cq_attr, out: *mut *mut fi::fid_cq => Out<*mut fi::fid_cq>, context: *mut libc::c_void) -> i32 {
        non_null!(attr);
        // SAFETY: our domain.
        let d = unsafe { domain::domain_ref(domain) }?;
        // SAFETY: checked non-null.
        let attr = unsafe { &mut *attr };
        if attr.flags & !(fi::FI_AFFINITY as u64) != 0 {
            return Err(Error::BadFlags);
        }
        let format = match attr.format {
            fi::FI_CQ_FORMAT_UNSPEC => fi::FI_CQ_FORMAT_CONTEXT,
            f @ (fi::FI_CQ_FORMAT_CONTEXT | fi::FI_CQ_FORMAT_MSG | fi::FI_CQ_FORMAT_DATA | fi::FI_CQ_FORMAT_TAGGED) => f,
            _ => return Err(Error::Inval("cq format")),
        };
        match attr.wait_obj {
            fi::FI_WAIT_NONE | fi::FI_WAIT_UNSPEC | fi::FI_WAIT_YIELD | fi::FI_WAIT_FD | fi::FI_WAIT_SET => {}
            _ => return Err(Error::NoSys),
        }
        // SAFETY: the application's wait set (checked by class) when it names one.
        let wait_set = if attr.wait_obj == fi::FI_WAIT_SET { Some(unsafe { crate::wait::set_of(attr.wait_set) }?) } else { None };
        // A member of a wait set has the fd FI_WAIT_FD would give it; the set
        // watches that fd.
        let wait = if attr.wait_obj == fi::FI_WAIT_FD || wait_set.is_some() { Some(WaitFd::new()?) } else { None };
        if attr.wait_cond != fi::FI_CQ_COND_NONE && attr.wait_cond != fi::FI_CQ_COND_THRESHOLD {
            return Err(Error::Inval("wait_cond"));
        }
        let shared = Arc::new(CqShared::new(wait, format, attr.size.clamp(16, 1 << 16)));
        if let Some(s) = &wait_set {
            s.join_cq(&shared);
        }
        d.children.get();
        let cq = fid::leak(Cq {
            fid: fi::fid_cq { fid: fid::new_fid(fi::FI_CLASS_CQ, context, &CQ_FI_OPS), ops: &CQ_OPS as *const _ as *mut _ },
            domain: d,
            bound: Refs::default(),
            shared,
            wait_set,
            wait_obj: wait_obj_of(attr.wait_obj),
        });
        out.set(cq as *mut fi::fid_cq);
        Ok(0)
    }
}

entry! {
    fn cq_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let cq = unsafe { Cq::from_fid(f) }?;
        cq.bound.busy()?;
        if let Some(s) = &cq.wait_set {
            s.refs.put();
        }
        // SAFETY: the domain outlives its children.
        unsafe { (*cq.domain).children.put() };
        // SAFETY: created by fid::leak in rdmx_cq_open.
        unsafe { fid::retire(cq as *const Cq) };
        Ok(0)
    }
}

entry! {
    fn cq_control(f: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let cq = unsafe { Cq::from_fid(f) }?;
        match (command as u32, &cq.shared.wait) {
            (fi::FI_GETWAIT, Some(w)) => {
                non_null!(arg);
                // SAFETY: for FI_WAIT_FD, FI_GETWAIT's argument is an int *.
                unsafe { *(arg as *mut libc::c_int) = w.fd() };
                Ok(0)
            }
            (fi::FI_GETWAIT, None) => Err(Error::NoData),
            (fi::FI_GETWAITOBJ, _) => {
                let obj = cq.wait_obj.ok_or(Error::NoData)?;
                non_null!(arg);
                // SAFETY: FI_GETWAITOBJ's argument is an enum fi_wait_obj *.
                unsafe { *(arg as *mut fi::fi_wait_obj) = obj };
                Ok(0)
            }
            _ => Err(Error::NoSys),
        }
    }
}

/// # Safety
/// `cq` is null or a CQ fid from rdmx.
pub unsafe fn cq_ref<'a>(cq: *mut fi::fid_cq) -> Result<&'a Cq> {
    // SAFETY: per contract.
    unsafe { Cq::from_fid(cq as *const fi::fid) }
}

#[inline(always)]
fn read_with_progress(cq: &Cq, buf: *mut libc::c_void, count: usize, src: *mut u64) -> Result<isize> {
    cq.shared.progress();
    if count == 0 {
        return Err(Error::Again);
    }
    non_null!(buf);
    let read = cq.shared.read(buf, count, src);
    match read {
        Err(Error::Again) => cq.shared.empty_reads.empty(),
        _ => cq.shared.empty_reads.found(),
    }
    read
}

entry! {
    fn cq_read(cq: *mut fi::fid_cq => &Cq, buf: *mut libc::c_void, count: usize) -> isize {
        read_with_progress(cq, buf, count, std::ptr::null_mut())
    }
}

entry! {
    fn cq_readfrom(cq: *mut fi::fid_cq => &Cq, buf: *mut libc::c_void, count: usize, src: *mut fi::fi_addr_t) -> isize {
        read_with_progress(cq, buf, count, src)
    }
}

fn sread_impl(cq: &Cq, buf: *mut libc::c_void, count: usize, src: *mut u64, timeout: i32) -> Result<isize> {
    let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
    loop {
        match read_with_progress(cq, buf, count, src) {
            Err(Error::Again) => {}
            other => return other,
        }
        if cq.shared.signaled.swap(false, Ordering::AcqRel) {
            return Err(Error::Again);
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Err(Error::Again);
        }
        let eps = cq.shared.endpoints();
        let wait = deadline.map(|d| d - now).unwrap_or(Duration::from_millis(100)).min(Duration::from_millis(100));
        progress::wait_any(&eps, wait);
    }
}

entry! {
    fn cq_sread(cq: *mut fi::fid_cq, buf: *mut libc::c_void, count: usize, cond: *const libc::c_void, timeout: i32) -> isize {
        let _ = cond;
        // SAFETY: our fid.
        let cq = unsafe { cq_ref(cq) }?;
        sread_impl(cq, buf, count, std::ptr::null_mut(), timeout)
    }
}

entry! {
    fn cq_sreadfrom(cq: *mut fi::fid_cq, buf: *mut libc::c_void, count: usize, src: *mut fi::fi_addr_t, cond: *const libc::c_void, timeout: i32) -> isize {
        let _ = cond;
        // SAFETY: our fid.
        let cq = unsafe { cq_ref(cq) }?;
        sread_impl(cq, buf, count, src, timeout)
    }
}

entry! {
    fn cq_readerr(cq: *mut fi::fid_cq, buf: *mut fi::fi_cq_err_entry, flags: u64) -> isize {
        let _ = flags;
        non_null!(buf);
        // SAFETY: our fid.
        let cq = unsafe { cq_ref(cq) }?;
        // SAFETY: the domain outlives its CQs (its close refuses while they are open).
        let version = unsafe { (*cq.domain).api_version() };
        let mut q = cq.shared.queue.lock();
        let i = q.iter().position(|c| c.err.is_some()).ok_or(Error::Again)?;
        let c = q.remove(i).ok_or(Error::Again)?;
        let e = c.err.ok_or(Error::Again)?;
        // The application's entry is as long as its API version says: 80
        // bytes before 1.20, 88 with `src_addr` from then on. 2.x bindings
        // describe the longer one, so no reference to the whole struct is
        // made; each field goes through its own raw pointer.
        // SAFETY: checked non-null; the application's entry, every field
        // written here a 1.17 one, src_addr only under 1.20+.
        unsafe {
            use std::ptr::{addr_of, addr_of_mut};
            // The application's own err_data buffer, if it gives one.
            let (given, given_size) = (addr_of!((*buf).err_data).read(), addr_of!((*buf).err_data_size).read());
            let (err_data, err_data_size) = match e.src_addr {
                Some(a) if given_size == 0 || given.is_null() => {
                    // Provider-owned buffer, valid until the next readerr.
                    let mut keep = cq.shared.err_data.lock();
                    *keep = a;
                    (keep.as_mut_ptr() as *mut libc::c_void, a.len())
                }
                Some(a) => {
                    let n = given_size.min(a.len());
                    std::ptr::copy_nonoverlapping(a.as_ptr(), given as *mut u8, n);
                    (given, n)
                }
                None => (given, 0),
            };
            addr_of_mut!((*buf).err_data).write(err_data);
            addr_of_mut!((*buf).err_data_size).write(err_data_size);
            *cq.shared.last_err_data.lock() = if e.src_addr.is_some() { (err_data as usize, err_data_size) } else { (0, 0) };
            addr_of_mut!((*buf).op_context).write(c.op_context as *mut _);
            addr_of_mut!((*buf).flags).write(c.flags);
            addr_of_mut!((*buf).len).write(c.len);
            addr_of_mut!((*buf).buf).write(c.buf as *mut _);
            addr_of_mut!((*buf).data).write(c.data);
            addr_of_mut!((*buf).tag).write(c.tag);
            addr_of_mut!((*buf).olen).write(e.olen);
            addr_of_mut!((*buf).err).write(e.err);
            addr_of_mut!((*buf).prov_errno).write(e.prov_errno);
            // fi_cq(3): without FI_AV_AUTH_KEY (never offered), src_addr is
            // FI_ADDR_NOTAVAIL.
            crate::info::appended::set_cq_err_src_addr(buf, version, crate::av_table::FI_ADDR_NOTAVAIL);
        }
        Ok(1)
    }
}

entry! {
    fn cq_signal(cq: *mut fi::fid_cq => &Cq) -> i32 {
        cq.shared.signaled.store(true, Ordering::Release);
        Ok(0)
    }
}

/// `fi_trywait` for one CQ: drives progress once, then says whether sleeping on
/// its fd is safe (nothing queued).
pub fn trywait(cq: &Cq) -> Result<()> {
    cq.shared.progress();
    if !cq.shared.eps.try_wait() {
        return Err(Error::Again);
    }
    if cq.shared.is_empty() {
        if let Some(w) = &cq.shared.wait {
            w.set(false);
        }
        Ok(())
    } else {
        Err(Error::Again)
    }
}

entry! {
    fn cq_strerror(cq: *mut fi::fid_cq => &Cq, prov_errno: i32, err_data: *const libc::c_void, buf: *mut libc::c_char, len: usize) -> *const libc::c_char {
        let (ptr, size) = *cq.shared.last_err_data.lock();
        // Only the err_data this CQ handed out (whole) is read back: any other
        // pointer may be shorter than an address.
        let peer = (!err_data.is_null() && err_data as usize == ptr && size >= crate::addr::ADDR_LEN)
            .then(|| {
                // SAFETY: `ptr` is the err_data of the last readerr, `size` bytes
                // long, which libfabric keeps valid until the next read.
                let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, crate::addr::ADDR_LEN) };
                crate::addr::RdmxAddr::decode(bytes)
            })
            .flatten();
        // SAFETY: the application's buffer of `len` bytes, or null (fi_cq_strerror's contract).
        let Some(peer) = peer else { return Ok(unsafe { crate::error::strerror_into(prov_errno, buf, len) }) };
        let base = match crate::error::ErrReason::from_prov_errno(prov_errno) {
            Some(r) => r.text().to_string_lossy().into_owned(),
            // SAFETY: fi_strerror returns a static string for any value.
            None => unsafe { std::ffi::CStr::from_ptr(fi::fi_strerror(prov_errno.abs())) }.to_string_lossy().into_owned(),
        };
        let text = std::ffi::CString::new(format!("{base} (peer {})", peer.to_uri())).unwrap_or_default();
        if !buf.is_null() && len > 0 {
            let src = text.as_bytes();
            let n = src.len().min(len - 1);
            // SAFETY: `buf` holds `len` bytes; we write at most len - 1 plus NUL.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
            return Ok(buf as *const libc::c_char);
        }
        let mut keep = cq.shared.strerror_text.lock();
        *keep = text;
        Ok(keep.as_ptr())
    }
}
