//! The verbs UD device: one unreliable-datagram queue pair per endpoint over
//! libibverbs (Soft-RoCE, RoCE NICs, InfiniBand HCAs).
//!
//! # API (for the provider's integration)
//!
//! * [`VerbsConfig`] `{ iface, ah_cache, sq_depth, rq_depth }`: `iface` names a
//!   netdev (`"eth0"`, `"dummy0"`), an RDMA device (`"rxe0"`, `"mlx5_0"`) or an
//!   IP address of a netdev (picks the RoCE v2 GID of that address); `None`:
//!   the RDMA device whose netdev the UDP device would choose
//!   ([`crate::iface::default_choice`]), else the first active port of any
//!   device. EFA devices are skipped (a named one is a `Config` error):
//!   verbs UD does not work on them, [`crate::efa`] does. `ah_cache` 0 = the device's `max_ah` capped at
//!   [`DEFAULT_AH_CACHE`]; the depths 0 = the defaults.
//! * [`VerbsContext::open`]`(&VerbsConfig) -> Result<VerbsContext, DeviceError>`:
//!   one per libfabric domain. Opens the device and one protection domain
//!   (shared, through an `Arc`, by every queue it opens and by its
//!   registrars). Implements [`DeviceContext`]: `open(&OpenSpec)` gives a
//!   `Box<dyn Device>` ([`VerbsContext::open_device`] gives the concrete
//!   [`VerbsDevice`], which has `stats`); `registrar()` is always `Some`.
//!   [`VerbsContext::available`]`()` says whether any RDMA device exists
//!   (cheap: lists devices, opens none). Accessors: `device_name()`,
//!   `port()`, `netdev()`, `gid()`, `gid_index()`, `lid()`, `mtu()`.
//! * [`VerbsDevice`] implements [`Device`]: caps = unreliable, unordered,
//!   `mtu` = the port's active MTU in bytes, `remote_read` true unless
//!   `rc_max_peers` is `Some(0)` (UD cannot read: reads go through RC queue
//!   pairs made lazily per peer, see "Remote reads" below), `gso` false,
//!   `registration` true, `max_inline` = the QP's `max_inline_data`. `wait_fd` is the
//!   completion channel's fd (non-blocking): call `prepare_wait` before each
//!   sleep. `poll_unreachable` reports destinations whose send completed in
//!   error or whose address handle could not be created.
//! * Address: `DevAddr::Raw(RawAddr)` of family [`RawAddr::FAMILY_VERBS_UD`],
//!   22 bytes = GID (16, network order as in the GID table) ++ QPN (u32 LE)
//!   ++ LID (u16 LE). On RoCE the LID is 0; on InfiniBand (no GRH) the GID is
//!   all zeros and the LID names the port. [`ud_addr`]`(gid, qpn, lid)` builds
//!   one, [`parse_ud_addr`]`(&DevAddr) -> Option<([u8; 16], u32, u16)>` reads
//!   one back (`None` for any other family or length). The Q_Key is not in
//!   the address: every endpoint of a job derives the same one from
//!   `OpenSpec::job_key` ([`qkey_for`]); the NIC drops other jobs' packets.
//! * Registration: the registrar's `register(addr, len, access)` takes
//!   libfabric access bits ([`FI_READ`], [`FI_WRITE`], [`FI_RECV`],
//!   [`FI_SEND`], [`FI_REMOTE_READ`], [`FI_REMOTE_WRITE`], the values of
//!   `rdma/fabric.h`) and returns the key `(rkey as u64) << 32 | lkey as u64`;
//!   [`mr_keys`]`(key) -> (lkey, rkey)` splits it. A [`LocalBuf`] of a local
//!   read target carries this key (the device takes the low half); a peer's
//!   remote read names the high half. `deregister(key)` takes the same key.
//!   Registrations are of the context's PD, valid on every queue it opens.
//! * Transmit: a datagram goes inline (up to `max_inline`) or is copied into
//!   a registered bounce slot (`stats.bounce_copies`) that stays the send's
//!   until its completion; never straight from the caller's buffer, which
//!   the endpoint rewrites as soon as `send_batch` returns while the NIC
//!   reads a request's bytes later (lent transmit buffers were sent from in
//!   place until that race was found: the device lends none now). Only a
//!   gathered part, application memory valid until its message completes,
//!   is sent in place.
//! * [`VerbsDevice`] extras: `pub stats: VerbsStats` (sent, received,
//!   inline / bounced / gathered sends, `sq_full`, send and receive errors,
//!   AH created / evicted / overflow / failed, `qp_recoveries`), `qpn()`,
//!   `qkey()`, `outstanding()` (sends not yet covered by a completion),
//!   `ah_cache_len()`, `ah_cache_cap()`. Helpers: [`ibv_access`] (libfabric
//!   bits to `IBV_ACCESS_*`), [`mr_key`], [`grh_source_gid`]; constants
//!   [`GRH_LEN`], [`UD_ADDR_LEN`], [`DEFAULT_AH_CACHE`],
//!   [`DEFAULT_SQ_DEPTH`], [`DEFAULT_RQ_DEPTH`], [`SIGNAL_EVERY`].
//! * Errors: a send completion in error puts its destination on
//!   `poll_unreachable` and brings the QP back (SQE -> RTS, or RESET ->
//!   RTS with every receive reposted after ERR). Soft-RoCE drops datagrams
//!   to unroutable GIDs silently (no error to report). Soft-RoCE (Linux 6.1)
//!   on one host cannot carry datagrams between two of its devices (rxe0 ->
//!   rxe1 loops back into rxe0): endpoints of one host share a device there.
//!
//! # How it works
//!
//! Sends are posted as one chain of work requests per `send_batch` (one
//! `ibv_post_send`); every [`SIGNAL_EVERY`]th one and the last of each chain
//! asks for a completion, and a completion covers every earlier request of
//! the send queue, so the device knows how many requests are outstanding and
//! takes only as many datagrams as fit (a short count is back-pressure). The
//! address handle and bounce slot of a request are released when a
//! completion covers it, never before: an address handle the send queue
//! still uses is not destroyed by the cache's eviction.
//!
//! Receives land in a pool of registered slots of GRH + MTU bytes, each
//! posted once; `recv_batch` lends the payload (after the 40-byte GRH) and
//! reposts the slots in one chain. The source of a datagram is the GRH's
//! source GID (RoCE; RoCE v2 over IPv4 carries an IPv4 header in the GRH's
//! last 20 bytes, recognised as rdma-core's `ibv_init_ah_from_wc` does) with
//! the completion's source QPN, or the completion's source LID on
//! InfiniBand.
//!
//! # Remote reads
//!
//! A rendezvous receiver reads the sender's registered memory by RDMA read
//! on a reliable connected (RC) queue pair to that peer. Which peers have
//! one, the handshake that connects it (carried by the endpoint over the
//! reliable UD stream: [`RemoteReads::poll_control`] / [`RemoteReads::handle_control`])
//! and the LRU bound live in the sans-IO [`rdm::device::rc::ConnTable`]; this device
//! is its queue factory (create + INIT with remote read access, RTR/RTS to
//! the peer's QPN, PSN and GID; retire = to ERR, destroyed once its posted
//! requests have flushed). `post_read` posts one signaled RDMA read per
//! piece of at most the port's `max_msg_sz`, all at once (up to
//! [`RC_SQ_DEPTH`] per connection); no connection yet or no room answers
//! `NotConnected` and the sender pushes that message. Read completions land
//! on one CQ shared by every connection, on the receive CQ's channel, so a
//! sleeper wakes for them. A read with any failed request breaks its
//! connection and completes `NotConnected` (pushed instead).
#![allow(unsafe_code)]

/// Memory keys, access bits and Q_Keys, as the verbs device builds them (shared with EFA: [`crate::ib`]).
pub use crate::ib::{
    ibv_access, mr_key, mr_keys, qkey_for, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_SEND, FI_WRITE,
};
use crate::ib::{
    last_err, nonblocking_channel, query_port, ret_err, AhError, BounceSlots, DeviceList, OpenDev, PdRegistrar,
    ProtectionDomain, ReceiveSlots,
};
use rdm::device::rc::{ConnStats, ConnTable, QueueFactory, QueueInfo};
use rdm::device::{
    ControlMsg, DevAddr, Device, DeviceCaps, DeviceContext, DeviceError, OpenSpec, RawAddr, ReadRun, Registrar,
    RemoteReads, TxDatagram,
};
use rdm::Instant;
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;

