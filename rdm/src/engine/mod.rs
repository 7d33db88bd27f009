//! The reliable-datagram engine (sans-IO).
//!
//! One `Engine` per endpoint talks to every peer over one datagram device. It
//! gives each message exactly-once, in-order (per peer) delivery on unreliable
//! devices (UDP, verbs UD) and keeps the same protocol, minus retransmission,
//! on reliable ones (shared memory, EFA SRD). On a path that is reliable *and*
//! ordered (shared memory), [`Engine::send_transmit_complete`] sends a message
//! that fits one datagram, with nothing ahead of it unacknowledged, as one
//! DIRECT packet: no sequence number, no acknowledgement, complete once written
//! (`rdm/PROTOCOL.md` §2.2).
//!
//! Beside that reliable stream, [`Engine::send_datagram`] carries a message as
//! one unreliable datagram (`FI_EP_DGRAM` endpoints): no sequence number, no
//! acknowledgement, no segmentation; it completes once handed to the device and
//! arrives as [`Event::Datagram`] at most once per copy the network delivers.
//! It shares the header, checksum and job-key check, and creates no per-peer
//! state beyond the cold entry that names the sender.
//!
//! Inputs: [`Engine::send`], [`Engine::send_datagram`], [`Engine::handle_datagram`], [`Engine::handle_timeout`].
//! Outputs, pulled: [`Engine::poll_transmit`], [`Engine::poll_timeout`],
//! [`Engine::poll_event`]. Time is always an argument; nothing here reads a clock,
//! touches a socket, or uses `unsafe`. The wire format is specified in
//! `rdm/PROTOCOL.md`.
//!
//! Per peer, state is split: a *cold* entry (address and an optional index of
//! hot state) exists for every address the engine was asked about; *hot* state
//! (sequence numbers, windows, timers, queues) is created on first traffic.
//!
//! Modules: [`seq`] (sequence numbers), [`wire`] (the header), [`recovery`]
//! (the send side's state; timers, retransmission, acknowledgements),
//! [`congestion`] (the congestion window and its rules) and [`reassembly`]
//! (the receive side's state; reorder window, message reassembly, ack
//! policy). The engine's own methods are in `peers` (the peer table, cold and
//! hot state, paths, incarnations, failing a peer), `send` (queueing reliable
//! messages and unreliable datagrams), `direct` (DIRECT packets on reliable,
//! ordered paths), `transmit` (`poll_transmit`: writing datagrams, the ready
//! queue, cutting messages into the window) and `receive` (`handle_datagram`:
//! the checks and dispatch of a datagram, back-pressure). This file holds the
//! public types, the engine's state and the types its parts share, its
//! construction, events and buffer pools; the unit tests are in `tests.rs`.
#![forbid(unsafe_code)]

pub mod congestion;
mod direct;
mod peers;
pub mod reassembly;
mod receive;
pub mod recovery;
pub mod seal;
mod send;
pub mod seq;
mod transmit;
pub mod wire;

use congestion::Congestion;
pub use direct::DirectRoute;
use peers::{Cold, Hot};
use reassembly::RecvState;
use recovery::SendState;
use seal::Sealer;
pub use seal::{JobAuth, JobSecret};
pub use seq::Psn;
pub use wire::{DecodeError, Header, Hello, PacketType, Sealed, HEADER_LEN, MAGIC, SACK_SPAN, TRAILER_LEN, VERSION};

use crate::device::{DevAddr, DeviceCaps, LocalBuf};
use crate::time::Instant;
use rustc_hash::FxHashMap;
use slab::Slab;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

// ---------------------------------------------------------------------------
// Public types

/// Dense index of a peer in this engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(u32);

impl PeerId {
    pub fn from_index(i: u32) -> PeerId {
        PeerId(i)
    }
    pub fn index(self) -> u32 {
        self.0
    }
}

/// One more job an endpoint serves ([`EngineConfig::other_jobs`]): its key
/// in clear, or its secret (whose job id then is the key).
#[derive(Clone, Debug)]
pub struct JobConfig {
    pub job_key: u64,
    pub auth: Option<Arc<JobAuth>>,
}

