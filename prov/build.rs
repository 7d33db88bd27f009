//! Build script of the provider crate (`prov/`): the cdylib must export exactly one
//! symbol, `fi_prov_ini`, so no Rust or dependency symbol leaks into MPI processes.
//! We hand the linker a version script (`{ global: fi_prov_ini; local: *; };`).
use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let script = out.join("rdmx-fi.map");
    fs::write(&script, "{\n  global: fi_prov_ini;\n  local: *;\n};\n").expect("write version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", script.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmx-fi.so");
    // libfabric dlcloses providers right after their cleanup, and rdmx's
    // cleanup never waits for its threads (it may run on a thread interrupted
    // with a lock held, see prov's core::shutdown_all): the code must stay
    // mapped for threads that are still finishing when the process goes on.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
