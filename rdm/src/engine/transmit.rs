//! The output side: [`Engine::poll_transmit`] writes the queued
//! whole-message packets (DGRAM, DIRECT) first, then each ready peer's data
//! segments (one datagram, or a run of them where the device takes runs) and
//! its pure acknowledgements; the ready queue that names the peers with
//! something to send; cutting pending messages into segments as the window
//! opens. What to resend and when is [`recovery`]'s; this part only writes it.
//! Separate because it is the one place datagrams are encoded for the device,
//! and one of the two per-message hot paths.
use super::*;

impl Engine {
    pub(super) fn schedule(&mut self, h: u32) {
        let hot = &mut self.hot[h as usize];
        if !hot.scheduled {
            hot.scheduled = true;
            self.ready.push_back(h);
        }
    }

    /// Writes the oldest queued whole-message packet (DGRAM or DIRECT) into
    /// `buf`, if any, and reports its send complete.
    fn transmit_datagram(&mut self, buf: &mut [u8]) -> Option<Transmit> {
        let d = self.dgram_tx.front()?;
        let sealed = self.sealing_of(d.peer);
        let trailer = if sealed == Sealed::No { 0 } else { TRAILER_LEN };
        if buf.len() < HEADER_LEN + d.payload.len() + trailer {
            return None;
        }
        let d = self.dgram_tx.pop_front()?;
        let job = self.cold[d.peer.0 as usize].job.0 as usize;
        let header = Header {
            ptype: d.ptype,
            first: d.first,
            last: d.last,
            job_key: self.jobs[job].key,
            src_inc: self.cfg.incarnation,
            dst_inc: d.dst_inc,
            // A challenge or echo (the ACKs queued here) closes no window.
            psn_or_window: if d.ptype == PacketType::Ack { RX_WINDOW } else { 0 },
            ack: Psn(0),
            sack: d.sack,
            header_sum: false,
            unsummed: unsummed_to(&d.dst, self.path_of(d.peer)),
            sealed,
            hello: d.hello,
        };
        let mut len = header.encode(&d.payload, buf);
        if let (Some(s), true) = (self.jobs[job].sealer.as_mut(), sealed != Sealed::No) {
            len = s.seal(buf, len, sealed);
        }
        self.dgram_bytes -= d.payload.len();
        if d.ptype == PacketType::Ack {
            if d.hello == Hello::Challenge {
                self.stats.sent_challenges += 1;
            }
        } else if d.ptype == PacketType::Direct {
            self.stats.sent_direct += 1;
            if d.last {
                self.events.push_back(Event::SendComplete { token: d.token });
                // Until the layer above takes that event, a device report
                // that the datagram could not be delivered turns it into a
                // failure (see `unreachable`).
                self.direct_unpolled.push((d.token, d.peer));
            }
        } else {
            self.stats.sent_datagrams += 1;
            self.events.push_back(Event::SendComplete { token: d.token });
        }
        self.recycle(d.payload);
        Some(Transmit { dst: d.dst, len, seg: len, gather: None })
    }

    /// Moves pending messages into segments while the window allows.
    pub(super) fn fill_window(&mut self, h: u32) {
        let peer = self.hot[h as usize].peer;
        let payload_max = self.path_of(peer).payload_max as usize;
        let sealed = self.sealing_of(peer) != Sealed::No;
        let hot = &mut self.hot[h as usize];
        let mut window = hot.cc.window().min(hot.tx.peer_window).min(self.cfg.max_window).max(1);
        if sealed && hot.peer_inc == 0 {
            // A sealed receiver acts on nothing that does not name it: one
            // datagram asks for its incarnation; the rest waits for it.
            window = 1;
        }
        while (hot.tx.unacked.len() as u32) < window {
            let Some(m) = hot.tx.pending.front_mut() else { break };
            let total = m.data.len() + m.gather.map_or(0, |g| g.len() as usize);
            let off = m.next_off;
            let len = (total - off).min(payload_max);
            let first = off == 0;
            let last = off + len == total;
            let psn = hot.tx.next_psn;
            hot.tx.next_psn = psn.next();
            hot.tx.unacked.push_back(TxSeg {
                psn,
                data: m.data.clone(),
                gather: m.gather,
                off: off as u32,
                len: len as u32,
                first,
                last,
                token: m.token,
                sent_at: None,
                retransmitted: false,
                sacked: false,
                queued: true,
            });
            hot.tx.to_send.push_back(psn);
            m.next_off = off + len;
            if last {
                hot.tx.queued_bytes = hot.tx.queued_bytes.saturating_sub(total);
                hot.tx.pending.pop_front();
            }
        }
    }

