//! Benchmarks live in `benches/benches/` (criterion); run `cargo bench -p rdmx-benches`.