/// Which of an endpoint's jobs a peer belongs to: 0 is
/// [`EngineConfig::job_key`]'s, then [`EngineConfig::other_jobs`] in order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobIdx(pub u8);

impl JobIdx {
    pub const FIRST: JobIdx = JobIdx(0);
}

/// Jobs one endpoint serves, at most (libfabric's `max_ep_auth_key`).
pub const JOBS_MAX: usize = 16;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Largest datagram, header included.
    pub mtu: usize,
    /// The device never loses, duplicates or corrupts: no retransmission.
    pub reliable: bool,
    /// The job key every packet carries; with `auth`, its secret's job id
    /// (the engine sets it).
    pub job_key: u64,
    /// The job's secret, when it has one: datagrams over a wire are sealed
    /// with it, and only sealed ones are taken from a wire (`seal`).
    pub auth: Option<Arc<JobAuth>>,
    /// The other jobs this endpoint serves ([`JobIdx`] 1 on, in this
    /// order), each with its key or secret: a peer is one process *in one
    /// job*, so a process met in two jobs is two peers, with two streams.
    /// Empty for an endpoint of one job. At most [`JOBS_MAX`] jobs in all.
    pub other_jobs: Vec<JobConfig>,
    pub incarnation: u64,
    /// A peer silent this long while data to it is unacknowledged is unreachable.
    pub peer_timeout: Duration,
    /// Packets in flight per peer, at most.
    pub max_window: u32,
    /// Bytes queued per peer before `send` answers `WouldBlock` (a single
    /// message is always accepted when the queue is empty).
    pub max_queued_bytes: usize,
    /// Delayed-ack timer.
    pub ack_delay: Duration,
    /// How long the acknowledgement of a completed message may wait for data
    /// going back to carry it; zero acknowledges at once (the only safe choice
    /// when nothing but the application's own calls would send it later).
    pub completed_ack_delay: Duration,
    pub initial_rto: Duration,
    pub min_rto: Duration,
    pub max_rto: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mtu: 1472,
            reliable: false,
            job_key: 0,
            auth: None,
            other_jobs: Vec::new(),
            incarnation: 1,
            peer_timeout: Duration::from_secs(30),
            max_window: 1024,
            max_queued_bytes: 64 << 20,
            ack_delay: Duration::from_micros(200),
            completed_ack_delay: Duration::ZERO,
            initial_rto: Duration::from_millis(20),
            min_rto: Duration::from_millis(2),
            max_rto: Duration::from_secs(2),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailReason {
    /// No acknowledgement within the peer timeout.
    Timeout,
    /// The peer restarted (new incarnation) before acknowledging.
    PeerRestarted,
    /// The network said the peer cannot be reached (ICMP port or host
    /// unreachable, through the device).
    Unreachable,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// A whole message, exactly once, in per-peer send order.
    Delivered {
        peer: PeerId,
        msg: Vec<u8>,
    },
    /// The peer acknowledged every byte of the message sent with `token`.
    SendComplete {
        token: u64,
    },
    SendFailed {
        token: u64,
        peer: PeerId,
        reason: FailReason,
    },
    PeerUnreachable {
        peer: PeerId,
    },
    PeerRestarted {
        peer: PeerId,
    },
    /// An unreliable datagram ([`Engine::send_datagram`]) arrived: its whole
    /// payload. It may be lost, duplicated or reordered by the network.
    Datagram {
        peer: PeerId,
        msg: Vec<u8>,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SendError {
    #[error("send queue to this peer is full; progress and retry")]
    WouldBlock,
    /// A datagram larger than one packet of the peer's path can carry.
    #[error("datagram of {len} bytes exceeds the path's {max}-byte payload")]
    TooLarge { len: usize, max: usize },
    /// [`Engine::send_gather`] to a peer whose path does not gather.
    #[error("this path does not send from registered application memory")]
    Unsupported,
}

/// A datagram `poll_transmit` wrote into the caller's buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub dst: DevAddr,
    pub len: usize,
    /// Bytes per datagram: `len` for one datagram; less for a run of datagrams
    /// to `dst` written back to back (the last may be shorter), formed only for
    /// paths whose device takes runs (`DeviceCaps::gso`).
    pub seg: usize,
    /// The rest of the (single) datagram, in registered application memory
    /// ([`Engine::send_gather`]): the device sends `len` bytes of the buffer
    /// and then these, gathered by the NIC.
    pub gather: Option<Gathered>,
}

/// The gathered part of a data datagram, and which segment it belongs to.
///
/// Its memory is vouched for only while the segment's message is pending in
/// this engine, and the engine knows that, its caller does not: a datagram the
/// device did not take goes back here ([`Engine::not_transmitted`]), to be
/// formed anew while the message is still pending, instead of being held by
/// the caller (whose copy of the address could outlive the message, if an
/// earlier transmission of the segment were acknowledged meanwhile).
///
/// It also carries what forming the datagram changed in the segment, so that
/// giving it back undoes it: a datagram that never left is no retransmission
/// (no RTT sample from it, no counter). Not undone: the retransmission timer
/// forming it may have started, which can still fire (a probe or a timeout,
/// with its backoff) if the device stays full past it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gathered {
    pub buf: LocalBuf,
    peer: PeerId,
    psn: Psn,
    /// The segment's `sent_at` and `retransmitted` before this datagram.
    sent_before: Option<Instant>,
    retransmitted_before: bool,
}

