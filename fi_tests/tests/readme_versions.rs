//! The README's status table names the versions the tests ran against: the
//! first row's libfabric and OpenMPI are Debian 12's packages, whose versions
//! apt does not pin. This holds them to what this machine's tools report, so
//! a Debian point release that moves them fails here until the README says so.
//! (The 2.1 and wheel rows are pinned by the setup scripts, and checked by
//! `prov/tests/docs_figures.rs`.)
use std::process::Command;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md")
}

/// The README's status row for the system libfabric (the one naming Debian 12).
fn debian12_row(readme: &str) -> String {
    readme
        .lines()
        .find(|l| l.starts_with('|') && l.contains("Debian 12"))
        .expect("a status row for Debian 12's libfabric")
        .to_string()
}

/// `tool args` and the word after `key` in its output.
fn reported_version(tool: &str, args: &[&str], key: &str) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} {args:?}: {e} (scripts/setup.sh installs it)"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let at = text.find(key).unwrap_or_else(|| panic!("{tool} {args:?} printed no '{key}': {text}"));
    text[at + key.len()..].split_whitespace().next().expect("a version").to_string()
}

#[test]
fn the_status_table_names_this_machines_libfabric_and_openmpi() {
    let row = debian12_row(&readme());
    let libfabric = reported_version("fi_info", &["--version"], "libfabric:");
    assert!(
        row.starts_with(&format!("| {libfabric} (Debian 12")),
        "README's Debian 12 row should name libfabric {libfabric}: {row}"
    );
    let openmpi = reported_version("mpirun", &["--version"], "(Open MPI)");
    assert!(
        row.contains(&format!("OpenMPI {openmpi} ")),
        "README's Debian 12 row should name OpenMPI {openmpi}: {row}"
    );
}

#[test]
fn version_checks_can_fail() {
    let row = "| 1.17.0 (Debian 12 `libfabric1`) | 1.17 headers | OpenMPI 4.1.4 (one host) |";
    assert!(row.starts_with("| 1.17.0 (Debian 12"));
    assert!(!row.starts_with("| 1.18.0 (Debian 12"));
    assert!(!row.contains("OpenMPI 4.1.5 "));
    assert_eq!(debian12_row(&format!("x\n{row}\ny")), row);
}
