//! The verbs device's UD queue pair: sends (inline, bounce-copied or
//! gathered, chained per batch, signaled every [`SIGNAL_EVERY`]th), receives
//! (registered slots lent to the caller and reposted), the address handles
//! of its destinations, and bringing the queue pair back after an error;
//! the [`Device`] implementation. Apart from the RC reads (`rc.rs`): the
//! two share only the completion channel, the completion buffer and the
//! counters.
//!
//! Unsafe here: posting to, polling and modifying the UD queue pair and its CQs, arming the receive CQ.
#![allow(unsafe_code)]

use super::{
    grh_source_gid, link_send_chain, mr_keys, parse_ud_addr, posted_before, ud_addr, VerbsDevice, VerbsStats, GRH_LEN,
    HOP_LIMIT, POLL_BATCH, SIGNAL_EVERY,
};
use crate::ib::{ret_err, AhCache, AhError, BounceSlots, ReceiveSlots};
use rdm::device::{DevAddr, Device, DeviceCaps, DeviceError, RemoteReads, TxDatagram};
use rdm::Instant;
use rdma_core_sys as ib;
use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::ptr;

/// An address handle's key: the GID on RoCE, the LID on InfiniBand.
pub(super) type AhKey = ([u8; 16], u16);

/// A posted send no completion has covered yet.
pub(super) struct Inflight {
    seq: u64,
    dst: DevAddr,
    ah: AhKey,
    bounce: Option<u32>,
    /// Part of it is gathered from application memory.
    gathered: bool,
}

/// The endpoint's UD queue pair and what its sends and receives hold (the
/// part of [`VerbsDevice`] that moves datagrams).
pub(super) struct UdQueue {
    pub(super) scq: *mut ib::ibv_cq,
    pub(super) rcq: *mut ib::ibv_cq,
    pub(super) qp: *mut ib::ibv_qp,
    pub(super) qpn: u32,
    pub(super) qkey: u32,
    pub(super) local: DevAddr,
    pub(super) mtu: usize,
    pub(super) max_inline: u16,
    // Receive.
    pub(super) rx: ReceiveSlots,
    pub(super) rq_depth: u32,
    /// Receive completions polled by `prepare_wait`, not yet delivered.
    pub(super) rx_pending: VecDeque<ib::ibv_wc>,
    // Send.
    pub(super) sq_depth: u32,
    pub(super) tx_seq: u64,
    pub(super) since_signal: u32,
    pub(super) inflight: VecDeque<Inflight>,
    pub(super) bounce: BounceSlots,
    pub(super) swrs: Vec<ib::ibv_send_wr>,
    pub(super) ssges: Vec<ib::ibv_sge>,
    /// Completions polled at once (the RC reads' polls use it too).
    pub(super) wcs: Vec<ib::ibv_wc>,
    pub(super) unreachable: VecDeque<DevAddr>,
    /// A send completed in error: the QP may need bringing back.
    pub(super) check_qp: bool,
    /// Test hook: the next non-inline send names a wrong memory key.
    pub(super) corrupt_next_key: bool,
}