/// Bytes the NIC writes before the payload of every UD receive.
pub const GRH_LEN: usize = 40;
/// Length of a verbs UD address: GID 16 + QPN 4 + LID 2.
pub const UD_ADDR_LEN: usize = 22;
/// Address handles cached per endpoint at most (fewer where the device's
/// `max_ah` is smaller).
pub const DEFAULT_AH_CACHE: usize = 1024;
/// Send queue depth asked for by default.
pub const DEFAULT_SQ_DEPTH: u32 = 256;
/// Receive slots posted by default (each GRH + MTU bytes).
pub const DEFAULT_RQ_DEPTH: u32 = 512;
/// Every this many sends one asks for a completion.
pub const SIGNAL_EVERY: u32 = 32;
/// Inline data asked for at QP creation (the provider may give more or less).
const REQ_INLINE: u32 = 256;
/// Completions polled per `ibv_poll_cq`.
const POLL_BATCH: usize = 32;
/// Hop limit of the GRH of RoCE address handles (libfabric verbs dgram's).
const HOP_LIMIT: u8 = 64;
/// Reliable connections (RC queue pairs) for reads kept per endpoint by
/// default, each way.
pub const DEFAULT_RC_MAX_PEERS: usize = 64;
/// A read none of whose pieces completed for this long is given up (see
/// `give_up_stuck_reads`): far beyond what the RC retries take to report a
/// dead path (7 retries of the 67 ms ACK timeout) and a 4 MiB read on a lossy
/// emulated link.
pub const RC_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// A connection no read used for this long is closed.
pub const RC_IDLE: std::time::Duration = std::time::Duration::from_secs(30);
/// Send queue depth of each RC queue pair: RDMA reads posted at once to one
/// peer (beyond it the message is pushed).
pub const RC_SQ_DEPTH: u32 = 128;
/// Smallest piece a large RDMA read is cut into (see `post_read`).
pub const RC_READ_PIECE: u64 = 1 << 20;
/// A read larger than this many `RC_READ_PIECE`s is cut into this many
/// pieces (so a 64 MiB read takes a quarter of a connection's queue).
pub const RC_READ_PIECES_MAX: u64 = 32;
/// RDMA reads in flight per queue pair asked for (fewer where the device
/// allows fewer).
const RC_RD_ATOMIC: u8 = 16;
/// Completions the shared RC completion queue holds: reads in flight on
/// all connections together.
const RC_CQ_DEPTH: u32 = 4096;
/// RC timers: local ACK timeout 4.096 us * 2^14 (67 ms), 7 retries, RNR
/// retry 7 (infinite).
const RC_TIMEOUT: u8 = 14;
const RC_RETRY: u8 = 7;

/// A verbs UD address (see the module docs for the layout).
pub fn ud_addr(gid: [u8; 16], qpn: u32, lid: u16) -> DevAddr {
    let mut b = [0u8; UD_ADDR_LEN];
    b[..16].copy_from_slice(&gid);
    b[16..20].copy_from_slice(&qpn.to_le_bytes());
    b[20..22].copy_from_slice(&lid.to_le_bytes());
    // 22 bytes always fit a RawAddr (RAW_ADDR_MAX is 28).
    DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_VERBS_UD, &b).expect("22 <= RAW_ADDR_MAX"))
}

/// `(gid, qpn, lid)` of a verbs UD address; `None` for anything else.
pub fn parse_ud_addr(addr: &DevAddr) -> Option<([u8; 16], u32, u16)> {
    let DevAddr::Raw(r) = addr else { return None };
    if r.family() != RawAddr::FAMILY_VERBS_UD || r.bytes().len() != UD_ADDR_LEN {
        return None;
    }
    let b = r.bytes();
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[..16]);
    Some((gid, u32::from_le_bytes([b[16], b[17], b[18], b[19]]), u16::from_le_bytes([b[20], b[21]])))
}

/// The source GID a UD receive's GRH area names: RoCE v2 over IPv4 puts an
/// IPv4 header in the last 20 bytes (recognised as rdma-core's
/// `get_grh_header_version` does: not IPv6 version, or IHL 5 with a valid
/// checksum), else it is a GRH proper (IB, RoCE v1, RoCE v2 over IPv6).
pub fn grh_source_gid(grh: &[u8]) -> [u8; 16] {
    let mut gid = [0u8; 16];
    if grh.len() < GRH_LEN {
        return gid;
    }
    let ip4 = &grh[20..40];
    let v4 = if grh[0] >> 4 != 6 {
        ip4[0] >> 4 == 4
    } else if ip4[0] & 0xf != 5 {
        false
    } else {
        let mut sum: u32 = ip4.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum == 0xffff
    };
    if v4 {
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..16].copy_from_slice(&ip4[12..16]);
    } else {
        gid.copy_from_slice(&grh[8..24]);
    }
    gid
}

/// Bytes of an `ibv_mtu` value (IBV_MTU_256 = 1 .. IBV_MTU_4096 = 5).
fn mtu_bytes(m: ib::ibv_mtu) -> usize {
    if (1..=5).contains(&m) {
        128 << m
    } else {
        256
    }
}

