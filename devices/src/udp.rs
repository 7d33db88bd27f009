//! The UDP device: one non-blocking datagram socket per endpoint, batched with
//! `sendmmsg` / `recvmmsg`. Works on any Linux host, over loopback or a real
//! network, IPv4 and IPv6. Unreliable and unordered: the engine's reliability
//! layer runs on top.
//!
//! Receive lends slices of a preallocated ring of [`RX_BATCH`] slots of 64 KiB (the
//! UDP maximum, so a peer configured with a larger MTU is never silently
//! truncated); nothing is allocated per datagram on either path.
//!
//! Bulk uses the kernel's UDP offloads when it has them ([`UdpConfig::gso`],
//! [`UdpConfig::gro`], [`UdpDevice::offloads`]): a run of equal-size datagrams to
//! one destination leaves as one `UDP_SEGMENT` (GSO) send, and a coalesced
//! `UDP_GRO` receive is split back into the original datagrams, boundaries intact.
//! Datagrams of a coalesced receive beyond a call's `max` wait for the next call;
//! [`Device::prepare_wait`] reports them (the socket is no longer readable).
//!
//! Choosing the local address ([`UdpDevice::open`]): a device address must be
//! something peers can send to, so a *wildcard* bind address (`0.0.0.0` / `::`) is
//! resolved to a concrete one: `node` if given, else the interface `iface`
//! (`FI_RDMX_IFACE`: a name like `eth0` or an IP), else the first usable
//! non-loopback interface by the order documented in [`crate::iface`], else loopback.
//!
//! Unsafe here: `sendmmsg`/`recvmmsg` with their headers and control messages
//! (GSO, GRO, the socket's error queue), and the `CMSG_*` sizes.
#![allow(unsafe_code)]

use nix::sys::socket::{setsockopt, sockopt};
use rdm::device::{DevAddr, Device, DeviceCaps, DeviceError, TxDatagram};
use rdm::Instant;
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};

/// Sleeps between two unconditional reads of the socket's error queue.
const ERRQ_EVERY: u32 = 64;

/// Datagrams moved per `sendmmsg` / `recvmmsg` call.
pub const BATCH: usize = 32;
/// Receive slots in the ring (one `recvmmsg` fills at most this many).
pub const RX_BATCH: usize = BATCH;
/// Bytes per receive slot: the largest UDP payload fits.
const RX_SLOT: usize = 65536;
/// Default MTU for IPv4 (Ethernet 1500 - IPv4 header 20 - UDP header 8).
pub const DEFAULT_MTU: usize = 1472;
/// Default MTU for IPv6 (Ethernet 1500 - IPv6 header 40 - UDP header 8).
pub const DEFAULT_MTU_V6: usize = 1452;
/// Largest payload of one IPv4 UDP datagram (65535 - 20 - 8).
pub const MAX_MTU: usize = 65507;
/// Socket buffer size asked for by default (the kernel may clamp it).
pub const DEFAULT_SOCKET_BUFFER: usize = 8 << 20;
/// Most datagrams one GSO send carries (the kernel's `UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes one GSO send carries (what one IPv4 datagram could hold).
pub const GSO_MAX_BYTES: usize = MAX_MTU;
/// iovecs of one `sendmmsg`: every entry may be a full GSO run.
const TX_IOVS: usize = BATCH * GSO_MAX_SEGMENTS;

/// How to open a [`UdpDevice`].
#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// Address to bind (port 0 = ephemeral). A wildcard IP (`0.0.0.0`, `::`) means
    /// "choose one" (see the module docs); its family is the preferred family.
    pub bind: SocketAddr,
    /// Interface to bind to when `bind` is a wildcard: a name (`eth0`) or an IP.
    pub iface: Option<String>,
    /// Host name or address to bind to (overrides `bind`'s IP and `iface`).
    pub node: Option<String>,
    /// Numeric port to bind to (overrides `bind`'s port).
    pub service: Option<String>,
    /// Largest datagram this endpoint sends; 0 = the default for the bound family
    /// ([`DEFAULT_MTU`] / [`DEFAULT_MTU_V6`]). At most [`MAX_MTU`].
    pub mtu: usize,
    /// Socket buffer sizes to ask for (the kernel may clamp them; as root the limit
    /// is bypassed with `SO_RCVBUFFORCE`).
    pub socket_buffer: usize,
    /// Use UDP segmentation offload (`UDP_SEGMENT`) when the kernel offers it: a
    /// run of equal-size datagrams to one destination in a `send_batch` goes out as
    /// one send. Turned off for good if the kernel refuses it on a send.
    pub gso: bool,
    /// Use UDP receive coalescing (`UDP_GRO`) when the kernel offers it; coalesced
    /// datagrams are split back before they are lent out.
    pub gro: bool,
}

impl Default for UdpConfig {
    /// Wildcard IPv4, ephemeral port, default MTU, offloads where the kernel has
    /// them: binds the host name's address.
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            iface: None,
            node: None,
            service: None,
            mtu: 0,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
            gso: true,
            gro: true,
        }
    }
}

impl UdpConfig {
    /// Binds exactly `bind` (a wildcard IP is still resolved, see [`UdpConfig::bind`]),
    /// with the default MTU of its family.
    pub fn new(bind: SocketAddr) -> Self {
        UdpConfig { bind, mtu: default_mtu(&bind), ..UdpConfig::default() }
    }
}

