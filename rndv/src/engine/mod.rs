//! The per-endpoint message engine: every protocol decision of rdmx's message
//! layer, sans-IO.
//!
//! [`MsgEngine`] runs on top of the endpoint's `rdm` [`Engine`] (reliable, ordered
//! delivery per peer) what libfabric's RDM semantics need: sends and
//! posted receives with tag matching ([`crate::matching`]), the protocol of each
//! message chosen from the peer's [`Path`] (eager, or a rendezvous the receiver
//! pulls where the path can read remotely, with a push fallback), RMA and atomics
//! emulated as request/answer messages, cancel, peek/claim/discard, multi-receive,
//! and failure of everything that waits on a peer that died.
//!
//! With [`Config::datagram`] the same engine gives `FI_EP_DGRAM` semantics
//! instead: each message, header included, travels as one unreliable `rdm`
//! datagram ([`Engine::send_datagram`]; larger is [`PostError::TooLarge`]), a
//! send completes once written out for the device, and an arriving message
//! that matches no posted receive is dropped and counted
//! ([`Stats::dropped_unmatched`]), never held. Matching (tags, directed
//! receives) is the same; rendezvous, RMA and multi-receive are not used.
//!
//! Inputs are calls with the time as an argument; outputs are pulled:
//! [`MsgEngine::poll_completion`] (what the provider reports on CQs and
//! counters), [`MsgEngine::poll_action`] (work for the layer below: remote reads)
//! and the `rdm` engine's datagrams (pulled from that engine by its owner).
//!
//! It does not own the `rdm` engine: the endpoint holds both side by side, and
//! every call that sends or reads per-peer state takes the `rdm` engine as its
//! first argument (with the time of the call, as one [`Io`], where the call
//! can send). Either engine can then be driven, tested and fuzzed with
//! the other in plain view, and the endpoint decides what runs in which order
//! (see `crate::endpoint`). Application memory is
//! reached only through the [`Memory`] trait, which the provider implements with
//! raw pointers and tests implement with a vector: this crate holds no `unsafe`.
//!
//! Operation entries live in slabs; their typed ids ([`TxId`], [`RxId`],
//! [`RmaId`], [`PullId`]) travel on the wire as request ids and come back in
//! answers, which are checked against the peer they came from. The `rdm` send
//! token of each packet is a [`Token`], encoded and decoded in one place.
use crate::matching::{Arrived, Matcher};
use crate::wire::msg::{MsgHeader, MsgKind, HEADER_LEN};
use crate::wire::rendezvous::MAX_IOV;
use crate::wire::Packet;
use rdm::engine::{Engine, Event, FailReason, PeerId, PeerPath};
use rdm::{DevAddr, DeviceCaps, Instant};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use slab::Slab;
use std::collections::VecDeque;

mod eager;
mod ops;
mod rendezvous;
mod rma;

pub use ops::{
    Access, Action, AtomicRequest, Completion, Config, IoBuf, IoList, Memory, OpError, OpKind, OpMeta, OutMsg,
    PostError, PullId, ReadOutcome, RecvSpec, RegHandle, Registration, RegistrationError, Registrations, RmaId,
    RmaTarget, RxId, Stats, Token, TxId,
};
pub use rendezvous::{for_each_read_run, PUSH_CHUNK, PUSH_COPY_AHEAD, PUSH_COPY_CHUNK};

/// What [`MsgEngine::send_direct`] did.
#[derive(Debug)]
pub enum DirectSend {
    /// Nothing: send the message the other way.
    NotTaken,
    /// Written and complete; its completion, unless the operation asked
    /// for none.
    Sent(Option<Completion>),
}
pub(crate) use ops::peer_counter;

/// What the message engine's calls that can send run with: the endpoint's
/// `rdm` engine (passed, not owned; see the module docs) and the time of the
/// call. The two always travel together, so they are one argument;
/// application memory, which fewer calls reach, stays an argument of its own.
///
/// Two words, passed by value; a callee that hands it on and then uses it
/// again passes [`Io::reborrow`].
pub struct Io<'a> {
    pub rdm: &'a mut Engine,
    pub now: Instant,
}

