//! The peer table and each peer's state: the cold entry that every address the
//! engine was asked about gets (address, path, index of hot state), the hot
//! state created on first traffic, the lookups between addresses, ids and
//! paths, the incarnation a peer is addressed as, what is reported of a peer
//! and what it costs, and failing a peer (unreachable, restarted). Separate because every other part
//! of the engine looks its peers up here, and this is the one place where
//! their entries are made and their streams torn down.
use super::*;

pub(super) struct Cold {
    pub(super) addr: DevAddr,
    /// The job this peer is a process of (its packets carry the job's key).
    pub(super) job: JobIdx,
    /// The index of its hot state, plus one ([`Cold::hot`]): four bytes, so
    /// that the job index fits beside it in a cold peer's 96 bytes.
    hot: Option<std::num::NonZeroU32>,
    /// The path to the peer, when the layer above gave one
    /// ([`Engine::peer_with_path`]); else the engine's defaults
    /// ([`Engine::path_of`]). The one place a peer's path is kept.
    pub(super) path: Option<PeerPath>,
}

/// A peer's hot state: who it is, its liveness and timer bookkeeping; the
/// send side ([`SendState`], driven by [`recovery`]), the receive side
/// ([`RecvState`], [`reassembly`]) and the congestion window
/// ([`Congestion`]) each in their own type. The path is not here: it is the
/// peer's cold entry's ([`Engine::path_of`]).
impl Cold {
    pub(super) fn new(addr: DevAddr, job: JobIdx) -> Cold {
        Cold { addr, job, hot: None, path: None }
    }

    /// The index of the peer's hot state, once it has some.
    #[inline]
    pub(super) fn hot(&self) -> Option<u32> {
        self.hot.map(|h| h.get() - 1)
    }
}

pub(super) struct Hot {
    pub(super) peer: PeerId,
    pub(super) peer_inc: u64,
    /// `peer_inc` came from the peer's own packets (not only from the address
    /// the application gave).
    pub(super) inc_heard: bool,
    pub(super) retired: [u64; 2],
    /// What a sealed peer adds (`receive`), boxed: only a job with a
    /// secret pays for it, and an idle peer of one without stays small.
    pub(super) sealed: Option<Box<SealedPeer>>,
    pub(super) last_heard: Instant,
    /// Declared unreachable: sends fail at once until the peer shows up with a
    /// new incarnation (a restart), since the stream to the old one is broken.
    pub(super) failed: bool,
    pub(super) scheduled: bool,
    /// The deadline this peer has on the engine's timer heap (the live entry).
    pub(super) armed_at: Option<Instant>,
    pub(super) tx: SendState,
    pub(super) rx: RecvState,
    pub(super) cc: Congestion,
    pub(super) counters: PeerCounters,
}

impl Hot {
    fn new(peer: PeerId, cfg: &EngineConfig, path: PeerPath, now: Instant) -> Hot {
        Hot {
            peer,
            peer_inc: 0,
            inc_heard: false,
            retired: [0; 2],
            sealed: None,
            last_heard: now,
            failed: false,
            scheduled: false,
            armed_at: None,
            tx: SendState::new(cfg),
            rx: RecvState::default(),
            cc: Congestion::new(path.reliable, cfg.max_window),
            counters: PeerCounters::default(),
        }
    }
}

/// A sealed peer's incarnations and packet counters.
#[derive(Default)]
pub(super) struct SealedPeer {
    /// The incarnations this endpoint challenged and that did not echo
    /// yet, with their cookies, and every one it took or challenged and then
    /// left (so that none is ever taken again), at most [`SEALED_HISTORY`]
    /// each.
    pub(super) challenged: Vec<Challenged>,
    pub(super) history: Vec<u64>,
    /// The packet counters of the current incarnation.
    pub(super) replay: seal::ReplayWindow,
    /// The incarnation last recorded as living at this peer's address
    /// (`Engine::sealed_homes`).
    pub(super) homed: u64,
}

/// An incarnation challenged and not yet current: its cookie, and the
/// packet counters of its challenges and echoes (which become the current
/// incarnation's when it is taken).
pub(super) struct Challenged {
    pub(super) inc: u64,
    pub(super) cookie: u64,
    pub(super) replay: seal::ReplayWindow,
}

/// Incarnations of one peer a sealed endpoint remembers as challenged, and
/// as left behind (the oldest forgotten beyond): one forgotten still cannot
/// become current again (a replay cannot echo a new challenge), it is only
/// challenged instead of dropped as stale (`PROTOCOL.md` §2.5).
pub const SEALED_HISTORY: usize = 64;

