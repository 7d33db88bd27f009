//! DIRECT packets (`rdm/PROTOCOL.md` §2.2): on a reliable, ordered path, a
//! message with nothing sequenced to its peer ahead of it goes without sequence
//! number or acknowledgement: queued ([`Engine::send_transmit_complete`]),
//! written at once into the caller's buffer ([`Engine::transmit_direct_now`]),
//! or handed to the caller's device over a route ([`Engine::direct_route`]). When the
//! peer pauses, what was queued DIRECT and not begun goes sequenced instead
//! ([`Engine::peer_holds_back`]). Separate because it is shared memory's
//! small-message fast path, with its own conditions and its own argument for
//! why nothing overtakes the sequenced stream.
use super::*;

/// Whether a message to the peer of `hot` over `path` may go as DIRECT
/// packets (rdm/PROTOCOL.md §2.2), size and queue aside: the path keeps
/// datagrams intact and in order, nothing sequenced to the peer is in
/// flight ahead of it, and the peer was heard from: a valid packet of ours
/// from it proved it is in this job and this incarnation, so a DIRECT
/// packet (which nothing acknowledges) cannot be silently dropped there as
/// foreign or stale while its send reports success.
fn direct_allowed(path: PeerPath, hot: &Hot) -> bool {
    path.reliable && path.ordered && hot.inc_heard && !hot.failed && !hot.tx.peer_paused && !hot.tx.busy()
}

