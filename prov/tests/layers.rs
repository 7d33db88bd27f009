//! The layering of the prov crate (issue 20, "prov in layers"), checked from
//! the sources so that it cannot rot.
//!
//! Every file `prov/src/<m>.rs` is a module `m`; a mention of `crate::x` (or
//! `$crate::x`, or `crate::{x, y::z}`) outside a `//` comment line is an edge
//! `m -> x`. Names that are not module files (`crate::provider_ptr`,
//! `crate::PROVIDER_VERSION`) are items of the crate root, `lib.rs`, which
//! declares every module and is not a node.
//!
//! Two rules:
//! * No import circle, except through the links of an fid object to its
//!   parent object ([`PARENT_LINKS`]: an endpoint points at its domain, a
//!   domain at its fabric), which are taken out of the graph first.
//! * No module imports a module of a higher layer ([`LAYERS`]): the base
//!   (errors, logging, parameters, addresses, fids), then the argument types
//!   and the queues, then the runtime (`core`), then the fid objects. A new
//!   module must be placed in a layer.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Bottom to top.
const LAYERS: &[(&str, &[&str])] = &[
    ("base", &["error", "log", "params", "clock", "addr", "entry", "fid", "info", "version", "job"]),
    (
        "arguments and queues",
        &[
            "args",
            "rma",
            "av_table",
            "progress",
            "wait_fd",
            "cq_queue",
            "cntr_queue",
            "eq_queue",
            "regcache",
            "devices",
            "dense_cache",
        ],
    ),
    ("runtime", &["process_memory", "core", "completions", "ep_stats", "stats_json"]),
    ("fid objects", &["fabric", "domain", "av", "cq", "cntr", "eq", "ep", "ep_msg", "ep_rma", "mr", "poll", "wait"]),
];

/// Object-to-parent links (child, parent): the only edges a circle may use.
const PARENT_LINKS: &[(&str, &str)] = &[
    ("domain", "fabric"),
    ("eq", "fabric"),
    ("wait", "fabric"),
    ("av", "domain"),
    ("cq", "domain"),
    ("cntr", "domain"),
    ("ep", "domain"),
    // The endpoint object names its operation tables; they take the object.
    ("ep", "ep_msg"),
    ("ep", "ep_rma"),
    ("mr", "domain"),
    ("poll", "domain"),
];

/// Where an edge was seen first: (file, line number).
type Graph = BTreeMap<String, BTreeMap<String, (String, usize)>>;

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment of every item of a `{...}` group (the text after
/// the opening brace); nested groups belong to their segment.
fn group_heads(rest: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let (mut depth, mut want, mut cur) = (0usize, true, String::new());
    for c in rest.chars() {
        if want && is_ident(c) {
            cur.push(c);
            continue;
        }
        if !cur.is_empty() {
            heads.push(std::mem::take(&mut cur));
            want = false;
        }
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => want = true,
            _ => {}
        }
    }
    heads.retain(|h| h != "self");
    heads
}

/// The modules of the crate a source text names, with the line of each.
fn mentions(src: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, line) in src.lines().enumerate() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        let mut from = 0;
        while let Some(k) = line[from..].find("crate::") {
            let at = from + k;
            from = at + "crate::".len();
            if line[..at].chars().next_back().is_some_and(is_ident) {
                continue; // `foo_crate::`, not the crate root
            }
            let rest = &line[from..];
            if rest.starts_with('{') {
                // A group may span lines: read on to its closing brace.
                let offset = src.lines().take(i).map(|l| l.len() + 1).sum::<usize>() + from + 1;
                for h in group_heads(&src[offset..]) {
                    out.push((h, i + 1));
                }
            } else {
                let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
                if !name.is_empty() {
                    out.push((name, i + 1));
                }
            }
        }
    }
    out
}

/// The module graph of the sources given as (module, text).
fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<&str> = files.iter().map(|(m, _)| m.as_str()).collect();
    let mut g = Graph::new();
    for (m, src) in files {
        let edges = g.entry(m.clone()).or_default();
        for (to, line) in mentions(src) {
            if to != *m && modules.contains(to.as_str()) {
                edges.entry(to).or_insert((format!("{m}.rs"), line));
            }
        }
    }
    g
}

