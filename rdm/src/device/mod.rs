//! The device seam: what the sans-IO engine asks of a datagram device, and the
//! types they exchange (addresses, capabilities, datagrams, remote reads).
//!
//! A device moves whole datagrams between endpoints and knows nothing about
//! reliability. The devices themselves (UDP, shared memory, verbs UD, EFA SRD,
//! the `auto` composite, the fault decorator) live in the `devices` crate, the
//! simulator's in `simnet`; all implement [`Device`] and pass the same
//! conformance suite (`devices/tests/device_conformance.rs`). [`rc`] is the
//! sans-IO table of lazily made reliable connections that a device with remote
//! reads (verbs) keeps.
//!
//! Receive *lends* buffers: `recv_batch` hands each datagram to a callback as a
//! borrowed slice that is valid only during the call, so a device can receive into
//! its own ring or registered memory without copying into engine-owned storage.

pub mod rc;

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;

/// Network address of one device endpoint. Small, `Copy`, hashable: the engine keys
/// peers by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DevAddr {
    /// A UDP socket (IPv4 or IPv6).
    Udp(SocketAddr),
    /// A shared-memory receive ring on this host.
    Shm(ShmAddr),
    /// An address whose bytes only its device interprets (verbs UD: GID, QPN
    /// and Q_Key; EFA SRD: its 32-byte address). The endpoint never looks
    /// inside: it asks the device ([`Device::caps_for`], [`Device::owns`]),
    /// so a new device needs no new variant here and no new match above.
    Raw(RawAddr),
}

impl DevAddr {
    /// Whether a datagram from or to this address crosses no wire: a
    /// shared-memory ring between two processes of this host, where nothing
    /// corrupts bytes on the way. Such datagrams go without a checksum
    /// (`PROTOCOL.md` §2.4); one that claims to come from anywhere else
    /// without it is dropped.
    pub fn crosses_no_wire(&self) -> bool {
        matches!(self, DevAddr::Shm(_))
    }
}

/// Longest address a [`RawAddr`] carries: verbs UD needs GID + QPN + Q_Key
/// (24 bytes), EFA its GID, QPN and QKey (24). Kept so that a `DevAddr` is no
/// larger than a `SocketAddr` (the engine keeps two per peer).
pub const RAW_ADDR_MAX: usize = 28;

// The engine keeps a peer's address twice (its map and its entry): a raw
// address must not make every peer larger.
const _: () = assert!(std::mem::size_of::<DevAddr>() <= std::mem::size_of::<SocketAddr>());

/// A device's own address bytes, tagged with the device family that defines
/// them (so two device kinds never mistake each other's addresses).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawAddr {
    family: u8,
    len: u8,
    bytes: [u8; RAW_ADDR_MAX],
}

impl RawAddr {
    /// Device families of raw addresses.
    pub const FAMILY_VERBS_UD: u8 = 1;
    pub const FAMILY_EFA: u8 = 2;
    /// The simulators' and the tests' model devices (`simnet::addr`): the
    /// simulator needs no variant of its own in the production enum.
    pub const FAMILY_MODEL: u8 = 0xfe;

    /// `None` when `bytes` is longer than [`RAW_ADDR_MAX`].
    pub fn new(family: u8, bytes: &[u8]) -> Option<RawAddr> {
        let mut b = [0u8; RAW_ADDR_MAX];
        b.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(RawAddr { family, len: bytes.len() as u8, bytes: b })
    }

    pub fn family(&self) -> u8 {
        self.family
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl std::fmt::Debug for RawAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "raw{}:", self.family)?;
        for b in self.bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl DevAddr {
    /// No address (0.0.0.0:0): what an empty composite reports, and a
    /// placeholder in buffers.
    pub const NONE: DevAddr =
        DevAddr::Udp(SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)));
}

/// Identity of a shared-memory endpoint: the host it lives on, the owning process
/// (for `process_vm_readv` and liveness checks) and the ring's unique id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShmAddr {
    pub host_id: u64,
    pub pid: u32,
    pub ring_id: u64,
}

