//! Congestion control of one peer's send side: the window (slow start, then
//! congestion avoidance, never above the engine's `max_window`) and when to
//! reduce it. Random loss is not congestion: a loss shrinks the window only
//! when the path shows a queue (the RTT of a whole round well above the lowest
//! ever seen), when two rounds in a row needed a third of their datagrams
//! resent, or on repeated timeouts; at most once per round trip, and never
//! below [`MIN_WINDOW`] packets. The rules are pure state changes, table-tested
//! at the bottom of this file; [`super::recovery`] decides when they apply.
use super::seq::Psn;
use std::time::Duration;

/// The floor of every reduction, in packets.
const MIN_WINDOW: f64 = 4.0;

/// The window of a lossy path at first traffic, in packets (at most the
/// engine's `max_window`); a reliable path starts at `max_window`.
const INITIAL_WINDOW: f64 = 64.0;

#[derive(Clone, Debug, PartialEq)]
pub(super) struct Congestion {
    /// Packets in flight allowed, and the slow-start threshold.
    cwnd: f64,
    ssthresh: f64,
    /// The lowest RTT sampled: the path's delay without queueing. An RTT well
    /// above it means a queue is building — congestion, which a random loss
    /// does not show.
    min_rtt: Option<Duration>,
    /// After a window reduction, no other until the cumulative ack reaches
    /// this PSN (one reduction per round trip, however many holes it had).
    recover: Option<Psn>,
    /// Loss accounting of the current round (a window's worth of data, until
    /// the cumulative ack reaches `round_end`): datagrams acknowledged, and
    /// how many of them had to be resent.
    round_end: Psn,
    round_acked: u32,
    round_retx: u32,
    /// The last whole round needed a third of its datagrams resent.
    last_round_heavy: bool,
    /// The lowest RTT sampled in this round, and in the last whole one: a
    /// queue raises every sample of a round, ack batching only some.
    round_min_rtt: Option<Duration>,
    last_round_min_rtt: Option<Duration>,
}

impl Congestion {
    pub(super) fn new(reliable: bool, max_window: u32) -> Congestion {
        Congestion {
            cwnd: initial_window(reliable, max_window),
            ssthresh: max_window as f64,
            min_rtt: None,
            recover: None,
            round_end: Psn(0),
            round_acked: 0,
            round_retx: 0,
            last_round_heavy: false,
            round_min_rtt: None,
            last_round_min_rtt: None,
        }
    }

    /// The window, in whole packets.
    #[inline]
    pub(super) fn window(&self) -> u32 {
        self.cwnd as u32
    }

    /// The window as kept (diagnostics).
    pub(super) fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The path turned out reliable before anything was sent: a full window.
    pub(super) fn open_fully(&mut self, max_window: u32) {
        self.cwnd = max_window as f64;
    }

    /// The peer restarted: its stream starts over, and so does what the
    /// window and the RTT floor learnt (the rest settles within a round).
    pub(super) fn restart(&mut self, reliable: bool, max_window: u32) {
        self.cwnd = initial_window(reliable, max_window);
        self.min_rtt = None;
        self.recover = None;
    }

