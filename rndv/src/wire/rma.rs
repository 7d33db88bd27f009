//! RMA and atomics emulated over messages: the request/response packets.
//!
//! A one-sided operation is a message to the target's provider, which checks the
//! key and range against its registrations *before* touching memory, performs the
//! access, and answers. The initiator completes the operation when the answer
//! arrives, with an error if the target refused it.
//!
//! | kind | packet | header bytes |
//! |----:|--------|------|
//! | 2 | `Write`: flags (bit0 remote CQ data), req id, key, addr, data; payload = bytes | 40 |
//! | 3 | `ReadReq`: req id, key, addr, len | 40 |
//! | 4 | `ReadResp`: status, req id; payload = bytes | 16 |
//! | 5 | `Atomic`: flags (bit0 return old values), datatype, op, count (u32), req id, key, addr; payload = operand [+ compare] | 32 |
//! | 6 | `AtomicResp`: status, req id; payload = old values | 16 |
//! | 7 | `WriteAck`: status, req id | 16 |
//!
//! Kinds 0 and 1 are the two-sided messages of [`super::msg`]; 8–10 the
//! rendezvous packets of [`super::rendezvous`]. All integers
//! little-endian; offsets: byte 0 kind, byte 1 flags/status, bytes 8.. the u64
//! fields in the order listed (the [`field`] table); unused bytes, and the
//! remote CQ data of a write without it, are zero. [`Packet::decode`] and
//! [`Packet::encode_header`] are the parse and emit sides.

use super::{put_u64, Kind, Packet, WireError as HeaderError};

/// Where the fields of the RMA packets lie.
pub mod field {
    pub use crate::wire::field::{FLAGS, KIND, REQ};
    use core::ops::Range;
    pub const KEY: Range<usize> = 16..24;
    pub const ADDR: Range<usize> = 24..32;
    /// `Write`: the remote CQ data.
    pub const WRITE_DATA: Range<usize> = 32..40;
    pub const WRITE_RESERVED: Range<usize> = 2..8;
    pub const WRITE_LEN: usize = WRITE_DATA.end;
    /// `ReadReq`: bytes to read.
    pub const READ_LEN: Range<usize> = 32..40;
    pub const READ_REQ_RESERVED: Range<usize> = 1..8;
    pub const READ_REQ_LEN: usize = READ_LEN.end;
    /// `ReadResp`, `AtomicResp`, `WriteAck`: status at [`FLAGS`], then the request id.
    pub const RESP_RESERVED: Range<usize> = 2..8;
    pub const RESP_LEN: usize = REQ.end;
    pub const ATOMIC_DATATYPE: usize = 2;
    pub const ATOMIC_OP: usize = 3;
    pub const ATOMIC_COUNT: Range<usize> = 4..8;
    pub const ATOMIC_LEN: usize = ADDR.end;
}

/// `Write` flag: remote CQ data present.
pub(crate) const FLAG_DATA: u8 = 1;
/// `Atomic` flag: return the old values.
pub(crate) const FLAG_FETCH: u8 = 1;

/// The target's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// No registration with that key.
    NoKey,
    /// Outside the registration, or an access it does not allow.
    Access,
    /// Unsupported datatype/op or malformed operands.
    Invalid,
}

impl Status {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::NoKey => 1,
            Status::Access => 2,
            Status::Invalid => 3,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Result<Status, HeaderError> {
        Ok(match b {
            0 => Status::Ok,
            1 => Status::NoKey,
            2 => Status::Access,
            3 => Status::Invalid,
            other => return Err(HeaderError::Flags(other)),
        })
    }
}

/// Writes an answer's header (`ReadResp`, `AtomicResp`, `WriteAck`: the
/// same layout) into `h`, exactly [`field::RESP_LEN`] bytes.
#[inline]
pub(super) fn put_resp(h: &mut [u8], kind: Kind, req: u64, status: Status) {
    h.fill(0);
    h[field::KIND] = kind as u8;
    h[field::FLAGS] = status.to_byte();
    put_u64(h, field::REQ, req);
}

