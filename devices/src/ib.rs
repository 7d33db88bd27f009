//! What the verbs UD device and the EFA device share of rdma-core: device
//! discovery (the device list, opening one, its ports), the protection
//! domain and memory registrations (keys, access bits, the registrar), the
//! registered receive and bounce slots of a datagram queue pair, the
//! non-blocking completion channel, the address-handle cache (`AhCache`:
//! verbs keeps one per endpoint, EFA one per domain) and the errors of these
//! calls. Each device keeps only its own queue pairs.
//!
//! Unsafe here: the rdma-core calls both devices share (device list, registrations, receives, AHs, channel fd).
#![allow(unsafe_code)]

use rdm::device::{DeviceError, Registrar};
use rdma_core_sys as ib;
use rustc_hash::FxHashMap;
use std::ffi::CStr;
use std::hash::Hash;
use std::io;
use std::ptr;
use std::sync::Arc;

// libfabric access bits, the values of <rdma/fabric.h> (rdm does not link
// libfabric): what `Registrar::register`'s `access` means here.
pub const FI_READ: u64 = 1 << 8;
pub const FI_WRITE: u64 = 1 << 9;
pub const FI_RECV: u64 = 1 << 10;
pub const FI_SEND: u64 = 1 << 11;
pub const FI_REMOTE_READ: u64 = 1 << 12;
pub const FI_REMOTE_WRITE: u64 = 1 << 13;

/// The verbs access flags for libfabric `access` bits. Local write (needed
/// by remote write, and by memory the NIC writes into: a read's target, a
/// receive buffer) is added where asked for; 0 means local write + remote
/// read. Memory registered for sending (`FI_SEND`) may also be read
/// remotely: a rendezvous receiver reads the announced buffer through its
/// key by RDMA read (EFA's provider registers for remote read likewise
/// where the device reads).
pub fn ibv_access(access: u64) -> u32 {
    let lw = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    let rr = ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    let rw = ib::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    if access == 0 {
        return lw | rr;
    }
    let mut f = 0;
    if access & (FI_READ | FI_RECV) != 0 {
        f |= lw;
    }
    if access & (FI_REMOTE_READ | FI_SEND) != 0 {
        f |= rr;
    }
    if access & FI_REMOTE_WRITE != 0 {
        f |= rw | lw;
    }
    f
}

/// The key a registration returns: rkey in the high half, lkey in the low.
pub fn mr_key(lkey: u32, rkey: u32) -> u64 {
    (rkey as u64) << 32 | lkey as u64
}

/// `(lkey, rkey)` of a key from [`mr_key`] (what the registrar returned).
pub fn mr_keys(key: u64) -> (u32, u32) {
    (key as u32, (key >> 32) as u32)
}

/// The Q_Key of a job: 31 bits (values with the high bit set are
/// privileged), the same on every endpoint of the job.
pub fn qkey_for(job_key: u64) -> u32 {
    let x = (job_key ^ (job_key >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 32) as u32) & 0x7fff_ffff
}

pub(crate) fn last_err(op: &'static str) -> DeviceError {
    DeviceError::io(op, io::Error::last_os_error())
}

/// Verbs calls return a positive errno (or -1 with errno set).
pub(crate) fn ret_err(op: &'static str, rc: i32) -> DeviceError {
    if rc > 0 {
        DeviceError::io(op, io::Error::from_raw_os_error(rc))
    } else {
        last_err(op)
    }
}

/// The device list, freed on drop (also the EFA device's discovery).
pub(crate) struct DeviceList {
    list: *mut *mut ib::ibv_device,
    pub(crate) n: usize,
}

impl DeviceList {
    pub(crate) fn get() -> DeviceList {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; a null list means no devices.
        let list = unsafe { ib::ibv_get_device_list(&mut n) };
        DeviceList { list, n: if list.is_null() { 0 } else { n.max(0) as usize } }
    }

    /// Devices in the list.
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    pub(crate) fn device(&self, i: usize) -> *mut ib::ibv_device {
        // SAFETY: i < n entries of the list ibv_get_device_list returned.
        unsafe { *self.list.add(i) }
    }

