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
    unsafe { assert_eq!(fi::fi_mr_reg(s.domain, buf.as_mut_ptr() as *const _, buf.len(), access, 0, 0, 0, &mut mr, null_mut()), 0) };
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
        assert_eq!(fi::fi_write(from.ep, payload.as_ptr() as *const _, 64, null_mut(), to_addr, base + 100, w.key, null_mut()), 0);
        assert_eq!(fi::fi_read(from.ep, back.as_mut_ptr() as *mut _, 64, null_mut(), to_addr, base + 200, w.key, null_mut()), 0);
        assert_eq!(fi::fi_atomic(from.ep, &one as *const _ as *const _, 1, null_mut(), to_addr, base + 512, w.key, fi::FI_UINT64, fi::FI_SUM, null_mut()), 0);
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
    assert_eq!(four_operations(&a, &c, c_at_a, &wc, Duration::from_secs(10)), (4, true), "{domain}: same job: everything works");
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
    stderr[start..end].lines().find_map(|l| l.strip_prefix(&format!("rdmx: {name} "))).unwrap_or_else(|| panic!("no {name} for {domain}:\n{stderr}")).trim().parse().unwrap()
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
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .envs(child_env())
        .env("RDMX_ISOLATION_CHILD", "1")
        .env("FI_RDMX_STATS", "1")
        .output()
        .unwrap();
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
    let Some(stderr) = in_child_with_stats("endpoints_of_different_jobs_cannot_reach_each_other_or_their_memory", &["udp", "shm"]) else { return };
    for domain in ["udp", "shm"] {
        let dropped = counter(&stderr, domain, "dropped_job_key");
        assert!(dropped >= 4, "{domain}: job 2 counted {dropped} packets of job 1 dropped");
        assert_eq!(counter(&stderr, domain, "messages_delivered"), 0, "{domain}: job 2 delivered something");
        println!("{domain}: job 2 dropped {dropped} packets of job 1");
    }
}
