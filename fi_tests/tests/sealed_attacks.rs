//! Attacks on sealed job traffic (`rdm/PROTOCOL.md` §2.5) through the real
//! UDP sockets of running endpoints, as a man in the middle sees them.
//!
//! Two endpoints of one job (a 32-byte `auth_key`: a job secret) on the udp
//! domain; every datagram between them goes through a relay in this test
//! (the sender's address of the receiver names the relay's port), which
//! records what passes. After a genuine exchange (eager messages, a
//! windowed rendezvous, an RMA write), the relay, knowing everything a
//! captured packet shows but not the secret, sends the receiver:
//!
//! - every captured datagram again, from the relay (inside the windows) and
//!   from another port (a new peer to the receiver);
//! - every captured datagram altered in one bit (header, payload, trailer)
//!   and cut short;
//! - forged datagrams of every packet type with the job's id and a new
//!   incarnation, with a made-up tag, and unsealed with a valid checksum.
//!
//! Nothing may be delivered, no completion may appear, the receiver's
//! registered memory (rewritten by the application after the genuine write)
//! must stay as the application left it, and each datagram must be counted
//! where it was refused (`FI_RDMX_STATS=1` lines of the receiver). A genuine
//! message after all that still arrives. The test re-runs itself in a child
//! with `FI_RDMX_STATS=1` (the counters are printed when an endpoint closes).
use fi_tests::*;
use rdm::engine::wire::{field, Header, Hello, PacketType, Sealed, HEADER_LEN, TRAILER_LEN};
use rdm::engine::Psn;
use std::net::{SocketAddr, UdpSocket};
use std::ptr::null_mut;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SECRET: &[u8; 32] = b"the job's secret, 32 bytes long!";
const EAGER: usize = 8;
const BIG: usize = 600 << 10;

fn sealed_stack(secret: &[u8]) -> Stack {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= fi::FI_RMA as u64;
    h.dom().mr_mode = (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32;
    // SAFETY: the hints own the key buffer (freed with them by fi_freeinfo).
    unsafe {
        let k = libc::malloc(secret.len()) as *mut u8;
        std::ptr::copy_nonoverlapping(secret.as_ptr(), k, secret.len());
        h.ep().auth_key = k;
        h.ep().auth_key_size = secret.len();
    }
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo with a 32-byte auth_key");
    Stack::open_with(info, fi::FI_AV_MAP, 0)
}

/// The UDP address in an rdmx address (devices/src/addr.rs: port at 6..8,
/// big-endian; IPv4 in the first 4 bytes at 8).
fn udp_of(name: &[u8]) -> SocketAddr {
    assert_eq!(name[2] & 0b11, 0b01, "an IPv4 UDP slot");
    let port = u16::from_be_bytes([name[6], name[7]]);
    SocketAddr::from(([name[8], name[9], name[10], name[11]], port))
}

fn with_port(name: &[u8], port: u16) -> Vec<u8> {
    let mut n = name.to_vec();
    n[6..8].copy_from_slice(&port.to_be_bytes());
    n
}

/// A relay between the sender (towards `front`) and the receiver at `to`
/// (from `back`), recording every datagram from the sender.
struct Relay {
    front: UdpSocket,
    back: UdpSocket,
    captured: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    fn start(ip: std::net::IpAddr, to: SocketAddr) -> (Relay, std::thread::JoinHandle<()>) {
        let front = UdpSocket::bind((ip, 0)).unwrap();
        let back = UdpSocket::bind((ip, 0)).unwrap();
        for s in [&front, &back] {
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        }
        let relay = Relay {
            front: front.try_clone().unwrap(),
            back: back.try_clone().unwrap(),
            captured: Arc::default(),
            stop: Arc::default(),
        };
        let (captured, stop) = (relay.captured.clone(), relay.stop.clone());
        let thread = std::thread::spawn(move || {
            let mut sender: Option<SocketAddr> = None;
            let mut buf = vec![0u8; 70_000];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok((n, from)) = front.recv_from(&mut buf) {
                    sender = Some(from);
                    captured.lock().unwrap().push(buf[..n].to_vec());
                    back.send_to(&buf[..n], to).unwrap();
                }
                if let Ok((n, _)) = back.recv_from(&mut buf) {
                    if let Some(s) = sender {
                        front.send_to(&buf[..n], s).unwrap();
                    }
                }
            }
        });
        (relay, thread)
    }
}

