//! Engine scenarios in the deterministic simulator (`rdm::sim`). Every scenario
//! asserts exactly-once, in-order delivery of every byte; each replays exactly
//! from its seed.
use rdm::engine::{EngineConfig, Event, FailReason, JobAuth, JobSecret};
use rdm::sim::{Link, Sim};
use std::sync::Arc;
use std::time::Duration;

fn msg(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect()
}

fn delivered(sim: &Sim, node: usize) -> Vec<&Vec<u8>> {
    sim.nodes[node]
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Delivered { msg, .. } => Some(msg),
            _ => None,
        })
        .collect()
}

fn delivered_from(sim: &Sim, node: usize, from: usize) -> Vec<&Vec<u8>> {
    let want = sim.nodes[node].engine.peer_id_of(rdm::simnet::addr(from as u32));
    sim.nodes[node]
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Delivered { msg, peer } if Some(*peer) == want => Some(msg),
            _ => None,
        })
        .collect()
}

fn completed(sim: &Sim, node: usize) -> usize {
    sim.nodes[node].events.iter().filter(|e| matches!(e, Event::SendComplete { .. })).count()
}

const SIZES: [usize; 6] = [0, 1, 100, 1400, 3000, 20000];

/// One direction, `n` messages of mixed sizes, checked exactly-once in order.
fn stream(cfg: EngineConfig, link: Link, seed: u64, n: u64, sizes: &[usize]) -> Sim {
    let mut sim = Sim::new(2, cfg, link, seed);
    let p = sim.peer(0, 1);
    let mut sent = 0u64;
    while sent < n {
        let len = sizes[(sent % sizes.len() as u64) as usize];
        let now = sim.now;
        if sim.nodes[0].engine.send(now, p, &[&msg(sent, len)], sent).is_ok() {
            sent += 1;
        } else {
            sim.step();
        }
        if sent.is_multiple_of(64) {
            for _ in 0..8 {
                sim.step();
            }
        }
    }
    let done =
        sim.run_until(Duration::from_secs(600), |s| delivered(s, 1).len() as u64 == n && completed(s, 0) as u64 == n);
    if !done {
        let pa = sim.peer(0, 1);
        let pb = sim.peer(1, 0);
        eprintln!(
            "sender: {}\nreceiver: {}",
            sim.nodes[0].engine.describe_peer(pa),
            sim.nodes[1].engine.describe_peer(pb)
        );
    }
    let got = delivered(&sim, 1);
    assert!(
        done,
        "only {} of {n} delivered, {} completed; stats {:?}",
        got.len(),
        completed(&sim, 0),
        sim.nodes[0].engine.stats()
    );
    for (i, m) in got.iter().enumerate() {
        let len = sizes[i % sizes.len()];
        assert!(**m == msg(i as u64, len), "message {i} wrong or out of order");
    }
    sim
}

#[test]
fn lossless_stream_delivers_in_order() {
    stream(EngineConfig::default(), Link::default(), 1, 500, &SIZES);
}

#[test]
fn hundred_thousand_messages_under_loss_reorder_dup_corruption() {
    let link = Link { loss_pct: 10.0, reorder_pct: 20.0, dup_pct: 1.0, corrupt_pct: 0.1, ..Link::default() };
    // Release builds (CI) run the full 100,000; debug builds a tenth.
    let n = if cfg!(debug_assertions) { 10_000 } else { 100_000 };
    let sim = stream(EngineConfig::default(), link, 7, n, &SIZES);
    let rx = sim.nodes[1].engine.stats();
    let tx = sim.nodes[0].engine.stats();
    assert!(
        rx.duplicates > 0
            && rx.out_of_order > 0
            && rx.dropped_checksum + tx.dropped_checksum + rx.dropped_malformed > 0,
        "{rx:?}"
    );
    assert!(tx.retransmits > 0, "{tx:?}");
}

