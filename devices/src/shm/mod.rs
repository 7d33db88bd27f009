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
//!   ([`Device::hold_back_senders`]); a sender's `write` then writes no
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
//!   are loom's and `ring::loom_tests` explore every interleaving (up to a preemption
//!   bound) of two producers, the consumer and the wake-up handshake, with every
//!   payload access checked for a data race; weakening any Release/Acquire/SeqCst
//!   in the ring makes them fail (`scripts/test.sh` runs them). A proptest
//!   (`ring_matches_vecdeque`) checks the ring against a bounded `VecDeque` model.
//!
//! Limits: a sender that dies between claiming a slot and publishing it wedges the
//! ring at that slot (its receiver then sees no more data: the engine's peer
//! timeout reports it). Ring geometry is chosen by the receiver; a sender sending
//! more than the receiver's MTU gets [`DeviceError::TooLarge`].
//!
//! The parts: `ring` is the queue in shared memory (its layout, push, pop and
//! wake-up flag, and its loom models), `segment` the files (naming, mapping, the
//! FIFO, removing the rings of dead processes and this process's at exit), and
//! this file the device on them: peers, their liveness, remote reads and the
//! [`Device`] methods. The unit tests of the ring and the device are in `tests.rs`.
//!
//! Unsafe here: handing fresh mappings to the ring, `posix_fallocate`, pidfd syscalls, and posted reads' buffers.
#![allow(unsafe_code)]

mod peers;
mod ring;
mod segment;
#[cfg(all(test, not(loom)))]
mod tests;

pub use crate::host::host_id;
pub use ring::segment_size;
pub use segment::{cleanup_stale, segment_name, unlink_own_at_exit, OpenRing};

use peers::PeerTable;
use rdm::device::{
    Dest, DevAddr, Device, DeviceCaps, DeviceError, ReadDone, ReadRun, RemoteReads, ShmAddr, TxDatagram,
};
use rdm::Instant;
use ring::sync::{fence, Ordering};
use ring::{Ring, HEADER_SIZE, MAGIC};
use segment::{create_fifo, fifo_path, remember_open_ring, ExitPath, FifoFiles, Mapping, RingProbe, Segment};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Default largest datagram: 8 KiB and room for the headers (rdm's 48 bytes,
/// the message layer's), so that an 8 KiB message, a size applications favour,
/// is one ring slot and not two (`mpi_bench`'s 8 KiB streaming ran at 0.76x of
/// OpenMPI's vader with two).
pub const DEFAULT_MTU: usize = 8192 + 128;
/// Default slots per ring (a power of two).
pub const DEFAULT_SLOTS: usize = 256;
/// Where rings live by default.
pub const DEFAULT_DIR: &str = "/dev/shm";

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
    /// Messages not written straight in (`write`) because the
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
    peers: PeerTable<Peer>,
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
            seg: Segment { ring, map: std::sync::Arc::new(map) },
            dir: cfg.dir.clone(),
            path,
            fifo_path,
            fifo_rx,
            _fifo_self: fifo_self,
            cma_ok: false,
            peers: PeerTable::default(),
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
            // SAFETY: inside `post_read`, which the run was handed to: the read
            // is in flight and its destination the read's alone until it
            // completes, which it does before `post_read` returns.
            let got = unsafe { run.local.with_bytes_mut(|dst| self.remote_read(peer, run.remote_addr, dst)) };
            match got {
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
        let i = self.peer_slot(a)?;
        Ok(self.peers.at_mut(i))
    }

    /// The slot of `peer`'s ring in the table, mapped on first use.
    fn peer_slot(&mut self, a: &ShmAddr) -> Result<u32, DeviceError> {
        let unreachable = || DeviceError::Unreachable(DevAddr::Shm(*a));
        // One hash probe (this runs on every send by address): a mapped ring
        // is lent unless its owner closed it; an unmapped one is mapped.
        if let Some(i) = self.peers.slot_of(a) {
            if self.peers.at(i).seg.ring.header().closed.load(Ordering::Acquire) != 0 {
                self.peers.remove(a);
                return Err(unreachable());
            }
            return Ok(i);
        }
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
        Ok(self.peers.insert(
            *a,
            Peer { seg: Segment { ring, map: std::sync::Arc::new(map) }, fifo, can_read: None, alive_at: None, pidfd },
        ))
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
    /// `direct` (a message written straight in, `write`): `Ok(false)`
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
        let i = self.peer_slot(&a)?;
        self.push_at(now, i, parts, len, direct)
    }

    /// [`ShmDevice::push_one`] to the peer in slot `i` of the table.
    #[inline]
    fn push_at(
        &mut self,
        now: Instant,
        i: u32,
        parts: &[&[u8]],
        len: usize,
        direct: bool,
    ) -> Result<bool, DeviceError> {
        if len > self.mtu {
            return Err(DeviceError::TooLarge { len, mtu: self.mtu });
        }
        let me = self.addr;
        let a = self.peers.addr_at(i);
        let peer = self.peers.at_mut(i);
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
            max_transmit: self.mtu,
        }
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        vec![DevAddr::Shm(self.addr)]
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

    /// A same-host peer resolves to its slot in the table of mapped rings
    /// (mapped now if it was not).
    fn resolve(&mut self, dst: &DevAddr) -> Result<Option<Dest>, DeviceError> {
        let DevAddr::Shm(a) = dst else { return Ok(None) };
        let i = self.peer_slot(a)?;
        Ok(Some(self.peers.dest(i)))
    }

    /// One index and a generation check instead of `send_batch`'s hash probe;
    /// the checks of a send by address otherwise (the owner closed its ring,
    /// its process died, the ring is full, it holds its senders back).
    fn write(&mut self, now: Instant, dest: Dest, parts: &[&[u8]]) -> Result<bool, DeviceError> {
        let Some(i) = self.peers.by_dest(dest) else { return Ok(false) };
        if self.peers.at(i).seg.ring.header().closed.load(Ordering::Acquire) != 0 {
            let a = self.peers.addr_at(i);
            self.peers.remove(&a);
            return Err(DeviceError::Unreachable(DevAddr::Shm(a)));
        }
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_at(now, i, parts, len, true)
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

    fn quiet(&mut self) -> bool {
        // The same tick as a poll's (`poll_unreachable`): a quiet round
        // still counts toward the next liveness check, and the round that
        // reaches it polls.
        let quiet = self.quiet_rounds() > 0 && !self.seg.ring.ready();
        if quiet {
            self.liveness_tick += 1;
        }
        quiet
    }

    fn input_probe(&self) -> Option<std::sync::Arc<dyn rdm::device::InputProbe>> {
        Some(std::sync::Arc::new(RingProbe::of(&self.seg)))
    }

    fn quiet_rounds(&self) -> u32 {
        // As many as `quiet` would answer true for with the ring empty: up to
        // the round that checks the peers' liveness.
        if self.dead.is_empty() {
            (LIVENESS_EVERY - 1).saturating_sub(self.liveness_tick)
        } else {
            0
        }
    }

    fn rounds_skipped(&mut self, n: u32) {
        self.liveness_tick = self.liveness_tick.saturating_add(n).min(LIVENESS_EVERY - 1);
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