    pub(crate) fn name(&self, i: usize) -> String {
        // SAFETY: a device of the live list; the name is a NUL-terminated
        // string owned by the device.
        unsafe { CStr::from_ptr(ib::ibv_get_device_name(self.device(i))) }.to_string_lossy().into_owned()
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: the list from ibv_get_device_list, freed once; opened
            // contexts stay valid after it.
            unsafe { ib::ibv_free_device_list(self.list) };
        }
    }
}

/// An open device context, closed on drop unless taken.
pub(crate) struct OpenDev(pub(crate) *mut ib::ibv_context);

impl Drop for OpenDev {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a context from ibv_open_device with nothing allocated on it.
            unsafe { ib::ibv_close_device(self.0) };
        }
    }
}

pub(crate) fn query_port(ctx: *mut ib::ibv_context, port: u8) -> Option<ib::ibv_port_attr> {
    let mut attr = ib::ibv_port_attr::default();
    // SAFETY: verbs.h's `ibv_query_port` is a static inline that, without
    // the extended op, calls the exported symbol with the full (zeroed)
    // struct cast to the compat one, exactly as here; providers fill the
    // full struct.
    let rc =
        unsafe { ib::ibv_query_port(ctx, port, &mut attr as *mut ib::ibv_port_attr as *mut ib::_compat_ibv_port_attr) };
    (rc == 0).then_some(attr)
}

/// An `ibv_mr` pointer that may move between threads.
pub(crate) struct MrPtr(*mut ib::ibv_mr);

// SAFETY: an MR is a handle any thread may deregister (verbs are thread-safe).
unsafe impl Send for MrPtr {}

pub(crate) fn reg_mr(
    pd: *mut ib::ibv_pd,
    addr: *mut u8,
    len: usize,
    access: u32,
) -> Result<*mut ib::ibv_mr, DeviceError> {
    // SAFETY: the caller names memory of this process; registering it only
    // pins it (the NIC touches it only through requests naming its keys).
    let mr = unsafe { ib::ibv_reg_mr(pd, addr.cast(), len, access as i32) };
    if mr.is_null() {
        Err(last_err("ibv_reg_mr"))
    } else {
        Ok(mr)
    }
}

pub(crate) fn dereg_mr(mr: *mut ib::ibv_mr) {
    if !mr.is_null() {
        // SAFETY: an MR from ibv_reg_mr, deregistered once.
        unsafe { ib::ibv_dereg_mr(mr) };
    }
}

/// A context that owns a protection domain: what a [`PdRegistrar`]
/// registers with and keeps alive (the verbs UD context, the EFA one).
pub(crate) trait ProtectionDomain: Send + Sync + 'static {
    fn pd(&self) -> *mut ib::ibv_pd;
    /// Application memory is registered on demand (no pinning).
    fn on_demand(&self) -> bool {
        false
    }
    /// The verbs access bits this protection domain's device accepts for a
    /// memory region: [`PdRegistrar::register`] drops every other bit that
    /// [`ibv_access`] asks for. All bits by default (verbs UD takes them);
    /// EFA takes local write, and remote read only with its RDMA-read cap
    /// (`efa_alloc_mr` refuses any other bit with `EOPNOTSUPP`).
    fn access_mask(&self) -> u32 {
        u32::MAX
    }
}

/// Registers memory with a context's protection domain (verbs UD, EFA):
/// keys as [`mr_key`] builds them, access as [`ibv_access`] maps it, cut to
/// what the device accepts ([`ProtectionDomain::access_mask`]).
pub(crate) struct PdRegistrar<C: ProtectionDomain> {
    ctx: Arc<C>,
    mrs: FxHashMap<u64, MrPtr>,
}

impl<C: ProtectionDomain> PdRegistrar<C> {
    pub(crate) fn new(ctx: Arc<C>) -> PdRegistrar<C> {
        PdRegistrar { ctx, mrs: FxHashMap::default() }
    }
}

