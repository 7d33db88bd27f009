//! The EFA SRD device: one scalable-reliable-datagram queue pair per endpoint
//! on an AWS Elastic Fabric Adapter, through libibverbs and libefa (`efadv`).
//!
//! **Not run on EFA hardware.** It builds against `<infiniband/efadv.h>` on
//! any host and is tested here only where no hardware is needed (addresses,
//! limits and caps from a device's attributes, read splitting, refusal to
//! open without an EFA device). The verbs facts it relies on are rdma-core's
//! (providers/efa) and libfabric's prov/efa, read, not tried.
//!
//! # Layer
//!
//! Like the verbs UD device ([`crate::verbs`]) it moves whole datagrams
//! between endpoints and lends receive buffers; unlike UD, SRD is
//! **reliable but unordered**: the device retransmits and may deliver out
//! of order, so its caps say `reliable: true, ordered: false` and the engine
//! runs with retransmission off and its reorder buffer on. With no
//! retransmission timer in the engine, a datagram this device loses would
//! leave a gap forever, so none is lost silently: every send that fails
//! (completed in error for any reason, flushed ones and gathered sends
//! whose registration was gone included, or dropped when the queue pair is
//! reset) puts its destination on [`Device::poll_unreachable`] (once) and
//! the engine fails that peer.
//!
//! # API (for the provider's integration)
//!
//! * [`EfaConfig`] `{ device, sq_depth, rq_depth, ah_cache }`: `device`
//!   names an RDMA device (`"rdmap0s6"`); `None`: the first EFA device;
//!   `ah_cache`: address handles the domain keeps (0: [`DEFAULT_AH_CACHE`],
//!   at most the device's `max_ah`).
//! * [`EfaContext::open`]`(&EfaConfig)`: one per libfabric domain: the
//!   device and one protection domain, shared by every queue it opens and
//!   by its registrar. An RDMA device is EFA when `efadv_query_device`
//!   answers for it (it refuses every other provider's device). No EFA
//!   device, or one without the completion-queue source GID
//!   (`EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID`, see below): a
//!   [`DeviceError::Config`] that says which. [`EfaContext::available`]
//!   says whether one would open.
//! * [`EfaDevice`] implements [`Device`]: caps reliable, unordered, `mtu` =
//!   the port's `max_msg_sz` (about 8 KiB on SRD), `remote_read` when the
//!   device reports RDMA read, `registration` true, `max_inline` = the
//!   device's inline buffer size, `gso` false.
//! * Address: `DevAddr::Raw` of family [`RawAddr::FAMILY_EFA`], 20 bytes =
//!   GID (16) ++ QPN (u32 LE): [`efa_addr`], [`parse_efa_addr`]. The Q_Key is
//!   not in it: every endpoint of a job derives the same one from
//!   `OpenSpec::job_key` ([`crate::verbs::qkey_for`]), so the device drops
//!   another job's datagrams, as on UD (and the 64-byte endpoint address has
//!   no room for four more bytes).
//! * Registration as on verbs (shared code): keys are `rkey << 32 | lkey`
//!   ([`crate::verbs::mr_key`]), access bits are libfabric's, mapped as on
//!   verbs and cut to what EFA's kernel driver takes
//!   ([`efa_mr_access_mask`]: local write, and remote read only where the
//!   device reads; no remote write with these headers).
//! * [`is_efa_device`]: the verbs UD device skips EFA devices with it (UD
//!   does not work on EFA).
//!
//! # How it works
//!
//! The queue pair is made with `efadv_create_qp_ex` (`IBV_QPT_DRIVER`,
//! `EFADV_QP_DRIVER_TYPE_SRD`) with the extended send API (`ibv_wr_*`: send,
//! and RDMA read where the device has it) and brought RESET -> INIT (P_Key
//! index 0, port 1, Q_Key) -> RTR -> RTS (SQ PSN 0, RNR retry 7 = retry
//! forever where the device has `EFADV_DEVICE_ATTR_CAPS_RNR_RETRY`: the
//! engine does not resend, so a receiver short of buffers must not lose a
//! datagram). Queue depths, inline size and SGEs come from
//! `efadv_query_device` ([`EfaLimits::from_attr`]).
//!
//! Sends: every work request asks for a completion (EFA refuses unsignaled
//! ones) and completions may come in any order, so each send is tracked by
//! its own id; a full send queue gives a short count (back-pressure). Bytes
//! go inline or through a registered bounce slot, which stays the send's
//! until its completion: never straight from the endpoint's staging buffers,
//! which it writes the next datagram into as soon as `send_batch` returns
//! while the NIC reads a request's bytes later. A datagram with a gathered
//! part (application memory, valid until its message completes) names it as
//! a second SGE (copied into the bounce slot when the device has one SGE).
//!
//! Address handles belong to the domain (a `crate::ib::AhCache`, the
//! one verbs UD uses per endpoint): one per peer GID, shared by every
//! endpoint of the domain, counted per request in flight and destroyed only
//! when none uses it and room is needed (least recently used first). Each
//! batch's AHs are resolved before its `ibv_wr_start` session (which holds
//! the send queue's lock, so no kernel call inside). No room for an AH (the
//! table full of AHs in use, or `ibv_create_ah` failing with `ENOMEM` and
//! the like even after an unused one was given back) holds the send back
//! (a short count), it never fails the peer; another `ibv_create_ah` error
//! does.
//!
//! Receives land in registered slots of `mtu` bytes: SRD puts no GRH before
//! the payload. The source of a datagram: its completion carries the
//! sender's QPN and, in `slid`, the number of the domain's address handle
//! for the sender's GID when there is one (`efadv_query_ah` gives it when an
//! AH is made); the domain keeps each number's GID after its AH is
//! destroyed, until a new AH gets the number, since completions written
//! before still carry it (and `efadv_wc_read_sgid` answers nothing for
//! them). For a sender with no AH the GID comes from the completion itself
//! (`efadv_wc_read_sgid` on a CQ made by `efadv_create_cq` with
//! `EFADV_WC_EX_WITH_SGID`); a datagram whose sender is still unknown is
//! dropped and counted (`unknown_sources`). A device without that cap
//! cannot name such senders, so the context refuses to open (`auto` then
//! uses UDP to remote peers: verbs UD does not work on EFA).
//!
//! A queue pair in an error state is brought back (SQE -> RTS, or ERR ->
//! RESET -> RTS): receives that completed before are kept and delivered,
//! sends no completion answered are reported unreachable, reads complete
//! `NotConnected`.
//!
//! Remote reads: RDMA read straight on the SRD queue pair (no connection),
//! one request per piece of at most `max_rdma_size`, all posted at once;
//! no room in the send queue answers `NotConnected` (the message is pushed,
//! later ones may be read); a request completed in error completes its read
//! `NotConnected` too, so the sender pushes that message (a read error
//! proper would fail the receive). A peer's remote range that wraps past
//! the end of the address space fails the read (nothing posted). Without
//! the RDMA-read cap `post_read` is `Unsupported` and long messages take
//! the windowed push. `read_conn_stats` gives the device's read timeouts
//! (a request whose remote did not answer) and the last failed read
//! request's status.
//!
//! Sleeping: both CQs are made on a completion channel when the device
//! allows (newer EFA kernels), else neither is and the channel is
//! destroyed: `wait_fd` is `None` and the endpoint polls. `prepare_wait`
//! arms the receive CQ, and the send CQ whenever sends or reads are
//! outstanding (a sender held back by a full send queue wakes when room
//! comes).
//!
//! # Layout
//!
//! This file: the constants, the address format, the configuration and the
//! device (discovery, the domain's context with its protection domain and
//! address-handle cache). Apart, each in its own file so that each part
//! reads on its own: `limits.rs` (what a device offers an endpoint, the
//! memory access it takes, how a read is cut into requests: pure functions
//! of the device's attributes, what the unit tests exercise without
//! hardware), `queue.rs` (the endpoint's SRD queue pair: sends, receives,
//! reads, recovery; the [`Device`] and [`RemoteReads`] implementations) and
//! `tests.rs`.
//!
//! Unsafe here: opening and querying the device, its protection domain, numbering and destroying AHs; `Send`/`Sync`.
//!
//! [`Device`]: rdm::device::Device
//! [`RemoteReads`]: rdm::device::RemoteReads
#![allow(unsafe_code)]