impl<'a> Io<'a> {
    #[inline]
    pub fn new(rdm: &'a mut Engine, now: Instant) -> Io<'a> {
        Io { rdm, now }
    }

    /// The same engine and time for a call that borrows them only while it
    /// runs.
    #[inline]
    pub fn reborrow(&mut self) -> Io<'_> {
        Io { rdm: &mut *self.rdm, now: self.now }
    }
}

/// What the engine and the protocols know about the way to one peer, fixed
/// when the peer is first used: the device's caps for that peer (under `auto`, a
/// same-host peer gets the shared-memory path's).
pub type Path = DeviceCaps;

struct TxEntry {
    meta: OpMeta,
    msg: MsgKind,
    len: usize,
    peer: PeerId,
    /// A long message announced by an RTS: the user's buffers (valid until the
    /// send completes, by libfabric's contract).
    rndv: Option<IoList>,
    /// Registrations acquired for the RTS's keys, released when the send
    /// completes.
    regs: [Option<RegHandle>; MAX_IOV],
    /// Pushes sent from the application's memory (`Engine::send_gather`)
    /// that rdm has not completed: the NIC may still read the buffer, so the
    /// send completes (and its registrations go back) only after them.
    gathered: u32,
    /// The receiver's Fin, held while `gathered` pushes are out: the
    /// completion's error, if any.
    fin: Option<Option<OpError>>,
}

struct RxEntry {
    iov: IoList,
    meta: OpMeta,
    /// FI_MULTI_RECV: bytes of the buffer already filled.
    multi_offset: Option<u64>,
}

/// An RMA or atomic at the initiator, from its request until its answer:
/// what its completion reports, and where read data or old values land.
struct RmaEntry {
    kind: OpKind,
    meta: OpMeta,
    peer: PeerId,
    /// Where read data or fetched values go.
    result: IoList,
    len: usize,
}

/// Where a matched message lands and what its completion says.
#[derive(Clone, Copy)]
struct Landing {
    target: IoList,
    meta: OpMeta,
    /// The message's kind, tag and remote CQ data, for its completion.
    header: MsgHeader,
    buf: u64,
    msg_len: usize,
    src: PeerId,
    multi_done: bool,
}

struct Pull {
    peer: PeerId,
    req: u64,
    landing: Landing,
}

/// A receive whose message arrives by window grants.
struct WindowRx {
    landing: Landing,
    /// Bytes this receive takes: the message, or less if the buffer is shorter.
    take: u64,
    granted: u64,
    received: u64,
}

/// The message engine of one endpoint. See the module docs.
pub struct MsgEngine {
    cfg: Config,
    matcher: Matcher,
    tx: Slab<TxEntry>,
    rx: Slab<RxEntry>,
    rma: Slab<RmaEntry>,
    pulls: Slab<Pull>,
    /// Messages reserved by FI_PEEK|FI_CLAIM, by the context that claims them.
    claimed: HashMap<u64, Arrived>,
    /// Peers that refused to pull: long messages to them go eagerly.
    refused: HashSet<PeerId>,
    /// Matched receives whose bytes arrive by window grants, by (sender, its
    /// request).
    windows: HashMap<(PeerId, u64), WindowRx>,
    /// Granted ranges (send, offset, end) the rdm engine has not taken yet.
    push_backlog: VecDeque<(TxId, u64, u64)>,
    completions: VecDeque<Completion>,
    actions: VecDeque<Action>,
    failed_peers: VecDeque<PeerId>,
    /// Why each peer that failed did, last failure first ([`MsgEngine::fail_reason`]).
    fail_reasons: HashMap<PeerId, FailReason>,
    /// Peers an answer is awaited from, with when the next keepalive is due.
    awaiting: HashMap<PeerId, Instant>,
    /// Where registrations for registering paths come from (none: such
    /// paths get no rendezvous, long messages go eagerly).
    registrations: Option<Box<dyn Registrations>>,
    /// Device control messages that arrived, for the endpoint to hand to
    /// its device ([`MsgEngine::poll_device_control`]).
    device_ctl: VecDeque<(PeerId, rdm::device::ControlMsg)>,
    /// Peers that failed or restarted, for the endpoint to tell its device
    /// (whatever it holds for them goes: [`MsgEngine::poll_gone_peer`]).
    gone: VecDeque<PeerId>,
    stats: Stats,
}

