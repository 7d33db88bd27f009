//! Whole endpoints on the simulated network (the `sim` feature: tests,
//! benches and fuzz targets only).
//!
//! [`EndpointSim`] runs N [`Endpoint`]s, each over its node's
//! [`SimDevice`](rdm::simnet::SimDevice) and the network's virtual clock, with
//! a model of each process's memory. It drives them as the provider does:
//! operations through the endpoint's own calls, then rounds of
//! [`Endpoint::progress`]; between rounds it serves the remote reads the
//! devices posted, from the peer's model memory, so that they complete later,
//! as RDMA reads do. Nothing of the endpoint's progress order is
//! re-implemented here.
use crate::endpoint::{Clock, Endpoint, EndpointConfig, EndpointEvent};
use crate::engine::{Completion, Memory, OpKind};
use rdm::device::{DeviceError, ReadDone};
use rdm::engine::PeerId;
use rdm::simnet::{self, SimDevice, SimNet};
use rdm::Instant;
use std::time::Duration;

/// A process's memory in the simulator: what the endpoint sees through
/// [`Memory`], plus what a peer's remote read needs.
pub trait SimMemory: Memory {
    /// `len` bytes at `addr` (a peer reads them).
    fn load(&self, addr: u64, len: usize) -> Vec<u8>;
    /// Writes `data` at `addr` (a read of ours lands).
    fn store(&mut self, addr: u64, data: &[u8]);
    /// Whether a peer may read `[addr, addr+len)` through `key` (a
    /// registering path reads only through live registrations).
    fn allows_read(&mut self, key: Option<u64>, addr: u64, len: u64) -> bool {
        let _ = (key, addr, len);
        true
    }
}

/// Rounds [`EndpointSim::run_until`] allows at one instant of virtual time.
const STILL_ROUNDS_MAX: u32 = 10_000;

/// The network's virtual time.
pub struct SimClock(SimNet);

impl Clock for SimClock {
    fn now(&self) -> Instant {
        self.0.now()
    }
}

pub type SimEndpoint<M> = Endpoint<SimDevice, M, SimClock>;

/// One simulated process.
pub struct SimNode<M: SimMemory> {
    pub ep: SimEndpoint<M>,
    /// Completions, in the order the endpoint reported them.
    pub done: Vec<Completion>,
    pub events: Vec<EndpointEvent>,
    /// Closing (see [`Endpoint::close`]): stepped with `poll_close`.
    pub closing: bool,
}

/// N endpoints on one simulated network.
pub struct EndpointSim<M: SimMemory> {
    pub net: SimNet,
    pub nodes: Vec<SimNode<M>>,
    cfg: EndpointConfig,
}

impl<M: SimMemory> EndpointSim<M> {
    /// Endpoints over `net`, one per memory; node `i` has incarnation `1000 + i`.
    pub fn new(net: SimNet, cfg: EndpointConfig, mems: Vec<M>) -> EndpointSim<M> {
        assert_eq!(net.nodes(), mems.len(), "one memory per node");
        let nodes = mems
            .into_iter()
            .enumerate()
            .map(|(i, mem)| SimNode {
                ep: Self::endpoint(&net, i as u32, 1000 + i as u64, cfg.clone(), mem),
                done: Vec::new(),
                events: Vec::new(),
                closing: false,
            })
            .collect();
        EndpointSim { net, nodes, cfg }
    }

    fn endpoint(net: &SimNet, i: u32, incarnation: u64, cfg: EndpointConfig, mem: M) -> SimEndpoint<M> {
        Endpoint::new(Box::new(net.device(i)), EndpointConfig { incarnation, ..cfg }, mem, SimClock(net.clone()))
    }

    pub fn now(&self) -> Instant {
        self.net.now()
    }

    /// Node `from`'s peer id for node `to`.
    pub fn peer(&mut self, from: usize, to: usize) -> PeerId {
        self.nodes[from].ep.peer(simnet::addr(to as u32))
    }

    /// Node `i`'s process dies.
    pub fn kill(&mut self, i: usize) {
        self.net.kill(i as u32);
    }