/// Links `wrs` into one chain for `ibv_post_send`, request `i` gathering
/// from `sges[per * i..]` (a request with `num_sge` 0 names none). Call after
/// the last push: the vectors must not move while the chain is posted.
fn link_send_chain(wrs: &mut [ib::ibv_send_wr], sges: &mut [ib::ibv_sge], per: usize) {
    let n = wrs.len();
    for i in 0..n {
        if wrs[i].num_sge > 0 {
            wrs[i].sg_list = &mut sges[per * i];
        }
        if i + 1 < n {
            let next: *mut ib::ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
    }
}

/// How many requests of a chain `ibv_post_send` took before `bad`, the
/// first it refused (null: none was taken).
fn posted_before(bad: *const ib::ibv_send_wr, wrs: &[ib::ibv_send_wr]) -> usize {
    if bad.is_null() {
        0
    } else {
        (bad as usize - wrs.as_ptr() as usize) / std::mem::size_of::<ib::ibv_send_wr>()
    }
}

/// How to open a [`VerbsContext`].
#[derive(Clone, Debug, Default)]
pub struct VerbsConfig {
    /// A netdev, an RDMA device or an IP address of a netdev; `None`: see
    /// the module docs.
    pub iface: Option<String>,
    /// Address handles cached per endpoint (0: the default). A test knob as
    /// much as a tuning one: a send never fails because the cache is full.
    pub ah_cache: usize,
    /// Send queue depth (0: [`DEFAULT_SQ_DEPTH`]).
    pub sq_depth: u32,
    /// Receive slots (0: [`DEFAULT_RQ_DEPTH`]).
    pub rq_depth: u32,
    /// Reliable connections for rendezvous reads kept per endpoint, each
    /// way (`FI_RDMX_RC_MAX_PEERS`; `None`: [`DEFAULT_RC_MAX_PEERS`];
    /// `Some(0)`: none, every long message is pushed over UD).
    pub rc_max_peers: Option<usize>,
    /// A read no completion answered in this long is given up (its message
    /// pushed) and its connection broken (`None`: [`RC_READ_TIMEOUT`]).
    pub rc_read_timeout: Option<std::time::Duration>,
    /// Register application memory on demand (`IBV_ACCESS_ON_DEMAND`: no
    /// pinning) where the device offers ODP for RC reads and UD sends
    /// (`FI_RDMX_VERBS_ODP`; `Some(true)`: where offered; `None` or
    /// `Some(false)`: never). Off unless asked for: the one ODP device it
    /// was tried on (Soft-RoCE in Debian's 7.3 kernel) read and wrote the
    /// wrong bytes of any transfer not aligned to a page (measured,
    /// `benches/results/2026-11-26-odp-probe`), and MPI buffers are not.
    pub odp: Option<bool>,
}

// ---- discovery ----

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
struct Ctx {
    ctx: *mut ib::ibv_context,
    pd: *mut ib::ibv_pd,
    name: String,
    port: u8,
    netdev: Option<String>,
    /// The GID this context's endpoints send from (zeros on InfiniBand).
    gid: [u8; 16],
    gid_index: u8,
    lid: u16,
    /// InfiniBand link layer: address handles carry the LID, no GRH.
    infiniband: bool,
    mtu: usize,
    /// The port's active MTU as an `ibv_mtu` value (RC path MTU).
    mtu_enum: u8,
    /// Largest message (one RDMA read) the port takes.
    max_msg: u64,
    /// RDMA reads a QP may have outstanding as initiator / as responder.
    rd_atomic: u8,
    max_ah: usize,
    max_qp_wr: u32,
    max_cqe: u32,
    /// The device pages in registered memory on demand for what rdmx does
    /// with it (RC RDMA read as requester and responder, UD sends gathered
    /// from it): registrations need not pin (see [`odp_offered`]).
    odp: bool,
    cfg: VerbsConfig,
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

// ---- the endpoint's queue pair ----

/// Counters of one [`VerbsDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct VerbsStats {
    pub sent: u64,
    pub received: u64,
    /// Sends whose payload went inline (`IBV_SEND_INLINE`).
    pub inline_sends: u64,
    /// Sends copied into a registered bounce slot first.
    pub bounce_copies: u64,
    /// Sends whose payload the NIC gathered from registered application
    /// memory (the windowed rendezvous push, zero-copy).
    pub gathered_sends: u64,
    /// Gathered sends that failed locally (their memory's registration was
    /// gone): dropped, not blamed on the peer.
    pub gathered_send_errors: u64,
    /// `send_batch` calls cut short by a full send queue.
    pub sq_full: u64,
    /// Send completions in error (their destinations go to
    /// [`Device::poll_unreachable`]).
    pub send_errors: u64,
    /// Receive completions in error, or too short to hold a GRH.
    pub recv_errors: u64,
    pub ah_created: u64,
    pub ah_evicted: u64,
    /// Address handles created beyond the cache bound because every cached
    /// one was still used by an outstanding send.
    pub ah_overflow: u64,
    /// Address handles that could not be created (destination unreachable).
    pub ah_failed: u64,
    /// Address handles the device refused for want of resources (its own
    /// limit below `max_ah`, memory): the cache evicted one and tried again,
    /// or the send waited (back-pressure), never failed.
    pub ah_refused: u64,
    /// Times the queue pair was brought back from an error state.
    pub qp_recoveries: u64,
    /// RDMA reads posted on RC connections, their requests, the bytes they
    /// brought; reads that failed (pushed instead), reads refused for want
    /// of room in the connection's queue (pushed).
    pub rc_reads: u64,
    pub rc_read_requests: u64,
    pub rc_read_bytes: u64,
    pub rc_read_errors: u64,
    pub rc_reads_deferred: u64,
    /// Reads given up after the read timeout with no completion.
    pub rc_reads_timed_out: u64,
    /// Control bytes that were no handshake message.
    pub rc_bad_control: u64,
    /// The `ibv_wc_status` of the last read request that failed (not
    /// flushed): what broke a connection.
    pub rc_last_error_status: u32,
}

type AhKey = ([u8; 16], u16);

struct AhEntry {
    ah: *mut ib::ibv_ah,
    last_use: u64,
    /// Posted sends using it that no completion has covered yet.
    inflight: u32,
}

/// A posted send no completion has covered yet.
struct Inflight {
    seq: u64,
    dst: DevAddr,
    ah: AhKey,
    bounce: Option<u32>,
    /// Part of it is gathered from application memory.
    gathered: bool,
}

/// One endpoint's UD queue pair (see the module docs).
pub struct VerbsDevice {
    ctx: Arc<Ctx>,
    channel: *mut ib::ibv_comp_channel,
    scq: *mut ib::ibv_cq,
    rcq: *mut ib::ibv_cq,
    qp: *mut ib::ibv_qp,
    qpn: u32,
    qkey: u32,
    local: DevAddr,
    mtu: usize,
    max_inline: u16,
    // Receive.
    rx: ReceiveSlots,
    rq_depth: u32,
    /// Receive completions polled by `prepare_wait`, not yet delivered.
    rx_pending: VecDeque<ib::ibv_wc>,
    // Send.
    sq_depth: u32,
    tx_seq: u64,
    since_signal: u32,
    inflight: VecDeque<Inflight>,
    bounce: BounceSlots,
    swrs: Vec<ib::ibv_send_wr>,
    ssges: Vec<ib::ibv_sge>,
    wcs: Vec<ib::ibv_wc>,
    // Address handles.
    ahs: FxHashMap<AhKey, AhEntry>,
    ah_cap: usize,
    ah_clock: u64,
    unreachable: VecDeque<DevAddr>,
    /// A send completed in error: the QP may need bringing back.
    check_qp: bool,
    /// Test hook: the next non-inline send names a wrong memory key.
    corrupt_next_key: bool,
    /// Address handles still to refuse (`refuse_next_ahs_for_test`).
    refuse_ahs: u32,
    // Remote reads through RC queue pairs.
    conns: ConnTable<RcQueue>,
    rc: RcFactory,
    rc_reads: slab::Slab<RcRead>,
    rc_done: VecDeque<rdm::device::ReadDone>,
    /// The endpoint's clock as it last passed it in (`post_read`,
    /// `poll_read`, `handle_control`): the device reads no clock of its own;
    /// reads' progress and the connections' idleness are timed by it.
    now: rdm::time::Instant,
    rc_wrs: Vec<ib::ibv_send_wr>,
    rc_sges: Vec<ib::ibv_sge>,
    pub stats: VerbsStats,
}

/// One end of a connection for reads: an RC queue pair.
pub struct RcQueue {
    qp: *mut ib::ibv_qp,
    qpn: u32,
    psn: u32,
}

/// Makes, connects and retires RC queue pairs ([`ConnTable`]'s factory);
/// counts the reads posted on each so a retired one is destroyed only when
/// its last request has completed (flushed).
struct RcFactory {
    ctx: Arc<Ctx>,
    cq: *mut ib::ibv_cq,
    /// Read requests posted and not completed, per queue pair number.
    outstanding: FxHashMap<u32, u32>,
    /// Requests outstanding on all queue pairs (bounded by the CQ's size).
    total_outstanding: u32,
    /// Queue pairs moved to the error state, waiting for their requests to
    /// flush before they are destroyed.
    retiring: Vec<RcQueue>,
    psn_seed: u64,
    /// Queue pairs made and not yet destroyed (open and retiring ones).
    live: u64,
}

/// A posted read: its requests still to complete and how it went.
struct RcRead {
    id: u64,
    peer: DevAddr,
    wrs_left: u32,
    bytes: u64,
    failed: bool,
    /// When it was posted or a piece of it last completed.
    last_progress: rdm::time::Instant,
    /// Given up on (reported failed) before its requests completed: their
    /// flushes are taken in silently.
    reported: bool,
}

impl RcFactory {
    fn modify(
        qp: *mut ib::ibv_qp,
        attr: &mut ib::ibv_qp_attr,
        mask: ib::ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    fn destroy(q: &RcQueue) {
        // SAFETY: a QP of ours with nothing outstanding, destroyed once.
        unsafe { ib::ibv_destroy_qp(q.qp) };
    }

    /// Destroys the retiring queue pairs whose requests have all completed.
    fn reap_retired(&mut self) {
        let out = &self.outstanding;
        let before = self.retiring.len();
        self.retiring.retain(|q| {
            let busy = out.get(&q.qpn).is_some_and(|&n| n > 0);
            if !busy {
                RcFactory::destroy(q);
            }
            busy
        });
        self.live -= (before - self.retiring.len()) as u64;
    }
}

impl QueueFactory for RcFactory {
    type Queue = RcQueue;

    fn create(&mut self) -> Result<(RcQueue, QueueInfo), DeviceError> {
        let mut init = ib::ibv_qp_init_attr {
            send_cq: self.cq,
            recv_cq: self.cq,
            cap: ib::ibv_qp_cap {
                max_send_wr: RC_SQ_DEPTH.min(self.ctx.max_qp_wr),
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ib::ibv_qp_type_IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: a live PD and CQ; `init` is a valid in/out struct.
        let qp = unsafe { ib::ibv_create_qp(self.ctx.pd, &mut init) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp(RC)"));
        }
        // SAFETY: a live QP.
        let qpn = unsafe { (*qp).qp_num };
        // A PSN of 24 bits, different per queue pair and incarnation.
        self.psn_seed = self.psn_seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407 ^ qpn as u64);
        let q = RcQueue { qp, qpn, psn: (self.psn_seed >> 40) as u32 & 0xff_ffff };
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.ctx.port,
            qp_access_flags: ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            ..Default::default()
        };
        if let Err(e) = Self::modify(
            qp,
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(RC INIT)",
        ) {
            Self::destroy(&q);
            return Err(e);
        }
        let info = QueueInfo { qpn, psn: q.psn, gid: self.ctx.gid, lid: self.ctx.lid, mtu: self.ctx.mtu_enum };
        self.live += 1;
        Ok((q, info))
    }

    fn connect(&mut self, q: &mut RcQueue, remote: &QueueInfo) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut ah = ib::ibv_ah_attr { port_num: self.ctx.port, ..Default::default() };
        if self.ctx.infiniband {
            ah.dlid = remote.lid;
        } else {
            ah.is_global = 1;
            ah.grh.dgid.raw = remote.gid;
            ah.grh.sgid_index = self.ctx.gid_index;
            ah.grh.hop_limit = HOP_LIMIT;
        }
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_RTR,
            path_mtu: self.ctx.mtu_enum.min(remote.mtu).max(1) as ib::ibv_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.ctx.rd_atomic,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        Self::modify(
            q.qp,
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RC RTR)",
        )?;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_RTS,
            timeout: RC_TIMEOUT,
            retry_cnt: RC_RETRY,
            rnr_retry: 7,
            sq_psn: q.psn,
            max_rd_atomic: self.ctx.rd_atomic,
            ..Default::default()
        };
        Self::modify(
            q.qp,
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RC RTS)",
        )
    }

    /// To the error state (the device stops touching memory for it and
    /// flushes what is posted), destroyed once those flushes are taken in.
    fn retire(&mut self, q: RcQueue) {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_ERR, ..Default::default() };
        let _ = Self::modify(q.qp, &mut a, m::IBV_QP_STATE, "ibv_modify_qp(RC ERR)");
        self.retiring.push(q);
        self.reap_retired();
    }
}

