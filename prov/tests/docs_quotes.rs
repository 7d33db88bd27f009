//! Figures the docs quote from a measurement's raw output are copied, not
//! retyped: a block introduced by `<!-- quoted from <path> -->` (a fenced
//! block, or the lines up to the next blank one, such as a Markdown table)
//! must consist of lines of that file, each exactly as it is there. The
//! README and every Markdown file directly under `docs/` and `benches/` are
//! checked.
use std::path::{Path, PathBuf};

const MARK: &str = "<!-- quoted from ";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Each quote of `doc`: (source path, the quoted lines).
fn quotes(doc: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(l) = lines.next() {
        let Some(rest) = l.trim().strip_prefix(MARK) else { continue };
        let path = rest.strip_suffix("-->").unwrap_or_else(|| panic!("unterminated marker: {l}")).trim().to_string();
        let first = lines.next().unwrap_or_default();
        let mut body = Vec::new();
        if first.starts_with("```") {
            // A fenced block, up to its closing fence.
            loop {
                let b = lines.next().unwrap_or_else(|| panic!("{path}: the quoted block never closes"));
                if b.starts_with("```") {
                    break;
                }
                body.push(b.to_string());
            }
        } else {
            // A paragraph or a Markdown table, up to the first blank line.
            let mut b = first;
            while !b.trim().is_empty() {
                body.push(b.to_string());
                b = lines.next().unwrap_or_default();
            }
        }
        out.push((path, body));
    }
    out
}

/// The quoted lines that are not lines of `source`.
fn not_in<'a>(body: &'a [String], source: &str) -> Vec<&'a String> {
    body.iter().filter(|q| !q.trim().is_empty() && !source.lines().any(|s| s.trim_end() == q.trim_end())).collect()
}

fn docs() -> Vec<PathBuf> {
    let r = root();
    let mut files = vec![r.join("README.md")];
    for dir in ["docs", "benches"] {
        for e in std::fs::read_dir(r.join(dir)).expect("read_dir") {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "md") {
                files.push(p);
            }
        }
    }
    files
}

#[test]
fn quoted_figures_are_lines_of_their_results_files() {
    let mut checked = 0;
    for doc in docs() {
        for (path, body) in quotes(&read(&doc)) {
            assert!(
                path.starts_with("benches/results/"),
                "{}: quotes {path}, which is not a results file",
                doc.display()
            );
            assert!(!body.is_empty(), "{}: an empty quote of {path}", doc.display());
            let source = read(&root().join(&path));
            let missing = not_in(&body, &source);
            assert!(
                missing.is_empty(),
                "{}: lines quoted from {path} that it does not contain: {missing:#?}",
                doc.display()
            );
            checked += 1;
        }
    }
    // docs/scale.md quotes its run twice; fewer means the marker was lost.
    assert!(checked >= 2, "only {checked} quoted blocks found");
}

#[test]
fn the_check_can_fail() {
    let doc = "x\n<!-- quoted from benches/results/a.txt -->\n```text\n  per peer 3163 B\n```\n";
    let q = quotes(doc);
    assert_eq!(q, vec![("benches/results/a.txt".to_string(), vec!["  per peer 3163 B".to_string()])]);
    assert!(not_in(&q[0].1, "head\n  per peer 3163 B\n").is_empty());
    assert_eq!(not_in(&q[0].1, "head\n  per peer 3160 B\n").len(), 1);
    let table = "<!-- quoted from benches/results/b.md -->\n| a | 1.21× |\n| b | 0.92× |\n\nafter\n";
    assert_eq!(quotes(table)[0].1, vec!["| a | 1.21× |".to_string(), "| b | 0.92× |".to_string()]);
}

/// The README's speed section is the whole summary of the newest harness run
/// that wrote one (`benches/readme_summary.sh` puts it there): every line of
/// that `summary.md`, in order, and nothing else between the markers.
#[test]
fn the_readme_speed_summary_is_the_newest_runs_whole_summary() {
    let readme = read(&root().join("README.md"));
    let begin = readme.find("<!-- speed summary: begin -->\n").expect("README.md: no speed summary begin marker");
    let end = readme.find("<!-- speed summary: end -->").expect("README.md: no speed summary end marker");
    let block = &readme[begin..end];
    let quoted = quotes(block);
    assert!(!quoted.is_empty(), "README.md: the speed summary quotes nothing (run benches/readme_summary.sh)");
    let path = &quoted[0].0;
    assert!(
        quoted.iter().all(|(p, _)| p == path) && path.ends_with("/summary.md"),
        "README.md: the speed summary must quote one run's summary.md, not {:?}",
        quoted.iter().map(|q| &q.0).collect::<Vec<_>>()
    );
    let source = read(&root().join(path));
    let want: Vec<&str> = source.lines().filter(|l| !l.trim().is_empty()).collect();
    let got: Vec<&str> =
        block.lines().skip(1).filter(|l| !l.trim().is_empty() && !l.trim().starts_with(MARK)).collect();
    assert_eq!(got, want, "README.md's speed summary is not {path} (run benches/readme_summary.sh)");
    // The newest run with a summary: results directories start with their
    // date (and, from 2026-11-27T19 on, the time: `<date>T<HHMM>` sorts after
    // the same date's older names).
    let mut runs: Vec<String> = std::fs::read_dir(root().join("benches/results"))
        .expect("benches/results")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("summary.md").exists())
        .map(|e| format!("benches/results/{}/summary.md", e.file_name().to_string_lossy()))
        .collect();
    runs.sort();
    assert_eq!(Some(path), runs.last(), "README.md quotes {path}, but a newer run has a summary");
}
