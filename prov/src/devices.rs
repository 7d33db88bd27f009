//! Opening the datagram devices an endpoint uses (`FI_RDMX_DEVICE`), and wrapping
//! them in the fault injector when `FI_RDMX_FAULT_*` asks for it.
use crate::error::{Error, Result};
use crate::params::Params;
use rdm::device::fault::{FaultConfig, FaultDevice};
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

/// The shared-memory device.
pub fn open_shm(_host_id: u64, _pid: u32, _incarnation: u64) -> Result<Box<dyn Device>> {
    Err(Error::NoSys)
}

/// Shared memory to local peers and UDP to the rest; the flag says whether the
/// shared-memory half could be opened.
pub fn open_auto(bind: SocketAddr, mtu: usize, _host_id: u64, _pid: u32, _incarnation: u64) -> Result<(Box<dyn Device>, SocketAddr, bool)> {
    let (d, a) = open_udp(bind, mtu)?;
    Ok((d, a, false))
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
