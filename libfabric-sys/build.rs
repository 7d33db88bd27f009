//! Generates the libfabric bindings from the headers pkg-config finds (Debian's
//! libfabric-dev by default; another libfabric, such as a 2.x in a prefix, with
//! `PKG_CONFIG_PATH=PREFIX/lib/pkgconfig`) and
//! compiles bindgen's wrappers for the headers' `static inline` functions (`fi_send`,
//! `fi_cq_read`, `fi_close`, ...) so tests can call them like a C program would.
use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    let inline_c = out.join("fi_inline.c");
    // pkg-config also prints the link flags (libfabric, from its libdir).
    let lib = pkg_config::Config::new()
        .atleast_version("1.17")
        .probe("libfabric")
        .expect("pkg-config finds no libfabric >= 1.17: install libfabric-dev, or set PKG_CONFIG_PATH");
    let includes: Vec<String> = lib.include_paths.iter().map(|p| format!("-I{}", p.display())).collect();
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .clang_args(&includes)
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
    let text = bindings.to_string();
    // libfabric 2.x put `fi_domain_attr.data_progress` (with its new alias
    // `progress`) and `fi_mr_attr.mr_iov` (with `dmabuf`) in anonymous unions,
    // which bindgen names `__bindgen_anon_N`; src/lib.rs gives both layouts one
    // accessor. Decided from the generated text, not the version number, so it
    // follows whatever the headers actually say.
    println!("cargo::rustc-check-cfg=cfg(fi_progress_union)");
    println!("cargo::rustc-check-cfg=cfg(fi_mr_iov_union)");
    if !struct_has_field(&text, "fi_domain_attr", "data_progress") {
        println!("cargo:rustc-cfg=fi_progress_union");
    }
    if !struct_has_field(&text, "fi_mr_attr", "mr_iov") {
        println!("cargo:rustc-cfg=fi_mr_iov_union");
    }
    std::fs::write(out.join("bindings.rs"), text).expect("writing bindings");
    cc::Build::new()
        .file(&inline_c)
        .includes(&lib.include_paths)
        .include(env::current_dir().expect("cwd"))
        .flag("-Wno-unused-parameter")
        .flag("-Wno-deprecated-declarations")
        .compile("fi_inline");
    // The static inline wrappers are what links libfabric (pkg-config printed
    // -lfabric above); the provider itself only needs the exported
    // fi_log/fi_param/fi_dupinfo symbols.
}

/// Whether bindgen's `pub struct NAME { ... }` has a direct field `field`.
fn struct_has_field(bindings: &str, name: &str, field: &str) -> bool {
    let start =
        bindings.find(&format!("pub struct {name} {{")).unwrap_or_else(|| panic!("no struct {name} in the bindings"));
    let body = &bindings[start..];
    let end = body.find("\n}").expect("struct end");
    body[..end].contains(&format!("pub {field}:"))
}
