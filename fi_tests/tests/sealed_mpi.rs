//! Sealed job traffic under a real MPI job across two simulated hosts, with
//! an attacker on the switch between them (`src/bin/rdmx_mitm.rs`).
//!
//! OpenMPI 4.1 (`pml cm`, `mtl ofi`) runs `fi_tests/mpi/alltoall.c` (rounds
//! of MPI_Alltoall at 8 B, 4 KiB and 64 KiB per peer, every element checked) with 4 ranks on 2 hosts (two per
//! host: shared memory within a host, UDP between them), the job's secret in a
//! file handed to every rank by the launcher (`mpirun -x
//! FI_RDMX_JOB_SECRET_FILE=...`, as fi_rdmx(7) says). While it runs, the
//! attacker captures sealed datagrams between the hosts and sends them again
//! from its own address and with the sender's, each altered in a bit, and
//! forgeries of every packet type naming the job and the receiver. The job
//! must finish with every byte intact; the ranks' counters (`FI_RDMX_STATS`
//! JSON documents) must say their traffic was tagged and count at least every
//! altered and forged datagram as refused, and every replay as one.
//!
//! The same under Intel MPI (hydra through the hosts' agent, the secret file
//! handed to every rank with `-genv`, as fi_rdmx(7) says).
use fi_tests::hosts::Hosts;
use fi_tests::procs::{self, text};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Rounds of the alltoall loop (three sizes each): long enough that the
/// attack is over well before the ranks close (a datagram still queued at a
/// closed endpoint would be counted nowhere).
const ROUNDS: usize = 2000;

#[test]
fn an_attacker_on_the_wire_cannot_touch_a_sealed_mpi_job() {
    fi_tests::init();
    let Some(exe) = procs::build_mpi("alltoall", &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi")) else {
        return;
    };
    let Some(hosts) = Hosts::create("rdmxsl", 197, 2, 0) else { return };
    let attack = fi_tests::attack::Attack::start(&hosts, env!("CARGO_BIN_EXE_rdmx_mitm"));
    let np = 4;
    let hostfile = hosts.hostfile(np / 2);
    let mut c = Command::new(&hosts.run_on(0)[0]);
    c.arg(&hosts.run_on(0)[1])
        .arg("mpirun")
        .args(["--allow-run-as-root", "-np", &np.to_string(), "--hostfile"])
        .arg(&hostfile)
        .args(["--mca", "plm_rsh_agent"])
        .arg(&hosts.agent)
        .args(["--mca", "oob_tcp_if_include", "10.197.0.0/24"]) // Hosts::create(.., 197, ..)
        .args(["--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "rdmx"])
        .args(["--mca", "btl", "self", "--mca", "mtl_ofi_verbose", "1"])
        .args(["-x", "FI_PROVIDER=rdmx", "-x"])
        .arg(format!("FI_PROVIDER_PATH={}", fi_tests::provider_dir().display()))
        .args(attack.rank_env().iter().flat_map(|(k, v)| ["-x".to_string(), format!("{k}={v}")]))
        .arg(&exe)
        .arg(ROUNDS.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
        c.env_remove(k);
    }
    let job = c.spawn().expect("mpirun");
    let out = procs::wait_output(job, Duration::from_secs(240));
    let t = text(&out);
    assert!(out.status.success(), "the job failed:\n{t}");
    assert!(t.contains(&format!("alltoall: all checks passed on {np} ranks, {} rounds, 2 hosts", 3 * ROUNDS)), "{t}");
    fi_tests::assert_mtl_chose_rdmx(&t, np);
    attack.check(&hosts, np);
}

#[test]
fn an_attacker_on_the_wire_cannot_touch_a_sealed_intel_mpi_job() {
    fi_tests::init();
    let Some(impi) = fi_tests::impi::dir() else { return };
    let exe = fi_tests::impi::build(&impi, "alltoall", &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("impi"));
    let Some(hosts) = Hosts::create("rdmxsi", 194, 2, 0) else { return };
    let attack = fi_tests::attack::Attack::start(&hosts, env!("CARGO_BIN_EXE_rdmx_mitm"));
    let np = 4;
    let names = format!("{},{}", hosts.hosts[0].name, hosts.hosts[1].name);
    let mpiexec = fi_tests::impi::command(&impi, "mpiexec");
    let mut c = Command::new(&hosts.run_on(0)[0]);
    c.arg(&hosts.run_on(0)[1])
        .arg(mpiexec.get_program())
        .args(["-n", &np.to_string(), "-ppn", "2", "-hosts", &names, "-bootstrap", "ssh", "-bootstrap-exec"])
        .arg(&hosts.agent)
        // I_MPI_DEBUG=5: rank 0 names the libfabric provider it chose (asserted below).
        .args(["-genv", "I_MPI_FABRICS", "ofi", "-genv", "I_MPI_DEBUG", "5"])
        .args(["-genv", "FI_PROVIDER", "rdmx", "-genv", "FI_PROVIDER_PATH"])
        .arg(fi_tests::provider_dir())
        .args(["-genv", "I_MPI_ROOT"])
        .arg(&impi)
        .args(["-genv", "LD_LIBRARY_PATH"])
        .arg(impi.join("lib"))
        .args(attack.rank_env().iter().flat_map(|(k, v)| ["-genv".to_string(), k.clone(), v.clone()]))
        .arg(&exe)
        .arg(ROUNDS.to_string())
        .envs(mpiexec.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
        c.env_remove(k);
    }
    let out = procs::wait_output(c.spawn().expect("mpiexec"), Duration::from_secs(240));
    let t = text(&out);
    assert!(out.status.success(), "the Intel MPI job failed:\n{t}");
    assert!(t.contains(&format!("alltoall: all checks passed on {np} ranks, {} rounds, 2 hosts", 3 * ROUNDS)), "{t}");
    fi_tests::assert_impi_chose_rdmx(&t);
    attack.check(&hosts, np);
}
