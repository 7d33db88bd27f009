//! Two rdm engines of a job with a secret (`rdm/PROTOCOL.md` §2.5) over a
//! network the fuzzer controls and an attacker who sees every datagram.
//!
//! A (`Sim(0)`) sends numbered messages to B (`Sim(1)`). The fuzzer delivers,
//! drops, duplicates, reorders, alters and truncates their datagrams; replays
//! any datagram ever sent (to B, from A's address or another one, also after B
//! restarted); and forges packets of every field value with the job's id,
//! sealed with made-up tags, from anywhere, A's own address included. Checked
//! after every step, with no exception for spoofed sources (the tag is the
//! authentication):
//!
//! * nothing panics;
//! * every message B delivers is one A sent, intact, in the order A sent
//!   them (per incarnation of B), and none twice;
//! * A reports a send complete only if some incarnation of B delivered it;
//! * every datagram handed to B that is not a genuine, first-seen one from A
//!   leaves B's delivered messages unchanged.
//!
//! B also serves a second job, C, whose key travels in clear (an endpoint of
//! several jobs, `FI_AV_AUTH_KEY`): the fuzzer forges job C packets too,
//! from A's address or anywhere, which B may deliver, but only as job C's
//! (its peer of job C at that address, never A's), and which never disturb
//! A's stream.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdm::engine::{
    Engine, EngineConfig, Event, Header, Hello, JobAuth, JobConfig, JobIdx, JobSecret, PacketType, Psn, Sealed,
    TRAILER_LEN,
};
use rdm::{DevAddr, Instant};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

const MTU: usize = 300;
/// The second job B serves, with its key in clear.
const JOB_C: u64 = 0xC0FF_EE00_0000_00C0;

#[derive(Arbitrary, Debug)]
struct Forged {
    ptype: u8,
    first: bool,
    last: bool,
    src_inc: u64,
    /// Name B's current incarnation (else `dst_inc`).
    names_b: bool,
    dst_inc: u64,
    psn_or_window: u32,
    ack: u32,
    sack: u64,
    encrypted: bool,
    /// 1: a challenge, 2: an echo (ACKs only), else neither.
    hello: u8,
    payload: Vec<u8>,
    tag: [u8; 16],
    counter: u64,
    /// Job C's key, unsealed with a valid checksum (C's key is in clear).
    job_c: bool,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Send {
        len: u16,
    },
    Deliver {
        pick: u16,
    },
    DeliverAll,
    Drop {
        pick: u16,
    },
    Swap {
        a: u16,
        b: u16,
    },
    Alter {
        pick: u16,
        at: u16,
        xor: u8,
    },
    Truncate {
        pick: u16,
        len: u16,
    },
    /// Any datagram ever sent from A, to B again, from A's address or from a
    /// stranger's.
    Replay {
        pick: u16,
        elsewhere: bool,
    },
    Forge {
        spoof_a: bool,
        f: Forged,
    },
    Raw {
        bytes: Vec<u8>,
    },
    Advance {
        micros: u32,
    },
    RestartB,
}

fn addr(i: u32) -> DevAddr {
    rdm::simnet::addr(i)
}

fn message(id: u64, len: usize) -> Vec<u8> {
    let mut m: Vec<u8> = (0..len.max(8)).map(|i| (i as u64).wrapping_mul(31).wrapping_add(id) as u8).collect();
    m[..8].copy_from_slice(&id.to_le_bytes());
    m
}

struct World {
    now: Instant,
    a: Engine,
    b: Engine,
    b_inc: u64,
    /// In flight: (to B?, bytes).
    net: Vec<(bool, Vec<u8>)>,
    /// Every datagram A ever sent.
    from_a: Vec<Vec<u8>>,
    sent: HashMap<u64, usize>,
    next_id: u64,
    /// Delivered by any incarnation of B; the last id delivered by the current one.
    delivered: HashSet<u64>,
    last: Option<u64>,
}

impl World {
    fn engine(inc: u64, other_jobs: Vec<JobConfig>) -> Engine {
        let secret = JobSecret::new(b"the fuzzed job's secret").unwrap();
        let auth = Some(Arc::new(JobAuth { secret, encrypt: inc % 2 == 1 }));
        Engine::new(EngineConfig { mtu: MTU, incarnation: inc, auth, other_jobs, ..EngineConfig::default() })
    }

    /// B: the job's engine that also serves job C.
    fn engine_b(inc: u64) -> Engine {
        World::engine(inc, vec![JobConfig { job_key: JOB_C, auth: None }])
    }

    fn flush(&mut self) {
        let mut buf = vec![0u8; 70_000];
        while let Some(x) = self.a.poll_transmit(self.now, &mut buf) {
            for d in buf[..x.len].chunks(x.seg) {
                self.from_a.push(d.to_vec());
                self.net.push((true, d.to_vec()));
            }
        }
        while let Some(x) = self.b.poll_transmit(self.now, &mut buf) {
            for d in buf[..x.len].chunks(x.seg) {
                self.net.push((false, d.to_vec()));
            }
        }
    }

    fn to_b(&mut self, from: DevAddr, d: &[u8]) {
        self.b.handle_datagram(self.now, from, d);
        self.check_b();
    }

