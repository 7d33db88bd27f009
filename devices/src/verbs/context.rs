//! Discovery for the verbs device: which RDMA device, port and GID a
//! [`VerbsConfig`] names (sysfs, the GID table, the netdev's addresses), and
//! the context a domain's endpoints and registrars share (the open device,
//! its protection domain and limits). Apart from the queue pairs: it runs
//! once per domain, off every data path.
//!
//! Unsafe here: opening and querying the device (attributes, GIDs), its protection domain; `Send`/`Sync` for it.
#![allow(unsafe_code)]

use super::{VerbsConfig, VerbsDevice, RC_RD_ATOMIC};
use crate::ib::{last_err, query_port, DeviceList, OpenDev, PdRegistrar, ProtectionDomain};
use rdm::device::{Device, DeviceContext, DeviceError, OpenSpec, Registrar};
use rdma_core_sys as ib;
use std::net::IpAddr;
use std::ptr;
use std::sync::Arc;

/// Bytes of an `ibv_mtu` value (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5).
fn mtu_bytes(m: ib::ibv_mtu) -> usize {
    if (1..=5).contains(&m) {
        128 << m
    } else {
        256
    }
}

const SYSFS_IB: &str = "/sys/class/infiniband";

fn sysfs(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

/// Netdevs of an RDMA device's port: the GID table's (RoCE: rxe has only
/// these) and the PCI device's (`device/net`, e.g. IPoIB).
fn port_netdevs(dev: &str, port: u8, gid_tbl_len: usize) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..gid_tbl_len {
        if let Some(n) = sysfs(&format!("{SYSFS_IB}/{dev}/ports/{port}/gid_attrs/ndevs/{i}")) {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(format!("{SYSFS_IB}/{dev}/device/net")) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// One usable GID table entry.
#[derive(Clone, Debug)]
struct GidEntry {
    index: u8,
    gid: [u8; 16],
    roce_v2: bool,
    ndev: Option<String>,
}

fn ipv4_mapped(gid: &[u8; 16]) -> Option<std::net::Ipv4Addr> {
    (gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff)
        .then(|| std::net::Ipv4Addr::new(gid[12], gid[13], gid[14], gid[15]))
}

fn gid_matches_ip(gid: &[u8; 16], ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => ipv4_mapped(gid) == Some(*v4),
        IpAddr::V6(v6) => v6.octets() == *gid,
    }
}

/// The best GID of `entries` for `netdev` / `ips`: RoCE v2, the address
/// asked for, IPv4-mapped, not link-local, in that order of importance.
fn rank_gid<'a>(entries: &'a [GidEntry], netdev: Option<&str>, ips: &[IpAddr]) -> Option<&'a GidEntry> {
    entries.iter().filter(|e| netdev.is_none() || e.ndev.is_none() || e.ndev.as_deref() == netdev).min_by_key(|e| {
        let link_local = e.gid[0] == 0xfe && e.gid[1] & 0xc0 == 0x80;
        (
            !e.roce_v2,
            !ips.iter().any(|ip| gid_matches_ip(&e.gid, ip)),
            ipv4_mapped(&e.gid).is_none(),
            link_local,
            e.index == 0,
            e.index,
        )
    })
}

/// What the configuration asks for.
enum Want {
    /// An RDMA device by name.
    Device(String),
    /// The device of a netdev, preferring the GIDs of these addresses.
    Netdev(String, Vec<IpAddr>),
    /// The first active port.
    Any,
}

