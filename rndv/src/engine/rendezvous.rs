//! Rendezvous in the message engine: RTS/CTS/Push/Fin, receiver pulls, windowed
//! pushes, and [`for_each_read_run`] for the provider's remote reads.
use super::ops::{Action, IoList, Memory, OpError, PullId, ReadOutcome, Token, TxId};
use super::{Io, Landing, MsgEngine, Pull, WindowRx};
use crate::iov::zip_pieces;
use crate::wire::rendezvous::{
    encode_cts, encode_fin, encode_push, FinStatus, RemoteIov, Rts, MAX_IOV, PUSH_HEADER_LEN,
};
use rdm::engine::PeerId;
use rdm::Instant;

/// Bytes per `Push` message of a granted window (rdm segments it further),
/// where the NIC gathers it from the application's memory (nothing copies).
/// Measured on loopback UDP, 1 MiB messages: 64 KiB pushes ran at half the
/// eager bandwidth (per-message overheads), 1 MiB pushes at parity.
pub const PUSH_CHUNK: u64 = 1 << 20;

/// Bytes per `Push` message that rdm copies into a buffer of its own (every
/// path that does not register): the largest that leaves a buffer rdm's pool
/// takes back. A 1 MiB copy was a fresh allocation, its pages faulted in and
/// zeroed, for every push (issue 44 item 7: `benches/results/2026-11-29-medium-udp`
/// has the profile, and the streams between two hosts before and after).
pub const PUSH_COPY_CHUNK: u64 = 64 << 10;
/// How many bytes of copied pushes may wait in rdm's queue to one peer,
/// behind its send window: enough that the window never waits for the next
/// copy between two rounds of progress, few enough that the buffers come
/// from rdm's pool (16 chunks, and the window's, within its 64 buffers).
/// Copying each grant at once (up to a 2 MiB window per message, 64 messages
/// in flight in `osu_bw`) allocated most of it fresh.
pub const PUSH_COPY_AHEAD: usize = 16 * PUSH_COPY_CHUNK as usize;
const _: () = assert!(PUSH_HEADER_LEN + PUSH_COPY_CHUNK as usize <= rdm::engine::POOL_MAX_CAPACITY);
// A 64 KiB eager message's header fits the room rdm's pools keep for it.
const _: () = assert!(crate::wire::msg::HEADER_LEN <= rdm::engine::POOL_HEADER_ROOM);

impl MsgEngine {
    // ------------------------------------------------------------ rendezvous

    pub(super) fn start_pull(&mut self, io: Io<'_>, peer: PeerId, rts: Rts, landing: Landing) {
        if landing.target.total() == 0 {
            // Nothing to read into: finish at once.
            self.reply(io, peer, &[&encode_fin(rts.req, FinStatus::Done, 0)]);
            self.finish_recv(&landing, 0, None);
            return;
        }
        // Whether this process may read the sender is the layer below's to say
        // (it answers NotPermitted, and the bytes are pushed): the sender only
        // announces where its path can read, and a peer that sent first has no
        // path recorded here.
        let addr = io.rdm.peer_addr(peer);
        let id = PullId(self.pulls.insert(Pull { peer, req: rts.req, landing }) as u32);
        self.actions.push_back(Action::RemoteRead {
            id,
            peer,
            addr,
            src: rts.iov,
            src_count: rts.iov_count,
            dst: landing.target,
        });
    }

    /// The layer below finished [`Action::RemoteRead`] `id`.
    pub fn remote_read_done(&mut self, io: Io<'_>, id: PullId, outcome: ReadOutcome) {
        let Some(p) = self.pulls.try_remove(id.0 as usize) else { return };
        match outcome {
            ReadOutcome::Done(n) => {
                self.stats.pulled += 1;
                self.count_peer(io.rdm, p.peer, super::ops::peer_counter::RECV_PULLED_MSGS, n);
                self.reply(io, p.peer, &[&encode_fin(p.req, FinStatus::Done, n)]);
                self.finish_recv(&p.landing, n as usize, None);
            }
            ReadOutcome::NotPermitted | ReadOutcome::NotNow => self.start_window(io, p.peer, p.req, p.landing),
            ReadOutcome::Failed(n) => {
                self.reply(io, p.peer, &[&encode_fin(p.req, FinStatus::Failed, n)]);
                self.finish_recv(&p.landing, n as usize, Some(OpError::Io));
            }
        }
    }

