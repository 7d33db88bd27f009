//! Hostile datagrams at a live job: while an OpenMPI job over rdmx's UDP device
//! moves every size class with every byte checked (`fi_tests/mpi/spray.c`),
//! a thread sprays the ranks' UDP ports (found from `/proc`: the sockets the
//! rank processes hold) with random datagrams of 0..2000 bytes, truncated
//! headers, and headers that look right but carry a wrong version, a wrong
//! checksum, or a correct checksum and a foreign job key. The job must finish
//! with every byte intact, and the endpoints' drop counters (`FI_RDMX_STATS=1`,
//! printed at close; this test is about them) must show the drops.
use fi_tests::procs::{self, text};
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// rdm's header (rdm/PROTOCOL.md), from the engine itself: a change of the
/// wire format changes what is sprayed, never leaves it spraying the old one.
use rdm::engine::wire::{field, seal, PacketType, HEADER_LEN, MAGIC, VERSION};
/// Ranks of the sprayed job.
const RANKS: usize = 3;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Random,
    Truncated,
    WrongVersion,
    WrongChecksum,
    ForeignJob,
}
const KINDS: [Kind; 5] = [Kind::Random, Kind::Truncated, Kind::WrongVersion, Kind::WrongChecksum, Kind::ForeignJob];

fn datagram(rng: &mut Rng, kind: Kind) -> Vec<u8> {
    let len = match kind {
        Kind::Random => rng.below(2000) as usize,
        Kind::Truncated => rng.below(HEADER_LEN as u64) as usize,
        _ => HEADER_LEN + rng.below(2000 - HEADER_LEN as u64) as usize,
    };
    let mut d: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    if kind == Kind::Random && !d.is_empty() && d[0] == MAGIC {
        d[0] = 0; // random means not even the magic
    }
    if kind != Kind::Random && !d.is_empty() {
        d[field::MAGIC] = MAGIC;
        if d.len() > field::VERSION {
            d[field::VERSION] = if kind == Kind::WrongVersion {
                [VERSION.wrapping_sub(1), VERSION.wrapping_add(1), 0, 0xff][rng.below(4) as usize]
            } else {
                VERSION
            };
        }
        if d.len() > field::FLAGS {
            const TYPES: [PacketType; 3] = [PacketType::Data, PacketType::Ack, PacketType::Datagram];
            let ty = TYPES[rng.below(TYPES.len() as u64) as usize];
            d[field::TYPE] = ty.to_wire();
            d[field::FLAGS] = if ty == PacketType::Data { rng.below(4) as u8 } else { 0 };
        }
    }
    if d.len() >= HEADER_LEN {
        // A correct checksum (rdm's own seal), then spoiled for every kind but
        // the foreign job's, which must be caught by its key alone.
        seal(&mut d);
        if kind != Kind::ForeignJob {
            let spoil = 1 + rng.below(u32::MAX as u64) as u32;
            for (b, x) in d[field::CHECKSUM].iter_mut().zip(spoil.to_le_bytes()) {
                *b ^= x;
            }
        }
    }
    d
}

/// The parent of `pid` (the fourth field of `/proc/<pid>/stat`, after the
/// command name in parentheses, which may itself hold spaces).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is `root` or one of its descendants.
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        if pid == root {
            return true;
        }
        match parent_of(pid) {
            Some(p) if p > 1 && p != pid => pid = p,
            _ => return false,
        }
    }
    false
}

/// Pids of processes running `exe` that this test's `mpirun` (pid `launcher`)
/// started: another run's ranks of the same program are never sprayed.
fn pids_of(exe: &Path, launcher: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe))
        .filter(|pid| descends_from(*pid, launcher))
        .collect()
}

/// Socket inodes a process holds.
fn socket_inodes(pid: u32) -> HashSet<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return HashSet::new() };
    dir.filter_map(|e| {
        let l = std::fs::read_link(e.ok()?.path()).ok()?;
        let s = l.to_str()?;
        s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
    })
    .collect()
}

/// Local addresses of the UDP sockets among `inodes` (from /proc/net/udp{,6}).
fn udp_addrs(inodes: &HashSet<u64>) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for (file, v6) in [("/proc/net/udp", false), ("/proc/net/udp6", true)] {
        let Ok(t) = std::fs::read_to_string(file) else { continue };
        for line in t.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(inode)) = (f.get(1), f.get(9).and_then(|i| i.parse::<u64>().ok())) else { continue };
            if !inodes.contains(&inode) {
                continue;
            }
            let Some((ip, port)) = local.split_once(':') else { continue };
            let Ok(port) = u16::from_str_radix(port, 16) else { continue };
            if !v6 {
                let Ok(raw) = u32::from_str_radix(ip, 16) else { continue };
                let mut ip = Ipv4Addr::from(u32::from_be(raw));
                if ip.is_unspecified() {
                    ip = Ipv4Addr::LOCALHOST;
                }
                out.push(SocketAddr::V4(SocketAddrV4::new(ip, port)));
            } else if ip.len() == 32 {
                // Four 32-bit words, each in host (little-endian) order.
                let mut b = [0u8; 16];
                for w in 0..4 {
                    let Ok(x) = u32::from_str_radix(&ip[8 * w..8 * w + 8], 16) else { continue };
                    b[4 * w..4 * w + 4].copy_from_slice(&u32::from_be(x).to_be_bytes());
                }
                let mut ip = std::net::Ipv6Addr::from(b);
                if ip.is_unspecified() {
                    ip = std::net::Ipv6Addr::LOCALHOST;
                }
                out.push(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0)));
            }
        }
    }
    out
}

