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
//! Address handles belong to the domain (`AhTable`): one per peer GID,
//! shared by every endpoint of the domain, counted per request in flight
//! and destroyed only when none uses it and room is needed (least recently
//! used first). Each batch's AHs are resolved before its `ibv_wr_start`
//! session (which holds the send queue's lock, so no kernel call inside).
//! No room for an AH (the table full of AHs in use, or `ibv_create_ah`
//! failing with `ENOMEM` and the like even after an unused one was given
//! back) holds the send back (a short count), it never fails the peer;
//! another `ibv_create_ah` error does.
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
#![allow(unsafe_code)]

use crate::ib::{
    last_err, mr_keys, nonblocking_channel, qkey_for, query_port, ret_err, AhError, BounceSlots, DeviceList, OpenDev,
    PdRegistrar, ProtectionDomain, ReceiveSlots,
};
use rdm::device::{
    DevAddr, Device, DeviceCaps, DeviceContext, DeviceError, OpenSpec, RawAddr, ReadDone, ReadRun, Registrar,
    RemoteReads, TxDatagram,
};
use rdm::Instant;
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::ptr;
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

/// What an EFA device offers an endpoint, from `efadv_query_device` and
/// the port's attributes (pure: tested with made-up attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EfaLimits {
    /// Largest datagram: the port's `max_msg_sz`.
    pub mtu: usize,
    pub sq_depth: u32,
    pub rq_depth: u32,
    /// Bytes a send may carry inline.
    pub max_inline: u16,
    /// SGEs a send may gather (2 lets a datagram name a gathered part).
    pub send_sges: u16,
    /// Largest RDMA read request; `None` when the device cannot read.
    pub max_rdma_size: Option<u32>,
    /// The device takes an RNR retry count at RTS.
    pub rnr_retry: bool,
    /// Receive completions can name the sender's GID.
    pub cq_with_sgid: bool,
}

impl EfaLimits {
    /// The limits for queues of `want_sq` / `want_rq` entries (0: the
    /// defaults), cut to what the device and its CQs (`max_cqe`) take.
    pub fn from_attr(
        attr: &ib::efadv_device_attr,
        port_max_msg: u32,
        max_cqe: u32,
        want_sq: u32,
        want_rq: u32,
    ) -> EfaLimits {
        let caps = attr.device_caps;
        let want_sq = if want_sq == 0 { DEFAULT_SQ_DEPTH } else { want_sq };
        let want_rq = if want_rq == 0 { DEFAULT_RQ_DEPTH } else { want_rq };
        let max_cqe = max_cqe.max(1);
        let mtu = port_max_msg as usize;
        EfaLimits {
            mtu,
            sq_depth: want_sq.min(attr.max_sq_wr).min(max_cqe).max(1),
            rq_depth: want_rq.min(attr.max_rq_wr).min(max_cqe).max(1),
            max_inline: (attr.inline_buf_size as usize).min(mtu) as u16,
            send_sges: attr.max_sq_sge.clamp(1, 2),
            max_rdma_size: (caps & ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ != 0 && attr.max_rdma_size > 0)
                .then_some(attr.max_rdma_size),
            rnr_retry: caps & ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY != 0,
            cq_with_sgid: caps & ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID != 0,
        }
    }

    /// The caps of an endpoint with these limits.
    pub fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: true,
            ordered: false,
            mtu: self.mtu,
            remote_read: self.max_rdma_size.is_some(),
            gso: false,
            max_inline: self.max_inline,
            registration: true,
        }
    }
}

/// One RDMA read request of a posted read: `len` bytes from the peer's
/// `remote_addr` (key `rkey`) into local `addr` (key `lkey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    pub remote_addr: u64,
    pub rkey: u32,
    pub addr: u64,
    pub lkey: u32,
    pub len: u32,
}

/// The requests of a read of `runs`, each at most `max` bytes (a run of 0
/// bytes asks for nothing). `Config` when a run lacks a key; an I/O error
/// (`InvalidInput`: the read fails, nothing is posted) when a run's remote
/// range, which the peer announced, runs past the end of the address space.
pub fn split_read(runs: &[ReadRun], max: u32) -> Result<Vec<ReadPiece>, DeviceError> {
    let max = max.max(1) as u64;
    let mut out = Vec::new();
    for r in runs {
        let (Some(remote), Some(local)) = (r.remote_key, r.local.key()) else {
            return Err(DeviceError::Config("efa: an RDMA read needs the peer's key and a local one".into()));
        };
        let (_, rkey) = mr_keys(remote);
        let (lkey, _) = mr_keys(local);
        if r.remote_addr.checked_add(r.local.len()).is_none() {
            return Err(DeviceError::io(
                "efa read",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the peer's range {:#x}+{} wraps past the end of the address space",
                        r.remote_addr,
                        r.local.len()
                    ),
                ),
            ));
        }
        let mut off = 0;
        while off < r.local.len() {
            let len = (r.local.len() - off).min(max);
            // Cannot wrap: remote_addr + len(run) did not, and off < len(run).
            out.push(ReadPiece {
                remote_addr: r.remote_addr + off,
                rkey,
                addr: r.local.addr() + off,
                lkey,
                len: len as u32,
            });
            off += len;
        }
    }
    Ok(out)
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
    ahs: Mutex<AhTable>,
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

/// The verbs access bits an EFA device with `device_caps` (from
/// `efadv_query_device`) takes for a memory region: the kernel's
/// `efa_alloc_mr` refuses any other bit with `EOPNOTSUPP`. Local write
/// always; remote read with `EFADV_DEVICE_ATTR_CAPS_RDMA_READ`. Remote
/// write would need `EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE`, which the
/// rdma-core headers this builds against (44) do not have: no remote write.
pub fn efa_mr_access_mask(device_caps: u32) -> u32 {
    let mut mask = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if device_caps & ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ != 0 {
        mask |= ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    mask
}

/// `ibv_create_ah` errnos that mean "no room now" (the device's AH table,
/// kernel memory): back-pressure, not an unreachable peer.
fn ah_errno_is_no_room(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::ENOBUFS))
}

impl EfaCtx {
    fn lock_ahs(&self) -> std::sync::MutexGuard<'_, AhTable> {
        self.ahs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The domain's address handle for `gid`, with one more user (one
    /// request in flight; [`AhTable::release`] when it completes): the one
    /// the domain has, or a new one. A full table first gives back the
    /// least recently used AH no request uses; no room (the table full of
    /// AHs in use, or the device out of AHs even after one was given back)
    /// is `Busy`, never a failed peer.
    fn acquire_ah(&self, table: &mut AhTable, gid: [u8; 16], stats: &mut EfaStats) -> Result<*mut ib::ibv_ah, AhError> {
        if let Some(ah) = table.take(&gid) {
            return Ok(ah);
        }
        if table.is_full() {
            match table.evict_lru() {
                Some(old) => {
                    // SAFETY: an AH of this PD no request in flight uses, out of the table: destroyed once.
                    unsafe { ib::ibv_destroy_ah(old) };
                    stats.ah_evicted += 1;
                }
                None => {
                    stats.ah_busy += 1;
                    return Err(AhError::Busy);
                }
            }
        }
        let mut evicted_for_room = false;
        let ah = loop {
            let mut attr = ib::ibv_ah_attr { is_global: 1, port_num: PORT, ..Default::default() };
            attr.grh.dgid.raw = gid;
            // SAFETY: a live PD and a valid attribute struct.
            let ah = unsafe { ib::ibv_create_ah(self.pd, &mut attr) };
            if !ah.is_null() {
                break ah;
            }
            let errno = io::Error::last_os_error().raw_os_error();
            if !ah_errno_is_no_room(errno) {
                stats.ah_failed += 1;
                return Err(AhError::Unreachable);
            }
            if !evicted_for_room {
                if let Some(old) = table.evict_lru() {
                    // SAFETY: as above.
                    unsafe { ib::ibv_destroy_ah(old) };
                    stats.ah_evicted += 1;
                    evicted_for_room = true;
                    continue;
                }
            }
            stats.ah_busy += 1;
            return Err(AhError::Busy);
        };
        let mut q = ib::efadv_ah_attr::default();
        // SAFETY: a live AH and an out-struct of the size passed.
        let rc = unsafe { ib::efadv_query_ah(ah, &mut q, std::mem::size_of::<ib::efadv_ah_attr>() as u32) };
        if rc != 0 {
            // SAFETY: the AH just made, used by nothing.
            unsafe { ib::ibv_destroy_ah(ah) };
            stats.ah_failed += 1;
            return Err(AhError::Unreachable);
        }
        table.insert(gid, ah, q.ahn);
        stats.ah_created += 1;
        Ok(ah)
    }
}

