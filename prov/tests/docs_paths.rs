//! The files and Rust items the docs name exist, so that a file moved or a
//! function renamed fails here instead of leaving the docs pointing at
//! nothing.
//!
//! The docs checked: `README.md`, every `docs/*.md`, `rdm/PROTOCOL.md`, and
//! the crate docs (`//!` lines) of every workspace crate's `src/lib.rs`. In
//! each, outside fenced code blocks, two kinds of names are read:
//!
//! * **Paths.** Each whitespace-separated word of an inline code span, and
//!   each Markdown link target. A code-span word is a repository path when it
//!   contains a `/`, consists of path characters only, and ends in a known
//!   extension ([`EXTENSIONS`]) or in `/` (a directory), or starts with a
//!   top-level entry of the repository (`benches/results/<run>`); it is
//!   resolved from the repository root. A link target is resolved from the
//!   doc's own directory (its `#anchor` dropped). Not paths: URLs, absolute
//!   paths (`/dev/shm`), `~` and `$VAR` paths, globs (`*.rs`), placeholders
//!   (`<run>`), assignments (`PREFIX=/opt/rdmx`), and, in crate docs,
//!   rustdoc's intra-doc link targets (`super::Packet::Cts`). Names outside
//!   this repository that look like its paths are listed, each with why, in
//!   [`EXTERNAL_PATHS`].
//! * **Rust items.** A code span (or intra-doc link target) that is a path of
//!   identifiers, `a::b::c` (an argument list `(..)` after it is dropped), is
//!   looked up in the workspace's `.rs` sources, by their text: a leading
//!   workspace crate name (`rdm`, `rdmx_fi`, ...) or `crate`/`self`/`super` is
//!   dropped; then a `CamelCase` segment must be defined as a `struct`,
//!   `enum`, `trait`, `type` or `union` (after a type: or be one of its
//!   variants), an `UPPER_CASE` one as a `const` or `static`, a `snake_case`
//!   one as a module when more follows (`wire::msg::MsgHeader`) and as an
//!   `fn` at the end (after a type: or a field, `UdpConfig::gso`; after a
//!   module: or a module, `rdm::device::rc`). `file.rs::test_name` names an
//!   `fn` in a file of that name. Items of other crates (`std::...`) are
//!   skipped by their first segment ([`EXTERNAL_ROOTS`]). This is a grep, not
//!   name resolution: `Engine::send` passes when some `Engine` type and some
//!   `fn send` exist.
//!
//! A failure lists every missing name with its doc and line.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// File extensions that make a code-span word with a `/` a path.
const EXTENSIONS: &[&str] =
    &["rs", "md", "sh", "toml", "c", "h", "7", "py", "txt", "csv", "json", "snap", "png", "svg", "yml", "yaml"];

/// Path-like names of files outside this repository (a prefix when it ends
/// in `/`), with why they are not here.
const EXTERNAL_PATHS: &[(&str, &str)] = &[
    // docs/testing.md: where fabtests dereferences NULL (a fabtests source file).
    ("common/shared.c", "fabtests' source"),
    // The build's output (scripts/build.sh): made at build time, never committed.
    ("build-out/", "build output"),
];

/// First segments of Rust paths that name other crates' items.
const EXTERNAL_ROOTS: &[&str] = &["std", "core", "alloc", "libc", "nix"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The workspace crates: (directory, library name) for each top-level
/// directory with a `Cargo.toml` and a `src/lib.rs`.
fn crates() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root()).expect("read_dir") {
        let p = e.expect("dir entry").path();
        if !p.join("Cargo.toml").is_file() || !p.join("src/lib.rs").is_file() {
            continue;
        }
        let dir = p.file_name().unwrap().to_string_lossy().into_owned();
        let manifest = read(&p.join("Cargo.toml"));
        // `[lib] name = "..."` if set, else the package name.
        let mut name = None;
        let mut section = "";
        for l in manifest.lines() {
            let l = l.trim();
            if l.starts_with('[') {
                section = l;
            } else if let Some(v) = l.strip_prefix("name").map(str::trim).and_then(|v| v.strip_prefix('=')) {
                let v = v.trim().trim_matches('"').replace('-', "_");
                if section == "[lib]" || (section == "[package]" && name.is_none()) {
                    name = Some(v);
                }
            }
        }
        out.push((dir, name.expect("a crate name")));
    }
    out.sort();
    out
}

