//! # One endpoint: the device, both engines and the order they run in
//!
//! [`Endpoint`] is everything an rdmx endpoint does below libfabric, in one
//! object the provider calls and the simulator drives whole. It owns
//!
//! * the **device** (`D`): datagrams in and out, remote reads, the wait fd;
//! * **both engines, side by side**: the `rdm` [`Engine`] (per-peer
//!   reliability, datagrams in and out) and the [`MsgEngine`] above it
//!   (matching, each message's protocol), which reaches the `rdm` engine only
//!   through the argument each of its calls is passed;
//! * the **transmit staging**: buffers the device lends
//!   ([`Device::transmit_buffers`]), which the rdm engine writes each datagram
//!   into once, and which go to the device as they are;
//! * **remote reads**: the message engine's [`Action::RemoteRead`]s become
//!   posted device reads ([`rdm::device::RemoteReads::post_read`]) into the posted receive
//!   buffer, with the sender's keys and, on paths that need them, a local
//!   registration of the destination; their completions come back later, or
//!   at once on a device that reads synchronously (shm);
//! * the **policy** the engines leave to their user: how long an ack may wait
//!   for a reply to carry it, how often a waited-on peer is probed, how many
//!   operations may queue, and the linger at close;
//! * the application's **memory** (`M`, see [`Memory`]) and the **clock**
//!   (`C`): the provider passes its process memory and the monotonic clock,
//!   the simulator a model and virtual time. Nothing here is `unsafe` or
//!   reads a real clock.
//!
//! It is driven quinn-proto style: operations in ([`Endpoint::send`],
//! [`Endpoint::post_recv`], the RMA calls, [`Endpoint::cancel`],
//! [`Endpoint::close`]), [`Endpoint::progress`], and outputs pulled
//! ([`Endpoint::poll_completion`], [`Endpoint::poll_event`],
//! [`Endpoint::poll_timeout`], [`Endpoint::prepare_wait`]).
//!
//! ## The order of one round of progress
//!
//! Receive a batch from the device into the rdm engine, report unreachable
//! destinations, fire due timers, run the message engine on what was delivered
//! (matching, remote reads to post, reads that finished), and only then
//! transmit. Acknowledgements produced while receiving therefore leave after
//! the message engine matched (or buffered) every delivered message: a
//! sender's completion means "processed by the peer". And a batch pulled from
//! the rdm engine goes to the device in the same call (see
//! [`Endpoint::flush`]): the engine reports a DIRECT message (reliable path,
//! no acknowledgement) complete as it is written out, which is true only
//! because nothing sits between `poll_transmit` and the device.
use crate::engine::{
    for_each_read_run, Action, AtomicRequest, Completion, Config, DirectSend, Io, IoList, Memory, MsgEngine, OpMeta,
    OutMsg, PostError, PullId, ReadOutcome, RecvSpec, RegHandle, Registrations, RmaTarget, Stats,
};
use crate::engine::{Access, RmaId};
use crate::wire::rendezvous::MAX_IOV;
use rdm::device::{ReadRun, TxDatagram};
use rdm::engine::{Engine, EngineConfig, JobIdx, PeerId};
use rdm::{DevAddr, Device, DeviceCaps, DeviceError, Instant};
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::time::Duration;

/// Where the endpoint's time comes from: the provider's monotonic clock, or
/// the simulator's virtual one. Read only when something needs the time (an
/// idle progress round reads no clock).
pub trait Clock {
    fn now(&self) -> Instant;
}

/// What the provider chooses for an endpoint (libfabric parameters and the
/// endpoint's attributes); the engines' configurations follow from it and the
/// device's caps.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Packets of another job key are dropped.
    pub job_key: u64,
    /// The job's secret, when it has one: traffic over a wire is sealed
    /// (`rdm/PROTOCOL.md` §2.5), and `job_key` is its job id.
    pub auth: Option<std::sync::Arc<rdm::engine::JobAuth>>,
    /// The other jobs the endpoint serves (libfabric's `FI_AV_AUTH_KEY`):
    /// their peers are peers of their own ([`Endpoint::peer_in`]).
    pub other_jobs: Vec<rdm::engine::JobConfig>,
    /// This endpoint instance (a restarted process has a new one).
    pub incarnation: u64,
    /// A peer silent this long while we wait on it is declared failed.
    pub peer_timeout: Duration,
    /// A thread progresses the endpoint when the application does not.
    pub background_progress: bool,
    pub rndv_threshold: usize,
    /// See [`crate::engine::Config::rdma_rndv_threshold`].
    pub rdma_rndv_threshold: Option<usize>,
    pub window_threshold: usize,
    pub min_multi_recv: usize,
    pub unexpected_limit: usize,
    /// Unreliable-datagram semantics (`FI_EP_DGRAM`).
    pub datagram: bool,
    /// Rendezvous reads may be posted at all (`FI_RDMX_SHM_CMA`); off, every
    /// long message is pushed in windows.
    pub remote_reads: bool,
    /// Sends and receives that may be outstanding before a post answers
    /// "again" (libfabric's tx_size / rx_size; the queues take 4x).
    pub tx_size: usize,
    pub rx_size: usize,
}

impl Default for EndpointConfig {
    fn default() -> EndpointConfig {
        let msg = Config::default();
        EndpointConfig {
            job_key: 0,
            auth: None,
            other_jobs: Vec::new(),
            incarnation: 1,
            peer_timeout: Duration::from_secs(30),
            background_progress: false,
            rndv_threshold: msg.rndv_threshold,
            rdma_rndv_threshold: msg.rdma_rndv_threshold,
            window_threshold: msg.window_threshold,
            min_multi_recv: 0,
            unexpected_limit: msg.unexpected_limit,
            datagram: false,
            remote_reads: true,
            tx_size: 1024,
            rx_size: 1024,
        }
    }
}

/// Something the application did not ask about but should know (the provider
/// logs these and raises EQ events).
#[derive(Debug)]
pub enum EndpointEvent {
    /// The peer is unreachable: what waited on it has failed.
    PeerFailed { peer: PeerId, addr: DevAddr },
    /// The device failed an operation; what it concerns is retried or failed
    /// by the engines.
    DeviceFailed { op: &'static str, error: DeviceError },
    /// A rendezvous read failed after `bytes`: the receive fails.
    ReadFailed { addr: DevAddr, bytes: u64, error: Option<DeviceError> },
}

/// What to sleep on ([`Endpoint::prepare_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitOn {
    /// Turns readable when input arrives (`None`: the device can only be polled).
    pub fd: Option<RawFd>,
    /// The engines' next timer.
    pub deadline: Option<Instant>,
    /// Input is already waiting: do not sleep.
    pub ready: bool,
}