// The engine's shorthands: each packet's header through `Packet::encode_header`.

#[inline]
pub fn encode_write(req: u64, key: u64, addr: u64, data: Option<u64>) -> [u8; field::WRITE_LEN] {
    let mut h = [0u8; field::WRITE_LEN];
    Packet::Write { req, key, addr, data, payload: &[] }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_read_req(req: u64, key: u64, addr: u64, len: u64) -> [u8; field::READ_REQ_LEN] {
    let mut h = [0u8; field::READ_REQ_LEN];
    Packet::ReadReq { req, key, addr, len }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_read_resp(req: u64, status: Status) -> [u8; field::RESP_LEN] {
    let mut h = [0u8; field::RESP_LEN];
    Packet::ReadResp { req, status, payload: &[] }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_atomic_resp(req: u64, status: Status) -> [u8; field::RESP_LEN] {
    let mut h = [0u8; field::RESP_LEN];
    Packet::AtomicResp { req, status, payload: &[] }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_write_ack(req: u64, status: Status) -> [u8; field::RESP_LEN] {
    let mut h = [0u8; field::RESP_LEN];
    Packet::WriteAck { req, status }.encode_header(&mut h);
    h
}

/// The header fields of an `Atomic` request, as [`encode_atomic`] writes
/// them: every field of [`Packet::Atomic`] but the payload (datatype and op
/// as their wire codes). Grouped because an atomic's header names all of
/// them at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicHeader {
    pub req: u64,
    pub key: u64,
    pub addr: u64,
    pub datatype: u8,
    pub op: u8,
    pub count: u32,
    pub fetch: bool,
}

#[inline]
pub fn encode_atomic(a: AtomicHeader) -> [u8; field::ATOMIC_LEN] {
    let AtomicHeader { req, key, addr, datatype, op, count, fetch } = a;
    let mut h = [0u8; field::ATOMIC_LEN];
    Packet::Atomic { req, key, addr, datatype, op, count, fetch, payload: &[] }.encode_header(&mut h);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn roundtrips() {
        let mut w = encode_write(1, 2, 3, Some(4)).to_vec();
        w.extend_from_slice(b"xy");
        assert_eq!(Packet::decode(&w), Ok(Packet::Write { req: 1, key: 2, addr: 3, data: Some(4), payload: b"xy" }));
        assert_eq!(
            Packet::decode(&encode_read_req(5, 6, 7, 8)),
            Ok(Packet::ReadReq { req: 5, key: 6, addr: 7, len: 8 })
        );
        let mut r = encode_read_resp(9, Status::Access).to_vec();
        r.push(1);
        assert_eq!(Packet::decode(&r), Ok(Packet::ReadResp { req: 9, status: Status::Access, payload: &[1] }));
        let mut a =
            encode_atomic(AtomicHeader { req: 10, key: 11, addr: 12, datatype: 7, op: 2, count: 3, fetch: true })
                .to_vec();
        a.extend_from_slice(&[0; 24]);
        assert_eq!(
            Packet::decode(&a),
            Ok(Packet::Atomic {
                req: 10,
                key: 11,
                addr: 12,
                datatype: 7,
                op: 2,
                count: 3,
                fetch: true,
                payload: &[0; 24]
            })
        );
        assert_eq!(
            Packet::decode(&encode_write_ack(13, Status::NoKey)),
            Ok(Packet::WriteAck { req: 13, status: Status::NoKey })
        );
        assert_eq!(
            Packet::decode(&encode_atomic_resp(14, Status::Ok)),
            Ok(Packet::AtomicResp { req: 14, status: Status::Ok, payload: &[] })
        );
        assert_eq!(Packet::decode(&[14]), Err(HeaderError::Kind(14)));
        assert_eq!(Packet::decode(&crate::wire::KEEPALIVE), Ok(Packet::Keepalive));
        assert!(Packet::decode(&[11]).is_err());
        assert_eq!(Packet::decode(&[2, 0, 0]), Err(HeaderError::Short));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = Packet::decode(&bytes);
        }
    }
}
