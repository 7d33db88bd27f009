//! An engine that serves several jobs (`EngineConfig::other_jobs`), through
//! the public API: a process met in two jobs is two peers with two streams,
//! each job's messages arrive only as that job's, a job the engine does not
//! serve is dropped before any state, and a datagram claiming a sealed job
//! without its tag is refused and counted against that job.
use rdm::engine::{Engine, EngineConfig, Event, JobAuth, JobConfig, JobIdx, JobSecret, PeerId};
use rdm::{DevAddr, Instant};
use std::sync::Arc;

const SECRET_A: &[u8] = b"the secret of job A, 32 bytes...";
const SECRET_C: &[u8] = b"the secret of job C, 32 bytes...";
const KEY_B: u64 = 0x42;

fn auth(secret: &[u8]) -> Arc<JobAuth> {
    Arc::new(JobAuth { secret: JobSecret::new(secret).unwrap(), encrypt: false })
}

fn job_a() -> JobConfig {
    JobConfig { job_key: 0, auth: Some(auth(SECRET_A)) }
}

fn job_b() -> JobConfig {
    JobConfig { job_key: KEY_B, auth: None }
}

fn engine(inc: u64, jobs: &[JobConfig]) -> Engine {
    Engine::new(EngineConfig {
        incarnation: inc,
        job_key: jobs[0].job_key,
        auth: jobs[0].auth.clone(),
        other_jobs: jobs[1..].to_vec(),
        ..EngineConfig::default()
    })
}

fn addr(i: u32) -> DevAddr {
    rdm::simnet::addr(i)
}

/// Engines at `addr(0)`, `addr(1)`, ...; every datagram goes to the engine
/// at its destination, and is kept (with its sender's index) for replays.
struct Net {
    nodes: Vec<Engine>,
    wire: Vec<(usize, usize, Vec<u8>)>,
}

