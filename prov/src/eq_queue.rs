//! The queue of an event queue, shared by the EQ object (`eq.rs`), the
//! endpoints bound to it (which report errors there) and wait sets.
use libfabric_sys as fi;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;

/// One event: an application's (`fi_eq_write`) or an error.
pub(crate) struct Event {
    pub(crate) kind: u32,
    pub(crate) data: Vec<u8>,
    pub(crate) err: Option<fi::fi_eq_err_entry>,
}

// SAFETY: the raw pointers inside fi_eq_err_entry are opaque values the application
// wrote; rdmx never dereferences them.
unsafe impl Send for Event {}

/// The queue of an EQ, shared with the endpoints bound to it: they report there
/// the errors that have no operation context to carry them to a CQ (a failed
/// `fi_inject`, a peer declared unreachable).
#[derive(Default)]
pub struct EqQueue {
    pub(crate) queue: Mutex<VecDeque<Event>>,
    pub(crate) cond: Condvar,
    /// `FI_WAIT_FD`: an eventfd that is readable exactly while events are queued.
    pub(crate) wait_fd: Option<std::os::fd::OwnedFd>,
}

impl EqQueue {
    /// Queues an error event for `fid` (the endpoint) with a positive `FI_E*`.
    pub fn push_error(&self, fid: usize, err: u32) {
        // SAFETY: fi_eq_err_entry is plain C data; all-zero is a valid value.
        let mut e: fi::fi_eq_err_entry = unsafe { std::mem::zeroed() };
        e.fid = fid as *mut fi::fid;
        e.err = err as i32;
        e.prov_errno = err as i32;
        self.push(Event { kind: 0, data: Vec::new(), err: Some(e) });
    }

    /// For wait sets: whether events are queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// For wait sets: the eventfd (FI_WAIT_FD or FI_WAIT_SET), if any.
    pub(crate) fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.wait_fd.as_ref().map(|f| f.as_raw_fd())
    }

    pub(crate) fn push(&self, ev: Event) {
        let mut q = self.queue.lock();
        q.push_back(ev);
        if q.len() == 1 {
            self.signal(true);
        }
        drop(q);
        self.cond.notify_all();
    }

    /// Keeps the wait fd readable exactly while `non_empty` (called under the
    /// queue lock when the queue's emptiness changes).
    pub(crate) fn signal(&self, non_empty: bool) {
        let Some(fd) = &self.wait_fd else { return };
        use std::os::fd::AsRawFd;
        let mut v: u64 = 1;
        // SAFETY: an eventfd we own; 8-byte reads and writes of a local u64.
        unsafe {
            if non_empty {
                libc::write(fd.as_raw_fd(), &v as *const u64 as *const libc::c_void, 8);
            } else {
                libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8);
            }
        }
    }
}
