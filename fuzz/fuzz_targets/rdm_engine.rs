//! The rdm engine fed arbitrary datagram sequences, with time advancing.
//!
//! Two honest engines, A (`Sim(0)`) and B (`Sim(1)`), exchange numbered
//! messages over a network the fuzzer controls (it delivers, drops, duplicates,
//! reorders, corrupts and truncates their datagrams) while strangers (`Sim(2..)`)
//! and spoofers (B's or A's own address) throw raw bytes and well-formed,
//! correctly checksummed packets of any field values at both. Checked after
//! every step:
//!
//! * nothing panics;
//! * every datagram handed in is counted exactly once: accepted, or dropped as
//!   malformed / bad checksum / foreign job;
//! * `delivered_msgs` and `received_datagrams` count exactly the events given;
//! * every event names a peer the engine was told about or heard from;
//! * each send token resolves (complete or failed) at most once, and only
//!   tokens that were sent;
//! * unless a forged packet with the right job key came from the honest peer's
//!   own address (no authentication can tell that apart): messages from the
//!   honest peer arrive intact, in order, at most once, and a send reported
//!   complete was delivered;
//! * at the end, on a clean network, every send resolves.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdm::engine::{DecodeError, Engine, EngineConfig, Event, Header, Hello, PacketType, PeerId, Psn, Sealed, Stats};
use rdm::{DevAddr, Instant};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

const JOB: u64 = 0x5eed_1234_abcd_0001;
const INC: [u64; 2] = [0x1111, 0x2222];
const MTU: usize = 200;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Who {
    Stranger(u8),
    /// The other honest engine's address.
    Spoof,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Inc {
    Zero,
    Sender,
    Receiver,
    Other(u64),
}

#[derive(Arbitrary, Debug)]
struct Forged {
    ptype: u8,
    first: bool,
    last: bool,
    right_job: bool,
    job: u64,
    src_inc: Inc,
    dst_inc: Inc,
    psn_or_window: u32,
    ack: u32,
    sack: u64,
    /// A header-only checksum (DATA): the simulated paths do not register,
    /// so the engine must drop it.
    header_sum: bool,
    /// Claims to need no checksum (only a shared-memory ring may: these
    /// come from simulator addresses, so they must be dropped).
    unsummed: bool,
    payload: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Send { to_b: bool, len: u16 },
    SendDatagram { to_b: bool, len: u8 },
    Deliver { pick: u16 },
    DeliverAll,
    Drop { pick: u16 },
    Duplicate { pick: u16 },
    Swap { a: u16, b: u16 },
    Corrupt { pick: u16, at: u16, xor: u8 },
    Truncate { pick: u16, len: u16 },
    Raw { to_b: bool, from: Who, bytes: Vec<u8> },
    Forge { to_b: bool, from: Who, f: Forged },
    Advance { micros: u32 },
    Pause { b: bool, paused: bool },
    Unreachable { b: bool, from: Who },
    ExpectIncarnation { b: bool, inc: u64 },
    FlushAcks { b: bool },
}

struct Side {
    e: Engine,
    me: DevAddr,
    other: DevAddr,
    /// Addresses this engine was told about or heard from.
    known: HashSet<DevAddr>,
    /// Datagrams handed to `handle_datagram`, and those of them the decoder
    /// refuses for something other than the checksum (`dropped_malformed` also
    /// counts protocol violations inside accepted packets).
    fed: u64,
    undecodable: u64,
    /// Sends reported complete since the last check: (token, message id).
    completed: Vec<u64>,
    delivered: u64,
    datagrams: u64,
    /// Token -> message id, for sends not yet resolved.
    outstanding: HashMap<u64, u64>,
    resolved: HashSet<u64>,
    next_token: u64,
    /// Ids of messages from the honest peer delivered here.
    got: HashSet<u64>,
    last_got: Option<u64>,
    last_stats: Stats,
}

/// `RDMX_FUZZ_TRACE=1` prints every datagram and event (to read a crash).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("RDMX_FUZZ_TRACE").is_some())
}

fn addr(who: Who, honest: DevAddr) -> DevAddr {
    match who {
        Who::Stranger(n) => rdm::simnet::addr(2 + (n % 4) as u32),
        Who::Spoof => honest,
    }
}