/// What a device can do; the engine and protocol selection adapt to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Datagrams are never lost, duplicated or corrupted (shm, SRD): the engine turns
    /// retransmission off.
    pub reliable: bool,
    /// Datagrams between two endpoints arrive in send order (shm, UDP on loopback is
    /// *not* promised to be).
    pub ordered: bool,
    /// Largest datagram payload the device carries.
    pub mtu: usize,
    /// The receiver can read the sender's memory directly ([`RemoteReads::post_read`]).
    pub remote_read: bool,
    /// The device takes a run of equal-size datagrams to one destination as one
    /// [`TxDatagram`] (`seg` < `data.len()`), e.g. as one UDP GSO send.
    pub gso: bool,
    /// Datagrams up to this many bytes are copied into the send queue itself
    /// (verbs `max_inline_data`): no buffer need stay registered for them. 0
    /// where the notion does not apply (sockets and rings copy every datagram).
    pub max_inline: u16,
    /// A remote read of this endpoint's memory needs a registration key (verbs
    /// UD, EFA SRD: the peer's RDMA read names a memory key). The sender of a
    /// rendezvous then registers its buffers (through the registration cache)
    /// and announces their keys. False for udp (no remote read) and shm
    /// (`process_vm_readv` reads any address): on those paths no registration
    /// is looked up at all.
    pub registration: bool,
    /// The largest `TxDatagram::data` the device takes on any of its paths,
    /// and so what one transmit buffer must hold: `mtu`, or a whole run where
    /// the device takes runs (`gso`); a composite's largest half's.
    pub max_transmit: usize,
}

impl DeviceCaps {
    /// An unreliable, unordered path of `mtu` bytes with nothing else: the
    /// base the tests and the simulator build from.
    pub const fn datagram(mtu: usize) -> DeviceCaps {
        DeviceCaps {
            reliable: false,
            ordered: false,
            mtu,
            remote_read: false,
            gso: false,
            registration: false,
            max_inline: 0,
            max_transmit: mtu,
        }
    }
}

/// Application memory a posted remote read writes into, or a datagram
/// gathers from ([`TxDatagram::gather`]), with the local registration key
/// where the device needs one: see [`local_mem::LocalBuf`], whose crate holds
/// the one `unsafe` contract (its constructor), so that this crate forbids
/// unsafe code.
pub use local_mem::LocalBuf;

/// A destination a device resolved once ([`Device::resolve`]) for the writes
/// that follow ([`Device::write`]): its own index of the peer, opaque to
/// callers, checked by the device on every write (a stale one is refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest(pub u64);

/// One piece of a posted remote read: `local.len()` bytes of the peer's memory
/// at `remote_addr`, named through `remote_key` on devices that need keys
/// ([`DeviceCaps::registration`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRun {
    pub remote_addr: u64,
    pub remote_key: Option<u64>,
    pub local: LocalBuf,
}

/// A posted remote read that finished: `bytes` were read, in order from its
/// first run; `error` says why it stopped short (`None`: every byte arrived).
#[derive(Debug)]
pub struct ReadDone {
    pub id: u64,
    pub bytes: u64,
    pub error: Option<DeviceError>,
}

/// Control bytes a device sends to its peer through the endpoint's reliable
/// stream ([`RemoteReads::poll_control`]): at most [`CONTROL_MAX`] of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlMsg {
    len: u8,
    bytes: [u8; CONTROL_MAX],
}

/// Longest control message a device sends.
pub const CONTROL_MAX: usize = 48;