// SAFETY: the device owns its verbs objects and buffers; verbs calls are
// thread-safe, and `&mut self` serialises this device's own use.
unsafe impl Send for VerbsDevice {}

impl VerbsDevice {
    fn open(ctx: Arc<Ctx>, spec: &OpenSpec) -> Result<VerbsDevice, DeviceError> {
        let cfg = &ctx.cfg;
        let sq_depth =
            if cfg.sq_depth == 0 { DEFAULT_SQ_DEPTH } else { cfg.sq_depth }.min(ctx.max_qp_wr).min(ctx.max_cqe).max(2);
        let rq_depth =
            if cfg.rq_depth == 0 { DEFAULT_RQ_DEPTH } else { cfg.rq_depth }.min(ctx.max_qp_wr).min(ctx.max_cqe).max(1);
        let ah_cap = if cfg.ah_cache == 0 { DEFAULT_AH_CACHE } else { cfg.ah_cache }.min(ctx.max_ah).max(1);
        let mtu = ctx.mtu;
        let mut dev = VerbsDevice {
            channel: ptr::null_mut(),
            scq: ptr::null_mut(),
            rcq: ptr::null_mut(),
            qp: ptr::null_mut(),
            qpn: 0,
            qkey: qkey_for(spec.job_key),
            local: DevAddr::NONE,
            mtu,
            max_inline: 0,
            rx: ReceiveSlots::new(ctx.pd, GRH_LEN + mtu, rq_depth)?,
            rq_depth,
            rx_pending: VecDeque::new(),
            sq_depth,
            tx_seq: 0,
            since_signal: 0,
            inflight: VecDeque::with_capacity(sq_depth as usize),
            bounce: BounceSlots::new(ctx.pd, mtu, sq_depth)?,
            swrs: Vec::with_capacity(sq_depth as usize),
            ssges: Vec::with_capacity(sq_depth as usize),
            wcs: vec![ib::ibv_wc::default(); POLL_BATCH],
            ahs: FxHashMap::default(),
            ah_cap,
            ah_clock: 0,
            unreachable: VecDeque::new(),
            check_qp: false,
            corrupt_next_key: false,
            refuse_ahs: 0,
            conns: ConnTable::new(cfg.rc_max_peers.unwrap_or(DEFAULT_RC_MAX_PEERS), RC_IDLE, spec.incarnation),
            rc: RcFactory {
                ctx: ctx.clone(),
                cq: ptr::null_mut(),
                outstanding: FxHashMap::default(),
                total_outstanding: 0,
                retiring: Vec::new(),
                psn_seed: spec.incarnation ^ 0x9e37_79b9_7f4a_7c15,
                live: 0,
            },
            rc_reads: slab::Slab::new(),
            rc_done: VecDeque::new(),
            now: rdm::time::Instant::from_nanos(0),
            rc_wrs: Vec::new(),
            rc_sges: Vec::new(),
            stats: VerbsStats::default(),
            ctx,
        };
        // From here on, Drop releases whatever was created.
        dev.channel = nonblocking_channel(dev.ctx.ctx)?;
        // SAFETY: an open context; the channel outlives the CQ (Drop order).
        dev.scq = unsafe { ib::ibv_create_cq(dev.ctx.ctx, sq_depth as i32, ptr::null_mut(), ptr::null_mut(), 0) };
        if dev.scq.is_null() {
            return Err(last_err("ibv_create_cq(send)"));
        }
        // SAFETY: as above.
        dev.rcq = unsafe { ib::ibv_create_cq(dev.ctx.ctx, rq_depth as i32, ptr::null_mut(), dev.channel, 0) };
        if dev.rcq.is_null() {
            return Err(last_err("ibv_create_cq(recv)"));
        }
        if dev.conns.enabled() {
            // One completion queue for the reads of every connection, on
            // the same channel as receives: a sleeper wakes for either.
            // SAFETY: an open context; the channel outlives the CQ.
            dev.rc.cq = unsafe {
                ib::ibv_create_cq(dev.ctx.ctx, RC_CQ_DEPTH.min(dev.ctx.max_cqe) as i32, ptr::null_mut(), dev.channel, 0)
            };
            if dev.rc.cq.is_null() {
                return Err(last_err("ibv_create_cq(rc)"));
            }
        }
        for inline in [REQ_INLINE, 64, 0] {
            let mut init = ib::ibv_qp_init_attr {
                send_cq: dev.scq,
                recv_cq: dev.rcq,
                cap: ib::ibv_qp_cap {
                    max_send_wr: sq_depth,
                    max_recv_wr: rq_depth,
                    max_send_sge: 2,
                    max_recv_sge: 1,
                    max_inline_data: inline,
                },
                qp_type: ib::ibv_qp_type_IBV_QPT_UD,
                sq_sig_all: 0,
                ..Default::default()
            };
            // SAFETY: a live PD and CQs; `init` is a valid in/out struct.
            dev.qp = unsafe { ib::ibv_create_qp(dev.ctx.pd, &mut init) };
            if !dev.qp.is_null() {
                dev.max_inline = init.cap.max_inline_data.min(u16::MAX as u32).min(mtu as u32) as u16;
                break;
            }
        }
        if dev.qp.is_null() {
            return Err(last_err("ibv_create_qp(UD)"));
        }
        // SAFETY: a live QP.
        dev.qpn = unsafe { (*dev.qp).qp_num };
        dev.bring_up()?;
        dev.post_all_receives()?;
        dev.local = ud_addr(dev.ctx.gid, dev.qpn, dev.ctx.lid);
        Ok(dev)
    }