impl<C: ProtectionDomain> Registrar for PdRegistrar<C> {
    fn on_demand(&self) -> bool {
        self.ctx.on_demand()
    }

    fn register(&mut self, addr: u64, len: u64, access: u64) -> Result<u64, DeviceError> {
        // On demand (opted in, `VerbsConfig::odp`): the pages are neither
        // pinned nor faulted in now; the NIC faults them in when it reads or
        // writes them, and follows the mapping across an unmap and a new
        // mapping at the same address.
        let odp = if self.ctx.on_demand() { ib::ibv_access_flags::IBV_ACCESS_ON_DEMAND.0 } else { 0 };
        let mr =
            reg_mr(self.ctx.pd(), addr as *mut u8, len as usize, (ibv_access(access) & self.ctx.access_mask()) | odp)?;
        // SAFETY: a registered MR, readable until deregistered.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        let key = mr_key(lkey, rkey);
        if let Some(old) = self.mrs.insert(key, MrPtr(mr)) {
            // The device reused keys of an MR we still hold: impossible for
            // a live MR, so the old one is gone; keep the map honest.
            dereg_mr(old.0);
        }
        Ok(key)
    }

    fn deregister(&mut self, key: u64) {
        if let Some(mr) = self.mrs.remove(&key) {
            dereg_mr(mr.0);
        }
    }
}

impl<C: ProtectionDomain> Drop for PdRegistrar<C> {
    fn drop(&mut self) {
        for (_, mr) in self.mrs.drain() {
            dereg_mr(mr.0);
        }
    }
}

/// Why no address handle could be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AhError {
    /// The device refused the destination itself (no route, bad GID).
    Unreachable,
    /// No room now (the device is out of them, or every address handle the
    /// cache may hold is in use): try later.
    Busy,
}

/// `ibv_create_ah` errnos that mean "no room now" (the device's AH table,
/// kernel memory): back-pressure, not an unreachable peer.
pub(crate) fn ah_errno_is_no_room(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::ENOMEM | libc::EAGAIN | libc::ENOSPC | libc::ENOBUFS))
}

/// Where an [`AhCache`] counts what it does: each device's own stats
/// (verbs per endpoint, EFA per endpoint over the domain's cache). The
/// cases a device has no counter for do nothing.
pub(crate) trait AhCounters {
    /// An address handle was made.
    fn ah_created(&mut self);
    /// One no request used was destroyed to make room.
    fn ah_evicted(&mut self);
    /// One could not be made: the destination is unreachable.
    fn ah_failed(&mut self);
    /// The device refused one for want of room (`ENOMEM` and the like).
    fn ah_refused(&mut self) {}
    /// The cache was full and every address handle in it in use.
    fn ah_full(&mut self) {}
    /// No address handle now: the request waits (`AhError::Busy`).
    fn ah_busy(&mut self) {}
}

/// One cached address handle.
struct CachedAh {
    ah: *mut ib::ibv_ah,
    /// Requests that use it and have not completed: posted, or in a chain
    /// being built.
    users: u32,
    last_use: u64,
}

/// An address-handle cache (verbs UD: one per endpoint, keyed by GID and
/// LID; EFA: one per domain, shared by its endpoints, keyed by GID): at
/// most `cap` handles, each counted per request in flight that uses it
/// and destroyed only when none does and room is needed (least recently
/// used first). A full cache whose every handle is in use gives none
/// (`Busy`: the send waits), unless it grows when busy
/// ([`AhCache::growing_when_busy`], verbs: it then makes one beyond `cap`,
/// counted by `ah_full`); so does a device out of handles after one was
/// given back; a destination the device refuses is `Unreachable`.
///
/// Receive completions of some devices (EFA) name a sender that has an AH
/// by its number, so a number's key can be recorded ([`AhCache::insert`]'s
/// `ahn`) and is kept after the AH goes (a tombstone) until a new AH gets
/// that number: a completion written before its AH was destroyed still
/// carries the old number. Left: a datagram that arrived before an AH
/// was destroyed and is polled after a new AH (for another key) took its
/// number is named after the new key; the device gives no way to tell them
/// apart (eviction is rare: the cache holds `cap` peers).
pub(crate) struct AhCache<K> {
    by_key: FxHashMap<K, CachedAh>,
    key_by_ahn: FxHashMap<u16, K>,
    cap: usize,
    clock: u64,
    /// Test hook: creations still to refuse as a device out of address
    /// handles would (`ENOMEM`).
    refuse: u32,
    /// A full cache whose every AH is in use makes one more instead of
    /// answering `Busy` (verbs: its posted requests may wait for a signaled
    /// one behind them before they release theirs, so waiting could stall);
    /// counted by `ah_full`. EFA waits.
    grows_when_busy: bool,
}