/// An address handle of the domain.
struct SharedAh {
    ah: *mut ib::ibv_ah,
    /// Requests in flight (of any endpoint of the domain) that use it.
    users: u32,
    last_use: u64,
}

/// The domain's address handles: one per peer GID, shared by its endpoints,
/// destroyed only when no request uses it and room is needed (least
/// recently used first). The bookkeeping only (pure, unit-tested): the
/// caller creates and destroys the AHs.
///
/// Receive completions name a sender that has an AH by its number (`slid`),
/// and for such a sender `efadv_wc_read_sgid` answers nothing (`-ENOENT`).
/// A completion written before its AH was destroyed still carries the old
/// number, so a number's GID is kept after the AH goes (a tombstone) until
/// a new AH gets that number. Left: a datagram that arrived before an AH
/// was destroyed and is polled after a new AH (for another GID) took its
/// number is named after the new GID; the device gives no way to tell them
/// apart (eviction is rare: the table holds `ah_cache` peers).
struct AhTable {
    by_gid: FxHashMap<[u8; 16], SharedAh>,
    gid_by_ahn: FxHashMap<u16, [u8; 16]>,
    cap: usize,
    clock: u64,
}

impl AhTable {
    fn new(cap: usize) -> AhTable {
        AhTable { by_gid: FxHashMap::default(), gid_by_ahn: FxHashMap::default(), cap: cap.max(1), clock: 0 }
    }

    /// The AH for `gid` if the domain has one, with one more user.
    fn take(&mut self, gid: &[u8; 16]) -> Option<*mut ib::ibv_ah> {
        self.clock += 1;
        let e = self.by_gid.get_mut(gid)?;
        e.users += 1;
        e.last_use = self.clock;
        Some(e.ah)
    }

    /// Whether a new AH needs one given back first.
    fn is_full(&self) -> bool {
        self.by_gid.len() >= self.cap
    }

    /// A new AH for `gid`, numbered `ahn`, with one user.
    fn insert(&mut self, gid: [u8; 16], ah: *mut ib::ibv_ah, ahn: u16) {
        self.clock += 1;
        self.gid_by_ahn.insert(ahn, gid);
        self.by_gid.insert(gid, SharedAh { ah, users: 1, last_use: self.clock });
    }

    /// `n` users of `gid`'s AH are done with it.
    fn release(&mut self, gid: &[u8; 16], n: u32) {
        if let Some(e) = self.by_gid.get_mut(gid) {
            debug_assert!(e.users >= n, "more AH releases than uses");
            e.users = e.users.saturating_sub(n);
        }
    }

    /// Takes out the least recently used AH no request uses, for the
    /// caller to destroy (its number stays mapped: a tombstone).
    fn evict_lru(&mut self) -> Option<*mut ib::ibv_ah> {
        let (&gid, _) = self.by_gid.iter().filter(|(_, e)| e.users == 0).min_by_key(|(_, e)| e.last_use)?;
        self.by_gid.remove(&gid).map(|e| e.ah)
    }

    /// The GID of AH number `ahn`: of a live AH, or of the last one that
    /// had the number.
    fn gid_of_ahn(&self, ahn: u16) -> Option<[u8; 16]> {
        self.gid_by_ahn.get(&ahn).copied()
    }

    /// Every AH, for the caller to destroy (the domain closes).
    fn drain(&mut self) -> Vec<*mut ib::ibv_ah> {
        self.by_gid.drain().map(|(_, e)| e.ah).collect()
    }