impl Net {
    fn pump(&mut self, t: Instant) {
        let mut buf = vec![0u8; 70_000];
        for _ in 0..10_000 {
            let mut moved = false;
            for from in 0..self.nodes.len() {
                while let Some(x) = self.nodes[from].poll_transmit(t, &mut buf) {
                    let to = (0..self.nodes.len()).find(|&i| addr(i as u32) == x.dst);
                    for d in buf[..x.len].chunks(x.seg) {
                        if let Some(to) = to {
                            self.wire.push((from, to, d.to_vec()));
                            self.nodes[to].handle_datagram(t, addr(from as u32), d);
                        }
                    }
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the net never went quiet");
    }
}

/// Every message `e` delivered, with its sender.
fn delivered(e: &mut Engine) -> Vec<(PeerId, Vec<u8>)> {
    let mut got = Vec::new();
    while let Some(ev) = e.poll_event() {
        if let Event::Delivered { peer, msg } = ev {
            got.push((peer, msg));
        }
    }
    got
}

#[test]
fn a_process_in_two_jobs_is_two_peers_and_each_jobs_messages_stay_its_own() {
    let t = Instant::ZERO;
    // 0 serves A (sealed) and B (a key in clear); 1 is of A only, 2 of B
    // only; 3 serves both, like 0; 4 is of job C, which 0 does not serve.
    let mut net = Net {
        nodes: vec![
            engine(10, &[job_a(), job_b()]),
            engine(11, &[job_a()]),
            engine(12, &[job_b()]),
            engine(13, &[job_b(), job_a()]),
            engine(14, &[JobConfig { job_key: 0, auth: Some(auth(SECRET_C)) }]),
        ],
        wire: Vec::new(),
    };
    let (a, b) = (JobIdx(0), JobIdx(1));
    // Node 3 lists its jobs the other way round: jobs are told apart by
    // their keys, not by their places.
    let (a3, b3) = (JobIdx(1), JobIdx(0));
    let p = net.nodes[1].peer(addr(0));
    net.nodes[1].send(t, p, &[b"from 1 in A"], 1).unwrap();
    let p = net.nodes[2].peer(addr(0));
    net.nodes[2].send(t, p, &[b"from 2 in B"], 2).unwrap();
    let pa = net.nodes[3].peer_in(addr(0), a3);
    let pb = net.nodes[3].peer_in(addr(0), b3);
    assert_ne!(pa, pb);
    net.nodes[3].send(t, pa, &[b"from 3 in A"], 3).unwrap();
    net.nodes[3].send(t, pb, &[b"from 3 in B"], 4).unwrap();
    let p = net.nodes[4].peer(addr(0));
    net.nodes[4].send(t, p, &[b"from 4 in C"], 5).unwrap();
    net.pump(t);

    let m = &mut net.nodes[0];
    let mut got: Vec<(DevAddr, JobIdx, Vec<u8>)> =
        delivered(m).into_iter().map(|(p, msg)| (m.peer_addr(p), m.peer_job(p), msg)).collect();
    got.sort();
    let want = |i: u32, j: JobIdx, s: &[u8]| (addr(i), j, s.to_vec());
    assert_eq!(
        got,
        vec![
            want(1, a, b"from 1 in A"),
            want(2, b, b"from 2 in B"),
            want(3, a, b"from 3 in A"),
            want(3, b, b"from 3 in B")
        ]
    );
    // Node 3 is two peers of node 0, one per job.
    let p3a = m.peer_id_in(addr(3), a).unwrap();
    let p3b = m.peer_id_in(addr(3), b).unwrap();
    assert_ne!(p3a, p3b);
    // Job C's datagram was dropped before any state was made for its sender.
    assert!(m.stats().dropped_job_key >= 1);
    assert_eq!(m.peer_id_in(addr(4), a), None);
    assert_eq!(m.peer_id_in(addr(4), b), None);
    assert!(m.job_counters(a).received >= 2 && m.job_counters(b).received >= 2);
    assert_eq!(m.job_counters(a).dropped_auth, 0);
    assert!(m.job_sealed(a) && !m.job_sealed(b));

    // And back: node 0 answers node 3 in each job; node 3 gets each from
    // the peer of that job.
    net.nodes[0].send(t, p3a, &[b"to 3 in A"], 6).unwrap();
    net.nodes[0].send(t, p3b, &[b"to 3 in B"], 7).unwrap();
    net.pump(t);
    let d = &mut net.nodes[3];
    let mut got: Vec<(JobIdx, Vec<u8>)> = delivered(d).into_iter().map(|(p, msg)| (d.peer_job(p), msg)).collect();
    got.sort();
    assert_eq!(got, vec![(b3, b"to 3 in B".to_vec()), (a3, b"to 3 in A".to_vec())]);
    // Job A went sealed, job B in clear, each with its own key.
    let a_id = JobSecret::new(SECRET_A).unwrap().job_id();
    for (from, to, d) in &net.wire {
        let (h, _) = rdm::engine::Header::decode(d).unwrap();
        if *from == 1 || *to == 1 {
            assert_eq!(h.job_key, a_id);
        }
        if *from == 2 || *to == 2 {
            assert_eq!(h.job_key, KEY_B);
        }
        if *from != 4 {
            assert_eq!(h.sealed != rdm::engine::Sealed::No, h.job_key == a_id, "only job A's datagrams are sealed");
        }
    }
}

#[test]
fn a_datagram_claiming_a_sealed_job_without_its_tag_is_refused_and_counted_against_it() {
    let t = Instant::ZERO;
    let mut net = Net {
        nodes: vec![engine(10, &[job_a(), job_b()]), engine(11, &[job_a()]), engine(12, &[job_b()])],
        wire: vec![],
    };
    let p = net.nodes[1].peer(addr(0));
    net.nodes[1].send(t, p, &[b"genuine"], 1).unwrap();
    let p = net.nodes[2].peer(addr(0));
    net.nodes[2].send(t, p, &[b"job B"], 2).unwrap();
    net.pump(t);
    let got = delivered(&mut net.nodes[0]);
    assert_eq!(got.len(), 2);
    let a = JobIdx(0);
    let before = net.nodes[0].job_counters(a);
    let a_id = JobSecret::new(SECRET_A).unwrap().job_id();
    // A member of job B (node 2) knows job A's id (it is in clear) but not
    // its secret: it alters a genuine job A datagram, and relabels one of
    // its own job B datagrams as job A (unsealed, with a valid checksum).
    let genuine = net.wire.iter().find(|(f, _, _)| *f == 1).unwrap().2.clone();
    let mut altered = genuine.clone();
    let n = altered.len();
    altered[n - 30] ^= 1;
    let own = net.wire.iter().find(|(f, _, _)| *f == 2).unwrap().2.clone();
    let (mut h, payload) = rdm::engine::Header::decode(&own).unwrap();
    h.job_key = a_id;
    let mut relabelled = vec![0u8; own.len() + 64];
    let len = h.encode(payload, &mut relabelled);
    relabelled.truncate(len);
    let m = &mut net.nodes[0];
    m.handle_datagram(t, addr(2), &altered);
    m.handle_datagram(t, addr(2), &relabelled);
    assert!(delivered(m).is_empty());
    assert_eq!(m.job_counters(a).dropped_auth, before.dropped_auth + 2);
    assert_eq!(m.job_counters(JobIdx(1)).dropped_auth, 0);
    // No peer of job A was made for node 2's address.
    assert_eq!(m.peer_id_in(addr(2), a), None);
}

mod model {
    //! The engine's peer table against a map of (address, job) to id, over
    //! generated sequences of lookups and creations.
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Clone, Debug)]
    enum Op {
        /// `peer_in` (creates), or `peer_id_in` (only looks).
        Peer { addr: u32, job: u8, create: bool },
        /// `peer` (the first job).
        First { addr: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..6, 0u8..4, any::<bool>()).prop_map(|(addr, job, create)| Op::Peer { addr, job, create }),
            (0u32..6).prop_map(|addr| Op::First { addr }),
        ]
    }

