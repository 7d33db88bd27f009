//! The small-message path of a reliable, ordered device (shm's gathered
//! write over a peer's send handle, [`rdm::device::Device::write`]) checked against the engine
//! path it short-cuts, for the same operation sequences.
//!
//! Each scenario runs twice on the simulated network, once with the devices
//! taking gathered writes (a small message goes from the application's
//! buffer straight to the device and completes at once) and once without
//! (the same message is staged, queued, written out by `poll_transmit` and
//! completed through the rdm engine's `SendComplete`). Everything the
//! application can observe must be the same: every completion of every node,
//! in order, with its length, tag, source and error, every byte that landed,
//! and the failures after a peer is killed mid-stream. Sequences mix eager
//! and rendezvous messages (which take the engine and must keep their order
//! with the fast ones), tagged and untagged, posted and unexpected receives,
//! and wildcard receives.
mod common;

use common::*;
use rdm::rng::Rng;
use rdm::sim::Link;
use rdm::DeviceCaps;
use rndv::engine::{IoList, OpKind, OutMsg, RecvSpec};
use rndv::{EndpointConfig, MsgHeader, MsgKind, Src};
use std::time::Duration;

/// A shared-memory-like path: reliable, ordered, remote reads, 8 KiB datagrams.
fn shm_path() -> DeviceCaps {
    DeviceCaps { reliable: true, ordered: true, remote_read: true, ..DeviceCaps::datagram(8192) }
}

const NODES: usize = 3;
const OPS: usize = 400;
/// Each operation's buffer: sends in the lower half of memory, receives in the upper.
const SLOT: u64 = 8192;
const RECV_BASE: u64 = BASE + (4 << 20);
const MAX_LEN: usize = 6000;

/// What the application saw on every node: completions (as printed) and the
/// bytes each completed receive left in its buffer.
#[derive(Debug, PartialEq)]
struct Observed {
    completions: Vec<Vec<String>>,
    landed: Vec<Vec<(u64, Vec<u8>)>>,
    /// Sends refused at post (`Again`: both runs must refuse the same ones).
    refused: Vec<String>,
    /// Messages the devices wrote straight from application buffers.
    written: u64,
}

