//! `FI_EP_DGRAM` endpoints through the public API: what fi_getinfo reports
//! (one datagram as max_msg_size, no RMA), a real two-process exchange on each
//! device, `-FI_EMSGSIZE` beyond one datagram, a datagram that finds no posted
//! receive dropped (counted by the receiver, never an error at the sender), and
//! libfabric's own `fi_pingpong -e dgram` on udp, shm and auto.
use fi_tests::procs::{self, text};
use fi_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::time::Duration;

/// rdm's header (48 bytes) and the message layer's (24) leave this much of a
/// device datagram for the application.
const HEADERS: usize = 48 + 24;

fn max_msg_size(i: &fi::fi_info) -> usize {
    // SAFETY: the ep_attr of an fi_info this test owns.
    unsafe { (*i.ep_attr).max_msg_size }
}

#[test]
fn getinfo_offers_dgram_endpoints_of_one_datagram() {
    // FI_RDMX_UDP_MTU unset: 1472-byte UDP datagrams; shm slots of 8 KiB and 128 bytes (an 8 KiB message and its headers).
    for (domain, want) in [("udp", 1472 - HEADERS), ("shm", 8192 + 128 - HEADERS), ("auto", 1472 - HEADERS)] {
        let info =
            getinfo(None, None, 0, Some(&Hints::dgram(Some(domain)))).unwrap_or_else(|e| panic!("{domain}: {e}"));
        let i = info.first();
        assert_eq!(info.iter().count(), 1, "{domain}");
        // SAFETY: attrs of an fi_info this test owns.
        let (ep, tx) = unsafe { (&*i.ep_attr, &*i.tx_attr) };
        assert_eq!(ep.type_, fi::FI_EP_DGRAM, "{domain}");
        assert_eq!(max_msg_size(i), want, "{domain}");
        assert_eq!(ep.msg_prefix_size, 0, "no FI_MSG_PREFIX");
        assert_eq!(i.mode, 0, "{domain}");
        assert!(tx.inject_size <= want, "{domain}: inject_size {}", tx.inject_size);
        // The documentation states these sizes (fi_rdmx(7) and docs/design.md).
        let doc = |rel: &str| {
            std::fs::read_to_string(format!("{}/../{rel}", env!("CARGO_MANIFEST_DIR")))
                .unwrap()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        let (man, design) = (doc("docs/fi_rdmx.7"), doc("docs/design.md"));
        match domain {
            "shm" => {
                assert!(
                    man.contains(&format!("and {want} over shared memory")),
                    "fi_rdmx(7) should state shm's {want}"
                );
                assert!(design.contains(&format!("`shm` {want})")), "docs/design.md should state shm's {want}");
            }
            "udp" => {
                assert!(
                    man.contains(&format!("{want} bytes over UDP with the default MTU")),
                    "fi_rdmx(7) should state UDP's {want}"
                );
                assert!(design.contains(&format!("`auto` {want} with")), "docs/design.md should state UDP's {want}");
            }
            _ => {}
        }
        assert_ne!(i.caps & fi::FI_MSG as u64, 0);
        assert_eq!(i.caps & (fi::FI_RMA | fi::FI_ATOMIC) as u64, 0, "{domain}: no RMA over datagrams");
    }
    // Tagged datagrams too; RMA, delivery completion and ordering are not offered.
    let mut h = Hints::dgram(None);
    h.get().caps = fi::FI_TAGGED as u64;
    assert!(getinfo(None, None, 0, Some(&h)).is_ok());
    for edit in [
        |h: &mut Hints| h.get().caps |= fi::FI_RMA as u64,
        |h: &mut Hints| h.tx().op_flags = fi::FI_DELIVERY_COMPLETE as u64,
        |h: &mut Hints| h.tx().msg_order = fi::FI_ORDER_SAS as u64,
        |h: &mut Hints| h.ep().max_msg_size = 1 << 20,
    ] {
        let mut h = Hints::dgram(Some("udp"));
        edit(&mut h);
        assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
    }
    // Unasked (hints that name no type), only RDM entries (one per domain); no
    // hints at all list DGRAM after RDM (man_rules.rs).
    let info = getinfo(None, None, 0, Some(&Hints::new())).unwrap();
    // SAFETY: attrs of an fi_info this test owns.
    assert!(info.iter().all(|i| unsafe { (*i.ep_attr).type_ } == fi::FI_EP_RDM));
}

struct Peer {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn spawn(domain: &str) -> (Peer, Vec<u8>, usize) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_rdmx_dgram_peer"));
        for (k, v) in child_env() {
            c.env(k, v);
        }
        // Info level: the endpoint logs at close how many datagrams it dropped.
        c.env("FI_LOG_LEVEL", "info").env("FI_LOG_PROV", "rdmx");
        let mut child = c
            .arg(domain)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("rdmx_dgram_peer");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut p = Peer { child, out };
        let line = p.line();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!((f[0], f[2]), ("ADDR", "MAX"), "{line}");
        let addr = (0..f[1].len() / 2).map(|i| u8::from_str_radix(&f[1][2 * i..2 * i + 2], 16).unwrap()).collect();
        (p, addr, f[3].parse().unwrap())
    }
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.out.read_line(&mut l).unwrap();
        l.trim().to_string()
    }
    fn say(&mut self, cmd: &str) {
        writeln!(self.child.stdin.as_mut().unwrap(), "{cmd}").unwrap();
    }
}

