//! An attacker on the switch of simulated hosts (`fi_tests::hosts`): it sees
//! every frame between them and may send anything, with any source address,
//! but has no job secret. Used by `tests/sealed_mpi.rs` against a running MPI
//! job whose traffic is sealed (`rdm/PROTOCOL.md` §2.5).
//!
//! `rdmx_mitm <want> <limit-ms> <counts-file> <own-ip>`: captures sealed rdmx
//! datagrams between the hosts (an AF_PACKET socket on every interface of
//! its namespace; none to or from its own address `own-ip`), `want` of them (or until `limit-ms` passed), and as it
//! sees each one sends it to its destination again from its own address
//! (`elsewhere`) and with the sender's address (`replayed`, a raw socket),
//! altered in one bit with the sender's address (`altered`), and for the
//! first 16, forgeries of every packet type with the job's id and the
//! receiver's incarnation and a made-up tag, from the sender's address
//! (`forged`); writes `<kind> <count>` lines to the counts file, and exits.
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

/// rdm's header fields (`rdm/PROTOCOL.md` §2): magic, flags, job key, incarnations.
const MAGIC: u8 = 0xD7;
const F_SEALED: u8 = 16;
const HEADER_LEN: usize = 48;
const TRAILER_LEN: usize = 24;

struct Captured {
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: Vec<u8>,
}

fn parse(frame: &[u8]) -> Option<Captured> {
    // IPv4 (the AF_PACKET SOCK_DGRAM socket strips the Ethernet header), UDP.
    if frame.len() < 28 || frame[0] >> 4 != 4 || frame[9] != 17 {
        return None;
    }
    let ihl = (frame[0] & 15) as usize * 4;
    let ip = |o: usize| Ipv4Addr::new(frame[o], frame[o + 1], frame[o + 2], frame[o + 3]);
    let udp = frame.get(ihl..)?;
    let port = |o: usize| u16::from_be_bytes([udp[o], udp[o + 1]]);
    let len = port(4) as usize;
    let payload = udp.get(8..len)?.to_vec();
    // Longer than one datagram of the path: a run of them sent in one
    // segmentation-offload write, seen before the kernel cut it (its
    // datagrams' boundaries are not in it): skipped.
    let one = payload.len() <= 1472;
    let sealed = one && payload.len() >= HEADER_LEN + TRAILER_LEN && payload[0] == MAGIC && payload[3] & F_SEALED != 0;
    sealed.then(|| Captured {
        src: SocketAddrV4::new(ip(12), port(0)),
        dst: SocketAddrV4::new(ip(16), port(2)),
        payload,
    })
}

/// A raw IPv4 socket that writes its own headers (any source address).
struct Spoofer(libc::c_int);

impl Spoofer {
    fn new() -> Spoofer {
        // SAFETY: socket(2) with constant arguments; the fd is checked.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        Spoofer(fd)
    }

