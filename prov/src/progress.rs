//! What a CQ or counter needs of the endpoints bound to it: a round of
//! progress, and what to sleep on. The queues hold their endpoints weakly as
//! [`Progress`] objects; the runtime's endpoint (`EpShared` in `core.rs`) is
//! the one implementation. Each endpoint also has an [`IdleGate`], which the
//! queues hold strongly: through it an empty poll skips the endpoint's round
//! without its lock.
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// An endpoint as the queues bound to it drive it (manual progress).
pub trait Progress: Send + Sync {
    /// One round of progress, on behalf of an application call.
    fn progress(&self);

    /// Before a sleep: arms the device's wait fd and returns it with the engine's
    /// next deadline and whether input is already waiting (then do not sleep).
    fn prepare_wait(&self) -> (Option<RawFd>, Option<rdm::Instant>, bool);

    /// `fi_trywait` for this endpoint: false when sleeping on the wait fd now
    /// could miss input that already arrived.
    fn try_wait(&self) -> bool;

    /// The endpoint's gate for idle polls.
    fn idle_gate(&self) -> Arc<IdleGate>;
}

/// What lets an application's empty poll skip a round of an endpoint's
/// progress without taking its lock (issue 44: an empty progress call in
/// under 100 instructions; MPICH makes one per `MPI_Isend`).
///
/// Every round of progress ends, under the endpoint's lock, by opening the
/// gate for the rounds that may be skipped from then on ([`IdleGate::open`]:
/// none unless the engines are quiet, then as many as the device's schedule
/// allows, `rndv::Endpoint::idle_rounds`). A poll then skips its round when
/// rounds are left and the device's lock-free input probe finds nothing
/// ([`IdleGate::skip`]). Whoever takes the lock next closes the gate first
/// ([`IdleGate::close`]) and reports the rounds skipped to the device, so
/// that its schedule (liveness checks, network polls) moves on as if they
/// had run. A post taking the lock closes the gate before it changes
/// anything, so a skip never hides work: a skip is a compare-and-swap on the
/// gate's state, which carries a generation that every open and close moves
/// on, so a poll that read the state before a close (and probed before it)
/// cannot take a round of the gate opened after it.
pub struct IdleGate {
    /// The generation (high 32 bits) and the rounds that may still be
    /// skipped (low 32 bits; 0: the gate is closed).
    state: AtomicU64,
    /// The rounds as last opened; read and written under the endpoint's lock only.
    opened: AtomicU32,
    /// The device's input probe ([`NoProbe`] where it has none: never skip).
    probe: Arc<dyn rdm::InputProbe>,
    /// Set by every application call, skipped rounds included; cleared by the
    /// background thread each period: the thread steps in only when the
    /// application has gone quiet.
    pub app_active: AtomicBool,
}

/// The probe of a device without one: input may always be there, so no
/// round is ever skipped.
struct NoProbe;

impl rdm::InputProbe for NoProbe {
    fn may_have_input(&self) -> bool {
        true
    }
}

/// The rounds part of [`IdleGate::state`].
const ROUNDS: u64 = u32::MAX as u64;
/// One generation of [`IdleGate::state`].
const GENERATION: u64 = 1 << 32;

impl IdleGate {
    /// The gate of an endpoint whose device has `probe` (closed until a
    /// round opens it).
    pub fn new(probe: Option<Arc<dyn rdm::InputProbe>>) -> IdleGate {
        IdleGate {
            state: AtomicU64::new(0),
            opened: AtomicU32::new(0),
            probe: probe.unwrap_or_else(|| Arc::new(NoProbe)),
            app_active: AtomicBool::new(false),
        }
    }

    /// Whether this poll may skip its round: the gate is open and the device
    /// has no input. Takes one round of the gate's.
    #[inline]
    pub fn skip(&self) -> bool {
        // Acquire: pairs with `open`'s release, so the probe reads the device
        // at least as the round that opened the gate left it (its pops of the
        // ring included).
        let state = self.state.load(Ordering::Acquire);
        if state & ROUNDS == 0 {
            return false;
        }
        if self.probe.may_have_input()
            || self.state.compare_exchange(state, state - 1, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            return false;
        }
        self.app_active.store(true, Ordering::Relaxed);
        true
    }