/// The default MTU for a local address: [`DEFAULT_MTU`] for IPv4, [`DEFAULT_MTU_V6`]
/// for IPv6 (loopback included, so tests behave like a real network).
pub fn default_mtu(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => DEFAULT_MTU,
        SocketAddr::V6(v6) if v6.ip().to_ipv4_mapped().is_some() => DEFAULT_MTU,
        SocketAddr::V6(_) => DEFAULT_MTU_V6,
    }
}

/// A UDP endpoint.
pub struct UdpDevice {
    sock: Socket,
    local: SocketAddr,
    mtu: usize,
    /// GSO in use now (asked for, offered by the kernel, not refused since).
    gso: bool,
    /// `UDP_GRO` enabled on the socket.
    gro: bool,
    /// Receive ring: `RX_BATCH` slots of `RX_SLOT` bytes each, lent to the caller.
    rx: Box<[u8]>,
    /// The `recvmmsg` vector and what the last call received.
    rxs: Box<RxScratch>,
    /// The `sendmmsg` vector.
    txs: Box<TxScratch>,
    /// The kernel reported an asynchronous error: its error queue (`IP_RECVERR`)
    /// holds ICMP reports to read.
    errq_pending: bool,
    /// Destinations the network reported unreachable, not yet polled.
    unreachable: std::collections::VecDeque<DevAddr>,
    /// Sleeps since the error queue was last read (see `prepare_wait`).
    waits_since_errq: u32,
    pub stats: UdpStats,
}

/// Which kernel offloads a [`UdpDevice`] uses (see [`UdpConfig::gso`] / [`UdpConfig::gro`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpOffloads {
    /// Sends coalesce runs of equal-size datagrams with `UDP_SEGMENT`.
    pub gso: bool,
    /// The socket accepts coalesced receives (`UDP_GRO`).
    pub gro: bool,
}

/// Counters of one [`UdpDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpStats {
    /// Datagrams sent (a GSO send counts each datagram it carries).
    pub sent: u64,
    /// Datagrams delivered (a coalesced receive counts each datagram it carried).
    pub received: u64,
    /// Messages dropped on receive because they (or, with GRO, their control data)
    /// did not fit a slot.
    pub truncated: u64,
    /// `send_batch` calls cut short by a full socket buffer (EAGAIN / ENOBUFS).
    pub send_would_block: u64,
    /// Asynchronous errors (ICMP unreachable for an earlier datagram) reported by
    /// the kernel on a later call; the error queue is then read for the
    /// destinations ([`Device::poll_unreachable`]).
    pub async_errors: u64,
    /// ICMP port / host / network unreachable reports read from the error queue.
    pub icmp_unreachable: u64,
    /// Hard send errors returned to the caller.
    pub send_errors: u64,
    /// Sends that carried two or more datagrams with `UDP_SEGMENT`.
    pub gso_sends: u64,
    /// Datagrams carried by those sends.
    pub gso_segments: u64,
    /// Times the kernel refused a GSO send (EIO: no checksum offload on the route's
    /// device; EINVAL: e.g. a segment over the path MTU), turning GSO off.
    pub gso_fallbacks: u64,
    /// Received messages the kernel had coalesced (`UDP_GRO`, two or more datagrams).
    pub gro_messages: u64,
    /// Datagrams carried by those messages.
    pub gro_segments: u64,
}

/// Room for one control message carrying an int (`UDP_GRO`) or a u16
/// (`UDP_SEGMENT`), laid out as `CMSG_FIRSTHDR` / `CMSG_DATA` have it on Linux:
/// the data right after the header (checked below).
#[repr(C)]
#[derive(Clone, Copy)]
struct CmsgBuf {
    hdr: libc::cmsghdr,
    data: [u8; 8],
}

// SAFETY: CMSG_LEN and CMSG_SPACE are pure arithmetic on their argument.
const CMSG_DATA_OFFSET: usize = unsafe { libc::CMSG_LEN(0) } as usize;
// SAFETY: as above.
const CMSG_SEGMENT_LEN: usize = unsafe { libc::CMSG_LEN(size_of::<u16>() as u32) } as usize;
// SAFETY: as above.
const CMSG_SEGMENT_SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
// SAFETY: as above.
const CMSG_GRO_LEN: usize = unsafe { libc::CMSG_LEN(size_of::<libc::c_int>() as u32) } as usize;
// SAFETY: as above.
const CMSG_GRO_SPACE: usize = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
const _: () = assert!(CMSG_DATA_OFFSET == size_of::<libc::cmsghdr>());
const _: () = assert!(CMSG_SEGMENT_SPACE <= size_of::<CmsgBuf>() && CMSG_GRO_SPACE <= size_of::<CmsgBuf>());

/// The `sendmmsg` vector, preallocated: entry `e` sends `dgrams[e]` datagrams of
/// the caller's batch (several = one GSO run, with a `UDP_SEGMENT` control message).
struct TxScratch {
    msgs: [libc::mmsghdr; BATCH],
    addrs: [libc::sockaddr_storage; BATCH],
    cmsgs: [CmsgBuf; BATCH],
    /// Batch elements per entry.
    dgrams: [usize; BATCH],
    /// Datagrams per entry (differs from `dgrams` for an engine-formed run).
    segs: [usize; BATCH],
    iovs: [libc::iovec; TX_IOVS],
}

// SAFETY: the raw pointers inside are scratch: rewritten before every system call
// and never dereferenced otherwise; the struct owns nothing they point to.
unsafe impl Send for TxScratch {}

/// What one received message holds, decoded right after `recvmmsg`.
#[derive(Clone, Copy)]
struct RxMsg {
    /// Sender; `None` = drop this message (truncated, or an unknown address family).
    from: Option<SocketAddr>,
    /// Bytes in the slot.
    len: usize,
    /// Bytes per datagram (the last may be shorter): `len` unless coalesced.
    seg: usize,
}

