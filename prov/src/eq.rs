//! Event queues. rdmx's RDM endpoints never need connection events, but
//! applications (fabtests, MPICH) open an EQ anyway and `fi_eq_write`/`read`/
//! `sread`/`readerr` must behave.
use crate::entry::{entry, non_null, Out};
use crate::eq_queue::{EqQueue, Event};
use crate::error::{Error, Result};
use crate::fabric;
use crate::fid::{self, FidObject, Refs};
use libfabric_sys as fi;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[repr(C)]
pub struct Eq {
    pub fid: fi::fid_eq,
    fabric: *const fabric::Fabric,
    pub bound: Refs,
    pub shared: Arc<EqQueue>,
    /// The wait set this EQ belongs to (`FI_WAIT_SET`), released at close.
    wait_set: Option<Arc<crate::wait::WaitSetShared>>,
}

// SAFETY: #[repr(C)] with fid_eq first.
unsafe impl FidObject for Eq {
    const CLASS: u32 = fi::FI_CLASS_EQ;
}

static EQ_FI_OPS: fi::fi_ops = fid::fi_ops(eq_close, None, Some(eq_control));
static EQ_OPS: fi::fi_ops_eq = fi::fi_ops_eq {
    size: std::mem::size_of::<fi::fi_ops_eq>(),
    read: Some(eq_read),
    readerr: Some(eq_readerr),
    write: Some(eq_write),
    sread: Some(eq_sread),
    strerror: Some(eq_strerror),
};

entry! {
    fn rdmx_eq_open(fabric: *mut fi::fid_fabric, attr: *mut fi::fi_eq_attr, out: *mut *mut fi::fid_eq => Out<*mut fi::fid_eq>, context: *mut libc::c_void) -> i32 {
        non_null!(attr);
        // SAFETY: libfabric passes our fabric.
        let fab = unsafe { fabric::fabric_ref(fabric) }?;
        // SAFETY: checked non-null.
        let attr = unsafe { &*attr };
        let wait_set = if attr.wait_obj == fi::FI_WAIT_SET {
            // SAFETY: the application's wait set (checked by class).
            Some(unsafe { crate::wait::set_of(attr.wait_set) }?)
        } else {
            None
        };
        let wait_fd = match attr.wait_obj {
            fi::FI_WAIT_NONE | fi::FI_WAIT_UNSPEC | fi::FI_WAIT_YIELD => None,
            // A member of a wait set has the eventfd FI_WAIT_FD would give it.
            fi::FI_WAIT_FD | fi::FI_WAIT_SET => {
                // SAFETY: eventfd has no memory preconditions; a valid fd is owned below.
                let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                if fd < 0 {
                    return Err(Error::Other(format!("eventfd: {}", std::io::Error::last_os_error())));
                }
                // SAFETY: a fresh fd nobody else owns.
                Some(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
            }
            _ => return Err(Error::NoSys),
        };
        // FI_WRITE: the application inserts its own events (always possible here).
        if attr.flags & !(fi::FI_WRITE as u64) != 0 {
            return Err(Error::BadFlags);
        }
        let shared = Arc::new(EqQueue { wait_fd, ..EqQueue::default() });
        if let Some(s) = &wait_set {
            s.join_eq(&shared);
        }
        fab.children.get();
        let eq = fid::leak(Eq {
            fid: fi::fid_eq { fid: fid::new_fid(fi::FI_CLASS_EQ, context, &EQ_FI_OPS), ops: &EQ_OPS as *const _ as *mut _ },
            fabric: fab,
            bound: Refs::default(),
            shared,
            wait_set,
        });
        out.set(eq as *mut fi::fid_eq);
        Ok(0)
    }
}

entry! {
    fn eq_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let eq = unsafe { Eq::from_fid(f) }?;
        eq.bound.busy()?;
        if let Some(s) = &eq.wait_set {
            s.refs.put();
        }
        // SAFETY: the fabric outlives its children (its close checks the count).
        unsafe { (*eq.fabric).children.put() };
        // SAFETY: created by fid::leak in rdmx_eq_open.
        unsafe { fid::retire(eq as *const Eq) };
        Ok(0)
    }
}

entry! {
    fn eq_control(f: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let eq = unsafe { Eq::from_fid(f) }?;
        match (command as u32, &eq.shared.wait_fd) {
            (fi::FI_GETWAIT, Some(fd)) => {
                non_null!(arg);
                use std::os::fd::AsRawFd;
                // SAFETY: for FI_WAIT_FD, FI_GETWAIT's argument is an int *.
                unsafe { *(arg as *mut libc::c_int) = fd.as_raw_fd() };
                Ok(0)
            }
            (fi::FI_GETWAIT, None) => Err(Error::NoSys),
            _ => Err(Error::NoSys),
        }
    }
}

