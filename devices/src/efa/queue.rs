//! The EFA device's endpoint: one SRD queue pair (see the module docs):
//! sends in `ibv_wr_*` sessions, receives named from the domain's address
//! handles or the completion's GID, RDMA reads on the same queue pair, and
//! bringing it back after an error; the [`Device`] and [`RemoteReads`]
//! implementations. Apart from the device's discovery and domain
//! (`mod.rs`): this is the per-endpoint data path.
//!
//! Unsafe here: the SRD queue pair and its CQs: creating them, posting sends and reads, polling, modifying state.
#![allow(unsafe_code)]

use super::{
    efa_addr, parse_efa_addr, split_read, EfaCtx, EfaLimits, AHN_UNKNOWN, POLL_BATCH, PORT, READ_WR, RNR_RETRY_INFINITE,
};
use crate::ib::{
    last_err, mr_keys, nonblocking_channel, qkey_for, ret_err, AhCache, AhCounters, AhError, BounceSlots, ReceiveSlots,
};
use rdm::device::{DevAddr, Device, DeviceCaps, DeviceError, OpenSpec, ReadDone, ReadRun, RemoteReads, TxDatagram};
use rdm::Instant;
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;

/// Counters of one [`EfaDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct EfaStats {
    pub sent: u64,
    pub received: u64,
    pub inline_sends: u64,
    pub bounce_copies: u64,
    pub gathered_sends: u64,
    /// Gathered sends that failed locally (their registration was gone);
    /// their destinations go to `poll_unreachable` all the same (the
    /// datagram is lost and nothing resends it).
    pub gathered_send_errors: u64,
    /// `send_batch` calls cut short by a full send queue.
    pub sq_full: u64,
    /// Sends that failed: completed in error (flushed ones included) or
    /// dropped by a queue pair reset; each destination to `poll_unreachable`.
    pub send_errors: u64,
    /// Receive completions in error or of impossible length.
    pub recv_errors: u64,
    /// Datagrams dropped because their sender could not be named (an AH
    /// number the domain never had, or no source GID in the completion).
    pub unknown_sources: u64,
    /// Address handles this endpoint made, gave back for room, could not
    /// make (the peer failed), and could not make for want of room now
    /// (back-pressure: the send waits).
    pub ah_created: u64,
    pub ah_evicted: u64,
    pub ah_failed: u64,
    pub ah_busy: u64,
    pub qp_recoveries: u64,
    /// RDMA reads posted, their requests, bytes read, reads failed.
    pub reads: u64,
    pub read_requests: u64,
    pub read_bytes: u64,
    pub read_errors: u64,
    /// Failed reads whose request timed out in the device (the remote did
    /// not answer: `IBV_WC_RESP_TIMEOUT_ERR`, `IBV_WC_RETRY_EXC_ERR`).
    pub read_timeouts: u64,
    /// Reads refused for want of room in the send queue (pushed).
    pub reads_deferred: u64,
    /// The `ibv_wc_status` of the last failed request (not flushed), or
    /// the errno of a read session the provider refused.
    pub last_error_status: u32,
    /// The `ibv_wc_status` of the last failed read request (not flushed).
    pub last_read_status: u32,
}

/// The domain's address-handle cache counts into the endpoint's counters.
impl AhCounters for EfaStats {
    fn ah_created(&mut self) {
        self.ah_created += 1;
    }
    fn ah_evicted(&mut self) {
        self.ah_evicted += 1;
    }
    fn ah_failed(&mut self) {
        self.ah_failed += 1;
    }
    fn ah_busy(&mut self) {
        self.ah_busy += 1;
    }
}

/// Where one datagram of a batch goes: its AH (one use taken), QPN, GID.
struct ResolvedDst {
    ah: *mut ib::ibv_ah,
    qpn: u32,
    gid: [u8; 16],
}

/// A posted send that has not completed.
struct Inflight {
    dst: DevAddr,
    gid: [u8; 16],
    bounce: Option<u32>,
    gathered: bool,
}

/// A posted read: its requests still to complete and how it went.
struct EfaRead {
    id: u64,
    gid: [u8; 16],
    wrs_left: u32,
    bytes: u64,
    status: Option<u32>,
}

/// A receive completion taken from the CQ, not yet delivered.
struct RxDone {
    slot: u32,
    /// The sender and the length; `None`: the completion failed or its
    /// sender could not be named (counted, the slot reposted).
    ok: Option<(DevAddr, u32)>,
}

