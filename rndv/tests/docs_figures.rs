//! Figures the docs state about the endpoint and the wire are the code's:
//!
//! - the linger bounds of `docs/reliability.md` ("lingers at close until N ms
//!   pass with no datagram ... (at most M ms)") are the constants
//!   `LINGER_IDLE` and `LINGER_MAX` of `rndv/src/endpoint.rs`, read from the
//!   source (the README said 20 ms / 200 ms long after the code moved to
//!   100 ms / 500 ms);
//! - `docs/ARCHITECTURE.md`'s header sizes are `rndv::HEADER_LEN` and
//!   `rdm::engine::wire::HEADER_LEN`, and its acknowledgement delay is the
//!   `completed_ack_delay` the endpoint sets with a progress thread; the
//!   header bytes a datagram endpoint's message carries (`docs/design.md`)
//!   are the two together;
//! - the RTS flag bit that `docs/registrations.md` says announces keys is
//!   `FLAG_KEYS` of `rndv/src/wire/rendezvous.rs`.
use std::path::PathBuf;

fn read(rel: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The milliseconds of `const NAME: Duration = Duration::from_millis(N);`.
fn const_millis(src: &str, name: &str) -> u64 {
    let decl = format!("const {name}: Duration = Duration::from_millis(");
    let i = src
        .find(&decl)
        .unwrap_or_else(|| panic!("no `{decl}...` in rndv/src/endpoint.rs: update this test with the code"));
    let digits: String = src[i + decl.len()..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("{name}: {digits:?}: {e}"))
}

/// The sentence the docs must contain for these bounds.
fn sentence(idle: u64, max: u64) -> String {
    format!(
        "lingers at close until {idle} ms pass with no datagram and its own data is acknowledged (at most {max} ms)"
    )
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
    let cfg = "completed_ack_delay: if cfg.background_progress { Duration::from_micros(50) } else { Duration::ZERO },";
    assert_eq!(ack_delay_micros(cfg), 50);
}

/// The microseconds of `completed_ack_delay: if cfg.background_progress { Duration::from_micros(N) }`.
fn ack_delay_micros(src: &str) -> u64 {
    let decl = "completed_ack_delay: if cfg.background_progress { Duration::from_micros(";
    let i = src
        .find(decl)
        .unwrap_or_else(|| panic!("no `{decl}...` in rndv/src/endpoint.rs: update this test with the code"));
    let digits: String = src[i + decl.len()..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|e| panic!("completed_ack_delay: {digits:?}: {e}"))
}

#[test]
fn docs_state_the_codes_header_sizes_and_ack_delay() {
    let doc = read("docs/ARCHITECTURE.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let msg = format!("prepends the {}-byte message header", rndv::HEADER_LEN);
    assert!(doc.contains(&msg), "docs/ARCHITECTURE.md should say \"{msg}\" (rndv::HEADER_LEN)");
    let rdm_hdr = format!("writes rdm's {}-byte header", rdm::engine::wire::HEADER_LEN);
    assert!(doc.contains(&rdm_hdr), "docs/ARCHITECTURE.md should say \"{rdm_hdr}\" (rdm::engine::wire::HEADER_LEN)");
    let delay = format!("waits up to {} µs for data going back", ack_delay_micros(&read("rndv/src/endpoint.rs")));
    assert!(
        doc.contains(&delay),
        "docs/ARCHITECTURE.md should say \"{delay}\" (rndv/src/endpoint.rs, completed_ack_delay)"
    );
    // A datagram endpoint's message carries both headers.
    let design = read("docs/design.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let dgram = format!("minus rdmx's {} header bytes", rdm::engine::wire::HEADER_LEN + rndv::HEADER_LEN);
    assert!(design.contains(&dgram), "docs/design.md should say \"{dgram}\" (rdm's and rndv's HEADER_LEN)");
}

/// The bit `const FLAG_KEYS: u8 = N;` sets (N a power of two).
fn keys_flag_bit(src: &str) -> u32 {
    let decl = "const FLAG_KEYS: u8 = ";
    let i = src
        .find(decl)
        .unwrap_or_else(|| panic!("no `{decl}...` in rndv/src/wire/rendezvous.rs: update this test with the code"));
    let digits: String = src[i + decl.len()..].chars().take_while(char::is_ascii_digit).collect();
    let flag: u8 = digits.parse().unwrap_or_else(|e| panic!("FLAG_KEYS: {digits:?}: {e}"));
    assert!(flag.is_power_of_two(), "FLAG_KEYS = {flag} is not one bit");
    flag.trailing_zeros()
}

#[test]
fn registrations_doc_states_the_rts_keys_flag() {
    let bit = keys_flag_bit(&read("rndv/src/wire/rendezvous.rs"));
    let doc = read("docs/registrations.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let want = format!("It announces the keys in the RTS (`rndv/src/wire/rendezvous.rs`, flag bit {bit}).");
    assert!(doc.contains(&want), "docs/registrations.md should say \"{want}\" (FLAG_KEYS)");
    assert_eq!(keys_flag_bit("const FLAG_KEYS: u8 = 8;"), 3, "the check can fail");
}