    fn modify(&mut self, attr: &mut ib::ibv_qp_attr, mask: u32, what: &'static str) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(self.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    /// RESET -> INIT (port, P_Key index 0, Q_Key) -> RTR -> RTS.
    fn bring_up(&mut self) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.ctx.port,
            qkey: self.qkey,
            ..Default::default()
        };
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY).0,
            "ibv_modify_qp(INIT)",
        )?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTR, ..Default::default() };
        self.modify(&mut a, m::IBV_QP_STATE.0, "ibv_modify_qp(RTR)")?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTS, sq_psn: 0, ..Default::default() };
        self.modify(&mut a, (m::IBV_QP_STATE | m::IBV_QP_SQ_PSN).0, "ibv_modify_qp(RTS)")
    }

    /// Posts receive slots `slots` as one chain.
    fn post_receives(&mut self, slots: impl Iterator<Item = u32>) -> Result<(), DeviceError> {
        self.rx.post(self.qp, slots)
    }

    fn post_all_receives(&mut self) -> Result<(), DeviceError> {
        self.post_receives(0..self.rq_depth)
    }

    /// Polls the send CQ and brings the QP back if a send failed.
    fn reap_sends(&mut self) {
        self.poll_sends();
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
    }

    /// Polls the send CQ: releases what the completions cover and records
    /// the destinations of failed sends. Safe in the middle of building a
    /// chain: completions cover only posted requests.
    fn poll_sends(&mut self) {
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.scq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for i in 0..n as usize {
                let wc = self.wcs[i];
                if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                    self.stats.send_errors += 1;
                    if wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                        self.check_qp = true;
                    }
                    // The destination of the failed send is reported (the
                    // peer it concerns), but not for requests the queue
                    // pair's error flushed (they were not at fault; the
                    // reliability layer resends them), nor for a local
                    // error of a gathered send (application memory whose
                    // registration went away: rdmx's matter, not the
                    // peer's; the message is resent or has completed).
                    let local = matches!(
                        wc.status,
                        ib::ibv_wc_status_IBV_WC_LOC_PROT_ERR | ib::ibv_wc_status_IBV_WC_LOC_LEN_ERR
                    );
                    let blame = wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR;
                    if let Some(f) = self.inflight.iter().find(|f| f.seq == wc.wr_id) {
                        let dst = f.dst;
                        if f.gathered && local {
                            self.stats.gathered_send_errors += 1;
                        } else if blame && !self.unreachable.contains(&dst) {
                            self.unreachable.push_back(dst);
                        }
                    }
                }
                self.release_through(wc.wr_id);
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
    }

    /// A completion of send `seq` covers it and every send before it.
    fn release_through(&mut self, seq: u64) {
        while self.inflight.front().is_some_and(|f| f.seq <= seq) {
            let f = self.inflight.pop_front().expect("checked");
            self.release(&f);
        }
    }

    fn release(&mut self, f: &Inflight) {
        if let Some(e) = self.ahs.get_mut(&f.ah) {
            e.inflight -= 1;
        }
        if let Some(b) = f.bounce {
            self.bounce.give_back(b);
        }
    }

    /// Brings the QP back after a send error: SQE -> RTS, or the whole
    /// cycle from RESET (reposting every receive slot) after ERR.
    fn recover(&mut self) {
        let mut attr = ib::ibv_qp_attr::default();
        let mut init = ib::ibv_qp_init_attr::default();
        // SAFETY: a live QP and valid out-structs.
        let rc =
            unsafe { ib::ibv_query_qp(self.qp, &mut attr, ib::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init) };
        if rc != 0 {
            return;
        }
        use ib::ibv_qp_attr_mask as m;
        match attr.qp_state {
            ib::ibv_qp_state_IBV_QPS_SQE => {
                let mut a = ib::ibv_qp_attr {
                    qp_state: ib::ibv_qp_state_IBV_QPS_RTS,
                    cur_qp_state: ib::ibv_qp_state_IBV_QPS_SQE,
                    ..Default::default()
                };
                if self.modify(&mut a, (m::IBV_QP_STATE | m::IBV_QP_CUR_STATE).0, "ibv_modify_qp(SQE->RTS)").is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            ib::ibv_qp_state_IBV_QPS_ERR => {
                let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RESET, ..Default::default() };
                if self.modify(&mut a, m::IBV_QP_STATE.0, "ibv_modify_qp(RESET)").is_err() {
                    return;
                }
                // Reset discarded every posted request: drop their
                // completions (flushes) and what they held.
                self.rx_pending.clear();
                // SAFETY: live CQs and room for POLL_BATCH completions.
                while unsafe { ib::ibv_poll_cq(self.rcq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) } > 0 {}
                // SAFETY: as above.
                while unsafe { ib::ibv_poll_cq(self.scq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) } > 0 {}
                while let Some(f) = self.inflight.pop_front() {
                    self.release(&f);
                }
                self.since_signal = 0;
                if self.bring_up().is_ok() && self.post_all_receives().is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            _ => {}
        }
    }

    /// The address handle for `key`, from the cache or new (evicting the
    /// least recently used one no outstanding send uses).
    fn ah_for(&mut self, key: AhKey) -> Result<*mut ib::ibv_ah, AhError> {
        self.ah_clock += 1;
        let clock = self.ah_clock;
        if let Some(e) = self.ahs.get_mut(&key) {
            e.last_use = clock;
            return Ok(e.ah);
        }
        if self.ahs.len() >= self.ah_cap && !self.evict_one() {
            // Not `reap_sends`: a recovery would release the requests of the
            // chain being built.
            self.poll_sends();
            if !self.evict_one() {
                self.stats.ah_overflow += 1;
            }
        }
        let mut attr = ib::ibv_ah_attr { port_num: self.ctx.port, ..Default::default() };
        if self.ctx.infiniband {
            attr.dlid = key.1;
        } else {
            attr.is_global = 1;
            attr.grh.dgid.raw = key.0;
            attr.grh.sgid_index = self.ctx.gid_index;
            attr.grh.hop_limit = HOP_LIMIT;
        }
        let mut retried = false;
        let ah = loop {
            let (ah, errno) = if self.refuse_ahs > 0 {
                self.refuse_ahs -= 1;
                (std::ptr::null_mut(), Some(libc::ENOMEM))
            } else {
                // SAFETY: errno is this thread's; then a live PD and a
                // valid attribute struct. errno is cleared first so that a
                // failure that sets none is not read as an older EAGAIN.
                let ah = unsafe {
                    *libc::__errno_location() = 0;
                    ib::ibv_create_ah(self.ctx.pd, &mut attr)
                };
                (ah, std::io::Error::last_os_error().raw_os_error().filter(|&e| e != 0))
            };
            if !ah.is_null() {
                break ah;
            }
            if !matches!(errno, Some(libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::ENOBUFS)) {
                self.stats.ah_failed += 1;
                return Err(AhError::Unreachable);
            }
            // The device is out of address handles (its limit can be below
            // `max_ah`) or memory: give one back and try once more, else
            // let the send wait for sends in flight to release theirs.
            self.stats.ah_refused += 1;
            if retried {
                return Err(AhError::Busy);
            }
            retried = true;
            if !self.evict_one() {
                self.poll_sends();
                if !self.evict_one() {
                    return Err(AhError::Busy);
                }
            }
        };
        self.stats.ah_created += 1;
        self.ahs.insert(key, AhEntry { ah, last_use: clock, inflight: 0 });
        Ok(ah)
    }

    fn evict_one(&mut self) -> bool {
        let Some((&k, _)) = self.ahs.iter().filter(|(_, e)| e.inflight == 0).min_by_key(|(_, e)| e.last_use) else {
            return false;
        };
        let e = self.ahs.remove(&k).expect("present");
        // SAFETY: an AH no outstanding send uses, destroyed once.
        unsafe { ib::ibv_destroy_ah(e.ah) };
        self.stats.ah_evicted += 1;
        true
    }

    /// Address handles cached now.
    pub fn ah_cache_len(&self) -> usize {
        self.ahs.len()
    }

    /// The bound of the address-handle cache.
    pub fn ah_cache_cap(&self) -> usize {
        self.ah_cap
    }

    /// The Q_Key of this queue pair.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Test hook: the next send that is not inline names a wrong memory
    /// key, so it completes in error (a local protection error): how the
    /// tests reach the error-completion and queue-pair recovery paths.
    #[doc(hidden)]
    pub fn corrupt_next_send_key_for_test(&mut self) {
        self.corrupt_next_key = true;
    }

    /// Test hook: the next `n` address handles to create are refused as a
    /// device out of them would (ENOMEM): how the tests reach the evict and
    /// retry path without exhausting a real device.
    #[doc(hidden)]
    pub fn refuse_next_ahs_for_test(&mut self, n: u32) {
        self.refuse_ahs = n;
    }

    /// Sends posted and not yet covered by a completion.
    pub fn outstanding(&self) -> usize {
        self.inflight.len()
    }

    /// Consumes the completion channel's events (acknowledging them), so
    /// its fd is not readable until the next armed completion.
    fn ack_events(&mut self) {
        let (mut n, mut n_rc) = (0, 0);
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live channel (non-blocking fd) and valid out-pointers.
            if unsafe { ib::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) } != 0 {
                break;
            }
            if cq == self.rc.cq {
                n_rc += 1;
            } else {
                n += 1;
            }
        }
        if n > 0 {
            // SAFETY: events of the receive CQ.
            unsafe { ib::ibv_ack_cq_events(self.rcq, n) };
        }
        if n_rc > 0 {
            // SAFETY: events of the RC CQ (the other CQ on the channel).
            unsafe { ib::ibv_ack_cq_events(self.rc.cq, n_rc) };
        }
    }

    /// Takes in RC read completions: a read is done when its last request
    /// completed; one that failed (the connection broke, a key was refused)
    /// breaks its connection and is reported `NotConnected`, so its message
    /// is pushed instead.
    fn reap_reads(&mut self) {
        if self.rc.cq.is_null() {
            return;
        }
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.rc.cq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for i in 0..n as usize {
                let wc = self.wcs[i];
                if let Some(c) = self.rc.outstanding.get_mut(&wc.qp_num) {
                    *c = c.saturating_sub(1);
                    if *c == 0 {
                        self.rc.outstanding.remove(&wc.qp_num);
                    }
                }
                self.rc.total_outstanding = self.rc.total_outstanding.saturating_sub(1);
                let Some(r) = self.rc_reads.get_mut(wc.wr_id as usize) else { continue };
                if wc.status == ib::ibv_wc_status_IBV_WC_SUCCESS {
                    if !r.failed {
                        r.bytes += wc.byte_len as u64;
                        // A piece landed: the read moves, slow as it may be
                        // (a lossy path); only one that stops is given up.
                        r.last_progress = self.now;
                    }
                } else {
                    if wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                        self.stats.rc_last_error_status = wc.status;
                    }
                    r.failed = true;
                }
                r.wrs_left -= 1;
                if r.wrs_left == 0 {
                    let r = self.rc_reads.remove(wc.wr_id as usize);
                    if r.reported {
                        continue;
                    }
                    self.conns.read_finished(self.now, &r.peer);
                    if r.failed {
                        self.stats.rc_read_errors += 1;
                        let now = self.now;
                        self.conns.broken(now, r.peer, &mut self.rc);
                        self.rc_done.push_back(rdm::device::ReadDone {
                            id: r.id,
                            bytes: r.bytes,
                            error: Some(DeviceError::NotConnected),
                        });
                    } else {
                        self.stats.rc_read_bytes += r.bytes;
                        self.rc_done.push_back(rdm::device::ReadDone { id: r.id, bytes: r.bytes, error: None });
                    }
                }
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
        self.give_up_stuck_reads();
        self.rc.reap_retired();
    }

    /// A read no completion has answered within the read timeout (a path
    /// that drops RC packets without the device reporting it: seen on
    /// Soft-RoCE between devices with no route) breaks its connection (to
    /// the error state: nothing more lands in its buffer) and is reported
    /// failed now, so its message is pushed instead of waiting forever.
    fn give_up_stuck_reads(&mut self) {
        if self.rc_reads.is_empty() {
            return;
        }
        let now = self.now;
        let limit = self.ctx.cfg.rc_read_timeout.unwrap_or(RC_READ_TIMEOUT);
        while let Some((slot, peer)) = self
            .rc_reads
            .iter()
            .find(|(_, r)| !r.reported && now.saturating_duration_since(r.last_progress) >= limit)
            .map(|(k, r)| (k, r.peer))
        {
            let r = &mut self.rc_reads[slot];
            r.reported = true;
            let (id, bytes) = (r.id, r.bytes);
            self.stats.rc_read_errors += 1;
            self.stats.rc_reads_timed_out += 1;
            self.conns.read_finished(now, &peer);
            self.conns.broken(now, peer, &mut self.rc);
            self.rc_done.push_back(rdm::device::ReadDone { id, bytes, error: Some(DeviceError::NotConnected) });
        }
    }

    /// The connection counters, and the connections open now (active: this
    /// endpoint reads through them; passive: peers read through them).
    pub fn rc_stats(&self) -> (ConnStats, usize, usize) {
        (self.conns.stats, self.conns.active_len(), self.conns.passive_len())
    }

    /// Polls the receive CQ into `rx_pending`, at most `max`.
    fn poll_recv(&mut self, max: usize) {
        let want = max.min(POLL_BATCH) as i32;
        // SAFETY: a live CQ and room for POLL_BATCH completions.
        let n = unsafe { ib::ibv_poll_cq(self.rcq, want, self.wcs.as_mut_ptr()) };
        for i in 0..n.max(0) as usize {
            self.rx_pending.push_back(self.wcs[i]);
        }
    }
}

