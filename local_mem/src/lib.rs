//! # local_mem — application memory its owner vouched for
//!
//! [`LocalBuf`] names memory of this process: an address, a length and a
//! local key. Its constructor is `unsafe`: whoever calls it (the provider, for
//! the application's buffers) vouches that the memory stays valid while the
//! operation naming it is in flight. A `LocalBuf` is plain data (`Copy`), so
//! a copy can outlive that operation; holding one proves nothing about *now*.
//! Hence every access to its bytes is `unsafe` too: [`LocalBuf::with_bytes`],
//! [`LocalBuf::with_bytes_mut`] and [`LocalBuf::append_to`] are the only code that
//! turns its address into memory, and each caller states why the operation is
//! still in flight at that moment (a device inside the send call that handed
//! it the datagram; shm inside the read it completes). A NIC reaches the
//! memory only through a request a device posts in an unsafe call, whose
//! `SAFETY` line says the same; such a request may be read by the NIC after
//! the call returns (a retransmission of a gathered datagram whose original
//! was acknowledged meanwhile), which the registration the memory is read
//! under keeps from faulting, and whose bytes the receiver then discards as a
//! duplicate. The engine crates (`rdm`, `rndv`) carry
//! such buffers and forbid unsafe code, so they never read one: a datagram a
//! device did not take goes back to the rdm engine
//! (`rdm::engine::Engine::not_transmitted`) rather than being copied.
#![deny(unsafe_code)]

/// Application memory a device reads or writes (a posted remote read writes
/// into it, maybe later, from a NIC; a gathered datagram is read from it),
/// with the local registration key where the device needs one. Built only
/// through the `unsafe` [`LocalBuf::new`]: whoever names memory vouches for
/// it, so that devices can take it through a safe call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalBuf {
    addr: u64,
    len: u64,
    key: Option<u64>,
}

impl LocalBuf {
    /// # Safety
    /// `addr..addr+len` is memory of this process that stays valid, and is
    /// not read or written by anything else, until the read naming it has
    /// completed (the device's `poll_read` returned its id) or the device is
    /// dropped; for a datagram's gathered part, until its message completes.
    // Declaring the contract is unsafe; nothing here dereferences.
    #[allow(unsafe_code)]
    pub unsafe fn new(addr: u64, len: u64) -> LocalBuf {
        LocalBuf { addr, len, key: None }
    }

    /// The same memory, with the local key of a registration covering it.
    pub fn with_key(self, key: u64) -> LocalBuf {
        LocalBuf { key: Some(key), ..self }
    }

    /// `len` bytes from `off` of this memory (same key), or `None` past its
    /// end: a piece of vouched memory is vouched for.
    pub fn sub(&self, off: u64, len: u64) -> Option<LocalBuf> {
        let end = off.checked_add(len)?;
        (end <= self.len).then(|| LocalBuf { addr: self.addr + off, len, key: self.key })
    }

    pub fn addr(&self) -> u64 {
        self.addr
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn key(&self) -> Option<u64> {
        self.key
    }

    /// Calls `f` with the bytes of this memory, to read: what a device copies
    /// into a bounce buffer when its NIC cannot gather. The slice lives only
    /// for the call, so it cannot outlive the moment the caller vouches for.
    ///
    /// # Safety
    /// The operation this memory was vouched for ([`LocalBuf::new`]) is still
    /// in flight: for a datagram's gathered part, the caller is inside the
    /// device call the datagram was handed to.
    #[allow(unsafe_code)]
    pub unsafe fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        if self.len == 0 {
            return f(&[]);
        }
        // SAFETY: valid for reads while the operation is in flight (the
        // vouch of `LocalBuf::new`), which the caller states it is; the slice
        // does not outlive `f`.
        f(unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len as usize) })
    }

    /// Calls `f` with the bytes of this memory, to write: the destination of a
    /// read a device completes with the CPU (shm's `process_vm_readv`).
    ///
    /// # Safety
    /// As [`LocalBuf::with_bytes`], and nothing else reads or writes the
    /// memory during the call (a posted read's destination is the read's
    /// alone until it completes).
    #[allow(unsafe_code)]
    pub unsafe fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        if self.len == 0 {
            return f(&mut []);
        }
        // SAFETY: as above; the caller states the memory is the read's alone.
        f(unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize) })
    }

    /// Appends the bytes of this memory to `v`, inside the call that handed
    /// the memory over: for decorators that then hold their copy past it.
    ///
    /// # Safety
    /// The operation this memory was vouched for ([`LocalBuf::new`]) is still
    /// in flight: for a datagram's gathered part, the caller is inside the
    /// device call the datagram was handed to.
    #[allow(unsafe_code)]
    pub unsafe fn append_to(&self, v: &mut Vec<u8>) {
        // SAFETY: the caller states the operation is in flight (as `with_bytes`).
        unsafe { self.with_bytes(|b| v.extend_from_slice(b)) }
    }
}