/// A job with a secret (`rdm/PROTOCOL.md` §2.5): tagged, or enciphered too.
fn sealed(encrypt: bool) -> EngineConfig {
    let secret = JobSecret::new(b"a job secret of some length").unwrap();
    EngineConfig { auth: Some(Arc::new(JobAuth { secret, encrypt })), ..EngineConfig::default() }
}

/// Sealed traffic under the same faults: every corrupted datagram fails its
/// tag (none its checksum: it has none), duplicates are refused as replays
/// or duplicates, and everything arrives once, in order, from a first
/// contact that named no incarnation.
#[test]
fn sealed_stream_under_loss_reorder_dup_corruption() {
    let link = Link { loss_pct: 10.0, reorder_pct: 20.0, dup_pct: 1.0, corrupt_pct: 0.1, ..Link::default() };
    let n = if cfg!(debug_assertions) { 3_000 } else { 30_000 };
    for encrypt in [false, true] {
        let sim = stream(sealed(encrypt), link, 17, n, &SIZES);
        let (tx, rx) = (sim.nodes[0].engine.stats(), sim.nodes[1].engine.stats());
        assert!(rx.dropped_auth + tx.dropped_auth > 0 && rx.dropped_checksum + tx.dropped_checksum == 0, "{rx:?}");
        assert!(rx.duplicates + rx.dropped_replay > 0 && tx.retransmits > 0, "{rx:?} {tx:?}");
    }
}

/// Sealed over a device that never loses but reorders (SRD): nothing is
/// refused as too old that no retransmission would send again.
#[test]
fn sealed_reliable_unordered_device_needs_no_retransmission() {
    let cfg = EngineConfig { reliable: true, ..sealed(false) };
    let link = Link { reorder_pct: 30.0, jitter: Duration::from_micros(50), ..Link::default() };
    let sim = stream(cfg, link, 5, 5000, &SIZES);
    let rx = sim.nodes[1].engine.stats();
    assert_eq!(rx.dropped_replay, 0, "{rx:?}");
    // First contact by address alone: the one datagram a sender keeps in
    // flight until it knows its peer, and its copy resent before the echo
    // that made the sender current arrived, at most.
    assert!((1..=2).contains(&rx.dropped_unnamed), "the first contact's datagrams only: {rx:?}");
}

#[test]
fn mtu_4096_device() {
    let cfg = EngineConfig { mtu: 4096, ..EngineConfig::default() };
    let link = Link { loss_pct: 5.0, reorder_pct: 10.0, ..Link::default() };
    stream(cfg, link, 11, 3000, &SIZES);
}

#[test]
fn reliable_unordered_device_needs_no_retransmission() {
    // SRD-like: never loses, but reorders.
    let cfg = EngineConfig { reliable: true, ..EngineConfig::default() };
    let link = Link { reorder_pct: 30.0, jitter: Duration::from_micros(50), ..Link::default() };
    let sim = stream(cfg, link, 5, 5000, &SIZES);
    assert_eq!(sim.nodes[0].engine.stats().retransmits, 0);
    assert!(sim.nodes[1].engine.stats().out_of_order > 0);
}

#[test]
fn pingpong_under_loss() {
    let link = Link { loss_pct: 5.0, reorder_pct: 20.0, dup_pct: 1.0, ..Link::default() };
    let mut sim = Sim::new(2, EngineConfig::default(), link, 3);
    let a = sim.peer(0, 1);
    let b = sim.peer(1, 0);
    for i in 0..300u64 {
        let len = [64usize, 256, 1024, 4096, 65536][(i % 5) as usize];
        let now = sim.now;
        sim.nodes[0].engine.send(now, a, &[&msg(i, len)], i).unwrap();
        assert!(sim.run_until(Duration::from_secs(60), |s| delivered(s, 1).len() as u64 == i + 1), "ping {i} lost");
        let now = sim.now;
        sim.nodes[1].engine.send(now, b, &[&msg(i, len)], i).unwrap();
        assert!(sim.run_until(Duration::from_secs(60), |s| delivered(s, 0).len() as u64 == i + 1), "pong {i} lost");
    }
    assert!(sim.run_until(Duration::from_secs(60), |s| completed(s, 0) == 300 && completed(s, 1) == 300));
}

