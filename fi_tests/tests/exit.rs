//! A process stopped by a signal whose handler calls `exit()` ends, whatever
//! rdmx was doing: two `rdmx_exit_peer`s exchange messages over each device
//! with rdmx's progress thread busy, and each is signalled at a different
//! moment (often inside `fi_cq_read`, with its endpoint locked). libfabric's
//! destructor then runs rdmx's cleanup on the interrupted thread: it must not
//! wait for a lock or a thread. Each process must end within a few seconds with
//! the handler's status, and leave no shared-memory ring of its own in
//! `/dev/shm` (the kernel does not remove files; rdmx's cleanup does).
use fi_tests::*;
use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RUNS_PER_DEVICE: u64 = 15;

fn spawn(domain: &str, after_ms: u64) -> (Child, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_exit_peer"));
    c.args([domain, &after_ms.to_string()])
        .envs(child_env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    let line = fi_tests::procs::Lines::of(&mut child)
        .next_within(Duration::from_secs(60), "the exit peer's address")
        .unwrap_or_default();
    let addr = line.strip_prefix("ADDR ").unwrap_or_else(|| panic!("exit peer said {line:?}")).trim().to_string();
    (child, addr)
}

/// Waits for `child` to end within `limit`: its status, or None (then it is
/// killed, with its stacks printed first if gdb is there).
fn wait_for(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > deadline {
            let pid = child.id().to_string();
            if let Ok(o) = Command::new("gdb").args(["-p", &pid, "-batch", "-ex", "thread apply all bt 30"]).output() {
                eprintln!("stacks of the hung process {pid}:\n{}", String::from_utf8_lossy(&o.stdout));
            }
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Files of `pid` among rdmx's shared-memory rings.
fn rings_of(pid: u32) -> Vec<String> {
    let needle = format!("-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("rdmx-") && n.contains(&needle))
                .collect()
        })
        .unwrap_or_default()
}

fn exits_while_busy(domain: &str) {
    init();
    let mut hung = Vec::new();
    for run in 0..RUNS_PER_DEVICE {
        // Different moments in each run, and never both at once.
        let (mut a, addr_a) = spawn(domain, 40 + run * 13 % 90);
        let (mut b, addr_b) = spawn(domain, 60 + run * 29 % 110);
        let (pa, pb) = (a.id(), b.id());
        writeln!(a.stdin.as_mut().unwrap(), "{addr_b}").unwrap();
        writeln!(b.stdin.as_mut().unwrap(), "{addr_a}").unwrap();
        for (who, child, pid) in [("a", &mut a, pa), ("b", &mut b, pb)] {
            match wait_for(child, Duration::from_secs(10)) {
                Some(st) => {
                    let mut err = String::new();
                    let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err);
                    assert_eq!(
                        st.code(),
                        Some(42),
                        "{domain} run {run} peer {who}: ended with {st}, not by its handler's exit(42): {err}"
                    );
                    let left = rings_of(pid);
                    assert!(
                        left.is_empty(),
                        "{domain} run {run} peer {who}: its rings stayed in /dev/shm after exit: {left:?}"
                    );
                }
                None => hung.push(format!("run {run} peer {who}")),
            }
        }
    }
    assert!(
        hung.is_empty(),
        "{domain}: {} of {} processes never ended after exit() from a signal handler: {hung:?}",
        hung.len(),
        2 * RUNS_PER_DEVICE
    );
}

#[test]
fn exit_from_a_signal_handler_ends_the_process_on_udp() {
    exits_while_busy("udp");
}

#[test]
fn exit_from_a_signal_handler_ends_the_process_on_shm() {
    exits_while_busy("shm");
}

#[test]
fn exit_from_a_signal_handler_ends_the_process_on_auto() {
    exits_while_busy("auto");
}
