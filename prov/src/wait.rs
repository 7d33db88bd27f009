//! Wait sets (`fi_wait_open`, `fi_wait`, `fi_control(FI_GETWAIT)`, see
//! fi_wait(3)): one object an application sleeps on for several CQs, counters
//! and EQs, opened with `wait_obj = FI_WAIT_SET` and `wait_set` = the set.
//!
//! Built from the wait fds rdmx already has: a member of a set gets the fd it
//! would have with `FI_WAIT_FD` (a CQ's or counter's epoll over its endpoints'
//! devices plus an eventfd set while completions are queued / the counter moved
//! unseen, an EQ's eventfd set while events are queued), and the set is an
//! epoll over those fds. So the set's fd (`FI_WAIT_FD`) is readable when a
//! member's is: input at a device, or something queued — also when the
//! background progress thread queued it. `FI_WAIT_UNSPEC` is the same object.
//!
//! `fi_wait` drives one round of progress of every member (manual progress),
//! returns 0 if any has something (a CQ with entries, a counter that changed
//! since it was last read, an EQ with events), and otherwise sleeps on the set
//! and the members' engine timers until then or the timeout
//! (`-FI_ETIMEDOUT`). Members stay in the set until they close; the set cannot
//! close before them (`-FI_EBUSY`).
use crate::cntr_queue::CntrShared;
use crate::cq_queue::CqShared;
use crate::entry::{entry, non_null, Out};
use crate::eq_queue::EqQueue;
use crate::error::{Error, Result};
use crate::fabric::{self, Fabric};
use crate::fid::{self, FidObject, Refs};
use crate::progress;
use crate::progress::Progress;
use libfabric_sys as fi;
use parking_lot::Mutex;
use smallvec::SmallVec;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

enum Member {
    Cq(Weak<CqShared>),
    Cntr(Weak<CntrShared>),
    Eq(Weak<EqQueue>),
}

/// The state of a wait set its members hold on to.
pub struct WaitSetShared {
    /// Epoll over the members' wait fds: the set's own fd.
    epoll: OwnedFd,
    members: Mutex<Vec<Member>>,
    /// Members opened on this set and not yet closed.
    pub refs: Refs,
}

impl WaitSetShared {
    /// Watches a member's wait fd (its epoll or eventfd).
    fn watch(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: `ev` is valid for the call; the fd is the member's, alive as
        // long as the member (epoll forgets it when it closes).
        unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    fn join(&self, m: Member, fd: Option<RawFd>) {
        if let Some(fd) = fd {
            self.watch(fd);
        }
        let mut members = self.members.lock();
        members.retain(|m| match m {
            Member::Cq(w) => w.strong_count() > 0,
            Member::Cntr(w) => w.strong_count() > 0,
            Member::Eq(w) => w.strong_count() > 0,
        });
        members.push(m);
        self.refs.get();
    }

    /// A CQ opened with `FI_WAIT_SET` (it has a [`crate::wait_fd::WaitFd`]).
    pub fn join_cq(&self, cq: &Arc<CqShared>) {
        self.join(Member::Cq(Arc::downgrade(cq)), cq.wait.as_ref().map(|w| w.fd()));
    }

    /// A counter opened with `FI_WAIT_SET`.
    pub fn join_cntr(&self, c: &Arc<CntrShared>) {
        self.join(Member::Cntr(Arc::downgrade(c)), c.wait.as_ref().map(|w| w.fd()));
    }

    /// An EQ opened with `FI_WAIT_SET`.
    pub fn join_eq(&self, eq: &Arc<EqQueue>) {
        self.join(Member::Eq(Arc::downgrade(eq)), eq.wait_fd());
    }

    /// One round of progress of every member; whether any has something, and
    /// the endpoints bound to the members (what a sleeper must arm and whose
    /// timers bound the sleep).
    fn poll_members(&self) -> (bool, SmallVec<[Arc<dyn Progress>; 4]>) {
        let live: SmallVec<[Member; 4]> = self
            .members
            .lock()
            .iter()
            .map(|m| match m {
                Member::Cq(w) => Member::Cq(w.clone()),
                Member::Cntr(w) => Member::Cntr(w.clone()),
                Member::Eq(w) => Member::Eq(w.clone()),
            })
            .collect();
        let mut ready = false;
        let mut eps: SmallVec<[Arc<dyn Progress>; 4]> = SmallVec::new();
        // Outside the set's lock: progress takes endpoint locks, and another
        // thread may be opening a member meanwhile.
        for m in live {
            match m {
                Member::Cq(w) => {
                    let Some(cq) = w.upgrade() else { continue };
                    cq.progress_now();
                    ready |= !cq.is_empty_now();
                    eps.extend(cq.endpoints());
                }
                Member::Cntr(w) => {
                    let Some(c) = w.upgrade() else { continue };
                    c.progress_now();
                    ready |= c.changed_unseen();
                    eps.extend(c.endpoints());
                }
                Member::Eq(w) => {
                    let Some(eq) = w.upgrade() else { continue };
                    ready |= !eq.is_empty();
                }
            }
        }
        (ready, eps)
    }
}

#[repr(C)]
pub struct WaitSet {
    pub fid: fi::fid_wait,
    fabric: *const Fabric,
    pub shared: Arc<WaitSetShared>,
}

// SAFETY: #[repr(C)] with fid_wait (which starts with fid) first.
unsafe impl FidObject for WaitSet {
    const CLASS: u32 = fi::FI_CLASS_WAIT;
}

static WAIT_FI_OPS: fi::fi_ops = fid::fi_ops(wait_close, None, Some(wait_control));
static WAIT_OPS: fi::fi_ops_wait =
    fi::fi_ops_wait { size: std::mem::size_of::<fi::fi_ops_wait>(), wait: Some(wait_wait) };

/// The set a member's attributes name (`wait_obj = FI_WAIT_SET`).
///
/// # Safety
/// `ws` is null or a fid the application got from libfabric.
pub unsafe fn set_of(ws: *mut fi::fid_wait) -> Result<Arc<WaitSetShared>> {
    non_null!(ws);
    // SAFETY: per contract; from_fid checks the class before the cast.
    let w = unsafe { WaitSet::from_fid(ws as *const fi::fid) }?;
    Ok(w.shared.clone())
}

entry! {
    /// `fi_wait_open`: `FI_WAIT_UNSPEC` or `FI_WAIT_FD` (the same object: an
    /// epoll fd). `FI_WAIT_MUTEX_COND` and `FI_WAIT_POLLFD` are not offered.
    fn rdmx_wait_open(fabric: *mut fi::fid_fabric, attr: *mut fi::fi_wait_attr, out: *mut *mut fi::fid_wait => Out<*mut fi::fid_wait>) -> i32 {
        non_null!(attr);
        // SAFETY: libfabric passes our fabric.
        let fab = unsafe { fabric::fabric_ref(fabric) }?;
        // SAFETY: checked non-null; the application's attributes.
        let attr = unsafe { &*attr };
        match attr.wait_obj {
            fi::FI_WAIT_UNSPEC | fi::FI_WAIT_FD => {}
            _ => return Err(Error::NoSys),
        }
        if attr.flags != 0 {
            return Err(Error::BadFlags);
        }
        // SAFETY: a plain syscall; the fd is owned below.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(Error::Io(format!("epoll_create1: {}", std::io::Error::last_os_error())));
        }
        // SAFETY: a fresh fd nobody else owns.
        let epoll = unsafe { OwnedFd::from_raw_fd(epoll) };
        fab.children.get();
        let w = fid::leak(WaitSet {
            fid: fi::fid_wait { fid: fid::new_fid(fi::FI_CLASS_WAIT, std::ptr::null_mut(), &WAIT_FI_OPS), ops: &WAIT_OPS as *const _ as *mut _ },
            fabric: fab,
            shared: Arc::new(WaitSetShared { epoll, members: Mutex::new(Vec::new()), refs: Refs::default() }),
        });
        out.set(w as *mut fi::fid_wait);
        Ok(0)
    }
}