mod limits;
mod queue;
#[cfg(test)]
mod tests;

pub use limits::{efa_mr_access_mask, split_read, EfaLimits, ReadPiece};
pub use queue::{EfaDevice, EfaStats};

use crate::ib::{last_err, query_port, AhCache, AhError, DeviceList, OpenDev, PdRegistrar, ProtectionDomain};
use rdm::device::{DevAddr, Device, DeviceContext, DeviceError, OpenSpec, RawAddr, Registrar};
use rdma_core_sys as ib;
use std::sync::{Arc, Mutex};

/// Length of an EFA address: GID 16 + QPN 4.
pub const EFA_ADDR_LEN: usize = 20;
/// Send queue depth asked for by default (fewer where the device allows fewer).
pub const DEFAULT_SQ_DEPTH: u32 = 256;
/// Receive slots posted by default (each `mtu` bytes).
pub const DEFAULT_RQ_DEPTH: u32 = 512;
/// Address handles a domain keeps at most (fewer where the device allows
/// fewer): one per peer GID, shared by the domain's endpoints.
pub const DEFAULT_AH_CACHE: usize = 1024;
/// RNR retry count meaning "retry forever" (the verbs encoding, which EFA
/// takes as its infinite retry).
pub const RNR_RETRY_INFINITE: u8 = 7;
/// The port EFA devices have (one).
const PORT: u8 = 1;
/// Completions polled per call.
const POLL_BATCH: usize = 32;
/// `slid` of a receive completion from a sender this device has no address
/// handle for.
const AHN_UNKNOWN: u32 = 0xffff;
/// Work-request ids of read requests have this bit; sends' ids never do.
const READ_WR: u64 = 1 << 63;