impl UdQueue {
    /// Polls the send CQ: releases what the completions cover and records
    /// the destinations of failed sends. Safe in the middle of building a
    /// chain: completions cover only posted requests.
    fn poll_sends(&mut self, ahs: &mut AhCache<AhKey>, stats: &mut VerbsStats) {
        loop {
            // SAFETY: a live CQ and room for POLL_BATCH completions.
            let n = unsafe { ib::ibv_poll_cq(self.scq, POLL_BATCH as i32, self.wcs.as_mut_ptr()) };
            if n <= 0 {
                break;
            }
            for i in 0..n as usize {
                let wc = self.wcs[i];
                if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                    stats.send_errors += 1;
                    if wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                        self.check_qp = true;
                    }
                    // The destination of the failed send is reported (the
                    // peer it concerns), but not for requests the queue
                    // pair's error flushed (they were not at fault; the
                    // reliability layer resends them), nor for a local
                    // error of a gathered send (application memory whose
                    // registration went away: rdmx's matter, not the
                    // peer's; the message is resent or has completed).
                    let local = matches!(
                        wc.status,
                        ib::ibv_wc_status_IBV_WC_LOC_PROT_ERR | ib::ibv_wc_status_IBV_WC_LOC_LEN_ERR
                    );
                    let blame = wc.status != ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR;
                    if let Some(f) = self.inflight.iter().find(|f| f.seq == wc.wr_id) {
                        let dst = f.dst;
                        if f.gathered && local {
                            stats.gathered_send_errors += 1;
                        } else if blame && !self.unreachable.contains(&dst) {
                            self.unreachable.push_back(dst);
                        }
                    }
                }
                self.release_through(wc.wr_id, ahs);
            }
            if (n as usize) < POLL_BATCH {
                break;
            }
        }
    }

    /// A completion of send `seq` covers it and every send before it.
    fn release_through(&mut self, seq: u64, ahs: &mut AhCache<AhKey>) {
        while self.inflight.front().is_some_and(|f| f.seq <= seq) {
            let f = self.inflight.pop_front().expect("checked");
            self.release(&f, ahs);
        }
    }

    /// Gives back what a send held: its use of its address handle, its
    /// bounce slot.
    fn release(&mut self, f: &Inflight, ahs: &mut AhCache<AhKey>) {
        ahs.release(&f.ah, 1);
        if let Some(b) = f.bounce {
            self.bounce.give_back(b);
        }
    }
}

impl VerbsDevice {
    fn modify(&mut self, attr: &mut ib::ibv_qp_attr, mask: u32, what: &'static str) -> Result<(), DeviceError> {
        // SAFETY: a live QP and a valid attribute struct.
        let rc = unsafe { ib::ibv_modify_qp(self.ud.qp, attr, mask as i32) };
        if rc != 0 {
            return Err(ret_err(what, rc));
        }
        Ok(())
    }