    /// Under the endpoint's lock, before anything changes: closes the gate
    /// and returns how many rounds were skipped since it opened.
    #[inline]
    pub fn close(&self) -> u32 {
        let opened = self.opened.load(Ordering::Relaxed);
        if opened == 0 {
            return 0;
        }
        self.opened.store(0, Ordering::Relaxed);
        let before = self.state.load(Ordering::Relaxed);
        let state = self.state.swap((before & !ROUNDS).wrapping_add(GENERATION), Ordering::Relaxed);
        opened - ((state & ROUNDS) as u32).min(opened)
    }

    /// Under the endpoint's lock, at the end of a round: opens the gate for
    /// `rounds` (none while the probe already sees input, which the next
    /// round takes).
    #[inline]
    pub fn open(&self, rounds: u32) {
        let rounds = if rounds > 0 && !self.probe.may_have_input() { rounds } else { 0 };
        self.opened.store(rounds, Ordering::Relaxed);
        let generation = (self.state.load(Ordering::Relaxed) & !ROUNDS).wrapping_add(GENERATION);
        self.state.store(generation | rounds as u64, Ordering::Release);
    }
}

/// Whether `w` is the endpoint `ep` (by address: the vtable part of the
/// pointer is not compared).
fn same<P: Progress>(w: &Weak<dyn Progress>, ep: &Arc<P>) -> bool {
    w.as_ptr() as *const () == Arc::as_ptr(ep) as *const ()
}

/// The endpoints bound to a CQ or counter, whose progress reading it drives.
/// Weak references: an endpoint's close detaches it, and a dangling one is
/// simply skipped.
#[derive(Default)]
pub struct BoundEndpoints(Mutex<Vec<Bound>>);

/// A bound endpoint, and its gate for idle polls (held strongly: a poll
/// that skips the round touches no endpoint).
struct Bound {
    ep: Weak<dyn Progress>,
    gate: Arc<IdleGate>,
}

impl BoundEndpoints {
    pub fn attach<P: Progress + 'static>(&self, ep: &Arc<P>) {
        let mut eps = self.0.lock();
        eps.retain(|b| b.ep.strong_count() > 0);
        if !eps.iter().any(|b| same(&b.ep, ep)) {
            let w = Arc::downgrade(ep);
            eps.push(Bound { ep: w, gate: ep.idle_gate() });
        }
    }

    pub fn detach<P: Progress>(&self, ep: &Arc<P>) {
        self.0.lock().retain(|b| b.ep.strong_count() > 0 && !same(&b.ep, ep));
    }

    /// The live endpoints (on the stack for the usual few: this runs on every
    /// CQ read).
    pub fn endpoints(&self) -> SmallVec<[Arc<dyn Progress>; 4]> {
        self.0.lock().iter().filter_map(|b| b.ep.upgrade()).collect()
    }

    /// Runs one round of progress on every bound endpoint. This runs on every
    /// CQ read: the usual single endpoint's gate is looked at first, under
    /// the list's lock but without the endpoint's, and may let the poll skip
    /// the round. (The list's lock is never held during progress: an
    /// endpoint's close holds the endpoint's lock while it detaches.)
    #[inline]
    pub fn progress(&self) {
        {
            let eps = self.0.lock();
            if let [only] = &eps[..] {
                if only.gate.skip() {
                    return;
                }
            }
        }
        self.progress_rounds();
    }

    /// [`BoundEndpoints::progress`] past the skip (out of line: a skip's
    /// frame stays small).
    #[inline(never)]
    fn progress_rounds(&self) {
        let single = {
            let eps = self.0.lock();
            (eps.len() == 1).then(|| eps[0].ep.upgrade())
        };
        match single {
            Some(Some(ep)) => ep.progress(),
            Some(None) => {}
            None => {
                for ep in self.endpoints() {
                    ep.progress();
                }
            }
        }
    }

    /// `fi_trywait` on every bound endpoint (all of them: each must arm its
    /// device); false if any has input waiting.
    #[allow(clippy::unnecessary_fold)] // not `all`: it would stop at the first endpoint with input, leaving the rest unarmed
    pub fn try_wait(&self) -> bool {
        self.endpoints().iter().fold(true, |ok, ep| ep.try_wait() && ok)
    }
}

/// How long an application's reads may keep finding nothing before rdmx
/// offers the CPU to whatever else is runnable on it (see [`EmptyReads`]).
const YIELD_AFTER: Duration = Duration::from_micros(20);

/// A `sched_yield` that took this long ran another thread on this core.
const SHARED_CORE: Duration = Duration::from_micros(10);

