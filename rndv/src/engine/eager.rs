//! The eager path of the message engine: sends, posted receives and their
//! matching and landing, multi-receive, peek/claim/discard and cancel.
use super::ops::{
    Access, Completion, IoList, Memory, OpError, OpKind, OpMeta, PostError, RecvSpec, RegHandle, RegistrationError,
    RxId, Token, TxId,
};
use super::{recv_op, DirectSend, Io, Landing, MsgEngine, OutMsg, RxEntry, TxEntry};
use crate::matching::{Arrived, RecvPost};
use crate::wire::msg::MsgHeader;
use crate::wire::rendezvous::{encode_fin, FinStatus, RemoteIov, Rts, MAX_IOV, RTS_MAX};
use rdm::engine::{Engine, PeerId};

impl MsgEngine {
    // ---------------------------------------------------------------- sends

    /// Sends a message. `msg.user` lists where the payload lies in
    /// application memory (used only if the message goes by rendezvous);
    /// `msg.payload` the same bytes as slices.
    pub fn send(&mut self, io: Io<'_>, msg: OutMsg<'_>) -> Result<TxId, PostError> {
        self.send_staged(io, &msg, None).map(|(id, _)| id)
    }

    /// A small message written by `write` straight to the device (given the
    /// rdm engine and the message header and payload as a gather list; it
    /// answers whether the device took them, and takes only what
    /// [`Engine::direct_route`] allows: a peer reached over a reliable,
    /// ordered path, nothing queued or in flight ahead of it), where the
    /// message goes eagerly and completes once written (not a rendezvous, not
    /// delivery complete, not an unreliable datagram endpoint). It completes
    /// here at once: no send entry, no event. False: nothing was done (send it
    /// with [`MsgEngine::send_staged`]). Its completion (none for a
    /// `silent` operation) is the caller's to report or queue
    /// ([`MsgEngine::push_completion`]): nothing is queued here.
    ///
    /// On shared memory this is the whole send of a small message: the
    /// device copies both headers and the payload once, into the receiver's
    /// ring cell, where the receiver matches it ([`MsgEngine::receive_datagram`]).
    // Inlined into the endpoint's send, as it was before the message became
    // one argument (per-message instructions, the harness's callgrind stage).
    #[inline]
    pub fn send_direct(
        &mut self,
        rdm: &mut Engine,
        msg: &OutMsg<'_>,
        write: impl FnOnce(&mut Engine, &[&[u8]]) -> bool,
    ) -> DirectSend {
        // By reference: the message (its iov list above all) is not copied
        // on its way down the send path.
        let (peer, header, payload, user, meta) = (msg.peer, msg.header, msg.payload, &msg.user, msg.meta);
        // Granted windows waiting for room go first (the other path retries
        // them before it reports anything).
        if self.cfg.datagram || meta.delivery_complete || payload.len() > MAX_IOV || !self.push_backlog.is_empty() {
            return DirectSend::NotTaken;
        }
        let len: usize = payload.iter().map(|p| p.len()).sum();
        // Exactly the messages send_staged sends eagerly.
        if !meta.inject && !meta.copy_at_post && user.count > 0 && self.use_rendezvous(rdm, peer, len) {
            return DirectSend::NotTaken;
        }
        let hdr = header.encode();
        let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
        parts[0] = &hdr;
        parts[1..=payload.len()].copy_from_slice(payload);
        if !write(rdm, &parts[..=payload.len()]) {
            return DirectSend::NotTaken;
        }
        self.stats.eager_sent += 1;
        self.count_peer(rdm, peer, super::ops::peer_counter::SENT_EAGER_MSGS, len as u64);
        DirectSend::Sent((!meta.silent).then(|| Completion {
            msg: Some(header.kind),
            len,
            src: Some(peer),
            ..Completion::new(meta, OpKind::Send)
        }))
    }