impl Engine {
    /// The entry of a datagram's sender in `job`; a new one is remembered
    /// as pathless.
    pub(super) fn peer_heard(&mut self, addr: DevAddr, job: JobIdx) -> PeerId {
        let known = self.cold.len();
        let p = self.peer_in(addr, job);
        if p.0 as usize == known {
            self.pathless.push(p);
        }
        p
    }

    /// A peer created by a datagram it sent and given no path since: the
    /// caller gives it one ([`Engine::peer_with_path`]) right after the
    /// receive batch, so that what is sent to it (an answer to its rendezvous,
    /// a DIRECT reply on shm) uses its path, not the engine's defaults, and
    /// the layer above sees the same path for it ([`Engine::path`]).
    /// Whether a sender heard for the first time still waits for its path
    /// ([`Engine::poll_pathless_peer`]).
    #[inline]
    pub fn has_pathless_peers(&self) -> bool {
        !self.pathless.is_empty()
    }

    pub fn poll_pathless_peer(&mut self) -> Option<PeerId> {
        while let Some(p) = self.pathless.pop() {
            if self.cold.get(p.0 as usize).is_some_and(|c| c.path.is_none()) {
                return Some(p);
            }
        }
        None
    }

    /// Finds or creates the (cold) entry for `addr` in the first job. Costs
    /// no traffic.
    pub fn peer(&mut self, addr: DevAddr) -> PeerId {
        self.peer_in(addr, JobIdx::FIRST)
    }

    /// Finds or creates the (cold) entry for the process at `addr` in `job`
    /// (a job this engine does not serve counts as the first).
    pub fn peer_in(&mut self, addr: DevAddr, job: JobIdx) -> PeerId {
        let job = if (job.0 as usize) < self.jobs.len() { job } else { JobIdx::FIRST };
        if let Some((a, j, p)) = self.last_peer {
            if a == addr && j == job {
                return p;
            }
        }
        let id = match self.peer_id_in(addr, job) {
            Some(p) => p,
            None => {
                let id = PeerId(self.cold.len() as u32);
                self.cold.push(Cold::new(addr, job));
                if job == JobIdx::FIRST {
                    self.by_addr.insert(addr, id);
                } else {
                    self.by_addr_in_job.insert((addr, job), id);
                }
                id
            }
        };
        self.last_peer = Some((addr, job, id));
        id
    }