fn reg(s: &Stack, buf: &mut [u8]) -> (*mut fi::fid_mr, u64) {
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE | fi::FI_RECV | fi::FI_SEND) as u64;
    // SAFETY: a libfabric call on objects this test opened; `buf` outlives the MR (closed before it).
    unsafe {
        assert_eq!(
            fi::fi_mr_reg(s.domain, buf.as_mut_ptr() as *const _, buf.len(), access, 0, 0, 0, &mut mr, null_mut()),
            0
        );
        (mr, fi::fi_mr_key(mr))
    }
}

/// Completions on `s` within `limit` (stopping early at `want`). The other
/// endpoints progress on their own (the provider's progress thread).
fn drain(s: &Stack, _others: &[&Stack], want: usize, limit: Duration) -> Vec<Result<fi::fi_cq_tagged_entry, i32>> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while Instant::now() < deadline && got.len() < want {
        if let Some(c) = s.poll_cq(Duration::from_millis(1)) {
            got.push(c.map_err(|e| e.err));
        }
    }
    got
}

fn eager(i: usize) -> [u8; EAGER] {
    let mut m = *b"genuine0";
    m[7] = b'0' + i as u8;
    m
}

fn big() -> Vec<u8> {
    (0..BIG).map(|i| (i * 7 + 3) as u8).collect()
}

/// Forged datagrams naming the job (`job_id`) and the receiver (`dst_inc`)
/// from a made-up incarnation: every packet type, sealed with a made-up tag,
/// and unsealed with a valid checksum.
fn forgeries(job_id: u64, dst_inc: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for ptype in PacketType::ALL {
        for sealed in [Sealed::No, Sealed::Tagged, Sealed::Encrypted] {
            let frag = ptype.has_fragments();
            let h = Header {
                ptype,
                first: frag,
                last: frag,
                job_key: job_id,
                src_inc: 0xF0F0_F0F0,
                dst_inc,
                psn_or_window: 0,
                ack: Psn(0),
                sack: 0,
                header_sum: false,
                unsummed: false,
                sealed,
                hello: Hello::None,
            };
            let mut b = vec![0x33u8; 300];
            let n = h.encode(&[0x44; 64], &mut b);
            out.push(b[..n + if sealed == Sealed::No { 0 } else { TRAILER_LEN }].to_vec());
        }
    }
    out
}