/// An EFA address (see the module docs for the layout).
pub fn efa_addr(gid: [u8; 16], qpn: u32) -> DevAddr {
    let mut b = [0u8; EFA_ADDR_LEN];
    b[..16].copy_from_slice(&gid);
    b[16..20].copy_from_slice(&qpn.to_le_bytes());
    // 20 bytes always fit a RawAddr (RAW_ADDR_MAX is 28).
    DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_EFA, &b).expect("20 <= RAW_ADDR_MAX"))
}

/// `(gid, qpn)` of an EFA address; `None` for anything else.
pub fn parse_efa_addr(addr: &DevAddr) -> Option<([u8; 16], u32)> {
    let DevAddr::Raw(r) = addr else { return None };
    let b: &[u8; EFA_ADDR_LEN] = r.bytes().try_into().ok()?;
    if r.family() != RawAddr::FAMILY_EFA {
        return None;
    }
    let mut gid = [0u8; 16];
    gid.copy_from_slice(&b[..16]);
    Some((gid, u32::from_le_bytes([b[16], b[17], b[18], b[19]])))
}

/// How to open an [`EfaContext`].
#[derive(Clone, Debug, Default)]
pub struct EfaConfig {
    /// An RDMA device by name; `None`: the first EFA device.
    pub device: Option<String>,
    /// Send queue depth (0: [`DEFAULT_SQ_DEPTH`]).
    pub sq_depth: u32,
    /// Receive slots (0: [`DEFAULT_RQ_DEPTH`]).
    pub rq_depth: u32,
    /// Address handles the domain keeps (0: [`DEFAULT_AH_CACHE`]; never
    /// more than the device's `max_ah`).
    pub ah_cache: usize,
}

/// The context shared by a domain's endpoints and registrar.
struct EfaCtx {
    ctx: *mut ib::ibv_context,
    pd: *mut ib::ibv_pd,
    name: String,
    gid: [u8; 16],
    limits: EfaLimits,
    /// The verbs access bits the device takes for a memory region
    /// ([`efa_mr_access_mask`]).
    mr_access_mask: u32,
    /// The domain's address handles (one per peer GID, shared by its
    /// endpoints) and the GID of every AH number it has been given.
    ahs: Mutex<AhCache<[u8; 16]>>,
}

// SAFETY: libibverbs objects may be used from any thread (every verb is
// thread-safe); the raw pointers are owned by this object, and the one
// mutable part is behind a mutex.
unsafe impl Send for EfaCtx {}
// SAFETY: as above.
unsafe impl Sync for EfaCtx {}

