//! Blocking on a CQ's wait fd (`FI_WAIT_FD`, `fi_trywait`, `poll`) on every
//! device, with manual progress only: the fd must wake the sleeper by itself.
use fi_tests::*;
use std::ptr::null_mut;

#[test]
fn wait_fd_cq_sleeps_and_wakes_on_a_completion() {
    // No progress thread: it would arm the device and progress on its own, and
    // hide a missing arm in fi_trywait (shm arms its ring only there).
    std::env::set_var("FI_RDMX_PROGRESS_THREAD", "0");
    for dev in ["udp", "shm", "auto"] {
        wait_fd_cq_sleeps_and_wakes_on(dev);
    }
}

fn wait_fd_cq_sleeps_and_wakes_on(dev: &str) {
    let mut h = Hints::rdm();
    h.set_domain_name(dev);
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    let a = Stack::open(Some(dev), fi::FI_AV_MAP);
    let cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, wait_obj: fi::FI_WAIT_FD, ..Default::default() };
    let b = Stack::open_with_cq(info, fi::FI_AV_MAP, 0, cq_attr);
    let b_at_a = a.insert(&b.name());
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe {
        let mut fd: libc::c_int = -1;
        assert_eq!(fi::fi_control(&mut (*b.cq).fid, fi::FI_GETWAIT as i32, &mut fd as *mut _ as *mut _), 0);
        assert!(fd >= 0);
        let mut buf = [0u8; 8];
        assert_eq!(fi::fi_recv(b.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, null_mut()), 0);
        // Nothing pending: trywait says sleeping is safe, and the fd stays quiet.
        let mut fids = [&mut (*b.cq).fid as *mut fi::fid];
        assert_eq!(fi::fi_trywait(b.fabric, fids.as_mut_ptr(), 1), 0);
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        assert_eq!(libc::poll(&mut pfd, 1, 50), 0);
        // A message arrives: the fd wakes the sleeper, then the read finds it.
        assert_eq!(fi::fi_send(a.ep, b"wake up!".as_ptr() as *const _, 8, null_mut(), b_at_a, null_mut()), 0);
        let mut woke = false;
        for _ in 0..100 {
            fi::fi_cq_read(a.cq, null_mut(), 0);
            if libc::poll(&mut pfd, 1, 20) > 0 {
                woke = true;
                break;
            }
        }
        assert!(woke, "{dev}: the CQ fd never became readable");
        let mut e = fi::fi_cq_tagged_entry::default();
        let mut n = 0;
        for _ in 0..1000 {
            n = fi::fi_cq_read(b.cq, &mut e as *mut _ as *mut _, 1);
            if n == 1 {
                break;
            }
            fi::fi_cq_read(a.cq, null_mut(), 0);
        }
        assert_eq!(n, 1);
        assert_eq!(&buf, b"wake up!");
    }
}
