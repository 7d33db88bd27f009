//! The rdm wire format (specified in `rdm/PROTOCOL.md`): one fixed header per
//! datagram, parsed once from untrusted bytes into a typed [`Header`] and
//! checked (magic, version, checksum) before anything else looks at it.
use super::seq::Psn;

pub const MAGIC: u8 = 0xD7;
pub const VERSION: u8 = 2;
pub const HEADER_LEN: usize = 48;
const T_DATA: u8 = 1;
const T_ACK: u8 = 2;
const T_DGRAM: u8 = 3;
const T_DIRECT: u8 = 4;
const F_FIRST: u8 = 1;
const F_LAST: u8 = 2;

/// A parsed packet header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub ptype: PacketType,
    pub first: bool,
    pub last: bool,
    pub job_key: u64,
    pub src_inc: u64,
    pub dst_inc: u64,
    /// DATA: this packet's sequence number. ACK: the advertised window.
    pub psn_or_window: u32,
    /// Cumulative ack: the next PSN the sender of this packet expects from us.
    pub ack: Psn,
    /// Bit i set: PSN `ack + 1 + i` was received.
    pub sack: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketType {
    Data,
    Ack,
    /// An unreliable datagram (`FI_EP_DGRAM`): one whole message, no sequence
    /// number, never acknowledged or retransmitted.
    Datagram,
    /// One whole message on a reliable, ordered path (shared memory), sent when
    /// nothing sequenced to that peer is unacknowledged: the path itself gives
    /// exactly-once, in-order delivery, so it carries no sequence number and is
    /// never acknowledged. Incarnations and the job key are checked as for DATA.
    Direct,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("datagram shorter than the header")]
    Short,
    #[error("not an rdmx datagram")]
    Magic,
    #[error("unsupported protocol version {0}")]
    Version(u8),
    #[error("checksum mismatch")]
    Checksum,
    #[error("unknown packet type {0}")]
    Type(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u8),
}

/// CRC-32 (IEEE) over the datagram with the checksum field taken as zero.
/// Table-free and vectorised (`crc32fast`: PCLMULQDQ where the CPU has it), so
/// that it costs a fraction of the copy it guards; a byte-at-a-time hash here
/// capped every eager transfer at well under 1 GB/s.
fn checksum(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..4]);
    h.update(&[0; 4]);
    h.update(&b[8..]);
    h.finalize()
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn le32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

impl Header {
    /// Parses and verifies an untrusted datagram; returns the header and payload.
    pub fn decode(b: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Short);
        }
        if b[0] != MAGIC {
            return Err(DecodeError::Magic);
        }
        if b[1] != VERSION {
            return Err(DecodeError::Version(b[1]));
        }
        if le32(b, 4) != checksum(b) {
            return Err(DecodeError::Checksum);
        }
        let ptype = match b[2] {
            T_DATA => PacketType::Data,
            T_ACK => PacketType::Ack,
            T_DGRAM => PacketType::Datagram,
            T_DIRECT => PacketType::Direct,
            t => return Err(DecodeError::Type(t)),
        };
        if b[3] & !(F_FIRST | F_LAST) != 0 || (!matches!(ptype, PacketType::Data | PacketType::Direct) && b[3] != 0) {
            return Err(DecodeError::Flags(b[3]));
        }
        let h = Header {
            ptype,
            first: b[3] & F_FIRST != 0,
            last: b[3] & F_LAST != 0,
            job_key: le64(b, 8),
            src_inc: le64(b, 16),
            dst_inc: le64(b, 24),
            psn_or_window: le32(b, 32),
            ack: Psn(le32(b, 36)),
            sack: le64(b, 40),
        };
        Ok((h, &b[HEADER_LEN..]))
    }

    /// Writes the header and `payload` into `buf`; returns the datagram length.
    pub fn encode(&self, payload: &[u8], buf: &mut [u8]) -> usize {
        let n = HEADER_LEN + payload.len();
        let b = &mut buf[..n];
        b[0] = MAGIC;
        b[1] = VERSION;
        b[2] = match self.ptype {
            PacketType::Data => T_DATA,
            PacketType::Ack => T_ACK,
            PacketType::Datagram => T_DGRAM,
            PacketType::Direct => T_DIRECT,
        };
        b[3] = (if self.first { F_FIRST } else { 0 }) | (if self.last { F_LAST } else { 0 });
        b[4..8].fill(0);
        b[8..16].copy_from_slice(&self.job_key.to_le_bytes());
        b[16..24].copy_from_slice(&self.src_inc.to_le_bytes());
        b[24..32].copy_from_slice(&self.dst_inc.to_le_bytes());
        b[32..36].copy_from_slice(&self.psn_or_window.to_le_bytes());
        b[36..40].copy_from_slice(&self.ack.0.to_le_bytes());
        b[40..48].copy_from_slice(&self.sack.to_le_bytes());
        b[HEADER_LEN..].copy_from_slice(payload);
        let c = checksum(b);
        b[4..8].copy_from_slice(&c.to_le_bytes());
        n
    }
}
