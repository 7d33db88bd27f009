//! Helpers shared by the fid objects: casting libfabric's pointers back to ours,
//! parent/child reference counts, and the `-FI_ENOSYS` slots.
use crate::entry::{entry_unsupported, FromRaw};
use crate::error::{Error, Result};
use libfabric_sys as fi;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Types whose first field is a libfabric `fid` (through `fid_ep`, `fid_cq`, ...).
///
/// # Safety
/// Implementors must be `#[repr(C)]` with the fid-bearing struct as the first
/// field, so a pointer to the object is also a pointer to its `struct fid`.
pub unsafe trait FidObject: Sized {
    const CLASS: u32;

    /// Casts a `struct fid *` libfabric gave us back to the object.
    ///
    /// # Safety
    /// `fid` must be null or point to a live fid that libfabric got from rdmx.
    unsafe fn from_fid<'a>(fid: *const fi::fid) -> Result<&'a Self> {
        // SAFETY: per contract `fid` is null or valid; we check the class before
        // reinterpreting, and `Self` starts with the fid (trait contract).
        unsafe {
            let f = fid.as_ref().ok_or(Error::Inval("NULL fid"))?;
            if f.fclass != Self::CLASS as usize {
                return Err(Error::Inval("fid of the wrong class"));
            }
            Ok(&*(fid as *const Self))
        }
    }

    fn as_fid(&self) -> *mut fi::fid {
        self as *const Self as *mut fi::fid
    }
}

/// `FidObject::from_fid` with the type inferred from the binding (for the
/// `=> &T` receivers of the entry macro).
///
/// # Safety
/// As for [`FidObject::from_fid`].
pub unsafe fn resolve<'a, T: FidObject>(fid: *const fi::fid) -> Result<&'a T> {
    // SAFETY: this function's contract.
    unsafe { T::from_fid(fid) }
}

/// A fid of rdmx's, resolved to its object (class checked).
impl<T: FidObject, P> FromRaw<*mut P> for &T {
    unsafe fn from_raw(p: *mut P) -> Result<Self, Error> {
        // SAFETY: per the trait's contract, a fid rdmx handed out (or NULL);
        // from_fid checks NULL and the class.
        unsafe { resolve(p as *const libfabric_sys::fid) }
    }
}

impl<T: FidObject, P> FromRaw<*const P> for &T {
    unsafe fn from_raw(p: *const P) -> Result<Self, Error> {
        // SAFETY: as above.
        unsafe { resolve(p as *const libfabric_sys::fid) }
    }
}

/// Counts live children / bindings of an object; closing with a non-zero count
/// returns -FI_EBUSY.
#[derive(Debug, Default)]
pub struct Refs(AtomicUsize);