#[derive(Default)]
struct Sprayed {
    sent: [u64; KINDS.len()],
    ports: HashSet<SocketAddr>,
}

/// Sprays the UDP sockets of the processes running `exe` under `launcher` until `stop`.
fn spray(exe: PathBuf, launcher: u32, stop: Arc<AtomicBool>) -> Sprayed {
    let v4 = UdpSocket::bind("0.0.0.0:0").expect("udp socket");
    let v6 = UdpSocket::bind("[::]:0").ok();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut out = Sprayed::default();
    let mut targets: Vec<SocketAddr> = Vec::new();
    let mut scanned = Instant::now() - Duration::from_secs(1);
    while !stop.load(Ordering::Relaxed) {
        if scanned.elapsed() > Duration::from_millis(200) {
            scanned = Instant::now();
            let inodes: HashSet<u64> = pids_of(&exe, launcher).into_iter().flat_map(socket_inodes).collect();
            targets = udp_addrs(&inodes);
            out.ports.extend(targets.iter().copied());
        }
        if targets.is_empty() {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        for _ in 0..8 {
            let k = rng.below(KINDS.len() as u64) as usize;
            let d = datagram(&mut rng, KINDS[k]);
            let to = targets[rng.below(targets.len() as u64) as usize];
            let sock = if to.is_ipv4() { Some(&v4) } else { v6.as_ref() };
            if sock.is_some_and(|s| s.send_to(&d, to).is_ok()) {
                out.sent[k] += 1;
            }
        }
        // About 20k datagrams a second: a flood for the receive path, not for
        // the two shared cores.
        std::thread::sleep(Duration::from_micros(400));
    }
    out
}

/// The sum over endpoints of `rdmx: <name> <value>` lines.
fn counter(out: &str, name: &str) -> u64 {
    let p = format!("rdmx: {name} ");
    out.lines().filter_map(|l| l.trim().strip_prefix(&p)).filter_map(|v| v.trim().parse::<u64>().ok()).sum()
}

#[test]
fn hostile_datagrams_during_an_mpi_job_are_dropped_and_counted() {
    fi_tests::init();
    let Some(exe) = procs::build_mpi("spray", &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi")) else { return };
    let exe = exe.canonicalize().unwrap();
    let dir = fi_tests::provider_dir();
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", &RANKS.to_string()])
        .args([
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_ofi_provider_include",
            "rdmx",
            "--mca",
            "btl",
            "self",
        ])
        .args(["-x", "FI_PROVIDER=rdmx", "-x", &format!("FI_PROVIDER_PATH={}", dir.display())])
        // UDP between ranks on one host (the default, auto, would use shared
        // memory), and the counters printed at close.
        .args(["-x", "FI_RDMX_DEVICE=udp", "-x", "FI_RDMX_STATS=1"])
        .arg(&exe)
        .arg("8")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let mpirun = c.spawn().expect("mpirun");
    let sprayer = {
        let (exe, launcher, stop) = (exe.clone(), mpirun.id(), stop.clone());
        std::thread::spawn(move || spray(exe, launcher, stop))
    };
    let out = procs::wait_output(mpirun, Duration::from_secs(240));
    stop.store(true, Ordering::Relaxed);
    let sprayed = sprayer.join().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "the job failed after {:?}:\n{t}", t0.elapsed());
    assert!(t.contains("spray: all checks passed"), "{t}");
    let total: u64 = sprayed.sent.iter().sum();
    println!("sprayed {total} datagrams at {} ports in {:?}:", sprayed.ports.len(), t0.elapsed());
    for (k, n) in KINDS.iter().zip(sprayed.sent) {
        println!("  {k:?}: {n}");
    }
    let rounds = t.lines().find_map(|l| l.strip_prefix("spray: all checks passed, ")).unwrap_or("?");
    println!("job: {rounds}");
    let names = [
        "packets_received",
        "dropped_malformed_packets",
        "dropped_checksum",
        "dropped_job_key",
        "dropped_stale",
        "dropped_malformed_messages",
        "packets_resent",
    ];
    for n in names {
        println!("rdmx: {n} {} (sum over endpoints)", counter(&t, n));
    }
    assert!(
        sprayed.ports.len() >= RANKS,
        "found the UDP ports of only {} ranks: {:?}",
        sprayed.ports.len(),
        sprayed.ports
    );
    assert!(total >= 1000, "only {total} datagrams sprayed");
    let malformed = counter(&t, "dropped_malformed_packets");
    let checksum = counter(&t, "dropped_checksum");
    let job = counter(&t, "dropped_job_key");
    assert!(
        malformed > 0 && checksum > 0 && job > 0,
        "drop counters did not rise: malformed {malformed}, checksum {checksum}, job key {job}\n{t}"
    );
    // Every sprayed datagram that reached a socket is counted by one of them
    // (some may be lost to full socket buffers, none is taken for data).
    let dropped = malformed + checksum + job;
    assert!(
        dropped <= total,
        "more drops ({dropped}) than datagrams sprayed ({total}): the job's own traffic was dropped"
    );
}

/// The sprayed job docs/reliability.md describes is this test's (nothing is
/// started: fast).
#[test]
fn reliability_doc_states_the_sprayed_job() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reliability.md");
    let doc =
        std::fs::read_to_string(path).expect("docs/reliability.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let want = format!("Hostile datagrams at the live UDP ports of an OpenMPI job (np {RANKS}, udp device)");
    assert!(doc.contains(&want), "docs/reliability.md should say \"{want}\" (fi_tests/tests/spray.rs)");
}