impl ControlMsg {
    /// `None` when `b` is longer than [`CONTROL_MAX`].
    pub fn new(b: &[u8]) -> Option<ControlMsg> {
        let mut bytes = [0u8; CONTROL_MAX];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(ControlMsg { len: b.len() as u8, bytes })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// What a device's connections for remote reads did ([`RemoteReads::read_conn_stats`];
/// all zero on devices that read without connections, or not at all).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadConnStats {
    pub conns: rc::ConnStats,
    /// Connections open now: this endpoint reads through them / peers do.
    pub open_active: usize,
    pub open_passive: usize,
    /// Reads posted through connections, the bytes they brought, and those
    /// that failed (their messages were pushed instead).
    pub reads: u64,
    pub read_bytes: u64,
    pub read_failures: u64,
    /// Reads given up because no completion came in time (counted in
    /// `read_failures` too), and the device's status code of the last read
    /// request that failed (verbs: its `ibv_wc_status`; 0 = none failed).
    pub read_timeouts: u64,
    pub last_read_error: u32,
    /// Queue pairs of connections that exist now (open ones, and closed ones
    /// whose last requests have not flushed yet): equal to the open
    /// connections once the device is idle, or queue pairs leak.
    pub queue_pairs: u64,
}

/// Registers memory with a device's protection domain: what a peer's remote
/// read of it names (the key), and what a local read target or a lent
/// transmit buffer carries.
pub trait Registrar: Send {
    /// Registers `[addr, addr+len)` for libfabric-style `access` bits; the
    /// key a remote access names.
    fn register(&mut self, addr: u64, len: u64, access: u64) -> Result<u64, DeviceError>;
    fn deregister(&mut self, key: u64);
    /// Registrations page in on demand (verbs ODP): no memory is pinned.
    fn on_demand(&self) -> bool {
        false
    }
}

/// What an endpoint's queue is opened with.
#[derive(Clone, Copy, Debug)]
pub struct OpenSpec {
    /// The local socket address asked for (devices that bind one).
    pub bind: Option<SocketAddr>,
    /// This endpoint instance, unique per process lifetime: names its ring on
    /// shm, feeds its Q_Key-independent identity elsewhere.
    pub incarnation: u64,
    /// The job's key: devices that can filter in hardware derive their own
    /// key from it (verbs UD: the Q_Key, so the NIC drops another job's
    /// packets).
    pub job_key: u64,
}

/// A domain's device: one per libfabric domain (on verbs its protection
/// domain; on EFA the same), from which every endpoint of the domain opens its
/// queue and through which the domain registers memory, so a registration is
/// valid on every endpoint's queue.
pub trait DeviceContext: Send + Sync {
    /// Opens one endpoint's queue.
    fn open(&self, spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError>;
    /// The domain's registrar, for devices whose remote reads need keys;
    /// `None` where nothing is registered (udp, shm).
    fn registrar(&self) -> Option<Box<dyn Registrar>>;
}

/// One outgoing datagram, or a run of them: `data` cut every `seg` bytes (the
/// last piece may be shorter) gives datagrams of one destination. A run is
/// passed only to devices whose caps say `gso`; the engine forms it, so the
/// device need not rediscover it.
#[derive(Clone, Copy, Debug)]
pub struct TxDatagram<'a> {
    pub dst: DevAddr,
    pub data: &'a [u8],
    pub seg: usize,
    /// The rest of a single datagram, in registered application memory
    /// (with its local key): the device sends `data` and then these bytes,
    /// gathered by the NIC without a copy. Formed only for paths whose device
    /// registers memory ([`DeviceCaps::registration`]); a device that cannot
    /// gather refuses it with `Unsupported`. The memory stays valid until the
    /// message it belongs to completes, which is after the device's send.
    pub gather: Option<LocalBuf>,
}

impl<'a> TxDatagram<'a> {
    /// One datagram.
    pub fn new(dst: DevAddr, data: &'a [u8]) -> TxDatagram<'a> {
        TxDatagram { dst, data, seg: data.len(), gather: None }
    }

    /// A run of datagrams of `seg` bytes (the last may be shorter).
    pub fn run(dst: DevAddr, data: &'a [u8], seg: usize) -> TxDatagram<'a> {
        TxDatagram { dst, data, seg: seg.clamp(1, data.len().max(1)), gather: None }
    }

    /// The same datagram followed by `gather` (see [`TxDatagram::gather`]).
    pub fn gathering(self, gather: Option<LocalBuf>) -> TxDatagram<'a> {
        TxDatagram { gather, ..self }
    }

    /// Bytes on the wire: `data` plus the gathered part.
    pub fn wire_len(&self) -> usize {
        self.data.len() + self.gather.map_or(0, |g| g.len() as usize)
    }

    /// Whether this is a run of more than one datagram.
    pub fn is_run(&self) -> bool {
        self.seg < self.data.len()
    }
}

/// The datagrams of `batch` up to the first with a gathered part: what a
/// device that cannot gather sends; `Unsupported` when that is the first.
/// Only paths whose device registers memory form gathered datagrams.
pub fn until_gathered<'b, 'a>(batch: &'b [TxDatagram<'a>]) -> Result<&'b [TxDatagram<'a>], DeviceError> {
    match batch.iter().position(|d| d.gather.is_some()) {
        Some(0) => Err(DeviceError::Unsupported),
        Some(i) => Ok(&batch[..i]),
        None => Ok(batch),
    }
}

