//! Datagram devices: the seam between the sans-IO engine and the operating system.
//!
//! A device moves whole datagrams between endpoints and knows nothing about
//! reliability. Every device (UDP, shared memory, later verbs UD and EFA SRD, the
//! fault-injecting decorator and the simulator) implements [`Device`] and passes the
//! same conformance suite.
//!
//! Receive *lends* buffers: `recv_batch` hands each datagram to a callback as a
//! borrowed slice that is valid only during the call, so a device can receive into
//! its own ring or registered memory without copying into engine-owned storage.

pub mod composite;
pub mod fault;
pub mod host;
pub mod iface;
pub mod shm;
pub mod udp;

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
    /// An endpoint of the in-process network simulator (tests; the `sim`
    /// feature, never in the shipped library).
    #[cfg(feature = "sim")]
    Sim(u32),
}

impl DevAddr {
    /// No address (0.0.0.0:0): what an empty composite reports, and a
    /// placeholder in buffers.
    pub const NONE: DevAddr = DevAddr::Udp(SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0)));
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
    /// The receiver can read the sender's memory directly ([`Device::remote_read`]).
    pub remote_read: bool,
    /// The device takes a run of equal-size datagrams to one destination as one
    /// [`TxDatagram`] (`seg` < `data.len()`), e.g. as one UDP GSO send.
    pub gso: bool,
    /// A remote read of this endpoint's memory needs a registration key (verbs
    /// UD, EFA SRD: the peer's RDMA read names a memory key). The sender of a
    /// rendezvous then registers its buffers (through the registration cache)
    /// and announces their keys. False for udp (no remote read) and shm
    /// (`process_vm_readv` reads any address): on those paths no registration
    /// is looked up at all.
    pub registration: bool,
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
}

impl<'a> TxDatagram<'a> {
    /// One datagram.
    pub fn new(dst: DevAddr, data: &'a [u8]) -> TxDatagram<'a> {
        TxDatagram { dst, data, seg: data.len() }
    }

    /// A run of datagrams of `seg` bytes (the last may be shorter).
    pub fn run(dst: DevAddr, data: &'a [u8], seg: usize) -> TxDatagram<'a> {
        TxDatagram { dst, data, seg: seg.clamp(1, data.len().max(1)) }
    }

    /// Whether this is a run of more than one datagram.
    pub fn is_run(&self) -> bool {
        self.seg < self.data.len()
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
pub trait Device: Send {
    fn caps(&self) -> DeviceCaps;

    /// The caps that hold for datagrams to `peer`: a composite device answers for
    /// the half that carries them (e.g. remote read only to same-host peers).
    fn caps_for(&self, peer: &DevAddr) -> DeviceCaps {
        let _ = peer;
        self.caps()
    }

    /// The largest datagram any path of this device carries (a composite's
    /// halves differ): what a transmit buffer must hold.
    fn max_mtu(&self) -> usize {
        self.caps().mtu
    }
    /// The largest `TxDatagram::data` the device takes: `max_mtu`, or a whole
    /// run where it takes runs.
    fn max_transmit(&self) -> usize {
        self.max_mtu()
    }
    /// The address peers use to reach this endpoint.
    fn local_addr(&self) -> DevAddr;

    /// Sends as many datagrams of `batch` as the device accepts now, in order, and
    /// returns how many were taken. A short count means "try the rest later"
    /// (back-pressure), not an error. Datagrams to unreachable destinations may be
    /// reported as an error for the first datagram only.
    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError>;

    /// Receives up to `max` datagrams that are ready now, lending each to `deliver`
    /// (source address, payload). Returns how many were delivered; 0 when none was
    /// ready.
    fn recv_batch(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(DevAddr, &[u8]),
    ) -> Result<usize, DeviceError>;

    /// Copies `dst.len()` bytes from address `remote_addr` in the memory of the peer
    /// at `peer` into `dst`. Only for devices with `caps().remote_read`.
    fn remote_read(
        &mut self,
        peer: DevAddr,
        remote_addr: u64,
        dst: &mut [u8],
    ) -> Result<usize, DeviceError> {
        let _ = (peer, remote_addr, dst);
        Err(DeviceError::Unsupported)
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
}

/// A boxed device is a device (so decorators such as
/// [`fault::FaultDevice`] can wrap a `Box<dyn Device>`).
impl<D: Device + ?Sized> Device for Box<D> {
    fn caps(&self) -> DeviceCaps {
        (**self).caps()
    }

    fn caps_for(&self, peer: &DevAddr) -> DeviceCaps {
        (**self).caps_for(peer)
    }
    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        (**self).poll_unreachable()
    }
    fn max_mtu(&self) -> usize {
        (**self).max_mtu()
    }
    fn max_transmit(&self) -> usize {
        (**self).max_transmit()
    }

    fn local_addr(&self) -> DevAddr {
        (**self).local_addr()
    }

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        (**self).send_batch(batch)
    }

    fn recv_batch(
        &mut self,
        max: usize,
        deliver: &mut dyn FnMut(DevAddr, &[u8]),
    ) -> Result<usize, DeviceError> {
        (**self).recv_batch(max, deliver)
    }

    fn remote_read(
        &mut self,
        peer: DevAddr,
        remote_addr: u64,
        dst: &mut [u8],
    ) -> Result<usize, DeviceError> {
        (**self).remote_read(peer, remote_addr, dst)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        (**self).wait_fd()
    }

    fn prepare_wait(&mut self) -> bool {
        (**self).prepare_wait()
    }
}