    /// One datagram acknowledged cumulatively (`retransmitted`: it had been
    /// sent more than once): counted for the round; the window grows by one
    /// in slow start, by one per window in congestion avoidance.
    #[inline]
    pub(super) fn on_acked(&mut self, retransmitted: bool, max_window: u32) {
        self.round_acked += 1;
        self.round_retx += u32::from(retransmitted);
        if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
        } else {
            self.cwnd += 1.0 / self.cwnd.max(1.0);
        }
        self.cwnd = self.cwnd.min(max_window as f64);
    }

    /// A round-trip time measured (Karn's rule already applied).
    #[inline]
    pub(super) fn on_rtt_sample(&mut self, rtt: Duration) {
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        self.round_min_rtt = Some(self.round_min_rtt.map_or(rtt, |m| m.min(rtt)));
    }

    /// Selective acks below cumulative ack `ack` made holes be resent, with
    /// `next_psn` the next PSN to send. Outside recovery, starts a recovery
    /// round, and halves the window if the path shows a queue (a window
    /// halved on every lost datagram keeps a few packets in flight at 5%
    /// random loss, a small fraction of the path). Returns whether it reduced.
    pub(super) fn on_fast_retransmit(&mut self, ack: Psn, next_psn: Psn) -> bool {
        if self.recover.is_some_and(|r| ack.lt(r)) {
            return false;
        }
        self.recover = Some(next_psn);
        if self.queue_building() {
            self.halve();
            return true;
        }
        false
    }

    /// The retransmission timer fired with holes to resend (`queued` of them
    /// queued now), the backoff already doubled to `backoff`. Repeated
    /// timeouts (a path that lost everything, or a peer gone) or a queue
    /// start again from a few packets; a first timeout without a queue (a
    /// tail, or a lost retransmission under random loss) keeps most of the
    /// window. Either way a recovery round starts. Returns whether it counts
    /// as a congestion reduction.
    pub(super) fn on_timeout(&mut self, backoff: u32, queued: u32, next_psn: Psn) -> bool {
        let congested = backoff > 2 || self.queue_building();
        if congested {
            self.ssthresh = (self.cwnd / 2.0).max(MIN_WINDOW);
            self.cwnd = MIN_WINDOW.max(queued as f64).min(self.ssthresh.max(MIN_WINDOW));
        } else {
            self.ssthresh = (self.cwnd * 0.7).max(MIN_WINDOW);
            self.cwnd = self.ssthresh;
        }
        self.recover = Some(next_psn);
        congested
    }

    /// The cumulative ack advanced to `ack` (`next_psn`: the next PSN to
    /// send). When that ends the round: if it and the round before each
    /// needed more than a third of their datagrams resent, the path is
    /// overflowing, whatever the RTT says: halve the window (once per round
    /// trip, as for a queue). One such round alone is a burst — a dropped GSO
    /// run is dozens of datagrams — not a buffer that stays full. Returns
    /// whether it reduced.
    pub(super) fn on_ack_advanced(&mut self, ack: Psn, next_psn: Psn) -> bool {
        if ack.lt(self.round_end) {
            return false;
        }
        let heavy = heavy_loss(self.round_acked, self.round_retx);
        let twice = heavy && self.last_round_heavy;
        self.last_round_heavy = heavy;
        let mut reduced = false;
        if twice && !self.recover.is_some_and(|r| ack.lt(r)) {
            self.recover = Some(next_psn);
            self.halve();
            reduced = true;
        }
        self.round_end = next_psn;
        self.round_acked = 0;
        self.round_retx = 0;
        self.last_round_min_rtt = self.round_min_rtt.take().or(self.last_round_min_rtt);
        reduced
    }

    fn halve(&mut self) {
        self.ssthresh = (self.cwnd * 0.5).max(MIN_WINDOW);
        self.cwnd = self.ssthresh;
    }

    /// Whether the RTT shows a queue: this round's lowest (else the last
    /// whole round's) against the lowest ever seen.
    fn queue_building(&self) -> bool {
        queue_building(self.round_min_rtt.or(self.last_round_min_rtt), self.min_rtt)
    }
}

fn initial_window(reliable: bool, max_window: u32) -> f64 {
    if reliable {
        max_window as f64
    } else {
        INITIAL_WINDOW.min(max_window as f64)
    }
}

/// Whether the RTT shows a queue on the path: the lowest RTT of the round
/// (every sample of a round carries a queue; only some carry the receiver's
/// ack batching or a delayed-ack timer) exceeds twice the lowest ever seen
/// plus 300 µs. On loopback the lowest RTT is ~10 µs while a round's lowest
/// sits at 100–400 µs from receive batching alone (measured with 5% random
/// loss and no queue); a socket buffer or link queue that fills adds
/// milliseconds. Congestion that drops before it queues that much shows as
/// [`heavy_loss`] instead.
fn queue_building(round_min_rtt: Option<Duration>, min_rtt: Option<Duration>) -> bool {
    match (round_min_rtt, min_rtt) {
        (Some(s), Some(m)) => s > m * 2 + Duration::from_micros(300),
        // No sample yet: assume the worst.
        _ => true,
    }
}

