//! The shared-memory device: one receive ring per endpoint in a `/dev/shm` file,
//! written by any number of local senders without locks, read by its owner.
//!
//! * **Naming.** The ring of endpoint `ShmAddr { host_id, pid, ring_id }` lives in
//!   `/dev/shm/rdmx-<host_id:016x>-<pid>-<ring_id:016x>`, so a sender derives the
//!   file from the address alone. Beside it, `<name>.fifo` is a named pipe used as
//!   the wake-up fd ([`Device::wait_fd`]).
//! * **The ring** is a bounded multi-producer single-consumer queue after Dmitry
//!   Vyukov's bounded MPMC queue: a `tail` counter that producers advance with a
//!   CAS, and per slot a sequence word that says whether the slot is free for
//!   position `p` (`seq == p`), holds the datagram of position `p`
//!   (`seq == p + 1`), or is still in use from the previous lap. A slot carries the
//!   sender's pid and ring id (the source address), the length and up to `mtu`
//!   payload bytes. The receiver lends the payload straight out of shared memory
//!   and frees the slot after the callback: no copy on receive.
//! * **Senders** map a peer's ring lazily on the first datagram to it and keep the
//!   mapping until the device is dropped. A full ring is back-pressure (short
//!   count); the device is `reliable` and `ordered` (per sender, one ring).
//! * **Holding senders back.** A receiver whose engine paused (its
//!   unexpected-message limit) sets `held_back` in its ring header
//!   ([`Device::hold_back_senders`]); a sender's `send_gathered` then writes no
//!   message straight in, and the engine sends that peer sequenced messages,
//!   which the receiver's window holds. The zero-window ACK says the same,
//!   but only to a sender that reads its own ring.
//! * **Liveness.** A ring whose owner closed it, whose file is gone, or whose owner
//!   pid no longer exists is [`DeviceError::Unreachable`]. The owner unlinks its
//!   files on drop; files of dead processes of this host are removed by the next
//!   [`ShmDevice::open`].
//! * **Wake-ups.** A receiver about to sleep calls [`Device::prepare_wait`], which
//!   sets an `armed` flag in the ring header; the next sender clears it and
//!   writes one byte into the FIFO, which makes the fd readable. A receiver that
//!   only polls never arms, so neither it nor its senders make a system call per
//!   message.
//! * **Remote read** uses `process_vm_readv` (Linux CMA): one copy from the peer
//!   process straight into the destination. It needs ptrace access to the peer
//!   (same user, and Yama `ptrace_scope` 0, or a parent); [`ShmDevice::probe_remote_read`]
//!   checks a given peer, and a refused read reports [`DeviceError::Unsupported`].
//! * **Reads end with the sender's endpoint.** The copy names a process, not an
//!   endpoint: a process outlives the endpoint it closed, and libfabric gives
//!   the application its buffers back when `fi_close(ep)` returns (fi_endpoint(3),
//!   2.2 and later). A rendezvous read ([`RemoteReads::post_read`]) therefore counts
//!   only if the sender's ring was still open *after* the copy: the closing
//!   device stores `closed` and fences before it returns, the reader fences
//!   after its copy and then loads `closed` (see [`ShmDevice::sender_closed`]);
//!   a read that finds the ring closed (or gone) fails with
//!   [`DeviceError::Unreachable`], and its receive with it
//!   ([`ShmStats::reads_after_close`]), whatever bytes it copied.
//! * **Checked with loom.** Built with `RUSTFLAGS="--cfg loom"`, the ring's atomics
//!   are loom's and `loom_tests` explore every interleaving (up to a preemption
//!   bound) of two producers, the consumer and the wake-up handshake, with every
//!   payload access checked for a data race; weakening any Release/Acquire/SeqCst
//!   in the ring makes them fail (`scripts/test.sh` runs them). A proptest
//!   (`ring_matches_vecdeque`) checks the ring against a bounded `VecDeque` model.
//!
//! Limits: a sender that dies between claiming a slot and publishing it wedges the
//! ring at that slot (its receiver then sees no more data: the engine's peer
//! timeout reports it). Ring geometry is chosen by the receiver; a sender sending
//! more than the receiver's MTU gets [`DeviceError::TooLarge`].
#![allow(unsafe_code)]

pub use crate::host::host_id;
use rdm::device::{DevAddr, Device, DeviceCaps, DeviceError, ReadDone, ReadRun, RemoteReads, ShmAddr, TxDatagram};
use rdm::Instant;
use rustc_hash::FxHashMap;
use std::collections::hash_map::Entry;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use sync::{fence, AtomicU32, AtomicU64, Ordering};

/// The atomics the ring is made of: the machine's, or under `cfg(all(test, loom))`
/// loom's, so that the model checker sees every access (see `loom_tests`).
mod sync {
    #[cfg(all(test, loom))]
    pub(super) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
    pub(super) use std::sync::atomic::Ordering;
    #[cfg(not(all(test, loom)))]
    pub(super) use std::sync::atomic::{fence, AtomicU32, AtomicU64};
}

/// Default largest datagram: 8 KiB and room for the headers (rdm's 48 bytes,
/// the message layer's), so that an 8 KiB message, a size applications favour,
/// is one ring slot and not two (`mpi_bench`'s 8 KiB streaming ran at 0.76x of
/// OpenMPI's vader with two).
pub const DEFAULT_MTU: usize = 8192 + 128;
/// Default slots per ring (a power of two).
pub const DEFAULT_SLOTS: usize = 256;
/// Where rings live by default.
pub const DEFAULT_DIR: &str = "/dev/shm";

const MAGIC: u64 = u64::from_le_bytes(*b"RDMXSHM1");
/// 2: the rdm datagrams in the slots go without a checksum (rdm `PROTOCOL.md`
/// §2.4), which a version-1 peer would drop as malformed: the two never attach.
const VERSION: u32 = 2;
#[cfg(not(all(test, loom)))]
const HEADER_SIZE: usize = 256;
#[cfg(not(all(test, loom)))]
const SLOT_HDR: usize = 32;
// Loom's atomics are bigger than the machine's: under loom the layout grows to fit
// them (such rings only live on the heap of a model, never in a shared file).
#[cfg(all(test, loom))]
const HEADER_SIZE: usize = (std::mem::size_of::<Header>() + 63) & !63;
#[cfg(all(test, loom))]
const SLOT_HDR: usize = (std::mem::size_of::<SlotHdr>() + 7) & !7;

/// The ring header at offset 0 of the segment. Every field is atomic: the memory
/// is shared with other processes.
#[repr(C)]
struct Header {
    /// [`MAGIC`] once the owner finished initialising (release store).
    magic: AtomicU64,
    version: AtomicU32,
    slot_count: AtomicU32,
    slot_size: AtomicU32,
    mtu: AtomicU32,
    owner_pid: AtomicU32,
    /// Set by the owner before it unlinks the ring.
    closed: AtomicU32,
    ring_id: AtomicU64,
    /// Where the owner mapped this header (for the remote-read probe).
    owner_hdr_addr: AtomicU64,
    /// 1 while the owner holds its senders back ([`Device::hold_back_senders`]:
    /// its engine paused at its unexpected-message limit): senders then
    /// write no message straight in (`send_gathered`) and send sequenced
    /// ones only, which its window holds. Zero in a ring of an older rdmx
    /// (the file is created zeroed), which never sets it.
    held_back: AtomicU32,
    _pad0: [u8; 12],
    /// 1 when the consumer wants a byte in the FIFO on the next arrival.
    armed: AtomicU32,
    _pad1: [u8; 60],
    /// Next position producers claim.
    tail: AtomicU64,
    _pad2: [u8; 56],
    /// Next position the consumer reads.
    head: AtomicU64,
    _pad3: [u8; 56],
}

#[cfg(not(all(test, loom)))]
const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);

/// The header of each slot; the payload follows.
#[repr(C)]
struct SlotHdr {
    seq: AtomicU64,
    len: AtomicU32,
    src_pid: AtomicU32,
    src_ring: AtomicU64,
    _pad: AtomicU64,
    /// Stands for the payload under loom: every payload access goes through it
    /// ([`SlotHdr::writing`], [`SlotHdr::reading`]), so the model checker reports
    /// a write that is not ordered after the previous read (or the reverse).
    #[cfg(all(test, loom))]
    payload: loom::cell::UnsafeCell<()>,
}

#[cfg(not(all(test, loom)))]
const _: () = assert!(std::mem::size_of::<SlotHdr>() == SLOT_HDR);

// Loom rings are built in cache-line-aligned memory (HEADER_SIZE and slot sizes
// are multiples of 64).
#[cfg(all(test, loom))]
const _: () = assert!(std::mem::align_of::<Header>() <= 64 && std::mem::align_of::<SlotHdr>() <= 64);