fn attack() {
    let a = sealed_stack(SECRET);
    let b = sealed_stack(SECRET);
    let b_name = b.name();
    let b_udp = udp_of(&b_name);
    let (relay, thread) = Relay::start(b_udp.ip(), b_udp);
    let b_at_a = a.insert(&with_port(&b_name, relay.front.local_addr().unwrap().port()));

    // The genuine exchange: eager messages, a windowed rendezvous, an RMA write.
    let mut rbufs = [[0u8; EAGER]; 4];
    let mut rbig = vec![0u8; BIG];
    let mut window = vec![0u8; 4096];
    let (wmr, wkey) = reg(&b, &mut window);
    let sbig = big();
    let written = [0xAB_u8; 256];
    // SAFETY: libfabric calls on objects this test opened; every buffer outlives the waits below.
    unsafe {
        for r in rbufs.iter_mut() {
            assert_eq!(fi::fi_recv(b.ep, r.as_mut_ptr() as *mut _, EAGER, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        }
        assert_eq!(fi::fi_recv(b.ep, rbig.as_mut_ptr() as *mut _, BIG, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        for i in 0..4 {
            let m = eager(i);
            assert_eq!(fi::fi_send(a.ep, m.as_ptr() as *const _, EAGER, null_mut(), b_at_a, null_mut()), 0);
        }
        assert_eq!(fi::fi_send(a.ep, sbig.as_ptr() as *const _, BIG, null_mut(), b_at_a, null_mut()), 0);
        let target = window.as_ptr() as u64 + 1000;
        assert_eq!(
            fi::fi_write(a.ep, written.as_ptr() as *const _, 256, null_mut(), b_at_a, target, wkey, null_mut()),
            0
        );
    }
    let at_b = drain(&b, &[&a], 5, Duration::from_secs(20));
    let at_a = drain(&a, &[&b], 6, Duration::from_secs(20));
    assert!(at_b.len() == 5 && at_b.iter().all(|c| c.is_ok()), "receives: {at_b:?}");
    assert!(at_a.len() == 6 && at_a.iter().all(|c| c.is_ok()), "sends and write: {at_a:?}");
    for (i, r) in rbufs.iter().enumerate() {
        assert_eq!(*r, eager(i));
    }
    assert!(rbig == sbig, "the rendezvous arrived intact");
    assert!(window[1000..1256].iter().all(|&x| x == 0xAB), "the genuine write landed");
    // The application moves on: its memory now holds something else, and
    // nothing may change it again.
    window.fill(0x11);
    rbufs.iter_mut().for_each(|r| r.fill(0));
    rbig.fill(0);
    std::thread::sleep(Duration::from_millis(100)); // the last acks pass the relay
    let captured = relay.captured.lock().unwrap().clone();
    assert!(captured.len() > 400, "a windowed rendezvous of 600 KiB is hundreds of datagrams: {}", captured.len());
    let (job_id, b_inc) = {
        let (h, _) = Header::decode(&captured[0]).unwrap();
        assert_ne!(h.sealed, Sealed::No, "the genuine traffic is sealed");
        (h.job_key, captured.iter().map(|d| Header::decode(d).unwrap().0.dst_inc).max().unwrap())
    };

    // Receives posted again: anything taken for a message lands here.
    // SAFETY: as above; the buffers outlive the endpoints (closed first).
    unsafe {
        for r in rbufs.iter_mut() {
            assert_eq!(fi::fi_recv(b.ep, r.as_mut_ptr() as *mut _, EAGER, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        }
        assert_eq!(fi::fi_recv(b.ep, rbig.as_mut_ptr() as *mut _, BIG, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
    }
    let elsewhere = UdpSocket::bind((b_udp.ip(), 0)).unwrap();
    let mut sent = [0u64; 3]; // replays, altered or cut, forged
    let mut paced = 0usize;
    let mut send = |sock: &UdpSocket, d: &[u8], kind: usize| {
        sock.send_to(d, b_udp).unwrap();
        sent[kind] += 1;
        paced += 1;
        if paced.is_multiple_of(32) {
            // Within the receiver's socket buffer: a datagram the kernel
            // drops would be counted nowhere.
            b.poll_cq(Duration::ZERO);
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    for d in &captured {
        send(&relay.back, d, 0);
        send(&elsewhere, d, 0);
    }
    for (i, d) in captured.iter().enumerate() {
        let mut f = d.clone();
        let bit = (i * 131) % (f.len() * 8);
        f[bit / 8] ^= 1 << (bit % 8);
        send(&relay.back, &f, 1);
        send(&relay.back, &d[..d.len() - 1 - i % (d.len() - 1)], 1);
    }
    for f in forgeries(job_id, b_inc) {
        send(&relay.back, &f, 2);
        send(&elsewhere, &f, 2);
    }
    let stray = drain(&b, &[&a], 1, Duration::from_millis(1500));
    assert!(stray.is_empty(), "an attack completed something at the receiver: {stray:?}");
    assert!(window.iter().all(|&x| x == 0x11), "an attack wrote the receiver's memory");
    assert!(rbufs.iter().all(|r| *r == [0; EAGER]) && rbig.iter().all(|&x| x == 0), "an attack filled a buffer");
    assert!(drain(&a, &[&b], 1, Duration::from_millis(200)).is_empty(), "the sender saw a completion");

    // The job still works.
    let last = *b"genuine!";
    // SAFETY: as above.
    unsafe { assert_eq!(fi::fi_send(a.ep, last.as_ptr() as *const _, EAGER, null_mut(), b_at_a, null_mut()), 0) };
    let after = drain(&b, &[&a], 1, Duration::from_secs(10));
    assert!(
        after.len() == 1 && after[0].is_ok() && rbufs[0] == last,
        "the genuine message after the attacks: {after:?}"
    );
    drain(&a, &[&b], 1, Duration::from_secs(10));

    relay.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    thread.join().unwrap();
    println!("SENT replays {} altered {} forged {}", sent[0], sent[1], sent[2]);
    drop(a);
    eprintln!("SEALED: closing the receiver");
    // SAFETY: closing the MR this test opened, before its buffer goes.
    unsafe { assert_eq!(fi::fi_close(&mut (*wmr).fid), 0) };
    drop(b);
    eprintln!("SEALED: closed");
}

fn counter(stderr: &str, name: &str) -> u64 {
    let start = stderr.find("SEALED: closing").unwrap_or_else(|| panic!("no marker:\n{stderr}"));
    stderr[start..]
        .lines()
        .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
        .unwrap_or_else(|| panic!("no {name}:\n{stderr}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn a_man_in_the_middle_can_neither_forge_alter_nor_replay_job_traffic() {
    if std::env::var_os("RDMX_SEALED_CHILD").is_some() {
        init();
        attack();
        return;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_man_in_the_middle_can_neither_forge_alter_nor_replay_job_traffic", "--nocapture"])
        .envs(child_env())
        .env("RDMX_SEALED_CHILD", "1")
        .env("FI_RDMX_STATS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = fi_tests::procs::wait_output(child, Duration::from_secs(120));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let sent: Vec<u64> = stdout
        .lines()
        .find_map(|l| l.split_once("SENT ").map(|(_, r)| r.to_string()))
        .expect("the child's counts")
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (replays, altered, forged) = (sent[0], sent[1], sent[2]);
    assert_eq!(counter(&stderr, "job_traffic_sealed"), 1, "tagged");
    let auth = counter(&stderr, "dropped_auth");
    let refused_as_replays = counter(&stderr, "dropped_replay")
        + counter(&stderr, "duplicates")
        + counter(&stderr, "dropped_stale")
        + counter(&stderr, "dropped_unnamed");
    let malformed = counter(&stderr, "dropped_malformed_packets")
        + counter(&stderr, "dropped_job_key")
        + counter(&stderr, "dropped_checksum");
    println!(
        "receiver: dropped_auth {auth}, refused as replays {refused_as_replays}, malformed or foreign {malformed}"
    );
    // Forged and altered ones fail their tag, or are malformed (cut inside
    // the header, a flipped magic, version or flag), of another job (a
    // flipped job id) or unsealed without a valid checksum (the flag
    // flipped off).
    assert!(auth + malformed >= altered + forged, "{auth} + {malformed} < {altered} + {forged}:\n{stderr}");
    assert!(auth >= forged * 5 / 6, "the sealed forgeries fail their tag: {auth} < {forged}:\n{stderr}");
    // Each replay is refused as one (the genuine traffic's own duplicates
    // only add to these counters).
    assert!(refused_as_replays >= replays, "{refused_as_replays} < {replays}:\n{stderr}");
}

/// An endpoint whose secret is another job's sees nothing of this job, and
/// an `auth_key` of 9 to 15 bytes (neither a key in clear nor a secret) is
/// refused by `fi_getinfo`.
#[test]
fn another_secret_is_another_job_and_odd_key_lengths_are_refused() {
    init();
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    // SAFETY: the hints own the key buffer.
    unsafe {
        let k = libc::malloc(12) as *mut u8;
        std::ptr::write_bytes(k, 7, 12);
        h.ep().auth_key = k;
        h.ep().auth_key_size = 12;
    }
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
    let a = sealed_stack(SECRET);
    let c = sealed_stack(b"another job's secret of 32 bytes");
    let c_at_a = a.insert(&c.name());
    let mut r = [0u8; EAGER];
    // SAFETY: libfabric calls on objects this test opened; buffers outlive the waits.
    unsafe {
        assert_eq!(fi::fi_recv(c.ep, r.as_mut_ptr() as *mut _, EAGER, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(a.ep, b"job A!!!".as_ptr() as *const _, EAGER, null_mut(), c_at_a, null_mut()), 0);
    }
    assert!(drain(&c, &[&a], 1, Duration::from_millis(1000)).is_empty(), "another job's message arrived");
    assert_eq!(r, [0; EAGER]);
    let _ = (field::JOB_KEY, HEADER_LEN);
}