impl Refs {
    pub fn get(&self) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
    pub fn put(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
    pub fn busy(&self) -> Result<()> {
        if self.0.load(Ordering::Acquire) != 0 {
            Err(Error::Busy)
        } else {
            Ok(())
        }
    }
}

/// A fresh `struct fid` for an object of `class`.
pub fn new_fid(class: u32, context: *mut libc::c_void, ops: &'static fi::fi_ops) -> fi::fid {
    fi::fid { fclass: class as usize, context, ops: ops as *const fi::fi_ops as *mut fi::fi_ops }
}

entry_unsupported! {
    fn no_bind(fid: *mut fi::fid, bfid: *mut fi::fid, flags: u64) -> i32 = Error::NoSys;
    fn no_control(fid: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_ops_open(fid: *mut fi::fid, name: *const libc::c_char, flags: u64, ops: *mut *mut libc::c_void, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_tostr(fid: *const fi::fid, buf: *mut libc::c_char, len: usize) -> i32 = Error::NoSys;
    fn no_ops_set(fid: *mut fi::fid, name: *const libc::c_char, flags: u64, ops: *mut libc::c_void, context: *mut libc::c_void) -> i32 = Error::NoSys;
}

/// An `fi_ops` table with the given close / bind / control and ENOSYS elsewhere.
pub const fn fi_ops(
    close: unsafe extern "C" fn(*mut fi::fid) -> i32,
    bind: Option<unsafe extern "C" fn(*mut fi::fid, *mut fi::fid, u64) -> i32>,
    control: Option<unsafe extern "C" fn(*mut fi::fid, i32, *mut libc::c_void) -> i32>,
) -> fi::fi_ops {
    fi::fi_ops {
        size: std::mem::size_of::<fi::fi_ops>(),
        close: Some(close),
        bind: match bind {
            Some(b) => Some(b),
            None => Some(no_bind),
        },
        control: match control {
            Some(c) => Some(c),
            None => Some(no_control),
        },
        ops_open: Some(no_ops_open),
        tostr: Some(no_tostr),
        ops_set: Some(no_ops_set),
    }
}

/// Moves `obj` to the heap and returns the raw pointer libfabric will hold.
pub fn leak<T>(obj: T) -> *mut T {
    Box::into_raw(Box::new(obj))
}

/// Closed objects whose memory is kept as husks before it is freed
/// (`docs/reliability.md` states it: `prov/tests/docs_figures.rs`).
pub const QUARANTINE: usize = 1024;

/// Husks of closed objects, oldest first: address and layout to free.
static CLOSED: parking_lot::Mutex<std::collections::VecDeque<(usize, std::alloc::Layout)>> =
    parking_lot::Mutex::new(std::collections::VecDeque::new());

/// Closes an object created by [`leak`] for good: drops its contents now, and
/// keeps its memory for the next [`QUARANTINE`] closes as a husk whose fid says
/// "closed" (class `FI_CLASS_UNSPEC`, ops that answer `-FI_EINVAL`). libfabric's
/// inline wrappers dispatch through the object's own pointers (`fi_close(fid)`
/// is `fid->ops->close(fid)`), so a double close, or a call on a closed
/// endpoint, would otherwise read freed memory; with the husk it gets an error
/// (every entry checks the class). The sub-ops tables (`ep->msg`, ...) are
/// static, so their pointers stay valid in the husk.
///
/// # Safety
/// `p` must come from `leak::<T>`, and rdmx must not use it afterwards.
pub unsafe fn retire<T: FidObject>(p: *const T) {
    let p = p as *mut T;
    // SAFETY: `p` is a live object from `leak` (contract); its contents are
    // dropped exactly once here, and the allocation stays valid (not freed)
    // until the quarantine lets it go. `T` starts with its `struct fid`
    // (FidObject's contract), which the husk header overwrites.
    unsafe {
        std::ptr::drop_in_place(p);
        (p as *mut fi::fid).write(fi::fid {
            fclass: fi::FI_CLASS_UNSPEC as usize,
            context: std::ptr::null_mut(),
            ops: &CLOSED_OPS as *const fi::fi_ops as *mut fi::fi_ops,
        });
    }
    let oldest = {
        let mut q = CLOSED.lock();
        q.push_back((p as usize, std::alloc::Layout::new::<T>()));
        if q.len() > QUARANTINE {
            q.pop_front()
        } else {
            None
        }
    };
    if let Some((addr, layout)) = oldest {
        // SAFETY: allocated by `Box::new` (leak) with this layout, contents
        // already dropped, out of the quarantine: nothing refers to it.
        unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
    }
}

/// The ops of a closed object's husk.
static CLOSED_OPS: fi::fi_ops = fi::fi_ops {
    size: std::mem::size_of::<fi::fi_ops>(),
    close: Some(closed_close),
    bind: Some(closed_bind),
    control: Some(closed_control),
    ops_open: Some(no_ops_open),
    tostr: Some(no_tostr),
    ops_set: Some(no_ops_set),
};

entry_unsupported! {
    fn closed_close(fid: *mut fi::fid) -> i32 = Error::Inval("the object is closed");
    fn closed_bind(fid: *mut fi::fid, bfid: *mut fi::fid, flags: u64) -> i32 = Error::Inval("the object is closed");
    fn closed_control(fid: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 = Error::Inval("the object is closed");
}

/// Writes `v` to an out-pointer after checking it.
///
/// # Safety
/// `out` must be null or valid for writes.
pub unsafe fn write_out<T>(out: *mut T, v: T) -> Result<()> {
    if out.is_null() {
        return Err(Error::Inval("NULL output pointer"));
    }
    // SAFETY: checked non-null; valid per contract.
    unsafe { out.write(v) };
    Ok(())
}
