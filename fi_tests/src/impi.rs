//! Intel MPI (ch4:ofi, from PyPI, installed by scripts/setup-impi.sh into
//! build-out/impi, or `RDMX_IMPI_DIR`): where it is, its commands with its
//! environment, and programs of `fi_tests/mpi` built with its `mpicc`.
use std::path::{Path, PathBuf};
use std::process::Command;

/// The installation, or `None` (with a SKIP line) when there is none.
pub fn dir() -> Option<PathBuf> {
    let dir = std::env::var_os("RDMX_IMPI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build-out/impi"));
    if dir.join("bin/mpiexec").exists() {
        Some(dir.canonicalize().unwrap_or(dir))
    } else {
        crate::skip(&format!("Intel MPI is not installed in {} (scripts/setup-impi.sh)", dir.display()));
        None
    }
}

/// `prog` of the installation with its environment (`I_MPI_ROOT`, `PATH`,
/// `LD_LIBRARY_PATH`).
pub fn command(dir: &Path, prog: &str) -> Command {
    let mut c = Command::new(dir.join("bin").join(prog));
    c.env("I_MPI_ROOT", dir)
        .env("PATH", format!("{}:{}", dir.join("bin").display(), std::env::var("PATH").unwrap_or_default()))
        .env("LD_LIBRARY_PATH", dir.join("lib"));
    c
}

/// `fi_tests/mpi/<name>.c` built with Intel MPI's `mpicc` into `out`.
pub fn build(dir: &Path, name: &str, out: &Path) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mpi").join(format!("{name}.c"));
    std::fs::create_dir_all(out).unwrap();
    let exe = out.join(name);
    let st = command(dir, "mpicc").args(["-O2", "-o"]).arg(&exe).arg(&src).arg("-lpthread").status().unwrap();
    assert!(st.success(), "Intel MPI mpicc {name}.c failed");
    exe
}
