//! The linger bounds `docs/reliability.md` states ("lingers at close until
//! N ms pass with no datagram ... (at most M ms)") are the constants
//! `LINGER_IDLE` and `LINGER_MAX` of `rndv/src/endpoint.rs`, read from the
//! source: the docs said 20 ms / 200 ms long after the code moved to
//! 100 ms / 500 ms.
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The milliseconds of `const NAME: Duration = Duration::from_millis(N);`.
fn const_millis(src: &str, name: &str) -> u64 {
    let decl = format!("const {name}: Duration = Duration::from_millis(");
    let i = src.find(&decl).unwrap_or_else(|| panic!("no `{decl}...` in rndv/src/endpoint.rs: update this test with the code"));
    let digits: String = src[i + decl.len()..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("{name}: {digits:?}: {e}"))
}

/// The sentence the docs must contain for these bounds.
fn sentence(idle: u64, max: u64) -> String {
    format!("lingers at close until {idle} ms pass with no datagram and its own data is acknowledged (at most {max} ms)")
}

#[test]
fn reliability_doc_states_the_codes_linger_bounds() {
    let src = read("rndv/src/endpoint.rs");
    let (idle, max) = (const_millis(&src, "LINGER_IDLE"), const_millis(&src, "LINGER_MAX"));
    assert!(idle < max, "LINGER_IDLE {idle} ms, LINGER_MAX {max} ms");
    let doc = read("docs/reliability.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let want = sentence(idle, max);
    assert!(doc.contains(&want), "docs/reliability.md should say \"{want}\" (rndv/src/endpoint.rs)");
}

#[test]
fn the_check_can_fail() {
    let src = "const LINGER_IDLE: Duration = Duration::from_millis(100);\nconst LINGER_MAX: Duration = Duration::from_millis(500);";
    assert_eq!((const_millis(src, "LINGER_IDLE"), const_millis(src, "LINGER_MAX")), (100, 500));
    let old_doc = "an endpoint lingers at close until 20 ms pass with no datagram and its own data is acknowledged (at most 200 ms)";
    assert!(!old_doc.contains(&sentence(100, 500)));
    assert!(old_doc.contains(&sentence(20, 200)));
}
