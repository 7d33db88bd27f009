//! The verbs device's remote reads: RDMA reads over reliable connected
//! (RC) queue pairs made lazily, one per peer each way (the connection
//! table, sans-IO, is [`rdm::device::rc::ConnTable`]; this is its queue
//! factory), posted in pieces and polled on one completion queue shared by
//! every connection; stuck reads are given up. The [`RemoteReads`]
//! implementation. Apart from the UD queue pair (`ud.rs`): a different
//! queue pair type with its own state, touched only by rendezvous reads.
//!
//! Unsafe here: creating, modifying and destroying RC queue pairs, posting RDMA reads, polling their CQ.
#![allow(unsafe_code)]

use super::context::Ctx;
use super::{
    link_send_chain, mr_keys, posted_before, VerbsDevice, HOP_LIMIT, POLL_BATCH, RC_CQ_DEPTH, RC_READ_PIECE,
    RC_READ_PIECES_MAX, RC_READ_TIMEOUT, RC_RETRY, RC_SQ_DEPTH, RC_TIMEOUT,
};
use crate::ib::{last_err, ret_err};
use rdm::device::rc::{ConnTable, QueueFactory, QueueInfo};
use rdm::device::{ControlMsg, DevAddr, DeviceError, ReadRun, RemoteReads};
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::ptr;
use std::sync::Arc;

/// The endpoint's remote reads (the part of [`VerbsDevice`] that reads
/// peers' memory): the connections, their queue pairs, the reads posted.
pub(super) struct RcReads {
    pub(super) conns: ConnTable<RcQueue>,
    pub(super) queues: RcFactory,
    pub(super) reads: slab::Slab<RcRead>,
    pub(super) done: VecDeque<rdm::device::ReadDone>,
    /// The endpoint's clock as it last passed it in (`post_read`,
    /// `poll_read`, `handle_control`): the device reads no clock of its own;
    /// reads' progress and the connections' idleness are timed by it.
    pub(super) now: rdm::time::Instant,
    pub(super) wrs: Vec<ib::ibv_send_wr>,
    pub(super) sges: Vec<ib::ibv_sge>,
}

/// One end of a connection for reads: an RC queue pair.
pub struct RcQueue {
    qp: *mut ib::ibv_qp,
    qpn: u32,
    psn: u32,
}

/// Makes, connects and retires RC queue pairs ([`ConnTable`]'s factory);
/// counts the reads posted on each so a retired one is destroyed only when
/// its last request has completed (flushed).
pub(super) struct RcFactory {
    pub(super) ctx: Arc<Ctx>,
    pub(super) cq: *mut ib::ibv_cq,
    /// Read requests posted and not completed, per queue pair number.
    pub(super) outstanding: FxHashMap<u32, u32>,
    /// Requests outstanding on all queue pairs (bounded by the CQ's size).
    pub(super) total_outstanding: u32,
    /// Queue pairs moved to the error state, waiting for their requests to
    /// flush before they are destroyed.
    pub(super) retiring: Vec<RcQueue>,
    pub(super) psn_seed: u64,
    /// Queue pairs made and not yet destroyed (open and retiring ones).
    pub(super) live: u64,
}

/// A posted read: its requests still to complete and how it went.
pub(super) struct RcRead {
    id: u64,
    peer: DevAddr,
    wrs_left: u32,
    bytes: u64,
    failed: bool,
    /// When it was posted or a piece of it last completed.
    last_progress: rdm::time::Instant,
    /// Given up on (reported failed) before its requests completed: their
    /// flushes are taken in silently.
    reported: bool,
}

impl RcFactory {
    fn modify(
        qp: *mut ib::ibv_qp,
        attr: &mut ib::ibv_qp_attr,
        mask: ib::ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    pub(super) fn destroy(q: &RcQueue) {
        // SAFETY: a QP of ours with nothing outstanding, destroyed once.
        unsafe { ib::ibv_destroy_qp(q.qp) };
    }

    /// Destroys the retiring queue pairs whose requests have all completed.
    fn reap_retired(&mut self) {
        let out = &self.outstanding;
        let before = self.retiring.len();
        self.retiring.retain(|q| {
            let busy = out.get(&q.qpn).is_some_and(|&n| n > 0);
            if !busy {
                RcFactory::destroy(q);
            }
            busy
        });
        self.live -= (before - self.retiring.len()) as u64;
    }
}

impl QueueFactory for RcFactory {
    type Queue = RcQueue;

