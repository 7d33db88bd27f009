//! RMA and atomics in the message engine, emulated as request/answer messages:
//! at the initiator (requests, answers) and at the target (serving them).
use super::ops::{
    Access, AtomicRequest, Completion, IoList, Memory, OpError, OpKind, OpMeta, PostError, RmaId, RmaTarget, Token,
};
use super::{Io, MsgEngine, RmaEntry};
use crate::atomic::{self, Datatype, Op};
use crate::wire::rendezvous::MAX_IOV;
use crate::wire::rma::{self as rma_wire, Status};
use crate::wire::{Packet, MAX_HEADER_LEN};
use rdm::engine::PeerId;

fn status_error(s: Status) -> Option<OpError> {
    match s {
        Status::Ok => None,
        Status::NoKey => Some(OpError::NoKey),
        Status::Access => Some(OpError::Access),
        Status::Invalid => Some(OpError::Invalid),
    }
}

impl MsgEngine {
    // ------------------------------------------------------------------ RMA

    /// Sends the request `request` builds from the operation's id, followed
    /// by `extra`, and records `pending` to wait for its answer.
    fn start_rma(
        &mut self,
        io: Io<'_>,
        pending: RmaEntry,
        request: impl FnOnce(u64) -> Packet<'static>,
        extra: &[&[u8]],
    ) -> Result<RmaId, PostError> {
        let Io { rdm, now } = io;
        let peer = pending.peer;
        let entry = self.rma.vacant_entry();
        let id = RmaId(entry.key() as u32);
        // The request names its id, for the answer to echo; its payload follows as `extra`.
        let mut hdr = [0u8; MAX_HEADER_LEN];
        let hdr_len = request(id.0 as u64).encode_header(&mut hdr);
        let mut parts: [&[u8]; 2 * MAX_IOV + 1] = [&[]; 2 * MAX_IOV + 1];
        parts[0] = &hdr[..hdr_len];
        let n = extra.len().min(2 * MAX_IOV);
        parts[1..=n].copy_from_slice(&extra[..n]);
        rdm.send(now, peer, &parts[..=n], Token::Rma(id).encode())?;
        entry.insert(pending);
        self.await_answer(now, peer);
        self.stats.rma_started += 1;
        Ok(id)
    }

    /// fi_write: `payload` to `target`, with remote CQ data.
    pub fn rma_write(
        &mut self,
        io: Io<'_>,
        target: RmaTarget,
        payload: &[&[u8]],
        data: Option<u64>,
        meta: OpMeta,
    ) -> Result<RmaId, PostError> {
        let RmaTarget { peer, key, addr } = target;
        let len = payload.iter().map(|p| p.len()).sum();
        let request = |req| Packet::Write { req, key, addr, data, payload: &[] };
        let pending = RmaEntry { kind: OpKind::Write, meta, peer, result: IoList::default(), len };
        self.start_rma(io, pending, request, payload)
    }

    /// fi_read: `dst.total()` bytes at `target` into `dst`.
    pub fn rma_read(&mut self, io: Io<'_>, target: RmaTarget, dst: IoList, meta: OpMeta) -> Result<RmaId, PostError> {
        let RmaTarget { peer, key, addr } = target;
        let len = dst.total();
        let request = |req| Packet::ReadReq { req, key, addr, len };
        let pending = RmaEntry { kind: OpKind::Read, meta, peer, result: dst, len: len as usize };
        self.start_rma(io, pending, request, &[])
    }

    /// An atomic of `req.count` elements; `req.fetch` returns the old values
    /// into `req.result`; `req.compare` operands make it a compare atomic.
    pub fn atomic(&mut self, io: Io<'_>, req: AtomicRequest<'_>, meta: OpMeta) -> Result<RmaId, PostError> {
        let AtomicRequest {
            target: RmaTarget { peer, key, addr },
            datatype: dt,
            op,
            count,
            operand,
            compare,
            result,
            fetch,
        } = req;
        let family = if !compare.is_empty() {
            atomic::Family::Compare
        } else if fetch {
            atomic::Family::Fetch
        } else {
            atomic::Family::Write
        };
        if !atomic::valid(family, dt, op) {
            return Err(PostError::AtomicUnsupported);
        }
        let bytes = count.checked_mul(dt.size()).ok_or(PostError::AtomicOperands)?;
        let given: usize = operand.iter().map(|p| p.len()).sum();
        if op != Op::Read && given != bytes {
            return Err(PostError::AtomicOperands);
        }
        let count32 = u32::try_from(count).map_err(|_| PostError::AtomicOperands)?;
        let (datatype, op_byte) = (dt.wire(), op.wire());
        let request =
            |req| Packet::Atomic { req, key, addr, datatype, op: op_byte, count: count32, fetch, payload: &[] };
        let mut extra: [&[u8]; 2 * MAX_IOV] = [&[]; 2 * MAX_IOV];
        let mut n = 0;
        let operands: &[&[u8]] = if op == Op::Read { &[] } else { operand };
        for p in operands.iter().chain(compare).take(2 * MAX_IOV) {
            extra[n] = p;
            n += 1;
        }
        let pending = RmaEntry { kind: OpKind::Atomic { fetch }, meta, peer, result, len: bytes };
        self.start_rma(io, pending, request, &extra[..n])
    }

