//! The `auto` device (`FI_RDMX_DEVICE=auto`): shared memory to peers on this host,
//! a network device (UDP by default) to the rest, behind one [`Device`].
//!
//! * Each datagram is routed by its address: [`DevAddr::Shm`] to the shm device,
//!   anything else to the network device. The provider decides which address of a
//!   peer to use (its shm address when the peer's host id equals ours).
//! * `recv_batch` drains both, alternating which goes first; after an empty
//!   network poll it skips the network half for a few calls (a socket poll is
//!   a system call; the shm ring is a memory read).
//! * `caps()` is the conservative combination (reliable / ordered only when there
//!   is no network half; `remote_read` false); the caps of the device that
//!   carries a given address are [`Device::caps_for`].
//! * `local_addr()` is the network address when there is one (what remote peers
//!   need); [`AutoDevice::shm_addr`] gives the other.
//! * `wait_fd()`: with two fds, an epoll fd watching both (level-triggered, so it
//!   is readable while either is).
//!
//! Unsafe here: borrowing the halves' fds to add them to that epoll fd.
#![allow(unsafe_code)]

use crate::shm::ShmDevice;
use crate::udp::UdpDevice;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use rdm::device::{
    ControlMsg, Dest, DevAddr, Device, DeviceCaps, DeviceError, DeviceExt, ReadConnStats, ReadDone, ReadRun,
    RemoteReads, ShmAddr, TxDatagram,
};
use rdm::Instant;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// Shared memory plus a network device `N` (UDP by default; `dyn Device` in
/// the provider, boxed: no forwarding impl stands between).
pub struct AutoDevice<N: Device + ?Sized = UdpDevice> {
    shm: Option<ShmDevice>,
    net: Option<Box<N>>,
    /// Watches both wait fds when both exist (the kernel drops an fd from the set
    /// when it is closed, so drop order does not matter).
    epoll: Option<Epoll>,
    shm_first: bool,
    /// Network polls still to skip (see `recv_batch`).
    net_skip: u32,
    /// The skip after the next empty network poll (grows while polls are
    /// empty, back to the start on input).
    net_backoff: u32,
    /// Whether the shm half has carried a datagram either way: until it has,
    /// nothing on-host waits behind a network poll, so none is skipped.
    shm_heard: bool,
    /// Whether the network half has: until it has, the skip may grow to
    /// [`NET_SKIP_IDLE_MAX`] (no off-host peer has spoken yet).
    net_heard: bool,
    /// The network half sent since its unreachable reports were last drained
    /// (a send can produce one): no round is quiet until they are.
    net_sent: bool,
}

/// After a network poll that found nothing, this many `recv_batch` calls leave
/// the network half alone: polling it is a system call (`recvmmsg`), ten times
/// the cost of looking at the shm ring, and would otherwise set the latency of
/// on-host traffic. Each further empty poll in a row doubles the skip, up to
/// [`NET_SKIP_MAX`] once off-host peers have spoken (the socket is polled once
/// per 64 calls), up to [`NET_SKIP_IDLE_MAX`] while only on-host peers have
/// (once per 1024: at 64 the default device's 8-byte shm round trip cost 0.81
/// against `-d shm`'s 0.65 us in the harness run of 3bc7437). Nothing is
/// skipped before the shm half carries anything: a job with no on-host traffic
/// polls the socket every time, as `-d udp` does. Off-host datagrams wait at
/// most the skip's count of (cheap) calls while the application polls, and
/// none when it sleeps (`prepare_wait`).
const NET_SKIP_AFTER_EMPTY: u32 = 7;
const NET_SKIP_MAX: u32 = 63;
const NET_SKIP_IDLE_MAX: u32 = 1023;

impl<N: Device + ?Sized> AutoDevice<N> {
    /// Combines the two halves; at least one must be present.
    ///
    /// # Errors
    /// [`DeviceError::Config`] when both are `None`; [`DeviceError::Io`] when the
    /// epoll fd cannot be created.
    pub fn new(shm: Option<ShmDevice>, net: Option<Box<N>>) -> Result<AutoDevice<N>, DeviceError> {
        if shm.is_none() && net.is_none() {
            return Err(DeviceError::Config("auto device needs a shared-memory or a network device".into()));
        }
        let fds: Vec<RawFd> =
            shm.iter().filter_map(|d| d.wait_fd()).chain(net.iter().filter_map(|d| d.wait_fd())).collect();
        let epoll = epoll_over(&fds)?;
        Ok(AutoDevice {
            shm,
            net,
            epoll,
            shm_first: false,
            net_skip: 0,
            net_backoff: NET_SKIP_AFTER_EMPTY,
            shm_heard: false,
            net_heard: false,
            net_sent: false,
        })
    }