    /// RESET -> INIT (port, P_Key index 0, Q_Key) -> RTR -> RTS.
    pub(super) fn bring_up(&mut self) -> Result<(), DeviceError> {
        use ib::ibv_qp_attr_mask as m;
        let mut a = ib::ibv_qp_attr {
            qp_state: ib::ibv_qp_state_IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.ctx.port,
            qkey: self.ud.qkey,
            ..Default::default()
        };
        self.modify(
            &mut a,
            (m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY).0,
            "ibv_modify_qp(INIT)",
        )?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTR, ..Default::default() };
        self.modify(&mut a, m::IBV_QP_STATE.0, "ibv_modify_qp(RTR)")?;
        let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RTS, sq_psn: 0, ..Default::default() };
        self.modify(&mut a, (m::IBV_QP_STATE | m::IBV_QP_SQ_PSN).0, "ibv_modify_qp(RTS)")
    }

    /// Posts receive slots `slots` as one chain.
    fn post_receives(&mut self, slots: impl Iterator<Item = u32>) -> Result<(), DeviceError> {
        self.ud.rx.post(self.ud.qp, slots)
    }

    pub(super) fn post_all_receives(&mut self) -> Result<(), DeviceError> {
        self.post_receives(0..self.ud.rq_depth)
    }

    /// Polls the send CQ and brings the QP back if a send failed.
    fn reap_sends(&mut self) {
        self.poll_sends();
        if self.ud.check_qp {
            self.ud.check_qp = false;
            self.recover();
        }
    }

    /// Polls the send CQ: releases what the completions cover and records
    /// the destinations of failed sends. Safe in the middle of building a
    /// chain: completions cover only posted requests.
    #[inline]
    fn poll_sends(&mut self) {
        self.ud.poll_sends(&mut self.ahs, &mut self.stats);
    }

    /// Brings the QP back after a send error: SQE -> RTS, or the whole
    /// cycle from RESET (reposting every receive slot) after ERR.
    fn recover(&mut self) {
        let mut attr = ib::ibv_qp_attr::default();
        let mut init = ib::ibv_qp_init_attr::default();
        // SAFETY: a live QP and valid out-structs.
        let rc =
            unsafe { ib::ibv_query_qp(self.ud.qp, &mut attr, ib::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32, &mut init) };
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
                if self.modify(&mut a, (m::IBV_QP_STATE | m::IBV_QP_CUR_STATE).0, "ibv_modify_qp(SQE->RTS)").is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            ib::ibv_qp_state_IBV_QPS_ERR => {
                let mut a = ib::ibv_qp_attr { qp_state: ib::ibv_qp_state_IBV_QPS_RESET, ..Default::default() };
                if self.modify(&mut a, m::IBV_QP_STATE.0, "ibv_modify_qp(RESET)").is_err() {
                    return;
                }
                // Reset discarded every posted request: drop their
                // completions (flushes) and what they held.
                self.ud.rx_pending.clear();
                // SAFETY: live CQs and room for POLL_BATCH completions.
                while unsafe { ib::ibv_poll_cq(self.ud.rcq, POLL_BATCH as i32, self.ud.wcs.as_mut_ptr()) } > 0 {}
                // SAFETY: as above.
                while unsafe { ib::ibv_poll_cq(self.ud.scq, POLL_BATCH as i32, self.ud.wcs.as_mut_ptr()) } > 0 {}
                while let Some(f) = self.ud.inflight.pop_front() {
                    self.ud.release(&f, &mut self.ahs);
                }
                self.ud.since_signal = 0;
                if self.bring_up().is_ok() && self.post_all_receives().is_ok() {
                    self.stats.qp_recoveries += 1;
                }
            }
            _ => {}
        }
    }

    /// The address handle for `key` with one more use (released when a
    /// completion covers the send): from the cache or new, evicting the
    /// least recently used one no outstanding send uses (see
    /// [`AhCache::acquire`]; no room: `Busy`).
    fn ah_for(&mut self, key: AhKey) -> Result<*mut ib::ibv_ah, AhError> {
        let ctx = &self.ctx;
        let ud = &mut self.ud;
        self.ahs.acquire(
            ctx.pd,
            key,
            || {
                let mut attr = ib::ibv_ah_attr { port_num: ctx.port, ..Default::default() };
                if ctx.infiniband {
                    attr.dlid = key.1;
                } else {
                    attr.is_global = 1;
                    attr.grh.dgid.raw = key.0;
                    attr.grh.sgid_index = ctx.gid_index;
                    attr.grh.hop_limit = HOP_LIMIT;
                }
                attr
            },
            |_| Ok(None),
            // Not `reap_sends`: a recovery would release the requests of
            // the chain being built.
            |ahs, stats| ud.poll_sends(ahs, stats),
            &mut self.stats,
        )
    }

    /// Polls the receive CQ into `rx_pending`, at most `max`.
    fn poll_recv(&mut self, max: usize) {
        let want = max.min(POLL_BATCH) as i32;
        // SAFETY: a live CQ and room for POLL_BATCH completions.
        let n = unsafe { ib::ibv_poll_cq(self.ud.rcq, want, self.ud.wcs.as_mut_ptr()) };
        for i in 0..n.max(0) as usize {
            self.ud.rx_pending.push_back(self.ud.wcs[i]);
        }
    }
}

