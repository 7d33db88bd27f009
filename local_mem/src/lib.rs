//! # local_mem — application memory its owner vouched for
//!
//! [`LocalBuf`] names memory of this process: an address, a length and a
//! local key. Its constructor is `unsafe`: whoever calls it (the provider, for
//! the application's buffers) vouches that the memory stays valid while the
//! operation naming it is in flight. A `LocalBuf` is plain data (`Copy`), so
//! a copy can outlive that operation; holding one proves nothing about *now*.
//! Hence every read of its bytes is `unsafe` too ([`LocalBuf::append_to`]),
//! and its caller states why the operation is still in flight at that moment
//! (a device inside the send call that handed the datagram over; a NIC posted
//! a read while its pull is pending). The engine crates (`rdm`, `rndv`) carry
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

    /// Appends the bytes of this memory to `v`: for devices that cannot
    /// gather and decorators that hold a datagram past its send call.
    ///
    /// # Safety
    /// The operation this memory was vouched for ([`LocalBuf::new`]) is still
    /// in flight: for a datagram's gathered part, the caller is inside the
    /// device call the datagram was handed to.
    #[allow(unsafe_code)]
    pub unsafe fn append_to(&self, v: &mut Vec<u8>) {
        if self.len == 0 {
            return;
        }
        // SAFETY: the memory is valid for reads while the operation naming it
        // is in flight, as whoever built this vouched ([`LocalBuf::new`]), and
        // the caller states it is.
        v.extend_from_slice(unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len as usize) });
    }
}
