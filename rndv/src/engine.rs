//! The per-endpoint message engine: every protocol decision of rdmx's message
//! layer, sans-IO.
//!
//! [`MsgEngine`] owns the endpoint's `rdm` [`Engine`] (reliable, ordered delivery
//! per peer) and runs on top of it what libfabric's RDM semantics need: sends and
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
//! and the `rdm` engine's datagrams ([`MsgEngine::rdm_mut`]). Application memory is
//! reached only through the [`Memory`] trait, which the provider implements with
//! raw pointers and tests implement with a vector: this crate holds no `unsafe`.
//!
//! Operation entries live in slabs; their typed ids ([`TxId`], [`RxId`],
//! [`RmaId`], [`PullId`]) travel on the wire as request ids and come back in
//! answers, which are checked against the peer they came from. The `rdm` send
//! token of each packet is a [`Token`], encoded and decoded in one place.
use crate::atomic::{self, Datatype, Op};
use crate::iov::zip_pieces;
use crate::matching::{Arrived, Matcher, RecvPost, Src};
use crate::wire::msg::{MsgHeader, MsgKind, HEADER_LEN};
use crate::wire::rendezvous::{encode_cts, encode_fin, encode_push, FinStatus, RemoteIov, Rts, MAX_IOV, RTS_MAX};
use crate::wire::rma::{self as rma_wire, Status};
use crate::wire::{Packet, MAX_HEADER_LEN};
use rdm::engine::{Engine, Event, FailReason, PeerId, SendError};
use rdm::{DevAddr, DeviceCaps, Instant};
use slab::Slab;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::collections::VecDeque;

/// What the engine and the protocols know about the way to one peer, fixed
/// when the peer is first used: the device's caps for that peer (under `auto`, a
/// same-host peer gets the shared-memory path's).
pub type Path = DeviceCaps;

/// A piece of application memory, by address; only [`Memory`] dereferences it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoBuf {
    pub addr: u64,
    pub len: u64,
}

/// A gather/scatter list of application memory (libfabric's iov limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoList {
    pub bufs: [IoBuf; MAX_IOV],
    pub count: usize,
    /// Per buffer: the key of the application's own registration covering it,
    /// if it passed one (its `fi_mr_desc`, translated by the provider). A
    /// rendezvous on a registering path announces that key and looks nothing
    /// up for the buffer.
    pub keys: [Option<u64>; MAX_IOV],
}

impl IoList {
    pub fn one(addr: u64, len: u64) -> IoList {
        let mut l = IoList { count: 1, ..IoList::default() };
        l.bufs[0] = IoBuf { addr, len };
        l
    }

    pub fn iter(&self) -> impl Iterator<Item = &IoBuf> {
        self.bufs[..self.count].iter()
    }

    pub fn total(&self) -> u64 {
        self.iter().map(|b| b.len).sum()
    }

    /// Copies `data` into the list's memory, in order; returns the bytes written.
    fn scatter(&self, mem: &mut dyn Memory, data: &[u8]) -> usize {
        let mut off = 0usize;
        for b in self.iter() {
            if off >= data.len() {
                break;
            }
            let n = (b.len as usize).min(data.len() - off);
            if n > 0 {
                mem.write(b.addr, &data[off..off + n]);
            }
            off += n;
        }
        off
    }

    /// Copies `data` into the list's memory starting at byte `offset` of the
    /// list (its buffers laid back to back); returns the bytes written.
    fn scatter_at(&self, mem: &mut dyn Memory, mut offset: u64, data: &[u8]) -> usize {
        let mut done = 0usize;
        for b in self.iter() {
            if done == data.len() {
                break;
            }
            if offset >= b.len {
                offset -= b.len;
                continue;
            }
            let n = ((b.len - offset) as usize).min(data.len() - done);
            mem.write(b.addr + offset, &data[done..done + n]);
            done += n;
            offset = 0;
        }
        done
    }

    /// The pieces of the list's memory from byte `offset`, up to `len` bytes,
    /// in order (at most one per buffer).
    fn range(&self, mut offset: u64, mut len: u64) -> impl Iterator<Item = IoBuf> + '_ {
        self.iter().filter_map(move |b| {
            if len == 0 {
                return None;
            }
            if offset >= b.len {
                offset -= b.len;
                return None;
            }
            let n = (b.len - offset).min(len);
            let piece = IoBuf { addr: b.addr + offset, len: n };
            offset = 0;
            len -= n;
            Some(piece)
        })
    }
}

/// Which remote access an RMA request asks of the target's registrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    RemoteRead,
    RemoteWrite,
    /// The local device writes it (the destination of a posted remote read).
    LocalWrite,
}

/// The application's memory and registrations. The provider implements it with
/// the process's address space; tests with a model.
pub trait Memory {
    /// Copies `data` to application memory at `addr`. The provider guarantees the
    /// address came from a buffer the application posted and keeps valid.
    fn write(&mut self, addr: u64, data: &[u8]);
    /// Appends `len` bytes of application memory at `addr` to `out`.
    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>);
    /// `len` bytes of application memory at `addr`, borrowed (a posted send
    /// buffer, valid until its send completes).
    fn bytes(&self, addr: u64, len: usize) -> &[u8];
    /// Checks a remote access through `key` against the registrations: the local
    /// pieces it touches, in order, or the status to answer with.
    fn rma_target(&mut self, key: u64, addr: u64, len: u64, access: Access) -> Result<Vec<IoBuf>, Status>;
    /// `[addr, addr+len)` of a posted receive buffer, named for a device read
    /// into it (the provider vouches for it: [`rdm::device::LocalBuf::new`]).
    /// `None`: this memory cannot be read into, the sender pushes instead.
    fn read_target(&mut self, addr: u64, len: u64) -> Option<rdm::device::LocalBuf> {
        let _ = (addr, len);
        None
    }
}

/// A registration acquired through [`Registrations::acquire`]: give `handle`
/// back with [`Registrations::release`]; `key` is what a peer's remote read
/// of the memory names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Registration {
    pub handle: RegHandle,
    pub key: u64,
}

/// Opaque handle of an acquired registration (the provider's cache entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegHandle(pub u64);

/// Why a registration could not be acquired (the device refused, or the
/// endpoint has no registrar): the message is then sent eagerly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("memory registration failed")]
pub struct RegistrationError;

