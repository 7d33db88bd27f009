//! Long messages between two processes on one host go by rendezvous: the receiver
//! pulls them from the sender's memory with `process_vm_readv` (one copy), or, when
//! it may not (`FI_RDMX_SHM_CMA=0` stands in for a different user or Yama
//! `ptrace_scope`), has them pushed through the ring. Both paths are checked for
//! data, gather/scatter lists that split differently on the two sides, sizes
//! around the threshold, unexpected long messages (FI_PEEK reports the full
//! length), truncation, FI_DISCARD (the sender must still complete), tags and
//! remote CQ data. The peer's counters (FI_RDMX_STATS=1) prove which path carried
//! the bytes, and that no registration was looked up (shm needs none).
use fi_tests::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn iov(b: &mut [u8]) -> fi::iovec {
    fi::iovec { iov_base: b.as_mut_ptr() as *mut _, iov_len: b.len() }
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|j| (j.wrapping_mul(31) ^ (j >> 9) ^ seed) as u8).collect()
}

/// Waits for the next receive completion (send completions are skipped).
fn next_recv(s: &Stack) -> Result<fi::fi_cq_tagged_entry, fi::fi_cq_err_entry> {
    loop {
        match s.wait_cq(&[]) {
            Ok(c) if c.flags & fi::FI_SEND as u64 != 0 => continue,
            other => return other,
        }
    }
}

fn wait_send(s: &Stack) {
    loop {
        if s.wait_cq(&[]).expect("send completion").flags & fi::FI_SEND as u64 != 0 {
            return;
        }
    }
}

