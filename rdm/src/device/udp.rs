//! The UDP device: one non-blocking datagram socket per endpoint, batched with
//! `sendmmsg` / `recvmmsg`. Works on any Linux host, over loopback or a real
//! network, IPv4 and IPv6. Unreliable and unordered: the engine's reliability
//! layer runs on top.
//!
//! Receive lends slices of a preallocated ring of [`RX_BATCH`] slots of 64 KiB (the
//! UDP maximum, so a peer configured with a larger MTU is never silently
//! truncated); nothing is allocated per datagram on either path.
//!
//! Choosing the local address ([`UdpDevice::open`]): a device address must be
//! something peers can send to, so a *wildcard* bind address (`0.0.0.0` / `::`) is
//! resolved to a concrete one: `node` if given, else the interface `iface`
//! (`FI_RDMX_IFACE`: a name like `eth0` or an IP), else the address the host name
//! resolves to, else loopback.
#![allow(unsafe_code)]

use super::{DevAddr, Device, DeviceCaps, DeviceError, TxDatagram};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};

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
}

impl Default for UdpConfig {
    /// Wildcard IPv4, ephemeral port, default MTU: binds the host name's address.
    fn default() -> Self {
        UdpConfig {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            iface: None,
            node: None,
            service: None,
            mtu: 0,
            socket_buffer: DEFAULT_SOCKET_BUFFER,
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
    /// Receive ring: `RX_BATCH` slots of `RX_SLOT` bytes each, lent to the caller.
    rx: Box<[u8]>,
    pub stats: UdpStats,
}

/// Counters of one [`UdpDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpStats {
    pub sent: u64,
    pub received: u64,
    /// Datagrams dropped on receive because they did not fit a slot.
    pub truncated: u64,
    /// `send_batch` calls cut short by a full socket buffer (EAGAIN / ENOBUFS).
    pub send_would_block: u64,
    /// Asynchronous errors (ICMP unreachable for an earlier datagram) reported by
    /// the kernel on a later call, and otherwise ignored.
    pub async_errors: u64,
    /// Hard send errors returned to the caller.
    pub send_errors: u64,
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

/// The addresses of interface `name`, IPv4 first if `want_v4`, else IPv6 first;
/// global addresses before link-local ones.
fn iface_addrs(name: &str, want_v4: bool) -> Result<Vec<IpAddr>, DeviceError> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let mut v6_ll = Vec::new();
    let mut found = false;
    let ifs = nix::ifaddrs::getifaddrs().map_err(|e| DeviceError::io("getifaddrs", e.into()))?;
    for ifa in ifs {
        if ifa.interface_name != name {
            continue;
        }
        found = true;
        let Some(addr) = ifa.address else { continue };
        if let Some(sin) = addr.as_sockaddr_in() {
            v4.push(IpAddr::V4(sin.ip()));
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            let ip = sin6.ip();
            // Link-local addresses need a scope; the caller recovers it by name.
            if ip.segments()[0] & 0xffc0 == 0xfe80 {
                v6_ll.push(IpAddr::V6(ip));
            } else {
                v6.push(IpAddr::V6(ip));
            }
        }
    }
    if !found {
        return Err(config_err(format!("FI_RDMX_IFACE: no network interface named {name:?}")));
    }
    v6.extend(v6_ll);
    let all = if want_v4 { [v4, v6].concat() } else { [v6, v4].concat() };
    if all.is_empty() {
        return Err(config_err(format!("FI_RDMX_IFACE: interface {name:?} has no IP address")));
    }
    Ok(all)
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

/// The address the host name resolves to, in the preferred family if possible;
/// loopback if it resolves to nothing.
fn hostname_addr(want_v4: bool, port: u16) -> SocketAddr {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()).filter(|h| !h.is_empty());
    if let Some(h) = host {
        if let Ok(addrs) = (h.as_str(), port).to_socket_addrs() {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if let Some(a) = addrs.iter().find(|a| a.is_ipv4() == want_v4).or_else(|| addrs.first()) {
                return *a;
            }
        }
    }
    if want_v4 {
        SocketAddr::from((Ipv4Addr::LOCALHOST, port))
    } else {
        SocketAddr::from((Ipv6Addr::LOCALHOST, port))
    }
}

/// Resolves the configuration to the concrete address to bind.
pub fn resolve_bind_addr(cfg: &UdpConfig) -> Result<SocketAddr, DeviceError> {
    let mut port = cfg.bind.port();
    if let Some(s) = &cfg.service {
        port = s
            .parse()
            .map_err(|_| config_err(format!("UDP service {s:?} is not a port number")))?;
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
        let ips = iface_addrs(iface, want_v4)?;
        return Ok(with_port(ips[0], port, Some(iface)));
    }
    Ok(hostname_addr(want_v4, port))
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
        Ok(UdpDevice { sock, local, mtu, rx: vec![0u8; RX_SLOT * RX_BATCH].into_boxed_slice(), stats: UdpStats::default() })
    }

    /// The bound address (concrete IP, actual port).
    pub fn local_socket_addr(&self) -> SocketAddr {
        self.local
    }

