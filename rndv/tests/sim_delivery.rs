//! Delivery through whole endpoints ([`rndv::Endpoint`] over the simulated
//! network, driven by [`EndpointSim`]): the scenarios of
//! `rdm/tests/sim_scenarios.rs` that concern message delivery, with messages
//! posted, matched and received as the provider does. Every message's bytes
//! and order are checked; every scenario replays from its seed
//! (`RDMX_SIM_SEED` picks one seed).
mod common;

use common::*;
use rdm::engine::{Engine, EngineConfig, PeerId};
use rdm::sim::Link;
use rdm::simnet;
use rdm::DeviceCaps;
use rndv::engine::{IoList, OpKind, OutMsg, RecvSpec};
use rndv::sim::EndpointSim;
use rndv::{EndpointConfig, EndpointEvent, MsgHeader, MsgKind, Src};
use std::time::Duration;

type Sim = EndpointSim<Mem>;

fn msg(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect()
}

/// An untagged message carrying `i` as its remote CQ data.
fn header(i: u64) -> MsgHeader {
    MsgHeader { kind: MsgKind::Msg, tag: 0, data: Some(i) }
}

/// Receive slots of 64 KiB in the receiver's memory, reposted as they fill.
const SLOT: u64 = 64 << 10;

fn post_slot(sim: &mut Sim, node: usize, slot: u64) {
    let spec = RecvSpec {
        kind: MsgKind::Msg,
        src: Src::Any,
        tag: 0,
        ignore: 0,
        iov: IoList::one(BASE + slot * SLOT, SLOT),
        multi: false,
        meta: meta(slot),
    };
    sim.nodes[node].ep.post_recv(spec).expect("post");
}

const SIZES: [usize; 6] = [0, 1, 100, 1400, 3000, 20000];

/// One direction, `n` messages of mixed sizes from node 0 to node 1, which
/// keeps 64 receives posted; each is checked exactly-once, in order, byte
/// for byte.
fn stream(caps: DeviceCaps, link: Link, seed: u64, n: u64, sizes: &[usize]) -> Sim {
    let mut sim = net_with(2, caps, link, seed, config());
    let p = sim.peer(0, 1);
    let ring = 64;
    for k in 0..ring {
        post_slot(&mut sim, 1, k);
    }
    let (mut sent, mut got, mut seen) = (0u64, 0u64, 0usize);
    let end = sim.now() + Duration::from_secs(600);
    while (got < n || completions(&sim, 0, OpKind::Send).len() as u64 != n) && sim.now() < end {
        while sent < n {
            let data = msg(sent, sizes[(sent % sizes.len() as u64) as usize]);
            if sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(sent),
                    payload: &[&data],
                    user: IoList::default(),
                    meta: meta(sent),
                })
                .is_err()
            {
                break;
            }
            sent += 1;
        }
        if !sim.step() && sent == n {
            break;
        }
        while seen < sim.nodes[1].done.len() {
            let c = sim.nodes[1].done[seen];
            seen += 1;
            let len = sizes[(got % sizes.len() as u64) as usize];
            assert_eq!(
                (c.kind, c.err, c.data, c.len),
                (OpKind::Recv, None, Some(got), len),
                "seed {seed}: message {got} wrong or out of order"
            );
            let slot = c.meta.context;
            assert!(
                sim.nodes[1].ep.mem().at(BASE + slot * SLOT, len) == msg(got, len),
                "seed {seed}: bytes of message {got}"
            );
            got += 1;
            post_slot(&mut sim, 1, slot);
        }
    }
    assert_eq!(got, n, "seed {seed}: only {got} of {n} delivered; sender {:?}", sim.nodes[0].ep.stats().rdm);
    let sends = completions(&sim, 0, OpKind::Send);
    assert_eq!(sends.len() as u64, n, "seed {seed}");
    assert!(sends.iter().all(|c| c.err.is_none()), "seed {seed}");
    sim
}

#[test]
fn lossless_stream_delivers_in_order() {
    for seed in seeds(&[1]) {
        stream(path(false), Link::default(), seed, 500, &SIZES);
    }
}

#[test]
fn many_messages_under_loss_reorder_dup_corruption() {
    let link = Link { loss_pct: 10.0, reorder_pct: 20.0, dup_pct: 1.0, corrupt_pct: 0.1, ..Link::default() };
    // Release builds run 20,000; debug builds a tenth.
    let n = if cfg!(debug_assertions) { 2_000 } else { 20_000 };
    for seed in seeds(&[7]) {
        let mut sim = stream(path(false), link, seed, n, &SIZES);
        let rx = sim.nodes[1].ep.stats().rdm;
        let tx = sim.nodes[0].ep.stats().rdm;
        assert!(
            rx.duplicates > 0
                && rx.out_of_order > 0
                && rx.dropped_checksum + tx.dropped_checksum + rx.dropped_malformed > 0,
            "{rx:?}"
        );
        assert!(tx.retransmits > 0, "{tx:?}");
    }
}