fn exchange(domain: &str) {
    init();
    let info = getinfo(None, None, 0, Some(&Hints::dgram(Some(domain)))).expect("DGRAM fi_getinfo");
    let max = max_msg_size(info.first());
    let s = Stack::open_with(info, fi::FI_AV_MAP, 0);
    let (mut peer, addr, peer_max) = Peer::spawn(domain);
    assert_eq!(peer_max, max);
    let p = s.insert(&addr);
    let me: String = s.name().iter().map(|x| format!("{x:02x}")).collect();
    peer.say(&me);
    let mut ctx = [0u64; 2];
    let (tx_ctx, rx_ctx) = (&mut ctx[0] as *mut u64 as *mut libc::c_void, &mut ctx[1] as *mut u64 as *mut libc::c_void);

    // Larger than one datagram: refused at once, for every send variant.
    let big = vec![7u8; max + 1];
    // SAFETY: libfabric calls on objects this test opened; `big` outlives them (they fail).
    unsafe {
        assert_eq!(
            fi::fi_send(s.ep, big.as_ptr() as *const _, max + 1, null_mut(), p, tx_ctx),
            neg(fi::FI_EMSGSIZE) as isize
        );
        assert_eq!(fi::fi_inject(s.ep, big.as_ptr() as *const _, max + 1, p), neg(fi::FI_EMSGSIZE) as isize);
        assert_eq!(
            fi::fi_senddata(s.ep, big.as_ptr() as *const _, max + 1, null_mut(), 1, p, tx_ctx),
            neg(fi::FI_EMSGSIZE) as isize
        );
    }

    // Echo of every size up to max_msg_size, the peer's receive posted first.
    for len in [0usize, 1, 100, max - 1, max] {
        let data: Vec<u8> = (0..len).map(|j| (j * 7 + len) as u8).collect();
        let mut back = vec![0u8; max];
        peer.say("echo 10000");
        assert_eq!(peer.line(), "POSTED");
        // SAFETY: libfabric calls on objects this test opened; both buffers outlive the completions awaited below.
        unsafe {
            assert_eq!(fi::fi_recv(s.ep, back.as_mut_ptr() as *mut _, max, null_mut(), p, rx_ctx), 0);
            assert_eq!(fi::fi_send(s.ep, data.as_ptr() as *const _, len, null_mut(), p, tx_ctx), 0);
        }
        let (mut sent, mut got) = (false, None);
        while !sent || got.is_none() {
            let c = s.wait_cq(&[]).expect("no error completion");
            if c.op_context == tx_ctx {
                assert_ne!(c.flags & fi::FI_SEND as u64, 0);
                sent = true;
            } else {
                assert_eq!(c.op_context, rx_ctx);
                got = Some(c);
            }
        }
        let c = got.unwrap();
        assert_eq!(c.flags & (fi::FI_RECV | fi::FI_MSG) as u64, (fi::FI_RECV | fi::FI_MSG) as u64);
        assert_eq!(c.len, len, "{domain}");
        assert!(back[..len] == data[..], "{domain}: echo of {len} bytes corrupted");
        assert_eq!(peer.line(), format!("ECHO {len}"));
    }

    // No receive posted at the peer: the send still completes without error,
    // and the datagram is gone: a receive posted afterwards never sees it.
    let lost = [0x55u8; 64];
    // SAFETY: `lost` outlives the send's completion, awaited below.
    assert_eq!(unsafe { fi::fi_send(s.ep, lost.as_ptr() as *const _, lost.len(), null_mut(), p, tx_ctx) }, 0);
    let c = s.wait_cq(&[]).expect("a dropped datagram is no error for its sender");
    assert_eq!(c.op_context, tx_ctx);
    peer.say("drain 300");
    assert_eq!(peer.line(), "DRAINED");
    peer.say("echo 500");
    assert_eq!(peer.line(), "POSTED");
    assert_eq!(peer.line(), "NONE", "{domain}: a datagram that arrived with no receive posted was kept");
    assert!(s.poll_cq(Duration::from_millis(50)).is_none(), "nothing else was reported");

    peer.say("quit");
    drop(peer.child.stdin.take());
    let out = procs::wait_output(peer.child, Duration::from_secs(30));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("1 datagrams dropped (no receive posted)"), "{domain}: the drop was not counted:\n{t}");
}

#[test]
fn two_processes_over_udp() {
    exchange("udp");
}

#[test]
fn two_processes_over_shm() {
    exchange("shm");
}

#[test]
fn two_processes_over_auto() {
    exchange("auto");
}

fn pingpong_dgram(device: &str) {
    init();
    let (s, c) = procs::pingpong(
        &["-e", "dgram", "-c", "-I", "20", "-S", "all"],
        &[("FI_RDMX_DEVICE", device)],
        "127.0.0.1",
        &[],
        &[],
    );
    let (st, ct) = (text(&s), text(&c));
    assert!(c.status.success(), "client failed on {device}:\n{ct}\nserver:\n{st}");
    assert!(s.status.success(), "server failed on {device}:\n{st}");
    assert!(ct.contains("usec/xfer"), "no numbers printed:\n{ct}");
    println!("{device}:\n{ct}");
}

#[test]
fn fi_pingpong_dgram_udp() {
    pingpong_dgram("udp");
}

#[test]
fn fi_pingpong_dgram_shm() {
    pingpong_dgram("shm");
}

#[test]
fn fi_pingpong_dgram_auto() {
    pingpong_dgram("auto");
}
