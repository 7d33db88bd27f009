//! A process restarted at the same address and port is a new incarnation: it
//! never receives what was meant for its predecessor. The sender keeps the old
//! process's address in its AV and sends to it after the restart: the first
//! send fails with an error completion (the new process drops its packets as
//! stale and answers with its new incarnation), later ones at once with
//! `-FI_EHOSTUNREACH` (the address names a process that is gone); the new
//! process delivers none of them, and messages to its new address arrive
//! whole. Also when the sender first uses the old address after the restart.
use fi_tests::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const OLD: u64 = 0x1_0000_0000;
const NEW: u64 = 0x2_0000_0000;

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Peer {
    child: Child,
    out: BufReader<ChildStdout>,
}

impl Peer {
    fn spawn(domain: &str, port: u16) -> (Peer, Vec<u8>) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_restart_peer"));
        c.args([domain, &port.to_string()])
            .envs(child_env())
            .env("FI_RDMX_STATS", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let hex = line.strip_prefix("ADDR ").unwrap_or_else(|| panic!("peer said {line:?}")).trim();
        let addr = (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap()).collect();
        (Peer { child, out }, addr)
    }

    /// Every `GOT` line until the 0xDEAD one, and the stats lines of its stderr.
    fn finish(mut self) -> (Vec<u64>, String) {
        let mut tags = Vec::new();
        for line in (&mut self.out).lines() {
            let line = line.unwrap();
            if let Some(rest) = line.strip_prefix("GOT ") {
                let tag = u64::from_str_radix(rest.split(' ').next().unwrap(), 16).unwrap();
                if tag == 0xDEAD {
                    break;
                }
                tags.push(tag);
            }
        }
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "restart peer failed: {}", String::from_utf8_lossy(&out.stderr));
        (tags, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn stat(stderr: &str, name: &str) -> u64 {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
        .unwrap_or_else(|| panic!("no {name} in {stderr}"))
        .trim()
        .parse()
        .unwrap()
}

fn send(s: &Stack, to: u64, tag: u64, len: usize) -> Result<(), i32> {
    let data = vec![tag as u8; len];
    // SAFETY: a libfabric call on objects this test opened and still holds; `data` outlives the completion waited for below.
    let ret = unsafe { fi::fi_tsend(s.ep, data.as_ptr() as *const _, len, null_mut(), to, tag, null_mut()) };
    if ret < 0 {
        return Err(-ret as i32);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match s.poll_cq(Duration::from_millis(100)) {
            Some(Ok(c)) if c.flags & fi::FI_SEND as u64 != 0 => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(e)) => return Err(e.err),
            None => assert!(Instant::now() < deadline, "send of tag {tag:#x} never completed"),
        }
    }
}

fn restart(domain: &str) {
    init();
    let port = free_udp_port();
    let s = Stack::open(Some(domain), fi::FI_AV_MAP);
    let (first, first_addr) = Peer::spawn(domain, port);
    let old = s.insert(&first_addr);
    // Eager and long (windowed rendezvous on UDP) messages reach the first process.
    assert_eq!(send(&s, old, OLD | 1, 100), Ok(()));
    assert_eq!(send(&s, old, OLD | 2, 512 << 10), Ok(()));
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();

    let (second, second_addr) = Peer::spawn(domain, port);
    assert_ne!(first_addr, second_addr, "a new incarnation, same port");
    // Sends to the old process's address now reach the new process's port:
    // they must fail, never be delivered.
    for (i, len) in [(3u64, 100usize), (4, 512 << 10), (5, 10)].into_iter() {
        let r = send(&s, old, OLD | i, len);
        assert!(
            r == Err(fi::FI_EHOSTUNREACH as i32) || r.is_err() && i == 3,
            "a send to the dead incarnation (tag {:#x}): {r:?}",
            OLD | i
        );
    }
    // A second sender that learns the old address only now (say, from a
    // stale address exchange) and never talked to either process.
    let late = Stack::open(Some(domain), fi::FI_AV_MAP);
    let late_old = late.insert(&first_addr);
    assert!(send(&late, late_old, OLD | 6, 100).is_err(), "a first send to a dead incarnation's address");
    drop(late);
    let new = s.insert(&second_addr);
    for (i, len) in [(1u64, 100usize), (2, 512 << 10), (3, 4000)] {
        assert_eq!(send(&s, new, NEW | i, len), Ok(()), "to the new incarnation");
    }
    assert_eq!(send(&s, new, 0xDEAD, 1), Ok(()));
    let (tags, stderr) = second.finish();
    assert_eq!(tags, vec![NEW | 1, NEW | 2, NEW | 3], "the new process got exactly the messages sent to it");
    if domain == "udp" {
        assert!(
            stat(&stderr, "dropped_stale") > 0,
            "the old incarnation's packets reached the new process's port and were dropped as stale:\n{stderr}"
        );
    }
}

#[test]
fn a_restarted_process_never_receives_what_was_sent_to_its_predecessor_udp() {
    restart("udp");
}

#[test]
fn a_restarted_process_never_receives_what_was_sent_to_its_predecessor_auto() {
    restart("auto");
}
