//! RMA and atomics (emulated over messages) through the public API: write, read,
//! writedata with remote CQ data, atomics (sum, fetch, compare-swap), and the
//! error paths: a wrong key or an out-of-range access fails at the initiator and
//! leaves the target untouched.
use fi_tests::*;
use std::ptr::null_mut;

const RMA_CAPS: u64 = fi::FI_RMA as u64 | fi::FI_ATOMIC as u64;

struct Target {
    mr: *mut fi::fid_mr,
}

fn register(s: &Stack, buf: &mut [u8], key: u64) -> Target {
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let ret = unsafe {
        fi::fi_mr_reg(s.domain, buf.as_mut_ptr() as *const _, buf.len(), access, 0, key, 0, &mut mr, null_mut())
    };
    assert_eq!(ret, 0);
    Target { mr }
}

impl Drop for Target {
    fn drop(&mut self) {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { assert_eq!(fi::fi_close(&mut (*self.mr).fid), 0) };
    }
}

fn run(domain: &str, mr_mode: i32) {
    let a = Stack::open_caps(Some(domain), fi::FI_AV_MAP, RMA_CAPS, mr_mode);
    let b = Stack::open_caps(Some(domain), fi::FI_AV_MAP, RMA_CAPS, mr_mode);
    let b_at_a = a.insert(&b.name());
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let virt = unsafe { (*a.info.first().domain_attr).mr_mode } & fi::FI_MR_VIRT_ADDR as i32 != 0;
    let mut window = vec![0u8; 4096];
    let base = if virt { window.as_ptr() as u64 } else { 0 };
    let t = register(&b, &mut window, 0x77);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let key = unsafe { fi::fi_mr_key(t.mr) };
    let (ca, cb) = (&a, &b);
    let wait_ok = || ca.wait_cq(&[cb]).expect("RMA completion");

    // Write, then read back.
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_write(a.ep, data.as_ptr() as *const _, 1000, null_mut(), b_at_a, base + 100, key, null_mut()),
            0
        )
    };
    let c = wait_ok();
    assert_ne!(c.flags & (fi::FI_RMA | fi::FI_WRITE) as u64, 0);
    assert_eq!(&window[100..1100], &data[..]);
    let mut back = vec![0u8; 1000];
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_read(a.ep, back.as_mut_ptr() as *mut _, 1000, null_mut(), b_at_a, base + 100, key, null_mut()),
            0
        )
    };
    let c = wait_ok();
    assert_ne!(c.flags & fi::FI_READ as u64, 0);
    assert_eq!(back, data);

    // writedata: the target sees the CQ data.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_writedata(a.ep, data.as_ptr() as *const _, 8, null_mut(), 0xabc, b_at_a, base, key, null_mut()),
            0
        )
    };
    wait_ok();
    let rc = b.wait_cq(&[&a]).expect("remote write completion");
    assert_ne!(rc.flags & fi::FI_REMOTE_CQ_DATA as u64, 0);
    assert_eq!(rc.data, 0xabc);

    // Atomics on a u64 at offset 2048.
    let off = base + 2048;
    window[2048..2056].copy_from_slice(&40u64.to_le_bytes());
    let two = 2u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_atomic(
                a.ep,
                &two as *const _ as *const _,
                1,
                null_mut(),
                b_at_a,
                off,
                key,
                fi::FI_UINT64,
                fi::FI_SUM,
                null_mut()
            ),
            0
        )
    };
    wait_ok();
    assert_eq!(u64::from_le_bytes(window[2048..2056].try_into().unwrap()), 42);
    let mut old = 0u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_fetch_atomic(
                a.ep,
                &two as *const _ as *const _,
                1,
                null_mut(),
                &mut old as *mut _ as *mut _,
                null_mut(),
                b_at_a,
                off,
                key,
                fi::FI_UINT64,
                fi::FI_SUM,
                null_mut()
            ),
            0
        )
    };
    wait_ok();
    assert_eq!(old, 42);
    let (cmp, swap) = (44u64, 7u64);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_compare_atomic(
                a.ep,
                &swap as *const _ as *const _,
                1,
                null_mut(),
                &cmp as *const _ as *const _,
                null_mut(),
                &mut old as *mut _ as *mut _,
                null_mut(),
                b_at_a,
                off,
                key,
                fi::FI_UINT64,
                fi::FI_CSWAP,
                null_mut()
            ),
            0
        )
    };
    wait_ok();
    assert_eq!(old, 44);
    assert_eq!(u64::from_le_bytes(window[2048..2056].try_into().unwrap()), 7);
    let mut count = 0usize;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_atomicvalid(a.ep, fi::FI_UINT64, fi::FI_SUM, &mut count), 0);
        assert!(count >= 1);
        assert_eq!(fi::fi_compare_atomicvalid(a.ep, fi::FI_UINT64, fi::FI_SUM, &mut count), neg(fi::FI_EOPNOTSUPP));
    }

    // Wrong key, and out of range: error at the initiator, target untouched.
    let snapshot = window.clone();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(fi::fi_write(a.ep, data.as_ptr() as *const _, 16, null_mut(), b_at_a, base, key + 1, null_mut()), 0)
    };
    let e = a.wait_cq(&[&b]).unwrap_err();
    assert_eq!(e.err, fi::FI_EACCES as i32);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_write(a.ep, data.as_ptr() as *const _, 16, null_mut(), b_at_a, base + 4090, key, null_mut()),
            0
        )
    };
    let e = a.wait_cq(&[&b]).unwrap_err();
    assert_eq!(e.err, fi::FI_EACCES as i32);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_atomic(
                a.ep,
                &two as *const _ as *const _,
                1,
                null_mut(),
                b_at_a,
                base + 4095,
                key,
                fi::FI_UINT64,
                fi::FI_SUM,
                null_mut()
            ),
            0
        )
    };
    let e = a.wait_cq(&[&b]).unwrap_err();
    assert_eq!(e.err, fi::FI_EACCES as i32);
    for _ in 0..20 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    assert!(window == snapshot, "a refused access changed target memory");
    drop(t);
}