/// The `recvmmsg` vector, preallocated, and the messages of the last call not yet
/// lent out (a coalesced message may hold more datagrams than `max` allows).
struct RxScratch {
    msgs: [libc::mmsghdr; RX_BATCH],
    addrs: [libc::sockaddr_storage; RX_BATCH],
    iovs: [libc::iovec; RX_BATCH],
    cmsgs: [CmsgBuf; RX_BATCH],
    info: [RxMsg; RX_BATCH],
    /// Messages of the last `recvmmsg`.
    got: usize,
    /// The next message to lend from, and the offset in its slot.
    next: usize,
    off: usize,
}

// SAFETY: as for `TxScratch`.
unsafe impl Send for RxScratch {}

impl TxScratch {
    fn new() -> Box<TxScratch> {
        // SAFETY: all-zero is a valid bit pattern for these plain C structs (null
        // pointers, zero lengths) and for the integers.
        Box::new(unsafe { zeroed() })
    }

    /// Starts entry `e`: its destination, and the UDP_SEGMENT control message
    /// with segment size `seg` (attached only if the entry turns out a run).
    fn open_entry(&mut self, e: usize, dst: &SocketAddr, seg: usize) {
        self.msgs[e].msg_hdr.msg_namelen = to_sockaddr(dst, &mut self.addrs[e]);
        let c = &mut self.cmsgs[e];
        c.hdr.cmsg_len = CMSG_SEGMENT_LEN as _;
        c.hdr.cmsg_level = libc::SOL_UDP;
        c.hdr.cmsg_type = libc::UDP_SEGMENT;
        c.data[..2].copy_from_slice(&(seg as u16).to_ne_bytes());
    }
}

impl RxScratch {
    fn new() -> Box<RxScratch> {
        Box::new(RxScratch {
            // SAFETY: all-zero is a valid bit pattern for these plain C structs.
            msgs: unsafe { zeroed() },
            // SAFETY: as above.
            addrs: unsafe { zeroed() },
            // SAFETY: as above.
            iovs: unsafe { zeroed() },
            // SAFETY: as above.
            cmsgs: unsafe { zeroed() },
            info: [RxMsg { from: None, len: 0, seg: 0 }; RX_BATCH],
            got: 0,
            next: 0,
            off: 0,
        })
    }

    fn pending(&self) -> bool {
        self.next < self.got
    }

    /// Points every entry at its slot of `rx` (`RX_BATCH` slots of `RX_SLOT`
    /// bytes, heap memory that never moves), its address and its control
    /// buffer, once: each `recvmmsg` then only needs the entries the last one
    /// filled set back ([`RxScratch::rearm`]), not the whole vector rebuilt on
    /// every poll of an idle socket.
    fn arm(&mut self, rx: &mut [u8], gro: bool) {
        for (i, chunk) in rx.chunks_mut(RX_SLOT).take(RX_BATCH).enumerate() {
            self.iovs[i] = libc::iovec { iov_base: chunk.as_mut_ptr() as *mut libc::c_void, iov_len: RX_SLOT };
            let hdr = &mut self.msgs[i].msg_hdr;
            hdr.msg_name = &mut self.addrs[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
            hdr.msg_iov = &mut self.iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control =
                if gro { &mut self.cmsgs[i] as *mut CmsgBuf as *mut libc::c_void } else { std::ptr::null_mut() };
        }
        self.rearm(RX_BATCH, gro);
    }

    /// Sets back what `recvmmsg` rewrites in the first `n` entries.
    fn rearm(&mut self, n: usize, gro: bool) {
        let control = if gro { size_of::<CmsgBuf>() } else { 0 };
        for m in &mut self.msgs[..n] {
            m.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            m.msg_hdr.msg_controllen = control as _;
            m.msg_hdr.msg_flags = 0;
            m.msg_len = 0;
        }
    }
}

/// The segment size of a coalesced receive, from its `UDP_GRO` control message.
// The casts are no-ops with glibc, not with musl (socklen_t lengths).
#[allow(clippy::unnecessary_cast)]
fn gro_segment(hdr: &libc::msghdr, c: &CmsgBuf) -> Option<usize> {
    if (hdr.msg_controllen as usize) < CMSG_GRO_LEN
        || c.hdr.cmsg_level != libc::SOL_UDP
        || c.hdr.cmsg_type != libc::UDP_GRO
        || (c.hdr.cmsg_len as usize) < CMSG_GRO_LEN
    {
        return None;
    }
    let v = libc::c_int::from_ne_bytes([c.data[0], c.data[1], c.data[2], c.data[3]]);
    usize::try_from(v).ok().filter(|&s| s > 0)
}

fn to_sockaddr(a: &SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in,
            // and we hold the only reference to `storage`.
            let sin = unsafe { &mut *(storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6,
            // and we hold the only reference to `storage`.
            let sin6 = unsafe { &mut *(storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

/// Reads a source address; IPv4-mapped IPv6 addresses come back as IPv4 so a peer
/// has one canonical [`DevAddr`].
fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const libc::sockaddr_storage as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const libc::sockaddr_storage as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            let port = u16::from_be(sin6.sin6_port);
            if let Some(v4) = ip.to_ipv4_mapped() {
                return Some(SocketAddr::V4(SocketAddrV4::new(v4, port)));
            }
            Some(SocketAddr::V6(SocketAddrV6::new(ip, port, sin6.sin6_flowinfo, sin6.sin6_scope_id)))
        }
        _ => None,
    }
}

/// The destination as the socket's family needs it, or `None` if this socket
/// cannot reach it (IPv6 destination from an IPv4 socket).
fn dst_for(local: &SocketAddr, dst: SocketAddr) -> Option<SocketAddr> {
    match (local, dst) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) | (SocketAddr::V6(_), SocketAddr::V6(_)) => Some(dst),
        (SocketAddr::V6(_), SocketAddr::V4(v4)) => {
            Some(SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)))
        }
        (SocketAddr::V4(_), SocketAddr::V6(v6)) => {
            v6.ip().to_ipv4_mapped().map(|ip| SocketAddr::V4(SocketAddrV4::new(ip, v6.port())))
        }
    }
}