entry! {
    fn wait_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let w = unsafe { WaitSet::from_fid(f) }?;
        w.shared.refs.busy()?;
        // SAFETY: the fabric outlives its children (its close checks the count).
        unsafe { (*w.fabric).children.put() };
        // SAFETY: created by fid::leak in rdmx_wait_open.
        unsafe { fid::retire(w as *const WaitSet) };
        Ok(0)
    }
}

entry! {
    fn wait_control(f: *mut fi::fid, command: i32, arg: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let w = unsafe { WaitSet::from_fid(f) }?;
        match command as u32 {
            fi::FI_GETWAIT => {
                non_null!(arg);
                // SAFETY: for an fd wait object, FI_GETWAIT's argument is an int *.
                unsafe { *(arg as *mut libc::c_int) = w.shared.epoll.as_raw_fd() };
                Ok(0)
            }
            fi::FI_GETWAITOBJ => {
                non_null!(arg);
                // SAFETY: FI_GETWAITOBJ's argument is an enum fi_wait_obj *.
                unsafe { *(arg as *mut fi::fi_wait_obj) = fi::FI_WAIT_FD };
                Ok(0)
            }
            _ => Err(Error::NoSys),
        }
    }
}

entry! {
    /// `fi_wait`: 0 once a member has something, `-FI_ETIMEDOUT` after
    /// `timeout` ms (negative: no limit) without.
    fn wait_wait(waitset: *mut fi::fid_wait => &WaitSet, timeout: i32) -> i32 {
        let deadline = (timeout >= 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            let (ready, eps) = waitset.shared.poll_members();
            if ready {
                return Ok(0);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(-(fi::FI_ETIMEDOUT as i32));
            }
            // Slices of at most 100 ms: a member opened meanwhile joins the
            // next round.
            let wait = deadline.map(|d| d - now).unwrap_or(Duration::from_millis(100)).min(Duration::from_millis(100));
            progress::wait_any_or_fd(&eps, Some(waitset.shared.epoll.as_raw_fd()), wait);
        }
    }
}

/// `fi_trywait` on a wait set: progresses its members; sleeping on its fd is
/// safe only if none has something and no device has input waiting.
pub fn trywait(w: &WaitSet) -> Result<()> {
    let (ready, eps) = w.shared.poll_members();
    // Every endpoint must arm its device, so no short-circuit.
    let mut armed = true;
    for ep in &eps {
        armed &= ep.try_wait();
    }
    if ready || !armed {
        Err(Error::Again)
    } else {
        Ok(())
    }
}
