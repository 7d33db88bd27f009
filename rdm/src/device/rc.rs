//! Lazily connected reliable queues for remote reads: which peers have one,
//! the handshake that sets one up, and the bound on how many are kept.
//!
//! A datagram queue (verbs UD) reaches every peer but cannot read remote
//! memory; a reliable connected queue pair (verbs RC) can, but costs memory
//! per peer and a handshake. So rdmx connects only where bulk data flows: the
//! first time an endpoint would read a peer's memory it creates a queue,
//! sends a [`ConnMsg::Request`] with the queue's number, first PSN and port
//! address, and pushes that message by windows meanwhile (nothing waits on a
//! handshake). The peer creates its own queue, connects it to ours and
//! answers [`ConnMsg::Accept`] (or [`ConnMsg::Reject`] when it keeps too many
//! already); our queue connects on the answer and later reads go through it.
//!
//! The handshake travels as opaque bytes ([`ConnMsg::encode`]) over rdmx's
//! reliable, per-peer ordered stream (the message engine carries them for the
//! device: [`super::RemoteReads::poll_control`] / [`super::RemoteReads::handle_control`]),
//! so it is never lost or reordered: no timer or retry lives here, and a
//! [`ConnMsg::Close`] always arrives before a later request of the same peer.
//!
//! Connections are directed: the reader owns its *active* end (it posts the
//! reads and closes it), the peer keeps a *passive* end that only answers
//! reads. Both sets are bounded by `max` (`FI_RDMX_RC_MAX_PEERS`): at the
//! bound the reader closes its least recently used idle connection (a
//! [`ConnMsg::Close`] tells the peer to free its end), and a peer with `max`
//! passive ends refuses new requests (the reader then pushes, and asks again
//! after a back-off). A connection idle for `idle` is closed too.
//!
//! The table is sans-IO: it owns queue handles of type `Q` and calls a
//! [`QueueFactory`] to make, connect and retire them; time comes in as an
//! argument. The verbs device plugs in real RC queue pairs, the simulator a
//! model ([`crate::simnet`]).
#![forbid(unsafe_code)]

use super::{DevAddr, DeviceError};
use crate::time::Instant;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::Duration;

/// One end of a connection, as the other end must know it: the queue's
/// number and first packet sequence number, and the port's address (GID and,
/// on InfiniBand, LID) and MTU (an `ibv_mtu` value: both ends use the
/// smaller).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueInfo {
    pub qpn: u32,
    pub psn: u32,
    pub gid: [u8; 16],
    pub lid: u16,
    pub mtu: u8,
}

/// The handshake's messages (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnMsg {
    /// "I would read your memory: connect to this queue."
    Request { conn: u64, queue: QueueInfo },
    /// "Connected: here is my end."
    Accept { conn: u64, queue: QueueInfo },
    /// "I keep too many connections (or could not make one): push instead."
    Reject { conn: u64 },
    /// "I closed my end of `conn`: free yours."
    Close { conn: u64 },
}

/// Bytes of an encoded [`ConnMsg`].
pub const CONN_MSG_LEN: usize = 40;
/// First byte of every encoded [`ConnMsg`] (so that other control bytes a
/// device might send one day are told apart).
const MAGIC: u8 = b'C';

mod field {
    use core::ops::Range;
    pub const MAGIC: usize = 0;
    pub const KIND: usize = 1;
    pub const RESERVED: Range<usize> = 2..4;
    pub const CONN: Range<usize> = 4..12;
    pub const QPN: Range<usize> = 12..16;
    pub const PSN: Range<usize> = 16..20;
    pub const LID: Range<usize> = 20..22;
    pub const MTU: usize = 22;
    pub const RESERVED2: usize = 23;
    pub const GID: Range<usize> = 24..40;
}

impl ConnMsg {
    fn conn(&self) -> u64 {
        match *self {
            ConnMsg::Request { conn, .. }
            | ConnMsg::Accept { conn, .. }
            | ConnMsg::Reject { conn }
            | ConnMsg::Close { conn } => conn,
        }
    }