impl Drop for EfaCtx {
    fn drop(&mut self) {
        let table = self.ahs.get_mut().unwrap_or_else(|p| p.into_inner());
        for ah in table.drain() {
            // SAFETY: an AH of this PD; every queue pair that could use it
            // belonged to a device holding an Arc of this context, all
            // dropped (QPs destroyed) before it; destroyed once.
            unsafe { ib::ibv_destroy_ah(ah) };
        }
        // SAFETY: every queue, MR and AH of the PD belonged to devices and
        // registrars holding an Arc of this context (dropped before it) or
        // to the table emptied above.
        unsafe {
            ib::ibv_dealloc_pd(self.pd);
            ib::ibv_close_device(self.ctx);
        }
    }
}

impl ProtectionDomain for EfaCtx {
    fn pd(&self) -> *mut ib::ibv_pd {
        self.pd
    }
    fn access_mask(&self) -> u32 {
        self.mr_access_mask
    }
}

impl EfaCtx {
    fn lock_ahs(&self) -> std::sync::MutexGuard<'_, AhCache<[u8; 16]>> {
        self.ahs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The domain's address handle for `gid`, with one more user (one
    /// request in flight; [`AhCache::release`] when it completes): the one
    /// the domain has, or a new one, numbered by `efadv_query_ah` (see
    /// [`AhCache::acquire`]). A full table first gives back the least
    /// recently used AH no request uses; no room (the table full of AHs in
    /// use, or the device out of AHs even after one was given back) is
    /// `Busy`, never a failed peer.
    fn acquire_ah(
        &self,
        table: &mut AhCache<[u8; 16]>,
        gid: [u8; 16],
        stats: &mut EfaStats,
    ) -> Result<*mut ib::ibv_ah, AhError> {
        table.acquire(
            self.pd,
            gid,
            || {
                let mut attr = ib::ibv_ah_attr { is_global: 1, port_num: PORT, ..Default::default() };
                attr.grh.dgid.raw = gid;
                attr
            },
            |ah| {
                let mut q = ib::efadv_ah_attr::default();
                // SAFETY: a live AH and an out-struct of the size passed.
                let rc = unsafe { ib::efadv_query_ah(ah, &mut q, std::mem::size_of::<ib::efadv_ah_attr>() as u32) };
                if rc != 0 {
                    return Err(());
                }
                Ok(Some(q.ahn))
            },
            // The table is the domain's, under its lock: no completions
            // are polled for room (the caller holds the lock).
            |_, _| {},
            stats,
        )
    }
}

/// A domain's EFA device: one EFA NIC and one protection domain.
#[derive(Clone)]
pub struct EfaContext {
    inner: Arc<EfaCtx>,
}

impl std::fmt::Debug for EfaContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EfaContext").field("device", &self.inner.name).field("limits", &self.inner.limits).finish()
    }
}

/// Whether an open RDMA device is an EFA device (`efadv_query_device`
/// answers for it): verbs UD does not work on one (its CQs need a
/// completion channel EFA refuses without CQ notifications, and it rejects
/// unsignaled sends), so the verbs device skips them.
pub(crate) fn is_efa_device(ctx: *mut ib::ibv_context) -> bool {
    query_efa(ctx).is_some()
}

/// The EFA attributes of an open device; `None` when it is no EFA device
/// (`efadv_query_device` answers only for EFA's provider).
fn query_efa(ctx: *mut ib::ibv_context) -> Option<ib::efadv_device_attr> {
    let mut attr = ib::efadv_device_attr::default();
    // SAFETY: an open context and an out-struct of the size passed.
    let rc = unsafe { ib::efadv_query_device(ctx, &mut attr, std::mem::size_of::<ib::efadv_device_attr>() as u32) };
    (rc == 0).then_some(attr)
}

impl EfaContext {
    /// Whether this host has an EFA device that would open (opens and
    /// closes each RDMA device to ask; no device at all answers at once).
    pub fn available() -> bool {
        EfaContext::open(&EfaConfig::default()).is_ok()
    }