/// Whether a round needed more than a third of its datagrams resent (at
/// least 20 acknowledged): far beyond random loss on any usable path.
fn heavy_loss(acked: u32, resent: u32) -> bool {
    acked >= 20 && resent * 3 > acked
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u32 = 1024;

    fn us(n: u64) -> Option<Duration> {
        Some(Duration::from_micros(n))
    }

    /// A lossy path's state after some traffic: window `cwnd`, threshold
    /// `ssthresh`, RTT floor 10 µs and a round without a queue (20 µs).
    fn st(cwnd: f64, ssthresh: f64) -> Congestion {
        Congestion {
            cwnd,
            ssthresh,
            min_rtt: us(10),
            round_min_rtt: us(20),
            round_end: Psn(100),
            ..Congestion::new(false, MAX)
        }
    }

    /// The inputs the rules take, one row each.
    #[derive(Clone, Copy, Debug)]
    enum Ev {
        Acked { retransmitted: bool, max_window: u32 },
        Rtt(u64),
        FastRetransmit { ack: u32, next_psn: u32 },
        Timeout { backoff: u32, queued: u32, next_psn: u32 },
        AckAdvanced { ack: u32, next_psn: u32 },
        Restart { reliable: bool },
    }

    fn apply(c: &mut Congestion, ev: Ev) -> bool {
        match ev {
            Ev::Acked { retransmitted, max_window } => {
                c.on_acked(retransmitted, max_window);
                false
            }
            Ev::Rtt(micros) => {
                c.on_rtt_sample(Duration::from_micros(micros));
                false
            }
            Ev::FastRetransmit { ack, next_psn } => c.on_fast_retransmit(Psn(ack), Psn(next_psn)),
            Ev::Timeout { backoff, queued, next_psn } => c.on_timeout(backoff, queued, Psn(next_psn)),
            Ev::AckAdvanced { ack, next_psn } => c.on_ack_advanced(Psn(ack), Psn(next_psn)),
            Ev::Restart { reliable } => {
                c.restart(reliable, MAX);
                false
            }
        }
    }

    /// (rule, state, event) -> (state, whether it counts as a reduction).
    #[test]
    fn transitions() {
        let queued = Congestion { round_min_rtt: us(2000), ..st(40.0, 100.0) };
        let no_sample = Congestion { min_rtt: None, round_min_rtt: None, last_round_min_rtt: None, ..st(40.0, 100.0) };
        let heavy_round = Congestion { round_acked: 30, round_retx: 11, ..st(40.0, 100.0) };
        let rows: Vec<(&str, Congestion, Ev, Congestion, bool)> = vec![
            (
                "a lossy path starts at 64 packets",
                Congestion::new(false, MAX),
                Ev::Rtt(10),
                Congestion {
                    cwnd: 64.0,
                    ssthresh: MAX as f64,
                    min_rtt: us(10),
                    round_min_rtt: us(10),
                    ..Congestion::new(false, MAX)
                },
                false,
            ),
            (
                "slow start: one more per ack",
                st(10.0, 100.0),
                Ev::Acked { retransmitted: false, max_window: MAX },
                Congestion { round_acked: 1, ..st(11.0, 100.0) },
                false,
            ),
            (
                "congestion avoidance: one more per window",
                st(100.0, 50.0),
                Ev::Acked { retransmitted: false, max_window: MAX },
                Congestion { round_acked: 1, ..st(100.01, 50.0) },
                false,
            ),
            (
                "ceiling: never above max_window",
                st(64.0, 100.0),
                Ev::Acked { retransmitted: true, max_window: 64 },
                Congestion { round_acked: 1, round_retx: 1, ..st(64.0, 100.0) },
                false,
            ),
            (
                "rtt samples lower the floors",
                st(10.0, 100.0),
                Ev::Rtt(5),
                Congestion { min_rtt: us(5), round_min_rtt: us(5), ..st(10.0, 100.0) },
                false,
            ),
            (
                "random loss: a recovery round, the window kept",
                st(40.0, 100.0),
                Ev::FastRetransmit { ack: 50, next_psn: 120 },
                Congestion { recover: Some(Psn(120)), ..st(40.0, 100.0) },
                false,
            ),
            (
                "loss with a queue: halved",
                queued.clone(),
                Ev::FastRetransmit { ack: 50, next_psn: 120 },
                Congestion { cwnd: 20.0, ssthresh: 20.0, recover: Some(Psn(120)), ..queued.clone() },
                true,
            ),
            (
                "loss before any rtt sample: halved",
                no_sample.clone(),
                Ev::FastRetransmit { ack: 0, next_psn: 9 },
                Congestion { cwnd: 20.0, ssthresh: 20.0, recover: Some(Psn(9)), ..no_sample.clone() },
                true,
            ),
            (
                "in recovery: once per round trip",
                Congestion { recover: Some(Psn(100)), ..queued.clone() },
                Ev::FastRetransmit { ack: 99, next_psn: 130 },
                Congestion { recover: Some(Psn(100)), ..queued.clone() },
                false,
            ),
            (
                "floor: never below 4",
                Congestion { round_min_rtt: us(2000), ..st(6.0, 100.0) },
                Ev::FastRetransmit { ack: 1, next_psn: 2 },
                Congestion { round_min_rtt: us(2000), recover: Some(Psn(2)), ..st(4.0, 4.0) },
                true,
            ),
            (
                "first timeout without a queue: 70% kept",
                st(40.0, 100.0),
                Ev::Timeout { backoff: 2, queued: 3, next_psn: 120 },
                Congestion { recover: Some(Psn(120)), ..st(28.0, 28.0) },
                false,
            ),
            (
                "repeated timeouts: a few packets",
                st(40.0, 100.0),
                Ev::Timeout { backoff: 4, queued: 10, next_psn: 120 },
                Congestion { recover: Some(Psn(120)), ..st(10.0, 20.0) },
                true,
            ),
            (
                "timeout with a queue: 4 packets",
                queued.clone(),
                Ev::Timeout { backoff: 2, queued: 1, next_psn: 120 },
                Congestion { cwnd: 4.0, ssthresh: 20.0, recover: Some(Psn(120)), ..queued.clone() },
                true,
            ),
            (
                "timeout floor",
                st(5.0, 100.0),
                Ev::Timeout { backoff: 8, queued: 0, next_psn: 1 },
                Congestion { recover: Some(Psn(1)), ..st(4.0, 4.0) },
                true,
            ),
            (
                "round not over yet",
                heavy_round.clone(),
                Ev::AckAdvanced { ack: 99, next_psn: 200 },
                heavy_round.clone(),
                false,
            ),
            (
                "one heavy round: a burst, nothing reduced",
                heavy_round.clone(),
                Ev::AckAdvanced { ack: 100, next_psn: 200 },
                Congestion {
                    last_round_heavy: true,
                    round_end: Psn(200),
                    round_min_rtt: None,
                    last_round_min_rtt: us(20),
                    ..st(40.0, 100.0)
                },
                false,
            ),
            (
                "two heavy rounds: halved",
                Congestion { last_round_heavy: true, ..heavy_round.clone() },
                Ev::AckAdvanced { ack: 100, next_psn: 200 },
                Congestion {
                    last_round_heavy: true,
                    recover: Some(Psn(200)),
                    round_end: Psn(200),
                    round_min_rtt: None,
                    last_round_min_rtt: us(20),
                    ..st(20.0, 20.0)
                },
                true,
            ),
            (
                "a light round clears the heavy mark",
                Congestion { last_round_heavy: true, round_acked: 30, round_retx: 2, ..st(40.0, 100.0) },
                Ev::AckAdvanced { ack: 150, next_psn: 200 },
                Congestion { round_end: Psn(200), round_min_rtt: None, last_round_min_rtt: us(20), ..st(40.0, 100.0) },
                false,
            ),
            (
                "restart: initial window, no floor, no recovery",
                Congestion { recover: Some(Psn(5)), ..st(9.0, 30.0) },
                Ev::Restart { reliable: false },
                Congestion { min_rtt: None, ..st(64.0, 30.0) },
                false,
            ),
            (
                "restart on a reliable path: the full window",
                st(9.0, 30.0),
                Ev::Restart { reliable: true },
                Congestion { min_rtt: None, ..st(MAX as f64, 30.0) },
                false,
            ),
        ];
        for (rule, mut state, ev, want, want_reduced) in rows {
            let reduced = apply(&mut state, ev);
            assert_eq!((state, reduced), (want, want_reduced), "{rule}: {ev:?}");
        }
    }

    #[test]
    fn a_reliable_path_starts_with_the_full_window_and_a_small_max_caps_the_start() {
        assert_eq!(Congestion::new(true, 300).window(), 300);
        assert_eq!(Congestion::new(false, 16).window(), 16);
        assert_eq!(Congestion::new(false, 300).window(), 64);
    }
}