/// Most datagrams in one run, and most bytes (what one UDP GSO send takes).
pub const RUN_MAX_SEGMENTS: usize = 64;
pub const RUN_MAX_BYTES: usize = 65507;

/// Counters (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub sent_data: u64,
    pub sent_acks: u64,
    pub retransmits: u64,
    pub fast_retransmits: u64,
    pub timeouts: u64,
    /// Window reductions for congestion (a queue on the path, or repeated
    /// timeouts); random losses without a queue reduce nothing.
    pub congestion_reductions: u64,
    /// Probe timeouts (tail loss probes) that fired.
    pub probes: u64,
    pub received: u64,
    pub delivered_msgs: u64,
    pub duplicates: u64,
    pub out_of_order: u64,
    pub dropped_malformed: u64,
    pub dropped_checksum: u64,
    pub dropped_job_key: u64,
    /// Datagrams over a wire that a job with a secret refused before anything
    /// else looked at them: unsealed, or sealed with a tag that does not
    /// verify (forged, altered, another job's, truncated); and sealed ones
    /// that reached an engine without a secret.
    pub dropped_auth: u64,
    /// Sealed datagrams refused as replays: a packet counter seen before (or
    /// too old to tell, and for data a sequence number received before), or
    /// a copy from another address than its sender's.
    pub dropped_replay: u64,
    /// Sealed datagrams that named no incarnation of this endpoint (their
    /// sender had not heard from it yet, or they are replays of such):
    /// acted on by nobody; a live sender sends them again once it has.
    pub dropped_unnamed: u64,
    /// Challenges sent: ACKs asking a sealed peer incarnation to echo a
    /// cookie (it named none or an earlier incarnation of ours, or it is
    /// not current yet); only an echo, or the application's address, makes
    /// an incarnation current.
    pub sent_challenges: u64,
    pub dropped_stale: u64,
    pub dropped_window: u64,
    pub peers_failed: u64,
    pub peer_restarts: u64,
    /// Unreliable datagrams handed to the device / received (job key checked).
    pub sent_datagrams: u64,
    pub received_datagrams: u64,
    /// Messages sent / received as DIRECT packets (reliable, ordered paths).
    pub sent_direct: u64,
    pub received_direct: u64,
    /// Of `sent_direct`, those written by the caller's device straight from
    /// the application's buffers ([`Engine::direct_route`]: shm's
    /// small-message path, no staging buffer, no queue, no event).
    pub sent_direct_written: u64,
    /// DIRECT messages queued to a peer that then paused, moved to its
    /// sequenced queue instead ([`Engine::peer_holds_back`]).
    pub direct_requeued: u64,
}

/// Counters the layer above keeps per peer in the peer's hot state (see
/// [`Engine::upper_counters_mut`]); rdm gives them no meaning (the message
/// layer counts its messages and bytes by protocol there).
pub const UPPER_COUNTERS: usize = 10;

