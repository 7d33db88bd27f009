//! Every rndv wire decoder (`Packet::decode`: messages, rendezvous RTS / Fin /
//! Push / CTS, the RMA and atomic requests and answers, keepalives) on
//! untrusted bytes: never panics, and what it accepts, re-encoded with
//! `Packet::encode`, gives back exactly the bytes it was decoded from (every
//! packet has one encoding) and decodes to the same packet.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rndv::wire::Packet;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::decode(data) {
        let mut again = Vec::new();
        p.encode(&mut again);
        assert_eq!(again, data, "an accepted packet re-encodes to other bytes");
        assert_eq!(Packet::decode(&again).as_ref(), Ok(&p), "re-encoded packet decodes differently");
        if let Packet::Rts(rts) = p {
            assert!(rts.iov_count >= 1 && rts.iov_count <= rts.iov.len());
            assert_eq!(rts.iovs().iter().map(|v| v.len).sum::<u64>(), rts.total);
        }
    }
    // The message header alone, as the matcher reads it.
    let _ = rndv::MsgHeader::decode(data);
});