    /// The socket buffer sizes the kernel granted (receive, send).
    pub fn socket_buffers(&self) -> (usize, usize) {
        (self.sock.recv_buffer_size().unwrap_or(0), self.sock.send_buffer_size().unwrap_or(0))
    }

    /// Sends one prepared `sendmmsg` vector; `Ok(None)` = would block.
    fn sendmmsg(&mut self, msgs: &mut [libc::mmsghdr]) -> Result<Option<usize>, io::Error> {
        // A pending asynchronous error (ICMP for an earlier datagram) fails the call
        // without sending anything and is cleared by being reported: retry a few
        // times so it cannot fail this batch forever.
        let mut async_left = 4;
        loop {
            // SAFETY: every mmsghdr in `msgs` points at a live iovec, sockaddr and
            // caller datagram buffer for the duration of the call (the caller keeps
            // them on its stack / borrowed), and the length matches the slice.
            let r = unsafe { libc::sendmmsg(self.sock.as_raw_fd(), msgs.as_mut_ptr(), msgs.len() as u32, libc::MSG_DONTWAIT) };
            if r >= 0 {
                return Ok(Some(r as usize));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) | Some(libc::ENOBUFS) => return Ok(None),
                Some(libc::ECONNREFUSED | libc::EHOSTUNREACH | libc::ENETUNREACH | libc::EHOSTDOWN) if async_left > 0 => {
                    async_left -= 1;
                    self.stats.async_errors += 1;
                    continue;
                }
                _ => return Err(e),
            }
        }
    }
}

impl Device for UdpDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps { reliable: false, ordered: false, mtu: self.mtu, max_inline: self.mtu, remote_read: false }
    }

    fn local_addr(&self) -> DevAddr {
        DevAddr::Udp(self.local)
    }

    fn send_batch(&mut self, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        let mut total = 0;
        while total < batch.len() {
            let chunk = &batch[total..batch.len().min(total + BATCH)];
            // SAFETY: all-zero is a valid bit pattern for these plain C structs
            // (null pointers, zero lengths).
            let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
            // Validate and stop at the first datagram this device cannot take: it is
            // reported as an error once it is first in a batch.
            let mut n = 0;
            let mut bad: Option<DeviceError> = None;
            for d in chunk {
                let dst = match d.dst {
                    DevAddr::Udp(a) => dst_for(&self.local, a),
                    _ => None,
                };
                let Some(dst) = dst else {
                    bad = Some(DeviceError::Unreachable(d.dst));
                    break;
                };
                if d.data.len() > self.mtu {
                    bad = Some(DeviceError::TooLarge { len: d.data.len(), mtu: self.mtu });
                    break;
                }
                msgs[n].msg_hdr.msg_namelen = to_sockaddr(&dst, &mut addrs[n]);
                iovs[n] = libc::iovec { iov_base: d.data.as_ptr() as *mut libc::c_void, iov_len: d.data.len() };
                n += 1;
            }
            for i in 0..n {
                msgs[i].msg_hdr.msg_name = &mut addrs[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
                msgs[i].msg_hdr.msg_iov = &mut iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            if n == 0 {
                return match bad {
                    Some(e) if total == 0 => Err(e),
                    _ => Ok(total),
                };
            }
            match self.sendmmsg(&mut msgs[..n]) {
                Ok(Some(sent)) => {
                    self.stats.sent += sent as u64;
                    total += sent;
                    if sent < n || bad.is_some() {
                        return Ok(total);
                    }
                }
                Ok(None) => {
                    self.stats.send_would_block += 1;
                    return Ok(total);
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
        let mut delivered = 0;
        let mut polled = 0;
        while polled < max {
            let n = (max - polled).min(RX_BATCH);
            // SAFETY: all-zero is a valid bit pattern for these plain C structs.
            let mut addrs: [libc::sockaddr_storage; RX_BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut iovs: [libc::iovec; RX_BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; RX_BATCH] = unsafe { zeroed() };
            for (i, chunk) in self.rx.chunks_mut(RX_SLOT).take(n).enumerate() {
                iovs[i] = libc::iovec { iov_base: chunk.as_mut_ptr() as *mut libc::c_void, iov_len: RX_SLOT };
                msgs[i].msg_hdr.msg_name = &mut addrs[i] as *mut libc::sockaddr_storage as *mut libc::c_void;
                msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                msgs[i].msg_hdr.msg_iov = &mut iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            let got = loop {
                // SAFETY: every mmsghdr points at a live iovec into `self.rx` (which
                // is not otherwise borrowed during the call) and a sockaddr_storage
                // on this stack frame; `n <= RX_BATCH`.
                let r = unsafe {
                    libc::recvmmsg(self.sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
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
                        continue;
                    }
                    _ => return Err(DeviceError::io("recvmmsg", e)),
                }
            };
            polled += got;
            for i in 0..got {
                let len = msgs[i].msg_len as usize;
                if msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > RX_SLOT {
                    self.stats.truncated += 1;
                    continue;
                }
                let Some(from) = from_sockaddr(&addrs[i]) else { continue };
                let start = i * RX_SLOT;
                deliver(DevAddr::Udp(from), &self.rx[start..start + len]);
                delivered += 1;
            }
            if got < n {
                break;
            }
        }
        self.stats.received += delivered as u64;
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