/// One peer's counters (monotonic), kept in its hot state: plain integers,
/// bumped where the endpoint-wide [`Stats`] are (no allocation, no lock). A
/// peer that never carried reliable traffic has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounters {
    /// Data packets sent again (timeouts, fast retransmits, reopened windows).
    pub retransmits: u64,
    /// Data packets received twice (already delivered or already buffered).
    pub duplicates: u64,
    /// Packets from an earlier incarnation of the peer, or addressed to an
    /// earlier incarnation of this endpoint, dropped.
    pub dropped_stale: u64,
    /// Data packets beyond the receive window (or refused while paused), dropped
    /// (the sender resends them).
    pub dropped_window: u64,
    /// The layer above's counters.
    pub upper: [u64; UPPER_COUNTERS],
}

/// What the engine knows of one peer with hot state ([`Engine::peer_snapshots`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeerSnapshot {
    pub peer: PeerId,
    pub addr: DevAddr,
    pub job: JobIdx,
    pub counters: PeerCounters,
    /// Smoothed round-trip time (none before the first sample).
    pub srtt: Option<Duration>,
    /// Congestion window, in packets.
    pub cwnd: f64,
    /// Declared unreachable.
    pub failed: bool,
}

// ---------------------------------------------------------------------------
// Paths, segments and queued packets (the peer table and a peer's state are
// in `peers`)

/// A peer's path, fixed before anything is sent to the peer: what this engine
/// needs of it, and what the message layer above asks of it
/// ([`Engine::path`]: whether the receiver can read remotely, whether reads
/// need registration keys). Kept once, in the peer's cold entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPath {
    /// Largest payload per datagram (the path's mtu minus the header; no
    /// datagram device carries more than 64 KiB, and 16 bits keep a cold
    /// peer within its 96 bytes).
    payload_max: u16,
    /// The path never loses, duplicates or corrupts: no retransmission timers,
    /// no SACK recovery, a full window from the start.
    reliable: bool,
    /// The device takes runs of datagrams to this peer (UDP GSO).
    gso: bool,
    /// The path keeps send order (with `reliable`: DIRECT packets may be used).
    ordered: bool,
    /// The receiver can read the sender's memory ([`DeviceCaps::remote_read`]).
    pub remote_read: bool,
    /// Remote reads need registration keys ([`DeviceCaps::registration`]).
    pub registration: bool,
}

/// The payload per datagram of a path of `mtu` bytes (at least 1, at most
/// 64 KiB), `sealed` ones ending in a trailer.
fn payload_max(mtu: usize, sealed: bool) -> u16 {
    let trailer = if sealed { TRAILER_LEN } else { 0 };
    mtu.saturating_sub(HEADER_LEN + trailer).clamp(1, u16::MAX as usize) as u16
}

pub(super) struct TxSeg {
    psn: Psn,
    /// The message's bytes rdm holds; with `gather`, only its head.
    data: Arc<Vec<u8>>,
    /// The rest of the message, in registered application memory.
    gather: Option<LocalBuf>,
    off: u32,
    len: u32,
    first: bool,
    last: bool,
    token: u64,
    sent_at: Option<Instant>,
    retransmitted: bool,
    sacked: bool,
    queued: bool,
}

impl TxSeg {
    /// This segment's bytes: the part rdm holds, and the part in registered
    /// application memory (a message's held head comes first).
    fn split(&self) -> (&[u8], Option<LocalBuf>) {
        let (off, end) = (self.off as usize, (self.off + self.len) as usize);
        let head = self.data.len();
        let held = &self.data[off.min(head)..end.min(head)];
        let gather = self.gather.and_then(|g| {
            let start = off.max(head) - head;
            let stop = end.saturating_sub(head);
            (stop > start).then(|| g.sub(start as u64, (stop - start) as u64)).flatten()
        });
        (held, gather)
    }
}

pub(super) struct PendingMsg {
    data: Arc<Vec<u8>>,
    gather: Option<LocalBuf>,
    token: u64,
    next_off: usize,
}

/// The send queues of a peer that went idle, kept by the engine (not the peer,
/// whose idle state must stay small) for the next peer that becomes busy: a
/// ping-pong peer goes idle after every message, and would otherwise free and
/// regrow its queues each time.
struct SpareQueues {
    unacked: VecDeque<TxSeg>,
    pending: VecDeque<PendingMsg>,
    to_send: VecDeque<Psn>,
}

