//! A deterministic network simulator for the engine: N endpoints on a virtual
//! clock, links with seeded loss, duplication, reordering (extra delay), jitter,
//! corruption and a bandwidth limit. Every run replays exactly from its seed.
#![forbid(unsafe_code)]

use crate::engine::{Engine, EngineConfig, Event, PeerId};
use crate::rng::Rng;
use crate::time::Instant;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Link behaviour, applied to every datagram.
#[derive(Clone, Copy, Debug)]
pub struct Link {
    pub loss_pct: f64,
    pub dup_pct: f64,
    pub reorder_pct: f64,
    pub corrupt_pct: f64,
    pub delay: Duration,
    pub jitter: Duration,
    /// Bytes per second; 0 = unlimited.
    pub bandwidth: u64,
}

impl Default for Link {
    fn default() -> Self {
        Link {
            loss_pct: 0.0,
            dup_pct: 0.0,
            reorder_pct: 0.0,
            corrupt_pct: 0.0,
            delay: Duration::from_micros(20),
            jitter: Duration::ZERO,
            bandwidth: 0,
        }
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct InFlight {
    pub(crate) at: Instant,
    seq: u64,
    pub(crate) to: u32,
    pub(crate) from: u32,
    pub(crate) data: Vec<u8>,
}

/// The wire between N endpoints: datagrams in flight in arrival order, and the
/// link's effects (loss, corruption, duplication, jitter, reordering, a
/// bandwidth limit per destination) drawn from one seeded generator. Shared by
/// the engine-level simulator ([`Sim`]) and the device-level one
/// ([`crate::simnet`]).
pub(crate) struct Wire {
    pub(crate) link: Link,
    rng: Rng,
    queue: BinaryHeap<Reverse<InFlight>>,
    seq: u64,
    /// When each destination's link is next free (bandwidth model).
    busy_until: Vec<Instant>,
}

impl Wire {
    pub(crate) fn new(n: usize, link: Link, seed: u64) -> Wire {
        Wire { link, rng: Rng::new(seed), queue: BinaryHeap::new(), seq: 0, busy_until: vec![Instant::ZERO; n] }
    }

    /// Puts a datagram on the wire at `now`, through the link's effects.
    pub(crate) fn put(&mut self, now: Instant, from: u32, to: u32, mut data: Vec<u8>) {
        let l = self.link;
        if self.rng.chance(l.loss_pct) {
            return;
        }
        if self.rng.chance(l.corrupt_pct) && !data.is_empty() {
            let at = (self.rng.next_u64() as usize) % data.len();
            data[at] ^= 1 << (self.rng.next_u64() % 8);
        }
        let copies = if self.rng.chance(l.dup_pct) { 2 } else { 1 };
        for _ in 0..copies {
            let mut at = now + l.delay;
            if !l.jitter.is_zero() {
                at = at + Duration::from_nanos(self.rng.next_u64() % l.jitter.as_nanos().max(1) as u64);
            }
            if self.rng.chance(l.reorder_pct) {
                at = at + l.delay * 3;
            }
            if let Some(nanos) = (data.len() as u64 * 1_000_000_000).checked_div(l.bandwidth) {
                let tx = Duration::from_nanos(nanos);
                let start = self.busy_until[to as usize].max(now);
                self.busy_until[to as usize] = start + tx;
                at = at.max(start + tx);
            }
            self.push(at, from, to, data.clone());
        }
    }

    /// Puts a datagram on the wire as it is, arriving at `at`.
    pub(crate) fn push(&mut self, at: Instant, from: u32, to: u32, data: Vec<u8>) {
        self.seq += 1;
        self.queue.push(Reverse(InFlight { at, seq: self.seq, to, from, data }));
    }

    /// When the next datagram arrives.
    pub(crate) fn next_arrival(&self) -> Option<Instant> {
        self.queue.peek().map(|Reverse(p)| p.at)
    }

    /// The next datagram that has arrived by `now`.
    pub(crate) fn pop_arrived(&mut self, now: Instant) -> Option<InFlight> {
        if self.queue.peek().is_some_and(|Reverse(p)| p.at <= now) {
            self.queue.pop().map(|Reverse(p)| p)
        } else {
            None
        }
    }
}

/// What the simulator drives on each node: an rdm [`Engine`], or a layer that
/// owns one (the message engine of `rndv` in its tests).
pub trait SimEndpoint {
    fn rdm(&mut self) -> &mut Engine;
    fn rdm_ref(&self) -> &Engine;
    /// The next time the node needs a step without input (its rdm engine's
    /// timers and any of its own).
    fn poll_timeout(&self) -> Option<Instant> {
        self.rdm_ref().poll_timeout()
    }
    /// Runs after the node handled its datagrams and timers of a step; `events`
    /// collects what the node wants the test to see.
    fn process(&mut self, now: Instant, events: &mut Vec<Event>);
}

impl SimEndpoint for Engine {
    fn rdm(&mut self) -> &mut Engine {
        self
    }

    fn rdm_ref(&self) -> &Engine {
        self
    }

    fn process(&mut self, _now: Instant, events: &mut Vec<Event>) {
        while let Some(e) = self.poll_event() {
            events.push(e);
        }
    }
}

/// The simulated network.
pub struct Sim<E: SimEndpoint = Engine> {
    pub now: Instant,
    pub nodes: Vec<Node<E>>,
    wire: Wire,
    pub datagrams: u64,
}

pub struct Node<E: SimEndpoint = Engine> {
    pub engine: E,
    pub alive: bool,
    /// Events the node produced, in order.
    pub events: Vec<Event>,
    /// Receiver pacing: when set, the node handles at most this many datagrams
    /// per millisecond (a slow receiver); the rest wait in its queue.
    pub rx_per_ms: Option<u32>,
    /// Datagrams waiting beyond this many are dropped (a full socket buffer).
    pub backlog_cap: usize,
    pub backlog_drops: u64,
    rx_budget: u32,
    rx_window_start: Instant,
    backlog: std::collections::VecDeque<(u32, Vec<u8>)>,
}

impl Sim<Engine> {
    pub fn new(n: usize, base: EngineConfig, link: Link, seed: u64) -> Sim {
        let engines =
            (0..n).map(|i| Engine::new(EngineConfig { incarnation: 1000 + i as u64, ..base.clone() })).collect();
        Sim::with_endpoints(engines, link, seed)
    }

    pub fn peer(&mut self, from: usize, to: usize) -> PeerId {
        self.nodes[from].engine.peer(crate::simnet::addr(to as u32))
    }

    /// Replaces node `i` with a fresh engine (a restarted process, new incarnation).
    pub fn restart(&mut self, i: usize, incarnation: u64) {
        let cfg = EngineConfig { incarnation, ..self.nodes[i].engine.config().clone() };
        self.nodes[i].engine = Engine::new(cfg);
        self.nodes[i].alive = true;
        self.nodes[i].events.clear();
    }
}

impl<E: SimEndpoint> Sim<E> {
    /// A network of the given endpoints; node `i` has address `crate::simnet::addr(i)`.
    pub fn with_endpoints(endpoints: Vec<E>, link: Link, seed: u64) -> Sim<E> {
        let n = endpoints.len();
        let nodes = endpoints
            .into_iter()
            .map(|engine| Node {
                engine,
                alive: true,
                events: Vec::new(),
                rx_per_ms: None,
                backlog_cap: usize::MAX,
                backlog_drops: 0,
                rx_budget: 0,
                rx_window_start: Instant::ZERO,
                backlog: Default::default(),
            })
            .collect();
        Sim { now: Instant::ZERO, nodes, wire: Wire::new(n, link, seed), datagrams: 0 }
    }

    /// Injects a raw datagram (e.g. a stale packet of an earlier incarnation).
    pub fn inject(&mut self, from: u32, to: u32, data: Vec<u8>) {
        self.wire.push(self.now, from, to, data);
    }

    fn transmit_all(&mut self) {
        let mut buf = vec![0u8; 70000];
        for i in 0..self.nodes.len() {
            if !self.nodes[i].alive {
                continue;
            }
            while let Some(t) = self.nodes[i].engine.rdm().poll_transmit(self.now, &mut buf) {
                let Some(to) = crate::simnet::node_of(&t.dst) else { continue };
                self.datagrams += 1;
                let data = buf[..t.len].to_vec();
                self.wire.put(self.now, i as u32, to, data);
            }
        }
    }

    fn drain_events(&mut self) {
        let now = self.now;
        for n in &mut self.nodes {
            if n.alive {
                n.engine.process(now, &mut n.events);
            }
        }
    }

    /// Advances the virtual clock to the next event and processes it. Returns
    /// false when nothing is scheduled any more.
    pub fn step(&mut self) -> bool {
        self.transmit_all();
        let next_packet = self.wire.next_arrival();
        let next_timer = self.nodes.iter().filter(|n| n.alive).filter_map(|n| n.engine.poll_timeout()).min();
        let next_backlog =
            self.nodes.iter().any(|n| !n.backlog.is_empty()).then(|| self.now + Duration::from_micros(100));
        let Some(t) = [next_packet, next_timer, next_backlog].into_iter().flatten().min() else {
            return false;
        };
        self.now = self.now.max(t);
        while let Some(p) = self.wire.pop_arrived(self.now) {
            let node = &mut self.nodes[p.to as usize];
            if node.alive {
                if node.backlog.len() >= node.backlog_cap {
                    node.backlog_drops += 1;
                } else {
                    node.backlog.push_back((p.from, p.data));
                }
            }
        }
        let now = self.now;
        for n in &mut self.nodes {
            if !n.alive {
                n.backlog.clear();
                continue;
            }
            if let Some(limit) = n.rx_per_ms {
                if now.saturating_duration_since(n.rx_window_start) >= Duration::from_millis(1) {
                    n.rx_window_start = now;
                    n.rx_budget = limit;
                }
            }
            while let Some((from, data)) = n.backlog.front() {
                if n.rx_per_ms.is_some() {
                    if n.rx_budget == 0 {
                        break;
                    }
                    n.rx_budget -= 1;
                }
                n.engine.rdm().handle_datagram(now, crate::simnet::addr(*from), data);
                n.backlog.pop_front();
            }
            if n.engine.rdm_ref().poll_timeout().is_some_and(|d| d <= now) {
                n.engine.rdm().handle_timeout(now);
            }
        }
        self.drain_events();
        true
    }

    /// Steps until `done` holds or the virtual deadline passes; returns whether
    /// `done` held.
    pub fn run_until(&mut self, deadline: Duration, mut done: impl FnMut(&Sim<E>) -> bool) -> bool {
        let end = self.now + deadline;
        while self.now < end {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }
}
