//! Time for the sans-IO engine: a monotonic instant the caller supplies.
//!
//! The engine never reads a clock. Real devices pass `Instant::from_nanos` of
//! `CLOCK_MONOTONIC`; the simulator passes its virtual clock.
#![forbid(unsafe_code)]

use core::ops::{Add, Sub};
use core::time::Duration;

/// Nanoseconds since an arbitrary, caller-chosen epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    pub const ZERO: Instant = Instant(0);

    pub const fn from_nanos(ns: u64) -> Self {
        Instant(ns)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}