#[test]
fn mtu_4096_device() {
    let link = Link { loss_pct: 5.0, reorder_pct: 10.0, ..Link::default() };
    for seed in seeds(&[11]) {
        let mut sim = stream(DeviceCaps::datagram(4096), link, seed, 3000, &SIZES);
        // A 3000-byte message is one datagram at this mtu.
        assert!(sim.nodes[0].ep.stats().rdm.sent_data < 3000 * 3, "{:?}", sim.nodes[0].ep.stats().rdm);
    }
}

#[test]
fn reliable_unordered_device_needs_no_retransmission() {
    // SRD-like: never loses, but reorders.
    let caps = DeviceCaps { reliable: true, ..DeviceCaps::datagram(1400) };
    let link = Link { reorder_pct: 30.0, jitter: Duration::from_micros(50), ..Link::default() };
    for seed in seeds(&[5]) {
        let mut sim = stream(caps, link, seed, 5000, &SIZES);
        assert_eq!(sim.nodes[0].ep.stats().rdm.retransmits, 0);
        assert!(sim.nodes[1].ep.stats().rdm.out_of_order > 0);
    }
}

#[test]
fn pingpong_under_loss() {
    let link = Link { loss_pct: 5.0, reorder_pct: 20.0, dup_pct: 1.0, ..Link::default() };
    for seed in seeds(&[3]) {
        let mut sim = net_with(2, path(false), link, seed, config());
        let a = sim.peer(0, 1);
        let b = sim.peer(1, 0);
        for i in 0..300u64 {
            let len = [64usize, 256, 1024, 4096, 65536][(i % 5) as usize];
            for (from, to, p) in [(0usize, 1usize, a), (1, 0, b)] {
                post_slot(&mut sim, to, 0);
                let data = msg(i + 1000 * from as u64, len);
                sim.nodes[from]
                    .ep
                    .send(OutMsg {
                        peer: p,
                        header: header(i),
                        payload: &[&data],
                        user: IoList::default(),
                        meta: meta(i),
                    })
                    .unwrap();
                let want = i as usize + 1;
                assert!(
                    sim.run_until(Duration::from_secs(60), |s| completions(s, to, OpKind::Recv).len() == want),
                    "seed {seed}: message {i} from {from} lost"
                );
                let c = completions(&sim, to, OpKind::Recv)[i as usize];
                assert_eq!((c.err, c.data, c.len), (None, Some(i), len));
                assert!(sim.nodes[to].ep.mem().at(BASE, len) == data, "seed {seed}: bytes of message {i} from {from}");
            }
        }
        assert!(sim.run_until(Duration::from_secs(60), |s| completions(s, 0, OpKind::Send).len() == 300
            && completions(s, 1, OpKind::Send).len() == 300));
        assert!(sim.nodes.iter().all(|n| n.done.iter().all(|c| c.err.is_none())));
    }
}

