//! fi_endpoint(3), libfabric 2.2 and later: the application's buffers belong
//! to the provider until a completion is generated or `fi_close(ep)` returns;
//! after that the provider touches them no more. On shared memory a long
//! message goes by a pull rendezvous: the sender announces its buffer and the
//! receiver copies it out of the sender's process (`process_vm_readv`). A
//! receive matched only after the sender closed its endpoint must therefore
//! not complete successfully with whatever the sender's (reused) buffer holds
//! by then: rdmx reports such a receive as failed (`FI_EIO`), a loss the
//! receiver can see, never a success with the wrong bytes.
//!
//! Each case: the sender posts a 64 KiB or 1 MiB tagged send, the receiver
//! sees the announcement (FI_PEEK) without posting a receive, the sender
//! closes its endpoint, writes another pattern into the buffer (its process
//! lives on, so the memory stays readable), and only then does the receiver
//! post its receive. One process with two endpoints (the receiver never
//! mapped the sender's ring), and two processes where the receiver sent to
//! the sender first (its ring is mapped, so its `closed` flag is what says
//! the endpoint went), on the `shm` domain and on `auto` (which uses shared
//! memory between local processes).
//!
//! The two-process cases run this test binary again as the sender
//! (`child_sender`, which does nothing unless `RDMX_CLOSE_IN_FLIGHT_CHILD` is
//! set).
use fi_tests::*;
use std::io::Write;
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

const TAG: u64 = 0xC105E;
const HELLO: u64 = 0x4E110;
/// Set (to `<domain> <len>`) in the environment of the child that sends.
const CHILD: &str = "RDMX_CLOSE_IN_FLIGHT_CHILD";

/// What the sender's buffer holds while the message is announced.
fn original(len: usize) -> Vec<u8> {
    (0..len).map(|j| (j.wrapping_mul(31) ^ (j >> 9) ^ 0x5A) as u8).collect()
}

/// What it holds after `fi_close(ep)` returned: differs from `original` in
/// every byte.
fn overwritten(len: usize) -> Vec<u8> {
    original(len).into_iter().map(|b| !b).collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

/// FI_PEEK on `s` until the announcement of `TAG` is there (the receiver
/// holds it unexpected); `others` are progressed meanwhile. Returns its length.
fn peek(s: &Stack, others: &[&Stack]) -> usize {
    s.peek_tagged(TAG, others, Duration::from_secs(10))
}

/// Posts the receive for `TAG` and judges what it gives: never a success
/// with the bytes the sender wrote after its close; by rdmx's design, an
/// `FI_EIO` error entry that carries the receive's context.
fn receive_after_close(s: &Stack, len: usize, what: &str) {
    let mut buf = vec![0u8; len];
    let mut rctx = 77u64;
    let rctx_ptr = &mut rctx as *mut u64 as *mut libc::c_void;
    // SAFETY: a libfabric call on objects this test opened and still holds; `buf` and `rctx` outlive the receive (its completion is read below, or the stack closes first).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, buf.as_mut_ptr() as *mut _, len, null_mut(), FI_ADDR_UNSPEC, TAG, 0, rctx_ptr), 0)
    };
    match s.poll_cq(Duration::from_secs(10)) {
        Some(Ok(c)) => {
            let kind = if buf == overwritten(len) {
                "the bytes the sender wrote AFTER fi_close(ep) returned (silent corruption)"
            } else if buf == original(len) {
                "the original bytes (read after the sender's close)"
            } else {
                "bytes that are neither pattern"
            };
            panic!("{what}: the receive of {len} bytes completed successfully (len {}) with {kind}; expected an error completion", c.len);
        }
        Some(Err(e)) => {
            assert_eq!(e.op_context, rctx_ptr, "{what}: the error entry carries the receive's context");
            assert_ne!(e.flags & fi::FI_RECV as u64, 0, "{what}: a receive error");
            assert_eq!(e.err, fi::FI_EIO as i32, "{what}: error {} (want FI_EIO)", e.err);
        }
        None => panic!("{what}: no completion for the receive within 10 s (want an FI_EIO error entry)"),
    }
}