impl Device for VerbsDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: false,
            ordered: false,
            mtu: self.mtu,
            // Through an RC queue pair made on the first read of a peer
            // (pushed until it is connected).
            remote_read: self.conns.enabled(),
            gso: false,
            max_inline: self.max_inline,
            registration: true,
        }
    }

    fn local_addr(&self) -> DevAddr {
        self.local
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        parse_ud_addr(addr).is_some()
    }

    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.reap_sends();
        let room = (self.sq_depth as usize).saturating_sub(self.inflight.len());
        if room < batch.len() {
            self.stats.sq_full += 1;
        }
        self.swrs.clear();
        self.ssges.clear();
        let first_seq = self.tx_seq;
        let mut failure = None;
        for d in batch.iter().take(room) {
            let Some((gid, qpn, lid)) = parse_ud_addr(&d.dst) else {
                failure = Some(DeviceError::Unreachable(d.dst));
                break;
            };
            if d.wire_len() > self.mtu {
                failure = Some(DeviceError::TooLarge { len: d.wire_len(), mtu: self.mtu });
                break;
            }
            let key: AhKey = if self.ctx.infiniband { ([0; 16], lid) } else { (gid, 0) };
            let ah = match self.ah_for(key) {
                Ok(ah) => ah,
                // Back-pressure: the rest of the batch goes later.
                Err(AhError::Busy) => break,
                Err(AhError::Unreachable) => {
                    if !self.unreachable.contains(&d.dst) {
                        self.unreachable.push_back(d.dst);
                    }
                    failure = Some(DeviceError::Unreachable(d.dst));
                    break;
                }
            };
            let len = d.data.len();
            let gather = d.gather.filter(|g| !g.is_empty());
            let mut flags = 0u32;
            let mut bounce = None;
            let sge = if len <= self.max_inline as usize && gather.is_none() {
                flags |= ib::ibv_send_flags::IBV_SEND_INLINE.0;
                self.stats.inline_sends += 1;
                ib::ibv_sge { addr: d.data.as_ptr() as u64, length: len as u32, lkey: 0 }
            } else {
                // Never straight from the caller's buffer, not even one this
                // device lent: the endpoint writes its next datagram there
                // as soon as this call returns, and the NIC reads a request's
                // bytes later. One slot per outstanding send, freed by its
                // completion: never empty while room > 0; if it ever were,
                // that is back-pressure (the rest of the batch goes later), not
                // a panic on the application's send path.
                let Some((b, sge)) = self.bounce.copy_in(&[d.data]) else { break };
                bounce = Some(b);
                self.stats.bounce_copies += 1;
                sge
            };
            let mut sge = sge;
            if self.corrupt_next_key && flags & ib::ibv_send_flags::IBV_SEND_INLINE.0 == 0 {
                self.corrupt_next_key = false;
                sge.lkey ^= 0x00ba_d000;
            }
            self.since_signal += 1;
            if self.since_signal >= SIGNAL_EVERY {
                flags |= ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
                self.since_signal = 0;
            }
            let seq = self.tx_seq;
            self.tx_seq += 1;
            if let Some(e) = self.ahs.get_mut(&key) {
                e.inflight += 1;
            }
            self.inflight.push_back(Inflight { seq, dst: d.dst, ah: key, bounce, gathered: gather.is_some() });
            // Two SGEs per request, always (the second unused without a
            // gathered part), so request i's list is at 2 * i.
            self.ssges.push(sge);
            let gathered = gather.map(|g| {
                self.stats.gathered_sends += 1;
                let (lkey, _) = mr_keys(g.key().unwrap_or(0));
                ib::ibv_sge { addr: g.addr(), length: g.len() as u32, lkey }
            });
            self.ssges.push(gathered.unwrap_or_default());
            let num_sge = match (len, gathered) {
                (0, None) => 0,
                (0, Some(_)) => {
                    // Only the gathered part: it moves into the first slot.
                    let i = self.ssges.len();
                    self.ssges.swap(i - 2, i - 1);
                    1
                }
                (_, None) => 1,
                (_, Some(_)) => 2,
            };
            let mut wr = ib::ibv_send_wr {
                wr_id: seq,
                num_sge,
                opcode: ib::ibv_wr_opcode_IBV_WR_SEND,
                send_flags: flags,
                ..Default::default()
            };
            wr.wr.ud = ib::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah, remote_qpn: qpn, remote_qkey: self.qkey };
            self.swrs.push(wr);
        }
        let n = self.swrs.len();
        if n == 0 {
            return match failure {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        // The chain's last request is signaled: every posted send is covered
        // by a completion to come.
        let last = &mut self.swrs[n - 1];
        if last.send_flags & ib::ibv_send_flags::IBV_SEND_SIGNALED.0 == 0 {
            last.send_flags |= ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
            self.since_signal = 0;
        }
        link_send_chain(&mut self.swrs, &mut self.ssges, 2);
        let mut bad: *mut ib::ibv_send_wr = ptr::null_mut();
        // SAFETY: a chain of valid UD send requests: each AH is live (its
        // inflight count keeps it from eviction), each SGE names either
        // inline data (copied by the post), a bounce slot (this send's
        // until its completion), or a gathered part: registered application
        // memory that stays valid until its message completes (the
        // `TxDatagram::gather` contract), which is after this send.
        let rc = unsafe { ib::ibv_post_send(self.qp, self.swrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            // Requests from `bad` on were not posted: undo them.
            let posted = posted_before(bad, &self.swrs);
            for _ in posted..n {
                let f = self.inflight.pop_back().expect("pushed above");
                self.release(&f);
            }
            self.tx_seq = first_seq + posted as u64;
            if posted > 0 {
                // The last posted one may be unsignaled: the next chain's
                // signaled last request covers it.
                self.stats.sent += posted as u64;
                return Ok(posted);
            }
            return Err(ret_err("ibv_post_send", rc));
        }
        self.stats.sent += n as u64;
        Ok(n)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        if max == 0 {
            return Ok(0);
        }
        self.reap_sends();
        if self.rx_pending.len() < max {
            self.poll_recv(max - self.rx_pending.len());
        }
        let mut delivered = 0;
        let mut repost: [u32; POLL_BATCH] = [0; POLL_BATCH];
        let mut nrepost = 0;
        while delivered < max {
            let Some(wc) = self.rx_pending.pop_front() else { break };
            let slot = wc.wr_id as usize;
            if slot >= self.rq_depth as usize {
                continue;
            }
            if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    // The QP went to error: recovery reposts every slot.
                    self.check_qp = true;
                    continue;
                }
                self.stats.recv_errors += 1;
            } else if (wc.byte_len as usize) < GRH_LEN || wc.byte_len as usize > self.rx.slot_len() {
                self.stats.recv_errors += 1;
            } else {
                let buf = self.rx.bytes(slot, wc.byte_len as usize);
                let src = if self.ctx.infiniband || wc.wc_flags & ib::ibv_wc_flags_IBV_WC_GRH == 0 {
                    ud_addr([0; 16], wc.src_qp, wc.slid)
                } else {
                    ud_addr(grh_source_gid(&buf[..GRH_LEN]), wc.src_qp, 0)
                };
                deliver(src, &buf[GRH_LEN..]);
                delivered += 1;
                self.stats.received += 1;
            }
            repost[nrepost] = slot as u32;
            nrepost += 1;
            if nrepost == POLL_BATCH {
                self.post_receives(repost.iter().copied())?;
                nrepost = 0;
            }
            if self.rx_pending.is_empty() && delivered < max {
                self.poll_recv(max - delivered);
            }
        }
        self.post_receives(repost[..nrepost].iter().copied())?;
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel lives as long as the device.
        Some(unsafe { (*self.channel).fd })
    }

    fn prepare_wait(&mut self) -> bool {
        self.ack_events();
        if !self.rx_pending.is_empty() {
            return true;
        }
        // SAFETY: a live CQ attached to the channel.
        unsafe { ib::ibv_req_notify_cq(self.rcq, 0) };
        if !self.rc.cq.is_null() {
            // SAFETY: as above.
            unsafe { ib::ibv_req_notify_cq(self.rc.cq, 0) };
            self.reap_reads();
        }
        // A completion that arrived before the arm raises no event: look.
        self.poll_recv(POLL_BATCH);
        !self.rx_pending.is_empty() || !self.rc_done.is_empty()
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.unreachable.pop_front()
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }

    fn remote_reads_ref(&self) -> Option<&dyn RemoteReads> {
        Some(self)
    }
}