    #[cfg(test)]
    fn users(&self, gid: &[u8; 16]) -> Option<u32> {
        self.by_gid.get(gid).map(|e| e.users)
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
                    ahs: Mutex::new(AhTable::new(ah_cap)),
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

/// Counters of one [`EfaDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct EfaStats {
    pub sent: u64,
    pub received: u64,
    pub inline_sends: u64,
    pub bounce_copies: u64,
    pub gathered_sends: u64,
    /// Gathered sends that failed locally (their registration was gone);
    /// their destinations go to `poll_unreachable` all the same (the
    /// datagram is lost and nothing resends it).
    pub gathered_send_errors: u64,
    /// `send_batch` calls cut short by a full send queue.
    pub sq_full: u64,
    /// Sends that failed: completed in error (flushed ones included) or
    /// dropped by a queue pair reset; each destination to `poll_unreachable`.
    pub send_errors: u64,
    /// Receive completions in error or of impossible length.
    pub recv_errors: u64,
    /// Datagrams dropped because their sender could not be named (an AH
    /// number the domain never had, or no source GID in the completion).
    pub unknown_sources: u64,
    /// Address handles this endpoint made, gave back for room, could not
    /// make (the peer failed), and could not make for want of room now
    /// (back-pressure: the send waits).
    pub ah_created: u64,
    pub ah_evicted: u64,
    pub ah_failed: u64,
    pub ah_busy: u64,
    pub qp_recoveries: u64,
    /// RDMA reads posted, their requests, bytes read, reads failed.
    pub reads: u64,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub read_errors: u64,
    /// Failed reads whose request timed out in the device (the remote did
    /// not answer: `IBV_WC_RESP_TIMEOUT_ERR`, `IBV_WC_RETRY_EXC_ERR`).
    pub read_timeouts: u64,
    /// Reads refused for want of room in the send queue (pushed).
    pub reads_deferred: u64,
    /// The `ibv_wc_status` of the last failed request (not flushed), or
    /// the errno of a read session the provider refused.
    pub last_error_status: u32,
    /// The `ibv_wc_status` of the last failed read request (not flushed).
    pub last_read_status: u32,
}

/// Where one datagram of a batch goes: its AH (one use taken), QPN, GID.
struct ResolvedDst {
    ah: *mut ib::ibv_ah,
    qpn: u32,
    gid: [u8; 16],
}

/// A posted send that has not completed.
struct Inflight {
    dst: DevAddr,
    gid: [u8; 16],
    bounce: Option<u32>,
    gathered: bool,
}

/// A posted read: its requests still to complete and how it went.
struct EfaRead {
    id: u64,
    gid: [u8; 16],
    wrs_left: u32,
    bytes: u64,
    status: Option<u32>,
}

/// A receive completion taken from the CQ, not yet delivered.
struct RxDone {
    slot: u32,
    /// The sender and the length; `None`: the completion failed or its
    /// sender could not be named (counted, the slot reposted).
    ok: Option<(DevAddr, u32)>,
}

/// One endpoint's SRD queue pair (see the module docs).
pub struct EfaDevice {
    ctx: Arc<EfaCtx>,
    channel: *mut ib::ibv_comp_channel,
    scq: *mut ib::ibv_cq,
    rcq_ex: *mut ib::ibv_cq_ex,
    rcq: *mut ib::ibv_cq,
    efa_rcq: *mut ib::efadv_cq,
    qp: *mut ib::ibv_qp,
    qpx: *mut ib::ibv_qp_ex,
    qpn: u32,
    qkey: u32,
    local: DevAddr,
    limits: EfaLimits,
    // Receive.
    rx: ReceiveSlots,
    rx_pending: VecDeque<RxDone>,
    // Send.
    tx_seq: u64,
    inflight: FxHashMap<u64, Inflight>,
    /// Scratch of `send_batch`: the batch's resolved destinations.
    tx_resolved: Vec<ResolvedDst>,
    /// Read requests posted and not completed (they take send queue room).
    read_wrs: u32,
    bounce: BounceSlots,
    wcs: Vec<ib::ibv_wc>,
    /// Destinations of failed sends, for `poll_unreachable` (each once).
    unreachable: VecDeque<DevAddr>,
    check_qp: bool,
    // Reads.
    reads: slab::Slab<EfaRead>,
    read_done: VecDeque<ReadDone>,
    pub stats: EfaStats,
}

// SAFETY: the device owns its verbs objects and buffers; verbs calls are
// thread-safe, and `&mut self` serialises this device's own use.
unsafe impl Send for EfaDevice {}

impl EfaDevice {
    fn open(ctx: Arc<EfaCtx>, spec: &OpenSpec) -> Result<EfaDevice, DeviceError> {
        let limits = ctx.limits;
        let mut dev = EfaDevice {
            channel: ptr::null_mut(),
            scq: ptr::null_mut(),
            rcq_ex: ptr::null_mut(),
            rcq: ptr::null_mut(),
            efa_rcq: ptr::null_mut(),
            qp: ptr::null_mut(),
            qpx: ptr::null_mut(),
            qpn: 0,
            qkey: qkey_for(spec.job_key),
            local: DevAddr::NONE,
            limits,
            rx: ReceiveSlots::new(ctx.pd, limits.mtu, limits.rq_depth)?,
            rx_pending: VecDeque::new(),
            tx_seq: 0,
            inflight: FxHashMap::default(),
            tx_resolved: Vec::new(),
            read_wrs: 0,
            bounce: BounceSlots::new(ctx.pd, limits.mtu, limits.sq_depth)?,
            wcs: vec![ib::ibv_wc::default(); POLL_BATCH],
            unreachable: VecDeque::new(),
            check_qp: false,
            reads: slab::Slab::new(),
            read_done: VecDeque::new(),
            stats: EfaStats::default(),
            ctx,
        };
        // From here on, Drop releases whatever was created.
        // A completion channel where the device can notify (newer EFA
        // kernels); without one the endpoint polls.
        dev.channel = nonblocking_channel(dev.ctx.ctx).unwrap_or(ptr::null_mut());
        dev.create_cqs()?;
        dev.create_qp()?;
        dev.bring_up()?;
        dev.post_receives(0..dev.limits.rq_depth)?;
        dev.local = efa_addr(dev.ctx.gid, dev.qpn);
        Ok(dev)
    }

    /// The send CQ (sends and reads) and the extended receive CQ that
    /// names senders' GIDs: both on the channel when the device takes one
    /// for both; else both without, and the channel destroyed once no CQ
    /// is on it (a channel with a CQ on it cannot be destroyed: it would
    /// leak, and a send CQ on it with a receive CQ off it would wake a
    /// sleeper for sends only).
    fn create_cqs(&mut self) -> Result<(), DeviceError> {
        let ctx = self.ctx.ctx;
        let sq = self.limits.sq_depth as i32;
        let wc_flags = ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN
            | ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP
            | ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID;
        let mut failure = None;
        for on_channel in [true, false] {
            if on_channel && self.channel.is_null() {
                continue;
            }
            if !on_channel && !self.channel.is_null() {
                // No CQ is on the channel now (those made on it were
                // destroyed below): nothing can wake a sleeper, so go.
                // SAFETY: a live channel with no CQ on it, destroyed once.
                unsafe { ib::ibv_destroy_comp_channel(self.channel) };
                self.channel = ptr::null_mut();
            }
            let channel = self.channel;
            // SAFETY: an open context; a channel, if any, outlives the CQ (Drop order).
            self.scq = unsafe { ib::ibv_create_cq(ctx, sq, ptr::null_mut(), channel, 0) };
            if self.scq.is_null() {
                failure = Some(last_err("ibv_create_cq(send)"));
                continue;
            }
            let mut attr = ib::ibv_cq_init_attr_ex {
                cqe: self.limits.rq_depth,
                channel,
                comp_vector: 0,
                wc_flags: wc_flags as u64,
                ..Default::default()
            };
            let mut efa = ib::efadv_cq_init_attr { comp_mask: 0, wc_flags: ib::EFADV_WC_EX_WITH_SGID as u64 };
            // SAFETY: an open context and valid attribute structs of the sizes passed.
            self.rcq_ex = unsafe {
                ib::efadv_create_cq(ctx, &mut attr, &mut efa, std::mem::size_of::<ib::efadv_cq_init_attr>() as u32)
            };
            if !self.rcq_ex.is_null() {
                break;
            }
            failure = Some(last_err("efadv_create_cq(recv, with sgid)"));
            // SAFETY: the send CQ just made, used by nothing, destroyed once.
            unsafe { ib::ibv_destroy_cq(self.scq) };
            self.scq = ptr::null_mut();
        }
        if self.scq.is_null() || self.rcq_ex.is_null() {
            return Err(failure.unwrap_or_else(|| DeviceError::Config("efa: no completion queues".into())));
        }
        // SAFETY: a live extended CQ.
        self.rcq = unsafe { ib::ibv_cq_ex_to_cq(self.rcq_ex) };
        // SAFETY: as above, made by efadv_create_cq.
        self.efa_rcq = unsafe { ib::efadv_cq_from_ibv_cq_ex(self.rcq_ex) };
        if self.efa_rcq.is_null() {
            return Err(DeviceError::Config("efa: efadv_cq_from_ibv_cq_ex gave nothing".into()));
        }
        Ok(())
    }