/// The docs checked: (path from the root, text with one line per line of
/// the file; for a `lib.rs`, its `//!` lines, the others blank).
fn docs() -> Vec<(String, String)> {
    let r = root();
    let mut names = vec!["README.md".to_string()];
    let mut md: Vec<String> = std::fs::read_dir(r.join("docs"))
        .expect("read_dir docs")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .collect();
    md.sort();
    names.extend(md);
    names.push("rdm/PROTOCOL.md".into());
    let mut out: Vec<(String, String)> = names.into_iter().map(|n| (n.clone(), read(&r.join(&n)))).collect();
    for (dir, _) in crates() {
        let name = format!("{dir}/src/lib.rs");
        out.push((name.clone(), crate_doc(&read(&r.join(&name)))));
    }
    out
}

/// A source file's `//!` text, line for line (other lines blank).
fn crate_doc(src: &str) -> String {
    src.lines()
        .map(|l| match l.trim_start().strip_prefix("//!") {
            Some(d) => d.strip_prefix(' ').unwrap_or(d),
            None => "",
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A word of an inline code span.
    Code,
    /// A Markdown link target.
    Link,
}

/// Every inline code span and link target of a doc outside fenced blocks:
/// (line number, kind, text).
fn names(doc: &str) -> Vec<(usize, Kind, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    // The code span open at the end of the previous line (a span may wrap;
    // it never crosses a blank line): its first line and text so far.
    let mut open: Option<(usize, String)> = None;
    for (i, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = None;
            continue;
        }
        if fenced || line.trim().is_empty() {
            open = None;
            continue;
        }
        // Code spans: the text between a backtick and the next.
        for (j, piece) in line.split('`').enumerate() {
            if j > 0 {
                open = match open.take() {
                    Some((at, text)) => {
                        if !text.trim().is_empty() {
                            out.push((at, Kind::Code, text.trim().to_string()));
                        }
                        None
                    }
                    None => Some((i + 1, String::new())),
                };
            }
            if let Some((_, text)) = open.as_mut() {
                if j == 0 {
                    text.push(' ');
                }
                text.push_str(piece);
            }
        }
        let mut rest = line;
        while let Some(k) = rest.find("](") {
            let tail = &rest[k + 2..];
            let Some(end) = tail.find(')') else { break };
            out.push((i + 1, Kind::Link, tail[..end].trim().to_string()));
            rest = &tail[end..];
        }
    }
    out
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_-./+#".contains(c)
}

/// The repository path a code-span word names, if it names one.
fn code_path(word: &str, top: &BTreeSet<String>) -> Option<String> {
    let w = word.trim_end_matches([',', ';', ':']).trim_start_matches("./");
    if !w.contains('/')
        || w.contains("//")
        || w.starts_with('/')
        || w.starts_with("..")
        || w.starts_with('-')
        || !w.chars().all(is_path_char)
    {
        return None;
    }
    let w = w.split('#').next().unwrap_or(w);
    let ext = Path::new(w).extension().map(|e| e.to_string_lossy().into_owned());
    let first = w.split('/').next().unwrap_or("");
    let looks = w.ends_with('/') || ext.is_some_and(|e| EXTENSIONS.contains(&e.as_str())) || top.contains(first);
    looks.then(|| w.to_string())
}

/// The file a link target names, relative to the doc's directory, if it
/// names one (not a URL, an anchor or an intra-doc link).
fn link_path(target: &str, doc: &str) -> Option<String> {
    let t = target.split('#').next().unwrap_or("");
    if t.is_empty() || t.contains("://") || t.starts_with("mailto:") || t.contains("::") {
        return None;
    }
    // Intra-doc links of crate docs name items (`Foo`, `crate::x`), never a
    // file without a dot or slash.
    if doc.ends_with(".rs") && !t.contains('/') && !t.contains('.') {
        return None;
    }
    let dir = Path::new(doc).parent().unwrap_or(Path::new(""));
    Some(normalize(&dir.join(t)))
}

/// `a/b/../c` as `a/c` (without touching the file system).
fn normalize(p: &Path) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            c => parts.push(c.as_os_str().to_string_lossy().into_owned()),
        }
    }
    parts.join("/")
}