    /// The message's bytes: magic, kind, two zero bytes, the connection id,
    /// then the queue's fields (all zero for Reject and Close).
    pub fn encode(&self) -> [u8; CONN_MSG_LEN] {
        let mut b = [0u8; CONN_MSG_LEN];
        b[field::MAGIC] = MAGIC;
        let (kind, queue) = match *self {
            ConnMsg::Request { queue, .. } => (1, Some(queue)),
            ConnMsg::Accept { queue, .. } => (2, Some(queue)),
            ConnMsg::Reject { .. } => (3, None),
            ConnMsg::Close { .. } => (4, None),
        };
        b[field::KIND] = kind;
        b[field::CONN].copy_from_slice(&self.conn().to_le_bytes());
        if let Some(q) = queue {
            b[field::QPN].copy_from_slice(&q.qpn.to_le_bytes());
            b[field::PSN].copy_from_slice(&q.psn.to_le_bytes());
            b[field::LID].copy_from_slice(&q.lid.to_le_bytes());
            b[field::MTU] = q.mtu;
            b[field::GID].copy_from_slice(&q.gid);
        }
        b
    }

    /// Parses untrusted bytes; `None` for anything [`ConnMsg::encode`] would
    /// not have written (each message has exactly one encoding).
    pub fn decode(b: &[u8]) -> Option<ConnMsg> {
        if b.len() != CONN_MSG_LEN
            || b[field::MAGIC] != MAGIC
            || b[field::RESERVED].iter().any(|&x| x != 0)
            || b[field::RESERVED2] != 0
        {
            return None;
        }
        let u32_at = |r: core::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().expect("4 bytes"));
        let conn = u64::from_le_bytes(b[field::CONN].try_into().expect("8 bytes"));
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[field::GID]);
        let queue = QueueInfo {
            qpn: u32_at(field::QPN),
            psn: u32_at(field::PSN),
            gid,
            lid: u16::from_le_bytes([b[20], b[21]]),
            mtu: b[field::MTU],
        };
        let m = match b[field::KIND] {
            1 => ConnMsg::Request { conn, queue },
            2 => ConnMsg::Accept { conn, queue },
            3 | 4 if queue == QueueInfo::default() => {
                if b[field::KIND] == 3 {
                    ConnMsg::Reject { conn }
                } else {
                    ConnMsg::Close { conn }
                }
            }
            _ => return None,
        };
        Some(m)
    }
}

/// Makes, connects and retires the queues of a [`ConnTable`].
pub trait QueueFactory {
    type Queue;
    /// A new queue, not connected yet, and what the peer must know of it.
    fn create(&mut self) -> Result<(Self::Queue, QueueInfo), DeviceError>;
    /// Connects `q` to the peer's end `remote`.
    fn connect(&mut self, q: &mut Self::Queue, remote: &QueueInfo) -> Result<(), DeviceError>;
    /// The queue is no longer used: anything still posted on it is flushed
    /// (completes in error) and it is destroyed when that is done.
    fn retire(&mut self, q: Self::Queue);
}

/// Counters of a [`ConnTable`] (`FI_RDMX_STATS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Requests this end sent / connections it established as the reader.
    pub requested: u64,
    pub established: u64,
    /// Requests of peers accepted / rejected (at the bound, or the queue
    /// could not be made).
    pub accepted: u64,
    pub rejected: u64,
    /// Our requests the peer rejected.
    pub refused_by_peer: u64,
    /// Reads that found every connection busy at the bound (pushed).
    pub at_bound: u64,
    /// Active connections closed as least recently used / idle / broken
    /// (an error on the queue) / because the peer failed.
    pub closed_lru: u64,
    pub closed_idle: u64,
    pub closed_broken: u64,
    pub closed_peer_failed: u64,
    /// Passive ends freed on the peer's Close.
    pub passive_closed: u64,
    /// Queues that could not be made or connected.
    pub setup_failures: u64,
}

