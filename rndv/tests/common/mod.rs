//! What the endpoint scenarios share: a model of one process's memory, seeds,
//! payload patterns and the network builder.
#![allow(dead_code)]

use rdm::device::LocalBuf;
use rdm::sim::Link;
use rdm::simnet::SimNet;
use rdm::DeviceCaps;
use rndv::engine::{Access, IoBuf, Memory, OpKind, OpMeta};
use rndv::sim::{EndpointSim, SimMemory};
use rndv::wire::rma::Status;
use rndv::{Completion, EndpointConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Application memory of one simulated process: addresses from `BASE`.
pub const BASE: u64 = 0x10_0000;
pub const MEM: usize = 8 << 20;

/// What a test checks about the accesses to one process's memory.
pub trait Keys: Send {
    /// A peer reads `[addr, addr+len)` of this memory through `key`.
    fn allows_read(&mut self, key: Option<u64>, addr: u64, len: u64) -> bool;
    /// A read of ours landed at `[addr, addr+len)` of this memory.
    fn stored(&mut self, addr: u64, len: u64) {
        let _ = (addr, len);
    }
}

pub struct Mem {
    pub bytes: Vec<u8>,
    /// RMA registrations: key -> (addr, len).
    pub regs: HashMap<u64, (u64, u64)>,
    /// A device may read into this memory (a rendezvous is pulled); false: the
    /// sender pushes instead.
    pub pullable: bool,
    /// Peers read this memory only through what this allows (its paths need
    /// registration); `None`: as shm does, without keys.
    pub keys: Option<Arc<Mutex<dyn Keys>>>,
    /// Told of every read that lands here.
    pub local: Option<Arc<Mutex<dyn Keys>>>,
    /// Reads of this memory by peers, and those refused.
    pub reads_served: u64,
}

impl Mem {
    pub fn new() -> Mem {
        Mem::sized(MEM)
    }

    pub fn sized(len: usize) -> Mem {
        Mem { bytes: vec![0; len], regs: HashMap::new(), pullable: true, keys: None, local: None, reads_served: 0 }
    }

    pub fn at(&self, addr: u64, len: usize) -> &[u8] {
        let o = (addr - BASE) as usize;
        &self.bytes[o..o + len]
    }

    pub fn put(&mut self, addr: u64, data: &[u8]) {
        let o = (addr - BASE) as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
    }
}

impl Default for Mem {
    fn default() -> Mem {
        Mem::new()
    }
}

impl Memory for Mem {
    fn write(&mut self, addr: u64, data: &[u8]) {
        self.put(addr, data);
    }
    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.at(addr, len));
    }
    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        self.at(addr, len)
    }
    fn rma_target(&mut self, key: u64, addr: u64, len: u64, _access: Access, _job: u64) -> Result<Vec<IoBuf>, Status> {
        let &(a, l) = self.regs.get(&key).ok_or(Status::NoKey)?;
        if addr < a || addr.checked_add(len).is_none_or(|e| e > a + l) {
            return Err(Status::Access);
        }
        Ok(vec![IoBuf { addr, len }])
    }
    fn read_target(&mut self, addr: u64, len: u64) -> Option<LocalBuf> {
        if !self.pullable {
            return None;
        }
        assert!(
            addr >= BASE && addr + len <= BASE + self.bytes.len() as u64,
            "a read into {addr:#x}+{len} outside the model memory"
        );
        // SAFETY: the simulated device never dereferences the address: the
        // harness copies into this model memory by address (`store`).
        Some(unsafe { LocalBuf::new(addr, len) })
    }
}

impl SimMemory for Mem {
    fn load(&self, addr: u64, len: usize) -> Vec<u8> {
        self.at(addr, len).to_vec()
    }
    fn store(&mut self, addr: u64, data: &[u8]) {
        if let Some(l) = &self.local {
            l.lock().unwrap().stored(addr, data.len() as u64);
        }
        self.put(addr, data);
    }
    fn allows_read(&mut self, key: Option<u64>, addr: u64, len: u64) -> bool {
        self.reads_served += 1;
        match &self.keys {
            Some(k) => k.lock().unwrap().allows_read(key, addr, len),
            None => true,
        }
    }
}

pub fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("RDMX_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => default.to_vec(),
    }
}

/// An unreliable, unordered path of 1400 bytes, with or without remote read.
pub fn path(remote_read: bool) -> DeviceCaps {
    DeviceCaps { remote_read, ..DeviceCaps::datagram(1400) }
}

/// The endpoints' configuration of these scenarios: a peer timeout of 3 s
/// (so keepalives every 500 ms).
pub fn config() -> EndpointConfig {
    EndpointConfig { peer_timeout: Duration::from_secs(3), ..EndpointConfig::default() }
}

/// `n` endpoints over a network whose every path is `caps`.
pub fn net_with(n: usize, caps: DeviceCaps, link: Link, seed: u64, cfg: EndpointConfig) -> EndpointSim<Mem> {
    let net = SimNet::new(n, caps, link, seed);
    EndpointSim::new(net, cfg, (0..n).map(|_| Mem::new()).collect())
}

/// `n` endpoints over paths that can read remotely.
pub fn net(n: usize, link: Link, seed: u64, cfg: EndpointConfig) -> EndpointSim<Mem> {
    net_with(n, path(true), link, seed, cfg)
}

pub fn lossy() -> Link {
    Link {
        loss_pct: 5.0,
        dup_pct: 2.0,
        reorder_pct: 20.0,
        corrupt_pct: 0.5,
        jitter: Duration::from_micros(30),
        ..Link::default()
    }
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7919) as u8).collect()
}

pub fn meta(context: u64) -> OpMeta {
    OpMeta { context, wanted: true, ..OpMeta::default() }
}

pub fn completions(sim: &EndpointSim<Mem>, node: usize, kind: OpKind) -> Vec<Completion> {
    sim.completions(node, kind)
}
