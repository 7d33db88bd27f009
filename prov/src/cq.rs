//! Completion queues. Endpoints push [`Completion`]s; `fi_cq_read*` drives the
//! progress of every endpoint bound to the CQ (manual progress) and then copies
//! entries out in the CQ's format. The queue grows as needed: with
//! `FI_RM_ENABLED` a completion is never dropped.
use crate::core::{self, BoundEndpoints, EpShared};
use crate::domain::{self, Domain};
use crate::entry::{entry, non_null, Out};
use crate::error::{Error, Result};
use crate::fid::{self, FidObject, Refs};
use libfabric_sys as fi;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One completion, successful or not. Pointers are the application's opaque
/// values, carried as integers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Completion {
    pub op_context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub src: u64,
    pub err: Option<CompletionError>,
}

#[derive(Clone, Copy, Debug)]
pub struct CompletionError {
    /// Positive `FI_E*`.
    pub err: i32,
    pub olen: usize,
    pub prov_errno: i32,
    /// An rdmx address handed out as `err_data`: the unknown sender
    /// (FI_SOURCE_ERR, with FI_EADDRNOTAVAIL) or the peer whose failure failed
    /// the operation (`fi_cq_strerror` then names it).
    pub src_addr: Option<[u8; crate::addr::ADDR_LEN]>,
}

impl CompletionError {
    pub fn new(err: u32) -> CompletionError {
        CompletionError { err: err as i32, olen: 0, prov_errno: err as i32, src_addr: None }
    }
}

/// The wait object of a CQ or counter opened with `FI_WAIT_FD`: an epoll fd
/// over the bound endpoints' device fds plus an eventfd that is readable while
/// completions are queued / the counter changed unseen (so events found by the
/// background progress thread also wake a sleeper).
pub struct WaitFd {
    epoll: libc::c_int,
    event: libc::c_int,
}

impl WaitFd {
    /// The fd handed out by `fi_control(FI_GETWAIT)`.
    pub fn fd(&self) -> RawFd {
        self.epoll
    }

