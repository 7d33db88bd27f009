//! The unmap monitor: what MMU notifiers give a kernel driver, from user space.
//! The kernel tells rdmx through userfaultfd whenever memory a cache entry
//! covers is unmapped (`munmap`, `brk` shrinking, `mmap(MAP_FIXED)` over it,
//! `mremap` moving or shrinking it) or its pages are dropped
//! (`madvise(MADV_DONTNEED/MADV_REMOVE)`), and the cache drops every entry that
//! overlaps.
//!
//! ## How it watches
//! A cached entry's pages are registered with one process-wide userfaultfd in
//! *write-protect* mode with the `EVENT_UNMAP`, `EVENT_REMOVE` and
//! `EVENT_REMAP` features. rdmx never write-protects a page, so the
//! application never takes a userfaultfd page fault: the registration exists
//! only to receive the events (a missing-mode registration would route every
//! first touch of those pages through this thread). What the kernel will not
//! register — file-backed mappings, memory another userfaultfd watches, kernels
//! without write-protect mode (< 5.7) — is not watchable, and the cache then
//! registers it per use, never caching it. When no userfaultfd can be created
//! at all (`vm.unprivileged_userfaultfd = 0` on a kernel without
//! `UFFD_USER_MODE_ONLY`, seccomp, a kernel built without it) the monitor is
//! [`Monitor::unavailable`]: nothing is watchable, so nothing is cached — the
//! safe mode, never a silently unsafe one. rdmx says so once in its log.
//!
//! ## Why a lookup never returns a registration of unmapped pages
//! The rule: a lookup never returns a registration whose pages were unmapped
//! before the lookup began. "Before" means the unmap call returned in some
//! thread, and the lookup starts after that (in the same thread, or in another
//! one that synchronized with it).
//!
//! 1. For a watched range the kernel blocks the unmapping thread, inside the
//!    unmap call, until the monitor has *read* the event from the
//!    userfaultfd (`userfaultfd_event_wait_completion`: the event completes
//!    when it is copied out by `read`). So when the unmap call returns, the
//!    read has happened.
//! 2. The monitor thread reads only while it holds the log lock, and appends
//!    every event it read to the log before it releases that lock. So the
//!    event is in the log before any later acquisition of the lock.
//! 3. Every lookup first takes the log lock and applies what it has not seen
//!    (its cache remembers the log position it has applied up to), then looks
//!    up. Its acquisition of the lock comes after the unmap returned, so
//!    after the monitor released it: the event is applied before the lookup.
//! 4. Between a lookup and an unmap in another thread that races with it
//!    (neither ordered before the other) the application has no right to a
//!    particular answer; either is consistent with some order.
//!
//! Memory that was unmapped and mapped again at the same address before the
//! lookup is covered by the same argument: the unmap's event comes first.
//!
//! ## Why it cannot deadlock
//! An unmapping thread waits for the monitor's read, so the monitor's reading
//! path must never wait for anything an unmapping thread may hold — including
//! the cache lock (the cache deregisters, and freeing memory may unmap) and
//! the allocator's locks (a thread inside `free` may be unmapping). So:
//! - the monitor's loop allocates and frees nothing (a fixed event buffer, a
//!   fixed ring for the log) and takes no lock but the log lock;
//! - holders of the log lock do nothing but copy ranges in or out (no
//!   allocation, no unmap, no other lock); a cache copies what it must apply
//!   into a buffer on its stack, releases the log lock, then invalidates;
//! - the log is a ring: a cache that fell more than a ring behind invalidates
//!   everything instead of missing an event (counted as a flush).
//!
//! ## fork
//! rdmx does not ask for `EVENT_FORK`, so a child's mappings carry no
//! userfaultfd registration and its unmaps never wait for the parent's monitor
//! thread (which does not exist in the child). A cache used in a child would
//! get no events: a child must not use its parent's rdmx objects (libfabric's
//! rule too). In the parent nothing changes; for the devices rdmx has today
//! registrations do not pin pages (copy-on-write after `fork` cannot leave a
//! device behind on an old page). Devices that pin (verbs, SRD) mark their
//! registrations `MADV_DONTFORK` or rely on the kernel's fork support (verbs'
//! `ibv_fork_init`, automatic with `FOLL_PIN` kernels >= 5.13).
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use userfaultfd::{Event, EventBuffer, FeatureFlags, RegisterMode, Uffd, UffdBuilder};

use crate::watch::WatchCounts;

/// Ranges kept in the log; a cache more than this many events behind flushes.
pub const LOG_CAPACITY: usize = 256;
const PAGE: u64 = 4096;