/// One endpoint's SRD queue pair (see the module docs).
pub struct EfaDevice {
    ctx: Arc<EfaCtx>,
    channel: *mut ib::ibv_comp_channel,
    scq: *mut ib::ibv_cq,
    rcq_ex: *mut ib::ibv_cq_ex,
    rcq: *mut ib::ibv_cq,
    efa_rcq: *mut ib::efadv_cq,
    qp: *mut ib::ibv_qp,
    qpx: *mut ib::ibv_qp_ex,
    qpn: u32,
    qkey: u32,
    local: DevAddr,
    limits: EfaLimits,
    // Receive.
    rx: ReceiveSlots,
    rx_pending: VecDeque<RxDone>,
    // Send.
    tx_seq: u64,
    inflight: FxHashMap<u64, Inflight>,
    /// Scratch of `send_batch`: the batch's resolved destinations.
    tx_resolved: Vec<ResolvedDst>,
    /// Read requests posted and not completed (they take send queue room).
    read_wrs: u32,
    bounce: BounceSlots,
    wcs: Vec<ib::ibv_wc>,
    /// Destinations of failed sends, for `poll_unreachable` (each once).
    unreachable: VecDeque<DevAddr>,
    check_qp: bool,
    // Reads.
    reads: slab::Slab<EfaRead>,
    read_done: VecDeque<ReadDone>,
    pub stats: EfaStats,
}

// SAFETY: the device owns its verbs objects and buffers; verbs calls are
// thread-safe, and `&mut self` serialises this device's own use.
unsafe impl Send for EfaDevice {}

impl EfaDevice {
    pub(super) fn open(ctx: Arc<EfaCtx>, spec: &OpenSpec) -> Result<EfaDevice, DeviceError> {
        let limits = ctx.limits;
        let mut dev = EfaDevice {
            channel: ptr::null_mut(),
            scq: ptr::null_mut(),
            rcq_ex: ptr::null_mut(),
            rcq: ptr::null_mut(),
            efa_rcq: ptr::null_mut(),
            qp: ptr::null_mut(),
            qpx: ptr::null_mut(),
            qpn: 0,
            qkey: qkey_for(spec.job_key),
            local: DevAddr::NONE,
            limits,
            rx: ReceiveSlots::new(ctx.pd, limits.mtu, limits.rq_depth)?,
            rx_pending: VecDeque::new(),
            tx_seq: 0,
            inflight: FxHashMap::default(),
            tx_resolved: Vec::new(),
            read_wrs: 0,
            bounce: BounceSlots::new(ctx.pd, limits.mtu, limits.sq_depth)?,
            wcs: vec![ib::ibv_wc::default(); POLL_BATCH],
            unreachable: VecDeque::new(),
            check_qp: false,
            reads: slab::Slab::new(),
            read_done: VecDeque::new(),
            stats: EfaStats::default(),
            ctx,
        };
        // From here on, Drop releases whatever was created.
        // A completion channel where the device can notify (newer EFA
        // kernels); without one the endpoint polls.
        dev.channel = nonblocking_channel(dev.ctx.ctx).unwrap_or(ptr::null_mut());
        dev.create_cqs()?;
        dev.create_qp()?;
        dev.bring_up()?;
        dev.post_receives(0..dev.limits.rq_depth)?;
        dev.local = efa_addr(dev.ctx.gid, dev.qpn);
        Ok(dev)
    }

    /// The send CQ (sends and reads) and the extended receive CQ that
    /// names senders' GIDs: both on the channel when the device takes one
    /// for both; else both without, and the channel destroyed once no CQ
    /// is on it (a channel with a CQ on it cannot be destroyed: it would
    /// leak, and a send CQ on it with a receive CQ off it would wake a
    /// sleeper for sends only).
    fn create_cqs(&mut self) -> Result<(), DeviceError> {
        let ctx = self.ctx.ctx;
        let sq = self.limits.sq_depth as i32;
        let wc_flags = ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_BYTE_LEN
            | ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SRC_QP
            | ib::ibv_create_cq_wc_flags_IBV_WC_EX_WITH_SLID;
        let mut failure = None;
        for on_channel in [true, false] {
            if on_channel && self.channel.is_null() {
                continue;
            }
            if !on_channel && !self.channel.is_null() {
                // No CQ is on the channel now (those made on it were
                // destroyed below): nothing can wake a sleeper, so go.
                // SAFETY: a live channel with no CQ on it, destroyed once.
                unsafe { ib::ibv_destroy_comp_channel(self.channel) };
                self.channel = ptr::null_mut();
            }
            let channel = self.channel;
            // SAFETY: an open context; a channel, if any, outlives the CQ (Drop order).
            self.scq = unsafe { ib::ibv_create_cq(ctx, sq, ptr::null_mut(), channel, 0) };
            if self.scq.is_null() {
                failure = Some(last_err("ibv_create_cq(send)"));
                continue;
            }
            let mut attr = ib::ibv_cq_init_attr_ex {
                cqe: self.limits.rq_depth,
                channel,
                comp_vector: 0,
                wc_flags: wc_flags as u64,
                ..Default::default()
            };
            let mut efa = ib::efadv_cq_init_attr { comp_mask: 0, wc_flags: ib::EFADV_WC_EX_WITH_SGID as u64 };
            // SAFETY: an open context and valid attribute structs of the sizes passed.
            self.rcq_ex = unsafe {
                ib::efadv_create_cq(ctx, &mut attr, &mut efa, std::mem::size_of::<ib::efadv_cq_init_attr>() as u32)
            };
            if !self.rcq_ex.is_null() {
                break;
            }
            failure = Some(last_err("efadv_create_cq(recv, with sgid)"));
            // SAFETY: the send CQ just made, used by nothing, destroyed once.
            unsafe { ib::ibv_destroy_cq(self.scq) };
            self.scq = ptr::null_mut();
        }
        if self.scq.is_null() || self.rcq_ex.is_null() {
            return Err(failure.unwrap_or_else(|| DeviceError::Config("efa: no completion queues".into())));
        }
        // SAFETY: a live extended CQ.
        self.rcq = unsafe { ib::ibv_cq_ex_to_cq(self.rcq_ex) };
        // SAFETY: as above, made by efadv_create_cq.
        self.efa_rcq = unsafe { ib::efadv_cq_from_ibv_cq_ex(self.rcq_ex) };
        if self.efa_rcq.is_null() {
            return Err(DeviceError::Config("efa: efadv_cq_from_ibv_cq_ex gave nothing".into()));
        }
        Ok(())
    }