impl Engine {
    /// The receiver of `peer` holds its senders back: its device says so
    /// ([`crate::device::Device::held_back`]: shared memory's ring flag, set
    /// while that receiver's engine is paused), before its zero-window ACK
    /// arrives or when this endpoint does not read its own input in time (an
    /// application that only sends). Taken as that ACK: no more DIRECT
    /// packets to it, and those queued and not begun go sequenced.
    pub fn peer_holds_back(&mut self, now: Instant, peer: PeerId) {
        let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) else { return };
        let hot = &mut self.hot[h as usize];
        if hot.tx.peer_paused {
            return;
        }
        hot.tx.peer_paused = true;
        hot.tx.peer_window = 1;
        self.requeue_direct(now, h);
    }

    /// The peer of `hot[h]` paused: its DIRECT messages still queued, and not
    /// begun, become sequenced messages, in their order and ahead of anything
    /// sent to it later, so that its zero window holds them back. A paused
    /// receiver still takes DIRECT packets (nothing would resend them), so
    /// without this every DIRECT message queued before the pause would still
    /// land in its unexpected storage, beyond its limit. The fragments left
    /// of a message already begun go on as DIRECT (the receiver is putting it
    /// together). Sequenced delivery is only ever chosen for a peer with
    /// nothing DIRECT ahead of it, so nothing overtakes: the sequenced queue
    /// of a peer that took DIRECT packets was empty.
    pub(super) fn requeue_direct(&mut self, now: Instant, h: u32) {
        let peer = self.hot[h as usize].peer;
        if !self.dgram_tx.iter().any(|d| d.peer == peer && d.ptype == PacketType::Direct) {
            return;
        }
        let queued = std::mem::take(&mut self.dgram_tx);
        let mut begun = true;
        let mut message: Vec<u8> = Vec::new();
        let mut moved: Vec<(Vec<u8>, u64)> = Vec::new();
        for d in queued {
            if d.peer != peer || d.ptype != PacketType::Direct {
                self.dgram_tx.push_back(d);
                continue;
            }
            if begun && !d.first {
                begun = !d.last;
                self.dgram_tx.push_back(d);
                continue;
            }
            begun = false;
            self.dgram_bytes -= d.payload.len();
            message.extend_from_slice(&d.payload);
            if d.last {
                moved.push((std::mem::take(&mut message), d.token));
            }
            self.recycle(d.payload);
        }
        for (data, token) in moved {
            self.stats.direct_requeued += 1;
            self.enqueue_sequenced(now, h, &[&data], data.len(), None, token);
        }
    }

    /// Like [`Engine::send`], but the message may complete once written out
    /// instead of once acknowledged (libfabric's transmit complete): on a
    /// reliable, ordered path, to a peer already heard from (so of this job
    /// and incarnation), a message that fits in one datagram and has
    /// nothing sequenced to the same peer ahead of it goes as one DIRECT packet
    /// (rdm/PROTOCOL.md §2.2) — no sequence number, no acknowledgement, no
    /// per-message state — and `SendComplete` follows when `poll_transmit` has
    /// written it. Anywhere else it is exactly [`Engine::send`].
    pub fn send_transmit_complete(
        &mut self,
        now: Instant,
        peer: PeerId,
        parts: &[&[u8]],
        token: u64,
    ) -> Result<(), SendError> {
        if let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) {
            let path = self.path_of(peer);
            let hot = &self.hot[h as usize];
            let len: usize = parts.iter().map(|p| p.len()).sum();
            if direct_allowed(path, hot)
                && len <= DIRECT_MAX
                && (self.dgram_tx.is_empty() || self.dgram_bytes + len <= self.cfg.max_queued_bytes)
            {
                // Cut into fragments of the path's payload size: the path keeps
                // them in order, so they need no sequence number either.
                let dst_inc = hot.peer_inc;
                let payload_max = (path.payload_max as usize).max(1);
                let dst = self.cold[peer.0 as usize].addr;
                let mut parts = parts.iter().copied().filter(|p| !p.is_empty()).peekable();
                let mut taken = 0usize;
                let mut off_in_part = 0usize;
                loop {
                    let n = (len - taken).min(payload_max);
                    let mut payload = self.pool.pop().unwrap_or_default();
                    payload.clear();
                    while payload.len() < n {
                        let Some(p) = parts.peek() else { break };
                        let k = (p.len() - off_in_part).min(n - payload.len());
                        payload.extend_from_slice(&p[off_in_part..off_in_part + k]);
                        off_in_part += k;
                        if off_in_part == p.len() {
                            parts.next();
                            off_in_part = 0;
                        }
                    }
                    let first = taken == 0;
                    taken += n;
                    let last = taken >= len;
                    self.dgram_tx.push_back(DgramTx {
                        dst,
                        payload,
                        token,
                        ptype: PacketType::Direct,
                        dst_inc,
                        peer,
                        first,
                        last,
                        hello: Hello::None,
                        sack: 0,
                    });
                    if last {
                        break;
                    }
                }
                self.dgram_bytes += len;
                return Ok(());
            }
        } else if self.cold.get(peer.0 as usize).and_then(|c| c.path).is_some_and(|p| p.reliable && p.ordered) {
            // First traffic to the peer: create its state (it names the
            // incarnation the application expects), then take the fast path.
            self.hot_index(peer, now);
            return self.send_transmit_complete(now, peer, parts, token);
        }
        self.send(now, peer, parts, token)
    }

    /// Where a DIRECT datagram of `len` payload bytes to `peer` goes, and
    /// its header, if one may go now: nothing queued to write ahead of it,
    /// DIRECT allowed to the peer, one datagram of its path. The conditions
    /// of both ways of sending one ([`Engine::transmit_direct_now`],
    /// [`Engine::direct_route`]).
    fn direct_header(&self, peer: PeerId, len: usize) -> Option<(DevAddr, Header)> {
        if !self.dgram_tx.is_empty() {
            return None;
        }
        let cold = self.cold.get(peer.0 as usize)?;
        let hot = &self.hot[cold.hot()? as usize];
        let path = self.path_of(peer);
        if !(direct_allowed(path, hot) && len <= (path.payload_max as usize).min(DIRECT_MAX)) {
            return None;
        }
        // DIRECT packets are never sealed (a receiver with a secret takes
        // them only from a shared-memory ring): over a wire, DATA.
        if self.sealing_of(peer) != Sealed::No {
            return None;
        }
        let header = Header {
            ptype: PacketType::Direct,
            first: true,
            last: true,
            job_key: self.jobs[cold.job.0 as usize].key,
            src_inc: self.cfg.incarnation,
            dst_inc: hot.peer_inc,
            psn_or_window: 0,
            ack: Psn(0),
            sack: 0,
            header_sum: false,
            unsummed: unsummed_to(&cold.addr, path),
            sealed: Sealed::No,
            hello: Hello::None,
        };
        Some((cold.addr, header))
    }

    /// The fast path of [`Engine::send_transmit_complete`]: a message that
    /// would go as one DIRECT datagram, written at once into `buf` (the
    /// caller's transmit buffer) instead of being queued, copied into a pooled
    /// buffer and written out by the next [`Engine::poll_transmit`]. Taken only
    /// when no datagram waits in the queue (which would otherwise be
    /// overtaken) and the message fits one datagram of the path and `buf`.
    /// `SendComplete` follows as for a queued one; the caller must hand the
    /// datagram to the device before anything `poll_transmit` writes later.
    /// `None`: nothing was done (send it with `send_transmit_complete`).
    pub fn transmit_direct_now(
        &mut self,
        peer: PeerId,
        parts: &[&[u8]],
        token: u64,
        buf: &mut [u8],
    ) -> Option<Transmit> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if HEADER_LEN + len > buf.len() {
            return None;
        }
        let (dst, header) = self.direct_header(peer, len)?;
        let n = header.encode_parts(parts, buf);
        self.stats.sent_direct += 1;
        self.events.push_back(Event::SendComplete { token });
        self.direct_unpolled.push((token, peer));
        Some(Transmit { dst, len: n, seg: n, gather: None })
    }

    /// The DIRECT route to `peer`: what every DIRECT datagram to it that the
    /// caller writes to its device itself needs and that does not change
    /// from message to message (its address, the engine's header with every
    /// field written, the incarnation the header names, the payload bound),
    /// made once and kept by the caller ([`Engine::route_open`] says, per
    /// message, whether it may still be used). `None` unless a DIRECT packet
    /// may go to the peer now ([`Engine::direct_header`]'s conditions) over a
    /// path fixed for good (given, not the engine's default).
    pub fn direct_route(&self, peer: PeerId) -> Option<DirectRoute> {
        let path = self.cold.get(peer.0 as usize)?.path?;
        let (dst, header) = self.direct_header(peer, 0)?;
        Some(DirectRoute {
            dst,
            header: header.encode_over(&[]),
            summed: !header.unsummed,
            dst_inc: header.dst_inc,
            payload_max: (path.payload_max as usize).min(DIRECT_MAX),
        })
    }

    /// Whether `route` (from [`Engine::direct_route`] for `peer`) may carry a
    /// DIRECT datagram of `len` payload bytes now: nothing queued to write
    /// ahead of it, DIRECT still allowed to the peer, the peer still the
    /// incarnation the route's header names, one datagram of its path. The
    /// per-message half of the conditions of [`Engine::direct_route`] (the
    /// path is fixed once given), a few loads. A route it refuses for the
    /// incarnation is stale for good: the caller makes a new one.
    #[inline]
    pub fn route_open(&self, peer: PeerId, route: &DirectRoute, len: usize) -> bool {
        if !self.dgram_tx.is_empty() || len > route.payload_max {
            return false;
        }
        let Some(h) = self.cold.get(peer.0 as usize).and_then(|c| c.hot()) else { return false };
        let hot = &self.hot[h as usize];
        let open =
            hot.inc_heard && !hot.failed && !hot.tx.peer_paused && !hot.tx.busy() && hot.peer_inc == route.dst_inc;
        debug_assert!(
            !open || self.direct_route(peer).is_some_and(|r| r.header == route.header && r.dst == route.dst),
            "an open route is the route the full check makes"
        );
        open
    }

    /// Counts a DIRECT datagram the caller wrote over a route (its device
    /// took it). No `SendComplete` follows and nothing is kept: the caller
    /// completes the message itself (a device that took a datagram on a
    /// reliable, ordered path has delivered it as far as this engine can
    /// tell).
    #[inline]
    pub fn direct_written(&mut self) {
        self.stats.sent_direct += 1;
        self.stats.sent_direct_written += 1;
    }

    /// Whether a DIRECT packet waits in the queue (behind a full ring): the
    /// next `poll_transmit` writes it out whatever its receiver said since,
    /// so a caller about to write should first read what arrived.
    pub fn direct_queued(&self) -> bool {
        self.direct_queued_to().is_some()
    }

    /// The peer, and its address, of the DIRECT packet the next
    /// `poll_transmit` writes out, if that is one.
    pub fn direct_queued_to(&self) -> Option<(PeerId, DevAddr)> {
        self.dgram_tx.front().filter(|d| d.ptype == PacketType::Direct).map(|d| (d.peer, d.dst))
    }
}

/// A peer's DIRECT route ([`Engine::direct_route`]): what its small messages
/// need to go straight to the device, written once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirectRoute {
    /// Where the datagrams go.
    pub dst: DevAddr,
    /// The engine's header of every DIRECT datagram to the peer.
    header: [u8; HEADER_LEN],
    /// Whether the path wants a checksum over header and payload (every
    /// path that crosses a wire); a shared-memory route's header is whole.
    summed: bool,
    /// The peer's incarnation the header names.
    dst_inc: u64,
    /// The largest payload of one DIRECT datagram on the path.
    payload_max: usize,
}

impl DirectRoute {
    /// The header of a DIRECT datagram whose payload is `parts` (the
    /// caller writes them after it): the route's header, summed over the
    /// parts where the path wants it. The same bytes as
    /// [`Header::encode_over`] of the header the route was made from.
    #[inline]
    pub fn header_over(&self, parts: &[&[u8]]) -> [u8; HEADER_LEN] {
        if self.summed {
            wire::sum_over(self.header, parts)
        } else {
            self.header
        }
    }
}