fn one_process(domain: &str, len: usize) {
    init();
    let b = Stack::open(Some(domain), fi::FI_AV_MAP);
    let mut data = original(len);
    let mut sctx = 5u64;
    {
        let a = Stack::open(Some(domain), fi::FI_AV_MAP);
        let pb = a.insert(&b.name());
        // SAFETY: a libfabric call on objects this test opened and still holds; `data` outlives the send (it is not touched until `a` is closed).
        unsafe {
            assert_eq!(
                fi::fi_tsend(
                    a.ep,
                    data.as_ptr() as *const _,
                    len,
                    null_mut(),
                    pb,
                    TAG,
                    &mut sctx as *mut u64 as *mut _
                ),
                0
            )
        };
        assert_eq!(peek(&b, &[&a]), len);
        // `a` drops here: fi_close(ep) (and the rest) returns, the send never completed.
    }
    data.copy_from_slice(&overwritten(len));
    receive_after_close(&b, len, &format!("one process, {domain}"));
}

/// The same exchange with the sender left open: the receive gets the
/// original bytes (the sequence above is not what fails the receive).
#[test]
fn control_open_sender_delivers_the_original() {
    init();
    let len = 64 << 10;
    let b = Stack::open(Some("shm"), fi::FI_AV_MAP);
    let a = Stack::open(Some("shm"), fi::FI_AV_MAP);
    let pa = a.insert(&b.name());
    let data = original(len);
    // SAFETY: a libfabric call on objects this test opened and still holds; `data` outlives the send (its completion is awaited below).
    unsafe { assert_eq!(fi::fi_tsend(a.ep, data.as_ptr() as *const _, len, null_mut(), pa, TAG, null_mut()), 0) };
    assert_eq!(peek(&b, &[&a]), len);
    let mut buf = vec![0u8; len];
    // SAFETY: as above; `buf` outlives the receive (its completion is awaited below).
    unsafe {
        assert_eq!(
            fi::fi_trecv(b.ep, buf.as_mut_ptr() as *mut _, len, null_mut(), FI_ADDR_UNSPEC, TAG, 0, null_mut()),
            0
        )
    };
    let c = b.wait_cq(&[&a]).expect("receive");
    assert_eq!((c.len, c.tag), (len, TAG));
    assert!(buf == data, "control: data corrupted");
    let s = a.wait_cq(&[&b]).expect("send");
    assert_ne!(s.flags & fi::FI_SEND as u64, 0);
}

#[test]
fn one_process_shm_64k() {
    one_process("shm", 64 << 10);
}

#[test]
fn one_process_shm_1m() {
    one_process("shm", 1 << 20);
}

/// Reads child lines until one holds `word` (libtest may have printed
/// `test child_sender ... ` before it on the same line); returns what follows.
fn expect_line(out: &fi_tests::procs::Lines, word: &str) -> String {
    loop {
        let line = out
            .next_within(Duration::from_secs(60), &format!("the sender's {word}"))
            .unwrap_or_else(|| panic!("the sender ended before saying {word}"));
        if let Some(at) = line.find(word) {
            return line[at + word.len()..].trim().to_string();
        }
    }
}

/// The sender's process, killed if the test fails before it ended.
struct Sender(std::process::Child);