    fn check_b(&mut self) {
        while let Some(ev) = self.b.poll_event() {
            if let Event::Delivered { msg, peer } = ev {
                if self.b.peer_job(peer) != JobIdx::FIRST {
                    // Job C's, from whoever knows its key: never A's.
                    assert_eq!(self.b.peer_job(peer), JobIdx(1));
                    continue;
                }
                assert!(msg.len() >= 8, "a message A never sent: {msg:?}");
                let id = u64::from_le_bytes(msg[..8].try_into().unwrap());
                let len = *self.sent.get(&id).unwrap_or_else(|| panic!("B delivered id {id}, never sent"));
                assert_eq!(msg, message(id, len), "message {id} altered");
                assert!(self.delivered.insert(id), "message {id} delivered twice");
                assert!(self.last.is_none_or(|l| id > l), "message {id} after {:?}: out of order", self.last);
                self.last = Some(id);
            }
        }
    }

    fn check_a(&mut self) {
        while let Some(ev) = self.a.poll_event() {
            if let Event::SendComplete { token } = ev {
                assert!(self.delivered.contains(&token), "send {token} complete, never delivered");
            }
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut w = World {
        now: Instant::ZERO,
        a: World::engine(0xA1, Vec::new()),
        b: World::engine_b(0xB2),
        b_inc: 0xB2,
        net: Vec::new(),
        from_a: Vec::new(),
        sent: HashMap::new(),
        next_id: 1,
        delivered: HashSet::new(),
        last: None,
    };
    let pb = w.a.peer(addr(1));
    let job = JobSecret::new(b"the fuzzed job's secret").unwrap().job_id();
    for op in ops.into_iter().take(300) {
        let pick = |n: usize, p: u16| (n > 0).then(|| p as usize % n);
        match op {
            Op::Send { len } => {
                let id = w.next_id;
                let len = 8 + len as usize % 2000;
                if w.a.send(w.now, pb, &[&message(id, len)], id).is_ok() {
                    w.sent.insert(id, len);
                    w.next_id += 1;
                }
            }
            Op::Deliver { pick: p } | Op::Alter { pick: p, .. } | Op::Truncate { pick: p, .. } => {
                let Some(i) = pick(w.net.len(), p) else { continue };
                let (to_b, mut d) = w.net.remove(i);
                match op {
                    Op::Alter { at, xor, .. } if !d.is_empty() => {
                        let at = at as usize % d.len();
                        d[at] ^= xor.max(1);
                    }
                    Op::Truncate { len, .. } => d.truncate(len as usize % (d.len() + 1)),
                    _ => {}
                }
                if to_b {
                    w.to_b(addr(0), &d);
                } else {
                    w.a.handle_datagram(w.now, addr(1), &d);
                }
            }
            Op::DeliverAll => {
                for (to_b, d) in std::mem::take(&mut w.net) {
                    if to_b {
                        w.to_b(addr(0), &d);
                    } else {
                        w.a.handle_datagram(w.now, addr(1), &d);
                    }
                }
            }
            Op::Drop { pick: p } => {
                if let Some(i) = pick(w.net.len(), p) {
                    w.net.remove(i);
                }
            }
            Op::Swap { a, b } => {
                if let (Some(i), Some(j)) = (pick(w.net.len(), a), pick(w.net.len(), b)) {
                    w.net.swap(i, j);
                }
            }
            Op::Replay { pick: p, elsewhere } => {
                let Some(i) = pick(w.from_a.len(), p) else { continue };
                let d = w.from_a[i].clone();
                w.to_b(if elsewhere { addr(7) } else { addr(0) }, &d);
            }
            Op::Forge { spoof_a, f } => {
                let h = Header {
                    ptype: PacketType::from_wire(f.ptype % 5).unwrap_or(PacketType::Data),
                    first: f.first,
                    last: f.last,
                    job_key: if f.job_c { JOB_C } else { job },
                    src_inc: f.src_inc,
                    dst_inc: if f.names_b { w.b_inc } else { f.dst_inc },
                    psn_or_window: f.psn_or_window,
                    ack: Psn(f.ack),
                    sack: f.sack,
                    header_sum: false,
                    unsummed: false,
                    sealed: match (f.job_c, f.encrypted) {
                        (true, _) => Sealed::No,
                        (false, true) => Sealed::Encrypted,
                        (false, false) => Sealed::Tagged,
                    },
                    hello: match f.hello {
                        1 => Hello::Challenge,
                        2 => Hello::Echo,
                        _ => Hello::None,
                    },
                };
                let payload = &f.payload[..f.payload.len().min(MTU)];
                let mut b = vec![0u8; 48 + payload.len() + TRAILER_LEN];
                let n = h.encode(payload, &mut b);
                if f.job_c {
                    b.truncate(n);
                } else {
                    b[n..n + 8].copy_from_slice(&f.counter.to_le_bytes());
                    b[n + 8..n + 24].copy_from_slice(&f.tag);
                }
                let before = w.delivered.len();
                w.to_b(if spoof_a { addr(0) } else { addr(9) }, &b);
                assert_eq!(w.delivered.len(), before, "a forged packet delivered something");
            }
            Op::Raw { bytes } => {
                let before = w.delivered.len();
                w.to_b(addr(0), &bytes);
                assert_eq!(w.delivered.len(), before, "raw bytes delivered something");
            }
            Op::Advance { micros } => {
                w.now = w.now + Duration::from_micros(micros as u64 % 100_000);
                w.a.handle_timeout(w.now);
                w.b.handle_timeout(w.now);
            }
            Op::RestartB => {
                w.b_inc += 2;
                w.b = World::engine_b(w.b_inc);
                w.last = None;
                w.net.retain(|(to_b, _)| !to_b);
            }
        }
        w.flush();
        w.check_b();
        w.check_a();
    }
});
