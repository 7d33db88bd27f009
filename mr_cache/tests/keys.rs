//! The key table with the real monitor: a registration whose memory is
//! unmapped while open is revoked.
use mr_cache::monitor::Monitor;
use mr_cache::{KeyTable, MrError, Region};

#[test]
fn unmapping_registered_memory_revokes_its_key() {
    let len = 64 << 10;
    // SAFETY: a fresh anonymous mapping.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let addr = p as u64;
    let mut t = KeyTable::new(Monitor::global());
    let k = t.insert(Region::contiguous(addr, len as u64, 3), None).unwrap();
    assert!(t.check(k, addr, 8, 1, true).is_ok());
    // SAFETY: our mapping; only the key refers to it.
    assert_eq!(unsafe { libc::munmap(p, len) }, 0);
    assert_eq!(t.check(k, addr, 8, 1, true), Err(MrError::Unmapped(k)));
}