    fn create_qp(&mut self) -> Result<(), DeviceError> {
        let mut ops = ib::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND;
        if self.limits.max_rdma_size.is_some() {
            ops |= ib::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ;
        }
        let mut init = ib::ibv_qp_init_attr_ex {
            send_cq: self.scq,
            recv_cq: self.rcq,
            cap: ib::ibv_qp_cap {
                max_send_wr: self.limits.sq_depth,
                max_recv_wr: self.limits.rq_depth,
                max_send_sge: self.limits.send_sges as u32,
                max_recv_sge: 1,
                max_inline_data: self.limits.max_inline as u32,
            },
            qp_type: ib::ibv_qp_type_IBV_QPT_DRIVER,
            sq_sig_all: 0,
            comp_mask: ib::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
                | ib::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            pd: self.ctx.pd,
            send_ops_flags: ops as u64,
            ..Default::default()
        };
        let mut efa = ib::efadv_qp_init_attr { driver_qp_type: ib::EFADV_QP_DRIVER_TYPE_SRD, ..Default::default() };
        // SAFETY: an open context, live PD and CQs; valid in/out structs of the sizes passed.
        self.qp = unsafe {
            ib::efadv_create_qp_ex(
                self.ctx.ctx,
                &mut init,
                &mut efa,
                std::mem::size_of::<ib::efadv_qp_init_attr>() as u32,
            )
        };
        if self.qp.is_null() {
            return Err(last_err("efadv_create_qp_ex(SRD)"));
        }
        // The provider may round the depths up; never beyond what was asked
        // for is used. Inline: what it granted.
        self.limits.max_inline = self.limits.max_inline.min(init.cap.max_inline_data.min(u16::MAX as u32) as u16);
        // SAFETY: a live QP made with send ops flags, so it has the extended part.
        self.qpx = unsafe { ib::ibv_qp_to_qp_ex(self.qp) };
        if self.qpx.is_null() {
            return Err(DeviceError::Config("efa: the SRD queue pair has no extended send API".into()));
        }
        // SAFETY: a live QP.
        self.qpn = unsafe { (*self.qp).qp_num };
        Ok(())
    }

