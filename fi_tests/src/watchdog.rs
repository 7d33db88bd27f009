//! A deadline on every test: one hung test (a child that never answers, a
//! completion that never comes) must fail with a clear message in minutes,
//! not eat CI's 90 minutes.
//!
//! Each test calls [`crate::init`] first, which registers the calling thread
//! (libtest names it after the test) with its start time. A watchdog thread
//! checks the live registrations every second; a test past its deadline
//! (`RDMX_TEST_DEADLINE_SECS`, default [`DEFAULT_DEADLINE`]) is named on
//! stderr, every process this test binary started is killed (so no child
//! outlives it holding ports or namespaces), and the binary aborts, which
//! fails the run. A registration ends with its thread: a finished test is
//! never judged.
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::{Duration, Instant};

/// Long enough for the slowest test here (MPI jobs across namespace hosts
/// under loss, on two loaded cores), short enough that a hang costs a fraction
/// of CI's budget.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(20 * 60);

struct Watched {
    test: String,
    since: Instant,
    alive: Weak<()>,
}

static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
static START: Once = Once::new();

thread_local! {
    /// Dropped when the test's thread ends: its registration's `Weak` then
    /// fails to upgrade.
    static ALIVE: Arc<()> = Arc::new(());
}

fn deadline() -> Duration {
    std::env::var("RDMX_TEST_DEADLINE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_DEADLINE)
}

/// Registers the calling test (once per thread) and starts the watchdog.
pub fn watch_this_test() {
    let alive = ALIVE.with(Arc::downgrade);
    {
        let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        if w.iter().any(|x| x.alive.ptr_eq(&alive)) {
            return;
        }
        let test = std::thread::current().name().unwrap_or("an unnamed test").to_string();
        w.push(Watched { test, since: Instant::now(), alive });
    }
    START.call_once(|| {
        let limit = deadline();
        std::thread::Builder::new()
            .name("rdmx-test-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(1));
                let late = {
                    let mut w = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
                    w.retain(|x| x.alive.strong_count() > 0);
                    w.iter().find(|x| x.since.elapsed() > limit).map(|x| x.test.clone())
                };
                if let Some(test) = late {
                    eprintln!(
                        "\nrdmx test watchdog: `{test}` ran past its deadline of {limit:?} (RDMX_TEST_DEADLINE_SECS): \
                         killing this binary's child processes and aborting"
                    );
                    let me = std::process::id();
                    for p in crate::procs::process_tree(me).into_iter().filter(|p| *p != me).rev() {
                        // SAFETY: kill(2) has no memory preconditions; `p` is a
                        // descendant of this test binary.
                        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
                    }
                    std::process::abort();
                }
            })
            .expect("spawn the test watchdog");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/testing.md states the default deadline this file enforces.
    #[test]
    fn testing_doc_states_the_default_deadline() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/testing.md")).unwrap();
        let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
        let want = format!(
            "(`fi_tests/src/watchdog.rs`: {} minutes, or `RDMX_TEST_DEADLINE_SECS`)",
            DEFAULT_DEADLINE.as_secs() / 60
        );
        assert!(doc.contains(&want), "docs/testing.md should say \"{want}\"");
    }
}
