//! An attack on a sealed job across simulated hosts (`rdm/PROTOCOL.md` §2.5),
//! shared by the MPI tests that run one: the attacker (`src/bin/rdmx_mitm.rs`)
//! on the hosts' switch, the job's secret file and stats directory, and the
//! check that the ranks refused and counted everything it sent.
use crate::hosts::Hosts;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Sealed datagrams the attacker attacks, the first it sees (early in the
/// job: one sent to a rank that has finished would be counted nowhere); each
/// as it sees it: replayed from
/// its own address and the sender's, altered; the first 16 also forged).
pub const ATTACKED: u64 = 50;

pub struct Attack {
    pub dir: PathBuf,
    attacker: Option<Child>,
    /// The hosts' kernels' UDP drops before the job.
    rcvbuf_before: u64,
}

fn rcvbuf_errors(hosts: &Hosts) -> u64 {
    (0..hosts.hosts.len()).map(|i| hosts.udp_kernel_drops(i)).sum()
}

impl Attack {
    /// A work directory with the job's secret file and a stats directory;
    /// the attacker starts at once on the hosts' switch (`exe`: the test's
    /// `env!("CARGO_BIN_EXE_rdmx_mitm")`).
    pub fn start(hosts: &Hosts, exe: &str) -> Attack {
        let dir = std::env::temp_dir().join(format!("rdmx-attack-{}", crate::unique_tag()));
        std::fs::create_dir_all(dir.join("stats")).unwrap();
        std::fs::write(dir.join("job.key"), b"a per-job secret from /dev/urandom, here fixed\n").unwrap();
        let sw = hosts.run_on_switch();
        let attacker = Command::new(&sw[0])
            .args(&sw[1..])
            .arg(exe)
            .args([&ATTACKED.to_string(), "60000"])
            .arg(dir.join("attack.txt"))
            .arg(hosts.switch_ip())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the attacker");
        Attack { dir, attacker: Some(attacker), rcvbuf_before: rcvbuf_errors(hosts) }
    }

    /// What the ranks need: the launcher hands every rank these.
    pub fn rank_env(&self) -> Vec<(String, String)> {
        vec![
            ("FI_RDMX_JOB_SECRET_FILE".into(), self.dir.join("job.key").display().to_string()),
            ("FI_RDMX_STATS".into(), format!("{}/rank-%p.jsonl", self.dir.join("stats").display())),
        ]
    }

    /// After the job: waits for the attacker, then requires that it attacked
    /// [`ATTACKED`] datagrams, that each of `np` ranks' traffic was tagged,
    /// and that the ranks refused and counted every altered and forged
    /// datagram (forgeries by their tag) and every replay.
    /// A datagram a rank's kernel dropped (a full socket buffer, or an
    /// endpoint already closed: the port gone) reached no rdmx counter:
    /// those drops (genuine datagrams' among them) are allowed for.
    pub fn check(mut self, hosts: &Hosts, np: usize) {
        let kernel = rcvbuf_errors(hosts) - self.rcvbuf_before;
        let a = crate::procs::wait_output(self.attacker.take().unwrap(), Duration::from_secs(90));
        assert!(a.status.success(), "the attacker failed:\n{}", crate::procs::text(&a));
        let sent = counts(&self.dir.join("attack.txt"));
        println!("attacker: {sent:?}");
        assert_eq!(sent["captured"], ATTACKED, "the attacker saw too little of the job: {sent:?}");
        let (docs, modes, r) = rank_counters(&self.dir.join("stats"));
        assert_eq!(docs, np, "one closing document per rank");
        assert!(modes.iter().all(|m| m == "tagged"), "{modes:?}");
        let refused_bytes =
            r["dropped_auth"] + r["dropped_checksum"] + r["dropped_malformed_packets"] + r["dropped_job_key"];
        let refused_replays = r["dropped_replay"] + r["duplicates"] + r["dropped_stale"] + r["dropped_unnamed"];
        println!(
            "ranks: dropped_auth {} (+ checksum/malformed/job key {}), refused as replays {refused_replays}; \
             the hosts' kernels dropped {kernel} (full socket buffers, closed ports)",
            r["dropped_auth"],
            refused_bytes - r["dropped_auth"]
        );
        assert!(refused_bytes + kernel >= sent["altered"] + sent["forged"], "{r:?}\n{sent:?}");
        assert!(r["dropped_auth"] + kernel >= sent["forged"], "every forgery fails its tag: {r:?}");
        assert!(refused_replays + kernel >= sent["replayed"] + sent["elsewhere"], "{r:?}\n{sent:?}");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        if let Some(mut a) = self.attacker.take() {
            let _ = a.kill();
            let _ = a.wait();
        }
    }
}

fn counts(path: &Path) -> HashMap<String, u64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(k, v)| (k.to_string(), v.trim().parse().unwrap())))
        .collect()
}

/// The counters of every rank's closing document, summed; and each one's mode.
fn rank_counters(dir: &Path) -> (usize, Vec<String>, HashMap<String, u64>) {
    let mut sum = HashMap::new();
    let (mut docs, mut modes) = (0, Vec::new());
    for e in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
        for line in text.lines() {
            let d: serde_json::Value = serde_json::from_str(line).unwrap();
            if d["reason"] != "close" {
                continue;
            }
            docs += 1;
            modes.push(d["job_traffic"].as_str().unwrap_or("?").to_string());
            for (k, v) in d["counters"].as_object().unwrap() {
                *sum.entry(k.clone()).or_insert(0) += v.as_u64().unwrap();
            }
        }
    }
    (docs, modes, sum)
}