#[cfg(all(test, loom))]
impl Header {
    /// A header of fresh loom atomics (values are set by [`Ring::init`]).
    fn new_loom() -> Header {
        Header {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            slot_count: AtomicU32::new(0),
            slot_size: AtomicU32::new(0),
            mtu: AtomicU32::new(0),
            owner_pid: AtomicU32::new(0),
            closed: AtomicU32::new(0),
            ring_id: AtomicU64::new(0),
            owner_hdr_addr: AtomicU64::new(0),
            held_back: AtomicU32::new(0),
            _pad0: [0; 12],
            armed: AtomicU32::new(0),
            _pad1: [0; 60],
            tail: AtomicU64::new(0),
            _pad2: [0; 56],
            head: AtomicU64::new(0),
            _pad3: [0; 56],
        }
    }
}

impl SlotHdr {
    /// A slot header of fresh loom atomics (values are set by [`Ring::init`]).
    #[cfg(all(test, loom))]
    fn new_loom() -> SlotHdr {
        SlotHdr {
            seq: AtomicU64::new(0),
            len: AtomicU32::new(0),
            src_pid: AtomicU32::new(0),
            src_ring: AtomicU64::new(0),
            _pad: AtomicU64::new(0),
            payload: loom::cell::UnsafeCell::new(()),
        }
    }

    /// Runs `f`, which writes this slot's payload. Just `f()` outside loom.
    #[inline(always)]
    fn writing<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(all(test, loom))]
        return self.payload.with_mut(|_| f());
        #[cfg(not(all(test, loom)))]
        f()
    }

    /// Runs `f`, which reads this slot's payload. Just `f()` outside loom.
    #[inline(always)]
    fn reading<R>(&self, f: impl FnOnce() -> R) -> R {
        #[cfg(all(test, loom))]
        return self.payload.with(|_| f());
        #[cfg(not(all(test, loom)))]
        f()
    }
}

/// Bytes per slot for `mtu`: header + payload, rounded to a cache line.
fn slot_size(mtu: usize) -> usize {
    (SLOT_HDR + mtu + 63) & !63
}

/// Bytes of a segment with `slots` slots of `mtu`.
pub fn segment_size(slots: usize, mtu: usize) -> usize {
    HEADER_SIZE + slots * slot_size(mtu)
}

/// A view of a ring in memory someone else owns (a mapping or, in tests, a heap
/// buffer).
struct Ring {
    base: *mut u8,
    slots: u64,
    slot_size: usize,
    mtu: usize,
}

// SAFETY: a Ring is a pair of pointers into memory shared between processes and
// accessed only through atomics or slots owned through the sequence protocol; it
// has no thread affinity. The memory outlives the Ring (see `init` / `attach`).
unsafe impl Send for Ring {}

impl Ring {
    /// Initialises a ring in `len` bytes at `base` and publishes it.
    ///
    /// # Safety
    /// `base` is 8-byte aligned, valid for reads and writes of `len` bytes for the
    /// life of the returned `Ring`, and nobody else writes it during the call.
    unsafe fn init(base: *mut u8, len: usize, slots: usize, mtu: usize, pid: u32, ring_id: u64) -> Ring {
        debug_assert!(slots.is_power_of_two() && len >= segment_size(slots, mtu));
        let ring = Ring { base, slots: slots as u64, slot_size: slot_size(mtu), mtu };
        // Under loom the atomics are objects of the model: construct them in place.
        // SAFETY: the header and every slot header lie inside the `len` bytes
        // (debug-asserted above) at offsets that are multiples of 64, and loom rings
        // are 64-aligned (`loom_tests::LoomRing`); nobody else accesses the memory
        // during the call, and `write` drops nothing.
        #[cfg(all(test, loom))]
        unsafe {
            std::ptr::write(base as *mut Header, Header::new_loom());
            for i in 0..ring.slots {
                std::ptr::write(ring.slot_ptr(i) as *mut SlotHdr, SlotHdr::new_loom());
            }
        }
        let h = ring.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.slot_count.store(slots as u32, Ordering::Relaxed);
        h.slot_size.store(ring.slot_size as u32, Ordering::Relaxed);
        h.mtu.store(mtu as u32, Ordering::Relaxed);
        h.owner_pid.store(pid, Ordering::Relaxed);
        h.closed.store(0, Ordering::Relaxed);
        h.ring_id.store(ring_id, Ordering::Relaxed);
        h.owner_hdr_addr.store(base as u64, Ordering::Relaxed);
        h.armed.store(0, Ordering::Relaxed);
        h.held_back.store(0, Ordering::Relaxed);
        h.tail.store(0, Ordering::Relaxed);
        h.head.store(0, Ordering::Relaxed);
        for i in 0..ring.slots {
            ring.slot(i).seq.store(i, Ordering::Relaxed);
        }
        h.magic.store(MAGIC, Ordering::Release);
        ring
    }

    /// Attaches to a ring someone initialised in `len` bytes at `base`.
    ///
    /// # Safety
    /// `base` is 8-byte aligned and valid for reads and writes of `len` bytes for
    /// the life of the returned `Ring`.
    unsafe fn attach(base: *mut u8, len: usize) -> Result<Ring, String> {
        if len < HEADER_SIZE {
            return Err(format!("segment of {len} bytes is too small"));
        }
        // SAFETY: `len >= HEADER_SIZE`, alignment and validity are the caller's
        // promise; Header is all atomics, so any bit pattern is valid.
        let h = unsafe { &*(base as *const Header) };
        if h.magic.load(Ordering::Acquire) != MAGIC {
            return Err("not an initialised rdmx ring".into());
        }
        if h.version.load(Ordering::Relaxed) != VERSION {
            return Err(format!("ring version {} (want {VERSION})", h.version.load(Ordering::Relaxed)));
        }
        let slots = h.slot_count.load(Ordering::Relaxed) as usize;
        let size = h.slot_size.load(Ordering::Relaxed) as usize;
        let mtu = h.mtu.load(Ordering::Relaxed) as usize;
        if !slots.is_power_of_two() || size != slot_size(mtu) || len < segment_size(slots, mtu) {
            return Err(format!("inconsistent ring geometry: {slots} slots of {size} bytes, mtu {mtu}, segment {len}"));
        }
        Ok(Ring { base, slots: slots as u64, slot_size: size, mtu })
    }

    fn header(&self) -> &Header {
        // SAFETY: `base` points at a live, aligned segment of at least HEADER_SIZE
        // bytes (init/attach contract); Header is all atomics.
        unsafe { &*(self.base as *const Header) }
    }

    fn slot_ptr(&self, pos: u64) -> *mut u8 {
        let i = (pos & (self.slots - 1)) as usize;
        // SAFETY: i < slots, so the slot lies inside the segment (geometry checked
        // in init/attach).
        unsafe { self.base.add(HEADER_SIZE + i * self.slot_size) }
    }

    fn slot(&self, pos: u64) -> &SlotHdr {
        // SAFETY: slot_ptr is inside the segment and 8-aligned (HEADER_SIZE and
        // slot_size are multiples of 64); SlotHdr is all atomics.
        unsafe { &*(self.slot_ptr(pos) as *const SlotHdr) }
    }

    /// Appends a datagram; false if the ring is full. `data.len() <= self.mtu`.
    #[cfg(test)]
    fn try_push(&self, src_pid: u32, src_ring: u64, data: &[u8]) -> bool {
        self.try_push_parts(src_pid, src_ring, &[data], data.len())
    }

