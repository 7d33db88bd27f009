//! End-to-end comparison of rdmx with libfabric's own providers, measured in one
//! run on this host: `fi_pingpong -e rdm` between two processes over loopback,
//! latency of small messages and bandwidth of large ones, printed as a markdown
//! table with ratios against a reference provider.
//!
//! ```text
//! cargo run --release -p rdmx-benches --bin compare -- [--sizes 64,65536,1048576] [--reps 3]
//! ```
//! Needs `fi_pingpong` (libfabric-bin) and the provider built into
//! `build-out/lib` (`./scripts/build.sh`); `RDMX_PROVIDER_DIR` overrides it.
//! Each cell is the best of `--reps` runs (the machine is shared; the best run
//! is the least disturbed one).
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// (label, fi_pingpong -p value, extra environment)
const PROVIDERS: &[(&str, &str, &[(&str, &str)])] = &[
    ("rdmx shm", "rdmx", &[("FI_RDMX_DEVICE", "shm")]),
    ("rdmx auto", "rdmx", &[("FI_RDMX_DEVICE", "auto")]),
    ("rdmx udp", "rdmx", &[("FI_RDMX_DEVICE", "udp")]),
    ("rdmx shm, CMA refused", "rdmx", &[("FI_RDMX_DEVICE", "shm"), ("FI_RDMX_SHM_CMA", "0")]),
    ("shm (libfabric)", "shm", &[]),
    ("tcp;ofi_rxm", "tcp;ofi_rxm", &[]),
    ("udp;ofi_rxd", "udp;ofi_rxd", &[]),
];

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(47592)
}

/// One fi_pingpong run; returns (µs per one-way message, MB/s) from the client's
/// result line.
fn run(prov: &str, env: &[(&str, &str)], size: usize, dir: &str) -> Option<(f64, f64)> {
    let iters = if size <= 4096 { 5000 } else if size <= 65536 { 2000 } else { 200 };
    let port = free_port().to_string();
    let mk = |extra: &[&str]| {
        let mut c = Command::new("fi_pingpong");
        c.env("FI_PROVIDER_PATH", dir).envs(env.iter().copied());
        c.args(["-p", prov, "-e", "rdm", "-I", &iters.to_string(), "-S", &size.to_string()]).args(extra);
        c.stdout(Stdio::piped()).stderr(Stdio::null());
        c
    };
    let mut server = mk(&["-B", &port]).spawn().ok()?;
    let t0 = Instant::now();
    let client = loop {
        std::thread::sleep(Duration::from_millis(50));
        let out = mk(&["-P", &port, "127.0.0.1"]).output().ok()?;
        if out.status.success() || t0.elapsed() > Duration::from_secs(5) {
            break out;
        }
    };
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&client.stdout);
    // bytes  #sent  #ack  total  time  MB/sec  usec/xfer  Mxfers/sec
    let line = text.lines().rev().find(|l| l.split_whitespace().count() == 8)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    Some((f[6].parse().ok()?, f[5].parse().ok()?))
}

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

fn main() {
    let mut sizes = vec![64usize, 4096, 65536, 1 << 20];
    let mut reps = 3;
    let mut reference = "shm (libfabric)".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--sizes" => sizes = args.next().expect("--sizes a,b,c").split(',').map(|s| s.trim().parse().expect("size")).collect(),
            "--reps" => reps = args.next().expect("--reps N").parse().expect("reps"),
            "--reference" => reference = args.next().expect("--reference LABEL"),
            other => panic!("unknown argument {other}"),
        }
    }
    let dir = std::env::var("RDMX_PROVIDER_DIR").unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../build-out/lib").to_string());
    assert!(std::path::Path::new(&dir).join("librdmx-fi.so").exists(), "no librdmx-fi.so in {dir}: run ./scripts/build.sh");
    let mut table: Vec<(&str, Vec<Option<(f64, f64)>>)> = Vec::new();
    for (label, prov, env) in PROVIDERS {
        let mut row = Vec::new();
        for &size in &sizes {
            let best = (0..reps).filter_map(|_| run(prov, env, size, &dir)).fold(None, |b: Option<(f64, f64)>, x| match b {
                Some(b) if b.0 <= x.0 => Some(b),
                _ => Some(x),
            });
            eprintln!("{label:>24} {:>8}: {best:?}", human(size));
            row.push(best);
        }
        table.push((label, row));
    }
    let refrow = table.iter().find(|(l, _)| *l == reference).map(|(_, r)| r.clone());
    println!("fi_pingpong -e rdm over loopback, best of {reps}; each cell: one-way latency µs / MB/s (ratio of MB/s to {reference})\n");
    print!("| provider |");
    for s in &sizes {
        print!(" {} |", human(*s));
    }
    println!();
    print!("|---|");
    for _ in &sizes {
        print!("---:|");
    }
    println!();
    for (label, row) in &table {
        print!("| {label} |");
        for (i, cell) in row.iter().enumerate() {
            match cell {
                Some((us, mbs)) => {
                    let ratio = refrow.as_ref().and_then(|r| r[i]).map(|(_, m)| format!(" ({:.2}×)", mbs / m)).unwrap_or_default();
                    print!(" {us:.2} µs / {mbs:.0}{ratio} |");
                }
                None => print!(" failed |"),
            }
        }
        println!();
    }
}