#[test]
fn rma_and_atomics_with_offsets_and_user_keys_udp() {
    run("udp", 0);
}

#[test]
fn rma_and_atomics_with_virtual_addresses_and_provider_keys_shm() {
    run("shm", (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY | fi::FI_MR_ALLOCATED) as i32);
}

#[test]
fn rma_and_atomics_on_the_auto_device() {
    run("auto", (fi::FI_MR_PROV_KEY) as i32);
}

/// One buffer; two segments of it registered under one key with a 1 KiB gap
/// between them. Every write that touches the gap, or goes through a closed
/// (revoked) key, fails at the initiator and leaves the whole buffer unchanged
/// byte for byte; writes inside the segments land exactly there.
fn gap_and_revoked_key(mr_mode: i32) {
    let a = Stack::open_caps(Some("udp"), fi::FI_AV_MAP, RMA_CAPS, mr_mode);
    let b = Stack::open_caps(Some("udp"), fi::FI_AV_MAP, RMA_CAPS, mr_mode);
    let b_at_a = a.insert(&b.name());
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let virt = unsafe { (*a.info.first().domain_attr).mr_mode } & fi::FI_MR_VIRT_ADDR as i32 != 0;
    let mut buf = vec![0x5au8; 4096];
    let p = buf.as_mut_ptr();
    // Segment 1: [0, 1024); gap: [1024, 2048); segment 2: [2048, 3072).
    let iov = [
        libc::iovec { iov_base: p as *mut _, iov_len: 1024 },
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        libc::iovec { iov_base: unsafe { p.add(2048) } as *mut _, iov_len: 1024 },
    ];
    let offset = 0x4000u64;
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        assert_eq!(
            fi::fi_mr_regv(b.domain, iov.as_ptr() as *const _, 2, access, offset, 0x99, 0, &mut mr, null_mut()),
            0
        )
    };
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let key = unsafe { fi::fi_mr_key(mr) };
    // Remote addresses of the bytes: virtual addresses, or `offset` + position in
    // the segments laid back to back (honouring fi_mr_regv's offset).
    let seg1 = if virt { p as u64 } else { offset };
    let seg2 = if virt { p as u64 + 2048 } else { offset + 1024 };
    let write = |addr: u64, data: &[u8], key: u64| -> Result<(), i32> {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe {
            assert_eq!(
                fi::fi_write(a.ep, data.as_ptr() as *const _, data.len(), null_mut(), b_at_a, addr, key, null_mut()),
                0
            )
        };
        a.wait_cq(&[&b]).map(|_| ()).map_err(|e| e.err)
    };
    let ones = [1u8; 64];
    assert_eq!(write(seg1 + 10, &ones, key), Ok(()));
    assert_eq!(write(seg2 + 20, &ones, key), Ok(()));
    let mut expect = vec![0x5au8; 4096];
    expect[10..74].fill(1);
    expect[2048 + 20..2048 + 84].fill(1);
    assert!(buf == expect, "in-segment writes landed elsewhere");
    let refused: Vec<u64> = if virt {
        // In the gap, straddling into it from either segment, and past the end.
        vec![p as u64 + 1024, p as u64 + 1500, p as u64 + 1000, p as u64 + 2040, p as u64 + 3060]
    } else {
        // Below the offset, and past the registered bytes.
        vec![offset - 32, offset + 2040]
    };
    for addr in refused {
        assert_eq!(write(addr, &ones, key), Err(fi::FI_EACCES as i32), "write at {addr:#x}");
        assert!(buf == expect, "a refused write at {addr:#x} changed target memory");
    }
    if !virt {
        // An offset-addressed write across the segment boundary continues in the
        // second segment and skips the gap.
        assert_eq!(write(offset + 1000, &ones, key), Ok(()));
        expect[1000..1024].fill(1);
        expect[2048..2048 + 40].fill(1);
        assert!(buf == expect, "a write spanning segments did not skip the gap");
    }
    // Revoked: after fi_close of the MR the key reaches nothing.
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_close(&mut (*mr).fid), 0) };
    assert_eq!(write(seg1, &ones, key), Err(fi::FI_EACCES as i32));
    for _ in 0..20 {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        unsafe { fi::fi_cq_read(b.cq, null_mut(), 0) };
    }
    assert!(buf == expect, "a write through a revoked key changed target memory");
}

