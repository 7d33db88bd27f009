//! The goodput-vs-loss table of `docs/reliability.md` is the snapshot that
//! `sim_scenarios.rs` (`goodput_versus_loss_table`) pins, copied verbatim
//! between two markers. This test fails when they differ, so a change to
//! the congestion control that moves the snapshot also moves the docs.
//! `RDMX_BLESS_DOCS=1` writes the snapshot's table into the docs instead.
use std::path::PathBuf;

const SNAPSHOT: &str = "rdm/tests/snapshots/sim_scenarios__goodput_vs_loss.snap";
const DOC: &str = "docs/reliability.md";
const BEGIN: &str =
    "<!-- goodput_vs_loss: generated from rdm/tests/snapshots/sim_scenarios__goodput_vs_loss.snap; do not edit -->\n";
const END: &str = "<!-- goodput_vs_loss: end -->";

fn repo(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read(rel: &str) -> String {
    let p = repo(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The body of an insta snapshot: what follows its `---` header.
fn snapshot_body(snap: &str) -> &str {
    let rest = snap.strip_prefix("---\n").expect("an insta snapshot starts with ---");
    let end = rest.find("\n---\n").expect("the snapshot header ends with ---");
    rest[end + 5..].trim_end()
}

/// The byte range of the generated table in the doc (between the markers).
fn table_range(doc: &str) -> std::ops::Range<usize> {
    let start = doc.find(BEGIN).unwrap_or_else(|| panic!("{DOC} lacks the marker {BEGIN:?}")) + BEGIN.len();
    let len = doc[start..].find(END).unwrap_or_else(|| panic!("{DOC} lacks the marker {END:?}"));
    start..start + len
}

#[test]
fn reliability_doc_table_is_the_goodput_snapshot() {
    let snap = read(SNAPSHOT);
    let want = snapshot_body(&snap);
    assert!(want.lines().count() >= 4, "the snapshot has no table: {want:?}");
    let doc = read(DOC);
    let range = table_range(&doc);
    let have = doc[range.clone()].trim_end();
    if have != want && std::env::var_os("RDMX_BLESS_DOCS").is_some() {
        let mut new = doc.clone();
        new.replace_range(range, &format!("{want}\n"));
        std::fs::write(repo(DOC), new).expect("write the doc");
        return;
    }
    assert_eq!(have, want, "{DOC}'s goodput table differs from {SNAPSHOT}: run `RDMX_BLESS_DOCS=1 cargo test --release -p rdm --test docs_goodput`");
}

#[test]
fn the_check_can_fail() {
    let snap = "---\nsource: x\nexpression: table\n---\n| a |\n|---:|\n| 1 |\n";
    assert_eq!(snapshot_body(snap), "| a |\n|---:|\n| 1 |");
    let doc = format!("text\n{BEGIN}| a |\n|---:|\n| 2 |\n{END}\nmore");
    let r = table_range(&doc);
    assert_ne!(doc[r].trim_end(), snapshot_body(snap), "a changed figure must differ");
}
