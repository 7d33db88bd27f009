//! RMA and atomics, emulated over messages (see `rndv::rma` for the packets).
//!
//! Initiator: each operation gets an entry in `Running::rma_ops`; its slab key is
//! the request id on the wire; the target's answer completes it.
//! Target: the request is checked against the domain's registrations (key,
//! access, range) *before* memory is touched, then served, then answered.
use crate::core::{now, EpState, UserBuf, UserIov};
use crate::cq::{Completion, CompletionError};
use crate::error::{Error, Result};
use crate::log::{fi_warn, Subsys};
use libfabric_sys as fi;
use mr_cache::Segment;
use rdm::engine::PeerId;
use rndv::atomic::{self, Datatype, Op};
use rndv::wire::rma::{self as wire, Status};
use rndv::wire::Packet;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RmaKind {
    Write,
    Read,
    Atomic { fetch: bool },
}

/// An outstanding one-sided operation at the initiator.
#[derive(Clone, Copy, Debug)]
pub struct RmaOp {
    kind: RmaKind,
    context: usize,
    /// Where read data or fetched old values go.
    result: UserIov,
    len: usize,
    completion: bool,
    /// An inject call: no context, so a failure goes to the EQ, not the CQ.
    inject: bool,
}

/// What an RMA or atomic call asks for.
pub struct RmaArgs<'a> {
    pub peer_addr: u64,
    pub key: u64,
    pub addr: u64,
    pub context: usize,
    pub flags: u64,
    /// An `inject` call: no completion.
    pub inject: bool,
    /// Data to write / operands.
    pub payload: &'a [&'a [u8]],
    /// Compare operands (compare atomics).
    pub compare: &'a [&'a [u8]],
    /// Destination of read data / fetched values.
    pub result: UserIov,
}

/// Engine send tokens with this bit belong to RMA requests (the rest of the
/// token is the request id); responses use [`RESPONSE_TOKEN`].
pub const RMA_TOKEN: u64 = 1 << 63;
pub const RESPONSE_TOKEN: u64 = u64::MAX;

const REMOTE_READ: u64 = fi::FI_REMOTE_READ as u64;
const REMOTE_WRITE: u64 = fi::FI_REMOTE_WRITE as u64;

impl EpState {
    fn rma_completion_wanted(&self, args: &RmaArgs<'_>) -> bool {
        !args.inject
            && match &self.tx_cq {
                Some(b) => !b.selective || args.flags & fi::FI_COMPLETION as u64 != 0,
                None => false,
            }
    }

