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
//! still uses is not destroyed by the cache's eviction (the cache is
//! `crate::ib::AhCache`, EFA's too: a full cache whose every handle is in
//! use holds the send back, a short count, and never grows past its bound).
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
//!
//! # Layout
//!
//! This file: the constants, the address format, the configuration, the
//! counters, the device's struct, its opening and its teardown. Apart, each
//! in its own file so that each part reads on its own: `context.rs`
//! (discovery: which device, port and GID; the domain's context),
//! `ud.rs` (the UD queue pair: sends, receives, address handles, recovery;
//! the [`Device`] implementation), `rc.rs` (RDMA reads over lazily made RC
//! connections; the [`RemoteReads`] implementation), `hooks.rs` (test
//! hooks) and `tests.rs`.
//!
//! Unsafe here: making and destroying the endpoint's CQs, UD QP and AHs, acking channel events; `Send` for them.
//!
//! [`Device`]: rdm::device::Device
//! [`DeviceContext`]: rdm::device::DeviceContext
//! [`RemoteReads`]: rdm::device::RemoteReads
//! [`RemoteReads::poll_control`]: rdm::device::RemoteReads::poll_control
//! [`RemoteReads::handle_control`]: rdm::device::RemoteReads::handle_control
#![allow(unsafe_code)]

mod context;
mod hooks;
mod rc;
#[cfg(test)]
mod tests;
mod ud;

pub use context::{odp_offered, VerbsContext};
pub use rc::RcQueue;

/// Memory keys, access bits and Q_Keys, as the verbs device builds them (shared with EFA: [`crate::ib`]).
pub use crate::ib::{
    ibv_access, mr_key, mr_keys, qkey_for, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_SEND, FI_WRITE,
};
use crate::ib::{last_err, nonblocking_channel, AhCache, AhCounters, BounceSlots, ReceiveSlots};
use context::Ctx;
use rc::{RcFactory, RcReads};
use rdm::device::rc::{ConnStats, ConnTable};
use rdm::device::DeviceError;
use rdm::device::{DevAddr, OpenSpec, RawAddr};
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ptr;
use std::sync::Arc;
use ud::{AhKey, UdQueue};

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
    /// [`Device::poll_unreachable`](rdm::device::Device::poll_unreachable)).
    pub send_errors: u64,
    /// Receive completions in error, or too short to hold a GRH.
    pub recv_errors: u64,
    pub ah_created: u64,
    pub ah_evicted: u64,
    /// Address handles made past the cache's bound because it was full and
    /// every cached one was still used by an outstanding send (waiting could
    /// stall: requests release theirs only when a signaled one completes).
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

/// The address-handle cache counts into the endpoint's counters.
impl AhCounters for VerbsStats {
    fn ah_created(&mut self) {
        self.ah_created += 1;
    }
    fn ah_evicted(&mut self) {
        self.ah_evicted += 1;
    }
    fn ah_failed(&mut self) {
        self.ah_failed += 1;
    }
    fn ah_refused(&mut self) {
        self.ah_refused += 1;
    }
    fn ah_full(&mut self) {
        self.ah_overflow += 1;
    }
}

