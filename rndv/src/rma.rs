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
//! Kinds 0 and 1 are the two-sided messages of [`crate::header`]; 8–10 the
//! rendezvous packets of [`crate::rendezvous`]. All integers
//! little-endian; offsets: byte 0 kind, byte 1 flags/status, bytes 8.. the u64
//! fields in the order listed.

use crate::header::{HeaderError, MsgHeader};
use crate::rendezvous::{self, FinStatus, Rts};

const WRITE: u8 = 2;
const READ_REQ: u8 = 3;
const READ_RESP: u8 = 4;
const ATOMIC: u8 = 5;
const ATOMIC_RESP: u8 = 6;
const WRITE_ACK: u8 = 7;

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
    fn to_byte(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::NoKey => 1,
            Status::Access => 2,
            Status::Invalid => 3,
        }
    }

    fn from_byte(b: u8) -> Result<Status, HeaderError> {
        Ok(match b {
            0 => Status::Ok,
            1 => Status::NoKey,
            2 => Status::Access,
            3 => Status::Invalid,
            other => return Err(HeaderError::Flags(other)),
        })
    }
}

/// Any packet of the message layer, parsed once from untrusted bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    Msg(MsgHeader, &'a [u8]),
    Write { req: u64, key: u64, addr: u64, data: Option<u64>, payload: &'a [u8] },
    ReadReq { req: u64, key: u64, addr: u64, len: u64 },
    ReadResp { req: u64, status: Status, payload: &'a [u8] },
    Atomic { req: u64, key: u64, addr: u64, datatype: u8, op: u8, count: u32, fetch: bool, payload: &'a [u8] },
    AtomicResp { req: u64, status: Status, payload: &'a [u8] },
    WriteAck { req: u64, status: Status },
    /// A long message announced for the receiver to pull ([`crate::rendezvous`]).
    Rts(Rts),
    /// The receiver finished (or redirected) a rendezvous.
    Fin { req: u64, status: FinStatus, read: u64 },
    /// The bytes of a long message the receiver could not pull.
    Push { req: u64, payload: &'a [u8] },
}

/// The little-endian u64 at `at`, or 0 past the end (callers check lengths).
pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

fn split(b: &[u8], n: usize) -> Result<(&[u8], &[u8]), HeaderError> {
    b.split_at_checked(n).ok_or(HeaderError::Short)
}

impl<'a> Packet<'a> {
    pub fn decode(b: &'a [u8]) -> Result<Packet<'a>, HeaderError> {
        let kind = *b.first().ok_or(HeaderError::Short)?;
        match kind {
            0 | 1 => {
                let (h, p) = MsgHeader::decode(b)?;
                Ok(Packet::Msg(h, p))
            }
            WRITE => {
                let (h, payload) = split(b, 40)?;
                if h[1] & !1 != 0 {
                    return Err(HeaderError::Flags(h[1]));
                }
                Ok(Packet::Write {
                    req: u64_at(h, 8),
                    key: u64_at(h, 16),
                    addr: u64_at(h, 24),
                    data: (h[1] & 1 != 0).then(|| u64_at(h, 32)),
                    payload,
                })
            }
            READ_REQ => {
                let (h, _) = split(b, 40)?;
                Ok(Packet::ReadReq { req: u64_at(h, 8), key: u64_at(h, 16), addr: u64_at(h, 24), len: u64_at(h, 32) })
            }
            READ_RESP | ATOMIC_RESP | WRITE_ACK => {
                let (h, payload) = split(b, 16)?;
                let status = Status::from_byte(h[1])?;
                let req = u64_at(h, 8);
                Ok(match kind {
                    READ_RESP => Packet::ReadResp { req, status, payload },
                    ATOMIC_RESP => Packet::AtomicResp { req, status, payload },
                    _ => Packet::WriteAck { req, status },
                })
            }
            ATOMIC => {
                let (h, payload) = split(b, 32)?;
                if h[1] & !1 != 0 {
                    return Err(HeaderError::Flags(h[1]));
                }
                Ok(Packet::Atomic {
                    req: u64_at(h, 8),
                    key: u64_at(h, 16),
                    addr: u64_at(h, 24),
                    datatype: h[2],
                    op: h[3],
                    count: u32::from_le_bytes([h[4], h[5], h[6], h[7]]),
                    fetch: h[1] & 1 != 0,
                    payload,
                })
            }
            rendezvous::RTS => Ok(Packet::Rts(Rts::decode(b)?)),
            rendezvous::FIN => {
                let (req, status, read) = rendezvous::decode_fin(b)?;
                Ok(Packet::Fin { req, status, read })
            }
            rendezvous::PUSH => {
                let (h, payload) = split(b, rendezvous::PUSH_HEADER_LEN)?;
                Ok(Packet::Push { req: u64_at(h, 8), payload })
            }
            k => Err(HeaderError::Kind(k)),
        }
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
        assert_eq!(Packet::decode(&[11]), Err(HeaderError::Kind(11)));
        assert_eq!(Packet::decode(&[2, 0, 0]), Err(HeaderError::Short));
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = Packet::decode(&bytes);
        }
    }
}
