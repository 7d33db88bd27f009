//! Running libfabric's own tools (fi_info, fi_pingpong) against rdmx in child
//! processes.
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A command with rdmx selected, plus extra environment.
pub fn command(prog: &str, env: &[(&str, &str)]) -> Command {
    let mut c = Command::new(prog);
    for (k, v) in crate::child_env() {
        c.env(k, v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// True once a TCP socket listens on `port` (reads /proc/net/tcp{,6}, so the
/// check does not consume the server's single accept).
pub fn tcp_listening(port: u16, netns: Option<&str>) -> bool {
    let want = format!(":{port:04X}");
    let read = |f: &str| -> Option<String> {
        match netns {
            None => std::fs::read_to_string(f).ok(),
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "cat", f])
                .output()
                .ok()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned()),
        }
    };
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        read(f).is_some_and(|s| {
            s.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// Waits for a child with a deadline; kills it on timeout.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "child timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `fi_pingpong` server and client (to `server_ip`) with the same arguments
/// and environment; returns (server output, client output). `wrap` prefixes each
/// side's command (e.g. `ip netns exec ns1`).
pub fn pingpong(
    args: &[&str],
    env: &[(&str, &str)],
    port: u16,
    server_ip: &str,
    wrap_server: &[&str],
    wrap_client: &[&str],
) -> (Output, Output) {
    let port_s = port.to_string();
    let mk = |wrap: &[&str], extra: &[&str]| {
        let (prog, pre): (&str, Vec<&str>) = match wrap.split_first() {
            Some((p, rest)) => (p, rest.iter().copied().chain(std::iter::once("fi_pingpong")).collect()),
            None => ("fi_pingpong", vec![]),
        };
        let mut c = command(prog, env);
        c.args(pre).args(["-p", "rdmx"]);
        // RDM unless the test names an endpoint type (`-e dgram`).
        if !args.contains(&"-e") {
            c.args(["-e", "rdm"]);
        }
        c.args(args).args(extra);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let server = mk(wrap_server, &["-B", &port_s]).spawn().expect("spawn fi_pingpong server");
    // `ip netns exec NS ...` wrappers: look for the listener inside NS.
    let netns = match wrap_server {
        ["ip", "netns", "exec", ns, ..] => Some(*ns),
        _ => None,
    };
    let server = wait_listening(server, port, netns);
    let client = mk(wrap_client, &["-P", &port_s, server_ip]).spawn().expect("spawn fi_pingpong client");
    let c = wait_output(client, Duration::from_secs(240));
    let s = wait_output(server, Duration::from_secs(60));
    (s, c)
}

/// Waits until `server` listens on TCP `port`, and gives it back. A server that exits first
/// fails the test at once, with its output. The bound only guards against a
/// hang: a process start is slow under emulation (the Soft-RoCE VM runs
/// without KVM, and libfabric's start-up there took over 10 s on a loaded
/// host), so it is a minute, not the few seconds a real machine needs.
pub fn wait_listening(mut server: Child, port: u16, netns: Option<&str>) -> Child {
    let t0 = Instant::now();
    while !tcp_listening(port, netns) {
        if let Ok(Some(st)) = server.try_wait() {
            let out = wait_output(server, Duration::from_secs(5));
            panic!("the server exited ({st}) before it listened on {port}:\n{}", text(&out));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = server.kill();
            panic!("the server did not listen on {port} within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// Builds `fi_tests/mpi/<name>.c` with OpenMPI's `mpicc` into the test target
/// directory `out_dir`; `None` (a skip, or a failure under CI) without mpicc.
pub fn build_mpi(name: &str, out_dir: &std::path::Path) -> Option<std::path::PathBuf> {
    if Command::new("mpicc").arg("--version").output().is_err() {
        crate::skip("mpicc (libopenmpi-dev) is not installed");
        return None;
    }
    let src = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi").join(format!("{name}.c"));
    std::fs::create_dir_all(out_dir).unwrap();
    let exe = out_dir.join(name);
    let st = Command::new("mpicc").args(["-O2", "-Wall", "-o"]).arg(&exe).arg(&src).arg("-lpthread").status().unwrap();
    assert!(st.success(), "mpicc {name}.c failed");
    Some(exe)
}
