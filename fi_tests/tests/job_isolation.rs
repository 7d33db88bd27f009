//! Job isolation: endpoints of two jobs (different `auth_key`s) on the same
//! host, over UDP and over shared memory, cannot reach each other. A message,
//! an RMA write, an RMA read and an atomic from job 1 to job 2 are never
//! delivered and never touch job 2's registered memory — even with the right
//! memory key; the same operations to an endpoint of job 1 all work (so the
//! path itself is fine); job 2 drops the packets and counts them
//! (`dropped_job_key` in its `FI_RDMX_STATS` lines).
//!
//! The counters are printed to stderr when an endpoint closes, so the test
//! re-runs itself in a child process with `FI_RDMX_STATS=1` and reads them.
use fi_tests::*;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const RMA_CAPS: u64 = fi::FI_RMA as u64 | fi::FI_ATOMIC as u64;

fn keyed(domain: &str, key: u8) -> Stack {
    let mut h = Hints::rdm();
    h.set_domain_name(domain);
    h.get().caps |= RMA_CAPS;
    h.dom().mr_mode = (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32;
    // SAFETY: the hints own the key buffer (freed with them by fi_freeinfo).
    unsafe {
        let k = libc::malloc(1) as *mut u8;
        *k = key;
        h.ep().auth_key = k;
        h.ep().auth_key_size = 1;
    }
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo with an auth_key");
    Stack::open_with(info, fi::FI_AV_MAP, 0)
}

/// A registered 4 KiB window filled with 0x5a, and its key.
struct Window {
    buf: Vec<u8>,
    mr: *mut fi::fid_mr,
    key: u64,
}

fn window(s: &Stack) -> Window {
    let mut buf = vec![0x5au8; 4096];
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on objects this test opened; `buf` lives as long as the MR (closed in `close`).
    unsafe {
        assert_eq!(
            fi::fi_mr_reg(s.domain, buf.as_mut_ptr() as *const _, buf.len(), access, 0, 0, 0, &mut mr, null_mut()),
            0
        )
    };
    // SAFETY: the MR just opened.
    let key = unsafe { fi::fi_mr_key(mr) };
    Window { buf, mr, key }
}

impl Window {
    fn close(self) -> Vec<u8> {
        // SAFETY: closing the MR this test opened.
        unsafe { assert_eq!(fi::fi_close(&mut (*self.mr).fid), 0) };
        self.buf
    }
}

/// Posts a receive at `to`, then a message, an RMA write, an RMA read and an
/// atomic from `from` to `to`'s window. Returns how many of the four
/// initiator operations completed successfully within `limit`, and whether
/// the receive completed.
fn four_operations(from: &Stack, to: &Stack, to_addr: u64, w: &Window, limit: Duration) -> (usize, bool) {
    let base = w.buf.as_ptr() as u64;
    let mut rbuf = [0u8; 8];
    let msg = *b"job-one!";
    let payload = [1u8; 64];
    let mut back = [0u8; 64];
    let one = 1u64;
    // SAFETY: libfabric calls on objects this test opened; every buffer outlives the wait below (and the endpoints are closed before the buffers go).
    unsafe {
        assert_eq!(fi::fi_recv(to.ep, rbuf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        assert_eq!(fi::fi_send(from.ep, msg.as_ptr() as *const _, 8, null_mut(), to_addr, null_mut()), 0);
        assert_eq!(
            fi::fi_write(from.ep, payload.as_ptr() as *const _, 64, null_mut(), to_addr, base + 100, w.key, null_mut()),
            0
        );
        assert_eq!(
            fi::fi_read(from.ep, back.as_mut_ptr() as *mut _, 64, null_mut(), to_addr, base + 200, w.key, null_mut()),
            0
        );
        assert_eq!(
            fi::fi_atomic(
                from.ep,
                &one as *const _ as *const _,
                1,
                null_mut(),
                to_addr,
                base + 512,
                w.key,
                fi::FI_UINT64,
                fi::FI_SUM,
                null_mut()
            ),
            0
        );
    }
    let (mut ok, mut received) = (0, false);
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline && (ok < 4 || !received) {
        if let Some(Ok(_)) = from.poll_cq(Duration::from_millis(5)) {
            ok += 1;
        }
        if let Some(Ok(c)) = to.poll_cq(Duration::from_millis(5)) {
            received |= c.flags & fi::FI_RECV as u64 != 0;
        }
    }
    (ok, received)
}

fn isolate(domain: &str) {
    let a = keyed(domain, 1);
    let b = keyed(domain, 2);
    let c = keyed(domain, 1);
    let (wb, wc) = (window(&b), window(&c));
    let (b_at_a, c_at_a) = (a.insert(&b.name()), a.insert(&c.name()));
    assert_eq!(
        four_operations(&a, &c, c_at_a, &wc, Duration::from_secs(10)),
        (4, true),
        "{domain}: same job: everything works"
    );
    let (ok, received) = four_operations(&a, &b, b_at_a, &wb, Duration::from_millis(1500));
    assert_eq!((ok, received), (0, false), "{domain}: another job: nothing completes, nothing is delivered");
    let untouched = wb.close();
    assert!(untouched.iter().all(|&x| x == 0x5a), "{domain}: another job's write or atomic reached memory");
    let touched = wc.close();
    assert!(touched[100..164].iter().all(|&x| x == 1), "{domain}: the same job's write landed");
    drop(a);
    drop(c);
    eprintln!("ISOLATION {domain}: closing job 2's endpoint");
    drop(b);
    eprintln!("ISOLATION {domain}: closed");
}

fn counter(stderr: &str, domain: &str, name: &str) -> u64 {
    let start = stderr.find(&format!("ISOLATION {domain}: closing")).unwrap_or_else(|| panic!("no marker:\n{stderr}"));
    let end = stderr[start..].find(&format!("ISOLATION {domain}: closed")).map(|e| start + e).unwrap();
    stderr[start..end]
        .lines()
        .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
        .unwrap_or_else(|| panic!("no {name} for {domain}:\n{stderr}"))
        .trim()
        .parse()
        .unwrap()
}

/// Runs the isolation of `domains` in a child process of this test binary
/// (test `name`) with `FI_RDMX_STATS=1`, since the counters are printed when
/// an endpoint closes; the parent gets the child's stderr, the child `None`.
fn in_child_with_stats(name: &str, domains: &[&str]) -> Option<String> {
    if std::env::var_os("RDMX_ISOLATION_CHILD").is_some() {
        init();
        for d in domains {
            isolate(d);
        }
        return None;
    }
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(child_env())
        .env("RDMX_ISOLATION_CHILD", "1")
        .env("FI_RDMX_STATS", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = fi_tests::procs::wait_output(child, Duration::from_secs(120));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{}\n{stderr}", String::from_utf8_lossy(&out.stdout));
    Some(stderr)
}

/// On the verbs device the job key becomes the queue pair's Q_Key: the NIC
/// itself drops the other job's datagrams, so rdmx never sees them (nothing
/// received, nothing counted as dropped by job key) and nothing is delivered.
#[test]
fn verbs_jobs_are_isolated_by_the_nic() {
    if !verbs_device_present() {
        return;
    }
    let Some(stderr) = in_child_with_stats("verbs_jobs_are_isolated_by_the_nic", &["verbs"]) else { return };
    assert_eq!(counter(&stderr, "verbs", "packets_received"), 0, "job 2's endpoint received packets of job 1");
    assert_eq!(counter(&stderr, "verbs", "dropped_job_key"), 0, "the NIC, not rdmx, should have dropped them");
    assert_eq!(counter(&stderr, "verbs", "messages_delivered"), 0);
}

#[test]
fn endpoints_of_different_jobs_cannot_reach_each_other_or_their_memory() {
    let Some(stderr) =
        in_child_with_stats("endpoints_of_different_jobs_cannot_reach_each_other_or_their_memory", &["udp", "shm"])
    else {
        return;
    };
    for domain in ["udp", "shm"] {
        let dropped = counter(&stderr, domain, "dropped_job_key");
        assert!(dropped >= 4, "{domain}: job 2 counted {dropped} packets of job 1 dropped");
        assert_eq!(counter(&stderr, domain, "messages_delivered"), 0, "{domain}: job 2 delivered something");
        println!("{domain}: job 2 dropped {dropped} packets of job 1");
    }
}

// ---------------------------------------------------------------------------
// `FI_RDMX_JOB_KEY` on the default device (`auto`), across two simulated hosts
// (UDP) and within one host (shared memory), each endpoint in its own process
// as an MPI job's would be.
//
// A receiver of job 7 runs on host 0. A sender of job 8 sends it
// `SENDS` messages and gives up after `OTHER_JOB_WAIT`: nothing may complete.
// Then a sender of job 7 sends it `SENDS` messages: all must complete and
// arrive intact. That second sender is the positive control: its datagrams
// reach the receiver after every datagram of job 8 (the job-8 process exited
// first, on a lossless path), so when the receiver has all of job 7's
// messages it has seen all of job 8's datagrams, with no sleep. The receiver
// must have dropped exactly as many packets as the job-8 sender sent
// (`dropped_job_key` = `packets_sent`, both from `FI_RDMX_STATS`), and
// delivered exactly job 7's messages.

const SENDS: usize = 5;
const OTHER_JOB_WAIT: Duration = Duration::from_millis(1500);
const ROLE: &str = "RDMX_ISOLATION_ROLE";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn message(i: usize) -> [u8; 16] {
    let mut m = *b"job-7 message 0\n";
    m[14] = b'0' + i as u8;
    m
}

/// The receiver's process: prints its address, receives job 7's `SENDS`
/// messages (checking each), keeps progressing until told to close on stdin,
/// then closes (its counters go to stderr) and prints what it received.
fn receiver() {
    let s = Stack::open(None, fi::FI_AV_MAP);
    // (libtest has written "test <name> ... " without a newline before this.)
    println!("ADDR {}", hex(&s.name()));
    let mut bufs = [[0u8; 16]; SENDS + 1];
    for b in bufs.iter_mut() {
        // SAFETY: a libfabric call on the endpoint just opened; the buffers outlive it (the stack is dropped first).
        unsafe {
            assert_eq!(
                fi::fi_recv(s.ep, b.as_mut_ptr() as *mut _, 16, null_mut(), FI_ADDR_UNSPEC, b.as_mut_ptr() as *mut _),
                0
            )
        };
    }
    let close = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = close.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !close.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
        match s.poll_cq(Duration::from_millis(1)) {
            Some(Ok(c)) => {
                let i = bufs.iter().position(|b| b.as_ptr() as *mut std::ffi::c_void == c.op_context).unwrap();
                got.push(bufs[i]);
                println!("RECEIVED {}", got.len());
            }
            Some(Err(e)) => panic!("receiver: error completion {}", e.err),
            None => {}
        }
    }
    let all = got.len();
    let intact = (0..SENDS).all(|i| got.get(i) == Some(&message(i)));
    drop(s);
    println!("DONE received {all} intact {intact}");
}

/// A sender's process: sends `SENDS` messages to the address in argv, counts
/// the completions within `wait`, closes, prints the count.
fn sender(peer: &str, wait: Duration) {
    let s = Stack::open(None, fi::FI_AV_MAP);
    let to = s.insert(&unhex(peer));
    let msgs: Vec<[u8; 16]> = (0..SENDS).map(message).collect();
    for m in &msgs {
        // SAFETY: a libfabric call on the endpoint just opened; `msgs` outlives it (the stack is dropped first).
        unsafe { assert_eq!(fi::fi_send(s.ep, m.as_ptr() as *const _, 16, null_mut(), to, null_mut()), 0) };
    }
    let (mut ok, deadline) = (0, Instant::now() + wait);
    while ok < SENDS && Instant::now() < deadline {
        match s.poll_cq(Duration::from_millis(5)) {
            Some(Ok(_)) => ok += 1,
            Some(Err(e)) => panic!("sender: error completion {}", e.err),
            None => {}
        }
    }
    drop(s);
    println!("COMPLETED {ok}");
}

/// In a role's child process: runs the role and returns true.
fn run_role() -> bool {
    let Ok(role) = std::env::var(ROLE) else { return false };
    init();
    let arg = std::env::var("RDMX_ISOLATION_PEER").unwrap_or_default();
    match role.as_str() {
        "receiver" => receiver(),
        "sender" => sender(&arg, Duration::from_secs(30)),
        "other-sender" => sender(&arg, OTHER_JOB_WAIT),
        other => panic!("unknown role {other}"),
    }
    true
}

/// A child process of this test binary running `role` (test `name`) on host
/// `host` with job key `key`, counters on, no other rdmx variable.
fn spawn_role(
    hosts: &fi_tests::hosts::Hosts,
    host: usize,
    name: &str,
    role: &str,
    key: u64,
    peer: &str,
) -> std::process::Child {
    let mut words = hosts.run_on(host);
    words.push(std::env::current_exe().unwrap().display().to_string());
    words.extend(["--exact", name, "--nocapture", "--test-threads=1"].map(String::from));
    let mut c = std::process::Command::new(&words[0]);
    c.args(&words[1..]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FI_RDMX_")) {
        c.env_remove(k);
    }
    c.envs(child_env())
        .env(ROLE, role)
        .env("RDMX_ISOLATION_PEER", peer)
        .env("FI_RDMX_JOB_KEY", key.to_string())
        .env("FI_RDMX_STATS", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    c.spawn().expect("spawn a role")
}

/// A counter from a process's `FI_RDMX_STATS` lines (one endpoint per process).
fn stat(stderr: &str, name: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{stderr}"))
        .trim()
        .parse()
        .unwrap()
}

fn finished(child: std::process::Child, what: &str) -> (String, String) {
    let o = fi_tests::procs::wait_output(child, Duration::from_secs(90));
    let (out, err) = (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{what} failed ({}):\n{out}\n{err}", o.status);
    (out, err)
}

/// Job 8's sender on host `other_host` against job 7's receiver on host 0,
/// then job 7's sender there (see above).
fn isolate_by_job_key(name: &str, prefix: &str, net: u8, other_host: usize) {
    let Some(hosts) = fi_tests::hosts::Hosts::create(prefix, net, other_host + 1, 0) else { return };
    use std::io::Write;
    let mut rx = spawn_role(&hosts, 0, name, "receiver", 7, "");
    let lines = fi_tests::procs::Lines::of(&mut rx);
    // The receiver's lines until one satisfies `want`, each within a deadline.
    let until = |want: &dyn Fn(&str) -> bool, awaited: &str| -> Option<String> {
        std::iter::from_fn(|| lines.next_within(Duration::from_secs(90), awaited)).find(|l| want(l))
    };
    let addr = until(&|l| l.contains("ADDR "), "the receiver's address")
        .and_then(|l| l.split_once("ADDR ").map(|(_, a)| a.trim().to_owned()))
        .expect("the receiver's address");
    let (out8, err8) = finished(spawn_role(&hosts, other_host, name, "other-sender", 8, &addr), "job 8's sender");
    assert!(out8.contains("COMPLETED 0"), "a send of job 8 completed at job 7:\n{out8}");
    let sent8 = stat(&err8, "packets_sent");
    assert!(sent8 > 0, "job 8 sent nothing: the check would prove nothing");
    let (out7, _) = finished(spawn_role(&hosts, other_host, name, "sender", 7, &addr), "job 7's sender");
    assert!(out7.contains(&format!("COMPLETED {SENDS}")), "job 7's own sends did not all complete:\n{out7}");
    // The positive control: every message of job 7 arrived, so every datagram
    // of job 8 (sent earlier, on a lossless path) did too.
    let received = format!("RECEIVED {SENDS}");
    let n = until(&|l| l == received, "the receiver's RECEIVED line");
    assert!(n.is_some(), "the receiver never got job 7's {SENDS} messages");
    rx.stdin.as_mut().unwrap().write_all(b"close\n").unwrap();
    let rest: Vec<String> =
        std::iter::from_fn(|| lines.next_within(Duration::from_secs(30), "the receiver's last lines")).collect();
    let o = fi_tests::procs::wait_output(rx, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "the receiver failed:\n{rest:?}\n{err}");
    assert!(
        rest.iter().any(|l| l == &format!("DONE received {SENDS} intact true")),
        "job 7's data, exactly and intact: {rest:?}"
    );
    assert_eq!(stat(&err, "dropped_job_key"), sent8, "job 7 dropped exactly the packets job 8 sent it");
    assert_eq!(stat(&err, "messages_delivered"), SENDS as u64, "job 7 delivered job 7's messages only");
    println!("{name}: job 8 sent {sent8} packets, job 7 dropped all {sent8}; job 7's {SENDS} messages arrived intact");
}

/// Across two hosts: `auto` reaches the other host over UDP.
#[test]
fn job_keys_isolate_jobs_across_two_hosts() {
    if run_role() {
        return;
    }
    isolate_by_job_key("job_keys_isolate_jobs_across_two_hosts", "rdmxjk2", 196, 1);
}

/// On one host: `auto` reaches the other process through shared memory.
#[test]
fn job_keys_isolate_jobs_on_one_host_over_shared_memory() {
    if run_role() {
        return;
    }
    isolate_by_job_key("job_keys_isolate_jobs_on_one_host_over_shared_memory", "rdmxjk1", 195, 0);
}
