//! libfabric's own tools against rdmx in separate processes: fi_info and a real
//! two-process fi_pingpong on every device, data verified (-c).
use fi_tests::procs::{self, text};
use std::time::Duration;

fn fi_info(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    fi_tests::init();
    let child = procs::command("fi_info", env)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("fi_info (libfabric-bin) is installed");
    let out = procs::wait_output(child, Duration::from_secs(30));
    (out.status.success(), text(&out))
}

#[test]
fn fi_info_lists_rdmx_with_full_attributes_and_parameters() {
    let (ok, out) = fi_info(&["-l"], &[]);
    assert!(ok && out.contains("rdmx:"), "{out}");
    let (ok, out) = fi_info(&["-p", "rdmx", "-t", "FI_EP_RDM", "-v"], &[]);
    assert!(ok, "{out}");
    assert!(out.contains("FI_MSG") && out.contains("FI_TAGGED"), "{out}");
    assert!(out.contains("prov_name: rdmx"), "{out}");
    assert!(out.contains("type: FI_EP_RDM"), "{out}");
    let (ok, out) = fi_info(&["-p", "rdmx", "-t", "FI_EP_MSG"], &[]);
    assert!(!ok, "no MSG endpoints: {out}");
    let (_, out) = fi_info(&["-e"], &[]);
    for p in [
        "FI_RDMX_DEVICE",
        "FI_RDMX_IFACE",
        "FI_RDMX_PEER_TIMEOUT",
        "FI_RDMX_JOB_KEY",
        "FI_RDMX_FAULT_DROP",
        "FI_RDMX_MR_CACHE_ENABLE",
        "FI_RDMX_MR_CACHE_MAX_COUNT",
        "FI_RDMX_MR_CACHE_MAX_SIZE",
    ] {
        assert!(out.contains(p), "fi_info -e lacks {p}");
    }
}

#[test]
fn fi_info_log_level_shows_rdmx_warnings_only_when_asked() {
    let (_, quiet) = fi_info(&["-p", "rdmx"], &[("FI_RDMX_DEVICE", "bogus")]);
    assert!(!quiet.contains("FI_RDMX_DEVICE=bogus"), "{quiet}");
    let (_, loud) = fi_info(&["-p", "rdmx"], &[("FI_RDMX_DEVICE", "bogus"), ("FI_LOG_LEVEL", "warn")]);
    assert!(loud.contains("FI_RDMX_DEVICE=bogus"), "{loud}");
}

/// fi_info has no attribute for how job traffic goes; at info level rdmx
/// says it (for endpoints without an `auth_key` of their own), never the
/// secret.
#[test]
fn fi_info_at_info_level_says_which_job_traffic_mode_is_in_force() {
    let (_, clear) = fi_info(&["-p", "rdmx"], &[("FI_LOG_LEVEL", "info")]);
    assert!(
        clear.contains("job traffic over a wire, for endpoints without an auth_key of their own: clear"),
        "{clear}"
    );
    let secret = "the job's secret 0123456789";
    for (encrypt, mode) in [("0", "tagged"), ("1", "encrypted")] {
        let (_, out) = fi_info(
            &["-p", "rdmx"],
            &[("FI_LOG_LEVEL", "info"), ("FI_RDMX_JOB_SECRET", secret), ("FI_RDMX_JOB_ENCRYPT", encrypt)],
        );
        assert!(out.contains(&format!("of their own: {mode}:")), "{out}");
        assert!(!out.contains(secret), "the secret in the log: {out}");
    }
}

fn pingpong_on(device: &str, extra: &[&str]) {
    fi_tests::init();
    let mut args = vec!["-c", "-I", "20"];
    args.extend_from_slice(extra);
    let (s, c) = procs::pingpong(&args, &[("FI_RDMX_DEVICE", device)], "127.0.0.1", &[], &[]);
    let (st, ct) = (text(&s), text(&c));
    assert!(c.status.success(), "client failed on {device}:\n{ct}\nserver:\n{st}");
    assert!(s.status.success(), "server failed on {device}:\n{st}");
    assert!(ct.contains("usec/xfer") || ct.contains("Mbps"), "no numbers printed:\n{ct}");
    println!("{device}:\n{ct}");
}

#[test]
fn fi_pingpong_udp_all_sizes() {
    pingpong_on("udp", &["-S", "all"]);
}

#[test]
fn fi_pingpong_shm_all_sizes() {
    pingpong_on("shm", &["-S", "all"]);
}

#[test]
fn fi_pingpong_auto_all_sizes() {
    pingpong_on("auto", &["-S", "all"]);
}

#[test]
fn fi_pingpong_tagged_udp() {
    pingpong_on("udp", &["-m", "tagged", "-S", "1024"]);
}
