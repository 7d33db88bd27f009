//! Scale: an all-to-all of 1024 whole endpoints ([`rndv::Endpoint`] over
//! [`rdm::simnet::SimNet`], driven by [`EndpointSim`]) and a memory model of a
//! 10,000-process job checked against it.
//!
//! Every ordered pair exchanges three tagged messages: an eager one (200 B), a
//! medium one (4000 B: three datagrams of a 1400-byte path) and a rendezvous one
//! (16 KiB, over the 8 KiB thresholds set here). Pairs of the same parity have
//! paths that read remotely (the receiver pulls); pairs of different parity do
//! not (the sender pushes in windows the receiver grants): half the pairs take
//! each rendezvous. Every link loses 1% of datagrams; node 0 is a slow receiver
//! (it takes 100 datagrams a millisecond, and drops beyond a backlog of 256) that
//! every other node sends to first: an incast of 1023 senders.
//!
//! Memory stays small: each node keeps `W` pairs in flight each way (a window
//! of send slots and of receive slots in its model memory, reused as the
//! pairs complete), except node 0, which posts every receive at once. The
//! order (node 0 first, then i+1, i+2, ... for senders; j-1, j-2, ... for
//! receivers) agrees with one global order of pairs, so the windows cannot
//! deadlock.
//!
//! Memory is measured with a counting global allocator: the peak of the heap
//! during the run, less the heap before the endpoints existed (the network and
//! its paths) and the model memories, is attributed to the endpoints (it also
//! holds the datagrams on the simulated wire and the harness's completions of
//! a round: an upper bound).
//!
//! `.ci/run` runs 256 endpoints (`alltoall_scaled_down`; `RDMX_SCALE_N`
//! changes the number, debug builds run 64). The 1024-endpoint job takes
//! minutes, so it is ignored by default:
//! `cargo test --release -p rndv --test scale_alltoall -- --ignored --nocapture`
//! prints its numbers. `RDMX_SIM_SEED` picks the seed.
//!
//! docs/scale.md describes this scenario with the constants below;
//! `docs_state_the_scenarios_constants` fails when the two part.
mod common;

use common::Mem;
use common::BASE;
use rdm::sim::Link;
use rdm::simnet::{self, SimNet};
use rdm::DeviceCaps;
use rndv::engine::{IoList, OpKind, OpMeta, OutMsg, RecvSpec};
use rndv::sim::EndpointSim;
use rndv::{EndpointConfig, MsgHeader, MsgKind, Src};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

// ------------------------------------------------------------ heap accounting

