//! The provider's error type and its one mapping to libfabric's `-FI_E*` codes.
use libfabric_sys as fi;

/// Everything an rdmx entry point can fail with. Each variant maps to exactly one
/// `FI_E*` code ([`Error::errno`]); the entry macro negates it for the C caller.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("invalid argument: {0}")]
    Inval(&'static str),
    #[error("operation not supported")]
    NoSys,
    #[error("no matching data")]
    NoData,
    #[error("object still has bound or child objects")]
    Busy,
    #[error("resources temporarily unavailable, retry after progress")]
    Again,
    #[error("out of memory")]
    NoMem,
    #[error("buffer too small")]
    TooSmall,
    #[error("no such entry")]
    NoEnt,
    #[error("unsupported flags")]
    BadFlags,
    #[error("option not supported")]
    NoProtoOpt,
    #[error("key already in use or invalid")]
    NoKey,
    #[error("address not available")]
    AddrNotAvail,
    #[error("operation not permitted in this state")]
    OpNotSupp,
    #[error("i/o error: {0}")]
    Io(String),
    #[error("internal error: {0}")]
    Other(String),
    #[error("message larger than max_msg_size")]
    MsgSize,
    /// The address names a process that is gone: the peer at that address is
    /// another incarnation (a restart).
    #[error("the address names an earlier incarnation of the process there")]
    HostUnreach,
}

impl Error {
    /// The positive `FI_E*` value.
    pub fn errno(&self) -> i32 {
        (match self {
            Error::Inval(_) => fi::FI_EINVAL,
            Error::NoSys => fi::FI_ENOSYS,
            Error::NoData => fi::FI_ENODATA,
            Error::Busy => fi::FI_EBUSY,
            Error::Again => fi::FI_EAGAIN,
            Error::NoMem => fi::FI_ENOMEM,
            Error::TooSmall => fi::FI_ETOOSMALL,
            Error::NoEnt => fi::FI_ENOENT,
            Error::BadFlags => fi::FI_EBADFLAGS,
            Error::NoProtoOpt => fi::FI_ENOPROTOOPT,
            Error::NoKey => fi::FI_ENOKEY,
            Error::AddrNotAvail => fi::FI_EADDRNOTAVAIL,
            Error::OpNotSupp => fi::FI_EOPNOTSUPP,
            Error::Io(_) => fi::FI_EIO,
            Error::HostUnreach => fi::FI_EHOSTUNREACH,
            Error::Other(_) => fi::FI_EOTHER,
            Error::MsgSize => fi::FI_EMSGSIZE,
        }) as i32
    }
}

impl From<rdm::engine::SendError> for Error {
    fn from(e: rdm::engine::SendError) -> Error {
        match e {
            rdm::engine::SendError::WouldBlock => Error::Again,
            rdm::engine::SendError::TooLarge { .. } => Error::MsgSize,
        }
    }
}

impl From<rdm::DeviceError> for Error {
    fn from(e: rdm::DeviceError) -> Self {
        match e {
            rdm::DeviceError::Config(s) => Error::Other(s),
            rdm::DeviceError::Unsupported => Error::NoSys,
            other => Error::Io(other.to_string()),
        }
    }
}

impl From<mr_cache::MrError> for Error {
    fn from(e: mr_cache::MrError) -> Self {
        match e {
            mr_cache::MrError::KeyInUse(_) | mr_cache::MrError::NoKey(_) | mr_cache::MrError::Unmapped(_) => Error::NoKey,
            mr_cache::MrError::OutOfRange { .. } | mr_cache::MrError::Access => Error::Inval("mr access"),
        }
    }
}

pub type Result<T, E = Error> = core::result::Result<T, E>;

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