impl Device for VerbsDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: false,
            ordered: false,
            mtu: self.ud.mtu,
            // Through an RC queue pair made on the first read of a peer
            // (pushed until it is connected).
            remote_read: self.rc.conns.enabled(),
            gso: false,
            max_inline: self.ud.max_inline,
            registration: true,
            max_transmit: self.ud.mtu,
        }
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        vec![self.ud.local]
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        parse_ud_addr(addr).is_some()
    }

    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.reap_sends();
        let room = (self.ud.sq_depth as usize).saturating_sub(self.ud.inflight.len());
        if room < batch.len() {
            self.stats.sq_full += 1;
        }
        self.ud.swrs.clear();
        self.ud.ssges.clear();
        let first_seq = self.ud.tx_seq;
        let mut failure = None;
        for d in batch.iter().take(room) {
            let Some((gid, qpn, lid)) = parse_ud_addr(&d.dst) else {
                failure = Some(DeviceError::Unreachable(d.dst));
                break;
            };
            if d.wire_len() > self.ud.mtu {
                failure = Some(DeviceError::TooLarge { len: d.wire_len(), mtu: self.ud.mtu });
                break;
            }
            let key: AhKey = if self.ctx.infiniband { ([0; 16], lid) } else { (gid, 0) };
            let ah = match self.ah_for(key) {
                Ok(ah) => ah,
                // Back-pressure: the rest of the batch goes later.
                Err(AhError::Busy) => break,
                Err(AhError::Unreachable) => {
                    if !self.ud.unreachable.contains(&d.dst) {
                        self.ud.unreachable.push_back(d.dst);
                    }
                    failure = Some(DeviceError::Unreachable(d.dst));
                    break;
                }
            };
            let len = d.data.len();
            let gather = d.gather.filter(|g| !g.is_empty());
            let mut flags = 0u32;
            let mut bounce = None;
            let sge = if len <= self.ud.max_inline as usize && gather.is_none() {
                flags |= ib::ibv_send_flags::IBV_SEND_INLINE.0;
                self.stats.inline_sends += 1;
                ib::ibv_sge { addr: d.data.as_ptr() as u64, length: len as u32, lkey: 0 }
            } else {
                // Never straight from the caller's buffer, not even one this
                // device lent: the endpoint writes its next datagram there
                // as soon as this call returns, and the NIC reads a request's
                // bytes later. One slot per outstanding send, freed by its
                // completion: never empty while room > 0; if it ever were,
                // that is back-pressure (the rest of the batch goes later), not
                // a panic on the application's send path.
                let Some((b, sge)) = self.ud.bounce.copy_in(&[d.data]) else {
                    // The address handle's use taken above goes back.
                    self.ahs.release(&key, 1);
                    break;
                };
                bounce = Some(b);
                self.stats.bounce_copies += 1;
                sge
            };
            let mut sge = sge;
            if self.ud.corrupt_next_key && flags & ib::ibv_send_flags::IBV_SEND_INLINE.0 == 0 {
                self.ud.corrupt_next_key = false;
                sge.lkey ^= 0x00ba_d000;
            }
            self.ud.since_signal += 1;
            if self.ud.since_signal >= SIGNAL_EVERY {
                flags |= ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
                self.ud.since_signal = 0;
            }
            let seq = self.ud.tx_seq;
            self.ud.tx_seq += 1;
            self.ud.inflight.push_back(Inflight { seq, dst: d.dst, ah: key, bounce, gathered: gather.is_some() });
            // Two SGEs per request, always (the second unused without a
            // gathered part), so request i's list is at 2 * i.
            self.ud.ssges.push(sge);
            let gathered = gather.map(|g| {
                self.stats.gathered_sends += 1;
                let (lkey, _) = mr_keys(g.key().unwrap_or(0));
                ib::ibv_sge { addr: g.addr(), length: g.len() as u32, lkey }
            });
            self.ud.ssges.push(gathered.unwrap_or_default());
            let num_sge = match (len, gathered) {
                (0, None) => 0,
                (0, Some(_)) => {
                    // Only the gathered part: it moves into the first slot.
                    let i = self.ud.ssges.len();
                    self.ud.ssges.swap(i - 2, i - 1);
                    1
                }
                (_, None) => 1,
                (_, Some(_)) => 2,
            };
            let mut wr = ib::ibv_send_wr {
                wr_id: seq,
                num_sge,
                opcode: ib::ibv_wr_opcode_IBV_WR_SEND,
                send_flags: flags,
                ..Default::default()
            };
            wr.wr.ud = ib::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah, remote_qpn: qpn, remote_qkey: self.ud.qkey };
            self.ud.swrs.push(wr);
        }
        let n = self.ud.swrs.len();
        if n == 0 {
            return match failure {
                Some(e) => Err(e),
                None => Ok(0),
            };
        }
        // The chain's last request is signaled: every posted send is covered
        // by a completion to come.
        let last = &mut self.ud.swrs[n - 1];
        if last.send_flags & ib::ibv_send_flags::IBV_SEND_SIGNALED.0 == 0 {
            last.send_flags |= ib::ibv_send_flags::IBV_SEND_SIGNALED.0;
            self.ud.since_signal = 0;
        }
        link_send_chain(&mut self.ud.swrs, &mut self.ud.ssges, 2);
        let mut bad: *mut ib::ibv_send_wr = ptr::null_mut();
        // SAFETY: a chain of valid UD send requests: each AH is live (its
        // use in the cache keeps it from eviction), each SGE names either
        // inline data (copied by the post), a bounce slot (this send's
        // until its completion), or a gathered part: registered application
        // memory that stays valid until its message completes (the
        // `TxDatagram::gather` contract), which is after this send.
        let rc = unsafe { ib::ibv_post_send(self.ud.qp, self.ud.swrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            // Requests from `bad` on were not posted: undo them.
            let posted = posted_before(bad, &self.ud.swrs);
            for _ in posted..n {
                let f = self.ud.inflight.pop_back().expect("pushed above");
                self.ud.release(&f, &mut self.ahs);
            }
            self.ud.tx_seq = first_seq + posted as u64;
            if posted > 0 {
                // The last posted one may be unsignaled: the next chain's
                // signaled last request covers it.
                self.stats.sent += posted as u64;
                return Ok(posted);
            }
            return Err(ret_err("ibv_post_send", rc));
        }
        self.stats.sent += n as u64;
        Ok(n)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        if max == 0 {
            return Ok(0);
        }
        self.reap_sends();
        if self.ud.rx_pending.len() < max {
            self.poll_recv(max - self.ud.rx_pending.len());
        }
        let mut delivered = 0;
        let mut repost: [u32; POLL_BATCH] = [0; POLL_BATCH];
        let mut nrepost = 0;
        while delivered < max {
            let Some(wc) = self.ud.rx_pending.pop_front() else { break };
            let slot = wc.wr_id as usize;
            if slot >= self.ud.rq_depth as usize {
                continue;
            }
            if wc.status != ib::ibv_wc_status_IBV_WC_SUCCESS {
                if wc.status == ib::ibv_wc_status_IBV_WC_WR_FLUSH_ERR {
                    // The QP went to error: recovery reposts every slot.
                    self.ud.check_qp = true;
                    continue;
                }
                self.stats.recv_errors += 1;
            } else if (wc.byte_len as usize) < GRH_LEN || wc.byte_len as usize > self.ud.rx.slot_len() {
                self.stats.recv_errors += 1;
            } else {
                let buf = self.ud.rx.bytes(slot, wc.byte_len as usize);
                let src = if self.ctx.infiniband || wc.wc_flags & ib::ibv_wc_flags_IBV_WC_GRH == 0 {
                    ud_addr([0; 16], wc.src_qp, wc.slid)
                } else {
                    ud_addr(grh_source_gid(&buf[..GRH_LEN]), wc.src_qp, 0)
                };
                deliver(src, &buf[GRH_LEN..]);
                delivered += 1;
                self.stats.received += 1;
            }
            repost[nrepost] = slot as u32;
            nrepost += 1;
            if nrepost == POLL_BATCH {
                self.post_receives(repost.iter().copied())?;
                nrepost = 0;
            }
            if self.ud.rx_pending.is_empty() && delivered < max {
                self.poll_recv(max - delivered);
            }
        }
        self.post_receives(repost[..nrepost].iter().copied())?;
        if self.ud.check_qp {
            self.ud.check_qp = false;
            self.recover();
        }
        Ok(delivered)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        // SAFETY: the channel lives as long as the device.
        Some(unsafe { (*self.channel).fd })
    }

    fn prepare_wait(&mut self) -> bool {
        self.ack_events();
        if !self.ud.rx_pending.is_empty() {
            return true;
        }
        // SAFETY: a live CQ attached to the channel.
        unsafe { ib::ibv_req_notify_cq(self.ud.rcq, 0) };
        if !self.rc.queues.cq.is_null() {
            // SAFETY: as above.
            unsafe { ib::ibv_req_notify_cq(self.rc.queues.cq, 0) };
            self.reap_reads();
        }
        // A completion that arrived before the arm raises no event: look.
        self.poll_recv(POLL_BATCH);
        !self.ud.rx_pending.is_empty() || !self.rc.done.is_empty()
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.ud.unreachable.pop_front()
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }
}
