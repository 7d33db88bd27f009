//! The message engine over rdm's deterministic network simulator: N endpoints,
//! each a [`MsgEngine`] with a model of application memory, on links that lose,
//! reorder, duplicate and corrupt datagrams. Every scenario verifies every byte
//! that lands and replays exactly from its seed (`RDMX_SIM_SEED` picks one seed).
use rdm::engine::{Engine, EngineConfig, Event, PeerId};
use rdm::sim::{Link, Sim, SimEndpoint};
use rdm::{DevAddr, DeviceCaps, Instant};
use rndv::atomic::{Datatype, Op};
use rndv::engine::{for_each_read_run, Access, Action, Completion, Config, IoBuf, IoList, Memory, MsgEngine, OpError, OpKind, OpMeta, ReadOutcome, RecvSpec};
use rndv::wire::rma::Status;
use rndv::{MsgHeader, MsgKind, Src};
use mr_cache::cache::{CacheConfig, EntryId, MrCache, Registrar};
use mr_cache::monitor::Monitor;
use rndv::engine::{RegHandle, Registration, RegistrationError, Registrations};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Application memory of one simulated process: addresses from `BASE`.
const BASE: u64 = 0x10_0000;
const MEM: usize = 8 << 20;

struct Mem {
    bytes: Vec<u8>,
    /// key -> (addr, len)
    regs: HashMap<u64, (u64, u64)>,
}

impl Mem {
    fn at(&self, addr: u64, len: usize) -> &[u8] {
        let o = (addr - BASE) as usize;
        &self.bytes[o..o + len]
    }
    fn put(&mut self, addr: u64, data: &[u8]) {
        let o = (addr - BASE) as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
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
    fn rma_target(&mut self, key: u64, addr: u64, len: u64, _access: Access) -> Result<Vec<IoBuf>, Status> {
        let &(a, l) = self.regs.get(&key).ok_or(Status::NoKey)?;
        if addr < a || addr.checked_add(len).is_none_or(|e| e > a + l) {
            return Err(Status::Access);
        }
        Ok(vec![IoBuf { addr, len }])
    }
}

struct Node {
    me: MsgEngine,
    mem: Mem,
    done: Vec<Completion>,
    /// Remote reads this process may do (false: every pull is refused, so the
    /// sender must push).
    may_read: bool,
    /// Peers whose memory this process cannot read at all (a UDP path).
    unreadable: Vec<u32>,
    /// This process's registrations, when its paths need them: every remote
    /// read of its memory must name a live key of them.
    regs: Option<Arc<Mutex<RegModel>>>,
    /// Keys of the application's own registrations (its `fi_mr_desc`s).
    app_keys: Vec<u64>,
    /// Peers read this process's memory only through live keys of `regs`
    /// (its paths need registration); otherwise as shm does, without keys.
    keyed: bool,
}

impl SimEndpoint for Node {
    fn rdm(&mut self) -> &mut Engine {
        self.me.rdm_mut()
    }
    fn rdm_ref(&self) -> &Engine {
        self.me.rdm()
    }
    fn poll_timeout(&self) -> Option<Instant> {
        [self.me.rdm().poll_timeout(), self.me.poll_timeout()].into_iter().flatten().min()
    }
    fn process(&mut self, now: Instant, _events: &mut Vec<Event>) {
        if self.me.poll_timeout().is_some_and(|t| t <= now) {
            self.me.handle_timeout(now);
        }
        self.me.handle_events(now, &mut self.mem);
        while let Some(c) = self.me.poll_completion() {
            self.done.push(c);
        }
    }
}

fn path(remote_read: bool) -> DeviceCaps {
    DeviceCaps { reliable: false, ordered: false, mtu: 1400, remote_read, gso: false, registration: false }
}

/// The device side of registrations, modelled: a registration is a live key
/// over a range until it is deregistered.
#[derive(Default)]
struct DevModel {
    next: u64,
    live: HashMap<u64, (u64, u64)>,
    registered: u64,
}

impl Registrar for DevModel {
    type Handle = u64;
    type Error = ();
    fn register(&mut self, addr: u64, len: u64, _access: u64) -> Result<u64, ()> {
        self.next += 1;
        self.registered += 1;
        self.live.insert(self.next, (addr, len));
        Ok(self.next)
    }
    fn deregister(&mut self, key: u64) {
        assert!(self.live.remove(&key).is_some(), "key {key} deregistered twice");
    }
}

/// One process's registrations as the message engine sees them: the real
/// registration cache over the device model, and what the engine holds.
struct RegModel {
    cache: MrCache<DevModel>,
    monitor: &'static Monitor,
    /// Acquired by the engine and not yet released.
    held: HashMap<u64, EntryId>,
    next: u64,
    acquires: u64,
    /// Remote reads of this process's memory checked against the keys, and
    /// those that named no live key (a released one, one deregistered after
    /// its range was invalidated, or none).
    reads_checked: u64,
    bad_reads: Vec<String>,
}

impl RegModel {
    fn new(cfg: CacheConfig) -> Arc<Mutex<RegModel>> {
        let monitor: &'static Monitor = Box::leak(Box::new(Monitor::manual()));
        Arc::new(Mutex::new(RegModel { cache: MrCache::new(DevModel::default(), cfg, monitor), monitor, held: HashMap::new(), next: 0, acquires: 0, reads_checked: 0, bad_reads: Vec::new() }))
    }

    /// Whether a remote read of `[addr, addr+len)` through `key` is allowed:
    /// the key is the device's live registration of a range that covers it,
    /// and the engine still holds it (or it is the application's own).
    fn check_read(&mut self, key: Option<u64>, addr: u64, len: u64, app_keys: &[u64]) -> bool {
        self.reads_checked += 1;
        let ok = key.is_some_and(|k| {
            let covered = self.cache.registrar().live.get(&k).is_some_and(|&(a, l)| a <= addr && addr + len <= a + l);
            let held = app_keys.contains(&k) || self.held.values().any(|id| self.cache.handle(*id) == Some(&k));
            covered && held
        });
        if !ok {
            self.bad_reads.push(format!("read of {addr:#x}+{len} with key {key:?}"));
        }
        ok
    }
}

struct SharedRegs(Arc<Mutex<RegModel>>);

impl Registrations for SharedRegs {
    fn acquire(&mut self, addr: u64, len: u64, access: Access) -> Result<Registration, RegistrationError> {
        assert_eq!(access, Access::RemoteRead);
        let mut m = self.0.lock().unwrap();
        let id = m.cache.acquire(addr, len, 1).map_err(|_| RegistrationError)?;
        let key = *m.cache.handle(id).expect("acquired");
        m.next += 1;
        let h = m.next;
        m.held.insert(h, id);
        m.acquires += 1;
        Ok(Registration { handle: RegHandle(h), key })
    }
    fn release(&mut self, handle: RegHandle) {
        let mut m = self.0.lock().unwrap();
        let id = m.held.remove(&handle.0).expect("released twice or never acquired");
        m.cache.release(id);
    }
}

/// A path whose remote reads need registration keys (as verbs UD, EFA SRD).
fn registering_path() -> DeviceCaps {
    DeviceCaps { registration: true, ..path(true) }
}

/// Gives node `i` a registration model and returns it.
fn with_registrations(sim: &mut Sim<Node>, i: usize) -> Arc<Mutex<RegModel>> {
    let m = RegModel::new(CacheConfig::default());
    sim.nodes[i].engine.regs = Some(m.clone());
    sim.nodes[i].engine.keyed = true;
    sim.nodes[i].engine.me.set_registrations(Box::new(SharedRegs(m.clone())));
    m
}

fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("RDMX_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        Some(s) => vec![s],
        None => default.to_vec(),
    }
}

