//! A multi-host MPI job as users run it: OpenMPI 4.1 (`pml cm`, `mtl ofi`)
//! launching ranks onto simulated hosts (network namespaces with their own host
//! names, through a `plm_rsh_agent` instead of ssh), two ranks per host so that
//! rdmx's default `auto` device uses shared memory and UDP at once, **no rdmx
//! variable** but the fault injection that makes the network hostile: nftables
//! drops 5% of UDP on every host, rdmx's fault device adds 25% reordering, 1%
//! duplication and 0.1% corruption (seeded). Every byte is checksummed by the
//! program; the job must finish within a bound.
use fi_tests::hosts::Hosts;
use fi_tests::procs::{self, text};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// UDP datagrams nftables drops on every host of a lossy job, in percent.
const LOSS_PCT: u32 = 5;
/// What rdmx's fault device adds in a lossy job (`FI_RDMX_FAULT_*`, percent).
const FAULTS: [(&str, &str); 3] =
    [("FI_RDMX_FAULT_REORDER", "25"), ("FI_RDMX_FAULT_DUP", "1"), ("FI_RDMX_FAULT_CORRUPT", "0.1")];
/// The lossy OpenMPI jobs: (hosts, ranks, fault seed).
const LOSSY_ON_TWO: (usize, usize, u32) = (2, 4, 5);
const LOSSY_ON_THREE: (usize, usize, u32) = (3, 6, 11);

fn build(name: &str) -> Option<PathBuf> {
    procs::build_mpi(name, &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi"))
}

fn lossy_job((n_hosts, np, seed): (usize, usize, u32)) {
    job(
        n_hosts,
        np,
        Some(seed),
        "multihost",
        &[],
        &format!("multihost: all checks passed on {n_hosts} hosts, {np} ranks"),
    );
}

/// `np` ranks over `n_hosts` hosts; with `faults` (a seed) the network drops,
/// reorders, duplicates and corrupts as the module doc says, without it the
/// job runs exactly as a user's would, with no rdmx variable at all.
fn job(n_hosts: usize, np: usize, faults: Option<u32>, program: &str, args: &[&str], want: &str) {
    fi_tests::init();
    let Some(exe) = build(program) else { return };
    let Some(hosts) = Hosts::create("rdmxmh", 198, n_hosts, if faults.is_some() { LOSS_PCT } else { 0 }) else {
        return;
    };
    let hostfile = hosts.hostfile(np / n_hosts);
    let dir = fi_tests::provider_dir();
    // mpirun itself runs on host 0; the others are reached through the agent.
    let mut c = Command::new(&hosts.run_on(0)[0]);
    c.arg(&hosts.run_on(0)[1])
        .arg("mpirun")
        .args(["--allow-run-as-root", "-np", &np.to_string(), "--hostfile"])
        .arg(&hostfile)
        .args(["--mca", "plm_rsh_agent"])
        .arg(&hosts.agent)
        .args(["--mca", "oob_tcp_if_include", "10.198.0.0/24"]) // Hosts::create(.., 198, ..)
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
            // Each rank names the provider its mtl chose (asserted below).
            "--mca",
            "mtl_ofi_verbose",
            "1",
        ])
        .args(["-x", "FI_PROVIDER=rdmx", "-x"])
        .arg(format!("FI_PROVIDER_PATH={}", dir.display()))
        .args(match faults {
            Some(seed) => FAULTS
                .iter()
                .flat_map(|(k, v)| ["-x".to_string(), format!("{k}={v}")])
                .chain(["-x".to_string(), format!("FI_RDMX_FAULT_SEED={seed}")])
                .collect::<Vec<String>>(),
            None => vec![],
        })
        .arg(&exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // No other rdmx variable reaches the ranks.
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
        c.env_remove(k);
    }
    let t0 = Instant::now();
    let out = procs::wait_output(c.spawn().expect("mpirun"), Duration::from_secs(240));
    let took = t0.elapsed();
    let t = text(&out);
    assert!(out.status.success(), "the job failed after {took:?}:\n{t}");
    assert!(t.contains(want), "{t}");
    fi_tests::assert_mtl_chose_rdmx(&t, np);
    // No wall-clock bound beyond the child's deadline above: how fast the job
    // runs is the benchmarks' question (benches/), not this test's.
    println!("the job took {took:?}");
    for i in 0..n_hosts {
        let d = hosts.dropped(i);
        println!("{}: nftables dropped {d} UDP datagrams", hosts.hosts[i].name);
        assert!(faults.is_none() || d > 0, "no loss on {}", hosts.hosts[i].name);
    }
    println!("{want} in {took:?}");
}