    /// [`Ring::try_push`] of one datagram given as a gather list of `len`
    /// bytes in all, copied back to back into the cell.
    fn try_push_parts(&self, src_pid: u32, src_ring: u64, parts: &[&[u8]], len: usize) -> bool {
        debug_assert!(len <= self.mtu);
        let h = self.header();
        let mut pos = h.tail.load(Ordering::Relaxed);
        loop {
            let seq = self.slot(pos).seq.load(Ordering::Acquire);
            let diff = seq.wrapping_sub(pos) as i64;
            if diff == 0 {
                match h.tail.compare_exchange_weak(pos, pos.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(now) => pos = now,
                }
            } else if diff < 0 {
                return false;
            } else {
                pos = h.tail.load(Ordering::Relaxed);
            }
        }
        // Position `pos` is ours until we publish it.
        let slot = self.slot(pos);
        slot.len.store(len as u32, Ordering::Relaxed);
        slot.src_pid.store(src_pid, Ordering::Relaxed);
        slot.src_ring.store(src_ring, Ordering::Relaxed);
        slot.writing(|| {
            let mut at = 0;
            for p in parts {
                debug_assert!(at + p.len() <= len);
                // SAFETY: the payload area (mtu bytes after the slot header) is
                // inside the slot, and the parts add up to `len` <= mtu bytes;
                // the sequence protocol gives this producer exclusive use of the
                // slot until the release store below; the parts do not overlap
                // shared memory we write (they are the caller's buffers).
                unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), self.slot_ptr(pos).add(SLOT_HDR + at), p.len()) }
                at += p.len();
            }
        });
        slot.seq.store(pos.wrapping_add(1), Ordering::Release);
        true
    }

    /// Whether the next position holds a datagram (consumer side).
    fn ready(&self) -> bool {
        let pos = self.header().head.load(Ordering::Relaxed);
        self.slot(pos).seq.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Lends the next datagram to `f` and frees its slot; false if the ring is
    /// empty. Only the ring's single consumer may call this.
    fn pop(&self, f: &mut dyn FnMut(u32, u64, &[u8])) -> bool {
        let h = self.header();
        let pos = h.head.load(Ordering::Relaxed);
        let slot = self.slot(pos);
        if slot.seq.load(Ordering::Acquire) != pos.wrapping_add(1) {
            return false;
        }
        // The length comes from another process: never trust it past the slot.
        let len = (slot.len.load(Ordering::Relaxed) as usize).min(self.mtu);
        let pid = slot.src_pid.load(Ordering::Relaxed);
        let ring = slot.src_ring.load(Ordering::Relaxed);
        slot.reading(|| {
            // SAFETY: the payload lies inside the slot (len <= mtu); the acquire
            // load above saw the producer's release, so its bytes are visible, and
            // no well-behaved producer writes this slot again before the release
            // store below hands it back (a misbehaving process sharing the segment
            // can only garble bytes, which the engine treats as a corrupt datagram).
            let data = unsafe { std::slice::from_raw_parts(self.slot_ptr(pos).add(SLOT_HDR), len) };
            f(pid, ring, data)
        });
        slot.seq.store(pos.wrapping_add(self.slots), Ordering::Release);
        h.head.store(pos.wrapping_add(1), Ordering::Relaxed);
        true
    }

    /// Consumer: asks the next producer for a wake-up byte. Call it when the ring
    /// looked empty, then look again: the SeqCst store and fence pair with the
    /// producers' push + `fence(SeqCst)` + [`Ring::take_armed`] (Dekker: either the
    /// second look sees the datagram or its producer sees `armed`).
    fn arm(&self) {
        self.header().armed.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Producer, after its pushes and a `fence(SeqCst)`: whether the consumer
    /// armed, in which case this producer (alone) disarmed it and must wake it.
    fn take_armed(&self) -> bool {
        let h = self.header();
        h.armed.load(Ordering::Relaxed) != 0 && h.armed.swap(0, Ordering::AcqRel) != 0
    }
}

/// An owned shared mapping of a whole file.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value (unmapped once, in Drop) and has no
// thread affinity.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file`, shared; `populate` creates every page table
    /// entry now rather than on first touch.
    fn map(file: &File, len: usize, populate: bool) -> io::Result<Mapping> {
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
struct Segment {
    ring: Ring,
    _map: Mapping,
}

/// How to open a [`ShmDevice`].
#[derive(Clone, Debug)]
pub struct ShmConfig {
    /// The ring id (the provider passes the endpoint incarnation); `None` = random.
    pub ring_id: Option<u64>,
    /// Largest datagram (the receive slot size).
    pub mtu: usize,
    /// Slots in the receive ring (rounded up to a power of two).
    pub slots: usize,
    /// Directory of the ring files (all endpoints of a job must agree).
    pub dir: PathBuf,
    /// Provide a wake-up fd (a FIFO beside the ring).
    pub wait_fd: bool,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            ring_id: None,
            mtu: DEFAULT_MTU,
            slots: DEFAULT_SLOTS,
            dir: PathBuf::from(DEFAULT_DIR),
            wait_fd: true,
        }
    }
}

/// Counters of one [`ShmDevice`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ShmStats {
    pub sent: u64,
    pub received: u64,
    /// `send_batch` calls cut short by a full peer ring.
    pub ring_full: u64,
    /// Bytes written into peers' FIFOs to wake them.
    pub wakeups_sent: u64,
    pub remote_reads: u64,
    /// Posted reads failed because the sender's endpoint had closed before
    /// or while they copied (see the module docs): their receives fail.
    pub reads_after_close: u64,
    /// Messages not written straight in (`send_gathered`) because the
    /// peer held its senders back.
    pub held_back: u64,
    /// Times this endpoint started or stopped holding its senders back.
    pub held_back_changes: u64,
}