fn run(seed: u64, gathered_writes: bool, kill_at: Option<usize>) -> Observed {
    let cfg = EndpointConfig { rndv_threshold: 4096, window_threshold: 4096, ..config() };
    let mut sim = net_with(NODES, shm_path(), Link::default(), seed, cfg);
    sim.net.set_gathered_writes(gathered_writes);
    let mut rng = Rng::new(seed);
    let mut recv_len = vec![Vec::new(); NODES];
    let mut refused = Vec::new();
    for op in 0..OPS {
        if kill_at == Some(op) {
            sim.kill(2);
        }
        match rng.below(10) {
            0..=4 => {
                let from = rng.below(NODES);
                let to = (from + 1 + rng.below(NODES - 1)) % NODES;
                if kill_at.is_some_and(|k| op >= k) && from == 2 {
                    continue;
                }
                let len = if rng.chance(20.0) { 4096 + rng.below(MAX_LEN - 4096) } else { rng.below(600) };
                let tagged = rng.chance(50.0);
                let h = MsgHeader {
                    kind: if tagged { MsgKind::Tagged } else { MsgKind::Msg },
                    tag: rng.below(3) as u64,
                    data: None,
                };
                let data = pattern(len, seed * 1000 + op as u64);
                let addr = BASE + op as u64 * SLOT;
                let peer = sim.peer(from, to);
                sim.nodes[from].ep.mem_mut().put(addr, &data);
                // `Again` (the send queue is full) is an outcome too: both
                // runs must meet it at the same operations.
                if let Err(e) = sim.nodes[from].ep.send(OutMsg {
                    peer,
                    header: h,
                    payload: &[&data],
                    user: IoList::one(addr, len as u64),
                    meta: meta(op as u64),
                }) {
                    refused.push(format!("node {from} op {op}: {e:?}"));
                }
            }
            5..=7 => {
                let node = rng.below(NODES);
                if kill_at.is_some_and(|k| op >= k) && node == 2 {
                    continue;
                }
                let tagged = rng.chance(50.0);
                let any_tag = rng.chance(30.0);
                let src = if rng.chance(30.0) { Src::Peer(sim.peer(node, (node + 1) % NODES)) } else { Src::Any };
                let addr = RECV_BASE + op as u64 * SLOT;
                let spec = RecvSpec {
                    kind: if tagged { MsgKind::Tagged } else { MsgKind::Msg },
                    src,
                    tag: rng.below(3) as u64,
                    ignore: if any_tag { u64::MAX } else { 0 },
                    iov: IoList::one(addr, MAX_LEN as u64),
                    multi: false,
                    meta: meta(op as u64),
                };
                sim.nodes[node].ep.post_recv(spec).expect("post_recv");
                recv_len[node].push((op as u64, addr));
            }
            _ => {
                for _ in 0..1 + rng.below(4) {
                    sim.step();
                }
            }
        }
        for i in 0..NODES {
            sim.drain(i);
        }
    }
    sim.run_until(Duration::from_secs(5), |_| false);
    for i in 0..NODES {
        sim.drain(i);
    }
    let mut landed = vec![Vec::new(); NODES];
    for (i, posted) in recv_len.iter().enumerate() {
        for c in sim.completions(i, OpKind::Recv) {
            let &(ctx, addr) = posted.iter().find(|(ctx, _)| *ctx == c.meta.context).expect("a posted receive");
            landed[i].push((ctx, sim.nodes[i].ep.mem().at(addr, c.len).to_vec()));
        }
    }
    Observed {
        completions: (0..NODES)
            .map(|i| {
                [OpKind::Send, OpKind::Recv]
                    .iter()
                    .flat_map(|&k| sim.completions(i, k))
                    .map(|c| format!("{c:?}"))
                    .collect()
            })
            .collect(),
        landed,
        refused,
        written: (0..NODES).map(|i| sim.nodes[i].ep.stats().rdm.sent_direct_written).sum(),
    }
}

/// The first completion where two runs part, per node (a readable failure).
fn same_completions(seed: u64, fast: &Observed, engine: &Observed) {
    for (node, (a, b)) in fast.completions.iter().zip(&engine.completions).enumerate() {
        if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
            panic!(
                "seed {seed}, node {node}, completion {i} of {}/{}:\n fast:   {:?}\n engine: {:?}",
                a.len(),
                b.len(),
                a.get(i),
                b.get(i)
            );
        }
    }
}

#[test]
fn the_fast_path_is_the_engine_path_as_the_application_sees_it() {
    for seed in seeds(&[1, 2, 3, 4, 5, 6]) {
        let fast = run(seed, true, None);
        let engine = run(seed, false, None);
        assert!(fast.written > 0, "seed {seed}: the fast path was taken");
        assert_eq!(engine.written, 0, "seed {seed}: without gathered writes nothing is written directly");
        assert!(
            fast.completions.iter().map(Vec::len).sum::<usize>() > OPS / 2,
            "seed {seed}: the scenario completes work"
        );
        same_completions(seed, &fast, &engine);
        assert_eq!(fast.landed, engine.landed, "seed {seed}");
        assert_eq!(fast.refused, engine.refused, "seed {seed}");
    }
}

#[test]
fn a_peer_killed_mid_stream_fails_the_same_messages_on_both_paths() {
    for seed in seeds(&[11, 12, 13]) {
        let fast = run(seed, true, Some(OPS / 2));
        let engine = run(seed, false, Some(OPS / 2));
        assert!(fast.written > 0, "seed {seed}");
        let failed = |o: &Observed| o.completions.iter().flatten().filter(|c| c.contains("PeerUnreachable")).count();
        assert!(failed(&fast) > 0, "seed {seed}: sends to the killed node failed");
        same_completions(seed, &fast, &engine);
        assert_eq!(fast.landed, engine.landed, "seed {seed}");
    }
}