/// Message `id` of `len` bytes: the id, then a pattern of it.
fn message(id: u64, len: usize) -> Vec<u8> {
    let len = len.max(8);
    let mut m = id.to_le_bytes().to_vec();
    m.extend((8..len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(id) as u8));
    m
}

impl Side {
    fn new(i: usize) -> Side {
        let cfg = EngineConfig {
            mtu: MTU,
            job_key: JOB,
            incarnation: INC[i],
            peer_timeout: Duration::from_millis(300),
            max_window: 64,
            max_queued_bytes: 16 << 10,
            ..EngineConfig::default()
        };
        let mut e = Engine::new(cfg);
        let me = rdm::simnet::addr(i as u32);
        let other = rdm::simnet::addr(1 - i as u32);
        e.peer(other);
        Side {
            e,
            me,
            other,
            known: [other].into_iter().collect(),
            fed: 0,
            undecodable: 0,
            completed: Vec::new(),
            delivered: 0,
            datagrams: 0,
            outstanding: HashMap::new(),
            resolved: HashSet::new(),
            next_token: 1,
            got: HashSet::new(),
            last_got: None,
            last_stats: Stats::default(),
        }
    }

    fn feed(&mut self, now: Instant, from: DevAddr, bytes: &[u8]) {
        if trace() {
            eprintln!("{:?} <- {:?} {:?} len {}", self.me, from, Header::decode(bytes).map(|h| h.0), bytes.len());
        }
        self.known.insert(from);
        self.fed += 1;
        if Header::decode(bytes).is_err_and(|e| e != DecodeError::Checksum) {
            self.undecodable += 1;
        }
        self.e.handle_datagram(now, from, bytes);
    }

    fn peer_ok(&self, p: PeerId) -> bool {
        let a = self.e.peer_addr(p);
        self.known.contains(&a) && self.e.peer_id_of(a) == Some(p)
    }

    /// Drains events and checks them and the counters.
    fn drain(&mut self, tainted: bool, sent_by_peer: &HashSet<u64>) {
        while let Some(ev) = self.e.poll_event() {
            if trace() {
                eprintln!(
                    "{:?} event {:?}",
                    self.me,
                    match &ev {
                        Event::Delivered { peer, msg } => format!("Delivered {peer:?} id {:?}", &msg[..8]),
                        e => format!("{e:?}"),
                    }
                );
            }
            match ev {
                Event::Delivered { peer, msg } => {
                    assert!(self.peer_ok(peer), "delivery from a peer never named: {peer:?}");
                    self.delivered += 1;
                    if !tainted && self.e.peer_addr(peer) == self.other {
                        assert!(msg.len() >= 8, "a message from the honest peer lost its id");
                        let id = u64::from_le_bytes(msg[..8].try_into().unwrap());
                        assert!(sent_by_peer.contains(&id), "message {id} was never sent");
                        assert_eq!(msg, message(id, msg.len()), "message {id} corrupted");
                        assert!(
                            self.last_got.is_none_or(|l| id > l),
                            "message {id} after {:?}: out of order or twice",
                            self.last_got
                        );
                        self.last_got = Some(id);
                        self.got.insert(id);
                    }
                    self.e.recycle(msg);
                }
                Event::Datagram { peer, msg } => {
                    assert!(self.peer_ok(peer), "datagram from a peer never named: {peer:?}");
                    self.datagrams += 1;
                    self.e.recycle(msg);
                }
                Event::SendComplete { token } | Event::SendFailed { token, .. } => {
                    assert!(!self.resolved.contains(&token), "token {token} resolved twice");
                    let id = self.outstanding.remove(&token);
                    assert!(id.is_some(), "token {token} never sent");
                    if matches!(ev, Event::SendComplete { .. }) {
                        self.completed.extend(id.filter(|&id| id != u64::MAX));
                    }
                    self.resolved.insert(token);
                }
                Event::PeerUnreachable { peer } | Event::PeerRestarted { peer } => {
                    assert!(self.peer_ok(peer), "event for a peer never named: {peer:?}");
                }
            }
        }
        let s = *self.e.stats();
        assert_eq!(
            s.received + self.undecodable + s.dropped_checksum + s.dropped_job_key + s.received_datagrams,
            self.fed,
            "every datagram handed in is counted once: {s:?}"
        );
        assert_eq!(s.delivered_msgs, self.delivered);
        assert_eq!(s.received_datagrams, self.datagrams);
        let l = self.last_stats;
        assert!(
            s.dropped_checksum >= l.dropped_checksum
                && s.dropped_job_key >= l.dropped_job_key
                && s.received >= l.received
        );
        self.last_stats = s;
    }
}