/// Spare queues larger than this (entries) are freed rather than kept.
const SPARE_MAX_ENTRIES: usize = 256;

/// Whether datagrams to `dst` over `path` go without a checksum
/// ([`Header::unsummed`], `PROTOCOL.md` §2.4): to a shared-memory ring, on a
/// path the device promises intact (a fault-injecting decorator, which may
/// corrupt, never does).
fn unsummed_to(dst: &DevAddr, path: PeerPath) -> bool {
    path.reliable && dst.crosses_no_wire()
}

/// A whole-message packet waiting for `poll_transmit`: an unreliable
/// datagram (DGRAM) or a message on a reliable, ordered path (DIRECT, with the
/// peer's incarnation as the sender knows it).
struct DgramTx {
    dst: DevAddr,
    payload: Vec<u8>,
    token: u64,
    ptype: PacketType,
    dst_inc: u64,
    peer: PeerId,
    /// DIRECT fragments of a message: its first and last (both for a whole
    /// message; DGRAM: neither). The send completes with the last.
    first: bool,
    last: bool,
    /// A sealed challenge or echo (an ACK) and its cookie (the SACK field).
    hello: Hello,
    sack: u64,
}

/// One job an endpoint serves: its key, and with a secret what sealing
/// needs; its counters.
struct Job {
    key: u64,
    /// With a secret: seals and opens this job's datagrams over a wire.
    sealer: Option<Sealer>,
    /// With a secret: the peer each sealed incarnation was heard at (taken
    /// or challenged there). A sealed datagram of one of them from any other
    /// address is a copy sent from elsewhere: refused before any peer state
    /// is made for that address.
    homes: FxHashMap<u64, PeerId>,
    /// With a secret: the packet counters of each sender of unreliable
    /// datagrams (DGRAM), by incarnation.
    dgram_replay: FxHashMap<u64, seal::ReplayWindow>,
    counters: JobCounters,
}

impl Job {
    fn new(key: u64, auth: Option<Arc<JobAuth>>, incarnation: u64) -> Job {
        let key = auth.as_ref().map_or(key, |a| a.secret.job_id());
        Job {
            key,
            sealer: auth.map(|a| Sealer::new(a, incarnation)),
            homes: FxHashMap::default(),
            dgram_replay: FxHashMap::default(),
            counters: JobCounters::default(),
        }
    }
}

/// One job's counters ([`Engine::job_counters`]): what its key or tag let in,
/// and what it refused. Messages and bytes are the layer above's, per peer
/// ([`PeerSnapshot::job`] says whose).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JobCounters {
    /// Datagrams that carried this job's key and passed its tag (if sealed).
    pub received: u64,
    /// Datagrams of this job refused by their tag, or unsealed from a wire
    /// while the job has a secret.
    pub dropped_auth: u64,
}

pub(super) struct RxSeg {
    first: bool,
    last: bool,
    payload: Vec<u8>,
}

const RX_WINDOW: u32 = 4096;

// ---------------------------------------------------------------------------
// The engine

