//! Logging through libfabric's `fi_log`, so rdmx obeys `FI_LOG_LEVEL`,
//! `FI_LOG_PROV` and `FI_LOG_SUBSYS` like the built-in providers.
use crate::provider_ptr;
use libfabric_sys as fi;
use std::ffi::CString;

#[derive(Clone, Copy, Debug)]
pub enum Subsys {
    Core,
    Fabric,
    Domain,
    EpCtrl,
    EpData,
    Av,
    Cq,
    Eq,
    Mr,
    Cntr,
}

impl Subsys {
    fn raw(self) -> fi::fi_log_subsys {
        match self {
            Subsys::Core => fi::FI_LOG_CORE,
            Subsys::Fabric => fi::FI_LOG_FABRIC,
            Subsys::Domain => fi::FI_LOG_DOMAIN,
            Subsys::EpCtrl => fi::FI_LOG_EP_CTRL,
            Subsys::EpData => fi::FI_LOG_EP_DATA,
            Subsys::Av => fi::FI_LOG_AV,
            Subsys::Cq => fi::FI_LOG_CQ,
            Subsys::Eq => fi::FI_LOG_EQ,
            Subsys::Mr => fi::FI_LOG_MR,
            Subsys::Cntr => fi::FI_LOG_CNTR,
        }
    }
}

/// Whether libfabric would print a message of this level and subsystem (check
/// before formatting one on a hot path: see [`debug_with`]).
pub fn enabled(level: fi::fi_log_level, subsys: Subsys) -> bool {
    // SAFETY: `provider_ptr()` is our provider struct, alive for the whole
    // process; libfabric only reads its context here.
    unsafe { fi::fi_log_enabled(provider_ptr(), level, subsys.raw()) != 0 }
}

fn emit(level: fi::fi_log_level, subsys: Subsys, func: &str, msg: &str) {
    if !enabled(level, subsys) {
        return;
    }
    let prov = provider_ptr();
    let func = CString::new(func.replace('\0', "")).unwrap_or_default();
    let msg = CString::new(format!("{}\n", msg.replace('\0', ""))).unwrap_or_default();
    // SAFETY: all pointers are valid NUL-terminated strings for the duration of the
    // call, and the format "%s" consumes exactly the one string argument we pass.
    unsafe {
        fi::fi_log(prov, level, subsys.raw(), func.as_ptr(), 0, c"%s".as_ptr(), msg.as_ptr());
    }
}

pub fn warn(subsys: Subsys, func: &str, msg: &str) {
    emit(fi::FI_LOG_WARN, subsys, func, msg);
}

pub fn info(subsys: Subsys, func: &str, msg: &str) {
    emit(fi::FI_LOG_INFO, subsys, func, msg);
}

pub fn debug(subsys: Subsys, func: &str, msg: &str) {
    emit(fi::FI_LOG_DEBUG, subsys, func, msg);
}

/// Whether debug logging is on, per subsystem: 0 not asked yet, 1 off, 2 on.
/// libfabric reads `FI_LOG_LEVEL`, `FI_LOG_PROV` and `FI_LOG_SUBSYS` once, at
/// its initialization, so the answer never changes: asked once, not on every
/// message (a call into libfabric and its filter, ~40 instructions a send).
static DEBUG_ON: [std::sync::atomic::AtomicU8; 10] = [const { std::sync::atomic::AtomicU8::new(0) }; 10];

/// A debug message built only when debug logging is on (per-message paths).
#[inline]
pub fn debug_with(subsys: Subsys, func: &str, msg: impl FnOnce() -> String) {
    use std::sync::atomic::Ordering::Relaxed;
    let cached = &DEBUG_ON[subsys as usize];
    let on = match cached.load(Relaxed) {
        0 => {
            let on = enabled(fi::FI_LOG_DEBUG, subsys);
            cached.store(if on { 2 } else { 1 }, Relaxed);
            on
        }
        v => v == 2,
    };
    if on {
        emit(fi::FI_LOG_DEBUG, subsys, func, &msg());
    }
}

/// `fi_warn!(Subsys::Cq, "format {}", args)`, mirroring libfabric's FI_WARN.
macro_rules! fi_warn {
    ($subsys:expr, $($arg:tt)*) => {
        $crate::log::warn($subsys, module_path!(), &format!($($arg)*))
    };
}
pub(crate) use fi_warn;

macro_rules! fi_info {
    ($subsys:expr, $($arg:tt)*) => {
        $crate::log::info($subsys, module_path!(), &format!($($arg)*))
    };
}
pub(crate) use fi_info;
