//! fi_rdmx(7) (`docs/fi_rdmx.7`) documents exactly the parameters rdmx
//! registers with `fi_param_define` (`params::documented()`, the table
//! `define_all` registers), with the same defaults as the registered help
//! texts. It is the only place that lists them: the README and the Markdown
//! docs may name parameters, but only registered ones, and hold no table of
//! them that could drift from the man page.
use std::collections::BTreeSet;
use std::path::Path;

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `FI_RDMX_<NAME>` token of a text. A token that ends in `_` (written
/// `FI_RDMX_FAULT_*`) is a family and is returned with its `*`.
fn tokens(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("FI_RDMX_") {
        let tail = &rest[i..];
        let end =
            tail.find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')).unwrap_or(tail.len());
        let mut name = tail[..end].to_string();
        if tail[end..].starts_with('*') {
            name.push('*');
        }
        out.insert(name);
        rest = &tail[end..];
    }
    out
}

fn registered() -> Vec<(String, String)> {
    let r = rdmx_fi::params::documented();
    assert!(r.len() >= 20, "the parameter table shrank? {r:?}");
    r
}

/// The numeric default a help text states (`(default 1472)`), if any.
fn numeric_default(help: &str) -> Option<String> {
    let i = help.find("default ")?;
    let digits: String = help[i + 8..].chars().take_while(char::is_ascii_digit).collect();
    (!digits.is_empty()).then_some(digits)
}

/// Names in `found` that are not registered (families must match one).
fn unregistered(found: &BTreeSet<String>, names: &BTreeSet<String>) -> Vec<String> {
    found
        .iter()
        .filter(|t| match t.strip_suffix('*') {
            Some(prefix) => !names.iter().any(|n| n.starts_with(prefix)),
            None => !names.contains(*t),
        })
        .cloned()
        .collect()
}

/// The man page's text from `.SH <name>` to the next `.SH`.
fn section<'a>(page: &'a str, name: &str) -> &'a str {
    let head = format!(".SH {name}\n");
    let start = page.find(&head).unwrap_or_else(|| panic!("no section {name}")) + head.len();
    let len = page[start..].find("\n.SH ").unwrap_or(page.len() - start);
    &page[start..start + len]
}

/// The `.TP` entries of a section: (tag line, body).
fn tp_entries(sec: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = sec.lines().peekable();
    while let Some(l) = lines.next() {
        if l == ".TP" {
            let tag = lines.next().unwrap_or_default().to_string();
            let mut body = String::new();
            while let Some(b) = lines.peek() {
                if b.starts_with(".TP") || b.starts_with(".PP") || b.starts_with(".SH") {
                    break;
                }
                body.push_str(b);
                body.push('\n');
                lines.next();
            }
            out.push((tag, body));
        }
    }
    out
}

#[test]
fn man_page_documents_exactly_the_registered_parameters() {
    let page = read("../docs/fi_rdmx.7");
    let reg = registered();
    let names: BTreeSet<String> = reg.iter().map(|(n, _)| n.clone()).collect();

    let unknown = unregistered(&tokens(&page), &names);
    assert!(unknown.is_empty(), "fi_rdmx.7 names FI_RDMX_ variables rdmx does not register: {unknown:?}");

    let entries = tp_entries(section(&page, "RUNTIME PARAMETERS"));
    let documented: Vec<String> =
        entries.iter().map(|(tag, _)| tag.replace("\\f[I]", "").replace("\\f[R]", "")).collect();
    let missing: Vec<&String> = names.iter().filter(|n| !documented.contains(n)).collect();
    assert!(missing.is_empty(), "fi_rdmx.7 RUNTIME PARAMETERS lacks {missing:?}");
    let extra: Vec<&String> = documented.iter().filter(|d| !names.contains(*d)).collect();
    assert!(extra.is_empty(), "fi_rdmx.7 RUNTIME PARAMETERS has entries that are not parameters: {extra:?}");

    for (name, help) in &reg {
        let Some(d) = numeric_default(help) else { continue };
        let (_, body) = &entries[documented.iter().position(|x| x == name).unwrap()];
        let flat = body.replace('\n', " ");
        assert!(
            flat.contains(&format!("default {d}")),
            "fi_rdmx.7: {name} should say 'default {d}' (its help text does): {flat}"
        );
    }
}

/// The README and the Markdown files under `docs/` and `benches/`.
fn markdown_docs() -> Vec<(String, String)> {
    let mut out = vec![("README.md".to_string(), read("../README.md"))];
    for dir in ["docs", "benches"] {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.extension().is_some_and(|x| x == "md") {
                let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                out.push((format!("{dir}/{}", p.file_name().unwrap_or_default().to_string_lossy()), text));
            }
        }
    }
    out
}

/// Rows of a Markdown table whose first cell is a parameter (`| `FI_RDMX_X` | ...`).
fn parameter_rows(text: &str) -> Vec<&str> {
    text.lines().filter(|l| l.split('|').nth(1).is_some_and(|c| c.trim().starts_with("`FI_RDMX_"))).collect()
}

#[test]
fn markdown_docs_name_only_registered_parameters_and_list_none() {
    let names: BTreeSet<String> = registered().into_iter().map(|(n, _)| n).collect();
    let docs = markdown_docs();
    assert!(
        docs.iter().any(|(n, _)| n == "docs/design.md"),
        "docs/ not found: {:?}",
        docs.iter().map(|d| &d.0).collect::<Vec<_>>()
    );
    for (name, text) in &docs {
        let unknown = unregistered(&tokens(text), &names);
        assert!(unknown.is_empty(), "{name} names FI_RDMX_ variables rdmx does not register: {unknown:?}");
        let rows = parameter_rows(text);
        assert!(
            rows.is_empty(),
            "{name} has a parameter table (fi_rdmx(7), RUNTIME PARAMETERS, is the only one): {rows:#?}"
        );
    }
}

#[test]
fn the_checks_can_fail() {
    // The helpers see a missing or an extra name.
    let names: BTreeSet<String> = ["FI_RDMX_A".to_string(), "FI_RDMX_FAULT_X".to_string()].into();
    let t = tokens("x FI_RDMX_A, FI_RDMX_B and FI_RDMX_FAULT_* FI_RDMX_NOPE_*");
    assert_eq!(unregistered(&t, &names), vec!["FI_RDMX_B".to_string(), "FI_RDMX_NOPE_*".to_string()]);
    assert_eq!(numeric_default("largest (default 1472)"), Some("1472".into()));
    assert_eq!(numeric_default("(default: the host)"), None);
    let sec = section(".SH A\n.TP\n\\f[I]FI_RDMX_A\\f[R]\nbody (default 3).\n.PP\nx\n.SH B\n", "A");
    assert_eq!(tp_entries(sec), vec![("\\f[I]FI_RDMX_A\\f[R]".to_string(), "body (default 3).\n".to_string())]);
    assert_eq!(
        parameter_rows("| `FI_RDMX_A` | 3 | x |\n| field | type |\n| `FI_RDMX_STATS=1` | y |"),
        vec!["| `FI_RDMX_A` | 3 | x |", "| `FI_RDMX_STATS=1` | y |"]
    );
}