struct Active<Q> {
    conn: u64,
    queue: Q,
    ready: bool,
    since: Instant,
    last_use: Instant,
    /// Reads posted on it and not finished: such a connection is not closed
    /// for the bound or idleness.
    reads: u32,
}

struct Passive<Q> {
    conn: u64,
    queue: Q,
}

/// After a peer rejected us, or a setup failed, reads of that peer are
/// pushed for this long before a new request.
pub const BACKOFF: Duration = Duration::from_secs(1);
/// A request the peer has not answered in this long (an rdmx that does not
/// know the handshake drops it) is given up, and the peer backed off from.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// The connections of one endpoint (see the module docs).
pub struct ConnTable<Q> {
    max: usize,
    idle: Duration,
    active: FxHashMap<DevAddr, Active<Q>>,
    passive: FxHashMap<DevAddr, Passive<Q>>,
    backoff: FxHashMap<DevAddr, Instant>,
    out: VecDeque<(DevAddr, ConnMsg)>,
    next_conn: u64,
    pub stats: ConnStats,
}

impl<Q> ConnTable<Q> {
    /// At most `max` active and `max` passive connections (0: none, every
    /// read is pushed); connections idle for `idle` are closed. `seed` makes
    /// connection ids unique across incarnations.
    pub fn new(max: usize, idle: Duration, seed: u64) -> ConnTable<Q> {
        ConnTable {
            max,
            idle,
            active: FxHashMap::default(),
            passive: FxHashMap::default(),
            backoff: FxHashMap::default(),
            out: VecDeque::new(),
            next_conn: seed << 20,
            stats: ConnStats::default(),
        }
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Whether reads can ever go through a connection here.
    pub fn enabled(&self) -> bool {
        self.max > 0
    }

    /// Connections this end reads through (connected or being set up).
    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    /// Connections peers read through.
    pub fn passive_len(&self) -> usize {
        self.passive.len()
    }

    /// Whether `peer` reads through a passive end of ours.
    pub fn has_passive(&self, peer: &DevAddr) -> bool {
        self.passive.contains_key(peer)
    }

    /// Whether `peer` has a connected active end.
    pub fn is_ready(&self, peer: &DevAddr) -> bool {
        self.active.get(peer).is_some_and(|a| a.ready)
    }

    /// The connected queue to read `peer` through, or `None`: then push this
    /// message, and a connection is being set up if one may be.
    pub fn route<F: QueueFactory<Queue = Q>>(&mut self, now: Instant, peer: DevAddr, f: &mut F) -> Option<&mut Q> {
        if self.max == 0 {
            return None;
        }
        if let Some(a) = self.active.get(&peer) {
            if !a.ready {
                if now.saturating_duration_since(a.since) >= SETUP_TIMEOUT {
                    let a = self.active.remove(&peer).expect("present");
                    self.stats.setup_failures += 1;
                    f.retire(a.queue);
                    self.backoff.insert(peer, now + BACKOFF);
                }
                return None;
            }
            let a = self.active.get_mut(&peer).expect("present");
            a.last_use = now;
            return Some(&mut a.queue);
        }
        if self.backoff.get(&peer).is_some_and(|&t| now < t) {
            return None;
        }
        self.backoff.remove(&peer);
        if self.active.len() >= self.max {
            let lru = self
                .active
                .iter()
                .filter(|(_, a)| a.ready && a.reads == 0)
                .min_by_key(|(_, a)| a.last_use)
                .map(|(p, _)| *p);
            match lru {
                Some(p) => {
                    self.close_active(p, f);
                    self.stats.closed_lru += 1;
                }
                None => {
                    self.stats.at_bound += 1;
                    return None;
                }
            }
        }
        match f.create() {
            Ok((queue, info)) => {
                let conn = self.next_conn;
                self.next_conn = self.next_conn.wrapping_add(1);
                self.active.insert(peer, Active { conn, queue, ready: false, since: now, last_use: now, reads: 0 });
                self.out.push_back((peer, ConnMsg::Request { conn, queue: info }));
                self.stats.requested += 1;
            }
            Err(_) => {
                self.stats.setup_failures += 1;
                self.backoff.insert(peer, now + BACKOFF);
            }
        }
        None
    }

    /// A read was posted on `peer`'s connection.
    pub fn read_started(&mut self, peer: &DevAddr) {
        if let Some(a) = self.active.get_mut(peer) {
            a.reads += 1;
        }
    }

    /// A read on `peer`'s connection finished at `now`. Idleness counts from
    /// here, not from when the read was posted: a read longer than the idle time
    /// (a 16 MiB read under loss on a slow host took 26 s) must not leave a
    /// connection that looks idle the moment it ends, or the next large message
    /// to that peer, often the reply, finds it closed and goes by the slow
    /// push path instead.
    pub fn read_finished(&mut self, now: Instant, peer: &DevAddr) {
        if let Some(a) = self.active.get_mut(peer) {
            a.reads = a.reads.saturating_sub(1);
            a.last_use = a.last_use.max(now);
        }
    }

    fn close_active<F: QueueFactory<Queue = Q>>(&mut self, peer: DevAddr, f: &mut F) {
        if let Some(a) = self.active.remove(&peer) {
            f.retire(a.queue);
            self.out.push_back((peer, ConnMsg::Close { conn: a.conn }));
        }
    }

    /// A message of the handshake from `from` (bytes the device was handed).
    /// Bytes that are no handshake message are ignored (false).
    pub fn handle<F: QueueFactory<Queue = Q>>(&mut self, now: Instant, from: DevAddr, bytes: &[u8], f: &mut F) -> bool {
        let Some(m) = ConnMsg::decode(bytes) else { return false };
        match m {
            ConnMsg::Request { conn, queue } => {
                // A new request replaces the peer's old end (it closed it,
                // and its Close came first; or it restarted).
                if let Some(old) = self.passive.remove(&from) {
                    f.retire(old.queue);
                }
                if self.passive.len() >= self.max {
                    self.stats.rejected += 1;
                    self.out.push_back((from, ConnMsg::Reject { conn }));
                    return true;
                }
                let made = f.create().and_then(|(mut q, info)| match f.connect(&mut q, &queue) {
                    Ok(()) => Ok((q, info)),
                    Err(e) => {
                        f.retire(q);
                        Err(e)
                    }
                });
                match made {
                    Ok((q, info)) => {
                        self.passive.insert(from, Passive { conn, queue: q });
                        self.stats.accepted += 1;
                        self.out.push_back((from, ConnMsg::Accept { conn, queue: info }));
                    }
                    Err(_) => {
                        self.stats.setup_failures += 1;
                        self.stats.rejected += 1;
                        self.out.push_back((from, ConnMsg::Reject { conn }));
                    }
                }
            }
            ConnMsg::Accept { conn, queue } => {
                let Some(a) = self.active.get_mut(&from).filter(|a| a.conn == conn && !a.ready) else { return true };
                match f.connect(&mut a.queue, &queue) {
                    Ok(()) => {
                        a.ready = true;
                        a.last_use = now;
                        self.stats.established += 1;
                    }
                    Err(_) => {
                        self.stats.setup_failures += 1;
                        self.close_active(from, f);
                        self.backoff.insert(from, now + BACKOFF);
                    }
                }
            }
            ConnMsg::Reject { conn } => {
                if self.active.get(&from).is_some_and(|a| a.conn == conn && !a.ready) {
                    let a = self.active.remove(&from).expect("present");
                    f.retire(a.queue);
                    self.stats.refused_by_peer += 1;
                    self.backoff.insert(from, now + BACKOFF);
                }
            }
            ConnMsg::Close { conn } => {
                if self.passive.get(&from).is_some_and(|p| p.conn == conn) {
                    let p = self.passive.remove(&from).expect("present");
                    f.retire(p.queue);
                    self.stats.passive_closed += 1;
                }
            }
        }
        true
    }

    /// `peer`'s active connection failed (an error completion on its queue):
    /// closed (the peer is told, if it still listens); its reads are pushed
    /// from now on, and a new connection is tried after the back-off.
    pub fn broken<F: QueueFactory<Queue = Q>>(&mut self, now: Instant, peer: DevAddr, f: &mut F) {
        if self.active.contains_key(&peer) {
            self.close_active(peer, f);
            self.stats.closed_broken += 1;
            self.backoff.insert(peer, now + BACKOFF);
        }
    }

    /// The peer failed (or restarted): both ends to it go, silently.
    pub fn peer_failed<F: QueueFactory<Queue = Q>>(&mut self, peer: &DevAddr, f: &mut F) {
        if let Some(a) = self.active.remove(peer) {
            f.retire(a.queue);
            self.stats.closed_peer_failed += 1;
        }
        if let Some(p) = self.passive.remove(peer) {
            f.retire(p.queue);
        }
        self.backoff.remove(peer);
        self.out.retain(|(p, _)| p != peer);
    }

    /// Closes active connections idle for the idle time (no read for that
    /// long and none in flight).
    pub fn expire<F: QueueFactory<Queue = Q>>(&mut self, now: Instant, f: &mut F) {
        // Called on every read: no allocation, at most `max` entries looked at
        // (closing is rare).
        let idle = self.idle;
        while let Some(p) = self
            .active
            .iter()
            .find(|(_, a)| a.ready && a.reads == 0 && now.saturating_duration_since(a.last_use) >= idle)
            .map(|(p, _)| *p)
        {
            self.close_active(p, f);
            self.stats.closed_idle += 1;
        }
    }

    /// The next handshake message to send, and to whom.
    pub fn poll_message(&mut self) -> Option<(DevAddr, ConnMsg)> {
        self.out.pop_front()
    }

    pub fn has_messages(&self) -> bool {
        !self.out.is_empty()
    }

    /// Retires every queue (the device closes).
    pub fn clear<F: QueueFactory<Queue = Q>>(&mut self, f: &mut F) {
        for (_, a) in self.active.drain() {
            f.retire(a.queue);
        }
        for (_, p) in self.passive.drain() {
            f.retire(p.queue);
        }
        self.out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::RawAddr;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn addr(i: u8) -> DevAddr {
        DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_MODEL, &[i]).unwrap())
    }