    /// Queues a completion the caller did not report itself (see
    /// [`MsgEngine::send_direct`]).
    pub fn push_completion(&mut self, c: Completion) {
        self.completions.push_back(c);
    }

    /// [`MsgEngine::send`], given the caller's empty transmit buffer: a
    /// message that goes as one DIRECT datagram is written straight into it
    /// ([`rdm::engine::Engine::transmit_direct_now`]) and returned, for the
    /// caller to hand to the device at once, instead of taking the queue.
    pub fn send_staged(
        &mut self,
        io: Io<'_>,
        msg: &OutMsg<'_>,
        stage: Option<&mut [u8]>,
    ) -> Result<(TxId, Option<rdm::engine::Transmit>), PostError> {
        let Io { rdm, now } = io;
        let (peer, header, payload, user, meta) = (msg.peer, msg.header, msg.payload, &msg.user, msg.meta);
        let mut staged = None;
        let len: usize = payload.iter().map(|p| p.len()).sum();
        let long = !self.cfg.datagram
            && !meta.inject
            && !meta.copy_at_post
            && user.count > 0
            && self.use_rendezvous(rdm, peer, len);
        // A registration the device refused even after the cache gave back
        // what it could: the message still goes by rendezvous, announced
        // without keys, so the receiver cannot read it and grants windows
        // instead. Never eagerly: a long message nobody has posted a receive
        // for would then fill the receiver's unexpected storage.
        let keys = if long { self.rendezvous_keys(rdm, peer, user).unwrap_or(None) } else { None };
        let entry = self.tx.vacant_entry();
        let id = TxId(entry.key() as u32);
        if long {
            let mut remote = [RemoteIov::default(); MAX_IOV];
            let mut iov = IoList::default();
            let mut regs = [None; MAX_IOV];
            for (i, b) in user.iter().enumerate().filter(|(_, b)| b.len > 0) {
                let (key, reg) = match &keys {
                    Some(k) => (Some(k[i].0), k[i].1),
                    None => (None, None),
                };
                remote[iov.count] = RemoteIov { addr: b.addr, len: b.len, key };
                iov.bufs[iov.count] = *b;
                // The key each piece was announced with (the application's,
                // or one acquired from the cache): its local half lets the
                // windowed push gather the piece straight from memory.
                iov.keys[iov.count] = key.or(user.keys[i]);
                regs[iov.count] = reg;
                iov.count += 1;
            }
            let rts = Rts { header, req: id.0 as u64, total: len as u64, iov: remote, iov_count: iov.count };
            let mut wire = [0u8; RTS_MAX];
            let n = rts.encode(&mut wire);
            if let Err(e) = rdm.send(now, peer, &[&wire[..n]], Token::Rts(id).encode()) {
                if let Some(r) = self.registrations.as_mut() {
                    regs.iter().flatten().for_each(|h| r.release(*h));
                }
                return Err(e.into());
            }
            entry.insert(TxEntry { meta, msg: header.kind, len, peer, rndv: Some(iov), regs, gathered: 0, fin: None });
            self.await_answer(now, peer);
            self.stats.rts_sent += 1;
            self.count_peer(rdm, peer, super::ops::peer_counter::SENT_RNDV_MSGS, len as u64);
        } else {
            let hdr = header.encode();
            let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
            parts[0] = &hdr;
            let n = payload.len().min(MAX_IOV);
            parts[1..=n].copy_from_slice(&payload[..n]);
            if self.cfg.datagram {
                rdm.send_datagram(peer, &parts[..=n], Token::Msg(id).encode())?;
            } else if meta.delivery_complete {
                rdm.send(now, peer, &parts[..=n], Token::Msg(id).encode())?;
            } else {
                let token = Token::Msg(id).encode();
                staged = stage.and_then(|buf| rdm.transmit_direct_now(peer, &parts[..=n], token, buf));
                if staged.is_none() {
                    rdm.send_transmit_complete(now, peer, &parts[..=n], token)?;
                }
            }
            entry.insert(TxEntry {
                meta,
                msg: header.kind,
                len,
                peer,
                rndv: None,
                regs: [None; MAX_IOV],
                gathered: 0,
                fin: None,
            });
            self.stats.eager_sent += 1;
            self.count_peer(rdm, peer, super::ops::peer_counter::SENT_EAGER_MSGS, len as u64);
        }
        Ok((id, staged))
    }