fn net(n: usize, link: Link, seed: u64, cfg: Config) -> Sim<Node> {
    let base = EngineConfig { peer_timeout: Duration::from_secs(3), ..EngineConfig::default() };
    let nodes = (0..n)
        .map(|i| {
            let rdm = Engine::new(EngineConfig { incarnation: 1000 + i as u64, ..base.clone() });
            Node { me: MsgEngine::new(rdm, cfg), mem: Mem { bytes: vec![0; MEM], regs: HashMap::new() }, done: Vec::new(), may_read: true, unreadable: Vec::new(), regs: None, app_keys: Vec::new(), keyed: false }
        })
        .collect();
    Sim::with_endpoints(nodes, link, seed)
}

fn lossy() -> Link {
    Link { loss_pct: 5.0, dup_pct: 2.0, reorder_pct: 20.0, corrupt_pct: 0.5, jitter: Duration::from_micros(30), ..Link::default() }
}

fn peer(sim: &mut Sim<Node>, from: usize, to: usize, remote_read: bool) -> PeerId {
    sim.nodes[from].engine.me.peer(DevAddr::Sim(to as u32), path(remote_read))
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed * 7919) as u8).collect()
}

fn meta(context: u64) -> OpMeta {
    OpMeta { context, wanted: true, ..OpMeta::default() }
}

/// Serves the remote reads nodes asked for: reads the other node's memory (the
/// simulated `process_vm_readv`).
fn serve_actions(sim: &mut Sim<Node>) -> bool {
    let mut any = false;
    for i in 0..sim.nodes.len() {
        while let Some(Action::RemoteRead { id, addr, src, src_count, dst, .. }) = sim.nodes[i].engine.me.poll_action() {
            any = true;
            let DevAddr::Sim(j) = addr else { panic!("sim address expected") };
            let outcome = if !sim.nodes[i].engine.may_read || sim.nodes[i].engine.unreadable.contains(&j) {
                ReadOutcome::NotPermitted
            } else if !sim.nodes[j as usize].alive {
                ReadOutcome::Failed(0)
            } else {
                let mut runs = Vec::new();
                let regs = sim.nodes[j as usize].engine.regs.clone().filter(|_| sim.nodes[j as usize].engine.keyed);
                let app_keys = sim.nodes[j as usize].engine.app_keys.clone();
                let (n, ok) = for_each_read_run(&src[..src_count], &dst, |key, s, d, len| {
                    // A registering sender's memory is readable only through
                    // a live key of its registrations.
                    let allowed = regs.as_ref().is_none_or(|m| m.lock().unwrap().check_read(key, s, len, &app_keys));
                    if allowed {
                        runs.push((s, d, len));
                    }
                    allowed
                });
                for (s, d, len) in runs {
                    let data = sim.nodes[j as usize].engine.mem.at(s, len as usize).to_vec();
                    sim.nodes[i].engine.mem.put(d, &data);
                }
                if ok { ReadOutcome::Done(n) } else { ReadOutcome::Failed(n) }
            };
            let now = sim.now;
            let node = &mut sim.nodes[i].engine;
            node.me.remote_read_done(now, id, outcome);
            node.me.handle_events(now, &mut node.mem);
            while let Some(c) = node.me.poll_completion() {
                node.done.push(c);
            }
        }
    }
    any
}

/// Steps (serving remote reads) until `done` or the virtual deadline.
fn run(sim: &mut Sim<Node>, limit: Duration, done: impl Fn(&Sim<Node>) -> bool) -> bool {
    let end = sim.now + limit;
    while sim.now < end {
        if done(sim) {
            return true;
        }
        let stepped = sim.step();
        let served = serve_actions(sim);
        if !stepped && !served {
            return done(sim);
        }
    }
    done(sim)
}

fn completions(sim: &Sim<Node>, node: usize, kind: OpKind) -> Vec<Completion> {
    sim.nodes[node].engine.done.iter().filter(|c| c.kind == kind).copied().collect()
}