/// A peer's ring as this device sees it.
struct Peer {
    seg: Segment,
    /// Write end of the peer's FIFO (None: the peer has no wake-up fd).
    fifo: Option<File>,
    /// Cached result of [`ShmDevice::probe_remote_read`].
    can_read: Option<bool>,
    /// When the peer's process was last seen alive, by the endpoint's clock
    /// passed to `send_batch`; `None` until the first send after the ring was
    /// mapped (its owner was checked alive at mapping).
    alive_at: Option<Instant>,
    /// The peer's process, as a pidfd (readable once it has exited): one
    /// `poll` per liveness check instead of reading `/proc/<pid>/stat`, and
    /// never fooled by a reused pid. `None` where `pidfd_open` is refused
    /// (kernels before 5.3, seccomp): then `/proc` is read.
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Peer {
    /// Wakes the ring's owner if it armed its wake-up (it sleeps on its
    /// FIFO); whether a wake-up was written.
    #[inline]
    fn wake(&mut self) -> bool {
        self.seg.ring.take_armed() && self.write_wake()
    }

    /// The wake-up byte into the owner's FIFO: the rare case (a receiver
    /// that polls never arms), kept out of line of every send.
    #[cold]
    #[inline(never)]
    fn write_wake(&mut self) -> bool {
        match &mut self.fifo {
            Some(f) => {
                let _ = f.write(&[1]);
                true
            }
            None => false,
        }
    }

    /// Whether the peer's process runs (see [`pid_alive`]).
    fn alive(&self, pid: u32) -> bool {
        match &self.pidfd {
            Some(fd) => pidfd_alive(fd),
            None => pid_alive(pid),
        }
    }
}

/// A pidfd of process `pid`, if the kernel gives one.
fn pidfd_open(pid: u32) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a fresh fd this call owns.
    (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process of `fd` runs: a pidfd turns readable when its
/// process exits (a zombie not yet reaped included).
fn pidfd_alive(fd: &std::os::fd::OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    !(n > 0 && p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
}

/// How long a peer's process is taken to be alive after a check. A process
/// killed without closing its ring leaves it writable; a datagram written
/// there is reported sent, and a message that needs no acknowledgement
/// (DIRECT) would complete. Checking on send at most this often (one `poll`
/// of the peer's pidfd per peer per millisecond, nothing per message in a
/// busy exchange) reports such a peer unreachable within a millisecond. The
/// time is the endpoint's clock, passed to `send_batch`: the device reads none.
const ALIVE_FOR: std::time::Duration = std::time::Duration::from_millis(1);

/// A shared-memory endpoint.
pub struct ShmDevice {
    addr: ShmAddr,
    mtu: usize,
    seg: Segment,
    dir: PathBuf,
    path: PathBuf,
    fifo_path: Option<PathBuf>,
    /// Read end of our FIFO (the wait fd).
    fifo_rx: Option<File>,
    /// Our own write end: keeps the FIFO from reporting hang-up when no sender has
    /// it open.
    _fifo_self: Option<File>,
    /// `process_vm_readv` works in this process at all.
    cma_ok: bool,
    peers: FxHashMap<ShmAddr, Peer>,
    touched: Vec<ShmAddr>,
    /// Mapped peers found dead, not yet reported by `poll_unreachable`.
    dead: std::collections::VecDeque<DevAddr>,
    /// Posted remote reads, finished (process_vm_readv reads at once).
    reads_done: std::collections::VecDeque<ReadDone>,
    liveness_tick: u32,
    /// This ring's entry among the rings to remove at exit (rings in
    /// [`DEFAULT_DIR`] only).
    exit_slot: Option<&'static OpenRing>,
    pub stats: ShmStats,
}

/// A ring of this process in [`DEFAULT_DIR`] that is open now: its ring id, 0
/// when the entry is free. Entries form a list that only grows (a closed ring's
/// entry is reused by the next one opened), so that [`unlink_own_at_exit`] can
/// walk it with no lock: it runs where the process is ending, possibly on a
/// thread interrupted while it held any lock of rdmx or of the allocator.
pub struct OpenRing {
    ring_id: std::sync::atomic::AtomicU64,
    next: *const OpenRing,
}

// SAFETY: `next` is written once before the entry is published and never after;
// entries are leaked, so every pointer stays valid for the process's life.
unsafe impl Sync for OpenRing {}

static OPEN_RINGS: std::sync::atomic::AtomicPtr<OpenRing> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

/// Records an open ring (ring id 0, which only a test can ask for, is not
/// recorded: 0 marks a free entry).
fn remember_open_ring(ring_id: u64) -> Option<&'static OpenRing> {
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
struct ExitPath {
    buf: [u8; 96],
    len: usize,
}

impl Default for ExitPath {
    fn default() -> ExitPath {
        ExitPath { buf: [0; 96], len: 0 }
    }
}

impl ExitPath {
    fn push(&mut self, b: &[u8]) {
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

    fn dec(&mut self, mut v: u32) {
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

/// The file name of the ring of `addr`.
pub fn segment_name(addr: &ShmAddr) -> String {
    format!("rdmx-{:016x}-{}-{:016x}", addr.host_id, addr.pid, addr.ring_id)
}

/// Whether process `pid` runs: it exists and is not a zombie (a SIGKILLed
/// process stays in /proc until its parent reaps it, but will never drain its
/// ring again). Used before a peer's ring is first mapped, and by
/// [`Peer::alive`] where the kernel gave no pidfd for the peer.
fn pid_alive(pid: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if pid == 0 {
        return false;
    }
    // Without a pidfd this runs on the send path (once a millisecond per
    // peer), so it allocates nothing: the path is built on the stack (std
    // opens short paths without allocating), and only the head of the file
    // is read.
    let mut path = ExitPath::default();
    path.push(b"/proc/");
    path.dec(pid);
    path.push(b"/stat");
    let Ok(mut f) = File::open(Path::new(std::ffi::OsStr::from_bytes(&path.buf[..path.len]))) else { return false };
    // "pid (comm) S ...": the state follows the last ')'; pid (at most 10
    // digits) and comm (at most 15 bytes) fit in 64 bytes with it.
    let mut head = [0u8; 64];
    let Ok(n) = f.read(&mut head) else { return false };
    let stat = &head[..n];
    let state = stat.iter().rposition(|&b| b == b')').and_then(|i| stat.get(i + 2)).copied();
    !matches!(state, Some(b'Z' | b'X' | b'x'))
}

/// Whether a process `pid` exists at all (a zombie counts): the conservative
/// test for removing a ring file, which a not yet reaped peer may still own.
fn pid_exists(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// Calls of `poll_unreachable` between two liveness checks of the mapped peers
/// (one `poll` of each peer's pidfd, or a read of /proc/<pid>/stat where it has
/// none); a sleep (`prepare_wait`) counts as 64 calls.
const LIVENESS_EVERY: u32 = 4096;

fn random_u64() -> u64 {
    use std::sync::atomic::AtomicU64 as A;
    static COUNTER: A = A::new(0);
    let t =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    let mut z = t ^ ((std::process::id() as u64) << 32) ^ COUNTER.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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
type FifoFiles = (PathBuf, File, File);

fn create_fifo(path: &Path) -> io::Result<(File, File)> {
    let _ = std::fs::remove_file(path);
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(io::Error::from)?;
    let rx = OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    let tx = OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path)?;
    Ok((rx, tx))
}

fn fifo_path(ring: &Path) -> PathBuf {
    let mut p = ring.as_os_str().to_owned();
    p.push(".fifo");
    PathBuf::from(p)
}

impl ShmDevice {
    /// Opens an endpoint with the default configuration and a random ring id.
    pub fn new() -> Result<ShmDevice, DeviceError> {
        ShmDevice::open(&ShmConfig::default())
    }

    /// Creates this endpoint's ring (and FIFO), after removing stale rings of dead
    /// processes of this host.
    ///
    /// # Errors
    /// [`DeviceError::Config`] for a bad MTU or slot count; [`DeviceError::Io`] when
    /// the segment cannot be created (e.g. `/dev/shm` full: the space is reserved
    /// up front, so a full tmpfs fails here rather than with SIGBUS later).
    pub fn open(cfg: &ShmConfig) -> Result<ShmDevice, DeviceError> {
        if cfg.mtu == 0 || cfg.mtu > (1 << 24) {
            return Err(DeviceError::Config(format!("shm MTU {} out of range 1..=16 MiB", cfg.mtu)));
        }
        if cfg.slots < 2 || cfg.slots > (1 << 20) {
            return Err(DeviceError::Config(format!("shm ring of {} slots out of range 2..=1Mi", cfg.slots)));
        }
        let slots = cfg.slots.next_power_of_two();
        cleanup_stale(&cfg.dir);
        let addr =
            ShmAddr { host_id: host_id(), pid: std::process::id(), ring_id: cfg.ring_id.unwrap_or_else(random_u64) };
        let path = cfg.dir.join(segment_name(&addr));
        let open = || {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)
        };
        let file = match open() {
            // Our pid, so a leftover of an earlier process with this pid (or of
            // ourselves with a reused ring id): replace it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_file(&path);
                open()
            }
            r => r,
        }
        .map_err(|e| DeviceError::io("create shm ring", e))?;
        let size = segment_size(slots, cfg.mtu);
        let setup = || -> Result<(Mapping, Option<FifoFiles>), DeviceError> {
            // SAFETY: plain syscall on an open fd; returns an errno value.
            let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, size as libc::off_t) };
            if r != 0 {
                if r == libc::EOPNOTSUPP || r == libc::EINVAL {
                    file.set_len(size as u64).map_err(|e| DeviceError::io("ftruncate shm ring", e))?;
                } else {
                    return Err(DeviceError::io("posix_fallocate shm ring", io::Error::from_raw_os_error(r)));
                }
            }
            let map = Mapping::map(&file, size, true).map_err(|e| DeviceError::io("mmap shm ring", e))?;
            let fifo = if cfg.wait_fd {
                let fp = fifo_path(&path);
                let (rx, tx) = create_fifo(&fp).map_err(|e| DeviceError::io("mkfifo shm wake-up", e))?;
                Some((fp, rx, tx))
            } else {
                None
            };
            Ok((map, fifo))
        };
        let (map, fifo) = match setup() {
            Ok(x) => x,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        // SAFETY: `map` is a fresh page-aligned mapping of `size` bytes that lives in
        // the Segment next to the Ring; nobody else can know the address before
        // `open` returns.
        let ring = unsafe { Ring::init(map.ptr, size, slots, cfg.mtu, addr.pid, addr.ring_id) };
        let (fifo_path, fifo_rx, fifo_self) = match fifo {
            Some((p, rx, tx)) => (Some(p), Some(rx), Some(tx)),
            None => (None, None, None),
        };
        let mut dev = ShmDevice {
            addr,
            mtu: cfg.mtu,
            seg: Segment { ring, _map: map },
            dir: cfg.dir.clone(),
            path,
            fifo_path,
            fifo_rx,
            _fifo_self: fifo_self,
            cma_ok: false,
            peers: FxHashMap::default(),
            touched: Vec::new(),
            dead: std::collections::VecDeque::new(),
            reads_done: std::collections::VecDeque::new(),
            liveness_tick: 0,
            exit_slot: if cfg.dir == Path::new(DEFAULT_DIR) { remember_open_ring(addr.ring_id) } else { None },
            stats: ShmStats::default(),
        };
        // Can this process use CMA at all (seccomp, kernel config)? Read our own
        // ring header through it.
        let mut probe = [0u8; 8];
        let own = DevAddr::Shm(addr);
        let hdr = dev.seg.ring.base as u64;
        dev.cma_ok = true;
        dev.cma_ok = matches!(dev.remote_read(own, hdr, &mut probe), Ok(8)) && u64::from_le_bytes(probe) == MAGIC;
        Ok(dev)
    }

    /// This endpoint's address.
    pub fn shm_addr(&self) -> ShmAddr {
        self.addr
    }

    /// The ring file of this endpoint.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether a remote read ([`RemoteReads::post_read`]) from `peer` works (same user, ptrace
    /// allowed): reads the magic of the peer's ring header out of its memory.
    /// Copies `dst.len()` bytes at `remote_addr` of the same-host process
    /// behind `peer` into `dst` (`process_vm_readv`); how many were read.
    /// The raw copy: it reads the process whether or not the endpoint
    /// `peer` names is still open. Reads of an application's announced
    /// buffers go through [`RemoteReads::post_read`], which checks that.
    pub fn remote_read(&mut self, peer: DevAddr, remote_addr: u64, dst: &mut [u8]) -> Result<usize, DeviceError> {
        let DevAddr::Shm(a) = peer else { return Err(DeviceError::Unreachable(peer)) };
        if !self.cma_ok {
            return Err(DeviceError::Unsupported);
        }
        if a.host_id != self.addr.host_id {
            return Err(DeviceError::Unreachable(peer));
        }
        use nix::sys::uio::{process_vm_readv, RemoteIoVec};
        let pid = nix::unistd::Pid::from_raw(a.pid as i32);
        let mut done = 0;
        while done < dst.len() {
            let remote = [RemoteIoVec { base: remote_addr as usize + done, len: dst.len() - done }];
            let mut local = [io::IoSliceMut::new(&mut dst[done..])];
            match process_vm_readv(pid, &mut local, &remote) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(nix::errno::Errno::EPERM | nix::errno::Errno::ENOSYS) => return Err(DeviceError::Unsupported),
                Err(nix::errno::Errno::ESRCH) => return Err(DeviceError::Unreachable(peer)),
                Err(e) if done > 0 => {
                    let _ = e;
                    break;
                }
                Err(e) => return Err(DeviceError::io("process_vm_readv", e.into())),
            }
        }
        self.stats.remote_reads += 1;
        Ok(done)
    }

    pub fn probe_remote_read(&mut self, peer: &ShmAddr) -> bool {
        if !self.cma_ok {
            return false;
        }
        if let Some(p) = self.peers.get(peer) {
            if let Some(ok) = p.can_read {
                return ok;
            }
        }
        let Ok(p) = self.peer(peer) else { return false };
        let hdr = p.seg.ring.header().owner_hdr_addr.load(Ordering::Relaxed);
        let mut buf = [0u8; 8];
        let ok =
            matches!(self.remote_read(DevAddr::Shm(*peer), hdr, &mut buf), Ok(8)) && u64::from_le_bytes(buf) == MAGIC;
        if let Some(p) = self.peers.get_mut(peer) {
            p.can_read = Some(ok);
        }
        ok
    }

    /// Reports (through `poll_unreachable`) and unmaps the peers whose process
    /// is gone: a SIGKILLed peer never closes its ring, and datagrams pushed
    /// into it would wait for an acknowledgement until the peer timeout.
    fn check_liveness(&mut self) {
        let gone: Vec<ShmAddr> = self.peers.iter().filter(|(a, p)| !p.alive(a.pid)).map(|(a, _)| *a).collect();
        for a in gone {
            self.peers.remove(&a);
            self.dead.push_back(DevAddr::Shm(a));
        }
    }

    /// Forgets the mapping of `peer` (it is mapped again on the next send).
    pub fn forget_peer(&mut self, peer: &ShmAddr) {
        self.peers.remove(peer);
    }

    /// After a copy out of `a`'s process: whether `a`'s endpoint had closed
    /// by then, in which case the copy may hold bytes its application wrote
    /// after `fi_close(ep)` returned. `a`'s ring must have been mapped
    /// before the copy (by [`ShmDevice::peer`]): a mapping made now could
    /// no longer tell (the file may be gone, or the name reused).
    ///
    /// The ordering is the message-passing pattern. The closing side does
    /// `closed = 1; fence(SeqCst)` before its close returns ([`Drop`]), and
    /// only then may its application write the buffer. Here the copy's
    /// loads come first, then `fence(SeqCst)`, then the load of `closed`. If
    /// the copy saw any byte written after the close, the fences order the
    /// store of `closed` before that write and our load after that read,
    /// so the load sees 1 and the read is refused. Seeing 0 means every
    /// byte copied was written while the buffer was still the provider's.
    /// (The copy is the kernel's, on this thread: the fence orders it like
    /// our own loads; on x86 the two fences are a formality of TSO.)
    fn sender_closed(&self, a: &ShmAddr) -> bool {
        fence(Ordering::SeqCst);
        match self.peers.get(a) {
            // Acquire is more than the fence above needs; it states intent.
            Some(p) => p.seg.ring.header().closed.load(Ordering::Acquire) != 0,
            // Mapped before the copy and unmapped only by our own calls:
            // missing means we cannot vouch for the bytes.
            None => true,
        }
    }

    /// Copies every run of a posted read in order, stopping at the first
    /// that fails or falls short: the bytes read, and the error if any.
    fn copy_runs(&mut self, peer: DevAddr, runs: &[ReadRun]) -> Result<(u64, Option<DeviceError>), DeviceError> {
        let mut bytes = 0u64;
        for run in runs {
            let len = run.local.len() as usize;
            // SAFETY: `LocalBuf`'s contract: its memory is this process's,
            // valid and used by nothing else until this read completes,
            // which it does before `post_read` returns.
            let dst = unsafe { std::slice::from_raw_parts_mut(run.local.addr() as *mut u8, len) };
            match self.remote_read(peer, run.remote_addr, dst) {
                Ok(n) => {
                    bytes += n as u64;
                    if n < len {
                        return Ok((
                            bytes,
                            Some(DeviceError::Config(format!("short remote read: {n} of {len} bytes"))),
                        ));
                    }
                }
                // Nothing read yet and the path cannot read: the caller asks
                // for a push instead.
                Err(e @ DeviceError::Unsupported) if bytes == 0 => return Err(e),
                Err(e) => return Ok((bytes, Some(e))),
            }
        }
        Ok((bytes, None))
    }

    /// The mapping of `peer`'s ring, created on first use.
    fn peer(&mut self, a: &ShmAddr) -> Result<&mut Peer, DeviceError> {
        let unreachable = || DeviceError::Unreachable(DevAddr::Shm(*a));
        // One hash probe (this runs on every send): a mapped ring is lent
        // unless its owner closed it; an unmapped one is mapped into the
        // vacant entry.
        let vacant = match self.peers.entry(*a) {
            Entry::Occupied(o) => {
                if o.get().seg.ring.header().closed.load(Ordering::Acquire) != 0 {
                    o.remove();
                    return Err(unreachable());
                }
                return Ok(o.into_mut());
            }
            Entry::Vacant(v) => v,
        };
        if a.host_id != self.addr.host_id || !pid_alive(a.pid) {
            return Err(unreachable());
        }
        let path = self.dir.join(segment_name(a));
        let file = match OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(unreachable()),
            Err(e) => return Err(DeviceError::io("open peer shm ring", e)),
        };
        let len = file.metadata().map_err(|e| DeviceError::io("fstat peer shm ring", e))?.len() as usize;
        if len < HEADER_SIZE {
            return Err(unreachable());
        }
        // Not populated: that cost 0.2 ms per peer (512 page table entries
        // for a 2 MiB ring) in the first round trip, twice (each side maps
        // the other's ring on its first send). The owner's pages exist
        // already; a sender touches a slot first by reading its sequence
        // word, and such a read fault maps the pages around it too (the
        // kernel's fault-around), so the first lap should take far fewer
        // faults than there are pages. Measured: the first round trip of
        // a fresh pair 350-550 -> 120-290 us, and the first 1000 no
        // slower than libfabric shm's against their steady state (1.31x
        // both, the harness at 4d90670).
        let map = Mapping::map(&file, len, false).map_err(|e| DeviceError::io("mmap peer shm ring", e))?;
        // SAFETY: `map` covers `len` bytes, page-aligned, and is kept beside the
        // Ring in the Segment for as long as the Ring lives.
        let ring = unsafe { Ring::attach(map.ptr, len) }.map_err(|_| unreachable())?;
        let h = ring.header();
        if h.owner_pid.load(Ordering::Relaxed) != a.pid
            || h.ring_id.load(Ordering::Relaxed) != a.ring_id
            || h.closed.load(Ordering::Acquire) != 0
        {
            return Err(unreachable());
        }
        let fifo =
            OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(fifo_path(&path)).ok();
        // Opened after the pid was checked alive and its ring found with
        // its pid and id: a pid reused since would not own that ring.
        let pidfd = pidfd_open(a.pid);
        Ok(vacant.insert(Peer { seg: Segment { ring, _map: map }, fifo, can_read: None, alive_at: None, pidfd }))
    }

    /// Empties our FIFO.
    fn drain_fifo(&mut self) {
        if let Some(rx) = &mut self.fifo_rx {
            let mut buf = [0u8; 256];
            while let Ok(n) = rx.read(&mut buf) {
                if n < buf.len() {
                    break;
                }
            }
        }
    }

    fn pop_into(&mut self, n: &mut usize, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) {
        let host_id = self.addr.host_id;
        while *n < max {
            let ok = self
                .seg
                .ring
                .pop(&mut |pid, ring_id, data| deliver(DevAddr::Shm(ShmAddr { host_id, pid, ring_id }), data));
            if !ok {
                break;
            }
            *n += 1;
        }
    }
}

impl ShmDevice {
    /// Writes one datagram (`parts`, `len` bytes) into the ring of `a`:
    /// `Ok(false)` when the ring is full. Checks the peer's process at most
    /// once per [`ALIVE_FOR`] of `now`, and whenever its ring is full.
    /// Pushes one datagram, gathered from `parts`, into `a`'s ring. With
    /// `direct` (a message written straight in, `send_gathered`): `Ok(false)`
    /// also when the owner holds its senders back, and the owner is woken if
    /// it sleeps, through the same peer entry (a lone send looks its peer up
    /// once, not twice; a batch wakes each peer once, after it).
    fn push_one(
        &mut self,
        now: Instant,
        a: ShmAddr,
        parts: &[&[u8]],
        len: usize,
        direct: bool,
    ) -> Result<bool, DeviceError> {
        if len > self.mtu {
            return Err(DeviceError::TooLarge { len, mtu: self.mtu });
        }
        let me = self.addr;
        let peer = self.peer(&a)?;
        match peer.alive_at {
            Some(at) if now.saturating_duration_since(at) > ALIVE_FOR => {
                if !peer.alive(a.pid) {
                    self.peers.remove(&a);
                    self.dead.push_back(DevAddr::Shm(a));
                    return Err(DeviceError::Unreachable(DevAddr::Shm(a)));
                }
                peer.alive_at = Some(now);
            }
            Some(_) => {}
            None => peer.alive_at = Some(now),
        }
        let ring = &peer.seg.ring;
        if len > ring.mtu {
            return Err(DeviceError::TooLarge { len, mtu: ring.mtu });
        }
        if direct && ring.header().held_back.load(Ordering::Acquire) != 0 {
            self.stats.held_back += 1;
            return Ok(false);
        }
        if !ring.try_push_parts(me.pid, me.ring_id, parts, len) {
            // Full. A ring nobody drains any more belongs to a dead process.
            if !peer.alive(a.pid) {
                self.peers.remove(&a);
                return Err(DeviceError::Unreachable(DevAddr::Shm(a)));
            }
            self.stats.ring_full += 1;
            return Ok(false);
        }
        // As after a batch (Dekker with the consumer's arm-then-recheck).
        let woke = direct && {
            fence(Ordering::SeqCst);
            peer.wake()
        };
        self.stats.sent += 1;
        self.stats.wakeups_sent += woke as u64;
        Ok(true)
    }

    /// Wakes the owner of `a`'s ring if it sleeps on its FIFO (after a push;
    /// see `send_batch`).
    fn wake(&mut self, a: &ShmAddr) {
        if let Some(p) = self.peers.get_mut(a) {
            if p.wake() {
                self.stats.wakeups_sent += 1;
            }
        }
    }
}

impl Device for ShmDevice {
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: true,
            ordered: true,
            mtu: self.mtu,
            remote_read: self.cma_ok,
            gso: false,
            registration: false,
            max_inline: 0,
        }
    }

