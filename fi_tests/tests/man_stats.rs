//! fi_rdmx(7)'s RUNTIME STATS section lists exactly the counters an endpoint
//! prints with `FI_RDMX_STATS=1` (`rdmx: <name> <value>` lines on stderr at
//! close), read from a real two-process fi_pingpong on each device.
use fi_tests::procs::{self, text};
use std::collections::BTreeSet;

/// The counter names in `rdmx: <name> <value>` lines.
fn printed(out: &str) -> BTreeSet<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("rdmx: "))
        .filter_map(|rest| rest.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn runtime_stats_section_lists_what_fi_rdmx_stats_prints() {
    let doc = fi_tests::documented_stats();
    assert!(doc.contains("packets_sent") && doc.contains("mr_cache_hits"), "{doc:?}");
    for device in ["udp", "shm"] {
        fi_tests::init();
        let (s, c) = procs::pingpong(
            &["-I", "10", "-S", "1024"],
            &[("FI_RDMX_DEVICE", device), ("FI_RDMX_STATS", "1")],
            "127.0.0.1",
            &[],
            &[],
        );
        assert!(c.status.success() && s.status.success(), "fi_pingpong on {device}:\n{}\n{}", text(&c), text(&s));
        for out in [text(&s), text(&c)] {
            let got = printed(&out);
            assert!(got.len() > 10, "no stats printed on {device}:\n{out}");
            let undocumented: Vec<_> = got.difference(&doc).collect();
            let stale: Vec<_> = doc.difference(&got).collect();
            assert!(
                undocumented.is_empty(),
                "FI_RDMX_STATS prints counters fi_rdmx(7) does not list: {undocumented:?}"
            );
            assert!(stale.is_empty(), "fi_rdmx(7) lists counters FI_RDMX_STATS does not print: {stale:?}");
        }
    }
}
