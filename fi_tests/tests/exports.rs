//! The shipped library exports exactly one symbol, `fi_prov_ini` (the README's
//! claim): libfabric dlopen()s it and calls that entry, and nothing of rdmx's
//! Rust (or of the crates it links) may leak into the application's symbol
//! namespace, where it could clash with another library's.
use std::process::Command;

#[test]
fn the_library_exports_fi_prov_ini_only() {
    let so = fi_tests::provider_dir().join("librdmx-fi.so");
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output().expect("nm (binutils)");
    assert!(out.status.success(), "nm -D {}: {}", so.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    // `<address> <type> <name>`: every defined dynamic symbol, of any type.
    let names: Vec<&str> = text.lines().filter_map(|l| l.split_whitespace().nth(2)).collect();
    assert_eq!(names, ["fi_prov_ini"], "exported symbols of {}:\n{text}", so.display());
    let entry = text.lines().find(|l| l.ends_with(" fi_prov_ini")).unwrap();
    assert_eq!(entry.split_whitespace().nth(1), Some("T"), "fi_prov_ini is a global function: {entry}");
}