    /// The peers at `addr`: the process there in each job it was met in.
    pub fn peers_at(&self, addr: DevAddr) -> impl Iterator<Item = PeerId> + '_ {
        (0..self.jobs.len()).filter_map(move |j| self.peer_id_in(addr, JobIdx(j as u8)))
    }

    /// The job `peer` is a process of.
    pub fn peer_job(&self, peer: PeerId) -> JobIdx {
        self.cold.get(peer.0 as usize).map_or(JobIdx::FIRST, |c| c.job)
    }

    /// Like [`Engine::peer`], and fixes the peer's path (mtu, reliability) from
    /// the device's caps toward it: under `auto`, a same-host peer gets the
    /// shared-memory path's. The first path given wins; a peer whose state was
    /// created before (it sent to us first) takes it if nothing was sent to it
    /// yet.
    pub fn peer_with_path(&mut self, addr: DevAddr, caps: &DeviceCaps) -> PeerId {
        self.peer_in_with_path(addr, JobIdx::FIRST, caps)
    }

    /// [`Engine::peer_with_path`] for the process at `addr` in `job`.
    pub fn peer_in_with_path(&mut self, addr: DevAddr, job: JobIdx, caps: &DeviceCaps) -> PeerId {
        let id = self.peer_in(addr, job);
        let job_sealed = self.jobs[self.cold[id.0 as usize].job.0 as usize].sealer.is_some();
        let cold = &mut self.cold[id.0 as usize];
        if cold.path.is_none() {
            // A sealed path carries everything in sealed datagrams: no
            // remote reads (the rendezvous pushes instead) and no payloads
            // gathered unread from registered memory.
            let sealed = job_sealed && !addr.crosses_no_wire();
            let path = PeerPath {
                payload_max: payload_max(caps.mtu, sealed),
                reliable: caps.reliable,
                gso: caps.gso,
                // DIRECT packets (which a reliable, ordered path carries)
                // are never sealed.
                ordered: caps.ordered && !sealed,
                remote_read: caps.remote_read && !sealed,
                registration: caps.registration && !sealed,
            };
            match cold.hot() {
                None => cold.path = Some(path),
                Some(h) => {
                    let hot = &mut self.hot[h as usize];
                    // Data already sent keeps the path it went out on (a
                    // stream cannot turn reliable under its retransmissions).
                    if hot.tx.next_psn == Psn(0) {
                        cold.path = Some(path);
                        if path.reliable {
                            hot.cc.open_fully(self.cfg.max_window);
                        }
                    }
                }
            }
        }
        id
    }

    /// The path to `peer`: the one given ([`Engine::peer_with_path`]), else
    /// the engine's defaults.
    #[inline]
    pub(super) fn path_of(&self, peer: PeerId) -> PeerPath {
        self.cold.get(peer.0 as usize).and_then(|c| c.path).unwrap_or(self.default_path)
    }

    /// The path given for `peer` ([`Engine::peer_with_path`]); `None` for a
    /// peer known only from what it sent, or given its path only after data
    /// had gone out to it on the engine's defaults.
    pub fn path(&self, peer: PeerId) -> Option<PeerPath> {
        self.cold.get(peer.0 as usize).and_then(|c| c.path)
    }

    /// The id of `addr` in the first job if the engine knows it (no entry
    /// is created).
    pub fn peer_id_of(&self, addr: DevAddr) -> Option<PeerId> {
        self.peer_id_in(addr, JobIdx::FIRST)
    }

    /// The id of the process at `addr` in `job` if the engine knows it.
    #[inline]
    pub fn peer_id_in(&self, addr: DevAddr, job: JobIdx) -> Option<PeerId> {
        if job == JobIdx::FIRST {
            self.by_addr.get(&addr).copied()
        } else {
            self.by_addr_in_job.get(&(addr, job)).copied()
        }
    }

    pub fn peer_addr(&self, peer: PeerId) -> DevAddr {
        self.cold.get(peer.0 as usize).map(|c| c.addr).unwrap_or(DevAddr::NONE)
    }

    /// A one-line description of a peer's protocol state (diagnostics).
    pub fn describe_peer(&self, peer: PeerId) -> String {
        let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) else { return "cold".into() };
        let hot = &self.hot[h as usize];
        format!(
            "next_psn {} unacked {} (first {:?}, sacked {}, queued {}) pending {} to_send {} cwnd {:.1} rto {:?} backoff {} rto_deadline {:?} rx_next {} ooo {} ack_now {} ack_deadline {:?}",
            hot.tx.next_psn.0,
            hot.tx.unacked.len(),
            hot.tx.unacked.front().map(|s| (s.psn.0, s.sacked, s.queued, s.retransmitted, s.sent_at)),
            hot.tx.unacked.iter().filter(|s| s.sacked).count(),
            hot.tx.unacked.iter().filter(|s| s.queued).count(),
            hot.tx.pending.len(),
            hot.tx.to_send.len(),
            hot.cc.cwnd(),
            hot.tx.rto,
            hot.tx.backoff,
            hot.tx.rto_deadline,
            hot.rx.rx_next.0,
            hot.rx.ooo.len(),
            hot.rx.ack_now,
            hot.rx.ack_deadline
        )
    }

    /// Whether data to some peer is still unacknowledged or queued.
    pub fn has_unacked(&self) -> bool {
        self.hot.iter().any(|(_, h)| h.tx.busy() && !h.failed)
    }

    /// Whether some peer that carried traffic sits on a path that can lose
    /// datagrams.
    pub fn has_lossy_peers(&self) -> bool {
        self.hot.iter().any(|(_, h)| !self.path_of(h.peer).reliable)
    }

    /// Number of peers with hot state.
    pub fn hot_peers(&self) -> usize {
        self.hot.len()
    }

    /// Every peer with hot state (one that carried traffic), with its
    /// counters, smoothed RTT and congestion window. Reads only.
    pub fn peer_snapshots(&self) -> impl Iterator<Item = PeerSnapshot> + '_ {
        self.hot.iter().map(|(_, h)| PeerSnapshot {
            peer: h.peer,
            addr: self.peer_addr(h.peer),
            job: self.peer_job(h.peer),
            counters: h.counters,
            srtt: h.tx.srtt,
            cwnd: h.cc.cwnd(),
            failed: h.failed,
        })
    }

    /// The layer above's counters of `peer` ([`PeerCounters::upper`]); none
    /// for a peer without hot state (it never carried reliable traffic).
    #[inline]
    pub fn upper_counters_mut(&mut self, peer: PeerId) -> Option<&mut [u64; UPPER_COUNTERS]> {
        let h = self.cold.get(peer.0 as usize)?.hot()?;
        self.hot.get_mut(h as usize).map(|hot| &mut hot.counters.upper)
    }

    /// Bytes accepted for `peer` that have not yet entered its send window
    /// (queued behind it). A layer that copies long data into the engine
    /// keeps this short: bytes copied long before the window takes them are
    /// memory allocated and faulted in only to wait.
    #[inline]
    pub fn queued_bytes(&self, peer: PeerId) -> usize {
        self.cold.get(peer.0 as usize).and_then(|c| c.hot()).map_or(0, |h| self.hot[h as usize].tx.queued_bytes)
    }

    /// Bytes one peer costs this engine: its cold entry and address-map entry,
    /// plus, once it has carried traffic, its hot state and the buffers that state
    /// currently holds.
    pub fn peer_bytes(&self, peer: PeerId) -> usize {
        let cold = std::mem::size_of::<Cold>() + std::mem::size_of::<(DevAddr, PeerId)>() + 1;
        let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) else { return cold };
        let hot = &self.hot[h as usize];
        cold + std::mem::size_of::<slab::Slab<Hot>>().max(std::mem::size_of::<Hot>())
            + hot.tx.unacked.capacity() * std::mem::size_of::<TxSeg>()
            + hot.tx.to_send.capacity() * std::mem::size_of::<Psn>()
            + hot.tx.pending.capacity() * std::mem::size_of::<PendingMsg>()
            + hot.rx.ooo.len() * (std::mem::size_of::<(u32, RxSeg)>() + 16)
            + hot.rx.assembling.as_ref().map_or(0, |b| b.capacity())
            + hot.sealed.as_ref().map_or(0, |s| {
                std::mem::size_of::<SealedPeer>()
                    + s.challenged.capacity() * std::mem::size_of::<Challenged>()
                    + s.history.capacity() * 8
            })
    }

    pub(super) fn hot_index(&mut self, peer: PeerId, now: Instant) -> u32 {
        let cold = &mut self.cold[peer.0 as usize];
        if let Some(h) = cold.hot() {
            return h;
        }
        let path = cold.path.unwrap_or(self.default_path);
        let mut hot = Hot::new(peer, &self.cfg, path, now);
        hot.peer_inc = self.expected_inc.remove(&peer.0).unwrap_or(0);
        let h = self.hot.insert(hot) as u32;
        cold.hot = std::num::NonZeroU32::new(h + 1);
        h
    }

    /// The application addresses `peer` as incarnation `inc` (its AV entry
    /// carries it; 0 names none). Until the peer has been heard from, packets
    /// to it are addressed to that incarnation, so a different process now at
    /// the same address drops them as stale and answers with its own
    /// incarnation — which fails what was sent to the old one. Returns false
    /// when the peer was heard from as another incarnation: the address is
    /// stale and nothing may be sent on it (the process it named is gone).
    #[inline]
    pub fn expect_incarnation(&mut self, peer: PeerId, inc: u64) -> bool {
        // Every send and directed receive asks: the usual answer (a peer with
        // state, already addressed as `inc`) in a few loads, inline.
        if let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) {
            if inc == 0 || self.hot[h as usize].peer_inc == inc {
                return true;
            }
        }
        self.expect_incarnation_slow(peer, inc)
    }

    /// [`Engine::expect_incarnation`] beyond its usual answer.
    #[inline(never)]
    fn expect_incarnation_slow(&mut self, peer: PeerId, inc: u64) -> bool {
        let Some(cold) = self.cold.get_mut(peer.0 as usize) else { return false };
        if inc == 0 {
            return true;
        }
        let job = &mut self.jobs[cold.job.0 as usize];
        if job.sealer.is_some() {
            // The application says where it lives (and knows better than any
            // datagram): a sealed datagram of it from anywhere else is a
            // copy (`receive`).
            job.homes.insert(inc, peer);
        }
        match cold.hot() {
            None => {
                // Nothing sent or heard yet: the latest address given wins.
                self.expected_inc.insert(peer.0, inc);
                true
            }
            Some(h) => {
                let hot = &mut self.hot[h as usize];
                if hot.peer_inc == inc {
                    true
                } else if !hot.inc_heard && hot.tx.next_psn == Psn(0) {
                    hot.peer_inc = inc;
                    true
                } else if !hot.inc_heard {
                    // Data already went out addressed to the earlier
                    // expectation (or to none), and the process there may
                    // have taken it: re-addressing the stream now would make
                    // that process look restarted when it answers, restart
                    // our sequence numbers under its feet and lose what
                    // follows (found by fuzz/rdm_engine). Keep the addressing
                    // until the peer is heard from; this entry is checked then.
                    true
                } else {
                    false
                }
            }
        }
    }

    /// The device reports `addr` unreachable (the kernel got an ICMP port or host
    /// unreachable for a datagram sent there). A peer with messages pending
    /// fails now, as at the peer timeout but without waiting for it; an idle
    /// peer is left alone (the ICMP may answer an acknowledgement to a peer that
    /// has finished and gone, which costs nobody anything).
    pub fn handle_unreachable(&mut self, addr: DevAddr) {
        self.unreachable(addr, false);
    }

    /// Like [`Engine::handle_unreachable`], but fails the peer even when
    /// nothing is in flight to it: the layer above waits on an answer from it
    /// (a rendezvous Fin, an RMA response) that will never come.
    pub fn fail_unreachable(&mut self, addr: DevAddr) {
        self.unreachable(addr, true);
    }

    fn unreachable(&mut self, addr: DevAddr, even_idle: bool) {
        // The process at `addr` is gone in every job it served.
        for j in 0..self.jobs.len() {
            if let Some(peer) = self.peer_id_in(addr, JobIdx(j as u8)) {
                self.unreachable_peer(peer, even_idle);
            }
        }
    }

    fn unreachable_peer(&mut self, peer: PeerId, even_idle: bool) {
        let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) else { return };
        let path = self.path_of(peer);
        let hot = &self.hot[h as usize];
        // On a reliable, ordered path the report answers a datagram that was
        // lost with the peer — perhaps a DIRECT message, which left nothing
        // busy behind it: fail the peer even when idle (on UDP an ICMP may only
        // answer an ack to a peer that finished and left, which costs nobody).
        let direct_path = path.reliable && path.ordered;
        if hot.failed || !(even_idle || hot.tx.busy() || direct_path) {
            return;
        }
        self.fail_peer(h, FailReason::Unreachable);
        self.hot[h as usize].failed = true;
        // DIRECT messages to it written out since the layer above last
        // polled: the device's report answers one of them (the provider
        // hands each batch to the device right after `poll_transmit`), so
        // their completions become failures.
        let mut i = 0;
        while i < self.direct_unpolled.len() {
            let (token, to) = self.direct_unpolled[i];
            if to != peer {
                i += 1;
                continue;
            }
            self.direct_unpolled.swap_remove(i);
            if let Some(ev) = self.events.iter_mut().find(|e| **e == Event::SendComplete { token }) {
                *ev = Event::SendFailed { token, peer, reason: FailReason::Unreachable };
            }
        }
        self.events.push_back(Event::PeerUnreachable { peer });
        self.stats.peers_failed += 1;
    }

    /// Fails every message queued to or in flight to the peer and resets the
    /// send side (a new send starts a fresh stream after a restart).
    pub(super) fn fail_peer(&mut self, h: u32, reason: FailReason) {
        let hot = &mut self.hot[h as usize];
        let peer = hot.peer;
        let mut tokens: Vec<u64> = Vec::new();
        for seg in hot.tx.unacked.drain(..) {
            if seg.last {
                tokens.push(seg.token);
            }
        }
        for m in hot.tx.pending.drain(..) {
            if m.next_off == 0 || !tokens.contains(&m.token) {
                tokens.push(m.token);
            }
        }
        tokens.dedup();
        hot.tx.to_send.clear();
        hot.tx.queued_bytes = 0;
        hot.tx.rto_deadline = None;
        hot.tx.backoff = 1;
        for token in tokens {
            self.events.push_back(Event::SendFailed { token, peer, reason });
        }
    }

    pub(super) fn reset_for_restart(&mut self, h: u32, new_inc: u64) {
        self.fail_peer(h, FailReason::PeerRestarted);
        let reliable = self.path_of(self.hot[h as usize].peer).reliable;
        let hot = &mut self.hot[h as usize];
        let old = hot.peer_inc;
        hot.retired = [old, hot.retired[0]];
        hot.peer_inc = new_inc;
        hot.failed = false;
        hot.tx.next_psn = Psn(0);
        hot.rx.rx_next = Psn(0);
        hot.rx.ooo.clear();
        if let Some(b) = hot.rx.assembling.take() {
            self.pool.push(b);
        }
        hot.cc.restart(reliable, self.cfg.max_window);
        hot.tx.srtt = None;
        hot.tx.rto = self.cfg.initial_rto;
        self.stats.peer_restarts += 1;
        self.events.push_back(Event::PeerRestarted { peer: hot.peer });
    }
}