    fn modify(
        &mut self,
        attr: &mut ib::ibv_qp_attr,
        mask: ib::ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    /// RESET -> INIT (P_Key index 0, port, Q_Key) -> RTR -> RTS (SQ PSN 0,
    /// RNR retry forever where the device takes it).
    fn bring_up(&mut self) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qkey: self.qkey,
            ..Default::default()
        };
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
            "ibv_modify_qp(SRD INIT)",
        )?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTR, ..Default::default() };
        self.modify(&mut a, m::IBV_QP_STATE, "ibv_modify_qp(SRD RTR)")?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTS, sq_psn: 0, ..Default::default() };
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if self.limits.rnr_retry {
            a.rnr_retry = RNR_RETRY_INFINITE;
            mask |= m::IBV_QP_RNR_RETRY;
        }
        self.modify(&mut a, mask, "ibv_modify_qp(SRD RTS)")
    }

    /// Posts receive slots `slots` as one chain.
    fn post_receives(&mut self, slots: impl Iterator<Item = u32>) -> Result<(), DeviceError> {
        self.rx.post(self.qp, slots)
    }

    /// Send queue entries in use (sends and read requests in flight).
    fn sq_used(&self) -> usize {
        self.inflight.len() + self.read_wrs as usize
    }

    /// Takes in send and read completions; brings the QP back if one failed.
    fn reap_sends(&mut self) {
        self.poll_send_cq();
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
    }

    /// Takes in every send and read completion the send CQ holds; returns
    /// how many.
    fn poll_send_cq(&mut self) -> usize {
        let ctx = self.ctx.clone();
        let mut total = 0;
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.scq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            total += n as usize;
            let mut ahs = ctx.lock_ahs();
            for i in 0..n as usize {
                let wc = self.wcs[i];
                if wc.wr_id & READ_WR != 0 {
                    self.read_completed(wc, &mut ahs);
                } else {
                    self.send_completed(wc, &mut ahs);
                }
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
        total
    }

    /// `dst` goes to `poll_unreachable` (once while it waits there).
    fn mark_unreachable(&mut self, dst: DevAddr) {
        if !self.unreachable.contains(&dst) {
            self.unreachable.push_back(dst);
        }
    }

    /// A send's completion. Any status but success means the datagram is
    /// lost, and nothing resends it (the engine runs no retransmission on
    /// this reliable path): its destination goes to `poll_unreachable`, so
    /// that the engine fails that peer rather than wait on a gap forever.
    /// That holds for a flushed send too (the queue pair went to an error
    /// state under it: this device never moves it there on purpose; at
    /// teardown nothing is polled) and for a gathered send whose
    /// registration was gone (rdmx's fault, not the peer's, but the
    /// datagram is lost all the same).
    fn send_completed(&mut self, wc: ib::ibv_wc, ahs: &mut AhTable) {
        let Some(f) = self.inflight.remove(&wc.wr_id) else { return };
        ahs.release(&f.gid, 1);
        if let Some(b) = f.bounce {
            self.bounce.give_back(b);
        }
        if wc.status == ib::ibv_wc_status_IBV_WC_SUCCESS {
            return;
        }
        self.stats.send_errors += 1;
        if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
            // The queue pair is in an error state: bring it back.
            self.check_qp = true;
        } else {
            self.stats.last_error_status = wc.status;
        }
        let local = matches!(
            wc.status,
            ib::ibv_wc_status_IBV_WC_LOC_PROT_ERR
                | ib::ibv_wc_status_IBV_WC_LOC_LEN_ERR
                | ib::ibv_wc_status_IBV_WC_LOC_QP_OP_ERR
        );
        if local {
            self.check_qp = true;
            if f.gathered {
                self.stats.gathered_send_errors += 1;
            }
        }
        self.mark_unreachable(f.dst);
    }

    fn read_completed(&mut self, wc: ib::ibv_wc, ahs: &mut AhTable) {
        self.read_wrs = self.read_wrs.saturating_sub(1);
        let slot = (wc.wr_id & !READ_WR) as usize;
        let Some(r) = self.reads.get_mut(slot) else { return };
        ahs.release(&r.gid, 1);
        if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS && r.status.is_none() {
            r.status = Some(wc.status);
        }
        if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
            self.check_qp = true;
        }
        r.wrs_left -= 1;
        if r.wrs_left != 0 {
            return;
        }
        let r = self.reads.remove(slot);
        match r.status {
            None => {
                self.stats.read_bytes += r.bytes;
                self.read_done.push_back(ReadDone { id: r.id, bytes: r.bytes, error: None });
            }
            Some(status) => {
                self.stats.read_errors += 1;
                if matches!(status, ib::ibv_wc_status_IBV_WC_RESP_TIMEOUT_ERR | ib::ibv_wc_status_IBV_WC_RETRY_EXC_ERR)
                {
                    self.stats.read_timeouts += 1;
                }
                if status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    self.stats.last_error_status = status;
                    self.stats.last_read_status = status;
                }
                // Pieces complete in any order: no prefix is known to have
                // arrived, so none is claimed. `NotConnected`: the sender
                // pushes the whole message (an I/O error would fail the
                // receive), unless the peer itself has failed; the status
                // is kept in `stats.last_read_status`.
                self.read_done.push_back(ReadDone { id: r.id, bytes: 0, error: Some(DeviceError::NotConnected) });
            }
        }
    }

    /// Brings the QP back after a local error moved it to an error state:
    /// SQE -> RTS (the sends flushed meanwhile completed in error: their
    /// destinations are unreachable), or after ERR through RESET. Before
    /// the reset every completion the CQs hold is taken in: receives that
    /// arrived are kept and delivered, sends and reads are answered as
    /// usual. Every send no completion answered is lost: its destination
    /// goes to `poll_unreachable`; every such read completes
    /// `NotConnected` (pushed). Then every receive slot that holds no
    /// undelivered datagram is posted again.
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
                if self.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_CUR_STATE, "ibv_modify_qp(SQE->RTS)").is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            ib::ibv_qp_state_IBV_QPS_ERR => {
                // What completed before the error (some providers drop a
                // QP's completions from its CQs at the reset).
                self.poll_send_cq();
                while self.poll_recv(POLL_BATCH) > 0 {}
                let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RESET, ..Default::default() };
                if self.modify(&mut a, m::IBV_QP_STATE, "ibv_modify_qp(RESET)").is_err() {
                    return;
                }
                self.poll_send_cq();
                while self.poll_recv(POLL_BATCH) > 0 {}
                self.drop_unanswered_requests();
                // Failed receives' slots are posted below with the free ones.
                self.rx_pending.retain(|rx| rx.ok.is_some());
                let mut held = vec![false; self.limits.rq_depth as usize];
                for rx in &self.rx_pending {
                    held[rx.slot as usize] = true;
                }
                let free = (0..self.limits.rq_depth).filter(|&s| !held[s as usize]);
                if self.bring_up().is_ok() && self.post_receives(free).is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            _ => {}
        }
        // Flushes taken in above asked for this very recovery.
        self.check_qp = false;
    }

    /// Sends and reads of a reset queue pair that no completion answered:
    /// sends are lost (their destinations unreachable), reads complete
    /// `NotConnected`; their bounce slots and AH uses are given back.
    fn drop_unanswered_requests(&mut self) {
        let ctx = self.ctx.clone();
        let mut ahs = ctx.lock_ahs();
        for (_, f) in std::mem::take(&mut self.inflight) {
            ahs.release(&f.gid, 1);
            if let Some(b) = f.bounce {
                self.bounce.give_back(b);
            }
            self.stats.send_errors += 1;
            if !self.unreachable.contains(&f.dst) {
                self.unreachable.push_back(f.dst);
            }
        }
        self.read_wrs = 0;
        for (_, r) in std::mem::take(&mut self.reads) {
            ahs.release(&r.gid, r.wrs_left);
            self.stats.read_errors += 1;
            self.read_done.push_back(ReadDone { id: r.id, bytes: 0, error: Some(DeviceError::NotConnected) });
        }
    }

    /// The sender of the completion the receive CQ is at: its GID from the
    /// AH number in `slid` (a live AH of the domain, or a tombstone: see
    /// [`AhTable`]), else from the completion itself.
    fn source_of_current(&self, ahs: &AhTable) -> Option<DevAddr> {
        // SAFETY: called inside a started poll on a CQ made with SRC_QP and SLID.
        let (src_qp, slid) = unsafe { (ib::ibv_wc_read_src_qp(self.rcq_ex), ib::ibv_wc_read_slid(self.rcq_ex)) };
        if slid != AHN_UNKNOWN {
            if let Some(gid) = ahs.gid_of_ahn(slid as u16) {
                return Some(efa_addr(gid, src_qp));
            }
            // A number this domain was never given: the completion may
            // still carry the GID (else the sender is unknown).
        }
        let mut gid = ib::ibv_gid::default();
        // SAFETY: inside a started poll of the CQ this efadv_cq belongs to
        // (made with EFADV_WC_EX_WITH_SGID); a valid out-pointer.
        if unsafe { ib::efadv_wc_read_sgid(self.efa_rcq, &mut gid) } != 0 {
            return None;
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Some(efa_addr(unsafe { gid.raw }, src_qp))
    }

    /// Takes up to `max` receive completions into `rx_pending`; returns
    /// how many.
    fn poll_recv(&mut self, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let mut attr = ib::ibv_poll_cq_attr::default();
        // SAFETY: a live extended CQ; a started poll is ended below.
        if unsafe { ib::ibv_start_poll(self.rcq_ex, &mut attr) } != 0 {
            return 0;
        }
        let ctx = self.ctx.clone();
        let ahs = ctx.lock_ahs();
        let mut n = 0;
        loop {
            // SAFETY: inside a started poll: the CQ's current completion.
            let (wr_id, status) = unsafe { ((*self.rcq_ex).wr_id, (*self.rcq_ex).status) };
            let ok = if status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                if status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    self.check_qp = true;
                } else {
                    self.stats.recv_errors += 1;
                }
                None
            } else {
                // SAFETY: inside a started poll on a CQ made with BYTE_LEN.
                let len = unsafe { ib::ibv_wc_read_byte_len(self.rcq_ex) };
                if len as usize > self.rx.slot_len() {
                    self.stats.recv_errors += 1;
                    None
                } else {
                    let src = self.source_of_current(&ahs);
                    if src.is_none() {
                        self.stats.unknown_sources += 1;
                    }
                    src.map(|s| (s, len))
                }
            };
            if wr_id < self.limits.rq_depth as u64 {
                self.rx_pending.push_back(RxDone { slot: wr_id as u32, ok });
            }
            n += 1;
            // SAFETY: inside a started poll.
            if n >= max || unsafe { ib::ibv_next_poll(self.rcq_ex) } != 0 {
                break;
            }
        }
        drop(ahs);
        // SAFETY: ends the poll started above.
        unsafe { ib::ibv_end_poll(self.rcq_ex) };
        n
    }

    /// Posts the slots of delivered datagrams again. A queue pair in an
    /// error state may refuse them: then the recovery that follows posts
    /// every slot that holds no undelivered datagram (these included)
    /// after its reset, and the datagrams already taken in are not lost
    /// for an error returned here.
    fn repost_delivered(&mut self, slots: &[u32]) {
        if self.post_receives(slots.iter().copied()).is_err() {
            self.stats.recv_errors += 1;
            self.check_qp = true;
        }
    }

    /// Consumes the channel's events (acknowledging them per CQ).
    fn ack_events(&mut self) {
        if self.channel.is_null() {
            return;
        }
        let (mut nr, mut ns) = (0, 0);
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live channel (non-blocking fd) and valid out-pointers.
            if unsafe { ib::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) } != 0 {
                break;
            }
            if cq == self.scq {
                ns += 1;
            } else {
                nr += 1;
            }
        }
        if nr > 0 {
            // SAFETY: events of the receive CQ.
            unsafe { ib::ibv_ack_cq_events(self.rcq, nr) };
        }
        if ns > 0 {
            // SAFETY: events of the send CQ.
            unsafe { ib::ibv_ack_cq_events(self.scq, ns) };
        }
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The Q_Key of this queue pair.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Sends and read requests posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.sq_used()
    }

    /// One send work request for `d` on the started send session.
    fn post_one(&mut self, d: &TxDatagram<'_>, ah: *mut ib::ibv_ah, qpn: u32, seq: u64) -> Option<u32> {
        let len = d.data.len();
        let gather = d.gather.filter(|g| !g.is_empty());
        let qpx = self.qpx;
        let mut flags = ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let inline = gather.is_none() && len <= self.limits.max_inline as usize;
        if inline {
            flags |= ib::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // SAFETY: inside a started session of a live QP with the extended
        // API; the AH is live (its in-flight count keeps it cached).
        unsafe {
            (*qpx).wr_id = seq;
            (*qpx).wr_flags = flags;
            ib::ibv_wr_send(qpx);
            ib::ibv_wr_set_ud_addr(qpx, ah, qpn, self.qkey);
        }
        if inline {
            self.stats.inline_sends += 1;
            // SAFETY: the provider copies the bytes into the WQE now.
            unsafe { ib::ibv_wr_set_inline_data(qpx, d.data.as_ptr() as *mut _, len) };
            return None;
        }
        let mut sges = [ib::ibv_sge::default(); 2];
        let mut n = 0;
        let mut bounce = None;
        match gather {
            Some(g) if self.limits.send_sges < 2 => {
                // One SGE only: both parts into a bounce slot.
                // SAFETY: a gathered part is memory its sender vouched for
                // until the message completes, after this send.
                let part = unsafe { std::slice::from_raw_parts(g.addr() as *const u8, g.len() as usize) };
                let (b, sge) = self
                    .bounce
                    .copy_in(&[d.data, part])
                    .expect("send_batch took no more datagrams than free bounce slots");
                sges[0] = sge;
                n = 1;
                bounce = Some(b);
                self.stats.bounce_copies += 1;
            }
            _ => {
                if len > 0 {
                    let (b, sge) = self
                        .bounce
                        .copy_in(&[d.data])
                        .expect("send_batch took no more datagrams than free bounce slots");
                    sges[n] = sge;
                    bounce = Some(b);
                    self.stats.bounce_copies += 1;
                    n += 1;
                }
                if let Some(g) = gather {
                    self.stats.gathered_sends += 1;
                    let (lkey, _) = mr_keys(g.key().unwrap_or(0));
                    sges[n] = ib::ibv_sge { addr: g.addr(), length: g.len() as u32, lkey };
                    n += 1;
                }
            }
        }
        // SAFETY: inside the started session; the provider copies the list
        // now. Each SGE names a lent transmit buffer, a bounce slot or a
        // gathered part (registered application memory valid until its
        // message completes, after this send's completion).
        unsafe { ib::ibv_wr_set_sge_list(qpx, n, sges.as_ptr()) };
        bounce
    }
}

