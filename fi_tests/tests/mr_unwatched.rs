//! rdmx warns once (at `FI_LOG_LEVEL=warn`) when `fi_mr_reg` registers memory
//! its unmap monitor cannot watch (a file-backed mapping): such a key is not
//! revoked if the application unmaps the memory, as docs/registrations.md says. Anonymous
//! memory draws no warning; a second file-backed registration no second one.
//!
//! The registrations run in a child process (this binary again), whose stderr
//! carries libfabric's log.
use fi_tests::*;
use std::ptr::null_mut;

const MARK: &str = "ANONYMOUS REGISTERED";
const WARNING: &str = "cannot be watched for unmapping";

fn register(domain: *mut fi::fid_domain, addr: *mut libc::c_void, len: usize, key: u64) -> *mut fi::fid_mr {
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on a domain this test holds; `addr..addr+len` is mapped.
    assert_eq!(unsafe { fi::fi_mr_reg(domain, addr, len, access, 0, key, 0, &mut mr, null_mut()) }, 0);
    mr
}

fn file_mapping(path: &std::path::Path, len: usize) -> *mut libc::c_void {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(path).unwrap();
    f.set_len(len as u64).unwrap();
    // SAFETY: maps the test's own file, shared, read-write.
    let p =
        unsafe { libc::mmap(null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p
}

fn child() {
    init();
    let s = Stack::open_caps(Some("udp"), fi::FI_AV_MAP, fi::FI_RMA as u64, 0);
    let mut anon = vec![0u8; 1 << 16];
    let a = register(s.domain, anon.as_mut_ptr() as *mut _, anon.len(), 1);
    eprintln!("{MARK}");
    let dir = std::env::temp_dir();
    let paths = [
        dir.join(format!("rdmx-unwatched-{}-a", std::process::id())),
        dir.join(format!("rdmx-unwatched-{}-b", std::process::id())),
    ];
    let maps: Vec<_> = paths.iter().map(|p| file_mapping(p, 1 << 16)).collect();
    let f1 = register(s.domain, maps[0], 1 << 16, 2);
    let f2 = register(s.domain, maps[1], 1 << 16, 3);
    // SAFETY: closes what this child opened; unmaps its own mappings.
    unsafe {
        for mr in [a, f1, f2] {
            assert_eq!(fi::fi_close(&mut (*mr).fid), 0);
        }
        for m in maps {
            libc::munmap(m, 1 << 16);
        }
    }
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
}

#[test]
fn file_backed_memory_is_registered_with_one_warning() {
    if std::env::var_os("RDMX_UNWATCHED_CHILD").is_some() {
        child();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "file_backed_memory_is_registered_with_one_warning", "--nocapture", "--test-threads=1"])
        .envs(child_env())
        .env("RDMX_PROVIDER_DIR", provider_dir())
        .env("RDMX_UNWATCHED_CHILD", "1")
        .env("FI_LOG_LEVEL", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the child failed: {err}");
    let (before, after) =
        err.split_once(MARK).unwrap_or_else(|| panic!("the child never registered its anonymous memory: {err}"));
    assert_eq!(before.matches(WARNING).count(), 0, "anonymous memory is watched, no warning: {before}");
    assert_eq!(after.matches(WARNING).count(), 1, "one warning for the two file-backed registrations: {after}");
}