    pub fn shm(&self) -> Option<&ShmDevice> {
        self.shm.as_ref()
    }

    pub fn shm_mut(&mut self) -> Option<&mut ShmDevice> {
        self.shm.as_mut()
    }

    pub fn net(&self) -> Option<&N> {
        self.net.as_deref()
    }

    pub fn net_mut(&mut self) -> Option<&mut N> {
        self.net.as_deref_mut()
    }

    /// The shared-memory address, if this device has a shm half.
    pub fn shm_addr(&self) -> Option<ShmAddr> {
        self.shm.as_ref().map(|s| s.shm_addr())
    }

    /// The network address, if this device has a network half.
    pub fn net_addr(&self) -> Option<DevAddr> {
        self.net.as_ref().map(|n| n.local_addr())
    }

    /// Which half carries `addr` (true = shm).
    fn is_shm(addr: &DevAddr) -> bool {
        matches!(addr, DevAddr::Shm(_))
    }

    /// Sends `run` (all to the same half) through that half.
    fn send_run(&mut self, now: Instant, shm: bool, run: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        match (shm, &mut self.shm, &mut self.net) {
            (true, Some(s), _) => {
                self.shm_heard = true;
                s.send_batch(now, run)
            }
            (false, _, Some(n)) => {
                self.net_heard = true;
                self.net_sent = true;
                n.send_batch(now, run)
            }
            _ => Err(DeviceError::Unreachable(run[0].dst)),
        }
    }
}

impl AutoDevice<UdpDevice> {
    /// Opens the shm half (if `shm` is `Some`; a failure to open it leaves the
    /// device network-only, see [`AutoDevice::shm`]) and the UDP half.
    pub fn open(
        shm: Option<&crate::shm::ShmConfig>,
        udp: &crate::udp::UdpConfig,
    ) -> Result<AutoDevice<UdpDevice>, DeviceError> {
        let shm = shm.and_then(|c| ShmDevice::open(c).ok());
        AutoDevice::new(shm, Some(Box::new(UdpDevice::open(udp)?)))
    }
}

impl<N: Device + ?Sized> Device for AutoDevice<N> {
    fn caps(&self) -> DeviceCaps {
        match (&self.shm, &self.net) {
            (Some(s), None) => s.caps(),
            (None, Some(n)) => n.caps(),
            (Some(s), Some(n)) => {
                let (s, n) = (s.caps(), n.caps());
                DeviceCaps {
                    reliable: false,
                    ordered: false,
                    mtu: s.mtu.min(n.mtu),
                    remote_read: false,
                    gso: false,
                    // Per path (`caps_for`): shm needs none, the network half says.
                    registration: false,
                    max_inline: s.max_inline.min(n.max_inline),
                    // A transmit buffer holds either half's largest.
                    max_transmit: s.max_transmit.max(n.max_transmit),
                }
            }
            (None, None) => DeviceCaps::datagram(0),
        }
    }

    fn send_batch(&mut self, now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        send_in_runs(self, batch, |_, a| Self::is_shm(a), |d, shm, run| d.send_run(now, shm, run))
    }

    /// A same-host peer resolves through the shm half; the network half
    /// offers no such writes (its devices resolve nothing yet).
    fn resolve(&mut self, dst: &DevAddr) -> Result<Option<Dest>, DeviceError> {
        match &mut self.shm {
            Some(s) if Self::is_shm(dst) => s.resolve(dst),
            _ => Ok(None),
        }
    }

    fn write(&mut self, now: Instant, dest: Dest, parts: &[&[u8]]) -> Result<bool, DeviceError> {
        match &mut self.shm {
            Some(s) => {
                self.shm_heard = true;
                s.write(now, dest, parts)
            }
            None => Ok(false),
        }
    }

    fn held_back(&mut self, dst: &DevAddr) -> bool {
        match &mut self.shm {
            Some(s) if Self::is_shm(dst) => s.held_back(dst),
            _ => false,
        }
    }