    /// Queues as numbers; `live` holds those made and not retired, with
    /// what each is connected to.
    #[derive(Default)]
    struct Model {
        next: u32,
        live: HashMap<u32, Option<u32>>,
        fail_create: bool,
    }

    impl QueueFactory for Model {
        type Queue = u32;
        fn create(&mut self) -> Result<(u32, QueueInfo), DeviceError> {
            if self.fail_create {
                return Err(DeviceError::Unsupported);
            }
            self.next += 1;
            self.live.insert(self.next, None);
            Ok((self.next, QueueInfo { qpn: self.next, psn: 7, ..Default::default() }))
        }
        fn connect(&mut self, q: &mut u32, remote: &QueueInfo) -> Result<(), DeviceError> {
            self.live.insert(*q, Some(remote.qpn));
            Ok(())
        }
        fn retire(&mut self, q: u32) {
            assert!(self.live.remove(&q).is_some(), "queue {q} retired twice");
        }
    }

    /// Two tables, each with its factory; handshake messages delivered in
    /// order (the reliable stream).
    struct Pair {
        t: [ConnTable<u32>; 2],
        f: [Model; 2],
    }

    impl Pair {
        fn new(max: usize) -> Pair {
            Pair {
                t: [ConnTable::new(max, Duration::from_secs(10), 1), ConnTable::new(max, Duration::from_secs(10), 2)],
                f: Default::default(),
            }
        }
        /// Delivers every pending message both ways until none is left.
        fn exchange(&mut self, now: Instant) {
            loop {
                let mut moved = false;
                for i in 0..2 {
                    while let Some((to, m)) = self.t[i].poll_message() {
                        assert_eq!(to, addr(1 - i as u8));
                        let j = 1 - i;
                        let Pair { t, f } = self;
                        assert!(t[j].handle(now, addr(i as u8), &m.encode(), &mut f[j]));
                        moved = true;
                    }
                }
                if !moved {
                    return;
                }
            }
        }
    }