    pub(super) fn finish_rma(&mut self, peer: PeerId, req: u64, status: Status, payload: &[u8], mem: &mut dyn Memory) {
        let id = req as usize;
        if u32::try_from(req).is_err() || self.rma.get(id).is_none_or(|e| e.peer != peer) {
            self.stats.stray += 1;
            return;
        }
        let e = self.rma.remove(id);
        let err = status_error(status);
        if err.is_none() && matches!(e.kind, OpKind::Read | OpKind::Atomic { fetch: true }) {
            e.result.scatter(mem, payload);
        }
        self.completions.push_back(Completion {
            len: e.len,
            src: Some(e.peer),
            err,
            ..Completion::new(e.meta, e.kind)
        });
    }

    pub(super) fn serve_rma(&mut self, io: Io<'_>, peer: PeerId, pkt: Packet<'_>, mem: &mut dyn Memory) {
        // The requester's job: a registration names the jobs that may reach it.
        let job = io.rdm.job_key(io.rdm.peer_job(peer));
        match pkt {
            Packet::Write { req, key, addr, data, payload } => {
                let status = match mem.rma_target(key, addr, payload.len() as u64, Access::RemoteWrite, job) {
                    Ok(pieces) => {
                        let mut off = 0;
                        for p in pieces {
                            mem.write(p.addr, &payload[off..off + p.len as usize]);
                            off += p.len as usize;
                        }
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.served(OpKind::RemoteWrite, payload.len(), data);
                }
                self.reply(io, peer, &[&rma_wire::encode_write_ack(req, status)]);
            }
            Packet::ReadReq { req, key, addr, len } => {
                let mut data = Vec::new();
                let status = match mem.rma_target(key, addr, len, Access::RemoteRead, job) {
                    Ok(pieces) => {
                        for p in pieces {
                            mem.read(p.addr, p.len as usize, &mut data);
                        }
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.served(OpKind::RemoteRead, data.len(), None);
                }
                self.reply(io, peer, &[&rma_wire::encode_read_resp(req, status), &data]);
            }
            Packet::Atomic { req, key, addr, datatype, op, count, fetch, payload } => {
                let mut old = Vec::new();
                let status = (|| -> Result<(), Status> {
                    let dt = Datatype::from_wire(datatype).ok_or(Status::Invalid)?;
                    let o = Op::from_wire(op).ok_or(Status::Invalid)?;
                    let bytes = (count as usize).checked_mul(dt.size()).ok_or(Status::Invalid)?;
                    let (operand, compare) = atomic::split_operands(o, payload, bytes).ok_or(Status::Invalid)?;
                    let pieces = mem.rma_target(key, addr, bytes as u64, Access::RemoteWrite, job)?;
                    for p in &pieces {
                        mem.read(p.addr, p.len as usize, &mut old);
                    }
                    let mut new = old.clone();
                    atomic::apply(dt, o, &mut new, operand, compare).map_err(|_| Status::Invalid)?;
                    let mut off = 0;
                    for p in &pieces {
                        mem.write(p.addr, &new[off..off + p.len as usize]);
                        off += p.len as usize;
                    }
                    Ok(())
                })();
                let status = match status {
                    Ok(()) => {
                        self.served(OpKind::RemoteWrite, old.len(), None);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                let back: &[u8] = if fetch && status == Status::Ok { &old } else { &[] };
                self.reply(io, peer, &[&rma_wire::encode_atomic_resp(req, status), back]);
            }
            _ => {}
        }
    }

    /// A served one-sided operation, reported for the target's counters (and,
    /// with CQ data, its receive CQ).
    fn served(&mut self, kind: OpKind, len: usize, data: Option<u64>) {
        self.stats.rma_served += 1;
        let meta = OpMeta { context: 0, wanted: data.is_some(), ..OpMeta::default() };
        self.completions.push_back(Completion { len, data, ..Completion::new(meta, kind) });
    }

    /// An answer nothing waits on: lost only if the rdm engine refuses it, and
    /// then the initiator fails with the peer.
    pub(super) fn reply(&mut self, io: Io<'_>, peer: PeerId, parts: &[&[u8]]) {
        let _ = io.rdm.send(io.now, peer, parts, Token::Reply.encode());
    }
}
