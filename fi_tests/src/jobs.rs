//! What the programs of several jobs on one endpoint (`c/rdmx_jobs.c`) share
//! between their runs: the plain one (`tests/multi_job.rs`) and the one under
//! the MPI wheels (`tests/mpi_wheels.rs`).
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The C program's source.
pub fn source() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/c/rdmx_jobs.c"))
}

/// The include directory of libfabric 2.1 as `scripts/setup-libfabric2.sh`
/// installs it (`RDMX_LIBFABRIC2_PREFIX`, else
/// `${RDMX_STACKS_CACHE:-$HOME/.cache/rdmx-stacks}/libfabric-2.1.0`): headers
/// of API 1.20 or newer, for a compiler whose libfabric brings none (the
/// wheels'). `None` when it is not there.
pub fn libfabric2_include() -> Option<PathBuf> {
    let prefix = std::env::var_os("RDMX_LIBFABRIC2_PREFIX").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("RDMX_STACKS_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rdmx-stacks"));
        cache.join("libfabric-2.1.0")
    });
    let include = prefix.join("include");
    include.join("rdma/fi_domain.h").exists().then_some(include)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// The fields of a `jobs` element fi_rdmx(7)'s JSON schema lists
/// (`\f[CR]jobs[].<name>\f[R]` bullets).
fn documented_job_fields() -> BTreeSet<String> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fi_rdmx.7")).expect("docs/fi_rdmx.7");
    page.lines()
        .filter_map(|l| l.strip_prefix("\\f[CR]jobs[]."))
        .filter_map(|rest| rest.split_once("\\f[R]").map(|(name, _)| name.to_string()))
        .collect()
}

/// The server's per-job counters (its endpoint's close document): exactly the
/// documented fields, one message each way per job, nothing refused by a
/// tag, job X's datagrams dropped by their key. `traffic`: how jobs B and C
/// go over a wire (`tagged`, `clear`).
pub fn check_server_counters(doc: &Value, traffic: [&str; 2]) {
    let jobs = doc["jobs"].as_array().unwrap_or_else(|| panic!("no jobs array: {doc}"));
    assert_eq!(jobs.len(), 2, "two jobs served: {doc}");
    let documented = documented_job_fields();
    assert!(documented.len() >= 9, "fi_rdmx(7) lists jobs[] fields: {documented:?}");
    for (j, job) in jobs.iter().enumerate() {
        let fields: BTreeSet<String> = job.as_object().unwrap().keys().cloned().collect();
        assert_eq!(fields, documented, "a jobs element's fields against fi_rdmx(7)");
        assert_eq!(u(&job["av_key"]), j as u64, "{job}");
        assert_eq!(job["traffic"], traffic[j], "{job}");
        assert_eq!(u(&job["peers"]), 1, "{job}");
        assert_eq!(u(&job["messages_received"]), 1, "{job}");
        assert_eq!(u(&job["messages_sent"]), 1, "{job}");
        assert!(u(&job["packets_received"]) >= 2, "{job}");
        assert_eq!(u(&job["dropped_auth"]), 0, "{job}");
    }
    assert!(u(&doc["counters"]["dropped_job_key"]) >= 1, "job X's message was not dropped by its key: {doc}");
}
