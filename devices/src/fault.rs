//! A fault-injecting decorator for any device: drops, duplicates, reorders and
//! corrupts outgoing datagrams at seeded random rates (`FI_RDMX_FAULT_*`), so the
//! reliability layer can be exercised over real sockets, not only in the
//! simulator (the shape of smoltcp's `FaultInjector`).
//!
//! * Faults are applied on the **send side only**; both directions of a
//!   conversation are covered when both ends run the decorator (the provider wraps
//!   every endpoint's device). The receive side passes through.
//! * **Reorder** holds a datagram back and sends it right after the next datagram
//!   that goes out (or, if nothing else is sent, at the next `recv_batch` call,
//!   which stands for "time passed"); at most [`MAX_HELD`] are held at once.
//! * **Corrupt** flips one random bit of a non-empty datagram.
//! * **Dup** sends a datagram twice, back to back.
//! * The decisions come from a splitmix64 stream seeded by
//!   [`FaultConfig::seed`]: the same seed and the same sequence of calls give the
//!   same faults.
//! * Back-pressure and errors of the inner device keep their meaning: a short count
//!   says which datagrams were taken; an error is returned only for the first
//!   datagram of a batch.
//!
//! The decorator promises neither reliability nor order, whatever the inner
//! device does, but keeps its MTU, `remote_read` and wait fd.
//!
//! Unsafe here: one read of a datagram's gathered part (application memory),
//! inside the send call that handed it over ([`flattened`]).
#![allow(unsafe_code)]

use rdm::device::{DevAddr, Device, DeviceCaps, DeviceError, RemoteReads, TxDatagram};

/// The whole datagram, `data` and then its gathered part, copied: what this
/// decorator holds past the send call, edits or sends twice.
///
/// # Safety
/// `d`'s gathered part is memory of a message still in flight: the caller is
/// inside the device call `d` was handed to ([`TxDatagram::gather`]).
unsafe fn flattened(d: &TxDatagram<'_>) -> Vec<u8> {
    let mut v = Vec::with_capacity(d.wire_len());
    v.extend_from_slice(d.data);
    if let Some(g) = d.gather {
        // SAFETY: as this function's contract.
        unsafe { g.append_to(&mut v) };
    }
    v
}
pub use rdm::rng::Rng;
use rdm::Instant;
use std::collections::VecDeque;
use std::os::fd::RawFd;

/// Most datagrams held back for reordering at once.
pub const MAX_HELD: usize = 4;

/// Fault rates in percent (0–100, fractions allowed) and the PRNG seed.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    pub seed: u64,
    pub drop_pct: f64,
    pub dup_pct: f64,
    pub reorder_pct: f64,
    pub corrupt_pct: f64,
}

impl FaultConfig {
    /// Whether any rate is non-zero.
    pub fn is_active(&self) -> bool {
        self.drop_pct > 0.0 || self.dup_pct > 0.0 || self.reorder_pct > 0.0 || self.corrupt_pct > 0.0
    }

    /// Reads `FI_RDMX_FAULT_SEED` (decimal or `0x` hex, default 1) and
    /// `FI_RDMX_FAULT_DROP/DUP/REORDER/CORRUPT` (percent; unparsable values count as
    /// 0, values are clamped to 0–100) from the environment; `None` when every rate
    /// is zero.
    pub fn from_env() -> Option<FaultConfig> {
        FaultConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`FaultConfig::from_env`] over any variable lookup (for tests and for the
    /// provider's parameter table).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Option<FaultConfig> {
        let pct = |name: &str| -> f64 {
            get(name)
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite())
                .map(|v| v.clamp(0.0, 100.0))
                .unwrap_or(0.0)
        };
        let seed = get("FI_RDMX_FAULT_SEED")
            .and_then(|v| {
                let v = v.trim();
                match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
                    Some(hex) => u64::from_str_radix(hex, 16).ok(),
                    None => v.parse().ok(),
                }
            })
            .unwrap_or(1);
        let cfg = FaultConfig {
            seed,
            drop_pct: pct("FI_RDMX_FAULT_DROP"),
            dup_pct: pct("FI_RDMX_FAULT_DUP"),
            reorder_pct: pct("FI_RDMX_FAULT_REORDER"),
            corrupt_pct: pct("FI_RDMX_FAULT_CORRUPT"),
        };
        cfg.is_active().then_some(cfg)
    }
}