impl Drop for Sender {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn two_processes(domain: &str, len: usize) {
    init();
    let s = Stack::open(Some(domain), fi::FI_AV_MAP);
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_sender", "--nocapture", "--test-threads=1"])
        .env(CHILD, format!("{domain} {len}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the sender");
    let mut child = Sender(child);
    let out = fi_tests::procs::Lines::of(&mut child.0);
    let mut to = child.0.stdin.take().unwrap();
    let p = s.insert(&unhex(&expect_line(&out, "ADDR")));
    writeln!(to, "{}", hex(&s.name())).unwrap();
    // A message to the sender first: our device maps its ring (so that the
    // flag in it, not a missing file, is what says it closed).
    // SAFETY: a libfabric call on objects this test opened and still holds; the static bytes outlive the send.
    unsafe { assert_eq!(fi::fi_tsend(s.ep, b"hello".as_ptr() as *const _, 5, null_mut(), p, HELLO, null_mut()), 0) };
    let c = s.wait_cq(&[]).expect("hello sent");
    assert_ne!(c.flags & fi::FI_SEND as u64, 0);
    expect_line(&out, "SENT");
    assert_eq!(peek(&s, &[]), len);
    writeln!(to, "CLOSE").unwrap();
    expect_line(&out, "CLOSED");
    receive_after_close(&s, len, &format!("two processes, {domain}"));
    writeln!(to, "EXIT").unwrap();
    assert!(
        fi_tests::procs::wait_status(&mut child.0, Duration::from_secs(60), "the sender's exit").success(),
        "the sender failed"
    );
}

#[test]
fn two_processes_shm_64k() {
    two_processes("shm", 64 << 10);
}

#[test]
fn two_processes_shm_1m() {
    two_processes("shm", 1 << 20);
}

#[test]
fn two_processes_auto_1m() {
    two_processes("auto", 1 << 20);
}

/// The sender of the two-process cases (a no-op unless run as the child):
/// prints `ADDR`, takes the receiver's address, receives its hello, posts the
/// long send (`SENT`), closes its endpoint on `CLOSE`, overwrites the buffer
/// (`CLOSED`), and stays alive (its memory readable) until `EXIT`.
#[test]
fn child_sender() {
    let Ok(spec) = std::env::var(CHILD) else { return };
    let mut f = spec.split_whitespace();
    let (domain, len): (String, usize) = (f.next().unwrap().into(), f.next().unwrap().parse().unwrap());
    init();
    // Closed by hand below, the endpoint first and alone: never by Stack's
    // Drop (which would close the endpoint a second time).
    let s = std::mem::ManuallyDrop::new(Stack::open(Some(&domain), fi::FI_AV_MAP));
    println!("ADDR {}", hex(&s.name()));
    let _ = std::io::stdout().flush();
    // Lines from the receiver, read on a thread: the endpoint is progressed
    // while waiting for them.
    let (tx, lines) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::stdin().lines() {
            if tx.send(l.unwrap().trim().to_string()).is_err() {
                return;
            }
        }
    });
    let next_line = || -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(l) = lines.try_recv() {
                return l;
            }
            // SAFETY: a zero-count read only drives progress of the endpoint, while it is open.
            unsafe { fi::fi_cq_read(s.cq, null_mut(), 0) };
            assert!(Instant::now() < deadline, "the receiver went quiet");
            std::thread::sleep(Duration::from_micros(200));
        }
    };
    let p = s.insert(&unhex(&next_line()));
    let mut hello = [0u8; 5];
    // SAFETY: a libfabric call on objects this process opened and still holds; `hello` outlives the receive (awaited below).
    unsafe { assert_eq!(fi::fi_trecv(s.ep, hello.as_mut_ptr() as *mut _, 5, null_mut(), p, HELLO, 0, null_mut()), 0) };
    s.wait_cq(&[]).expect("hello");
    assert_eq!(&hello, b"hello");
    let mut data = original(len);
    // SAFETY: as above; `data` is not touched until the endpoint is closed.
    unsafe { assert_eq!(fi::fi_tsend(s.ep, data.as_ptr() as *const _, len, null_mut(), p, TAG, null_mut()), 0) };
    println!("SENT");
    let _ = std::io::stdout().flush();
    // The receiver says CLOSE once it holds the announcement (the send
    // itself never completes: nothing is received before the close).
    assert_eq!(next_line(), "CLOSE");
    // SAFETY: closes the endpoint this process opened, once; the other objects are closed below.
    unsafe { assert_eq!(fi::fi_close(&mut (*{ s.ep }).fid), 0) };
    // fi_close returned: the buffer is the application's again.
    data.copy_from_slice(&overwritten(len));
    println!("CLOSED");
    let _ = std::io::stdout().flush();
    // EXIT, or the receiver went away (it failed: its panic is the report).
    let l = lines.recv_timeout(Duration::from_secs(30));
    assert!(matches!(l.as_deref(), Ok("EXIT") | Err(std::sync::mpsc::RecvTimeoutError::Disconnected)), "{l:?}");
    std::hint::black_box(&data);
    // SAFETY: the remaining objects, children before parents, each once.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*{ s.av }).fid), 0);
        assert_eq!(fi::fi_close(&mut (*{ s.cq }).fid), 0);
        assert_eq!(fi::fi_close(&mut (*{ s.domain }).fid), 0);
        assert_eq!(fi::fi_close(&mut (*{ s.fabric }).fid), 0);
    }
}