/// The same job under Intel MPI (hydra, `-bootstrap-exec` through the hosts'
/// agent), from the PyPI install of scripts/setup-impi.sh.
#[test]
fn intel_mpi_np4_on_two_lossy_hosts_with_default_settings() {
    fi_tests::init();
    let impi = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build-out/impi");
    if !impi.join("bin/mpiexec").exists() {
        fi_tests::skip("Intel MPI is not installed (scripts/setup-impi.sh)");
        return;
    }
    let impi = impi.canonicalize().unwrap();
    let bin = impi.join("bin");
    let lib = impi.join("lib");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("impi");
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("multihost");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi/multihost.c");
    let st = Command::new(bin.join("mpicc"))
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .env("I_MPI_ROOT", &impi)
        .env("PATH", &path)
        .env("LD_LIBRARY_PATH", &lib)
        .status()
        .unwrap();
    assert!(st.success(), "Intel MPI mpicc failed");
    let Some(hosts) = Hosts::create("rdmxim", 196, 2, 5) else { return };
    let dir = fi_tests::provider_dir();
    let names = format!("{},{}", hosts.hosts[0].name, hosts.hosts[1].name);
    let mut c = Command::new(&hosts.run_on(0)[0]);
    c.arg(&hosts.run_on(0)[1])
        .arg(bin.join("mpiexec"))
        .args(["-n", "4", "-ppn", "2", "-hosts", &names, "-bootstrap", "ssh", "-bootstrap-exec"])
        .arg(&hosts.agent)
        // I_MPI_DEBUG=5: rank 0 names the libfabric provider it chose (asserted below).
        .args(["-genv", "I_MPI_FABRICS", "ofi", "-genv", "I_MPI_DEBUG", "5"])
        .args(["-genv", "FI_PROVIDER", "rdmx", "-genv", "FI_PROVIDER_PATH"])
        .arg(&dir)
        .args(["-genv", "I_MPI_ROOT"])
        .arg(&impi)
        .args(["-genv", "LD_LIBRARY_PATH"])
        .arg(&lib)
        .arg(&exe)
        .env("I_MPI_ROOT", &impi)
        .env("PATH", &path)
        .env("LD_LIBRARY_PATH", &lib)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
        c.env_remove(k);
    }
    let t0 = Instant::now();
    let out = procs::wait_output(c.spawn().expect("mpiexec"), Duration::from_secs(240));
    let t = text(&out);
    assert!(out.status.success(), "Intel MPI job failed after {:?}:\n{t}", t0.elapsed());
    assert!(t.contains("multihost: all checks passed on 2 hosts, 4 ranks"), "{t}");
    fi_tests::assert_impi_chose_rdmx(&t);
    for i in 0..2 {
        assert!(hosts.dropped(i) > 0, "no loss on {}", hosts.hosts[i].name);
    }
    println!("Intel MPI: np 4 on 2 lossy hosts in {:?}", t0.elapsed());
}

#[test]
fn np4_on_two_lossy_hosts_with_default_settings() {
    lossy_job(LOSSY_ON_TWO);
}

/// 16 ranks over the two hosts (8 each, so shared memory and UDP at once),
/// oversubscribed on 2 cores, with no rdmx variable and no injected fault:
/// the alltoall loop (8 B, 4 KiB and 64 KiB per peer, 10 rounds each, then an
/// uneven Alltoallv), every element checked. (multihost.c's pairwise
/// exchanges up to 4 MiB, 2.5 GB in all at np 16, outlast the time bound on
/// 2 cores.)
#[test]
fn np16_on_two_hosts_with_default_settings() {
    job(2, 16, None, "alltoall", &["10"], "alltoall: all checks passed on 16 ranks, 30 rounds, 2 hosts");
}

#[test]
fn np6_on_three_lossy_hosts_through_a_bridge() {
    lossy_job(LOSSY_ON_THREE);
}

/// docs/reliability.md's item on this test states its loss, faults and jobs
/// (no job is started: fast, and runs anywhere).
#[test]
fn reliability_doc_states_the_lossy_jobs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reliability.md");
    let doc =
        std::fs::read_to_string(path).expect("docs/reliability.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let [(_, reorder), (_, dup), (_, corrupt)] = FAULTS;
    let ((h2, np2, _), (h3, np3, _)) = (LOSSY_ON_TWO, LOSSY_ON_THREE);
    let want = format!("**{LOSS_PCT} % UDP loss on every host (nftables), {reorder} % reordering, {dup} % duplication, {corrupt} % corruption (fault device), OpenMPI np {np2} on {h2} hosts and np {np3} on {h3} hosts**");
    assert!(doc.contains(&want), "docs/reliability.md should say \"{want}\" (fi_tests/tests/multihost.rs)");
    assert_eq!(
        FAULTS.map(|(k, _)| k),
        ["FI_RDMX_FAULT_REORDER", "FI_RDMX_FAULT_DUP", "FI_RDMX_FAULT_CORRUPT"],
        "the phrase above names them in this order"
    );
}
