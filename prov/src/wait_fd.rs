//! The fd wait object of a CQ or counter (`FI_WAIT_FD`, and members of wait
//! sets).
use crate::error::{Error, Result};
use std::os::fd::RawFd;

/// The wait object of a CQ or counter opened with `FI_WAIT_FD`: an epoll fd
/// over the bound endpoints' device fds plus an eventfd that is readable while
/// completions are queued / the counter changed unseen (so events found by the
/// background progress thread also wake a sleeper).
pub struct WaitFd {
    epoll: libc::c_int,
    event: libc::c_int,
}

impl WaitFd {
    /// The fd handed out by `fi_control(FI_GETWAIT)`.
    pub fn fd(&self) -> RawFd {
        self.epoll
    }

    /// Whether the eventfd is currently set.
    pub fn is_set(&self) -> bool {
        let mut p = libc::pollfd { fd: self.event, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout.
        unsafe { libc::poll(&mut p, 1, 0) > 0 }
    }

    pub fn new() -> Result<WaitFd> {
        // SAFETY: plain syscalls; the fds are owned by the returned value.
        let (epoll, event) = unsafe {
            (libc::epoll_create1(libc::EPOLL_CLOEXEC), libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK))
        };
        if epoll < 0 || event < 0 {
            // SAFETY: closing only what was opened.
            unsafe {
                if epoll >= 0 {
                    libc::close(epoll);
                }
                if event >= 0 {
                    libc::close(event);
                }
            }
            return Err(Error::Io("cannot create the CQ wait fd".into()));
        }
        let w = WaitFd { epoll, event };
        w.add(event);
        Ok(w)
    }

    /// Watches `fd` for input (a bound endpoint's device).
    pub fn add(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        // SAFETY: `ev` is valid for the call; a failure (e.g. already added) is
        // harmless, the fd is then watched already or cannot be.
        unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    pub fn set(&self, ready: bool) {
        if ready {
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a valid u64 into our eventfd.
            unsafe { libc::write(self.event, &one as *const u64 as *const libc::c_void, 8) };
        } else {
            let mut v: u64 = 0;
            // SAFETY: reads at most 8 bytes into a valid u64 (non-blocking).
            unsafe { libc::read(self.event, &mut v as *mut u64 as *mut libc::c_void, 8) };
        }
    }
}

impl Drop for WaitFd {
    fn drop(&mut self) {
        // SAFETY: both fds are owned by this value and closed once.
        unsafe {
            libc::close(self.epoll);
            libc::close(self.event);
        }
    }
}