/// Counters of the endpoint's engines (`FI_RDMX_STATS`).
#[derive(Clone, Copy, Debug)]
pub struct EndpointStats {
    pub rdm: rdm::engine::Stats,
    pub msg: Stats,
    pub unexpected_bytes: usize,
    /// The device's connections for remote reads (verbs RC).
    pub read_conns: rdm::device::ReadConnStats,
}

/// Messages and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgBytes {
    pub messages: u64,
    pub bytes: u64,
}

/// One peer's counters and path state ([`Endpoint::peer_stats`]): a peer
/// appears once it carried reliable traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeerStats {
    pub addr: DevAddr,
    /// The job it is a process of (an endpoint of several jobs).
    pub job: JobIdx,
    /// Sent eagerly / announced by rendezvous.
    pub sent_eager: MsgBytes,
    pub sent_rendezvous: MsgBytes,
    /// Received eagerly / by rendezvous pulled with a remote read / by
    /// rendezvous through window grants.
    pub received_eager: MsgBytes,
    pub received_pulled: MsgBytes,
    pub received_windowed: MsgBytes,
    pub retransmits: u64,
    pub duplicates: u64,
    pub dropped_stale: u64,
    pub dropped_window: u64,
    /// Smoothed RTT (none before the first sample).
    pub srtt: Option<Duration>,
    /// Congestion window, in packets.
    pub cwnd: f64,
    /// Declared unreachable.
    pub failed: bool,
}

/// Datagrams pulled from the rdm engine per device call.
pub const TX_BATCH: usize = 32;
/// Datagrams taken from the device per receive call, and calls per round.
pub const RX_BATCH: usize = 64;
pub const RX_ROUNDS: usize = 4;

/// The datagrams pulled from the rdm engine and not yet taken by the device,
/// oldest first: one transmit buffer each (lent by the device, maybe its
/// registered memory) and what the device needs to send it. `count` of them
/// hold datagrams.
struct Staging {
    bufs: Vec<Box<[u8]>>,
    staged: [Staged; TX_BATCH],
    count: usize,
}

/// One staged datagram (the bytes are in its buffer of [`Staging::bufs`]).
#[derive(Clone, Copy)]
struct Staged {
    dst: DevAddr,
    len: usize,
    /// Bytes per datagram: less than `len` for a run.
    seg: usize,
    /// The gathered part ([`rdm::engine::Transmit::gather`]): sent in the
    /// call that stages it or given back to the rdm engine, never kept.
    gather: Option<rdm::engine::Gathered>,
}

impl Staging {
    fn new(bufs: Vec<Box<[u8]>>) -> Staging {
        Staging { bufs, staged: [Staged { dst: DevAddr::NONE, len: 0, seg: 0, gather: None }; TX_BATCH], count: 0 }
    }

    /// The `i`th staged datagram as the device takes it.
    fn datagram(&self, i: usize) -> TxDatagram<'_> {
        let d = &self.staged[i];
        TxDatagram::run(d.dst, &self.bufs[i][..d.len], d.seg).gathering(d.gather.map(|g| g.buf))
    }

    /// Gives the gathered datagrams from `from` on back to `rdm`
    /// ([`Engine::not_transmitted`]) and takes them out of the stage, keeping
    /// the others in order.
    fn give_back_gathered(&mut self, from: usize, rdm: &mut Engine) {
        // Newest first: each goes to the front of its peer's queue, so the
        // oldest ends up first again.
        for i in (from..self.count).rev() {
            if let Some(g) = self.staged[i].gather {
                rdm.not_transmitted(g);
            }
        }
        let mut kept = from;
        for i in from..self.count {
            if self.staged[i].gather.is_none() {
                self.bufs.swap(kept, i);
                self.staged[kept] = self.staged[i];
                kept += 1;
            }
        }
        self.count = kept;
    }

    /// Drops the first `taken` datagrams (the device took them); the rest move
    /// to the front, in order, with their buffers.
    fn consume(&mut self, taken: usize) {
        for i in taken..self.count {
            self.bufs.swap(i - taken, i);
            self.staged[i - taken] = self.staged[i];
        }
        self.count -= taken;
    }
}

/// At close on a lossy path: answer peers until nothing arrived for this long
/// and our own data is acknowledged, at most `LINGER_MAX`. A sender with no
/// RTT sample yet retransmits at the 20 ms initial timeout and backs off (20,
/// 40, 80 ms apart): the idle bound must exceed the gap after two lost
/// acknowledgements in a row, or the linger ends between two retransmissions
/// and the sender fails a message that arrived (found by the simulator at
/// 20% loss with a 20 ms bound).
const LINGER_IDLE: Duration = Duration::from_millis(100);
const LINGER_MAX: Duration = Duration::from_millis(500);

struct Linger {
    start: Instant,
    last_rx: Instant,
    seen: u64,
}

/// A posted device read: the message engine's pull and the local
/// registrations its destination holds until it completes.
struct ReadInFlight {
    local_regs: [Option<RegHandle>; READ_RUNS_MAX],
}

/// While reads are in flight a sleeper wakes at least this often, so a
/// device can give up a read no completion answers (verbs: 10 s).
const READ_POLL: Duration = Duration::from_secs(1);

/// Runs of one read: each source piece against each destination piece.
const READ_RUNS_MAX: usize = 2 * MAX_IOV;

/// One endpoint below libfabric (see the module docs). The device is boxed
/// and may be `dyn Device` (the provider's): the endpoint calls it directly,
/// with no forwarding impl between that could miss a method.
pub struct Endpoint<D: Device + ?Sized, M: Memory, C: Clock> {
    device: Box<D>,
    /// The reliable-datagram engine: sequence numbers, acknowledgements,
    /// windows and timers per peer, datagrams in and out.
    rdm: Engine,
    /// The message engine above it: matching and each message's protocol.
    /// It reaches `rdm` only through the argument each call passes it.
    msg: MsgEngine,
    mem: M,
    clock: C,
    cfg: EndpointConfig,
    /// Datagrams pulled from the rdm engine that the device has not taken yet.
    stage: Staging,
    reads: slab::Slab<ReadInFlight>,
    /// Maps a device read id to its pull (the read id is the slab key).
    read_pull: Vec<PullId>,
    /// Runs of the read being posted (kept: no allocation per rendezvous).
    runs: Vec<ReadRun>,
    events: VecDeque<EndpointEvent>,
    linger: Option<Linger>,
    closed: bool,
    /// What the device was last told of the rdm engine's pause
    /// ([`Endpoint::tell_senders_if_paused`]).
    senders_held_back: bool,
    /// Per peer (by id), what its small messages need to go straight to the
    /// device ([`SendHandle`]), made at its first such message. Boxed: only
    /// the few peers on a reliable, ordered path (this host's) have one.
    handles: Vec<Option<Box<SendHandle>>>,
}