    fn create_qp(&mut self) -> Result<(), DeviceError> {
        let mut ops = ib::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_SEND;
        if self.limits.max_rdma_size.is_some() {
            ops |= ib::ibv_qp_create_send_ops_flags_IBV_QP_EX_WITH_RDMA_READ;
        }
        let mut init = ib::ibv_qp_init_attr_ex {
            send_cq: self.scq,
            recv_cq: self.rcq,
            cap: ib::ibv_qp_cap {
                max_send_wr: self.limits.sq_depth,
                max_recv_wr: self.limits.rq_depth,
                max_send_sge: self.limits.send_sges as u32,
                max_recv_sge: 1,
                max_inline_data: self.limits.max_inline as u32,
            },
            qp_type: ib::ibv_qp_type_IBV_QPT_DRIVER,
            sq_sig_all: 0,
            comp_mask: ib::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_PD
                | ib::ibv_qp_init_attr_mask_IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            pd: self.ctx.pd,
            send_ops_flags: ops as u64,
            ..Default::default()
        };
        let mut efa = ib::efadv_qp_init_attr { driver_qp_type: ib::EFADV_QP_DRIVER_TYPE_SRD, ..Default::default() };
        // SAFETY: an open context, live PD and CQs; valid in/out structs of the sizes passed.
        self.qp = unsafe {
            ib::efadv_create_qp_ex(
                self.ctx.ctx,
                &mut init,
                &mut efa,
                std::mem::size_of::<ib::efadv_qp_init_attr>() as u32,
            )
        };
        if self.qp.is_null() {
            return Err(last_err("efadv_create_qp_ex(SRD)"));
        }
        // The provider may round the depths up; never beyond what was asked
        // for is used. Inline: what it granted.
        self.limits.max_inline = self.limits.max_inline.min(init.cap.max_inline_data.min(u16::MAX as u32) as u16);
        // SAFETY: a live QP made with send ops flags, so it has the extended part.
        self.qpx = unsafe { ib::ibv_qp_to_qp_ex(self.qp) };
        if self.qpx.is_null() {
            return Err(DeviceError::Config("efa: the SRD queue pair has no extended send API".into()));
        }
        // SAFETY: a live QP.
        self.qpn = unsafe { (*self.qp).qp_num };
        Ok(())
    }