/// Unmapped ranges in order, numbered from 0.
struct Log {
    ranges: [(u64, u64); LOG_CAPACITY],
    /// Number of ranges ever appended.
    head: u64,
}

impl Log {
    fn push(&mut self, start: u64, end: u64) {
        self.ranges[(self.head % LOG_CAPACITY as u64) as usize] = (start, end);
        self.head += 1;
    }
}

/// What a cache has to apply.
pub enum Changes {
    /// This many ranges, copied into the caller's buffer, were unmapped since
    /// the position the cache had seen.
    Ranges(usize),
    /// The cache fell too far behind: invalidate everything.
    Everything,
}

/// Where the monitor's knowledge of unmaps comes from.
enum Source {
    /// The kernel, through this userfaultfd (read by the monitor thread).
    Uffd(Uffd),
    /// Tests: everything counts as watched; unmaps are what the test records.
    Manual,
    /// Nothing can be watched, for this reason.
    Unavailable(String),
}

/// The process-wide unmap monitor (see the module docs).
pub struct Monitor {
    source: Source,
    log: Mutex<Log>,
    /// The log's head, published after each batch is appended (the lock-free
    /// check of [`Monitor::may_have_changes`]).
    head: AtomicU64,
    /// Set before each read of the userfaultfd, cleared after what it read is
    /// in the log and `head` published.
    reading: AtomicBool,
    watched: Mutex<WatchCounts>,
}

