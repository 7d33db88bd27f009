//! The C boundary. Every function libfabric calls is defined with [`entry!`]: it
//! becomes `unsafe extern "C"`, runs its body inside a panic barrier, and turns the
//! body's `Result` into the C return convention (`0`/count or `-FI_E*`). No panic and
//! no Rust error ever crosses into C.
use crate::error::Error;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Return types an entry point may have, and how an error is spelled in each.
pub trait CReturn: Copy {
    fn from_error(e: &Error) -> Self;
}

impl CReturn for i32 {
    fn from_error(e: &Error) -> Self {
        -e.errno()
    }
}

impl CReturn for isize {
    fn from_error(e: &Error) -> Self {
        -(e.errno() as isize)
    }
}

impl CReturn for u64 {
    // fi_cntr_read/readerr return a plain count; on failure 0 is the only safe value.
    fn from_error(_: &Error) -> Self {
        0
    }
}

impl CReturn for *const libc::c_char {
    fn from_error(_: &Error) -> Self {
        c"rdmx: internal error".as_ptr()
    }
}

impl CReturn for () {
    fn from_error(_: &Error) -> Self {}
}

/// Runs `body` behind a panic barrier. A panic is logged and reported as
/// `-FI_EOTHER`; an `Err` is logged at debug level and mapped with [`CReturn`].
pub fn guard<R: CReturn>(name: &'static str, body: impl FnOnce() -> Result<R, Error>) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            if !matches!(e, Error::Again | Error::NoData) {
                crate::log::debug(crate::log::Subsys::Core, name, &e.to_string());
            }
            R::from_error(&e)
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            crate::log::warn(
                crate::log::Subsys::Core,
                name,
                &format!("internal panic caught at the C boundary: {what}"),
            );
            R::from_error(&Error::Other(what))
        }
    }
}

/// Defines a C entry point: `entry! { fn name(args) -> ret { body returning Result<ret> } }`.
///
/// An argument written `name: *mut fi::fid_cq => &Cq` is a fid libfabric hands
/// back to one of rdmx's ops: the macro resolves it to the rdmx object (class
/// checked, `-FI_EINVAL` for NULL or a wrong class) before the body runs, which
/// sees `name: &Cq`. An out-pointer written `out: *mut T => Out<T>` is checked
/// non-null (`-FI_EINVAL`) and reaches the body as an [`Out`] to `set`.
macro_rules! entry {
    ($(#[$m:meta])* fn $name:ident($($arg:ident : $ty:ty $(=> $res:ty)?),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$m])*
        #[allow(clippy::missing_safety_doc)]
        pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            $crate::entry::guard::<$ret>(stringify!($name), move || -> $crate::error::Result<$ret> {
                $($(
                    // SAFETY: libfabric calls rdmx's ops only with fids rdmx
                    // created (from_fid also checks the class and NULL).
                    let $arg: $res = unsafe { <$res as $crate::entry::FromRaw<$ty>>::from_raw($arg) }?;
                )?)*
                $body
            })
        }
    };
}
pub(crate) use entry;

/// How the entry macro turns a raw argument into what the body sees.
pub trait FromRaw<P>: Sized {
    /// # Safety
    /// `p` is what libfabric passed for this argument of an rdmx op.
    unsafe fn from_raw(p: P) -> Result<Self, Error>;
}

/// An out-pointer of the caller's, checked non-null.
pub struct Out<'a, T>(&'a mut T);

impl<T> Out<'_, T> {
    /// Writes the result.
    pub fn set(self, v: T) {
        *self.0 = v;
    }
}

impl<T> FromRaw<*mut T> for Out<'_, T> {
    unsafe fn from_raw(p: *mut T) -> Result<Self, Error> {
        // SAFETY: per the trait's contract, the caller's out-pointer: NULL
        // (refused here) or valid for a write of T.
        unsafe { p.as_mut() }.map(Out).ok_or(Error::Inval("NULL out-pointer"))
    }
}

/// Defines the ops-table slots rdmx does not support: each returns `-FI_ENOSYS`
/// (or the given error) through the same barrier.
macro_rules! entry_unsupported {
    ($(fn $name:ident($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty = $err:expr;)*) => {
        $(
            #[allow(clippy::missing_safety_doc)]
            pub(crate) unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                $(let _ = $arg;)*
                <$ret as $crate::entry::CReturn>::from_error(&$err)
            }
        )*
    };
}
pub(crate) use entry_unsupported;

/// Returns `Err(Error::Inval)` from the enclosing entry when a pointer is null.
macro_rules! non_null {
    ($($p:expr),+) => {
        $(if $p.is_null() {
            return Err($crate::error::Error::Inval(concat!(stringify!($p), " is NULL")));
        })+
    };
}
pub(crate) use non_null;