impl RemoteReads for VerbsDevice {
    /// An RDMA read through the peer's RC connection, one request per piece
    /// of at most the port's `max_msg_sz`, all posted at once. No
    /// connection yet (it is being made), or no room: `NotConnected`, and
    /// the sender pushes this message.
    fn post_read(
        &mut self,
        now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        if !self.conns.enabled() {
            return Err(DeviceError::Unsupported);
        }
        self.now = now;
        self.reap_reads();
        self.conns.expire(now, &mut self.rc);
        // Pieces of at least RC_READ_PIECE, fewer than RC_READ_PIECES_MAX
        // per read where the read is larger, never beyond the port's
        // max_msg_sz: on rxe (and on NICs that reset the retry counter
        // only when a request completes) one lost response packet costs a
        // retry of the request it belongs to, so one request for a 64 MiB
        // read under loss spends its 7 retries and breaks the connection,
        // where pieces of a few MiB each complete and reset it.
        let total: u64 = runs.iter().map(|r| r.local.len()).sum();
        let max_msg = self.ctx.max_msg.max(4096).min(RC_READ_PIECE.max(total.div_ceil(RC_READ_PIECES_MAX)));
        let wrs: u64 = runs.iter().map(|r| r.local.len().div_ceil(max_msg).max(1)).sum();
        let Some(q) = self.conns.route(now, peer, &mut self.rc) else {
            return Err(DeviceError::NotConnected);
        };
        let (qp, qpn) = (q.qp, q.qpn);
        let busy = self.rc.outstanding.get(&qpn).copied().unwrap_or(0) as u64;
        let cq_room = (RC_CQ_DEPTH.min(self.ctx.max_cqe) as u64).saturating_sub(self.rc.total_outstanding as u64);
        if busy + wrs > RC_SQ_DEPTH.min(self.ctx.max_qp_wr) as u64 || wrs > cq_room {
            self.stats.rc_reads_deferred += 1;
            return Err(DeviceError::NotConnected);
        }
        if runs.iter().any(|r| r.remote_key.is_none() || r.local.key().is_none()) {
            return Err(DeviceError::Config("an RDMA read needs the peer's key and a local one".into()));
        }
        let slot = self.rc_reads.vacant_key() as u64;
        self.rc_wrs.clear();
        self.rc_sges.clear();
        for r in runs {
            let (_, rkey) = mr_keys(r.remote_key.unwrap_or(0));
            let (lkey, _) = mr_keys(r.local.key().unwrap_or(0));
            let mut off = 0u64;
            loop {
                let len = (r.local.len() - off).min(max_msg);
                self.rc_sges.push(ib::ibv_sge { addr: r.local.addr() + off, length: len as u32, lkey });
                let mut wr = ib::ibv_send_wr {
                    wr_id: slot,
                    num_sge: 1,
                    opcode: ib::ibv_wr_opcode_IBV_WR_RDMA_READ,
                    send_flags: ib::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.wr.rdma = ib::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: r.remote_addr + off, rkey };
                self.rc_wrs.push(wr);
                off += len;
                if off >= r.local.len() {
                    break;
                }
            }
        }
        let n = self.rc_wrs.len();
        link_send_chain(&mut self.rc_wrs, &mut self.rc_sges, 1);
        let mut bad: *mut ib::ibv_send_wr = ptr::null_mut();
        // SAFETY: a chain of valid RDMA read requests on a connected RC QP:
        // each local SGE names memory the caller vouched for until this read
        // completes (`LocalBuf`), registered under its lkey; the remote side
        // is named by the peer's rkey.
        let rc = unsafe { ib::ibv_post_send(qp, self.rc_wrs.as_mut_ptr(), &mut bad) };
        let posted = if rc == 0 { n } else { posted_before(bad, &self.rc_wrs) };
        if posted == 0 {
            self.stats.rc_read_errors += 1;
            self.conns.broken(now, peer, &mut self.rc);
            return Err(DeviceError::NotConnected);
        }
        // Requests that did not post count as failed; the read is given up
        // (pushed) when the posted ones complete.
        let key = self.rc_reads.insert(RcRead {
            id,
            peer,
            wrs_left: posted as u32,
            bytes: 0,
            failed: posted < n,
            last_progress: now,
            reported: false,
        });
        debug_assert_eq!(key as u64, slot);
        *self.rc.outstanding.entry(qpn).or_insert(0) += posted as u32;
        self.rc.total_outstanding += posted as u32;
        self.conns.read_started(&peer);
        self.stats.rc_reads += 1;
        self.stats.rc_read_requests += posted as u64;
        Ok(())
    }

