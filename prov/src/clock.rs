//! The process's monotonic clock, the one time source of the provider: the
//! endpoint reads it through [`MonotonicClock`], waits compute deadlines with
//! [`now`].
use std::sync::OnceLock;

/// Monotonic time for the engine, from one process-wide epoch.
pub fn now() -> rdm::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    rdm::Instant::from_nanos(epoch.elapsed().as_nanos() as u64)
}

/// The endpoint's clock: the process's monotonic one.
pub struct MonotonicClock;

impl rndv::Clock for MonotonicClock {
    fn now(&self) -> rdm::Instant {
        now()
    }
}
