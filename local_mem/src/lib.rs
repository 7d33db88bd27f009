//! # local_mem — application memory its owner vouched for
//!
//! [`LocalBuf`] names memory of this process: an address, a length and a
//! local key. Its constructor is `unsafe`: whoever calls it (the provider, for
//! the application's buffers) vouches that the memory stays valid while the
//! operation naming it is in flight. A `LocalBuf` is plain data (`Copy`), so
//! a copy can outlive that operation; holding one proves nothing about *now*.
//! Hence every access to its bytes is `unsafe` too: [`LocalBuf::bytes`],
//! [`LocalBuf::bytes_mut`] and [`LocalBuf::append_to`] are the only code that
//! turns its address into memory, and each caller states why the operation is
//! still in flight at that moment (a device inside the send call that handed
//! it the datagram; shm inside the read it completes). A NIC reaches the
//! memory only through a request a device posts in an unsafe call, whose
//! `SAFETY` line says the same. The engine crates (`rdm`, `rndv`) carry
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

    /// The bytes of this memory, to read: what a device copies into a bounce
    /// buffer when its NIC cannot gather.
    ///
    /// # Safety
    /// The operation this memory was vouched for ([`LocalBuf::new`]) is still
    /// in flight for as long as the slice is used: for a datagram's gathered
    /// part, the caller is inside the device call the datagram was handed to.
    #[allow(unsafe_code)]
    pub unsafe fn bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: valid for reads while the operation is in flight (the
        // vouch of `LocalBuf::new`), which the caller states it is.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len as usize) }
    }

    /// The bytes of this memory, to write: the destination of a read a device
    /// completes with the CPU (shm's `process_vm_readv`).
    ///
    /// # Safety
    /// As [`LocalBuf::bytes`], and nothing else reads or writes the memory
    /// while the slice is used (a posted read's destination is the read's
    /// alone until it completes).
    #[allow(unsafe_code)]
    pub unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as above; the caller states the memory is the read's alone.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len as usize) }
    }

    /// Appends the bytes of this memory to `v`: for devices that cannot
    /// gather and decorators that hold a datagram past its send call.
    ///
    /// # Safety
    /// The operation this memory was vouched for ([`LocalBuf::new`]) is still
    /// in flight: for a datagram's gathered part, the caller is inside the
    /// device call the datagram was handed to.
    #[allow(unsafe_code)]
    pub unsafe fn append_to(&self, v: &mut Vec<u8>) {
        // SAFETY: the caller states the operation is in flight (as `bytes`).
        v.extend_from_slice(unsafe { self.bytes() });
    }
}
