//! rdmx refuses to load into a libfabric older than it was built for (fi_prov_ini
//! returns NULL with a warning naming both versions), loads into any newer one,
//! 2.x included, and declares the API version it implements capped at the
//! running library's. A preloaded shim answers `fi_version()` with the version
//! under test: the provider's own call to it resolves to the shim, the rest of
//! libfabric is the system's. (scripts/test-libfabric2.sh runs rdmx under a
//! real libfabric 2.1.)
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
    let out = fi_info_with(shim, version, &["-l"]);
    (out.lines().any(|l| l.trim() == "rdmx:"), out)
}

fn fi_info_with(shim: &std::path::Path, version: u32, args: &[&str]) -> String {
    fi_tests::init();
    let v = format!("{version:#x}");
    let child = procs::command(
        "fi_info",
        &[("LD_PRELOAD", shim.to_str().unwrap()), ("SHIM_FI_VERSION", &v), ("FI_LOG_LEVEL", "warn")],
    )
    .args(args)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("fi_info (libfabric-bin) is installed");
    text(&procs::wait_output(child, Duration::from_secs(30)))
}

#[test]
fn refuses_older_libfabric_and_says_why_loads_into_newer_ones_of_either_major() {
    let Some(shim) = shim() else {
        return fi_tests::skip("no C compiler (cc) for the fi_version shim");
    };
    let v = fi_tests::fi::fi_version_num;

    let (listed, out) = list_with(&shim, v(1, 16));
    assert!(!listed, "rdmx loaded into a libfabric 1.16:\n{out}");
    assert!(
        out.contains("rdmx") && out.contains("libfabric 1.16 found") && out.contains("needs libfabric >= 1.17"),
        "{out}"
    );

    // Newer minors and 2.x (same soname, same ABI, structs only appended) load, quietly.
    for (major, minor) in [(1, 17), (1, 18), (1, 22), (2, 0), (2, 5)] {
        let (listed, out) = list_with(&shim, v(major, minor));
        assert!(listed, "rdmx refused libfabric {major}.{minor}:\n{out}");
        assert!(!out.contains("not loading"), "{out}");
    }
}

/// A C program asking `fi_getinfo(FI_VERSION(maj, min))` with `FI_PROVIDER=rdmx`,
/// for each version in argv: prints `maj.min found` or `maj.min -61`.
fn getinfo_prog() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fi_version_shim");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("ask.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <stdlib.h>\n#include <rdma/fabric.h>\n\
         int main(int argc, char **argv) {\n\
           for (int i = 1; i + 1 < argc; i += 2) {\n\
             int maj = atoi(argv[i]), min = atoi(argv[i + 1]);\n\
             struct fi_info *info = NULL;\n\
             int r = fi_getinfo(FI_VERSION(maj, min), NULL, NULL, 0, NULL, &info);\n\
             if (r == 0) { printf(\"%d.%d found\\n\", maj, min); fi_freeinfo(info); }\n\
             else printf(\"%d.%d %d\\n\", maj, min, r);\n\
           }\n\
           return 0;\n\
         }\n",
    )
    .unwrap();
    let exe = dir.join("ask");
    match std::process::Command::new("cc").arg("-o").arg(&exe).arg(&src).arg("-lfabric").status() {
        Ok(s) if s.success() => Some(exe),
        _ => None,
    }
}

/// libfabric's fi_getinfo skips a provider whose declared `fi_version` is below
/// the requested version: rdmx declares the running library's version (up to
/// the newest it implements), so every request up to it finds rdmx, and a
/// request beyond it does not.
#[test]
fn declares_the_running_api_version_up_to_what_it_implements() {
    let (Some(shim), Some(ask)) = (shim(), getinfo_prog()) else {
        return fi_tests::skip("no C compiler (cc) for the fi_version shim");
    };
    fi_tests::init();
    let v = fi_tests::fi::fi_version_num;
    let ask_under = |running: u32, asks: &[&str]| -> String {
        let ver = format!("{running:#x}");
        let child = procs::command(
            ask.to_str().unwrap(),
            &[("LD_PRELOAD", shim.to_str().unwrap()), ("SHIM_FI_VERSION", &ver), ("FI_PROVIDER", "rdmx")],
        )
        .args(asks)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the fi_getinfo program");
        text(&procs::wait_output(child, Duration::from_secs(30)))
    };
    for (major, minor) in [(1, 17), (1, 18), (2, 0), (2, 5)] {
        let (maj, min) = (major.to_string(), minor.to_string());
        let out = ask_under(v(major, minor), &["1", "5", "1", "17", &maj, &min]);
        for asked in ["1.5".to_string(), "1.17".to_string(), format!("{major}.{minor}")] {
            assert!(
                out.contains(&format!("{asked} found")),
                "running {major}.{minor}: a request for {asked} did not find rdmx:\n{out}"
            );
        }
    }
    // Under a libfabric newer than anything rdmx implements, rdmx declares what it
    // implements: older requests find it, the library's own version does not
    // (-FI_ENODATA: libfabric skipped rdmx). (A request beyond the running
    // library is refused by libfabric itself, -FI_ENOSYS, before any provider.)
    let out = ask_under(v(9, 0), &["2", "0", "9", "0"]);
    assert!(out.contains("2.0 found") && out.contains("9.0 -61"), "running 9.0:\n{out}");
}
