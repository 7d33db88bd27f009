//! Engine scenarios in the deterministic simulator.
use rdm::engine::{EngineConfig, Event};
use rdm::sim::{Link, Sim};
use std::time::Duration;

fn msg(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 131 + j * 7) as u8).collect()
}

fn delivered(sim: &Sim, node: usize) -> Vec<&Vec<u8>> {
    sim.nodes[node].events.iter().filter_map(|e| match e { Event::Delivered { msg, .. } => Some(msg), _ => None }).collect()
}

fn completed(sim: &Sim, node: usize) -> usize {
    sim.nodes[node].events.iter().filter(|e| matches!(e, Event::SendComplete { .. })).count()
}

/// One direction, `n` messages of mixed sizes, checked exactly-once in order.
fn stream(link: Link, seed: u64, n: u64, mtu: usize) -> Sim {
    let cfg = EngineConfig { mtu, ..EngineConfig::default() };
    let mut sim = Sim::new(2, cfg, link, seed);
    let p = sim.peer(0, 1);
    let sizes = [0usize, 1, 100, 1400, 3000, 20000];
    let mut sent = 0u64;
    let ok = sim.run_until(Duration::from_secs(600), |s| delivered(s, 1).len() as u64 == n && completed(s, 0) as u64 == n);
    let _ = ok;
    // Feed messages gradually so the queue never blocks.
    while sent < n {
        let len = sizes[(sent % sizes.len() as u64) as usize];
        let now = sim.now;
        if sim.nodes[0].engine.send(now, p, &[&msg(sent, len)], sent).is_ok() {
            sent += 1;
        } else {
            sim.step();
        }
        if sent % 64 == 0 {
            for _ in 0..8 {
                sim.step();
            }
        }
    }
    let done = sim.run_until(Duration::from_secs(600), |s| delivered(s, 1).len() as u64 == n && completed(s, 0) as u64 == n);
    if !done {
        let pa = sim.peer(0, 1);
        let pb = sim.peer(1, 0);
        eprintln!("sender: {}\nreceiver: {}\nreceiver stats {:?}", sim.nodes[0].engine.describe_peer(pa), sim.nodes[1].engine.describe_peer(pb), sim.nodes[1].engine.stats());
    }
    let got = delivered(&sim, 1);
    assert!(done, "only {} of {n} delivered, {} completed; stats {:?}", got.len(), completed(&sim, 0), sim.nodes[0].engine.stats());
    for (i, m) in got.iter().enumerate() {
        let len = sizes[i % sizes.len()];
        assert_eq!(**m, msg(i as u64, len), "message {i} wrong or out of order");
    }
    sim
}

#[test]
fn lossless_stream_delivers_in_order() {
    stream(Link::default(), 1, 500, 1472);
}

#[test]
fn lossy_reordering_duplicating_corrupting_link() {
    let link = Link { loss_pct: 10.0, reorder_pct: 20.0, dup_pct: 1.0, corrupt_pct: 0.1, ..Link::default() };
    let n = if cfg!(debug_assertions) { 2_000 } else { 20_000 };
    let sim = stream(link, 7, n, 1472);
    let st = sim.nodes[1].engine.stats();
    assert!(st.duplicates > 0 && st.out_of_order > 0, "{st:?}");
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