/// Tag matching with wildcards and unexpected messages, eager and rendezvous
/// sizes, between three endpoints over a lossy network: node 0 and node 2 send
/// to node 1, which posts half its receives before the messages arrive and half
/// after, directed and wildcard. Every byte is checked.
#[test]
fn tagged_wildcards_unexpected_eager_and_rendezvous_under_loss() {
    for seed in seeds(&[1, 2, 3]) {
        let cfg = Config { rndv_threshold: 16 << 10, ..Config::default() };
        let mut sim = net(3, lossy(), seed, cfg);
        // Node 2 is reached over a path without remote read (as UDP).
        sim.nodes[1].engine.unreadable.push(2);
        let sizes = [0usize, 1, 100, 1399, 5000, 16 << 10, 100_000, 300_000];
        let to1_from0 = peer(&mut sim, 0, 1, true);
        let to1_from2 = peer(&mut sim, 2, 1, false);
        let at1_0 = peer(&mut sim, 1, 0, true);
        // Receives posted first: directed at node 0, tags exactly 0..8 with
        // nothing ignored, buffers in node 1's memory at 1 MiB steps.
        let now = sim.now;
        let node1 = &mut sim.nodes[1].engine;
        for (i, &len) in sizes.iter().enumerate() {
            let iov = IoList::one(BASE + (i as u64) * (1 << 20) / 4, len.max(1) as u64);
            let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Peer(at1_0), tag: i as u64, ignore: 0, iov, multi: false, meta: meta(100 + i as u64) };
            node1.me.post_recv(now, spec, &mut node1.mem);
        }
        // Node 0 sends tags 0..8 (matched by the directed receives), node 2 sends
        // tags 0x100.. that only wildcard receives posted later will take.
        for (src, to, tagbase) in [(0usize, to1_from0, 0u64), (2, to1_from2, 0x100)] {
            for (i, &len) in sizes.iter().enumerate() {
                let data = pattern(len, tagbase + i as u64);
                let addr = BASE + (i as u64) * (1 << 20) / 2;
                let node = &mut sim.nodes[src].engine;
                node.mem.put(addr, &data);
                let user = IoList::one(addr, len as u64);
                let h = MsgHeader { kind: MsgKind::Tagged, tag: tagbase + i as u64, data: Some(tagbase + i as u64) };
                node.me.send(now, to, h, &[&data], user, meta(200 + i as u64)).expect("send");
            }
        }
        // Let everything arrive (node 2's messages become unexpected), then post
        // wildcard receives for them: source any, tag 0x100 with the low byte ignored.
        assert!(run(&mut sim, Duration::from_secs(60), |s| completions(s, 1, OpKind::Recv).len() == sizes.len()), "seed {seed}: directed receives");
        let now = sim.now;
        let node1 = &mut sim.nodes[1].engine;
        for i in 0..sizes.len() {
            let iov = IoList::one(BASE + (4 << 20) + (i as u64) * (400 << 10), 400 << 10);
            let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag: 0x100, ignore: 0xff, iov, multi: false, meta: meta(300 + i as u64) };
            node1.me.post_recv(now, spec, &mut node1.mem);
        }
        assert!(
            run(&mut sim, Duration::from_secs(120), |s| completions(s, 1, OpKind::Recv).len() == 2 * sizes.len()
                && completions(s, 0, OpKind::Send).len() == sizes.len()
                && completions(s, 2, OpKind::Send).len() == sizes.len()),
            "seed {seed}: not all completed: {:?}",
            completions(&sim, 1, OpKind::Recv).len()
        );
        let recvs = completions(&sim, 1, OpKind::Recv);
        for c in &recvs {
            assert_eq!(c.err, None, "seed {seed}: {c:?}");
            let tag = c.tag;
            let i = (tag & 0xff) as usize;
            assert_eq!(c.len, sizes[i]);
            assert_eq!(c.data, Some(tag));
            let addr = if c.meta.context < 300 { BASE + (i as u64) * (1 << 20) / 4 } else { BASE + (4 << 20) + (c.meta.context - 300) * (400 << 10) };
            assert!(sim.nodes[1].engine.mem.at(addr, c.len) == pattern(sizes[i], tag), "seed {seed}: bytes of tag {tag:#x}");
            let from = if tag < 0x100 { 0 } else { 2 };
            assert_eq!(c.src, sim.nodes[1].engine.me.rdm().peer_id_of(DevAddr::Sim(from)));
        }
        // Wildcards took node 2's messages in arrival order (per-sender order).
        let wild: Vec<u64> = recvs.iter().filter(|c| c.meta.context >= 300).map(|c| c.tag).collect();
        assert_eq!(wild, (0..sizes.len() as u64).map(|i| 0x100 + i).collect::<Vec<_>>(), "seed {seed}");
        for c in completions(&sim, 0, OpKind::Send).iter().chain(&completions(&sim, 2, OpKind::Send)) {
            assert_eq!(c.err, None, "seed {seed}: {c:?}");
        }
        // Node 0's long messages were pulled (its path can read); node 2's path
        // cannot, so its messages from the window threshold (256 KiB) up came by
        // window grants, the rest eagerly.
        let s0 = sim.nodes[0].engine.me.stats();
        let s2 = sim.nodes[2].engine.me.stats();
        assert_eq!(s0.rts_sent, 3, "seed {seed}");
        assert_eq!(sim.nodes[1].engine.me.stats().pulled, 3, "seed {seed}");
        assert_eq!(s2.rts_sent, 1, "seed {seed}");
        assert_eq!(sim.nodes[1].engine.me.stats().pushed, 1, "seed {seed}");
    }
}

/// A receiver that may not read the sender (different user, Yama): the
/// rendezvous falls back to window grants; later long messages to it go
/// eagerly. Truncation of a long message reports the lost length.
#[test]
fn rendezvous_push_fallback_and_truncation() {
    for seed in seeds(&[4, 5]) {
        let cfg = Config { rndv_threshold: 4096, ..Config::default() };
        let mut sim = net(2, lossy(), seed, cfg);
        sim.nodes[1].engine.may_read = false;
        let to1 = peer(&mut sim, 0, 1, true);
        let now = sim.now;
        let lens = [50_000usize, 70_000, 20_000];
        for (i, &len) in lens.iter().enumerate() {
            let addr = BASE + (i as u64) * (1 << 20);
            let data = pattern(len, i as u64);
            let n0 = &mut sim.nodes[0].engine;
            n0.mem.put(addr, &data);
            n0.me.send(now, to1, MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, &[&data], IoList::one(addr, len as u64), meta(i as u64)).unwrap();
            let n1 = &mut sim.nodes[1].engine;
            // The middle receive is 10 bytes short: truncated.
            let room = if i == 1 { len - 10 } else { len };
            let spec = RecvSpec { kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, iov: IoList::one(addr, room as u64), multi: false, meta: meta(10 + i as u64) };
            n1.me.post_recv(now, spec, &mut n1.mem);
        }
        assert!(run(&mut sim, Duration::from_secs(60), |s| completions(s, 1, OpKind::Recv).len() == 3 && completions(s, 0, OpKind::Send).len() == 3), "seed {seed}");
        for c in completions(&sim, 1, OpKind::Recv) {
            let i = (c.meta.context - 10) as usize;
            let want = if i == 1 { Some(OpError::Truncated { olen: 10 }) } else { None };
            assert_eq!(c.err, want, "seed {seed}");
            assert!(sim.nodes[1].engine.mem.at(BASE + (i as u64) * (1 << 20), c.len) == &pattern(lens[i], i as u64)[..c.len], "seed {seed}: message {i}");
        }
        // All three were announced before the first refusal came back; each came
        // by window grants.
        assert_eq!(sim.nodes[0].engine.me.stats().rts_sent, 3);
        assert_eq!(sim.nodes[1].engine.me.stats().pushed, 3);
        // After the refusal, later long messages to that peer go eagerly.
        let now = sim.now;
        let data = pattern(30_000, 9);
        let n0 = &mut sim.nodes[0].engine;
        n0.mem.put(BASE + (5 << 20), &data);
        n0.me.send(now, to1, MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, &[&data], IoList::one(BASE + (5 << 20), 30_000), meta(3)).unwrap();
        let n1 = &mut sim.nodes[1].engine;
        let spec = RecvSpec { kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, iov: IoList::one(BASE + (5 << 20), 30_000), multi: false, meta: meta(13) };
        n1.me.post_recv(now, spec, &mut n1.mem);
        assert!(run(&mut sim, Duration::from_secs(60), |s| completions(s, 1, OpKind::Recv).len() == 4), "seed {seed}");
        assert!(sim.nodes[1].engine.mem.at(BASE + (5 << 20), 30_000) == data);
        assert_eq!(sim.nodes[0].engine.me.stats().rts_sent, 3, "seed {seed}: no new announcement after the refusal");
    }
}

