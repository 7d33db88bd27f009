//! The message-layer header at the front of every rdm message.
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 1 | kind: 0 = untagged (FI_MSG), 1 = tagged (FI_TAGGED) |
//! | 1 | 1 | flags: bit0 = remote CQ data present |
//! | 2 | 6 | reserved, zero |
//! | 8 | 8 | tag (little-endian; 0 for untagged) |
//! | 16 | 8 | remote CQ data (little-endian) |
//!
//! The payload follows immediately.

pub const HEADER_LEN: usize = 24;
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
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = match self.kind {
            MsgKind::Msg => 0,
            MsgKind::Tagged => 1,
        };
        if let Some(d) = self.data {
            b[1] = FLAG_DATA;
            b[16..24].copy_from_slice(&d.to_le_bytes());
        }
        b[8..16].copy_from_slice(&self.tag.to_le_bytes());
        b
    }

    /// Parses the header of an (untrusted) message; returns it and the payload.
    pub fn decode(msg: &[u8]) -> Result<(MsgHeader, &[u8]), HeaderError> {
        let (h, payload) = msg.split_at_checked(HEADER_LEN).ok_or(HeaderError::Short)?;
        let kind = match h[0] {
            0 => MsgKind::Msg,
            1 => MsgKind::Tagged,
            k => return Err(HeaderError::Kind(k)),
        };
        if h[1] & !FLAG_DATA != 0 {
            return Err(HeaderError::Flags(h[1]));
        }
        let word = |at: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&h[at..at + 8]);
            u64::from_le_bytes(a)
        };
        let data = (h[1] & FLAG_DATA != 0).then(|| word(16));
        Ok((MsgHeader { kind, tag: word(8), data }, payload))
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
