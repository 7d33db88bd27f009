//! The message-layer header at the front of every rdm message.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 1 | kind: 0 = untagged (FI_MSG), 1 = tagged (FI_TAGGED) |
//! | 1 | 1 | flags: bit0 = remote CQ data present |
//! | 2 | 6 | reserved, zero |
//! | 8 | 8 | tag (little-endian; 0 for untagged) |
//! | 16 | 8 | remote CQ data (little-endian; zero when absent) |
//!
//! The payload follows immediately. The offsets are [`field`]'s.

use super::{check_zero, get_u64, put_u64, Kind};

/// Where the header's fields lie (the table above).
pub mod field {
    pub use crate::wire::field::{FLAGS, KIND};
    use core::ops::Range;
    pub const RESERVED: Range<usize> = 2..8;
    pub const TAG: Range<usize> = 8..16;
    pub const DATA: Range<usize> = 16..24;
}

pub const HEADER_LEN: usize = field::DATA.end;
const FLAG_DATA: u8 = 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MsgKind {
    Msg,
    Tagged,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsgHeader {
    pub kind: MsgKind,
    pub tag: u64,
    pub data: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HeaderError {
    #[error("message shorter than the {HEADER_LEN}-byte header")]
    Short,
    #[error("unknown message kind {0}")]
    Kind(u8),
    #[error("unknown header flags {0:#x}")]
    Flags(u8),
    #[error("inconsistent {0}")]
    Malformed(&'static str),
}

impl MsgHeader {
    /// The header's bytes; [`MsgHeader::decode`] is its inverse.
    #[inline]
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[field::KIND] = match self.kind {
            MsgKind::Msg => Kind::Msg as u8,
            MsgKind::Tagged => Kind::Tagged as u8,
        };
        b[field::FLAGS] = if self.data.is_some() { FLAG_DATA } else { 0 };
        put_u64(&mut b, field::TAG, self.tag);
        put_u64(&mut b, field::DATA, self.data.unwrap_or(0));
        b
    }

    /// Parses the header of an (untrusted) message; returns it and the payload.
    #[inline]
    pub fn decode(msg: &[u8]) -> Result<(MsgHeader, &[u8]), HeaderError> {
        let (h, payload) = msg.split_at_checked(HEADER_LEN).ok_or(HeaderError::Short)?;
        let kind = match h[field::KIND] {
            k if k == Kind::Msg as u8 => MsgKind::Msg,
            k if k == Kind::Tagged as u8 => MsgKind::Tagged,
            k => return Err(HeaderError::Kind(k)),
        };
        let flags = h[field::FLAGS];
        if flags & !FLAG_DATA != 0 {
            return Err(HeaderError::Flags(flags));
        }
        check_zero(h, field::RESERVED)?;
        let data = flags & FLAG_DATA != 0;
        if !data {
            check_zero(h, field::DATA)?;
        }
        Ok((MsgHeader { kind, tag: get_u64(h, field::TAG), data: data.then(|| get_u64(h, field::DATA)) }, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn roundtrip(tagged: bool, tag: u64, data: Option<u64>, payload: Vec<u8>) {
            let h = MsgHeader { kind: if tagged { MsgKind::Tagged } else { MsgKind::Msg }, tag, data };
            let mut msg = h.encode().to_vec();
            msg.extend_from_slice(&payload);
            let (back, p) = MsgHeader::decode(&msg).unwrap();
            prop_assert_eq!(back, h);
            prop_assert_eq!(p, &payload[..]);
        }

        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = MsgHeader::decode(&bytes);
        }
    }
}