    fn local_addr(&self) -> DevAddr {
        DevAddr::Shm(self.addr)
    }

    fn send_batch(&mut self, now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        // It cannot gather (only RDMA paths form such datagrams).
        let batch = rdm::device::until_gathered(batch)?;
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        let mut result = Ok(batch.len());
        for (i, d) in batch.iter().enumerate() {
            let fail = |e: DeviceError| if i == 0 { Err(e) } else { Ok(i) };
            let DevAddr::Shm(a) = d.dst else {
                result = fail(DeviceError::Unreachable(d.dst));
                break;
            };
            match self.push_one(now, a, &[d.data], d.data.len(), false) {
                Ok(true) => {}
                Ok(false) => {
                    result = Ok(i);
                    break;
                }
                Err(e) => {
                    result = fail(e);
                    break;
                }
            }
            if !touched.contains(&a) {
                touched.push(a);
            }
        }
        // Wake the receivers that asked for it (Dekker with the consumer's
        // arm-then-recheck in prepare_wait: one of the two sees the other).
        fence(Ordering::SeqCst);
        for a in &touched {
            self.wake(a);
        }
        self.touched = touched;
        result
    }

    fn send_gathered(&mut self, now: Instant, dst: DevAddr, parts: &[&[u8]]) -> Result<bool, DeviceError> {
        let DevAddr::Shm(a) = dst else { return Err(DeviceError::Unreachable(dst)) };
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_one(now, a, parts, len, true)
    }