/// Registrations of local memory, for paths whose remote reads need a key
/// ([`Path::registration`]). The provider implements it with the domain's
/// registration cache over the device's registrar; tests with a model. Set
/// once per engine ([`MsgEngine::set_registrations`]), not passed per call
/// like [`Memory`]: registrations are released from paths that have no memory
/// at hand (a send failed by the rdm engine, the engine's drop at endpoint
/// close).
///
/// The engine acquires one registration per iov buffer of a rendezvous send
/// on such a path (unless the application's own key came with the buffer),
/// carries the keys in the RTS, and releases each exactly once when the send
/// completes: on the receiver's `Fin`, on a failure of the peer or of the
/// send, or when the engine is dropped with the send still pending.
pub trait Registrations: Send {
    /// A registration covering `[addr, addr+len)` that allows `access`.
    fn acquire(&mut self, addr: u64, len: u64, access: Access) -> Result<Registration, RegistrationError>;
    /// Gives back a registration from [`Registrations::acquire`].
    fn release(&mut self, handle: RegHandle);
}

/// Slab id of a send; travels as the request id of its RTS / Push.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TxId(pub u32);
/// Slab id of a posted receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RxId(pub u32);
/// Slab id of an RMA / atomic at the initiator; travels as its request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RmaId(pub u32);
/// Id of a remote read handed to the layer below ([`Action::RemoteRead`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PullId(pub u32);

/// What an `rdm` send token names. The one place tokens are encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// An eager message.
    Msg(TxId),
    /// The ready-to-send of a long message.
    Rts(TxId),
    /// The bytes of a long message the receiver could not pull.
    Push(TxId),
    /// An RMA / atomic request.
    Rma(RmaId),
    /// An answer (Fin, RMA response): nothing waits on its delivery.
    Reply,
}

impl Token {
    fn encode(self) -> u64 {
        let (tag, id) = match self {
            Token::Msg(TxId(i)) => (1u64, i),
            Token::Rts(TxId(i)) => (2, i),
            Token::Push(TxId(i)) => (3, i),
            Token::Rma(RmaId(i)) => (4, i),
            Token::Reply => (5, 0),
        };
        tag << 32 | id as u64
    }

    fn decode(t: u64) -> Option<Token> {
        let id = t as u32;
        Some(match t >> 32 {
            1 => Token::Msg(TxId(id)),
            2 => Token::Rts(TxId(id)),
            3 => Token::Push(TxId(id)),
            4 => Token::Rma(RmaId(id)),
            5 => Token::Reply,
            _ => return None,
        })
    }
}

/// What the provider passes with each operation and gets back in its completion.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpMeta {
    /// The application's context (opaque).
    pub context: u64,
    /// A successful completion is reported (selective completion decides).
    pub wanted: bool,
    /// An inject: it has no context, so failures go elsewhere than a CQ.
    pub inject: bool,
    /// The application may reuse the send buffer as soon as the call returns
    /// (`FI_INJECT`, from `fi_inject*` or as a flag of `fi_sendmsg`): the
    /// payload is copied before `send` returns, never sent by rendezvous,
    /// whatever the thresholds. (`inject` implies it.)
    pub copy_at_post: bool,
    /// The send completes only once the peer has processed the message
    /// (`FI_DELIVERY_COMPLETE`). Otherwise a message on a reliable, ordered
    /// path may complete once written out for the device (transmit complete:
    /// the path cannot lose it), with no acknowledgement at all.
    pub delivery_complete: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Send,
    Recv,
    Write,
    Read,
    Atomic { fetch: bool },
    /// Target side: a peer's write or atomic was served here (`data` is its
    /// remote CQ data, if it carried any).
    RemoteWrite,
    /// Target side: a peer's read was served here.
    RemoteRead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpError {
    /// The message was longer than the buffer; `olen` bytes were lost.
    Truncated { olen: usize },
    Canceled,
    /// FI_PEEK found nothing.
    NoMessage,
    /// The peer was declared unreachable (timeout or ICMP).
    PeerUnreachable,
    /// Delivery failed (the peer restarted, or its memory could not be read).
    Io,
    /// The target refused: no such key.
    NoKey,
    /// The target refused: outside the registration or not allowed.
    Access,
    /// The target refused: unsupported or malformed operation.
    Invalid,
}

/// One finished operation, successful or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    pub meta: OpMeta,
    pub kind: OpKind,
    /// Sends and receives: untagged or tagged.
    pub msg: Option<MsgKind>,
    pub len: usize,
    /// Multi-receive: where in the buffer the message landed.
    pub buf: u64,
    pub data: Option<u64>,
    pub tag: u64,
    /// Receives: the sender. Sends and one-sided operations: the target.
    pub src: Option<PeerId>,
    /// Multi-receive: the buffer is released (FI_MULTI_RECV).
    pub multi_done: bool,
    pub err: Option<OpError>,
}

impl Completion {
    fn new(meta: OpMeta, kind: OpKind) -> Completion {
        Completion { meta, kind, msg: None, len: 0, buf: 0, data: None, tag: 0, src: None, multi_done: false, err: None }
    }
}

/// Work for the layer below.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Copy the peer's memory `src` into ours at `dst` (in order, up to the
    /// shorter of the two), then call [`MsgEngine::remote_read_done`] with `id`.
    RemoteRead { id: PullId, peer: PeerId, addr: DevAddr, src: [RemoteIov; MAX_IOV], src_count: usize, dst: IoList },
}

/// How a remote read ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// `n` bytes read.
    Done(u64),
    /// This process may not read that one (or the path cannot): ask for a push.
    NotPermitted,
    /// Reading failed after `n` bytes.
    Failed(u64),
}

/// Why a call was refused at once (nothing was queued).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    #[error("the peer's queue is full; progress and retry")]
    Again,
    #[error("FI_CLAIM without a message claimed by that context")]
    NotClaimed,
    #[error("unsupported atomic datatype or operation")]
    AtomicUnsupported,
    #[error("atomic operands do not match the count")]
    AtomicOperands,
    /// A datagram-mode message larger than one datagram of the peer's path.
    #[error("message larger than one datagram")]
    TooLarge,
}

impl From<SendError> for PostError {
    fn from(e: SendError) -> PostError {
        match e {
            SendError::WouldBlock => PostError::Again,
            SendError::TooLarge { .. } => PostError::TooLarge,
        }
    }
}