    /// Whether the eventfd is currently set.
    pub fn is_set(&self) -> bool {
        let mut p = libc::pollfd { fd: self.event, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    pub fn new() -> Result<WaitFd> {
        // SAFETY: plain syscalls; the fds are owned by the returned value.
        let (epoll, event) = unsafe { (libc::epoll_create1(libc::EPOLL_CLOEXEC), libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)) };
        if epoll < 0 || event < 0 {
            // SAFETY: closing only what was opened.
            unsafe {
                if epoll >= 0 {
                    libc::close(epoll);
                }
                if event >= 0 {
                    libc::close(event);
                }
            }
            return Err(Error::Io("cannot create the CQ wait fd".into()));
        }
        let w = WaitFd { epoll, event };
        w.add(event);
        Ok(w)
    }

    /// Watches `fd` for input (a bound endpoint's device).
    pub fn add(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: `ev` is valid for the call; a failure (e.g. already added) is
        // harmless, the fd is then watched already or cannot be.
        unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    pub fn set(&self, ready: bool) {
        if ready {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a valid u64 into our eventfd.
            unsafe { libc::write(self.event, &one as *const u64 as *const libc::c_void, 8) };
        } else {
            let mut v: u64 = 0;
            // SAFETY: reads at most 8 bytes into a valid u64 (non-blocking).
            unsafe { libc::read(self.event, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }
}

impl Drop for WaitFd {
    fn drop(&mut self) {
        // SAFETY: both fds are owned by this value and closed once.
        unsafe {
            libc::close(self.epoll);
            libc::close(self.event);
        }
    }
}

pub struct CqShared {
    pub wait: Option<WaitFd>,
    pub format: fi::fi_cq_format,
    queue: Mutex<VecDeque<Completion>>,
    /// Provider-owned `err_data` for callers that pass `err_data_size == 0`; valid
    /// until the next readerr, as libfabric specifies.
    err_data: Mutex<[u8; crate::addr::ADDR_LEN]>,
    /// The last `err_data` handed out that holds a whole address (pointer,
    /// size): `fi_cq_strerror` reads it back only if it gets this pointer.
    last_err_data: Mutex<(usize, usize)>,
    /// Provider-owned `fi_cq_strerror` text for callers that pass no buffer.
    strerror_text: Mutex<std::ffi::CString>,
    eps: BoundEndpoints,
    signaled: AtomicBool,
}

impl CqShared {
    pub fn push(&self, c: Completion) {
        let mut q = self.queue.lock();
        q.push_back(c);
        if q.len() == 1 {
            if let Some(w) = &self.wait {
                w.set(true);
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// For poll sets: whether entries are queued.
    pub(crate) fn is_empty_now(&self) -> bool {
        self.is_empty()
    }

    /// For poll sets: one round of progress of the bound endpoints.
    pub(crate) fn progress_now(&self) {
        self.progress();
    }

    pub fn attach(&self, ep: &Arc<EpShared>) {
        self.eps.attach(ep);
    }

    pub fn detach(&self, ep: &EpShared) {
        self.eps.detach(ep);
    }

    pub(crate) fn endpoints(&self) -> smallvec::SmallVec<[Arc<EpShared>; 4]> {
        self.eps.endpoints()
    }

    fn progress(&self) {
        self.eps.progress();
    }

    fn entry_size(&self) -> usize {
        match self.format {
            fi::FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<fi::fi_cq_entry>(),
            fi::FI_CQ_FORMAT_MSG => std::mem::size_of::<fi::fi_cq_msg_entry>(),
            fi::FI_CQ_FORMAT_DATA => std::mem::size_of::<fi::fi_cq_data_entry>(),
            _ => std::mem::size_of::<fi::fi_cq_tagged_entry>(),
        }
    }

    /// Copies up to `count` good entries to `buf` (and sources to `src`).
    /// `Ok(0)` means empty; `Err(Avail)` style is returned as -FI_EAVAIL by caller.
    fn read(&self, buf: *mut libc::c_void, count: usize, src: *mut u64) -> Result<isize> {
        let mut q = self.queue.lock();
        let mut n = 0;
        while n < count {
            match q.front() {
                Some(c) if c.err.is_none() => {
                    let c = *c;
                    q.pop_front();
                    // SAFETY: the application's buffer holds `count` entries of the
                    // CQ's format, and `src` (if given) `count` fi_addr_t.
                    unsafe {
                        let slot = (buf as *mut u8).add(n * self.entry_size());
                        write_entry(self.format, slot, &c);
                        if !src.is_null() {
                            *src.add(n) = c.src;
                        }
                    }
                    n += 1;
                }
                _ => break,
            }
        }
        if q.is_empty() {
            if let Some(w) = &self.wait {
                w.set(false);
            }
        }
        if n > 0 {
            return Ok(n as isize);
        }
        match q.front() {
            Some(_) => Ok(-(fi::FI_EAVAIL as isize)),
            None => Err(Error::Again),
        }
    }
}

/// # Safety
/// `slot` is valid for one entry of `format`.
unsafe fn write_entry(format: fi::fi_cq_format, slot: *mut u8, c: &Completion) {
    let ctx = c.op_context as *mut libc::c_void;
    // SAFETY: per contract; entries are written unaligned-safe via write_unaligned.
    unsafe {
        match format {
            fi::FI_CQ_FORMAT_CONTEXT => std::ptr::write_unaligned(slot as *mut fi::fi_cq_entry, fi::fi_cq_entry { op_context: ctx }),
            fi::FI_CQ_FORMAT_MSG => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_msg_entry,
                fi::fi_cq_msg_entry { op_context: ctx, flags: c.flags, len: c.len },
            ),
            fi::FI_CQ_FORMAT_DATA => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_data_entry,
                fi::fi_cq_data_entry { op_context: ctx, flags: c.flags, len: c.len, buf: c.buf as *mut _, data: c.data },
            ),
            _ => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_tagged_entry,
                fi::fi_cq_tagged_entry { op_context: ctx, flags: c.flags, len: c.len, buf: c.buf as *mut _, data: c.data, tag: c.tag },
            ),
        }
    }
}

#[repr(C)]
pub struct Cq {
    pub fid: fi::fid_cq,
    domain: *const Domain,
    pub bound: Refs,
    pub shared: Arc<CqShared>,
    /// The wait set this CQ belongs to (`FI_WAIT_SET`), released at close.
    wait_set: Option<Arc<crate::wait::WaitSetShared>>,
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
        let shared = Arc::new(CqShared {
            wait,
            format,
            queue: Mutex::new(VecDeque::with_capacity(attr.size.clamp(16, 1 << 16))),
            err_data: Mutex::new([0; crate::addr::ADDR_LEN]),
            last_err_data: Mutex::new((0, 0)),
            strerror_text: Mutex::new(std::ffi::CString::default()),
            eps: BoundEndpoints::default(),
            signaled: AtomicBool::new(false),
        });
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
                unsafe { *(arg as *mut libc::c_int) = w.epoll };
                Ok(0)
            }
            (fi::FI_GETWAIT, None) => Err(Error::NoData),
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

fn read_with_progress(cq: &Cq, buf: *mut libc::c_void, count: usize, src: *mut u64) -> Result<isize> {
    cq.shared.progress();
    if count == 0 {
        return Err(Error::Again);
    }
    non_null!(buf);
    cq.shared.read(buf, count, src)
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
        core::wait_any(&eps, wait);
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
        let mut q = cq.shared.queue.lock();
        let i = q.iter().position(|c| c.err.is_some()).ok_or(Error::Again)?;
        let c = q.remove(i).ok_or(Error::Again)?;
        let e = c.err.ok_or(Error::Again)?;
        // SAFETY: checked non-null; the application's entry.
        unsafe {
            let out = &mut *buf;
            match e.src_addr {
                Some(a) if out.err_data_size == 0 || out.err_data.is_null() => {
                    // Provider-owned buffer, valid until the next readerr.
                    let mut keep = cq.shared.err_data.lock();
                    *keep = a;
                    out.err_data = keep.as_mut_ptr() as *mut _;
                    out.err_data_size = a.len();
                }
                Some(a) => {
                    let n = out.err_data_size.min(a.len());
                    std::ptr::copy_nonoverlapping(a.as_ptr(), out.err_data as *mut u8, n);
                    out.err_data_size = n;
                }
                None => out.err_data_size = 0,
            }
            *cq.shared.last_err_data.lock() = if e.src_addr.is_some() { (out.err_data as usize, out.err_data_size) } else { (0, 0) };
            out.op_context = c.op_context as *mut _;
            out.flags = c.flags;
            out.len = c.len;
            out.buf = c.buf as *mut _;
            out.data = c.data;
            out.tag = c.tag;
            out.olen = e.olen;
            out.err = e.err;
            out.prov_errno = e.prov_errno;
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

/// Writes the text for `prov_errno` into `buf` (if given) and returns it.
///
/// # Safety
/// `buf` is null or the caller's buffer of `len` bytes.
pub unsafe fn strerror_into(prov_errno: i32, buf: *mut libc::c_char, len: usize) -> *const libc::c_char {
    // SAFETY: fi_strerror returns a static string for any value.
    let s = unsafe { fi::fi_strerror(prov_errno.abs()) };
    if !buf.is_null() && len > 0 && !s.is_null() {
        // SAFETY: `s` is a valid C string; `buf` holds `len` bytes; we write at most
        // len - 1 bytes plus NUL.
        unsafe {
            let src = std::ffi::CStr::from_ptr(s).to_bytes();
            let n = src.len().min(len - 1);
            std::ptr::copy_nonoverlapping(src.as_ptr(), buf as *mut u8, n);
            *buf.add(n) = 0;
        }
        return buf;
    }
    s
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
        let Some(peer) = peer else { return Ok(unsafe { strerror_into(prov_errno, buf, len) }) };
        // SAFETY: fi_strerror returns a static string for any value.
        let base = unsafe { std::ffi::CStr::from_ptr(fi::fi_strerror(prov_errno.abs())) }.to_string_lossy().into_owned();
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