/// Goodput of one 4 KiB-message stream over a 1 Gbit/s, 50 µs link at each
/// loss rate, as a table pinned by a snapshot (copied into docs/reliability.md;
/// `docs_goodput.rs` fails when the two differ).
#[test]
fn goodput_versus_loss_table() {
    let mut table = String::from("| loss % | goodput MB/s | retransmitted % |\n|---:|---:|---:|\n");
    for loss in [0.0, 0.1, 1.0, 5.0, 10.0, 20.0, 30.0] {
        let link = Link { loss_pct: loss, delay: Duration::from_micros(50), bandwidth: 125_000_000, ..Link::default() };
        let n = 2000u64;
        let sim = stream(EngineConfig::default(), link, 42, n, &[4096]);
        let secs = sim.now.as_nanos() as f64 / 1e9;
        let mb = (n * 4096) as f64 / 1e6;
        let st = sim.nodes[0].engine.stats();
        let retx = 100.0 * st.retransmits as f64 / st.sent_data.max(1) as f64;
        table.push_str(&format!("| {loss} | {:.1} | {:.1} |\n", mb / secs, retx));
    }
    println!("{table}");
    insta::assert_snapshot!("goodput_vs_loss", table);
}

/// Random loss is not congestion: on a link with room to spare (no queue),
/// 5% random loss costs retransmissions but no window reductions, and the
/// stream keeps at least half of its lossless goodput.
#[test]
fn random_loss_without_a_queue_keeps_the_window() {
    let run = |loss: f64| {
        let link = Link { loss_pct: loss, delay: Duration::from_micros(50), bandwidth: 125_000_000, ..Link::default() };
        let n = 2000u64;
        let sim = stream(EngineConfig::default(), link, 7, n, &[4096]);
        ((n * 4096) as f64 / sim.now.as_nanos() as f64, *sim.nodes[0].engine.stats())
    };
    let (lossless, _) = run(0.0);
    let (lossy, st) = run(5.0);
    assert!(lossy >= 0.5 * lossless, "5% loss: {lossy:.3} GB/s vs {lossless:.3} lossless");
    assert!(st.fast_retransmits > 50, "{st:?}");
    assert!(st.congestion_reductions * 10 < st.fast_retransmits, "{st:?}");
}

/// 16 senders into one slow receiver whose socket buffer overflows: congestion
/// control keeps every stream moving, nothing is lost or duplicated.
#[test]
fn incast_16_to_1_with_slow_receiver() {
    let senders = 16;
    let mut sim = Sim::new(senders + 1, EngineConfig::default(), Link::default(), 9);
    sim.nodes[0].rx_per_ms = Some(400);
    sim.nodes[0].backlog_cap = 256;
    let per = 200u64;
    let peers: Vec<_> = (1..=senders).map(|i| sim.peer(i, 0)).collect();
    let mut sent = vec![0u64; senders + 1];
    loop {
        let mut all = true;
        for i in 1..=senders {
            if sent[i] < per {
                all = false;
                let now = sim.now;
                if sim.nodes[i]
                    .engine
                    .send(now, peers[i - 1], &[&msg(sent[i] + 1000 * i as u64, 8192)], sent[i])
                    .is_ok()
                {
                    sent[i] += 1;
                }
            }
        }
        if all {
            break;
        }
        for _ in 0..4 {
            sim.step();
        }
    }
    let total = senders as u64 * per;
    assert!(
        sim.run_until(Duration::from_secs(600), |s| delivered(s, 0).len() as u64 == total),
        "incast stalled: {} of {total}",
        delivered(&sim, 0).len()
    );
    for i in 1..=senders {
        let got = delivered_from(&sim, 0, i);
        assert_eq!(got.len() as u64, per, "sender {i}");
        for (k, m) in got.iter().enumerate() {
            assert!(**m == msg(k as u64 + 1000 * i as u64, 8192), "sender {i} message {k}");
        }
    }
    assert!(sim.nodes[0].backlog_drops > 0, "the receiver was never overrun; the scenario tests nothing");
    let retx: u64 = (1..=senders).map(|i| sim.nodes[i].engine.stats().retransmits).sum();
    let sent_total: u64 = (1..=senders).map(|i| sim.nodes[i].engine.stats().sent_data).sum();
    // No congestion collapse: most transmissions are useful.
    assert!(retx * 2 < sent_total, "{retx} retransmissions of {sent_total} datagrams");
    // The overrun receiver's queue shows in the RTT: the senders back off.
    let reductions: u64 = (1..=senders).map(|i| sim.nodes[i].engine.stats().congestion_reductions).sum();
    assert!(reductions >= senders as u64, "{reductions} window reductions for {senders} congested senders");
    println!(
        "incast: {} virtual ms, {retx} retransmissions of {sent_total}, {} receiver drops",
        sim.now.as_nanos() / 1_000_000,
        sim.nodes[0].backlog_drops
    );
}