fn external_path(p: &str) -> bool {
    EXTERNAL_PATHS.iter().any(|(e, _)| if e.ends_with('/') { p.starts_with(e) } else { p == *e })
}

/// What the workspace's sources define, by name (found by their text).
#[derive(Default)]
struct Defined {
    fns: BTreeSet<String>,
    types: BTreeSet<String>,
    variants: BTreeSet<String>,
    consts: BTreeSet<String>,
    mods: BTreeSet<String>,
    fields: BTreeSet<String>,
    macros: BTreeSet<String>,
    /// File name -> the `fn`s it defines.
    files: Vec<(String, BTreeSet<String>)>,
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The identifier after each occurrence of `kw ` in `line` at a word start.
fn after_keyword<'a>(line: &'a str, kw: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let pat = format!("{kw} ");
    let mut from = 0;
    while let Some(k) = line[from..].find(&pat) {
        let at = from + k;
        let word_start = at == 0 || !line[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_');
        let id = ident_at(line[at + pat.len()..].trim_start_matches("r#"));
        if word_start && !id.is_empty() {
            out.push(id);
        }
        from = at + pat.len();
    }
    out
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let p = e.expect("dir entry").path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            if !(name.starts_with('.') || name == "target" || name == "build-out") {
                rs_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn defined() -> Defined {
    let mut files = Vec::new();
    rs_files(&root(), &mut files);
    files.sort();
    assert!(files.len() > 100, "found only {} .rs files", files.len());
    let mut d = Defined::default();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let stem = name.trim_end_matches(".rs");
        // A file is a module of its name (`wire.rs`), `mod.rs` one of its directory's.
        if stem == "mod" {
            d.mods.insert(f.parent().unwrap().file_name().unwrap().to_string_lossy().into_owned());
        } else {
            d.mods.insert(stem.to_string());
        }
        let mut fns = BTreeSet::new();
        for line in read(f).lines() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            for id in after_keyword(t, "fn") {
                fns.insert(id.to_string());
            }
            for kw in ["struct", "enum", "trait", "type", "union"] {
                d.types.extend(after_keyword(t, kw).into_iter().map(String::from));
            }
            for kw in ["const", "static"] {
                d.consts.extend(after_keyword(t, kw).into_iter().map(String::from));
            }
            d.mods.extend(after_keyword(t, "mod").into_iter().map(String::from));
            d.macros.extend(after_keyword(t, "macro_rules!").into_iter().map(String::from));
            // A field (`pub gso: bool,`) or a variant (`Delivered {`, `Raw(..)`,
            // `Ok,`, `Ok = 0,`), or a pattern naming one: a line that starts
            // with the name.
            let body = t.strip_prefix("pub(crate) ").or_else(|| t.strip_prefix("pub ")).unwrap_or(t);
            let id = ident_at(body);
            if !id.is_empty() {
                let after = &body[id.len()..];
                if after.starts_with(':') && !after.starts_with("::") {
                    d.fields.insert(id.to_string());
                }
                if id.starts_with(|c: char| c.is_ascii_uppercase())
                    && (after.is_empty() || after.starts_with([',', '(', ' ']))
                {
                    d.variants.insert(id.to_string());
                }
            }
        }
        d.fns.extend(fns.iter().cloned());
        d.files.push((name, fns));
    }
    d
}

fn is_ident(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[derive(Clone, Copy, PartialEq)]
enum Case {
    Camel,
    Upper,
    Snake,
}

fn case(s: &str) -> Case {
    if s.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_') {
        Case::Upper
    } else if s.starts_with(|c: char| c.is_ascii_uppercase()) {
        Case::Camel
    } else {
        Case::Snake
    }
}

/// The segments of a Rust path a code span names (`rdm::Engine::send`,
/// `Endpoint::peer(addr)`, `sim_messages.rs::a_test`), if it is one.
fn rust_path(span: &str) -> Option<Vec<String>> {
    let s = span.trim().trim_end_matches("()");
    let s = match s.find('(') {
        Some(k) if s.ends_with(')') => &s[..k],
        _ => s,
    };
    let segs: Vec<&str> = s.split("::").collect();
    if segs.len() < 2 {
        return None;
    }
    let first_ok = is_ident(segs[0]) || (segs[0].ends_with(".rs") && is_ident(segs[0].trim_end_matches(".rs")));
    (first_ok && segs[1..].iter().all(|x| is_ident(x))).then(|| segs.iter().map(|x| x.to_string()).collect())
}

/// Why the item `segs` names is not in the workspace, if it is not (`None`:
/// found, or not this workspace's).
fn missing_item(segs: &[String], d: &Defined, crate_names: &BTreeSet<String>) -> Option<String> {
    if EXTERNAL_ROOTS.contains(&segs[0].as_str()) {
        return None;
    }
    if let Some(file) = segs[0].strip_suffix(".rs").map(|_| segs[0].as_str()) {
        let f = &segs[1];
        let found = d.files.iter().any(|(n, fns)| n == file && fns.contains(f));
        return (!found).then(|| format!("no `fn {f}` in a file `{file}`"));
    }
    let mut segs: &[String] = segs;
    while let Some(s) = segs.first() {
        if ["crate", "self", "super"].contains(&s.as_str()) || crate_names.contains(s) {
            segs = &segs[1..];
        } else {
            break;
        }
    }
    let mut after_type = false;
    for (i, s) in segs.iter().enumerate() {
        let last = i + 1 == segs.len();
        let ok = match case(s) {
            Case::Camel => d.types.contains(s) || (after_type && d.variants.contains(s)),
            Case::Upper => d.consts.contains(s) || (after_type && d.variants.contains(s)),
            Case::Snake if last => {
                d.fns.contains(s)
                    || d.macros.contains(s)
                    || (after_type && d.fields.contains(s))
                    || (!after_type && d.mods.contains(s))
            }
            Case::Snake => d.mods.contains(s),
        };
        if !ok {
            let what = match case(s) {
                Case::Camel if after_type => "type or variant",
                Case::Camel => "struct, enum, trait or type",
                Case::Upper => "const or static",
                Case::Snake if last && after_type => "fn or field",
                Case::Snake if last => "fn or module",
                Case::Snake => "module",
            };
            return Some(format!("no {what} `{s}`"));
        }
        after_type = case(s) == Case::Camel;
    }
    None
}

/// Every name of the doc `doc_name` (its text `text`) that does not exist:
/// "doc:line: what".
fn check_doc(
    doc_name: &str,
    text: &str,
    d: &Defined,
    crate_names: &BTreeSet<String>,
    top: &BTreeSet<String>,
    counts: &mut (usize, usize),
) -> Vec<String> {
    let mut out = Vec::new();
    for (line, kind, s) in names(text) {
        let path = match kind {
            Kind::Link => link_path(&s, doc_name).into_iter().collect::<Vec<_>>(),
            Kind::Code => s.split_whitespace().filter_map(|w| code_path(w, top)).collect(),
        };
        for p in path {
            if external_path(&p) {
                continue;
            }
            counts.0 += 1;
            if !root().join(&p).exists() {
                out.push(format!("{doc_name}:{line}: path `{p}`: no such file or directory"));
            }
        }
        let item = match kind {
            Kind::Code => rust_path(&s),
            Kind::Link if s.contains("::") && !s.contains("://") => rust_path(&s),
            Kind::Link => None,
        };
        if let Some(segs) = item {
            counts.1 += 1;
            if let Some(why) = missing_item(&segs, d, crate_names) {
                out.push(format!("{doc_name}:{line}: item `{}`: {why} in the workspace's sources", segs.join("::")));
            }
        }
    }
    out
}

fn context() -> (Defined, BTreeSet<String>, BTreeSet<String>) {
    let crate_names: BTreeSet<String> = crates().into_iter().flat_map(|(dir, lib)| [dir, lib]).collect();
    let top: BTreeSet<String> = std::fs::read_dir(root())
        .expect("read_dir")
        .map(|e| e.expect("dir entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !(n == "target" || n == "build-out"))
        .collect();
    (defined(), crate_names, top)
}

#[test]
fn every_path_and_item_the_docs_name_exists() {
    let (d, crate_names, top) = context();
    let mut missing = Vec::new();
    let mut counts = (0, 0);
    let all = docs();
    for (name, text) in &all {
        missing.extend(check_doc(name, text, &d, &crate_names, &top, &mut counts));
    }
    assert!(
        missing.is_empty(),
        "the docs name {} thing(s) the repository does not have:\n  {}",
        missing.len(),
        missing.join("\n  ")
    );
    // Fewer means the extraction broke, not that the docs got better.
    assert!(all.len() >= 15, "only {} docs read", all.len());
    assert!(counts.0 >= 150 && counts.1 >= 60, "only {} paths and {} items checked", counts.0, counts.1);
}

#[test]
fn what_counts_as_a_name() {
    let top: BTreeSet<String> = ["benches", "scripts", "rdm", ".ci"].into_iter().map(String::from).collect();
    let p = |w| code_path(w, &top);
    assert_eq!(p("rdm/src/engine/wire.rs").as_deref(), Some("rdm/src/engine/wire.rs"));
    assert_eq!(p("./scripts/test.sh").as_deref(), Some("scripts/test.sh"));
    assert_eq!(p("rndv/src/wire/").as_deref(), Some("rndv/src/wire/"));
    assert_eq!(p(".ci/run").as_deref(), Some(".ci/run"));
    assert_eq!(
        p("benches/results/2026-11-27T2032-vm-1eed664").as_deref(),
        Some("benches/results/2026-11-27T2032-vm-1eed664")
    );
    for not in [
        "https://ofiwg.github.io/libfabric/",
        "rdmx://<host>/x",
        "*.rs",
        "rdm/src/*.rs",
        "~/.cache/rdmx-vm",
        "/dev/shm",
        "/usr/lib/x86_64-linux-gnu/libfabric/librdmx-fi.so",
        "$libdir/libfabric",
        "FI_PROVIDER_PATH=$PWD/build-out/lib",
        "PREFIX=/opt/rdmx",
        "max_order_raw/war/waw_size",
        "tcp;ofi_rxm",
        "//",
        "FI_RECV",
    ] {
        assert_eq!(p(not), None, "{not}");
    }
    assert!(external_path("common/shared.c") && external_path("build-out/lib/librdmx-fi.so"));
    assert_eq!(link_path("../benches/HISTORY.md", "docs/testing.md").as_deref(), Some("benches/HISTORY.md"));
    assert_eq!(link_path("reliability.md#loss", "docs/testing.md").as_deref(), Some("docs/reliability.md"));
    assert_eq!(link_path("#speed", "README.md"), None);
    assert_eq!(link_path("super::Packet::Cts", "rndv/src/wire/mod.rs"), None);
    assert_eq!(link_path("Engine", "rdm/src/lib.rs"), None);
    let r = |s| rust_path(s).map(|v| v.join("::"));
    assert_eq!(r("Engine::send_gather").as_deref(), Some("Engine::send_gather"));
    assert_eq!(r("Endpoint::peer(addr)").as_deref(), Some("Endpoint::peer"));
    assert_eq!(r("sim_messages.rs::a_test").as_deref(), Some("sim_messages.rs::a_test"));
    for not in ["rdmx://a/b", "SendFailed { reason: Timeout }", "Vec<u8>", "FI_RDMX_DEVICE", "a::b c"] {
        assert_eq!(r(not), None, "{not}");
    }
}

/// The check fails on a planted error: a doc naming a file and items that do
/// not exist, beside ones that do.
#[test]
fn the_check_can_fail() {
    let (d, crate_names, top) = context();
    let doc = "x\nSee `rdm/src/engine/wire.rs` and `rdm/src/engine/nope.rs`, [the design](design.md), \
               [gone](gone.md).\n`Engine::send_gather`, `Engine::no_such_method`, `NoSuchType::send`, \
               `rdm::engine::DIRECT_MAX`, `std::mem::take`.\n```\n`not/checked.rs`\n```\n";
    let mut counts = (0, 0);
    let missing = check_doc("docs/planted.md", doc, &d, &crate_names, &top, &mut counts);
    assert_eq!(
        missing,
        vec![
            "docs/planted.md:2: path `rdm/src/engine/nope.rs`: no such file or directory".to_string(),
            "docs/planted.md:2: path `docs/gone.md`: no such file or directory".to_string(),
            "docs/planted.md:3: item `Engine::no_such_method`: no fn or field `no_such_method` in the workspace's sources"
                .to_string(),
            "docs/planted.md:3: item `NoSuchType::send`: no struct, enum, trait or type `NoSuchType` in the workspace's sources"
                .to_string(),
        ]
    );
    assert_eq!(counts, (4, 5));
}
