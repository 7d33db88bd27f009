//! # When a background thread progresses an endpoint
//!
//! An endpoint with background progress ([`crate::EndpointConfig::background_progress`])
//! is served by a thread while the application does not call in: acks,
//! retransmissions and arriving data must move even when a manual-progress
//! application stops calling after its last send, or a peer that lost a
//! datagram waits forever. While the application does call in, the thread
//! stays out of its way: each of its wake-ups can preempt a busy-polling rank
//! on a machine with no spare core, and it would contend for the endpoint's
//! lock.
//!
//! This module is that decision, sans-IO. The provider owns the thread, the
//! flag an application call sets (one relaxed store, no clock read on the
//! data path) and the sleeping; it asks [`BackgroundProgress`] what to do
//! with the flag it read:
//!
//! 1. [`BackgroundProgress::next`]: the application called in during the
//!    last period: stand by for [`BackgroundProgress::STAND_BY`]; otherwise
//!    wait on the endpoint ([`crate::Endpoint::prepare_wait`]: its device's
//!    fd and its next timer), at most [`BackgroundProgress::MAX_WAIT`].
//! 2. [`BackgroundProgress::after_wait`]: woken, the thread progresses the
//!    endpoint unless the application called in meanwhile (it was woken by
//!    the same input and progresses it itself).
//!
//! The stand-by period is fixed. A period that doubled while the application
//! kept calling in (2 ms up to 16 ms) measured better latency on an idle
//! machine but halved the rounds of a lossy soak (4 OpenMPI ranks on two
//! 2-core hosts, 5 % loss): ranks that compute or are descheduled stop
//! calling in for milliseconds, and their peers then wait on acks and
//! retransmissions that only the thread serves (reverted in f8cb1d4).
use std::time::Duration;

/// What the background thread does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackgroundStep {
    /// The application is progressing the endpoint: sleep this long, touch
    /// nothing, and ask again.
    StandBy(Duration),
    /// The application is not: sleep on the endpoint (input, its next timer)
    /// at most this long, then ask [`BackgroundProgress::after_wait`].
    Wait(Duration),
}

/// The policy of an endpoint's background progress (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct BackgroundProgress;

impl BackgroundProgress {
    /// The application counts as progressing the endpoint if it called in
    /// during the last period of this length. Short enough that a delayed
    /// ack or a retransmission waits at most about this long once the
    /// application stops calling in; long enough that the thread's wake-ups
    /// cost a busy-polling application nothing measurable.
    pub const STAND_BY: Duration = Duration::from_millis(2);

    /// The longest sleep on the endpoint: a bound for a wake-up the device
    /// could miss, and for noticing a stop request.
    pub const MAX_WAIT: Duration = Duration::from_millis(10);

    /// The next step, given whether the application called in since the
    /// last time it was asked.
    pub fn next(&self, app_called_in: bool) -> BackgroundStep {
        if app_called_in {
            BackgroundStep::StandBy(Self::STAND_BY)
        } else {
            BackgroundStep::Wait(Self::MAX_WAIT)
        }
    }

    /// After a [`BackgroundStep::Wait`]: whether the thread progresses the
    /// endpoint, given whether the application called in while it slept.
    pub fn after_wait(&self, app_called_in: bool) -> bool {
        !app_called_in
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread driven by the policy over a sequence of application calls:
    /// it never progresses in a period the application called in, and it
    /// progresses in every period the application stayed away.
    #[test]
    fn steps_in_only_while_the_application_stays_away() {
        let policy = BackgroundProgress;
        // (called in before the decision, called in during the wait)
        let periods = [(true, false), (false, false), (false, true), (true, true), (false, false)];
        let mut progressed = Vec::new();
        for (before, during) in periods {
            match policy.next(before) {
                BackgroundStep::StandBy(d) => {
                    assert_eq!(d, BackgroundProgress::STAND_BY);
                    progressed.push(false);
                }
                BackgroundStep::Wait(d) => {
                    assert_eq!(d, BackgroundProgress::MAX_WAIT);
                    progressed.push(policy.after_wait(during));
                }
            }
        }
        assert_eq!(progressed, [false, true, false, false, true]);
    }

    /// The stand-by period bounds how long a delayed ack waits once the
    /// application stops calling in; it stays well under the initial
    /// retransmission timeout, or a peer would retransmit messages
    /// that arrived.
    #[test]
    fn stand_by_is_short_against_the_retransmission_timeout() {
        let initial_rto = rdm::engine::EngineConfig::default().initial_rto;
        assert!(BackgroundProgress::STAND_BY * 5 <= initial_rto);
        assert!(BackgroundProgress::STAND_BY < BackgroundProgress::MAX_WAIT);
    }
}