/// 16 senders into one slow receiver whose receive queue overflows:
/// congestion control keeps every stream moving, nothing is lost or
/// duplicated, each sender's messages arrive in its order.
#[test]
fn incast_16_to_1_with_slow_receiver() {
    let senders = 16;
    let mut sim = net_with(senders + 1, path(false), Link::default(), 9, config());
    sim.net.set_rx_per_ms(0, 400);
    sim.net.set_backlog_cap(0, 256);
    let per = 200u64;
    let peers: Vec<PeerId> = (1..=senders).map(|i| sim.peer(i, 0)).collect();
    let ring = 100;
    for k in 0..ring {
        post_slot(&mut sim, 0, k);
    }
    let mut sent = vec![0u64; senders + 1];
    let mut next = vec![0u64; senders + 1];
    let mut seen = 0;
    let total = senders as u64 * per;
    let mut got = 0u64;
    let end = sim.now() + Duration::from_secs(600);
    while got < total && sim.now() < end {
        for i in 1..=senders {
            while sent[i] < per {
                let data = msg(sent[i] + 1000 * i as u64, 8192);
                if sim.nodes[i]
                    .ep
                    .send(OutMsg {
                        peer: peers[i - 1],
                        header: header(sent[i]),
                        payload: &[&data],
                        user: IoList::default(),
                        meta: meta(sent[i]),
                    })
                    .is_err()
                {
                    break;
                }
                sent[i] += 1;
            }
        }
        for _ in 0..4 {
            sim.step();
        }
        while seen < sim.nodes[0].done.len() {
            let c = sim.nodes[0].done[seen];
            seen += 1;
            let from =
                (1..=senders).find(|&i| sim.nodes[0].ep.peer_id_of(simnet::addr(i as u32)) == c.src).expect("a sender");
            let k = next[from];
            assert_eq!(
                (c.kind, c.err, c.data, c.len),
                (OpKind::Recv, None, Some(k), 8192),
                "sender {from} message {k}"
            );
            assert!(
                sim.nodes[0].ep.mem().at(BASE + c.meta.context * SLOT, 8192) == msg(k + 1000 * from as u64, 8192),
                "sender {from} message {k}"
            );
            next[from] += 1;
            got += 1;
            post_slot(&mut sim, 0, c.meta.context);
        }
    }
    assert_eq!(got, total, "incast stalled");
    assert!(next[1..].iter().all(|&k| k == per));
    assert!(sim.net.backlog_drops(0) > 0, "the receiver was never overrun; the scenario tests nothing");
    let retx: u64 = (1..=senders).map(|i| sim.nodes[i].ep.stats().rdm.retransmits).sum();
    let sent_total: u64 = (1..=senders).map(|i| sim.nodes[i].ep.stats().rdm.sent_data).sum();
    // No congestion collapse: most transmissions are useful.
    assert!(retx * 2 < sent_total, "{retx} retransmissions of {sent_total} datagrams");
    // The overrun receiver's queue shows in the RTT: the senders back off.
    let reductions: u64 = (1..=senders).map(|i| sim.nodes[i].ep.stats().rdm.congestion_reductions).sum();
    assert!(reductions >= senders as u64, "{reductions} window reductions for {senders} congested senders");
    println!(
        "incast: {} virtual ms, {retx} retransmissions of {sent_total}, {} receiver drops",
        sim.now().as_nanos() / 1_000_000,
        sim.net.backlog_drops(0)
    );
}

/// A peer that vanishes silently (the network to it drops everything) fails
/// every pending send within a bound of the peer timeout, and not before it;
/// one whose process died (the device reports it unreachable) fails them at
/// once. Later sends fail at once instead of hanging.
#[test]
fn dead_peer_fails_every_pending_send_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    for silent in [true, false] {
        let mut sim =
            net_with(2, path(false), Link::default(), 4, EndpointConfig { peer_timeout: timeout, ..config() });
        let p = sim.peer(0, 1);
        for k in 0..10 {
            post_slot(&mut sim, 1, k);
            sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(k),
                    payload: &[&msg(k, 3000)],
                    user: IoList::default(),
                    meta: meta(k),
                })
                .unwrap();
        }
        assert!(sim.run_until(Duration::from_secs(5), |s| completions(s, 0, OpKind::Send).len() == 10
            && completions(s, 1, OpKind::Recv).len() == 10));
        for c in completions(&sim, 1, OpKind::Recv) {
            let k = c.data.unwrap();
            assert!(sim.nodes[1].ep.mem().at(BASE + c.meta.context * SLOT, 3000) == msg(k, 3000));
        }
        if silent {
            sim.net.set_link(Link { loss_pct: 100.0, ..Link::default() });
        } else {
            sim.kill(1);
        }
        let died = sim.now();
        for k in 10..30 {
            sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(k),
                    payload: &[&msg(k, 5000)],
                    user: IoList::default(),
                    meta: meta(k),
                })
                .unwrap();
        }
        let failed = |s: &Sim| {
            completions(s, 0, OpKind::Send).iter().filter(|c| c.err == Some(rndv::OpError::PeerUnreachable)).count()
        };
        assert!(sim.run_until(timeout * 3, |s| failed(s) == 20), "silent {silent}: only {} of 20 failed", failed(&sim));
        let elapsed = sim.now().saturating_duration_since(died);
        assert!(elapsed <= timeout + Duration::from_millis(500), "silent {silent}: failures took {elapsed:?}");
        if silent {
            assert!(elapsed >= timeout, "silent: failed after {elapsed:?}, before the peer timeout");
        }
        assert_eq!(completions(&sim, 0, OpKind::Send).len(), 30, "nothing succeeded after the death");
        assert!(sim.nodes[0].events.iter().any(|e| matches!(e, EndpointEvent::PeerFailed { peer, .. } if *peer == p)));
        // Later sends fail at once instead of hanging.
        sim.nodes[0]
            .ep
            .send(OutMsg { peer: p, header: header(99), payload: &[b"late"], user: IoList::default(), meta: meta(99) })
            .unwrap();
        sim.drain(0);
        let late = completions(&sim, 0, OpKind::Send);
        assert_eq!(
            late.last().map(|c| (c.meta.context, c.err)),
            Some((99, Some(rndv::OpError::PeerUnreachable))),
            "silent {silent}"
        );
    }
}