    fn poll_read(&mut self, now: rdm::time::Instant) -> Option<rdm::device::ReadDone> {
        self.now = now;
        if self.rc_done.is_empty() && !self.rc_reads.is_empty() {
            self.reap_reads();
        }
        self.rc_done.pop_front()
    }

    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        let (to, m) = self.conns.poll_message()?;
        Some((to, ControlMsg::new(&m.encode()).expect("a handshake message fits")))
    }

    fn handle_control(&mut self, now: rdm::time::Instant, from: DevAddr, bytes: &[u8]) {
        self.now = now;
        if !self.conns.handle(now, from, bytes, &mut self.rc) {
            self.stats.rc_bad_control += 1;
        }
    }

    fn peer_failed(&mut self, peer: DevAddr) {
        // Its queue pairs go to the error state: reads in flight flush and
        // complete as failed.
        self.conns.peer_failed(&peer, &mut self.rc);
    }

    fn read_conn_stats(&self) -> rdm::device::ReadConnStats {
        rdm::device::ReadConnStats {
            conns: self.conns.stats,
            open_active: self.conns.active_len(),
            open_passive: self.conns.passive_len(),
            reads: self.stats.rc_reads,
            read_bytes: self.stats.rc_read_bytes,
            read_failures: self.stats.rc_read_errors,
            read_timeouts: self.stats.rc_reads_timed_out,
            last_read_error: self.stats.rc_last_error_status,
            queue_pairs: self.rc.live,
        }
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // The RC queue pairs first (to the error state, then destroyed: the
        // device no longer writes read targets through them).
        self.conns.clear(&mut self.rc);
        for q in self.rc.retiring.drain(..) {
            RcFactory::destroy(&q);
        }
        // SAFETY: every object is destroyed once, users before what they
        // use: the QPs (nothing is posted any more), then the AHs the UD QP
        // sent through, the CQs (their events acknowledged), the channel,
        // and the MRs; the buffers are freed after (fields drop after this),
        // the PD and context when the last Arc of the context goes.
        unsafe {
            if !self.qp.is_null() {
                ib::ibv_destroy_qp(self.qp);
            }
            for (_, e) in self.ahs.drain() {
                ib::ibv_destroy_ah(e.ah);
            }
            if !self.channel.is_null() {
                self.ack_events();
            }
            if !self.scq.is_null() {
                ib::ibv_destroy_cq(self.scq);
            }
            if !self.rc.cq.is_null() {
                ib::ibv_destroy_cq(self.rc.cq);
            }
            if !self.rcq.is_null() {
                ib::ibv_destroy_cq(self.rcq);
            }
            if !self.channel.is_null() {
                ib::ibv_destroy_comp_channel(self.channel);
            }
        }
        self.rx.deregister();
        self.bounce.deregister();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_round_trip() {
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 12, 1];
        let a = ud_addr(gid, 0x12345, 7);
        assert_eq!(parse_ud_addr(&a), Some((gid, 0x12345, 7)));
        let DevAddr::Raw(r) = a else { panic!() };
        assert_eq!(r.bytes().len(), UD_ADDR_LEN);
        assert_eq!(&r.bytes()[16..20], &0x12345u32.to_le_bytes());
        assert_eq!(parse_ud_addr(&DevAddr::NONE), None);
        let efa = DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_EFA, &[0; 22]).unwrap());
        assert_eq!(parse_ud_addr(&efa), None);
    }

    #[test]
    fn keys_and_access() {
        let k = mr_key(0x1111, 0x2222);
        assert_eq!(k, 0x2222_0000_1111);
        assert_eq!(mr_keys(k), (0x1111, 0x2222));
        let lw = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let rr = ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        let rw = ib::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        assert_eq!(ibv_access(FI_SEND), rr, "a rendezvous receiver reads what is sent");
        assert_eq!(ibv_access(FI_REMOTE_READ), rr);
        assert_eq!(ibv_access(FI_REMOTE_WRITE), rw | lw);
        assert_eq!(ibv_access(FI_READ), lw);
        assert_eq!(ibv_access(FI_RECV | FI_REMOTE_READ), lw | rr);
    }

    #[test]
    fn on_demand_needs_rc_read_and_ud_send() {
        let (gen, read, send) = (
            ib::ibv_odp_general_caps_IBV_ODP_SUPPORT as u64,
            ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_READ,
            ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_SEND,
        );
        // Soft-RoCE in Debian's 7.3 kernel: RC send/recv/write/read/atomic/srq, UD send/recv/srq.
        assert!(odp_offered(gen, 0x3f | 0xc0, 0x23));
        assert!(!odp_offered(0, read | send, send), "no general ODP");
        assert!(!odp_offered(gen, send, send), "no RC read");
        assert!(!odp_offered(gen, read, 0), "no UD send (gathered pushes)");
        assert!(!odp_offered(0, 0, 0), "6.1: nothing");
    }

    #[test]
    fn qkeys_are_unprivileged_and_spread() {
        let keys: Vec<u32> = (0..1000u64).map(qkey_for).collect();
        assert!(keys.iter().all(|k| k & 0x8000_0000 == 0));
        let mut d = keys.clone();
        d.sort();
        d.dedup();
        assert_eq!(d.len(), keys.len());
        assert_eq!(qkey_for(42), qkey_for(42));
    }

    #[test]
    fn grh_source_of_ipv4_and_ipv6() {
        // RoCE v2 over IPv4: 20 bytes unused, then an IPv4 header.
        let mut g = [0u8; GRH_LEN];
        let ip4: [u8; 20] = [0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 11, 12, 1, 10, 11, 13, 1];
        g[20..].copy_from_slice(&ip4);
        let mut sum: u32 = ip4.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        let ck = !(sum as u16);
        g[30..32].copy_from_slice(&ck.to_be_bytes());
        assert_eq!(grh_source_gid(&g), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 12, 1]);
        // A GRH proper (IPv6 version): sgid at bytes 8..24.
        let mut g = [0u8; GRH_LEN];
        g[0] = 0x60;
        for (i, b) in g[8..24].iter_mut().enumerate() {
            *b = 0xf0 + i as u8;
        }
        let want: [u8; 16] = std::array::from_fn(|i| 0xf0 + i as u8);
        assert_eq!(grh_source_gid(&g), want);
    }
}
