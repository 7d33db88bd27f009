//! Poll sets (`fi_poll_open`, `fi_poll_add`, `fi_poll_del`, `fi_poll`, see
//! fi_poll(3)): one call that drives progress of every CQ and counter in the set
//! and reports the context of each one that has something new — a CQ with
//! entries queued, a counter whose value or error count changed since the last
//! `fi_poll` reported it.
use crate::cntr::Cntr;
use crate::cntr_queue::CntrShared;
use crate::cq::Cq;
use crate::cq_queue::CqShared;
use crate::domain::Domain;
use crate::entry::{entry, Out};
use crate::error::Error;
use crate::fid::{self, FidObject, Refs};
use libfabric_sys as fi;
use parking_lot::Mutex;
use std::sync::Arc;

enum Member {
    Cq { fid: usize, context: usize, shared: Arc<CqShared>, bound: *const Refs },
    Cntr { fid: usize, context: usize, shared: Arc<CntrShared>, bound: *const Refs, seen: (u64, u64) },
}

// SAFETY: the raw pointers are the members' reference counts, which outlive the
// membership (a member cannot close while in the set: its count is held).
unsafe impl Send for Member {}

impl Member {
    fn fid(&self) -> usize {
        match self {
            Member::Cq { fid, .. } | Member::Cntr { fid, .. } => *fid,
        }
    }

    fn bound(&self) -> *const Refs {
        match self {
            Member::Cq { bound, .. } | Member::Cntr { bound, .. } => *bound,
        }
    }
}

#[repr(C)]
pub struct Poll {
    pub fid: fi::fid_poll,
    domain: *const Domain,
    members: Mutex<Vec<Member>>,
}

// SAFETY: #[repr(C)] with fid_poll first.
unsafe impl FidObject for Poll {
    const CLASS: u32 = fi::FI_CLASS_POLL;
}

static POLL_FI_OPS: fi::fi_ops = fid::fi_ops(poll_close, None, None);
static POLL_OPS: fi::fi_ops_poll = fi::fi_ops_poll {
    size: std::mem::size_of::<fi::fi_ops_poll>(),
    poll: Some(poll_poll),
    poll_add: Some(poll_add),
    poll_del: Some(poll_del),
};

entry! {
    fn rdmx_poll_open(domain: *mut fi::fid_domain => &Domain, attr: *mut fi::fi_poll_attr, out: *mut *mut fi::fid_poll => Out<*mut fi::fid_poll>) -> i32 {
        if !attr.is_null() {
            // SAFETY: checked non-null; the application's attributes.
            if unsafe { (*attr).flags } != 0 {
                return Err(Error::BadFlags);
            }
        }
        domain.children.get();
        let p = fid::leak(Poll {
            fid: fi::fid_poll { fid: fid::new_fid(fi::FI_CLASS_POLL, std::ptr::null_mut(), &POLL_FI_OPS), ops: &POLL_OPS as *const _ as *mut _ },
            domain,
            members: Mutex::new(Vec::new()),
        });
        out.set(p as *mut fi::fid_poll);
        Ok(0)
    }
}

entry! {
    fn poll_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let p = unsafe { Poll::from_fid(f) }?;
        for m in p.members.lock().drain(..) {
            // SAFETY: the member's count, held since poll_add (see Member).
            unsafe { (*m.bound()).put() };
        }
        // SAFETY: the domain outlives its children (its close checks the count).
        unsafe { (*p.domain).children.put() };
        // SAFETY: created by fid::leak in rdmx_poll_open.
        unsafe { fid::retire(p as *const Poll) };
        Ok(0)
    }
}

entry! {
    fn poll_add(pollset: *mut fi::fid_poll => &Poll, event_fid: *mut fi::fid, flags: u64) -> i32 {
        let _ = flags;
        crate::entry::non_null!(event_fid);
        let mut members = pollset.members.lock();
        if members.iter().any(|m| m.fid() == event_fid as usize) {
            return Err(Error::Inval("already in the poll set"));
        }
        // SAFETY: non-null; libfabric hands us a fid of some provider's object.
        let class = unsafe { (*event_fid).fclass } as u32;
        // SAFETY: the fid's context, an opaque value.
        let context = unsafe { (*event_fid).context } as usize;
        let m = match class {
            fi::FI_CLASS_CQ => {
                // SAFETY: class checked; our CQ.
                let cq = unsafe { Cq::from_fid(event_fid) }?;
                cq.bound.get();
                Member::Cq { fid: event_fid as usize, context, shared: cq.shared.clone(), bound: &cq.bound }
            }
            fi::FI_CLASS_CNTR => {
                // SAFETY: class checked; our counter.
                let c = unsafe { Cntr::from_fid(event_fid) }?;
                c.bound.get();
                Member::Cntr { fid: event_fid as usize, context, shared: c.shared.clone(), bound: &c.bound, seen: c.shared.snapshot() }
            }
            _ => return Err(Error::Inval("only CQs and counters join a poll set")),
        };
        members.push(m);
        Ok(0)
    }
}

entry! {
    fn poll_del(pollset: *mut fi::fid_poll => &Poll, event_fid: *mut fi::fid, flags: u64) -> i32 {
        let _ = flags;
        let mut members = pollset.members.lock();
        let i = members.iter().position(|m| m.fid() == event_fid as usize).ok_or(Error::NoEnt)?;
        let m = members.remove(i);
        // SAFETY: the member's count, held since poll_add.
        unsafe { (*m.bound()).put() };
        Ok(0)
    }
}

entry! {
    fn poll_poll(pollset: *mut fi::fid_poll => &Poll, context: *mut *mut libc::c_void, count: i32) -> i32 {
        let mut members = pollset.members.lock();
        let mut n = 0usize;
        let room = usize::try_from(count).unwrap_or(0);
        for m in members.iter_mut() {
            let ready = match m {
                Member::Cq { shared, .. } => {
                    shared.progress_now();
                    !shared.is_empty_now()
                }
                Member::Cntr { shared, seen, .. } => {
                    shared.progress_now();
                    let now = shared.snapshot();
                    let changed = now != *seen;
                    if changed && n < room {
                        *seen = now;
                    }
                    changed
                }
            };
            if ready {
                if n < room && !context.is_null() {
                    let ctx = match m {
                        Member::Cq { context, .. } | Member::Cntr { context, .. } => *context,
                    };
                    // SAFETY: the application's array of `count` context slots.
                    unsafe { *context.add(n) = ctx as *mut libc::c_void };
                }
                n += 1;
            }
        }
        Ok(n.min(room) as i32)
    }
}
