//! Real MPI programs (C, built with mpicc) over rdmx with OpenMPI 4.1:
//! `--mca pml cm --mca mtl ofi -x FI_PROVIDER=rdmx`, on every device.
use fi_tests::procs::{self, text};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

fn build(name: &str) -> Option<PathBuf> {
    procs::build_mpi(name, &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mpi"))
}

fn mpirun(exe: &PathBuf, np: u32, device: &str, args: &[&str], extra_mca: &[&str]) -> String {
    fi_tests::init();
    let dir = fi_tests::provider_dir();
    let np_s = np.to_string();
    let mut c = Command::new("mpirun");
    c.args(["--allow-run-as-root", "--oversubscribe", "-np", &np_s]);
    if extra_mca.is_empty() || !extra_mca.contains(&"pml") {
        c.args(["--mca", "pml", "cm", "--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "rdmx"])
            .args(["--mca", "btl", "self"])
            .args(["--mca", "mtl_ofi_verbose", "1"]);
    }
    c.args(extra_mca)
        .args(["-x", "FI_PROVIDER=rdmx", "-x", &format!("FI_PROVIDER_PATH={}", dir.display())])
        // "" = the default device, no rdmx variable at all (as users run it).
        .args(if device.is_empty() { vec![] } else { vec!["-x".to_string(), format!("FI_RDMX_DEVICE={device}")] })
        .arg(exe)
        .args(args)
        .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if device.is_empty() {
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
            c.env_remove(k);
        }
    }
    let out = procs::wait_output(c.spawn().expect("mpirun"), Duration::from_secs(300));
    let t = text(&out);
    assert!(out.status.success(), "mpirun -np {np} {} on {device} failed:\n{t}", exe.display());
    t
}

#[test]
fn p2p_semantics_on_udp_shm_and_auto() {
    let Some(exe) = build("p2p") else { return };
    for dev in ["udp", "shm", "auto"] {
        let out = mpirun(&exe, 2, dev, &[], &[]);
        assert!(out.contains("p2p: all checks passed"), "{out}");
        assert!(out.contains("rdmx"), "the mtl did not report rdmx:\n{out}");
    }
}

#[test]
fn collectives_np_2_4_8() {
    let Some(exe) = build("coll") else { return };
    for np in [2, 4, 8] {
        let out = mpirun(&exe, np, "auto", &[], &[]);
        assert!(out.contains("coll: all checks passed"), "{out}");
    }
    let out = mpirun(&exe, 4, "udp", &[], &[]);
    assert!(out.contains("coll: all checks passed"), "{out}");
}

/// 16 ranks on this 2-core machine (oversubscribed), rdmx's defaults with no
/// rdmx variable: the point-to-point, collective and one-sided programs, and
/// an alltoall loop (Alltoall at 8 B, 4 KiB and 64 KiB per peer, 20 rounds
/// each, then an uneven Alltoallv), every element checked.
#[test]
fn np16_oversubscribed_with_no_rdmx_variable() {
    let (Some(p2p), Some(coll), Some(rma), Some(a2a)) = (build("p2p"), build("coll"), build("rma"), build("alltoall")) else { return };
    let out = mpirun(&p2p, 16, "", &[], &[]);
    assert!(out.contains("p2p: all checks passed on 16 ranks"), "{out}");
    let out = mpirun(&coll, 16, "", &[], &[]);
    assert!(out.contains("coll: all checks passed on 16 ranks"), "{out}");
    let out = mpirun(&rma, 16, "", &[], &["--mca", "osc", "pt2pt"]);
    assert!(out.contains("rma: all checks passed on 16 ranks"), "{out}");
    let out = mpirun(&a2a, 16, "", &["20"], &[]);
    assert!(out.contains("alltoall: all checks passed on 16 ranks, 60 rounds, 1 hosts"), "{out}");
}

#[test]
fn thread_multiple_with_four_threads() {
    let Some(exe) = build("threads") else { return };
    let out = mpirun(&exe, 2, "auto", &[], &[]);
    assert!(out.contains("threads: 4 threads"), "{out}");
}

#[test]
fn one_sided_put_get_accumulate() {
    let Some(exe) = build("rma") else { return };
    // With pml cm, OpenMPI 4.1 runs MPI one-sided through osc/pt2pt, i.e. over
    // rdmx's tagged messages.
    let out = mpirun(&exe, 2, "auto", &[], &["--mca", "osc", "pt2pt"]);
    assert!(out.contains("rma: all checks passed"), "{out}");
}

/// osc/rdma over btl/ofi: OpenMPI's one-sided path drives rdmx's emulated RMA and
/// atomics. With FI_RDMX_STATS=1 each endpoint prints its counters at close
/// (`rdmx: rma_started <n>`); with pml ob1 nothing but btl/ofi opens rdmx
/// endpoints, so non-zero counts prove btl/ofi selected rdmx rather than falling
/// back.
#[test]
fn btl_ofi_selects_rdmx_for_one_sided() {
    let Some(exe) = build("rma") else { return };
    for dev in ["auto", "udp"] {
        let out = mpirun(
            &exe,
            2,
            dev,
            &[],
            &[
                "--mca", "pml", "ob1", "--mca", "btl", "self,vader,ofi", "--mca", "btl_ofi_provider_include", "rdmx",
                "--mca", "osc", "rdma", "--mca", "osc_rdma_btls", "ofi", "-x", "FI_RDMX_STATS=1",
            ],
        );
        assert!(out.contains("rma: all checks passed"), "{out}");
        let started: u64 = out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rdmx: rma_started "))
            .filter_map(|n| n.trim().parse::<u64>().ok())
            .sum();
        assert!(started > 0, "btl/ofi did not use rdmx for RMA:\n{out}");
        println!("{dev}: btl/ofi started {started} RMA/atomic operations through rdmx");
    }
}

/// The MPI programs over the verbs UD device (in the Soft-RoCE VM: see
/// `verbs_device_present`): point-to-point checksums at np 2, collectives at
/// np 4, one-sided through osc/pt2pt at np 2.
#[test]
fn verbs_p2p_collectives_and_one_sided() {
    if !fi_tests::verbs_device_present() {
        return;
    }
    let (Some(p2p), Some(coll), Some(rma)) = (build("p2p"), build("coll"), build("rma")) else { return };
    let out = mpirun(&p2p, 2, "verbs", &[], &[]);
    assert!(out.contains("p2p: all checks passed"), "{out}");
    let out = mpirun(&coll, 4, "verbs", &[], &[]);
    assert!(out.contains("coll: all checks passed"), "{out}");
    let out = mpirun(&rma, 2, "verbs", &[], &["--mca", "osc", "pt2pt"]);
    assert!(out.contains("rma: all checks passed"), "{out}");
}