/// Polls FI_PEEK for `tag` until it reports a message; returns its length.
fn peek_len(s: &Stack, p: u64, tag: u64, flags: u64) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut ctx = 0u64;
    loop {
        let msg = fi::fi_msg_tagged {
            msg_iov: std::ptr::null(),
            desc: null_mut(),
            iov_count: 0,
            addr: p,
            tag,
            ignore: 0,
            context: &mut ctx as *mut _ as *mut _,
            data: 0,
        };
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_trecvmsg(s.ep, &msg, fi::FI_PEEK as u64 | flags), 0) };
        match next_recv(s) {
            Ok(c) => {
                assert_eq!(c.tag, tag);
                return c.len;
            }
            Err(e) => assert_eq!(e.err, fi::FI_ENOMSG as i32),
        }
        assert!(Instant::now() < deadline, "message {tag} never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn run(domain: &str, cma: bool) {
    // A threshold of 16 KiB (not the default) so that the sizes below sit on
    // both sides of it; the peer inherits it.
    std::env::set_var("FI_RDMX_RNDV_THRESHOLD", "16384");
    init();
    let s = Stack::open_caps(Some(domain), fi::FI_AV_MAP, fi::FI_DIRECTED_RECV, 0);
    let log = std::env::temp_dir().join(format!("rdmx-rndv-{domain}-{cma}-{}.log", std::process::id()));
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_peer"));
    for (k, v) in child_env() {
        c.env(k, v);
    }
    c.env("FI_RDMX_SHM_CMA", if cma { "1" } else { "0" }).env("FI_RDMX_STATS", "1");
    let mut child = c
        .arg(domain)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&log).unwrap()))
        .spawn()
        .expect("rdmx_peer");
    let out = fi_tests::procs::Lines::of(&mut child);
    let line = out.next_within(Duration::from_secs(60), "the peer's address").unwrap_or_default();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f[0], "ADDR", "{line}");
    let p = s.insert(&unhex(f[1]));
    let me: String = s.name().iter().map(|x| format!("{x:02x}")).collect();
    writeln!(child.stdin.as_mut().unwrap(), "{me}").unwrap();

    // Echoes around and far above the threshold; we gather from three pieces, the
    // peer's reply lands in two pieces split elsewhere.
    for (i, len) in [16_383usize, 16_384, 100_000, 1 << 20, (4 << 20) - 1].into_iter().enumerate() {
        let mut data = pattern(len, i);
        let mut back = vec![0u8; len];
        let tag = 100 + i as u64;
        let (a, rest) = data.split_at_mut(len / 3);
        let (b, c) = rest.split_at_mut(len / 3 + 1);
        let send = [iov(a), iov(b), iov(c)];
        let (x, y) = back.split_at_mut(len / 2 + 4097);
        let recv = [iov(x), iov(y)];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(fi::fi_trecvv(s.ep, recv.as_ptr(), null_mut(), 2, p, tag, 0, null_mut()), 0);
            let msg = fi::fi_msg_tagged {
                msg_iov: send.as_ptr(),
                desc: null_mut(),
                iov_count: 3,
                addr: p,
                tag,
                ignore: 0,
                context: null_mut(),
                data: 7 * i as u64,
            };
            assert_eq!(fi::fi_tsendmsg(s.ep, &msg, (fi::FI_REMOTE_CQ_DATA | fi::FI_COMPLETION) as u64), 0);
        }
        let c = next_recv(&s).expect("echo");
        assert_eq!((c.len, c.tag, c.data), (len, tag, 7 * i as u64 + 1));
        let mut want = data.clone();
        want.reverse();
        assert!(back == want, "echo of {len} bytes corrupted");
    }

    // An unexpected long message: FI_PEEK reports its full length before any byte
    // moved, then a receive takes it.
    let data = pattern(200_000, 50);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_tsend(s.ep, data.as_ptr() as *const _, data.len(), null_mut(), p, 50, null_mut()), 0) };
    wait_send(&s);
    assert_eq!(peek_len(&s, p, 50, 0), 200_000);
    let mut back = vec![0u8; 200_000];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, back.as_mut_ptr() as *mut _, back.len(), null_mut(), p, 50, 0, null_mut()), 0)
    };
    assert_eq!(next_recv(&s).expect("unexpected long").len, 200_000);
    back.reverse();
    assert!(back == data, "unexpected long message corrupted");

    // Truncation: the receive takes the first 40,000 bytes and says how many more.
    let data = pattern(100_000, 9);
    let mut small = vec![0u8; 40_000];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, small.as_mut_ptr() as *mut _, small.len(), null_mut(), p, 9, 0, null_mut()), 0);
        assert_eq!(fi::fi_tsend(s.ep, data.as_ptr() as *const _, data.len(), null_mut(), p, 9, null_mut()), 0);
    }
    let e = next_recv(&s).expect_err("truncation");
    assert_eq!((e.err, e.olen, e.tag), (fi::FI_ETRUNC as i32, 60_000, 9));
    let mut want = data.clone();
    want.reverse();
    assert!(small[..] == want[..40_000], "truncated long message corrupted");

    // FI_DISCARD of an unexpected long message still completes the peer's send:
    // the peer posts its next receive only after that, so the next echo works.
    let data = pattern(300_000, 11);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_tsend(s.ep, data.as_ptr() as *const _, data.len(), null_mut(), p, 11, null_mut()), 0) };
    wait_send(&s);
    assert_eq!(peek_len(&s, p, 11, fi::FI_DISCARD), 300_000);
    let mut v = [0u8; 8];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, v.as_mut_ptr() as *mut _, 8, null_mut(), p, 12, 0, null_mut()), 0);
        assert_eq!(fi::fi_tsend(s.ep, b"after-11".as_ptr() as *const _, 8, null_mut(), p, 12, null_mut()), 0);
    }
    assert_eq!(next_recv(&s).expect("echo after discard").tag, 12);
    assert_eq!(&v, b"11-retfa");

    // Stop the peer and read which path its endpoint used.
    let mut q = [0u8; 4];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, q.as_mut_ptr() as *mut _, 4, null_mut(), p, 0xDEAD, 0, null_mut()), 0);
        assert_eq!(fi::fi_tsend(s.ep, b"quit".as_ptr() as *const _, 4, null_mut(), p, 0xDEAD, null_mut()), 0);
    }
    next_recv(&s).expect("quit");
    let line = out.next_within(Duration::from_secs(60), "the peer's WINDOW line").unwrap_or_default();
    assert!(line.starts_with("WINDOW"), "{line}");
    assert!(fi_tests::procs::wait_status(&mut child, Duration::from_secs(60), "the peer's exit").success());
    let text = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_file(&log);
    let stat = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("rdmx: {name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no '{name}' counter from the peer:\n{text}"))
    };
    let (sent, pulled, windowed) = (stat("rendezvous_sent"), stat("rendezvous_pulled"), stat("rendezvous_windowed"));
    // The peer announced its 7 long replies (4 echoes at or above the threshold,
    // the unexpected, truncated and discarded ones) and received 7 long messages
    // from us: all pulled; or, refusing, the first by window grants, after which
    // we treat the peer as unreadable: messages from the window threshold
    // (256 KiB: the 1 MiB and 4 MiB echoes, the 300,000-byte discard) also by
    // windows, the others eagerly.
    assert_eq!(sent, 7, "{text}");
    // shm needs no registration: no rendezvous looked one up. (The domain has
    // no registration cache at all on shm, so its mr_cache_* counters print 0
    // whatever happens: asserting them would test nothing.)
    for name in ["rendezvous_registrations", "rendezvous_registrations_from_desc"] {
        assert_eq!(stat(name), 0, "{name}: {text}");
    }
    if cma {
        assert_eq!((pulled, windowed), (7, 0), "{text}");
    } else {
        assert_eq!((pulled, windowed), (0, 4), "{text}");
    }
}

#[test]
fn long_messages_pulled_with_cma_over_shm() {
    run("shm", true);
}

#[test]
fn long_messages_pushed_through_the_ring_when_cma_is_refused() {
    run("shm", false);
}

#[test]
fn long_messages_pulled_with_cma_over_auto() {
    run("auto", true);
}
