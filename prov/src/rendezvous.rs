//! The rendezvous path of long messages to peers on the same host.
//!
//! A send of at least `FI_RDMX_RNDV_THRESHOLD` bytes to a peer the endpoint
//! reaches through shared memory (and whose device offers remote read) sends a
//! ready-to-send ([`rndv::Rts`]) that lists where the bytes lie in this process.
//! The send stays pending; the user's buffer is not copied.
//!
//! The receiver matches the RTS like any message. At the match it reads the bytes
//! with [`Device::remote_read`] (`process_vm_readv`) straight into the posted
//! buffer, one copy in all, and answers `Fin(Done)`; the send completes on the
//! `Fin`. The bytes never pass through the ring, and an RTS that arrives before
//! its receive is posted costs the receiver ~100 bytes of unexpected-message
//! memory instead of the whole message.
//!
//! When the receiver may not read the sender (different user, Yama
//! `ptrace_scope`, seccomp, or `FI_RDMX_SHM_CMA=0`) it keeps the matched receive
//! aside and answers `Fin(Push)`; the sender then sends the bytes as a `Push`
//! message through the reliable-datagram path (copy through the ring) and
//! completes when that is acknowledged. The sender remembers the refusal and sends
//! further long messages to that peer eagerly.
//!
//! Limits: a receiver that dies after acknowledging the RTS but before its `Fin`
//! leaves the send pending until the peer is declared unreachable (the engine's
//! peer timeout) — the same as any send waiting on an unresponsive peer.
use crate::core::{now, EpState, Running, UserBuf, UserIov};
use crate::log::{fi_warn, Subsys};
use crate::params::params;
use libfabric_sys as fi;
use rdm::engine::PeerId;
use rdm::{DevAddr, Device, DeviceError};
use rndv::iov::zip_pieces;
use rndv::wire::rendezvous::{encode_fin, encode_push, FinStatus, RemoteIov, Rts, MAX_IOV, RTS_MAX};
use rndv::{MsgHeader, Packet};
use std::collections::{HashMap, HashSet, VecDeque};

/// Engine token bit of a ready-to-send (the rest is the send's tx token).
pub const RTS_TOKEN: u64 = 1 << 62;

/// Sender-side state of a long send: the peer that must answer and the user's
/// buffers (valid until the send completes, by libfabric's contract).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RndvTx {
    pub peer: PeerId,
    pub iov: UserIov,
}

/// Where a matched message lands and what its completion says; kept aside while
/// a pushed rendezvous is in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Landing {
    pub target: UserIov,
    pub context: usize,
    pub completion: bool,
    pub flags: u64,
    pub buf: usize,
    pub msg_len: usize,
    pub data: u64,
    pub tag: u64,
    pub src: u64,
    pub src_err: Option<[u8; crate::addr::ADDR_LEN]>,
}

/// Per-endpoint rendezvous bookkeeping.
#[derive(Default)]
pub(crate) struct RndvState {
    /// Peers that refused to pull: long messages to them go eagerly.
    pub refused: HashSet<PeerId>,
    /// Matched receives waiting for the sender's `Push`, by (sender, its req id).
    pub awaiting_push: HashMap<(PeerId, u64), Landing>,
    /// Sends whose `Push` the engine could not queue yet (tx tokens).
    pub push_backlog: VecDeque<usize>,
    pub rts_sent: u64,
    pub pulled: u64,
    pub pushed: u64,
    /// Fin / Push packets that matched nothing (stale or forged), dropped.
    pub stray: u64,
}

impl Running {
    /// Whether a long message to `peer` may go by rendezvous.
    pub(crate) fn rndv_possible(&self, peer: PeerId) -> bool {
        let dev = self.engine.peer_addr(peer);
        matches!(dev, DevAddr::Shm(_)) && self.device.caps_for(&dev).remote_read && !self.rndv.refused.contains(&peer)
    }