fn want_of(cfg: &VerbsConfig) -> Result<(Want, bool), DeviceError> {
    match cfg.iface.as_deref() {
        Some(s) => {
            if let Ok(ip) = s.parse::<IpAddr>() {
                let a = crate::iface::local_addrs()
                    .into_iter()
                    .find(|a| a.ip == ip)
                    .ok_or_else(|| DeviceError::Config(format!("verbs: no netdev has the address {ip}")))?;
                return Ok((Want::Netdev(a.name, vec![ip]), true));
            }
            if std::path::Path::new(&format!("{SYSFS_IB}/{s}")).exists() {
                return Ok((Want::Device(s.to_owned()), true));
            }
            let ips = crate::iface::addrs_of(s, true).unwrap_or_default();
            if nix::net::if_::if_nametoindex(s).is_err() {
                return Err(DeviceError::Config(format!("verbs: {s:?} is neither an RDMA device nor a netdev")));
            }
            Ok((Want::Netdev(s.to_owned(), ips), true))
        }
        None => {
            let c = crate::iface::default_choice(true);
            Ok(match c.iface {
                Some(n) => (Want::Netdev(n, vec![c.ip]), false),
                None => (Want::Any, false),
            })
        }
    }
}

fn gid_entries(ctx: *mut ib::ibv_context, dev: &str, port: u8, tbl_len: usize) -> Vec<GidEntry> {
    let mut out = Vec::new();
    for i in 0..tbl_len.min(256) {
        let ty = sysfs(&format!("{SYSFS_IB}/{dev}/ports/{port}/gid_attrs/types/{i}"));
        let mut gid = ib::ibv_gid::default();
        // SAFETY: an open context and a valid out-pointer.
        if unsafe { ib::ibv_query_gid(ctx, port, i as i32, &mut gid) } != 0 {
            continue;
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        let raw = unsafe { gid.raw };
        if raw.iter().all(|&b| b == 0) {
            continue;
        }
        let ndev = sysfs(&format!("{SYSFS_IB}/{dev}/ports/{port}/gid_attrs/ndevs/{i}"));
        out.push(GidEntry { index: i as u8, gid: raw, roce_v2: ty.as_deref() == Some("RoCE v2"), ndev });
    }
    out
}

/// The context shared by a domain's endpoints and registrars.
pub(super) struct Ctx {
    pub(super) ctx: *mut ib::ibv_context,
    pub(super) pd: *mut ib::ibv_pd,
    pub(super) name: String,
    pub(super) port: u8,
    pub(super) netdev: Option<String>,
    /// The GID this context's endpoints send from (zeros on InfiniBand).
    pub(super) gid: [u8; 16],
    pub(super) gid_index: u8,
    pub(super) lid: u16,
    /// InfiniBand link layer: address handles carry the LID, no GRH.
    pub(super) infiniband: bool,
    pub(super) mtu: usize,
    /// The port's active MTU as an `ibv_mtu` value (RC path MTU).
    pub(super) mtu_enum: u8,
    /// Largest message (one RDMA read) the port takes.
    pub(super) max_msg: u64,
    /// RDMA reads a QP may have outstanding as initiator / as responder.
    pub(super) rd_atomic: u8,
    pub(super) max_ah: usize,
    pub(super) max_qp_wr: u32,
    pub(super) max_cqe: u32,
    /// The device pages in registered memory on demand for what rdmx does
    /// with it (RC RDMA read as requester and responder, UD sends gathered
    /// from it): registrations need not pin (see [`odp_offered`]).
    pub(super) odp: bool,
    pub(super) cfg: VerbsConfig,
}

/// Whether the device's ODP capabilities cover what rdmx registers
/// application memory for: RDMA reads of it and into it over RC, and UD
/// sends gathered from it. Implicit ODP is not needed.
pub fn odp_offered(general: u64, rc: u32, ud: u32) -> bool {
    let read = ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_READ;
    let send = ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_SEND;
    general & ib::ibv_odp_general_caps_IBV_ODP_SUPPORT as u64 != 0 && rc & read != 0 && ud & send != 0
}

// SAFETY: libibverbs objects may be used from any thread (every verb is
// thread-safe); the raw pointers are owned by this object.
unsafe impl Send for Ctx {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for Ctx {}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: every queue, MR and AH of the PD belonged to devices and
        // registrars holding an Arc of this context: all dropped before it.
        unsafe {
            ib::ibv_dealloc_pd(self.pd);
            ib::ibv_close_device(self.ctx);
        }
    }
}