    fn start(&mut self, args: &RmaArgs<'_>, kind: RmaKind, len: usize, header: &[u8], extra: &[&[u8]]) -> Result<()> {
        let peer = self.peer_for(args.peer_addr)?;
        let completion = self.rma_completion_wanted(args);
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let entry = r.rma_ops.vacant_entry();
        let req = entry.key() as u64;
        // The request id travels in the header; patch it in (bytes 8..16).
        let mut hdr = [0u8; 40];
        hdr[..header.len()].copy_from_slice(header);
        hdr[8..16].copy_from_slice(&req.to_le_bytes());
        let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + extra.len());
        parts.push(&hdr[..header.len()]);
        parts.extend_from_slice(extra);
        r.engine.send(now(), peer, &parts, RMA_TOKEN | req)?;
        entry.insert(RmaOp { kind, context: args.context, result: args.result, len, completion, inject: args.inject });
        r.rma_started += 1;
        self.progress();
        Ok(())
    }

    pub fn rma_write(&mut self, args: RmaArgs<'_>, data: Option<u64>) -> Result<()> {
        let len: usize = args.payload.iter().map(|p| p.len()).sum();
        if args.inject && len > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let hdr = wire::encode_write(0, args.key, args.addr, data);
        self.start(&args, RmaKind::Write, len, &hdr, args.payload)
    }

    pub fn rma_read(&mut self, args: RmaArgs<'_>) -> Result<()> {
        let len = args.result.total();
        let hdr = wire::encode_read_req(0, args.key, args.addr, len as u64);
        self.start(&args, RmaKind::Read, len, &hdr, &[])
    }

    pub fn atomic(&mut self, args: RmaArgs<'_>, datatype: u32, op: u32, count: usize, fetch: bool) -> Result<()> {
        let dt = Datatype::from_fi(datatype).ok_or(Error::OpNotSupp)?;
        let o = Op::from_fi(op).ok_or(Error::OpNotSupp)?;
        let family = if !args.compare.is_empty() {
            atomic::Family::Compare
        } else if fetch {
            atomic::Family::Fetch
        } else {
            atomic::Family::Write
        };
        if !atomic::valid(family, dt, o) {
            return Err(Error::OpNotSupp);
        }
        let bytes = count.checked_mul(dt.size()).ok_or(Error::Inval("atomic count"))?;
        let given: usize = args.payload.iter().map(|p| p.len()).sum();
        if o != Op::Read && given != bytes {
            return Err(Error::Inval("atomic operand size"));
        }
        if args.inject && bytes > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let count32 = u32::try_from(count).map_err(|_| Error::Inval("atomic count"))?;
        let hdr = wire::encode_atomic(0, args.key, args.addr, datatype as u8, op as u8, count32, fetch);
        let mut extra: Vec<&[u8]> = if o == Op::Read { Vec::new() } else { args.payload.to_vec() };
        extra.extend_from_slice(args.compare);
        self.start(&args, RmaKind::Atomic { fetch }, bytes, &hdr, &extra)
    }

    /// Looks up and checks an access at the target. Returns the local pieces of
    /// the registration it touches, in order (several when an offset-addressed
    /// access spans segments of a multi-segment registration).
    fn target_access(&self, key: u64, addr: u64, len: u64, want: u64) -> std::result::Result<Vec<Segment>, Status> {
        let keys = self.mr_keys.lock();
        let region = keys.get(key).ok_or(Status::NoKey)?;
        // Registrations made without any access flag allow every access.
        let access_flags = (fi::FI_READ | fi::FI_WRITE | fi::FI_SEND | fi::FI_RECV) as u64 | REMOTE_READ | REMOTE_WRITE;
        let want = if region.access & access_flags == 0 { 0 } else { want };
        keys.check(key, addr, len, want, self.mr_virt_addr).map_err(|e| match e {
            mr_cache::MrError::NoKey(_) | mr_cache::MrError::KeyInUse(_) => Status::NoKey,
            _ => Status::Access,
        })
    }

    fn reply(&mut self, peer: PeerId, parts: &[&[u8]]) {
        let Some(r) = self.running.as_mut() else { return };
        if let Err(e) = r.engine.send(now(), peer, parts, RESPONSE_TOKEN) {
            // The answer is lost only if the engine refuses it outright; the
            // initiator then times out with the peer.
            fi_warn!(Subsys::EpData, "cannot queue an RMA response: {e:?}");
        }
    }

    fn count_target(&mut self, write: bool) {
        if let Some(r) = self.running.as_mut() {
            r.rma_served += 1;
        }
        let c = if write { &self.rwrite_cntr } else { &self.rread_cntr };
        if let Some(c) = c {
            c.inc();
        }
    }

    /// A one-sided packet arrived (request for us as target, or an answer).
    pub(crate) fn handle_rma(&mut self, peer: PeerId, msg: Vec<u8>) {
        let Ok(pkt) = Packet::decode(&msg) else { return };
        match pkt {
            Packet::Msg(..) => {}
            Packet::Write { req, key, addr, data, payload } => {
                let status = match self.target_access(key, addr, payload.len() as u64, REMOTE_WRITE) {
                    Ok(pieces) => {
                        scatter(&pieces, payload);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.count_target(true);
                    if let Some(d) = data {
                        self.push_rx(Completion {
                            flags: (fi::FI_RMA | fi::FI_REMOTE_WRITE | fi::FI_REMOTE_CQ_DATA) as u64,
                            len: payload.len(),
                            data: d,
                            ..Completion::default()
                        });
                    }
                }
                let ack = wire::encode_write_ack(req, status);
                self.reply(peer, &[&ack]);
            }
            Packet::ReadReq { req, key, addr, len } => {
                let mut data: Vec<u8> = Vec::new();
                let status = match self.target_access(key, addr, len, REMOTE_READ) {
                    Ok(pieces) => {
                        gather(&pieces, &mut data);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                if status == Status::Ok {
                    self.count_target(false);
                }
                let h = wire::encode_read_resp(req, status);
                self.reply(peer, &[&h, &data]);
            }
            Packet::Atomic { req, key, addr, datatype, op, count, fetch, payload } => {
                let mut old: Vec<u8> = Vec::new();
                let status = (|| -> std::result::Result<(), Status> {
                    let dt = Datatype::from_fi(datatype as u32).ok_or(Status::Invalid)?;
                    let o = Op::from_fi(op as u32).ok_or(Status::Invalid)?;
                    let bytes = (count as usize).checked_mul(dt.size()).ok_or(Status::Invalid)?;
                    let (operand, compare) = match o {
                        Op::Read => (&payload[..0], &payload[..0]),
                        Op::Cswap | Op::CswapNe | Op::CswapLe | Op::CswapLt | Op::CswapGe | Op::CswapGt | Op::Mswap => {
                            if payload.len() != 2 * bytes {
                                return Err(Status::Invalid);
                            }
                            payload.split_at(bytes)
                        }
                        _ => {
                            if payload.len() != bytes {
                                return Err(Status::Invalid);
                            }
                            (payload, &payload[..0])
                        }
                    };
                    let pieces = self.target_access(key, addr, bytes as u64, REMOTE_WRITE)?;
                    gather(&pieces, &mut old);
                    let mut new = old.clone();
                    atomic::apply(dt, o, &mut new, operand, compare).map_err(|_| Status::Invalid)?;
                    scatter(&pieces, &new);
                    Ok(())
                })();
                let status = match status {
                    Ok(()) => {
                        self.count_target(true);
                        Status::Ok
                    }
                    Err(s) => s,
                };
                let h = wire::encode_atomic_resp(req, status);
                let back: &[u8] = if fetch && status == Status::Ok { &old } else { &[] };
                self.reply(peer, &[&h, back]);
            }
            Packet::ReadResp { req, status, payload } | Packet::AtomicResp { req, status, payload } => {
                self.finish(req, status, payload)
            }
            Packet::WriteAck { req, status } => self.finish(req, status, &[]),
            Packet::Rts(_) | Packet::Fin { .. } | Packet::Push { .. } => {}
        }
        if let Some(r) = self.running.as_mut() {
            r.engine.recycle(msg);
        }
    }

    /// The request could not be delivered (peer unreachable).
    pub(crate) fn fail_rma(&mut self, token: u64) {
        if token == RESPONSE_TOKEN {
            return;
        }
        self.finish_with(token & !RMA_TOKEN, Some(fi::FI_EIO as i32), &[]);
    }

    fn finish(&mut self, req: u64, status: Status, payload: &[u8]) {
        let err = match status {
            Status::Ok => None,
            Status::NoKey | Status::Access => Some(fi::FI_EACCES as i32),
            Status::Invalid => Some(fi::FI_EINVAL as i32),
        };
        self.finish_with(req, err, payload);
    }

    fn finish_with(&mut self, req: u64, err: Option<i32>, payload: &[u8]) {
        let Some(r) = self.running.as_mut() else { return };
        let Some(op) = usize::try_from(req).ok().and_then(|k| r.rma_ops.try_remove(k)) else {
            fi_warn!(Subsys::EpData, "RMA answer for unknown request {req}");
            return;
        };
        if err.is_none() {
            match op.kind {
                RmaKind::Read | RmaKind::Atomic { fetch: true } => {
                    op.result.scatter(payload);
                }
                _ => {}
            }
        }
        let flags = match op.kind {
            RmaKind::Write => (fi::FI_RMA | fi::FI_WRITE) as u64,
            RmaKind::Read => (fi::FI_RMA | fi::FI_READ) as u64,
            RmaKind::Atomic { fetch: false } => (fi::FI_ATOMIC | fi::FI_WRITE) as u64,
            RmaKind::Atomic { fetch: true } => (fi::FI_ATOMIC | fi::FI_READ) as u64,
        };
        if let (true, Some(e)) = (op.inject, err) {
            self.report_contextless_error("fi_inject_write", e);
        } else if op.completion || err.is_some() {
            if let Some(b) = &self.tx_cq {
                b.cq.push(Completion {
                    op_context: op.context,
                    flags,
                    len: op.len,
                    err: err.map(|e| CompletionError { err: e, olen: 0, prov_errno: e, src_addr: None }),
                    ..Completion::default()
                });
            }
        }
        let cntr = if matches!(op.kind, RmaKind::Read) { &self.read_cntr } else { &self.write_cntr };
        if let Some(c) = cntr {
            if err.is_some() {
                c.inc_err();
            } else {
                c.inc();
            }
        }
    }
}

/// Copies `data` into the registered pieces, in order (their lengths sum to
/// `data.len()`: [`mr_cache::Region::resolve`] made them so).
fn scatter(pieces: &[Segment], data: &[u8]) {
    let mut off = 0;
    for p in pieces {
        let n = p.len as usize;
        // SAFETY: each piece lies inside a live registration (checked by
        // target_access); the application keeps registered memory valid while the
        // MR is open; `data[off..off + n]` is in bounds (the pieces sum to its length).
        unsafe { std::ptr::copy_nonoverlapping(data[off..off + n].as_ptr(), p.addr as *mut u8, n) };
        off += n;
    }
}

/// Appends the bytes of the registered pieces, in order, to `out`.
fn gather(pieces: &[Segment], out: &mut Vec<u8>) {
    for p in pieces {
        // SAFETY: as in `scatter`: the piece lies inside a live registration.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.len as usize) });
    }
}

/// One user buffer as an iov (helper for the C entry points).
pub fn one(ptr: usize, len: usize) -> UserIov {
    let mut v = UserIov { count: 1, ..UserIov::default() };
    v.bufs[0] = UserBuf { ptr, len };
    v
}