    /// An unexpected message dropped by FI_DISCARD: an announced one still needs
    /// its `Fin`, or the sender would wait forever.
    pub(crate) fn discard_arrived(&mut self, peer: PeerId, rts: Option<Rts>, msg: Vec<u8>) {
        self.engine.recycle(msg);
        if let Some(rts) = rts {
            self.send_fin(peer, rts.req, FinStatus::Discarded, 0);
        }
    }

    fn send_fin(&mut self, peer: PeerId, req: u64, status: FinStatus, read: u64) {
        let fin = encode_fin(req, status, read);
        if let Err(e) = self.engine.send(now(), peer, &[&fin], crate::rma::RESPONSE_TOKEN) {
            fi_warn!(Subsys::EpData, "cannot queue a rendezvous Fin: {e:?}");
        }
    }
}

impl EpState {
    /// Announces a long message instead of sending it.
    pub(crate) fn send_rts(
        &mut self,
        peer: PeerId,
        header: MsgHeader,
        args: &crate::core::SendArgs<'_>,
        total: usize,
        op_flags: u64,
        completion: bool,
    ) -> crate::error::Result<()> {
        let Some(r) = self.running.as_mut() else { return Err(crate::error::Error::OpNotSupp) };
        let mut user = UserIov::default();
        let mut remote = [RemoteIov::default(); MAX_IOV];
        for s in args.payload.iter().filter(|s| !s.is_empty()).take(MAX_IOV) {
            user.bufs[user.count] = UserBuf { ptr: s.as_ptr() as usize, len: s.len() };
            remote[user.count] = RemoteIov { addr: s.as_ptr() as u64, len: s.len() as u64 };
            user.count += 1;
        }
        let token = r.tx_ops.insert(crate::core::TxOp::new(args.context, op_flags, total, completion, Some(RndvTx { peer, iov: user })));
        let rts = Rts { header, req: token as u64, total: total as u64, iov: remote, iov_count: user.count };
        let mut wire = [0u8; RTS_MAX];
        let n = rts.encode(&mut wire);
        if let Err(e) = r.engine.send(now(), peer, &[&wire[..n]], RTS_TOKEN | token as u64) {
            r.tx_ops.remove(token);
            self.progress();
            return Err(e.into());
        }
        r.rndv.rts_sent += 1;
        self.progress();
        Ok(())
    }