    proptest! {
        #[test]
        fn peers_are_keyed_by_address_and_job(jobs in 1usize..4, ops in proptest::collection::vec(op(), 1..200)) {
            let configs: Vec<JobConfig> =
                (0..jobs).map(|j| JobConfig { job_key: 100 + j as u64, auth: None }).collect();
            let mut e = engine(1, &configs);
            let mut model: HashMap<(u32, u8), PeerId> = HashMap::new();
            for op in ops {
                let (addr, job, create) = match op {
                    Op::Peer { addr, job, create } => (addr, job, create),
                    Op::First { addr } => (addr, 0, true),
                };
                // A job the engine does not serve counts as the first.
                let served = if (job as usize) < jobs { job } else { 0 };
                let got = match (op, create) {
                    (Op::First { .. }, _) => Some(e.peer(rdm::simnet::addr(addr))),
                    (_, true) => Some(e.peer_in(rdm::simnet::addr(addr), JobIdx(job))),
                    (_, false) => e.peer_id_in(rdm::simnet::addr(addr), JobIdx(served)),
                };
                let want = if create {
                    let n = model.len() as u32;
                    Some(*model.entry((addr, served)).or_insert(PeerId::from_index(n)))
                } else {
                    model.get(&(addr, served)).copied()
                };
                prop_assert_eq!(got, want);
            }
            for (&(addr, job), &id) in &model {
                prop_assert_eq!(e.peer_addr(id), rdm::simnet::addr(addr));
                prop_assert_eq!(e.peer_job(id), JobIdx(job));
                prop_assert!(e.peers_at(rdm::simnet::addr(addr)).any(|p| p == id));
            }
        }
    }
}