#[test]
fn dead_peer_fails_every_pending_operation_within_the_timeout() {
    let timeout = Duration::from_secs(2);
    let cfg = EngineConfig { peer_timeout: timeout, ..EngineConfig::default() };
    let mut sim = Sim::new(2, cfg, Link::default(), 4);
    let p = sim.peer(0, 1);
    for i in 0..10 {
        let now = sim.now;
        sim.nodes[0].engine.send(now, p, &[&msg(i, 3000)], i).unwrap();
    }
    assert!(sim.run_until(Duration::from_secs(5), |s| completed(s, 0) == 10));
    // The peer dies; 20 more operations are queued to it.
    sim.nodes[1].alive = false;
    let died = sim.now;
    for i in 10..30 {
        let now = sim.now;
        sim.nodes[0].engine.send(now, p, &[&msg(i, 5000)], i).unwrap();
    }
    let failed = |s: &Sim| {
        s.nodes[0].events.iter().filter(|e| matches!(e, Event::SendFailed { reason: FailReason::Timeout, .. })).count()
    };
    assert!(sim.run_until(timeout * 3, |s| failed(s) == 20), "only {} of 20 failed", failed(&sim));
    let elapsed = sim.now.saturating_duration_since(died);
    assert!(elapsed <= timeout + Duration::from_millis(500), "failures took {elapsed:?}");
    assert!(sim.nodes[0].events.iter().any(|e| matches!(e, Event::PeerUnreachable { .. })));
    // Later sends fail at once instead of hanging.
    let now = sim.now;
    sim.nodes[0].engine.send(now, p, &[b"late"], 99).unwrap();
    assert!(sim.nodes[0].engine.poll_event().is_some_and(|e| matches!(e, Event::SendFailed { token: 99, .. })));
}

#[test]
fn restarted_peer_gets_a_new_session_and_stale_packets_are_ignored() {
    restart_scenario(EngineConfig::default());
    restart_scenario(sealed(false));
}

