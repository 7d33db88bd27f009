//! Micro-benchmarks of the message layer's per-message work: header encode and
//! decode, tag matching against posted and unexpected queues of growing depth,
//! and one emulated atomic. `cargo bench -p rdmx-benches`.
use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rdm::engine::PeerId;
use rndv::atomic::{apply, Datatype, Op};
use rndv::{Arrived, Matcher, MsgHeader, MsgKind, RecvPost, Src};

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
                let post = RecvPost { token: i as u64, kind: MsgKind::Tagged, src: Src::Any, tag: 1 << 40 | i as u64, ignore: 0, persistent: false };
                m.post(post);
            }
            b.iter(|| {
                let a = Arrived { peer: PeerId::from_index(1), kind: MsgKind::Tagged, tag: 5, data: None, msg: Vec::new(), offset: 0, rndv: None };
                black_box(m.arrive(a));
                let post = RecvPost { token: 9, kind: MsgKind::Tagged, src: Src::Any, tag: 5, ignore: 0, persistent: false };
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

criterion_group!(benches, header, matching, atomics);
criterion_main!(benches);
