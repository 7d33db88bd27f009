//! The files behind the shared-memory device: how a ring's file is named and
//! mapped, its wake-up FIFO, and the removal of ring files whose owner is gone
//! (those of dead processes of this host when a ring is opened, this process's
//! own when it exits without closing them). It is apart from the device because
//! it deals in files and the process's life, not in datagrams; the exit-time
//! cleanup in particular must take no lock and allocate nothing.
//!
//! Unsafe here: `mmap`/`munmap` of ring files, `unlink` at exit, and the lock-free list of open rings exit walks.
#![allow(unsafe_code)]

use super::ring::Ring;
use super::{host_id, DEFAULT_DIR};
use rdm::device::ShmAddr;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An owned shared mapping of a whole file.
pub(super) struct Mapping {
    pub(super) ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value (unmapped once, in Drop) and has no
// thread affinity.
unsafe impl Send for Mapping {}
// SAFETY: nothing reaches the memory through a `&Mapping` (its pointer is only
// read to make Rings, which use atomics); shared, it is only kept alive.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, shared; `populate` creates every page table
    /// entry now rather than on first touch.
    pub(super) fn map(file: &File, len: usize, populate: bool) -> io::Result<Mapping> {
        let flags = libc::MAP_SHARED | if populate { libc::MAP_POPULATE } else { 0 };
        // SAFETY: a fresh shared mapping of an open file; no existing memory is
        // affected. The result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, file.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr as *mut u8, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr/len` is exactly the mapping created in `map`, unmapped only
        // here; Rings pointing into it are dropped first (field order / owners).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A ring together with the mapping it lives in (ring first: dropped first).
/// The mapping is shared with the ring's input probe ([`RingProbe`]), which
/// may outlive the device.
pub(super) struct Segment {
    pub(super) ring: Ring,
    pub(super) map: Arc<Mapping>,
}

/// The lock-free input check of a receive ring
/// ([`Device::input_probe`](rdm::device::Device::input_probe)): a view of the
/// ring and the mapping it lives in, kept mapped while the probe lives.
pub(super) struct RingProbe {
    ring: Ring,
    _map: Arc<Mapping>,
}

impl RingProbe {
    pub(super) fn of(seg: &Segment) -> RingProbe {
        RingProbe { ring: seg.ring.view(), _map: seg.map.clone() }
    }
}

// SAFETY: the probe only calls `Ring::ready`, which reads the ring's header and
// one slot header through atomics (memory other processes write concurrently
// anyway); the mapping it points into is held by `_map`.
unsafe impl Sync for RingProbe {}

impl rdm::device::InputProbe for RingProbe {
    #[inline]
    fn may_have_input(&self) -> bool {
        self.ring.ready()
    }
}

/// The file name of the ring of `addr`.
pub fn segment_name(addr: &ShmAddr) -> String {
    format!("rdmx-{:016x}-{}-{:016x}", addr.host_id, addr.pid, addr.ring_id)
}

/// Removes ring files (and FIFOs) of this host whose owner process is gone.
/// Returns how many rings were removed.
pub fn cleanup_stale(dir: &Path) -> usize {
    let prefix = format!("rdmx-{:016x}-", host_id());
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(&prefix) else { continue };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else { continue };
        if !pid_exists(pid) && std::fs::remove_file(e.path()).is_ok() && !name.ends_with(".fifo") {
            removed += 1;
        }
    }
    removed
}

/// A FIFO's path, read end and our own write end.
pub(super) type FifoFiles = (PathBuf, File, File);

pub(super) fn create_fifo(path: &Path) -> io::Result<(File, File)> {
    let _ = std::fs::remove_file(path);
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(io::Error::from)?;
    let rx = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let tx = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    Ok((rx, tx))
}

pub(super) fn fifo_path(ring: &Path) -> PathBuf {
    let mut p = ring.as_os_str().to_owned();
    p.push(".fifo");
    PathBuf::from(p)
}

/// Whether a process `pid` exists at all (a zombie counts): the conservative
/// test for removing a ring file, which a not yet reaped peer may still own.
fn pid_exists(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// A ring of this process in [`DEFAULT_DIR`] that is open now: its ring id, 0
/// when the entry is free. Entries form a list that only grows (a closed ring's
/// entry is reused by the next one opened), so that [`unlink_own_at_exit`] can
/// walk it with no lock: it runs where the process is ending, possibly on a
/// thread interrupted while it held any lock of rdmx or of the allocator.
pub struct OpenRing {
    pub(super) ring_id: std::sync::atomic::AtomicU64,
    next: *const OpenRing,
}

// SAFETY: `next` is written once before the entry is published and never after;
// entries are leaked, so every pointer stays valid for the process's life.
unsafe impl Sync for OpenRing {}

static OPEN_RINGS: std::sync::atomic::AtomicPtr<OpenRing> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Records an open ring (ring id 0, which only a test can ask for, is not
/// recorded: 0 marks a free entry).
pub(super) fn remember_open_ring(ring_id: u64) -> Option<&'static OpenRing> {
    use std::sync::atomic::Ordering as O;
    if ring_id == 0 {
        return None;
    }
    let mut p = OPEN_RINGS.load(O::Acquire);
    while !p.is_null() {
        // SAFETY: entries are leaked and never freed (see OpenRing).
        let e: &'static OpenRing = unsafe { &*p };
        if e.ring_id.compare_exchange(0, ring_id, O::AcqRel, O::Relaxed).is_ok() {
            return Some(e);
        }
        p = e.next as *mut OpenRing;
    }
    let e: &'static mut OpenRing =
        Box::leak(Box::new(OpenRing { ring_id: std::sync::atomic::AtomicU64::new(ring_id), next: std::ptr::null() }));
    let mut head = OPEN_RINGS.load(O::Acquire);
    loop {
        e.next = head;
        match OPEN_RINGS.compare_exchange(head, e, O::AcqRel, O::Acquire) {
            Ok(_) => return Some(e),
            Err(now) => head = now,
        }
    }
}

/// Removes the files of every ring this process has open in [`DEFAULT_DIR`]
/// (and their FIFOs), for a process that ends without closing its endpoints:
/// the kernel frees memory and descriptors at exit, never files. Takes no lock
/// and allocates nothing, so it may run from libfabric's destructor on a thread
/// that `exit()` interrupted anywhere. The rings' mappings stay valid; senders
/// that already mapped a ring find its owner's pid gone, new ones find no
/// file: both see the peer unreachable. A forked child (whose pid differs)
/// names files that are not there, so it never removes its parent's rings.
/// Returns how many rings it removed.
pub fn unlink_own_at_exit() -> usize {
    use std::sync::atomic::Ordering as O;
    let mut p = OPEN_RINGS.load(O::Acquire);
    if p.is_null() {
        return 0;
    }
    let (host, pid) = (host_id(), std::process::id());
    let mut removed = 0;
    while !p.is_null() {
        // SAFETY: entries are leaked and never freed (see OpenRing).
        let e = unsafe { &*p };
        let ring_id = e.ring_id.load(O::Acquire);
        if ring_id != 0 {
            let mut path = ExitPath::default();
            path.push(DEFAULT_DIR.as_bytes());
            path.push(b"/rdmx-");
            path.hex16(host);
            path.push(b"-");
            path.dec(pid);
            path.push(b"-");
            path.hex16(ring_id);
            // SAFETY: `path` is NUL-terminated (ExitPath::c_str).
            if unsafe { libc::unlink(path.c_str()) } == 0 {
                removed += 1;
            }
            path.push(b".fifo");
            // SAFETY: as above.
            unsafe { libc::unlink(path.c_str()) };
        }
        p = e.next as *mut OpenRing;
    }
    removed
}

/// A path built on the stack (exit-time cleanup and the liveness check
/// allocate nothing).
pub(super) struct ExitPath {
    pub(super) buf: [u8; 96],
    pub(super) len: usize,
}

impl Default for ExitPath {
    fn default() -> ExitPath {
        ExitPath { buf: [0; 96], len: 0 }
    }
}

impl ExitPath {
    // Inline, as it was beside `pid_alive` (which runs on the send path where a
    // peer has no pidfd).
    #[inline]
    pub(super) fn push(&mut self, b: &[u8]) {
        let n = b.len().min(self.buf.len() - 1 - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
    }

    fn hex16(&mut self, v: u64) {
        let mut d = [0u8; 16];
        for (i, c) in d.iter_mut().enumerate() {
            *c = b"0123456789abcdef"[(v >> (60 - 4 * i)) as usize & 0xf];
        }
        self.push(&d);
    }

    pub(super) fn dec(&mut self, mut v: u32) {
        let mut d = [0u8; 10];
        let mut i = d.len();
        loop {
            i -= 1;
            d[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.push(&d[i..]);
    }

    /// The path, NUL-terminated (the last byte of `buf` is never written).
    fn c_str(&mut self) -> *const libc::c_char {
        self.buf[self.len] = 0;
        self.buf.as_ptr().cast()
    }
}
