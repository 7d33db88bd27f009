//! Micro-benchmarks of the message layer's per-message work: header encode and
//! decode, tag matching against posted and unexpected queues of growing depth,
//! one emulated atomic, and one message through two whole endpoints (the
//! object the provider calls) over the simulated network device.
//! `cargo bench -p rdmx-benches`.
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdm::engine::PeerId;
use rdm::sim::Link;
use rdm::simnet::SimNet;
use rdm::DeviceCaps;
use rndv::atomic::{apply, Datatype, Op};
use rndv::engine::{Access, IoBuf, IoList, Memory, OpMeta, OutMsg, RecvSpec};
use rndv::sim::{EndpointSim, SimMemory};
use rndv::wire::rma::Status;
use rndv::{Arrived, EndpointConfig, Matcher, MsgHeader, MsgKind, RecvPost, Src};
use std::time::Duration;

fn header(c: &mut Criterion) {
    let h = MsgHeader { kind: MsgKind::Tagged, tag: 0x1234_5678, data: Some(7) };
    let mut g = c.benchmark_group("header");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode", |b| b.iter(|| black_box(black_box(&h).encode())));
    let bytes = h.encode();
    g.bench_function("decode", |b| b.iter(|| black_box(MsgHeader::decode(black_box(&bytes)).ok())));
    g.finish();
}

fn matching(c: &mut Criterion) {
    let mut g = c.benchmark_group("matching");
    for depth in [1usize, 16, 256] {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("arrive_then_post", depth), &depth, |b, &depth| {
            let mut m = Matcher::new();
            for i in 0..depth {
                let post = RecvPost {
                    token: i as u64,
                    kind: MsgKind::Tagged,
                    src: Src::Any,
                    tag: 1 << 40 | i as u64,
                    ignore: 0,
                    persistent: false,
                };
                m.post(post);
            }
            b.iter(|| {
                let a = Arrived {
                    peer: PeerId::from_index(1),
                    kind: MsgKind::Tagged,
                    tag: 5,
                    data: None,
                    msg: Vec::new(),
                    offset: 0,
                    rndv: None,
                };
                black_box(m.arrive(a));
                let post =
                    RecvPost { token: 9, kind: MsgKind::Tagged, src: Src::Any, tag: 5, ignore: 0, persistent: false };
                black_box(m.post(post));
            });
        });
    }
    g.finish();
}

fn atomics(c: &mut Criterion) {
    let mut target = vec![0u8; 8 * 64];
    let operand = vec![1u8; 8 * 64];
    c.bench_function("atomic_sum_u64x64", |b| {
        b.iter(|| apply(Datatype::U64, Op::Sum, black_box(&mut target), black_box(&operand), &[]).ok())
    });
}

/// Application memory of a benchmark endpoint: a send area and a receive area.
struct BenchMem(Vec<u8>);

const BASE: u64 = 0x1000;

impl Memory for BenchMem {
    fn write(&mut self, addr: u64, data: &[u8]) {
        let o = (addr - BASE) as usize;
        self.0[o..o + data.len()].copy_from_slice(data);
    }
    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.bytes(addr, len));
    }
    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let o = (addr - BASE) as usize;
        &self.0[o..o + len]
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
}

impl SimMemory for BenchMem {
    fn load(&self, addr: u64, len: usize) -> Vec<u8> {
        self.bytes(addr, len).to_vec()
    }
    fn store(&mut self, addr: u64, data: &[u8]) {
        self.write(addr, data);
    }
}

/// One 8-byte tagged message from endpoint 0 to endpoint 1 (receive posted
/// first), until both completions are out: the per-message work of both
/// endpoints, engines and the simulated device, on a reliable ordered path
/// (DIRECT, as shm) and a lossy-capable one (sequenced and acknowledged, as UDP).
fn endpoint_message(c: &mut Criterion) {
    let mut g = c.benchmark_group("endpoint_8B_message");
    g.throughput(Throughput::Elements(1));
    for (name, caps) in [
        ("direct", DeviceCaps { reliable: true, ordered: true, ..DeviceCaps::datagram(8192) }),
        ("sequenced", DeviceCaps::datagram(1472)),
    ] {
        g.bench_function(name, |b| {
            let net = SimNet::new(2, caps, Link { delay: Duration::ZERO, ..Link::default() }, 1);
            let mems = (0..2).map(|_| BenchMem(vec![0; 4096])).collect();
            let mut sim = EndpointSim::new(net, EndpointConfig::default(), mems);
            let to1 = sim.peer(0, 1);
            let payload = [7u8; 8];
            let mut context = 0u64;
            b.iter(|| {
                context += 1;
                let meta = OpMeta { context, wanted: true, ..OpMeta::default() };
                let spec = RecvSpec {
                    kind: MsgKind::Tagged,
                    src: Src::Any,
                    tag: 5,
                    ignore: 0,
                    iov: IoList::one(BASE + 2048, 8),
                    multi: false,
                    meta,
                };
                sim.nodes[1].ep.post_recv(spec).unwrap();
                let h = MsgHeader { kind: MsgKind::Tagged, tag: 5, data: None };
                sim.nodes[0]
                    .ep
                    .send(OutMsg { peer: to1, header: h, payload: &[&payload], user: IoList::one(BASE, 8), meta })
                    .unwrap();
                while sim.nodes[1].done.is_empty() || sim.nodes[0].done.is_empty() {
                    if !sim.step() {
                        break;
                    }
                }
                assert!(sim.nodes[1].done.len() == 1 && sim.nodes[0].done.len() == 1, "the message did not complete");
                sim.nodes[0].done.clear();
                black_box(sim.nodes[1].done.pop());
            });
        });
    }
    g.finish();
}

criterion_group!(benches, header, matching, atomics, endpoint_message);
criterion_main!(benches);