/// The streak of empty reads of one CQ, as an application's busy-poll loop
/// makes them (`fi_cq_read` until it returns an entry).
///
/// Why: two busy-polling processes of a job can end up on one core while the
/// other core idles. A sleeper woken by a socket or pipe write (a job's address
/// exchange at start-up, an rdmx wake-up byte) is placed on its waker's core
/// when the other core is busy at that instant, for example with a progress
/// thread's wake-up; the waker then does not sleep but polls. The two then
/// take turns by the scheduler's time slice, 4 ms here, until the load
/// balancer separates them: a fresh pair's first round trip took 6-12 ms in a
/// quarter of the runs (`perf sched timehist`: the woken process migrated onto
/// its peer's core, then waited 4.4 ms there while the other core was idle).
/// A reader that found nothing for [`YIELD_AFTER`] calls `sched_yield`, so a
/// process sharing the core runs now instead of at the end of the slice; when
/// that yield did run another thread (it took [`SHARED_CORE`] or more), a 1 µs
/// sleep follows, whose wake-up puts the reader on an idle core if there is
/// one. Alone on its core the yield returns at once: at most one system call
/// per 20 µs of waiting, and never while completions keep coming.
#[derive(Default)]
pub struct EmptyReads {
    /// Clock of the first empty read of the current streak, 0 outside one.
    since_ns: AtomicU64,
    /// Empty reads, counted roughly (a plain load and store: readers of one
    /// CQ on several threads may lose a count, which only shifts when the
    /// clock is next read).
    reads: AtomicU32,
}

/// The clock is read on one empty read in this many: a poll loop's empty
/// read then costs no clock read, and the streak's start and its yield come
/// at most this many reads (a few µs) later than [`YIELD_AFTER`] says.
const CLOCK_EVERY: u32 = 16;

impl EmptyReads {
    /// A read returned something: the streak ends.
    #[inline]
    pub fn found(&self) {
        if self.since_ns.load(Ordering::Relaxed) != 0 {
            self.since_ns.store(0, Ordering::Relaxed);
        }
    }

    /// A read found nothing: starts or extends the streak, and yields the CPU
    /// once per [`YIELD_AFTER`] of it.
    pub fn empty(&self) {
        let n = self.reads.load(Ordering::Relaxed).wrapping_add(1);
        self.reads.store(n, Ordering::Relaxed);
        if !n.is_multiple_of(CLOCK_EVERY) {
            return;
        }
        self.empty_at(
            crate::clock::now().as_nanos(),
            &mut || {
                std::thread::yield_now();
                crate::clock::now().as_nanos()
            },
            &mut || std::thread::sleep(Duration::from_micros(1)),
        );
    }

    /// [`EmptyReads::empty`] at clock `now` (ns), with the yield (which
    /// returns the clock after it) and the short sleep passed in.
    fn empty_at(&self, now: u64, yield_now: &mut dyn FnMut() -> u64, nap: &mut dyn FnMut()) {
        let now = now.max(1);
        let since = self.since_ns.load(Ordering::Relaxed);
        if since == 0 {
            self.since_ns.store(now, Ordering::Relaxed);
        } else if now.saturating_sub(since) >= YIELD_AFTER.as_nanos() as u64 {
            let mut after = yield_now();
            if after.saturating_sub(now) >= SHARED_CORE.as_nanos() as u64 {
                // Something else ran on this core meanwhile: a short sleep,
                // whose wake-up places this thread on an idle core if there
                // is one (yielding alone keeps both on this core: each then
                // looks cache-hot to the load balancer, which then waits).
                nap();
                after = crate::clock::now().as_nanos();
            }
            self.since_ns.store(after.max(1), Ordering::Relaxed);
        }
    }
}

/// Sleeps until one of the endpoints' devices has input, an engine timer is due,
/// or `max` has passed.
pub fn wait_any<P: Progress + ?Sized>(eps: &[Arc<P>], max: Duration) {
    wait_any_or_fd(eps, None, max);
}

/// Like [`wait_any`], also waking when `extra` turns readable (a wait set's fd).
pub fn wait_any_or_fd<P: Progress + ?Sized>(eps: &[Arc<P>], extra: Option<RawFd>, max: Duration) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(eps.len() + 1);
    if let Some(fd) = extra {
        fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
    }
    let mut wait = max;
    let t = crate::clock::now();
    for ep in eps {
        let (fd, deadline, ready) = ep.prepare_wait();
        if ready {
            return;
        }
        if let Some(fd) = fd {
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(t));
        }
    }
    sleep_on_fds(&mut fds, wait);
}

