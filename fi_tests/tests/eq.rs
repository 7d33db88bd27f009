//! Event queues as fi_eq(3) defines them: `FI_WRITE` (applications insert their
//! own events), the `FI_WAIT_FD` wait object through `fi_control(FI_GETWAIT)`
//! (readable exactly while events are queued), `FI_PEEK`, and `fi_eq_sread`
//! timing out with `-FI_EAGAIN`. Each of these failed before (flags were
//! refused, FI_WAIT_FD was -FI_ENOSYS).
use fi_tests::*;
use std::ptr::null_mut;

fn readable(fd: i32) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd on the stack.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn eq_with_fi_write_and_a_wait_fd() {
    init();
    let info = getinfo(None, None, 0, Some(&Hints::rdm())).expect("fi_getinfo");
    let mut fabric = null_mut();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    assert_eq!(unsafe { fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()) }, 0);
    let mut attr =
        fi::fi_eq_attr { size: 8, flags: fi::FI_WRITE as u64, wait_obj: fi::FI_WAIT_FD, ..Default::default() };
    let mut eq = null_mut();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call.
    assert_eq!(unsafe { fi::fi_eq_open(fabric, &mut attr, &mut eq, null_mut()) }, 0, "FI_WRITE | FI_WAIT_FD");
    let mut fd: i32 = -1;
    // SAFETY: as above; FI_GETWAIT writes an int for FI_WAIT_FD.
    assert_eq!(unsafe { fi::fi_control(&mut (*eq).fid, fi::FI_GETWAIT as i32, &mut fd as *mut i32 as *mut _) }, 0);
    assert!(fd >= 0);
    assert!(!readable(fd), "empty EQ: fd not readable");
    let (mut ev, mut buf) = (0u32, [0u8; 16]);
    // SAFETY: as above.
    let r = unsafe { fi::fi_eq_sread(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 20, 0) };
    assert_eq!(r, -(fi::FI_EAGAIN as isize), "sread times out on an empty EQ");
    let entry = 0x1234_5678u64.to_le_bytes();
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_eq_write(eq, fi::FI_NOTIFY, entry.as_ptr() as *const _, 8, 0) }, 8);
    assert!(readable(fd), "an event makes the fd readable");
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_eq_read(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), fi::FI_PEEK as u64) }, 8);
    assert_eq!(ev, fi::FI_NOTIFY);
    assert!(readable(fd), "FI_PEEK leaves the event (and the fd readable)");
    // SAFETY: as above.
    assert_eq!(unsafe { fi::fi_eq_sread(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 1000, 0) }, 8);
    assert_eq!(buf[..8], entry);
    assert!(!readable(fd), "drained: fd not readable");
    // SAFETY: as above.
    unsafe {
        assert_eq!(fi::fi_close(&mut (*eq).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}

#[test]
fn eq_flags_other_than_fi_write_are_refused() {
    init();
    let info = getinfo(None, None, 0, Some(&Hints::rdm())).expect("fi_getinfo");
    let mut fabric = null_mut();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    assert_eq!(unsafe { fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()) }, 0);
    let mut attr =
        fi::fi_eq_attr { size: 8, flags: fi::FI_READ as u64, wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
    let mut eq = null_mut();
    // SAFETY: a libfabric call on objects this test opened and still holds.
    assert_eq!(unsafe { fi::fi_eq_open(fabric, &mut attr, &mut eq, null_mut()) }, neg(fi::FI_EBADFLAGS));
    // SAFETY: as above.
    unsafe { assert_eq!(fi::fi_close(&mut (*fabric).fid), 0) };
}

/// fi_trywait(3) takes EQs: 0 while the EQ is empty (the application may sleep
/// on its fd), -FI_EAGAIN while events are queued; as libfabric's own EQ unit
/// test waits. It failed with -FI_ENOSYS before.
#[test]
fn trywait_on_an_eq() {
    init();
    let info = getinfo(None, None, 0, Some(&Hints::rdm())).expect("fi_getinfo");
    let mut fabric = null_mut();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    assert_eq!(unsafe { fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()) }, 0);
    let mut attr =
        fi::fi_eq_attr { size: 8, flags: fi::FI_WRITE as u64, wait_obj: fi::FI_WAIT_FD, ..Default::default() };
    let mut eq = null_mut();
    // SAFETY: libfabric calls on objects this test opened and still holds; every buffer passed outlives the call.
    unsafe {
        assert_eq!(fi::fi_eq_open(fabric, &mut attr, &mut eq, null_mut()), 0);
        let mut fids = [&mut (*eq).fid as *mut fi::fid];
        assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), 0, "empty: sleeping is safe");
        let entry = 7u64.to_le_bytes();
        assert_eq!(fi::fi_eq_write(eq, fi::FI_NOTIFY, entry.as_ptr() as *const _, 8, 0), 8);
        assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), neg(fi::FI_EAGAIN), "an event is queued");
        let (mut ev, mut buf) = (0u32, [0u8; 16]);
        assert_eq!(fi::fi_eq_read(eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 0), 8);
        assert_eq!(fi::fi_trywait(fabric, fids.as_mut_ptr(), 1), 0, "drained");
        assert_eq!(fi::fi_close(&mut (*eq).fid), 0);
        assert_eq!(fi::fi_close(&mut (*fabric).fid), 0);
    }
}