pub struct Engine {
    cfg: EngineConfig,
    /// The layer above is out of buffer space: new messages are not accepted
    /// (not acknowledged, so senders keep them) and the window is advertised 0.
    paused: bool,
    /// The path of peers the layer above gave none for.
    default_path: PeerPath,
    cold: Vec<Cold>,
    /// Peers of the first job by address, and of the others by address
    /// and job (a process met in two jobs is two peers): an endpoint of one
    /// job keeps its map entries as small as ever.
    by_addr: FxHashMap<DevAddr, PeerId>,
    by_addr_in_job: FxHashMap<(DevAddr, JobIdx), PeerId>,
    /// The last address and job [`Engine::peer_in`] answered for: datagrams
    /// come in runs from one sender, and a run then costs one comparison per
    /// datagram instead of a hash lookup. Never stale: `by_addr` only grows.
    last_peer: Option<(DevAddr, JobIdx, PeerId)>,
    /// The incarnation the application's address names, for peers without hot
    /// state yet ([`Engine::expect_incarnation`]); a side map so that cold
    /// peers stay small.
    expected_inc: FxHashMap<u32, u64>,
    hot: Slab<Hot>,
    /// Deadlines of hot peers, earliest first (see [`Engine::arm`]).
    timers: BinaryHeap<Reverse<(Instant, u32)>>,
    /// Runs of datagrams may be formed (off once a device refused one).
    runs: bool,
    ready: VecDeque<u32>,
    events: VecDeque<Event>,
    pool: Vec<Vec<u8>>,
    /// Send buffers with their reference-count blocks, reused whole so that
    /// queueing a message allocates nothing once the pool is warm.
    tx_pool: Vec<Arc<Vec<u8>>>,
    spare_queues: Vec<SpareQueues>,
    /// Whole-message packets (DGRAM, DIRECT) not yet written out, oldest
    /// first, and their bytes. They go out before sequenced data: a DIRECT
    /// packet is only queued when nothing sequenced to its peer waits.
    dgram_tx: VecDeque<DgramTx>,
    dgram_bytes: usize,
    /// DIRECT messages reported sent whose `SendComplete` the layer above has
    /// not polled yet, with their peers.
    direct_unpolled: Vec<(u64, PeerId)>,
    /// Peers first heard from (created by an arriving datagram), not yet given
    /// a path: the layer above, which knows the devices, gives them one
    /// ([`Engine::poll_pathless_peer`]) before anything is sent to them.
    pathless: Vec<PeerId>,
    /// The jobs this endpoint serves, [`JobIdx`] order: the first is the
    /// configuration's `job_key`/`auth`, then `other_jobs`.
    jobs: Vec<Job>,
    /// The last cookie this endpoint challenged a sealed peer with.
    next_cookie: u64,
    stats: Stats,
}

/// Largest message sent as DIRECT fragments; larger ones (which the message
/// layer sends by rendezvous on shared memory anyway) take the sequenced way.
/// The docs state it (`prov/tests/docs_figures.rs`).
pub const DIRECT_MAX: usize = 64 << 10;

/// Buffers kept for reuse per pool; larger ones are freed (a pool of huge
/// buffers would pin memory long after a burst of long messages). A buffer
/// that holds a 64 KiB payload behind the layer above's header
/// ([`POOL_HEADER_ROOM`] bytes at most) is kept: a stream of 64 KiB messages
/// then allocates nothing, where a bound of exactly 64 KiB freed and
/// reallocated one buffer per message on each side (issue 44 item 7).
/// docs/scale.md states both (`rndv/tests/scale_alltoall.rs`).
pub const POOL_DEPTH: usize = 64;
pub const POOL_MAX_CAPACITY: usize = (64 << 10) + POOL_HEADER_ROOM;
/// Room for the header the layer above puts before a 64 KiB payload in one
/// message (rndv asserts that its message and push headers fit).
pub const POOL_HEADER_ROOM: usize = 256;

impl Engine {
    pub fn new(mut cfg: EngineConfig) -> Engine {
        let mut jobs = vec![Job::new(cfg.job_key, cfg.auth.clone(), cfg.incarnation)];
        cfg.job_key = jobs[0].key;
        for j in cfg.other_jobs.iter().take(JOBS_MAX - 1) {
            jobs.push(Job::new(j.job_key, j.auth.clone(), cfg.incarnation));
        }
        let any_sealed = jobs.iter().any(|j| j.sealer.is_some());
        let default_path = PeerPath {
            payload_max: payload_max(cfg.mtu, any_sealed),
            reliable: cfg.reliable,
            gso: false,
            ordered: false,
            remote_read: false,
            registration: false,
        };
        Engine {
            cfg,
            paused: false,
            default_path,
            cold: Vec::new(),
            by_addr: FxHashMap::default(),
            by_addr_in_job: FxHashMap::default(),
            last_peer: None,
            expected_inc: FxHashMap::default(),
            hot: Slab::new(),
            timers: BinaryHeap::new(),
            runs: true,
            ready: VecDeque::new(),
            events: VecDeque::new(),
            pool: Vec::new(),
            tx_pool: Vec::new(),
            spare_queues: Vec::new(),
            dgram_tx: VecDeque::new(),
            dgram_bytes: 0,
            direct_unpolled: Vec::new(),
            pathless: Vec::new(),
            jobs,
            next_cookie: 0,
            stats: Stats::default(),
        }
    }