impl<K: Copy + Eq + Hash> AhCache<K> {
    pub(crate) fn new(cap: usize) -> AhCache<K> {
        AhCache {
            by_key: FxHashMap::default(),
            key_by_ahn: FxHashMap::default(),
            cap: cap.max(1),
            clock: 0,
            refuse: 0,
            grows_when_busy: false,
        }
    }

    /// The same cache, growing past its bound rather than answering `Busy`
    /// when every AH is in use (see [`AhCache::grows_when_busy`]).
    pub(crate) fn growing_when_busy(self) -> AhCache<K> {
        AhCache { grows_when_busy: true, ..self }
    }

    /// Address handles cached now.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The bound of the cache.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// The AH for `key` if the cache has one, with one more user.
    #[inline]
    pub(crate) fn take(&mut self, key: &K) -> Option<*mut ib::ibv_ah> {
        self.clock += 1;
        let e = self.by_key.get_mut(key)?;
        e.users += 1;
        e.last_use = self.clock;
        Some(e.ah)
    }

    /// Whether a new AH needs one given back first.
    pub(crate) fn is_full(&self) -> bool {
        self.by_key.len() >= self.cap
    }

    /// A new AH for `key`, numbered `ahn` where the device numbers them,
    /// with one user.
    pub(crate) fn insert(&mut self, key: K, ah: *mut ib::ibv_ah, ahn: Option<u16>) {
        self.clock += 1;
        if let Some(n) = ahn {
            self.key_by_ahn.insert(n, key);
        }
        self.by_key.insert(key, CachedAh { ah, users: 1, last_use: self.clock });
    }

    /// `n` users of `key`'s AH are done with it.
    #[inline]
    pub(crate) fn release(&mut self, key: &K, n: u32) {
        if let Some(e) = self.by_key.get_mut(key) {
            debug_assert!(e.users >= n, "more AH releases than uses");
            e.users = e.users.saturating_sub(n);
        }
    }

    /// Takes out the least recently used AH no request uses, for the
    /// caller to destroy (its number stays mapped: a tombstone).
    pub(crate) fn evict_lru(&mut self) -> Option<*mut ib::ibv_ah> {
        let (&key, _) = self.by_key.iter().filter(|(_, e)| e.users == 0).min_by_key(|(_, e)| e.last_use)?;
        self.by_key.remove(&key).map(|e| e.ah)
    }

    /// The key of AH number `ahn`: of a live AH, or of the last one that
    /// had the number.
    pub(crate) fn key_of_ahn(&self, ahn: u16) -> Option<K> {
        self.key_by_ahn.get(&ahn).copied()
    }