    fn held_back(&mut self, dst: &DevAddr) -> bool {
        let DevAddr::Shm(a) = dst else { return false };
        self.peers.get(a).is_some_and(|p| p.seg.ring.header().held_back.load(Ordering::Acquire) != 0)
    }

    fn hold_back_senders(&mut self, hold: bool) {
        // Before the zero-window ACK (or, resuming, the window's reopening)
        // goes out to the senders' rings: a sender that reads that ACK and
        // then this flag sees the flag of the same state or a later one.
        self.seg.ring.header().held_back.store(hold as u32, Ordering::SeqCst);
        self.stats.held_back_changes += 1;
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        // No system call here: a polling receiver never arms the wake-up, so its
        // senders never write to the FIFO either (see `prepare_wait`).
        let mut n = 0;
        self.pop_into(&mut n, max, deliver);
        self.stats.received += n as u64;
        Ok(n)
    }

    fn prepare_wait(&mut self) -> bool {
        // Drain old wake-ups, arm, and look again so that a datagram pushed before
        // the arm (whose sender saw no flag) is not left behind a quiet fd.
        if self.fifo_rx.is_some() {
            self.drain_fifo();
            self.seg.ring.arm();
        }
        // Before a sleep too, but not every time: a process that sleeps on
        // every message would otherwise check every peer on every message.
        self.liveness_tick += LIVENESS_EVERY / 64;
        if self.liveness_tick >= LIVENESS_EVERY {
            self.liveness_tick = 0;
            self.check_liveness();
        }
        self.seg.ring.ready() || !self.dead.is_empty()
    }

    fn poll_unreachable(&mut self) -> Option<DevAddr> {
        self.liveness_tick += 1;
        if self.liveness_tick >= LIVENESS_EVERY {
            self.liveness_tick = 0;
            self.check_liveness();
        }
        self.dead.pop_front()
    }

    fn owns(&self, addr: &DevAddr) -> bool {
        matches!(addr, DevAddr::Shm(_))
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.fifo_rx.as_ref().map(|f| f.as_raw_fd())
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }

    fn remote_reads_ref(&self) -> Option<&dyn RemoteReads> {
        Some(self)
    }
}

impl RemoteReads for ShmDevice {
    /// Reads at once with `process_vm_readv` (no key: it reads any address of
    /// a same-host process the ptrace policy lets us read), and only from an
    /// endpoint that stayed open through the copy (see the module docs).
    ///
    /// Why fail the read rather than something else: the copy cannot be
    /// made safe before it starts (the sender may close during it), and a
    /// closed sender cannot resend; an error completion is a loss the
    /// receiver sees (MPI reports it), where delivering the bytes would be
    /// silent corruption and dropping the announcement would leave the
    /// receive waiting for a message that never comes.
    fn post_read(
        &mut self,
        _now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        // The sender's ring, mapped before anything is copied (its `closed`
        // flag is read after the copy). Not our own endpoint: it is open
        // while we run. Not when this process cannot read at all: the copy
        // below says Unsupported, and the bytes are pushed instead.
        let sender = match peer {
            DevAddr::Shm(a) if self.cma_ok && a != self.addr => Some(a),
            _ => None,
        };
        if let Some(a) = sender {
            // Closed, or its ring gone: the endpoint's buffers are no
            // longer the provider's to read.
            if let Err(error) = self.peer(&a) {
                if matches!(error, DeviceError::Unreachable(_)) {
                    self.stats.reads_after_close += 1;
                }
                self.reads_done.push_back(ReadDone { id, bytes: 0, error: Some(error) });
                return Ok(());
            }
        }
        let (bytes, mut error) = self.copy_runs(peer, runs)?;
        if let Some(a) = sender.filter(|_| error.is_none()) {
            if self.sender_closed(&a) {
                self.stats.reads_after_close += 1;
                error = Some(DeviceError::Unreachable(peer));
            }
        }
        self.reads_done.push_back(ReadDone { id, bytes, error });
        Ok(())
    }

    fn poll_read(&mut self, _now: rdm::time::Instant) -> Option<ReadDone> {
        self.reads_done.pop_front()
    }
}

