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
//!
//! Both runs are also held to what the application sent ([`check_against_sent`]),
//! so that a defect the two paths share fails too: every landed receive holds
//! the bytes of one message sent to that node that the receive accepts, with
//! its length, tag and source; no message lands twice; a send completes at
//! most once, an eager one always and a rendezvous one exactly when its
//! message landed; and messages of one sender are matched in order (MPI's
//! non-overtaking rule).
mod common;

use common::*;
use rdm::rng::Rng;
use rdm::sim::Link;
use rdm::DeviceCaps;
use rndv::engine::{IoList, OpKind, OutMsg, RecvSpec};
use rndv::sim::EndpointSim;
use rndv::{EndpointConfig, MsgHeader, MsgKind, Src};
use std::collections::HashMap;
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
    /// Where the run departs from what the application sent
    /// ([`check_against_sent`]); empty when it does not.
    violations: Vec<String>,
}

/// A message the application sent (and the send was taken).
struct Sent {
    op: u64,
    from: usize,
    to: usize,
    kind: MsgKind,
    tag: u64,
    data: Vec<u8>,
}

/// A receive the application posted.
struct Posted {
    op: u64,
    kind: MsgKind,
    /// The node a directed receive names.
    src: Option<usize>,
    tag: u64,
    ignore: u64,
    addr: u64,
}

impl Posted {
    fn accepts(&self, m: &Sent) -> bool {
        self.kind == m.kind
            && self.src.is_none_or(|s| s == m.from)
            && (m.kind == MsgKind::Msg || (self.tag | self.ignore) == (m.tag | self.ignore))
    }
}

/// The payload of send `op`: a pattern led by the operation's number, so that
/// a landed receive names the message it holds (a message under 2 bytes may
/// be taken for another of its length, which the checks allow for).
fn payload(len: usize, seed: u64, op: u64) -> Vec<u8> {
    let mut d = pattern(len, seed * 1000 + op);
    for (b, x) in d.iter_mut().zip((op as u16).to_le_bytes()) {
        *b = x;
    }
    d
}

/// Holds a run to what the application sent and posted (see the module docs):
/// the departures found, each said once.
fn check_against_sent(
    sim: &mut EndpointSim<Mem>,
    sent: &[Sent],
    posted: &[Vec<Posted>],
    rndv_threshold: usize,
) -> Vec<String> {
    let mut bad = Vec::new();
    // Send completions by (node, context).
    let mut send_done: HashMap<(usize, u64), usize> = HashMap::new();
    for node in 0..NODES {
        for c in sim.completions(node, OpKind::Send) {
            *send_done.entry((node, c.meta.context)).or_default() += 1;
        }
    }
    for (&(node, op), &n) in &send_done {
        if n > 1 || !sent.iter().any(|m| m.from == node && m.op == op) {
            bad.push(format!("node {node}: send {op} completed {n} times, or was never taken"));
        }
    }
    let mut used = vec![false; sent.len()];
    for (node, posts) in posted.iter().enumerate() {
        // (receive, message) in the order the receives completed.
        let mut matched: Vec<(&Posted, &Sent)> = Vec::new();
        for c in sim.completions(node, OpKind::Recv) {
            let Some(r) = posts.iter().find(|r| r.op == c.meta.context) else {
                bad.push(format!("node {node}: a receive completion for no posted receive: {c:?}"));
                continue;
            };
            if c.err.is_some() {
                continue;
            }
            let bytes = sim.nodes[node].ep.mem().at(r.addr, c.len).to_vec();
            let found =
                sent.iter().enumerate().find(|(k, m)| !used[*k] && m.to == node && m.data == bytes && r.accepts(m));
            let Some((k, m)) = found else {
                bad.push(format!("node {node}: receive {} holds {} bytes no accepted send to it carried", r.op, c.len));
                continue;
            };
            used[k] = true;
            let src = sim.peer(node, m.from);
            if c.src != Some(src) || (m.kind == MsgKind::Tagged && c.tag != m.tag) {
                bad.push(format!("node {node}: receive {} of send {}: source or tag wrong: {c:?}", r.op, m.op));
            }
            matched.push((r, m));
        }
        // Non-overtaking: of two messages from one sender, the earlier one
        // never lands in a later-posted receive while an earlier-posted one
        // that accepts it took the later message.
        for (r1, m1) in &matched {
            for (r2, m2) in &matched {
                let identified = m1.data.len() >= 2 && m2.data.len() >= 2;
                if identified && m1.from == m2.from && m1.op < m2.op && r2.op < r1.op && r2.accepts(m1) {
                    bad.push(format!(
                        "node {node}: send {} (later) overtook send {} from node {}: receive {} took it though it accepts the earlier one, which went to receive {}",
                        m2.op, m1.op, m1.from, r2.op, r1.op
                    ));
                }
            }
        }
    }
    // An eager message completes once written; a rendezvous one once its
    // receiver took it, and only then.
    for (k, m) in sent.iter().enumerate() {
        let done = send_done.contains_key(&(m.from, m.op));
        let eager = m.data.len() < rndv_threshold;
        if (eager && !done) || (!eager && done != used[k]) {
            bad.push(format!(
                "send {} ({} bytes, node {} to {}): completed {done}, landed {}",
                m.op,
                m.data.len(),
                m.from,
                m.to,
                used[k]
            ));
        }
    }
    bad
}

fn run(seed: u64, gathered_writes: bool, kill_at: Option<usize>) -> Observed {
    let cfg = EndpointConfig { rndv_threshold: 4096, window_threshold: 4096, ..config() };
    let mut sim = net_with(NODES, shm_path(), Link::default(), seed, cfg.clone());
    sim.net.set_gathered_writes(gathered_writes);
    let mut rng = Rng::new(seed);
    let mut recv_len = vec![Vec::new(); NODES];
    let mut refused = Vec::new();
    let mut sent: Vec<Sent> = Vec::new();
    let mut posted: Vec<Vec<Posted>> = (0..NODES).map(|_| Vec::new()).collect();
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
                let data = payload(len, seed, op as u64);
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
                } else {
                    sent.push(Sent { op: op as u64, from, to, kind: h.kind, tag: h.tag, data });
                }
            }
            5..=7 => {
                let node = rng.below(NODES);
                if kill_at.is_some_and(|k| op >= k) && node == 2 {
                    continue;
                }
                let tagged = rng.chance(50.0);
                let any_tag = rng.chance(30.0);
                let directed = rng.chance(30.0);
                let src = if directed { Src::Peer(sim.peer(node, (node + 1) % NODES)) } else { Src::Any };
                let addr = RECV_BASE + op as u64 * SLOT;
                let kind = if tagged { MsgKind::Tagged } else { MsgKind::Msg };
                let tag = rng.below(3) as u64;
                let ignore = if any_tag { u64::MAX } else { 0 };
                posted[node].push(Posted {
                    op: op as u64,
                    kind,
                    src: directed.then_some((node + 1) % NODES),
                    tag,
                    ignore,
                    addr,
                });
                let spec = RecvSpec {
                    kind,
                    src,
                    tag,
                    ignore,
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
    let violations =
        if kill_at.is_none() { check_against_sent(&mut sim, &sent, &posted, cfg.rndv_threshold) } else { Vec::new() };
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
        violations,
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
        assert!(fast.violations.is_empty(), "seed {seed}, fast path: {:#?}", fast.violations);
        assert!(engine.violations.is_empty(), "seed {seed}, engine path: {:#?}", engine.violations);
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