/// What the decorator did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
}

/// Where a planned outgoing datagram's bytes live.
#[derive(Clone, Copy)]
enum Src {
    /// The caller's datagram `i`.
    Batch(usize),
    /// `corrupted[i]`.
    Corrupted(usize),
    /// `self.held[i]` (held back by an earlier call).
    Held(usize),
    /// `new_held[i]` (held back earlier in this call).
    NewHeld(usize),
}

/// The fault-injecting decorator around device `D` (`dyn Device` in the
/// provider: boxed, with no forwarding impl between).
pub struct FaultDevice<D: Device + ?Sized = dyn Device> {
    inner: Box<D>,
    cfg: FaultConfig,
    rng: Rng,
    /// Datagrams held back for reordering, oldest first.
    held: VecDeque<(DevAddr, Vec<u8>)>,
    /// The time of the last send: held datagrams released by a receive or a
    /// sleep go out with it (the seam passes time to sends only).
    now: Instant,
    pub stats: FaultStats,
}

impl<D: Device + ?Sized> FaultDevice<D> {
    /// `send_batch` of datagrams without gathered parts; `corruptible[i]`:
    /// how many leading bytes of datagram i a corruption may hit (all where
    /// `None`).
    fn send_plain(&mut self, batch: &[TxDatagram<'_>], corruptible: Option<&[usize]>) -> Result<usize, DeviceError> {
        let mtu = self.inner.caps().mtu;
        // Plan the whole batch, then hand it to the inner device in one call.
        let mut plan: Vec<(DevAddr, Src)> = Vec::with_capacity(batch.len() + self.held.len());
        // Per input datagram: how many planned datagrams must be sent for it to
        // count as taken.
        let mut ends: Vec<usize> = Vec::with_capacity(batch.len());
        let mut corrupted: Vec<Vec<u8>> = Vec::new();
        // (input index, destination, bytes) held back during this call.
        let mut new_held: Vec<(usize, DevAddr, Vec<u8>)> = Vec::new();
        let mut old_held_released = false;
        let mut new_held_released = 0;
        let mut fate = FaultStats::default();
        for (i, d) in batch.iter().enumerate() {
            if d.data.len() > mtu {
                // Let the inner device report it (error if first, short count
                // otherwise): a fault must not hide a caller's bug.
                plan.push((d.dst, Src::Batch(i)));
                ends.push(plan.len());
                break;
            }
            if self.rng.chance(self.cfg.drop_pct) {
                fate.dropped += 1;
                ends.push(plan.len());
                continue;
            }
            let mut src = Src::Batch(i);
            if !d.data.is_empty() && self.rng.chance(self.cfg.corrupt_pct) {
                let mut c = d.data.to_vec();
                let at = self.rng.below(corruptible.map_or(c.len(), |l| l[i].clamp(1, c.len())));
                c[at] ^= 1 << self.rng.below(8);
                corrupted.push(c);
                src = Src::Corrupted(corrupted.len() - 1);
                fate.corrupted += 1;
            }
            let held_now = if old_held_released { 0 } else { self.held.len() } + (new_held.len() - new_held_released);
            if held_now < MAX_HELD && self.rng.chance(self.cfg.reorder_pct) {
                let bytes = match src {
                    Src::Corrupted(c) => std::mem::take(&mut corrupted[c]),
                    _ => d.data.to_vec(),
                };
                new_held.push((i, d.dst, bytes));
                fate.reordered += 1;
                ends.push(plan.len());
                continue;
            }
            plan.push((d.dst, src));
            if self.rng.chance(self.cfg.dup_pct) {
                plan.push((d.dst, src));
                fate.duplicated += 1;
            }
            // Held datagrams go out right after the one that overtook them.
            if !old_held_released {
                plan.extend((0..self.held.len()).map(|j| (self.held[j].0, Src::Held(j))));
                old_held_released = true;
            }
            plan.extend((new_held_released..new_held.len()).map(|j| (new_held[j].1, Src::NewHeld(j))));
            new_held_released = new_held.len();
            ends.push(plan.len());
        }

        let sent = if plan.is_empty() {
            Ok(0)
        } else {
            let tx: Vec<TxDatagram<'_>> = plan
                .iter()
                .map(|&(dst, src)| {
                    TxDatagram::new(
                        dst,
                        match src {
                            Src::Batch(i) => batch[i].data,
                            Src::Corrupted(c) => &corrupted[c],
                            Src::Held(j) => &self.held[j].1,
                            Src::NewHeld(j) => &new_held[j].2,
                        },
                    )
                })
                .collect();
            self.inner.send_batch(self.now, &tx)
        };
        let k = *sent.as_ref().unwrap_or(&0);
        let taken = ends.iter().take_while(|&&e| e <= k).count();

        // Old held datagrams that went out leave the queue.
        let mut keep_old = vec![true; self.held.len()];
        for &(_, src) in &plan[..k.min(plan.len())] {
            if let Src::Held(j) = src {
                keep_old[j] = false;
            }
        }
        let mut j = 0;
        self.held.retain(|_| {
            j += 1;
            keep_old[j - 1]
        });
        // Datagrams held back in this call stay held if their input was taken and
        // they did not go out yet; otherwise the caller sends them again.
        let mut out_new = vec![false; new_held.len()];
        for &(_, src) in &plan[..k.min(plan.len())] {
            if let Src::NewHeld(j) = src {
                out_new[j] = true;
            }
        }
        for (j, (i, dst, bytes)) in new_held.into_iter().enumerate() {
            if i < taken && !out_new[j] {
                self.held.push_back((dst, bytes));
            }
        }
        // The counters are for humans reading logs: under back-pressure they may
        // count a fault of a datagram the caller sends again.
        self.stats.dropped += fate.dropped;
        self.stats.corrupted += fate.corrupted;
        self.stats.duplicated += fate.duplicated;
        self.stats.reordered += fate.reordered;
        match sent {
            Err(e) if taken == 0 => Err(e),
            _ => Ok(taken),
        }
    }

    pub fn new(inner: Box<D>, cfg: FaultConfig) -> FaultDevice<D> {
        FaultDevice {
            inner,
            rng: Rng::new(cfg.seed),
            cfg,
            held: VecDeque::new(),
            now: Instant::from_nanos(0),
            stats: FaultStats::default(),
        }
    }

    pub fn config(&self) -> &FaultConfig {
        &self.cfg
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    pub fn into_inner(self) -> Box<D> {
        self.inner
    }

    /// Sends the held-back datagrams now (what `recv_batch` does first). Those the
    /// inner device does not take stay held.
    pub fn flush_held(&mut self) -> Result<(), DeviceError> {
        while let Some((dst, data)) = self.held.front() {
            match self.inner.send_batch(self.now, &[TxDatagram::new(*dst, data)]) {
                Ok(1) => {
                    self.held.pop_front();
                }
                Ok(_) => break,
                Err(_) => {
                    // Unsendable (peer gone): it is lost, as on a real network.
                    self.held.pop_front();
                    self.stats.dropped += 1;
                }
            }
        }
        Ok(())
    }
}

impl<D: Device + ?Sized> Device for FaultDevice<D> {
    fn caps(&self) -> DeviceCaps {
        // Whatever the inner device promises, this one may break it.
        DeviceCaps { reliable: false, ordered: false, gso: false, ..self.inner.caps() }
    }

    fn send_batch(&mut self, now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.now = now;
        if batch.iter().any(|d| d.gather.is_some()) {
            // Held, duplicated or corrupted datagrams outlive the call (and
            // are edited): the gathered ones go as copies.
            let owned: Vec<Vec<u8>> = batch
                .iter()
                .map(|d| {
                    if d.gather.is_some() {
                        // SAFETY: inside `send_batch`, which `batch` was handed
                        // to: each gathered part's message is in flight
                        // ([`TxDatagram::gather`]).
                        unsafe { flattened(d) }
                    } else {
                        Vec::new()
                    }
                })
                .collect();
            let flat: Vec<TxDatagram<'_>> = batch
                .iter()
                .zip(&owned)
                .map(|(d, o)| if d.gather.is_some() { TxDatagram::run(d.dst, o, o.len()) } else { *d })
                .collect();
            // The transport of a gathering path (an RDMA NIC) guards the
            // payload end to end: a corruption hits only rdm's header, which
            // its checksum covers.
            let corruptible: Vec<usize> = batch
                .iter()
                .map(|d| if d.gather.is_some() { d.data.len().min(rdm::engine::HEADER_LEN) } else { usize::MAX })
                .collect();
            return self.send_plain(&flat, Some(&corruptible));
        }
        self.send_plain(batch, None)
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        // Never hold a datagram across a quiet period.
        if !self.held.is_empty() {
            self.flush_held()?;
        }
        self.inner.recv_batch(max, deliver)
    }

    fn caps_for(&self, peer: &DevAddr) -> DeviceCaps {
        // Faults apply per datagram: no runs through this decorator.
        DeviceCaps { reliable: false, ordered: false, gso: false, ..self.inner.caps_for(peer) }
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        self.inner.local_addrs()
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        self.inner.owns(addr)
    }

    /// The inner device's reads, untouched: faults apply to datagrams only.
    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        self.inner.remote_reads()
    }

    fn transmit_buffers(&mut self, count: usize, len: usize) -> Vec<Box<[u8]>> {
        self.inner.transmit_buffers(count, len)
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.inner.wait_fd()
    }

    fn prepare_wait(&mut self) -> bool {
        // Held datagrams would otherwise wait as long as the caller sleeps.
        let _ = self.flush_held();
        self.inner.prepare_wait()
    }

    /// Never: a datagram written straight into a peer's ring would escape
    /// the faults (and such writes go only to reliable, ordered paths, which
    /// this decorator does not offer).
    fn resolve(&mut self, _dst: &DevAddr) -> Result<Option<rdm::device::Dest>, DeviceError> {
        Ok(None)
    }

    /// The receiver's side of holding senders back is the inner device's: a
    /// peer without this decorator still writes straight into our ring.
    fn hold_back_senders(&mut self, hold: bool) {
        self.inner.hold_back_senders(hold)
    }

    fn held_back(&mut self, dst: &DevAddr) -> bool {
        self.inner.held_back(dst)
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.inner.poll_unreachable()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device that records what it is asked to send and takes at most `room`.
    struct Recorder {
        sent: Vec<(DevAddr, Vec<u8>)>,
        room: usize,
    }

    impl Device for Recorder {
        fn caps(&self) -> DeviceCaps {
            DeviceCaps {
                reliable: true,
                ordered: true,
                mtu: 100,
                remote_read: false,
                gso: false,
                registration: false,
                max_inline: 0,
                max_transmit: 100,
            }
        }
        fn local_addrs(&self) -> Vec<DevAddr> {
            vec![rdm::simnet::addr(0)]
        }
        fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
            let mut n = 0;
            for d in batch {
                if n == self.room {
                    break;
                }
                if d.data.len() > 100 {
                    if n == 0 {
                        return Err(DeviceError::TooLarge { len: d.data.len(), mtu: 100 });
                    }
                    break;
                }
                self.sent.push((d.dst, d.data.to_vec()));
                n += 1;
            }
            self.room -= n;
            Ok(n)
        }
        fn recv_batch(&mut self, _: usize, _: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
            Ok(0)
        }
        fn wait_fd(&self) -> Option<RawFd> {
            None
        }
    }

    fn data(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| vec![i as u8; 8]).collect()
    }

