//! The receive ring of the shared-memory device: a bounded lock-free queue of
//! datagrams in memory that several processes map (the layout of its header and
//! slots, and the push, pop and wake-up protocol on them), with its loom model
//! checks. It is apart from the device because it knows no files, peers or
//! system calls, only a pointer and a length: the same code runs on a heap buffer
//! in the unit tests and, with loom's atomics, inside the loom models below.
//!
//! Unsafe here: the header, slot headers and payloads are reached through raw pointers into the shared segment.
#![allow(unsafe_code)]

use sync::{fence, AtomicU32, AtomicU64, Ordering};

/// The atomics the ring is made of: the machine's, or under `cfg(all(test, loom))`
/// loom's, so that the model checker sees every access (see `loom_tests`).
pub(super) mod sync {
    #[cfg(all(test, loom))]
    pub(in crate::shm) use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
    pub(in crate::shm) use std::sync::atomic::Ordering;
    #[cfg(not(all(test, loom)))]
    pub(in crate::shm) use std::sync::atomic::{fence, AtomicU32, AtomicU64};
}

pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"RDMXSHM1");
/// 2: the rdm datagrams in the slots go without a checksum (rdm `PROTOCOL.md`
/// §2.4), which a version-1 peer would drop as malformed: the two never attach.
const VERSION: u32 = 2;
#[cfg(not(all(test, loom)))]
pub(super) const HEADER_SIZE: usize = 256;
#[cfg(not(all(test, loom)))]
const SLOT_HDR: usize = 32;
// Loom's atomics are bigger than the machine's: under loom the layout grows to fit
// them (such rings only live on the heap of a model, never in a shared file).
#[cfg(all(test, loom))]
pub(super) const HEADER_SIZE: usize = (std::mem::size_of::<Header>() + 63) & !63;
#[cfg(all(test, loom))]
const SLOT_HDR: usize = (std::mem::size_of::<SlotHdr>() + 7) & !7;

/// The ring header at offset 0 of the segment. Every field is atomic: the memory
/// is shared with other processes.
#[repr(C)]
pub(super) struct Header {
    /// [`MAGIC`] once the owner finished initialising (release store).
    magic: AtomicU64,
    version: AtomicU32,
    slot_count: AtomicU32,
    slot_size: AtomicU32,
    mtu: AtomicU32,
    pub(super) owner_pid: AtomicU32,
    /// Set by the owner before it unlinks the ring.
    pub(super) closed: AtomicU32,
    pub(super) ring_id: AtomicU64,
    /// Where the owner mapped this header (for the remote-read probe).
    pub(super) owner_hdr_addr: AtomicU64,
    /// 1 while the owner holds its senders back ([`Device::hold_back_senders`](rdm::device::Device::hold_back_senders):
    /// its engine paused at its unexpected-message limit): senders then
    /// write no message straight in (`write`) and send sequenced
    /// ones only, which its window holds. Zero in a ring of an older rdmx
    /// (the file is created zeroed), which never sets it.
    pub(super) held_back: AtomicU32,
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
pub(super) struct Ring {
    pub(super) base: *mut u8,
    pub(super) slots: u64,
    slot_size: usize,
    pub(super) mtu: usize,
}

// SAFETY: a Ring is a pair of pointers into memory shared between processes and
// accessed only through atomics or slots owned through the sequence protocol; it
// has no thread affinity. The memory outlives the Ring (see `init` / `attach`).
unsafe impl Send for Ring {}

// The methods the device calls per datagram are `#[inline]`: from another
// module they would land in another codegen unit and stay out of line, a call
// per push and per pop that the device did not make when it shared a file with
// the ring.
impl Ring {
    /// Initialises a ring in `len` bytes at `base` and publishes it.
    ///
    /// # Safety
    /// `base` is 8-byte aligned, valid for reads and writes of `len` bytes for the
    /// life of the returned `Ring`, and nobody else writes it during the call.
    pub(super) unsafe fn init(base: *mut u8, len: usize, slots: usize, mtu: usize, pid: u32, ring_id: u64) -> Ring {
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
    pub(super) unsafe fn attach(base: *mut u8, len: usize) -> Result<Ring, String> {
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

    #[inline]
    pub(super) fn header(&self) -> &Header {
        // SAFETY: `base` points at a live, aligned segment of at least HEADER_SIZE
        // bytes (init/attach contract); Header is all atomics.
        unsafe { &*(self.base as *const Header) }
    }

    #[inline]
    fn slot_ptr(&self, pos: u64) -> *mut u8 {
        let i = (pos & (self.slots - 1)) as usize;
        // SAFETY: i < slots, so the slot lies inside the segment (geometry checked
        // in init/attach).
        unsafe { self.base.add(HEADER_SIZE + i * self.slot_size) }
    }

    #[inline]
    fn slot(&self, pos: u64) -> &SlotHdr {
        // SAFETY: slot_ptr is inside the segment and 8-aligned (HEADER_SIZE and
        // slot_size are multiples of 64); SlotHdr is all atomics.
        unsafe { &*(self.slot_ptr(pos) as *const SlotHdr) }
    }

    /// Appends a datagram; false if the ring is full. `data.len() <= self.mtu`.
    #[cfg(test)]
    pub(super) fn try_push(&self, src_pid: u32, src_ring: u64, data: &[u8]) -> bool {
        self.try_push_parts(src_pid, src_ring, &[data], data.len())
    }

    /// [`Ring::try_push`] of one datagram given as a gather list of `len`
    /// bytes in all, copied back to back into the cell.
    #[inline]
    pub(super) fn try_push_parts(&self, src_pid: u32, src_ring: u64, parts: &[&[u8]], len: usize) -> bool {
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

    /// Another view of the same ring, for a reader of [`Ring::ready`] on
    /// another thread (the input probe); the consumer stays the one that
    /// pops.
    pub(super) fn view(&self) -> Ring {
        Ring { base: self.base, slots: self.slots, slot_size: self.slot_size, mtu: self.mtu }
    }

    /// Whether the next position holds a datagram (consumer side).
    #[inline]
    pub(super) fn ready(&self) -> bool {
        let pos = self.header().head.load(Ordering::Relaxed);
        self.slot(pos).seq.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Lends the next datagram to `f` and frees its slot; false if the ring is
    /// empty. Only the ring's single consumer may call this.
    #[inline]
    pub(super) fn pop(&self, f: &mut dyn FnMut(u32, u64, &[u8])) -> bool {
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
    #[inline]
    pub(super) fn arm(&self) {
        self.header().armed.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Producer, after its pushes and a `fence(SeqCst)`: whether the consumer
    /// armed, in which case this producer (alone) disarmed it and must wake it.
    #[inline]
    pub(super) fn take_armed(&self) -> bool {
        let h = self.header();
        h.armed.load(Ordering::Relaxed) != 0 && h.armed.swap(0, Ordering::AcqRel) != 0
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
