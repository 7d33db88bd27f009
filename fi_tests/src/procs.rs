//! Running libfabric's own tools (fi_info, fi_pingpong) against rdmx in child
//! processes.
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A command with rdmx selected, plus extra environment.
pub fn command(prog: &str, env: &[(&str, &str)]) -> Command {
    crate::watchdog::watch_this_test();
    let mut c = Command::new(prog);
    for (k, v) in crate::child_env() {
        c.env(k, v);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// A port free for both TCP and UDP on every address of this host right now,
/// chosen by the kernel (bind to port 0). A test passes it to the server it
/// spawns instead of a fixed number, so that two runs (or two tests) never
/// share one; if something takes it before the server binds, the server
/// fails to listen and [`wait_listening`] says so, rather than the test
/// talking to a stranger.
pub fn free_port() -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind(("0.0.0.0", 0)).expect("bind a TCP port");
        let port = tcp.local_addr().expect("local address").port();
        // rdmx's UDP socket may take the same number: want it free too.
        if std::net::UdpSocket::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

/// `pid` and every process below it, parents first (from
/// `/proc/<pid>/task/<tid>/children`), so that a wrapper (`ip netns exec`,
/// `unshare`, `sh -c`, valgrind) and what it runs count as one.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
                tree.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
            }
        }
        i += 1;
    }
    tree
}