/// RMA write, read and atomics (sum, fetch, compare-swap) over a lossy link,
/// and a request outside the registration refused without touching memory.
#[test]
fn rma_and_atomics_under_loss() {
    for seed in seeds(&[6, 7]) {
        let mut sim = net(2, lossy(), seed, Config::default());
        let window = BASE + (2 << 20);
        sim.nodes[1].engine.mem.regs.insert(9, (window, 64 << 10));
        let to1 = peer(&mut sim, 0, 1, false);
        let now = sim.now;
        let data = pattern(40_000, 1);
        let n0 = &mut sim.nodes[0].engine;
        n0.me.rma_write(now, to1, 9, window + 100, &[&data], Some(77), meta(1)).unwrap();
        assert!(run(&mut sim, Duration::from_secs(30), |s| completions(s, 0, OpKind::Write).len() == 1), "seed {seed}");
        assert!(sim.nodes[1].engine.mem.at(window + 100, data.len()) == data);
        assert_eq!(completions(&sim, 1, OpKind::RemoteWrite)[0].data, Some(77));
        assert!(completions(&sim, 1, OpKind::RemoteWrite)[0].meta.wanted, "CQ data is reported");
        let now = sim.now;
        let n0 = &mut sim.nodes[0].engine;
        n0.me.rma_read(now, to1, 9, window + 100, IoList::one(BASE, 40_000), meta(2)).unwrap();
        sim.nodes[1].engine.mem.put(window + 8, &40u64.to_le_bytes());
        let two = 2u64.to_le_bytes();
        let n0 = &mut sim.nodes[0].engine;
        n0.me.atomic(now, to1, 9, window + 8, Datatype::U64, Op::Sum, 1, &[&two], &[], IoList::default(), false, meta(3)).unwrap();
        n0.me.atomic(now, to1, 9, window + 8, Datatype::U64, Op::Sum, 1, &[&two], &[], IoList::one(BASE + 50_000, 8), true, meta(4)).unwrap();
        let (cmp, swap) = (44u64.to_le_bytes(), 7u64.to_le_bytes());
        n0.me.atomic(now, to1, 9, window + 8, Datatype::U64, Op::Cswap, 1, &[&swap], &[&cmp], IoList::one(BASE + 50_008, 8), true, meta(5)).unwrap();
        n0.me.rma_write(now, to1, 9, window + (64 << 10) - 4, &[&data[..8]], None, meta(6)).unwrap();
        n0.me.rma_write(now, to1, 10, window, &[&data[..8]], None, meta(7)).unwrap();
        assert!(run(&mut sim, Duration::from_secs(30), |s| s.nodes[0].engine.done.len() == 7), "seed {seed}");
        let done: HashMap<u64, Completion> = sim.nodes[0].engine.done.iter().map(|c| (c.meta.context, *c)).collect();
        assert!(sim.nodes[0].engine.mem.at(BASE, 40_000) == data, "read back");
        assert_eq!(sim.nodes[0].engine.mem.at(BASE + 50_000, 8), 42u64.to_le_bytes(), "fetch returns the old value");
        assert_eq!(sim.nodes[0].engine.mem.at(BASE + 50_008, 8), 44u64.to_le_bytes());
        assert_eq!(sim.nodes[1].engine.mem.at(window + 8, 8), 7u64.to_le_bytes(), "compare-swap swapped");
        assert_eq!(done[&6].err, Some(OpError::Access));
        assert_eq!(done[&7].err, Some(OpError::NoKey));
        assert!(sim.nodes[1].engine.mem.at(window + (64 << 10) - 4, 4) == [0; 4], "a refused write left memory alone");
    }
}

/// Cancel of a posted receive; peek and claim of an unexpected message;
/// multi-receive filling one buffer with several messages.
#[test]
fn cancel_peek_claim_and_multi_receive() {
    let mut sim = net(2, lossy(), 8, Config { min_multi_recv: 64, ..Config::default() });
    let to1 = peer(&mut sim, 0, 1, false);
    let now = sim.now;
    let n1 = &mut sim.nodes[1].engine;
    let spec = |tag, context, addr, len| RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag, ignore: 0, iov: IoList::one(addr, len), multi: false, meta: meta(context) };
    n1.me.post_recv(now, spec(5, 1, BASE, 100), &mut n1.mem);
    assert!(n1.me.cancel(1));
    assert!(!n1.me.cancel(1), "a canceled receive is gone");
    let n0 = &mut sim.nodes[0].engine;
    n0.me.send(now, to1, MsgHeader { kind: MsgKind::Tagged, tag: 5, data: None }, &[b"claimed"], IoList::default(), meta(2)).unwrap();
    for k in 0..3u8 {
        n0.me.send(now, to1, MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, &[&[k; 100]], IoList::default(), meta(3)).unwrap();
    }
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 0, OpKind::Send).len() == 4));
    let now = sim.now;
    let n1 = &mut sim.nodes[1].engine;
    n1.me.peek(now, spec(5, 10, 0, 0), true, false);
    n1.me.claim(now, spec(5, 10, BASE + 1000, 100), false, &mut n1.mem).unwrap();
    // A multi-receive buffer of 250 bytes with min 64: two messages fit, the
    // third leaves less than 64 bytes, so it is truncated and releases.
    let multi = RecvSpec { kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, iov: IoList::one(BASE + 2000, 250), multi: true, meta: meta(20) };
    n1.me.post_recv(now, multi, &mut n1.mem);
    while let Some(c) = n1.me.poll_completion() {
        n1.done.push(c);
    }
    let recvs = completions(&sim, 1, OpKind::Recv);
    assert_eq!(recvs[0].err, Some(OpError::Canceled));
    assert_eq!((recvs[1].meta.context, recvs[1].len, recvs[1].err), (10, 7, None), "peek reports the claimed message");
    assert_eq!((recvs[2].meta.context, recvs[2].len), (10, 7));
    assert_eq!(sim.nodes[1].engine.mem.at(BASE + 1000, 7), b"claimed");
    let multi: Vec<(u64, usize, bool)> = recvs[3..].iter().map(|c| (c.buf, c.len, c.multi_done)).collect();
    assert_eq!(multi, [(BASE + 2000, 100, false), (BASE + 2100, 100, true)]);
}