    /// The keys a rendezvous of `user` to `peer` announces, per buffer of
    /// `user` (key, and the registration to release if one was acquired), or
    /// `None` on a path that needs no registration (no lookup at all). An
    /// error when a registration failed: the message then goes by a windowed
    /// rendezvous, announced without keys (and nothing stays acquired).
    #[allow(clippy::type_complexity)]
    fn rendezvous_keys(
        &mut self,
        rdm: &mut Engine,
        peer: PeerId,
        user: &IoList,
    ) -> Result<Option<[(u64, Option<RegHandle>); MAX_IOV]>, RegistrationError> {
        if !self.path(rdm, peer).is_some_and(|p| p.registration) {
            return Ok(None);
        }
        let mut out = [(0u64, None); MAX_IOV];
        for (i, b) in user.iter().enumerate() {
            if b.len == 0 {
                continue;
            }
            if let Some(k) = user.keys[i] {
                out[i] = (k, None);
                self.stats.registrations_from_desc += 1;
                continue;
            }
            let got = match self.registrations.as_mut() {
                Some(r) => r.acquire(b.addr, b.len, Access::RemoteRead),
                None => Err(RegistrationError),
            };
            match got {
                Ok(reg) => {
                    out[i] = (reg.key, Some(reg.handle));
                    self.stats.registrations_acquired += 1;
                }
                Err(e) => {
                    let acquired: [Option<RegHandle>; MAX_IOV] = std::array::from_fn(|j| out[j].1);
                    self.release_all(&acquired);
                    self.stats.registration_failures += 1;
                    return Err(e);
                }
            }
        }
        Ok(Some(out))
    }

    fn release_all(&mut self, regs: &[Option<RegHandle>]) {
        if let Some(r) = self.registrations.as_mut() {
            for h in regs.iter().flatten() {
                r.release(*h);
            }
        }
    }

    /// Every way a send ends goes through here: its registrations go back.
    pub(super) fn complete_send(&mut self, id: TxId, err: Option<OpError>) {
        let Some(t) = self.tx.try_remove(id.0 as usize) else { return };
        self.release_all(&t.regs);
        if t.rndv.is_some() && !self.push_backlog.is_empty() {
            // Ranges still to push (a Fin that came early, a failure): the
            // slab id may name a new send soon, which must not inherit them.
            self.push_backlog.retain(|&(i, _, _)| i != id);
        }
        self.completions.push_back(Completion {
            msg: Some(t.msg),
            len: t.len,
            src: Some(t.peer),
            err,
            ..Completion::new(t.meta, OpKind::Send)
        });
    }

    // ------------------------------------------------------------- receives

    /// Posts a receive: it completes at once from an unexpected message, or
    /// waits for one.
    pub fn post_recv(&mut self, mut io: Io<'_>, spec: RecvSpec, mem: &mut dyn Memory) -> RxId {
        let id =
            RxId(self.rx.insert(RxEntry { iov: spec.iov, meta: spec.meta, multi_offset: spec.multi.then_some(0) })
                as u32);
        let post = RecvPost {
            token: id.0 as u64,
            kind: spec.kind,
            src: spec.src,
            tag: spec.tag,
            ignore: spec.ignore,
            persistent: spec.multi,
        };
        if spec.multi {
            // Fill the buffer from the unexpected queue first, then leave it
            // posted (in order) if room remains.
            while self.rx.contains(id.0 as usize) {
                match self.matcher.take_unexpected(&post) {
                    Some(arrived) => self.land(io.reborrow(), id, arrived, mem),
                    None => {
                        self.matcher.post_only(post);
                        break;
                    }
                }
            }
        } else if let Some(arrived) = self.matcher.post(post) {
            self.land(io.reborrow(), id, arrived, mem);
        } else {
            // Nothing unexpected was taken: the bytes held, and so the
            // back-pressure, are as the last change left them.
            return id;
        }
        self.update_backpressure(io.rdm);
        id
    }