#[test]
fn multi_segment_registration_exposes_no_gap_with_virtual_addresses() {
    gap_and_revoked_key((fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32);
}

#[test]
fn multi_segment_registration_honours_offset_without_virtual_addresses() {
    gap_and_revoked_key(0);
}

/// The application unmaps memory whose registration is still open (a bug
/// libfabric leaves undefined, and a NIC survives: its registration pins the
/// old pages). rdmx's emulated keys must not write into the hole (that killed
/// the target process) nor into whatever is mapped at that address now (that
/// corrupted it): the unmap monitor revokes the key, and remote accesses
/// through it fail at the initiator with `FI_EACCES`.
fn unmapped_while_registered(domain: &str) {
    const LEN: usize = 64 << 10;
    let a = Stack::open_caps(Some(domain), fi::FI_AV_MAP, RMA_CAPS, (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32);
    let b = Stack::open_caps(Some(domain), fi::FI_AV_MAP, RMA_CAPS, (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32);
    let b_at_a = a.insert(&b.name());
    let map = |at: usize, fill: u8| -> usize {
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | if at != 0 { libc::MAP_FIXED_NOREPLACE } else { 0 };
        // SAFETY: an anonymous mapping; MAP_FIXED_NOREPLACE never replaces one.
        let p = unsafe { libc::mmap(at as *mut _, LEN, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        assert!(at == 0 || p as usize == at, "the address was taken meanwhile");
        // SAFETY: the mapping just made, LEN bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, fill, LEN) };
        p as usize
    };
    let write = |addr: u64, key: u64| -> Result<(), i32> {
        let ones = [1u8; 256];
        // SAFETY: a libfabric call on objects this test opened and still holds; `ones` outlives the completion.
        unsafe {
            assert_eq!(
                fi::fi_write(a.ep, ones.as_ptr() as *const _, ones.len(), null_mut(), b_at_a, addr, key, null_mut()),
                0
            )
        };
        a.wait_cq(&[&b]).map(|_| ()).map_err(|e| e.err)
    };
    let read = |addr: u64, key: u64| -> Result<(), i32> {
        let mut back = [0u8; 256];
        // SAFETY: as above; `back` outlives the completion.
        unsafe {
            assert_eq!(
                fi::fi_read(a.ep, back.as_mut_ptr() as *mut _, back.len(), null_mut(), b_at_a, addr, key, null_mut()),
                0
            )
        };
        a.wait_cq(&[&b]).map(|_| ()).map_err(|e| e.err)
    };
    let register = |at: usize| -> (*mut fi::fid_mr, u64) {
        let mut mr = null_mut();
        let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        // SAFETY: a libfabric call on objects this test opened; the memory is the test's mapping.
        unsafe { assert_eq!(fi::fi_mr_reg(b.domain, at as *const _, LEN, access, 0, 0, 0, &mut mr, null_mut()), 0) };
        // SAFETY: the MR just opened.
        (mr, unsafe { fi::fi_mr_key(mr) })
    };
    let unmap = |at: usize| {
        // SAFETY: the test's own mapping; only the (revoked) registration refers to it.
        assert_eq!(unsafe { libc::munmap(at as *mut _, LEN) }, 0);
    };

    // Unmapped and mapped again at the same address: the new memory is never touched.
    let buf = map(0, 0);
    let (mr, key) = register(buf);
    assert_eq!(write(buf as u64 + 100, key), Ok(()), "a write while it is mapped works");
    unmap(buf);
    map(buf, 0x33);
    assert_eq!(write(buf as u64 + 100, key), Err(fi::FI_EACCES as i32), "a write through the key of unmapped memory");
    assert_eq!(read(buf as u64, key), Err(fi::FI_EACCES as i32), "a read through it");
    // SAFETY: the new mapping, LEN bytes.
    let now = unsafe { std::slice::from_raw_parts(buf as *const u8, LEN) };
    assert!(now.iter().all(|&x| x == 0x33), "the memory mapped there now was changed");
    // SAFETY: closing the MR this test opened.
    unsafe { assert_eq!(fi::fi_close(&mut (*mr).fid), 0) };
    let (mr, key) = register(buf);
    assert_eq!(write(buf as u64, key), Ok(()), "a new registration of the new memory works");
    // SAFETY: as above.
    unsafe { assert_eq!(fi::fi_close(&mut (*mr).fid), 0) };
    unmap(buf);

    // Unmapped and left a hole: the target survives and the access fails.
    let buf = map(0, 0);
    let (mr, key) = register(buf);
    unmap(buf);
    assert_eq!(write(buf as u64 + 8, key), Err(fi::FI_EACCES as i32));
    assert_eq!(read(buf as u64 + 8, key), Err(fi::FI_EACCES as i32));
    // SAFETY: as above.
    unsafe { assert_eq!(fi::fi_close(&mut (*mr).fid), 0) };
}

#[test]
fn memory_unmapped_under_an_open_registration_is_never_touched_udp() {
    unmapped_while_registered("udp");
}

#[test]
fn memory_unmapped_under_an_open_registration_is_never_touched_shm() {
    unmapped_while_registered("shm");
}

/// fork() in the target process: the parent's registration keeps naming the
/// parent's memory (its writes after the fork are what a remote read sees,
/// remote writes land in it), and the child — which writes its copy of the
/// buffer, unmaps it and exits without touching rdmx — revokes nothing: a
/// child's mappings carry no userfaultfd registration, so its unmaps are not
/// reported. (rdmx's devices do not pin pages; devices that do will mark
/// registrations MADV_DONTFORK, see mr_cache's monitor module.)
#[test]
fn a_registration_stays_the_parents_across_fork() {
    const LEN: usize = 16 << 10;
    let a = Stack::open_caps(Some("shm"), fi::FI_AV_MAP, RMA_CAPS, (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32);
    let b = Stack::open_caps(Some("shm"), fi::FI_AV_MAP, RMA_CAPS, (fi::FI_MR_VIRT_ADDR | fi::FI_MR_PROV_KEY) as i32);
    let b_at_a = a.insert(&b.name());
    // SAFETY: a fresh anonymous mapping of the test's.
    let p = unsafe {
        libc::mmap(null_mut(), LEN, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
    };
    assert_ne!(p, libc::MAP_FAILED);
    let buf = p as *mut u8;
    // SAFETY: the mapping just made.
    unsafe { std::ptr::write_bytes(buf, 0x11, LEN) };
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on objects this test opened; the memory is the test's mapping.
    unsafe { assert_eq!(fi::fi_mr_reg(b.domain, p as *const _, LEN, access, 0, 0, 0, &mut mr, null_mut()), 0) };
    // SAFETY: the MR just opened.
    let key = unsafe { fi::fi_mr_key(mr) };

    // SAFETY: the child only writes its copy of the buffer (no allocation, no
    // lock, no rdmx call), unmaps it and leaves with _exit.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        // SAFETY: in the child: its private copy of the mapping.
        unsafe {
            std::ptr::write_bytes(buf, 0xcc, LEN);
            libc::munmap(p, LEN);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just forked.
    assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    // The parent writes after the fork (copy-on-write gives it its own pages).
    // SAFETY: the parent's mapping.
    unsafe { std::ptr::write_bytes(buf, 0x22, LEN / 2) };

    let mut back = vec![0u8; LEN];
    // SAFETY: a libfabric call on objects this test opened; `back` outlives the completion.
    unsafe {
        assert_eq!(
            fi::fi_read(a.ep, back.as_mut_ptr() as *mut _, LEN, null_mut(), b_at_a, p as u64, key, null_mut()),
            0
        )
    };
    a.wait_cq(&[&b]).expect("the key still works after the child exited");
    assert!(back[..LEN / 2].iter().all(|&x| x == 0x22), "a remote read sees the parent's writes after the fork");
    assert!(back[LEN / 2..].iter().all(|&x| x == 0x11), "and never the child's");
    let ones = [0x5au8; 64];
    // SAFETY: as above; `ones` outlives the completion.
    unsafe {
        assert_eq!(
            fi::fi_write(a.ep, ones.as_ptr() as *const _, 64, null_mut(), b_at_a, p as u64 + 100, key, null_mut()),
            0
        )
    };
    a.wait_cq(&[&b]).expect("a remote write after the fork");
    // SAFETY: the parent's mapping.
    let now = unsafe { std::slice::from_raw_parts(buf, LEN) };
    assert!(now[100..164].iter().all(|&x| x == 0x5a), "the remote write landed in the parent's memory");
    // SAFETY: closing the MR this test opened, then unmapping its memory.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*mr).fid), 0);
        libc::munmap(p, LEN);
    }
}
