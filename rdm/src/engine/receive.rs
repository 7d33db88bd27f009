//! The input side: [`Engine::handle_datagram`] (and
//! [`Engine::handle_datagram_lending`]) decodes and checks a datagram
//! (checksum, job key, incarnations), gives its acknowledgement state to
//! [`recovery`] and its data to [`reassembly`], or delivers a DIRECT message;
//! and the receive side's back-pressure ([`Engine::set_paused`]) and
//! flushing of delayed acknowledgements. Separate because it is the other
//! per-message hot path, and the place where the checks that guard every
//! peer's state are made, in their order.
use super::*;

impl Engine {
    /// Processes one datagram from the device. Never panics on bad input:
    /// malformed, corrupted, foreign-job and stale packets are counted and dropped.
    pub fn handle_datagram(&mut self, now: Instant, from: DevAddr, bytes: &[u8]) {
        self.receive(now, from, bytes, false);
    }

    /// [`Engine::handle_datagram`], except that a whole message in one DIRECT
    /// datagram is lent back instead of being copied into a pooled buffer and
    /// queued as `Delivered`: `Some(peer)` means `bytes[HEADER_LEN..]` is that
    /// message from `peer`, delivered (and counted) now, for the caller to
    /// take from the device's buffer. Only while no event waits to be polled
    /// (a message queued before it would otherwise be overtaken) and no
    /// message of that peer is being put together.
    pub fn handle_datagram_lending(&mut self, now: Instant, from: DevAddr, bytes: &[u8]) -> Option<PeerId> {
        self.receive(now, from, bytes, true)
    }

    fn receive(&mut self, now: Instant, from: DevAddr, bytes: &[u8], lend: bool) -> Option<PeerId> {
        let (hdr, payload) = match Header::decode(bytes) {
            Ok(x) => x,
            Err(DecodeError::Checksum) => {
                self.stats.dropped_checksum += 1;
                return None;
            }
            Err(_) => {
                self.stats.dropped_malformed += 1;
                return None;
            }
        };
        if hdr.unsummed && !from.crosses_no_wire() {
            // Only a shared-memory ring may carry a datagram without its sum.
            self.stats.dropped_checksum += 1;
            return None;
        }
        // The job the datagram names: one comparison for an endpoint of one
        // job, a short scan for one that serves several.
        let Some(j) = self.jobs.iter().position(|j| j.key == hdr.job_key) else {
            self.stats.dropped_job_key += 1;
            return None;
        };
        let job = JobIdx(j as u8);
        if hdr.sealed == Sealed::No && (self.jobs[j].sealer.is_none() || from.crosses_no_wire()) {
            self.jobs[j].counters.received += 1;
            return self.accept(now, from, job, hdr, payload, None, lend);
        }
        // A job with a secret takes nothing unsealed from a wire, and nothing
        // sealed is taken without one; the tag is checked before anything
        // else looks at the datagram (no peer state, no byte, no event).
        let Job { sealer, homes, counters, .. } = &mut self.jobs[j];
        let Some(sealer) = sealer.as_mut() else {
            self.stats.dropped_auth += 1;
            counters.dropped_auth += 1;
            return None;
        };
        if hdr.sealed == Sealed::No || hdr.ptype == PacketType::Direct {
            // DIRECT packets go only through a shared-memory ring, unsealed.
            self.stats.dropped_auth += 1;
            counters.dropped_auth += 1;
            return None;
        }
        let Some(counter) = sealer.open(bytes, hdr.src_inc, hdr.sealed) else {
            self.stats.dropped_auth += 1;
            counters.dropped_auth += 1;
            return None;
        };
        counters.received += 1;
        if let Some(&home) = homes.get(&hdr.src_inc) {
            // One incarnation sends from one address: a genuine datagram of
            // it from another is a replay from elsewhere.
            if self.cold[home.0 as usize].addr != from {
                self.stats.dropped_replay += 1;
                return None;
            }
        }
        if hdr.sealed == Sealed::Encrypted {
            let opened = std::mem::take(&mut sealer.opened);
            let lent = self.accept(now, from, job, hdr, &opened, Some(counter), false);
            if let Some(s) = self.jobs[j].sealer.as_mut() {
                s.opened = opened;
            }
            return lent;
        }
        self.accept(now, from, job, hdr, payload, Some(counter), false)
    }

