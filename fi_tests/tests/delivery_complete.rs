//! `FI_DELIVERY_COMPLETE` on shared memory (docs/design.md, "completion
//! semantics"): a plain send of up to 64 KiB to a peer already heard from, with
//! nothing earlier to it unacknowledged, is written into the peer's receive ring
//! as DIRECT packets and completes then (`FI_TRANSMIT_COMPLETE`, no
//! acknowledgement); a send that asks `FI_DELIVERY_COMPLETE` — a flag of
//! `fi_tsendmsg`, or `tx_attr->op_flags` — "goes the acknowledged way on every
//! path": it completes only once the peer's provider has processed it.
//!
//! Two observations through the public API, against `rdmx_peer` (an echo
//! server in a second process, `FI_RDMX_STATS=1`):
//! - the peer's `direct_received` counter (DIRECT packets it took from its
//!   ring) equals the plain sends made after first contact, and counts none of
//!   the `FI_DELIVERY_COMPLETE` ones;
//! - with the peer stopped (SIGSTOP), a plain send still completes (it is in the
//!   peer's ring), while an `FI_DELIVERY_COMPLETE` send completes only after the
//!   peer runs again (SIGCONT) and has processed it.
//!
//! Code paths: `prov/src/core.rs` (`send`: `delivery_complete` from the
//! operation's flags, which are `tx_attr->op_flags` for `fi_tsend` and the
//! call's own for `fi_tsendmsg`, `prov/src/ep.rs` `do_send`);
//! `rndv/src/engine.rs` (`send`: `meta.delivery_complete` takes `rdm.send`,
//! the sequenced and acknowledged path, else `rdm.send_transmit_complete`);
//! `rdm/src/engine/direct.rs` (`send_transmit_complete`: DIRECT only when the path
//! is reliable and ordered, the peer was heard from, nothing is unacknowledged
//! or pending, and the peer has not paused us).
use fi_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const LEN: usize = 64;
/// Receive contexts are `RECV | tag`; send contexts are the tag.
const RECV: u64 = 1 << 40;
/// The tag that makes `rdmx_peer` echo once more and exit.
const QUIT: u64 = 0xDEAD;

/// How a send asks for `FI_DELIVERY_COMPLETE`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ask {
    /// The flag of `fi_tsendmsg`; plain sends are `fi_tsend` (the endpoint's
    /// op_flags are the default ones, without it).
    Flag,
    /// The endpoint's `tx_attr->op_flags` (from the hints), which `fi_tsend`
    /// uses; plain sends are `fi_tsendmsg` with flags 0, which replace them.
    OpFlags,
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// `rdmx_peer` on shm, its stderr (the counters it prints at close) in a file.
struct Peer {
    child: Child,
    log: PathBuf,
    /// Kept open: the peer prints a last line before it exits.
    _out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn spawn(s: &Stack, ask: Ask) -> (Peer, u64) {
        let log = std::env::temp_dir().join(format!("rdmx-delivery-complete-{ask:?}-{}.log", std::process::id()));
        let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_peer"));
        c.arg("shm").envs(child_env()).env("FI_RDMX_STATS", "1");
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
            .spawn()
            .expect("rdmx_peer");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.first(), Some(&"ADDR"), "peer said {line:?}");
        let p = s.insert(&unhex(f[1]));
        let me: String = s.name().iter().map(|x| format!("{x:02x}")).collect();
        writeln!(child.stdin.as_mut().unwrap(), "{me}").unwrap();
        (Peer { child, log, _out: out }, p)
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped
        // (we hold its Child and wait for it only in `finish`).
        assert_eq!(unsafe { libc::kill(self.child.id() as libc::pid_t, sig) }, 0);
    }

    /// Stops the peer and waits until every one of its threads is stopped
    /// (state `T` in /proc/<pid>/task/*/stat): from then on it processes nothing.
    fn stop(&self) {
        self.signal(libc::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_stopped(self.child.id()) {
            assert!(Instant::now() < deadline, "the peer never stopped");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits for the peer's exit; its counters.
    fn finish(mut self) -> String {
        let st = self.child.wait().unwrap();
        let text = std::fs::read_to_string(&self.log).unwrap();
        assert!(st.success(), "rdmx_peer failed:\n{text}");
        text
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        // A failed assertion may leave the peer stopped: SIGKILL ends it anyway.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn all_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else { return false };
        // The state follows the command name, in parentheses that may hold spaces.
        if stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("T") {
            return false;
        }
        any = true;
    }
    any
}

/// Completions by context, in whatever order they come.
struct Completions<'a> {
    s: &'a Stack,
    seen: Vec<u64>,
}

impl Completions<'_> {
    /// Whether the completion with context `ctx` came within `within`; an
    /// error completion fails the test.
    fn arrived(&mut self, ctx: u64, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if let Some(i) = self.seen.iter().position(|&c| c == ctx) {
                self.seen.swap_remove(i);
                return true;
            }
            match self.s.poll_cq(deadline.saturating_duration_since(Instant::now())) {
                Some(Ok(e)) => self.seen.push(e.op_context as u64),
                Some(Err(e)) => panic!("error completion {} (context {:#x})", e.err, e.op_context as u64),
                None => return false,
            }
        }
    }

    fn expect(&mut self, ctx: u64, what: &str) {
        assert!(self.arrived(ctx, Duration::from_secs(20)), "{what}: no completion (context {ctx:#x}) within 20 s");
    }
}

fn post_recv(s: &Stack, p: u64, tag: u64, buf: &mut [u8]) {
    // SAFETY: a libfabric call on objects this test opened; `buf` outlives the
    // receive (every caller waits for its completion before `buf` goes).
    let ret = unsafe {
        fi::fi_trecv(
            s.ep,
            buf.as_mut_ptr() as *mut _,
            buf.len(),
            null_mut(),
            p,
            tag,
            0,
            (RECV | tag) as usize as *mut _,
        )
    };
    assert_eq!(ret, 0, "fi_trecv of tag {tag:#x}");
}

