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
        if hdr.job_key != self.cfg.job_key {
            self.stats.dropped_job_key += 1;
            return None;
        }
        if hdr.ptype == PacketType::Datagram {
            // Stateless: no incarnation, order or acknowledgement to track;
            // the cold entry names the sender for the layer above.
            self.stats.received_datagrams += 1;
            let peer = self.peer_heard(from);
            let mut msg = self.pool.pop().unwrap_or_default();
            msg.clear();
            msg.extend_from_slice(payload);
            self.events.push_back(Event::Datagram { peer, msg });
            return None;
        }
        if hdr.header_sum {
            // Only an RDMA path guards a payload the checksum leaves out.
            let registers = self.by_addr.get(&from).map_or(self.default_path, |&p| self.path_of(p)).registration;
            if !registers {
                self.stats.dropped_checksum += 1;
                return None;
            }
        }
        self.stats.received += 1;
        let peer = self.peer_heard(from);
        let h = self.hot_index(peer, now);
        let my_inc = self.cfg.incarnation;
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
                    let mut n = 0u64;
                    for seg in hot.tx.unacked.iter_mut().rev() {
                        if seg.sent_at.is_some() && !seg.queued && !seg.sacked {
                            seg.queued = true;
                            hot.tx.to_send.push_front(seg.psn);
                            n += 1;
                        }
                    }
                    self.stats.retransmits += n;
                    hot.counters.retransmits += n;
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
