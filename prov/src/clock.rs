//! The process's monotonic clock, the one time source of the provider: the
//! endpoint reads it through [`MonotonicClock`], waits compute deadlines with
//! [`now`].

/// Monotonic time for the engine: `CLOCK_MONOTONIC` in nanoseconds (its
/// epoch, boot, is as good as any: only differences are used).
///
/// Read straight from the vDSO and turned into nanoseconds with one multiply:
/// `std::time::Instant::elapsed` from a process epoch did the same read plus a
/// normalising subtraction and a `Duration` round trip, some 250 instructions
/// of a shared-memory round trip's 5,500 (three reads per round trip).
#[inline]
pub fn now() -> rdm::Instant {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC exists on
    // every Linux (the call cannot fail with a valid pointer and clock id).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    rdm::Instant::from_nanos((ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64))
}

/// The endpoint's clock: the process's monotonic one.
pub struct MonotonicClock;

impl rndv::Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> rdm::Instant {
        now()
    }
}