/// Errors of a device operation; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("address {0:?} cannot be reached through this device")]
    Unreachable(DevAddr),
    #[error("datagram of {len} bytes exceeds the device MTU {mtu}")]
    TooLarge { len: usize, mtu: usize },
    #[error("operation not supported by this device")]
    Unsupported,
    /// The path can read, but not now: a connection to the peer is being
    /// set up, refused for a while, or broke under the read. The bytes are
    /// pushed instead; later reads may go through.
    #[error("no connection to the peer for remote reads (yet)")]
    NotConnected,
    #[error("{0}")]
    Config(String),
}

impl DeviceError {
    pub fn io(op: &'static str, source: io::Error) -> Self {
        DeviceError::Io { op, source }
    }
}

/// A datagram device. Implementations must be non-blocking: `send_batch` and
/// `recv_batch` never sleep; callers sleep on [`Device::wait_fd`].
///
/// Narrow on purpose: sizes come from [`Device::caps`], addresses from one
/// accessor ([`Device::local_addrs`]), remote reads from one
/// ([`Device::remote_reads`]); conveniences derived from them are in
/// [`DeviceExt`], which no device can override. There is no forwarding impl
/// for boxes: a holder of a `Box<dyn Device>` is generic over `D: ?Sized`
/// (`rndv::Endpoint`, the composites, the fault decorator) and calls the
/// device itself, so a box never hides a device's method behind a default;
/// a default a device keeps is its own choice (the fault decorator and
/// `NetPair` write nothing straight into a ring, by design).
pub trait Device: Send {
    fn caps(&self) -> DeviceCaps;

    /// The caps that hold for datagrams to `peer`: a composite device answers for
    /// the half that carries them (e.g. remote read only to same-host peers).
    fn caps_for(&self, peer: &DevAddr) -> DeviceCaps {
        let _ = peer;
        self.caps()
    }

