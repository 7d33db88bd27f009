//! Faults as they happen to real jobs, through the public API with two
//! processes (`rdmx_sender` posting 4 MiB sends, `rdmx_peer` receiving):
//! the receiver is killed with SIGKILL mid-transfer (on this host over udp and
//! shm, and on another simulated host), its host's link goes down, or it never
//! existed. Every pending send must complete (no hang), the failed ones with an
//! error whose `fi_cq_strerror` names the peer, within the bound each case
//! allows: ICMP makes a killed UDP peer fail in well under a second; a cut link
//! sends no ICMP, so it fails at the peer timeout.
use fi_tests::hosts::Hosts;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

struct Proc {
    child: Child,
    lines: mpsc::Receiver<String>,
}

fn spawn(wrap: &[String], bin: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
    let (prog, pre) = match wrap.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (bin.to_string(), vec![]),
    };
    let mut c = Command::new(prog);
    c.args(pre);
    if !wrap.is_empty() {
        c.arg(bin);
    }
    c.args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    for (k, v) in fi_tests::child_env() {
        c.env(k, v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("spawn");
    let out: ChildStdout = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    Proc { child, lines }
}

impl Proc {
    fn expect(&self, prefix: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => continue,
                Err(_) => panic!("no '{prefix}' line within {within:?}"),
            }
        }
    }
    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the sender reported after the fault: (ok, errors, ms of the last
/// completion after `fault_at_ms`).
struct Outcome {
    ok: usize,
    errs: Vec<String>,
    last_after_fault: Duration,
}

const COUNT: usize = 8;
const SIZE: &str = "4194304";

/// Runs sender (wrap_s) -> peer (wrap_p); once the first send completed,
/// applies `fault`; collects every completion.
fn scenario(domain: &str, wrap_s: &[String], wrap_p: &[String], env: &[(&str, &str)], fault: impl FnOnce()) -> Outcome {
    fi_tests::init();
    let mut peer = spawn(wrap_p, env!("CARGO_BIN_EXE_rdmx_peer"), &[domain], env);
    let paddr = peer.expect("ADDR", Duration::from_secs(20)).split_whitespace().nth(1).unwrap().to_string();
    let mut sender = spawn(wrap_s, env!("CARGO_BIN_EXE_rdmx_sender"), &[domain, &COUNT.to_string(), SIZE], env);
    let saddr = sender.expect("ADDR", Duration::from_secs(20)).split_whitespace().nth(1).unwrap().to_string();
    peer.say(&saddr);
    sender.say(&paddr);
    sender.expect("SENT", Duration::from_secs(20));
    let mut ok = 0;
    let mut errs = Vec::new();
    // The first completion: transfers are under way.
    let first = sender.expect("", Duration::from_secs(30));
    if first.starts_with("OK") {
        ok += 1;
    } else {
        errs.push(first.clone());
    }
    let fault_at = Instant::now();
    fault();
    let mut last = Duration::ZERO;
    while ok + errs.len() < COUNT {
        let l = sender.expect("", Duration::from_secs(60));
        last = fault_at.elapsed();
        if l.starts_with("OK") {
            ok += 1;
        } else if l.starts_with("ERR") {
            errs.push(l);
        }
    }
    sender.expect("DONE", Duration::from_secs(5));
    Outcome { ok, errs, last_after_fault: last }
}

fn check(o: &Outcome, within: Duration, what: &str) {
    println!("{what}: {} completed, {} failed; the last {:?} after the fault", o.ok, o.errs.len(), o.last_after_fault);
    assert!(!o.errs.is_empty(), "{what}: nothing failed");
    for e in &o.errs {
        assert!(e.contains("(peer rdmx://"), "{what}: the error does not name the peer: {e}");
    }
    assert!(o.last_after_fault <= within, "{what}: took {:?}, bound {within:?}", o.last_after_fault);
}

fn kill_peer() {
    let _ = Command::new("pkill").args(["-9", "-f", "rdmx_peer"]).status();
}

#[test]
fn sigkill_of_the_receiver_on_this_host_udp_and_shm() {
    for domain in ["udp", "shm"] {
        let o = scenario(domain, &[], &[], &[], kill_peer);
        check(&o, Duration::from_secs(3), &format!("kill -9 on this host over {domain}"));
    }
}

#[test]
fn sigkill_of_the_receiver_on_another_host() {
    let Some(hosts) = Hosts::create("rdmxft", 197, 2, 0) else { return };
    let o = scenario("auto", &hosts.run_on(0), &hosts.run_on(1), &[], kill_peer);
    check(&o, Duration::from_secs(3), "kill -9 on another host");
}

#[test]
fn the_receivers_link_goes_down() {
    let Some(hosts) = Hosts::create("rdmxft", 197, 2, 0) else { return };
    let ns = hosts.hosts[1].ns.clone();
    // No ICMP comes back from a cut link: the peer timeout decides (shortened
    // here to keep the test quick; the default is 30 s).
    let o = scenario("auto", &hosts.run_on(0), &hosts.run_on(1), &[("FI_RDMX_PEER_TIMEOUT", "4000")], || {
        assert!(Command::new("ip").args(["-n", &ns, "link", "set", "rdmxftv1", "down"]).status().unwrap().success());
    });
    check(&o, Duration::from_secs(8), "link down");
    kill_peer();
}

#[test]
fn a_receiver_that_never_answered() {
    let Some(hosts) = Hosts::create("rdmxft", 197, 2, 0) else { return };
    fi_tests::init();
    // A peer that existed long enough to give its address, then vanished
    // before anything was sent: the sender's first datagram draws ICMP.
    let peer = spawn(&hosts.run_on(1), env!("CARGO_BIN_EXE_rdmx_peer"), &["auto"], &[]);
    let paddr = peer.expect("ADDR", Duration::from_secs(20)).split_whitespace().nth(1).unwrap().to_string();
    kill_peer();
    drop(peer);
    let mut sender = spawn(&hosts.run_on(0), env!("CARGO_BIN_EXE_rdmx_sender"), &["auto", "4", "65536"], &[]);
    sender.expect("ADDR", Duration::from_secs(20));
    let t0 = Instant::now();
    sender.say(&paddr);
    for _ in 0..4 {
        let l = sender.expect("ERR", Duration::from_secs(10));
        assert!(l.contains("(peer rdmx://"), "{l}");
    }
    sender.expect("DONE", Duration::from_secs(5));
    assert!(t0.elapsed() < Duration::from_secs(3), "a peer that never answered failed after {:?}", t0.elapsed());
}