/// A tagged send of `buf` to `p` (context = tag), asking `FI_DELIVERY_COMPLETE`
/// or not, the way `ask` says.
fn send(s: &Stack, p: u64, tag: u64, buf: &[u8], delivery_complete: bool, ask: Ask) {
    let ctx = tag as usize as *mut libc::c_void;
    let iov = fi::iovec { iov_base: buf.as_ptr() as *mut _, iov_len: buf.len() };
    let msg = fi::fi_msg_tagged {
        msg_iov: &iov,
        desc: null_mut(),
        iov_count: 1,
        addr: p,
        tag,
        ignore: 0,
        context: ctx,
        data: 0,
    };
    let by_op_flags = match ask {
        Ask::Flag => !delivery_complete,
        Ask::OpFlags => delivery_complete,
    };
    let msg_flags = if delivery_complete { fi::FI_DELIVERY_COMPLETE as u64 } else { 0 };
    // SAFETY: a libfabric call on objects this test opened; `buf` (and `iov`,
    // `msg` for the call) outlive the send: every caller waits for its
    // completion before `buf` goes.
    let ret = unsafe {
        if by_op_flags {
            fi::fi_tsend(s.ep, buf.as_ptr() as *const _, buf.len(), null_mut(), p, tag, ctx)
        } else {
            fi::fi_tsendmsg(s.ep, &msg, msg_flags)
        }
    };
    assert_eq!(ret, 0, "send of tag {tag:#x}");
}

/// One message and its echo, both completions awaited (so nothing stays
/// unacknowledged toward the peer afterwards).
fn exchange(c: &mut Completions, p: u64, tag: u64, delivery_complete: bool, ask: Ask) {
    let out = [tag as u8; LEN];
    let mut back = [0u8; LEN];
    post_recv(c.s, p, tag, &mut back);
    send(c.s, p, tag, &out, delivery_complete, ask);
    c.expect(tag, "send");
    c.expect(RECV | tag, "echo");
    assert_eq!(back, out, "echo of tag {tag:#x}");
}

fn stat(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{name}' counter from the peer:\n{text}"))
}

fn run(ask: Ask) {
    init();
    let mut h = Hints::rdm();
    h.set_domain_name("shm");
    h.get().caps |= fi::FI_DIRECTED_RECV;
    if ask == Ask::OpFlags {
        h.tx().op_flags = fi::FI_DELIVERY_COMPLETE as u64;
    }
    let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
    // SAFETY: a field of an fi_info that fi_getinfo returned and this test owns.
    let op_flags = unsafe { (*info.first().tx_attr).op_flags };
    assert_eq!(op_flags & fi::FI_DELIVERY_COMPLETE as u64 != 0, ask == Ask::OpFlags, "tx_attr->op_flags {op_flags:#x}");
    let s = Stack::open_with(info, fi::FI_AV_MAP, 0);
    let (peer, p) = Peer::spawn(&s, ask);
    let mut c = Completions { s: &s, seen: Vec::new() };

    // First contact: sequenced and acknowledged whatever is asked (the peer
    // was never heard from, so it might be of another job or incarnation).
    exchange(&mut c, p, 1, false, ask);
    // FI_DELIVERY_COMPLETE: acknowledged, never DIRECT.
    for tag in 2..=4 {
        exchange(&mut c, p, tag, true, ask);
    }
    // Plain sends, everything before them acknowledged: DIRECT.
    for tag in 5..=7 {
        exchange(&mut c, p, tag, false, ask);
    }

    // The peer stopped: a plain send still completes (it was written into the
    // peer's ring); one that asks FI_DELIVERY_COMPLETE cannot complete before
    // the peer has run and processed it.
    let (out8, out9) = ([8u8; LEN], [9u8; LEN]);
    let (mut back8, mut back9) = ([0u8; LEN], [0u8; LEN]);
    post_recv(&s, p, 8, &mut back8);
    post_recv(&s, p, 9, &mut back9);
    peer.stop();
    send(&s, p, 8, &out8, false, ask);
    assert!(c.arrived(8, Duration::from_secs(5)), "a plain send to a stopped peer did not complete within 5 s: it should have completed once written into the peer's ring (DIRECT, FI_TRANSMIT_COMPLETE)");
    send(&s, p, 9, &out9, true, ask);
    assert!(
        !c.arrived(9, Duration::from_millis(500)),
        "an FI_DELIVERY_COMPLETE send completed while the peer was stopped: the peer cannot have processed it"
    );
    peer.signal(libc::SIGCONT);
    c.expect(9, "FI_DELIVERY_COMPLETE send once the peer runs again");
    c.expect(RECV | 8, "echo of the plain send");
    c.expect(RECV | 9, "echo of the FI_DELIVERY_COMPLETE send");
    assert_eq!((back8, back9), (out8, out9));

    exchange(&mut c, p, QUIT, true, ask);
    let text = peer.finish();
    // Tags 5, 6, 7 and 8, one packet each (64 bytes); not 1 (first contact),
    // 2, 3, 4, 9 or the QUIT (FI_DELIVERY_COMPLETE).
    assert_eq!(stat(&text, "direct_received"), 4, "DIRECT packets the peer received (asked via {ask:?}):\n{text}");
}

#[test]
fn delivery_complete_flag_is_acknowledged_on_shm() {
    run(Ask::Flag);
}

#[test]
fn delivery_complete_op_flags_are_acknowledged_on_shm() {
    run(Ask::OpFlags);
}