    /// Every AH, taken out for the caller to destroy (its owner closes).
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = *mut ib::ibv_ah> + '_ {
        self.by_key.drain().map(|(_, e)| e.ah)
    }

    #[cfg(test)]
    pub(crate) fn users(&self, key: &K) -> Option<u32> {
        self.by_key.get(key).map(|e| e.users)
    }

    /// Test hook: the next `n` creations are refused as a device out of
    /// address handles would (`ENOMEM`).
    pub(crate) fn refuse_next_for_test(&mut self, n: u32) {
        self.refuse = n;
    }

    /// Destroys the least recently used AH no request uses; false: none.
    fn evict_one<S: AhCounters>(&mut self, stats: &mut S) -> bool {
        let Some(ah) = self.evict_lru() else { return false };
        // SAFETY: an AH of the owner's PD that no request in flight uses,
        // out of the cache: destroyed once.
        unsafe { ib::ibv_destroy_ah(ah) };
        stats.ah_evicted();
        true
    }

    /// The address handle for `key`, with one more user (one request;
    /// [`AhCache::release`] when it completes): the cached one, or a new
    /// one of `pd` made from `attr()`. `number` is asked for a new AH's
    /// number (`Ok(None)`: the device numbers none; `Err`: the AH is
    /// destroyed and the destination unreachable). `reclaim` may release
    /// uses (a device polling its send completions) when no unused AH is
    /// there to give back; it is called at most once per miss and then the
    /// eviction tried again.
    ///
    /// A full cache first gives back the least recently used AH no request
    /// uses; none (every one in use): `Busy`, or, in a cache that grows when
    /// busy, one more AH beyond `cap`. `ibv_create_ah` failing for
    /// want of room (errno cleared before the call, so an older errno is
    /// never read as this failure's) gives one back and tries once more,
    /// else `Busy`; any other failure is `Unreachable`.
    #[inline]
    pub(crate) fn acquire<S: AhCounters>(
        &mut self,
        pd: *mut ib::ibv_pd,
        key: K,
        attr: impl FnOnce() -> ib::ibv_ah_attr,
        number: impl FnOnce(*mut ib::ibv_ah) -> Result<Option<u16>, ()>,
        reclaim: impl FnMut(&mut AhCache<K>, &mut S),
        stats: &mut S,
    ) -> Result<*mut ib::ibv_ah, AhError> {
        if let Some(ah) = self.take(&key) {
            return Ok(ah);
        }
        self.create(pd, key, attr, number, reclaim, stats)
    }

    /// The miss of [`AhCache::acquire`].
    fn create<S: AhCounters>(
        &mut self,
        pd: *mut ib::ibv_pd,
        key: K,
        attr: impl FnOnce() -> ib::ibv_ah_attr,
        number: impl FnOnce(*mut ib::ibv_ah) -> Result<Option<u16>, ()>,
        mut reclaim: impl FnMut(&mut AhCache<K>, &mut S),
        stats: &mut S,
    ) -> Result<*mut ib::ibv_ah, AhError> {
        if self.is_full() && !self.evict_one(stats) {
            reclaim(self, stats);
            if !self.evict_one(stats) {
                stats.ah_full();
                if !self.grows_when_busy {
                    stats.ah_busy();
                    return Err(AhError::Busy);
                }
            }
        }
        let mut attr = attr();
        let mut retried = false;
        let ah = loop {
            let (ah, errno) = if self.refuse > 0 {
                self.refuse -= 1;
                (ptr::null_mut(), Some(libc::ENOMEM))
            } else {
                // SAFETY: errno is this thread's; then a live PD and a
                // valid attribute struct. errno is cleared first so that a
                // failure that sets none is not read as an older EAGAIN.
                let ah = unsafe {
                    *libc::__errno_location() = 0;
                    ib::ibv_create_ah(pd, &mut attr)
                };
                (ah, io::Error::last_os_error().raw_os_error().filter(|&e| e != 0))
            };
            if !ah.is_null() {
                break ah;
            }
            if !ah_errno_is_no_room(errno) {
                stats.ah_failed();
                return Err(AhError::Unreachable);
            }
            // The device is out of address handles (its limit can be below
            // `max_ah`) or memory: give one back and try once more, else
            // let the request wait for those in flight to release theirs.
            stats.ah_refused();
            if !retried {
                retried = true;
                if self.evict_one(stats) {
                    continue;
                }
                reclaim(self, stats);
                if self.evict_one(stats) {
                    continue;
                }
            }
            stats.ah_busy();
            return Err(AhError::Busy);
        };
        let Ok(ahn) = number(ah) else {
            // SAFETY: the AH just made, used by nothing.
            unsafe { ib::ibv_destroy_ah(ah) };
            stats.ah_failed();
            return Err(AhError::Unreachable);
        };
        self.insert(key, ah, ahn);
        stats.ah_created();
        Ok(ah)
    }
}