/// A peer that dies mid-rendezvous: node 1 acknowledged the ready-to-send
/// (it sits unexpected there) and then dies. Nothing is in flight to it any
/// more, yet the sender's send fails with the peer within a bound of the peer
/// timeout (keepalives make the rdm engine notice), and so does an RMA read
/// started after the death.
#[test]
fn a_peer_that_dies_mid_rendezvous_fails_what_waits_on_it() {
    let cfg = Config { rndv_threshold: 4096, keepalive: Duration::from_millis(500), ..Config::default() };
    let mut sim = net(2, Link::default(), 9, cfg);
    sim.nodes[1].engine.mem.regs.insert(1, (BASE, 4096));
    let to1 = peer(&mut sim, 0, 1, true);
    let now = sim.now;
    let n0 = &mut sim.nodes[0].engine;
    let data = pattern(100_000, 3);
    n0.mem.put(BASE, &data);
    n0.me.send(now, to1, MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, &[&data], IoList::one(BASE, 100_000), meta(1)).unwrap();
    // Let the RTS be delivered and acknowledged, then kill node 1.
    assert!(run(&mut sim, Duration::from_secs(5), |s| s.nodes[1].engine.me.unexpected_bytes() > 0));
    run(&mut sim, Duration::from_millis(50), |_| false);
    sim.nodes[1].alive = false;
    let died = sim.now;
    assert!(run(&mut sim, Duration::from_secs(20), |s| s.nodes[0].engine.done.len() == 1), "the sender still waits: {:?}", sim.nodes[0].engine.done);
    let waited = sim.now.saturating_duration_since(died);
    assert!(waited <= Duration::from_secs(5), "failed after {waited:?}, peer timeout 3 s");
    let n0 = &mut sim.nodes[0].engine;
    n0.me.rma_read(sim.now, to1, 1, BASE, IoList::one(BASE + 200_000, 64), meta(2)).unwrap();
    assert!(run(&mut sim, Duration::from_secs(20), |s| s.nodes[0].engine.done.len() == 2));
    for c in &sim.nodes[0].engine.done {
        assert_eq!(c.err, Some(OpError::PeerUnreachable), "{c:?}");
    }
    assert_eq!(sim.nodes[0].engine.me.poll_failed_peer(), Some(to1));
}

/// A receiver that never sent to the sender (its peer entry was created by the
/// sender's first datagram) still pulls: whether it may read is the layer
/// below's to say, not a path recorded for sending.
/// A send whose buffer the application may reuse at return (`FI_INJECT` as a
/// flag of `fi_sendmsg`) is copied at post: never a rendezvous, even above the
/// threshold, so changing the buffer after the call never changes what
/// arrives (it went by rendezvous, read after return, before the fix).
#[test]
fn a_send_copied_at_post_never_goes_by_rendezvous() {
    let mut sim = net(2, Link::default(), 13, Config { rndv_threshold: 1024, window_threshold: 1024, ..Config::default() });
    let to1 = peer(&mut sim, 0, 1, true);
    let now = sim.now;
    let data = pattern(2048, 5);
    let n0 = &mut sim.nodes[0].engine;
    n0.mem.put(BASE, &data);
    let copied = OpMeta { copy_at_post: true, ..meta(1) };
    n0.me.send(now, to1, MsgHeader { kind: MsgKind::Tagged, tag: 1, data: None }, &[&data], IoList::one(BASE, 2048), copied).unwrap();
    // The application writes its buffer again as soon as the call returned.
    n0.mem.put(BASE, &pattern(2048, 6));
    let n1 = &mut sim.nodes[1].engine;
    let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag: 1, ignore: 0, iov: IoList::one(BASE + (1 << 20), 2048), multi: false, meta: meta(2) };
    n1.me.post_recv(now, spec, &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(10), |s| completions(s, 0, OpKind::Send).len() == 1 && completions(s, 1, OpKind::Recv).len() == 1));
    assert!(sim.nodes[1].engine.mem.at(BASE + (1 << 20), 2048) == data, "the bytes of the buffer at the call");
    let st = sim.nodes[0].engine.me.stats();
    assert_eq!((st.rts_sent, st.eager_sent), (0, 1));
}

#[test]
fn a_receiver_that_never_sent_pulls() {
    let mut sim = net(2, Link::default(), 12, Config { rndv_threshold: 4096, ..Config::default() });
    let to1 = peer(&mut sim, 0, 1, true);
    let now = sim.now;
    let data = pattern(50_000, 4);
    let n0 = &mut sim.nodes[0].engine;
    n0.mem.put(BASE, &data);
    n0.me.send(now, to1, MsgHeader { kind: MsgKind::Tagged, tag: 1, data: None }, &[&data], IoList::one(BASE, 50_000), meta(1)).unwrap();
    let n1 = &mut sim.nodes[1].engine;
    let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag: 1, ignore: 0, iov: IoList::one(BASE, 50_000), multi: false, meta: meta(2) };
    n1.me.post_recv(now, spec, &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(10), |s| completions(s, 0, OpKind::Send).len() == 1 && completions(s, 1, OpKind::Recv).len() == 1));
    assert!(sim.nodes[1].engine.mem.at(BASE, 50_000) == data);
    assert_eq!((sim.nodes[1].engine.me.stats().pulled, sim.nodes[1].engine.me.stats().pushed), (1, 0));
}

/// Long messages over a path that cannot read remotely (UDP): windowed
/// rendezvous under loss, reordering, duplication and corruption. The receiver
/// grants 64 KiB windows (so a 1 MiB message needs many, granted while earlier
/// ones arrive); the bytes land at their offsets in the posted buffer; a
/// message longer than its buffer is truncated with the lost length reported;
/// an unexpected announcement costs the receiver no payload memory.
#[test]
fn windowed_rendezvous_over_a_path_without_remote_read() {
    for seed in seeds(&[13, 14, 15]) {
        let cfg = Config { window_threshold: 32 << 10, window: 64 << 10, ..Config::default() };
        let mut sim = net(2, lossy(), seed, cfg);
        sim.nodes[1].engine.unreadable.push(0);
        let to1 = peer(&mut sim, 0, 1, false);
        let lens = [40_000usize, 1 << 20, 300_000];
        let now = sim.now;
        for (i, &len) in lens.iter().enumerate() {
            let addr = BASE + (i as u64) * (2 << 20);
            let data = pattern(len, 20 + i as u64);
            let n0 = &mut sim.nodes[0].engine;
            n0.mem.put(addr, &data);
            n0.me.send(now, to1, MsgHeader { kind: MsgKind::Tagged, tag: i as u64, data: None }, &[&data], IoList::one(addr, len as u64), meta(i as u64)).unwrap();
        }
        // Let the announcements arrive unexpected first.
        assert!(run(&mut sim, Duration::from_secs(10), |s| s.nodes[1].engine.me.unexpected_bytes() > 0 && s.now > Instant::from_nanos(50_000_000)));
        assert!(sim.nodes[1].engine.me.unexpected_bytes() < 1000, "only announcements are held: {}", sim.nodes[1].engine.me.unexpected_bytes());
        let now = sim.now;
        let n1 = &mut sim.nodes[1].engine;
        for (i, &len) in lens.iter().enumerate() {
            // The last buffer is 1000 bytes short: truncated.
            let room = if i == 2 { len - 1000 } else { len };
            let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag: i as u64, ignore: 0, iov: IoList::one(BASE + (i as u64) * (2 << 20), room as u64), multi: false, meta: meta(10 + i as u64) };
            n1.me.post_recv(now, spec, &mut n1.mem);
        }
        assert!(
            run(&mut sim, Duration::from_secs(120), |s| completions(s, 1, OpKind::Recv).len() == 3 && completions(s, 0, OpKind::Send).len() == 3),
            "seed {seed}: recv {} send {}",
            completions(&sim, 1, OpKind::Recv).len(),
            completions(&sim, 0, OpKind::Send).len()
        );
        for c in completions(&sim, 1, OpKind::Recv) {
            let i = (c.meta.context - 10) as usize;
            let want = if i == 2 { Some(OpError::Truncated { olen: 1000 }) } else { None };
            assert_eq!(c.err, want, "seed {seed}");
            assert!(sim.nodes[1].engine.mem.at(BASE + (i as u64) * (2 << 20), c.len) == &pattern(lens[i], 20 + i as u64)[..c.len], "seed {seed}: message {i}");
        }
        for c in completions(&sim, 0, OpKind::Send) {
            assert_eq!(c.err, None, "seed {seed}");
        }
        let s1 = sim.nodes[1].engine.me.stats();
        assert_eq!((s1.pushed, s1.pulled), (3, 0), "seed {seed}");
        assert!(s1.windows_granted > 16 + 5, "1 MiB in 64 KiB windows: {} grants", s1.windows_granted);
        assert_eq!(sim.nodes[0].engine.me.stats().rts_sent, 3, "no refusal: the path never claimed remote read");
    }
}