/// Tunables, chosen by the provider (libfabric parameters).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Messages of at least this many bytes to a peer whose path can read
    /// remotely go by rendezvous (the receiver pulls).
    pub rndv_threshold: usize,
    /// Messages of at least this many bytes to a peer whose path cannot read
    /// remotely (UDP) go by windowed rendezvous: the receiver grants windows and
    /// the bytes land straight in the posted buffer.
    pub window_threshold: usize,
    /// Bytes a receiver grants at a time in a windowed rendezvous.
    pub window: u64,
    /// FI_OPT_MIN_MULTI_RECV: a multi-receive buffer with less room is released.
    pub min_multi_recv: usize,
    /// Bytes of unexpected messages held before senders are paused.
    pub unexpected_limit: usize,
    /// While an answer from a peer is awaited (a Fin, an RMA response), a
    /// keepalive goes to it this often, so that a peer that died after
    /// acknowledging the request is declared unreachable by the rdm engine's
    /// peer timeout instead of leaving the operation pending forever. A quarter
    /// of the peer timeout, at most half a second (so that a dead peer behind
    /// ICMP fails within a second), is a good value.
    pub keepalive: std::time::Duration,
    /// Unreliable-datagram semantics (`FI_EP_DGRAM`; see the module docs).
    pub datagram: bool,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            rndv_threshold: 65536,
            window_threshold: 256 << 10,
            window: 2 << 20,
            min_multi_recv: 0,
            unexpected_limit: 256 << 20,
            keepalive: std::time::Duration::from_millis(7500),
            datagram: false,
        }
    }
}

/// What a receive accepts and where its bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvSpec {
    pub kind: MsgKind,
    pub src: Src,
    pub tag: u64,
    pub ignore: u64,
    pub iov: IoList,
    /// FI_MULTI_RECV: one untagged buffer that takes messages until full.
    pub multi: bool,
    pub meta: OpMeta,
}

/// Counters (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub eager_sent: u64,
    pub rts_sent: u64,
    pub pulled: u64,
    /// Long messages received through window grants (the receiver could not pull).
    pub pushed: u64,
    /// Window grants sent.
    pub windows_granted: u64,
    pub rma_started: u64,
    pub rma_served: u64,
    /// Messages with a header that does not parse, dropped.
    pub dropped_malformed: u64,
    /// Answers (Fin, Push, RMA responses) that match nothing of that peer, dropped.
    /// Also messages of the other kind of endpoint (a reliable message at a
    /// datagram endpoint, a datagram at a reliable one).
    pub stray: u64,
    /// Datagram mode: messages that arrived with no matching receive posted,
    /// dropped.
    pub dropped_unmatched: u64,
    /// Registrations acquired for rendezvous sends on registering paths.
    pub registrations_acquired: u64,
    /// Rendezvous buffers announced with the application's own key (no lookup).
    pub registrations_from_desc: u64,
    /// Rendezvous sends that went eagerly because a registration failed.
    pub registration_failures: u64,
}

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
}

struct RxEntry {
    iov: IoList,
    meta: OpMeta,
    /// FI_MULTI_RECV: bytes of the buffer already filled.
    multi_offset: Option<u64>,
}

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
    msg: MsgKind,
    buf: u64,
    msg_len: usize,
    data: Option<u64>,
    tag: u64,
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

/// Bytes per `Push` message of a granted window (rdm segments it further).
/// Measured on loopback UDP, 1 MiB messages: 64 KiB pushes ran at half the
/// eager bandwidth (per-message overheads), 1 MiB pushes at parity.
const PUSH_CHUNK: u64 = 1 << 20;

/// The message engine of one endpoint. See the module docs.
pub struct MsgEngine {
    rdm: Engine,
    cfg: Config,
    /// Per-peer paths, by peer index.
    paths: Vec<Option<Path>>,
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
    /// Peers an answer is awaited from, with when the next keepalive is due.
    awaiting: HashMap<PeerId, Instant>,
    /// Where registrations for registering paths come from (none: such
    /// paths get no rendezvous, long messages go eagerly).
    registrations: Option<Box<dyn Registrations>>,
    stats: Stats,
}

fn recv_op(meta: OpMeta, msg: MsgKind) -> Completion {
    Completion { msg: Some(msg), ..Completion::new(meta, OpKind::Recv) }
}

fn status_error(s: Status) -> Option<OpError> {
    match s {
        Status::Ok => None,
        Status::NoKey => Some(OpError::NoKey),
        Status::Access => Some(OpError::Access),
        Status::Invalid => Some(OpError::Invalid),
    }
}

