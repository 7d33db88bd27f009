//! The verbs UD device through libfabric's own tools, as users run them: two
//! `fi_pingpong` processes on the `verbs` domain (`-d verbs`), every size with
//! data checks, on one device (no rdmx variable) and between two (`rxe0` and
//! `rxe1` on the two ends of a veth pair in the VM, each process's device named
//! by `FI_RDMX_IFACE`, so datagrams leave one device and enter the other); the
//! latter under 5% loss on the wire (netem on `veth1`) and under rdmx's fault
//! decorator. Run in the Soft-RoCE VM by `scripts/test-verbs.sh`; on a host
//! without an RDMA device they pass saying so (see `verbs_device_present`).
use fi_tests::procs::{pingpong, text};
use fi_tests::*;
use std::process::Command;

/// Each process on its own device (the VM's rxe0 and rxe1).
const SERVER_ON_RXE0: &[&str] = &["env", "FI_RDMX_IFACE=rxe0"];
const CLIENT_ON_RXE1: &[&str] = &["env", "FI_RDMX_IFACE=rxe1"];

fn two_devices_present() -> bool {
    let both = ["rxe0", "rxe1"].iter().all(|d| std::path::Path::new("/sys/class/infiniband").join(d).exists());
    if !both {
        assert!(std::env::var("RDMX_VERBS_REQUIRED").map_or(true, |v| v != "1"), "RDMX_VERBS_REQUIRED=1 and not both rxe0 and rxe1 are here");
        eprintln!("skip: the two-device tests need rxe0 and rxe1 (the Soft-RoCE VM)");
    }
    both
}

fn checked_pingpong(args: &[&str], env: &[(&str, &str)], port: u16) {
    checked_pingpong_on(args, env, port, &[], &[]);
}

fn checked_pingpong_on(args: &[&str], env: &[(&str, &str)], port: u16, server: &[&str], client: &[&str]) {
    let (s, c) = pingpong(args, env, port, "127.0.0.1", server, client);
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "fi_pingpong {args:?} {env:?} failed\nserver:\n{st}\nclient:\n{ct}");
    // fi_pingpong -c verifies the data and prints one line of figures per size.
    assert!(ct.lines().any(|l| l.starts_with("bytes")), "no result lines:\n{ct}");
    println!("{}", ct.lines().filter(|l| !l.starts_with("libfabric:")).collect::<Vec<_>>().join("\n"));
}

#[test]
fn verbs_pingpong_every_size_with_data_checks_on_one_and_two_devices() {
    if !verbs_device_present() {
        return;
    }
    init();
    checked_pingpong(&["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"], &[], 46011);
    checked_pingpong(&["-d", "verbs", "-S", "all", "-c", "-I", "10"], &[], 46012);
    if two_devices_present() {
        checked_pingpong_on(&["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"], &[], 46013, SERVER_ON_RXE0, CLIENT_ON_RXE1);
    }
}

/// netem on a device for the life of the guard.
struct Netem(&'static str);

impl Netem {
    fn loss(dev: &'static str, pct: u32) -> Netem {
        let st = Command::new("tc").args(["qdisc", "add", "dev", dev, "root", "netem", "loss", &format!("{pct}%")]).status().expect("tc");
        assert!(st.success(), "tc qdisc add dev {dev} root netem loss {pct}% failed (sch_netem missing?)");
        Netem(dev)
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", self.0, "root"]).status();
    }
}

#[test]
fn verbs_pingpong_between_two_devices_under_wire_loss_and_injected_faults() {
    if !verbs_device_present() || !two_devices_present() {
        return;
    }
    init();
    {
        // Loss on both ends of the pair: each direction leaves through one.
        let _loss = (Netem::loss("veth0", 5), Netem::loss("veth1", 5));
        for (i, size) in ["8", "4096", "65536", "1048576"].into_iter().enumerate() {
            checked_pingpong_on(&["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", "30"], &[], 46020 + i as u16, SERVER_ON_RXE0, CLIENT_ON_RXE1);
        }
    }
    let faults = [("FI_RDMX_FAULT_DROP", "5"), ("FI_RDMX_FAULT_DUP", "2"), ("FI_RDMX_FAULT_REORDER", "5")];
    for (i, size) in ["8", "65536", "1048576"].into_iter().enumerate() {
        checked_pingpong_on(&["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", "30"], &faults, 46030 + i as u16, SERVER_ON_RXE0, CLIENT_ON_RXE1);
    }
}

/// The value of `rdmx: <name> <n>` in one process's `FI_RDMX_STATS=1` output.
fn stat(out: &str, name: &str) -> u64 {
    let key = format!("rdmx: {name} ");
    out.lines().find_map(|l| l.trim().strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok()).unwrap_or_else(|| panic!("no {name} in:\n{out}"))
}

/// A rendezvous over UD goes through the domain's registration cache:
/// fi_pingpong registers its buffers (`fi_mr_reg`, which on the verbs domain
/// is an `ibv_reg_mr` through the cache: a miss), every 1 MiB message is
/// announced with a key (the application's, from its descriptor, so nothing
/// more is looked up: measured, server and client alike), and the receiver
/// gets the bytes by windows (UD cannot read).
#[test]
fn verbs_rendezvous_moves_the_registration_cache_counters() {
    if !verbs_device_present() {
        return;
    }
    init();
    let (s, c) = pingpong(&["-d", "verbs", "-m", "tagged", "-S", "1048576", "-c", "-I", "20"], &[("FI_RDMX_STATS", "1")], 46021, "127.0.0.1", &[], &[]);
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        let (misses, cached) = (stat(out, "mr_cache_misses"), stat(out, "mr_cache_bytes_cached"));
        let keyed = stat(out, "rendezvous_registrations") + stat(out, "rendezvous_registrations_from_desc");
        println!("{who}: mr_cache_misses {misses}, mr_cache_bytes_cached {cached}, rendezvous keys {keyed}, windowed {}", stat(out, "rendezvous_windowed"));
        assert!(misses >= 1 && cached >= 1 << 20, "{who}: the registration went around the cache (misses {misses}, {cached} bytes cached)");
        assert!(keyed >= 20, "{who}: {keyed} keys announced for at least 20 rendezvous messages");
        assert!(stat(out, "rendezvous_windowed") >= 20, "{who}: fewer than 20 windowed rendezvous received");
        assert_eq!(stat(out, "rendezvous_pulled"), 0, "{who}: UD cannot read");
    }
}