    /// Writes the next datagram to send into `buf` (at least `mtu` bytes).
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut [u8]) -> Option<Transmit> {
        if !self.dgram_tx.is_empty() {
            if let Some(t) = self.transmit_datagram(buf) {
                return Some(t);
            }
        }
        while let Some(&h) = self.ready.front() {
            if !self.hot.contains(h as usize) {
                self.ready.pop_front();
                continue;
            }
            self.fill_window(h);
            let my_inc = self.cfg.incarnation;
            let max_rto = self.cfg.max_rto;
            let ack_delay = self.cfg.ack_delay;
            let hot = &mut self.hot[h as usize];
            let cold = &self.cold[hot.peer.0 as usize];
            let (dst, path) = (cold.addr, cold.path.unwrap_or(self.default_path));
            let job = &mut self.jobs[cold.job.0 as usize];
            let job_key = job.key;
            let reliable = path.reliable;
            let unsummed = unsummed_to(&dst, path);
            let sealed = match &job.sealer {
                Some(s) if !dst.crosses_no_wire() => s.sealing(),
                _ => Sealed::No,
            };
            let trailer = if sealed == Sealed::No { 0 } else { TRAILER_LEN };
            // Data: one datagram, or a run of them back to back in `buf` where the
            // path's device takes runs (each `seg` bytes, the last maybe shorter).
            let run_room = if path.gso && self.runs { buf.len().min(RUN_MAX_BYTES) } else { 0 };
            let (mut total, mut seg_len, mut count) = (0usize, 0usize, 0usize);
            while let Some(&psn) = hot.tx.to_send.front() {
                let Some(front) = hot.tx.unacked.front() else {
                    hot.tx.to_send.pop_front();
                    break;
                };
                let idx = psn.diff(front.psn);
                if idx < 0 || idx as usize >= hot.tx.unacked.len() || hot.tx.unacked[idx as usize].sacked {
                    // Acknowledged meanwhile.
                    hot.tx.to_send.pop_front();
                    if let Some(seg) = usize::try_from(idx).ok().and_then(|i| hot.tx.unacked.get_mut(i)) {
                        seg.queued = false;
                    }
                    continue;
                }
                let (held_len, gather) = {
                    let seg = &hot.tx.unacked[idx as usize];
                    let (held, gather) = seg.split();
                    let (sent_before, retransmitted_before) = (seg.sent_at, seg.retransmitted);
                    (
                        held.len(),
                        gather.map(|buf| Gathered { buf, peer: hot.peer, psn, sent_before, retransmitted_before }),
                    )
                };
                let wire_len = HEADER_LEN + held_len + trailer;
                if total == 0 {
                    if buf.len() < wire_len {
                        return None;
                    }
                } else if gather.is_some()
                    || wire_len > seg_len
                    || total + wire_len > run_room
                    || count >= RUN_MAX_SEGMENTS
                {
                    // A datagram with a gathered part goes alone.
                    break;
                }
                hot.tx.to_send.pop_front();
                let sack = hot.rx.sack_bits();
                let (rx_next, peer_inc) = (hot.rx.rx_next, hot.peer_inc);
                let seg = &mut hot.tx.unacked[idx as usize];
                seg.queued = false;
                let header = Header {
                    ptype: PacketType::Data,
                    first: seg.first,
                    last: seg.last,
                    job_key,
                    src_inc: my_inc,
                    dst_inc: peer_inc,
                    psn_or_window: seg.psn.0,
                    ack: rx_next,
                    sack,
                    header_sum: gather.is_some(),
                    unsummed,
                    sealed,
                    hello: Hello::None,
                };
                let mut len = header.encode(seg.split().0, &mut buf[total..]);
                if let (Some(s), true) = (job.sealer.as_mut(), sealed != Sealed::No) {
                    len = s.seal(&mut buf[total..], len, sealed);
                }
                if seg.sent_at.is_some() {
                    seg.retransmitted = true;
                    self.stats.retransmits += 1;
                    hot.counters.retransmits += 1;
                }
                seg.sent_at = Some(now);
                if hot.tx.rto_deadline.is_none() && !reliable {
                    let d = now + hot.tx.retransmit_timer(max_rto, ack_delay);
                    hot.tx.rto_deadline = Some(d);
                    // Inline `arm` (the peer is borrowed from `self.hot`).
                    if hot.armed_at.is_none_or(|a| d < a) {
                        hot.armed_at = Some(d);
                        self.timers.push(Reverse((d, h)));
                    }
                }
                // Every data packet carries the cumulative ack.
                hot.rx.ack_now = false;
                hot.rx.ack_deadline = None;
                hot.rx.rx_since_ack = 0;
                self.stats.sent_data += 1;
                if total == 0 {
                    seg_len = len;
                }
                total += len;
                count += 1;
                if gather.is_some() {
                    return Some(Transmit { dst, len, seg: len, gather });
                }
                // A shorter datagram ends a run; without runs, one datagram.
                if len < seg_len || run_room == 0 {
                    break;
                }
            }
            if total > 0 {
                return Some(Transmit { dst, len: total, seg: seg_len, gather: None });
            }
            if hot.rx.ack_now {
                hot.rx.ack_now = false;
                hot.rx.ack_deadline = None;
                hot.rx.rx_since_ack = 0;
                let header = Header {
                    ptype: PacketType::Ack,
                    first: false,
                    last: false,
                    job_key,
                    src_inc: my_inc,
                    dst_inc: hot.peer_inc,
                    psn_or_window: if self.paused { 0 } else { RX_WINDOW.saturating_sub(hot.rx.ooo.len() as u32) },
                    ack: hot.rx.rx_next,
                    sack: hot.rx.sack_bits(),
                    header_sum: false,
                    unsummed,
                    sealed,
                    hello: Hello::None,
                };
                if buf.len() < HEADER_LEN + trailer {
                    return None;
                }
                let mut len = header.encode(&[], buf);
                if let (Some(s), true) = (job.sealer.as_mut(), sealed != Sealed::No) {
                    len = s.seal(buf, len, sealed);
                }
                self.stats.sent_acks += 1;
                return Some(Transmit { dst, len, seg: len, gather: None });
            }
            hot.scheduled = false;
            self.ready.pop_front();
        }
        None
    }

    /// The device did not take the gathered datagram `poll_transmit` gave
    /// with `g` (its send queue was full): its segment goes back to the front
    /// of its peer's queue, to be written again by a later `poll_transmit` if
    /// its message is still pending then. The caller drops the datagram and
    /// keeps no copy of `g`'s address (see [`Gathered`]). What forming it
    /// changed is undone: the segment's send time and retransmission mark,
    /// the data and retransmit counts, and the acknowledgement the datagram
    /// would have carried (owed again, at once). Its retransmission timer is
    /// not (see [`Gathered`]). Several given back in a row go back
    /// newest first, so that they are formed again in order.
    pub fn not_transmitted(&mut self, g: Gathered) {
        let Some(h) = self.cold.get(g.peer.0 as usize).and_then(|c| c.hot()) else { return };
        let Some(hot) = self.hot.get_mut(h as usize) else { return };
        hot.rx.ack_now = true;
        let Some(front) = hot.tx.unacked.front() else { return };
        let idx = g.psn.diff(front.psn);
        let Some(seg) = usize::try_from(idx).ok().and_then(|i| hot.tx.unacked.get_mut(i)) else { return };
        if seg.sacked || seg.queued {
            return;
        }
        // Formed in the same flush, so its send time is set.
        debug_assert!(seg.sent_at.is_some(), "a gathered datagram given back was formed");
        seg.sent_at = g.sent_before;
        seg.retransmitted = g.retransmitted_before;
        self.stats.sent_data = self.stats.sent_data.saturating_sub(1);
        if g.sent_before.is_some() {
            self.stats.retransmits = self.stats.retransmits.saturating_sub(1);
            hot.counters.retransmits = hot.counters.retransmits.saturating_sub(1);
        }
        seg.queued = true;
        hot.tx.to_send.push_front(g.psn);
        self.schedule(h);
    }

    /// A device refused a run of datagrams (its offload went away): form no
    /// more runs; everything goes as single datagrams.
    pub fn disable_runs(&mut self) {
        self.runs = false;
    }

    /// Whether `poll_transmit` may have a datagram (some peer is scheduled); a
    /// caller may skip reading the clock and polling when not.
    pub fn wants_transmit(&self) -> bool {
        !self.ready.is_empty() || !self.dgram_tx.is_empty()
    }
}