impl MsgEngine {
    pub fn new(rdm: Engine, cfg: Config) -> MsgEngine {
        MsgEngine {
            rdm,
            cfg,
            paths: Vec::new(),
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
            awaiting: HashMap::default(),
            registrations: None,
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

    pub fn has_failed_peers(&self) -> bool {
        !self.failed_peers.is_empty()
    }

    /// The reliable-datagram engine below (datagrams in and out, timers).
    pub fn rdm(&self) -> &Engine {
        &self.rdm
    }

    pub fn rdm_mut(&mut self) -> &mut Engine {
        &mut self.rdm
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

    /// The peer at `addr`, reached over `path` (recorded the first time).
    pub fn peer(&mut self, addr: DevAddr, path: Path) -> PeerId {
        let p = self.rdm.peer_with_path(addr, &path);
        let i = p.index() as usize;
        if self.paths.len() <= i {
            self.paths.resize(i + 1, None);
        }
        self.paths[i].get_or_insert(path);
        p
    }

    fn path(&self, peer: PeerId) -> Option<&Path> {
        self.paths.get(peer.index() as usize).and_then(|p| p.as_ref())
    }

    /// The protocol of a message of `len` bytes to `peer`, from its path:
    /// rendezvous pulled by the receiver from `rndv_threshold` where the path can
    /// read remotely (and the peer never refused), windowed rendezvous from
    /// `window_threshold` where it cannot; eager below.
    fn use_rendezvous(&self, peer: PeerId, len: usize) -> bool {
        let Some(path) = self.path(peer) else { return false };
        if path.remote_read && !self.refused.contains(&peer) {
            len >= self.cfg.rndv_threshold
        } else {
            len >= self.cfg.window_threshold
        }
    }

    // ---------------------------------------------------------------- sends

    /// Sends a message. `user` lists where the payload lies in application
    /// memory (used only if the message goes by rendezvous); `payload` the same
    /// bytes as slices.
    pub fn send(&mut self, now: Instant, peer: PeerId, header: MsgHeader, payload: &[&[u8]], user: IoList, meta: OpMeta) -> Result<TxId, PostError> {
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let long = !self.cfg.datagram && !meta.inject && !meta.copy_at_post && user.count > 0 && self.use_rendezvous(peer, len);
        let keys = if long { self.rendezvous_keys(peer, &user) } else { Ok(None) };
        let entry = self.tx.vacant_entry();
        let id = TxId(entry.key() as u32);
        let long = long && keys.is_ok();
        if let (Ok(keys), true) = (keys, long) {
            let mut remote = [RemoteIov::default(); MAX_IOV];
            let mut iov = IoList::default();
            let mut regs = [None; MAX_IOV];
            for (i, b) in user.iter().enumerate().filter(|(_, b)| b.len > 0) {
                let (key, reg) = match &keys {
                    Some(k) => (Some(k[i].0), k[i].1),
                    None => (None, None),
                };
                remote[iov.count] = RemoteIov { addr: b.addr, len: b.len, key };
                iov.bufs[iov.count] = *b;
                iov.keys[iov.count] = user.keys[i];
                regs[iov.count] = reg;
                iov.count += 1;
            }
            let rts = Rts { header, req: id.0 as u64, total: len as u64, iov: remote, iov_count: iov.count };
            let mut wire = [0u8; RTS_MAX];
            let n = rts.encode(&mut wire);
            if let Err(e) = self.rdm.send(now, peer, &[&wire[..n]], Token::Rts(id).encode()) {
                if let Some(r) = self.registrations.as_mut() {
                    regs.iter().flatten().for_each(|h| r.release(*h));
                }
                return Err(e.into());
            }
            entry.insert(TxEntry { meta, msg: header.kind, len, peer, rndv: Some(iov), regs });
            self.await_answer(now, peer);
            self.stats.rts_sent += 1;
        } else {
            let hdr = header.encode();
            let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
            parts[0] = &hdr;
            let n = payload.len().min(MAX_IOV);
            parts[1..=n].copy_from_slice(&payload[..n]);
            if self.cfg.datagram {
                self.rdm.send_datagram(peer, &parts[..=n], Token::Msg(id).encode())?;
            } else if meta.delivery_complete {
                self.rdm.send(now, peer, &parts[..=n], Token::Msg(id).encode())?;
            } else {
                self.rdm.send_transmit_complete(now, peer, &parts[..=n], Token::Msg(id).encode())?;
            }
            entry.insert(TxEntry { meta, msg: header.kind, len, peer, rndv: None, regs: [None; MAX_IOV] });
            self.stats.eager_sent += 1;
        }
        Ok(id)
    }

    /// The keys a rendezvous of `user` to `peer` announces, per buffer of
    /// `user` (key, and the registration to release if one was acquired), or
    /// `None` on a path that needs no registration (no lookup at all). An
    /// error when a registration failed: the message then goes eagerly (and
    /// nothing stays acquired).
    #[allow(clippy::type_complexity)]
    fn rendezvous_keys(&mut self, peer: PeerId, user: &IoList) -> Result<Option<[(u64, Option<RegHandle>); MAX_IOV]>, RegistrationError> {
        if !self.path(peer).is_some_and(|p| p.registration) {
            return Ok(None);
        }
        let mut out = [(0u64, None); MAX_IOV];
        for (i, b) in user.iter().enumerate() {
            if b.len == 0 {
                continue;
            }
            if let Some(k) = user.keys[i] {
                out[i] = (k, None);
                self.stats.registrations_from_desc += 1;
                continue;
            }
            let got = match self.registrations.as_mut() {
                Some(r) => r.acquire(b.addr, b.len, Access::RemoteRead),
                None => Err(RegistrationError),
            };
            match got {
                Ok(reg) => {
                    out[i] = (reg.key, Some(reg.handle));
                    self.stats.registrations_acquired += 1;
                }
                Err(e) => {
                    let acquired: [Option<RegHandle>; MAX_IOV] = std::array::from_fn(|j| out[j].1);
                    self.release_all(&acquired);
                    self.stats.registration_failures += 1;
                    return Err(e);
                }
            }
        }
        Ok(Some(out))
    }

    fn release_all(&mut self, regs: &[Option<RegHandle>]) {
        if let Some(r) = self.registrations.as_mut() {
            for h in regs.iter().flatten() {
                r.release(*h);
            }
        }
    }

    /// Every way a send ends goes through here: its registrations go back.
    fn complete_send(&mut self, id: TxId, err: Option<OpError>) {
        let Some(t) = self.tx.try_remove(id.0 as usize) else { return };
        self.release_all(&t.regs);
        self.completions.push_back(Completion { msg: Some(t.msg), len: t.len, src: Some(t.peer), err, ..Completion::new(t.meta, OpKind::Send) });
    }

    // ------------------------------------------------------------- receives

    /// Posts a receive: it completes at once from an unexpected message, or
    /// waits for one.
    pub fn post_recv(&mut self, now: Instant, spec: RecvSpec, mem: &mut dyn Memory) -> RxId {
        let id = RxId(self.rx.insert(RxEntry { iov: spec.iov, meta: spec.meta, multi_offset: spec.multi.then_some(0) }) as u32);
        let post = RecvPost { token: id.0 as u64, kind: spec.kind, src: spec.src, tag: spec.tag, ignore: spec.ignore, persistent: spec.multi };
        if spec.multi {
            // Fill the buffer from the unexpected queue first, then leave it
            // posted (in order) if room remains.
            while self.rx.contains(id.0 as usize) {
                match self.matcher.take_unexpected(&post) {
                    Some(arrived) => self.land(now, id, arrived, mem),
                    None => {
                        self.matcher.post_only(post);
                        break;
                    }
                }
            }
        } else if let Some(arrived) = self.matcher.post(post) {
            self.land(now, id, arrived, mem);
        }
        self.update_backpressure();
        id
    }

    /// FI_PEEK, optionally with FI_CLAIM (reserve the message for a later
    /// claiming receive with the same context) or FI_DISCARD (drop it). Reports
    /// the message's attributes, or [`OpError::NoMessage`], as a completion.
    pub fn peek(&mut self, now: Instant, spec: RecvSpec, claim: bool, discard: bool) {
        let probe = RecvPost { token: 0, kind: spec.kind, src: spec.src, tag: spec.tag, ignore: spec.ignore, persistent: false };
        let Some(m) = self.matcher.peek(&probe) else {
            self.completions.push_back(Completion { tag: spec.tag, err: Some(OpError::NoMessage), ..recv_op(spec.meta, spec.kind) });
            return;
        };
        let c = Completion { len: m.len(), data: m.data, tag: m.tag, src: Some(m.peer), ..recv_op(spec.meta, m.kind) };
        if claim || discard {
            if let Some(m) = self.matcher.take_unexpected(&probe) {
                if discard {
                    self.discard(now, m);
                } else {
                    self.claimed.insert(spec.meta.context, m);
                }
            }
        }
        self.completions.push_back(c);
        self.update_backpressure();
    }

    /// FI_CLAIM: receives (or with `discard` drops) the message an earlier
    /// FI_PEEK|FI_CLAIM reserved for `spec.meta.context`.
    pub fn claim(&mut self, now: Instant, spec: RecvSpec, discard: bool, mem: &mut dyn Memory) -> Result<(), PostError> {
        let arrived = self.claimed.remove(&spec.meta.context).ok_or(PostError::NotClaimed)?;
        if discard {
            let c = Completion { tag: arrived.tag, data: arrived.data, ..recv_op(spec.meta, arrived.kind) };
            self.discard(now, arrived);
            self.completions.push_back(c);
        } else {
            let id = RxId(self.rx.insert(RxEntry { iov: spec.iov, meta: OpMeta { wanted: true, ..spec.meta }, multi_offset: None }) as u32);
            self.land(now, id, arrived, mem);
        }
        Ok(())
    }

    /// A dropped unexpected message: an announced one still needs its Fin, or
    /// the sender would wait forever.
    fn discard(&mut self, now: Instant, m: Arrived) {
        let (peer, rts) = (m.peer, m.rndv);
        self.rdm.recycle(m.msg);
        if let Some(rts) = rts {
            self.reply(now, peer, &[&encode_fin(rts.req, FinStatus::Discarded, 0)]);
        }
    }

    /// fi_cancel of a posted receive. Returns whether one with that context was
    /// still posted (it then completes with [`OpError::Canceled`]).
    pub fn cancel(&mut self, context: u64) -> bool {
        let Some(key) = self.rx.iter().find(|(_, e)| e.meta.context == context).map(|(k, _)| k) else { return false };
        let Some(post) = self.matcher.cancel(key as u64) else { return false };
        let e = self.rx.remove(key);
        self.completions.push_back(Completion { tag: post.tag, err: Some(OpError::Canceled), ..recv_op(e.meta, post.kind) });
        true
    }

    /// A message matched receive `id`: place it (eager) or start pulling it.
    fn land(&mut self, now: Instant, id: RxId, arrived: Arrived, mem: &mut dyn Memory) {
        let Some(e) = self.rx.get(id.0 as usize) else { return };
        let (meta, iov, multi_offset) = (e.meta, e.iov, e.multi_offset);
        let msg_len = arrived.len();
        let (target, buf, multi_done) = match multi_offset {
            None => {
                self.rx.remove(id.0 as usize);
                (iov, 0, false)
            }
            Some(off) => {
                // One message lands right after the previous one.
                let base = iov.bufs[0];
                let room = IoList::one(base.addr + off, base.len - off);
                let n = (msg_len as u64).min(room.bufs[0].len);
                let new_off = off + n;
                let release = base.len - new_off < self.cfg.min_multi_recv.max(1) as u64 || n < msg_len as u64;
                if release {
                    self.matcher.cancel(id.0 as u64);
                    self.rx.remove(id.0 as usize);
                } else if let Some(e) = self.rx.get_mut(id.0 as usize) {
                    e.multi_offset = Some(new_off);
                }
                (room, base.addr + off, release)
            }
        };
        let landing = Landing { target, meta, msg: arrived.kind, buf, msg_len, data: arrived.data, tag: arrived.tag, src: arrived.peer, multi_done };
        match arrived.rndv {
            None => {
                let written = target.scatter(mem, arrived.payload());
                self.rdm.recycle(arrived.msg);
                self.finish_recv(&landing, written, None);
            }
            Some(rts) => {
                self.rdm.recycle(arrived.msg);
                self.start_pull(now, arrived.peer, rts, landing);
            }
        }
    }

    /// Reports a receive whose bytes have landed (`written` of `msg_len`).
    fn finish_recv(&mut self, l: &Landing, written: usize, err: Option<OpError>) {
        let err = err.or((l.msg_len > written).then_some(OpError::Truncated { olen: l.msg_len - written }));
        self.completions.push_back(Completion {
            len: written,
            buf: l.buf,
            data: l.data,
            tag: l.tag,
            src: Some(l.src),
            multi_done: l.multi_done,
            err,
            ..recv_op(l.meta, l.msg)
        });
    }

    // ------------------------------------------------------------ rendezvous

    fn start_pull(&mut self, now: Instant, peer: PeerId, rts: Rts, landing: Landing) {
        if landing.target.total() == 0 {
            // Nothing to read into: finish at once.
            self.reply(now, peer, &[&encode_fin(rts.req, FinStatus::Done, 0)]);
            self.finish_recv(&landing, 0, None);
            return;
        }
        // Whether this process may read the sender is the layer below's to say
        // (it answers NotPermitted, and the bytes are pushed): the sender only
        // announces where its path can read, and a peer that sent first has no
        // path recorded here.
        let addr = self.rdm.peer_addr(peer);
        let id = PullId(self.pulls.insert(Pull { peer, req: rts.req, landing }) as u32);
        self.actions.push_back(Action::RemoteRead { id, peer, addr, src: rts.iov, src_count: rts.iov_count, dst: landing.target });
    }

    /// The layer below finished [`Action::RemoteRead`] `id`.
    pub fn remote_read_done(&mut self, now: Instant, id: PullId, outcome: ReadOutcome) {
        let Some(p) = self.pulls.try_remove(id.0 as usize) else { return };
        match outcome {
            ReadOutcome::Done(n) => {
                self.stats.pulled += 1;
                self.reply(now, p.peer, &[&encode_fin(p.req, FinStatus::Done, n)]);
                self.finish_recv(&p.landing, n as usize, None);
            }
            ReadOutcome::NotPermitted => self.start_window(now, p.peer, p.req, p.landing),
            ReadOutcome::Failed(n) => {
                self.reply(now, p.peer, &[&encode_fin(p.req, FinStatus::Failed, n)]);
                self.finish_recv(&p.landing, n as usize, Some(OpError::Io));
            }
        }
    }

    fn handle_fin(&mut self, peer: PeerId, req: u64, status: FinStatus, mem: &mut dyn Memory, now: Instant) {
        let id = TxId(req as u32);
        let ours = u32::try_from(req).is_ok() && self.tx.get(id.0 as usize).is_some_and(|t| t.rndv.is_some() && t.peer == peer);
        if !ours {
            self.stats.stray += 1;
            return;
        }
        match status {
            FinStatus::Done | FinStatus::Discarded => self.complete_send(id, None),
            FinStatus::Failed => self.complete_send(id, Some(OpError::Io)),
        }
        let _ = (mem, now);
    }

    /// The receiver cannot pull: grant the first window.
    fn start_window(&mut self, now: Instant, peer: PeerId, req: u64, landing: Landing) {
        let take = (landing.msg_len as u64).min(landing.target.total());
        let mut w = WindowRx { landing, take, granted: 0, received: 0 };
        self.grant(now, peer, req, &mut w);
        self.windows.insert((peer, req), w);
        self.await_answer(now, peer);
    }

    /// Grants the next window while at most half of the granted bytes are
    /// still outstanding: the sender never waits for a grant round trip.
    fn grant(&mut self, now: Instant, peer: PeerId, req: u64, w: &mut WindowRx) {
        let window = self.cfg.window.max(1);
        while w.granted < w.take && w.granted - w.received <= window / 2 {
            let len = (w.take - w.granted).min(window);
            self.reply(now, peer, &[&encode_cts(req, w.granted, len)]);
            w.granted += len;
            self.stats.windows_granted += 1;
        }
    }

    /// A `Push` of a granted range landed.
    fn handle_push(&mut self, now: Instant, peer: PeerId, req: u64, offset: u64, payload: &[u8], mem: &mut dyn Memory) {
        let Some(mut w) = self.windows.remove(&(peer, req)) else {
            self.stats.stray += 1;
            return;
        };
        let end = offset.checked_add(payload.len() as u64);
        if end.is_none_or(|e| e > w.granted) {
            // Outside what was granted: a confused or hostile sender.
            self.stats.stray += 1;
            self.windows.insert((peer, req), w);
            return;
        }
        let written = w.landing.target.scatter_at(mem, offset, payload);
        w.received += written as u64;
        if w.received >= w.take {
            self.stats.pushed += 1;
            self.reply(now, peer, &[&encode_fin(req, FinStatus::Done, w.received)]);
            self.finish_recv(&w.landing, w.received as usize, None);
        } else {
            self.grant(now, peer, req, &mut w);
            self.windows.insert((peer, req), w);
        }
    }

    /// A window grant for one of our rendezvous sends.
    fn handle_cts(&mut self, now: Instant, peer: PeerId, req: u64, offset: u64, len: u64, mem: &dyn Memory) {
        let id = TxId(req as u32);
        let fits = u32::try_from(req).is_ok()
            && self.tx.get(id.0 as usize).is_some_and(|t| t.peer == peer && t.rndv.is_some() && offset.checked_add(len).is_some_and(|e| e <= t.len as u64));
        if !fits {
            self.stats.stray += 1;
            return;
        }
        if self.path(peer).is_some_and(|p| p.remote_read) {
            // The path could read, the receiver may not: long messages to it go
            // eagerly from now on.
            self.refused.insert(peer);
        }
        self.push_backlog.push_back((id, offset, offset + len));
        self.retry_pushes(now, mem);
    }

    /// Sends the granted ranges as `Push` messages of at most [`PUSH_CHUNK`]
    /// bytes, in order, while the rdm engine takes them.
    fn retry_pushes(&mut self, now: Instant, mem: &dyn Memory) {
        while let Some(&(id, offset, end)) = self.push_backlog.front() {
            let Some((peer, iov)) = self.tx.get(id.0 as usize).and_then(|t| t.rndv.map(|iov| (t.peer, iov))) else {
                self.push_backlog.pop_front();
                continue;
            };
            if offset >= end {
                self.push_backlog.pop_front();
                continue;
            }
            let n = (end - offset).min(PUSH_CHUNK);
            let hdr = encode_push(id.0 as u64, offset);
            let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
            parts[0] = &hdr;
            let mut k = 1;
            for piece in iov.range(offset, n) {
                parts[k] = mem.bytes(piece.addr, piece.len as usize);
                k += 1;
            }
            match self.rdm.send(now, peer, &parts[..k], Token::Push(id).encode()) {
                Ok(()) => {
                    if let Some(front) = self.push_backlog.front_mut() {
                        front.1 = offset + n;
                    }
                }
                Err(_) => return,
            }
        }
    }

    // ------------------------------------------------------------------ RMA

    #[allow(clippy::too_many_arguments)] // one request's parts, as the RMA calls take them
    fn start_rma(&mut self, now: Instant, peer: PeerId, kind: OpKind, meta: OpMeta, result: IoList, len: usize, request: impl FnOnce(u64) -> Packet<'static>, extra: &[&[u8]]) -> Result<RmaId, PostError> {
        let entry = self.rma.vacant_entry();
        let id = RmaId(entry.key() as u32);
        // The request names its id, for the answer to echo; its payload follows as `extra`.
        let mut hdr = [0u8; MAX_HEADER_LEN];
        let hdr_len = request(id.0 as u64).encode_header(&mut hdr);
        let mut parts: [&[u8]; 2 * MAX_IOV + 1] = [&[]; 2 * MAX_IOV + 1];
        parts[0] = &hdr[..hdr_len];
        let n = extra.len().min(2 * MAX_IOV);
        parts[1..=n].copy_from_slice(&extra[..n]);
        self.rdm.send(now, peer, &parts[..=n], Token::Rma(id).encode())?;
        entry.insert(RmaEntry { kind, meta, peer, result, len });
        self.await_answer(now, peer);
        self.stats.rma_started += 1;
        Ok(id)
    }

    /// fi_write: `payload` to `addr` under `key` at `peer`, with remote CQ data.
    #[allow(clippy::too_many_arguments)] // fi_writedata's own arguments
    pub fn rma_write(&mut self, now: Instant, peer: PeerId, key: u64, addr: u64, payload: &[&[u8]], data: Option<u64>, meta: OpMeta) -> Result<RmaId, PostError> {
        let len = payload.iter().map(|p| p.len()).sum();
        let request = |req| Packet::Write { req, key, addr, data, payload: &[] };
        self.start_rma(now, peer, OpKind::Write, meta, IoList::default(), len, request, payload)
    }

    /// fi_read: `dst.total()` bytes at `addr` under `key` at `peer` into `dst`.
    pub fn rma_read(&mut self, now: Instant, peer: PeerId, key: u64, addr: u64, dst: IoList, meta: OpMeta) -> Result<RmaId, PostError> {
        let len = dst.total();
        let request = |req| Packet::ReadReq { req, key, addr, len };
        self.start_rma(now, peer, OpKind::Read, meta, dst, len as usize, request, &[])
    }

    /// An atomic of `count` elements; `fetch` returns the old values into
    /// `result`; `compare` operands make it a compare atomic.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic(
        &mut self,
        now: Instant,
        peer: PeerId,
        key: u64,
        addr: u64,
        dt: Datatype,
        op: Op,
        count: usize,
        operand: &[&[u8]],
        compare: &[&[u8]],
        result: IoList,
        fetch: bool,
        meta: OpMeta,
    ) -> Result<RmaId, PostError> {
        let family = if !compare.is_empty() {
            atomic::Family::Compare
        } else if fetch {
            atomic::Family::Fetch
        } else {
            atomic::Family::Write
        };
        if !atomic::valid(family, dt, op) {
            return Err(PostError::AtomicUnsupported);
        }
        let bytes = count.checked_mul(dt.size()).ok_or(PostError::AtomicOperands)?;
        let given: usize = operand.iter().map(|p| p.len()).sum();
        if op != Op::Read && given != bytes {
            return Err(PostError::AtomicOperands);
        }
        let count32 = u32::try_from(count).map_err(|_| PostError::AtomicOperands)?;
        let (datatype, op_byte) = (dt.wire(), op.wire());
        let request = |req| Packet::Atomic { req, key, addr, datatype, op: op_byte, count: count32, fetch, payload: &[] };
        let mut extra: [&[u8]; 2 * MAX_IOV] = [&[]; 2 * MAX_IOV];
        let mut n = 0;
        let operands: &[&[u8]] = if op == Op::Read { &[] } else { operand };
        for p in operands.iter().chain(compare).take(2 * MAX_IOV) {
            extra[n] = p;
            n += 1;
        }
        self.start_rma(now, peer, OpKind::Atomic { fetch }, meta, result, bytes, request, &extra[..n])
    }

    fn finish_rma(&mut self, peer: PeerId, req: u64, status: Status, payload: &[u8], mem: &mut dyn Memory) {
        let id = req as usize;
        if u32::try_from(req).is_err() || self.rma.get(id).is_none_or(|e| e.peer != peer) {
            self.stats.stray += 1;
            return;
        }
        let e = self.rma.remove(id);
        let err = status_error(status);
        if err.is_none() && matches!(e.kind, OpKind::Read | OpKind::Atomic { fetch: true }) {
            e.result.scatter(mem, payload);
        }
        self.completions.push_back(Completion { len: e.len, src: Some(e.peer), err, ..Completion::new(e.meta, e.kind) });
    }

    fn serve_rma(&mut self, now: Instant, peer: PeerId, pkt: Packet<'_>, mem: &mut dyn Memory) {
        match pkt {
            Packet::Write { req, key, addr, data, payload } => {
                let status = match mem.rma_target(key, addr, payload.len() as u64, Access::RemoteWrite) {
                    Ok(pieces) => {
                        let mut off = 0;
                        for p in pieces {
                            mem.write(p.addr, &payload[off..off + p.len as usize]);
                            off += p.len as usize;
                        }
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.served(OpKind::RemoteWrite, payload.len(), data);
                }
                self.reply(now, peer, &[&rma_wire::encode_write_ack(req, status)]);
            }
            Packet::ReadReq { req, key, addr, len } => {
                let mut data = Vec::new();
                let status = match mem.rma_target(key, addr, len, Access::RemoteRead) {
                    Ok(pieces) => {
                        for p in pieces {
                            mem.read(p.addr, p.len as usize, &mut data);
                        }
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.served(OpKind::RemoteRead, data.len(), None);
                }
                self.reply(now, peer, &[&rma_wire::encode_read_resp(req, status), &data]);
            }
            Packet::Atomic { req, key, addr, datatype, op, count, fetch, payload } => {
                let mut old = Vec::new();
                let status = (|| -> Result<(), Status> {
                    let dt = Datatype::from_wire(datatype).ok_or(Status::Invalid)?;
                    let o = Op::from_wire(op).ok_or(Status::Invalid)?;
                    let bytes = (count as usize).checked_mul(dt.size()).ok_or(Status::Invalid)?;
                    let (operand, compare) = atomic::split_operands(o, payload, bytes).ok_or(Status::Invalid)?;
                    let pieces = mem.rma_target(key, addr, bytes as u64, Access::RemoteWrite)?;
                    for p in &pieces {
                        mem.read(p.addr, p.len as usize, &mut old);
                    }
                    let mut new = old.clone();
                    atomic::apply(dt, o, &mut new, operand, compare).map_err(|_| Status::Invalid)?;
                    let mut off = 0;
                    for p in &pieces {
                        mem.write(p.addr, &new[off..off + p.len as usize]);
                        off += p.len as usize;
                    }
                    Ok(())
                })();
                let status = match status {
                    Ok(()) => {
                        self.served(OpKind::RemoteWrite, old.len(), None);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                let back: &[u8] = if fetch && status == Status::Ok { &old } else { &[] };
                self.reply(now, peer, &[&rma_wire::encode_atomic_resp(req, status), back]);
            }
            _ => {}
        }
    }

    /// A served one-sided operation, reported for the target's counters (and,
    /// with CQ data, its receive CQ).
    fn served(&mut self, kind: OpKind, len: usize, data: Option<u64>) {
        self.stats.rma_served += 1;
        let meta = OpMeta { context: 0, wanted: data.is_some(), ..OpMeta::default() };
        self.completions.push_back(Completion { len, data, ..Completion::new(meta, kind) });
    }

    /// An answer nothing waits on: lost only if the rdm engine refuses it, and
    /// then the initiator fails with the peer.
    fn reply(&mut self, now: Instant, peer: PeerId, parts: &[&[u8]]) {
        let _ = self.rdm.send(now, peer, parts, Token::Reply.encode());
    }

    /// The layer below reports `addr` unreachable (ICMP, a dead process): the
    /// rdm engine fails it if data is in flight, and so does this engine if it
    /// waits on an answer from it.
    pub fn handle_unreachable(&mut self, addr: DevAddr) {
        match self.rdm.peer_id_of(addr) {
            Some(peer) if self.waits_on(peer) => self.rdm.fail_unreachable(addr),
            _ => self.rdm.handle_unreachable(addr),
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
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.awaiting.values().min().copied()
    }

    /// Sends the keepalives that are due, and forgets peers nothing waits on.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<PeerId> = self.awaiting.iter().filter(|(_, t)| **t <= now).map(|(p, _)| *p).collect();
        for peer in due {
            if self.waits_on(peer) {
                let _ = self.rdm.send(now, peer, &[&crate::wire::KEEPALIVE], Token::Reply.encode());
                self.awaiting.insert(peer, now + self.cfg.keepalive);
            } else {
                self.awaiting.remove(&peer);
            }
        }
    }

    // ------------------------------------------------------- events from rdm

    /// Runs the protocols on everything the rdm engine delivered or reported
    /// since the last call. Call after feeding it datagrams and timeouts.
    pub fn handle_events(&mut self, now: Instant, mem: &mut dyn Memory) {
        self.retry_pushes(now, mem);
        while let Some(ev) = self.rdm.poll_event() {
            match ev {
                Event::Delivered { peer, msg } if !self.cfg.datagram => self.handle_message(now, peer, msg, mem),
                Event::Datagram { peer, msg } if self.cfg.datagram => self.handle_datagram(now, peer, msg, mem),
                Event::Delivered { msg, .. } | Event::Datagram { msg, .. } => {
                    self.stats.stray += 1;
                    self.rdm.recycle(msg);
                }
                Event::SendComplete { token } => {
                    // An RTS and its pushes complete on the receiver's Fin; an
                    // RMA request on its answer.
                    if let Some(Token::Msg(id)) = Token::decode(token) {
                        self.complete_send(id, None);
                    }
                }
                Event::SendFailed { token, peer: _, reason } => {
                    let err = if reason == FailReason::PeerRestarted { OpError::Io } else { OpError::PeerUnreachable };
                    match Token::decode(token) {
                        Some(Token::Msg(id) | Token::Push(id) | Token::Rts(id)) => self.complete_send(id, Some(err)),
                        Some(Token::Rma(id)) => {
                            if let Some(e) = self.rma.try_remove(id.0 as usize) {
                                self.completions.push_back(Completion { len: e.len, src: Some(e.peer), err: Some(err), ..Completion::new(e.meta, e.kind) });
                            }
                        }
                        _ => {}
                    }
                }
                Event::PeerUnreachable { peer } => self.fail_peer(peer, true),
                Event::PeerRestarted { peer } => self.fail_peer(peer, false),
            }
        }
        self.update_backpressure();
    }

    fn handle_message(&mut self, now: Instant, peer: PeerId, msg: Vec<u8>, mem: &mut dyn Memory) {
        // Parsed once; the typed fields are all that is used below.
        let pkt = match Packet::decode(&msg) {
            Ok(p) => p,
            Err(_) => {
                self.stats.dropped_malformed += 1;
                self.rdm.recycle(msg);
                return;
            }
        };
        let matched = match pkt {
            Packet::Msg(h, _) => Some((h, None)),
            Packet::Rts(rts) => Some((rts.header, Some(rts))),
            _ => None,
        };
        if let Some((h, rndv)) = matched {
            let arrived = Arrived { peer, kind: h.kind, tag: h.tag, data: h.data, msg, offset: HEADER_LEN, rndv };
            if let Some((post, arrived)) = self.matcher.arrive(arrived) {
                self.land(now, RxId(post.token as u32), arrived, mem);
            }
            return;
        }
        match pkt {
            Packet::Fin { req, status, .. } => self.handle_fin(peer, req, status, mem, now),
            Packet::Push { req, offset, payload } => self.handle_push(now, peer, req, offset, payload, mem),
            Packet::Cts { req, offset, len } => self.handle_cts(now, peer, req, offset, len, mem),
            Packet::ReadResp { req, status, payload } | Packet::AtomicResp { req, status, payload } => self.finish_rma(peer, req, status, payload, mem),
            Packet::WriteAck { req, status } => self.finish_rma(peer, req, status, &[], mem),
            Packet::Keepalive => {}
            other => self.serve_rma(now, peer, other, mem),
        }
        self.rdm.recycle(msg);
    }

    /// Datagram mode: a message lands in the oldest posted receive it matches,
    /// or is dropped (counted); only plain messages are expected.
    fn handle_datagram(&mut self, now: Instant, peer: PeerId, msg: Vec<u8>, mem: &mut dyn Memory) {
        let h = match Packet::decode(&msg) {
            Ok(Packet::Msg(h, _)) => h,
            Ok(_) => {
                self.stats.stray += 1;
                self.rdm.recycle(msg);
                return;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                self.rdm.recycle(msg);
                return;
            }
        };
        match self.matcher.match_posted(peer, h.kind, h.tag) {
            Some(post) => {
                let arrived = Arrived { peer, kind: h.kind, tag: h.tag, data: h.data, msg, offset: HEADER_LEN, rndv: None };
                self.land(now, RxId(post.token as u32), arrived, mem);
            }
            None => {
                self.stats.dropped_unmatched += 1;
                self.rdm.recycle(msg);
            }
        }
    }

    /// Everything that waits on an answer from `peer` fails: rendezvous sends
    /// awaiting a Fin, RMA requests awaiting their answer, receives awaiting a
    /// Push or a pull. A peer declared `unreachable` also fails the receives
    /// directed at it alone (they can never match), and is reported by
    /// [`MsgEngine::poll_failed_peer`]; a restarted one keeps them (its new
    /// incarnation may still send).
    fn fail_peer(&mut self, peer: PeerId, unreachable: bool) {
        let err = if unreachable { OpError::PeerUnreachable } else { OpError::Io };
        let sends: Vec<usize> = self.tx.iter().filter(|(_, t)| t.peer == peer && t.rndv.is_some()).map(|(k, _)| k).collect();
        for k in sends {
            self.complete_send(TxId(k as u32), Some(err));
        }
        let rmas: Vec<usize> = self.rma.iter().filter(|(_, e)| e.peer == peer).map(|(k, _)| k).collect();
        for k in rmas {
            let e = self.rma.remove(k);
            self.completions.push_back(Completion { len: e.len, src: Some(e.peer), err: Some(err), ..Completion::new(e.meta, e.kind) });
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
                    self.completions.push_back(Completion { tag: post.tag, src: Some(peer), err: Some(err), ..recv_op(e.meta, post.kind) });
                }
            }
            self.failed_peers.push_back(peer);
        }
        self.awaiting.remove(&peer);
    }

    /// Unexpected messages are held without a count limit but with a memory
    /// limit: above it the rdm engine stops accepting new messages (senders keep
    /// them and wait); below half of it, it resumes.
    fn update_backpressure(&mut self) {
        let held = self.matcher.unexpected_bytes();
        let limit = self.cfg.unexpected_limit;
        if !self.rdm.is_paused() && held > limit {
            self.rdm.set_paused(true);
        } else if self.rdm.is_paused() && held <= limit / 2 {
            self.rdm.set_paused(false);
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

/// Copies up to `dst.total()` bytes of `src` (the peer's memory) into `dst` by
/// calling `read(src_key, src_addr, dst_addr, len)` per run that lies in one
/// piece of both (`src_key`: the registration key the RTS announced for that
/// piece, on registering paths); stops at the first run `read` does not
/// complete. For the provider's
/// [`Action::RemoteRead`] handler. Returns the bytes read and whether every run
/// succeeded.
pub fn for_each_read_run(src: &[RemoteIov], dst: &IoList, mut read: impl FnMut(Option<u64>, u64, u64, u64) -> bool) -> (u64, bool) {
    let mut src_lens = [0u64; MAX_IOV];
    for (d, v) in src_lens.iter_mut().zip(src) {
        *d = v.len;
    }
    let mut dst_lens = [0u64; MAX_IOV];
    for (d, b) in dst_lens.iter_mut().zip(dst.iter()) {
        *d = b.len;
    }
    let mut ok = true;
    let n = zip_pieces(&src_lens[..src.len().min(MAX_IOV)], &dst_lens[..dst.count], |si, so, di, doff, len| {
        ok = read(src[si].key, src[si].addr + so, dst.bufs[di].addr + doff, len);
        ok
    });
    (n, ok)
}