    /// Sends as many datagrams of `batch` as the device accepts now, in order, and
    /// returns how many were taken. A short count means "try the rest later"
    /// (back-pressure), not an error. Datagrams to unreachable destinations may be
    /// reported as an error for the first datagram only. `now` is the endpoint's
    /// clock: a device that times anything on send (shm's liveness check of a
    /// peer) uses it and reads no clock of its own.
    fn send_batch(&mut self, now: crate::time::Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError>;

    /// Resolves `dst` once for the many [`Device::write`]s that follow (a
    /// peer's small messages): `Ok(None)` where the device offers no such
    /// writes to it (they go by `send_batch`). The device keeps what a
    /// write needs (shm: the mapped ring) until the destination goes away;
    /// a [`Dest`] that outlived it is refused by `write`, never misdirected.
    /// Errors as for `send_batch`'s first datagram (shm: the peer's ring
    /// cannot be mapped). Asked only for peers whose path is reliable and
    /// ordered.
    fn resolve(&mut self, dst: &DevAddr) -> Result<Option<Dest>, DeviceError> {
        let _ = dst;
        Ok(None)
    }

    /// Writes one datagram, gathered from `parts`, to a destination
    /// [`Device::resolve`] gave, at once and without a staging buffer (shm:
    /// header and payload copied once, into the peer's ring cell).
    /// `Ok(true)`: taken; `Ok(false)`: not taken and nothing done (the ring
    /// is full, its receiver holds senders back, or `dest` no longer
    /// resolves): resolve again or send it with `send_batch`. Errors as for
    /// `send_batch`'s first datagram; `now` as for `send_batch`.
    fn write(&mut self, now: crate::time::Instant, dest: Dest, parts: &[&[u8]]) -> Result<bool, DeviceError> {
        let _ = (now, dest, parts);
        Ok(false)
    }

    /// After [`Device::write`] to `dst` answered `Ok(false)`: whether
    /// because `dst`'s receiver holds its senders back
    /// ([`Device::hold_back_senders`]). The sender then sends sequenced
    /// messages only, which the receiver's window holds.
    fn held_back(&mut self, dst: &DevAddr) -> bool {
        let _ = dst;
        false
    }

    /// Receiver side: asks this endpoint's senders, where the device can
    /// tell them without a datagram (shm: a flag in the ring's header), to
    /// stop writing messages straight in, and then to start again. The
    /// engine is paused (unexpected-message limit): a sender's own progress
    /// would learn it only from our zero-window ACK, and a sender that only
    /// sends never reads it.
    fn hold_back_senders(&mut self, hold: bool) {
        let _ = hold;
    }

    /// Receives up to `max` datagrams that are ready now, lending each to `deliver`
    /// (source address, payload). Returns how many were delivered; 0 when none was
    /// ready.
    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError>;

    /// Every address this endpoint is reachable at, the one peers use first
    /// (a composite has one per half). Called at setup, not per datagram.
    fn local_addrs(&self) -> Vec<DevAddr>;

    /// Whether datagrams to `addr` go through this device (a composite asks
    /// its halves): how an endpoint routes by device, never by address kind.
    fn owns(&self, addr: &DevAddr) -> bool {
        let _ = addr;
        true
    }

    /// Reads of peers' memory, where this device offers them
    /// ([`RemoteReads`]: shm's `process_vm_readv`, RDMA reads on verbs and
    /// EFA). `None`: this path cannot read, the sender pushes the bytes.
    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        None
    }

    /// Buffers for the endpoint to build outgoing datagrams in, each `len`
    /// bytes. The endpoint writes its next datagram into them as soon as
    /// `send_batch` returns, so whatever the device sends from them it must
    /// have taken by then (a socket's `sendmmsg` and shm's ring copy at the
    /// call; the RDMA devices copy into a slot of their own, since a NIC
    /// reads a posted request's bytes later). Datagrams passed to
    /// `send_batch` may also point elsewhere.
    fn transmit_buffers(&mut self, count: usize, len: usize) -> Vec<Box<[u8]>> {
        (0..count).map(|_| vec![0u8; len].into_boxed_slice()).collect()
    }

    /// A file descriptor that becomes readable when `recv_batch` has work; `None` if
    /// the device can only be polled. Call [`Device::prepare_wait`] before each
    /// sleep on it.
    fn wait_fd(&self) -> Option<RawFd>;

    /// The caller is about to sleep on [`Device::wait_fd`]: make sure the fd turns
    /// readable when data arrives from now on. Returns true when data is already
    /// waiting (then do not sleep; call `recv_batch`). Devices whose fd is always
    /// live (a socket) need nothing; shm arms its ring here, so that a receiver
    /// that only polls costs its senders no wake-up system calls.
    fn prepare_wait(&mut self) -> bool {
        false
    }
    /// A destination the network reported unreachable since the last call (the
    /// UDP device reads ICMP port / host unreachable from the socket's error
    /// queue); `None` when there is none. Callers drain it after each receive.
    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        None
    }

    /// Whether a round of progress may leave this device alone now:
    /// [`Device::recv_batch`] would deliver nothing and
    /// [`Device::poll_unreachable`] would report nothing, and the device's own
    /// schedule of polls (liveness checks, turns of a network half) says it
    /// need not be asked. True counts as one poll of that schedule. False
    /// when unsure (the default: a device that must make a system call to know
    /// whether input waits, like UDP's socket, is always polled).
    ///
    /// Why: an application polls its CQ far more often than data arrives
    /// (MPICH makes one empty progress call per `MPI_Isend`), and an idle
    /// round must cost a few loads, not a walk through every layer.
    fn quiet(&mut self) -> bool {
        false
    }

    /// A check for input that needs nothing of the device but shared
    /// memory, made from any thread while another may be using the device:
    /// what lets an idle poll skip a round without taking the endpoint's
    /// lock. `None` (the default): the device has no such check, and every
    /// round asks it.
    fn input_probe(&self) -> Option<std::sync::Arc<dyn InputProbe>> {
        None
    }

    /// How many rounds of progress in a row, from now, may leave this
    /// device alone while its [`InputProbe`] finds nothing: the quiet rounds
    /// its schedule allows (liveness checks, turns of a network half), each
    /// as [`Device::quiet`] would answer with no input. 0 (the default):
    /// ask it every round. A query only: the rounds the endpoint did skip
    /// are reported by [`Device::rounds_skipped`].
    fn quiet_rounds(&self) -> u32 {
        0
    }

    /// The endpoint skipped `n` rounds (at most the last
    /// [`Device::quiet_rounds`] answer) on the word of the device's
    /// [`InputProbe`]: the device's schedule moves on by as many quiet polls.
    fn rounds_skipped(&mut self, n: u32) {
        let _ = n;
    }
}

