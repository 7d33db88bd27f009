//! Two whole endpoints ([`rndv::Endpoint`], the object the provider calls) on
//! the simulated network, driven by an arbitrary sequence of operations:
//! sends of any size (eager, rendezvous pulled or pushed), receives posted
//! before or after, cancels, peeks, closes, time passing, loss, the peer's
//! death, and raw datagrams of any content thrown at either endpoint, from
//! the peer's address or a stranger's. Checked:
//!
//! * nothing panics;
//! * the endpoints write only into posted receive areas (reads included);
//! * each operation completes at most once, with a context that was posted,
//!   and a receive reports at most the bytes of its buffer;
//! * a receive that completes without error from the real peer, while no raw
//!   datagram was injected, holds exactly the bytes that were sent.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdm::device::LocalBuf;
use rdm::sim::Link;
use rdm::simnet::{self, SimNet};
use rdm::DeviceCaps;
use rndv::engine::{Access, IoBuf, IoList, Memory, OpKind, OpMeta, OutMsg, RecvSpec};
use rndv::sim::{EndpointSim, SimMemory};
use rndv::wire::rma::Status;
use rndv::{EndpointConfig, MsgHeader, MsgKind, Src};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const BASE: u64 = 0x10_0000;
/// Receive area (2 MiB), then the send area: each receive and each send has
/// its own piece (an application may not hand out a buffer twice while an
/// operation on it is pending).
const AREA: u64 = 2 << 20;
const RECV_MAX: u64 = 32 << 10;
const RECV: u64 = BASE;
const SEND: u64 = BASE + AREA;
const SEND_AREA: u64 = 4 << 20;
const SEND_MAX: u64 = 64 << 10;

struct Mem {
    bytes: Vec<u8>,
}

impl Mem {
    fn range(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let o = addr.checked_sub(BASE).expect("address below application memory") as usize;
        assert!(o + len <= self.bytes.len(), "access past application memory: {addr:#x}+{len}");
        o..o + len
    }
}

impl Memory for Mem {
    fn write(&mut self, addr: u64, data: &[u8]) {
        assert!(
            addr >= RECV && addr + data.len() as u64 <= RECV + AREA,
            "write outside the receive area: {addr:#x}+{}",
            data.len()
        );
        let r = self.range(addr, data.len());
        self.bytes[r].copy_from_slice(data);
    }
    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        let r = self.range(addr, len);
        out.extend_from_slice(&self.bytes[r]);
    }
    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let r = self.range(addr, len);
        &self.bytes[r]
    }
    fn rma_target(
        &mut self,
        _key: u64,
        _addr: u64,
        _len: u64,
        _access: Access,
        _job: u64,
    ) -> Result<Vec<IoBuf>, Status> {
        Err(Status::NoKey)
    }
    fn read_target(&mut self, addr: u64, len: u64) -> Option<LocalBuf> {
        assert!(addr >= RECV && addr + len <= RECV + AREA, "read target outside the receive area: {addr:#x}+{len}");
        // SAFETY: the simulated device never dereferences it; the harness
        // stores into this model memory by address (checked in `store`).
        Some(unsafe { LocalBuf::new(addr, len) })
    }
}

impl SimMemory for Mem {
    fn load(&self, addr: u64, len: usize) -> Vec<u8> {
        let r = self.range(addr, len);
        self.bytes[r].to_vec()
    }
    fn store(&mut self, addr: u64, data: &[u8]) {
        self.write(addr, data);
    }
}

#[derive(Arbitrary, Debug)]
enum Step {
    /// Node `from & 1` sends `len` bytes (scaled) with `tag`.
    Send {
        from: u8,
        len: u16,
        scale: u8,
        tag: u8,
        tagged: bool,
    },
    /// Node `at & 1` posts a receive of `len` bytes (scaled) into a buffer of
    /// its own (`slot` is not used: kept so that the corpus stays valid).
    Recv {
        at: u8,
        len: u16,
        scale: u8,
        slot: u8,
        tag: u8,
        tagged: bool,
        any_tag: bool,
    },
    Cancel {
        at: u8,
        context: u8,
    },
    Peek {
        at: u8,
        tag: u8,
    },
    /// Virtual time passes.
    Run {
        ms: u8,
    },
    /// Raw bytes to node `to & 1`, from its peer's address or a stranger's.
    Raw {
        to: u8,
        from_peer: bool,
        bytes: Vec<u8>,
    },
    Loss {
        pct: u8,
    },
    Close {
        at: u8,
    },
    Kill {
        at: u8,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    /// The path can read remotely (shm-like pulls) or not (windows).
    remote_read: bool,
    reliable: bool,
    steps: Vec<Step>,
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed.wrapping_mul(7919)) as u8).collect()
}