    /// The matched RTS of a long message: pull its bytes into `l.target`.
    pub(crate) fn pull(&mut self, peer: PeerId, rts: Rts, l: Landing) {
        let Some(r) = self.running.as_mut() else { return };
        let dev = r.engine.peer_addr(peer);
        let mut src_lens = [0u64; MAX_IOV];
        for (d, v) in src_lens.iter_mut().zip(rts.iovs()) {
            *d = v.len;
        }
        let mut dst_lens = [0u64; MAX_IOV];
        for (d, b) in dst_lens.iter_mut().zip(&l.target.bufs[..l.target.count]) {
            *d = b.len as u64;
        }
        let mut failure: Option<DeviceError> = None;
        let read = if params().shm_cma {
            let device = &mut r.device;
            zip_pieces(&src_lens[..rts.iov_count], &dst_lens[..l.target.count], |si, so, di, doff, len| {
                let at = l.target.bufs[di].ptr + doff as usize;
                // SAFETY: the application posted this buffer (`bufs[di]`, `len` bytes
                // from `doff` lie inside it: zip_pieces keeps runs inside pieces) and
                // keeps it valid and unaliased until the receive completes.
                let dst = unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len as usize) };
                match device.remote_read(dev, rts.iov[si].addr + so, dst) {
                    Ok(n) if n as u64 == len => true,
                    Ok(n) => {
                        failure = Some(DeviceError::Config(format!("short remote read: {n} of {len} bytes")));
                        false
                    }
                    Err(e) => {
                        failure = Some(e);
                        false
                    }
                }
            })
        } else {
            failure = Some(DeviceError::Unsupported);
            0
        };
        match failure {
            None => {
                r.rndv.pulled += 1;
                r.send_fin(peer, rts.req, FinStatus::Done, read);
                self.finish_recv(&l, read as usize, None);
            }
            Some(DeviceError::Unsupported) if read == 0 => {
                // Not allowed to read that process: have the bytes pushed.
                r.rndv.awaiting_push.insert((peer, rts.req), l);
                r.send_fin(peer, rts.req, FinStatus::Push, 0);
            }
            Some(e) => {
                fi_warn!(Subsys::EpData, "rendezvous read from {dev:?} failed after {read} bytes: {e}");
                r.send_fin(peer, rts.req, FinStatus::Failed, read);
                self.finish_recv(&l, read as usize, Some(fi::FI_EIO));
            }
        }
    }

    /// A packet of the message layer that is neither a message nor an RTS.
    pub(crate) fn handle_control(&mut self, peer: PeerId, msg: Vec<u8>) {
        match Packet::decode(&msg) {
            Ok(Packet::Fin { req, status, .. }) => {
                self.handle_fin(peer, req, status);
                if let Some(r) = self.running.as_mut() {
                    r.engine.recycle(msg);
                }
            }
            Ok(Packet::Push { req, payload }) => {
                let Some(r) = self.running.as_mut() else { return };
                match r.rndv.awaiting_push.remove(&(peer, req)) {
                    Some(l) => {
                        let written = l.target.scatter(payload);
                        r.rndv.pushed += 1;
                        self.finish_recv(&l, written, None);
                    }
                    None => {
                        r.rndv.stray += 1;
                        fi_warn!(Subsys::EpData, "dropping a rendezvous push nobody waits for (req {req})");
                    }
                }
                if let Some(r) = self.running.as_mut() {
                    r.engine.recycle(msg);
                }
            }
            _ => self.handle_rma(peer, msg),
        }
    }

    fn handle_fin(&mut self, peer: PeerId, req: u64, status: FinStatus) {
        let Some(r) = self.running.as_mut() else { return };
        let ours = usize::try_from(req)
            .ok()
            .and_then(|t| r.tx_ops.get(t))
            .and_then(|op| op.rndv)
            .is_some_and(|x| x.peer == peer);
        if !ours {
            r.rndv.stray += 1;
            fi_warn!(Subsys::EpData, "dropping a rendezvous Fin for no send of this peer (req {req})");
            return;
        }
        match status {
            FinStatus::Done | FinStatus::Discarded => self.complete_send(req, None),
            FinStatus::Failed => self.complete_send(req, Some(fi::FI_EIO as i32)),
            FinStatus::Push => {
                r.rndv.refused.insert(peer);
                r.rndv.push_backlog.push_back(req as usize);
                self.retry_pushes();
            }
        }
    }

    /// Queues the `Push` messages of refused rendezvous sends, in order, while
    /// the engine takes them.
    pub(crate) fn retry_pushes(&mut self) {
        let Some(r) = self.running.as_mut() else { return };
        while let Some(&token) = r.rndv.push_backlog.front() {
            let Some(tx) = r.tx_ops.get(token).and_then(|op| op.rndv) else {
                r.rndv.push_backlog.pop_front();
                continue;
            };
            let hdr = encode_push(token as u64);
            let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
            parts[0] = &hdr;
            for (p, b) in parts[1..].iter_mut().zip(&tx.iov.bufs[..tx.iov.count]) {
                // SAFETY: the sender's buffers stay valid until its send completes
                // (libfabric's contract), which happens only after this Push is
                // acknowledged; the engine copies them before `send` returns.
                *p = unsafe { std::slice::from_raw_parts(b.ptr as *const u8, b.len) };
            }
            match r.engine.send(now(), tx.peer, &parts[..=tx.iov.count], token as u64) {
                Ok(()) => {
                    r.rndv.push_backlog.pop_front();
                }
                Err(_) => return,
            }
        }
    }
}
