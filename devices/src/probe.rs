//! Which RDMA devices this host offers and their datagram sizes, asked once
//! per process (opening a device context is a few system calls, and
//! `fi_getinfo` asks often), and what an `auto` domain learned about EFA at
//! run time. The provider passes the settings in ([`Settings`]); nothing here
//! reads its parameters.
#![forbid(unsafe_code)]

use crate::efa::{EfaConfig, EfaContext};
use crate::verbs::{VerbsConfig, VerbsContext};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// The settings the probes depend on: the provider's `FI_RDMX_IFACE`,
/// `FI_RDMX_RC_MAX_PEERS` and `FI_RDMX_VERBS_ODP`, fixed for the process.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub iface: Option<String>,
    pub rc_max_peers: Option<usize>,
    pub odp: Option<bool>,
}

/// How the verbs device is chosen: `iface` names a netdev, an RDMA device or
/// an address; unset, the RDMA device of the netdev the UDP device would use.
/// `None` when this host has no RDMA device at all.
pub fn verbs_config(s: &Settings) -> Option<VerbsConfig> {
    VerbsContext::available().then(|| VerbsConfig {
        iface: s.iface.clone(),
        rc_max_peers: s.rc_max_peers,
        odp: s.odp,
        ..Default::default()
    })
}

/// The verbs device's port MTU, when one can be opened (asked once per
/// process: the settings are the process's).
pub fn verbs_mtu(s: &Settings) -> Option<usize> {
    static MTU: OnceLock<Option<usize>> = OnceLock::new();
    *MTU.get_or_init(|| verbs_config(s).and_then(|c| VerbsContext::open(&c).ok()).map(|v| v.mtu()))
}

/// The EFA device's context config: `iface` naming an RDMA device picks it;
/// anything else, the first EFA device.
pub fn efa_config(s: &Settings) -> EfaConfig {
    let named = s.iface.clone().filter(|n| std::path::Path::new(&format!("/sys/class/infiniband/{n}")).exists());
    EfaConfig { device: named, ..Default::default() }
}

/// The EFA device's largest datagram, when one opens (asked once per
/// process). `None` on hosts without an EFA device (every host it has been
/// tried on).
pub fn efa_mtu(s: &Settings) -> Option<usize> {
    static MTU: OnceLock<Option<usize>> = OnceLock::new();
    *MTU.get_or_init(|| {
        if !VerbsContext::available() {
            return None;
        }
        EfaContext::open(&efa_config(s)).ok().map(|c| c.mtu())
    })
}

/// An auto domain's EFA context failed to open in this process: auto sends
/// to remote peers over UDP from then on.
static AUTO_EFA_FAILED: AtomicBool = AtomicBool::new(false);

/// Records that an auto domain could not open the EFA device.
pub fn note_auto_efa_failed() {
    AUTO_EFA_FAILED.store(true, Ordering::Relaxed);
}

/// The largest datagram of the RDMA device an auto domain uses for remote
/// peers: on a host with an EFA device, EFA's while its context opens and
/// none once an auto domain's failed (UDP then; verbs UD does not work on
/// EFA); elsewhere the verbs device's (never an EFA one). `None`: UDP only.
/// A value given before a fallback is never too large for it: the auto
/// datagram is the minimum over UDP and this.
pub fn auto_rdma_mtu(s: &Settings) -> Option<usize> {
    match efa_mtu(s) {
        Some(mtu) => (!AUTO_EFA_FAILED.load(Ordering::Relaxed)).then_some(mtu),
        None => verbs_mtu(s),
    }
}
