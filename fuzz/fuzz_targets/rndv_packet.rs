//! Every rndv wire decoder (`Packet::decode`: messages, rendezvous RTS / Fin /
//! Push / CTS, the RMA and atomic requests and answers, keepalives) on
//! untrusted bytes: never panics, and what it accepts, re-encoded with the
//! public encoders, decodes to the same packet.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rndv::wire::rendezvous::{encode_cts, encode_fin, encode_push, RTS_MAX};
use rndv::wire::rma::{encode_atomic, encode_atomic_resp, encode_read_req, encode_read_resp, encode_write, encode_write_ack};
use rndv::wire::{Packet, KEEPALIVE};

fn encode(p: &Packet<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    match *p {
        Packet::Msg(h, payload) => {
            v.extend_from_slice(&h.encode());
            v.extend_from_slice(payload);
        }
        Packet::Write { req, key, addr, data, payload } => {
            v.extend_from_slice(&encode_write(req, key, addr, data));
            v.extend_from_slice(payload);
        }
        Packet::ReadReq { req, key, addr, len } => v.extend_from_slice(&encode_read_req(req, key, addr, len)),
        Packet::ReadResp { req, status, payload } => {
            v.extend_from_slice(&encode_read_resp(req, status));
            v.extend_from_slice(payload);
        }
        Packet::Atomic { req, key, addr, datatype, op, count, fetch, payload } => {
            v.extend_from_slice(&encode_atomic(req, key, addr, datatype, op, count, fetch));
            v.extend_from_slice(payload);
        }
        Packet::AtomicResp { req, status, payload } => {
            v.extend_from_slice(&encode_atomic_resp(req, status));
            v.extend_from_slice(payload);
        }
        Packet::WriteAck { req, status } => v.extend_from_slice(&encode_write_ack(req, status)),
        Packet::Rts(rts) => {
            let mut b = [0u8; RTS_MAX];
            let n = rts.encode(&mut b);
            v.extend_from_slice(&b[..n]);
        }
        Packet::Fin { req, status, read } => v.extend_from_slice(&encode_fin(req, status, read)),
        Packet::Push { req, offset, payload } => {
            v.extend_from_slice(&encode_push(req, offset));
            v.extend_from_slice(payload);
        }
        Packet::Cts { req, offset, len } => v.extend_from_slice(&encode_cts(req, offset, len)),
        Packet::Keepalive => v.extend_from_slice(&KEEPALIVE),
    }
    v
}

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::decode(data) {
        let again = encode(&p);
        assert_eq!(Packet::decode(&again).as_ref(), Ok(&p), "re-encoded packet decodes differently");
        if let Packet::Rts(rts) = p {
            assert!(rts.iov_count >= 1 && rts.iov_count <= rts.iov.len());
            assert_eq!(rts.iovs().iter().map(|v| v.len).sum::<u64>(), rts.total);
        }
    }
    // The message header alone, as the matcher reads it.
    let _ = rndv::MsgHeader::decode(data);
});