struct Net {
    sides: [Side; 2],
    /// In flight: (to B, bytes).
    wire: Vec<(bool, Vec<u8>)>,
    now: Instant,
    /// A forged packet with the right job key came from an honest address.
    tainted: bool,
    sent: [HashSet<u64>; 2],
    next_id: u64,
    buf: Vec<u8>,
}

impl Net {
    /// A hostile datagram. One with the right job key from an honest address
    /// is indistinguishable from the honest peer: end-to-end checks stop.
    fn feed(&mut self, to_b: bool, from: DevAddr, bytes: &[u8]) {
        let i = to_b as usize;
        if (from == self.sides[i].other || from == self.sides[i].me)
            && Header::decode(bytes).is_ok_and(|(h, _)| h.job_key == JOB)
        {
            self.tainted = true;
        }
        let now = self.now;
        self.sides[i].feed(now, from, bytes);
    }

    fn deliver(&mut self, k: usize) {
        let (to_b, bytes) = self.wire.remove(k);
        let from = self.sides[!to_b as usize].me;
        let now = self.now;
        self.sides[to_b as usize].feed(now, from, &bytes);
    }

    fn step(&mut self) {
        for i in 0..2 {
            if self.sides[i].e.poll_timeout().is_some_and(|t| t <= self.now) {
                self.sides[i].e.handle_timeout(self.now);
            }
            while let Some(t) = self.sides[i].e.poll_transmit(self.now, &mut self.buf) {
                assert!(t.len <= self.buf.len() && t.seg > 0);
                assert!(self.sides[i].known.contains(&t.dst), "a datagram to an address never named: {:?}", t.dst);
                if t.dst != self.sides[i].other {
                    // Answers to strangers are lost.
                    continue;
                }
                for d in self.buf[..t.len].chunks(t.seg) {
                    assert!(d.len() <= MTU);
                    if self.wire.len() < 2048 {
                        self.wire.push((i == 0, d.to_vec()));
                    }
                }
            }
        }
        for i in 0..2 {
            let tainted = self.tainted;
            let peer_sent = self.sent[1 - i].clone();
            self.sides[i].drain(tainted, &peer_sent);
        }
        for i in 0..2 {
            for id in std::mem::take(&mut self.sides[i].completed) {
                assert!(
                    self.tainted || self.sides[1 - i].got.contains(&id),
                    "message {id} reported complete, never delivered"
                );
            }
        }
    }

