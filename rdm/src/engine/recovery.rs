//! Loss recovery and congestion control: the timer heap (delayed acks,
//! retransmission timeouts, peer timeouts), retransmission of holes on timeout,
//! and the processing of acknowledgements (RTT estimate, cumulative and
//! selective acks, fast retransmission, the congestion window).
use super::*;

impl Engine {
    /// When `handle_timeout` must next be called (possibly a little early: a
    /// deadline that moved later leaves its old entry, which then fires and is
    /// skipped). [`Engine::next_timeout`] is exact.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((t, _))| *t)
    }

    /// Like [`Engine::poll_timeout`], after dropping stale entries from the top:
    /// `None` when no peer has a deadline (callers then read no clock).
    pub fn next_timeout(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, h))) = self.timers.peek() {
            if self.hot.get(h as usize).is_some_and(|hot| hot.armed_at == Some(t)) {
                return Some(t);
            }
            self.timers.pop();
        }
        None
    }

    /// Puts peer `h`'s deadline `t` on the timer heap if it is earlier than the
    /// one already there. Called wherever a deadline is set; [`Engine::fire`]
    /// re-arms the next one.
    pub(super) fn arm(&mut self, h: u32, t: Instant) {
        let Some(hot) = self.hot.get_mut(h as usize) else { return };
        if hot.armed_at.is_none_or(|a| t < a) {
            hot.armed_at = Some(t);
            self.timers.push(Reverse((t, h)));
        }
    }

    /// Runs the timers that are due: O(due peers · log n), not a scan of every
    /// peer.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(&Reverse((t, h))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            // Only the live entry of a peer fires; older ones are stale.
            let live = self.hot.get_mut(h as usize).is_some_and(|hot| {
                let live = hot.armed_at == Some(t);
                if live {
                    hot.armed_at = None;
                }
                live
            });
            if live {
                self.fire(h, now);
            }
        }
    }

    /// Peer `h`'s timers at `now`: delayed ack, peer timeout, retransmission;
    /// then re-arms its next deadline.
    fn fire(&mut self, h: u32, now: Instant) {
        let Some(hot) = self.hot.get_mut(h as usize) else { return };
        let mut wake = false;
        if hot.ack_deadline.is_some_and(|d| d <= now) {
            hot.ack_deadline = None;
            hot.ack_now = true;
            wake = true;
        }
        if hot.busy() && now.saturating_duration_since(hot.last_heard) >= self.cfg.peer_timeout {
            self.fail_peer(h, FailReason::Timeout);
            self.hot[h as usize].failed = true;
            self.events.push_back(Event::PeerUnreachable { peer: self.hot[h as usize].peer });
            self.stats.peers_failed += 1;
            self.schedule(h);
            self.rearm(h);
            return;
        }
        let hot = &mut self.hot[h as usize];
        if hot.probing && hot.rto_deadline.is_some_and(|d| d <= now) {
            // A probe (RFC 8985's tail loss probe): resend the newest datagram
            // still unacknowledged after the probe time; keep the window and
            // the backoff, and arm the full RTO behind it. If the tail of a
            // flight was lost, the peer's answer to the probe selectively
            // acknowledges it and shows the holes before it, which fast
            // retransmission then fills.
            let pto = hot.probe_time(self.cfg.max_rto, self.cfg.ack_delay).unwrap_or(hot.rto);
            hot.probes_fired += 1;
            let overdue = hot
                .unacked
                .iter_mut()
                .rev()
                .find(|seg| !seg.sacked && !seg.queued && seg.sent_at.is_some_and(|t| now.saturating_duration_since(t) + Duration::from_micros(10) >= pto));
            let queued = overdue.is_some();
            if let Some(seg) = overdue {
                seg.queued = true;
                hot.to_send.push_back(seg.psn);
            }
            self.stats.probes += 1;
            // A second probe if the first (or its answer) was lost too, then
            // the full RTO.
            let (max_rto, ack_delay) = (self.cfg.max_rto, self.cfg.ack_delay);
            hot.rto_deadline = Some(now + hot.retransmit_timer(max_rto, ack_delay));
            if queued {
                wake = true;
            }
        } else if hot.rto_deadline.is_some_and(|d| d <= now) {
            hot.rto_deadline = None;
            // Retransmit every hole (not selectively acked) that has been out
            // for at least an RTO, oldest first, not only the first one: at
            // high loss several holes are usually open at once.
            let rto = hot.rto;
            let mut queued = 0;
            for seg in hot.unacked.iter_mut() {
                if seg.sacked || seg.queued {
                    continue;
                }
                if seg.sent_at.is_some_and(|t| now.saturating_duration_since(t) + Duration::from_micros(10) >= rto) {
                    seg.queued = true;
                    hot.to_send.push_back(seg.psn);
                    queued += 1;
                    if queued >= 64 {
                        break;
                    }
                }
            }
            if queued > 0 || hot.unacked.iter().any(|s| !s.sacked) {
                hot.backoff = (hot.backoff * 2).min(16);
                if hot.backoff > 2 || queue_building(hot.round_min_rtt.or(hot.last_round_min_rtt), hot.min_rtt) {
                    // Repeated timeouts (a path that lost everything, or a
                    // peer gone) or a queue: start again from a few packets.
                    hot.ssthresh = (hot.cwnd / 2.0).max(4.0);
                    hot.cwnd = 4.0f64.max(queued as f64).min(hot.ssthresh.max(4.0));
                    self.stats.congestion_reductions += 1;
                } else {
                    // A first timeout without a queue: a tail or a lost
                    // retransmission under random loss; keep most of the window.
                    hot.ssthresh = (hot.cwnd * 0.7).max(4.0);
                    hot.cwnd = hot.ssthresh;
                }
                hot.recover = Some(hot.next_psn);
                self.stats.timeouts += 1;
                wake = true;
                if queued == 0 {
                    // Nothing old enough yet: look again after an RTO.
                    hot.rto_deadline = Some(now + rto);
                }
            }
        }
        if wake {
            self.schedule(h);
        }
        self.rearm(h);
    }

    /// Keeps peer `h`'s heap entry no later than its earliest pending deadline,
    /// and drops it (marks it stale) when the peer has none left: called after
    /// deadlines are set or cleared. A deadline that moved later keeps the
    /// earlier entry, which fires, finds nothing due and re-arms: one early
    /// wake-up instead of a heap push per message.
    pub(super) fn rearm(&mut self, h: u32) {
        let Some(hot) = self.hot.get_mut(h as usize) else { return };
        let timeout = hot.busy().then(|| hot.last_heard + self.cfg.peer_timeout);
        match ([hot.ack_deadline, hot.rto_deadline, timeout].into_iter().flatten().min(), hot.armed_at) {
            (None, _) => hot.armed_at = None,
            (Some(t), Some(a)) if a <= t => {}
            (Some(t), _) => {
                hot.armed_at = Some(t);
                self.timers.push(Reverse((t, h)));
            }
        }
    }

    pub(super) fn process_ack(&mut self, h: u32, now: Instant, hdr: &Header) {
        let hot = &mut self.hot[h as usize];
        let mut advanced = false;
        let mut rtt_sample: Option<Duration> = None;
        // The ack cannot be ahead of what we sent.
        if hdr.ack.diff(hot.next_psn) > 0 {
            return;
        }
        while let Some(front) = hot.unacked.front() {
            if !front.psn.lt(hdr.ack) {
                break;
            }
            let Some(seg) = hot.unacked.pop_front() else { break };
            advanced = true;
            hot.round_acked += 1;
            hot.round_retx += u32::from(seg.retransmitted);
            // Karn: no sample from retransmitted segments, nor from segments that
            // waited for a hole to be filled (their delay is recovery, not RTT).
            if !seg.retransmitted && !seg.sacked {
                if let Some(t) = seg.sent_at {
                    rtt_sample = Some(now.saturating_duration_since(t));
                }
            }
            if hot.cwnd < hot.ssthresh {
                hot.cwnd += 1.0;
            } else {
                hot.cwnd += 1.0 / hot.cwnd.max(1.0);
            }
            hot.cwnd = hot.cwnd.min(self.cfg.max_window as f64);
            if seg.last {
                self.events.push_back(Event::SendComplete { token: seg.token });
                // The last reference (earlier segments were acknowledged
                // first, the usual case): keep buffer and count block.
                if Arc::strong_count(&seg.data) == 1 && self.tx_pool.len() < POOL_DEPTH && seg.data.capacity() <= POOL_MAX_CAPACITY {
                    self.tx_pool.push(seg.data);
                }
            }
        }
        // Selective acks: mark, and fast-retransmit holes below the highest one.
        // A hole is resent once per smoothed RTT at most (a lost retransmission
        // is resent again without waiting for the timer).
        let srtt = hot.srtt.unwrap_or(self.cfg.initial_rto);
        let resend_ok = |seg: &TxSeg| match seg.sent_at {
            None => false,
            Some(t) => !seg.retransmitted || now.saturating_duration_since(t) > srtt + srtt / 2,
        };
        if hdr.sack != 0 && !hot.reliable {
            let highest = 64 - hdr.sack.leading_zeros();
            let base = hdr.ack;
            let mut fast = 0;
            for seg in hot.unacked.iter_mut() {
                let d = seg.psn.diff(base);
                if d < 1 {
                    // d == 0 is the hole at the cumulative point.
                    if d == 0 && !seg.queued && resend_ok(seg) {
                        seg.queued = true;
                        hot.to_send.push_front(seg.psn);
                        fast += 1;
                    }
                    continue;
                }
                if d > 64 {
                    break;
                }
                if hdr.sack & (1 << (d - 1)) != 0 {
                    seg.sacked = true;
                } else if (d as u32) < highest && !seg.queued && resend_ok(seg) {
                    seg.queued = true;
                    hot.to_send.push_back(seg.psn);
                    fast += 1;
                }
            }
            if fast > 0 {
                self.stats.fast_retransmits += fast;
                // Random loss is not congestion: the window shrinks (halved,
                // once per round trip) only when the RTT shows a queue. A
                // window halved on every lost datagram keeps a few packets in
                // flight at 5% random loss, a small fraction of the path.
                let in_recovery = hot.recover.is_some_and(|r| hdr.ack.lt(r));
                if !in_recovery {
                    hot.recover = Some(hot.next_psn);
                    if queue_building(hot.round_min_rtt.or(hot.last_round_min_rtt), hot.min_rtt) {
                        hot.ssthresh = (hot.cwnd * 0.5).max(4.0);
                        hot.cwnd = hot.ssthresh;
                        self.stats.congestion_reductions += 1;
                    }
                }
            }
        }
        if let Some(r) = rtt_sample {
            hot.min_rtt = Some(hot.min_rtt.map_or(r, |m| m.min(r)));
            hot.round_min_rtt = Some(hot.round_min_rtt.map_or(r, |m| m.min(r)));
            // RFC 6298.
            match hot.srtt {
                None => {
                    hot.srtt = Some(r);
                    hot.rttvar = r / 2;
                }
                Some(s) => {
                    let diff = s.abs_diff(r);
                    hot.rttvar = (hot.rttvar * 3 + diff) / 4;
                    hot.srtt = Some((s * 7 + r) / 8);
                }
            }
            let s = hot.srtt.unwrap_or(r);
            hot.rto = (s + (hot.rttvar * 4).max(Duration::from_micros(100))).clamp(self.cfg.min_rto, self.cfg.max_rto);
        }
        if advanced && !hot.busy() {
            // Idle again: give back what a burst grew, so an idle peer stays small;
            // queues of a modest size go to the engine's spares for reuse. With
            // nothing unacknowledged, what `to_send` still lists is stale.
            hot.to_send.clear();
            let spare = SpareQueues {
                unacked: std::mem::take(&mut hot.unacked),
                pending: std::mem::take(&mut hot.pending),
                to_send: std::mem::take(&mut hot.to_send),
            };
            let modest = spare.unacked.capacity().max(spare.pending.capacity()).max(spare.to_send.capacity())
                <= SPARE_MAX_ENTRIES;
            if modest && self.spare_queues.len() < POOL_DEPTH {
                self.spare_queues.push(spare);
            }
        }
        if advanced && !hdr.ack.lt(hot.round_end) {
            // A round ended. If it and the round before each needed more
            // than a third of their datagrams resent, the path is
            // overflowing, whatever the RTT says: halve the window (once per
            // round trip, as for a queue). One such round alone is a burst —
            // a dropped GSO run is dozens of datagrams — not a buffer that
            // stays full.
            let heavy = heavy_loss(hot.round_acked, hot.round_retx);
            let twice = heavy && hot.last_round_heavy;
            hot.last_round_heavy = heavy;
            if twice && !hot.recover.is_some_and(|r| hdr.ack.lt(r)) {
                hot.recover = Some(hot.next_psn);
                hot.ssthresh = (hot.cwnd * 0.5).max(4.0);
                hot.cwnd = hot.ssthresh;
                self.stats.congestion_reductions += 1;
            }
            hot.round_end = hot.next_psn;
            hot.round_acked = 0;
            hot.round_retx = 0;
            hot.last_round_min_rtt = hot.round_min_rtt.take().or(hot.last_round_min_rtt);
        }
        if advanced {
            hot.backoff = 1;
            hot.probes_fired = 0;
            let (max_rto, ack_delay) = (self.cfg.max_rto, self.cfg.ack_delay);
            hot.rto_deadline = if hot.unacked.is_empty() || hot.reliable { None } else { Some(now + hot.retransmit_timer(max_rto, ack_delay)) };
            self.rearm(h);
        }
    }
}

/// Whether the RTT shows a queue on the path: the lowest RTT of the round
/// (every sample of a round carries a queue; only some carry the receiver's
/// ack batching or a delayed-ack timer) exceeds twice the lowest ever seen
/// plus 500 µs. On loopback the lowest RTT is ~10 µs while a round's lowest
/// sits at 100–400 µs from receive batching alone (measured with 5% random
/// loss and no queue); a socket buffer or link queue that fills adds
/// milliseconds. Congestion that drops before it queues that much shows as
/// [`heavy_loss`] instead.
fn queue_building(round_min_rtt: Option<Duration>, min_rtt: Option<Duration>) -> bool {
    match (round_min_rtt, min_rtt) {
        (Some(s), Some(m)) => s > m * 2 + Duration::from_micros(300),
        // No sample yet: assume the worst.
        _ => true,
    }
}

/// Whether a round needed more than a third of its datagrams resent (at
/// least 20 acknowledged): far beyond random loss on any usable path.
fn heavy_loss(acked: u32, resent: u32) -> bool {
    acked >= 20 && resent * 3 > acked
}