    /// FI_PEEK, optionally with FI_CLAIM (reserve the message for a later
    /// claiming receive with the same context) or FI_DISCARD (drop it). Reports
    /// the message's attributes, or [`OpError::NoMessage`], as a completion.
    pub fn peek(&mut self, mut io: Io<'_>, spec: RecvSpec, claim: bool, discard: bool) {
        let probe = RecvPost {
            token: 0,
            kind: spec.kind,
            src: spec.src,
            tag: spec.tag,
            ignore: spec.ignore,
            persistent: false,
        };
        let Some(m) = self.matcher.peek(&probe) else {
            self.completions.push_back(Completion {
                tag: spec.tag,
                err: Some(OpError::NoMessage),
                ..recv_op(spec.meta, spec.kind)
            });
            return;
        };
        let c = Completion { len: m.len(), data: m.data, tag: m.tag, src: Some(m.peer), ..recv_op(spec.meta, m.kind) };
        if claim || discard {
            if let Some(m) = self.matcher.take_unexpected(&probe) {
                if discard {
                    self.discard(io.reborrow(), m);
                } else {
                    self.claimed.insert(spec.meta.context, m);
                }
            }
        }
        self.completions.push_back(c);
        self.update_backpressure(io.rdm);
    }

    /// FI_CLAIM: receives (or with `discard` drops) the message an earlier
    /// FI_PEEK|FI_CLAIM reserved for `spec.meta.context`.
    pub fn claim(&mut self, io: Io<'_>, spec: RecvSpec, discard: bool, mem: &mut dyn Memory) -> Result<(), PostError> {
        let arrived = self.claimed.remove(&spec.meta.context).ok_or(PostError::NotClaimed)?;
        if discard {
            let c = Completion { tag: arrived.tag, data: arrived.data, ..recv_op(spec.meta, arrived.kind) };
            self.discard(io, arrived);
            self.completions.push_back(c);
        } else {
            let id = RxId(self.rx.insert(RxEntry {
                iov: spec.iov,
                meta: OpMeta { wanted: true, ..spec.meta },
                multi_offset: None,
            }) as u32);
            self.land(io, id, arrived, mem);
        }
        Ok(())
    }

    /// A dropped unexpected message: an announced one still needs its Fin, or
    /// the sender would wait forever.
    fn discard(&mut self, io: Io<'_>, m: Arrived) {
        let (peer, rts) = (m.peer, m.rndv);
        io.rdm.recycle(m.msg);
        if let Some(rts) = rts {
            self.reply(io, peer, &[&encode_fin(rts.req, FinStatus::Discarded, 0)]);
        }
    }

    /// fi_cancel of a posted receive. Returns whether one with that context was
    /// still posted (it then completes with [`OpError::Canceled`]).
    pub fn cancel(&mut self, context: u64) -> bool {
        let Some(key) = self.rx.iter().find(|(_, e)| e.meta.context == context).map(|(k, _)| k) else { return false };
        let Some(post) = self.matcher.cancel(key as u64) else { return false };
        let e = self.rx.remove(key);
        self.completions.push_back(Completion {
            tag: post.tag,
            err: Some(OpError::Canceled),
            ..recv_op(e.meta, post.kind)
        });
        true
    }