impl Drop for ShmDevice {
    fn drop(&mut self) {
        // Tell cached senders first, then remove the names; the mapping goes with
        // the Segment.
        //
        // The store must also be visible to a peer's rendezvous read before
        // any write the application makes to a buffer it announced: that
        // may follow as soon as this drop (inside fi_close) returns. A
        // release store orders only what came before it; the SeqCst fence
        // orders it before every later store too, and pairs with the
        // reader's fence after its copy (`ShmDevice::sender_closed`).
        self.seg.ring.header().closed.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if let Some(e) = self.exit_slot {
            e.ring_id.store(0, std::sync::atomic::Ordering::Release);
        }
        let _ = std::fs::remove_file(&self.path);
        if let Some(p) = &self.fifo_path {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rdm::device::LocalBuf;
    use std::collections::VecDeque;

    /// A ring in a heap buffer (8-byte aligned).
    struct HeapRing {
        _buf: Vec<u64>,
        ring: Ring,
    }

    fn heap_ring(slots: usize, mtu: usize) -> HeapRing {
        let len = segment_size(slots, mtu);
        let mut buf = vec![0u64; len / 8 + 1];
        // SAFETY: the buffer is 8-aligned, `len` bytes long, and lives in HeapRing
        // beside the Ring.
        let ring = unsafe { Ring::init(buf.as_mut_ptr() as *mut u8, len, slots, mtu, 1, 2) };
        HeapRing { _buf: buf, ring }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(Vec<u8>),
        Pop,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Op::Push),
            2 => Just(Op::Pop),
        ]
    }

    proptest! {
        /// The ring behaves like a bounded VecDeque.
        #[test]
        fn ring_matches_vecdeque(ops in proptest::collection::vec(op(), 0..300), slots_log in 1u32..5) {
            let slots = 1usize << slots_log;
            let r = heap_ring(slots, 32);
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            for op in ops {
                match op {
                    Op::Push(mut d) => {
                        d.truncate(32);
                        let ok = r.ring.try_push(7, 9, &d);
                        prop_assert_eq!(ok, model.len() < slots);
                        if ok { model.push_back(d); }
                    }
                    Op::Pop => {
                        let mut got = None;
                        let ok = r.ring.pop(&mut |pid, ring, data| {
                            assert_eq!((pid, ring), (7, 9));
                            got = Some(data.to_vec());
                        });
                        prop_assert_eq!(ok, !model.is_empty());
                        prop_assert_eq!(got, model.pop_front());
                    }
                }
                prop_assert_eq!(r.ring.ready(), !model.is_empty());
            }
        }
    }

    #[test]
    fn concurrent_producers_keep_per_sender_order() {
        let r = heap_ring(64, 16);
        const PER: u32 = 20_000;
        const PRODUCERS: u32 = 3;
        let ring = &r.ring;
        struct Shared<'a>(&'a Ring);
        // SAFETY: test-only: Ring's operations are thread-safe by construction
        // (atomics; one consumer, the main thread).
        unsafe impl Sync for Shared<'_> {}
        let shared = Shared(ring);
        let shared = &shared;
        std::thread::scope(|s| {
            for p in 0..PRODUCERS {
                s.spawn(move || {
                    for i in 0..PER {
                        let mut b = [0u8; 8];
                        b[..4].copy_from_slice(&p.to_le_bytes());
                        b[4..].copy_from_slice(&i.to_le_bytes());
                        while !shared.0.try_push(p, 0, &b) {
                            std::thread::yield_now();
                        }
                    }
                });
            }
            let mut next = [0u32; PRODUCERS as usize];
            let mut total = 0;
            while total < PER * PRODUCERS {
                let ok = shared.0.pop(&mut |pid, _, d| {
                    let p = u32::from_le_bytes(d[..4].try_into().unwrap());
                    let i = u32::from_le_bytes(d[4..].try_into().unwrap());
                    assert_eq!(p, pid);
                    assert_eq!(i, next[p as usize], "per-producer FIFO order");
                    next[p as usize] += 1;
                });
                if ok {
                    total += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
    }

    /// One posted read of all of `src` (a buffer of this process, read
    /// through `process_vm_readv` as any other's) into `dst`, from the
    /// endpoint `from`: what completed.
    fn read_all(r: &mut ShmDevice, id: u64, from: DevAddr, src: &[u8], dst: &mut [u8]) -> ReadDone {
        // SAFETY: `dst` outlives the read, which completes before post_read
        // returns (shm reads synchronously), and nothing else touches it.
        let run = ReadRun {
            remote_addr: src.as_ptr() as u64,
            remote_key: None,
            local: unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, dst.len() as u64) },
        };
        r.post_read(rdm::time::Instant::ZERO, id, from, &[run]).unwrap();
        r.poll_read(rdm::time::Instant::ZERO).unwrap()
    }

    /// fi_endpoint(3): after fi_close(ep) returns, the provider touches the
    /// endpoint's buffers no more. The sender's process lives on (its memory
    /// stays readable), yet a read of its buffer after its device dropped
    /// fails, whether or not the reader had its ring mapped (it sent to it
    /// first, or never).
    #[test]
    fn a_read_from_an_endpoint_that_closed_fails_while_its_process_lives() {
        let mut r = ShmDevice::new().unwrap();
        if !r.caps().remote_read {
            eprintln!("SKIP: process_vm_readv unavailable here");
            return;
        }
        let src: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        for mapped in [false, true] {
            let s = ShmDevice::new().unwrap();
            let from = s.local_addr();
            if mapped {
                assert_eq!(r.send_batch(Instant::ZERO, &[TxDatagram::new(from, b"x")]).unwrap(), 1);
            }
            let mut dst = vec![0u8; src.len()];
            let done = read_all(&mut r, 1, from, &src, &mut dst);
            assert!(done.error.is_none(), "mapped {mapped}: open sender: {:?}", done.error);
            assert_eq!((done.id, done.bytes), (1, src.len() as u64));
            assert!(dst == src);
            if !mapped {
                // The read above mapped the ring: unmap it, so that the read
                // below must find the ring (its file is gone by then).
                let DevAddr::Shm(a) = from else { unreachable!() };
                r.forget_peer(&a);
            }
            let before = r.stats.reads_after_close;
            drop(s);
            let done = read_all(&mut r, 2, from, &src, &mut dst);
            assert_eq!(done.id, 2);
            assert!(
                matches!(done.error, Some(DeviceError::Unreachable(a)) if a == from),
                "mapped {mapped}: {:?}",
                done.error
            );
            assert_eq!(r.stats.reads_after_close, before + 1);
        }
        // Our own endpoint is readable (it is open while we run).
        let own = r.local_addr();
        let mut dst = vec![0u8; 100];
        assert!(read_all(&mut r, 3, own, &src[..100], &mut dst).error.is_none());
    }

    /// The check after the copy: a sender that closes while the copy runs
    /// (here: its flag set after the copy, as its drop would) fails the read.
    #[test]
    fn a_close_during_the_copy_is_seen_after_it() {
        let mut r = ShmDevice::new().unwrap();
        if !r.caps().remote_read {
            eprintln!("SKIP: process_vm_readv unavailable here");
            return;
        }
        let s = ShmDevice::new().unwrap();
        let DevAddr::Shm(a) = s.local_addr() else { unreachable!() };
        r.peer(&a).unwrap();
        let src = vec![7u8; 4096];
        let mut dst = vec![0u8; 4096];
        // SAFETY: `dst` outlives the synchronous copy and nothing else touches it.
        let run = ReadRun {
            remote_addr: src.as_ptr() as u64,
            remote_key: None,
            local: unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, 4096) },
        };
        assert!(matches!(r.copy_runs(s.local_addr(), &[run]), Ok((4096, None))));
        assert!(!r.sender_closed(&a), "an open sender");
        s.seg.ring.header().closed.store(1, Ordering::SeqCst);
        assert!(r.sender_closed(&a), "a sender that closed during the copy");
    }

    #[test]
    fn attach_rejects_garbage() {
        let mut buf = vec![0u64; 1024];
        // SAFETY: an 8 KiB aligned heap buffer that outlives the call.
        assert!(unsafe { Ring::attach(buf.as_mut_ptr() as *mut u8, 8192) }.is_err());
        let r = heap_ring(4, 64);
        let len = segment_size(4, 64);
        // SAFETY: as above; the ring's buffer outlives the attached view.
        let view = unsafe { Ring::attach(r.ring.base, len) }.unwrap();
        assert_eq!((view.slots, view.mtu), (4, 64));
        // SAFETY: as above, but claims fewer bytes than the geometry needs.
        assert!(unsafe { Ring::attach(r.ring.base, len - 1) }.is_err());
    }
}