/// A domain's verbs device: one RDMA port and one protection domain.
#[derive(Clone)]
pub struct VerbsContext {
    inner: Arc<Ctx>,
}

impl std::fmt::Debug for VerbsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsContext")
            .field("device", &self.inner.name)
            .field("port", &self.inner.port)
            .field("netdev", &self.inner.netdev)
            .field("gid_index", &self.inner.gid_index)
            .field("mtu", &self.inner.mtu)
            .finish()
    }
}

impl VerbsContext {
    /// Whether this host has any RDMA device (opens none).
    pub fn available() -> bool {
        DeviceList::get().n > 0
    }

    /// Finds the device and port (see the module docs), opens it and
    /// allocates the protection domain.
    pub fn open(cfg: &VerbsConfig) -> Result<VerbsContext, DeviceError> {
        let (want, explicit) = want_of(cfg)?;
        let list = DeviceList::get();
        if list.n == 0 {
            return Err(DeviceError::Config("verbs: no RDMA device on this host".into()));
        }
        let found = Self::find(&list, &want)?;
        let found = match (found, &want, explicit) {
            (Some(f), _, _) => f,
            // The default netdev has no RDMA device: any active port will do.
            (None, Want::Netdev(..), false) => Self::find(&list, &Want::Any)?
                .ok_or_else(|| DeviceError::Config("verbs: no active RDMA port".into()))?,
            (None, Want::Netdev(n, _), true) => {
                return Err(DeviceError::Config(format!("verbs: no active RDMA port on netdev {n:?}")))
            }
            (None, Want::Device(d), _) => {
                return Err(DeviceError::Config(format!("verbs: RDMA device {d:?} has no active port")))
            }
            (None, Want::Any, _) => return Err(DeviceError::Config("verbs: no active RDMA port".into())),
        };
        let mut found = found;
        found.cfg = cfg.clone();
        Ok(VerbsContext { inner: Arc::new(found) })
    }

