//! Opening the datagram devices an endpoint uses (`FI_RDMX_DEVICE`), and wrapping
//! them in the fault injector when `FI_RDMX_FAULT_*` asks for it.
use crate::params::{DeviceChoice, Params};
use ::devices::composite::{AutoDevice, NetPair};
use ::devices::efa::EfaContext;
use ::devices::fault::{FaultConfig, FaultDevice};
use ::devices::shm::{ShmConfig, ShmDevice};
use ::devices::udp::{UdpConfig, UdpDevice};
use ::devices::verbs::VerbsContext;
use rdm::device::{DeviceContext, OpenSpec, Registrar};
use rdm::{Device, DeviceError};
use std::net::SocketAddr;
use std::sync::Arc;

/// A domain's device (one per libfabric domain): every endpoint of the domain
/// opens its queue here, and the domain registers memory through its
/// registrar, so that a registration is valid on every endpoint's queue.
pub struct DomainDevices {
    choice: DeviceChoice,
    /// The RDMA device and its protection domain (the verbs domain): every
    /// endpoint's queue pair and every registration of the domain on it.
    verbs: Option<Arc<VerbsContext>>,
    /// The EFA device and its protection domain (the efa domain, and auto
    /// on a host with an EFA device, which then opens no verbs UD).
    efa: Option<Arc<EfaContext>>,
}

impl DomainDevices {
    pub fn new(choice: DeviceChoice) -> Result<DomainDevices, DeviceError> {
        let efa = match choice {
            DeviceChoice::Efa => Some(Arc::new(open_efa()?)),
            // auto prefers an EFA device (SRD: reliable, reads without
            // connections); hosts without one (every host this has run
            // on) answer at once from the device list. Verbs UD does not
            // work on EFA, so an EFA context that fails here leaves remote
            // peers to UDP (and the auto MTU follows: info::auto_rdma_mtu).
            DeviceChoice::Auto if crate::info::efa_mtu().is_some() => {
                match open_efa() {
                    Ok(ctx) => Some(Arc::new(ctx)),
                    Err(e) => {
                        crate::info::note_auto_efa_failed();
                        crate::log::warn(crate::log::Subsys::Domain, "efa", &format!("auto: EFA device not usable ({e}); remote peers over UDP (verbs UD does not work on EFA)"));
                        None
                    }
                }
            }
            _ => None,
        };
        let verbs = match choice {
            DeviceChoice::Verbs => {
                let cfg = crate::info::verbs_config()
                    .ok_or_else(|| DeviceError::Config("no RDMA device on this host".into()))?;
                Some(Arc::new(open_verbs(&cfg)?))
            }
            // An EFA host (its context open or failed): SRD or UDP, no UD.
            DeviceChoice::Auto if efa.is_some() || crate::info::efa_mtu().is_some() => None,
            // auto takes the RDMA device when there is a usable one (never
            // an EFA device: VerbsContext skips them), for remote peers
            // that have one too; without it, shm and UDP.
            DeviceChoice::Auto => crate::info::verbs_config().and_then(|cfg| match open_verbs(&cfg) {
                Ok(ctx) => Some(Arc::new(ctx)),
                Err(e) => {
                    crate::log::warn(
                        crate::log::Subsys::Domain,
                        "verbs",
                        &format!("auto: RDMA device not usable ({e}); shm and UDP only"),
                    );
                    None
                }
            }),
            _ => None,
        };
        Ok(DomainDevices { choice, verbs, efa })
    }
}