fn config_err(msg: String) -> DeviceError {
    DeviceError::Config(msg)
}

fn scope_for(ip: &Ipv6Addr, iface: Option<&str>) -> u32 {
    if ip.segments()[0] & 0xffc0 != 0xfe80 {
        return 0;
    }
    iface.and_then(|n| nix::net::if_::if_nametoindex(n).ok()).unwrap_or(0)
}

fn with_port(ip: IpAddr, port: u16, iface: Option<&str>) -> SocketAddr {
    match ip {
        IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
        IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope_for(&v6, iface))),
    }
}

/// Resolves the configuration to the concrete address to bind.
pub fn resolve_bind_addr(cfg: &UdpConfig) -> Result<SocketAddr, DeviceError> {
    let mut port = cfg.bind.port();
    if let Some(s) = &cfg.service {
        port = s.parse().map_err(|_| config_err(format!("UDP service {s:?} is not a port number")))?;
    }
    let want_v4 = cfg.bind.is_ipv4();
    if let Some(node) = &cfg.node {
        if let Ok(ip) = node.parse::<IpAddr>() {
            return Ok(with_port(ip, port, cfg.iface.as_deref()));
        }
        let addrs: Vec<SocketAddr> = (node.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| config_err(format!("cannot resolve node {node:?}: {e}")))?
            .collect();
        return addrs
            .iter()
            .find(|a| a.is_ipv4() == want_v4)
            .or_else(|| addrs.first())
            .copied()
            .ok_or_else(|| config_err(format!("node {node:?} resolves to no address")));
    }
    if !cfg.bind.ip().is_unspecified() {
        let mut a = cfg.bind;
        a.set_port(port);
        return Ok(a);
    }
    if let Some(iface) = &cfg.iface {
        if let Ok(ip) = iface.parse::<IpAddr>() {
            return Ok(with_port(ip, port, None));
        }
        let ips = crate::iface::addrs_of(iface, want_v4)?;
        return Ok(with_port(ips[0], port, Some(iface)));
    }
    let choice = crate::iface::default_choice(want_v4);
    Ok(with_port(choice.ip, port, choice.iface.as_deref()))
}