/// The system allocator, counting the bytes live and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = LIVE.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds
// `GlobalAlloc`'s contract; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: the caller's layout is passed on as `GlobalAlloc::alloc` requires.
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(l) };
        if !p.is_null() {
            grew(l.size());
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` was allocated by `System` with `l` (every allocation goes through here).
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: `p` and `l` come from this allocator, `new` is the caller's, as `realloc` requires.
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            if new >= l.size() {
                grew(new - l.size());
            } else {
                LIVE.fetch_sub(l.size() - new, Ordering::Relaxed);
            }
        }
        q
    }
}

#[global_allocator]
static HEAP: Counting = Counting;

fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Starts a new peak measurement from the heap as it is now.
fn reset_peak() {
    PEAK.store(live(), Ordering::Relaxed);
}

fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// The heap is one for the whole binary: tests run one at a time, or one
/// would count the other's allocations.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ------------------------------------------------------------ the all-to-all

/// Message sizes: eager, medium (segmented), rendezvous.
const SIZES: [usize; 3] = [200, 4000, 16 << 10];
/// Where each message sits in a slot.
const OFFSETS: [u64; 3] = [0, 256, 4352];
/// One pair's three messages (64-byte aligned).
const SLOT: u64 = 4352 + (16 << 10);
/// Rendezvous from here, pulled or windowed (the engine's defaults are 64 KiB
/// and 256 KiB: scaled down with the messages).
const THRESHOLD: usize = 8 << 10;
/// Pairs in flight per node and direction.
const W: usize = 8;
/// Every path's datagram size.
const PATH_MTU: usize = 1400;
/// Datagrams every link loses, in percent.
const LOSS_PCT: f64 = 1.0;
/// The slow receiver (node 0): datagrams it takes a millisecond, and the
/// backlog beyond which it drops.
const SLOW_RX_PER_MS: u32 = 100;
const SLOW_BACKLOG: usize = 256;
/// Simulated time within which every send and receive must complete.
const VIRTUAL_TIME_LIMIT: Duration = Duration::from_secs(60);
/// Endpoints of the run `.ci/run` makes (a release build).
const CI_ENDPOINTS: usize = 256;
/// Processes of the job the memory model is printed for.
const JOB_PROCS: usize = 10_000;

/// The endpoints' configuration: 8 KiB thresholds both ways.
fn config() -> EndpointConfig {
    EndpointConfig {
        rndv_threshold: THRESHOLD,
        window_threshold: THRESHOLD,
        peer_timeout: Duration::from_secs(10),
        ..EndpointConfig::default()
    }
}

fn link() -> Link {
    Link { loss_pct: LOSS_PCT, ..Link::default() }
}

/// The bytes of message `kind` from `src` to `dst`.
fn fill(out: &mut [u8], src: usize, dst: usize, kind: usize) {
    let mut x = ((src as u64) << 40 | (dst as u64) << 8 | kind as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for c in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
    }
}

/// Node `i`'s k-th destination: node 0 first (the incast), then i+1, i+2, ...
fn dest(n: usize, i: usize, k: usize) -> Option<usize> {
    if i == 0 {
        return (k + 1 < n).then_some(k + 1);
    }
    if k == 0 {
        return Some(0);
    }
    // i+1, ..., n-1, then 1, ..., i-1 (0 went first).
    if k <= n - 1 - i {
        Some(i + k)
    } else {
        let r = k - (n - 1 - i);
        (r < i).then_some(r)
    }
}

/// Node `j`'s k-th source: j-1, j-2, ... (node 0 among them); node 0 takes
/// every source at once, in any order.
fn source(n: usize, j: usize, k: usize) -> Option<usize> {
    (k + 1 < n).then(|| (j + n - 1 - k) % n)
}

/// What one node of the all-to-all has left to do.
struct NodeState {
    /// Next destination / source index.
    next_dst: usize,
    next_src: usize,
    /// Per slot: the pair and its messages not yet complete.
    tx: Vec<(usize, u8)>,
    rx: Vec<(usize, u8)>,
    /// Sends the endpoint refused for now (its queue was full): (slot, kind).
    again: VecDeque<(usize, usize)>,
    sends_done: u64,
    recvs_done: u64,
}

/// Where node `i`'s send slot `s` / receive slot `s` is (receive slots after
/// the `W` send slots).
fn tx_addr(s: usize, kind: usize) -> u64 {
    BASE + s as u64 * SLOT + OFFSETS[kind]
}

fn rx_addr(s: usize, kind: usize) -> u64 {
    BASE + (W + s) as u64 * SLOT + OFFSETS[kind]
}

fn rx_slots(n: usize, i: usize) -> usize {
    if i == 0 {
        n - 1
    } else {
        W
    }
}

/// What the run measured.
#[derive(Clone, Copy, Debug, Default)]
struct Report {
    n: usize,
    seed: u64,
    messages: u64,
    bytes: u64,
    datagrams: u64,
    sent_data: u64,
    retransmits: u64,
    acks: u64,
    pulled: u64,
    pushed: u64,
    backlog_drops: u64,
    completion: Duration,
    wall: Duration,
    steps: u64,
    /// Heap per endpoint as created (before any peer), and per cold peer
    /// (the application inserted the address, nothing was sent).
    created: f64,
    cold: f64,
    /// rdm's pools and the staging buffers, per endpoint, after the run.
    pooled: f64,
    staging: f64,
    /// Model memories of all nodes.
    model_bytes: usize,
    /// Heap before the endpoints (network, paths, harness).
    base_heap: usize,
    /// Peak heap during the run, and heap once every message completed.
    peak_heap: usize,
    end_heap: usize,
    /// rdm's own estimate (`peer_bytes`), per peer: averaged over every peer
    /// of every node at the end, and the largest single peer.
    engine_peer_avg: f64,
    engine_peer_max: usize,
    /// rdm's estimate, per endpoint, summed over its peers, mid-run.
    engine_midrun_per_ep: f64,
    hot_peers: usize,
}

impl Report {
    /// Peak heap attributed to the endpoints, per endpoint.
    fn peak_per_ep(&self) -> f64 {
        (self.peak_heap - self.base_heap - self.model_bytes) as f64 / self.n as f64
    }
    /// An endpoint's heap after the run less what it held as created and
    /// rdm's pools: what grows with its peers.
    fn peer_part(&self) -> f64 {
        self.end_per_ep() - self.created - self.pooled
    }

    fn end_per_ep(&self) -> f64 {
        (self.end_heap - self.base_heap - self.model_bytes) as f64 / self.n as f64
    }
    fn peak_per_peer(&self) -> f64 {
        self.peak_per_ep() / (self.n - 1) as f64
    }
    fn end_per_peer(&self) -> f64 {
        self.end_per_ep() / (self.n - 1) as f64
    }
    fn retx_ratio(&self) -> f64 {
        self.retransmits as f64 / self.sent_data as f64
    }

    fn print(&self) {
        let kib = |b: f64| b / 1024.0;
        println!("scale all-to-all: {} endpoints, seed {}", self.n, self.seed);
        println!(
            "  messages            {} ({} per pair: {:?} B), {} bytes",
            self.messages,
            SIZES.len(),
            SIZES,
            self.bytes
        );
        println!("  datagrams           {} on the wire (data {} incl. {} retransmits, acks {}), {} backlog drops at the slow receiver", self.datagrams, self.sent_data, self.retransmits, self.acks, self.backlog_drops);
        println!("  rendezvous          {} pulled, {} pushed in windows", self.pulled, self.pushed);
        println!("  retransmit ratio    {:.4} (retransmits / data packets sent)", self.retx_ratio());
        println!(
            "  completion          {:.1} ms simulated, {} rounds, {:.1} s wall",
            self.completion.as_secs_f64() * 1e3,
            self.steps,
            self.wall.as_secs_f64()
        );
        println!(
            "  heap                base {:.1} MiB, model memories {:.1} MiB, peak {:.1} MiB, end {:.1} MiB",
            self.base_heap as f64 / 1048576.0,
            self.model_bytes as f64 / 1048576.0,
            self.peak_heap as f64 / 1048576.0,
            self.end_heap as f64 / 1048576.0
        );
        println!(
            "  per endpoint        peak {:.1} KiB, after the run {:.1} KiB",
            kib(self.peak_per_ep()),
            kib(self.end_per_ep())
        );
        println!(
            "  per peer            peak {:.0} B, after the run {:.0} B",
            self.peak_per_peer(),
            self.end_per_peer()
        );
        println!("  as created          {:.1} KiB per endpoint (staging {:.1} KiB), cold peer {:.0} B; after the run rdm pools {:.1} KiB per endpoint", kib(self.created), kib(self.staging), self.cold, kib(self.pooled));
        println!("  rdm peer_bytes      {:.0} B per peer after the run (largest {} B, {} hot peers); mid-run {:.1} KiB per endpoint", self.engine_peer_avg, self.engine_peer_max, self.hot_peers, kib(self.engine_midrun_per_ep));
    }
}

/// The network of the all-to-all: every path 1400 bytes; remote reads only
/// between nodes of the same parity.
fn network(n: usize, seed: u64) -> SimNet {
    let net = SimNet::new(n, DeviceCaps { remote_read: true, ..DeviceCaps::datagram(PATH_MTU) }, link(), seed);
    let no_read = DeviceCaps { remote_read: false, ..DeviceCaps::datagram(PATH_MTU) };
    for i in 0..n {
        for j in (1 - i % 2..n).step_by(2) {
            net.set_path(i as u32, j as u32, no_read);
        }
    }
    // The slow receiver of the incast.
    net.set_rx_per_ms(0, SLOW_RX_PER_MS);
    net.set_backlog_cap(0, SLOW_BACKLOG);
    net
}

fn meta(slot: usize, kind: usize) -> OpMeta {
    OpMeta { context: (slot as u64) << 2 | kind as u64, wanted: true, ..OpMeta::default() }
}

/// Posts node `j`'s receives for `src` into receive slot `s`.
fn post_recvs(sim: &mut EndpointSim<Mem>, j: usize, s: usize, src: usize) {
    let p = sim.peer(j, src);
    for (kind, &len) in SIZES.iter().enumerate() {
        let spec = RecvSpec {
            kind: MsgKind::Tagged,
            src: Src::Peer(p),
            tag: kind as u64,
            ignore: 0,
            iov: IoList::one(rx_addr(s, kind), len as u64),
            multi: false,
            meta: meta(s, kind),
        };
        sim.nodes[j].ep.post_recv(spec).expect("receive queue has room");
    }
}

/// Node `i` sends message `kind` of send slot `s`; false when the endpoint's
/// queue is full (try again later).
fn send(sim: &mut EndpointSim<Mem>, i: usize, s: usize, dst: usize, kind: usize, buf: &mut Vec<u8>) -> bool {
    let len = SIZES[kind];
    buf.resize(len, 0);
    fill(buf, i, dst, kind);
    let addr = tx_addr(s, kind);
    let p = sim.peer(i, dst);
    let ep = &mut sim.nodes[i].ep;
    ep.mem_mut().put(addr, buf);
    let h = MsgHeader { kind: MsgKind::Tagged, tag: kind as u64, data: None };
    match ep.send(OutMsg {
        peer: p,
        header: h,
        payload: &[buf],
        user: IoList::one(addr, len as u64),
        meta: meta(s, kind),
    }) {
        Ok(_) => true,
        Err(rndv::engine::PostError::Again) => false,
        Err(e) => panic!("node {i}: send to {dst} failed: {e:?}"),
    }
}

/// Node `i` starts its next destination in send slot `s`, if one is left.
fn start_pair(sim: &mut EndpointSim<Mem>, st: &mut NodeState, n: usize, i: usize, s: usize, buf: &mut Vec<u8>) {
    let Some(dst) = dest(n, i, st.next_dst) else { return };
    st.next_dst += 1;
    st.tx[s] = (dst, 3);
    for kind in 0..3 {
        if !st.again.is_empty() || !send(sim, i, s, dst, kind, buf) {
            st.again.push_back((s, kind));
        }
    }
}

/// Runs the all-to-all of `n` endpoints from `seed`; panics on any failure
/// (a wrong byte, a failed or missing completion, an event, virtual time
/// beyond `limit`).
fn alltoall(n: usize, seed: u64, limit: Duration) -> Report {
    let wall = std::time::Instant::now();
    let net = network(n, seed);
    let mut st: Vec<NodeState> = (0..n)
        .map(|i| NodeState {
            next_dst: 0,
            next_src: 0,
            tx: vec![(0, 0); W],
            rx: vec![(0, 0); rx_slots(n, i)],
            again: VecDeque::new(),
            sends_done: 0,
            recvs_done: 0,
        })
        .collect();
    let mut buf = Vec::with_capacity(SIZES[2]);
    let mut done = Vec::new();
    let base_heap = live();
    let mems: Vec<Mem> = (0..n).map(|i| Mem::sized((W + rx_slots(n, i)) * SLOT as usize)).collect();
    let model_bytes: usize = mems.iter().map(|m| m.bytes.len()).sum();
    reset_peak();
    let mut sim = EndpointSim::new(net, config(), mems);
    let after_new = live();
    // The application inserts every address (MPI does): cold peers.
    for i in 0..n {
        for j in (0..n).filter(|&j| j != i) {
            sim.peer(i, j);
        }
    }
    let after_peers = live();
    let (created, cold) = (
        (after_new - base_heap - model_bytes) as f64 / n as f64,
        (after_peers - after_new) as f64 / (n * (n - 1)) as f64,
    );
    for (i, s) in st.iter_mut().enumerate() {
        for slot in 0..rx_slots(n, i) {
            let Some(src) = source(n, i, s.next_src) else { break };
            s.next_src += 1;
            s.rx[slot] = (src, 3);
            post_recvs(&mut sim, i, slot, src);
        }
    }
    for (i, s) in st.iter_mut().enumerate() {
        for slot in 0..W {
            start_pair(&mut sim, s, n, i, slot, &mut buf);
        }
    }
    let pairs = (n * (n - 1)) as u64;
    let (mut sends, mut recvs, mut steps) = (0u64, 0u64, 0u64);
    let mut check = vec![0u8; SIZES[2]];
    let mut midrun = None;
    let start = sim.now();
    while sends < 3 * pairs || recvs < 3 * pairs {
        assert!(
            sim.now() - start < limit,
            "seed {seed}: not done after {limit:?} simulated: {sends} sends, {recvs} receives of {}",
            3 * pairs
        );
        for (i, s) in st.iter_mut().enumerate() {
            while let Some(&(slot, kind)) = s.again.front() {
                if !send(&mut sim, i, slot, s.tx[slot].0, kind, &mut buf) {
                    break;
                }
                s.again.pop_front();
            }
        }
        if !sim.step() {
            panic!("seed {seed}: nothing left to happen with {sends} sends, {recvs} receives of {} done", 3 * pairs);
        }
        steps += 1;
        // Indexes: the harness state and the simulator are borrowed in turn.
        #[allow(clippy::needless_range_loop)]
        for i in 0..n {
            if let Some(e) = sim.nodes[i].events.first() {
                panic!("seed {seed}: node {i}: {e:?}");
            }
            std::mem::swap(&mut done, &mut sim.nodes[i].done);
            for c in done.drain(..) {
                let (slot, kind) = ((c.meta.context >> 2) as usize, (c.meta.context & 3) as usize);
                assert!(c.err.is_none(), "seed {seed}: node {i}: {c:?}");
                match c.kind {
                    OpKind::Send => {
                        let dst = st[i].tx[slot].0;
                        assert_eq!(c.src, Some(sim.peer(i, dst)), "node {i} slot {slot}");
                        st[i].tx[slot].1 -= 1;
                        sends += 1;
                        st[i].sends_done += 1;
                        if st[i].tx[slot].1 == 0 {
                            start_pair(&mut sim, &mut st[i], n, i, slot, &mut buf);
                        }
                    }
                    OpKind::Recv => {
                        let (src, _) = st[i].rx[slot];
                        let len = SIZES[kind];
                        assert_eq!(
                            (c.len, c.tag, c.src),
                            (len, kind as u64, Some(sim.peer(i, src))),
                            "seed {seed}: node {i} from {src}"
                        );
                        fill(&mut check[..len], src, i, kind);
                        assert!(
                            sim.nodes[i].ep.mem().at(rx_addr(slot, kind), len) == &check[..len],
                            "seed {seed}: bytes of message {kind} from {src} to {i}"
                        );
                        st[i].rx[slot].1 -= 1;
                        recvs += 1;
                        st[i].recvs_done += 1;
                        if st[i].rx[slot].1 == 0 {
                            if let Some(next) = source(n, i, st[i].next_src).filter(|_| i != 0) {
                                st[i].next_src += 1;
                                st[i].rx[slot] = (next, 3);
                                post_recvs(&mut sim, i, slot, next);
                            }
                        }
                    }
                    k => panic!("unexpected completion {k:?}"),
                }
            }
        }
        if midrun.is_none() && recvs >= 3 * pairs / 2 {
            let total: usize = (0..n)
                .map(|i| {
                    (0..n)
                        .filter(|&j| j != i)
                        .map(|j| {
                            sim.nodes[i].ep.peer_bytes(sim.nodes[i].ep.peer_id_of(simnet::addr(j as u32)).unwrap())
                        })
                        .sum::<usize>()
                })
                .sum();
            midrun = Some(total as f64 / n as f64);
        }
    }
    let completion = sim.now() - start;
    let peak_heap = peak();
    let end_heap = live();
    for (i, s) in st.iter().enumerate() {
        assert_eq!((s.sends_done, s.recvs_done), (3 * (n as u64 - 1), 3 * (n as u64 - 1)), "node {i}");
    }
    let mut r = Report {
        n,
        seed,
        created,
        cold,
        model_bytes,
        base_heap,
        peak_heap,
        end_heap,
        completion,
        steps,
        ..Report::default()
    };
    r.messages = 3 * pairs;
    r.bytes = pairs * SIZES.iter().sum::<usize>() as u64;
    r.datagrams = sim.net.datagrams();
    r.backlog_drops = sim.net.backlog_drops(0);
    let (mut sum, mut count) = (0usize, 0usize);
    for i in 0..n {
        let ep = &mut sim.nodes[i].ep;
        let s = ep.stats();
        r.sent_data += s.rdm.sent_data;
        r.retransmits += s.rdm.retransmits;
        r.acks += s.rdm.sent_acks;
        r.pulled += s.msg.pulled;
        r.pushed += s.msg.pushed;
        r.hot_peers += ep.hot_peers();
        r.pooled += ep.pooled_bytes() as f64 / n as f64;
        r.staging += ep.staging_bytes() as f64 / n as f64;
        for j in (0..n).filter(|&j| j != i) {
            let b = ep.peer_bytes(ep.peer_id_of(simnet::addr(j as u32)).unwrap());
            sum += b;
            count += 1;
            r.engine_peer_max = r.engine_peer_max.max(b);
        }
    }
    r.engine_peer_avg = sum as f64 / count as f64;
    r.engine_midrun_per_ep = midrun.unwrap_or(0.0);
    r.wall = wall.elapsed();
    r
}

// ------------------------------------------------------------ memory model

/// Bytes per AV entry the provider keeps: a 64-byte address plus the table's
/// overhead, as `fi_tests/tests/av_scale.rs` measured (64.8).
const AV_ENTRY: f64 = 64.8;

/// One RC queue pair per peer (libfabric `verbs;ofi_rxm`), from the seeds:
/// "For a 100-node fabric, about 10 GB - 100 GB memory is required for
/// WQEs/Buffers/QP states on each server node" (the RDMA/rv RFC, Kaike Wan,
/// 2021, /work/shared/seeds/003_7f8f55f7063261de.txt). The seed gives no
/// process count; at 32 processes a node, each with a QP to every remote
/// process, a node holds 32 x 99 x 32 = 101,376 QPs: 10-100 GB of them is
/// about 100 KB to 1 MB per QP. These are the low and high ends.
const RC_QP_BYTES: (f64, f64) = (10e9 / RC_QPS_PER_NODE, 100e9 / RC_QPS_PER_NODE);
/// Processes per node assumed for [`RC_QP_BYTES`] (the seed's 100 nodes).
const RC_PROCS_PER_NODE: usize = 32;
const RC_NODES: usize = 100;
const RC_QPS_PER_NODE: f64 = (RC_PROCS_PER_NODE * (RC_NODES - 1) * RC_PROCS_PER_NODE) as f64;

/// What the model of one process takes from a measured run.
#[derive(Clone, Copy, Debug)]
struct ModelInputs {
    /// The endpoint as created, before any peer (staging buffers, queues).
    endpoint: f64,
    /// rdm's reusable buffers (bounded: at most 64 buffers of at most 64 KiB
    /// per pool), as the engine reports them after the run.
    pools: f64,
    /// Buffers in flight at the peak beyond what stays (peak less end heap,
    /// per endpoint).
    in_flight: f64,
    /// Heap per peer once the peer carried traffic: the slope of the
    /// endpoint's heap (less `endpoint` and `pools`) over its peers, between
    /// two runs of different sizes.
    peer: f64,
    /// The rest of the endpoint that does not grow with its peers (the
    /// message engine's queues and tables): that line's value at no peers.
    other: f64,
    /// Registrations: none on the paths simulated here (UDP-like and shm
    /// paths register nothing); on verbs, the registration cache's entries,
    /// bounded by its limit, not by the number of peers.
    registrations: f64,
}

impl ModelInputs {
    /// Fitted on runs `a` and `b` (peer slope and the rest), with the fixed
    /// parts as `r` measured them.
    fn fit(a: &Report, b: &Report, r: &Report) -> ModelInputs {
        let rest = Report::peer_part;
        let peer = (rest(b) - rest(a)) / (b.n - a.n) as f64;
        let other = rest(a) - (a.n - 1) as f64 * peer;
        ModelInputs {
            endpoint: r.created,
            pools: r.pooled,
            in_flight: r.peak_per_ep() - r.end_per_ep(),
            peer,
            other,
            registrations: 0.0,
        }
    }

    /// The part of an endpoint's heap after the run that grows with `peers`
    /// (and the fit's intercept): all but the endpoint as created and rdm's pools.
    fn peer_part(&self, peers: usize) -> f64 {
        self.other + peers as f64 * self.peer
    }
}

/// One process's memory in a job of `procs` processes, by part (bytes).
#[derive(Clone, Copy, Debug)]
struct ProcessMemory {
    av: f64,
    peers: f64,
    buffers: f64,
    registrations: f64,
}

impl ProcessMemory {
    fn total(&self) -> f64 {
        self.av + self.peers + self.buffers + self.registrations
    }
}

/// The model: every other process is an AV entry and a peer that carried
/// traffic (an all-to-all touches them all); buffers are per endpoint.
fn model(procs: usize, m: &ModelInputs) -> ProcessMemory {
    let peers = (procs - 1) as f64;
    ProcessMemory {
        av: peers * AV_ENTRY,
        peers: peers * m.peer,
        buffers: m.endpoint + m.pools + m.other + m.in_flight,
        registrations: m.registrations,
    }
}

/// What one RC queue pair per peer costs a process (low, high).
fn rc_model(procs: usize) -> (f64, f64) {
    let peers = (procs - 1) as f64;
    (peers * RC_QP_BYTES.0, peers * RC_QP_BYTES.1)
}

fn print_model(procs: usize, m: &ModelInputs) {
    let p = model(procs, m);
    let (lo, hi) = rc_model(procs);
    let mib = |b: f64| b / 1048576.0;
    println!("memory model of a {procs}-process job, per process:");
    println!("  | part | bytes | per peer |");
    println!("  |---|---:|---:|");
    println!("  | AV entries ({AV_ENTRY} B each) | {:.1} MiB | {AV_ENTRY:.1} B |", mib(p.av));
    println!("  | peer state (engines, after traffic) | {:.1} MiB | {:.0} B |", mib(p.peers), m.peer);
    println!("  | buffers and queues (endpoint as created {:.0} KiB, rdm pools {:.0} KiB, message engine {:.0} KiB, in flight {:.0} KiB) | {:.1} MiB | - |", m.endpoint / 1024.0, m.pools / 1024.0, m.other / 1024.0, m.in_flight / 1024.0, mib(p.buffers));
    println!("  | registrations | {:.1} MiB | - |", mib(p.registrations));
    println!("  | **rdmx total** | **{:.1} MiB** | {:.0} B |", mib(p.total()), p.total() / (procs - 1) as f64);
    println!(
        "  | RC QP per peer (verbs;ofi_rxm, seeds: {:.0}-{:.0} KB per QP) | {:.0}-{:.0} MiB | {:.0}-{:.0} KB |",
        RC_QP_BYTES.0 / 1e3,
        RC_QP_BYTES.1 / 1e3,
        mib(lo),
        mib(hi),
        RC_QP_BYTES.0 / 1e3,
        RC_QP_BYTES.1 / 1e3
    );
}

/// The model, fitted on smaller runs, must predict the endpoint's heap per
/// peer of the large one (what stays after the run) within this fraction.
const MODEL_TOLERANCE: f64 = 0.10;

#[test]
fn orders_cover_every_pair_once() {
    let _serial = serial();
    for n in [2, 3, 5, 64] {
        let mut seen = vec![false; n * n];
        for i in 0..n {
            let d: Vec<usize> = (0..).map_while(|k| dest(n, i, k)).collect();
            assert_eq!(d.len(), n - 1, "node {i} of {n}: {d:?}");
            for j in d {
                assert!(j != i && !seen[i * n + j], "{i}->{j}");
                seen[i * n + j] = true;
            }
            let s: Vec<usize> = (0..).map_while(|k| source(n, i, k)).collect();
            assert_eq!(s.len(), n - 1);
            assert!(s.iter().all(|&j| j != i));
        }
    }
}

#[test]
fn a_run_replays_from_its_seed() {
    let _serial = serial();
    let key = |r: &Report| (r.datagrams, r.sent_data, r.retransmits, r.backlog_drops, r.completion, r.steps);
    let (a, b) = (alltoall(48, 5, Duration::from_secs(60)), alltoall(48, 5, Duration::from_secs(60)));
    assert_eq!(key(&a), key(&b));
    assert_ne!(key(&a), key(&alltoall(48, 6, Duration::from_secs(60))), "the seed changes nothing");
}

#[test]
fn model_adds_up() {
    let _serial = serial();
    let m = ModelInputs { endpoint: 50e3, pools: 1e6, in_flight: 0.0, peer: 1000.0, other: 0.0, registrations: 0.0 };
    let p = model(10_001, &m);
    for (got, want) in [(p.av, 648_000.0), (p.peers, 10e6), (p.buffers, 1.05e6), (p.total(), 11.698e6)] {
        assert!((got - want).abs() < 1.0, "{got} vs {want}");
    }
    let (lo, hi) = rc_model(10_001);
    assert!(lo > 900e6 && hi < 10e9 && hi > 9e9, "{lo} {hi}");
}

/// The all-to-all of `n` endpoints, and the memory model checked against it:
/// fitted on runs of a quarter and half the endpoints, the model must predict
/// the heap per peer of the full run within `MODEL_TOLERANCE`.
fn scale(n: usize) {
    let seed = common::seeds(&[1]).into_iter().next().unwrap();
    let limit = VIRTUAL_TIME_LIMIT;
    let (a, b) = (alltoall((n / 4).max(8), seed, limit), alltoall((n / 2).max(16), seed, limit));
    let r = alltoall(n, seed, limit);
    r.print();
    assert!(r.retransmits > 0 && r.pulled > 0 && r.pushed > 0, "no loss or one rendezvous never ran: {r:?}");
    assert!(n < 128 || r.backlog_drops > 0, "the slow receiver was never overrun");
    // The part of an endpoint's heap that grows with its peers (all but the
    // endpoint as created and rdm's pools, which are measured, and bounded
    // per endpoint) is fitted on the two smaller runs alone and must predict
    // the n-endpoint run, which the fit has not seen.
    let m = ModelInputs::fit(&a, &b, &r);
    let predicted = m.peer_part(n - 1) / (n - 1) as f64;
    let measured = r.peer_part() / (n - 1) as f64;
    println!("model check: fitted on {} and {} endpoints ({:.0} B per peer, {:.1} KiB rest), predicts {predicted:.0} B per peer at {n}; measured {measured:.0} B (heap per peer, pools and endpoint included: {:.0} B, peak {:.0} B)", a.n, b.n, m.peer, m.other / 1024.0, r.end_per_peer(), r.peak_per_peer());
    assert!(
        (predicted - measured).abs() <= MODEL_TOLERANCE * measured,
        "the model is off by more than {MODEL_TOLERANCE}: {predicted:.0} vs {measured:.0} B per peer"
    );
    // The table and the bounds: that model (its per-peer part checked just
    // above against a run it was not fitted on; the endpoint's own buffers as
    // the n-endpoint run measured them), with the larger of the fitted and the
    // measured per-peer cost, so that a cost that still grows with the job is
    // not extrapolated from the smaller runs' slope.
    // Slope against slope: the measured part less the fit's intercept, which
    // the model counts once, in the buffers.
    let measured_slope = (r.peer_part() - m.other) / (n - 1) as f64;
    let m = ModelInputs { peer: m.peer.max(measured_slope), ..m };
    print_model(n, &m);
    print_model(JOB_PROCS, &m);
    // The bounds docs/scale.md states (runs of 256 endpoints or more: smaller
    // fits are noise-dominated by the fixed per-endpoint part).
    if n >= 256 {
        let (peer, created, total) = documented_bounds();
        let job = model(JOB_PROCS, &m).total();
        println!("bounds: {:.0} B per peer (at most {peer:.0}), {:.1} KiB as created (at most {:.1}), {:.1} MiB per process of 10,000 (at most {:.1})", m.peer, r.created / 1024.0, created / 1024.0, job / MIB, total / MIB);
        assert!(
            m.peer <= peer,
            "{:.0} B per peer that carried traffic, above the {peer:.0} B docs/scale.md states",
            m.peer
        );
        assert!(
            r.created <= created,
            "{:.1} KiB per endpoint as created, above the {:.1} KiB docs/scale.md states",
            r.created / 1024.0,
            created / 1024.0
        );
        assert!(
            job <= total,
            "{:.2} MiB per process of a 10,000-process job, above the {:.1} MiB docs/scale.md states",
            job / MIB,
            total / MIB
        );
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// The bounds of docs/scale.md's "Memory bounds the CI run holds" paragraph:
/// bytes per peer, bytes per endpoint as created, bytes per process of a
/// 10,000-process job.
fn documented_bounds() -> (f64, f64, f64) {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/scale.md");
    let doc = std::fs::read_to_string(path).expect("docs/scale.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let number = |before: &str, after: &str| -> f64 {
        let i = doc.find(before).unwrap_or_else(|| {
            panic!("docs/scale.md no longer says \"{before}\": keep the bounds paragraph and this test together")
        });
        let rest = &doc[i + before.len()..];
        let j = rest.find(after).unwrap_or_else(|| panic!("docs/scale.md: no \"{after}\" after \"{before}\""));
        rest[..j]
            .replace(',', "")
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("docs/scale.md: {:?} after \"{before}\": {e}", &rest[..j]))
    };
    let peer = number("grows by more than **", " B per peer that carried traffic**");
    let created = number("holds more than **", " KiB**") * 1024.0;
    let total = number("job above **", " MiB per process**") * MIB;
    (peer, created, total)
}

/// What `.ci/run` runs: 256 endpoints (`RDMX_SCALE_N` changes it; debug
/// builds run 64).
#[test]
fn alltoall_scaled_down() {
    let _serial = serial();
    scale(std::env::var("RDMX_SCALE_N").ok().and_then(|s| s.parse().ok()).unwrap_or(if cfg!(debug_assertions) {
        64
    } else {
        CI_ENDPOINTS
    }));
}

/// The 1024-endpoint job of docs/scale.md (minutes of wall time: run by hand,
/// `cargo test --release -p rndv --test scale_alltoall -- --ignored --nocapture`).
#[test]
#[ignore = "1024 endpoints: several minutes; run with --ignored"]
fn alltoall_1024_endpoints() {
    let _serial = serial();
    scale(1024);
}

/// `1234567` as `1,234,567`.
fn thousands(n: usize) -> String {
    let reversed: Vec<char> = n.to_string().chars().rev().collect();
    let groups: Vec<String> = reversed.chunks(3).map(|g| g.iter().rev().collect()).collect();
    groups.into_iter().rev().collect::<Vec<_>>().join(",")
}

/// The phrases of docs/scale.md that state this file's constants.
fn documented_phrases() -> Vec<String> {
    let kib = |b: usize| b >> 10;
    let (pool_depth, pool_max) = (rdm::engine::POOL_DEPTH, rdm::engine::POOL_MAX_CAPACITY);
    let qps = RC_QPS_PER_NODE as usize;
    vec![
        format!("a simulated all-to-all of 1024 endpoints, and a memory model of a {}-process job", thousands(JOB_PROCS)),
        format!("eager ({} B), medium ({} B, three {PATH_MTU}-byte datagrams) and rendezvous ({} KiB; the thresholds are set to {} KiB", SIZES[0], SIZES[1], kib(SIZES[2]), kib(THRESHOLD)),
        format!("Every link loses {LOSS_PCT} % of datagrams."),
        format!("Node 0 is a slow receiver ({SLOW_RX_PER_MS} datagrams/ms, {SLOW_BACKLOG} waiting at most, the rest dropped)"),
        format!("Each node keeps {W} pairs in flight each way"),
        format!("within {} s of virtual time", VIRTUAL_TIME_LIMIT.as_secs()),
        format!("`.ci/run` runs the scenario at {CI_ENDPOINTS} endpoints (`alltoall_scaled_down`"),
        format!("(`alltoall_scaled_down`, {CI_ENDPOINTS} endpoints; the model fitted on its {}- and {}-endpoint runs and checked against the {CI_ENDPOINTS}-endpoint run)", CI_ENDPOINTS / 4, CI_ENDPOINTS / 2),
        format!("within {:.0} % (`MODEL_TOLERANCE`)", MODEL_TOLERANCE * 100.0),
        format!(
            "({pool_depth} buffers of at most {} KiB and {} B each per pool: a 64 KiB payload and the header before it)",
            kib(pool_max),
            pool_max % 1024
        ),
        format!("one AV entry per other process ({AV_ENTRY} B:"),
        format!("assuming {RC_PROCS_PER_NODE} processes a node, each with a QP to every remote process ({} QPs a node), that is {:.0} KB to {:.0} KB per QP", thousands(qps), RC_QP_BYTES.0 / 1e3, RC_QP_BYTES.1 / 1e3),
        format!("\"For a {RC_NODES}-node fabric, about 10 GB - 100 GB memory is required"),
    ]
}

/// docs/scale.md describes the scenario with this file's constants (no
/// simulation: fast).
#[test]
fn docs_state_the_scenarios_constants() {
    let _serial = serial();
    // A 4000-byte message with rndv's header, in datagrams of PATH_MTU less rdm's header: "three".
    let medium = (SIZES[1] + rndv::HEADER_LEN).div_ceil(PATH_MTU - rdm::engine::wire::HEADER_LEN);
    assert_eq!(medium, 3, "the medium message takes {medium} datagrams now: docs/scale.md says three");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/scale.md");
    let doc = std::fs::read_to_string(path).expect("docs/scale.md").split_whitespace().collect::<Vec<_>>().join(" ");
    for phrase in documented_phrases() {
        assert!(doc.contains(&phrase), "docs/scale.md should say \"{phrase}\" (rndv/tests/scale_alltoall.rs)");
    }
}

#[test]
fn documented_phrases_can_fail() {
    let _serial = serial();
    assert_eq!(thousands(101_376), "101,376");
    assert_eq!(thousands(10_000), "10,000");
    assert_eq!(thousands(999), "999");
    let phrases = documented_phrases();
    assert!(phrases.iter().any(|p| p == "Every link loses 1 % of datagrams."), "{phrases:?}");
    assert!(phrases.iter().any(|p| p.contains("(101,376 QPs a node), that is 99 KB to 986 KB per QP")), "{phrases:?}");
    assert!(!phrases.iter().any(|p| p == "Every link loses 2 % of datagrams."));
}