    fn run(cfg: FaultConfig, n: usize) -> (FaultDevice<Recorder>, usize) {
        let mut d = FaultDevice::new(Box::new(Recorder { sent: vec![], room: usize::MAX }), cfg);
        let msgs = data(n);
        let tx: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(rdm::simnet::addr(1), m)).collect();
        let taken = d.send_batch(Instant::ZERO, &tx).unwrap();
        d.recv_batch(1, &mut |_, _| {}).unwrap();
        (d, taken)
    }

    #[test]
    fn zero_rates_pass_through() {
        let (d, taken) = run(FaultConfig::default(), 50);
        assert_eq!(taken, 50);
        let got: Vec<Vec<u8>> = d.inner.sent.iter().map(|(_, b)| b.clone()).collect();
        assert_eq!(got, data(50));
    }

    #[test]
    fn rates_are_roughly_honoured_and_seeded() {
        let cfg = FaultConfig { seed: 7, drop_pct: 10.0, dup_pct: 10.0, reorder_pct: 10.0, corrupt_pct: 10.0 };
        let (d, taken) = run(cfg, 10_000);
        assert_eq!(taken, 10_000);
        for v in [d.stats.dropped, d.stats.duplicated, d.stats.corrupted] {
            assert!((700..1300).contains(&v), "{:?}", d.stats);
        }
        assert!(d.stats.reordered > 500, "{:?}", d.stats);
        assert!(d.held.is_empty());
        // Everything not dropped went out (dups twice).
        let expected = 10_000 - d.stats.dropped + d.stats.duplicated;
        assert_eq!(d.inner.sent.len() as u64, expected);
        // Same seed, same faults.
        let (d2, _) = run(cfg, 10_000);
        assert_eq!(d.inner.sent, d2.inner.sent);
        assert_eq!(d.stats, d2.stats);
    }

    #[test]
    fn reorder_sends_after_the_next() {
        let cfg = FaultConfig { seed: 3, reorder_pct: 100.0, ..Default::default() };
        let mut d = FaultDevice::new(Box::new(Recorder { sent: vec![], room: usize::MAX }), cfg);
        let msgs = data(3);
        for m in &msgs {
            assert_eq!(d.send_batch(Instant::ZERO, &[TxDatagram::new(rdm::simnet::addr(1), m)]).unwrap(), 1);
        }
        // Everything is held (up to MAX_HELD) until the receive side runs.
        assert!(d.inner.sent.is_empty());
        d.recv_batch(1, &mut |_, _| {}).unwrap();
        assert_eq!(d.inner.sent.len(), 3);
    }

    #[test]
    fn back_pressure_and_errors_keep_their_meaning() {
        let mut d = FaultDevice::new(Box::new(Recorder { sent: vec![], room: 3 }), FaultConfig::default());
        let msgs = data(5);
        let tx: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(rdm::simnet::addr(1), m)).collect();
        assert_eq!(d.send_batch(Instant::ZERO, &tx).unwrap(), 3);
        let big = vec![0u8; 101];
        d.inner.room = 10;
        assert!(matches!(
            d.send_batch(Instant::ZERO, &[TxDatagram::new(rdm::simnet::addr(1), &big)]),
            Err(DeviceError::TooLarge { .. })
        ));
        assert_eq!(d.send_batch(Instant::ZERO, &[tx[0], TxDatagram::new(rdm::simnet::addr(1), &big)]).unwrap(), 1);
    }

    #[test]
    fn from_lookup_parses() {
        let env = |k: &str| match k {
            "FI_RDMX_FAULT_SEED" => Some("0x10".to_string()),
            "FI_RDMX_FAULT_DROP" => Some("2.5".to_string()),
            "FI_RDMX_FAULT_DUP" => Some("250".to_string()),
            "FI_RDMX_FAULT_REORDER" => Some("junk".to_string()),
            _ => None,
        };
        let c = FaultConfig::from_lookup(env).unwrap();
        assert_eq!(c, FaultConfig { seed: 16, drop_pct: 2.5, dup_pct: 100.0, reorder_pct: 0.0, corrupt_pct: 0.0 });
        assert_eq!(FaultConfig::from_lookup(|_| None), None);
    }
}
