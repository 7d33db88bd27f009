//! The queue of a completion queue, shared by the CQ object (`cq.rs`),
//! the endpoints bound to it (which push [`Completion`]s) and wait and poll
//! sets. Reading it first drives the progress of the bound endpoints.
use crate::error::{Error, Result};
use crate::progress::{BoundEndpoints, EmptyReads, Progress};
use crate::wait_fd::WaitFd;
use libfabric_sys as fi;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// One completion, successful or not. Pointers are the application's opaque
/// values, carried as integers.
#[derive(Clone, Debug, Default)]
pub struct Completion {
    pub op_context: usize,
    pub flags: u64,
    pub len: usize,
    pub buf: usize,
    pub data: u64,
    pub tag: u64,
    pub src: u64,
    /// Boxed: errors are rare, and every successful completion is copied
    /// into and out of the queue at a third of the size.
    pub err: Option<Box<CompletionError>>,
}

#[derive(Clone, Copy, Debug)]
pub struct CompletionError {
    /// Positive `FI_E*`.
    pub err: i32,
    pub olen: usize,
    pub prov_errno: i32,
    /// An rdmx address handed out as `err_data`: the unknown sender
    /// (FI_SOURCE_ERR, with FI_EADDRNOTAVAIL) or the peer whose failure failed
    /// the operation (`fi_cq_strerror` then names it).
    pub src_addr: Option<[u8; crate::addr::ADDR_LEN]>,
}

impl CompletionError {
    pub fn new(err: u32) -> CompletionError {
        CompletionError { err: err as i32, olen: 0, prov_errno: err as i32, src_addr: None }
    }
}

pub struct CqShared {
    pub wait: Option<WaitFd>,
    pub format: fi::fi_cq_format,
    pub(crate) queue: Mutex<VecDeque<Completion>>,
    /// The queue's length as of its last push or read, for a read that
    /// finds it empty without taking the lock (an application polls an empty
    /// CQ far more often than it finds something). Never zero while an entry
    /// is queued: every push stores it under the lock, and a removal elsewhere
    /// (`fi_cq_readerr`) only leaves it high until the next read.
    queued: AtomicUsize,
    /// Provider-owned `err_data` for callers that pass `err_data_size == 0`; valid
    /// until the next readerr, as libfabric specifies.
    pub(crate) err_data: Mutex<[u8; crate::addr::ADDR_LEN]>,
    /// The last `err_data` handed out that holds a whole address (pointer,
    /// size): `fi_cq_strerror` reads it back only if it gets this pointer.
    pub(crate) last_err_data: Mutex<(usize, usize)>,
    /// Provider-owned `fi_cq_strerror` text for callers that pass no buffer.
    pub(crate) strerror_text: Mutex<std::ffi::CString>,
    pub(crate) eps: BoundEndpoints,
    pub(crate) signaled: AtomicBool,
    /// The application's empty reads in a row (it yields the CPU in long ones).
    pub(crate) empty_reads: EmptyReads,
}

impl CqShared {
    pub(crate) fn new(wait: Option<WaitFd>, format: fi::fi_cq_format, capacity: usize) -> CqShared {
        CqShared {
            wait,
            format,
            queue: Mutex::new(VecDeque::with_capacity(capacity)),
            queued: AtomicUsize::new(0),
            err_data: Mutex::new([0; crate::addr::ADDR_LEN]),
            last_err_data: Mutex::new((0, 0)),
            strerror_text: Mutex::new(std::ffi::CString::default()),
            eps: BoundEndpoints::default(),
            signaled: AtomicBool::new(false),
            empty_reads: Default::default(),
        }
    }

    pub fn push(&self, c: Completion) {
        let mut q = self.queue.lock();
        q.push_back(c);
        self.queued.store(q.len(), Ordering::Release);
        if q.len() == 1 {
            if let Some(w) = &self.wait {
                w.set(true);
            }
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.lock().is_empty()
    }

    /// For poll sets: whether entries are queued.
    pub(crate) fn is_empty_now(&self) -> bool {
        self.is_empty()
    }

    /// For poll sets: one round of progress of the bound endpoints.
    pub(crate) fn progress_now(&self) {
        self.progress();
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

    pub(crate) fn progress(&self) {
        self.eps.progress();
    }

    fn entry_size(&self) -> usize {
        match self.format {
            fi::FI_CQ_FORMAT_CONTEXT => std::mem::size_of::<fi::fi_cq_entry>(),
            fi::FI_CQ_FORMAT_MSG => std::mem::size_of::<fi::fi_cq_msg_entry>(),
            fi::FI_CQ_FORMAT_DATA => std::mem::size_of::<fi::fi_cq_data_entry>(),
            _ => std::mem::size_of::<fi::fi_cq_tagged_entry>(),
        }
    }

    /// Copies up to `count` good entries to `buf` (and sources to `src`).
    /// `Ok(0)` means empty; `Err(Avail)` style is returned as -FI_EAVAIL by caller.
    #[inline]
    pub(crate) fn read(&self, buf: *mut libc::c_void, count: usize, src: *mut u64) -> Result<isize> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return Err(Error::Again);
        }
        self.read_queued(buf, count, src)
    }

    #[inline(never)]
    fn read_queued(&self, buf: *mut libc::c_void, count: usize, src: *mut u64) -> Result<isize> {
        let mut q = self.queue.lock();
        let mut n = 0;
        while n < count {
            match q.front() {
                Some(c) if c.err.is_none() => {
                    let Some(c) = q.pop_front() else { break };
                    // SAFETY: the application's buffer holds `count` entries of the
                    // CQ's format, and `src` (if given) `count` fi_addr_t.
                    unsafe {
                        let slot = (buf as *mut u8).add(n * self.entry_size());
                        write_entry(self.format, slot, &c);
                        if !src.is_null() {
                            *src.add(n) = c.src;
                        }
                    }
                    n += 1;
                }
                _ => break,
            }
        }
        self.queued.store(q.len(), Ordering::Release);
        if q.is_empty() {
            if let Some(w) = &self.wait {
                w.set(false);
            }
        }
        if n > 0 {
            return Ok(n as isize);
        }
        match q.front() {
            Some(_) => Ok(-(fi::FI_EAVAIL as isize)),
            None => Err(Error::Again),
        }
    }
}

/// # Safety
/// `slot` is valid for one entry of `format`.
unsafe fn write_entry(format: fi::fi_cq_format, slot: *mut u8, c: &Completion) {
    let ctx = c.op_context as *mut libc::c_void;
    // SAFETY: per contract; entries are written unaligned-safe via write_unaligned.
    unsafe {
        match format {
            fi::FI_CQ_FORMAT_CONTEXT => {
                std::ptr::write_unaligned(slot as *mut fi::fi_cq_entry, fi::fi_cq_entry { op_context: ctx })
            }
            fi::FI_CQ_FORMAT_MSG => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_msg_entry,
                fi::fi_cq_msg_entry { op_context: ctx, flags: c.flags, len: c.len },
            ),
            fi::FI_CQ_FORMAT_DATA => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_data_entry,
                fi::fi_cq_data_entry {
                    op_context: ctx,
                    flags: c.flags,
                    len: c.len,
                    buf: c.buf as *mut _,
                    data: c.data,
                },
            ),
            _ => std::ptr::write_unaligned(
                slot as *mut fi::fi_cq_tagged_entry,
                fi::fi_cq_tagged_entry {
                    op_context: ctx,
                    flags: c.flags,
                    len: c.len,
                    buf: c.buf as *mut _,
                    data: c.data,
                    tag: c.tag,
                },
            ),
        }
    }
}
