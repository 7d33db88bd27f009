//! The public operation and completion types of the message engine: buffers
//! and memory access, registrations, operation ids and tokens, completions,
//! actions, errors, configuration and statistics.
#[cfg(doc)]
use super::{MsgEngine, Path};
use crate::atomic::{self, Datatype};
use crate::matching::Src;
use crate::wire::msg::{MsgHeader, MsgKind};
use crate::wire::rendezvous::{RemoteIov, MAX_IOV};
use crate::wire::rma::Status;
use rdm::engine::{PeerId, SendError};
use rdm::DevAddr;

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
    pub(super) fn scatter(&self, mem: &mut dyn Memory, data: &[u8]) -> usize {
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
    pub(super) fn scatter_at(&self, mem: &mut dyn Memory, mut offset: u64, data: &[u8]) -> usize {
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
    pub(super) fn range(&self, mut offset: u64, mut len: u64) -> impl Iterator<Item = IoBuf> + '_ {
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
    /// Checks a remote access through `key` by a peer of job `job` (its job
    /// key) against the registrations: the local pieces it touches, in
    /// order, or the status to answer with (`Status::Access` for a
    /// registration that job may not reach).
    fn rma_target(&mut self, key: u64, addr: u64, len: u64, access: Access, job: u64) -> Result<Vec<IoBuf>, Status>;
    /// `[addr, addr+len)` of a posted receive buffer, named for a device read
    /// into it (the provider vouches for it: [`rdm::device::LocalBuf::new`]).
    /// `None`: this memory cannot be read into, the sender pushes instead.
    fn read_target(&mut self, addr: u64, len: u64) -> Option<rdm::device::LocalBuf> {
        let _ = (addr, len);
        None
    }
    /// `[addr, addr+len)` of a pending send's buffer, named for a device to
    /// send from (the provider vouches for it, as for `read_target`).
    /// `None`: the bytes are copied instead.
    fn send_source(&self, addr: u64, len: u64) -> Option<rdm::device::LocalBuf> {
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
    /// Bytes of a long message pushed straight from the application's
    /// registered memory: the send waits for their completion too.
    PushGathered(TxId),
}

impl Token {
    pub(super) fn encode(self) -> u64 {
        let (tag, id) = match self {
            Token::Msg(TxId(i)) => (1u64, i),
            Token::Rts(TxId(i)) => (2, i),
            Token::Push(TxId(i)) => (3, i),
            Token::Rma(RmaId(i)) => (4, i),
            Token::Reply => (5, 0),
            Token::PushGathered(TxId(i)) => (6, i),
        };
        tag << 32 | id as u64
    }

    pub(super) fn decode(t: u64) -> Option<Token> {
        let id = t as u32;
        Some(match t >> 32 {
            1 => Token::Msg(TxId(id)),
            2 => Token::Rts(TxId(id)),
            3 => Token::Push(TxId(id)),
            4 => Token::Rma(RmaId(id)),
            5 => Token::Reply,
            6 => Token::PushGathered(TxId(id)),
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
    /// Nothing above needs to hear that it succeeded: no CQ entry is wanted
    /// and no counter counts it (an `fi_inject` with no send counter). A
    /// send that completes in the call then queues no completion at all; a
    /// failure is still reported.
    pub silent: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Send,
    Recv,
    Write,
    Read,
    Atomic {
        fetch: bool,
    },
    /// Target side: a peer's write or atomic was served here (`data` is its
    /// remote CQ data, if it carried any).
    RemoteWrite,
    /// Target side: a peer's read was served here.
    RemoteRead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpError {
    /// The message was longer than the buffer; `olen` bytes were lost.
    Truncated {
        olen: usize,
    },
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
    pub(super) fn new(meta: OpMeta, kind: OpKind) -> Completion {
        Completion {
            meta,
            kind,
            msg: None,
            len: 0,
            buf: 0,
            data: None,
            tag: 0,
            src: None,
            multi_done: false,
            err: None,
        }
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
    /// The path can read but not this time (its connection is being set
    /// up): ask for a push, without marking the peer as one that refuses.
    NotNow,
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
            // Only `send_gather` says so, and its caller falls back to a copy.
            SendError::Unsupported => PostError::Again,
        }
    }
}

/// Tunables, chosen by the provider (libfabric parameters).
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// Messages of at least this many bytes to a peer whose path can read
    /// remotely go by rendezvous (the receiver pulls).
    pub rndv_threshold: usize,
    /// The same for a path whose reads need a registration (RDMA: verbs RC,
    /// EFA SRD), where a read costs a cache lookup and a NIC round trip
    /// rather than one `process_vm_readv`; `None`: `rndv_threshold`.
    pub rdma_rndv_threshold: Option<usize>,
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

/// The one set of defaults: the provider's parameters (`FI_RDMX_RNDV_THRESHOLD`
/// and its kin, `prov/src/params.rs`) take theirs from here, so the simulator,
/// the fuzzers and the benchmarks run the thresholds users run.
impl Default for Config {
    fn default() -> Config {
        Config {
            // A peer on this host: below 16 KiB copying through the ring is
            // faster than a `process_vm_readv` round trip.
            rndv_threshold: 16 << 10,
            // A peer over RDMA: a read costs a registration lookup and a NIC
            // round trip.
            rdma_rndv_threshold: Some(64 << 10),
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

/// One message to send, as a send call takes it: where it goes, its header,
/// its payload, and what its completion reports. Grouped because every send
/// path (`send`, `send_direct`, `send_staged`, and the endpoint's) takes all
/// of it and hands it on whole; `Copy`, so that a message the direct path
/// declines goes the queued way as it is (the payload slices are borrowed,
/// never copied).
#[derive(Clone, Copy, Debug)]
pub struct OutMsg<'p> {
    pub peer: PeerId,
    pub header: MsgHeader,
    /// The payload's bytes, in order (what an eager message carries).
    pub payload: &'p [&'p [u8]],
    /// Where the same bytes lie in application memory: used only if the
    /// message goes by rendezvous (empty: it never does).
    pub user: IoList,
    pub meta: OpMeta,
}

/// Where a one-sided operation (RMA or atomic) acts: the target peer, and
/// an address there under the key of one of its registrations (libfabric's
/// `dest_addr`, `addr` and `key`, which every RMA and atomic call names
/// together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmaTarget {
    pub peer: PeerId,
    pub key: u64,
    pub addr: u64,
}

/// One atomic as the initiator asks for it (the arguments of `fi_atomic`,
/// `fi_fetch_atomic` and `fi_compare_atomic`, less the operation's
/// [`OpMeta`]): where it acts, what it computes on how many elements, its
/// operands, and where fetched old values go.
#[derive(Clone, Copy, Debug)]
pub struct AtomicRequest<'p> {
    pub target: RmaTarget,
    pub datatype: Datatype,
    pub op: atomic::Op,
    /// Elements of `datatype` at the target.
    pub count: usize,
    /// `count` elements (none for [`atomic::Op::Read`]).
    pub operand: &'p [&'p [u8]],
    /// `count` elements to compare with: non-empty makes it a compare atomic.
    pub compare: &'p [&'p [u8]],
    /// Where the old values go if `fetch`.
    pub result: IoList,
    /// Return the target's old values (a fetch or compare atomic).
    pub fetch: bool,
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
    /// Pushed chunks sent straight from the application's registered memory
    /// (the NIC gathered them; no copy).
    pub pushes_gathered: u64,
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
    /// Most bytes of unexpected (unmatched) messages held at once.
    pub unexpected_bytes_max: u64,
}

/// The message layer's per-peer counters: indices into the rdm engine's
/// [`rdm::engine::PeerCounters::upper`] of the peer (its hot state), bumped as
/// the endpoint-wide [`Stats`] are. Each names a message count; the bytes of
/// those messages are at the next index.
pub(crate) mod peer_counter {
    /// Messages sent eagerly (the payload in the message), and their bytes.
    pub const SENT_EAGER_MSGS: usize = 0;
    /// Messages announced by rendezvous (RTS), and their bytes.
    pub const SENT_RNDV_MSGS: usize = 2;
    /// Eager messages that arrived from the peer, and their payload bytes.
    pub const RECV_EAGER_MSGS: usize = 4;
    /// Rendezvous messages this endpoint pulled (remote read), bytes read.
    pub const RECV_PULLED_MSGS: usize = 6;
    /// Rendezvous messages received through window grants, bytes received.
    pub const RECV_WINDOWED_MSGS: usize = 8;
}