/// A sender that dies in the middle of a windowed transfer: the receiver's
/// receive fails with the peer (it sends keepalives while it waits).
#[test]
fn a_sender_that_dies_mid_window_fails_the_receive() {
    let cfg = Config { window_threshold: 32 << 10, window: 64 << 10, keepalive: Duration::from_millis(500), ..Config::default() };
    let mut sim = net(2, Link { bandwidth: 50_000_000, ..Link::default() }, 16, cfg);
    sim.nodes[1].engine.unreadable.push(0);
    let to1 = peer(&mut sim, 0, 1, false);
    let now = sim.now;
    let data = pattern(4 << 20, 1);
    let n0 = &mut sim.nodes[0].engine;
    n0.mem.put(BASE, &data);
    n0.me.send(now, to1, MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, &[&data], IoList::one(BASE, 4 << 20), meta(1)).unwrap();
    let n1 = &mut sim.nodes[1].engine;
    let spec = RecvSpec { kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, iov: IoList::one(BASE, 4 << 20), multi: false, meta: meta(2) };
    n1.me.post_recv(now, spec, &mut n1.mem);
    // Some windows in, then the sender dies.
    assert!(run(&mut sim, Duration::from_secs(10), |s| s.nodes[1].engine.me.stats().windows_granted >= 4));
    sim.nodes[0].alive = false;
    let died = sim.now;
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 1, OpKind::Recv).len() == 1), "the receive still waits");
    let c = completions(&sim, 1, OpKind::Recv)[0];
    assert_eq!(c.err, Some(OpError::PeerUnreachable));
    assert!(sim.now.saturating_duration_since(died) <= Duration::from_secs(5));
}

/// Datagram mode (`FI_EP_DGRAM`): over a clean link, a message that finds a
/// matching posted receive lands whole (tags and directed receives match as
/// usual); one that finds none is dropped and counted, never held for a later
/// receive; sends complete without any answer from the receiver, and a message
/// larger than one datagram is refused. Over a lossy link nothing is
/// retransmitted: some messages are lost, and every one that lands is intact.
#[test]
fn datagram_mode_matches_or_drops_and_never_retransmits() {
    let cfg = Config { datagram: true, ..Config::default() };
    let mut sim = net(2, Link::default(), 1, cfg);
    let to1 = peer(&mut sim, 0, 1, false);
    let at1 = peer(&mut sim, 1, 0, false);
    let max = 1400 - rdm::engine::HEADER_LEN - rndv::HEADER_LEN;
    let now = sim.now;
    let send = |sim: &mut Sim<Node>, tag: u64, len: usize, ctx: u64| {
        let node = &mut sim.nodes[0].engine;
        let data = pattern(len, tag);
        node.me.send(sim.now, to1, MsgHeader { kind: MsgKind::Tagged, tag, data: None }, &[&data], IoList::default(), meta(ctx))
    };
    assert_eq!(send(&mut sim, 1, max + 1, 1).err(), Some(rndv::PostError::TooLarge));
    // No receive posted: sent, completed, dropped at the receiver.
    send(&mut sim, 2, 100, 2).expect("send");
    assert!(run(&mut sim, Duration::from_secs(1), |s| completions(s, 0, OpKind::Send).len() == 1));
    run(&mut sim, Duration::from_millis(10), |_| false);
    assert_eq!(sim.nodes[1].engine.me.stats().dropped_unmatched, 1);
    assert_eq!(sim.nodes[1].engine.me.unexpected_bytes(), 0);
    // A receive posted now does not see it; a directed one takes the next.
    let node1 = &mut sim.nodes[1].engine;
    let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Peer(at1), tag: 3, ignore: 0, iov: IoList::one(BASE, max as u64), multi: false, meta: meta(10) };
    node1.me.post_recv(now, spec, &mut node1.mem);
    send(&mut sim, 3, max, 3).expect("send");
    assert!(run(&mut sim, Duration::from_secs(1), |s| completions(s, 1, OpKind::Recv).len() == 1));
    let c = completions(&sim, 1, OpKind::Recv)[0];
    assert_eq!((c.err, c.len, c.tag, c.meta.context), (None, max, 3, 10));
    assert!(sim.nodes[1].engine.mem.at(BASE, max) == pattern(max, 3));
    assert_eq!(sim.nodes[0].engine.me.rdm().stats().sent_data, 0, "nothing went over the reliable stream");
    assert_eq!(sim.nodes[1].engine.me.rdm().stats().sent_acks, 0, "nothing is acknowledged");

    // Lossy: 200 datagrams, receives for all of them posted; none is resent.
    let mut sim = net(2, lossy(), 7, cfg);
    let to1 = peer(&mut sim, 0, 1, false);
    let now = sim.now;
    let node1 = &mut sim.nodes[1].engine;
    for i in 0..200u64 {
        let spec = RecvSpec { kind: MsgKind::Tagged, src: Src::Any, tag: i, ignore: 0, iov: IoList::one(BASE + i * 2048, 2048), multi: false, meta: meta(i) };
        node1.me.post_recv(now, spec, &mut node1.mem);
    }
    for i in 0..200u64 {
        let data = pattern(1000, i);
        sim.nodes[0].engine.me.send(now, to1, MsgHeader { kind: MsgKind::Tagged, tag: i, data: None }, &[&data], IoList::default(), meta(i)).expect("send");
    }
    run(&mut sim, Duration::from_secs(1), |_| false);
    assert_eq!(completions(&sim, 0, OpKind::Send).len(), 200);
    let got = completions(&sim, 1, OpKind::Recv);
    assert!(got.len() < 200 && got.len() > 150, "{} of 200 arrived over a 5% lossy link", got.len());
    for c in &got {
        assert_eq!((c.err, c.len), (None, 1000));
        assert!(sim.nodes[1].engine.mem.at(BASE + c.tag * 2048, 1000) == pattern(1000, c.tag), "tag {}", c.tag);
    }
    assert_eq!(sim.nodes[0].engine.me.rdm().stats().retransmits, 0);
}