impl Monitor {
    /// The process's monitor, created (with its thread) on first use.
    pub fn global() -> &'static Monitor {
        static GLOBAL: OnceLock<&'static Monitor> = OnceLock::new();
        GLOBAL.get_or_init(|| {
            let m: &'static Monitor = Box::leak(Box::new(Monitor::open()));
            if matches!(m.source, Source::Uffd(_)) {
                let spawned = std::thread::Builder::new().name("rdmx-unmap".into()).spawn(move || m.run());
                if let Err(e) = spawned {
                    // Without the reader an unmap of watched memory would block
                    // forever: never watch anything then.
                    let m: &'static Monitor =
                        Box::leak(Box::new(Monitor::unavailable(format!("cannot start the monitor thread: {e}"))));
                    return m;
                }
            }
            m
        })
    }

    /// A monitor that watches nothing (so nothing is cached).
    pub fn unavailable(why: String) -> Monitor {
        Monitor::with_source(Source::Unavailable(why))
    }

    /// A monitor for tests: every range is watchable, and the unmaps are the
    /// ones the test passes to [`Monitor::record`].
    pub fn manual() -> Monitor {
        Monitor::with_source(Source::Manual)
    }

    fn with_source(source: Source) -> Monitor {
        Monitor {
            source,
            log: Mutex::new(Log { ranges: [(0, 0); LOG_CAPACITY], head: 0 }),
            head: AtomicU64::new(0),
            reading: AtomicBool::new(false),
            watched: Mutex::new(WatchCounts::new()),
        }
    }

    fn open() -> Monitor {
        let features = FeatureFlags::EVENT_UNMAP | FeatureFlags::EVENT_REMOVE | FeatureFlags::EVENT_REMAP;
        match UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(true)
            .user_mode_only(true)
            .require_features(features)
            .create()
        {
            Ok(uffd) => Monitor::with_source(Source::Uffd(uffd)),
            Err(e) => {
                Monitor::unavailable(format!("userfaultfd unavailable ({e}); memory registrations are not cached"))
            }
        }
    }

    /// Why this monitor watches nothing, if it does not.
    pub fn unavailable_reason(&self) -> Option<&str> {
        match &self.source {
            Source::Unavailable(why) => Some(why),
            _ => None,
        }
    }

    /// Starts watching the pages of `[addr, addr+len)`: true when the kernel
    /// will report their unmapping (only then may a registration of them be
    /// cached).
    pub fn watch(&self, addr: u64, len: u64) -> bool {
        let (start, end) = pages(addr, len);
        if start >= end {
            return false;
        }
        let mut watched = lock(&self.watched);
        match &self.source {
            Source::Unavailable(_) => return false,
            Source::Manual => {}
            Source::Uffd(uffd) => {
                // Registering pages that are already registered is allowed
                // (same userfaultfd): each watch makes sure its whole range is.
                if uffd
                    .register_with_mode(start as *mut _, (end - start) as usize, RegisterMode::WRITE_PROTECT)
                    .is_err()
                {
                    return false;
                }
            }
        }
        watched.add(start, end);
        true
    }

    /// Stops watching `[addr, addr+len)` for one entry; pages no other entry
    /// watches are unregistered (an unmap of them then costs the application
    /// no wait for this thread).
    pub fn unwatch(&self, addr: u64, len: u64) {
        let (start, end) = pages(addr, len);
        let mut watched = lock(&self.watched);
        watched.remove(start, end, |s, e| {
            if let Source::Uffd(uffd) = &self.source {
                // Fails harmlessly where the pages were unmapped meanwhile.
                let _ = uffd.unregister(s as *mut _, (e - s) as usize);
            }
        });
    }

    /// Pages watched now (runs of pages, for tests and stats).
    pub fn watched_runs(&self) -> usize {
        lock(&self.watched).boundaries()
    }

    /// The log position now (a new cache starts here).
    pub fn position(&self) -> u64 {
        lock(&self.log).head
    }

    /// False only when nothing was unmapped since `seen`, without taking the
    /// log lock (a hit's fast path). Why this is enough: an unmap that returned
    /// was read by the monitor while `reading` was set (it is set before the
    /// read, so the unmapping thread, woken by that read, sees it set or sees
    /// a later clear); it is cleared only after the event is in the log and
    /// `head` moved past it. So a caller that started after the unmap
    /// returned sees `reading` set (and then waits on the log lock in
    /// [`Monitor::changes_since`]) or `head` beyond `seen`.
    pub fn may_have_changes(&self, seen: u64) -> bool {
        self.reading.load(Ordering::SeqCst) || self.head.load(Ordering::SeqCst) != seen
    }

    /// What was unmapped since `seen` (copied into `buf`); moves `seen` to
    /// the present.
    pub fn changes_since(&self, seen: &mut u64, buf: &mut [(u64, u64); LOG_CAPACITY]) -> Option<Changes> {
        let log = lock(&self.log);
        if log.head == *seen {
            return None;
        }
        let behind = log.head - *seen;
        let out = if behind > LOG_CAPACITY as u64 {
            Changes::Everything
        } else {
            for (slot, n) in buf.iter_mut().zip(*seen..log.head) {
                *slot = log.ranges[(n % LOG_CAPACITY as u64) as usize];
            }
            Changes::Ranges(behind as usize)
        };
        *seen = log.head;
        Some(out)
    }

    /// Appends an unmapped range as the monitor thread does (for
    /// [`Monitor::manual`] monitors that tests drive by hand).
    pub fn record(&self, start: u64, end: u64) {
        let mut log = lock(&self.log);
        log.push(start, end);
        self.head.store(log.head, Ordering::SeqCst);
    }

    /// The monitor thread: wait for events without the lock, then read and
    /// log them with it (see the module docs for why in that order).
    fn run(&'static self) -> ! {
        let Source::Uffd(uffd) = &self.source else { unreachable!("the thread runs only for a userfaultfd") };
        let mut events = EventBuffer::new(64);
        // This thread must never stop while anything is watched: an unmap of
        // watched memory waits for it. So errors are retried, not fatal.
        loop {
            if !wait_readable(uffd) {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            let mut log = lock(&self.log);
            loop {
                let mut n = 0;
                self.reading.store(true, Ordering::SeqCst);
                match uffd.read_events(&mut events) {
                    Ok(iter) => {
                        for event in iter {
                            n += 1;
                            match event {
                                Ok(Event::Unmap { start, end } | Event::Remove { start, end }) => {
                                    log.push(start as u64, end as u64)
                                }
                                Ok(Event::Remap { from, len, .. }) => {
                                    log.push(from as u64, (from as u64).saturating_add(len as u64))
                                }
                                // No fault can come (nothing is write-protected)
                                // and fork events were not asked for.
                                Ok(Event::Pagefault { .. } | Event::Fork { .. }) => {}
                                // An event it cannot parse may have been an
                                // unmap: forget everything rather than miss it.
                                Err(_) => log.push(0, u64::MAX),
                            }
                        }
                    }
                    // EINTR and the like: `reading` stays set (lookups take
                    // the slow path meanwhile), poll again.
                    Err(_) => break,
                }
                self.head.store(log.head, Ordering::SeqCst);
                self.reading.store(false, Ordering::SeqCst);
                if n == 0 {
                    break;
                }
            }
        }
    }
}

fn pages(addr: u64, len: u64) -> (u64, u64) {
    let start = addr & !(PAGE - 1);
    let end = addr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
    (start, end)
}

/// A poisoned lock still holds consistent data here (no code under these locks
/// panics midway through an update), so keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks until the userfaultfd is readable; false when it never will be.
fn wait_readable(uffd: &Uffd) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(uffd.as_fd(), PollFlags::POLLIN)];
    loop {
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => {
                let ready = fds[0].revents().unwrap_or(PollFlags::empty());
                return !ready.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL);
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}