/// A device's lock-free check for input ([`Device::input_probe`]).
pub trait InputProbe: Send + Sync {
    /// False only when no input waits now that a round within
    /// [`Device::quiet_rounds`] would take (a datagram arriving after the
    /// check is seen by the next one): then the device would call the round
    /// quiet ([`Device::quiet`]). Input its schedule leaves for later (a
    /// composite's network half) is not looked at.
    fn may_have_input(&self) -> bool;
}

/// What a device that reads peers' memory offers besides moving datagrams
/// ([`Device::remote_reads`]): posting reads and reporting them done, and for
/// a device whose reads need connections (verbs RC) the control bytes of their
/// handshake, the news that a peer failed, and the connections' counters.
pub trait RemoteReads {
    /// Posts a read of the peer's memory into local memory: the runs in order,
    /// each `run.local.len()` bytes. It completes later with one [`ReadDone`]
    /// carrying `id` ([`RemoteReads::poll_read`]); a device that reads synchronously
    /// (shm's `process_vm_readv`) completes before returning. An error here
    /// means nothing was read and no completion follows: `Unsupported` says
    /// this path cannot read (the sender then pushes the bytes).
    fn post_read(
        &mut self,
        now: crate::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError>;

    /// A posted read that finished, if any.
    fn poll_read(&mut self, now: crate::time::Instant) -> Option<ReadDone>;

    /// Bytes the device must get to `peer` reliably and in order (the
    /// handshake of a connection for remote reads, [`rc`]): the endpoint
    /// sends them over its reliable stream and hands them to the peer's
    /// device through [`RemoteReads::handle_control`]. Produced only inside
    /// [`RemoteReads::post_read`], [`RemoteReads::handle_control`] and
    /// [`RemoteReads::peer_failed`], so the endpoint drains after those.
    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        None
    }

    /// Control bytes the device at `from` sent ([`RemoteReads::poll_control`]).
    fn handle_control(&mut self, now: crate::time::Instant, from: DevAddr, bytes: &[u8]) {
        let _ = (now, from, bytes);
    }

    /// The endpoint gave up on `peer` (timeout, unreachable, restarted):
    /// whatever the device holds for it goes (connections, pending reads,
    /// which complete in error).
    fn peer_failed(&mut self, peer: DevAddr) {
        let _ = peer;
    }

    /// Counters of the connections for remote reads (`FI_RDMX_STATS`).
    fn read_conn_stats(&mut self) -> ReadConnStats {
        ReadConnStats::default()
    }
}

/// What every device offers on top of [`Device`], derived from its few
/// methods and the same for all (a blanket impl: no device overrides it).
pub trait DeviceExt: Device {
    /// The address peers use to reach this endpoint: the first of
    /// [`Device::local_addrs`].
    fn local_addr(&self) -> DevAddr {
        self.local_addrs().first().copied().unwrap_or(DevAddr::NONE)
    }
}

impl<D: Device + ?Sized> DeviceExt for D {}
