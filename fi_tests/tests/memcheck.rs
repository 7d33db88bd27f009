//! rdmx's unsafe code (the C ABI, buffers handed in by the application, the
//! devices) under valgrind memcheck, driven as an application drives it:
//! `fi_pingpong` with data checks over every message size (eager, segmented,
//! rendezvous pull on shm, windowed rendezvous on UDP), server and client each
//! under memcheck. Any invalid read or write, use of uninitialised memory, or
//! definitely leaked block fails the test.
use fi_tests::procs;

const MEMCHECK: &[&str] = &[
    "valgrind",
    "-q",
    "--error-exitcode=99",
    "--leak-check=full",
    "--errors-for-leak-kinds=definite",
    "--show-leak-kinds=definite",
];

fn under_memcheck(domain: &str) {
    fi_tests::init();
    if std::process::Command::new("valgrind").arg("--version").output().is_err() {
        fi_tests::skip("valgrind is not installed");
        return;
    }
    let (s, c) = procs::pingpong(&["-c", "-I", "10", "-S", "all", "-d", domain], &[], "127.0.0.1", MEMCHECK, MEMCHECK);
    let (st, ct) = (procs::text(&s), procs::text(&c));
    // valgrind cannot size userfaultfd's ioctls (the MR unmap monitor's); it
    // says so once per process, which is not an error.
    let errors = |t: &str| {
        t.lines()
            .filter(|l| {
                l.starts_with("==")
                    && !l.contains("ioctl")
                    && !l.contains("spurious value errors")
                    && !l.contains("README_MISSING_SYSCALL")
            })
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert!(
        c.status.success() && s.status.success(),
        "memcheck on {domain}: client {:?}, server {:?}\nclient:\n{ct}\nserver:\n{st}",
        c.status,
        s.status
    );
    assert!(
        errors(&ct).is_empty() && errors(&st).is_empty(),
        "memcheck reports on {domain}:\n{:?}\n{:?}",
        errors(&ct),
        errors(&st)
    );
    assert!(ct.contains("usec/xfer"), "no numbers printed:\n{ct}");
}

#[test]
fn fi_pingpong_all_sizes_is_memcheck_clean_on_udp() {
    under_memcheck("udp");
}

#[test]
fn fi_pingpong_all_sizes_is_memcheck_clean_on_shm() {
    under_memcheck("shm");
}

#[test]
fn fi_pingpong_all_sizes_is_memcheck_clean_on_auto() {
    under_memcheck("auto");
}