fn restart_scenario(cfg: EngineConfig) {
    let mut sim = Sim::new(2, cfg, Link::default(), 8);
    let p = sim.peer(0, 1);
    let q = sim.peer(1, 0);
    for i in 0..5 {
        let now = sim.now;
        sim.nodes[0].engine.send(now, p, &[&msg(i, 2000)], i).unwrap();
        let now = sim.now;
        sim.nodes[1].engine.send(now, q, &[&msg(i, 100)], i).unwrap();
    }
    assert!(sim.run_until(Duration::from_secs(5), |s| delivered(s, 1).len() == 5 && delivered(s, 0).len() == 5));
    // Capture a datagram of node 1's old incarnation to replay later.
    let mut buf = vec![0u8; 2000];
    let now = sim.now;
    sim.nodes[1].engine.send(now, q, &[b"old"], 100).unwrap();
    let stale = sim.nodes[1].engine.poll_transmit(now, &mut buf).map(|t| buf[..t.len].to_vec()).unwrap();
    // Node 1 restarts (new process at the same address).
    sim.restart(1, 777_777);
    let q = sim.peer(1, 0);
    let now = sim.now;
    sim.nodes[1].engine.send(now, q, &[b"hello from the new incarnation"], 1).unwrap();
    assert!(sim.run_until(Duration::from_secs(5), |s| delivered(s, 0).len() == 6));
    assert_eq!(delivered(&sim, 0)[5].as_slice(), b"hello from the new incarnation");
    assert!(sim.nodes[0].events.iter().any(|e| matches!(e, Event::PeerRestarted { .. })));
    // The old incarnation's datagram arrives late: dropped, counted.
    sim.inject(1, 0, stale);
    let before = sim.nodes[0].engine.stats().dropped_stale;
    sim.run_until(Duration::from_millis(10), |_| false);
    assert_eq!(sim.nodes[0].engine.stats().dropped_stale, before + 1);
    assert_eq!(delivered(&sim, 0).len(), 6, "stale data must not be delivered");
    // And the new session works both ways.
    for i in 0..20 {
        let now = sim.now;
        sim.nodes[0].engine.send(now, p, &[&msg(i, 5000)], 200 + i).unwrap();
    }
    assert!(sim.run_until(Duration::from_secs(5), |s| delivered(s, 1).len() == 20));
}

/// A sender whose address for a peer names an incarnation that is gone (the
/// process at that address restarted before the sender ever talked to it):
/// the new process drops the packets as stale and delivers nothing, the send
/// fails, and the old address is refused from then on; the new one works.
#[test]
fn an_address_naming_a_gone_incarnation_reaches_nobody() {
    gone_incarnation_scenario(EngineConfig::default());
    gone_incarnation_scenario(sealed(true));
}

fn gone_incarnation_scenario(cfg: EngineConfig) {
    let mut sim = Sim::new(2, cfg, Link::default(), 9);
    let gone_inc = 424_242;
    sim.restart(1, 777_777); // node 1 is now incarnation 777777
    let p = sim.peer(0, 1);
    assert!(sim.nodes[0].engine.expect_incarnation(p, gone_inc), "nothing known yet: taken");
    let now = sim.now;
    sim.nodes[0].engine.send(now, p, &[b"for the old process"], 1).unwrap();
    let failed = |s: &Sim| {
        s.nodes[0]
            .events
            .iter()
            .any(|e| matches!(e, Event::SendFailed { token: 1, reason: FailReason::PeerRestarted, .. }))
    };
    assert!(sim.run_until(Duration::from_secs(2), failed), "the send to the gone incarnation failed");
    assert!(delivered(&sim, 1).is_empty(), "the new process delivered nothing");
    assert!(sim.nodes[1].engine.stats().dropped_stale >= 1);
    assert!(!sim.nodes[0].engine.expect_incarnation(p, gone_inc), "the old address is stale now");
    assert!(sim.nodes[0].engine.expect_incarnation(p, 777_777), "the new one is right");
    let now = sim.now;
    sim.nodes[0].engine.send(now, p, &[b"for the new process"], 2).unwrap();
    assert!(sim.run_until(Duration::from_secs(2), |s| delivered(s, 1).len() == 1));
    assert_eq!(delivered(&sim, 1)[0].as_slice(), b"for the new process");
}

#[test]
fn foreign_job_key_is_dropped_and_counted() {
    let mut sim = Sim::new(2, EngineConfig { job_key: 5, ..EngineConfig::default() }, Link::default(), 1);
    let other = rdm::engine::Engine::new(EngineConfig { job_key: 6, incarnation: 9, ..EngineConfig::default() });
    let mut other = other;
    let to0 = other.peer(rdm::simnet::addr(0));
    other.send(sim.now, to0, &[b"intruder"], 1).unwrap();
    let mut buf = vec![0u8; 2000];
    let t = other.poll_transmit(sim.now, &mut buf).unwrap();
    sim.inject(1, 0, buf[..t.len].to_vec());
    sim.run_until(Duration::from_millis(10), |_| false);
    assert_eq!(sim.nodes[0].engine.stats().dropped_job_key, 1);
    assert!(delivered(&sim, 0).is_empty());
}