impl Device for EfaDevice {
    fn caps(&self) -> DeviceCaps {
        self.limits.caps()
    }

    fn local_addr(&self) -> DevAddr {
        self.local
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        parse_efa_addr(addr).is_some()
    }

    /// Resolves the address handles of the datagrams that fit (one lock of
    /// the domain's table, AHs made where missing: kernel calls), then
    /// posts them in one `ibv_wr_*` session, which holds the send queue's
    /// lock and so makes no kernel call.
    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.reap_sends();
        // Each request takes at most one bounce slot, claimed in the middle
        // of a work-request session that cannot be abandoned: a batch never
        // holds more datagrams than there are free slots.
        let room = (self.limits.sq_depth as usize).saturating_sub(self.sq_used()).min(self.bounce.available());
        if room < batch.len() {
            self.stats.sq_full += 1;
        }
        let mut resolved = std::mem::take(&mut self.tx_resolved);
        resolved.clear();
        let mut failure = None;
        {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            for d in batch.iter().take(room) {
                let Some((gid, qpn)) = parse_efa_addr(&d.dst) else {
                    failure = Some(DeviceError::Unreachable(d.dst));
                    break;
                };
                if d.wire_len() > self.limits.mtu {
                    failure = Some(DeviceError::TooLarge { len: d.wire_len(), mtu: self.limits.mtu });
                    break;
                }
                match ctx.acquire_ah(&mut ahs, gid, &mut self.stats) {
                    Ok(ah) => resolved.push(ResolvedDst { ah, qpn, gid }),
                    // No room for an AH now: the rest waits (back-pressure).
                    Err(AhError::Busy) => break,
                    Err(AhError::Unreachable) => {
                        self.mark_unreachable(d.dst);
                        failure = Some(DeviceError::Unreachable(d.dst));
                        break;
                    }
                }
            }
        }
        if resolved.is_empty() {
            self.tx_resolved = resolved;
            return match failure {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        let first_seq = self.tx_seq;
        // SAFETY: a live QP with the extended API; completed below.
        unsafe { ib::ibv_wr_start(self.qpx) };
        for (d, r) in batch.iter().zip(&resolved) {
            let seq = self.tx_seq;
            self.tx_seq += 1;
            let bounce = self.post_one(d, r.ah, r.qpn, seq);
            self.inflight.insert(
                seq,
                Inflight { dst: d.dst, gid: r.gid, bounce, gathered: d.gather.is_some_and(|g| !g.is_empty()) },
            );
        }
        let count = resolved.len();
        // SAFETY: ends the session started above: posts every request of it
        // or none.
        let rc = unsafe { ib::ibv_wr_complete(self.qpx) };
        if rc != 0 {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            for seq in first_seq..self.tx_seq {
                if let Some(f) = self.inflight.remove(&seq) {
                    ahs.release(&f.gid, 1);
                    if let Some(b) = f.bounce {
                        self.bounce.give_back(b);
                    }
                }
            }
            drop(ahs);
            self.tx_seq = first_seq;
            self.tx_resolved = resolved;
            // A full queue (the provider counts its own entries): try later.
            if rc == libc::ENOMEM {
                return Ok(0);
            }
            return Err(ret_err("ibv_wr_complete(send)", rc));
        }
        self.tx_resolved = resolved;
        self.stats.sent += count as u64;
        Ok(count)
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
            let Some(rx) = self.rx_pending.pop_front() else { break };
            if let Some((src, len)) = rx.ok {
                deliver(src, self.rx.bytes(rx.slot as usize, len as usize));
                delivered += 1;
                self.stats.received += 1;
            }
            repost[nrepost] = rx.slot;
            nrepost += 1;
            if nrepost == POLL_BATCH {
                self.repost_delivered(&repost);
                nrepost = 0;
            }
            if self.rx_pending.is_empty() && delivered < max {
                self.poll_recv(max - delivered);
            }
        }
        self.repost_delivered(&repost[..nrepost]);
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel lives as long as the device.
        (!self.channel.is_null()).then(|| unsafe { (*self.channel).fd })
    }

