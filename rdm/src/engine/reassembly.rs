//! The receive side: the reorder window of out-of-order segments, reassembly of
//! segments into whole messages delivered exactly once and in order, and the
//! acknowledgement policy (immediate on a completed message or a hole, delayed
//! otherwise).
use super::*;

/// One peer's receive side.
#[derive(Default)]
pub(super) struct RecvState {
    /// The next PSN to deliver; `ooo` holds what arrived beyond it.
    pub(super) rx_next: Psn,
    pub(super) ooo: BTreeMap<u32, RxSeg>,
    /// The message being put together from in-order fragments.
    pub(super) assembling: Option<Vec<u8>>,
    pub(super) rx_since_ack: u32,
    pub(super) ack_now: bool,
    pub(super) ack_deadline: Option<Instant>,
}

impl RecvState {
    /// Bit i set: PSN `rx_next + 1 + i` is buffered (the SACK field).
    pub(super) fn sack_bits(&self) -> u64 {
        let mut bits = 0u64;
        for (&psn, _) in self.ooo.range(..) {
            let d = Psn(psn).diff(self.rx_next);
            if (1..=SACK_SPAN as i32).contains(&d) {
                bits |= 1 << (d - 1);
            }
        }
        bits
    }
}

impl Engine {
    pub(super) fn process_data(&mut self, h: u32, now: Instant, hdr: &Header, payload: &[u8]) {
        let ack_delay = self.cfg.ack_delay;
        let hot = &mut self.hot[h as usize];
        let psn = Psn(hdr.psn_or_window);
        let d = psn.diff(hot.rx.rx_next);
        if d < 0 {
            self.stats.duplicates += 1;
            hot.counters.duplicates += 1;
            hot.rx.ack_now = true;
            return;
        }
        if d as u32 >= RX_WINDOW {
            self.stats.dropped_window += 1;
            hot.counters.dropped_window += 1;
            return;
        }
        if self.paused {
            // Refuse without acknowledging: the sender keeps the data.
            self.stats.dropped_window += 1;
            hot.counters.dropped_window += 1;
            hot.rx.ack_now = true;
            return;
        }
        if d > 0 {
            match hot.rx.ooo.entry(psn.0) {
                std::collections::btree_map::Entry::Occupied(_) => {
                    self.stats.duplicates += 1;
                    hot.counters.duplicates += 1;
                }
                std::collections::btree_map::Entry::Vacant(slot) => {
                    self.stats.out_of_order += 1;
                    let mut v = self.pool.pop().unwrap_or_default();
                    v.clear();
                    v.extend_from_slice(payload);
                    slot.insert(RxSeg { first: hdr.first, last: hdr.last, payload: v });
                }
            }
            // Out of order: tell the sender now so it can fill the hole.
            hot.rx.ack_now = true;
            return;
        }
        // In order: accept it and whatever it unblocks.
        let mut completed_msg = false;
        let mut seg = RxSeg { first: hdr.first, last: hdr.last, payload: Vec::new() };
        let mut borrowed = Some(payload);
        loop {
            let data: &[u8] = match borrowed.take() {
                Some(p) => p,
                None => &seg.payload,
            };
            completed_msg |= self.assemble(h, seg.first, seg.last, data);
            if !seg.payload.is_empty() || seg.payload.capacity() > 0 {
                let v = std::mem::take(&mut seg.payload);
                if self.pool.len() < POOL_DEPTH {
                    self.pool.push(v);
                }
            }
            let hot = &mut self.hot[h as usize];
            hot.rx.rx_next = hot.rx.rx_next.next();
            hot.rx.rx_since_ack += 1;
            match hot.rx.ooo.remove(&hot.rx.rx_next.0) {
                Some(next) => seg = next,
                None => break,
            }
        }
        let hot = &mut self.hot[h as usize];
        let completed_ack_delay = self.cfg.completed_ack_delay;
        // A completed message is acknowledged at once when nothing else will
        // send the ack for this side (manual progress: the sender's completion
        // must not depend on this side calling in again). With a progress
        // thread, the ack waits `completed_ack_delay` for the application's
        // answer to carry it: in a ping-pong that saves one datagram per
        // message, which on UDP is a system call on the critical path.
        if hot.rx.rx_since_ack >= 16 || !hot.rx.ooo.is_empty() || (completed_msg && completed_ack_delay.is_zero()) {
            hot.rx.ack_now = true;
        } else if completed_msg {
            let d = now + completed_ack_delay;
            if hot.rx.ack_deadline.is_none_or(|x| d < x) {
                hot.rx.ack_deadline = Some(d);
                self.arm(h, d);
            }
        } else if hot.rx.ack_deadline.is_none() {
            let d = now + ack_delay;
            hot.rx.ack_deadline = Some(d);
            self.arm(h, d);
        }
    }

    /// Appends one in-order fragment to the peer's message being assembled
    /// (FIRST opens it, LAST delivers it); returns whether a message was
    /// delivered. A FIRST while a message is open, or a fragment with none
    /// open, breaks the protocol: the partial message or the fragment is
    /// dropped and counted. Shared by DATA (in PSN order) and DIRECT (in path
    /// order) packets.
    pub(super) fn assemble(&mut self, h: u32, first: bool, last: bool, data: &[u8]) -> bool {
        let hot = &mut self.hot[h as usize];
        if first {
            if let Some(old) = hot.rx.assembling.take() {
                self.stats.dropped_malformed += 1;
                self.pool.push(old);
            }
            let mut b = self.pool.pop().unwrap_or_default();
            b.clear();
            hot.rx.assembling = Some(b);
        }
        match hot.rx.assembling.as_mut() {
            Some(b) => {
                grow_for(b, data.len());
                b.extend_from_slice(data)
            }
            None => self.stats.dropped_malformed += 1,
        }
        if !last {
            return false;
        }
        match hot.rx.assembling.take() {
            Some(msg) => {
                self.stats.delivered_msgs += 1;
                self.events.push_back(Event::Delivered { peer: hot.peer, msg });
                true
            }
            None => false,
        }
    }
}

/// Makes room for `more` bytes in a message being assembled (whose length no
/// header announces): doubling, as `Vec` does, but never past
/// [`POOL_MAX_CAPACITY`] while the message fits it, so that every message up
/// to that size ends in a buffer the pool takes back. Plain doubling would
/// end a 64 KiB message in a 128 KiB buffer, freed and allocated again for
/// every message of a stream.
fn grow_for(b: &mut Vec<u8>, more: usize) {
    let need = b.len() + more;
    if need <= b.capacity() {
        return;
    }
    let doubled = b.capacity().saturating_mul(2).max(need);
    let target = if need <= POOL_MAX_CAPACITY { doubled.min(POOL_MAX_CAPACITY) } else { doubled };
    b.reserve_exact(target - b.len());
}