    /// Finds the EFA device (see the module docs), opens it and allocates
    /// the protection domain.
    pub fn open(cfg: &EfaConfig) -> Result<EfaContext, DeviceError> {
        let list = DeviceList::get();
        if list.len() == 0 {
            return Err(DeviceError::Config("efa: no RDMA device on this host".into()));
        }
        let mut others = Vec::new();
        for i in 0..list.len() {
            let name = list.name(i);
            if cfg.device.as_ref().is_some_and(|d| *d != name) {
                continue;
            }
            // SAFETY: a device of the live list.
            let dev = OpenDev(unsafe { ib::ibv_open_device(list.device(i)) });
            if dev.0.is_null() {
                others.push(format!("{name} (cannot open)"));
                continue;
            }
            let Some(attr) = query_efa(dev.0) else {
                others.push(name);
                continue;
            };
            let Some(pattr) = query_port(dev.0, PORT) else {
                others.push(format!("{name} (port {PORT} not queried)"));
                continue;
            };
            if pattr.state != ib::ibv_port_state_IBV_PORT_ACTIVE {
                others.push(format!("{name} (port {PORT} not active)"));
                continue;
            }
            let mut dattr = ib::ibv_device_attr::default();
            // SAFETY: an open context and a valid out-pointer.
            if unsafe { ib::ibv_query_device(dev.0, &mut dattr) } != 0 {
                return Err(last_err("ibv_query_device"));
            }
            let limits =
                EfaLimits::from_attr(&attr, pattr.max_msg_sz, dattr.max_cqe.max(1) as u32, cfg.sq_depth, cfg.rq_depth);
            if !limits.cq_with_sgid {
                return Err(DeviceError::Config(format!(
                    "efa: {name} cannot name the source GID of a receive completion (no EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID): datagrams from peers without an address handle would be nameless"
                )));
            }
            if limits.mtu == 0 {
                return Err(DeviceError::Config(format!("efa: {name} reports a max_msg_sz of 0")));
            }
            let mut gid = ib::ibv_gid::default();
            // SAFETY: an open context and a valid out-pointer.
            if unsafe { ib::ibv_query_gid(dev.0, PORT, 0, &mut gid) } != 0 {
                return Err(last_err("ibv_query_gid"));
            }
            // SAFETY: every bit pattern of the union is a valid byte array.
            let gid = unsafe { gid.raw };
            // SAFETY: an open context.
            let pd = unsafe { ib::ibv_alloc_pd(dev.0) };
            if pd.is_null() {
                return Err(last_err("ibv_alloc_pd"));
            }
            let ctx = dev.0;
            std::mem::forget(dev);
            let ah_cap =
                if cfg.ah_cache == 0 { DEFAULT_AH_CACHE } else { cfg.ah_cache }.min(dattr.max_ah.max(1) as usize);
            return Ok(EfaContext {
                inner: Arc::new(EfaCtx {
                    ctx,
                    pd,
                    name,
                    gid,
                    limits,
                    mr_access_mask: efa_mr_access_mask(attr.device_caps),
                    ahs: Mutex::new(AhCache::new(ah_cap)),
                }),
            });
        }
        Err(DeviceError::Config(match (&cfg.device, others.is_empty()) {
            (Some(d), true) => format!("efa: no RDMA device named {d:?}"),
            (Some(d), false) => format!("efa: {d:?} is no usable EFA device: {}", others.join(", ")),
            (None, _) => format!("efa: no EFA device on this host (efadv_query_device refuses {})", others.join(", ")),
        }))
    }

    /// The RDMA device's name.
    pub fn device_name(&self) -> &str {
        &self.inner.name
    }

    /// The GID endpoints send from.
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }

    /// What the device offers an endpoint.
    pub fn limits(&self) -> EfaLimits {
        self.inner.limits
    }

    /// The largest datagram.
    pub fn mtu(&self) -> usize {
        self.inner.limits.mtu
    }

    /// Opens one endpoint's queue pair.
    pub fn open_device(&self, spec: &OpenSpec) -> Result<EfaDevice, DeviceError> {
        EfaDevice::open(self.inner.clone(), spec)
    }
}

impl DeviceContext for EfaContext {
    fn open(&self, spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError> {
        Ok(Box::new(self.open_device(spec)?))
    }

    fn registrar(&self) -> Option<Box<dyn Registrar>> {
        Some(Box::new(PdRegistrar::new(self.inner.clone())))
    }
}