/// The rdm engine of a process that is gone: builds datagrams as its
/// endpoint would have (to inject them late).
fn raw_datagram(job_key: u64, incarnation: u64, to: u32, payload: &[u8]) -> Vec<u8> {
    let mut e = Engine::new(EngineConfig { job_key, incarnation, ..EngineConfig::default() });
    let p = e.peer(simnet::addr(to));
    let t = rdm::Instant::ZERO;
    e.send(t, p, &[payload], 1).unwrap();
    let mut buf = vec![0u8; 2000];
    let tx = e.poll_transmit(t, &mut buf).expect("a datagram");
    buf[..tx.len].to_vec()
}

/// A peer restarts (a new process, a new incarnation, at the same address):
/// the messages sent to the old incarnation and still in flight never reach
/// the new one (dropped as stale) and their sends fail; a late datagram of
/// the old incarnation is dropped too; the new session works both ways.
#[test]
fn a_restarted_peer_gets_a_new_session_and_nothing_sent_to_the_old_one_reaches_it() {
    for seed in seeds(&[8]) {
        let mut sim = net_with(2, path(false), Link::default(), seed, config());
        let p = sim.peer(0, 1);
        let q = sim.peer(1, 0);
        for k in 0..5 {
            post_slot(&mut sim, 0, k);
            post_slot(&mut sim, 1, k);
            sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(k),
                    payload: &[&msg(k, 2000)],
                    user: IoList::default(),
                    meta: meta(k),
                })
                .unwrap();
            sim.nodes[1]
                .ep
                .send(OutMsg {
                    peer: q,
                    header: header(k),
                    payload: &[&msg(k, 100)],
                    user: IoList::default(),
                    meta: meta(k),
                })
                .unwrap();
        }
        assert!(sim.run_until(Duration::from_secs(5), |s| completions(s, 1, OpKind::Recv).len() == 5
            && completions(s, 0, OpKind::Recv).len() == 5));
        // Five more to the old process, on the wire when it is replaced.
        for k in 100..105 {
            sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(k),
                    payload: &[&msg(k, 2000)],
                    user: IoList::default(),
                    meta: meta(k),
                })
                .unwrap();
        }
        sim.restart(1, 777_777, Mem::new());
        for k in 0..40 {
            post_slot(&mut sim, 1, k);
        }
        post_slot(&mut sim, 0, 5);
        let q = sim.peer(1, 0);
        sim.nodes[1]
            .ep
            .send(OutMsg {
                peer: q,
                header: header(1),
                payload: &[b"hello from the new incarnation"],
                user: IoList::default(),
                meta: meta(1),
            })
            .unwrap();
        assert!(sim.run_until(Duration::from_secs(5), |s| completions(s, 0, OpKind::Recv).len() == 6), "seed {seed}");
        let c = completions(&sim, 0, OpKind::Recv)[5];
        assert_eq!(sim.nodes[0].ep.mem().at(BASE + c.meta.context * SLOT, c.len), b"hello from the new incarnation");
        assert!(sim.nodes[0].ep.stats().rdm.peer_restarts >= 1);
        assert!(
            sim.run_until(Duration::from_secs(10), |s| completions(s, 0, OpKind::Send).len() == 10),
            "seed {seed}: the sends to the old process still wait"
        );
        for c in completions(&sim, 0, OpKind::Send) {
            if c.meta.context >= 100 {
                assert!(c.err.is_some(), "seed {seed}: a send to the old incarnation succeeded: {c:?}");
            } else {
                assert_eq!(c.err, None);
            }
        }
        assert!(sim.nodes[1].ep.stats().rdm.dropped_stale >= 1, "seed {seed}: {:?}", sim.nodes[1].ep.stats().rdm);
        assert!(
            sim.nodes[1].done.iter().all(|c| c.kind != OpKind::Recv),
            "seed {seed}: the new process received something sent to the old one: {:?}",
            sim.nodes[1].done
        );
        assert_eq!(sim.nodes[1].ep.unexpected_bytes(), 0);
        // The old incarnation's datagram arrives late: dropped, counted.
        let before = sim.nodes[0].ep.stats().rdm.dropped_stale;
        sim.net.inject(1, 0, raw_datagram(0, 1001, 0, b"old"));
        sim.run_until(Duration::from_millis(10), |_| false);
        assert_eq!(sim.nodes[0].ep.stats().rdm.dropped_stale, before + 1);
        assert_eq!(completions(&sim, 0, OpKind::Recv).len(), 6, "stale data must not be delivered");
        // And the new session works both ways.
        for k in 0..20 {
            sim.nodes[0]
                .ep
                .send(OutMsg {
                    peer: p,
                    header: header(200 + k),
                    payload: &[&msg(200 + k, 5000)],
                    user: IoList::default(),
                    meta: meta(200 + k),
                })
                .unwrap();
        }
        assert!(sim.run_until(Duration::from_secs(5), |s| completions(s, 1, OpKind::Recv).len() == 20), "seed {seed}");
        for (k, c) in completions(&sim, 1, OpKind::Recv).iter().enumerate() {
            let i = 200 + k as u64;
            assert_eq!((c.err, c.data), (None, Some(i)), "seed {seed}");
            assert!(
                sim.nodes[1].ep.mem().at(BASE + c.meta.context * SLOT, 5000) == msg(i, 5000),
                "seed {seed}: message {i}"
            );
        }
    }
}

