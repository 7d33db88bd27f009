//! The semantics of the in-process tests, across two processes: tagged messages
//! with remote CQ data of every size, unexpected messages and wildcard matching,
//! FI_PEEK, truncation, RMA and atomics into another process's memory, and the
//! error paths of RMA — on the udp and shm devices.
use fi_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::ptr::null_mut;

struct Peer {
    child: std::process::Child,
    addr: Vec<u8>,
    key: u64,
    base: u64,
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap()).collect()
}

fn spawn(domain: &str) -> (Peer, BufReader<std::process::ChildStdout>) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_peer"));
    for (k, v) in child_env() {
        c.env(k, v);
    }
    let mut child = c.arg(domain).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("rdmx_peer");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!((f[0], f[2], f[4]), ("ADDR", "KEY", "BASE"), "{line}");
    (Peer { child, addr: unhex(f[1]), key: f[3].parse().unwrap(), base: f[5].parse().unwrap() }, out)
}

fn run(domain: &str) {
    init();
    let s = Stack::open_caps(
        Some(domain),
        fi::FI_AV_MAP,
        fi::FI_RMA as u64 | fi::FI_ATOMIC as u64 | fi::FI_DIRECTED_RECV,
        0,
    );
    let (mut peer, mut out) = spawn(domain);
    let p = s.insert(&peer.addr);
    let me: String = s.name().iter().map(|x| format!("{x:02x}")).collect();
    writeln!(peer.child.stdin.as_mut().unwrap(), "{me}").unwrap();

    // Echo of every size, with remote CQ data, from a directed receive.
    for (i, len) in [0usize, 1, 1000, 1500, 70_000, 1 << 20].into_iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|j| (j * 13 + i) as u8).collect();
        let mut back = vec![0u8; len];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(
                fi::fi_trecv(s.ep, back.as_mut_ptr() as *mut _, len, null_mut(), p, 100 + i as u64, 0, null_mut()),
                0
            );
            assert_eq!(
                fi::fi_tsenddata(
                    s.ep,
                    data.as_ptr() as *const _,
                    len,
                    null_mut(),
                    7 * i as u64,
                    p,
                    100 + i as u64,
                    null_mut()
                ),
                0
            );
        }
        let mut got = None;
        while got.is_none() {
            let c = s.wait_cq(&[]).expect("completion");
            if c.flags & fi::FI_RECV as u64 != 0 {
                got = Some(c);
            }
        }
        let c = got.unwrap();
        assert_eq!((c.len, c.tag, c.data), (len, 100 + i as u64, 7 * i as u64 + 1));
        let mut want = data.clone();
        want.reverse();
        assert!(back == want, "echo of {len} bytes corrupted");
    }

    // Unexpected replies, matched later in reverse tag order, and FI_PEEK.
    for tag in [1u64, 2, 3] {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(fi::fi_tsend(s.ep, tag.to_le_bytes().as_ptr() as *const _, 8, null_mut(), p, tag, null_mut()), 0)
        };
    }
    let mut sends = 0;
    while sends < 3 {
        if s.wait_cq(&[]).expect("send").flags & fi::FI_SEND as u64 != 0 {
            sends += 1;
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    let mut probe_ctx = 0u64;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let msg = fi::fi_msg_tagged {
            msg_iov: std::ptr::null(),
            desc: null_mut(),
            iov_count: 0,
            addr: p,
            tag: 3,
            ignore: 0,
            context: &mut probe_ctx as *mut _ as *mut _,
            data: 0,
        };
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_trecvmsg(s.ep, &msg, fi::FI_PEEK as u64), 0) };
        match s.wait_cq(&[]) {
            Ok(c) => {
                assert_eq!((c.tag, c.len), (3, 8));
                break;
            }
            Err(e) => assert_eq!(e.err, fi::FI_ENOMSG as i32),
        }
        assert!(std::time::Instant::now() < deadline, "reply 3 never arrived");
    }
    for tag in [3u64, 1, 2] {
        let mut v = [0u8; 8];
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(
                fi::fi_trecv(s.ep, v.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, tag, 0, null_mut()),
                0
            )
        };
        let c = s.wait_cq(&[]).expect("unexpected reply");
        assert_eq!(c.tag, tag);
        let mut want = tag.to_le_bytes();
        want.reverse();
        assert_eq!(v, want);
    }

    // Truncation of a reply.
    let big = vec![5u8; 5000];
    let mut small = [0u8; 100];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_trecv(s.ep, small.as_mut_ptr() as *mut _, 100, null_mut(), p, 9, 0, null_mut()), 0);
        assert_eq!(fi::fi_tsend(s.ep, big.as_ptr() as *const _, 5000, null_mut(), p, 9, null_mut()), 0);
    }
    loop {
        match s.wait_cq(&[]) {
            Ok(c) if c.flags & fi::FI_SEND as u64 != 0 => continue,
            Ok(c) => panic!("expected truncation, got {} bytes", c.len),
            Err(e) => {
                assert_eq!((e.err, e.olen), (fi::FI_ETRUNC as i32, 4900));
                break;
            }
        }
    }

    // RMA and atomics into the peer's window (mr_mode 0: offsets, user keys).
    let _ = peer.base;
    let pattern: Vec<u8> = (0..16u8).collect();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_write(s.ep, pattern.as_ptr() as *const _, 16, null_mut(), p, 0, peer.key, null_mut()), 0)
    };
    s.wait_cq(&[]).expect("write");
    let mut readback = [0u8; 16];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_read(s.ep, readback.as_mut_ptr() as *mut _, 16, null_mut(), p, 0, peer.key, null_mut()), 0)
    };
    s.wait_cq(&[]).expect("read");
    assert_eq!(&readback[..], &pattern[..]);
    let add = 5u64;
    let mut old = 0u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_fetch_atomic(
                s.ep,
                &add as *const _ as *const _,
                1,
                null_mut(),
                &mut old as *mut _ as *mut _,
                null_mut(),
                p,
                1024,
                peer.key,
                fi::FI_UINT64,
                fi::FI_SUM,
                null_mut()
            ),
            0
        )
    };
    s.wait_cq(&[]).expect("atomic");
    assert_eq!(old, 0);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_write(s.ep, pattern.as_ptr() as *const _, 16, null_mut(), p, 65530, peer.key, null_mut()), 0)
    };
    assert_eq!(s.wait_cq(&[]).unwrap_err().err, fi::FI_EACCES as i32, "out of range");
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_write(s.ep, pattern.as_ptr() as *const _, 16, null_mut(), p, 0, peer.key ^ 0xff, null_mut()),
            0
        )
    };
    assert_eq!(s.wait_cq(&[]).unwrap_err().err, fi::FI_EACCES as i32, "wrong key");

    // Stop the peer; it reports its window, which holds exactly our write.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_tsend(s.ep, b"quit".as_ptr() as *const _, 4, null_mut(), p, 0xDEAD, null_mut()), 0) };
    let mut v = [0u8; 4];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_trecv(s.ep, v.as_mut_ptr() as *mut _, 4, null_mut(), p, 0xDEAD, 0, null_mut()), 0) };
    let mut recvd = false;
    while !recvd {
        recvd = s.wait_cq(&[]).expect("quit").flags & fi::FI_RECV as u64 != 0;
    }
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "WINDOW 000102030405060708090a0b0c0d0e0f");
    assert!(peer.child.wait().unwrap().success());
}

#[test]
fn two_processes_udp() {
    run("udp");
}

#[test]
fn two_processes_shm() {
    run("shm");
}
