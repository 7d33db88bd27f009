//! Exit-time cleanup of shared-memory rings: a process that ends without
//! closing its endpoints leaves no file behind. Its own binary: the cleanup
//! removes every ring this process has open in /dev/shm, which would pull the
//! files from under the other tests of a shared binary.
use devices::shm::{unlink_own_at_exit, ShmConfig, ShmDevice};

#[test]
fn rings_left_open_are_unlinked_without_a_lock_and_closed_ones_are_forgotten() {
    let closed = ShmDevice::open(&ShmConfig::default()).expect("a ring in /dev/shm");
    drop(closed);
    let a = ShmDevice::open(&ShmConfig::default()).expect("a ring in /dev/shm");
    let b = ShmDevice::open(&ShmConfig::default()).expect("a second ring");
    let fifo = |p: &std::path::Path| std::path::PathBuf::from(format!("{}.fifo", p.display()));
    for d in [&a, &b] {
        assert!(d.path().exists() && fifo(d.path()).exists());
    }
    assert_eq!(unlink_own_at_exit(), 2, "the two open rings, not the closed one");
    for d in [&a, &b] {
        assert!(!d.path().exists(), "{} is still there", d.path().display());
        assert!(!fifo(d.path()).exists(), "the FIFO of {} is still there", d.path().display());
    }
    // A ring opened after a close reuses its entry; it is found as well.
    drop(a);
    let c = ShmDevice::open(&ShmConfig::default()).expect("a third ring");
    assert!(c.path().exists());
    assert_eq!(unlink_own_at_exit(), 1, "c (the files of b are gone already)");
    assert!(!c.path().exists());
    drop(b);
    drop(c);
    assert_eq!(unlink_own_at_exit(), 0, "nothing open");
}
