//! rdmx refuses to load into a libfabric it was not built for (fi_prov_ini
//! returns NULL with a warning naming both versions). No other libfabric is
//! installed here, so a preloaded shim answers `fi_version()` with the version
//! under test: the provider's own call to it resolves to the shim, the rest of
//! libfabric is the system's.
use fi_tests::procs::{self, text};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

fn shim() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fi_version_shim");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("shim.c");
    std::fs::write(
        &src,
        "#include <stdint.h>\n#include <stdlib.h>\n\
         uint32_t fi_version(void) { return (uint32_t)strtoul(getenv(\"SHIM_FI_VERSION\"), 0, 0); }\n",
    )
    .unwrap();
    let so = dir.join("shim.so");
    match std::process::Command::new("cc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).status() {
        Ok(s) if s.success() => Some(so),
        _ => None,
    }
}

/// `fi_info -l` with `fi_version()` answering `version`: (rdmx listed, output).
fn list_with(shim: &std::path::Path, version: u32) -> (bool, String) {
    fi_tests::init();
    let v = format!("{version:#x}");
    let child = procs::command("fi_info", &[("LD_PRELOAD", shim.to_str().unwrap()), ("SHIM_FI_VERSION", &v), ("FI_LOG_LEVEL", "warn")])
        .arg("-l")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fi_info (libfabric-bin) is installed");
    let out = text(&procs::wait_output(child, Duration::from_secs(30)));
    (out.lines().any(|l| l.trim() == "rdmx:"), out)
}

#[test]
fn refuses_older_or_other_major_libfabric_and_says_why() {
    let Some(shim) = shim() else {
        return fi_tests::skip("no C compiler (cc) for the fi_version shim");
    };
    let v = fi_tests::fi::fi_version_num;

    let (listed, out) = list_with(&shim, v(1, 16));
    assert!(!listed, "rdmx loaded into a libfabric 1.16:\n{out}");
    assert!(out.contains("rdmx") && out.contains("libfabric 1.16 found") && out.contains("needs libfabric >= 1.17"), "{out}");

    let (listed, out) = list_with(&shim, v(2, 0));
    assert!(!listed, "rdmx loaded into a libfabric 2.0:\n{out}");
    assert!(out.contains("libfabric 2.0 found") && out.contains("major version 1"), "{out}");

    // Newer minors of the same major load, quietly.
    for minor in [17, 18, 22] {
        let (listed, out) = list_with(&shim, v(1, minor));
        assert!(listed, "rdmx refused libfabric 1.{minor}:\n{out}");
        assert!(!out.contains("not loading"), "{out}");
    }
}