/// Every circle of `g` once (as found by a depth-first search from each
/// module in order), as the list of its modules.
fn circles(g: &Graph) -> Vec<Vec<String>> {
    fn visit(g: &Graph, m: &str, stack: &mut Vec<String>, done: &mut BTreeSet<String>, found: &mut Vec<Vec<String>>) {
        stack.push(m.to_string());
        for to in g.get(m).into_iter().flat_map(|e| e.keys()) {
            if let Some(i) = stack.iter().position(|s| s == to) {
                found.push(stack[i..].to_vec());
            } else if !done.contains(to) {
                visit(g, to, stack, done, found);
            }
        }
        stack.pop();
        done.insert(m.to_string());
    }
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for m in g.keys() {
        if !done.contains(m) {
            visit(g, m, &mut Vec::new(), &mut done, &mut found);
        }
    }
    found
}

/// `g` without the object-to-parent links.
fn without_parent_links(g: &Graph) -> Graph {
    let mut g = g.clone();
    for (child, parent) in PARENT_LINKS {
        if let Some(e) = g.get_mut(*child) {
            e.remove(*parent);
        }
    }
    g
}

fn describe(g: &Graph, circle: &[String]) -> String {
    let mut s = String::new();
    for (i, m) in circle.iter().enumerate() {
        let to = &circle[(i + 1) % circle.len()];
        let (file, line) = &g[m][to];
        s.push_str(&format!("\n    {m} -> {to}   ({file}:{line})"));
    }
    s
}

fn sources() -> Vec<(String, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for e in std::fs::read_dir(&dir).expect("prov/src") {
        let p = e.expect("a directory entry").path();
        let Some(m) = p.file_stem().and_then(|s| s.to_str()).map(str::to_string) else { continue };
        if p.extension().is_some_and(|x| x == "rs") && m != "lib" {
            files.push((m, std::fs::read_to_string(&p).expect("a source file")));
        }
    }
    assert!(files.len() > 10, "no sources found in {}", dir.display());
    files.sort();
    files
}

#[test]
fn no_import_circle_but_object_to_parent_links() {
    let g = without_parent_links(&graph(&sources()));
    let found = circles(&g);
    let text: String = found.iter().map(|c| describe(&g, c)).collect::<Vec<_>>().join("\n  and");
    assert!(found.is_empty(), "import circles in prov/src (object-to-parent links excepted):{text}");
}

#[test]
fn no_module_imports_a_higher_layer() {
    let layer_of: BTreeMap<&str, usize> =
        LAYERS.iter().enumerate().flat_map(|(i, (_, ms))| ms.iter().map(move |m| (*m, i))).collect();
    let g = graph(&sources());
    let mut wrong = Vec::new();
    for (m, edges) in &g {
        let Some(&from) = layer_of.get(m.as_str()) else {
            wrong.push(format!("\n    {m}.rs is in no layer: add it to LAYERS in prov/tests/layers.rs"));
            continue;
        };
        for (to, (file, line)) in edges {
            let to_layer = layer_of.get(to.as_str()).copied().unwrap_or(usize::MAX);
            if to_layer > from {
                let name = |l: usize| LAYERS.get(l).map_or("no layer", |x| x.0);
                wrong.push(format!("\n    {m} ({}) -> {to} ({})   ({file}:{line})", name(from), name(to_layer)));
            }
        }
    }
    assert!(wrong.is_empty(), "prov modules that import upward:{}", wrong.concat());
}

/// The checker itself: it reads grouped and `$crate` paths, skips comments
/// and the crate root's items, and finds a circle through a non-parent link.
#[test]
fn the_checker_finds_circles() {
    let files = |srcs: &[(&str, &str)]| srcs.iter().map(|(m, s)| (m.to_string(), s.to_string())).collect::<Vec<_>>();
    let g = graph(&files(&[
        (
            "core",
            "use crate::{cq_queue::CqShared, args};\n// crate::ep in a comment\nfn f() { crate::provider_ptr(); }",
        ),
        ("cq_queue", "fn g() { $crate::core::now() }"),
        ("args", "use crate::{\n    error::{Error, Result},\n    self,\n};"),
        ("error", ""),
        ("ep", "use crate::domain;"),
        ("domain", "use crate::ep;"),
    ]));
    let edges = |m: &str| g[m].keys().cloned().collect::<Vec<_>>();
    assert_eq!(edges("core"), ["args", "cq_queue"]);
    assert_eq!(edges("args"), ["error"]);
    let found = circles(&without_parent_links(&g));
    assert_eq!(found, [vec!["core".to_string(), "cq_queue".to_string()]]);
    assert_eq!(circles(&g).len(), 2, "ep -> domain -> ep counts unless excepted");
}
