//! # rdmx — a libfabric provider in Rust
//!
//! This crate is the only one that talks to libfabric. It builds `librdmx-fi.so`,
//! which exports exactly one symbol, [`fi_prov_ini`]; libfabric finds it through
//! `FI_PROVIDER_PATH` and calls it to get the provider's `struct fi_provider`.
//!
//! Layout:
//! * [`entry`]: the C boundary (panic barrier, null checks, `Result` → `-FI_E*`);
//!   every `extern "C"` function is defined with its `entry!` macro.
//! * [`info`]: `fi_getinfo` — attribute profile and hint matching.
//! * [`fabric`], [`domain`], [`ep`], [`av`], [`cq`], [`cntr`], [`eq`], [`mr`]: the
//!   fid objects, each a `#[repr(C)]` struct whose first field is the libfabric
//!   `fid_*` so the pointer libfabric hands back casts to ours.
//! * [`core`]: an enabled endpoint's engine — device, `rdm` engine, `rndv` matcher —
//!   and its progress function.
//! * [`log`], [`params`]: `fi_log` and `fi_param` glue (`FI_RDMX_*`).
//!
//! Layers, bottom to top (checked by `prov/tests/layers.rs`): the base
//! ([`error`], [`log`], [`params`], [`addr`], [`fid`], [`entry`], [`info`]);
//! the argument types and the queues ([`args`], [`av_table`], [`cq_queue`],
//! [`cntr_queue`], [`eq_queue`], [`wait_fd`], and [`progress`], the trait
//! through which a queue drives the endpoints bound to it); the runtime
//! ([`core`]); the fid objects. A module imports only its own layer and the
//! ones below, with no circle except an fid object's link to its parent
//! object (an endpoint to its domain, a domain to its fabric).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod addr;
pub mod args;
pub mod av;
pub mod av_table;
pub mod clock;
pub mod cntr;
pub mod cntr_queue;
pub mod completions;
pub mod core;
pub mod cq;
pub mod cq_queue;
pub mod dense_cache;
pub mod devices;
pub mod domain;
pub mod entry;
pub mod ep;
pub mod ep_msg;
pub mod ep_rma;
pub mod ep_stats;
pub mod eq;
pub mod eq_queue;
pub mod error;
pub mod fabric;
pub mod fid;
pub mod info;
pub mod job;
pub mod log;
pub mod mr;
pub mod params;
pub mod poll;
pub mod process_memory;
pub mod progress;
pub mod regcache;
pub mod rma;
pub mod stats_json;
pub mod version;
pub mod wait;
pub mod wait_fd;

use entry::entry;
use libfabric_sys as fi;
use std::cell::UnsafeCell;

/// rdmx's own version (0.1), as printed by `fi_info -l`.
pub const PROVIDER_VERSION: u32 = fi::fi_version_num(0, 1);

/// The provider struct libfabric registers. libfabric writes its `context` field
/// during registration and reads it on every log call, so it must be one writable
/// object alive for the whole process.
#[repr(transparent)]
pub struct ProviderCell(UnsafeCell<fi::fi_provider>);

// SAFETY: libfabric writes `context` once, during registration (single-threaded,
// inside fi_ini), and only reads the struct afterwards; rdmx never writes it.
unsafe impl Sync for ProviderCell {}

static PROVIDER: ProviderCell = ProviderCell(UnsafeCell::new(fi::fi_provider {
    version: PROVIDER_VERSION,
    // Replaced by version::declared() in fi_prov_ini, before libfabric sees it.
    fi_version: version::MIN_API,
    context: fi::fi_context { internal: [std::ptr::null_mut(); 4] },
    name: c"rdmx".as_ptr(),
    getinfo: Some(rdmx_getinfo),
    fabric: Some(fabric::rdmx_fabric),
    cleanup: Some(rdmx_cleanup),
}));

/// The pointer to pass to every `fi_log*` / `fi_param*` call.
pub fn provider_ptr() -> *mut fi::fi_provider {
    PROVIDER.0.get()
}

/// The provider's entry point, called by libfabric after `dlopen`. Returns
/// NULL (libfabric then skips rdmx) for a libfabric older than rdmx was
/// built for ([`version::check`]), with a warning saying which it found and
/// which it needs; otherwise declares [`version::declared`] and registers.
#[no_mangle]
pub extern "C" fn fi_prov_ini() -> *mut fi::fi_provider {
    let r = std::panic::catch_unwind(|| {
        if let Err(why) = version::check(version::running(), version::BUILT_API) {
            log::warn(log::Subsys::Core, "fi_prov_ini", &why);
            return std::ptr::null_mut();
        }
        let declared = version::declare(version::running());
        version::set_declared(declared);
        // SAFETY: fi_prov_ini runs inside libfabric's single-threaded
        // registration, before libfabric holds the pointer, and nothing else
        // writes the struct.
        unsafe { (*provider_ptr()).fi_version = declared };
        params::define_all();
        provider_ptr()
    });
    r.unwrap_or(std::ptr::null_mut())
}

entry! {
    fn rdmx_getinfo(
        version: u32,
        node: *const libc::c_char,
        service: *const libc::c_char,
        flags: u64,
        hints: *const fi::fi_info,
        out: *mut *mut fi::fi_info,
    ) -> i32 {
        entry::non_null!(out);
        // SAFETY: libfabric passes valid (or null) strings and hints.
        let profiles = unsafe { info::getinfo(version, node, service, flags, hints) }?;
        let mut head: *mut fi::fi_info = std::ptr::null_mut();
        let mut tail: *mut fi::fi_info = std::ptr::null_mut();
        for p in &profiles {
            let i = match info::to_fi_info(p) {
                Ok(i) => i,
                Err(e) => {
                    // SAFETY: `head` is a list we built with fi_dupinfo.
                    unsafe { fi::fi_freeinfo(head) };
                    return Err(e);
                }
            };
            if tail.is_null() {
                head = i;
            } else {
                // SAFETY: `tail` is the last element of our list.
                unsafe { (*tail).next = i };
            }
            tail = i;
        }
        // SAFETY: checked non-null above.
        unsafe { *out = head };
        Ok(0)
    }
}

unsafe extern "C" fn rdmx_cleanup() {
    let _ = std::panic::catch_unwind(core::shutdown_all);
}
