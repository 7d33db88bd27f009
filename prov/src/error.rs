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
            rdm::engine::SendError::Unsupported => Error::NoSys,
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
            mr_cache::MrError::KeyInUse(_) | mr_cache::MrError::NoKey(_) | mr_cache::MrError::Unmapped(_) => {
                Error::NoKey
            }
            mr_cache::MrError::OutOfRange { .. } | mr_cache::MrError::Access => Error::Inval("mr access"),
        }
    }
}

pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Why an operation failed, more precisely than its `FI_E*` value: rdmx's
/// `prov_errno` in CQ error entries (`fi_cq_strerror` turns it into text, and
/// names the peer from `err_data`). Values start at [`ErrReason::BASE`] so
/// they never collide with an errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ErrReason {
    PeerTimeout = 1,
    PeerUnreachable,
    PeerRestarted,
    Transfer,
    RemoteNoKey,
    RemoteAccess,
    RemoteInvalid,
    Truncated,
}

impl ErrReason {
    pub const BASE: i32 = 0x5244_0000;
    const ALL: [ErrReason; 8] = [
        ErrReason::PeerTimeout,
        ErrReason::PeerUnreachable,
        ErrReason::PeerRestarted,
        ErrReason::Transfer,
        ErrReason::RemoteNoKey,
        ErrReason::RemoteAccess,
        ErrReason::RemoteInvalid,
        ErrReason::Truncated,
    ];

    pub fn prov_errno(self) -> i32 {
        Self::BASE + self as i32
    }

    pub fn from_prov_errno(v: i32) -> Option<ErrReason> {
        Self::ALL.into_iter().find(|r| r.prov_errno() == v)
    }

    /// The `FI_E*` value an entry with this reason carries.
    pub fn errno(self) -> u32 {
        match self {
            ErrReason::PeerTimeout | ErrReason::PeerUnreachable => fi::FI_EHOSTUNREACH,
            ErrReason::PeerRestarted | ErrReason::Transfer => fi::FI_EIO,
            ErrReason::RemoteNoKey | ErrReason::RemoteAccess => fi::FI_EACCES,
            ErrReason::RemoteInvalid => fi::FI_EINVAL,
            ErrReason::Truncated => fi::FI_ETRUNC,
        }
    }

    /// The whole text (`fi_strerror` of [`ErrReason::errno`], then why).
    pub fn text(self) -> &'static std::ffi::CStr {
        match self {
            ErrReason::PeerTimeout => c"No route to host: the peer acknowledged nothing within the peer timeout (FI_RDMX_PEER_TIMEOUT)",
            ErrReason::PeerUnreachable => c"No route to host: the network or the device reported the peer unreachable (ICMP, a closed port or ring, a dead process)",
            ErrReason::PeerRestarted => c"Input/output error: the peer process restarted (a new incarnation at its address) before the operation completed",
            ErrReason::Transfer => c"Input/output error: the transfer of the message's bytes failed (a remote read refused or cut short)",
            ErrReason::RemoteNoKey => c"Permission denied: the target has no registration with this key (closed, or its memory unmapped)",
            ErrReason::RemoteAccess => c"Permission denied: the access falls outside the target's registration or is not allowed by it",
            ErrReason::RemoteInvalid => c"Invalid argument: the target refused the operation as unsupported or malformed",
            ErrReason::Truncated => c"Truncation error: the message was longer than the posted buffer",
        }
    }
}

/// Writes the text for `prov_errno` into `buf` (if given) and returns it.
///
/// # Safety
/// `buf` is null or the caller's buffer of `len` bytes.
pub unsafe fn strerror_into(prov_errno: i32, buf: *mut libc::c_char, len: usize) -> *const libc::c_char {
    let s = match ErrReason::from_prov_errno(prov_errno) {
        Some(r) => r.text().as_ptr(),
        // SAFETY: fi_strerror returns a static string for any value.
        None => unsafe { fi::fi_strerror(prov_errno.abs()) },
    };
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

#[cfg(test)]
mod tests {
    use super::ErrReason;

    /// Every reason survives the trip through `prov_errno`, none collides with
    /// an errno, and each text starts with what `fi_strerror` says of its
    /// `FI_E*` value.
    #[test]
    fn reasons_round_trip_through_prov_errno() {
        for r in ErrReason::ALL {
            assert_eq!(ErrReason::from_prov_errno(r.prov_errno()), Some(r));
            assert!(r.prov_errno() > 4095, "{r:?} collides with an errno");
            // SAFETY: fi_strerror returns a static string for any value.
            let base = unsafe { std::ffi::CStr::from_ptr(libfabric_sys::fi_strerror(r.errno() as i32)) }
                .to_string_lossy()
                .into_owned();
            let text = r.text().to_string_lossy();
            assert!(text.starts_with(&base), "{r:?}: {text:?} does not start with {base:?}");
        }
        assert_eq!(ErrReason::from_prov_errno(libfabric_sys::FI_EHOSTUNREACH as i32), None);
    }
}