/// A queue pair's receive slots: one registered buffer cut into `count`
/// slots of `slot_len` bytes, posted by slot number (the work request id),
/// shared by the UD and EFA devices. Its registration is released by
/// [`ReceiveSlots::deregister`], which the owning device calls in its Drop
/// after destroying the queue pair and before its context can go.
pub(crate) struct ReceiveSlots {
    buf: Box<[u8]>,
    mr: *mut ib::ibv_mr,
    slot_len: usize,
    wrs: Vec<ib::ibv_recv_wr>,
    sges: Vec<ib::ibv_sge>,
}

impl ReceiveSlots {
    /// `count` slots of `slot_len` bytes, registered for the NIC to write.
    pub(crate) fn new(pd: *mut ib::ibv_pd, slot_len: usize, count: u32) -> Result<ReceiveSlots, DeviceError> {
        let mut buf = vec![0u8; slot_len * count as usize].into_boxed_slice();
        let mr = reg_mr(pd, buf.as_mut_ptr(), buf.len().max(1), ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0)?;
        Ok(ReceiveSlots {
            buf,
            mr,
            slot_len,
            wrs: Vec::with_capacity(count as usize),
            sges: Vec::with_capacity(count as usize),
        })
    }

    pub(crate) fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// The first `len` bytes of slot `slot` (`len` at most `slot_len`).
    pub(crate) fn bytes(&self, slot: usize, len: usize) -> &[u8] {
        let off = slot * self.slot_len;
        &self.buf[off..off + len.min(self.slot_len)]
    }