/// True once a process of `pid`'s tree holds a listening TCP socket on
/// `port`: the socket's inode, from `/proc/<p>/net/tcp{,6}` (the table of that
/// process's own network namespace), is among `/proc/<p>/fd`'s links. A
/// listener that some other process owns does not count. Reads /proc, so
/// the check does not consume the server's single accept.
pub fn listens_on(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    process_tree(pid).into_iter().any(|p| {
        let inodes: Vec<String> = ["tcp", "tcp6"]
            .iter()
            .filter_map(|t| std::fs::read_to_string(format!("/proc/{p}/net/{t}")).ok())
            .flat_map(|s| {
                s.lines()
                    .skip(1)
                    .filter_map(|l| {
                        let cols: Vec<&str> = l.split_whitespace().collect();
                        (cols.len() > 9 && cols[1].ends_with(&want) && cols[3] == "0A")
                            .then(|| format!("socket:[{}]", cols[9]))
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        !inodes.is_empty()
            && std::fs::read_dir(format!("/proc/{p}/fd")).is_ok_and(|fds| {
                fds.flatten().any(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| inodes.iter().any(|i| l.as_os_str() == i.as_str()))
                })
            })
    })
}

/// SIGKILLs `child` and every process below it (a wrapper's child survives
/// the wrapper's death otherwise), then reaps `child`. By pid only: nothing
/// outside the tree this test spawned is touched. A child already reaped is
/// left alone, as its pid may now name another process; until reaped, an
/// exited child's pid stays its own.
pub fn kill_tree(child: &mut Child) {
    if let Ok(Some(_)) = child.try_wait() {
        return;
    }
    for p in process_tree(child.id()) {
        // SAFETY: kill(2) has no memory preconditions; `p` was read from this
        // test's own process tree.
        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
    }
    let _ = child.wait();
}

/// Waits for a child with a deadline; kills it on timeout.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    // Both pipes are drained while the child runs: a child that writes more
    // than a pipe holds would otherwise block until the deadline.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break Some(status);
        }
        if Instant::now() > deadline {
            kill_tree(&mut child);
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (stdout.join().unwrap_or_default(), stderr.join().unwrap_or_default());
    match status {
        Some(status) => Output { status, stdout, stderr },
        None => panic!(
            "child timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Runs `fi_pingpong` server and client (to `server_ip`) with the same arguments
/// and environment, on a port chosen free at run time ([`free_port`]); returns
/// (server output, client output). `wrap` prefixes each side's command (e.g.
/// `ip netns exec ns1`).
pub fn pingpong(
    args: &[&str],
    env: &[(&str, &str)],
    server_ip: &str,
    wrap_server: &[&str],
    wrap_client: &[&str],
) -> (Output, Output) {
    let port = free_port();
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
    let server = wait_listening(server, port);
    let client = mk(wrap_client, &["-P", &port_s, server_ip]).spawn().expect("spawn fi_pingpong client");
    let c = wait_output(client, Duration::from_secs(240));
    let s = wait_output(server, Duration::from_secs(60));
    (s, c)
}

/// Waits until `server` (or a process it started) listens on TCP `port`
/// ([`listens_on`]: in its own network namespace, a socket it holds), and
/// gives it back. A server that exits first
/// fails the test at once, with its output. The bound only guards against a
/// hang: a process start is slow under emulation (the Soft-RoCE VM runs
/// without KVM, and libfabric's start-up there took over 10 s on a loaded
/// host), so it is a minute, not the few seconds a real machine needs.
pub fn wait_listening(mut server: Child, port: u16) -> Child {
    let t0 = Instant::now();
    while !listens_on(server.id(), port) {
        if let Ok(Some(st)) = server.try_wait() {
            let out = wait_output(server, Duration::from_secs(5));
            panic!("the server exited ({st}) before it listened on {port}:\n{}", text(&out));
        }
        if t0.elapsed() > Duration::from_secs(60) {
            kill_tree(&mut server);
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

/// The lines a child writes to its stdout, read on a thread of their own, so
/// that a test waits for the next one with a deadline instead of blocking on
/// the pipe for as long as a hung child lives.
pub struct Lines {
    rx: std::sync::mpsc::Receiver<String>,
}

impl Lines {
    /// Takes `child`'s stdout (which must be piped).
    pub fn of(child: &mut Child) -> Lines {
        let out = child.stdout.take().expect("the child's stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Bytes, not UTF-8 lines: a child that writes something else
            // must not end the reading (nor close its pipe under it).
            let mut r = std::io::BufReader::new(out);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match std::io::BufRead::read_until(&mut r, b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let line = String::from_utf8_lossy(&buf).trim_end_matches(['\n', '\r']).to_string();
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Lines { rx }
    }

    /// The next line, `None` once the child closed its stdout; panics, saying
    /// what was awaited, when none comes within `limit`.
    pub fn next_within(&self, limit: Duration, awaited: &str) -> Option<String> {
        match self.rx.recv_timeout(limit) {
            Ok(line) => Some(line),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("the child wrote no line within {limit:?} while the test awaited {awaited}")
            }
        }
    }
}

/// Waits for `child` to exit, at most `limit`; past it kills the child's tree
/// and panics, saying what was awaited.
pub fn wait_status(child: &mut Child, limit: Duration, awaited: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            kill_tree(child);
            panic!("the child did not exit within {limit:?} ({awaited}); killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readiness check fails for a listener that is not the child's: a
    /// port this process listens on does not make a child that opened no
    /// socket ready; the same port counts for this process itself.
    #[test]
    fn a_listener_of_another_process_does_not_count() {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        assert!(!listens_on(child.id(), port), "another process's listener was taken for the child's");
        assert!(listens_on(std::process::id(), port), "this process's own listener was not found");
        kill_tree(&mut child);
    }

    /// A wrapper's child dies with the wrapper: `sh` runs `sleep` in the
    /// background and waits; both are killed, by pid.
    #[test]
    fn kill_tree_kills_what_the_child_started() {
        let mut child =
            Command::new("sh").args(["-c", "sleep 30 & echo $!; wait"]).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        let grandchild: u32 = line.trim().parse().unwrap();
        assert!(process_tree(child.id()).contains(&grandchild), "{:?}", process_tree(child.id()));
        kill_tree(&mut child);
        // Dead: gone, or a zombie until whoever inherited it reaps it.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| !r.trim_start().starts_with('Z')))
        };
        let t0 = Instant::now();
        while alive() {
            assert!(t0.elapsed() < Duration::from_secs(5), "the grandchild survived");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