    fn find(list: &DeviceList, want: &Want) -> Result<Option<Ctx>, DeviceError> {
        for i in 0..list.n {
            let name = list.name(i);
            if let Want::Device(d) = want {
                if *d != name {
                    continue;
                }
            }
            // SAFETY: a device of the live list.
            let dev = OpenDev(unsafe { ib::ibv_open_device(list.device(i)) });
            if dev.0.is_null() {
                continue;
            }
            // Verbs UD does not work on an EFA device (its CQs need a
            // completion channel EFA refuses without CQ notifications, and
            // it rejects unsignaled sends): EFA is the efa device's.
            if crate::efa::is_efa_device(dev.0) {
                if let Want::Device(d) = want {
                    return Err(DeviceError::Config(format!(
                        "verbs: {d:?} is an EFA device, on which verbs UD does not work (FI_RDMX_DEVICE=efa uses it)"
                    )));
                }
                continue;
            }
            let mut dattr = ib::ibv_device_attr::default();
            // SAFETY: an open context and a valid out-pointer.
            if unsafe { ib::ibv_query_device(dev.0, &mut dattr) } != 0 {
                continue;
            }
            let mut xattr = ib::ibv_device_attr_ex::default();
            // SAFETY: an open context, no input, a valid out-pointer; a
            // failure (an old kernel) leaves the caps zero: no ODP.
            let odp = unsafe { ib::ibv_query_device_ex(dev.0, ptr::null(), &mut xattr) } == 0 && {
                let c = &xattr.odp_caps;
                odp_offered(c.general_caps, c.per_transport_caps.rc_odp_caps, c.per_transport_caps.ud_odp_caps)
            };
            for port in 1..=dattr.phys_port_cnt {
                let Some(pattr) = query_port(dev.0, port) else { continue };
                if pattr.state != ib::ibv_port_state_IBV_PORT_ACTIVE {
                    continue;
                }
                let tbl = pattr.gid_tbl_len.max(0) as usize;
                let netdevs = port_netdevs(&name, port, tbl);
                let (netdev, ips) = match want {
                    Want::Netdev(n, ips) => {
                        if !netdevs.contains(n) {
                            continue;
                        }
                        (Some(n.clone()), ips.clone())
                    }
                    _ => (netdevs.first().cloned(), Vec::new()),
                };
                let infiniband = pattr.link_layer == ib::IBV_LINK_LAYER_INFINIBAND as u8;
                let (gid, gid_index) = if infiniband {
                    ([0u8; 16], 0)
                } else {
                    let entries = gid_entries(dev.0, &name, port, tbl);
                    let ips = if ips.is_empty() {
                        netdev.as_deref().and_then(|n| crate::iface::addrs_of(n, true).ok()).unwrap_or_default()
                    } else {
                        ips
                    };
                    match rank_gid(&entries, netdev.as_deref(), &ips) {
                        Some(e) => (e.gid, e.index),
                        None => continue,
                    }
                };
                // SAFETY: an open context.
                let pd = unsafe { ib::ibv_alloc_pd(dev.0) };
                if pd.is_null() {
                    return Err(last_err("ibv_alloc_pd"));
                }
                let ctx = dev.0;
                std::mem::forget(dev);
                return Ok(Some(Ctx {
                    ctx,
                    pd,
                    name,
                    port,
                    netdev,
                    gid,
                    gid_index,
                    lid: if infiniband { pattr.lid } else { 0 },
                    infiniband,
                    mtu: mtu_bytes(pattr.active_mtu),
                    mtu_enum: pattr.active_mtu as u8,
                    max_msg: if pattr.max_msg_sz == 0 { 1 << 30 } else { pattr.max_msg_sz as u64 },
                    rd_atomic: dattr.max_qp_rd_atom.min(dattr.max_qp_init_rd_atom).clamp(1, RC_RD_ATOMIC as i32) as u8,
                    max_ah: dattr.max_ah.max(1) as usize,
                    max_qp_wr: dattr.max_qp_wr.max(1) as u32,
                    max_cqe: dattr.max_cqe.max(1) as u32,
                    odp,
                    cfg: VerbsConfig::default(),
                }));
            }
        }
        Ok(None)
    }

    /// The RDMA device's name (`rxe0`, `mlx5_0`).
    pub fn device_name(&self) -> &str {
        &self.inner.name
    }
    pub fn port(&self) -> u8 {
        self.inner.port
    }
    /// The netdev of the port, where it has one.
    pub fn netdev(&self) -> Option<&str> {
        self.inner.netdev.as_deref()
    }
    /// The GID endpoints send from (zeros on InfiniBand).
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }
    pub fn gid_index(&self) -> u8 {
        self.inner.gid_index
    }
    /// The port's LID on InfiniBand, 0 on RoCE.
    pub fn lid(&self) -> u16 {
        self.inner.lid
    }
    /// The port's active MTU in bytes: the largest UD payload.
    pub fn mtu(&self) -> usize {
        self.inner.mtu
    }

    /// Application memory is registered on demand (ODP, no pinning).
    pub fn on_demand(&self) -> bool {
        self.inner.on_demand()
    }

    /// Opens one endpoint's queue pair.
    pub fn open_device(&self, spec: &OpenSpec) -> Result<VerbsDevice, DeviceError> {
        VerbsDevice::open(self.inner.clone(), spec)
    }
}

impl DeviceContext for VerbsContext {
    fn open(&self, spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError> {
        Ok(Box::new(self.open_device(spec)?))
    }

    fn registrar(&self) -> Option<Box<dyn Registrar>> {
        Some(Box::new(PdRegistrar::new(self.inner.clone())))
    }
}

impl ProtectionDomain for Ctx {
    fn pd(&self) -> *mut ib::ibv_pd {
        self.pd
    }
    fn on_demand(&self) -> bool {
        self.odp && self.cfg.odp == Some(true)
    }
}