/// # Safety
/// `eq` is an EQ fid from rdmx.
unsafe fn eq_ref<'a>(eq: *mut fi::fid_eq) -> Result<&'a Eq> {
    // SAFETY: per contract.
    unsafe { Eq::from_fid(eq as *const fi::fid) }
}

/// `fi_trywait` for one EQ: nothing to progress (its events come from
/// `fi_eq_write` and from endpoint progress, which queues them at once), so
/// sleeping on its eventfd is safe exactly while nothing is queued.
pub fn trywait(eq: &Eq) -> Result<()> {
    if eq.shared.is_empty() {
        Ok(())
    } else {
        Err(Error::Again)
    }
}

fn pop(eq: &Eq, event: *mut u32, buf: *mut libc::c_void, len: usize, flags: u64) -> Result<isize> {
    let mut q = eq.shared.queue.lock();
    match q.front() {
        None => Err(Error::Again),
        Some(e) if e.err.is_some() => Ok(-(fi::FI_EAVAIL as isize)),
        Some(e) => {
            if e.data.len() > len {
                return Err(Error::TooSmall);
            }
            let n = e.data.len();
            if !event.is_null() {
                // SAFETY: non-null out-pointer from the application.
                unsafe { *event = e.kind };
            }
            if n > 0 {
                non_null!(buf);
                // SAFETY: the application's buffer holds `len >= n` bytes.
                unsafe { std::ptr::copy_nonoverlapping(e.data.as_ptr(), buf as *mut u8, n) };
            }
            if flags & fi::FI_PEEK as u64 == 0 {
                q.pop_front();
                if q.is_empty() {
                    eq.shared.signal(false);
                }
            }
            Ok(n as isize)
        }
    }
}

entry! {
    fn eq_read(eq: *mut fi::fid_eq => &Eq, event: *mut u32, buf: *mut libc::c_void, len: usize, flags: u64) -> isize {
        pop(eq, event, buf, len, flags)
    }
}

entry! {
    fn eq_sread(eq: *mut fi::fid_eq => &Eq, event: *mut u32, buf: *mut libc::c_void, len: usize, timeout: i32, flags: u64) -> isize {
        let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            match pop(eq, event, buf, len, flags) {
                Err(Error::Again) => {}
                other => return other,
            }
            let mut q = eq.shared.queue.lock();
            if !q.is_empty() {
                continue;
            }
            match deadline {
                Some(d) => {
                    if eq.shared.cond.wait_until(&mut q, d).timed_out() && q.is_empty() {
                        return Err(Error::Again);
                    }
                }
                None => eq.shared.cond.wait(&mut q),
            }
        }
    }
}

entry! {
    fn eq_readerr(eq: *mut fi::fid_eq, buf: *mut fi::fi_eq_err_entry, flags: u64) -> isize {
        non_null!(buf);
        // SAFETY: our fid.
        let eq = unsafe { eq_ref(eq) }?;
        let mut q = eq.shared.queue.lock();
        match q.front() {
            Some(e) if e.err.is_some() => {
                let err = e.err.unwrap_or_default();
                // SAFETY: checked non-null; the application's entry.
                unsafe { *buf = err };
                if flags & fi::FI_PEEK as u64 == 0 {
                    q.pop_front();
                    if q.is_empty() {
                        eq.shared.signal(false);
                    }
                }
                Ok(1)
            }
            _ => Err(Error::Again),
        }
    }
}

entry! {
    fn eq_write(eq: *mut fi::fid_eq => &Eq, event: u32, buf: *const libc::c_void, len: usize, flags: u64) -> isize {
        let data = if len == 0 {
            Vec::new()
        } else {
            non_null!(buf);
            // SAFETY: the application's buffer of `len` bytes.
            unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec()
        };
        // libfabric 1.17 has no flag to write error events; they come only from
        // the provider (none today).
        let _ = flags;
        let err = None;
        eq.shared.push(Event { kind: event, data, err });
        Ok(len as isize)
    }
}

entry! {
    fn eq_strerror(eq: *mut fi::fid_eq, prov_errno: i32, err_data: *const libc::c_void, buf: *mut libc::c_char, len: usize) -> *const libc::c_char {
        let _ = (eq, err_data);
        // SAFETY: the application's buffer of `len` bytes, or null (fi_eq_strerror's contract).
        Ok(unsafe { crate::error::strerror_into(prov_errno, buf, len) })
    }
}