    fn create(&mut self) -> Result<(RcQueue, QueueInfo), DeviceError> {
        let mut init = ib::ibv_qp_init_attr {
            send_cq: self.cq,
            recv_cq: self.cq,
            cap: ib::ibv_qp_cap {
                max_send_wr: RC_SQ_DEPTH.min(self.ctx.max_qp_wr),
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ib::ibv_qp_type_IBV_QPT_RC,
            sq_sig_all: 0,
            ..Default::default()
        };
        // SAFETY: a live PD and CQ; `init` is a valid in/out struct.
        let qp = unsafe { ib::ibv_create_qp(self.ctx.pd, &mut init) };
        if qp.is_null() {
            return Err(last_err("ibv_create_qp(RC)"));
        }
        // SAFETY: a live QP.
        let qpn = unsafe { (*qp).qp_num };
        // A PSN of 24 bits, different per queue pair and incarnation.
        self.psn_seed = self.psn_seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407 ^ qpn as u64);
        let q = RcQueue { qp, qpn, psn: (self.psn_seed >> 40) as u32 & 0xff_ffff };
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.ctx.port,
            qp_access_flags: ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0,
            ..Default::default()
        };
        if let Err(e) = Self::modify(
            qp,
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(RC INIT)",
        ) {
            Self::destroy(&q);
            return Err(e);
        }
        let info = QueueInfo { qpn, psn: q.psn, gid: self.ctx.gid, lid: self.ctx.lid, mtu: self.ctx.mtu_enum };
        self.live += 1;
        Ok((q, info))
    }

    fn connect(&mut self, q: &mut RcQueue, remote: &QueueInfo) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut ah = ib::ibv_ah_attr { port_num: self.ctx.port, ..Default::default() };
        if self.ctx.infiniband {
            ah.dlid = remote.lid;
        } else {
            ah.is_global = 1;
            ah.grh.dgid.raw = remote.gid;
            ah.grh.sgid_index = self.ctx.gid_index;
            ah.grh.hop_limit = HOP_LIMIT;
        }
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_RTR,
            path_mtu: self.ctx.mtu_enum.min(remote.mtu).max(1) as ib::ibv_mtu,
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: self.ctx.rd_atomic,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        Self::modify(
            q.qp,
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_AV
                | m::IBV_QP_PATH_MTU
                | m::IBV_QP_DEST_QPN
                | m::IBV_QP_RQ_PSN
                | m::IBV_QP_MAX_DEST_RD_ATOMIC
                | m::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RC RTR)",
        )?;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_RTS,
            timeout: RC_TIMEOUT,
            retry_cnt: RC_RETRY,
            rnr_retry: 7,
            sq_psn: q.psn,
            max_rd_atomic: self.ctx.rd_atomic,
            ..Default::default()
        };
        Self::modify(
            q.qp,
            &mut a,
            m::IBV_QP_STATE
                | m::IBV_QP_TIMEOUT
                | m::IBV_QP_RETRY_CNT
                | m::IBV_QP_RNR_RETRY
                | m::IBV_QP_SQ_PSN
                | m::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RC RTS)",
        )
    }

    /// To the error state (the device stops touching memory for it and
    /// flushes what is posted), destroyed once those flushes are taken in.
    fn retire(&mut self, q: RcQueue) {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_ERR, ..Default::default() };
        let _ = Self::modify(q.qp, &mut a, m::IBV_QP_STATE, "ibv_modify_qp(RC ERR)");
        self.retiring.push(q);
        self.reap_retired();
    }
}