fuzz_target!(|input: Input| {
    let caps = DeviceCaps {
        reliable: input.reliable,
        ordered: input.reliable,
        remote_read: input.remote_read,
        ..DeviceCaps::datagram(1400)
    };
    let net = SimNet::new(3, caps, Link::default(), 1);
    let cfg = EndpointConfig {
        peer_timeout: Duration::from_secs(2),
        rndv_threshold: 4096,
        window_threshold: 16 << 10,
        ..EndpointConfig::default()
    };
    let mems = (0..3).map(|_| Mem { bytes: vec![0; (AREA + SEND_AREA) as usize] }).collect();
    let mut send_used = [0u64; 2];
    let mut recv_used = [0u64; 2];
    let mut sim = EndpointSim::new(net, cfg, mems);
    let peers = [sim.peer(0, 1), sim.peer(1, 0)];
    let mut contexts: HashSet<u64> = HashSet::new();
    // Where each receive's buffer is, by context.
    let mut recv_at: HashMap<u64, u64> = HashMap::new();
    let mut next_context = 1u64;
    let mut raw_injected = false;
    let mut closed = [false; 2];
    for step in input.steps.iter().take(64) {
        match *step {
            Step::Send { from, len, scale, tag, tagged } => {
                let i = (from & 1) as usize;
                if closed[i] || !sim.net.alive(i as u32) {
                    continue;
                }
                let len = ((len as u64) << (scale % 3 * 4)).min(SEND_MAX) as usize;
                let at = SEND + send_used[i];
                if send_used[i] + len as u64 > SEND_AREA {
                    continue;
                }
                send_used[i] += len as u64;
                // The payload names its own length and tag, so a receive
                // can be checked without knowing which send it matched.
                let seed = (len as u64) << 8 | tag as u64;
                let data = pattern(len, seed);
                let o = (at - BASE) as usize;
                sim.nodes[i].ep.mem_mut().bytes[o..o + len].copy_from_slice(&data);
                let kind = if tagged { MsgKind::Tagged } else { MsgKind::Msg };
                let h = MsgHeader { kind, tag: tag as u64, data: Some(seed) };
                let context = next_context;
                next_context += 1;
                contexts.insert(context);
                let meta = OpMeta { context, wanted: true, ..OpMeta::default() };
                let _ = sim.nodes[i].ep.send(OutMsg {
                    peer: peers[i],
                    header: h,
                    payload: &[&data],
                    user: IoList::one(at, len as u64),
                    meta,
                });
            }
            Step::Recv { at, len, scale, slot, tag, tagged, any_tag } => {
                let i = (at & 1) as usize;
                if closed[i] || !sim.net.alive(i as u32) {
                    continue;
                }
                let room = ((len as u64) << (scale % 3 * 4)).min(RECV_MAX);
                if recv_used[i] + room > AREA {
                    continue;
                }
                let addr = RECV + recv_used[i];
                recv_used[i] += room;
                let _ = slot;
                let kind = if tagged { MsgKind::Tagged } else { MsgKind::Msg };
                let context = next_context;
                next_context += 1;
                contexts.insert(context);
                recv_at.insert(context, addr);
                let spec = RecvSpec {
                    kind,
                    src: Src::Any,
                    tag: tag as u64,
                    ignore: if any_tag { u64::MAX } else { 0 },
                    iov: IoList::one(addr, room),
                    multi: false,
                    meta: OpMeta { context, wanted: true, ..OpMeta::default() },
                };
                let _ = sim.nodes[i].ep.post_recv(spec);
            }
            Step::Cancel { at, context } => {
                let i = (at & 1) as usize;
                if !closed[i] && sim.net.alive(i as u32) {
                    sim.nodes[i].ep.cancel(context as u64);
                }
            }
            Step::Peek { at, tag } => {
                let i = (at & 1) as usize;
                if closed[i] || !sim.net.alive(i as u32) {
                    continue;
                }
                let context = next_context;
                next_context += 1;
                contexts.insert(context);
                let spec = RecvSpec {
                    kind: MsgKind::Tagged,
                    src: Src::Any,
                    tag: tag as u64,
                    ignore: 0,
                    iov: IoList::default(),
                    multi: false,
                    meta: OpMeta { context, wanted: true, ..OpMeta::default() },
                };
                sim.nodes[i].ep.peek(spec, false, false);
            }
            Step::Run { ms } => {
                sim.run_until(Duration::from_millis(ms as u64 % 50 + 1), |_| false);
            }
            Step::Raw { to, from_peer, ref bytes } => {
                raw_injected = true;
                let to = (to & 1) as u32;
                let from = if from_peer { 1 - to } else { 2 };
                sim.net.inject(from, to, bytes.clone());
            }
            // Only on a path that may lose: a device whose caps say reliable
            // (shm, SRD) never loses a datagram, and the engine relies on it
            // (no sequence numbers on DIRECT packets). Loss on such a path
            // is a broken device, not an input rdmx must survive.
            Step::Loss { pct } if !input.reliable => {
                sim.net.set_link(Link { loss_pct: (pct % 30) as f64, ..Link::default() })
            }
            Step::Loss { .. } => {}
            Step::Close { at } => {
                let i = (at & 1) as usize;
                if !closed[i] && sim.net.alive(i as u32) {
                    closed[i] = true;
                    sim.close(i);
                }
            }
            Step::Kill { at } => sim.kill((at & 1) as usize),
        }
        for i in 0..2 {
            sim.drain(i);
        }
    }
    sim.run_until(Duration::from_secs(5), |_| false);
    for i in 0..2 {
        let mut seen = HashSet::new();
        for c in &sim.nodes[i].done {
            assert!(contexts.contains(&c.meta.context), "completion with a context never posted: {c:?}");
            assert!(seen.insert(c.meta.context), "completed twice: {c:?}");
            if c.kind == OpKind::Recv {
                if let Some(&addr) = recv_at.get(&c.meta.context) {
                    assert!(addr + c.len as u64 <= RECV + AREA, "a receive reports more bytes than its area: {c:?}");
                }
            }
            let from_peer = c.src.is_some_and(|p| sim.nodes[i].ep.peer_addr(p) == simnet::addr(1 - i as u32));
            if c.kind == OpKind::Recv && c.err.is_none() && from_peer && !raw_injected {
                if let (Some(seed), Some(&addr)) = (c.data, recv_at.get(&c.meta.context)) {
                    let want = pattern((seed >> 8) as usize, seed);
                    let got = sim.nodes[i].ep.mem().load(addr, c.len);
                    assert!(got == want[..c.len.min(want.len())], "received bytes differ from the sent ones: {c:?}");
                }
            }
        }
    }
});
