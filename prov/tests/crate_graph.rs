//! The crate graph (issue 34), checked from the manifests and sources so that
//! it cannot rot:
//!
//! * `rdm` (the sans-IO engine, the device seam, the simulator) depends on no
//!   other crate of the workspace and on nothing that makes system calls;
//! * `devices` sits on `rdm` only, and is the one crate linking rdma-core;
//! * `rndv` (matching, protocols, `Endpoint`) sits on `rdm` only: no device;
//! * `prov` sits on all of them;
//! * `rdm` and `rndv` forbid `unsafe`: the one contract the engine carries,
//!   application memory its owner vouched for (`LocalBuf`), is the small
//!   `local_mem` crate's.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The names in a manifest's `[dependencies]` table (not dev- or build-).
fn deps(krate: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(krate).join("Cargo.toml")).unwrap();
    let mut out = BTreeSet::new();
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap().trim();
            out.insert(name.to_string());
        }
    }
    out
}

const WORKSPACE: &[&str] = &["local_mem", "rdm", "devices", "rndv", "mr_cache", "libfabric-sys", "rdma-core-sys"];

fn workspace_deps(krate: &str) -> BTreeSet<String> {
    deps(krate).into_iter().filter(|d| WORKSPACE.contains(&d.as_str())).collect()
}

fn set(xs: &[&str]) -> BTreeSet<String> {
    xs.iter().map(|x| x.to_string()).collect()
}

#[test]
fn the_layers_depend_downwards_only() {
    assert_eq!(workspace_deps("local_mem"), set(&[]));
    assert_eq!(
        workspace_deps("rdm"),
        set(&["local_mem"]),
        "rdm (the engine) depends on no other crate of the workspace"
    );
    assert_eq!(workspace_deps("devices"), set(&["rdm", "rdma-core-sys"]));
    assert_eq!(workspace_deps("rndv"), set(&["rdm"]), "the message layer reaches devices only through the seam");
    assert_eq!(workspace_deps("prov"), set(&["rdm", "devices", "rndv", "mr_cache", "libfabric-sys"]));
}

#[test]
fn only_devices_links_rdma_core_and_the_engine_makes_no_system_calls() {
    for krate in ["local_mem", "rdm", "rndv", "mr_cache", "prov", "benches", "fi_tests"] {
        assert!(!deps(krate).contains("rdma-core-sys"), "{krate} depends on rdma-core-sys");
    }
    for krate in ["local_mem", "rdm"] {
        for io in ["libc", "nix", "socket2", "libfabric-sys"] {
            assert!(!deps(krate).contains(io), "{krate} depends on {io}");
        }
    }
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// Lines that use `unsafe` (not comments).
fn unsafe_lines(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") && l.contains("unsafe") && !l.contains("unsafe_code"))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn the_engine_and_message_crates_forbid_unsafe_code() {
    for krate in ["rdm", "rndv"] {
        let lib = std::fs::read_to_string(root().join(krate).join("src/lib.rs")).unwrap();
        assert!(lib.contains("#![forbid(unsafe_code)]"), "{krate}/src/lib.rs must forbid unsafe code");
        for f in sources(&root().join(krate).join("src")) {
            let lines = unsafe_lines(&f);
            assert!(lines.is_empty(), "{} uses unsafe: {lines:?}", f.display());
        }
    }
    // The memory contract: an unsafe constructor and unsafe accessors (their
    // callers state the operation is still in flight); no safe function of
    // local_mem touches the memory.
    let src = std::fs::read_to_string(root().join("local_mem/src/lib.rs")).unwrap();
    let mut unsafe_fns = Vec::new();
    let mut in_unsafe_fn = false;
    for line in src.lines().map(str::trim).filter(|l| !l.starts_with("//")) {
        if let Some(rest) = line.strip_prefix("pub unsafe fn ") {
            unsafe_fns.push(rest.split(['(', '<']).next().unwrap().to_string());
            in_unsafe_fn = true;
        } else if line.contains("fn ") && !line.contains("unsafe fn ") {
            // Any other function, whatever its visibility or qualifiers.
            in_unsafe_fn = false;
        } else if line.contains("unsafe {") {
            assert!(in_unsafe_fn, "local_mem: an unsafe block in a safe function: {line}");
        }
    }
    assert_eq!(unsafe_fns, ["new", "with_bytes", "with_bytes_mut", "append_to"], "local_mem's unsafe functions");
}

/// The devices crate declares `unsafe` per module, honestly: a module with no
/// unsafe code forbids it; a module with some allows it and its doc says what
/// for ("Unsafe here: ..."); the crate denies it by default, so a new module
/// has none until it declares it.
#[test]
fn every_devices_module_declares_its_unsafe() {
    let lib = std::fs::read_to_string(root().join("devices/src/lib.rs")).unwrap();
    let has_line = |src: &str, attr: &str| src.lines().any(|l| l.trim() == attr);
    // Denied by default: a new module has no unsafe code until it declares it.
    assert!(has_line(&lib, "#![deny(unsafe_code)]"), "devices/src/lib.rs denies unsafe code by default");
    for f in sources(&root().join("devices/src")) {
        if f.ends_with("lib.rs") {
            continue;
        }
        let src = std::fs::read_to_string(&f).unwrap();
        let uses = !unsafe_lines(&f).is_empty();
        let forbids = has_line(&src, "#![forbid(unsafe_code)]");
        let allows = has_line(&src, "#![allow(unsafe_code)]");
        let says = src.lines().any(|l| l.starts_with("//! Unsafe here:"));
        if uses {
            assert!(
                allows && says,
                "{}: has unsafe code: #![allow(unsafe_code)] and a \"//! Unsafe here:\" line",
                f.display()
            );
        } else {
            assert!(forbids && !allows, "{}: has no unsafe code: #![forbid(unsafe_code)]", f.display());
        }
    }
}
