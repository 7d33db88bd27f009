//! Which libfabric rdmx agrees to load into.
//!
//! rdmx is compiled against one libfabric's headers (`FI_MAJOR_VERSION` /
//! `FI_MINOR_VERSION` in `rdma/fabric.h`, through `libfabric-sys`): the layouts
//! of `fi_info`, the attribute structs and every `fid_*` it reads and writes come
//! from them. libfabric only ever appends to those structs within one major
//! version, so a libfabric of the same major and at least that minor hands rdmx
//! structs at least as large as it expects; an older one may hand it smaller
//! ones, and another major may have changed them. `fi_prov_ini` therefore asks
//! the running library (`fi_version()`) and refuses the rest with a warning.
//!
//! The provider struct's `fi_version` field is the API version rdmx implements,
//! `info::API_VERSION` = FI_VERSION(1,17); it must not be newer than the
//! headers (asserted below), and libfabric skips the provider for applications
//! that request a newer API than it.
use libfabric_sys as fi;

/// The oldest libfabric rdmx supports at all: 1.17 (the DL-provider ABI and
/// struct layouts it was written and tested against).
pub const MIN_API: u32 = fi::fi_version_num(1, 17);

/// The libfabric API version of the headers rdmx was built against.
pub const BUILT_API: u32 = fi::fi_version_num(fi::FI_MAJOR_VERSION, fi::FI_MINOR_VERSION);

// Building against headers older than 1.17 would make every struct layout
// suspect; and the API rdmx declares must exist in those headers.
const _: () = assert!(BUILT_API >= MIN_API, "rdmx needs libfabric 1.17 or newer headers");
const _: () = assert!(crate::info::API_VERSION <= BUILT_API, "info::API_VERSION newer than the headers");

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
/// Accepted: the same major as `built`, a minor at least `built`'s, and at
/// least [`MIN_API`].
pub fn check(found: u32, built: u32) -> Result<(), String> {
    let needed = if built > MIN_API { built } else { MIN_API };
    if major(found) != major(built) {
        return Err(format!(
            "libfabric {} found, but rdmx was built for libfabric {} and needs major version {} (>= {}); not loading",
            dotted(found),
            dotted(built),
            major(built),
            dotted(needed),
        ));
    }
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
    fn newer_minor_of_the_same_major_loads() {
        assert_eq!(check(v(1, 18), v(1, 17)), Ok(()));
        assert_eq!(check(v(1, 22), v(1, 17)), Ok(()));
    }

    #[test]
    fn older_than_1_17_is_refused_and_says_which_versions() {
        let e = check(v(1, 16), v(1, 17)).unwrap_err();
        assert!(e.contains("libfabric 1.16 found"), "{e}");
        assert!(e.contains(">= 1.17"), "{e}");
        assert!(check(v(1, 3), v(1, 17)).is_err());
        assert!(check(v(1, 0), v(1, 17)).is_err());
    }

    #[test]
    fn older_than_the_headers_is_refused() {
        // Built against 1.20 headers: their structs may be larger than 1.18's.
        let e = check(v(1, 18), v(1, 20)).unwrap_err();
        assert!(e.contains("1.18 found") && e.contains(">= 1.20"), "{e}");
        assert_eq!(check(v(1, 20), v(1, 20)), Ok(()));
    }

    #[test]
    fn another_major_is_refused_either_way() {
        let e = check(v(2, 0), v(1, 17)).unwrap_err();
        assert!(e.contains("libfabric 2.0 found") && e.contains("major version 1"), "{e}");
        assert!(check(v(2, 17), v(1, 17)).is_err());
        assert!(check(v(0, 99), v(1, 17)).is_err());
        assert!(check(v(1, 17), v(2, 0)).is_err());
    }

    #[test]
    fn provider_declares_the_api_it_implements() {
        // The provider struct's fi_version is info::API_VERSION, which is
        // asserted at compile time to be no newer than the headers, so no
        // newer than any libfabric check() accepts.
        // SAFETY: the provider struct is a static, alive for the process;
        // nothing writes its fi_version field.
        let declared = unsafe { (*crate::provider_ptr()).fi_version };
        assert_eq!(declared, crate::info::API_VERSION);
    }

    #[test]
    fn this_machines_libfabric_is_accepted() {
        let found = running();
        assert!(found >= MIN_API, "fi_version() = {}", dotted(found));
        assert_eq!(check(found, BUILT_API), Ok(()));
    }
}