/// One endpoint's UD queue pair (see the module docs), with its RC queue
/// pairs for reads.
pub struct VerbsDevice {
    ctx: Arc<Ctx>,
    /// The receive CQ's and the RC CQ's completion channel.
    channel: *mut ib::ibv_comp_channel,
    /// The UD queue pair: sends and receives (`ud.rs`).
    ud: UdQueue,
    /// Address handles of the UD queue's destinations.
    ahs: AhCache<AhKey>,
    /// Remote reads through RC queue pairs (`rc.rs`).
    rc: RcReads,
    pub stats: VerbsStats,
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
            ud: UdQueue {
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
                unreachable: VecDeque::new(),
                check_qp: false,
                corrupt_next_key: false,
            },
            // As verbs always did: past the bound rather than wait, counted
            // in `ah_overflow`.
            ahs: AhCache::new(ah_cap).growing_when_busy(),
            rc: RcReads {
                conns: ConnTable::new(cfg.rc_max_peers.unwrap_or(DEFAULT_RC_MAX_PEERS), RC_IDLE, spec.incarnation),
                queues: RcFactory {
                    ctx: ctx.clone(),
                    cq: ptr::null_mut(),
                    outstanding: FxHashMap::default(),
                    total_outstanding: 0,
                    retiring: Vec::new(),
                    psn_seed: spec.incarnation ^ 0x9e37_79b9_7f4a_7c15,
                    live: 0,
                },
                reads: slab::Slab::new(),
                done: VecDeque::new(),
                now: rdm::time::Instant::from_nanos(0),
                wrs: Vec::new(),
                sges: Vec::new(),
            },
            stats: VerbsStats::default(),
            ctx,
        };
        // From here on, Drop releases whatever was created.
        dev.channel = nonblocking_channel(dev.ctx.ctx)?;
        // SAFETY: an open context; the channel outlives the CQ (Drop order).
        dev.ud.scq = unsafe { ib::ibv_create_cq(dev.ctx.ctx, sq_depth as i32, ptr::null_mut(), ptr::null_mut(), 0) };
        if dev.ud.scq.is_null() {
            return Err(last_err("ibv_create_cq(send)"));
        }
        // SAFETY: as above.
        dev.ud.rcq = unsafe { ib::ibv_create_cq(dev.ctx.ctx, rq_depth as i32, ptr::null_mut(), dev.channel, 0) };
        if dev.ud.rcq.is_null() {
            return Err(last_err("ibv_create_cq(recv)"));
        }
        if dev.rc.conns.enabled() {
            // One completion queue for the reads of every connection, on
            // the same channel as receives: a sleeper wakes for either.
            // SAFETY: an open context; the channel outlives the CQ.
            dev.rc.queues.cq = unsafe {
                ib::ibv_create_cq(dev.ctx.ctx, RC_CQ_DEPTH.min(dev.ctx.max_cqe) as i32, ptr::null_mut(), dev.channel, 0)
            };
            if dev.rc.queues.cq.is_null() {
                return Err(last_err("ibv_create_cq(rc)"));
            }
        }
        for inline in [REQ_INLINE, 64, 0] {
            let mut init = ib::ibv_qp_init_attr {
                send_cq: dev.ud.scq,
                recv_cq: dev.ud.rcq,
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
            dev.ud.qp = unsafe { ib::ibv_create_qp(dev.ctx.pd, &mut init) };
            if !dev.ud.qp.is_null() {
                dev.ud.max_inline = init.cap.max_inline_data.min(u16::MAX as u32).min(mtu as u32) as u16;
                break;
            }
        }
        if dev.ud.qp.is_null() {
            return Err(last_err("ibv_create_qp(UD)"));
        }
        // SAFETY: a live QP.
        dev.ud.qpn = unsafe { (*dev.ud.qp).qp_num };
        dev.bring_up()?;
        dev.post_all_receives()?;
        dev.ud.local = ud_addr(dev.ctx.gid, dev.ud.qpn, dev.ctx.lid);
        Ok(dev)
    }

    /// Address handles cached now.
    pub fn ah_cache_len(&self) -> usize {
        self.ahs.len()
    }

    /// The bound of the address-handle cache.
    pub fn ah_cache_cap(&self) -> usize {
        self.ahs.cap()
    }

    /// The Q_Key of this queue pair.
    pub fn qkey(&self) -> u32 {
        self.ud.qkey
    }

    pub fn qpn(&self) -> u32 {
        self.ud.qpn
    }

    /// Sends posted and not yet covered by a completion.
    pub fn outstanding(&self) -> usize {
        self.ud.inflight.len()
    }

    /// The connection counters, and the connections open now (active: this
    /// endpoint reads through them; passive: peers read through them).
    pub fn rc_stats(&self) -> (ConnStats, usize, usize) {
        (self.rc.conns.stats, self.rc.conns.active_len(), self.rc.conns.passive_len())
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
            if cq == self.rc.queues.cq {
                n_rc += 1;
            } else {
                n += 1;
            }
        }
        if n > 0 {
            // SAFETY: events of the receive CQ.
            unsafe { ib::ibv_ack_cq_events(self.ud.rcq, n) };
        }
        if n_rc > 0 {
            // SAFETY: events of the RC CQ (the other CQ on the channel).
            unsafe { ib::ibv_ack_cq_events(self.rc.queues.cq, n_rc) };
        }
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // The RC queue pairs first (to the error state, then destroyed: the
        // device no longer writes read targets through them).
        self.rc.conns.clear(&mut self.rc.queues);
        for q in self.rc.queues.retiring.drain(..) {
            RcFactory::destroy(&q);
        }
        // SAFETY: every object is destroyed once, users before what they
        // use: the QPs (nothing is posted any more), then the AHs the UD QP
        // sent through, the CQs (their events acknowledged), the channel,
        // and the MRs; the buffers are freed after (fields drop after this),
        // the PD and context when the last Arc of the context goes.
        unsafe {
            if !self.ud.qp.is_null() {
                ib::ibv_destroy_qp(self.ud.qp);
            }
            for ah in self.ahs.drain() {
                ib::ibv_destroy_ah(ah);
            }
            if !self.channel.is_null() {
                self.ack_events();
            }
            if !self.ud.scq.is_null() {
                ib::ibv_destroy_cq(self.ud.scq);
            }
            if !self.rc.queues.cq.is_null() {
                ib::ibv_destroy_cq(self.rc.queues.cq);
            }
            if !self.ud.rcq.is_null() {
                ib::ibv_destroy_cq(self.ud.rcq);
            }
            if !self.channel.is_null() {
                ib::ibv_destroy_comp_channel(self.channel);
            }
        }
        self.ud.rx.deregister();
        self.ud.bounce.deregister();
    }
}