    /// A message matched receive `id`: place it (eager) or start pulling it.
    pub(super) fn land(&mut self, io: Io<'_>, id: RxId, arrived: Arrived, mem: &mut dyn Memory) {
        let header = MsgHeader { kind: arrived.kind, tag: arrived.tag, data: arrived.data };
        let Some(landing) = self.landing(id, arrived.peer, header, arrived.len()) else { return };
        match arrived.rndv {
            None => {
                let written = landing.target.scatter(mem, arrived.payload());
                io.rdm.recycle(arrived.msg);
                self.finish_recv(&landing, written, None);
            }
            Some(rts) => {
                io.rdm.recycle(arrived.msg);
                self.start_pull(io, arrived.peer, rts, landing);
            }
        }
    }

    /// An eager message that arrived in one DIRECT datagram lands in the
    /// posted receive `id` matched to it, straight from the device's buffer.
    pub(super) fn land_lent(
        &mut self,
        id: RxId,
        peer: PeerId,
        header: MsgHeader,
        payload: &[u8],
        mem: &mut dyn Memory,
    ) {
        // The usual receive (not multi-receive) lands from its entry as it
        // leaves the table: no `Landing` copied out of it first.
        if let Some(e) = self.rx.get(id.0 as usize).filter(|e| e.multi_offset.is_none()) {
            let (written, meta) = (e.iov.scatter(mem, payload), e.meta);
            self.rx.remove(id.0 as usize);
            let c = recv_completion(meta, header, peer, payload.len(), written, None);
            self.completions.push_back(c);
            return;
        }
        let Some(landing) = self.landing(id, peer, header, payload.len()) else { return };
        let written = landing.target.scatter(mem, payload);
        self.finish_recv(&landing, written, None);
    }

    /// Where a message of `msg_len` bytes matched to the posted receive `id`
    /// lands (a multi-receive buffer keeps the rest of its room posted).
    fn landing(&mut self, id: RxId, peer: PeerId, header: MsgHeader, msg_len: usize) -> Option<Landing> {
        let e = self.rx.get(id.0 as usize)?;
        let (meta, iov, multi_offset) = (e.meta, e.iov, e.multi_offset);
        let (target, buf, multi_done) = match multi_offset {
            None => {
                self.rx.remove(id.0 as usize);
                (iov, 0, false)
            }
            Some(off) => {
                // One message lands right after the previous one.
                let base = iov.bufs[0];
                let room = IoList::one(base.addr + off, base.len - off);
                let n = (msg_len as u64).min(room.bufs[0].len);
                let new_off = off + n;
                let release = base.len - new_off < self.cfg.min_multi_recv.max(1) as u64 || n < msg_len as u64;
                if release {
                    self.matcher.cancel(id.0 as u64);
                    self.rx.remove(id.0 as usize);
                } else if let Some(e) = self.rx.get_mut(id.0 as usize) {
                    e.multi_offset = Some(new_off);
                }
                (room, base.addr + off, release)
            }
        };
        Some(Landing { target, meta, header, buf, msg_len, src: peer, multi_done })
    }

    /// Reports a receive whose bytes have landed (`written` of `msg_len`).
    pub(super) fn finish_recv(&mut self, l: &Landing, written: usize, err: Option<OpError>) {
        let c = recv_completion(l.meta, l.header, l.src, l.msg_len, written, err);
        self.completions.push_back(Completion { buf: l.buf, multi_done: l.multi_done, ..c });
    }
}

/// The completion of a receive of a message of `msg_len` bytes with `header`
/// from `src`, `written` of which landed: failed with `err`, else truncated if
/// fewer landed. A multi-receive's buffer and release are the caller's to add.
fn recv_completion(
    meta: OpMeta,
    header: MsgHeader,
    src: PeerId,
    msg_len: usize,
    written: usize,
    err: Option<OpError>,
) -> Completion {
    let err = err.or((msg_len > written).then_some(OpError::Truncated { olen: msg_len - written }));
    Completion { len: written, data: header.data, tag: header.tag, src: Some(src), err, ..recv_op(meta, header.kind) }
}
