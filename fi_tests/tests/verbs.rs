//! The verbs UD device through libfabric's own tools, as users run them: two
//! `fi_pingpong` processes on the `verbs` domain (`-d verbs`, no rdmx variable),
//! every size with data checks; the same under 5% loss on the wire (netem on
//! `lo`, which carries Soft-RoCE's traffic between endpoints of one host) and
//! under rdmx's fault decorator over the verbs device. Run in the Soft-RoCE VM
//! by `scripts/test-verbs.sh`; on a host without an RDMA device they pass
//! saying so (see `verbs_device_present`).
use fi_tests::procs::{pingpong, text};
use fi_tests::*;
use std::process::Command;

fn checked_pingpong(args: &[&str], env: &[(&str, &str)], port: u16) {
    let (s, c) = pingpong(args, env, port, "127.0.0.1", &[], &[]);
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "fi_pingpong {args:?} {env:?} failed\nserver:\n{st}\nclient:\n{ct}");
    // fi_pingpong -c verifies the data and prints one line of figures per size.
    assert!(ct.lines().any(|l| l.starts_with("bytes")), "no result lines:\n{ct}");
    println!("{}", ct.lines().filter(|l| !l.starts_with("libfabric:")).collect::<Vec<_>>().join("\n"));
}

#[test]
fn verbs_pingpong_every_size_with_data_checks() {
    if !verbs_device_present() {
        return;
    }
    init();
    checked_pingpong(&["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"], &[], 46011);
    checked_pingpong(&["-d", "verbs", "-S", "all", "-c", "-I", "10"], &[], 46012);
}

/// netem on `lo` for the life of the guard.
struct Netem;

impl Netem {
    fn loss(pct: u32) -> Netem {
        let st = Command::new("tc").args(["qdisc", "add", "dev", "lo", "root", "netem", "loss", &format!("{pct}%")]).status().expect("tc");
        assert!(st.success(), "tc qdisc add dev lo root netem loss {pct}% failed (sch_netem missing?)");
        Netem
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", "lo", "root"]).status();
    }
}

#[test]
fn verbs_pingpong_under_wire_loss_and_injected_faults() {
    if !verbs_device_present() {
        return;
    }
    init();
    {
        let _loss = Netem::loss(5);
        for (i, size) in ["8", "4096", "65536", "1048576"].into_iter().enumerate() {
            checked_pingpong(&["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", "30"], &[], 46020 + i as u16);
        }
    }
    let faults = [("FI_RDMX_FAULT_DROP", "5"), ("FI_RDMX_FAULT_DUP", "2"), ("FI_RDMX_FAULT_REORDER", "5")];
    for (i, size) in ["8", "65536", "1048576"].into_iter().enumerate() {
        checked_pingpong(&["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", "30"], &faults, 46030 + i as u16);
    }
}