fn msg() -> MsgHeader {
    MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }
}

fn recv(addr: u64, len: u64, context: u64) -> RecvSpec {
    RecvSpec { kind: MsgKind::Msg, src: Src::Any, tag: 0, ignore: 0, iov: IoList::one(addr, len), multi: false, meta: meta(context) }
}

/// Two buffers of node 0's memory as one gather list.
fn two_bufs(a: u64, a_len: u64, b: u64, b_len: u64) -> IoList {
    let mut l = IoList::one(a, a_len);
    l.bufs[1] = IoBuf { addr: b, len: b_len };
    l.count = 2;
    l
}

/// Rendezvous on a path whose reads need registration keys, under loss:
/// the sender registers each iov buffer through the cache, the RTS carries
/// the keys, every remote read names a live key the sender still holds, and
/// each registration is released exactly once when its send completes (a
/// second send of the same buffers is a cache hit, not a new device
/// registration). A path without `registration` (node 2 to node 1) looks
/// nothing up.
#[test]
fn rendezvous_on_a_registering_path_reads_only_through_held_keys() {
    for seed in seeds(&[21, 22]) {
        let cfg = Config { rndv_threshold: 4096, ..Config::default() };
        let mut sim = net(3, lossy(), seed, cfg);
        let regs0 = with_registrations(&mut sim, 0);
        // Node 2 has registrations but reaches node 1 over a path that
        // needs none (as shm): its memory is read without keys.
        let regs2 = with_registrations(&mut sim, 2);
        sim.nodes[2].engine.keyed = false;
        let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
        let to1_from2 = peer(&mut sim, 2, 1, true);
        let (a, b) = (BASE, BASE + (2 << 20));
        let data = pattern(150_000, seed);
        sim.nodes[0].engine.mem.put(a, &data[..100_000]);
        sim.nodes[0].engine.mem.put(b, &data[100_000..]);
        sim.nodes[2].engine.mem.put(a, &data);
        for round in 0..2u64 {
            let now = sim.now;
            let n0 = &mut sim.nodes[0].engine;
            n0.me.send(now, to1, msg(), &[&data[..100_000], &data[100_000..]], two_bufs(a, 100_000, b, 50_000), meta(round)).unwrap();
            let n2 = &mut sim.nodes[2].engine;
            n2.me.send(now, to1_from2, msg(), &[&data], IoList::one(a, 150_000), meta(round)).unwrap();
            let n1 = &mut sim.nodes[1].engine;
            for k in 0..2u64 {
                let at = BASE + (4 + 2 * k) * (1 << 20);
                n1.me.post_recv(now, recv(at, 150_000, 10 + k), &mut n1.mem);
            }
            let want = 2 * (round as usize + 1);
            assert!(run(&mut sim, Duration::from_secs(60), |s| completions(s, 1, OpKind::Recv).len() == want && completions(s, 0, OpKind::Send).len() == round as usize + 1), "seed {seed}");
            for k in 0..2u64 {
                let got = sim.nodes[1].engine.mem.at(BASE + (4 + 2 * k) * (1 << 20), 150_000);
                assert!(got == data, "seed {seed} round {round}: first difference at {:?}; {:?}", got.iter().zip(&data).position(|(a, b)| a != b), completions(&sim, 1, OpKind::Recv));
            }
        }
        assert!(completions(&sim, 0, OpKind::Send).iter().all(|c| c.err.is_none()));
        let m = regs0.lock().unwrap();
        assert!(m.bad_reads.is_empty(), "seed {seed}: {:?}", m.bad_reads);
        assert!(m.reads_checked >= 4, "seed {seed}: every pull went through the keys");
        assert_eq!(m.acquires, 4, "one per iov buffer per send");
        assert!(m.held.is_empty(), "seed {seed}: registrations still held after the sends completed");
        let st = m.cache.stats();
        assert_eq!((st.misses, st.hits), (2, 2), "the second send reuses the cached registrations");
        assert_eq!(m.cache.registrar().live.len(), 2, "cached, not deregistered, after release");
        assert_eq!(sim.nodes[0].engine.me.stats().registrations_acquired, 4);
        let m2 = regs2.lock().unwrap();
        assert_eq!((m2.acquires, m2.cache.stats().misses), (0, 0), "seed {seed}: no lookup on a path without registration");
    }
}

/// The application's own registration (its descriptor's key, in the IoList)
/// is announced as is: no lookup for that buffer; the other buffer of the
/// same send, without one, is looked up.
#[test]
fn a_buffer_with_the_applications_key_is_not_looked_up() {
    let mut sim = net(2, Link::default(), 23, Config { rndv_threshold: 4096, ..Config::default() });
    let regs0 = with_registrations(&mut sim, 0);
    let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
    let (a, b) = (BASE, BASE + (2 << 20));
    // The application registered `a` itself (fi_mr_reg): a device key the
    // engine did not acquire.
    let app_key = {
        let mut m = regs0.lock().unwrap();
        let id = m.cache.acquire(a, 100_000, 1).unwrap();
        *m.cache.handle(id).unwrap()
    };
    sim.nodes[0].engine.app_keys.push(app_key);
    let data = pattern(130_000, 5);
    sim.nodes[0].engine.mem.put(a, &data[..100_000]);
    sim.nodes[0].engine.mem.put(b, &data[100_000..]);
    let now = sim.now;
    let mut iov = two_bufs(a, 100_000, b, 30_000);
    iov.keys[0] = Some(app_key);
    let n0 = &mut sim.nodes[0].engine;
    n0.me.send(now, to1, msg(), &[&data[..100_000], &data[100_000..]], iov, meta(1)).unwrap();
    // Only the buffer without a key: one lookup.
    assert_eq!(regs0.lock().unwrap().acquires, 1);
    let n1 = &mut sim.nodes[1].engine;
    n1.me.post_recv(now, recv(BASE + (4 << 20), 130_000, 10), &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 1, OpKind::Recv).len() == 1 && completions(s, 0, OpKind::Send).len() == 1));
    assert!(sim.nodes[1].engine.mem.at(BASE + (4 << 20), 130_000) == data);
    // With a key for every buffer (`a`'s registration covers both here): no lookup at all.
    let mut iov = IoList::one(a, 100_000);
    iov.keys[0] = Some(app_key);
    let now = sim.now;
    let n0 = &mut sim.nodes[0].engine;
    n0.me.send(now, to1, msg(), &[&data[..100_000]], iov, meta(2)).unwrap();
    let n1 = &mut sim.nodes[1].engine;
    n1.me.post_recv(now, recv(BASE + (6 << 20), 100_000, 11), &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 1, OpKind::Recv).len() == 2 && completions(s, 0, OpKind::Send).len() == 2));
    let m = regs0.lock().unwrap();
    assert!(m.bad_reads.is_empty(), "{:?}", m.bad_reads);
    assert_eq!(m.reads_checked, 3);
    assert_eq!(m.acquires, 1, "the buffers that came with a key were not looked up");
    assert!(m.held.is_empty());
    assert_eq!(sim.nodes[0].engine.me.stats().registrations_from_desc, 2);
}