impl DeviceContext for DomainDevices {
    fn open(&self, spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError> {
        let p = crate::params::params();
        let bind = spec.bind.unwrap_or_else(|| SocketAddr::new(crate::info::default_ip(), 0));
        let dev = match self.choice {
            DeviceChoice::Udp => open_udp(bind, p.udp_mtu)?,
            DeviceChoice::Shm => open_shm(spec.incarnation)?,
            DeviceChoice::Auto => open_auto(bind, p.udp_mtu, spec, self.verbs.as_deref(), self.efa.as_deref())?,
            DeviceChoice::Verbs => self
                .verbs
                .as_ref()
                .ok_or_else(|| DeviceError::Config("verbs domain without a device".into()))?
                .open(spec)?,
            DeviceChoice::Efa => self
                .efa
                .as_ref()
                .ok_or_else(|| DeviceError::Config("efa domain without a device".into()))?
                .open(spec)?,
        };
        Ok(maybe_fault(dev, p))
    }

    /// `None` for udp, shm and an auto domain without an RDMA device: udp
    /// pushes long messages and shm reads them with `process_vm_readv`,
    /// neither needs a registration, so their domains keep no registration
    /// cache (see [`crate::regcache`]). The verbs or EFA protection domain
    /// registers (verbs, efa, and auto on a host with an RDMA device).
    fn registrar(&self) -> Option<Box<dyn Registrar>> {
        match self.choice {
            DeviceChoice::Udp | DeviceChoice::Shm => None,
            DeviceChoice::Efa => self.efa.as_ref().and_then(|e| e.registrar()),
            DeviceChoice::Auto | DeviceChoice::Verbs => match &self.efa {
                Some(e) => e.registrar(),
                None => self.verbs.as_ref().and_then(|v| v.registrar()),
            },
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

/// Opens the RDMA device and its protection domain.
fn open_verbs(cfg: &::devices::verbs::VerbsConfig) -> Result<VerbsContext, DeviceError> {
    let ctx = VerbsContext::open(cfg)?;
    crate::log::info(
        crate::log::Subsys::Domain,
        "verbs",
        &format!(
            "verbs domain on {} port {} (netdev {:?}, GID index {}, mtu {}, {} registrations)",
            ctx.device_name(),
            ctx.port(),
            ctx.netdev(),
            ctx.gid_index(),
            ctx.mtu(),
            if ctx.on_demand() { "on-demand (ODP, unpinned)" } else { "pinned" }
        ),
    );
    Ok(ctx)
}

/// Opens the EFA device and its protection domain.
fn open_efa() -> Result<EfaContext, DeviceError> {
    let ctx = EfaContext::open(&crate::info::efa_config())?;
    crate::log::info(
        crate::log::Subsys::Domain,
        "efa",
        &format!("efa domain on {} ({:?})", ctx.device_name(), ctx.limits()),
    );
    Ok(ctx)
}

/// Shared memory to local peers, an SRD queue pair (when the domain has an
/// EFA device) or else a UD queue pair (when it has an RDMA device) to remote
/// peers that have one, and UDP to the rest; without the shared-memory half
/// the endpoint is network-only and its address says so.
///
/// A queue pair that cannot be created (EFA limits queue pairs per NIC, so
/// the endpoints past the limit get none) leaves this endpoint on UDP
/// alone, loudly (a warning that says why and what it means). Addresses
/// stay consistent across the job: this endpoint's address carries no
/// queue pair (it is built from the device's `local_addrs`), and a peer
/// routes over SRD/UD only when both addresses carry one
/// ([`crate::addr::RdmxAddr::route`]), so both sides of every pair agree on
/// UDP, on which the engine retransmits (UDP's caps are unreliable). Such
/// an endpoint is slower, not broken; failing its open instead would fail
/// a job for a resource limit that UDP gets around.
fn open_auto(
    bind: SocketAddr,
    mtu: usize,
    spec: &OpenSpec,
    verbs: Option<&VerbsContext>,
    efa: Option<&EfaContext>,
) -> Result<Box<dyn Device>, DeviceError> {
    let mut udp_cfg = UdpConfig::new(bind);
    udp_cfg.mtu = mtu;
    let udp = UdpDevice::open(&udp_cfg)?;
    let rdma: Option<Box<dyn Device>> = match (efa, verbs) {
        (Some(e), _) => match e.open_device(spec) {
            Ok(d) => Some(Box::new(d)),
            Err(err) => {
                crate::log::warn(
                    crate::log::Subsys::EpCtrl,
                    "open_auto",
                    &format!(
                        "this endpoint has no EFA SRD queue pair on {} ({err}; EFA limits queue pairs per NIC, so too many endpoints on this host can hit it): its address carries none, so every remote peer reaches it, and it them, over UDP (unreliable, resent by rdmx, slower); FI_RDMX_DEVICE=efa fails such an endpoint instead",
                        e.device_name()
                    ),
                );
                None
            }
        },
        (None, Some(v)) => match v.open_device(spec) {
            Ok(d) => Some(Box::new(d)),
            Err(e) => {
                crate::log::warn(
                    crate::log::Subsys::EpCtrl,
                    "open_auto",
                    &format!("no UD queue pair ({e}); remote peers over UDP"),
                );
                None
            }
        },
        (None, None) => None,
    };
    let ud = rdma;
    let net: Box<dyn Device> = match ud {
        Some(ud) => Box::new(NetPair::new(ud, Box::new(udp))?),
        None => Box::new(udp),
    };
    let shm = ShmDevice::open(&shm_config(spec.incarnation)).ok();
    if shm.is_none() {
        crate::log::warn(
            crate::log::Subsys::EpCtrl,
            "open_auto",
            "shared memory unavailable; this endpoint uses the network only",
        );
    }
    Ok(Box::new(AutoDevice::new(shm, Some(net))?))
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
            &format!(
                "fault injection on: drop {}% dup {}% reorder {}% corrupt {}% (seed {})",
                cfg.drop_pct, cfg.dup_pct, cfg.reorder_pct, cfg.corrupt_pct, cfg.seed
            ),
        );
        Box::new(FaultDevice::new(dev, cfg))
    } else {
        dev
    }
}