    fn hold_back_senders(&mut self, hold: bool) {
        if let Some(s) = &mut self.shm {
            s.hold_back_senders(hold);
        }
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        self.shm_first = !self.shm_first;
        let mut n = 0;
        for turn in 0..2 {
            if n >= max {
                break;
            }
            let shm_turn = (turn == 0) == self.shm_first;
            n += if shm_turn {
                match &mut self.shm {
                    Some(s) => {
                        let got = s.recv_batch(max - n, deliver)?;
                        self.shm_heard |= got > 0;
                        got
                    }
                    None => 0,
                }
            } else {
                match &mut self.net {
                    Some(_) if self.net_skip > 0 => {
                        self.net_skip -= 1;
                        0
                    }
                    Some(d) => {
                        let got = d.recv_batch(max - n, deliver)?;
                        if got == 0 && self.shm_heard {
                            self.net_skip = self.net_backoff;
                            let max_skip = if self.net_heard { NET_SKIP_MAX } else { NET_SKIP_IDLE_MAX };
                            self.net_backoff = (self.net_backoff * 2 + 1).min(max_skip);
                        } else if got > 0 {
                            self.net_heard = true;
                            self.net_backoff = NET_SKIP_AFTER_EMPTY;
                        }
                        got
                    }
                    None => 0,
                }
            };
        }
        Ok(n)
    }

    /// The caps of the device that carries datagrams to `addr`; for an address
    /// no half can reach, the conservative [`Device::caps`].
    fn caps_for(&self, addr: &DevAddr) -> DeviceCaps {
        // The half's caps for this very address: a network half that is
        // itself two devices (`NetPair`: UD and UDP) answers per address too.
        match (Self::is_shm(addr), &self.shm, &self.net) {
            (true, Some(s), _) => s.caps_for(addr),
            (false, _, Some(n)) => n.caps_for(addr),
            _ => self.caps(),
        }
    }

    /// The network half's buffers (registered memory when it has a verbs
    /// half, which then sends them without a bounce copy; plain memory to
    /// the others).
    fn transmit_buffers(&mut self, count: usize, len: usize) -> Vec<Box<[u8]>> {
        match &mut self.net {
            Some(n) => n.transmit_buffers(count, len),
            None => (0..count).map(|_| vec![0u8; len].into_boxed_slice()).collect(),
        }
    }

    /// The network half's first (the address peers use: every rdmx endpoint
    /// reaches UDP), then the shm half's.
    fn local_addrs(&self) -> Vec<DevAddr> {
        self.net.iter().flat_map(|n| n.local_addrs()).chain(self.shm.iter().flat_map(|s| s.local_addrs())).collect()
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        match (Self::is_shm(addr), &self.shm, &self.net) {
            (true, Some(s), _) => s.owns(addr),
            (false, _, Some(n)) => n.owns(addr),
            _ => false,
        }
    }

    fn wait_fd(&self) -> Option<RawFd> {
        if let Some(ep) = &self.epoll {
            return Some(ep.0.as_raw_fd());
        }
        self.shm.as_ref().and_then(|s| s.wait_fd()).or_else(|| self.net.as_ref().and_then(|n| n.wait_fd()))
    }

    fn prepare_wait(&mut self) -> bool {
        // A sleeper's next receive must look at the socket (the epoll fd would
        // otherwise report network input that recv_batch then skips).
        self.net_skip = 0;
        self.net_backoff = NET_SKIP_AFTER_EMPTY;
        // Both halves, always: each must be armed before the caller sleeps.
        let shm = self.shm.as_mut().is_some_and(|s| s.prepare_wait());
        let net = self.net.as_mut().is_some_and(|n| n.prepare_wait());
        shm || net
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        let found = self
            .shm
            .as_mut()
            .and_then(|s| s.poll_unreachable())
            .or_else(|| self.net.as_mut().and_then(|n| n.poll_unreachable()));
        if found.is_none() {
            self.net_sent = false;
        }
        found
    }

    /// Quiet when the shm half is and the network half's turn is being
    /// skipped anyway (`recv_batch`'s schedule; the skipped turn is taken
    /// here) with nothing it sent left to report.
    fn quiet(&mut self) -> bool {
        let net_skipped = match &self.net {
            None => true,
            Some(_) => self.net_skip > 0 && !self.net_sent,
        };
        if !net_skipped || !self.shm.as_mut().is_none_or(|s| s.quiet()) {
            return false;
        }
        if self.net.is_some() {
            self.net_skip -= 1;
        }
        true
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }

    /// The shm half's: the network half has none (its socket needs a system
    /// call), its polls are scheduled by the skip instead (`quiet_rounds`).
    fn input_probe(&self) -> Option<std::sync::Arc<dyn rdm::device::InputProbe>> {
        self.shm.as_ref()?.input_probe()
    }

    /// The rounds both halves allow: the shm half's schedule, and with a
    /// network half the polls of it still to skip (none while its
    /// unreachable reports wait, as for `quiet`).
    fn quiet_rounds(&self) -> u32 {
        let Some(shm) = &self.shm else { return 0 };
        match &self.net {
            None => shm.quiet_rounds(),
            Some(_) if self.net_sent => 0,
            Some(_) => shm.quiet_rounds().min(self.net_skip),
        }
    }

    fn rounds_skipped(&mut self, n: u32) {
        if self.net.is_some() {
            self.net_skip = self.net_skip.saturating_sub(n);
        }
        if let Some(shm) = &mut self.shm {
            shm.rounds_skipped(n);
        }
    }
}

/// Reads go to the half that reaches the peer: shm for peers on this host,
/// the network device for the rest; a half that cannot read answers
/// `Unsupported` (the sender then pushes).
impl<N: Device + ?Sized> TwoHalves for AutoDevice<N> {
    fn first_carries(&self, peer: &DevAddr) -> Option<bool> {
        if Self::is_shm(peer) {
            self.shm.is_some().then_some(true)
        } else {
            self.net.is_some().then_some(false)
        }
    }

    fn half_reads(&mut self, first: bool) -> Option<&mut dyn RemoteReads> {
        if first {
            self.shm.as_mut().and_then(|s| s.remote_reads())
        } else {
            self.net.as_mut().and_then(|n| n.remote_reads())
        }
    }
}

impl<N: Device + ?Sized> RemoteReads for AutoDevice<N> {
    fn post_read(
        &mut self,
        now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        routed::post_read(self, now, id, peer, runs)
    }
    fn poll_read(&mut self, now: rdm::time::Instant) -> Option<ReadDone> {
        routed::poll_read(self, now)
    }
    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        routed::poll_control(self)
    }
    fn handle_control(&mut self, now: rdm::time::Instant, from: DevAddr, bytes: &[u8]) {
        routed::handle_control(self, now, from, bytes)
    }
    fn peer_failed(&mut self, peer: DevAddr) {
        routed::peer_failed(self, peer)
    }
    fn read_conn_stats(&mut self) -> ReadConnStats {
        routed::read_conn_stats(self)
    }
}

/// Two network devices behind one: `preferred` (verbs UD) carries the
/// datagrams of every address it owns ([`Device::owns`]), `fallback` (UDP)
/// the rest. The network half of `auto` on a host with an RDMA device: peers
/// whose address carries a queue pair this device reaches go over UD, the
/// others over UDP, and an endpoint answers on both.
///
/// * `recv_batch` polls both, alternating which goes first (a CQ poll and a
///   `recvmmsg`; `AutoDevice` already paces the network half as a whole).
/// * `caps()` is the conservative combination; [`Device::caps_for`] answers
///   for the half that carries an address.
/// * `local_addrs()` lists the fallback's first (UDP, which every rdmx
///   endpoint reaches), then the preferred half's.
/// * `wait_fd()`: an epoll fd over both halves' fds.
pub struct NetPair<A: Device + ?Sized, B: Device + ?Sized> {
    preferred: Box<A>,
    fallback: Box<B>,
    epoll: Option<Epoll>,
    preferred_first: bool,
}

/// A device of two halves as remote reads see it: which half carries a peer,
/// and each half's remote reads (if it offers them). Both composites route
/// remote reads through it, with the functions of [`routed`].
trait TwoHalves {
    /// Whether the first half carries `peer` (`None`: neither half does).
    fn first_carries(&self, peer: &DevAddr) -> Option<bool>;
    fn half_reads(&mut self, first: bool) -> Option<&mut dyn RemoteReads>;
}