    /// Node `i` starts again as a new process (new incarnation, new memory)
    /// at the same address.
    pub fn restart(&mut self, i: usize, incarnation: u64, mem: M) {
        self.nodes[i] = SimNode {
            ep: Self::endpoint(&self.net, i as u32, incarnation, self.cfg.clone(), mem),
            done: Vec::new(),
            events: Vec::new(),
            closing: false,
        };
        self.net.revive(i as u32);
    }

    /// Node `i` starts closing.
    pub fn close(&mut self, i: usize) {
        self.nodes[i].ep.close();
        self.nodes[i].closing = true;
        self.drain(i);
    }

    /// Pulls node `i`'s completions and events.
    pub fn drain(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        while let Some(c) = n.ep.poll_completion() {
            n.done.push(c);
        }
        while let Some(e) = n.ep.poll_event() {
            n.events.push(e);
        }
    }

    /// Node `i`'s completions of one kind.
    pub fn completions(&self, i: usize, kind: OpKind) -> Vec<Completion> {
        self.nodes[i].done.iter().filter(|c| c.kind == kind).copied().collect()
    }

    /// One round: every live endpoint progresses, posted reads are served,
    /// and the clock moves to the next thing to happen. False when nothing is
    /// scheduled any more.
    pub fn step(&mut self) -> bool {
        for i in 0..self.nodes.len() {
            if !self.net.alive(i as u32) {
                continue;
            }
            if self.nodes[i].closing {
                // A closed endpoint's queue is gone: what is sent to it from
                // now on is refused, as a closed port or unlinked ring is.
                if self.nodes[i].ep.poll_close() {
                    self.net.kill(i as u32);
                }
            } else {
                self.nodes[i].ep.progress();
            }
            self.drain(i);
        }
        let served = self.serve_reads();
        let now = self.net.now();
        let timers = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| self.net.alive(*i as u32) && !(n.closing && n.ep.is_closed()))
            .filter_map(|(_, n)| n.ep.poll_timeout())
            .min();
        let Some(next) = [self.net.next_event(), timers, served.then_some(now)].into_iter().flatten().min() else {
            return false;
        };
        self.net.advance(next);
        true
    }

    /// Serves the reads the devices posted: copies from the peer's model
    /// memory (through its keys, where it checks them) into the reader's.
    fn serve_reads(&mut self) -> bool {
        let reads = self.net.take_reads();
        let any = !reads.is_empty();
        for r in reads {
            let (node, peer) = (r.node as usize, r.peer as usize);
            let mut bytes = 0u64;
            let mut error = None;
            if !self.net.alive(r.peer) {
                error = Some(DeviceError::Unreachable(simnet::addr(r.peer)));
            } else {
                for run in &r.runs {
                    let len = run.local.len();
                    if !self.nodes[peer].ep.mem_mut().allows_read(run.remote_key, run.remote_addr, len) {
                        error = Some(DeviceError::Config(format!(
                            "remote access error: key {:?} does not cover {:#x}+{len}",
                            run.remote_key, run.remote_addr
                        )));
                        break;
                    }
                    let data = self.nodes[peer].ep.mem().load(run.remote_addr, len as usize);
                    self.nodes[node].ep.mem_mut().store(run.local.addr(), &data);
                    bytes += len;
                }
            }
            self.net.complete_read(r.node, ReadDone { id: r.id, bytes, error });
        }
        any
    }

    /// Steps until `done` holds or `limit` of virtual time passed; whether
    /// `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Self) -> bool) -> bool {
        let end = self.now() + limit;
        // Rounds at one instant: a few are normal (a read served, an answer to
        // it); this many means some endpoint asks to be woken at a time already
        // past and nothing it does moves the clock, which a real progress
        // thread would spin on. Fail loudly rather than hang.
        let (mut stood, mut at) = (0u32, self.now());
        while self.now() < end {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
            if self.now() == at {
                stood += 1;
                assert!(
                    stood < STILL_ROUNDS_MAX,
                    "virtual time stands still at {at:?}: {stood} rounds without a clock move"
                );
            } else {
                (stood, at) = (0, self.now());
            }
        }
        done(self)
    }
}