    #[test]
    fn messages_round_trip_and_refuse_other_bytes() {
        let q = QueueInfo { qpn: 0x12_3456, psn: 0xab_cdef, gid: [9; 16], lid: 3, mtu: 5 };
        for m in [
            ConnMsg::Request { conn: 1, queue: q },
            ConnMsg::Accept { conn: u64::MAX, queue: q },
            ConnMsg::Reject { conn: 7 },
            ConnMsg::Close { conn: 8 },
        ] {
            assert_eq!(ConnMsg::decode(&m.encode()), Some(m));
        }
        let mut b = ConnMsg::Reject { conn: 7 }.encode();
        b[field::QPN.start] = 1;
        assert_eq!(ConnMsg::decode(&b), None, "a reject with queue fields");
        assert_eq!(ConnMsg::decode(&b[..39]), None);
        assert_eq!(ConnMsg::decode(&[0; CONN_MSG_LEN]), None);
    }

    #[test]
    fn the_first_read_pushes_and_sets_up_then_reads_go_through_the_connection() {
        let mut p = Pair::new(4);
        let t0 = Instant::ZERO;
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_none(), "first read: push while connecting");
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_none(), "still connecting");
        assert_eq!(p.t[0].stats.requested, 1, "one request, not one per read");
        p.exchange(t0);
        let q = *p.t[0].route(t0, addr(1), &mut p.f[0]).expect("connected");
        let theirs = p.f[0].live[&q].expect("connected to the peer's queue");
        assert_eq!(p.f[1].live[&theirs], Some(q), "the peer's end connects back to ours");
        assert_eq!((p.t[0].active_len(), p.t[1].passive_len()), (1, 1));
    }

    #[test]
    fn at_the_bound_the_least_recently_used_idle_connection_closes_and_its_peer_frees_its_end() {
        // One reader, three peers, at most two connections.
        let mut t = ConnTable::<u32>::new(2, Duration::from_secs(10), 1);
        let mut f = Model::default();
        let mut peers: Vec<(ConnTable<u32>, Model)> =
            (0..3).map(|i| (ConnTable::new(2, Duration::from_secs(10), 10 + i), Model::default())).collect();
        let mut now = Instant::ZERO;
        let run = |t: &mut ConnTable<u32>, f: &mut Model, peers: &mut Vec<(ConnTable<u32>, Model)>, now: Instant| {
            while let Some((to, m)) = t.poll_message() {
                let DevAddr::Raw(r) = to else { unreachable!() };
                let (pt, pf) = &mut peers[r.bytes()[0] as usize - 1];
                pt.handle(now, addr(0), &m.encode(), pf);
                while let Some((_, back)) = pt.poll_message() {
                    t.handle(now, to, &back.encode(), f);
                }
            }
        };
        for i in 1..=3u8 {
            now = now + Duration::from_millis(1);
            assert!(t.route(now, addr(i), &mut f).is_none());
            run(&mut t, &mut f, &mut peers, now);
            assert!(t.route(now, addr(i), &mut f).is_some(), "peer {i} connected");
        }
        assert_eq!(t.active_len(), 2);
        assert_eq!(t.stats.closed_lru, 1);
        assert_eq!(peers[0].0.passive_len(), 0, "peer 1, the least recently used, freed its end");
        assert_eq!(peers[0].1.live.len(), 0);
        assert_eq!(f.live.len(), 2, "no queue leaked");
        // A connection with a read in flight is never closed for the bound.
        t.read_started(&addr(2));
        t.read_started(&addr(3));
        now = now + Duration::from_millis(1);
        assert!(t.route(now, addr(1), &mut f).is_none());
        assert_eq!(t.stats.at_bound, 1, "every connection busy: push, no request");
        assert_eq!(t.active_len(), 2);
    }

    #[test]
    fn a_peer_at_its_bound_rejects_and_the_reader_backs_off() {
        let mut p = Pair::new(0);
        p.t[0] = ConnTable::new(1, Duration::from_secs(10), 1);
        let t0 = Instant::ZERO;
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_none());
        p.exchange(t0);
        assert_eq!((p.t[1].stats.rejected, p.t[0].stats.refused_by_peer), (1, 1));
        assert_eq!((p.f[0].live.len(), p.f[1].live.len()), (0, 0));
        assert!(p.t[0].route(t0 + BACKOFF / 2, addr(1), &mut p.f[0]).is_none());
        assert_eq!(p.t[0].stats.requested, 1, "no new request during the back-off");
        assert!(p.t[0].route(t0 + BACKOFF, addr(1), &mut p.f[0]).is_none());
        assert_eq!(p.t[0].stats.requested, 2, "asked again after it");
    }

    #[test]
    fn crossing_requests_give_one_connection_each_way() {
        let mut p = Pair::new(4);
        let t0 = Instant::ZERO;
        let Pair { t, f } = &mut p;
        assert!(t[0].route(t0, addr(1), &mut f[0]).is_none());
        assert!(t[1].route(t0, addr(0), &mut f[1]).is_none());
        p.exchange(t0);
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_some());
        assert!(p.t[1].route(t0, addr(0), &mut p.f[1]).is_some());
        assert_eq!((p.f[0].live.len(), p.f[1].live.len()), (2, 2));
    }

    #[test]
    fn idleness_counts_from_the_end_of_the_last_read_not_its_start() {
        let mut p = Pair::new(4);
        let t0 = Instant::ZERO;
        p.t[0].route(t0, addr(1), &mut p.f[0]);
        p.exchange(t0);
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_some());
        p.t[0].read_started(&addr(1));
        // The read takes twice the idle time (10 s here): never idle meanwhile.
        p.t[0].expire(t0 + Duration::from_secs(15), &mut p.f[0]);
        let done = t0 + Duration::from_secs(20);
        p.t[0].read_finished(done, &addr(1));
        p.t[0].expire(done + Duration::from_secs(1), &mut p.f[0]);
        assert_eq!(p.t[0].stats.closed_idle, 0, "closed as idle the moment its read ended");
        assert!(
            p.t[0].route(done + Duration::from_secs(1), addr(1), &mut p.f[0]).is_some(),
            "the reply's read finds it open"
        );
        p.t[0].expire(done + Duration::from_secs(12), &mut p.f[0]);
        assert_eq!(p.t[0].stats.closed_idle, 1, "idle for the idle time after its last use: closed");
    }

    #[test]
    fn idle_broken_and_failed_connections_are_retired() {
        let mut p = Pair::new(4);
        let t0 = Instant::ZERO;
        p.t[0].route(t0, addr(1), &mut p.f[0]);
        p.exchange(t0);
        p.t[0].expire(t0 + Duration::from_secs(11), &mut p.f[0]);
        assert_eq!(p.t[0].stats.closed_idle, 1);
        p.exchange(t0);
        assert_eq!((p.f[0].live.len(), p.f[1].live.len()), (0, 0), "the idle close freed both ends");
        // Broken: closed, told, backed off.
        p.t[0].route(t0, addr(1), &mut p.f[0]);
        p.exchange(t0);
        p.t[0].broken(t0, addr(1), &mut p.f[0]);
        p.exchange(t0);
        assert_eq!((p.f[0].live.len(), p.f[1].live.len()), (0, 0));
        assert!(p.t[0].route(t0, addr(1), &mut p.f[0]).is_none());
        assert_eq!(p.t[0].stats.requested, 2, "backed off after the break");
        // The peer fails: everything to it goes, nothing is sent to it.
        p.t[0].route(t0 + BACKOFF, addr(1), &mut p.f[0]);
        p.exchange(t0 + BACKOFF);
        p.t[1].peer_failed(&addr(0), &mut p.f[1]);
        p.t[0].peer_failed(&addr(1), &mut p.f[0]);
        assert!(!p.t[0].has_messages() && !p.t[1].has_messages());
        assert_eq!((p.f[0].live.len(), p.f[1].live.len()), (0, 0));
    }

    #[test]
    fn an_unanswered_request_is_given_up() {
        let mut t = ConnTable::<u32>::new(4, Duration::from_secs(10), 1);
        let mut f = Model::default();
        t.route(Instant::ZERO, addr(1), &mut f);
        assert!(t.poll_message().is_some());
        t.route(Instant::ZERO + SETUP_TIMEOUT, addr(1), &mut f);
        assert_eq!((t.stats.setup_failures, f.live.len(), t.active_len()), (1, 0, 0));
    }

    proptest! {
        /// Any sequence of reads, finishes, expiries, breaks and failures over
        /// a few peers: the bound holds on both sides, every queue made is
        /// retired exactly once or still owned by a table, and a connection
        /// the reader holds ready has the peer's end connected to it.
        #[test]
        fn the_bound_holds_and_no_queue_leaks(ops in proptest::collection::vec((0u8..6, 1u8..4, 0u64..3000), 1..120), max in 1usize..3) {
            // Node 0 reads from nodes 1..=3; each of those may read node 0 too.
            let mut tables: Vec<ConnTable<u32>> = (0..4).map(|i| ConnTable::new(max, Duration::from_secs(2), i)).collect();
            let mut fs: Vec<Model> = (0..4).map(|_| Model::default()).collect();
            let mut now = Instant::ZERO;
            for (op, who, dt) in ops {
                now = now + Duration::from_millis(dt);
                let (r, w) = if op % 2 == 0 { (0usize, who as usize) } else { (who as usize, 0usize) };
                match op {
                    0 | 1 => { tables[r].route(now, addr(w as u8), &mut fs[r]); }
                    2 => tables[r].expire(now, &mut fs[r]),
                    3 => tables[r].broken(now, addr(w as u8), &mut fs[r]),
                    4 => { tables[r].read_started(&addr(w as u8)); }
                    _ => {
                        tables[0].peer_failed(&addr(who), &mut fs[0]);
                        tables[who as usize].peer_failed(&addr(0), &mut fs[who as usize]);
                    }
                }
                // The stream delivers every handshake message, in order.
                loop {
                    let mut msgs = Vec::new();
                    for (i, t) in tables.iter_mut().enumerate() {
                        while let Some((to, m)) = t.poll_message() {
                            msgs.push((i, to, m));
                        }
                    }
                    if msgs.is_empty() { break; }
                    for (i, to, m) in msgs {
                        let DevAddr::Raw(a) = to else { unreachable!() };
                        let j = a.bytes()[0] as usize;
                        tables[j].handle(now, addr(i as u8), &m.encode(), &mut fs[j]);
                    }
                }
                for (i, t) in tables.iter().enumerate() {
                    prop_assert!(t.active_len() <= max && t.passive_len() <= max, "node {} over the bound", i);
                    prop_assert_eq!(fs[i].live.len(), t.active_len() + t.passive_len(), "node {}: queues made and not retired = queues held", i);
                }
                for i in 0..4usize {
                    for (peer, a) in &tables[i].active {
                        if a.ready {
                            let DevAddr::Raw(r) = peer else { unreachable!() };
                            let j = r.bytes()[0] as usize;
                            let theirs = fs[i].live[&a.queue].expect("a ready queue is connected");
                            prop_assert_eq!(fs[j].live.get(&theirs).copied().flatten(), Some(a.queue), "node {} -> {}: the peer's end is connected back", i, j);
                        }
                    }
                }
            }
        }
    }
}
