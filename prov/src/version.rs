//! Which libfabric rdmx agrees to load into, and which API version it declares.
//!
//! rdmx is compiled against one libfabric's headers (`FI_MAJOR_VERSION` /
//! `FI_MINOR_VERSION` in `rdma/fabric.h`, through `libfabric-sys`): the layouts
//! of `fi_info`, the attribute structs and every `fid_*` it reads and writes come
//! from them. libfabric only ever appends to those structs and ops tables, across
//! 2.0 too (fabric(7): 2.x keeps `libfabric.so.1` and ABI 1.x, with 1.8 and 1.9
//! only appending fields), so a libfabric at least as new as the headers hands
//! rdmx structs at least as large as it expects, whatever its major version; an
//! older one may hand it smaller ones. `fi_prov_ini` therefore asks the running
//! library (`fi_version()`) and refuses only an older one, with a warning.
//!
//! The provider struct's `fi_version` is the API version rdmx declares
//! ([`declared`]): the newest version whose rules rdmx follows
//! ([`IMPLEMENTED_API`]), capped at the running library's. libfabric's
//! `fi_getinfo` skips a provider whose `fi_version` is below the version the
//! application asks for (OpenMPI 5 asks 1.18, MPICH the running library's own
//! version), so declaring by the running version, not by the headers, is what
//! lets a build against 1.17's headers serve a 2.x application.
use libfabric_sys as fi;
use std::sync::atomic::{AtomicU32, Ordering};

/// The oldest libfabric rdmx supports at all: 1.17 (the DL-provider ABI and
/// struct layouts it was written and tested against).
pub const MIN_API: u32 = fi::fi_version_num(1, 17);

/// The newest libfabric API whose rules rdmx follows, whatever headers it was
/// built against: the 2.x capability bits are known by value (`info.rs`), the
/// fields 2.x appended are read only when the running library has them, and
/// every hint rdmx cannot honour is refused (`info::match_hints`). Raise it
/// only after reading what the newer version changed for providers.
pub const IMPLEMENTED_API: u32 = fi::fi_version_num(2, 6);

/// The libfabric API version of the headers rdmx was built against.
pub const BUILT_API: u32 = fi::fi_version_num(fi::FI_MAJOR_VERSION, fi::FI_MINOR_VERSION);

// Building against headers older than 1.17 would make every struct layout
// suspect.
const _: () = assert!(BUILT_API >= MIN_API, "rdmx needs libfabric 1.17 or newer headers");

pub const fn major(v: u32) -> u32 {
    v >> 16
}

pub const fn minor(v: u32) -> u32 {
    v & 0xffff
}

/// `maj.min` of an `FI_VERSION` number.
pub fn dotted(v: u32) -> String {
    format!("{}.{}", major(v), minor(v))
}

/// Whether rdmx, built against `built`, may load into a libfabric reporting
/// `found` (both `FI_VERSION` numbers). `Err` carries the warning to log.
///
/// Accepted: any version at least `built` and at least [`MIN_API`], of any
/// major (2.x kept the 1.x ABI).
pub fn check(found: u32, built: u32) -> Result<(), String> {
    let needed = built.max(MIN_API);
    if found < needed {
        return Err(format!(
            "libfabric {} found, but rdmx (built against libfabric {}) needs libfabric >= {}; not loading",
            dotted(found),
            dotted(built),
            dotted(needed),
        ));
    }
    Ok(())
}

/// The API version to declare when running under a libfabric of API `running`:
/// [`IMPLEMENTED_API`], capped at `running` (declaring more than the library
/// knows would claim rules it has never heard of).
pub const fn declare(running: u32) -> u32 {
    if running < IMPLEMENTED_API {
        running
    } else {
        IMPLEMENTED_API
    }
}

/// Set once by `fi_prov_ini` before the provider struct is handed over; 0 until then.
static DECLARED: AtomicU32 = AtomicU32::new(0);

/// Records the declared version (called by `fi_prov_ini`).
pub fn set_declared(v: u32) {
    DECLARED.store(v, Ordering::Relaxed);
}

/// The API version rdmx declared to the running libfabric: what `fi_getinfo`
/// compares applications' requests with, and what `fabric_attr.api_version` says.
/// Before `fi_prov_ini` ran (unit tests), the version it would declare.
pub fn declared() -> u32 {
    match DECLARED.load(Ordering::Relaxed) {
        0 => declare(running()),
        v => v,
    }
}

/// Whether the running library is at least `v` (fields added in `v` exist in
/// the structs it allocates).
pub fn running_at_least(v: u32) -> bool {
    running() >= v
}

/// The running libfabric's API version, `fi_version()`.
pub fn running() -> u32 {
    // SAFETY: fi_version takes no argument, touches no state and only returns
    // the library's compiled-in FI_VERSION number.
    unsafe { fi::fi_version() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fi::fi_version_num as v;

    #[test]
    fn same_version_loads() {
        assert_eq!(check(v(1, 17), v(1, 17)), Ok(()));
    }

    #[test]
    fn newer_minor_or_major_loads() {
        assert_eq!(check(v(1, 18), v(1, 17)), Ok(()));
        assert_eq!(check(v(1, 22), v(1, 17)), Ok(()));
        // 2.x keeps libfabric.so.1 and appends only: a 1.17 build loads there.
        assert_eq!(check(v(2, 0), v(1, 17)), Ok(()));
        assert_eq!(check(v(2, 5), v(1, 17)), Ok(()));
        assert_eq!(check(v(2, 5), v(2, 1)), Ok(()));
    }

    #[test]
    fn older_than_1_17_is_refused_and_says_which_versions() {
        let e = check(v(1, 16), v(1, 17)).unwrap_err();
        assert!(e.contains("libfabric 1.16 found"), "{e}");
        assert!(e.contains(">= 1.17"), "{e}");
        assert!(check(v(1, 3), v(1, 17)).is_err());
        assert!(check(v(1, 0), v(1, 17)).is_err());
        assert!(check(v(0, 99), v(1, 17)).is_err());
    }

    #[test]
    fn older_than_the_headers_is_refused() {
        // Built against 2.1 headers: their structs are larger than 1.x's.
        let e = check(v(1, 22), v(2, 1)).unwrap_err();
        assert!(e.contains("1.22 found") && e.contains(">= 2.1"), "{e}");
        assert!(check(v(1, 17), v(2, 0)).is_err());
        assert_eq!(check(v(2, 1), v(2, 1)), Ok(()));
    }

    #[test]
    fn declares_the_implemented_api_capped_at_the_running_one() {
        assert_eq!(declare(v(1, 17)), v(1, 17));
        assert_eq!(declare(v(1, 18)), v(1, 18));
        assert_eq!(declare(v(2, 1)), v(2, 1));
        assert_eq!(declare(IMPLEMENTED_API), IMPLEMENTED_API);
        assert_eq!(declare(v(2, 99)), IMPLEMENTED_API);
        assert_eq!(declare(v(3, 0)), IMPLEMENTED_API);
    }

    #[test]
    fn this_machines_libfabric_is_accepted() {
        let found = running();
        assert!(found >= MIN_API, "fi_version() = {}", dotted(found));
        assert_eq!(check(found, BUILT_API), Ok(()));
        assert_eq!(declared(), declare(found));
    }
}
