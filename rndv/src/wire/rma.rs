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
//! fields in the order listed.

use super::{Kind, WireError as HeaderError};
#[cfg(test)]
use super::Packet;

pub(crate) const WRITE: u8 = Kind::Write as u8;
pub(crate) const READ_REQ: u8 = Kind::ReadReq as u8;
pub(crate) const READ_RESP: u8 = Kind::ReadResp as u8;
pub(crate) const ATOMIC: u8 = Kind::Atomic as u8;
pub(crate) const ATOMIC_RESP: u8 = Kind::AtomicResp as u8;
pub(crate) const WRITE_ACK: u8 = Kind::WriteAck as u8;

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

pub fn encode_write(req: u64, key: u64, addr: u64, data: Option<u64>) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = WRITE;
    h[1] = data.is_some() as u8;
    h[8..16].copy_from_slice(&req.to_le_bytes());
    h[16..24].copy_from_slice(&key.to_le_bytes());
    h[24..32].copy_from_slice(&addr.to_le_bytes());
    h[32..40].copy_from_slice(&data.unwrap_or(0).to_le_bytes());
    h
}

pub fn encode_read_req(req: u64, key: u64, addr: u64, len: u64) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = READ_REQ;
    h[8..16].copy_from_slice(&req.to_le_bytes());
    h[16..24].copy_from_slice(&key.to_le_bytes());
    h[24..32].copy_from_slice(&addr.to_le_bytes());
    h[32..40].copy_from_slice(&len.to_le_bytes());
    h
}

fn encode_resp(kind: u8, req: u64, status: Status) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = kind;
    h[1] = status.to_byte();
    h[8..16].copy_from_slice(&req.to_le_bytes());
    h
}

pub fn encode_read_resp(req: u64, status: Status) -> [u8; 16] {
    encode_resp(READ_RESP, req, status)
}

pub fn encode_atomic_resp(req: u64, status: Status) -> [u8; 16] {
    encode_resp(ATOMIC_RESP, req, status)
}

pub fn encode_write_ack(req: u64, status: Status) -> [u8; 16] {
    encode_resp(WRITE_ACK, req, status)
}

#[allow(clippy::too_many_arguments)]
pub fn encode_atomic(req: u64, key: u64, addr: u64, datatype: u8, op: u8, count: u32, fetch: bool) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0] = ATOMIC;
    h[1] = fetch as u8;
    h[2] = datatype;
    h[3] = op;
    h[4..8].copy_from_slice(&count.to_le_bytes());
    h[8..16].copy_from_slice(&req.to_le_bytes());
    h[16..24].copy_from_slice(&key.to_le_bytes());
    h[24..32].copy_from_slice(&addr.to_le_bytes());
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
        assert_eq!(Packet::decode(&encode_read_req(5, 6, 7, 8)), Ok(Packet::ReadReq { req: 5, key: 6, addr: 7, len: 8 }));
        let mut r = encode_read_resp(9, Status::Access).to_vec();
        r.push(1);
        assert_eq!(Packet::decode(&r), Ok(Packet::ReadResp { req: 9, status: Status::Access, payload: &[1] }));
        let mut a = encode_atomic(10, 11, 12, 7, 2, 3, true).to_vec();
        a.extend_from_slice(&[0; 24]);
        assert_eq!(
            Packet::decode(&a),
            Ok(Packet::Atomic { req: 10, key: 11, addr: 12, datatype: 7, op: 2, count: 3, fetch: true, payload: &[0; 24] })
        );
        assert_eq!(Packet::decode(&encode_write_ack(13, Status::NoKey)), Ok(Packet::WriteAck { req: 13, status: Status::NoKey }));
        assert_eq!(Packet::decode(&encode_atomic_resp(14, Status::Ok)), Ok(Packet::AtomicResp { req: 14, status: Status::Ok, payload: &[] }));
        assert_eq!(Packet::decode(&[13]), Err(HeaderError::Kind(13)));
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