    /// How a datagram to `peer` is sealed: over a wire when its job has a
    /// secret; never through a shared-memory ring, which the kernel guards.
    #[inline]
    pub(super) fn sealing_of(&self, peer: PeerId) -> Sealed {
        let cold = &self.cold[peer.0 as usize];
        match &self.jobs[cold.job.0 as usize].sealer {
            Some(s) if !cold.addr.crosses_no_wire() => s.sealing(),
            _ => Sealed::No,
        }
    }

    /// Whether the first job's datagrams over a wire are sealed (it has a
    /// secret).
    pub fn sealed(&self) -> bool {
        self.jobs[0].sealer.is_some()
    }

    /// The jobs this endpoint serves ([`JobIdx`] order) by their keys (a
    /// sealed job's key is its job id).
    pub fn job_keys(&self) -> impl Iterator<Item = u64> + '_ {
        self.jobs.iter().map(|j| j.key)
    }

    /// The key `job`'s datagrams carry (a sealed job's: its job id).
    pub fn job_key(&self, job: JobIdx) -> u64 {
        self.jobs.get(job.0 as usize).map_or(self.jobs[0].key, |j| j.key)
    }

    /// Whether job `job` is sealed.
    pub fn job_sealed(&self, job: JobIdx) -> bool {
        self.jobs.get(job.0 as usize).is_some_and(|j| j.sealer.is_some())
    }

    /// One job's counters.
    pub fn job_counters(&self, job: JobIdx) -> JobCounters {
        self.jobs.get(job.0 as usize).map(|j| j.counters).unwrap_or_default()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Bytes the engine keeps for reuse and no peer owns: its receive and
    /// transmit buffer pools (at most `POOL_DEPTH` buffers of at most
    /// `POOL_MAX_CAPACITY` each) and the spare queues of peers gone idle.
    pub fn pooled_bytes(&self) -> usize {
        use std::mem::size_of;
        let rx = self.pool.capacity() * size_of::<Vec<u8>>() + self.pool.iter().map(|b| b.capacity()).sum::<usize>();
        // An Arc's block: two counts and the Vec.
        let tx = self.tx_pool.capacity() * size_of::<Arc<Vec<u8>>>()
            + self.tx_pool.iter().map(|b| 2 * size_of::<usize>() + size_of::<Vec<u8>>() + b.capacity()).sum::<usize>();
        let spare = self.spare_queues.capacity() * size_of::<SpareQueues>()
            + self
                .spare_queues
                .iter()
                .map(|q| {
                    q.unacked.capacity() * size_of::<TxSeg>()
                        + q.pending.capacity() * size_of::<PendingMsg>()
                        + q.to_send.capacity() * size_of::<Psn>()
                })
                .sum::<usize>();
        rx + tx + spare
    }

    /// Whether [`Engine::poll_event`] has something (a cheap check for callers
    /// that skip work when idle).
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        let ev = self.events.pop_front();
        if let Some(Event::SendComplete { token }) = &ev {
            if let Some(i) = self.direct_unpolled.iter().position(|(t, _)| t == token) {
                self.direct_unpolled.swap_remove(i);
            }
        }
        ev
    }

    /// An empty buffer from the pool (for a message lent by
    /// [`Engine::handle_datagram_lending`] that the layer above keeps after
    /// all); give it back with [`Engine::recycle`].
    pub fn take_buffer(&mut self) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b
    }

    /// Queues a message lent by [`Engine::handle_datagram_lending`] as the
    /// `Delivered` event it would have been: the layer above did not take it
    /// from the device's buffer after all. In order: lending happens only
    /// while no event waits.
    pub fn deliver_later(&mut self, peer: PeerId, msg: Vec<u8>) {
        self.events.push_back(Event::Delivered { peer, msg });
    }

    /// Gives a delivered message's buffer back for reuse.
    pub fn recycle(&mut self, mut buf: Vec<u8>) {
        if self.pool.len() < POOL_DEPTH && buf.capacity() <= POOL_MAX_CAPACITY {
            buf.clear();
            self.pool.push(buf);
        }
    }
}

#[cfg(test)]
mod tests;