/// Sleeps until `fd` turns readable, `deadline` passes, or `max` has passed
/// (one endpoint, its state already locked: a close's linger).
pub fn sleep_on(fd: Option<RawFd>, deadline: Option<rdm::Instant>, max: Duration) {
    let wait = deadline.map_or(max, |d| max.min(d.saturating_duration_since(crate::clock::now())));
    let mut fds: Vec<libc::pollfd> =
        fd.map(|fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).into_iter().collect();
    sleep_on_fds(&mut fds, wait);
}

fn sleep_on_fds(fds: &mut [libc::pollfd], wait: Duration) {
    if fds.is_empty() {
        // Nothing to sleep on: yield briefly so a polling-only device still moves.
        std::thread::sleep(wait.min(Duration::from_micros(50)));
        return;
    }
    // ppoll, not poll: a deadline under a millisecond away (an ack delay, a
    // retransmission timer) rounded down to poll's 0 ms made the caller spin
    // until it passed, a core taken from the application on a small machine.
    let ts = libc::timespec {
        tv_sec: wait.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: wait.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `fds` is a valid array of pollfd for its length; `ts` outlives
    // the call; no signal mask is changed.
    unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, &ts, std::ptr::null()) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdm::InputProbe;

    /// A device's input as a flag.
    #[derive(Default)]
    struct Input(AtomicBool);
    impl rdm::InputProbe for Input {
        fn may_have_input(&self) -> bool {
            self.0.load(Ordering::Relaxed)
        }
    }

    /// Against a model (rounds left, rounds skipped since the gate opened)
    /// over generated sequences of opens, polls with and without input, and
    /// closes: a poll skips exactly when rounds are left and the probe sees
    /// nothing, a close reports exactly the rounds skipped since the open and
    /// leaves the gate shut, and a gate never opens while input waits.
    #[test]
    fn the_idle_gate_skips_only_open_rounds_without_input_and_counts_them() {
        use proptest::prelude::*;
        #[derive(Debug, Clone)]
        enum Op {
            Open(u32),
            Poll(bool),
            Close,
        }
        let op = prop_oneof![(0u32..6).prop_map(Op::Open), any::<bool>().prop_map(Op::Poll), Just(Op::Close),];
        proptest!(|(ops in proptest::collection::vec(op, 1..60))| {
            let input = Arc::new(Input::default());
            let gate = IdleGate::new(Some(input.clone()));
            let (mut left, mut skipped) = (0u32, 0u32);
            for op in ops {
                match op {
                    Op::Open(n) => {
                        gate.open(n);
                        (left, skipped) = (if input.may_have_input() { 0 } else { n }, 0);
                    }
                    Op::Poll(arrived) => {
                        input.0.store(arrived, Ordering::Relaxed);
                        let want = left > 0 && !arrived;
                        prop_assert_eq!(gate.skip(), want);
                        if want {
                            left -= 1;
                            skipped += 1;
                        }
                    }
                    Op::Close => {
                        prop_assert_eq!(gate.close(), skipped);
                        (left, skipped) = (0, 0);
                        prop_assert!(!gate.skip(), "a skip through a closed gate");
                    }
                }
            }
        });
        // A poll that read the gate before a close cannot take a round of
        // the gate opened after it with the same count (the generation moved).
        let input = Arc::new(Input::default());
        let gate = IdleGate::new(Some(input));
        gate.open(3);
        let stale = gate.state.load(Ordering::Relaxed);
        assert_eq!(gate.close(), 0);
        gate.open(3);
        assert!(gate.state.compare_exchange(stale, stale - 1, Ordering::Relaxed, Ordering::Relaxed).is_err());
        // Without a probe, never a skip.
        let gate = IdleGate::new(None);
        gate.open(5);
        assert!(!gate.skip());
        assert_eq!(gate.close(), 0);
    }

    /// The look at the only bound endpoint's gate follows binds and
    /// unbinds: one endpoint, its gate; two, none.
    #[test]
    fn the_gate_looked_at_is_the_only_bound_endpoints() {
        struct Ep(Arc<IdleGate>, AtomicU32);
        impl Progress for Ep {
            fn progress(&self) {
                self.1.fetch_add(1, Ordering::Relaxed);
            }
            fn prepare_wait(&self) -> (Option<RawFd>, Option<rdm::Instant>, bool) {
                (None, None, false)
            }
            fn try_wait(&self) -> bool {
                true
            }
            fn idle_gate(&self) -> Arc<IdleGate> {
                self.0.clone()
            }
        }
        let input = Arc::new(Input::default());
        let ep = |_| Arc::new(Ep(Arc::new(IdleGate::new(Some(input.clone()))), AtomicU32::new(0)));
        let (a, b) = (ep(0), ep(1));
        let bound = BoundEndpoints::default();
        bound.attach(&a);
        a.0.open(2);
        for _ in 0..3 {
            bound.progress();
        }
        assert_eq!(a.1.load(Ordering::Relaxed), 1, "two rounds skipped, the third run");
        bound.attach(&b);
        a.0.open(2);
        bound.progress();
        // Two bound: no gate looked at, each endpoint's progress is called (the
        // runtime's checks its own gate there).
        assert_eq!(a.1.load(Ordering::Relaxed), 2, "two bound: a's progress called");
        assert_eq!(b.1.load(Ordering::Relaxed), 1);
        bound.detach(&a);
        b.0.open(1);
        bound.progress();
        bound.progress();
        assert_eq!(b.1.load(Ordering::Relaxed), 2, "b alone again: one skipped, one run");
        assert_eq!(a.1.load(Ordering::Relaxed), 2, "a unbound");
    }

    /// The yield comes once per 20 µs of empty reads, never while reads find
    /// something; the nap only when the yield ran something else (10 µs or
    /// more passed in it).
    #[test]
    fn empty_reads_yield_once_per_20_us_and_nap_only_when_the_core_is_shared() {
        let r = EmptyReads::default();
        let (mut yields, mut naps) = (0, 0);
        let us = |n: u64| 1_000_000 + n * 1000;
        // Reads every µs for 100 µs, all empty; each yield takes 1 µs.
        for t in 0..100 {
            r.empty_at(
                us(t),
                &mut || {
                    yields += 1;
                    us(t + 1)
                },
                &mut || naps += 1,
            );
        }
        assert_eq!((yields, naps), (4, 0), "a yield at 20, 41, 62 and 83 µs, no nap: the yields were quick");
        // A read that finds something ends the streak: 19 µs more of empty
        // reads do not yield.
        r.found();
        for t in 200..219 {
            r.empty_at(
                us(t),
                &mut || {
                    yields += 1;
                    us(t)
                },
                &mut || naps += 1,
            );
        }
        assert_eq!(yields, 4);
        // A yield that took 10 µs: another thread had this core; then a nap.
        r.empty_at(
            us(221),
            &mut || {
                yields += 1;
                us(231)
            },
            &mut || naps += 1,
        );
        assert_eq!((yields, naps), (5, 1));
    }

    /// An endpoint with nothing to read (a pipe no one writes) and a timer
    /// 700 µs away.
    struct Idle {
        fd: RawFd,
        deadline: rdm::Instant,
    }

    impl Progress for Idle {
        fn progress(&self) {}
        fn prepare_wait(&self) -> (Option<RawFd>, Option<rdm::Instant>, bool) {
            (Some(self.fd), Some(self.deadline), false)
        }
        fn try_wait(&self) -> bool {
            true
        }
        fn idle_gate(&self) -> Arc<IdleGate> {
            Arc::new(IdleGate::new(None))
        }
    }

    /// A deadline under a millisecond away is slept until, not spun on: the
    /// caller's loop "wait, then check the timer" goes round once or twice,
    /// where poll's whole milliseconds (0 here) made it go round thousands
    /// of times, a core taken from the application.
    #[test]
    fn a_sub_millisecond_deadline_is_slept_until_not_spun_on() {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: a valid array of two fds for pipe(2) to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let deadline = crate::clock::now() + Duration::from_micros(700);
        let ep = Arc::new(Idle { fd: fds[0], deadline });
        let mut rounds = 0;
        while crate::clock::now() < deadline {
            wait_any(std::slice::from_ref(&ep), Duration::from_millis(10));
            rounds += 1;
            assert!(rounds < 50, "wait_any returned {rounds} times before a deadline 700 us away");
        }
        // SAFETY: the pipe's fds, opened above, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }
}