    pub(super) fn handle_fin(&mut self, peer: PeerId, req: u64, status: FinStatus, mem: &mut dyn Memory, now: Instant) {
        let id = TxId(req as u32);
        let ours = u32::try_from(req).is_ok()
            && self.tx.get(id.0 as usize).is_some_and(|t| t.rndv.is_some() && t.peer == peer);
        if !ours {
            self.stats.stray += 1;
            return;
        }
        let err = match status {
            FinStatus::Done | FinStatus::Discarded => None,
            FinStatus::Failed => Some(OpError::Io),
        };
        match self.tx.get_mut(id.0 as usize) {
            // The NIC may still read the buffer for pushes not yet complete.
            Some(t) if t.gathered > 0 => t.fin = Some(err),
            _ => self.complete_send(id, err),
        }
        let _ = (mem, now);
    }

    /// rdm completed one push sent from the application's memory.
    pub(super) fn gathered_push_done(&mut self, id: TxId) {
        let Some(t) = self.tx.get_mut(id.0 as usize) else { return };
        t.gathered = t.gathered.saturating_sub(1);
        if t.gathered == 0 {
            if let Some(err) = t.fin {
                self.complete_send(id, err);
            }
        }
    }

    /// The receiver cannot pull: grant the first window.
    fn start_window(&mut self, mut io: Io<'_>, peer: PeerId, req: u64, landing: Landing) {
        let take = (landing.msg_len as u64).min(landing.target.total());
        let mut w = WindowRx { landing, take, granted: 0, received: 0 };
        self.grant(io.reborrow(), peer, req, &mut w);
        self.windows.insert((peer, req), w);
        self.await_answer(io.now, peer);
    }

    /// Grants the next window while at most half of the granted bytes are
    /// still outstanding: the sender never waits for a grant round trip.
    fn grant(&mut self, mut io: Io<'_>, peer: PeerId, req: u64, w: &mut WindowRx) {
        let window = self.cfg.window.max(1);
        while w.granted < w.take && w.granted - w.received <= window / 2 {
            let len = (w.take - w.granted).min(window);
            self.reply(io.reborrow(), peer, &[&encode_cts(req, w.granted, len)]);
            w.granted += len;
            self.stats.windows_granted += 1;
        }
    }

    /// A `Push` of a granted range landed.
    pub(super) fn handle_push(
        &mut self,
        io: Io<'_>,
        peer: PeerId,
        req: u64,
        offset: u64,
        payload: &[u8],
        mem: &mut dyn Memory,
    ) {
        let Some(mut w) = self.windows.remove(&(peer, req)) else {
            self.stats.stray += 1;
            return;
        };
        let end = offset.checked_add(payload.len() as u64);
        if end.is_none_or(|e| e > w.granted) {
            // Outside what was granted: a confused or hostile sender.
            self.stats.stray += 1;
            self.windows.insert((peer, req), w);
            return;
        }
        let written = w.landing.target.scatter_at(mem, offset, payload);
        w.received += written as u64;
        if w.received >= w.take {
            self.stats.pushed += 1;
            self.count_peer(io.rdm, peer, super::ops::peer_counter::RECV_WINDOWED_MSGS, w.received);
            self.reply(io, peer, &[&encode_fin(req, FinStatus::Done, w.received)]);
            self.finish_recv(&w.landing, w.received as usize, None);
        } else {
            self.grant(io, peer, req, &mut w);
            self.windows.insert((peer, req), w);
        }
    }

    /// A window grant for one of our rendezvous sends.
    pub(super) fn handle_cts(&mut self, io: Io<'_>, peer: PeerId, req: u64, offset: u64, len: u64, mem: &dyn Memory) {
        let id = TxId(req as u32);
        let fits = u32::try_from(req).is_ok()
            && self.tx.get(id.0 as usize).is_some_and(|t| {
                t.peer == peer && t.rndv.is_some() && offset.checked_add(len).is_some_and(|e| e <= t.len as u64)
            });
        if !fits {
            self.stats.stray += 1;
            return;
        }
        // The path could read, the receiver may not (shm with ptrace
        // refused): long messages to it go by windows from now on. Not on a
        // registering path (verbs, SRD): there a grant says "not now" (no
        // connection for reads yet, one broke, our registration failed and
        // the announcement carried no keys) as often as "never", and the
        // receiver decides per message, so keep announcing.
        if self.path(io.rdm, peer).is_some_and(|p| p.remote_read && !p.registration) {
            self.refused.insert(peer);
        }
        self.push_backlog.push_back((id, offset, offset + len));
        self.retry_pushes(io, mem);
    }

