//! Generates the libfabric bindings from the installed headers (libfabric-dev) and
//! compiles bindgen's wrappers for the headers' `static inline` functions (`fi_send`,
//! `fi_cq_read`, `fi_close`, ...) so tests can call them like a C program would.
use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let inline_c = out.join("fi_inline.c");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*|fid_.*")
        .allowlist_var("FI_.*|FID_.*")
        .blocklist_function("fi_freeparams|fi_getparams")
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .layout_tests(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&inline_c)
        .generate()
        .expect("bindgen failed on the libfabric headers: is libfabric-dev installed?");
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings");
    cc::Build::new()
        .file(&inline_c)
        .include(env::current_dir().expect("cwd"))
        .flag("-Wno-unused-parameter")
        .flag("-Wno-deprecated-declarations")
        .compile("fi_inline");
    // The static inline wrappers are what links the system libfabric; the provider
    // itself only needs the exported fi_log/fi_param/fi_dupinfo symbols.
    println!("cargo:rustc-link-lib=fabric");
}
