//! The UDP device: one non-blocking datagram socket per endpoint, batched with
//! `sendmmsg` / `recvmmsg`. Works on any Linux host, over loopback or a real
//! network, IPv4 and IPv6. Unreliable and unordered: the engine's reliability
//! layer runs on top.
#![allow(unsafe_code)]

use super::{DevAddr, Device, DeviceCaps, DeviceError, TxDatagram};
use socket2::{Domain, Protocol, Socket, Type};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};

/// Datagrams moved per `sendmmsg` / `recvmmsg` call.
pub const BATCH: usize = 32;
/// Default MTU (IPv4 over Ethernet: 1500 - 20 - 8).
pub const DEFAULT_MTU: usize = 1472;

#[derive(Clone, Debug)]
pub struct UdpConfig {
    /// Address to bind (port 0 = ephemeral).
    pub bind: SocketAddr,
    /// Largest datagram this endpoint sends.
    pub mtu: usize,
    /// Socket buffer sizes to ask for (the kernel may clamp them).
    pub socket_buffer: usize,
}

impl UdpConfig {
    pub fn new(bind: SocketAddr) -> Self {
        UdpConfig { bind, mtu: DEFAULT_MTU, socket_buffer: 8 << 20 }
    }
}

pub struct UdpDevice {
    sock: Socket,
    local: SocketAddr,
    mtu: usize,
    /// Receive buffers, `BATCH` slots of `slot` bytes each, lent to the caller.
    rx: Vec<u8>,
    slot: usize,
    pub stats: UdpStats,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct UdpStats {
    pub sent: u64,
    pub received: u64,
    pub truncated: u64,
    pub send_would_block: u64,
    pub send_errors: u64,
}

fn to_sockaddr(a: &SocketAddr, storage: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) };
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe { &mut *(storage as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            sin6.sin6_flowinfo = v6.flowinfo();
            sin6.sin6_scope_id = v6.scope_id();
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

fn from_sockaddr(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let sin = unsafe { &*(storage as *const _ as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let sin6 = unsafe { &*(storage as *const _ as *const libc::sockaddr_in6) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), sin6.sin6_flowinfo, sin6.sin6_scope_id)))
        }
        _ => None,
    }
}

impl UdpDevice {
    pub fn open(cfg: &UdpConfig) -> Result<UdpDevice, DeviceError> {
        let domain = if cfg.bind.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
        let sock = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(|e| DeviceError::io("socket", e))?;
        sock.set_nonblocking(true).map_err(|e| DeviceError::io("set_nonblocking", e))?;
        // Best effort: large buffers absorb bursts; the kernel clamps to its max.
        let _ = sock.set_recv_buffer_size(cfg.socket_buffer);
        let _ = sock.set_send_buffer_size(cfg.socket_buffer);
        sock.bind(&cfg.bind.into()).map_err(|e| DeviceError::io("bind", e))?;
        let local = sock
            .local_addr()
            .map_err(|e| DeviceError::io("getsockname", e))?
            .as_socket()
            .ok_or_else(|| DeviceError::Config("UDP socket has no IP address".into()))?;
        // Receive slots take any datagram up to the UDP maximum, so a peer with a
        // larger MTU is never silently truncated.
        let slot = 65536;
        Ok(UdpDevice { sock, local, mtu: cfg.mtu, rx: vec![0u8; slot * BATCH], slot, stats: UdpStats::default() })
    }

    pub fn local_socket_addr(&self) -> SocketAddr {
        self.local
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
        for chunk in batch.chunks(BATCH) {
            // SAFETY: all-zero is a valid bit pattern for these plain C structs.
            let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
            // SAFETY: as above.
            let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
            let mut n = 0;
            for (i, d) in chunk.iter().enumerate() {
                let DevAddr::Udp(dst) = d.dst else {
                    if i == 0 {
                        return Err(DeviceError::Unreachable(d.dst));
                    }
                    break;
                };
                if d.data.len() > self.mtu {
                    if i == 0 {
                        return Err(DeviceError::TooLarge { len: d.data.len(), mtu: self.mtu });
                    }
                    break;
                }
                let len = to_sockaddr(&dst, &mut addrs[i]);
                iovs[i] = libc::iovec { iov_base: d.data.as_ptr() as *mut libc::c_void, iov_len: d.data.len() };
                msgs[i].msg_hdr.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
                msgs[i].msg_hdr.msg_namelen = len;
                msgs[i].msg_hdr.msg_iov = &mut iovs[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
                n += 1;
            }
            if n == 0 {
                break;
            }
            let sent = loop {
                // SAFETY: `msgs[..n]` point at live iovecs, addresses and the
                // caller's datagram buffers for the duration of the call.
                let r = unsafe { libc::sendmmsg(self.sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
                if r >= 0 {
                    break r as usize;
                }
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EAGAIN) | Some(libc::ENOBUFS) => {
                        self.stats.send_would_block += 1;
                        return Ok(total);
                    }
                    // An ICMP error from an earlier datagram surfaces here; the
                    // current batch was not sent, so try it once more.
                    Some(libc::ECONNREFUSED) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => {
                        self.stats.send_errors += 1;
                        // SAFETY: as above.
                        let r2 = unsafe { libc::sendmmsg(self.sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT) };
                        if r2 >= 0 {
                            break r2 as usize;
                        }
                        return if total > 0 { Ok(total) } else { Err(DeviceError::io("sendmmsg", e)) };
                    }
                    _ => {
                        self.stats.send_errors += 1;
                        return if total > 0 { Ok(total) } else { Err(DeviceError::io("sendmmsg", e)) };
                    }
                }
            };
            self.stats.sent += sent as u64;
            total += sent;
            if sent < n || n < chunk.len() {
                break;
            }
        }
        Ok(total)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        let n = max.min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero is a valid bit pattern for these plain C structs.
        let mut addrs: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let base = self.rx.as_mut_ptr();
        for i in 0..n {
            // SAFETY: slot i lies inside `self.rx` (BATCH slots of `slot` bytes).
            iovs[i] = libc::iovec { iov_base: unsafe { base.add(i * self.slot) } as *mut libc::c_void, iov_len: self.slot };
            msgs[i].msg_hdr.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let got = loop {
            // SAFETY: every mmsghdr points at a live iovec into `self.rx` and a
            // sockaddr_storage, valid for the call.
            let r = unsafe {
                libc::recvmmsg(self.sock.as_raw_fd(), msgs.as_mut_ptr(), n as u32, libc::MSG_DONTWAIT, std::ptr::null_mut())
            };
            if r >= 0 {
                break r as usize;
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return Ok(0),
                // ICMP port unreachable for something we sent earlier: not a
                // receive failure; the engine's timers handle the peer.
                Some(libc::ECONNREFUSED) | Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => return Ok(0),
                _ => return Err(DeviceError::io("recvmmsg", e)),
            }
        };
        let mut delivered = 0;
        for i in 0..got {
            let len = msgs[i].msg_len as usize;
            if msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.stats.truncated += 1;
                continue;
            }
            let Some(from) = from_sockaddr(&addrs[i]) else { continue };
            let start = i * self.slot;
            deliver(DevAddr::Udp(from), &self.rx[start..start + len.min(self.slot)]);
            delivered += 1;
        }
        self.stats.received += delivered as u64;
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.sock.as_raw_fd())
    }
}