    fn send(&self, src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) {
        let udp_len = 8 + payload.len();
        let mut p = vec![0u8; 20 + udp_len];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&((20 + udp_len) as u16).to_be_bytes());
        p[8] = 64;
        p[9] = 17;
        p[12..16].copy_from_slice(&src.ip().octets());
        p[16..20].copy_from_slice(&dst.ip().octets());
        p[20..22].copy_from_slice(&src.port().to_be_bytes());
        p[22..24].copy_from_slice(&dst.port().to_be_bytes());
        p[24..26].copy_from_slice(&(udp_len as u16).to_be_bytes());
        // UDP checksum 0: none (IPv4); the kernel fills the IP checksum.
        p[28..].copy_from_slice(payload);
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(dst.ip().octets()) },
            sin_zero: [0; 8],
        };
        // SAFETY: `p` and `sa` are valid for the lengths given; the fd is ours.
        let n = unsafe {
            libc::sendto(
                self.0,
                p.as_ptr() as *const _,
                p.len(),
                0,
                &sa as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_in>() as u32,
            )
        };
        assert_eq!(n as usize, p.len(), "raw send: {}", std::io::Error::last_os_error());
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (want, limit, out): (usize, u64, &str) = (args[1].parse().unwrap(), args[2].parse().unwrap(), &args[3]);
    // Its own address: datagrams to it (the ranks answer its copies sent
    // from there with challenges) are not the job's traffic between hosts.
    let me: Ipv4Addr = args[4].parse().unwrap();
    // SAFETY: socket(2) with constant arguments; the fd is checked.
    // ETH_P_ALL: frames a bridge forwards between its ports reach only the
    // taps of every protocol (the bridge takes them before protocol ones).
    let cap = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, (libc::ETH_P_ALL as u16).to_be() as i32) };
    assert!(cap >= 0, "packet socket: {}", std::io::Error::last_os_error());
    let tv = libc::timeval { tv_sec: 0, tv_usec: 10_000 };
    // SAFETY: a timeval option on our socket.
    unsafe {
        libc::setsockopt(
            cap,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const _,
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let own = UdpSocket::bind("0.0.0.0:0").unwrap();
    let spoof = Spoofer::new();
    let mut counts = [0u64; 4]; // elsewhere, replayed, altered, forged
    let (mut captured, mut frames, mut paced) = (0usize, 0u64, 0u64);
    let mut pace = || {
        paced += 1;
        if paced.is_multiple_of(8) {
            // Gently: a receiver's socket buffer, full with the job's own
            // traffic, drops what comes on top.
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let t0 = Instant::now();
    let mut buf = vec![0u8; 70_000];
    // Each datagram is attacked as soon as it is seen, while the job runs
    // (a datagram sent to a rank that has finished would be counted nowhere).
    while captured < want && t0.elapsed() < Duration::from_millis(limit) {
        // SAFETY: sockaddr_ll is plain data; zeroes are a valid value.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut flen = std::mem::size_of::<libc::sockaddr_ll>() as u32;
        // SAFETY: `buf` and `from` are valid for the lengths given.
        let n = unsafe {
            libc::recvfrom(cap, buf.as_mut_ptr() as *mut _, buf.len(), 0, &mut from as *mut _ as *mut _, &mut flen)
        };
        if n > 0 {
            frames += 1;
        }
        // Each frame crosses the switch twice (in on one port, out on
        // another): take it once, as it comes in.
        let ip = from.sll_protocol == (libc::ETH_P_IP as u16).to_be();
        if n <= 0 || !ip || from.sll_pkttype == libc::PACKET_OUTGOING {
            continue;
        }
        let Some(c) = parse(&buf[..n as usize]) else { continue };
        if *c.dst.ip() == me || *c.src.ip() == me {
            continue;
        }
        captured += 1;
        own.send_to(&c.payload, c.dst).unwrap();
        counts[0] += 1;
        pace();
        spoof.send(c.src, c.dst, &c.payload);
        counts[1] += 1;
        pace();
        let mut f = c.payload.clone();
        let bit = (captured * 131) % (f.len() * 8);
        f[bit / 8] ^= 1 << (bit % 8);
        spoof.send(c.src, c.dst, &f);
        counts[2] += 1;
        pace();
        if captured > 16 {
            continue;
        }
        // Forgeries: every packet type (DATA, ACK, DGRAM, DIRECT), tagged
        // and enciphered, naming the receiver's incarnation, with a made-up
        // tag, from the sender's current incarnation or a new one (a restart).
        for ptype in 1u8..=4 {
            for flags in [F_SEALED | 3, F_SEALED | 32 | 3] {
                for new_inc in [false, true] {
                    let mut f = vec![0x5au8; HEADER_LEN + 100 + TRAILER_LEN];
                    f[..HEADER_LEN].copy_from_slice(&c.payload[..HEADER_LEN]);
                    f[2] = ptype;
                    f[3] = if ptype == 1 || ptype == 4 { flags } else { flags & !3 };
                    if new_inc {
                        f[16..24].copy_from_slice(&0xBAD_1DEA_u64.to_le_bytes());
                    }
                    spoof.send(c.src, c.dst, &f);
                    counts[3] += 1;
                    pace();
                }
            }
        }
    }
    let text = format!(
        "frames {frames}\ncaptured {}\nelsewhere {}\nreplayed {}\naltered {}\nforged {}\n",
        captured, counts[0], counts[1], counts[2], counts[3]
    );
    std::fs::write(out, text).unwrap();
}