    /// Posts slots `slots` on `qp` as one chain.
    pub(crate) fn post(&mut self, qp: *mut ib::ibv_qp, slots: impl Iterator<Item = u32>) -> Result<(), DeviceError> {
        self.wrs.clear();
        self.sges.clear();
        // SAFETY: the MR is live (deregistered only by `deregister`).
        let lkey = unsafe { (*self.mr).lkey };
        let base = self.buf.as_mut_ptr() as u64;
        for s in slots {
            self.sges.push(ib::ibv_sge {
                addr: base + s as u64 * self.slot_len as u64,
                length: self.slot_len as u32,
                lkey,
            });
            self.wrs.push(ib::ibv_recv_wr {
                wr_id: s as u64,
                next: ptr::null_mut(),
                sg_list: ptr::null_mut(),
                num_sge: 1,
            });
        }
        if self.wrs.is_empty() {
            return Ok(());
        }
        // Link after every push: the vectors no longer move.
        let n = self.wrs.len();
        for i in 0..n {
            self.wrs[i].sg_list = &mut self.sges[i];
            if i + 1 < n {
                let next: *mut ib::ibv_recv_wr = &mut self.wrs[i + 1];
                self.wrs[i].next = next;
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: a chain of valid WRs whose SGEs name slots of the
        // registered buffer, which lives as long as the QP (its owner
        // destroys the QP before `deregister`).
        let rc = unsafe { ib::ibv_post_recv(qp, self.wrs.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(ret_err("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Releases the registration (once; later calls do nothing).
    pub(crate) fn deregister(&mut self) {
        dereg_mr(std::mem::replace(&mut self.mr, ptr::null_mut()));
    }
}

/// Registered slots a send copies its bytes into (UD and EFA devices): the
/// slot is the send's until its completion gives it back, so the caller's
/// buffer is free as soon as the post returns. One slot per send queue
/// entry, so a send with room in the queue always finds one. Released by
/// [`BounceSlots::deregister`] in the owning device's Drop.
pub(crate) struct BounceSlots {
    buf: Box<[u8]>,
    mr: *mut ib::ibv_mr,
    slot_len: usize,
    free: Vec<u32>,
}

impl BounceSlots {
    pub(crate) fn new(pd: *mut ib::ibv_pd, slot_len: usize, count: u32) -> Result<BounceSlots, DeviceError> {
        let mut buf = vec![0u8; slot_len * count as usize].into_boxed_slice();
        let mr = reg_mr(pd, buf.as_mut_ptr(), buf.len().max(1), 0)?;
        Ok(BounceSlots { buf, mr, slot_len, free: (0..count).rev().collect() })
    }

    /// Slots free now.
    pub(crate) fn available(&self) -> usize {
        self.free.len()
    }

    /// Copies `parts`, one after another (at most `slot_len` bytes in all),
    /// into a free slot: the slot and the SGE naming its bytes; `None` when
    /// every slot is taken.
    pub(crate) fn copy_in(&mut self, parts: &[&[u8]]) -> Option<(u32, ib::ibv_sge)> {
        let slot = self.free.pop()?;
        let off = slot as usize * self.slot_len;
        let mut len = 0;
        for p in parts {
            self.buf[off + len..off + len + p.len()].copy_from_slice(p);
            len += p.len();
        }
        // SAFETY: the MR is live (deregistered only by `deregister`).
        let lkey = unsafe { (*self.mr).lkey };
        Some((slot, ib::ibv_sge { addr: self.buf[off..].as_ptr() as u64, length: len as u32, lkey }))
    }

    /// A slot's send completed (or was never posted).
    pub(crate) fn give_back(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Releases the registration (once; later calls do nothing).
    pub(crate) fn deregister(&mut self) {
        dereg_mr(std::mem::replace(&mut self.mr, ptr::null_mut()));
    }
}

/// A completion channel whose fd does not block (`ibv_get_cq_event` then
/// returns at once when no event is waiting).
pub(crate) fn nonblocking_channel(ctx: *mut ib::ibv_context) -> Result<*mut ib::ibv_comp_channel, DeviceError> {
    // SAFETY: an open context.
    let channel = unsafe { ib::ibv_create_comp_channel(ctx) };
    if channel.is_null() {
        return Err(last_err("ibv_create_comp_channel"));
    }
    // SAFETY: the channel is live; its fd is a plain fd we may set flags on.
    let fd = unsafe { (*channel).fd };
    // SAFETY: fcntl on an fd we own.
    let rc = unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK)
    };
    if rc < 0 {
        let e = last_err("fcntl(O_NONBLOCK)");
        // SAFETY: the channel just made, with no CQ on it.
        unsafe { ib::ibv_destroy_comp_channel(channel) };
        return Err(e);
    }
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_ah(n: usize) -> *mut ib::ibv_ah {
        // Never dereferenced: the cache only keeps and hands back pointers.
        n as *mut ib::ibv_ah
    }

    #[test]
    fn ah_cache_shares_counts_uses_and_evicts_only_unused_lru() {
        let (a, b, c) = ([1u8; 16], [2u8; 16], [3u8; 16]);
        let mut t = AhCache::new(2);
        assert_eq!(t.take(&a), None);
        t.insert(a, fake_ah(0x10), Some(7));
        assert_eq!(t.take(&a), Some(fake_ah(0x10)), "one AH per key, shared");
        assert_eq!(t.users(&a), Some(2));
        t.insert(b, fake_ah(0x20), Some(8));
        assert!(t.is_full());
        // Both in use: nothing can go (the caller answers Busy).
        assert_eq!(t.evict_lru(), None);
        t.release(&b, 1);
        assert_eq!(t.evict_lru(), Some(fake_ah(0x20)));
        assert!(!t.is_full());
        // b's number still names b (a tombstone) for completions written
        // before its AH went.
        assert_eq!(t.key_of_ahn(8), Some(b));
        assert_eq!(t.take(&b), None);
        // Least recently used among the unused goes first.
        t.release(&a, 2);
        t.insert(c, fake_ah(0x30), Some(9));
        t.release(&c, 1);
        assert_eq!(t.take(&a), Some(fake_ah(0x10)));
        t.release(&a, 1);
        assert_eq!(t.evict_lru(), Some(fake_ah(0x30)));
        assert_eq!(t.key_of_ahn(9), Some(c));
        // A new AH that gets a tombstone's number takes it over.
        t.insert(b, fake_ah(0x40), Some(9));
        assert_eq!(t.key_of_ahn(9), Some(b));
        assert_eq!(t.key_of_ahn(7), Some(a));
        assert_eq!(t.key_of_ahn(99), None, "never given: unknown");
        // Unnumbered AHs (verbs UD) take no number over.
        assert_eq!(t.take(&a), Some(fake_ah(0x10)));
        t.release(&b, 1);
        assert_eq!(t.evict_lru(), Some(fake_ah(0x40)), "a is in use: b goes");
        t.insert(c, fake_ah(0x50), None);
        assert_eq!(t.key_of_ahn(9), Some(b));
        let mut left: Vec<_> = t.drain().collect();
        left.sort();
        assert_eq!(left, vec![fake_ah(0x10), fake_ah(0x50)]);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn ah_errnos_that_mean_no_room_are_back_pressure() {
        for e in [libc::ENOMEM, libc::EAGAIN, libc::ENOSPC, libc::ENOBUFS] {
            assert!(ah_errno_is_no_room(Some(e)));
        }
        for e in [Some(libc::EINVAL), Some(libc::EOPNOTSUPP), Some(libc::ENODEV), None] {
            assert!(!ah_errno_is_no_room(e));
        }
    }

    #[derive(Default, Debug, PartialEq)]
    struct Counts {
        created: u32,
        evicted: u32,
        failed: u32,
        refused: u32,
        full: u32,
        busy: u32,
    }

    impl AhCounters for Counts {
        fn ah_created(&mut self) {
            self.created += 1;
        }
        fn ah_evicted(&mut self) {
            self.evicted += 1;
        }
        fn ah_failed(&mut self) {
            self.failed += 1;
        }
        fn ah_refused(&mut self) {
            self.refused += 1;
        }
        fn ah_full(&mut self) {
            self.full += 1;
        }
        fn ah_busy(&mut self) {
            self.busy += 1;
        }
    }

    /// The paths of `acquire` that reach no verbs call (no device here): a
    /// hit, a full cache of handles in use (`Busy`, the bound holds, after
    /// one `reclaim`), and refused creations with nothing to give back.
    #[test]
    fn ah_cache_acquire_holds_its_bound_and_waits_when_refused() {
        let pd = ptr::null_mut();
        let attr = ib::ibv_ah_attr::default;
        let mut c = Counts::default();
        let mut t = AhCache::new(1);
        t.insert(1u8, fake_ah(0x10), None);
        assert_eq!(
            t.acquire(pd, 1, attr, |_| Ok(None), |_, _| panic!("a hit reclaims nothing"), &mut c),
            Ok(fake_ah(0x10))
        );
        assert_eq!(t.users(&1), Some(2));
        let mut reclaims = 0;
        let got = t.acquire(pd, 2, attr, |_| Ok(None), |_, _| reclaims += 1, &mut c);
        assert_eq!(got, Err(AhError::Busy));
        assert_eq!(reclaims, 1);
        assert_eq!(t.len(), 1, "never beyond the bound");
        assert_eq!(c, Counts { full: 1, busy: 1, ..Counts::default() });
        // Refused twice with nothing to give back: Busy, after one reclaim,
        // each refusal counted; the hook's count is used up.
        let mut t: AhCache<u8> = AhCache::new(4);
        t.refuse_next_for_test(2);
        let mut c = Counts::default();
        let mut reclaims = 0;
        assert_eq!(t.acquire(pd, 3, attr, |_| Ok(None), |_, _| reclaims += 1, &mut c), Err(AhError::Busy));
        assert_eq!((reclaims, t.refuse), (1, 1));
        assert_eq!(c, Counts { refused: 1, busy: 1, ..Counts::default() });
        assert_eq!(t.acquire(pd, 3, attr, |_| Ok(None), |_, _| {}, &mut c), Err(AhError::Busy));
        assert_eq!(c, Counts { refused: 2, busy: 2, ..Counts::default() });
        assert_eq!((t.refuse, t.len()), (0, 0));
    }
}