    /// A datagram past the checks of its bytes (checksum or tag, job key):
    /// `counter` is its packet counter if it was sealed. The checks of its
    /// identity (incarnations, and for sealed ones freshness and replay),
    /// then its acknowledgement state and its data.
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &mut self,
        now: Instant,
        from: DevAddr,
        job: JobIdx,
        hdr: Header,
        payload: &[u8],
        counter: Option<u64>,
        lend: bool,
    ) -> Option<PeerId> {
        if hdr.ptype == PacketType::Datagram {
            // Stateless: no order or acknowledgement to track; the cold
            // entry names the sender for the layer above. One addressed to
            // an earlier incarnation of this endpoint (its sender's AV entry
            // names it) was meant for a process that is gone: dropped, as a
            // copy of it sent again is. Sealed ones are refused when their
            // sender's packet counter was seen (before any entry is made for
            // a forged address).
            if hdr.dst_inc != 0 && hdr.dst_inc != self.cfg.incarnation {
                // Counted as received, as every datagram past the checks of
                // its bytes is, and then as stale.
                self.stats.received += 1;
                self.stats.dropped_stale += 1;
                return None;
            }
            if let Some(counter) = counter {
                let senders = &mut self.jobs[job.0 as usize].dgram_replay;
                if senders.len() >= DGRAM_SENDERS_MAX && !senders.contains_key(&hdr.src_inc) {
                    senders.clear();
                }
                let w = senders.entry(hdr.src_inc).or_default();
                if w.check(counter) != seal::Replay::Fresh {
                    self.stats.dropped_replay += 1;
                    return None;
                }
            }
            self.stats.received_datagrams += 1;
            let peer = self.peer_heard(from, job);
            let mut msg = self.pool.pop().unwrap_or_default();
            msg.clear();
            msg.extend_from_slice(payload);
            self.events.push_back(Event::Datagram { peer, msg });
            return None;
        }
        if hdr.header_sum {
            // Only an RDMA path guards a payload the checksum leaves out.
            let registers = self.peer_id_in(from, job).map_or(self.default_path, |p| self.path_of(p)).registration;
            if !registers {
                self.stats.dropped_checksum += 1;
                return None;
            }
        }
        self.stats.received += 1;
        let peer = self.peer_heard(from, job);
        let h = self.hot_index(peer, now);
        let my_inc = self.cfg.incarnation;
        let mut data_only = false;
        if let Some(counter) = counter {
            match self.accept_sealed(h, &hdr, counter) {
                None => return None,
                Some(b) => data_only = b == Beyond::DataOnly,
            }
        }
        let mut hot = &mut self.hot[h as usize];
        if hot.retired.contains(&hdr.src_inc) && hdr.src_inc != 0 {
            self.stats.dropped_stale += 1;
            hot.counters.dropped_stale += 1;
            return None;
        }
        if hot.peer_inc == 0 {
            hot.peer_inc = hdr.src_inc;
        } else if hot.peer_inc != hdr.src_inc {
            self.reset_for_restart(h, hdr.src_inc);
            hot = &mut self.hot[h as usize];
        }
        hot.inc_heard = true;
        if hdr.dst_inc != 0 && hdr.dst_inc != my_inc {
            // Addressed to an earlier incarnation of this endpoint: drop it, and
            // answer so the peer learns our new incarnation.
            self.stats.dropped_stale += 1;
            hot.counters.dropped_stale += 1;
            hot.rx.ack_now = true;
            self.schedule(h);
            return None;
        }
        if data_only {
            // Sealed data older than the packet counters tell apart: only
            // what was never received counts, silently.
            if Psn(hdr.psn_or_window).diff(hot.rx.rx_next) < 0 || hot.rx.ooo.contains_key(&hdr.psn_or_window) {
                self.stats.dropped_replay += 1;
                return None;
            }
            self.process_data(h, now, &hdr, payload);
            return None;
        }
        hot.last_heard = now;
        if hdr.ptype != PacketType::Direct {
            // DIRECT packets carry no acknowledgement state (§2.2).
            self.process_ack(h, now, &hdr);
        }
        let mut lent = None;
        match hdr.ptype {
            PacketType::Ack => {
                let reliable = self.path_of(self.hot[h as usize].peer).reliable;
                let hot = &mut self.hot[h as usize];
                hot.tx.peer_window = hdr.psn_or_window.max(1);
                let was_paused = hot.tx.peer_paused;
                hot.tx.peer_paused = hdr.psn_or_window == 0;
                if hot.tx.peer_paused && !was_paused {
                    self.requeue_direct(now, h);
                }
                let hot = &mut self.hot[h as usize];
                if was_paused && !hot.tx.peer_paused && reliable {
                    // The peer refused everything it got while paused, and a
                    // reliable path has no retransmission timer to resend it:
                    // its window reopening is the signal (go back to the
                    // cumulative point, in order, ahead of what never left).
                    self.stats.retransmits += resend_refused(hot);
                }
            }
            PacketType::Direct => {
                // The path delivered it in order with everything sequenced
                // before it (the sender sends DIRECT only when all of that was
                // acknowledged), and a message's fragments back to back:
                // deliver once its last fragment is in. Accepted even while
                // paused (nothing would resend it): the sender stops at our
                // zero-window ACK or the device's flag and requeues what it
                // had not begun (`requeue_direct`), so what still arrives is
                // bounded by what the path holds (PROTOCOL.md §2.2).
                self.stats.received_direct += 1;
                let hot = &self.hot[h as usize];
                if lend && hdr.first && hdr.last && self.events.is_empty() && hot.rx.assembling.is_none() {
                    self.stats.delivered_msgs += 1;
                    lent = Some(hot.peer);
                } else {
                    self.assemble(h, hdr.first, hdr.last, payload);
                }
            }
            _ => self.process_data(h, now, &hdr, payload),
        }
        let hot = &self.hot[h as usize];
        if hot.rx.ack_now || !hot.tx.to_send.is_empty() || !hot.tx.pending.is_empty() {
            self.schedule(h);
        }
        lent
    }

    /// The identity checks of a sealed datagram from hot peer `h`, whose tag
    /// verified (`PROTOCOL.md` §2.5): what of it may go on. A tag proves a
    /// job member made the datagram, not when. So an incarnation of a peer
    /// becomes current only when the application named it (its address), or
    /// when it sent back a cookie this endpoint challenged it with (an echo,
    /// made after the challenge); anything else from it, and anything that
    /// names none or an earlier incarnation of ours, is answered by a
    /// challenge and not acted on. A challenge is answered with an echo (made
    /// now, whatever the challenge's age), and everything it refused goes
    /// again. Incarnations left behind never come back, and within the
    /// current one a packet counter seen before is a replay.
    fn accept_sealed(&mut self, h: u32, hdr: &Header, counter: u64) -> Option<Beyond> {
        let my_inc = self.cfg.incarnation;
        let hot = &mut self.hot[h as usize];
        let inc = hdr.src_inc;
        let sp = hot.sealed.get_or_insert_with(Default::default);
        if inc == 0 || hot.retired.contains(&inc) || sp.history.contains(&inc) {
            self.stats.dropped_stale += 1;
            hot.counters.dropped_stale += 1;
            return None;
        }
        let named = hdr.dst_inc == my_inc;
        if named && hdr.hello != Hello::None {
            // A challenge or echo is refused when sent again, like the rest:
            // by the counters of its incarnation, current or challenged (an
            // incarnation not yet challenged is, by the challenge below).
            if inc != hot.peer_inc && !sp.challenged.iter().any(|c| c.inc == inc) {
                self.challenge(h, inc);
            }
            let hot = &mut self.hot[h as usize];
            let sp = hot.sealed.get_or_insert_with(Default::default);
            let window = if inc == hot.peer_inc {
                Some(&mut sp.replay)
            } else {
                sp.challenged.iter_mut().find(|c| c.inc == inc).map(|c| &mut c.replay)
            };
            if window.is_none_or(|w| w.check(counter) != seal::Replay::Fresh) {
                self.stats.dropped_replay += 1;
                return None;
            }
        }
        let hot = &mut self.hot[h as usize];
        match hdr.hello {
            Hello::Challenge if named => {
                // Everything we sent it since it last took us was refused:
                // all of it again (naming it once it is current), after the
                // echo (whole-message packets go first).
                self.stats.retransmits += resend_refused(hot);
                let (peer, unknown) = (hot.peer, inc != hot.peer_inc);
                self.queue_hello(peer, inc, Hello::Echo, hdr.sack);
                if unknown {
                    // We cannot name it before it is current: ask it too.
                    self.challenge(h, inc);
                }
                self.schedule(h);
                return None;
            }
            Hello::Echo if named => {
                let sp = hot.sealed.get_or_insert_with(Default::default);
                let Some(at) = sp.challenged.iter().position(|c| c.inc == inc && c.cookie == hdr.sack) else {
                    // An echo of a cookie not (or no longer) outstanding.
                    self.stats.dropped_replay += 1;
                    return None;
                };
                if inc == hot.peer_inc {
                    // Current already (the application named it): now heard.
                    sp.challenged.remove(at);
                    hot.inc_heard = true;
                    return None;
                }
                self.take_incarnation(h, inc);
                return None;
            }
            Hello::Challenge | Hello::Echo => {
                self.stats.dropped_stale += 1;
                return None;
            }
            Hello::None => {}
        }
        let sp = hot.sealed.get_or_insert_with(Default::default);
        if !named {
            if hdr.dst_inc == 0 {
                self.stats.dropped_unnamed += 1;
            } else {
                self.stats.dropped_stale += 1;
                hot.counters.dropped_stale += 1;
            }
            // Once the current incarnation was heard from, it has heard from
            // us: one of its datagrams naming none is late, or a replay.
            if !(inc == hot.peer_inc && hot.inc_heard) {
                self.challenge(h, inc);
            }
            return None;
        }
        if inc != hot.peer_inc {
            // Names us, but is not (yet) current: only its echo makes it so.
            self.stats.dropped_unnamed += 1;
            self.challenge(h, inc);
            return None;
        }
        if sp.homed != inc {
            sp.homed = inc;
            let job = self.cold[hot.peer.0 as usize].job.0 as usize;
            self.jobs[job].homes.entry(inc).or_insert(hot.peer);
        }
        match sp.replay.check(counter) {
            seal::Replay::Fresh => Some(Beyond::No),
            // Beyond the window, data is still told apart by its sequence
            // number; its data is taken if never received (it is the
            // sender's), and nothing else of it (a replay could otherwise
            // keep a dead peer alive, or answer old acknowledgements).
            seal::Replay::TooOld if hdr.ptype == PacketType::Data => Some(Beyond::DataOnly),
            seal::Replay::Seen | seal::Replay::TooOld => {
                self.stats.dropped_replay += 1;
                None
            }
        }
    }

    /// Challenges incarnation `inc` at hot peer `h` (its cookie kept, one
    /// per incarnation challenged; the oldest left behind beyond
    /// [`peers::SEALED_HISTORY`]).
    fn challenge(&mut self, h: u32, inc: u64) {
        let hot = &mut self.hot[h as usize];
        let peer = hot.peer;
        let sp = hot.sealed.get_or_insert_with(Default::default);
        let cookie = match sp.challenged.iter().find(|c| c.inc == inc) {
            Some(c) => c.cookie,
            None => {
                // No home from a challenged incarnation: a replay of one of
                // its datagrams from a forged address would pin it there.
                if sp.challenged.len() == peers::SEALED_HISTORY {
                    let oldest = sp.challenged.remove(0);
                    remember(&mut sp.history, oldest.inc);
                }
                // Unique per challenge of this endpoint incarnation (an echo
                // of an earlier one is refused once it is answered).
                self.next_cookie += 1;
                let cookie = self.next_cookie;
                sp.challenged.push(peers::Challenged { inc, cookie, replay: seal::ReplayWindow::default() });
                cookie
            }
        };
        self.queue_hello(peer, inc, Hello::Challenge, cookie);
    }

    /// Queues a challenge or echo to incarnation `inc` of `peer`, unless the
    /// same one waits already.
    fn queue_hello(&mut self, peer: PeerId, inc: u64, hello: Hello, cookie: u64) {
        let queued =
            self.dgram_tx.iter().any(|d| d.peer == peer && d.dst_inc == inc && d.hello == hello && d.sack == cookie);
        if queued {
            return;
        }
        let dst = self.cold[peer.0 as usize].addr;
        let payload = self.take_buffer();
        self.dgram_tx.push_back(DgramTx {
            dst,
            payload,
            token: 0,
            ptype: PacketType::Ack,
            dst_inc: inc,
            peer,
            first: false,
            last: false,
            hello,
            sack: cookie,
        });
    }

    /// Makes `inc` the current incarnation of hot peer `h` (it echoed our
    /// cookie): the one it replaces and every other one challenged are left
    /// behind for good; a restart if there was one.
    fn take_incarnation(&mut self, h: u32, inc: u64) {
        let hot = &mut self.hot[h as usize];
        let peer = hot.peer;
        let old = hot.peer_inc;
        let sp = hot.sealed.get_or_insert_with(Default::default);
        if old != 0 {
            remember(&mut sp.history, old);
        }
        sp.replay = seal::ReplayWindow::default();
        for c in std::mem::take(&mut sp.challenged) {
            if c.inc == inc {
                // Its challenges and echoes so far stay refused if sent again.
                sp.replay = c.replay;
            } else {
                remember(&mut sp.history, c.inc);
            }
        }
        sp.homed = inc;
        let job = self.cold[peer.0 as usize].job.0 as usize;
        self.jobs[job].homes.insert(inc, peer);
        if old == 0 {
            // What we sent named no incarnation and was refused: all of it
            // again, naming this one.
            self.stats.retransmits += resend_refused(hot);
            hot.peer_inc = inc;
        } else {
            self.reset_for_restart(h, inc);
        }
        self.hot[h as usize].inc_heard = true;
        self.schedule(h);
    }

    /// Back-pressure from the layer above. While paused, in-order data that would
    /// start or continue delivery is left unacknowledged (the sender keeps and
    /// resends it) and ACKs advertise a zero window; nothing is ever dropped for
    /// good. Resuming acknowledges at once so senders restart promptly.
    pub fn set_paused(&mut self, paused: bool) {
        if self.paused == paused {
            return;
        }
        self.paused = paused;
        if paused {
            // Peers on reliable, ordered paths send DIRECT packets, which no
            // window holds back: tell them now (an ACK of window 0).
            let ids: Vec<u32> = self
                .hot
                .iter()
                .filter(|(_, h)| {
                    let path = self.path_of(h.peer);
                    path.reliable && path.ordered
                })
                .map(|(i, _)| i as u32)
                .collect();
            for h in ids {
                self.hot[h as usize].rx.ack_now = true;
                self.schedule(h);
            }
        } else {
            let ids: Vec<u32> = self.hot.iter().map(|(i, _)| i as u32).collect();
            for h in ids {
                self.hot[h as usize].rx.ack_now = true;
                self.schedule(h);
            }
        }
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Makes every delayed acknowledgement due now (endpoint close: the peer must
    /// not wait for an ack we would never send).
    pub fn flush_acks(&mut self) {
        let due: Vec<u32> = self
            .hot
            .iter()
            .filter(|(_, h)| h.rx.ack_deadline.is_some() || h.rx.rx_since_ack > 0)
            .map(|(i, _)| i as u32)
            .collect();
        for h in due {
            let hot = &mut self.hot[h as usize];
            hot.rx.ack_deadline = None;
            hot.rx.ack_now = true;
            self.schedule(h);
        }
    }
}

/// Adds `inc` to a sealed peer's incarnations left behind, forgetting the
/// oldest beyond [`peers::SEALED_HISTORY`].
fn remember(history: &mut Vec<u64>, inc: u64) {
    if history.len() == peers::SEALED_HISTORY {
        history.remove(0);
    }
    history.push(inc);
}

/// What of a sealed datagram may be acted on ([`Engine::accept_sealed`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Beyond {
    /// All of it.
    No,
    /// Data beyond the replay window: its data if never received, nothing else.
    DataOnly,
}

/// Senders of sealed unreliable datagrams whose packet counters are kept;
/// beyond, all are forgotten at once (a copy of one of their datagrams is
/// then taken once more).
const DGRAM_SENDERS_MAX: usize = 4096;

/// Queues again, in order and ahead of what never left, every segment of
/// `hot` that went out and is neither acknowledged nor queued (the peer
/// refused it: a window that reopened, a challenge, an incarnation taken);
/// counts them as retransmissions on the peer and returns how many.
fn resend_refused(hot: &mut peers::Hot) -> u64 {
    let mut n = 0u64;
    for seg in hot.tx.unacked.iter_mut().rev() {
        if seg.sent_at.is_some() && !seg.queued && !seg.sacked {
            seg.queued = true;
            hot.tx.to_send.push_front(seg.psn);
            n += 1;
        }
    }
    hot.counters.retransmits += n;
    n
}