/// What a peer's small messages need to go straight to the device, made once
/// and kept while the peer keeps its incarnation: the rdm engine's route (the
/// destination and the engine's header, every field written) and the
/// destination the device resolved for it. Checked per message
/// ([`Engine::route_open`]: a few loads); marked unusable when the engine
/// refuses it or the device does not take a write (a new incarnation, a full
/// or closed ring), and made again in place at the next message (its box is
/// allocated once per peer, never per message).
struct SendHandle {
    route: rdm::engine::DirectRoute,
    dest: rdm::device::Dest,
    usable: bool,
}

/// Parts of a datagram written over a send handle: the engine's header, the
/// message header, the payload.
const HANDLE_PARTS_MAX: usize = MAX_IOV + 2;

/// Writes a small message to `peer` (`parts`: the message header and the
/// payload) over the peer's send handle, made first if it has none or its
/// own was refused: the rdm engine's header prepended, straight to the
/// device. True when the device took it (the engine counted it). False when
/// nothing was done: DIRECT not allowed to the peer now, the device offers
/// no such writes toward it, or it did not take this one (`held_back` says
/// whether because the receiver holds its senders back; the handle is marked
/// unusable and made again at the next message, so a stale one is never used
/// twice).
#[inline]
fn write_over_handle<D: Device + ?Sized>(
    device: &mut D,
    rdm: &mut Engine,
    handles: &mut Vec<Option<Box<SendHandle>>>,
    now: Instant,
    peer: PeerId,
    parts: &[&[u8]],
    held_back: &mut bool,
) -> bool {
    if parts.len() >= HANDLE_PARTS_MAX {
        return false;
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let i = peer.index() as usize;
    let open = matches!(handles.get(i), Some(Some(h)) if h.usable && rdm.route_open(peer, &h.route, len));
    if !open && !make_handle(device, rdm, handles, peer, len) {
        return false;
    }
    let Some(Some(h)) = handles.get_mut(i) else { return false };
    let head = h.route.header_over(parts);
    let mut all: [&[u8]; HANDLE_PARTS_MAX] = [&[]; HANDLE_PARTS_MAX];
    all[0] = &head;
    all[1..=parts.len()].copy_from_slice(parts);
    match device.write(now, h.dest, &all[..=parts.len()]) {
        Ok(true) => {
            rdm.direct_written();
            true
        }
        Ok(false) => {
            *held_back = device.held_back(&h.route.dst);
            h.usable = false;
            false
        }
        Err(_) => {
            h.usable = false;
            false
        }
    }
}

/// Makes `peer`'s send handle, in its box if it has one (out of line: once per
/// peer, and again after a refusal): false, and the handle left unusable,
/// when DIRECT is not allowed to it for a message of `len` bytes now or the
/// device offers no such writes toward it.
#[inline(never)]
fn make_handle<D: Device + ?Sized>(
    device: &mut D,
    rdm: &Engine,
    handles: &mut Vec<Option<Box<SendHandle>>>,
    peer: PeerId,
    len: usize,
) -> bool {
    let i = peer.index() as usize;
    let made = rdm.direct_route(peer).filter(|route| rdm.route_open(peer, route, len)).and_then(|route| {
        let dest = device.resolve(&route.dst).ok().flatten()?;
        Some(SendHandle { route, dest, usable: true })
    });
    match (made, handles.get_mut(i)) {
        (Some(made), Some(Some(h))) => **h = made,
        (Some(made), _) => {
            if handles.len() <= i {
                handles.resize_with(i + 1, || None);
            }
            handles[i] = Some(Box::new(made));
        }
        (None, Some(Some(h))) => h.usable = false,
        (None, _) => {}
    }
    matches!(handles.get(i), Some(Some(h)) if h.usable)
}

impl<D: Device + ?Sized, M: Memory, C: Clock> Endpoint<D, M, C> {
    /// An endpoint over `device`, ready to move data.
    pub fn new(mut device: Box<D>, cfg: EndpointConfig, mem: M, clock: C) -> Endpoint<D, M, C> {
        let caps = device.caps();
        let rdm_cfg = EngineConfig {
            mtu: caps.mtu,
            reliable: caps.reliable,
            job_key: cfg.job_key,
            auth: cfg.auth.clone(),
            other_jobs: cfg.other_jobs.clone(),
            incarnation: cfg.incarnation,
            peer_timeout: cfg.peer_timeout,
            // With a progress thread, the ack of a completed message may wait
            // a little for the application's answer to carry it (the thread
            // sends it if the application stops calling in); without one, at
            // once.
            completed_ack_delay: if cfg.background_progress { Duration::from_micros(50) } else { Duration::ZERO },
            ..EngineConfig::default()
        };
        let msg_cfg = Config {
            rndv_threshold: cfg.rndv_threshold,
            rdma_rndv_threshold: cfg.rdma_rndv_threshold,
            window_threshold: cfg.window_threshold,
            window: Config::default().window,
            min_multi_recv: cfg.min_multi_recv,
            unexpected_limit: cfg.unexpected_limit,
            // Often enough that a peer which died while we wait on it draws an
            // ICMP (UDP) or a device report within a second; rare enough to cost
            // nothing (one small datagram per waited-on peer).
            keepalive: (cfg.peer_timeout / 4).min(Duration::from_millis(500)),
            datagram: cfg.datagram,
        };
        // Paths differ under auto (shm segments are larger than UDP's).
        let stage = Staging::new(device.transmit_buffers(TX_BATCH, caps.max_transmit.max(64)));
        Endpoint {
            device,
            rdm: Engine::new(rdm_cfg),
            msg: MsgEngine::new(msg_cfg),
            mem,
            clock,
            cfg,
            stage,
            reads: slab::Slab::new(),
            read_pull: Vec::new(),
            runs: Vec::with_capacity(READ_RUNS_MAX),
            events: VecDeque::new(),
            linger: None,
            closed: false,
            senders_held_back: false,
            handles: Vec::new(),
        }
    }

    /// Where registrations for paths that need keys come from (the domain's
    /// registration cache).
    pub fn set_registrations(&mut self, r: Box<dyn Registrations>) {
        self.msg.set_registrations(r);
    }

    pub fn set_min_multi_recv(&mut self, n: usize) {
        self.cfg.min_multi_recv = n;
        self.msg.set_min_multi_recv(n);
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    pub fn mem(&self) -> &M {
        &self.mem
    }

    pub fn mem_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    pub fn caps(&self) -> DeviceCaps {
        self.device.caps()
    }

    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }

    // ------------------------------------------------------------ peers

    /// The peer at `addr`, created on first use; its path is what the device
    /// offers toward it, fixed from now on.
    pub fn peer(&mut self, addr: DevAddr) -> PeerId {
        let path = self.device.caps_for(&addr);
        self.rdm.peer_with_path(addr, &path)
    }

    /// The process at `addr` as a peer in `job` (see [`Endpoint::peer`]).
    pub fn peer_in(&mut self, addr: DevAddr, job: JobIdx) -> PeerId {
        let path = self.device.caps_for(&addr);
        self.rdm.peer_in_with_path(addr, job, &path)
    }

    /// The peer at `addr` if it exists.
    pub fn peer_id_of(&self, addr: DevAddr) -> Option<PeerId> {
        self.rdm.peer_id_of(addr)
    }

    /// The job `peer` is a process of.
    pub fn peer_job(&self, peer: PeerId) -> JobIdx {
        self.rdm.peer_job(peer)
    }

    /// The rdm engine's counters of one job.
    pub fn job_counters(&self, job: JobIdx) -> rdm::engine::JobCounters {
        self.rdm.job_counters(job)
    }

    /// How many jobs the endpoint serves.
    pub fn jobs(&self) -> usize {
        self.rdm.job_keys().count()
    }

    /// Whether `job`'s traffic over a wire is sealed.
    pub fn job_sealed(&self, job: JobIdx) -> bool {
        self.rdm.job_sealed(job)
    }

    pub fn peer_addr(&self, peer: PeerId) -> DevAddr {
        self.rdm.peer_addr(peer)
    }

    /// Why `peer` last failed, if it did (see [`MsgEngine::fail_reason`]).
    pub fn fail_reason(&self, peer: PeerId) -> Option<rdm::engine::FailReason> {
        self.msg.fail_reason(peer)
    }

    /// The application addresses `peer` as incarnation `inc` of its process;
    /// false if that incarnation is known to be gone (nothing sent on it may
    /// reach a newer one).
    pub fn expect_incarnation(&mut self, peer: PeerId, inc: u64) -> bool {
        self.rdm.expect_incarnation(peer, inc)
    }

    // ------------------------------------------------------------ operations

    /// Sends a message; runs what the post produced (a DIRECT message leaves
    /// here). `Again` when the send queue is full (after a round of progress).
    pub fn send(&mut self, msg: OutMsg<'_>) -> Result<(), PostError> {
        if let Some(c) = self.send_reporting(&msg)? {
            self.msg.push_completion(c);
        }
        Ok(())
    }

    /// [`Endpoint::send`], except that a message that completes in the call
    /// (the small-message path) while no completion waits to be pulled
    /// returns its completion instead of queueing it: the caller reports it
    /// at once, in order, and saves the queue's round trip.
    pub fn send_reporting(&mut self, msg: &OutMsg<'_>) -> Result<Option<Completion>, PostError> {
        if self.msg.pending_sends() >= self.cfg.tx_size.max(1) * 4 {
            self.progress();
            return Err(PostError::Again);
        }
        let t = self.clock.now();
        // The small-message path of a reliable, ordered device (shm): written
        // by the device straight into the peer's ring cell and completed
        // now, when nothing of ours waits to go out, to be reported or to be
        // run first (it would be overtaken: the other path runs it here).
        if self.stage.count == 0
            && self.reads.is_empty()
            && !self.rdm.wants_transmit()
            && !self.rdm.has_events()
            && !self.msg.has_actions()
        {
            let (device, handles) = (&mut self.device, &mut self.handles);
            let mut held_back = false;
            let write = |rdm: &mut Engine, parts: &[&[u8]]| {
                write_over_handle(&mut **device, rdm, handles, t, msg.peer, parts, &mut held_back)
            };
            if let DirectSend::Sent(c) = self.msg.send_direct(&mut self.rdm, msg, write) {
                return Ok(match c {
                    Some(c) if self.msg.has_completions() => {
                        self.msg.push_completion(c);
                        None
                    }
                    c => c,
                });
            }
            if held_back {
                // The receiver is at its unexpected-message limit: this
                // message and those after it go sequenced, held by its window.
                self.rdm.peer_holds_back(t, msg.peer);
            }
        }
        // DIRECT messages queued behind a full ring go out with the flush
        // below, whatever their receiver said since: a receiver at its
        // unexpected-message limit still takes DIRECT packets, and its
        // zero-window ACK waits in our input. Read it first, so that an
        // application that only sends stops writing DIRECT packets to it.
        if self.rdm.direct_queued() {
            self.progress();
        }
        // With nothing staged, a message that goes as one DIRECT datagram is
        // written straight into the first transmit buffer: no queue, no pooled
        // copy; `settle` hands it to the device ahead of anything else.
        let stage = if self.stage.count == 0 { Some(&mut self.stage.bufs[0][..]) } else { None };
        match self.msg.send_staged(Io::new(&mut self.rdm, t), msg, stage) {
            Ok((_, staged)) => {
                if let Some(tx) = staged {
                    self.stage.staged[0] = Staged { dst: tx.dst, len: tx.len, seg: tx.seg, gather: None };
                    self.stage.count = 1;
                    // To the device before its `SendComplete` is taken: a
                    // device that finds the peer gone then turns it into a
                    // failure (a DIRECT message to a dead process must never
                    // complete successfully).
                    self.flush(t);
                }
                self.settle(t);
                Ok(None)
            }
            Err(e) => {
                self.progress();
                Err(e)
            }
        }
    }

    /// Posts a receive. `Again` when the receive queue is full even after the
    /// arrivals of a round of progress.
    pub fn post_recv(&mut self, spec: RecvSpec) -> Result<(), PostError> {
        let limit = self.cfg.rx_size.max(1) * 4;
        if self.msg.posted_recvs() >= limit {
            // Arrivals may complete posted receives: count again after them.
            self.progress();
            if self.msg.posted_recvs() >= limit {
                return Err(PostError::Again);
            }
        }
        let t = self.clock.now();
        self.msg.post_recv(Io::new(&mut self.rdm, t), spec, &mut self.mem);
        self.settle(t);
        Ok(())
    }

    /// `FI_PEEK` (and `FI_CLAIM` with it): reports whether a matching message
    /// has arrived. Takes in what the device holds first (MPI_Iprobe must see
    /// a message already sent).
    pub fn peek(&mut self, spec: RecvSpec, claim: bool, discard: bool) {
        self.progress();
        let t = self.clock.now();
        self.msg.peek(Io::new(&mut self.rdm, t), spec, claim, discard);
        self.settle(t);
    }

    /// `FI_CLAIM`: receives (or discards) the message a peek claimed.
    pub fn claim(&mut self, spec: RecvSpec, discard: bool) -> Result<(), PostError> {
        self.progress();
        let t = self.clock.now();
        self.msg.claim(Io::new(&mut self.rdm, t), spec, discard, &mut self.mem)?;
        self.settle(t);
        Ok(())
    }

    /// Cancels the posted receive with this context; false if there is none.
    pub fn cancel(&mut self, context: u64) -> bool {
        if !self.msg.cancel(context) {
            return false;
        }
        self.progress();
        true
    }

    /// fi_write: `payload` to `target`, with remote CQ data.
    pub fn rma_write(
        &mut self,
        target: RmaTarget,
        payload: &[&[u8]],
        data: Option<u64>,
        meta: OpMeta,
    ) -> Result<RmaId, PostError> {
        let t = self.clock.now();
        let id = self.msg.rma_write(Io::new(&mut self.rdm, t), target, payload, data, meta)?;
        self.progress();
        Ok(id)
    }

    /// fi_read: `dst.total()` bytes at `target` into `dst`.
    pub fn rma_read(&mut self, target: RmaTarget, dst: IoList, meta: OpMeta) -> Result<RmaId, PostError> {
        let t = self.clock.now();
        let id = self.msg.rma_read(Io::new(&mut self.rdm, t), target, dst, meta)?;
        self.progress();
        Ok(id)
    }

    /// An atomic (see [`MsgEngine::atomic`]).
    pub fn atomic(&mut self, req: AtomicRequest<'_>, meta: OpMeta) -> Result<RmaId, PostError> {
        let t = self.clock.now();
        let id = self.msg.atomic(Io::new(&mut self.rdm, t), req, meta)?;
        self.progress();
        Ok(id)
    }

    // ------------------------------------------------------------ outputs

    /// The next completion of an operation.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.msg.poll_completion()
    }

    /// The next event (failed peers, device failures).
    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        if let Some(peer) = self.msg.poll_failed_peer() {
            return Some(EndpointEvent::PeerFailed { peer, addr: self.rdm.peer_addr(peer) });
        }
        self.events.pop_front()
    }

    /// Whether a completion or event is waiting to be pulled.
    pub fn has_output(&self) -> bool {
        !self.events.is_empty() || self.msg.has_completions() || self.msg.has_failed_peers()
    }

    /// When the endpoint next needs a round of progress without input.
    pub fn poll_timeout(&self) -> Option<Instant> {
        // While our data is unacknowledged the idle deadline may be past and
        // still not end the linger: then only its bound (and the rdm timers,
        // for the retransmissions) can, never a deadline already gone, which
        // would wake the caller at once, again and again.
        let linger = self.linger.as_ref().map(|l| {
            if self.rdm.has_unacked() {
                l.start + LINGER_MAX
            } else {
                (l.last_rx + LINGER_IDLE).min(l.start + LINGER_MAX)
            }
        });
        [self.rdm.poll_timeout(), self.msg.poll_timeout(), linger].into_iter().flatten().min()
    }

    /// Before a sleep: arms the device's wait fd and says what to sleep on.
    pub fn prepare_wait(&mut self) -> WaitOn {
        let ready = self.device.prepare_wait();
        // A read in flight completes with an event on the device's fd; one
        // that never does is given up by the device when polled: wake now
        // and then while any is out.
        let reads = (!self.reads.is_empty()).then(|| self.clock.now() + READ_POLL);
        // A lingering close wakes at the linger's end too (poll_timeout).
        let deadline = [self.poll_timeout(), reads].into_iter().flatten().min();
        WaitOn { fd: self.device.wait_fd(), deadline, ready }
    }

    /// Whether the endpoint refuses new messages now, holding its
    /// unexpected-message limit (its senders wait until receives take some).
    pub fn refusing_messages(&self) -> bool {
        self.rdm.is_paused()
    }

    /// The message engine's counters alone (no device query: `&self`).
    pub fn msg_stats(&self) -> crate::engine::Stats {
        self.msg.stats()
    }

    /// The endpoint's counters (`&mut`: the device's connection counters are
    /// read through its one accessor for remote reads).
    pub fn stats(&mut self) -> EndpointStats {
        EndpointStats {
            rdm: *self.rdm.stats(),
            msg: self.msg.stats(),
            unexpected_bytes: self.msg.unexpected_bytes(),
            read_conns: self.device.remote_reads().map(|r| r.read_conn_stats()).unwrap_or_default(),
        }
    }

    /// A snapshot of every peer that carried reliable traffic (reads only:
    /// for stats, never on the data path).
    pub fn peer_stats(&self) -> impl Iterator<Item = PeerStats> + '_ {
        use crate::engine::peer_counter as pc;
        self.rdm.peer_snapshots().map(|p| {
            let u = &p.counters.upper;
            let mb = |i: usize| MsgBytes { messages: u[i], bytes: u[i + 1] };
            PeerStats {
                addr: p.addr,
                job: p.job,
                sent_eager: mb(pc::SENT_EAGER_MSGS),
                sent_rendezvous: mb(pc::SENT_RNDV_MSGS),
                received_eager: mb(pc::RECV_EAGER_MSGS),
                received_pulled: mb(pc::RECV_PULLED_MSGS),
                received_windowed: mb(pc::RECV_WINDOWED_MSGS),
                retransmits: p.counters.retransmits,
                duplicates: p.counters.duplicates,
                dropped_stale: p.counters.dropped_stale,
                dropped_window: p.counters.dropped_window,
                srtt: p.srtt,
                cwnd: p.cwnd,
                failed: p.failed,
            }
        })
    }

    pub fn pending_sends(&self) -> usize {
        self.msg.pending_sends()
    }

    pub fn posted_recvs(&self) -> usize {
        self.msg.posted_recvs()
    }

    pub fn unexpected_bytes(&self) -> usize {
        self.msg.unexpected_bytes()
    }

    /// Bytes `peer` costs the reliable-datagram engine (its own estimate:
    /// cold entry, and hot state with the buffers it holds once the peer
    /// carried traffic; see [`rdm::engine::Engine::peer_bytes`]).
    pub fn peer_bytes(&self, peer: PeerId) -> usize {
        self.rdm.peer_bytes(peer)
    }

    /// Bytes accepted for `peer` that wait behind its send window in the
    /// reliable-datagram engine ([`rdm::engine::Engine::queued_bytes`]).
    pub fn queued_bytes(&self, peer: PeerId) -> usize {
        self.rdm.queued_bytes(peer)
    }

    /// Bytes the reliable-datagram engine keeps for reuse (buffer pools,
    /// spare queues; see [`rdm::engine::Engine::pooled_bytes`]).
    pub fn pooled_bytes(&self) -> usize {
        self.rdm.pooled_bytes()
    }

    /// Bytes of the transmit staging buffers the device lent.
    pub fn staging_bytes(&self) -> usize {
        self.stage.bufs.iter().map(|b| b.len()).sum()
    }

    /// Peers with hot state in the reliable-datagram engine.
    pub fn hot_peers(&self) -> usize {
        self.rdm.hot_peers()
    }

    // ------------------------------------------------------------ progress

    /// One round of progress (see the module docs for its order).
    #[inline]
    pub fn progress(&mut self) {
        if !self.quiet() {
            self.progress_round();
        }
    }

    /// [`Endpoint::progress`] when the endpoint is not quiet (out of line:
    /// an idle poll does not pay for this frame).
    #[inline(never)]
    fn progress_round(&mut self) {
        // The clock is read only when something needs it: an idle poll (nothing
        // received, no timer, nothing to send) costs no clock read.
        let mut clock: Option<Instant> = None;
        let mut active = false;
        {
            let Endpoint { device, rdm, msg, clock: source, events, mem, .. } = self;
            for _ in 0..RX_ROUNDS {
                match device.recv_batch(RX_BATCH, &mut |from, bytes| {
                    let now = *clock.get_or_insert_with(|| source.now());
                    msg.receive_datagram(Io::new(rdm, now), from, bytes, mem)
                }) {
                    Ok(0) => break,
                    Ok(n) => {
                        active = true;
                        // A short batch is all the device had ready: asking
                        // again would cost UDP an empty recvmmsg per round.
                        if n < RX_BATCH {
                            break;
                        }
                    }
                    Err(error) => {
                        events.push_back(EndpointEvent::DeviceFailed { op: "receive", error });
                        break;
                    }
                }
            }
            // Senders heard for the first time get their path now, before
            // the message engine answers any of them.
            while let Some(p) = rdm.poll_pathless_peer() {
                let addr = rdm.peer_addr(p);
                rdm.peer_in_with_path(addr, rdm.peer_job(p), &device.caps_for(&addr));
            }
            while let Some(addr) = device.poll_unreachable() {
                msg.handle_unreachable(rdm, addr);
                active = true;
            }
        }
        if let Some(deadline) = self.rdm.next_timeout() {
            let t = *clock.get_or_insert_with(|| self.clock.now());
            if deadline <= t {
                self.rdm.handle_timeout(t);
                active = true;
            }
        }
        if let Some(deadline) = self.msg.poll_timeout() {
            let t = *clock.get_or_insert_with(|| self.clock.now());
            if deadline <= t {
                self.msg.handle_timeout(Io::new(&mut self.rdm, t));
            }
        }
        // A receive posted for an announced (rendezvous) message queues a remote
        // read with no datagram arriving: run it now, not at the next input;
        // and a posted read may have finished.
        if active || self.rdm.has_events() || self.msg.has_actions() || !self.reads.is_empty() {
            let t = *clock.get_or_insert_with(|| self.clock.now());
            self.run_engine(t);
        }
        if self.stage.count > 0 || self.rdm.wants_transmit() {
            let t = clock.unwrap_or_else(|| self.clock.now());
            self.flush(t);
        }
    }

    /// Whether a round of progress would do nothing now: no timer armed in
    /// either engine (so no clock is read), nothing queued to run, send or
    /// report, no read in flight, no close lingering, and the device quiet
    /// ([`Device::quiet`], which counts this as one of its polls). Checked
    /// first, in this order, so that an idle poll costs a few loads: the
    /// device is asked last, since asking takes a turn of its schedule.
    #[inline]
    fn quiet(&mut self) -> bool {
        self.engines_quiet() && self.device.quiet()
    }

    /// Nothing for a round to do but look at the device: nothing staged or
    /// being read, no timer, event, transmission or action pending.
    #[inline]
    fn engines_quiet(&self) -> bool {
        self.stage.count == 0
            && self.reads.is_empty()
            && self.linger.is_none()
            && self.rdm.no_timers()
            && self.msg.no_timers()
            && !self.rdm.has_events()
            && !self.rdm.wants_transmit()
            && !self.rdm.has_pathless_peers()
            && !self.msg.has_actions()
    }

    /// How many rounds of progress in a row, from now, need not run while
    /// the device's input probe ([`rdm::Device::input_probe`]) finds no input: none unless
    /// the engines are quiet and nothing waits to be pulled (completions,
    /// events), then as many as the device's schedule allows
    /// ([`rdm::Device::quiet_rounds`]). The caller skips them without taking
    /// whatever guards this endpoint, and reports how many it skipped
    /// ([`Endpoint::rounds_skipped`]) before the next call that changes it.
    pub fn idle_rounds(&self) -> u32 {
        if self.engines_quiet() && !self.has_output() {
            self.device.quiet_rounds()
        } else {
            0
        }
    }

    /// `n` rounds were skipped on the probe's word ([`Endpoint::idle_rounds`]).
    pub fn rounds_skipped(&mut self, n: u32) {
        self.device.rounds_skipped(n);
    }

    /// Tells the device when the rdm engine started or stopped pausing
    /// (the message engine's unexpected-message limit), before the ACKs that
    /// say so leave: the device tells senders that write straight into our
    /// ring ([`Device::hold_back_senders`]).
    fn tell_senders_if_paused(&mut self) {
        let paused = self.rdm.is_paused();
        if paused != self.senders_held_back {
            self.senders_held_back = paused;
            self.device.hold_back_senders(paused);
        }
    }

    /// After a post: runs what the post itself produced (a match against an
    /// unexpected message, a read to start, completions, datagrams to send)
    /// without polling the device or the timers, which the next round does. A
    /// full round per posted operation would cost a device poll and the timer
    /// checks on every send and receive.
    fn settle(&mut self, t: Instant) {
        if self.rdm.has_events() || self.msg.has_actions() {
            self.run_engine(t);
        }
        if self.stage.count > 0 || self.rdm.wants_transmit() {
            self.flush(t);
            // A DIRECT message completes as it is written out: report it now,
            // so the application's next completion read finds it.
            if self.rdm.has_events() {
                self.msg.handle_events(Io::new(&mut self.rdm, t), &mut self.mem);
            }
        }
    }

    /// Runs the message engine on what the rdm engine delivered, posts the
    /// reads it asks for, takes in the reads that finished, and runs it again
    /// on their outcome.
    fn run_engine(&mut self, t: Instant) {
        self.msg.handle_events(Io::new(&mut self.rdm, t), &mut self.mem);
        if self.msg.has_actions() || !self.reads.is_empty() || self.msg.has_device_control() {
            self.exchange_control(t);
            self.post_reads(t);
            self.finish_reads(t);
            self.msg.handle_events(Io::new(&mut self.rdm, t), &mut self.mem);
            self.exchange_control(t);
        }
    }

    /// Hands the device what peers' devices sent it, and sends what it has
    /// for them (the handshake of connections for remote reads) over the
    /// reliable stream.
    fn exchange_control(&mut self, t: Instant) {
        // A failed peer's connections go, and its reads in flight fail (they
        // are taken in as failed: the peer is gone).
        while let Some(peer) = self.msg.poll_gone_peer() {
            let addr = self.rdm.peer_addr(peer);
            if let Some(r) = self.device.remote_reads() {
                r.peer_failed(addr);
            }
        }
        while let Some((peer, m)) = self.msg.poll_device_control() {
            let addr = self.rdm.peer_addr(peer);
            if let Some(r) = self.device.remote_reads() {
                r.handle_control(t, addr, m.bytes());
            }
        }
        while let Some((addr, m)) = self.device.remote_reads().and_then(|r| r.poll_control()) {
            // The first job's peer: only verbs RC makes these, and an endpoint
            // over verbs serves one job (its NIC filters one Q_Key).
            debug_assert_eq!(self.rdm.job_keys().count(), 1, "device control on an endpoint of several jobs");
            let peer = self.peer(addr);
            self.msg.send_device_control(Io::new(&mut self.rdm, t), peer, m.bytes());
        }
    }

    /// Turns the message engine's read requests into posted device reads.
    fn post_reads(&mut self, t: Instant) {
        while let Some(Action::RemoteRead { id, addr, src, src_count, dst, .. }) = self.msg.poll_action() {
            let path = self.device.caps_for(&addr);
            if !self.cfg.remote_reads || !path.remote_read {
                self.msg.remote_read_done(Io::new(&mut self.rdm, t), id, ReadOutcome::NotPermitted);
                continue;
            }
            self.runs.clear();
            let mut held: [Option<RegHandle>; READ_RUNS_MAX] = [None; READ_RUNS_MAX];
            let mut nameable = true;
            let (mem, runs, engine) = (&mut self.mem, &mut self.runs, &mut self.msg);
            for_each_read_run(&src[..src_count], &dst, |remote_key, from, to, len| {
                let Some(mut local) = mem.read_target(to, len) else {
                    nameable = false;
                    return false;
                };
                if path.registration && remote_key.is_none() {
                    // Announced without a key (the sender could not register
                    // it): nothing can be read; the sender pushes instead.
                    nameable = false;
                    return false;
                }
                if path.registration {
                    // The destination must be registered for the device to
                    // write it (verbs: the read's local key).
                    let Some(regs) = engine.registrations() else {
                        nameable = false;
                        return false;
                    };
                    match regs.acquire(to, len, Access::LocalWrite) {
                        Ok(r) => {
                            held[runs.len()] = Some(r.handle);
                            local = local.with_key(r.key);
                        }
                        Err(_) => {
                            nameable = false;
                            return false;
                        }
                    }
                }
                runs.push(ReadRun { remote_addr: from, remote_key, local });
                runs.len() < READ_RUNS_MAX
            });
            let read_id = self.reads.vacant_key() as u64;
            let posted = match self.device.remote_reads() {
                Some(r) if nameable => r.post_read(t, read_id, addr, &self.runs),
                _ => Err(DeviceError::Unsupported),
            };
            match posted {
                Ok(()) => {
                    let key = self.reads.insert(ReadInFlight { local_regs: held });
                    if self.read_pull.len() <= key {
                        self.read_pull.resize(key + 1, PullId(u32::MAX));
                    }
                    self.read_pull[key] = id;
                }
                Err(error) => {
                    self.release_regs(&held);
                    let outcome = match error {
                        // This path cannot read (or the memory cannot be
                        // named for it): the sender pushes instead.
                        DeviceError::Unsupported => ReadOutcome::NotPermitted,
                        // It can read, not yet (a connection is being set
                        // up): pushed, and later messages are pulled.
                        DeviceError::NotConnected => ReadOutcome::NotNow,
                        error => {
                            self.events.push_back(EndpointEvent::ReadFailed { addr, bytes: 0, error: Some(error) });
                            ReadOutcome::Failed(0)
                        }
                    };
                    self.msg.remote_read_done(Io::new(&mut self.rdm, t), id, outcome);
                }
            }
        }
    }

    /// Takes in device reads that finished.
    fn finish_reads(&mut self, t: Instant) {
        while let Some(done) = self.device.remote_reads().and_then(|r| r.poll_read(t)) {
            let key = done.id as usize;
            let Some(r) = self.reads.try_remove(key) else { continue };
            self.release_regs(&r.local_regs);
            let id = self.read_pull[key];
            let failed_peer = self.msg.pull_peer(id).is_some_and(|p| self.msg.fail_reason(p).is_some());
            let outcome = match done.error {
                None => ReadOutcome::Done(done.bytes),
                // The connection broke under the read (the peer lives): the
                // sender still holds the message, so it pushes it whole.
                Some(DeviceError::NotConnected) if !failed_peer => ReadOutcome::NotNow,
                Some(error) => {
                    let addr = self.msg.pull_peer(id).map(|p| self.rdm.peer_addr(p)).unwrap_or(DevAddr::NONE);
                    self.events.push_back(EndpointEvent::ReadFailed { addr, bytes: done.bytes, error: Some(error) });
                    ReadOutcome::Failed(done.bytes)
                }
            };
            self.msg.remote_read_done(Io::new(&mut self.rdm, t), id, outcome);
        }
    }

    fn release_regs(&mut self, held: &[Option<RegHandle>]) {
        if let Some(regs) = self.msg.registrations() {
            for h in held.iter().flatten() {
                regs.release(*h);
            }
        }
    }

    /// Moves datagrams from the engine to the device until either runs dry.
    /// Each batch pulled goes to the device in this call: the rdm engine
    /// reports a DIRECT message complete when it is pulled, so no pulled
    /// datagram may wait here across a return to the application unless the
    /// device refused it (then it is retried first, in order).
    fn flush(&mut self, t: Instant) {
        self.tell_senders_if_paused();
        loop {
            // A batch of DIRECT packets is about to be pulled: not to a
            // receiver that holds its senders back (its flag, seen before its
            // zero-window ACK), however fast it drains its ring meanwhile.
            if let Some((peer, dst)) = self.rdm.direct_queued_to() {
                if self.device.held_back(&dst) {
                    self.rdm.peer_holds_back(t, peer);
                }
            }
            while self.stage.count < TX_BATCH {
                let i = self.stage.count;
                match self.rdm.poll_transmit(t, &mut self.stage.bufs[i]) {
                    Some(tx) => {
                        self.stage.staged[i] = Staged { dst: tx.dst, len: tx.len, seg: tx.seg, gather: tx.gather };
                        self.stage.count += 1;
                    }
                    None => break,
                }
            }
            if self.stage.count == 0 {
                return;
            }
            // One datagram (a small message, an ack) is the usual case: no
            // batch array to fill.
            let one;
            let mut batch;
            let datagrams: &[TxDatagram<'_>] = if self.stage.count == 1 {
                one = [self.stage.datagram(0)];
                &one
            } else {
                batch = [TxDatagram::new(self.stage.staged[0].dst, &[]); TX_BATCH];
                for (i, slot) in batch.iter_mut().enumerate().take(self.stage.count) {
                    *slot = self.stage.datagram(i);
                }
                &batch[..self.stage.count]
            };
            let taken = match self.device.send_batch(t, datagrams) {
                Ok(n) => n,
                Err(error) => {
                    // The first datagram cannot go out (peer gone, unroutable):
                    // drop it; a destination the device calls unreachable fails
                    // the peer now, anything else is retransmitted or times the
                    // peer out.
                    match error {
                        DeviceError::Unreachable(a) => self.msg.handle_unreachable(&mut self.rdm, a),
                        // A run the device can no longer send whole (its offload
                        // was refused): single datagrams from now on.
                        DeviceError::Unsupported if self.stage.staged[0].seg < self.stage.staged[0].len => {
                            self.rdm.disable_runs()
                        }
                        _ => {}
                    }
                    self.events.push_back(EndpointEvent::DeviceFailed { op: "send", error });
                    1
                }
            };
            let taken = taken.min(self.stage.count);
            // A datagram the device did not take waits in its stage; one with
            // a gathered part may not: its message could complete (an earlier
            // transmission acknowledged) before this one goes, and the
            // application have its buffer back. It goes back to the rdm
            // engine, which forms it again only while its message is pending.
            self.stage.give_back_gathered(taken, &mut self.rdm);
            if taken == 0 {
                return;
            }
            // Keep the untaken tail at the front, in order.
            self.stage.consume(taken);
            if self.stage.count > 0 {
                return;
            }
        }
    }

    // ------------------------------------------------------------ close

    /// Starts closing: acknowledges everything received so far (no peer
    /// waits on a delayed ack) and pushes it out. On a path that can lose
    /// datagrams the endpoint then lingers, like TCP's TIME_WAIT briefly: a
    /// peer whose last acknowledgement was lost resends, and without an
    /// answer its send would fail with the port closed although the message
    /// arrived. Call [`Endpoint::poll_close`] until it says done.
    ///
    /// Rendezvous sends still announced (no Fin yet) are not waited for:
    /// their receiver may not have posted a receive, and when it will is the
    /// receiving application's business, not a delay the provider can bound
    /// (the linger above waits for acknowledgements the peer's provider
    /// sends on its own, and only on lossy paths). An application closes
    /// with such a send pending only when it abandoned it (MPI completes
    /// every send before it finalizes). Once the close returns the buffers
    /// are the application's again (fi_endpoint(3)): a peer that pulls one
    /// later must not deliver what it reads. The device keeps that promise
    /// where the read names a process rather than the endpoint (shm: the
    /// read counts only if the sender's ring stayed open through the copy,
    /// else it fails and so does the receive). RDMA reads (verbs, efa) are
    /// answered by the sender endpoint's queue pairs, which its device
    /// destroys when it is dropped at close.
    pub fn close(&mut self) {
        self.progress();
        self.rdm.flush_acks();
        let t = self.clock.now();
        self.flush(t);
        let rdm = &self.rdm;
        if rdm.has_lossy_peers() && rdm.stats().received > 0 {
            self.linger = Some(Linger { start: t, last_rx: t, seen: rdm.stats().received });
        } else {
            self.closed = true;
        }
    }

    /// Whether a close has finished.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// One round of closing; true once the endpoint may go: nothing arrived
    /// for `LINGER_IDLE` and our data is acknowledged, or `LINGER_MAX` passed.
    pub fn poll_close(&mut self) -> bool {
        if self.closed {
            return true;
        }
        if self.linger.is_none() {
            self.close();
            return self.closed;
        }
        self.progress();
        self.rdm.flush_acks();
        let t = self.clock.now();
        self.flush(t);
        let received = self.rdm.stats().received;
        let unacked = self.rdm.has_unacked();
        let Some(l) = self.linger.as_mut() else { return true };
        if received != l.seen {
            l.seen = received;
            l.last_rx = t;
        }
        let idle = t.saturating_duration_since(l.last_rx) >= LINGER_IDLE && !unacked;
        if idle || t.saturating_duration_since(l.start) >= LINGER_MAX {
            self.closed = true;
        }
        self.closed
    }
}