    fn modify(
        &mut self,
        attr: &mut ib::ibv_qp_attr,
        mask: ib::ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    /// RESET -> INIT (P_Key index 0, port, Q_Key) -> RTR -> RTS (SQ PSN 0,
    /// RNR retry forever where the device takes it).
    fn bring_up(&mut self) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: PORT,
            qkey: self.qkey,
            ..Default::default()
        };
        self.modify(
            &mut a,
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY,
            "ibv_modify_qp(SRD INIT)",
        )?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTR, ..Default::default() };
        self.modify(&mut a, m::IBV_QP_STATE, "ibv_modify_qp(SRD RTR)")?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTS, sq_psn: 0, ..Default::default() };
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if self.limits.rnr_retry {
            a.rnr_retry = RNR_RETRY_INFINITE;
            mask |= m::IBV_QP_RNR_RETRY;
        }
        self.modify(&mut a, mask, "ibv_modify_qp(SRD RTS)")
    }

    /// Posts receive slots `slots` as one chain.
    fn post_receives(&mut self, slots: impl Iterator<Item = u32>) -> Result<(), DeviceError> {
        self.rx.post(self.qp, slots)
    }

    /// Send queue entries in use (sends and read requests in flight).
    fn sq_used(&self) -> usize {
        self.inflight.len() + self.read_wrs as usize
    }

    /// Takes in send and read completions; brings the QP back if one failed.
    fn reap_sends(&mut self) {
        self.poll_send_cq();
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
    }

    /// Takes in every send and read completion the send CQ holds; returns
    /// how many.
    fn poll_send_cq(&mut self) -> usize {
        let ctx = self.ctx.clone();
        let mut total = 0;
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.scq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            total += n as usize;
            let mut ahs = ctx.lock_ahs();
            for i in 0..n as usize {
                let wc = self.wcs[i];
                if wc.wr_id & READ_WR != 0 {
                    self.read_completed(wc, &mut ahs);
                } else {
                    self.send_completed(wc, &mut ahs);
                }
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
        total
    }

    /// `dst` goes to `poll_unreachable` (once while it waits there).
    fn mark_unreachable(&mut self, dst: DevAddr) {
        if !self.unreachable.contains(&dst) {
            self.unreachable.push_back(dst);
        }
    }

    /// A send's completion. Any status but success means the datagram is
    /// lost, and nothing resends it (the engine runs no retransmission on
    /// this reliable path): its destination goes to `poll_unreachable`, so
    /// that the engine fails that peer rather than wait on a gap forever.
    /// That holds for a flushed send too (the queue pair went to an error
    /// state under it: this device never moves it there on purpose; at
    /// teardown nothing is polled) and for a gathered send whose
    /// registration was gone (rdmx's fault, not the peer's, but the
    /// datagram is lost all the same).
    fn send_completed(&mut self, wc: ib::ibv_wc, ahs: &mut AhCache<[u8; 16]>) {
        let Some(f) = self.inflight.remove(&wc.wr_id) else { return };
        ahs.release(&f.gid, 1);
        if let Some(b) = f.bounce {
            self.bounce.give_back(b);
        }
        if wc.status == ib::ibv_wc_status_IBV_WC_SUCCESS {
            return;
        }
        self.stats.send_errors += 1;
        if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
            // The queue pair is in an error state: bring it back.
            self.check_qp = true;
        } else {
            self.stats.last_error_status = wc.status;
        }
        let local = matches!(
            wc.status,
            ib::ibv_wc_status_IBV_WC_LOC_PROT_ERR
                | ib::ibv_wc_status_IBV_WC_LOC_LEN_ERR
                | ib::ibv_wc_status_IBV_WC_LOC_QP_OP_ERR
        );
        if local {
            self.check_qp = true;
            if f.gathered {
                self.stats.gathered_send_errors += 1;
            }
        }
        self.mark_unreachable(f.dst);
    }

    fn read_completed(&mut self, wc: ib::ibv_wc, ahs: &mut AhCache<[u8; 16]>) {
        self.read_wrs = self.read_wrs.saturating_sub(1);
        let slot = (wc.wr_id & !READ_WR) as usize;
        let Some(r) = self.reads.get_mut(slot) else { return };
        ahs.release(&r.gid, 1);
        if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS && r.status.is_none() {
            r.status = Some(wc.status);
        }
        if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
            self.check_qp = true;
        }
        r.wrs_left -= 1;
        if r.wrs_left != 0 {
            return;
        }
        let r = self.reads.remove(slot);
        match r.status {
            None => {
                self.stats.read_bytes += r.bytes;
                self.read_done.push_back(ReadDone { id: r.id, bytes: r.bytes, error: None });
            }
            Some(status) => {
                self.stats.read_errors += 1;
                if matches!(status, ib::ibv_wc_status_IBV_WC_RESP_TIMEOUT_ERR | ib::ibv_wc_status_IBV_WC_RETRY_EXC_ERR)
                {
                    self.stats.read_timeouts += 1;
                }
                if status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    self.stats.last_error_status = status;
                    self.stats.last_read_status = status;
                }
                // Pieces complete in any order: no prefix is known to have
                // arrived, so none is claimed. `NotConnected`: the sender
                // pushes the whole message (an I/O error would fail the
                // receive), unless the peer itself has failed; the status
                // is kept in `stats.last_read_status`.
                self.read_done.push_back(ReadDone { id: r.id, bytes: 0, error: Some(DeviceError::NotConnected) });
            }
        }
    }

    /// Brings the QP back after a local error moved it to an error state:
    /// SQE -> RTS (the sends flushed meanwhile completed in error: their
    /// destinations are unreachable), or after ERR through RESET. Before
    /// the reset every completion the CQs hold is taken in: receives that
    /// arrived are kept and delivered, sends and reads are answered as
    /// usual. Every send no completion answered is lost: its destination
    /// goes to `poll_unreachable`; every such read completes
    /// `NotConnected` (pushed). Then every receive slot that holds no
    /// undelivered datagram is posted again.
    fn recover(&mut self) {
        let mut attr = ib::ibv_qp_attr::default();
        let mut init = ib::ibv_qp_init_attr::default();
        // SAFETY: a live QP and valid out-structs.
        let rc =
            unsafe { ib::ibv_query_qp(self.qp, &mut attr, ib::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init) };
        if rc != 0 {
            return;
        }
        use ib::ibv_qp_attr_mask as m;
        match attr.qp_state {
            ib::ibv_qp_state_IBV_QPS_SQE => {
                let mut a = ib::ibv_qp_attr {
                    qp_state: ib::ibv_qp_state_IBV_QPS_RTS,
                    cur_qp_state: ib::ibv_qp_state_IBV_QPS_SQE,
                    ..Default::default()
                };
                if self.modify(&mut a, m::IBV_QP_STATE | m::IBV_QP_CUR_STATE, "ibv_modify_qp(SQE->RTS)").is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            ib::ibv_qp_state_IBV_QPS_ERR => {
                // What completed before the error (some providers drop a
                // QP's completions from its CQs at the reset).
                self.poll_send_cq();
                while self.poll_recv(POLL_BATCH) > 0 {}
                let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RESET, ..Default::default() };
                if self.modify(&mut a, m::IBV_QP_STATE, "ibv_modify_qp(RESET)").is_err() {
                    return;
                }
                self.poll_send_cq();
                while self.poll_recv(POLL_BATCH) > 0 {}
                self.drop_unanswered_requests();
                // Failed receives' slots are posted below with the free ones.
                self.rx_pending.retain(|rx| rx.ok.is_some());
                let mut held = vec![false; self.limits.rq_depth as usize];
                for rx in &self.rx_pending {
                    held[rx.slot as usize] = true;
                }
                let free = (0..self.limits.rq_depth).filter(|&s| !held[s as usize]);
                if self.bring_up().is_ok() && self.post_receives(free).is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            _ => {}
        }
        // Flushes taken in above asked for this very recovery.
        self.check_qp = false;
    }

    /// Sends and reads of a reset queue pair that no completion answered:
    /// sends are lost (their destinations unreachable), reads complete
    /// `NotConnected`; their bounce slots and AH uses are given back.
    fn drop_unanswered_requests(&mut self) {
        let ctx = self.ctx.clone();
        let mut ahs = ctx.lock_ahs();
        for (_, f) in std::mem::take(&mut self.inflight) {
            ahs.release(&f.gid, 1);
            if let Some(b) = f.bounce {
                self.bounce.give_back(b);
            }
            self.stats.send_errors += 1;
            if !self.unreachable.contains(&f.dst) {
                self.unreachable.push_back(f.dst);
            }
        }
        self.read_wrs = 0;
        for (_, r) in std::mem::take(&mut self.reads) {
            ahs.release(&r.gid, r.wrs_left);
            self.stats.read_errors += 1;
            self.read_done.push_back(ReadDone { id: r.id, bytes: 0, error: Some(DeviceError::NotConnected) });
        }
    }

    /// The sender of the completion the receive CQ is at: its GID from the
    /// AH number in `slid` (a live AH of the domain, or a tombstone: see
    /// [`AhCache`]), else from the completion itself.
    fn source_of_current(&self, ahs: &AhCache<[u8; 16]>) -> Option<DevAddr> {
        // SAFETY: called inside a started poll on a CQ made with SRC_QP and SLID.
        let (src_qp, slid) = unsafe { (ib::ibv_wc_read_src_qp(self.rcq_ex), ib::ibv_wc_read_slid(self.rcq_ex)) };
        if slid != AHN_UNKNOWN {
            if let Some(gid) = ahs.key_of_ahn(slid as u16) {
                return Some(efa_addr(gid, src_qp));
            }
            // A number this domain was never given: the completion may
            // still carry the GID (else the sender is unknown).
        }
        let mut gid = ib::ibv_gid::default();
        // SAFETY: inside a started poll of the CQ this efadv_cq belongs to
        // (made with EFADV_WC_EX_WITH_SGID); a valid out-pointer.
        if unsafe { ib::efadv_wc_read_sgid(self.efa_rcq, &mut gid) } != 0 {
            return None;
        }
        // SAFETY: every bit pattern of the union is a valid byte array.
        Some(efa_addr(unsafe { gid.raw }, src_qp))
    }

    /// Takes up to `max` receive completions into `rx_pending`; returns
    /// how many.
    fn poll_recv(&mut self, max: usize) -> usize {
        if max == 0 {
            return 0;
        }
        let mut attr = ib::ibv_poll_cq_attr::default();
        // SAFETY: a live extended CQ; a started poll is ended below.
        if unsafe { ib::ibv_start_poll(self.rcq_ex, &mut attr) } != 0 {
            return 0;
        }
        let ctx = self.ctx.clone();
        let ahs = ctx.lock_ahs();
        let mut n = 0;
        loop {
            // SAFETY: inside a started poll: the CQ's current completion.
            let (wr_id, status) = unsafe { ((*self.rcq_ex).wr_id, (*self.rcq_ex).status) };
            let ok = if status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                if status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    self.check_qp = true;
                } else {
                    self.stats.recv_errors += 1;
                }
                None
            } else {
                // SAFETY: inside a started poll on a CQ made with BYTE_LEN.
                let len = unsafe { ib::ibv_wc_read_byte_len(self.rcq_ex) };
                if len as usize > self.rx.slot_len() {
                    self.stats.recv_errors += 1;
                    None
                } else {
                    let src = self.source_of_current(&ahs);
                    if src.is_none() {
                        self.stats.unknown_sources += 1;
                    }
                    src.map(|s| (s, len))
                }
            };
            if wr_id < self.limits.rq_depth as u64 {
                self.rx_pending.push_back(RxDone { slot: wr_id as u32, ok });
            }
            n += 1;
            // SAFETY: inside a started poll.
            if n >= max || unsafe { ib::ibv_next_poll(self.rcq_ex) } != 0 {
                break;
            }
        }
        drop(ahs);
        // SAFETY: ends the poll started above.
        unsafe { ib::ibv_end_poll(self.rcq_ex) };
        n
    }

    /// Posts the slots of delivered datagrams again. A queue pair in an
    /// error state may refuse them: then the recovery that follows posts
    /// every slot that holds no undelivered datagram (these included)
    /// after its reset, and the datagrams already taken in are not lost
    /// for an error returned here.
    fn repost_delivered(&mut self, slots: &[u32]) {
        if self.post_receives(slots.iter().copied()).is_err() {
            self.stats.recv_errors += 1;
            self.check_qp = true;
        }
    }

    /// Consumes the channel's events (acknowledging them per CQ).
    fn ack_events(&mut self) {
        if self.channel.is_null() {
            return;
        }
        let (mut nr, mut ns) = (0, 0);
        loop {
            let mut cq = ptr::null_mut();
            let mut cq_ctx = ptr::null_mut();
            // SAFETY: a live channel (non-blocking fd) and valid out-pointers.
            if unsafe { ib::ibv_get_cq_event(self.channel, &mut cq, &mut cq_ctx) } != 0 {
                break;
            }
            if cq == self.scq {
                ns += 1;
            } else {
                nr += 1;
            }
        }
        if nr > 0 {
            // SAFETY: events of the receive CQ.
            unsafe { ib::ibv_ack_cq_events(self.rcq, nr) };
        }
        if ns > 0 {
            // SAFETY: events of the send CQ.
            unsafe { ib::ibv_ack_cq_events(self.scq, ns) };
        }
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// The Q_Key of this queue pair.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// Sends and read requests posted and not completed.
    pub fn outstanding(&self) -> usize {
        self.sq_used()
    }

    /// One send work request for `d` on the started send session.
    fn post_one(&mut self, d: &TxDatagram<'_>, ah: *mut ib::ibv_ah, qpn: u32, seq: u64) -> Option<u32> {
        let len = d.data.len();
        let gather = d.gather.filter(|g| !g.is_empty());
        let qpx = self.qpx;
        let mut flags = ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let inline = gather.is_none() && len <= self.limits.max_inline as usize;
        if inline {
            flags |= ib::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        // SAFETY: inside a started session of a live QP with the extended
        // API; the AH is live (its in-flight count keeps it cached).
        unsafe {
            (*qpx).wr_id = seq;
            (*qpx).wr_flags = flags;
            ib::ibv_wr_send(qpx);
            ib::ibv_wr_set_ud_addr(qpx, ah, qpn, self.qkey);
        }
        if inline {
            self.stats.inline_sends += 1;
            // SAFETY: the provider copies the bytes into the WQE now.
            unsafe { ib::ibv_wr_set_inline_data(qpx, d.data.as_ptr() as *mut _, len) };
            return None;
        }
        let mut sges = [ib::ibv_sge::default(); 2];
        let mut n = 0;
        let mut bounce = None;
        match gather {
            Some(g) if self.limits.send_sges < 2 => {
                // One SGE only: both parts into a bounce slot.
                let bounce_slot = &mut self.bounce;
                // SAFETY: inside `send_batch`, which the datagram was handed
                // to: its message is in flight ([`TxDatagram::gather`]).
                let (b, sge) = unsafe { g.with_bytes(|part| bounce_slot.copy_in(&[d.data, part])) }
                    .expect("send_batch took no more datagrams than free bounce slots");
                sges[0] = sge;
                n = 1;
                bounce = Some(b);
                self.stats.bounce_copies += 1;
            }
            _ => {
                if len > 0 {
                    let (b, sge) = self
                        .bounce
                        .copy_in(&[d.data])
                        .expect("send_batch took no more datagrams than free bounce slots");
                    sges[n] = sge;
                    bounce = Some(b);
                    self.stats.bounce_copies += 1;
                    n += 1;
                }
                if let Some(g) = gather {
                    self.stats.gathered_sends += 1;
                    let (lkey, _) = mr_keys(g.key().unwrap_or(0));
                    sges[n] = ib::ibv_sge { addr: g.addr(), length: g.len() as u32, lkey };
                    n += 1;
                }
            }
        }
        // SAFETY: inside the started session; the provider copies the list
        // now. Each SGE names a lent transmit buffer, a bounce slot or a
        // gathered part (registered application memory valid until its
        // message completes, after this send's completion).
        unsafe { ib::ibv_wr_set_sge_list(qpx, n, sges.as_ptr()) };
        bounce
    }
}

impl Device for EfaDevice {
    fn caps(&self) -> DeviceCaps {
        self.limits.caps()
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        vec![self.local]
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        parse_efa_addr(addr).is_some()
    }

    /// Resolves the address handles of the datagrams that fit (one lock of
    /// the domain's table, AHs made where missing: kernel calls), then
    /// posts them in one `ibv_wr_*` session, which holds the send queue's
    /// lock and so makes no kernel call.
    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.reap_sends();
        // Each request takes at most one bounce slot, claimed in the middle
        // of a work-request session that cannot be abandoned: a batch never
        // holds more datagrams than there are free slots.
        let room = (self.limits.sq_depth as usize).saturating_sub(self.sq_used()).min(self.bounce.available());
        if room < batch.len() {
            self.stats.sq_full += 1;
        }
        let mut resolved = std::mem::take(&mut self.tx_resolved);
        resolved.clear();
        let mut failure = None;
        {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            for d in batch.iter().take(room) {
                let Some((gid, qpn)) = parse_efa_addr(&d.dst) else {
                    failure = Some(DeviceError::Unreachable(d.dst));
                    break;
                };
                if d.wire_len() > self.limits.mtu {
                    failure = Some(DeviceError::TooLarge { len: d.wire_len(), mtu: self.limits.mtu });
                    break;
                }
                match ctx.acquire_ah(&mut ahs, gid, &mut self.stats) {
                    Ok(ah) => resolved.push(ResolvedDst { ah, qpn, gid }),
                    // No room for an AH now: the rest waits (back-pressure).
                    Err(AhError::Busy) => break,
                    Err(AhError::Unreachable) => {
                        self.mark_unreachable(d.dst);
                        failure = Some(DeviceError::Unreachable(d.dst));
                        break;
                    }
                }
            }
        }
        if resolved.is_empty() {
            self.tx_resolved = resolved;
            return match failure {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        let first_seq = self.tx_seq;
        // SAFETY: a live QP with the extended API; completed below.
        unsafe { ib::ibv_wr_start(self.qpx) };
        for (d, r) in batch.iter().zip(&resolved) {
            let seq = self.tx_seq;
            self.tx_seq += 1;
            let bounce = self.post_one(d, r.ah, r.qpn, seq);
            self.inflight.insert(
                seq,
                Inflight { dst: d.dst, gid: r.gid, bounce, gathered: d.gather.is_some_and(|g| !g.is_empty()) },
            );
        }
        let count = resolved.len();
        // SAFETY: ends the session started above: posts every request of it
        // or none.
        let rc = unsafe { ib::ibv_wr_complete(self.qpx) };
        if rc != 0 {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            for seq in first_seq..self.tx_seq {
                if let Some(f) = self.inflight.remove(&seq) {
                    ahs.release(&f.gid, 1);
                    if let Some(b) = f.bounce {
                        self.bounce.give_back(b);
                    }
                }
            }
            drop(ahs);
            self.tx_seq = first_seq;
            self.tx_resolved = resolved;
            // A full queue (the provider counts its own entries): try later.
            if rc == libc::ENOMEM {
                return Ok(0);
            }
            return Err(ret_err("ibv_wr_complete(send)", rc));
        }
        self.tx_resolved = resolved;
        self.stats.sent += count as u64;
        Ok(count)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        if max == 0 {
            return Ok(0);
        }
        self.reap_sends();
        if self.rx_pending.len() < max {
            self.poll_recv(max - self.rx_pending.len());
        }
        let mut delivered = 0;
        let mut repost: [u32; POLL_BATCH] = [0; POLL_BATCH];
        let mut nrepost = 0;
        while delivered < max {
            let Some(rx) = self.rx_pending.pop_front() else { break };
            if let Some((src, len)) = rx.ok {
                deliver(src, self.rx.bytes(rx.slot as usize, len as usize));
                delivered += 1;
                self.stats.received += 1;
            }
            repost[nrepost] = rx.slot;
            nrepost += 1;
            if nrepost == POLL_BATCH {
                self.repost_delivered(&repost);
                nrepost = 0;
            }
            if self.rx_pending.is_empty() && delivered < max {
                self.poll_recv(max - delivered);
            }
        }
        self.repost_delivered(&repost[..nrepost]);
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel lives as long as the device.
        (!self.channel.is_null()).then(|| unsafe { (*self.channel).fd })
    }

    /// Arms the receive CQ, and the send CQ whenever sends or reads are
    /// outstanding: a sender held back by a full send queue (or by AHs all
    /// in use) is woken by the completion that makes room, and a read's
    /// completion wakes its reader. Ready now (do not sleep): a datagram
    /// or a read's end waiting, a failed destination to report, or a send
    /// completion taken in after the arm (room the caller may use).
    fn prepare_wait(&mut self) -> bool {
        self.ack_events();
        if !self.rx_pending.is_empty() || !self.read_done.is_empty() || !self.unreachable.is_empty() {
            return true;
        }
        if !self.channel.is_null() {
            // SAFETY: a live CQ on the channel.
            unsafe { ib::ibv_req_notify_cq(self.rcq, 0) };
            if self.sq_used() > 0 {
                // SAFETY: as above.
                unsafe { ib::ibv_req_notify_cq(self.scq, 0) };
            }
        }
        // A completion that arrived before the arm raises no event: look.
        let sends_done = self.poll_send_cq() > 0;
        if self.check_qp {
            self.check_qp = false;
            self.recover();
        }
        self.poll_recv(POLL_BATCH);
        sends_done || !self.rx_pending.is_empty() || !self.read_done.is_empty() || !self.unreachable.is_empty()
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.unreachable.pop_front()
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }
}

impl RemoteReads for EfaDevice {
    /// RDMA read on the SRD queue pair itself: one request per piece of at
    /// most `max_rdma_size`, all posted in one session.
    fn post_read(
        &mut self,
        _now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        let Some(max) = self.limits.max_rdma_size else {
            return Err(DeviceError::Unsupported);
        };
        let Some((gid, qpn)) = parse_efa_addr(&peer) else {
            return Err(DeviceError::Unsupported);
        };
        self.reap_sends();
        let pieces = split_read(runs, max)?;
        if pieces.is_empty() {
            self.read_done.push_back(ReadDone { id, bytes: 0, error: None });
            return Ok(());
        }
        if pieces.len() > (self.limits.sq_depth as usize).saturating_sub(self.sq_used()) {
            self.stats.reads_deferred += 1;
            return Err(DeviceError::NotConnected);
        }
        // One AH use per request (each completion gives one back).
        let ah = {
            let ctx = self.ctx.clone();
            let mut ahs = ctx.lock_ahs();
            let ah = match ctx.acquire_ah(&mut ahs, gid, &mut self.stats) {
                Ok(ah) => ah,
                Err(AhError::Busy) => {
                    self.stats.reads_deferred += 1;
                    return Err(DeviceError::NotConnected);
                }
                Err(AhError::Unreachable) => return Err(DeviceError::Unreachable(peer)),
            };
            for _ in 1..pieces.len() {
                ahs.take(&gid);
            }
            ah
        };
        let slot = self.reads.vacant_key() as u64;
        let wr_id = READ_WR | slot;
        let qpx = self.qpx;
        // SAFETY: a live QP made with IBV_QP_EX_WITH_RDMA_READ (the device
        // has the cap); the AH is live; each local SGE names memory the
        // caller vouched for until this read completes (`LocalBuf`),
        // registered under its lkey; the session is completed below.
        let rc = unsafe {
            ib::ibv_wr_start(qpx);
            for p in &pieces {
                (*qpx).wr_id = wr_id;
                (*qpx).wr_flags = ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
                ib::ibv_wr_rdma_read(qpx, p.rkey, p.remote_addr);
                ib::ibv_wr_set_ud_addr(qpx, ah, qpn, self.qkey);
                ib::ibv_wr_set_sge(qpx, p.lkey, p.addr, p.len);
            }
            ib::ibv_wr_complete(qpx)
        };
        if rc != 0 {
            self.ctx.lock_ahs().release(&gid, pieces.len() as u32);
            self.stats.reads_deferred += 1;
            // Nothing was posted: pushed this time, read later (the errno
            // is the provider's: a full queue, or a request it refused).
            self.stats.last_error_status = rc.unsigned_abs();
            return Err(DeviceError::NotConnected);
        }
        let bytes = pieces.iter().map(|p| p.len as u64).sum();
        let key = self.reads.insert(EfaRead { id, gid, wrs_left: pieces.len() as u32, bytes, status: None });
        debug_assert_eq!(key as u64, slot);
        self.read_wrs += pieces.len() as u32;
        self.stats.reads += 1;
        self.stats.read_requests += pieces.len() as u64;
        Ok(())
    }

    fn poll_read(&mut self, _now: rdm::time::Instant) -> Option<ReadDone> {
        if self.read_done.is_empty() && !self.reads.is_empty() {
            self.reap_sends();
        }
        self.read_done.pop_front()
    }

    fn read_conn_stats(&mut self) -> rdm::device::ReadConnStats {
        // No connections: SRD reads on the datagram queue pair. No timer
        // of rdmx's either: a timeout is the device's (the remote did not
        // answer), and the status the last failed read request's.
        rdm::device::ReadConnStats {
            reads: self.stats.reads,
            read_bytes: self.stats.read_bytes,
            read_failures: self.stats.read_errors,
            read_timeouts: self.stats.read_timeouts,
            last_read_error: self.stats.last_read_status,
            ..Default::default()
        }
    }
}

impl Drop for EfaDevice {
    fn drop(&mut self) {
        // SAFETY: every object is destroyed once, users before what they
        // use: the QP (nothing more is posted or written), the CQs (their
        // events acknowledged), the channel, the MRs; the AHs, PD and
        // context go with the last Arc of the context.
        unsafe {
            if !self.qp.is_null() {
                ib::ibv_destroy_qp(self.qp);
            }
        }
        // The requests in flight never complete now: their AH uses go back
        // to the domain (whose other endpoints go on).
        {
            let mut ahs = self.ctx.lock_ahs();
            for f in self.inflight.values() {
                ahs.release(&f.gid, 1);
            }
            for (_, r) in &self.reads {
                ahs.release(&r.gid, r.wrs_left);
            }
        }
        self.ack_events();
        // SAFETY: as above.
        unsafe {
            if !self.scq.is_null() {
                ib::ibv_destroy_cq(self.scq);
            }
            if !self.rcq.is_null() {
                ib::ibv_destroy_cq(self.rcq);
            } else if !self.rcq_ex.is_null() {
                ib::ibv_destroy_cq(ib::ibv_cq_ex_to_cq(self.rcq_ex));
            }
            if !self.channel.is_null() {
                ib::ibv_destroy_comp_channel(self.channel);
            }
        }
        self.rx.deregister();
        self.bounce.deregister();
    }
}
