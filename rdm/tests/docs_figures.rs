//! Figures docs/reliability.md states about the reliable stream are the
//! code's: the congestion signals (the queue margin and the heavy-loss share,
//! `rdm/src/engine/congestion.rs`), the tail loss probes (how many, and when:
//! `rdm/src/engine/recovery.rs`), the retransmission timeout's floor
//! (`EngineConfig::default().min_rto`, which the endpoint keeps), and the
//! setups of the goodput table and the incast scenario
//! (`rdm/tests/sim_scenarios.rs`). Private code is read as source text, as
//! `rndv/tests/docs_figures.rs` does; a declaration that changed shape fails
//! with a message to update this test.
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn reliability_doc() -> String {
    read("docs/reliability.md").split_whitespace().collect::<Vec<_>>().join(" ")
}

fn assert_says(doc: &str, phrase: &str, source: &str) {
    assert!(doc.contains(phrase), "docs/reliability.md should say \"{phrase}\" ({source})");
}

/// The number (digits, `_` separators dropped) that follows `before` in
/// `src`, searching from `from` on.
fn number_after(src: &str, from: &str, before: &str, file: &str) -> u64 {
    let start = src.find(from).unwrap_or_else(|| panic!("no `{from}` in {file}: update this test with the code"));
    let i = src[start..]
        .find(before)
        .unwrap_or_else(|| panic!("no `{before}...` after `{from}` in {file}: update this test with the code"))
        + start;
    let digits: String =
        src[i + before.len()..].chars().take_while(|c| c.is_ascii_digit() || *c == '_').filter(|c| *c != '_').collect();
    digits.parse().unwrap_or_else(|e| panic!("{file}: {before:?} is followed by {digits:?}: {e}"))
}

/// "two", "a third": how the doc writes a small count or share.
fn count_word(n: u64) -> &'static str {
    match n {
        1 => "one",
        2 => "two",
        3 => "three",
        4 => "four",
        _ => panic!("{n}: write it as a word here and in docs/reliability.md"),
    }
}

fn share_word(n: u64) -> &'static str {
    match n {
        2 => "half",
        3 => "a third",
        4 => "a quarter",
        _ => panic!("1/{n}: write it as a word here and in docs/reliability.md"),
    }
}

/// "twice", "three times": how the doc writes a multiple.
fn times_word(n: u64) -> String {
    match n {
        2 => "twice".into(),
        n => format!("{} times", count_word(n)),
    }
}

/// The doc's phrase for the queue-building test of congestion.rs.
fn queue_phrase(factor: u64, margin_us: u64) -> String {
    format!("rises above {} the path's lowest plus {margin_us} µs", times_word(factor))
}

#[test]
fn congestion_signals() {
    let doc = reliability_doc();
    let src = read("rdm/src/engine/congestion.rs");
    let file = "rdm/src/engine/congestion.rs";
    let factor = number_after(&src, "fn queue_building", "(Some(s), Some(m)) => s > m * ", file);
    let margin = number_after(&src, "fn queue_building", "Duration::from_micros(", file);
    assert_says(&doc, &queue_phrase(factor, margin), "queue_building in rdm/src/engine/congestion.rs");
    let share = number_after(&src, "fn heavy_loss", "resent * ", file);
    assert_says(
        &doc,
        &format!("each needed more than {} of their datagrams resent", share_word(share)),
        "heavy_loss in rdm/src/engine/congestion.rs",
    );
}

#[test]
fn tail_loss_probes_and_rto_floor() {
    let doc = reliability_doc();
    let src = read("rdm/src/engine/recovery.rs");
    let file = "rdm/src/engine/recovery.rs";
    let probes = number_after(&src, "fn retransmit_timer", "self.probes_fired < ", file);
    let srtts = number_after(&src, "fn probe_time", "self.srtt.map(|s| (s * ", file);
    let phrase = format!(
        "up to {} tail loss probes (RFC 8985: the newest unacknowledged datagram resent after {} smoothed RTTs)",
        count_word(probes),
        count_word(srtts)
    );
    assert_says(&doc, &phrase, "retransmit_timer and probe_time in rdm/src/engine/recovery.rs");

    // The endpoint keeps the engine's default floor.
    let endpoint = read("rndv/src/endpoint.rs");
    assert!(
        endpoint.contains("..EngineConfig::default()") && !endpoint.contains("min_rto"),
        "rndv/src/endpoint.rs sets min_rto itself now: read the floor from there"
    );
    let floor = rdm::engine::EngineConfig::default().min_rto;
    assert_eq!(floor.subsec_nanos() % 1_000_000, 0, "{floor:?}: not whole milliseconds");
    assert_says(
        &doc,
        &format!("whose {} ms floor is dozens of round trips on a LAN", floor.as_millis()),
        "EngineConfig::default().min_rto",
    );
}

#[test]
fn simulated_scenarios_setups() {
    let doc = reliability_doc();
    let src = read("rdm/tests/sim_scenarios.rs");
    let file = "rdm/tests/sim_scenarios.rs";
    let from = "fn goodput_versus_loss_table";
    let delay_us = number_after(&src, from, "delay: Duration::from_micros(", file);
    let bytes_per_s = number_after(&src, from, "bandwidth: ", file);
    let size = number_after(&src, from, "&[", file);
    assert_eq!(size % 1024, 0, "{size} B messages: not whole KiB");
    assert_eq!(bytes_per_s % 125_000_000, 0, "{bytes_per_s} B/s: not whole Gbit/s");
    let phrase = format!(
        "one stream of {} KiB messages over a simulated {} Gbit/s link with {delay_us} µs delay",
        size / 1024,
        bytes_per_s / 125_000_000
    );
    assert_says(&doc, &phrase, "goodput_versus_loss_table in rdm/tests/sim_scenarios.rs");

    let incast = "fn incast_16_to_1_with_slow_receiver";
    let senders = number_after(&src, incast, "let senders = ", file);
    assert_says(&doc, &format!("in `incast_16_to_1_with_slow_receiver` (same test file) {senders} senders overrun one slow receiver's buffer"), file);
    let share = number_after(&src, incast, "assert!(retx * ", file);
    assert_says(
        &doc,
        &format!("fewer than {} of the datagrams sent are retransmissions", share_word(share)),
        "incast_16_to_1_with_slow_receiver",
    );
}

#[test]
fn the_checks_can_fail() {
    let src = "fn queue_building(..) {\n        (Some(s), Some(m)) => s > m * 2 + Duration::from_micros(300),\n}";
    assert_eq!(number_after(src, "fn queue_building", "Duration::from_micros(", "x"), 300);
    assert_eq!(number_after("fn g() { bandwidth: 125_000_000, }", "fn g", "bandwidth: ", "x"), 125_000_000);
    assert_eq!((count_word(2), share_word(3)), ("two", "a third"));
    // The phrase the test builds from the source, against a doc that states
    // another margin or factor: refused; against the one it states: taken.
    let doc = "when the RTT rises above twice the path's lowest plus 500 µs (a queue";
    assert!(doc.contains(&queue_phrase(2, 500)));
    assert!(!doc.contains(&queue_phrase(2, 300)));
    assert!(!doc.contains(&queue_phrase(3, 500)));
    assert!(std::panic::catch_unwind(|| number_after("fn a() {}", "fn b", "x", "y")).is_err());
}
