//! fi_rdmx(7)'s RUNTIME STATS section lists exactly the counters an endpoint
//! prints with `FI_RDMX_STATS=1` (`rdmx: <name> <value>` lines on stderr at
//! close), read from a real two-process fi_pingpong on each device.
use fi_tests::procs::{self, text};
use std::collections::BTreeSet;

/// The names in the `.TP` tags of the man page's RUNTIME STATS section
/// (`\f[C]name\f[R], \f[C]other\f[R]`).
fn documented() -> BTreeSet<String> {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fi_rdmx.7")).expect("docs/fi_rdmx.7");
    let start = page.find(".SH RUNTIME STATS\n").expect("RUNTIME STATS section");
    let sec = &page[start + 1..];
    let sec = &sec[..sec.find("\n.SH ").unwrap_or(sec.len())];
    let mut names = BTreeSet::new();
    let mut lines = sec.lines();
    while let Some(l) = lines.next() {
        if l == ".TP" {
            for part in lines.next().unwrap_or_default().split(", ") {
                let n = part.trim().trim_start_matches("\\f[C]").trim_end_matches("\\f[R]");
                names.insert(n.replace("\\-", "-"));
            }
        }
    }
    names
}

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
    let doc = documented();
    assert!(doc.contains("packets_sent") && doc.contains("mr_cache_hits"), "{doc:?}");
    for (device, port) in [("udp", 47650), ("shm", 47651)] {
        fi_tests::init();
        let (s, c) = procs::pingpong(&["-I", "10", "-S", "1024"], &[("FI_RDMX_DEVICE", device), ("FI_RDMX_STATS", "1")], port, "127.0.0.1", &[], &[]);
        assert!(c.status.success() && s.status.success(), "fi_pingpong on {device}:\n{}\n{}", text(&c), text(&s));
        for out in [text(&s), text(&c)] {
            let got = printed(&out);
            assert!(got.len() > 10, "no stats printed on {device}:\n{out}");
            let undocumented: Vec<_> = got.difference(&doc).collect();
            let stale: Vec<_> = doc.difference(&got).collect();
            assert!(undocumented.is_empty(), "FI_RDMX_STATS prints counters fi_rdmx(7) does not list: {undocumented:?}");
            assert!(stale.is_empty(), "fi_rdmx(7) lists counters FI_RDMX_STATS does not print: {stale:?}");
        }
    }
}
