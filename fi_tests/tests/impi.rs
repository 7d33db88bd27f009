//! The MPICH family: Intel MPI (ch4:ofi, from PyPI, installed by
//! scripts/setup-impi.sh into build-out/impi) over the system libfabric with
//! `I_MPI_FABRICS=ofi FI_PROVIDER=rdmx`; `I_MPI_DEBUG=5` shows the chosen provider.
use fi_tests::procs::{self, text};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

fn build(dir: &Path, name: &str) -> PathBuf {
    fi_tests::impi::build(dir, name, &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("impi"))
}

fn run(dir: &Path, exe: &PathBuf, np: u32, device: &str, args: &[&str]) -> String {
    fi_tests::init();
    let mut c = fi_tests::impi::command(dir, "mpiexec");
    c.args(["-n", &np.to_string()])
        .arg(exe)
        .args(args)
        .env("I_MPI_FABRICS", "ofi")
        .env("I_MPI_DEBUG", "5")
        .env("FI_PROVIDER", "rdmx")
        .env("FI_PROVIDER_PATH", fi_tests::provider_dir())
        .env("FI_RDMX_DEVICE", device)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = procs::wait_output(c.spawn().expect("mpiexec"), Duration::from_secs(300));
    let t = text(&out);
    assert!(out.status.success(), "Intel MPI -n {np} {} on {device} failed:\n{t}", exe.display());
    fi_tests::assert_impi_chose_rdmx(&t);
    t
}

#[test]
fn intel_mpi_runs_every_mpi_program_over_rdmx() {
    let Some(dir) = fi_tests::impi::dir() else { return };
    let p2p = build(&dir, "p2p");
    let coll = build(&dir, "coll");
    let threads = build(&dir, "threads");
    let rma = build(&dir, "rma");
    for (np, dev) in [(2, "auto"), (2, "udp"), (4, "shm")] {
        let out = run(&dir, &p2p, np, dev, &["4194304"]);
        assert!(out.contains(&format!("p2p: all checks passed on {np} ranks")), "{out}");
    }
    for np in [2, 4] {
        let out = run(&dir, &coll, np, "auto", &[]);
        assert!(out.contains("coll: all checks passed"), "{out}");
    }
    let out = run(&dir, &threads, 2, "auto", &[]);
    assert!(out.contains("threads: 4 threads"), "{out}");
    for np in [2, 4] {
        let out = run(&dir, &rma, np, "auto", &[]);
        assert!(out.contains("rma: all checks passed"), "{out}");
    }
}