    /// Sends the granted ranges as `Push` messages of at most [`PUSH_CHUNK`]
    /// bytes gathered or [`PUSH_COPY_CHUNK`] bytes copied, in order, while
    /// the rdm engine takes them.
    pub(super) fn retry_pushes(&mut self, io: Io<'_>, mem: &dyn Memory) {
        let Io { rdm, now } = io;
        while let Some(&(id, offset, end)) = self.push_backlog.front() {
            let Some((peer, iov)) = self.tx.get(id.0 as usize).and_then(|t| t.rndv.map(|iov| (t.peer, iov))) else {
                self.push_backlog.pop_front();
                continue;
            };
            if offset >= end {
                self.push_backlog.pop_front();
                continue;
            }
            // On a path that registers (an RDMA NIC), a chunk within one
            // piece announced with a key goes from the application's memory
            // as it is: the NIC gathers it behind the header, nothing copies.
            let hdr = encode_push(id.0 as u64, offset);
            let gather_len = (end - offset).min(PUSH_CHUNK);
            let gathered = if self.path(rdm, peer).is_some_and(|p| p.registration) {
                piece_at(&iov, offset, gather_len)
            } else {
                None
            }
            .and_then(|(addr, key)| Some(mem.send_source(addr, gather_len)?.with_key(key)))
            .map(|g| rdm.send_gather(now, peer, &hdr, g, Token::PushGathered(id).encode()))
            .filter(|r| *r != Err(rdm::engine::SendError::Unsupported));
            let was_gathered = gathered.is_some();
            // Every other chunk is copied (a path that turns out not to
            // gather included), in chunks rdm's pool keeps, as fast as the
            // peer's window drains them (the next round of progress retries).
            if !was_gathered && rdm.queued_bytes(peer) >= PUSH_COPY_AHEAD {
                return;
            }
            let n = if was_gathered { gather_len } else { (end - offset).min(copy_chunk(rdm.datagram_max(peer))) };
            let sent = gathered.unwrap_or_else(|| {
                let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
                parts[0] = &hdr;
                let mut k = 1;
                for piece in iov.range(offset, n) {
                    parts[k] = mem.bytes(piece.addr, piece.len as usize);
                    k += 1;
                }
                rdm.send(now, peer, &parts[..k], Token::Push(id).encode())
            });
            match sent {
                Ok(()) => {
                    if was_gathered {
                        self.stats.pushes_gathered += 1;
                        if let Some(t) = self.tx.get_mut(id.0 as usize) {
                            t.gathered += 1;
                        }
                    }
                    if let Some(front) = self.push_backlog.front_mut() {
                        front.1 = offset + n;
                    }
                }
                Err(_) => return,
            }
        }
    }
}

/// The bytes of a copied `Push` to a peer whose datagrams carry
/// `datagram_max` bytes: at most [`PUSH_COPY_CHUNK`], and with its header a
/// whole number of full datagrams. A push that ended in a short datagram cut
/// every run of equal datagrams the device sends as one (UDP segmentation
/// offload) in two: 64 KiB pushes over UDP carried 4 MiB at 0.91x the rate
/// of 1 MiB pushes in a loopback ping-pong; whole datagrams, at parity.
fn copy_chunk(datagram_max: usize) -> u64 {
    let room = PUSH_COPY_CHUNK as usize + PUSH_HEADER_LEN;
    if datagram_max == 0 || datagram_max >= room {
        return PUSH_COPY_CHUNK;
    }
    ((room / datagram_max) * datagram_max - PUSH_HEADER_LEN) as u64
}

/// Where `[offset, offset+n)` of the list lies when it is within one piece
/// that carries a key: its address and the key.
fn piece_at(iov: &IoList, offset: u64, n: u64) -> Option<(u64, u64)> {
    let mut start = 0u64;
    for (i, b) in iov.iter().enumerate() {
        if offset < start + b.len {
            let end = offset.checked_add(n)?;
            return (end <= start + b.len).then_some(()).and(iov.keys[i]).map(|k| (b.addr + (offset - start), k));
        }
        start += b.len;
    }
    None
}

/// Copies up to `dst.total()` bytes of `src` (the peer's memory) into `dst` by
/// calling `read(src_key, src_addr, dst_addr, len)` per run that lies in one
/// piece of both (`src_key`: the registration key the RTS announced for that
/// piece, on registering paths); stops at the first run `read` does not
/// complete. For the provider's
/// [`Action::RemoteRead`] handler. Returns the bytes read and whether every run
/// succeeded.
pub fn for_each_read_run(
    src: &[RemoteIov],
    dst: &IoList,
    mut read: impl FnMut(Option<u64>, u64, u64, u64) -> bool,
) -> (u64, bool) {
    let mut src_lens = [0u64; MAX_IOV];
    for (d, v) in src_lens.iter_mut().zip(src) {
        *d = v.len;
    }
    let mut dst_lens = [0u64; MAX_IOV];
    for (d, b) in dst_lens.iter_mut().zip(dst.iter()) {
        *d = b.len;
    }
    let mut ok = true;
    let n = zip_pieces(&src_lens[..src.len().min(MAX_IOV)], &dst_lens[..dst.count], |si, so, di, doff, len| {
        ok = read(src[si].key, src[si].addr + so, dst.bufs[di].addr + doff, len);
        ok
    });
    (n, ok)
}