/// Model checks of the ring with loom: every interleaving (up to a preemption
/// bound) of producers and the consumer, with the memory orderings as weak as the
/// C++ model allows, and every payload access checked for a data race.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A cache line, so that loom rings are 64-aligned.
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    /// A ring on the heap whose atomics are loom's (constructed by `Ring::init`).
    struct LoomRing {
        ring: Ring,
        _buf: Vec<Line>,
        steps: AtomicU32,
    }

    // SAFETY: the Ring's operations are atomics plus slots owned through the
    // sequence protocol; each model calls `pop`/`arm` from one thread only.
    unsafe impl Sync for LoomRing {}

    impl LoomRing {
        fn new(slots: usize, mtu: usize) -> Arc<LoomRing> {
            let len = segment_size(slots, mtu);
            let mut buf: Vec<Line> = (0..len.div_ceil(64)).map(|_| Line([0; 64])).collect();
            // SAFETY: the buffer is 64-aligned, at least `len` bytes, moves with the
            // Ring into LoomRing (its heap block does not move) and is dropped after
            // it; nobody else sees it during `init`.
            let ring = unsafe { Ring::init(buf.as_mut_ptr() as *mut u8, len, slots, mtu, 1, 2) };
            Arc::new(LoomRing { ring, _buf: buf, steps: AtomicU32::new(0) })
        }

        /// A scheduling point, taken before each ring operation. Loom's DPOR
        /// remembers only the last access to each atomic, so it can miss that a
        /// producer's `seq` load races with the consumer's `seq` store when the
        /// consumer's own load came in between (it then never tries the consumer's
        /// pop first). RMWs of one atomic always conflict, so these make loom try
        /// the threads' operations in every order; being Relaxed, they order no
        /// memory and hide no missing Acquire/Release.
        fn step(&self) {
            self.steps.fetch_add(1, Ordering::Relaxed);
        }

        fn try_push(&self, p: u32, data: &[u8]) -> bool {
            self.step();
            self.ring.try_push(p, 100 + p as u64, data)
        }

        fn pop(&self, f: &mut dyn FnMut(u32, u64, &[u8])) -> bool {
            self.step();
            self.ring.pop(f)
        }

        /// Moves the empty ring to position `start` (to cross the u64 wrap).
        fn start_at(&self, start: u64) {
            let h = self.ring.header();
            h.tail.store(start, Ordering::Relaxed);
            h.head.store(start, Ordering::Relaxed);
            for k in 0..self.ring.slots {
                self.ring.slot(start.wrapping_add(k)).seq.store(start.wrapping_add(k), Ordering::Relaxed);
            }
        }
    }

    impl Drop for LoomRing {
        fn drop(&mut self) {
            // SAFETY: `Ring::init` constructed these objects in place; the Ring is
            // no longer used by any thread (last Arc reference).
            unsafe {
                std::ptr::drop_in_place(self.ring.base as *mut Header);
                for i in 0..self.ring.slots {
                    std::ptr::drop_in_place(self.ring.slot_ptr(i) as *mut SlotHdr);
                }
            }
        }
    }

    /// Datagram `i` of producer `p`: its length and every byte depend on both.
    fn datagram(p: u32, i: u32) -> Vec<u8> {
        vec![(p * 16 + i) as u8; 1 + (p + i) as usize]
    }

    /// A model explored exhaustively up to `preemptions` forced context switches.
    fn model(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(preemptions);
        b.check(f);
    }

    /// Checks each popped datagram: from producer 1 or 2, intact, and the next one
    /// of its producer. `next[p]` counts what producer `p` got through.
    fn check_next(next: &mut [u32; 3]) -> impl FnMut(u32, u64, &[u8]) + '_ {
        |pid, src_ring, data| {
            assert!(pid == 1 || pid == 2, "source pid {pid}");
            assert_eq!(src_ring, 100 + pid as u64);
            assert_eq!(data, datagram(pid, next[pid as usize]), "datagram {} of producer {pid}", next[pid as usize]);
            next[pid as usize] += 1;
        }
    }

    /// Producers 1 and 2 push up to `per` datagrams each, stopping at the first
    /// refusal (full ring), while the consumer makes `pops` attempts; then the
    /// consumer drains the ring. Every datagram that went in comes out once,
    /// intact, in its producer's order. (No retry loops: loom would explore ever
    /// longer spins of a thread waiting for a preempted one.)
    fn two_producers(slots: usize, per: u32, pops: usize, preemptions: usize) {
        model(preemptions, move || {
            let r = LoomRing::new(slots, 8);
            let producers: Vec<_> = (1..=2u32)
                .map(|p| {
                    let r = r.clone();
                    thread::spawn(move || {
                        let mut sent = 0;
                        while sent < per && r.try_push(p, &datagram(p, sent)) {
                            sent += 1;
                        }
                        sent
                    })
                })
                .collect();
            let mut next = [0u32; 3];
            for _ in 0..pops {
                r.pop(&mut check_next(&mut next));
            }
            let sent: Vec<u32> = producers.into_iter().map(|t| t.join().unwrap()).collect();
            while r.pop(&mut check_next(&mut next)) {}
            assert_eq!(next[1..], sent[..], "every datagram pushed is received once");
            if slots >= 2 * per as usize {
                assert_eq!(sent, [per, per], "a ring with room refused a datagram");
            }
            assert!(!r.ring.ready());
        });
    }

    #[test]
    fn loom_two_producers_one_each_4_slots() {
        two_producers(4, 1, 2, 3);
    }

    #[test]
    fn loom_two_producers_two_each_2_slots() {
        two_producers(2, 2, 2, 2);
    }

    /// A full ring refuses a push; after a pop the producer reuses the freed slot
    /// on the next lap, here across the wrap of the u64 positions.
    #[test]
    fn loom_full_ring_reuses_slot_after_pop_across_wrap() {
        model(3, || {
            let r = LoomRing::new(2, 8);
            r.start_at(u64::MAX - 1);
            assert!(r.try_push(1, &datagram(1, 0)));
            assert!(r.try_push(1, &datagram(1, 1)));
            assert!(!r.try_push(1, &datagram(1, 2)), "a full ring takes no more");
            let popped = Arc::new(AtomicU32::new(0));
            let consumer = {
                let (r, popped) = (r.clone(), popped.clone());
                thread::spawn(move || {
                    let mut next = [0u32; 3];
                    for _ in 0..2 {
                        let mut check = check_next(&mut next);
                        assert!(r.pop(&mut |pid, src_ring, data| {
                            check(pid, src_ring, data);
                            popped.fetch_add(1, Ordering::Relaxed);
                        }));
                    }
                })
            };
            // Datagram i reuses the slot of datagram i - 2: the push may only
            // succeed once the consumer let go of that one.
            let mut i = 2;
            while i < 4 && r.try_push(1, &datagram(1, i)) {
                assert!(
                    popped.load(Ordering::Relaxed) >= i - 1,
                    "slot of datagram {} reused before its pop finished",
                    i - 2
                );
                i += 1;
            }
            consumer.join().unwrap();
            for i in i..4 {
                assert!(r.try_push(1, &datagram(1, i)), "push {i} after the pops");
            }
            let mut next = [0, 2, 0];
            while r.pop(&mut check_next(&mut next)) {}
            assert_eq!(next, [0, 4, 0]);
            let h = r.ring.header();
            assert_eq!((h.head.load(Ordering::Relaxed), h.tail.load(Ordering::Relaxed)), (2, 2), "positions wrapped");
        });
    }

    /// The wake-up handshake of `send_batch` / `prepare_wait`, with a counter for
    /// the FIFO: a consumer that goes to sleep with a datagram in its ring always
    /// has a wake-up byte to read.
    fn wakeup(producers: u32, preemptions: usize) {
        model(preemptions, move || {
            let r = LoomRing::new(4, 8);
            let fifo = Arc::new(AtomicU32::new(0));
            let threads: Vec<_> = (1..=producers)
                .map(|p| {
                    let (r, fifo) = (r.clone(), fifo.clone());
                    thread::spawn(move || {
                        // send_batch: push, fence, wake the consumer if it armed.
                        assert!(r.try_push(p, &datagram(p, 0)));
                        r.step();
                        fence(Ordering::SeqCst);
                        if r.ring.take_armed() {
                            fifo.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            // The consumer: pop; if short, prepare_wait (drain the FIFO, arm) and pop again.
            let pop_all = || {
                let mut k = 0;
                while r.pop(&mut |_, _, _| {}) {
                    k += 1;
                }
                k
            };
            let mut n = pop_all();
            let sleeps = n < producers && {
                fifo.store(0, Ordering::Relaxed);
                r.step();
                r.ring.arm();
                n += pop_all();
                n < producers
            };
            for t in threads {
                t.join().unwrap();
            }
            if sleeps {
                assert!(
                    fifo.load(Ordering::Relaxed) > 0,
                    "lost wake-up: the consumer sleeps on a non-empty ring and an empty FIFO"
                );
            }
        });
    }

    #[test]
    fn loom_wakeup_one_producer_never_lost() {
        wakeup(1, 3);
    }

    #[test]
    fn loom_wakeup_two_producers_never_lost() {
        wakeup(2, 3);
    }
}