/// A sender whose address for a peer names an incarnation that is gone (the
/// process at that address restarted before the sender ever talked to it):
/// the new process drops the packets as stale and receives nothing, the send
/// fails, and the old address is refused from then on; the new one works.
#[test]
fn an_address_naming_a_gone_incarnation_reaches_nobody() {
    let mut sim = net_with(2, path(false), Link::default(), 9, config());
    let gone_inc = 424_242;
    sim.restart(1, 777_777, Mem::new());
    post_slot(&mut sim, 1, 0);
    let p = sim.peer(0, 1);
    assert!(sim.nodes[0].ep.expect_incarnation(p, gone_inc), "nothing known yet: taken");
    sim.nodes[0]
        .ep
        .send(OutMsg {
            peer: p,
            header: header(1),
            payload: &[b"for the old process"],
            user: IoList::default(),
            meta: meta(1),
        })
        .unwrap();
    assert!(
        sim.run_until(Duration::from_secs(2), |s| completions(s, 0, OpKind::Send).len() == 1),
        "the send to the gone incarnation never ended"
    );
    assert!(completions(&sim, 0, OpKind::Send)[0].err.is_some(), "the send to the gone incarnation failed");
    assert!(completions(&sim, 1, OpKind::Recv).is_empty(), "the new process received nothing");
    assert_eq!(sim.nodes[1].ep.unexpected_bytes(), 0);
    assert!(sim.nodes[1].ep.stats().rdm.dropped_stale >= 1);
    assert!(!sim.nodes[0].ep.expect_incarnation(p, gone_inc), "the old address is stale now");
    assert!(sim.nodes[0].ep.expect_incarnation(p, 777_777), "the new one is right");
    sim.nodes[0]
        .ep
        .send(OutMsg {
            peer: p,
            header: header(2),
            payload: &[b"for the new process"],
            user: IoList::default(),
            meta: meta(2),
        })
        .unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| completions(s, 1, OpKind::Recv).len() == 1));
    let c = completions(&sim, 1, OpKind::Recv)[0];
    assert_eq!((c.err, c.data), (None, Some(2)));
    assert_eq!(sim.nodes[1].ep.mem().at(BASE, c.len), b"for the new process");
}

#[test]
fn foreign_job_key_is_dropped_and_counted() {
    let mut sim = net_with(2, path(false), Link::default(), 1, EndpointConfig { job_key: 5, ..config() });
    post_slot(&mut sim, 0, 0);
    sim.net.inject(1, 0, raw_datagram(6, 9, 0, b"intruder"));
    sim.run_until(Duration::from_millis(10), |_| false);
    assert_eq!(sim.nodes[0].ep.stats().rdm.dropped_job_key, 1);
    assert!(sim.nodes[0].done.is_empty() && sim.nodes[0].ep.unexpected_bytes() == 0);
    assert_eq!(sim.nodes[0].ep.stats().rdm.delivered_msgs, 0);
    // The same datagram with the job's key is taken (the check is the key).
    sim.net.inject(1, 0, raw_datagram(5, 9, 0, b"colleague"));
    sim.run_until(Duration::from_millis(10), |_| false);
    assert_eq!(sim.nodes[0].ep.stats().rdm.dropped_job_key, 1);
    assert_eq!(sim.nodes[0].ep.stats().rdm.delivered_msgs, 1);
}