fn recv_op(meta: OpMeta, msg: MsgKind) -> Completion {
    Completion { msg: Some(msg), ..Completion::new(meta, OpKind::Recv) }
}

impl MsgEngine {
    pub fn new(cfg: Config) -> MsgEngine {
        MsgEngine {
            cfg,
            matcher: Matcher::new(),
            tx: Slab::new(),
            rx: Slab::new(),
            rma: Slab::new(),
            pulls: Slab::new(),
            claimed: HashMap::default(),
            refused: HashSet::default(),
            windows: HashMap::default(),
            push_backlog: VecDeque::new(),
            completions: VecDeque::new(),
            actions: VecDeque::new(),
            failed_peers: VecDeque::new(),
            fail_reasons: Default::default(),
            awaiting: HashMap::default(),
            registrations: None,
            device_ctl: VecDeque::new(),
            gone: VecDeque::new(),
            stats: Stats::default(),
        }
    }

    /// Where registrations for paths with [`Path::registration`] come from.
    pub fn set_registrations(&mut self, r: Box<dyn Registrations>) {
        self.registrations = Some(r);
    }

    /// The registrations set with [`MsgEngine::set_registrations`].
    pub fn registrations(&mut self) -> Option<&mut (dyn Registrations + 'static)> {
        self.registrations.as_deref_mut()
    }

    /// The peer a pending pull reads from.
    pub fn pull_peer(&self, id: PullId) -> Option<PeerId> {
        self.pulls.get(id.0 as usize).map(|p| p.peer)
    }

    pub fn has_completions(&self) -> bool {
        !self.completions.is_empty()
    }

    /// Why `peer` last failed (no acknowledgement within the peer timeout, the
    /// network said unreachable, a new incarnation), for error reports.
    pub fn fail_reason(&self, peer: PeerId) -> Option<FailReason> {
        self.fail_reasons.get(&peer).copied()
    }

