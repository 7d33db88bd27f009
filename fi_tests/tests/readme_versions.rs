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

/// Whether `row` names `libfabric` as its library and `openmpi` among its
/// clients: the one check both tests below run.
fn row_names(row: &str, libfabric: &str, openmpi: &str) -> Result<(), String> {
    if !row.starts_with(&format!("| {libfabric} (Debian 12")) {
        return Err(format!("README's Debian 12 row should name libfabric {libfabric}: {row}"));
    }
    if !row.contains(&format!("OpenMPI {openmpi} ")) {
        return Err(format!("README's Debian 12 row should name OpenMPI {openmpi}: {row}"));
    }
    Ok(())
}

#[test]
fn the_status_table_names_this_machines_libfabric_and_openmpi() {
    let row = debian12_row(&readme());
    let libfabric = reported_version("fi_info", &["--version"], "libfabric:");
    let openmpi = reported_version("mpirun", &["--version"], "(Open MPI)");
    if let Err(e) = row_names(&row, &libfabric, &openmpi) {
        panic!("{e}");
    }
}

/// The check above, on the README's real row, refuses any other version of
/// either (so it is not a comparison that cannot fail).
#[test]
fn version_checks_can_fail() {
    let row = debian12_row(&readme());
    let libfabric = row.trim_start_matches("| ").split_whitespace().next().expect("the row's libfabric").to_string();
    let openmpi = row
        .split("OpenMPI ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the row's OpenMPI version")
        .to_string();
    assert_eq!(row_names(&row, &libfabric, &openmpi), Ok(()), "the row read back");
    assert!(row_names(&row, &format!("{libfabric}.1"), &openmpi).is_err(), "another libfabric passed");
    assert!(row_names(&row, "1.18.0", &openmpi).is_err(), "another libfabric passed");
    assert!(row_names(&row, &libfabric, &format!("{openmpi}9")).is_err(), "another OpenMPI passed");
    assert!(row_names(&row, &libfabric, "4.1.5").is_err(), "another OpenMPI passed");
}