/// Asks the kernel to queue ICMP errors for datagrams we sent on the socket's
/// error queue (and report them on unconnected sockets at all): how a dead or
/// unroutable peer is noticed in milliseconds instead of at the peer timeout.
fn enable_recverr(sock: &Socket, v4: bool) {
    let on: libc::c_int = 1;
    let opts: &[(libc::c_int, libc::c_int)] = if v4 {
        &[(libc::SOL_IP, libc::IP_RECVERR)]
    } else {
        // A v6 socket also carries IPv4-mapped traffic.
        &[(libc::SOL_IPV6, libc::IPV6_RECVERR), (libc::SOL_IP, libc::IP_RECVERR)]
    };
    for &(level, name) in opts {
        // SAFETY: a valid socket fd and a c_int option value of the size given.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                &on as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
}

/// Asks for `size` bytes of socket buffer, past `rmem_max`/`wmem_max` if we may.
fn set_buffers(sock: &Socket, size: usize) {
    let _ = sock.set_recv_buffer_size(size);
    let _ = sock.set_send_buffer_size(size);
    let val = size.min(i32::MAX as usize) as libc::c_int;
    for (opt, cur) in [
        (libc::SO_RCVBUFFORCE, sock.recv_buffer_size().unwrap_or(0)),
        (libc::SO_SNDBUFFORCE, sock.send_buffer_size().unwrap_or(0)),
    ] {
        // The kernel reports twice the value set; only force when it clamped.
        if cur >= size {
            continue;
        }
        // SAFETY: `val` is a live c_int and its size is passed; the fd is open.
        // Failure (EPERM without CAP_NET_ADMIN) is harmless and ignored.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &val as *const libc::c_int as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
}

impl UdpDevice {
    /// Binds `addr` (port 0 = ephemeral) with the default MTU of its family.
    pub fn bind(addr: SocketAddr) -> Result<UdpDevice, DeviceError> {
        UdpDevice::open(&UdpConfig::new(addr))
    }

    /// Opens a device as `cfg` says (see [`UdpConfig`] and the module docs).
    ///
    /// # Errors
    /// [`DeviceError::Config`] for an unknown interface, an unresolvable node, a bad
    /// service or MTU; [`DeviceError::Io`] when the socket cannot be created or bound.
    pub fn open(cfg: &UdpConfig) -> Result<UdpDevice, DeviceError> {
        let bind = resolve_bind_addr(cfg)?;
        let mtu = if cfg.mtu == 0 { default_mtu(&bind) } else { cfg.mtu };
        if mtu > MAX_MTU {
            return Err(config_err(format!("UDP MTU {mtu} exceeds the UDP maximum {MAX_MTU}")));
        }
        let domain = if bind.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::DGRAM.nonblocking().cloexec(), Some(Protocol::UDP))
            .map_err(|e| DeviceError::io("socket", e))?;
        set_buffers(&sock, cfg.socket_buffer);
        sock.bind(&bind.into()).map_err(|e| DeviceError::io("bind", e))?;
        let local = sock
            .local_addr()
            .map_err(|e| DeviceError::io("getsockname", e))?
            .as_socket()
            .ok_or_else(|| config_err("UDP socket has no IP address".into()))?;
        // Setting the socket's default segment size to 0 (no GSO unless a send asks)
        // succeeds exactly when the kernel knows UDP_SEGMENT (4.18+). Whether a
        // route's device can do it shows only on the first GSO send (see send_batch).
        enable_recverr(&sock, bind.is_ipv4());
        let gso = cfg.gso && setsockopt(&sock, sockopt::UdpGsoSegment, &0).is_ok();
        let gro = cfg.gro && setsockopt(&sock, sockopt::UdpGroSegment, &true).is_ok();
        let mut rx = vec![0u8; RX_SLOT * RX_BATCH].into_boxed_slice();
        let mut rxs = RxScratch::new();
        rxs.arm(&mut rx, gro);
        Ok(UdpDevice {
            sock,
            local,
            mtu,
            gso,
            gro,
            rx,
            rxs,
            txs: TxScratch::new(),
            errq_pending: false,
            unreachable: std::collections::VecDeque::new(),
            waits_since_errq: 0,
            stats: UdpStats::default(),
        })
    }

    /// The offloads in use now: those [`UdpConfig`] asked for that the kernel
    /// offers (GSO turns off for good when the kernel refuses a GSO send).
    pub fn offloads(&self) -> UdpOffloads {
        UdpOffloads { gso: self.gso, gro: self.gro }
    }

    /// The bound address (concrete IP, actual port).
    pub fn local_socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// The socket buffer sizes the kernel granted (receive, send).
    pub fn socket_buffers(&self) -> (usize, usize) {
        (self.sock.recv_buffer_size().unwrap_or(0), self.sock.send_buffer_size().unwrap_or(0))
    }

    /// Fills the `sendmmsg` vector from the head of `batch`: up to [`BATCH`] entries,
    /// each one datagram or, with GSO, a run of datagrams to one destination, all
    /// of one length but the last, which may be shorter (at most
    /// [`GSO_MAX_SEGMENTS`] and [`GSO_MAX_BYTES`]). Stops at the first datagram this
    /// device cannot take, returned as the error to report. Returns the entries.
    fn prepare_tx(&mut self, batch: &[TxDatagram<'_>]) -> (usize, Option<DeviceError>) {
        let txs = &mut *self.txs;
        let mut entries = 0;
        // The open entry: its destination, segment size and bytes, and whether a
        // datagram may still join it.
        let mut run_dst: Option<SocketAddr> = None;
        let mut seg = 0;
        let mut bytes = 0;
        let mut open = false;
        let mut bad = None;
        // Datagram `i` of the batch has iovec `i` (i < TX_IOVS: at most BATCH
        // entries of at most GSO_MAX_SEGMENTS datagrams).
        for (i, d) in batch.iter().enumerate() {
            let dst = match d.dst {
                DevAddr::Udp(a) => dst_for(&self.local, a),
                _ => None,
            };
            let Some(dst) = dst else {
                bad = Some(DeviceError::Unreachable(d.dst));
                break;
            };
            let len = d.data.len();
            if d.is_run() {
                // A run the engine formed: one entry of its own, cut by the kernel
                // every `seg` bytes. Without GSO (refused since) it cannot go out
                // whole: report it, and the sender falls back to single datagrams.
                let segments = len.div_ceil(d.seg);
                if !self.gso || d.seg > self.mtu || segments > GSO_MAX_SEGMENTS || len > GSO_MAX_BYTES {
                    bad = Some(if self.gso {
                        DeviceError::TooLarge { len, mtu: self.mtu }
                    } else {
                        DeviceError::Unsupported
                    });
                    break;
                }
                if entries == BATCH {
                    break;
                }
                let e = entries;
                txs.open_entry(e, &dst, d.seg);
                txs.dgrams[e] = 1;
                txs.segs[e] = segments;
                txs.iovs[i] = libc::iovec { iov_base: d.data.as_ptr() as *mut libc::c_void, iov_len: len };
                entries += 1;
                open = false;
                continue;
            }
            if len > self.mtu {
                bad = Some(DeviceError::TooLarge { len, mtu: self.mtu });
                break;
            }
            // Empty datagrams never join a run: a zero-length segment would vanish.
            let joins = open
                && len > 0
                && len <= seg
                && run_dst == Some(dst)
                && txs.dgrams[entries - 1] < GSO_MAX_SEGMENTS
                && bytes + len <= GSO_MAX_BYTES;
            if !joins {
                if entries == BATCH {
                    break;
                }
                let e = entries;
                // The segment size, attached below if a run forms: the kernel cuts
                // the payload (the entry's iovecs, back to back) every `len` bytes.
                txs.open_entry(e, &dst, len);
                txs.dgrams[e] = 0;
                txs.segs[e] = 0;
                entries += 1;
                run_dst = Some(dst);
                seg = len;
                bytes = 0;
                open = self.gso && len > 0;
            }
            let e = entries - 1;
            txs.iovs[i] = libc::iovec { iov_base: d.data.as_ptr() as *mut libc::c_void, iov_len: len };
            txs.dgrams[e] += 1;
            txs.segs[e] += 1;
            bytes += len;
            // A shorter datagram ends its run.
            open &= len == seg;
        }
        // Wire the pointers once everything is written: entry `e` has the next
        // `dgrams[e]` iovecs, and the segment size only if it is a run.
        let iovs = txs.iovs.as_mut_ptr();
        let mut first = 0;
        for e in 0..entries {
            let n = txs.dgrams[e];
            let hdr = &mut txs.msgs[e].msg_hdr;
            hdr.msg_name = &mut txs.addrs[e] as *mut libc::sockaddr_storage as *mut libc::c_void;
            hdr.msg_iov = iovs.wrapping_add(first);
            hdr.msg_iovlen = n as _;
            first += n;
            if txs.segs[e] > 1 {
                hdr.msg_control = &mut txs.cmsgs[e] as *mut CmsgBuf as *mut libc::c_void;
                hdr.msg_controllen = CMSG_SEGMENT_SPACE as _;
            } else {
                hdr.msg_control = std::ptr::null_mut();
                hdr.msg_controllen = 0;
            }
        }
        (entries, bad)
    }

    /// Sends the first `n` entries of the prepared vector; `Ok(None)` = would block.
    fn sendmmsg(&mut self, n: usize) -> Result<Option<usize>, io::Error> {
        // A pending asynchronous error (ICMP for an earlier datagram) fails the call
        // without sending anything and is cleared by being reported: retry a few
        // times so it cannot fail this batch forever.
        let mut async_left = 4;
        let msgs = self.txs.msgs.as_mut_ptr();
        loop {
            // SAFETY: `prepare_tx` pointed each of the first `n <= BATCH` mmsghdrs at
            // its sockaddr, iovecs and control message in `self.txs` (boxed, not
            // moved or otherwise borrowed during the call) and the iovecs at the
            // caller's datagrams, borrowed by `send_batch` for its whole duration.
            let r = unsafe { libc::sendmmsg(self.sock.as_raw_fd(), msgs, n as u32, libc::MSG_DONTWAIT) };
            if r >= 0 {
                // A short count without EAGAIN: usually an ICMP error for an earlier
                // datagram failed the next one, and sendmmsg swallows the error.
                if (r as usize) < n {
                    self.errq_pending = true;
                }
                return Ok(Some(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Ok(None),
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN)
                    if async_left > 0 =>
                {
                    async_left -= 1;
                    self.stats.async_errors += 1;
                    self.errq_pending = true;
                    continue;
                }
                _ => return Err(e),
            }
        }
    }

    /// Reads every report in the socket's error queue (`IP_RECVERR`): each ICMP
    /// port, host or network unreachable names the destination of a datagram we
    /// sent (the error message's address is the original destination), which is
    /// queued for [`Device::poll_unreachable`]. Reading also clears the queue, so
    /// an `EPOLLERR` wake-up does not repeat forever.
    fn read_error_queue(&mut self) {
        loop {
            // SAFETY: plain C structs; all-zero is valid for each.
            let mut name: libc::sockaddr_storage = unsafe { zeroed() };
            let mut payload = [0u8; 64];
            let mut control = [0u64; 64];
            let mut iov = libc::iovec { iov_base: payload.as_mut_ptr() as *mut libc::c_void, iov_len: payload.len() };
            // SAFETY: as above.
            let mut hdr: libc::msghdr = unsafe { zeroed() };
            hdr.msg_name = &mut name as *mut libc::sockaddr_storage as *mut libc::c_void;
            hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut iov;
            hdr.msg_iovlen = 1;
            hdr.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            hdr.msg_controllen = size_of::<[u64; 64]>() as _;
            // SAFETY: `hdr` points at the local name, iovec and control buffers above,
            // all live for the call and of the sizes given.
            let r = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut hdr, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
            if r < 0 {
                if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return;
            }
            // SAFETY: `hdr` was filled by recvmsg; CMSG_FIRSTHDR/NXTHDR stay within
            // msg_control/msg_controllen.
            let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
            while !cmsg.is_null() {
                // SAFETY: non-null cmsg inside the control buffer.
                let c = unsafe { &*cmsg };
                let is_err = (c.cmsg_level == libc::SOL_IP && c.cmsg_type == libc::IP_RECVERR)
                    || (c.cmsg_level == libc::SOL_IPV6 && c.cmsg_type == libc::IPV6_RECVERR);
                if is_err && c.cmsg_len as usize >= size_of::<libc::cmsghdr>() + size_of::<libc::sock_extended_err>() {
                    // SAFETY: the kernel wrote a sock_extended_err as this cmsg's data
                    // (length checked); read unaligned to be safe.
                    let ee =
                        unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(cmsg) as *const libc::sock_extended_err) };
                    let icmp = ee.ee_origin == libc::SO_EE_ORIGIN_ICMP || ee.ee_origin == libc::SO_EE_ORIGIN_ICMP6;
                    let unreachable =
                        matches!(ee.ee_errno as i32, libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH);
                    if icmp && unreachable {
                        if let Some(dst) = from_sockaddr(&name) {
                            self.stats.icmp_unreachable += 1;
                            self.unreachable.push_back(DevAddr::Udp(dst));
                        }
                    }
                }
                // SAFETY: as for CMSG_FIRSTHDR.
                cmsg = unsafe { libc::CMSG_NXTHDR(&hdr, cmsg) };
            }
        }
    }

    /// Counts the datagrams of the first `sent` entries (the ones the kernel took).
    /// Counts the batch elements of the first `sent` entries (the ones the
    /// kernel took), and their datagrams in the statistics.
    fn count_sent(&mut self, sent: usize) -> usize {
        let mut n = 0;
        for e in 0..sent {
            let (d, segs) = (self.txs.dgrams[e], self.txs.segs[e]);
            n += d;
            if segs > 1 {
                self.stats.gso_sends += 1;
                self.stats.gso_segments += segs as u64;
            }
            self.stats.sent += segs as u64;
        }
        n
    }

    /// One `recvmmsg` for up to `want <= RX_BATCH` messages into the ring; decodes
    /// them into `rxs.info` for [`UdpDevice::lend`]. Only called with nothing pending.
    fn recvmmsg(&mut self, want: usize) -> Result<usize, DeviceError> {
        let rxs = &mut *self.rxs;
        let got = loop {
            // SAFETY: each of the first `want <= RX_BATCH` mmsghdrs points at its own
            // iovec (into `self.rx`, a slot of RX_SLOT bytes), sockaddr_storage and
            // control buffer (of the size given) in `self.rxs`, as `arm` set them
            // when the device was opened; all boxed (the heap memory never moves),
            // not otherwise borrowed during the call.
            let r = unsafe {
                libc::recvmmsg(
                    self.sock.as_raw_fd(),
                    rxs.msgs.as_mut_ptr(),
                    want as u32,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                )
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => break 0,
                // ICMP unreachable for something we sent earlier: not a receive
                // failure (the engine's timers handle the peer); the error is
                // cleared by being reported, so try again.
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN) => {
                    self.stats.async_errors += 1;
                    self.errq_pending = true;
                    continue;
                }
                _ => return Err(DeviceError::io("recvmmsg", e)),
            }
        };
        for i in 0..got {
            let hdr = &rxs.msgs[i].msg_hdr;
            let len = rxs.msgs[i].msg_len as usize;
            let mut info = RxMsg { from: None, len, seg: len };
            // A truncated control message could hide a segment size: drop rather
            // than lend several datagrams as one.
            let cut = libc::MSG_TRUNC | if self.gro { libc::MSG_CTRUNC } else { 0 };
            if hdr.msg_flags & cut != 0 || len > RX_SLOT {
                self.stats.truncated += 1;
            } else {
                info.from = from_sockaddr(&rxs.addrs[i]);
                if let Some(seg) = gro_segment(hdr, &rxs.cmsgs[i]).filter(|&s| s < len) {
                    info.seg = seg;
                    self.stats.gro_messages += 1;
                    self.stats.gro_segments += len.div_ceil(seg) as u64;
                }
            }
            rxs.info[i] = info;
        }
        // The kernel rewrote the lengths and flags of the entries it filled
        // (and of no other): set them back for the next call.
        rxs.rearm(got, self.gro);
        rxs.got = got;
        rxs.next = 0;
        rxs.off = 0;
        Ok(got)
    }

    /// Lends up to `max` held datagrams of the last `recvmmsg`, one per segment of
    /// a coalesced message; returns how many.
    fn lend(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> usize {
        let rxs = &mut *self.rxs;
        let mut n = 0;
        while n < max && rxs.next < rxs.got {
            let m = rxs.info[rxs.next];
            let Some(from) = m.from else {
                rxs.next += 1;
                continue;
            };
            let take = m.seg.min(m.len - rxs.off);
            let start = rxs.next * RX_SLOT + rxs.off;
            deliver(DevAddr::Udp(from), &self.rx[start..start + take]);
            n += 1;
            rxs.off += take;
            // `>=` also moves past an empty datagram.
            if rxs.off >= m.len {
                rxs.next += 1;
                rxs.off = 0;
            }
        }
        n
    }
}

impl Device for UdpDevice {
    fn owns(&self, addr: &DevAddr) -> bool {
        matches!(addr, DevAddr::Udp(_))
    }

    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: false,
            ordered: false,
            mtu: self.mtu,
            remote_read: false,
            gso: self.gso,
            registration: false,
            max_inline: 0,
            max_transmit: if self.gso { GSO_MAX_BYTES } else { self.mtu },
        }
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        vec![DevAddr::Udp(self.local)]
    }

    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        // It cannot gather (only RDMA paths form such datagrams).
        let batch = rdm::device::until_gathered(batch)?;
        let mut total = 0;
        while total < batch.len() {
            let (entries, bad) = self.prepare_tx(&batch[total..]);
            if entries == 0 {
                return match bad {
                    Some(e) if total == 0 => Err(e),
                    _ => Ok(total),
                };
            }
            match self.sendmmsg(entries) {
                Ok(Some(sent)) => {
                    // A GSO entry goes out whole or not at all: the datagrams of the
                    // entries sent are exactly the ones taken.
                    total += self.count_sent(sent);
                    if sent < entries || bad.is_some() {
                        return Ok(total);
                    }
                }
                Ok(None) => {
                    self.stats.send_would_block += 1;
                    return Ok(total);
                }
                Err(e) if self.txs.segs[0] > 1 && matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL)) => {
                    // The kernel refused segmentation offload for the first entry
                    // (nothing was sent): send each datagram on its own from now on.
                    self.gso = false;
                    self.stats.gso_fallbacks += 1;
                }
                Err(e) => {
                    self.stats.send_errors += 1;
                    // The failing datagram is the first unsent one: report it only
                    // when it heads the batch.
                    return if total > 0 { Ok(total) } else { Err(DeviceError::io("sendmmsg", e)) };
                }
            }
        }
        Ok(total)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        // What a coalesced message of the last call still holds goes first.
        let mut delivered = self.lend(max, deliver);
        let mut result = Ok(());
        while delivered < max {
            let want = (max - delivered).min(RX_BATCH);
            let got = match self.recvmmsg(want) {
                Ok(got) => got,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            delivered += self.lend(max - delivered, deliver);
            if got < want {
                break;
            }
        }
        self.stats.received += delivered as u64;
        result.map(|()| delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        if self.errq_pending {
            self.errq_pending = false;
            self.read_error_queue();
        }
        self.unreachable.pop_front()
    }

    /// With GRO, `recv_batch` may keep datagrams of a coalesced message for the
    /// next call, and the socket is then no longer readable for them.
    fn prepare_wait(&mut self) -> bool {
        // ICMP reports sit in the error queue until read, and keep the socket
        // signalling EPOLLERR. The send and receive paths notice almost all of
        // them (an asynchronous error or a short send marks the queue); for the
        // rest, read it every ERRQ_EVERY sleeps, so that a sleeper woken by a
        // report nobody noticed spins at most that often — instead of paying a
        // syscall before every sleep on the latency path.
        self.waits_since_errq += 1;
        if self.errq_pending || self.waits_since_errq >= ERRQ_EVERY {
            self.errq_pending = false;
            self.waits_since_errq = 0;
            self.read_error_queue();
        }
        self.rxs.pending() || !self.unreachable.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdm::device::DeviceExt;

    /// A run formed by the sender (one GSO send) arrives as its datagrams, each
    /// intact; a device without GSO refuses a run instead of mangling it.
    #[test]
    fn a_run_leaves_as_its_datagrams() {
        let mut tx = UdpDevice::open(&UdpConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        let mut rx =
            UdpDevice::open(&UdpConfig { gro: false, ..UdpConfig::new("127.0.0.1:0".parse().unwrap()) }).unwrap();
        let dst = rx.local_addr();
        let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        if !tx.offloads().gso {
            eprintln!("kernel without UDP GSO: runs are never formed here");
            return;
        }
        assert_eq!(tx.send_batch(Instant::ZERO, &[TxDatagram::run(dst, &data, 1400)]).unwrap(), 1);
        let mut got: Vec<Vec<u8>> = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while got.len() < 4 && std::time::Instant::now() < deadline {
            rx.recv_batch(16, &mut |_, d| got.push(d.to_vec())).unwrap();
        }
        let want: Vec<Vec<u8>> = data.chunks(1400).map(|c| c.to_vec()).collect();
        assert_eq!(got, want);
        assert_eq!(tx.stats.gso_sends, 1);
        tx.gso = false;
        assert!(matches!(
            tx.send_batch(Instant::ZERO, &[TxDatagram::run(dst, &data, 1400)]),
            Err(DeviceError::Unsupported)
        ));
    }

    /// A datagram to a port nobody listens on draws an ICMP port unreachable;
    /// the device reads it from the error queue and names the destination.
    #[test]
    fn icmp_port_unreachable_names_the_destination() {
        let mut dev = UdpDevice::open(&UdpConfig::new("127.0.0.1:0".parse().unwrap())).unwrap();
        let closed = {
            let probe = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap()
        };
        let live = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let data = [7u8; 32];
        let batch = [
            TxDatagram::new(DevAddr::Udp(closed), &data),
            TxDatagram::new(DevAddr::Udp(live.local_addr().unwrap()), &data),
        ];
        let mut sent = 0;
        while sent < batch.len() {
            sent += dev.send_batch(Instant::ZERO, &batch[sent..]).unwrap_or(1);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        let mut found = Vec::new();
        while found.is_empty() && std::time::Instant::now() < deadline {
            let _ = dev.recv_batch(8, &mut |_, _| {});
            while let Some(a) = dev.poll_unreachable() {
                found.push(a);
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(found, [DevAddr::Udp(closed)], "stats {:?}", dev.stats);
        assert_eq!(dev.stats.icmp_unreachable, 1);
        // The queue is drained: nothing more, and the live peer was never named.
        assert_eq!(dev.poll_unreachable(), None);
    }

    #[test]
    fn wildcard_resolves_to_concrete_address() {
        let a = resolve_bind_addr(&UdpConfig::default()).unwrap();
        assert!(!a.ip().is_unspecified());
        let mut cfg = UdpConfig { iface: Some("lo".into()), ..UdpConfig::default() };
        assert_eq!(resolve_bind_addr(&cfg).unwrap().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        cfg.iface = Some("127.0.0.1".into());
        cfg.service = Some("0".into());
        assert_eq!(resolve_bind_addr(&cfg).unwrap().ip(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        cfg.iface = Some("no-such-if0".into());
        assert!(matches!(resolve_bind_addr(&cfg), Err(DeviceError::Config(_))));
    }

    #[test]
    fn mapped_addresses_are_canonical() {
        let v4: SocketAddr = "10.1.2.3:77".parse().unwrap();
        let v6 = dst_for(&"[::]:0".parse().unwrap(), v4).unwrap();
        let mut st: libc::sockaddr_storage = unsafe_zeroed_storage();
        to_sockaddr(&v6, &mut st);
        assert_eq!(from_sockaddr(&st), Some(v4));
        assert_eq!(dst_for(&"0.0.0.0:0".parse().unwrap(), v6), Some(v4));
        assert_eq!(dst_for(&"0.0.0.0:0".parse().unwrap(), "[::1]:5".parse().unwrap()), None);
    }

    fn unsafe_zeroed_storage() -> libc::sockaddr_storage {
        // SAFETY: all-zero is a valid sockaddr_storage.
        unsafe { zeroed() }
    }
}