    pub fn has_failed_peers(&self) -> bool {
        !self.failed_peers.is_empty()
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn set_min_multi_recv(&mut self, n: usize) {
        self.cfg.min_multi_recv = n;
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Adds `msgs` and `bytes` to the per-peer counters at `idx` and `idx + 1`
    /// (see [`ops::peer_counter`]): plain integers in the peer's rdm hot
    /// state; nothing for a peer without one (datagram endpoints).
    #[inline]
    pub(crate) fn count_peer(&mut self, rdm: &mut Engine, peer: PeerId, idx: usize, bytes: u64) {
        if let Some(c) = rdm.upper_counters_mut(peer) {
            c[idx] += 1;
            c[idx + 1] += bytes;
        }
    }

    /// The path recorded for `peer`, kept once by the rdm engine.
    fn path(&self, rdm: &Engine, peer: PeerId) -> Option<PeerPath> {
        rdm.path(peer)
    }

    /// The protocol of a message of `len` bytes to `peer`, from its path:
    /// rendezvous pulled by the receiver from `rndv_threshold` where the path can
    /// read remotely (and the peer never refused), windowed rendezvous from
    /// `window_threshold` where it cannot; eager below.
    fn use_rendezvous(&self, rdm: &Engine, peer: PeerId, len: usize) -> bool {
        // Below every threshold (most messages): no path or peer lookup.
        let smallest = self
            .cfg
            .rndv_threshold
            .min(self.cfg.window_threshold)
            .min(self.cfg.rdma_rndv_threshold.unwrap_or(usize::MAX));
        if len < smallest {
            return false;
        }
        let Some(path) = self.path(rdm, peer) else { return false };
        if path.remote_read && !self.refused.contains(&peer) {
            let threshold = if path.registration {
                self.cfg.rdma_rndv_threshold.unwrap_or(self.cfg.rndv_threshold)
            } else {
                self.cfg.rndv_threshold
            };
            len >= threshold
        } else {
            len >= self.cfg.window_threshold
        }
    }

    /// The layer below reports `addr` unreachable (ICMP, a dead process): the
    /// rdm engine fails it if data is in flight, and so does this engine if it
    /// waits on an answer from it.
    pub fn handle_unreachable(&mut self, rdm: &mut Engine, addr: DevAddr) {
        if rdm.peers_at(addr).any(|peer| self.waits_on(peer)) {
            rdm.fail_unreachable(addr)
        } else {
            rdm.handle_unreachable(addr)
        }
    }

    // ------------------------------------------------------------ keepalive

    fn await_answer(&mut self, now: Instant, peer: PeerId) {
        let every = self.cfg.keepalive;
        self.awaiting.entry(peer).or_insert(now + every);
    }

    fn waits_on(&self, peer: PeerId) -> bool {
        self.tx.iter().any(|(_, t)| t.peer == peer && t.rndv.is_some())
            || self.rma.iter().any(|(_, e)| e.peer == peer)
            || self.windows.keys().any(|(p, _)| *p == peer)
    }

    /// The next time [`MsgEngine::handle_timeout`] has work (a keepalive due).
    /// Whether no keepalive is due at any time ([`MsgEngine::poll_timeout`]
    /// is `None`).
    #[inline]
    pub fn no_timers(&self) -> bool {
        self.awaiting.is_empty()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.awaiting.values().min().copied()
    }

    /// Sends the keepalives that are due, and forgets peers nothing waits on.
    pub fn handle_timeout(&mut self, io: Io<'_>) {
        let Io { rdm, now } = io;
        let due: Vec<PeerId> = self.awaiting.iter().filter(|(_, t)| **t <= now).map(|(p, _)| *p).collect();
        for peer in due {
            if self.waits_on(peer) {
                let _ = rdm.send(now, peer, &[&crate::wire::KEEPALIVE], Token::Reply.encode());
                self.awaiting.insert(peer, now + self.cfg.keepalive);
            } else {
                self.awaiting.remove(&peer);
            }
        }
    }

    // ------------------------------------------------------- events from rdm

    /// Runs the protocols on everything the rdm engine delivered or reported
    /// since the last call. Call after feeding it datagrams and timeouts.
    pub fn handle_events(&mut self, mut io: Io<'_>, mem: &mut dyn Memory) {
        self.retry_pushes(io.reborrow(), mem);
        while let Some(ev) = io.rdm.poll_event() {
            match ev {
                Event::Delivered { peer, msg } if !self.cfg.datagram => {
                    // The peer talks again (a new incarnation, or a path that
                    // came back): its old failure explains nothing from now on.
                    if !self.fail_reasons.is_empty() {
                        self.fail_reasons.remove(&peer);
                    }
                    self.handle_message(io.reborrow(), peer, msg, mem)
                }
                Event::Datagram { peer, msg } if self.cfg.datagram => {
                    self.handle_datagram(io.reborrow(), peer, msg, mem)
                }
                Event::Delivered { msg, .. } | Event::Datagram { msg, .. } => {
                    self.stats.stray += 1;
                    io.rdm.recycle(msg);
                }
                Event::SendComplete { token } => {
                    // An RTS and its pushes complete on the receiver's Fin
                    // (and the last gathered push); an RMA request on its
                    // answer.
                    match Token::decode(token) {
                        Some(Token::Msg(id)) => self.complete_send(id, None),
                        Some(Token::PushGathered(id)) => self.gathered_push_done(id),
                        _ => {}
                    }
                }
                Event::SendFailed { token, peer, reason } => {
                    // The first reason of a failure stands: a send to a peer
                    // already failed is refused as a timeout by the rdm engine,
                    // whatever failed it.
                    self.fail_reasons.entry(peer).or_insert(reason);
                    let err = if reason == FailReason::PeerRestarted { OpError::Io } else { OpError::PeerUnreachable };
                    match Token::decode(token) {
                        Some(Token::Msg(id) | Token::Push(id) | Token::PushGathered(id) | Token::Rts(id)) => {
                            self.complete_send(id, Some(err))
                        }
                        Some(Token::Rma(id)) => {
                            if let Some(e) = self.rma.try_remove(id.0 as usize) {
                                self.completions.push_back(Completion {
                                    len: e.len,
                                    src: Some(e.peer),
                                    err: Some(err),
                                    ..Completion::new(e.meta, e.kind)
                                });
                            }
                        }
                        _ => {}
                    }
                }
                Event::PeerUnreachable { peer } => {
                    // A timeout or an ICMP report said so through SendFailed
                    // just before, when data was in flight; else the device did.
                    self.fail_reasons.entry(peer).or_insert(FailReason::Unreachable);
                    self.fail_peer(peer, true)
                }
                Event::PeerRestarted { peer } => {
                    self.fail_reasons.insert(peer, FailReason::PeerRestarted);
                    self.fail_peer(peer, false)
                }
            }
        }
        self.update_backpressure(io.rdm);
    }

    /// One datagram from the device. A whole eager message in one DIRECT
    /// datagram (shared memory) that a posted receive awaits lands straight
    /// from the device's buffer ([`rdm::engine::Engine::handle_datagram_lending`]):
    /// no copy into a pooled buffer, no trip through the event queue. The
    /// rest goes the usual way, through the events [`MsgEngine::handle_events`] takes.
    pub fn receive_datagram(&mut self, io: Io<'_>, from: DevAddr, bytes: &[u8], mem: &mut dyn Memory) {
        let Io { rdm, now } = io;
        if self.cfg.datagram {
            rdm.handle_datagram(now, from, bytes);
            return;
        }
        let Some(peer) = rdm.handle_datagram_lending(now, from, bytes) else { return };
        let msg = &bytes[rdm::engine::HEADER_LEN..];
        // As for a Delivered event (see handle_events).
        if !self.fail_reasons.is_empty() {
            self.fail_reasons.remove(&peer);
        }
        if let Ok(Packet::Msg(h, payload)) = Packet::decode(msg) {
            if let Some(post) = self.matcher.match_posted(peer, h.kind, h.tag) {
                self.count_peer(rdm, peer, ops::peer_counter::RECV_EAGER_MSGS, payload.len() as u64);
                self.land_lent(RxId(post.token as u32), peer, h, payload, mem);
                return;
            }
        }
        // Unexpected, or not a plain message: queued as the rdm engine would
        // have, and handled in order by handle_events (after the senders
        // heard for the first time got their paths).
        let _ = now;
        let mut owned = rdm.take_buffer();
        owned.extend_from_slice(msg);
        rdm.deliver_later(peer, owned);
    }

    fn handle_message(&mut self, mut io: Io<'_>, peer: PeerId, msg: Vec<u8>, mem: &mut dyn Memory) {
        // Parsed once; the typed fields are all that is used below.
        let pkt = match Packet::decode(&msg) {
            Ok(p) => p,
            Err(_) => {
                self.stats.dropped_malformed += 1;
                io.rdm.recycle(msg);
                return;
            }
        };
        let matched = match pkt {
            Packet::Msg(h, _) => Some((h, None)),
            Packet::Rts(rts) => Some((rts.header, Some(rts))),
            _ => None,
        };
        if let Packet::Msg(_, payload) = &pkt {
            self.count_peer(io.rdm, peer, ops::peer_counter::RECV_EAGER_MSGS, payload.len() as u64);
        }
        if let Some((h, rndv)) = matched {
            let arrived = Arrived { peer, kind: h.kind, tag: h.tag, data: h.data, msg, offset: HEADER_LEN, rndv };
            if let Some((post, arrived)) = self.matcher.arrive(arrived) {
                self.land(io, RxId(post.token as u32), arrived, mem);
            }
            return;
        }
        match pkt {
            Packet::Fin { req, status, .. } => self.handle_fin(peer, req, status, mem, io.now),
            Packet::Push { req, offset, payload } => self.handle_push(io.reborrow(), peer, req, offset, payload, mem),
            Packet::Cts { req, offset, len } => self.handle_cts(io.reborrow(), peer, req, offset, len, mem),
            Packet::ReadResp { req, status, payload } | Packet::AtomicResp { req, status, payload } => {
                self.finish_rma(peer, req, status, payload, mem)
            }
            Packet::WriteAck { req, status } => self.finish_rma(peer, req, status, &[], mem),
            Packet::Keepalive => {}
            Packet::DeviceCtl(bytes) => {
                if let Some(m) = rdm::device::ControlMsg::new(bytes) {
                    self.device_ctl.push_back((peer, m));
                }
            }
            other => self.serve_rma(io.reborrow(), peer, other, mem),
        }
        io.rdm.recycle(msg);
    }

    /// Datagram mode: a message lands in the oldest posted receive it matches,
    /// or is dropped (counted); only plain messages are expected.
    fn handle_datagram(&mut self, io: Io<'_>, peer: PeerId, msg: Vec<u8>, mem: &mut dyn Memory) {
        let h = match Packet::decode(&msg) {
            Ok(Packet::Msg(h, _)) => h,
            Ok(_) => {
                self.stats.stray += 1;
                io.rdm.recycle(msg);
                return;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                io.rdm.recycle(msg);
                return;
            }
        };
        match self.matcher.match_posted(peer, h.kind, h.tag) {
            Some(post) => {
                let arrived =
                    Arrived { peer, kind: h.kind, tag: h.tag, data: h.data, msg, offset: HEADER_LEN, rndv: None };
                self.land(io, RxId(post.token as u32), arrived, mem);
            }
            None => {
                self.stats.dropped_unmatched += 1;
                io.rdm.recycle(msg);
            }
        }
    }

    /// Everything that waits on an answer from `peer` fails: rendezvous sends
    /// awaiting a Fin, RMA requests awaiting their answer, receives awaiting a
    /// Push or a pull. A peer declared `unreachable` also fails the receives
    /// directed at it alone (they can never match), and is reported by
    /// [`MsgEngine::poll_failed_peer`]; a restarted one keeps them (its new
    /// incarnation may still send).
    ///
    /// Messages that arrived from the peer and wait unmatched stay, the
    /// announcements of long messages included. An eager message is whole
    /// here. An announcement of a peer that is gone (or merely closed its
    /// endpoint, which we may never hear of before a receive matches it)
    /// cannot be pulled any more: the layer below refuses to read an
    /// endpoint that closed, even one whose process lives, so the receive
    /// that matches it fails (`OpError::Io`). That is the loss the receiving
    /// application can see; dropping the announcement here would instead
    /// leave that receive waiting for a message that never comes, and would
    /// not cover the announcements of a sender we do not know is closed.
    fn fail_peer(&mut self, peer: PeerId, unreachable: bool) {
        let err = if unreachable { OpError::PeerUnreachable } else { OpError::Io };
        let sends: Vec<usize> =
            self.tx.iter().filter(|(_, t)| t.peer == peer && t.rndv.is_some()).map(|(k, _)| k).collect();
        for k in sends {
            self.complete_send(TxId(k as u32), Some(err));
        }
        let rmas: Vec<usize> = self.rma.iter().filter(|(_, e)| e.peer == peer).map(|(k, _)| k).collect();
        for k in rmas {
            let e = self.rma.remove(k);
            self.completions.push_back(Completion {
                len: e.len,
                src: Some(e.peer),
                err: Some(err),
                ..Completion::new(e.meta, e.kind)
            });
        }
        let waiting: Vec<(PeerId, u64)> = self.windows.keys().filter(|(p, _)| *p == peer).copied().collect();
        for k in waiting {
            if let Some(w) = self.windows.remove(&k) {
                self.finish_recv(&w.landing, w.received as usize, Some(err));
            }
        }
        self.push_backlog.retain(|(id, _, _)| self.tx.contains(id.0 as usize));
        if unreachable {
            for post in self.matcher.take_posted_from(peer) {
                if let Some(e) = self.rx.try_remove(post.token as usize) {
                    self.completions.push_back(Completion {
                        tag: post.tag,
                        src: Some(peer),
                        err: Some(err),
                        ..recv_op(e.meta, post.kind)
                    });
                }
            }
            self.failed_peers.push_back(peer);
        }
        self.gone.push_back(peer);
        self.awaiting.remove(&peer);
    }

    /// Unexpected messages are held without a count limit but with a memory
    /// limit: above it the rdm engine stops accepting new messages (senders keep
    /// them and wait); below half of it, it resumes.
    fn update_backpressure(&mut self, rdm: &mut Engine) {
        let held = self.matcher.unexpected_bytes();
        self.stats.unexpected_bytes_max = self.stats.unexpected_bytes_max.max(held as u64);
        let limit = self.cfg.unexpected_limit;
        if !rdm.is_paused() && held > limit {
            rdm.set_paused(true);
        } else if rdm.is_paused() && held <= limit / 2 {
            rdm.set_paused(false);
        }
    }

    // -------------------------------------------------------------- outputs

    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.completions.pop_front()
    }

    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether work for the layer below is waiting: a receive posted for an
    /// announced message queues a remote read without any datagram arriving,
    /// so a caller that runs actions only after input must check this too.
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Device control bytes a peer's device sent to ours.
    pub fn poll_device_control(&mut self) -> Option<(PeerId, rdm::device::ControlMsg)> {
        self.device_ctl.pop_front()
    }

    /// Whether the device has something to hear: control bytes from a peer's
    /// device, or a peer that is gone.
    pub fn has_device_control(&self) -> bool {
        !self.device_ctl.is_empty() || !self.gone.is_empty()
    }

    /// A peer that failed (or restarted) since the last call.
    pub fn poll_gone_peer(&mut self) -> Option<PeerId> {
        self.gone.pop_front()
    }

    /// Sends control bytes of our device to `peer`'s device, reliably and in
    /// order with everything else to it.
    pub fn send_device_control(&mut self, io: Io<'_>, peer: PeerId, bytes: &[u8]) {
        let hdr = [crate::wire::Kind::DeviceCtl as u8, 0, 0, 0, 0, 0, 0, 0];
        self.reply(io, peer, &[&hdr, bytes]);
    }

    /// A peer declared unreachable since the last call.
    pub fn poll_failed_peer(&mut self) -> Option<PeerId> {
        self.failed_peers.pop_front()
    }

    pub fn unexpected_bytes(&self) -> usize {
        self.matcher.unexpected_bytes()
    }

    pub fn pending_sends(&self) -> usize {
        self.tx.len()
    }

    /// Receives posted and not yet matched.
    pub fn posted_recvs(&self) -> usize {
        self.matcher.posted_len()
    }
}

impl Drop for MsgEngine {
    /// The endpoint closes with rendezvous sends pending (their Fin never
    /// came): their registrations go back now, or the cache would hold them
    /// in use forever.
    fn drop(&mut self) {
        let regs: Vec<RegHandle> = self.tx.iter().flat_map(|(_, t)| t.regs.iter().flatten().copied()).collect();
        if let Some(r) = self.registrations.as_mut() {
            for h in regs {
                r.release(h);
            }
        }
    }
}