/// [`RemoteReads`] of a [`TwoHalves`] device: a peer's reads, control bytes
/// and failure go to the half that carries it; completions and control
/// bytes to send are taken from the first half, then the second.
mod routed {
    use super::TwoHalves;
    use rdm::device::{ControlMsg, DevAddr, DeviceError, ReadConnStats, ReadDone, ReadRun};
    use rdm::time::Instant;

    pub(super) fn post_read(
        d: &mut impl TwoHalves,
        now: Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        let Some(first) = d.first_carries(&peer) else { return Err(DeviceError::Unreachable(peer)) };
        d.half_reads(first).map_or(Err(DeviceError::Unsupported), |r| r.post_read(now, id, peer, runs))
    }

    pub(super) fn poll_read(d: &mut impl TwoHalves, now: Instant) -> Option<ReadDone> {
        let done = d.half_reads(true).and_then(|r| r.poll_read(now));
        done.or_else(|| d.half_reads(false).and_then(|r| r.poll_read(now)))
    }

    pub(super) fn poll_control(d: &mut impl TwoHalves) -> Option<(DevAddr, ControlMsg)> {
        let m = d.half_reads(true).and_then(|r| r.poll_control());
        m.or_else(|| d.half_reads(false).and_then(|r| r.poll_control()))
    }

    pub(super) fn handle_control(d: &mut impl TwoHalves, now: Instant, from: DevAddr, bytes: &[u8]) {
        if let Some(r) = d.first_carries(&from).and_then(|first| d.half_reads(first)) {
            r.handle_control(now, from, bytes);
        }
    }

    pub(super) fn peer_failed(d: &mut impl TwoHalves, peer: DevAddr) {
        if let Some(r) = d.first_carries(&peer).and_then(|first| d.half_reads(first)) {
            r.peer_failed(peer);
        }
    }

    /// The half whose connections did something (only one half reads
    /// through connections: verbs RC), else zeros.
    pub(super) fn read_conn_stats(d: &mut impl TwoHalves) -> ReadConnStats {
        let mut stats = |first| d.half_reads(first).map(|r| r.read_conn_stats()).unwrap_or_default();
        let (a, b) = (stats(true), stats(false));
        [a, b].into_iter().find(|s| *s != ReadConnStats::default()).unwrap_or_default()
    }
}

