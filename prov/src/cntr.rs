//! Counters: success and error counts of operations bound with FI_SEND, FI_RECV,
//! FI_READ, FI_WRITE, FI_REMOTE_READ, FI_REMOTE_WRITE. Reading or waiting drives
//! progress of the bound endpoints.
use crate::cntr_queue::CntrShared;
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
pub struct Cntr {
    pub fid: fi::fid_cntr,
    domain: *const Domain,
    pub bound: Refs,
    pub shared: Arc<CntrShared>,
    /// The wait set this counter belongs to (`FI_WAIT_SET`), released at close.
    wait_set: Option<Arc<crate::wait::WaitSetShared>>,
}

// SAFETY: #[repr(C)] with fid_cntr first.
unsafe impl FidObject for Cntr {
    const CLASS: u32 = fi::FI_CLASS_CNTR;
}

static CNTR_FI_OPS: fi::fi_ops = fid::fi_ops(cntr_close, None, Some(cntr_control));
static CNTR_OPS: fi::fi_ops_cntr = fi::fi_ops_cntr {
    size: std::mem::size_of::<fi::fi_ops_cntr>(),
    read: Some(cntr_read),
    readerr: Some(cntr_readerr),
    add: Some(cntr_add),
    set: Some(cntr_set),
    wait: Some(cntr_wait),
    adderr: Some(cntr_adderr),
    seterr: Some(cntr_seterr),
};

entry! {
    fn rdmx_cntr_open(domain: *mut fi::fid_domain, attr: *mut fi::fi_cntr_attr, out: *mut *mut fi::fid_cntr => Out<*mut fi::fid_cntr>, context: *mut libc::c_void) -> i32 {
        // SAFETY: our domain.
        let d = unsafe { domain::domain_ref(domain) }?;
        // SAFETY: null or the application's attr.
        if let Some(attr) = unsafe { attr.as_ref() } {
            if attr.events != fi::FI_CNTR_EVENTS_COMP {
                return Err(Error::NoSys);
            }
            match attr.wait_obj {
                fi::FI_WAIT_NONE | fi::FI_WAIT_UNSPEC | fi::FI_WAIT_YIELD | fi::FI_WAIT_FD | fi::FI_WAIT_SET => {}
                _ => return Err(Error::NoSys),
            }
            if attr.flags != 0 {
                return Err(Error::BadFlags);
            }
        }
        // SAFETY: null or the application's attr.
        let attr = unsafe { attr.as_ref() };
        let wait_obj = attr.map_or(fi::FI_WAIT_NONE, |a| a.wait_obj);
        let wait_set = match attr {
            // SAFETY: the application's wait set (checked by class).
            Some(a) if a.wait_obj == fi::FI_WAIT_SET => Some(unsafe { crate::wait::set_of(a.wait_set) }?),
            _ => None,
        };
        // A member of a wait set has the fd FI_WAIT_FD would give it.
        let wait = if wait_obj == fi::FI_WAIT_FD || wait_set.is_some() { Some(WaitFd::new()?) } else { None };
        let shared = Arc::new(CntrShared { wait, ..CntrShared::default() });
        if let Some(s) = &wait_set {
            s.join_cntr(&shared);
        }
        d.children.get();
        let c = fid::leak(Cntr {
            fid: fi::fid_cntr { fid: fid::new_fid(fi::FI_CLASS_CNTR, context, &CNTR_FI_OPS), ops: &CNTR_OPS as *const _ as *mut _ },
            domain: d,
            bound: Refs::default(),
            shared,
            wait_set,
        });
        out.set(c as *mut fi::fid_cntr);
        Ok(0)
    }
}

entry! {
    fn cntr_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let c = unsafe { Cntr::from_fid(f) }?;
        c.bound.busy()?;
        if let Some(s) = &c.wait_set {
            s.refs.put();
        }
        // SAFETY: the domain outlives its children.
        unsafe { (*c.domain).children.put() };
        // SAFETY: created by fid::leak in rdmx_cntr_open.
        unsafe { fid::retire(c as *const Cntr) };
        Ok(0)
    }
}

entry! {
    fn cntr_control(f: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let c = unsafe { Cntr::from_fid(f) }?;
        match (command as u32, &c.shared.wait) {
            (fi::FI_GETWAIT, Some(w)) => {
                non_null!(arg);
                // SAFETY: for FI_WAIT_FD, FI_GETWAIT's argument is an int *.
                unsafe { *(arg as *mut libc::c_int) = w.fd() };
                Ok(0)
            }
            (fi::FI_GETWAIT, None) => Err(Error::NoData),
            _ => Err(Error::NoSys),
        }
    }
}

/// `fi_trywait` for one counter: drives progress once; sleeping is safe unless
/// the counter changed since it was last read.
pub fn trywait(c: &Cntr) -> Result<()> {
    c.shared.progress();
    if !c.shared.eps.try_wait() {
        return Err(Error::Again);
    }
    match &c.shared.wait {
        Some(w) if w.is_set() => Err(Error::Again),
        _ => Ok(()),
    }
}

/// # Safety
/// `c` is null or a counter fid from rdmx.
pub unsafe fn cntr_ref<'a>(c: *mut fi::fid_cntr) -> Result<&'a Cntr> {
    // SAFETY: per contract.
    unsafe { Cntr::from_fid(c as *const fi::fid) }
}

entry! {
    fn cntr_read(c: *mut fi::fid_cntr => &Cntr) -> u64 {
        c.shared.progress();
        c.shared.seen();
        Ok(c.shared.value.load(Ordering::Acquire))
    }
}

entry! {
    fn cntr_readerr(c: *mut fi::fid_cntr => &Cntr) -> u64 {
        c.shared.progress();
        c.shared.seen();
        Ok(c.shared.errors.load(Ordering::Acquire))
    }
}

entry! {
    fn cntr_add(c: *mut fi::fid_cntr => &Cntr, value: u64) -> i32 {
        c.shared.add(value);
        Ok(0)
    }
}

entry! {
    fn cntr_set(c: *mut fi::fid_cntr => &Cntr, value: u64) -> i32 {
        c.shared.set(value);
        Ok(0)
    }
}

entry! {
    fn cntr_adderr(c: *mut fi::fid_cntr => &Cntr, value: u64) -> i32 {
        c.shared.add_err(value);
        Ok(0)
    }
}

entry! {
    fn cntr_seterr(c: *mut fi::fid_cntr => &Cntr, value: u64) -> i32 {
        c.shared.set_err(value);
        Ok(0)
    }
}

entry! {
    fn cntr_wait(c: *mut fi::fid_cntr => &Cntr, threshold: u64, timeout: i32) -> i32 {
        let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        let errors_before = c.shared.errors.load(Ordering::Acquire);
        loop {
            c.shared.progress();
            if c.shared.value.load(Ordering::Acquire) >= threshold {
                return Ok(0);
            }
            if c.shared.errors.load(Ordering::Acquire) != errors_before {
                return Ok(-(fi::FI_EAVAIL as i32));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(-(fi::FI_ETIMEDOUT as i32));
            }
            let wait = deadline.map(|d| d - now).unwrap_or(Duration::from_millis(100)).min(Duration::from_millis(100));
            progress::wait_any(&c.shared.endpoints(), wait);
        }
    }
}
