//! Generates rdma-core bindings (verbs + efadv) from libibverbs-dev's headers.
use std::env;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rerun-if-changed=build.rs");
    let inline_c = out.join("verbs_inline.c");
    let bindings = bindgen::Builder::default()
        .header("wrapper.h")
        .allowlist_function("ibv_.*|efadv_.*")
        .allowlist_type("ibv_.*|efadv_.*")
        .allowlist_var("IBV_.*|EFADV_.*")
        .bitfield_enum("ibv_access_flags|ibv_qp_attr_mask|ibv_send_flags")
        .derive_default(true)
        .layout_tests(false)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&inline_c)
        .generate()
        .expect("bindgen failed on the rdma-core headers: is libibverbs-dev installed?");
    bindings.write_to_file(out.join("bindings.rs")).expect("writing bindings");
    cc::Build::new()
        .file(&inline_c)
        .include(env::current_dir().expect("cwd"))
        .flag("-Wno-unused-parameter")
        .flag("-Wno-deprecated-declarations")
        .compile("verbs_inline");
    println!("cargo:rustc-link-lib=ibverbs");
    println!("cargo:rustc-link-lib=efa");
}
