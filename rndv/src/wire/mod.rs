//! The message layer's packets, one registry of kinds ([`Kind`]) and one file per
//! packet family: two-sided messages ([`msg`]), the rendezvous packets
//! ([`rendezvous`]) and the emulated one-sided operations ([`rma`]). Every packet
//! arriving from the network is parsed exactly once, by [`Packet::decode`], into
//! typed fields; each family's file holds the emit (encode) side next to its
//! parse side. The first byte of every packet is its kind.
pub mod msg;
pub mod rendezvous;
pub mod rma;

pub use msg::HeaderError as WireError;
use msg::HeaderError;
use msg::MsgHeader;
use rendezvous::{FinStatus, Rts, CTS, FIN, PUSH, RTS};
use rma::{Status, ATOMIC, ATOMIC_RESP, READ_REQ, READ_RESP, WRITE, WRITE_ACK};

/// Every packet kind, by its first byte: the one place kinds are numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Untagged message ([`msg`]).
    Msg = 0,
    /// Tagged message ([`msg`]).
    Tagged = 1,
    Write = 2,
    ReadReq = 3,
    ReadResp = 4,
    Atomic = 5,
    AtomicResp = 6,
    WriteAck = 7,
    Rts = 8,
    Fin = 9,
    Push = 10,
    /// Sent while this side waits on an answer from the peer (a Fin, an RMA
    /// response) and nothing else is in flight to it: its acknowledgement
    /// proves the peer alive, its absence lets the rdm engine declare the peer
    /// unreachable. Carries nothing; the receiver ignores it.
    Keepalive = 11,
    /// A window grant of a rendezvous the receiver cannot pull ([`rendezvous`]).
    Cts = 12,
}

/// The bytes of a keepalive.
pub const KEEPALIVE: [u8; 8] = [Kind::Keepalive as u8, 0, 0, 0, 0, 0, 0, 0];

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
    /// A long message announced for the receiver to pull ([`rendezvous`]).
    Rts(Rts),
    /// The receiver finished (or redirected) a rendezvous.
    Fin { req: u64, status: FinStatus, read: u64 },
    /// The bytes of a long message the receiver could not pull.
    Push { req: u64, offset: u64, payload: &'a [u8] },
    /// The receiver grants bytes `offset..offset+len` of a long message.
    Cts { req: u64, offset: u64, len: u64 },
    Keepalive,
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
    /// Parses one packet from untrusted bytes; every packet is parsed once, here.
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
            RTS => Ok(Packet::Rts(Rts::decode(b)?)),
            FIN => {
                let (req, status, read) = rendezvous::decode_fin(b)?;
                Ok(Packet::Fin { req, status, read })
            }
            PUSH => {
                let (h, payload) = split(b, rendezvous::PUSH_HEADER_LEN)?;
                Ok(Packet::Push { req: u64_at(h, 8), offset: u64_at(h, 16), payload })
            }
            CTS => {
                if b.len() != rendezvous::CTS_LEN {
                    return Err(HeaderError::Malformed("cts length"));
                }
                Ok(Packet::Cts { req: u64_at(b, 8), offset: u64_at(b, 16), len: u64_at(b, 24) })
            }
            11 => {
                if b.len() != KEEPALIVE.len() {
                    return Err(HeaderError::Malformed("keepalive length"));
                }
                Ok(Packet::Keepalive)
            }
            k => Err(HeaderError::Kind(k)),
        }
    }
}