    fn run(&mut self, op: Op) {
        let n = self.wire.len();
        match op {
            Op::Send { to_b, len } => {
                let i = !to_b as usize;
                let id = self.next_id;
                self.next_id += 1;
                let m = message(id, (len % 4096) as usize);
                let token = self.sides[i].next_token;
                let peer = self.sides[i].e.peer(self.sides[i].other);
                if self.sides[i].e.send(self.now, peer, &[&m], token).is_ok() {
                    self.sides[i].next_token += 1;
                    self.sides[i].outstanding.insert(token, id);
                    self.sent[i].insert(id);
                }
            }
            Op::SendDatagram { to_b, len } => {
                let i = !to_b as usize;
                let token = self.sides[i].next_token;
                let peer = self.sides[i].e.peer(self.sides[i].other);
                let m = vec![0xAB; len as usize];
                if self.sides[i].e.send_datagram(peer, &[&m], token).is_ok() {
                    self.sides[i].next_token += 1;
                    self.sides[i].outstanding.insert(token, u64::MAX);
                }
            }
            Op::Deliver { pick } if n > 0 => self.deliver(pick as usize % n),
            Op::DeliverAll => {
                while !self.wire.is_empty() {
                    self.deliver(0);
                }
            }
            Op::Drop { pick } if n > 0 => {
                self.wire.remove(pick as usize % n);
            }
            Op::Duplicate { pick } if n > 0 && n < 2048 => {
                let d = self.wire[pick as usize % n].clone();
                self.wire.push(d);
            }
            Op::Swap { a, b } if n > 0 => self.wire.swap(a as usize % n, b as usize % n),
            Op::Corrupt { pick, at, xor } if n > 0 => {
                let d = &mut self.wire[pick as usize % n].1;
                if !d.is_empty() {
                    let k = at as usize % d.len();
                    d[k] ^= xor;
                    // A corruption the checksum cannot see (CRC-32 misses some
                    // patterns) is out of scope: the datagram is lost instead.
                    if xor != 0 && Header::decode(d).is_ok() {
                        self.wire.remove(pick as usize % n);
                    }
                }
            }
            Op::Truncate { pick, len } if n > 0 => {
                let d = &mut self.wire[pick as usize % n].1;
                d.truncate(len as usize % (d.len() + 1));
                if Header::decode(d).is_ok() {
                    // Cut to exactly a header of a valid empty packet: also a
                    // change the checksum would not see. Lose it.
                    self.wire.remove(pick as usize % n);
                }
            }
            Op::Raw { to_b, from, bytes } => {
                let from = addr(from, self.sides[to_b as usize].other);
                self.feed(to_b, from, &bytes);
            }
            Op::Forge { to_b, from, f } => {
                let i = to_b as usize;
                let from = addr(from, self.sides[i].other);
                let inc = |x: Inc| match x {
                    Inc::Zero => 0,
                    Inc::Sender => INC[1 - i],
                    Inc::Receiver => INC[i],
                    Inc::Other(v) => v,
                };
                let ptype = PacketType::ALL[f.ptype as usize % PacketType::ALL.len()];
                let h = Header {
                    ptype,
                    first: f.first && ptype.has_fragments(),
                    last: f.last && ptype.has_fragments(),
                    job_key: if f.right_job { JOB } else { f.job },
                    src_inc: inc(f.src_inc),
                    dst_inc: inc(f.dst_inc),
                    psn_or_window: f.psn_or_window,
                    ack: Psn(f.ack),
                    sack: f.sack,
                    header_sum: f.header_sum && ptype == PacketType::Data,
                    unsummed: f.unsummed,
                    sealed: Sealed::No,
                    hello: Hello::None,
                };
                let payload = &f.payload[..f.payload.len().min(MTU - rdm::engine::HEADER_LEN)];
                let mut b = vec![0u8; rdm::engine::HEADER_LEN + payload.len()];
                h.encode(payload, &mut b);
                self.feed(to_b, from, &b);
            }
            Op::Advance { micros } => self.now = self.now + Duration::from_micros((micros % 2_000_000) as u64),
            Op::Pause { b, paused } => self.sides[b as usize].e.set_paused(paused),
            Op::Unreachable { b, from } => {
                let a = addr(from, self.sides[b as usize].other);
                self.sides[b as usize].e.handle_unreachable(a);
            }
            Op::ExpectIncarnation { b, inc } => {
                let s = &mut self.sides[b as usize];
                let p = s.e.peer(s.other);
                s.e.expect_incarnation(p, inc);
            }
            Op::FlushAcks { b } => self.sides[b as usize].e.flush_acks(),
            _ => {}
        }
        self.step();
    }

    /// A clean network until every send resolves: all datagrams delivered, time
    /// moving to the next deadline.
    fn settle(&mut self) {
        for s in &mut self.sides {
            s.e.set_paused(false);
        }
        self.step();
        for _ in 0..20_000 {
            while !self.wire.is_empty() {
                self.deliver(0);
                self.step();
            }
            if self.sides.iter().all(|s| s.outstanding.is_empty()) {
                return;
            }
            let next = self.sides.iter_mut().filter_map(|s| s.e.next_timeout()).min();
            match next {
                Some(t) => self.now = t.max(self.now + Duration::from_micros(1)),
                None => break,
            }
            self.step();
        }
        // A forged packet from the honest peer's address can make an engine
        // believe its peer restarted while the peer kept its state: the two
        // then disagree on sequence numbers and, as each answers the other,
        // neither times out. No liveness is promised against such a forger.
        if self.tainted {
            return;
        }
        for (i, s) in self.sides.iter().enumerate() {
            assert!(s.outstanding.is_empty(), "side {i}: sends never resolved on a clean network: {:?}", s.outstanding);
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut net = Net {
        sides: [Side::new(0), Side::new(1)],
        wire: Vec::new(),
        now: Instant::from_nanos(1_000_000),
        tainted: false,
        sent: [HashSet::new(), HashSet::new()],
        next_id: 1,
        buf: vec![0u8; 65536],
    };
    for op in ops.into_iter().take(400) {
        net.run(op);
    }
    net.settle();
});
