//! Opening the datagram devices an endpoint uses (`FI_RDMX_DEVICE`), and wrapping
//! them in the fault injector when `FI_RDMX_FAULT_*` asks for it.
use crate::params::{DeviceChoice, Params};
use rdm::device::composite::AutoDevice;
use rdm::device::fault::{FaultConfig, FaultDevice};
use rdm::device::shm::{ShmConfig, ShmDevice};
use rdm::device::udp::{UdpConfig, UdpDevice};
use rdm::device::verbs::VerbsContext;
use rdm::device::{DeviceContext, OpenSpec, Registrar};
use std::sync::Arc;
use rdm::{Device, DeviceError};
use std::net::SocketAddr;

/// A domain's device (one per libfabric domain): every endpoint of the domain
/// opens its queue here, and the domain registers memory through its
/// registrar, so that a registration is valid on every endpoint's queue.
pub struct DomainDevices {
    choice: DeviceChoice,
    /// The RDMA device and its protection domain (the verbs domain): every
    /// endpoint's queue pair and every registration of the domain on it.
    verbs: Option<Arc<VerbsContext>>,
}

impl DomainDevices {
    pub fn new(choice: DeviceChoice) -> Result<DomainDevices, DeviceError> {
        let verbs = match choice {
            DeviceChoice::Verbs => {
                let cfg = crate::info::verbs_config().ok_or_else(|| DeviceError::Config("no RDMA device on this host".into()))?;
                let ctx = VerbsContext::open(&cfg)?;
                crate::log::info(
                    crate::log::Subsys::Domain,
                    "verbs",
                    &format!("verbs domain on {} port {} (netdev {:?}, GID index {}, mtu {})", ctx.device_name(), ctx.port(), ctx.netdev(), ctx.gid_index(), ctx.mtu()),
                );
                Some(Arc::new(ctx))
            }
            _ => None,
        };
        Ok(DomainDevices { choice, verbs })
    }
}

impl DeviceContext for DomainDevices {
    fn open(&self, spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError> {
        let p = crate::params::params();
        let bind = spec.bind.unwrap_or_else(|| SocketAddr::new(crate::info::default_ip(), 0));
        let dev = match self.choice {
            DeviceChoice::Udp => open_udp(bind, p.udp_mtu)?,
            DeviceChoice::Shm => open_shm(spec.incarnation)?,
            DeviceChoice::Auto => open_auto(bind, p.udp_mtu, spec.incarnation)?,
            DeviceChoice::Verbs => self.verbs.as_ref().ok_or_else(|| DeviceError::Config("verbs domain without a device".into()))?.open(spec)?,
        };
        Ok(maybe_fault(dev, p))
    }

    /// `None` for udp, shm and auto: udp pushes long messages and shm reads
    /// them with `process_vm_readv`, neither needs a registration, so their
    /// domains keep no registration cache (see [`crate::regcache`]). The
    /// verbs domain's protection domain registers (and the EFA SRD one will).
    fn registrar(&self) -> Option<Box<dyn Registrar>> {
        match self.choice {
            DeviceChoice::Auto | DeviceChoice::Udp | DeviceChoice::Shm => None,
            DeviceChoice::Verbs => self.verbs.as_ref().and_then(|v| v.registrar()),
        }
    }
}

/// The UDP device bound to `bind`.
fn open_udp(bind: SocketAddr, mtu: usize) -> Result<Box<dyn Device>, DeviceError> {
    let mut cfg = UdpConfig::new(bind);
    cfg.mtu = mtu;
    Ok(Box::new(UdpDevice::open(&cfg)?))
}

fn shm_config(incarnation: u64) -> ShmConfig {
    // The ring id is the endpoint incarnation, so peers derive the ring's name
    // from the address alone (see RdmxAddr::shm).
    ShmConfig { ring_id: Some(incarnation), ..ShmConfig::default() }
}

/// The shared-memory device.
fn open_shm(incarnation: u64) -> Result<Box<dyn Device>, DeviceError> {
    Ok(Box::new(ShmDevice::open(&shm_config(incarnation))?))
}

/// Shared memory to local peers and UDP to the rest; without the
/// shared-memory half the endpoint is UDP-only and its address says so.
fn open_auto(bind: SocketAddr, mtu: usize, incarnation: u64) -> Result<Box<dyn Device>, DeviceError> {
    let mut udp = UdpConfig::new(bind);
    udp.mtu = mtu;
    let dev = AutoDevice::open(Some(&shm_config(incarnation)), &udp)?;
    if dev.shm().is_none() {
        crate::log::warn(crate::log::Subsys::EpCtrl, "open_auto", "shared memory unavailable; this endpoint uses UDP only");
    }
    if dev.net().is_none() {
        return Err(DeviceError::Config("auto device without UDP".into()));
    }
    Ok(Box::new(dev))
}

/// Wraps `dev` in the fault-injecting decorator when any FI_RDMX_FAULT_* rate is set.
pub fn maybe_fault(dev: Box<dyn Device>, p: &Params) -> Box<dyn Device> {
    let cfg = FaultConfig {
        seed: p.fault_seed,
        drop_pct: p.fault_drop,
        dup_pct: p.fault_dup,
        reorder_pct: p.fault_reorder,
        corrupt_pct: p.fault_corrupt,
    };
    if cfg.is_active() {
        crate::log::info(
            crate::log::Subsys::EpCtrl,
            "maybe_fault",
            &format!("fault injection on: drop {}% dup {}% reorder {}% corrupt {}% (seed {})", cfg.drop_pct, cfg.dup_pct, cfg.reorder_pct, cfg.corrupt_pct, cfg.seed),
        );
        Box::new(FaultDevice::new(dev, cfg))
    } else {
        dev
    }
}