impl VerbsDevice {
    /// Takes in RC read completions: a read is done when its last request
    /// completed; one that failed (the connection broke, a key was refused)
    /// breaks its connection and is reported `NotConnected`, so its message
    /// is pushed instead.
    pub(super) fn reap_reads(&mut self) {
        if self.rc.queues.cq.is_null() {
            return;
        }
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.rc.queues.cq, POLL_BATCH as i32, self.ud.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for i in 0..n as usize {
                let wc = self.ud.wcs[i];
                if let Some(c) = self.rc.queues.outstanding.get_mut(&wc.qp_num) {
                    *c = c.saturating_sub(1);
                    if *c == 0 {
                        self.rc.queues.outstanding.remove(&wc.qp_num);
                    }
                }
                self.rc.queues.total_outstanding = self.rc.queues.total_outstanding.saturating_sub(1);
                let Some(r) = self.rc.reads.get_mut(wc.wr_id as usize) else { continue };
                if wc.status == ib::ibv_wc_status_IBV_WC_SUCCESS {
                    if !r.failed {
                        r.bytes += wc.byte_len as u64;
                        // A piece landed: the read moves, slow as it may be
                        // (a lossy path); only one that stops is given up.
                        r.last_progress = self.rc.now;
                    }
                } else {
                    if wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                        self.stats.rc_last_error_status = wc.status;
                    }
                    r.failed = true;
                }
                r.wrs_left -= 1;
                if r.wrs_left == 0 {
                    let r = self.rc.reads.remove(wc.wr_id as usize);
                    if r.reported {
                        continue;
                    }
                    self.rc.conns.read_finished(self.rc.now, &r.peer);
                    if r.failed {
                        self.stats.rc_read_errors += 1;
                        let now = self.rc.now;
                        self.rc.conns.broken(now, r.peer, &mut self.rc.queues);
                        self.rc.done.push_back(rdm::device::ReadDone {
                            id: r.id,
                            bytes: r.bytes,
                            error: Some(DeviceError::NotConnected),
                        });
                    } else {
                        self.stats.rc_read_bytes += r.bytes;
                        self.rc.done.push_back(rdm::device::ReadDone { id: r.id, bytes: r.bytes, error: None });
                    }
                }
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
        self.give_up_stuck_reads();
        self.rc.queues.reap_retired();
    }

    /// A read no completion has answered within the read timeout (a path
    /// that drops RC packets without the device reporting it: seen on
    /// Soft-RoCE between devices with no route) breaks its connection (to
    /// the error state: nothing more lands in its buffer) and is reported
    /// failed now, so its message is pushed instead of waiting forever.
    fn give_up_stuck_reads(&mut self) {
        if self.rc.reads.is_empty() {
            return;
        }
        let now = self.rc.now;
        let limit = self.ctx.cfg.rc_read_timeout.unwrap_or(RC_READ_TIMEOUT);
        while let Some((slot, peer)) = self
            .rc
            .reads
            .iter()
            .find(|(_, r)| !r.reported && now.saturating_duration_since(r.last_progress) >= limit)
            .map(|(k, r)| (k, r.peer))
        {
            let r = &mut self.rc.reads[slot];
            r.reported = true;
            let (id, bytes) = (r.id, r.bytes);
            self.stats.rc_read_errors += 1;
            self.stats.rc_reads_timed_out += 1;
            self.rc.conns.read_finished(now, &peer);
            self.rc.conns.broken(now, peer, &mut self.rc.queues);
            self.rc.done.push_back(rdm::device::ReadDone { id, bytes, error: Some(DeviceError::NotConnected) });
        }
    }
}