/// Registrations go back however the send ends without a Fin(Done): the
/// receiver discards the announced message (FI_DISCARD: Fin(Discarded)); the
/// receiver dies (the send fails with the peer); the endpoint closes with the
/// send pending (the engine is dropped).
#[test]
fn a_discarded_failed_or_abandoned_rendezvous_gives_its_registrations_back() {
    let cfg = Config { rndv_threshold: 4096, keepalive: Duration::from_millis(500), ..Config::default() };
    let mut sim = net(2, Link::default(), 24, cfg);
    let regs0 = with_registrations(&mut sim, 0);
    let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
    let data = pattern(60_000, 6);
    sim.nodes[0].engine.mem.put(BASE, &data);
    let held = |m: &Arc<Mutex<RegModel>>| m.lock().unwrap().held.len();
    // Discarded by the receiver.
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 60_000), meta(1)).unwrap();
    assert_eq!(held(&regs0), 1);
    assert!(run(&mut sim, Duration::from_secs(5), |s| s.nodes[1].engine.me.unexpected_bytes() > 0));
    let now = sim.now;
    sim.nodes[1].engine.me.peek(now, recv(0, 0, 5), false, true);
    assert!(run(&mut sim, Duration::from_secs(5), |s| completions(s, 0, OpKind::Send).len() == 1));
    assert_eq!(completions(&sim, 0, OpKind::Send)[0].err, None);
    assert_eq!(held(&regs0), 0, "released on Fin(Discarded)");
    // The receiver dies holding the announcement.
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 60_000), meta(2)).unwrap();
    assert!(run(&mut sim, Duration::from_secs(5), |s| s.nodes[1].engine.me.unexpected_bytes() > 0));
    sim.nodes[1].alive = false;
    assert_eq!(held(&regs0), 1);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 0, OpKind::Send).len() == 2));
    assert_eq!(completions(&sim, 0, OpKind::Send)[1].err, Some(OpError::PeerUnreachable));
    assert_eq!(held(&regs0), 0, "released when the peer failed");
    // The endpoint closes with an announced send pending.
    let mut sim = net(2, Link::default(), 25, cfg);
    let regs0 = with_registrations(&mut sim, 0);
    let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 60_000), meta(3)).unwrap();
    assert_eq!(held(&regs0), 1);
    let fresh = MsgEngine::new(Engine::new(EngineConfig::default()), cfg);
    drop(std::mem::replace(&mut sim.nodes[0].engine.me, fresh));
    assert_eq!(held(&regs0), 0, "released when the engine was dropped");
    assert!(regs0.lock().unwrap().bad_reads.is_empty());
}

/// The application unmaps the send buffer while the rendezvous is in
/// flight: the cache drops the entry from its index at once (a new send of
/// that address registers anew) but deregisters it only when the engine
/// releases it, so the pull already announced reads through a live key; after
/// the release the old key is dead and a read through it would fail.
#[test]
fn an_unmap_during_a_transfer_defers_deregistration_until_release() {
    let mut sim = net(2, Link::default(), 26, Config { rndv_threshold: 4096, ..Config::default() });
    let regs0 = with_registrations(&mut sim, 0);
    let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
    let data = pattern(80_000, 7);
    sim.nodes[0].engine.mem.put(BASE, &data);
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 80_000), meta(1)).unwrap();
    let first_key = {
        let m = regs0.lock().unwrap();
        *m.cache.handle(*m.held.values().next().unwrap()).unwrap()
    };
    assert!(run(&mut sim, Duration::from_secs(5), |s| s.nodes[1].engine.me.unexpected_bytes() > 0));
    {
        // The unmap, as the monitor reports it, applied by the cache.
        let mut m = regs0.lock().unwrap();
        m.monitor.record(BASE, BASE + 4096);
        m.cache.sync();
        assert_eq!(m.cache.stats().invalidations, 1);
        assert!(m.cache.registrar().live.contains_key(&first_key), "in use: deregistration deferred");
        assert!(m.cache.is_empty(), "but gone from the index");
    }
    let now = sim.now;
    let n1 = &mut sim.nodes[1].engine;
    n1.me.post_recv(now, recv(BASE + (4 << 20), 80_000, 10), &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 0, OpKind::Send).len() == 1 && completions(s, 1, OpKind::Recv).len() == 1));
    assert!(sim.nodes[1].engine.mem.at(BASE + (4 << 20), 80_000) == data);
    {
        let mut m = regs0.lock().unwrap();
        assert!(m.bad_reads.is_empty(), "{:?}", m.bad_reads);
        assert!(!m.cache.registrar().live.contains_key(&first_key), "deregistered at the release");
        assert!(!m.check_read(Some(first_key), BASE, 10, &[]), "a read through the dead key fails");
        m.bad_reads.clear();
    }
    // The memory mapped again and sent from: a new registration, a new key.
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 80_000), meta(2)).unwrap();
    let n1 = &mut sim.nodes[1].engine;
    n1.me.post_recv(now, recv(BASE + (6 << 20), 80_000, 11), &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 0, OpKind::Send).len() == 2 && completions(s, 1, OpKind::Recv).len() == 2));
    let m = regs0.lock().unwrap();
    assert!(m.bad_reads.is_empty(), "{:?}", m.bad_reads);
    assert_eq!(m.cache.registrar().registered, 2, "registered anew after the unmap");
    assert!(!m.cache.registrar().live.contains_key(&first_key));
    assert!(m.held.is_empty());
}

/// Without a registrar (or when it fails), a long message on a registering
/// path goes eagerly: no RTS without keys is ever sent.
#[test]
fn a_registering_path_without_registrations_sends_eagerly() {
    let mut sim = net(2, Link::default(), 27, Config { rndv_threshold: 4096, ..Config::default() });
    let to1 = sim.nodes[0].engine.me.peer(DevAddr::Sim(1), registering_path());
    let data = pattern(50_000, 8);
    sim.nodes[0].engine.mem.put(BASE, &data);
    let now = sim.now;
    sim.nodes[0].engine.me.send(now, to1, msg(), &[&data], IoList::one(BASE, 50_000), meta(1)).unwrap();
    let n1 = &mut sim.nodes[1].engine;
    n1.me.post_recv(now, recv(BASE + (4 << 20), 50_000, 10), &mut n1.mem);
    assert!(run(&mut sim, Duration::from_secs(20), |s| completions(s, 1, OpKind::Recv).len() == 1));
    assert!(sim.nodes[1].engine.mem.at(BASE + (4 << 20), 50_000) == data);
    let st = sim.nodes[0].engine.me.stats();
    assert_eq!((st.rts_sent, st.eager_sent, st.registration_failures), (0, 1, 1));
}