/// Sends `batch` through a device of two halves: each run of consecutive
/// datagrams for the same half (`first`: the first half carries this
/// address) in one `send` call, in order. Stops at a short count; an error
/// is returned only when nothing was sent (the caller retries the rest).
fn send_in_runs<D>(
    dev: &mut D,
    batch: &[TxDatagram<'_>],
    first: impl Fn(&D, &DevAddr) -> bool,
    mut send: impl FnMut(&mut D, bool, &[TxDatagram<'_>]) -> Result<usize, DeviceError>,
) -> Result<usize, DeviceError> {
    let mut done = 0;
    while done < batch.len() {
        let half = first(dev, &batch[done].dst);
        let run_len = batch[done..].iter().take_while(|d| first(dev, &d.dst) == half).count();
        match send(dev, half, &batch[done..done + run_len]) {
            Ok(k) => {
                done += k;
                if k < run_len {
                    break;
                }
            }
            Err(e) if done == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(done)
}

/// One epoll fd watching `fds` (level-triggered: readable while any is), or
/// `None` when there are fewer than two (the one fd is then waited on itself).
fn epoll_over(fds: &[RawFd]) -> Result<Option<Epoll>, DeviceError> {
    if fds.len() < 2 {
        return Ok(None);
    }
    let ep = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| DeviceError::io("epoll_create", e.into()))?;
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: the fd belongs to a device owned by the value being built,
        // and is open for this call; epoll keeps no borrow of it.
        let bfd = unsafe { BorrowedFd::borrow_raw(*fd) };
        ep.add(bfd, EpollEvent::new(EpollFlags::EPOLLIN, i as u64))
            .map_err(|e| DeviceError::io("epoll_ctl", e.into()))?;
    }
    Ok(Some(ep))
}

impl<A: Device + ?Sized, B: Device + ?Sized> NetPair<A, B> {
    /// # Errors
    /// [`DeviceError::Io`] when the epoll fd cannot be created.
    pub fn new(preferred: Box<A>, fallback: Box<B>) -> Result<NetPair<A, B>, DeviceError> {
        let fds: Vec<RawFd> = preferred.wait_fd().into_iter().chain(fallback.wait_fd()).collect();
        let epoll = epoll_over(&fds)?;
        Ok(NetPair { preferred, fallback, epoll, preferred_first: false })
    }

    pub fn preferred(&self) -> &A {
        &self.preferred
    }

    pub fn fallback(&self) -> &B {
        &self.fallback
    }

    fn send_run(&mut self, now: Instant, preferred: bool, run: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        if preferred {
            self.preferred.send_batch(now, run)
        } else {
            self.fallback.send_batch(now, run)
        }
    }
}

impl<A: Device + ?Sized, B: Device + ?Sized> Device for NetPair<A, B> {
    fn caps(&self) -> DeviceCaps {
        let (a, b) = (self.preferred.caps(), self.fallback.caps());
        DeviceCaps {
            reliable: a.reliable && b.reliable,
            ordered: a.ordered && b.ordered,
            mtu: a.mtu.min(b.mtu),
            remote_read: a.remote_read && b.remote_read,
            gso: false,
            // Per path (`caps_for`), as in `AutoDevice`.
            registration: false,
            max_inline: a.max_inline.min(b.max_inline),
            max_transmit: a.max_transmit.max(b.max_transmit),
        }
    }

    fn caps_for(&self, addr: &DevAddr) -> DeviceCaps {
        if self.preferred.owns(addr) {
            self.preferred.caps_for(addr)
        } else {
            self.fallback.caps_for(addr)
        }
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        let mut v = self.fallback.local_addrs();
        v.extend(self.preferred.local_addrs());
        v
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        self.preferred.owns(addr) || self.fallback.owns(addr)
    }

    fn send_batch(&mut self, now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        send_in_runs(self, batch, |d, a| d.preferred.owns(a), |d, preferred, run| d.send_run(now, preferred, run))
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        self.preferred_first = !self.preferred_first;
        let mut n = 0;
        for turn in 0..2 {
            if n >= max {
                break;
            }
            n += if (turn == 0) == self.preferred_first {
                self.preferred.recv_batch(max - n, deliver)?
            } else {
                self.fallback.recv_batch(max - n, deliver)?
            };
        }
        Ok(n)
    }

    /// The preferred device's (registered memory on verbs, so its sends need
    /// no bounce copy; the fallback sends from any memory).
    fn transmit_buffers(&mut self, count: usize, len: usize) -> Vec<Box<[u8]>> {
        self.preferred.transmit_buffers(count, len)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        if let Some(ep) = &self.epoll {
            return Some(ep.0.as_raw_fd());
        }
        self.preferred.wait_fd().or_else(|| self.fallback.wait_fd())
    }

    fn prepare_wait(&mut self) -> bool {
        // Both, always: each must be armed before the caller sleeps.
        let a = self.preferred.prepare_wait();
        let b = self.fallback.prepare_wait();
        a || b
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.preferred.poll_unreachable().or_else(|| self.fallback.poll_unreachable())
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }
}

/// Reads go to the half that owns the peer's address.
impl<A: Device + ?Sized, B: Device + ?Sized> TwoHalves for NetPair<A, B> {
    fn first_carries(&self, peer: &DevAddr) -> Option<bool> {
        Some(self.preferred.owns(peer))
    }

    fn half_reads(&mut self, first: bool) -> Option<&mut dyn RemoteReads> {
        if first {
            self.preferred.remote_reads()
        } else {
            self.fallback.remote_reads()
        }
    }
}

impl<A: Device + ?Sized, B: Device + ?Sized> RemoteReads for NetPair<A, B> {
    fn post_read(
        &mut self,
        now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        routed::post_read(self, now, id, peer, runs)
    }
    fn poll_read(&mut self, now: rdm::time::Instant) -> Option<ReadDone> {
        routed::poll_read(self, now)
    }
    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        routed::poll_control(self)
    }
    fn handle_control(&mut self, now: rdm::time::Instant, from: DevAddr, bytes: &[u8]) {
        routed::handle_control(self, now, from, bytes)
    }
    fn peer_failed(&mut self, peer: DevAddr) {
        routed::peer_failed(self, peer)
    }
    fn read_conn_stats(&mut self) -> ReadConnStats {
        routed::read_conn_stats(self)
    }
}