impl RemoteReads for VerbsDevice {
    /// An RDMA read through the peer's RC connection, one request per piece
    /// of at most the port's `max_msg_sz`, all posted at once. No
    /// connection yet (it is being made), or no room: `NotConnected`, and
    /// the sender pushes this message.
    fn post_read(
        &mut self,
        now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        if !self.rc.conns.enabled() {
            return Err(DeviceError::Unsupported);
        }
        self.rc.now = now;
        self.reap_reads();
        self.rc.conns.expire(now, &mut self.rc.queues);
        // Pieces of at least RC_READ_PIECE, fewer than RC_READ_PIECES_MAX
        // per read where the read is larger, never beyond the port's
        // max_msg_sz: on rxe (and on NICs that reset the retry counter
        // only when a request completes) one lost response packet costs a
        // retry of the request it belongs to, so one request for a 64 MiB
        // read under loss spends its 7 retries and breaks the connection,
        // where pieces of a few MiB each complete and reset it.
        let total: u64 = runs.iter().map(|r| r.local.len()).sum();
        let max_msg = self.ctx.max_msg.max(4096).min(RC_READ_PIECE.max(total.div_ceil(RC_READ_PIECES_MAX)));
        let wrs: u64 = runs.iter().map(|r| r.local.len().div_ceil(max_msg).max(1)).sum();
        let Some(q) = self.rc.conns.route(now, peer, &mut self.rc.queues) else {
            return Err(DeviceError::NotConnected);
        };
        let (qp, qpn) = (q.qp, q.qpn);
        let busy = self.rc.queues.outstanding.get(&qpn).copied().unwrap_or(0) as u64;
        let cq_room =
            (RC_CQ_DEPTH.min(self.ctx.max_cqe) as u64).saturating_sub(self.rc.queues.total_outstanding as u64);
        if busy + wrs > RC_SQ_DEPTH.min(self.ctx.max_qp_wr) as u64 || wrs > cq_room {
            self.stats.rc_reads_deferred += 1;
            return Err(DeviceError::NotConnected);
        }
        if runs.iter().any(|r| r.remote_key.is_none() || r.local.key().is_none()) {
            return Err(DeviceError::Config("an RDMA read needs the peer's key and a local one".into()));
        }
        let slot = self.rc.reads.vacant_key() as u64;
        self.rc.wrs.clear();
        self.rc.sges.clear();
        for r in runs {
            let (_, rkey) = mr_keys(r.remote_key.unwrap_or(0));
            let (lkey, _) = mr_keys(r.local.key().unwrap_or(0));
            let mut off = 0u64;
            loop {
                let len = (r.local.len() - off).min(max_msg);
                self.rc.sges.push(ib::ibv_sge { addr: r.local.addr() + off, length: len as u32, lkey });
                let mut wr = ib::ibv_send_wr {
                    wr_id: slot,
                    num_sge: 1,
                    opcode: ib::ibv_wr_opcode_IBV_WR_RDMA_READ,
                    send_flags: ib::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    ..Default::default()
                };
                wr.wr.rdma = ib::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: r.remote_addr + off, rkey };
                self.rc.wrs.push(wr);
                off += len;
                if off >= r.local.len() {
                    break;
                }
            }
        }
        let n = self.rc.wrs.len();
        link_send_chain(&mut self.rc.wrs, &mut self.rc.sges, 1);
        let mut bad: *mut ib::ibv_send_wr = ptr::null_mut();
        // SAFETY: a chain of valid RDMA read requests on a connected RC QP:
        // each local SGE names memory the caller vouched for until this read
        // completes (`LocalBuf`), registered under its lkey; the remote side
        // is named by the peer's rkey.
        let rc = unsafe { ib::ibv_post_send(qp, self.rc.wrs.as_mut_ptr(), &mut bad) };
        let posted = if rc == 0 { n } else { posted_before(bad, &self.rc.wrs) };
        if posted == 0 {
            self.stats.rc_read_errors += 1;
            self.rc.conns.broken(now, peer, &mut self.rc.queues);
            return Err(DeviceError::NotConnected);
        }
        // Requests that did not post count as failed; the read is given up
        // (pushed) when the posted ones complete.
        let key = self.rc.reads.insert(RcRead {
            id,
            peer,
            wrs_left: posted as u32,
            bytes: 0,
            failed: posted < n,
            last_progress: now,
            reported: false,
        });
        debug_assert_eq!(key as u64, slot);
        *self.rc.queues.outstanding.entry(qpn).or_insert(0) += posted as u32;
        self.rc.queues.total_outstanding += posted as u32;
        self.rc.conns.read_started(&peer);
        self.stats.rc_reads += 1;
        self.stats.rc_read_requests += posted as u64;
        Ok(())
    }

    fn poll_read(&mut self, now: rdm::time::Instant) -> Option<rdm::device::ReadDone> {
        self.rc.now = now;
        if self.rc.done.is_empty() && !self.rc.reads.is_empty() {
            self.reap_reads();
        }
        self.rc.done.pop_front()
    }

    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        let (to, m) = self.rc.conns.poll_message()?;
        Some((to, ControlMsg::new(&m.encode()).expect("a handshake message fits")))
    }

    fn handle_control(&mut self, now: rdm::time::Instant, from: DevAddr, bytes: &[u8]) {
        self.rc.now = now;
        if !self.rc.conns.handle(now, from, bytes, &mut self.rc.queues) {
            self.stats.rc_bad_control += 1;
        }
    }

    fn peer_failed(&mut self, peer: DevAddr) {
        // Its queue pairs go to the error state: reads in flight flush and
        // complete as failed.
        self.rc.conns.peer_failed(&peer, &mut self.rc.queues);
    }

    fn read_conn_stats(&mut self) -> rdm::device::ReadConnStats {
        rdm::device::ReadConnStats {
            conns: self.rc.conns.stats,
            open_active: self.rc.conns.active_len(),
            open_passive: self.rc.conns.passive_len(),
            reads: self.stats.rc_reads,
            read_bytes: self.stats.rc_read_bytes,
            read_failures: self.stats.rc_read_errors,
            read_timeouts: self.stats.rc_reads_timed_out,
            last_read_error: self.stats.rc_last_error_status,
            queue_pairs: self.rc.queues.live,
        }
    }
}
