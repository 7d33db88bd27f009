//! The rdm packet header decoder on untrusted bytes: never panics, and what it
//! accepts re-encodes to the same bytes (a sealed datagram's trailer aside). The input is tried as is and with its
//! checksum fixed up by the encoder's own `seal` (libFuzzer cannot solve a CRC), so the checks past the
//! checksum are reached too.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rdm::engine::wire::seal;
use rdm::engine::{Header, Sealed, HEADER_LEN, TRAILER_LEN};

fn check(b: &[u8]) {
    if let Ok((h, payload)) = Header::decode(b) {
        // A sealed datagram ends in a trailer (counter and tag) that the
        // engine's sealer checks, not the header: the rest re-encodes.
        let end = if h.sealed == Sealed::No { b.len() } else { b.len() - TRAILER_LEN };
        assert_eq!(payload, &b[HEADER_LEN..end]);
        let mut out = vec![0u8; end];
        let n = h.encode(payload, &mut out);
        assert_eq!(n, end);
        assert_eq!(out, &b[..end], "an accepted header re-encodes to the same bytes");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut fixed = data.to_vec();
        seal(&mut fixed);
        check(&fixed);
    }
});
