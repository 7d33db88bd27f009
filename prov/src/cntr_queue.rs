//! The state of a counter, shared by the counter object (`cntr.rs`),
//! the endpoints bound to it (which count their completions there) and wait
//! and poll sets. Reading it first drives the progress of the bound endpoints.
use crate::progress::{BoundEndpoints, Progress};
use crate::wait_fd::WaitFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Default)]
pub struct CntrShared {
    pub(crate) value: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) eps: BoundEndpoints,
    /// FI_WAIT_FD: set on every change, cleared by reads.
    pub wait: Option<WaitFd>,
}

impl CntrShared {
    pub fn inc(&self) {
        self.add(1);
    }

    pub fn inc_err(&self) {
        self.add_err(1);
    }

    // Every change, from a completion or from fi_cntr_add/set/adderr/seterr,
    // signals the wait fd (and through it a wait set): a waiter on the fd
    // cannot tell who changed the counter.
    pub(crate) fn add(&self, v: u64) {
        self.value.fetch_add(v, Ordering::AcqRel);
        self.changed();
    }

    pub(crate) fn set(&self, v: u64) {
        self.value.store(v, Ordering::Release);
        self.changed();
    }

    pub(crate) fn add_err(&self, v: u64) {
        self.errors.fetch_add(v, Ordering::AcqRel);
        self.changed();
    }

    pub(crate) fn set_err(&self, v: u64) {
        self.errors.store(v, Ordering::Release);
        self.changed();
    }

    fn changed(&self) {
        if let Some(w) = &self.wait {
            w.set(true);
        }
    }

    pub(crate) fn seen(&self) {
        if let Some(w) = &self.wait {
            w.set(false);
        }
    }

    pub fn attach<P: Progress + 'static>(&self, ep: &Arc<P>) {
        self.eps.attach(ep);
    }

    pub fn detach<P: Progress>(&self, ep: &Arc<P>) {
        self.eps.detach(ep);
    }

    pub(crate) fn endpoints(&self) -> smallvec::SmallVec<[Arc<dyn Progress>; 4]> {
        self.eps.endpoints()
    }

    /// For wait sets: the counter changed since it was last read.
    pub(crate) fn changed_unseen(&self) -> bool {
        self.wait.as_ref().is_some_and(|w| w.is_set())
    }

    pub(crate) fn progress(&self) {
        self.eps.progress();
    }

    /// For poll sets: one round of progress of the bound endpoints.
    pub(crate) fn progress_now(&self) {
        self.progress();
    }

    /// For poll sets: (value, errors) now.
    pub(crate) fn snapshot(&self) -> (u64, u64) {
        (self.value.load(Ordering::Acquire), self.errors.load(Ordering::Acquire))
    }
}
