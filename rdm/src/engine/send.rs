//! Queueing messages: reliable ones for the sequenced stream ([`Engine::send`],
//! [`Engine::send_gather`]), copied into pooled send buffers and cut into
//! segments as far as the window allows, and unreliable datagrams
//! ([`Engine::send_datagram`]). Separate from `transmit` because these are the
//! inputs the application's sends call; what goes on the wire, and when, is
//! decided when `poll_transmit` pulls.
use super::*;

impl Engine {
    /// Queues a message (the gather list, concatenated) for reliable, in-order
    /// delivery to `peer`. `token` comes back in `SendComplete` / `SendFailed`.
    pub fn send(&mut self, now: Instant, peer: PeerId, parts: &[&[u8]], token: u64) -> Result<(), SendError> {
        self.send_inner(now, peer, parts, None, token)
    }

    /// Like [`Engine::send`] for the message `head ++ gather`, where `gather`
    /// is registered application memory that stays valid and unchanged until
    /// the message completes (`SendComplete` or `SendFailed`): rdm copies
    /// only `head`; each datagram carries the rdm header and its share of
    /// `head` from the transmit buffer, and its share of `gather` straight
    /// from the application's memory ([`Transmit::gather`]), under a checksum
    /// of the header alone. Only on paths whose device registers memory (an
    /// RDMA NIC: the transport guards the payload, and the device gathers);
    /// elsewhere `Unsupported` and nothing is queued.
    pub fn send_gather(
        &mut self,
        now: Instant,
        peer: PeerId,
        head: &[u8],
        gather: LocalBuf,
        token: u64,
    ) -> Result<(), SendError> {
        if peer.0 as usize >= self.cold.len() || !self.path_of(peer).registration || gather.key().is_none() {
            return Err(SendError::Unsupported);
        }
        self.send_inner(now, peer, &[head], Some(gather), token)
    }

    fn send_inner(
        &mut self,
        now: Instant,
        peer: PeerId,
        parts: &[&[u8]],
        gather: Option<LocalBuf>,
        token: u64,
    ) -> Result<(), SendError> {
        if peer.0 as usize >= self.cold.len() {
            // Unknown peer ids cannot come from `peer()`; treat as a full queue
            // rather than panicking.
            return Err(SendError::WouldBlock);
        }
        let held: usize = parts.iter().map(|p| p.len()).sum();
        let len = held + gather.map_or(0, |g| g.len() as usize);
        let h = self.hot_index(peer, now);
        let hot = &self.hot[h as usize];
        if hot.failed {
            self.events.push_back(Event::SendFailed { token, peer, reason: FailReason::Timeout });
            return Ok(());
        }
        if !hot.tx.pending.is_empty() && hot.tx.queued_bytes + len > self.cfg.max_queued_bytes {
            return Err(SendError::WouldBlock);
        }
        self.enqueue_sequenced(now, h, parts, held, gather, token);
        Ok(())
    }

    /// Queues a message for sequenced delivery to the peer of `hot[h]`
    /// (whatever its queue holds: the caller checked the limit, or is
    /// moving a message that was already accepted).
    /// `held` is the bytes of `parts`.
    pub(super) fn enqueue_sequenced(
        &mut self,
        now: Instant,
        h: u32,
        parts: &[&[u8]],
        held: usize,
        gather: Option<LocalBuf>,
        token: u64,
    ) {
        let len = held + gather.map_or(0, |g| g.len() as usize);
        let pool = &mut self.pool;
        let mut data = self.tx_pool.pop().unwrap_or_else(|| Arc::new(pool.pop().unwrap_or_default()));
        // Never clones: only unshared buffers enter the pool.
        let buf = Arc::make_mut(&mut data);
        buf.clear();
        buf.reserve(held);
        for p in parts {
            buf.extend_from_slice(p);
        }
        let hot = &mut self.hot[h as usize];
        if !hot.tx.busy() {
            hot.last_heard = now;
            if hot.tx.unacked.capacity() == 0 && hot.tx.to_send.capacity() == 0 {
                if let Some(spare) = self.spare_queues.pop() {
                    hot.tx.unacked = spare.unacked;
                    hot.tx.pending = spare.pending;
                    hot.tx.to_send = spare.to_send;
                }
            }
        }
        hot.tx.queued_bytes += len;
        hot.tx.pending.push_back(PendingMsg { data, gather, token, next_off: 0 });
        let timeout = hot.last_heard + self.cfg.peer_timeout;
        self.arm(h, timeout);
        self.fill_window(h);
        self.schedule(h);
    }

    /// The largest payload one datagram to `peer` carries: its path's (see
    /// [`Engine::peer_with_path`]), else the engine's.
    pub fn datagram_max(&self, peer: PeerId) -> usize {
        self.path_of(peer).payload_max as usize
    }

    /// Queues the gather list, concatenated, as one unreliable datagram to
    /// `peer`: no sequence number, no retransmission, no segmentation (larger
    /// than [`Engine::datagram_max`] is refused). `SendComplete { token }`
    /// follows once `poll_transmit` has written it out for the device; whether
    /// it arrives is never known.
    pub fn send_datagram(&mut self, peer: PeerId, parts: &[&[u8]], token: u64) -> Result<(), SendError> {
        let Some(cold) = self.cold.get(peer.0 as usize) else { return Err(SendError::WouldBlock) };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let max = self.datagram_max(peer);
        if len > max {
            return Err(SendError::TooLarge { len, max });
        }
        if !self.dgram_tx.is_empty() && self.dgram_bytes + len > self.cfg.max_queued_bytes {
            return Err(SendError::WouldBlock);
        }
        let dst = cold.addr;
        // The incarnation the application addressed (its AV entry): a
        // receiver that restarted since drops the datagram, and so drops
        // copies of it sent again later.
        let dst_inc = match cold.hot() {
            Some(h) => self.hot[h as usize].peer_inc,
            None => self.expected_inc.get(&peer.0).copied().unwrap_or(0),
        };
        let mut payload = self.pool.pop().unwrap_or_default();
        payload.clear();
        for p in parts {
            payload.extend_from_slice(p);
        }
        self.dgram_bytes += len;
        self.dgram_tx.push_back(DgramTx {
            dst,
            payload,
            token,
            ptype: PacketType::Datagram,
            dst_inc,
            peer,
            first: false,
            last: false,
            hello: Hello::None,
            sack: 0,
        });
        Ok(())
    }
}
