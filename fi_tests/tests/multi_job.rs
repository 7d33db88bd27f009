//! Several jobs on one endpoint through libfabric's own API
//! (`FI_AV_AUTH_KEY`, libfabric 1.20 on): the C program `c/rdmx_jobs.c`,
//! built against the libfabric headers pkg-config finds, runs a server
//! endpoint that serves job B (a job secret: sealed over a wire) and job C
//! (a key in clear) at once, and a client of each job plus one of job X,
//! which the server does not serve. Each job's messages arrive intact and
//! as that job's (the sender's fi_addr is the one inserted under its key),
//! job X's never, and each job's registration is written and read by its
//! own job only: the other job's write and read fail with `FI_EACCES` at
//! the initiator and leave the memory as it was. Once on one host (the
//! default device: shared memory between the processes) and once across
//! two namespace hosts (udp); the server's per-job counters (`FI_RDMX_STATS`
//! JSON) must show one message each way per job, job B's traffic over a
//! wire tagged and job C's in clear, and job X's dropped by its key.
//!
//! Against headers older than 1.20 (Debian 12's 1.17) the program cannot be
//! built and the test says so and passes; `scripts/test-libfabric2.sh`
//! runs it on libfabric 2.1.
use fi_tests::procs::{self, text};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The C program built against the headers pkg-config finds, or `None`
/// (with a note) when they are older than 1.20.
fn build() -> Option<PathBuf> {
    let version = Command::new("pkg-config").args(["--modversion", "libfabric"]).output().ok()?;
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if (major, minor) < (1, 20) {
        eprintln!(
            "note: FI_AV_AUTH_KEY needs libfabric >= 1.20 headers (pkg-config finds {version}); not checked here (scripts/test-libfabric2.sh runs it on 2.1)"
        );
        return None;
    }
    let flags = Command::new("pkg-config").args(["--cflags", "--libs", "libfabric"]).output().unwrap();
    let libdir = Command::new("pkg-config").args(["--variable=libdir", "libfabric"]).output().unwrap();
    let out = std::env::temp_dir().join(format!("rdmx_jobs-{}", fi_tests::unique_tag()));
    let src = fi_tests::jobs::source();
    let mut cc = Command::new("cc");
    cc.args(["-O1", "-Wall", "-Wextra", "-Werror", "-o"]).arg(&out).arg(&src);
    cc.args(String::from_utf8_lossy(&flags.stdout).split_whitespace());
    cc.arg(format!("-Wl,-rpath,{}", String::from_utf8_lossy(&libdir.stdout).trim()));
    let built = cc.output().expect("cc");
    assert!(built.status.success(), "building {}:\n{}", src.display(), text(&built));
    Some(out)
}

/// Starts `prog args` (prefixed by `on`: a host's agent, or nothing) with
/// rdmx selected and `env`.
fn spawn(on: &[String], prog: &Path, args: &[&str], env: &[(&str, String)]) -> Child {
    let mut c = match on.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(prog);
            c
        }
        None => Command::new(prog),
    };
    c.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in fi_tests::child_env() {
        c.env(k, v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().expect("spawn rdmx_jobs")
}

/// Runs the server (on `server_on`) and the clients B, C and X (on
/// `clients_on`); all must print OK. Returns the server's JSON document.
fn run(prog: &Path, server_on: &[String], clients_on: &[String]) -> Value {
    let dir = std::env::temp_dir().join(format!("rdmx-jobs-{}", fi_tests::unique_tag()));
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display().to_string();
    let stats = dir.join("server-stats.jsonl");
    let server = spawn(server_on, prog, &["server", &d], &[("FI_RDMX_STATS", stats.display().to_string())]);
    let clients: Vec<(String, Child)> =
        ["B", "C", "X"].iter().map(|n| (n.to_string(), spawn(clients_on, prog, &["client", &d, n], &[]))).collect();
    let mut outputs = vec![("server".to_string(), procs::wait_output(server, Duration::from_secs(90)))];
    for (n, c) in clients {
        outputs.push((format!("client {n}"), procs::wait_output(c, Duration::from_secs(90))));
    }
    let all: String = outputs.iter().map(|(n, o)| format!("--- {n}\n{}", text(o))).collect();
    for (n, o) in &outputs {
        assert!(o.status.success() && text(o).contains(&format!("{n}: OK")), "{n} failed:\n{all}");
    }
    let docs = fi_tests::stats_docs::documents(&stats);
    assert_eq!(docs.len(), 1, "the server's endpoint writes one document at close:\n{all}");
    let _ = std::fs::remove_dir_all(&dir);
    docs.into_iter().next().unwrap()
}

#[test]
fn one_endpoint_serves_two_jobs_on_one_host() {
    fi_tests::init();
    let Some(prog) = build() else { return };
    let doc = run(&prog, &[], &[]);
    // How each job's traffic goes over a wire (on this host it goes
    // through shared memory, untagged, with its key).
    fi_tests::jobs::check_server_counters(&doc, ["tagged", "clear"]);
    let _ = std::fs::remove_file(prog);
}

#[test]
fn one_endpoint_serves_two_jobs_across_two_hosts() {
    fi_tests::init();
    let Some(prog) = build() else { return };
    let Some(hosts) = fi_tests::hosts::Hosts::create("rdmxjb", 195, 2, 0) else { return };
    let doc = run(&prog, &hosts.run_on(0), &hosts.run_on(1));
    fi_tests::jobs::check_server_counters(&doc, ["tagged", "clear"]);
    let _ = std::fs::remove_file(prog);
}
