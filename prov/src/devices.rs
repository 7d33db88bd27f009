//! Opening the datagram devices an endpoint uses (`FI_RDMX_DEVICE`), and wrapping
//! them in the fault injector when `FI_RDMX_FAULT_*` asks for it.
use crate::error::{Error, Result};
use crate::params::Params;
use rdm::device::fault::{FaultConfig, FaultDevice};
use rdm::device::composite::AutoDevice;
use rdm::device::shm::{ShmConfig, ShmDevice};
use rdm::device::udp::{UdpConfig, UdpDevice};
use rdm::Device;
use std::net::SocketAddr;

/// The UDP device bound to `bind`; returns it with the bound address.
pub fn open_udp(bind: SocketAddr, mtu: usize) -> Result<(Box<dyn Device>, SocketAddr)> {
    let mut cfg = UdpConfig::new(bind);
    cfg.mtu = mtu;
    let dev = UdpDevice::open(&cfg)?;
    let local = dev.local_socket_addr();
    Ok((Box::new(dev), local))
}

fn shm_config(incarnation: u64) -> ShmConfig {
    // The ring id is the endpoint incarnation, so peers derive the ring's name
    // from the address alone (see RdmxAddr::shm).
    ShmConfig { ring_id: Some(incarnation), ..ShmConfig::default() }
}

/// The shared-memory device.
pub fn open_shm(incarnation: u64) -> Result<Box<dyn Device>> {
    Ok(Box::new(ShmDevice::open(&shm_config(incarnation))?))
}

/// Shared memory to local peers and UDP to the rest; the flag says whether the
/// shared-memory half could be opened (if not, the endpoint is UDP-only and says
/// so in its address).
pub fn open_auto(bind: SocketAddr, mtu: usize, incarnation: u64) -> Result<(Box<dyn Device>, SocketAddr, bool)> {
    let mut udp = UdpConfig::new(bind);
    udp.mtu = mtu;
    let dev = AutoDevice::open(Some(&shm_config(incarnation)), &udp)?;
    let has_shm = dev.shm().is_some();
    if !has_shm {
        crate::log::warn(crate::log::Subsys::EpCtrl, "open_auto", "shared memory unavailable; this endpoint uses UDP only");
    }
    let local = dev.net().map(|n| n.local_socket_addr()).ok_or_else(|| Error::Other("auto device without UDP".into()))?;
    Ok((Box::new(dev), local, has_shm))
}

/// The registrar of a domain's device: what registers memory so that peers can
/// read it remotely (paths with `DeviceCaps::registration`). `None` for every
/// device rdmx has today: udp pushes long messages and shm reads them with
/// `process_vm_readv`, neither needs a registration, so their domains keep no
/// registration cache (see [`crate::regcache`]). The verbs UD and EFA SRD
/// devices will return their protection domain's registrar here.
pub fn open_registrar(choice: crate::params::DeviceChoice) -> Option<crate::regcache::BoxedRegistrar> {
    use crate::params::DeviceChoice;
    match choice {
        DeviceChoice::Auto | DeviceChoice::Udp | DeviceChoice::Shm => None,
    }
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