    /// Arms the receive CQ, and the send CQ whenever sends or reads are
    /// outstanding: a sender held back by a full send queue (or by AHs all
    /// in use) is woken by the completion that makes room, and a read's
    /// completion wakes its reader. Ready now (do not sleep): a datagram
    /// or a read's end waiting, a failed destination to report, or a send
    /// completion taken in after the arm (room the caller may use).
    fn prepare_wait(&mut self) -> bool {
        self.ack_events();
        if !self.rx_pending.is_empty() || !self.read_done.is_empty() || !self.unreachable.is_empty() {
            return true;
        }
        if !self.channel.is_null() {
            // SAFETY: a live CQ on the channel.
            unsafe { ib::ibv_req_notify_cq(self.rcq, 0) };
            if self.sq_used() > 0 {
                // SAFETY: as above.
                unsafe { ib::ibv_req_notify_cq(self.scq, 0) };
            }
        }
        // A completion that arrived before the arm raises no event: look.
        let sends_done = self.poll_send_cq() > 0;
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
        self.poll_recv(POLL_BATCH);
        sends_done || !self.rx_pending.is_empty() || !self.read_done.is_empty() || !self.unreachable.is_empty()
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

impl RemoteReads for EfaDevice {
    /// RDMA read on the SRD queue pair itself: one request per piece of at
    /// most `max_rdma_size`, all posted in one session.
    fn post_read(
        &mut self,
        _now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        let Some(max) = self.limits.max_rdma_size else {
            return Err(DeviceError::Unsupported);
        };
        let Some((gid, qpn)) = parse_efa_addr(&peer) else {
            return Err(DeviceError::Unsupported);
        };
        self.reap_sends();
        let pieces = split_read(runs, max)?;
        if pieces.is_empty() {
            self.read_done.push_back(ReadDone { id, bytes: 0, error: None });
            return Ok(());
        }
        if pieces.len() > (self.limits.sq_depth as usize).saturating_sub(self.sq_used()) {
            self.stats.reads_deferred += 1;
            return Err(DeviceError::NotConnected);
        }
        // One AH use per request (each completion gives one back).
        let ah = {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            let ah = match ctx.acquire_ah(&mut ahs, gid, &mut self.stats) {
                Ok(ah) => ah,
                Err(AhError::Busy) => {
                    self.stats.reads_deferred += 1;
                    return Err(DeviceError::NotConnected);
                }
                Err(AhError::Unreachable) => return Err(DeviceError::Unreachable(peer)),
            };
            for _ in 1..pieces.len() {
                ahs.take(&gid);
            }
            ah
        };
        let slot = self.reads.vacant_key() as u64;
        let wr_id = READ_WR | slot;
        let qpx = self.qpx;
        // SAFETY: a live QP made with IBV_QP_EX_WITH_RDMA_READ (the device
        // has the cap); the AH is live; each local SGE names memory the
        // caller vouched for until this read completes (`LocalBuf`),
        // registered under its lkey; the session is completed below.
        let rc = unsafe {
            ib::ibv_wr_start(qpx);
            for p in &pieces {
                (*qpx).wr_id = wr_id;
                (*qpx).wr_flags = ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
                ib::ibv_wr_rdma_read(qpx, p.rkey, p.remote_addr);
                ib::ibv_wr_set_ud_addr(qpx, ah, qpn, self.qkey);
                ib::ibv_wr_set_sge(qpx, p.lkey, p.addr, p.len);
            }
            ib::ibv_wr_complete(qpx)
        };
        if rc != 0 {
            self.ctx.lock_ahs().release(&gid, pieces.len() as u32);
            self.stats.reads_deferred += 1;
            // Nothing was posted: pushed this time, read later (the errno
            // is the provider's: a full queue, or a request it refused).
            self.stats.last_error_status = rc.unsigned_abs();
            return Err(DeviceError::NotConnected);
        }
        let bytes = pieces.iter().map(|p| p.len as u64).sum();
        let key = self.reads.insert(EfaRead { id, gid, wrs_left: pieces.len() as u32, bytes, status: None });
        debug_assert_eq!(key as u64, slot);
        self.read_wrs += pieces.len() as u32;
        self.stats.reads += 1;
        self.stats.read_requests += pieces.len() as u64;
        Ok(())
    }

    fn poll_read(&mut self, _now: rdm::time::Instant) -> Option<ReadDone> {
        if self.read_done.is_empty() && !self.reads.is_empty() {
            self.reap_sends();
        }
        self.read_done.pop_front()
    }

    fn read_conn_stats(&self) -> rdm::device::ReadConnStats {
        // No connections: SRD reads on the datagram queue pair. No timer
        // of rdmx's either: a timeout is the device's (the remote did not
        // answer), and the status the last failed read request's.
        rdm::device::ReadConnStats {
            reads: self.stats.reads,
            read_bytes: self.stats.read_bytes,
            read_failures: self.stats.read_errors,
            read_timeouts: self.stats.read_timeouts,
            last_read_error: self.stats.last_read_status,
            ..Default::default()
        }
    }
}

impl Drop for EfaDevice {
    fn drop(&mut self) {
        // SAFETY: every object is destroyed once, users before what they
        // use: the QP (nothing more is posted or written), the CQs (their
        // events acknowledged), the channel, the MRs; the AHs, PD and
        // context go with the last Arc of the context.
        unsafe {
            if !self.qp.is_null() {
                ib::ibv_destroy_qp(self.qp);
            }
        }
        // The requests in flight never complete now: their AH uses go back
        // to the domain (whose other endpoints go on).
        {
            let mut ahs = self.ctx.lock_ahs();
            for f in self.inflight.values() {
                ahs.release(&f.gid, 1);
            }
            for (_, r) in &self.reads {
                ahs.release(&r.gid, r.wrs_left);
            }
        }
        self.ack_events();
        // SAFETY: as above.
        unsafe {
            if !self.scq.is_null() {
                ib::ibv_destroy_cq(self.scq);
            }
            if !self.rcq.is_null() {
                ib::ibv_destroy_cq(self.rcq);
            } else if !self.rcq_ex.is_null() {
                ib::ibv_destroy_cq(ib::ibv_cq_ex_to_cq(self.rcq_ex));
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
    use rdm::device::LocalBuf;

    fn attr(caps: u32) -> ib::efadv_device_attr {
        ib::efadv_device_attr {
            max_sq_wr: 512,
            max_rq_wr: 8192,
            max_sq_sge: 2,
            max_rq_sge: 1,
            inline_buf_size: 32,
            device_caps: caps,
            max_rdma_size: 1 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn address_round_trip_and_foreign_families() {
        let gid: [u8; 16] = std::array::from_fn(|i| 0xfe - i as u8);
        let a = efa_addr(gid, 0xabcdef);
        assert_eq!(parse_efa_addr(&a), Some((gid, 0xabcdef)));
        let DevAddr::Raw(r) = a else { panic!("raw") };
        assert_eq!(r.family(), RawAddr::FAMILY_EFA);
        assert_eq!(r.bytes().len(), EFA_ADDR_LEN);
        assert_eq!(&r.bytes()[16..], &0xabcdefu32.to_le_bytes());
        // A verbs UD address (another family), a wrong length, a socket.
        assert_eq!(parse_efa_addr(&crate::verbs::ud_addr(gid, 7, 0)), None);
        assert_eq!(parse_efa_addr(&DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_EFA, &[0; 22]).unwrap())), None);
        assert_eq!(parse_efa_addr(&DevAddr::NONE), None);
        assert_eq!(crate::verbs::parse_ud_addr(&a), None);
    }

    #[test]
    fn limits_and_caps_from_the_device_attributes() {
        let all = ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ
            | ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY
            | ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID;
        let l = EfaLimits::from_attr(&attr(all), 8928, 32768, 0, 0);
        assert_eq!(
            l,
            EfaLimits {
                mtu: 8928,
                sq_depth: 256,
                rq_depth: 512,
                max_inline: 32,
                send_sges: 2,
                max_rdma_size: Some(1 << 30),
                rnr_retry: true,
                cq_with_sgid: true
            }
        );
        let c = l.caps();
        assert!(c.reliable && !c.ordered && c.remote_read && c.registration && !c.gso);
        assert_eq!((c.mtu, c.max_inline), (8928, 32));
        // The device's depths bound what is asked for; so do its CQs.
        let l = EfaLimits::from_attr(&attr(all), 8928, 300, 4096, 4096);
        assert_eq!((l.sq_depth, l.rq_depth), (300, 300));
        let l = EfaLimits::from_attr(&attr(all), 8928, 1 << 20, 4096, 4096);
        assert_eq!((l.sq_depth, l.rq_depth), (512, 4096));
        // No RDMA read: the windowed push; no RNR retry cap; no SGID.
        let l = EfaLimits::from_attr(&attr(ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID), 8928, 1024, 0, 0);
        assert_eq!(l.max_rdma_size, None);
        assert!(!l.caps().remote_read && !l.rnr_retry && l.cq_with_sgid);
        let l = EfaLimits::from_attr(&attr(0), 8928, 1024, 0, 0);
        assert!(!l.cq_with_sgid);
        // A read cap with a size of 0 cannot read.
        let mut a = attr(ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ);
        a.max_rdma_size = 0;
        assert_eq!(EfaLimits::from_attr(&a, 8928, 1024, 0, 0).max_rdma_size, None);
        // One SGE; inline larger than the datagram is cut to it.
        let mut a = attr(0);
        a.max_sq_sge = 1;
        a.inline_buf_size = 9000;
        let l = EfaLimits::from_attr(&a, 8928, 1024, 0, 0);
        assert_eq!((l.send_sges, l.max_inline), (1, 8928));
    }

    #[test]
    fn reads_split_by_max_rdma_size() {
        let buf = vec![0u8; 10_000];
        // SAFETY: `buf` outlives the runs; nothing reads through them.
        let local = unsafe { LocalBuf::new(buf.as_ptr() as u64, 10_000) }.with_key(crate::verbs::mr_key(0x11, 0x22));
        let remote_key = Some(crate::verbs::mr_key(0x33, 0x44));
        let runs = [
            ReadRun { remote_addr: 0x1000_0000, remote_key, local: local.sub(0, 9000).unwrap() },
            ReadRun { remote_addr: 0x2000_0000, remote_key, local: local.sub(9000, 0).unwrap() },
            ReadRun { remote_addr: 0x3000_0000, remote_key, local: local.sub(9000, 1000).unwrap() },
        ];
        let p = split_read(&runs, 4096).unwrap();
        let base = buf.as_ptr() as u64;
        assert_eq!(
            p,
            vec![
                ReadPiece { remote_addr: 0x1000_0000, rkey: 0x44, addr: base, lkey: 0x11, len: 4096 },
                ReadPiece { remote_addr: 0x1000_1000, rkey: 0x44, addr: base + 4096, lkey: 0x11, len: 4096 },
                ReadPiece { remote_addr: 0x1000_2000, rkey: 0x44, addr: base + 8192, lkey: 0x11, len: 808 },
                ReadPiece { remote_addr: 0x3000_0000, rkey: 0x44, addr: base + 9000, lkey: 0x11, len: 1000 },
            ]
        );
        assert_eq!(p.iter().map(|p| p.len as u64).sum::<u64>(), 10_000);
        assert_eq!(split_read(&runs, 1 << 30).unwrap().len(), 2);
        let no_key = [ReadRun { remote_addr: 0, remote_key: None, local }];
        assert!(matches!(split_read(&no_key, 4096), Err(DeviceError::Config(_))));
    }

    /// Hosts without an EFA device (this one, CI's, the Soft-RoCE VM):
    /// opening is a `Config` error that says why, never a panic.
    #[test]
    fn opening_without_an_efa_device_is_a_config_error() {
        match EfaContext::open(&EfaConfig::default()) {
            Ok(c) => eprintln!("an EFA device is here: {c:?}"),
            Err(DeviceError::Config(why)) => {
                assert!(why.starts_with("efa: no"), "{why}");
                if crate::verbs::VerbsContext::available() {
                    // RDMA devices of another provider (Soft-RoCE in the
                    // VM): asked, each refused by name.
                    assert!(why.contains("efadv_query_device refuses"), "{why}");
                }
                assert!(!EfaContext::available());
            }
            Err(e) => panic!("not a Config error: {e}"),
        }
        match EfaContext::open(&EfaConfig { device: Some("no-such-rdma-device".into()), ..Default::default() }) {
            Err(DeviceError::Config(why)) => assert!(why.contains("no RDMA device"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn mr_access_mask_follows_the_device_caps() {
        let lw = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let rr = ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        let rw = ib::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let read = efa_mr_access_mask(ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ | ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID);
        assert_eq!(read, lw | rr);
        assert_eq!(efa_mr_access_mask(ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY), lw);
        assert_eq!(efa_mr_access_mask(u32::MAX) & rw, 0, "no remote write on EFA here");
        // What the registrar asks for, cut to the mask: never a bit
        // efa_alloc_mr refuses.
        use crate::verbs::{ibv_access, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_SEND};
        for access in [
            0,
            FI_SEND,
            FI_RECV,
            FI_READ,
            FI_REMOTE_READ,
            FI_REMOTE_WRITE,
            FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE,
        ] {
            for mask in [read, lw] {
                let got = ibv_access(access) & mask;
                assert_eq!(got & !mask, 0);
                if mask == read && access & (FI_SEND | FI_REMOTE_READ) != 0 {
                    assert_ne!(got & rr, 0, "readable where the device reads");
                }
            }
        }
        assert_eq!(ibv_access(FI_REMOTE_WRITE) & read, lw);
        assert_eq!(ibv_access(FI_SEND) & lw, 0);
    }

    fn fake_ah(n: usize) -> *mut ib::ibv_ah {
        // Never dereferenced: the table only keeps and hands back pointers.
        n as *mut ib::ibv_ah
    }

    #[test]
    fn ah_table_shares_counts_uses_and_evicts_only_unused_lru() {
        let (a, b, c) = ([1u8; 16], [2u8; 16], [3u8; 16]);
        let mut t = AhTable::new(2);
        assert_eq!(t.take(&a), None);
        t.insert(a, fake_ah(0x10), 7);
        assert_eq!(t.take(&a), Some(fake_ah(0x10)), "one AH per GID, shared");
        assert_eq!(t.users(&a), Some(2));
        t.insert(b, fake_ah(0x20), 8);
        assert!(t.is_full());
        // Both in use: nothing can go (the caller answers Busy).
        assert_eq!(t.evict_lru(), None);
        t.release(&b, 1);
        assert_eq!(t.evict_lru(), Some(fake_ah(0x20)));
        assert!(!t.is_full());
        // b's number still names b (a tombstone) for completions written
        // before its AH went.
        assert_eq!(t.gid_of_ahn(8), Some(b));
        assert_eq!(t.take(&b), None);
        // Least recently used among the unused goes first.
        t.release(&a, 2);
        t.insert(c, fake_ah(0x30), 9);
        t.release(&c, 1);
        assert_eq!(t.take(&a), Some(fake_ah(0x10)));
        t.release(&a, 1);
        assert_eq!(t.evict_lru(), Some(fake_ah(0x30)));
        assert_eq!(t.gid_of_ahn(9), Some(c));
        // A new AH that gets a tombstone's number takes it over.
        t.insert(b, fake_ah(0x40), 9);
        assert_eq!(t.gid_of_ahn(9), Some(b));
        assert_eq!(t.gid_of_ahn(7), Some(a));
        assert_eq!(t.gid_of_ahn(99), None, "never given: unknown");
        let mut left = t.drain();
        left.sort();
        assert_eq!(left, vec![fake_ah(0x10), fake_ah(0x40)]);
    }

    #[test]
    fn ah_errnos_that_mean_no_room_are_back_pressure() {
        for e in [libc::ENOMEM, libc::EAGAIN, libc::ENOSPC, libc::ENOBUFS] {
            assert!(ah_errno_is_no_room(Some(e)));
        }
        for e in [Some(libc::EINVAL), Some(libc::EOPNOTSUPP), Some(libc::ENODEV), None] {
            assert!(!ah_errno_is_no_room(e));
        }
    }

    #[test]
    fn a_read_whose_remote_range_wraps_fails_without_a_panic() {
        let buf = vec![0u8; 4096];
        // SAFETY: `buf` outlives the runs; nothing reads through them.
        let local = unsafe { LocalBuf::new(buf.as_ptr() as u64, 4096) }.with_key(crate::verbs::mr_key(0x11, 0x22));
        let remote_key = Some(crate::verbs::mr_key(0x33, 0x44));
        let wraps = [ReadRun { remote_addr: u64::MAX - 100, remote_key, local }];
        match split_read(&wraps, 1024) {
            Err(DeviceError::Io { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::InvalidInput),
            other => panic!("{other:?}"),
        }
        // The last byte at the top of the address space is fine.
        let top = [ReadRun { remote_addr: u64::MAX - 4096, remote_key, local }];
        let p = split_read(&top, 1024).unwrap();
        assert_eq!(p.last().map(|p| p.remote_addr + p.len as u64), Some(u64::MAX));
    }
}
