//! The rdm wire format (specified in `rdm/PROTOCOL.md`): one fixed header per
//! datagram, parsed once from untrusted bytes into a typed [`Header`] and
//! checked (magic, version, checksum) before anything else looks at it.
use super::seq::Psn;

pub const MAGIC: u8 = 0xD7;
pub const VERSION: u8 = 2;
/// Bytes of the header: it ends where its last field ends.
pub const HEADER_LEN: usize = field::SACK.end;

/// Where each header field lies (`rdm/PROTOCOL.md` §2, one row per field):
/// the one place offsets are written; [`Header::decode`] and
/// [`Header::encode`] both read them from here.
pub mod field {
    use core::ops::Range;
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 1;
    pub const TYPE: usize = 2;
    pub const FLAGS: usize = 3;
    pub const CHECKSUM: Range<usize> = 4..8;
    pub const JOB_KEY: Range<usize> = 8..16;
    pub const SRC_INC: Range<usize> = 16..24;
    pub const DST_INC: Range<usize> = 24..32;
    pub const PSN_OR_WINDOW: Range<usize> = 32..36;
    pub const ACK: Range<usize> = 36..40;
    pub const SACK: Range<usize> = 40..48;
}

/// PSNs beyond the cumulative ack that the SACK field covers: one per bit.
pub const SACK_SPAN: u32 = u64::BITS;

/// Bits of the flags byte (FIRST and LAST on DATA and DIRECT only;
/// HEADER_SUM on DATA only; UNSUMMED on any type, never with HEADER_SUM).
const F_FIRST: u8 = 1;
const F_LAST: u8 = 2;
const F_HEADER_SUM: u8 = 4;
const F_UNSUMMED: u8 = 8;
const F_SEALED: u8 = 16;
const F_ENCRYPTED: u8 = 32;
const F_CHALLENGE: u8 = 64;
const F_ECHO: u8 = 128;

/// Bytes a sealed datagram carries after its payload (`PROTOCOL.md` §2.5):
/// the sender's packet counter (8, the AEAD nonce) and the tag (16).
pub const TRAILER_LEN: usize = 8 + TAG_LEN;
/// Bytes of the authentication tag.
pub const TAG_LEN: usize = 16;

/// Whether (and how) a datagram is sealed with the job's secret
/// (`PROTOCOL.md` §2.5): an AEAD tag over header and payload, and, with
/// [`Sealed::Encrypted`], the payload enciphered. A sealed datagram has no
/// checksum (the tag is a stronger one) and ends in a [`TRAILER_LEN`]-byte
/// trailer, which the engine's sealer writes and checks (the header alone
/// cannot: it has no key).
/// A sealed ACK that asks its receiver to prove it is alive now, or answers
/// one (`PROTOCOL.md` §2.5): the SACK field carries the challenger's random
/// cookie, and the ACK carries no acknowledgement state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hello {
    #[default]
    None,
    /// Flags bit6: name me with this cookie (echo it) before I act on you.
    Challenge,
    /// Flags bit7: the cookie of a challenge, sent back.
    Echo,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sealed {
    #[default]
    No,
    Tagged,
    Encrypted,
}

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
    /// Bit i set: PSN `ack + 1 + i` was received (`i` < [`SACK_SPAN`]).
    pub sack: u64,
    /// DATA only: the checksum covers the header alone. Set where the payload
    /// goes from registered application memory straight to an RDMA NIC
    /// (`PROTOCOL.md` §2.3): the sender never reads those bytes, and the
    /// transport guards them end to end (RoCE and InfiniBand ICRC, EFA). A
    /// receiver takes it only from a peer on such a path.
    pub header_sum: bool,
    /// No checksum at all (the field is zero and unchecked): the datagram
    /// crosses no wire, only a shared-memory ring between two processes of
    /// this host (`PROTOCOL.md` §2.4), where nothing corrupts bytes on the
    /// way and a CRC of every packet, twice per message, was the largest
    /// single cost of a small message. A receiver takes it only from such a
    /// ring ([`crate::device::DevAddr::crosses_no_wire`]).
    pub unsummed: bool,
    /// Sealed with the job's secret (`PROTOCOL.md` §2.5): no checksum, a
    /// trailer after the payload. Never with `unsummed` or `header_sum`.
    pub sealed: Sealed,
    /// Sealed ACKs only: a challenge or its echo.
    pub hello: Hello,
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

impl PacketType {
    /// Every type, in wire-number order.
    pub const ALL: [PacketType; 4] = [PacketType::Data, PacketType::Ack, PacketType::Datagram, PacketType::Direct];

    /// The type byte: the one place types are numbered.
    #[inline]
    pub const fn to_wire(self) -> u8 {
        match self {
            PacketType::Data => 1,
            PacketType::Ack => 2,
            PacketType::Datagram => 3,
            PacketType::Direct => 4,
        }
    }

    #[inline]
    pub const fn from_wire(b: u8) -> Option<PacketType> {
        match b {
            1 => Some(PacketType::Data),
            2 => Some(PacketType::Ack),
            3 => Some(PacketType::Datagram),
            4 => Some(PacketType::Direct),
            _ => None,
        }
    }

    /// Whether packets of this type carry the FIRST/LAST fragment flags (the
    /// others must send a zero flags byte).
    #[inline]
    pub const fn has_fragments(self) -> bool {
        matches!(self, PacketType::Data | PacketType::Direct)
    }
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
#[inline]
fn checksum(b: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..field::CHECKSUM.start]);
    h.update(&[0; field::CHECKSUM.end - field::CHECKSUM.start]);
    h.update(&b[field::CHECKSUM.end..]);
    h.finalize()
}

/// Writes the checksum of a whole datagram (header and payload, at least
/// [`HEADER_LEN`] bytes) into its checksum field: the last step of
/// [`Header::encode`]. Public for tools that edit a datagram's fields and
/// must reseal it (the fuzzers, to get past the checksum).
#[inline]
pub fn seal(datagram: &mut [u8]) {
    let c = checksum(datagram);
    datagram[field::CHECKSUM].copy_from_slice(&c.to_le_bytes());
}

#[inline]
fn get_u64(b: &[u8], f: core::ops::Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[f]);
    u64::from_le_bytes(a)
}

#[inline]
fn get_u32(b: &[u8], f: core::ops::Range<usize>) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[f]);
    u32::from_le_bytes(a)
}

impl Header {
    /// Parses and verifies an untrusted datagram; returns the header and payload.
    #[inline]
    pub fn decode(b: &[u8]) -> Result<(Header, &[u8]), DecodeError> {
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Short);
        }
        if b[field::MAGIC] != MAGIC {
            return Err(DecodeError::Magic);
        }
        if b[field::VERSION] != VERSION {
            return Err(DecodeError::Version(b[field::VERSION]));
        }
        let flags = b[field::FLAGS];
        let mut end = b.len();
        if flags & F_SEALED != 0 {
            // The tag, checked by the engine's sealer, guards it all; a
            // sealer writes zero here and no other coverage beside it.
            if get_u32(b, field::CHECKSUM) != 0 || flags & (F_HEADER_SUM | F_UNSUMMED) != 0 {
                return Err(DecodeError::Flags(flags));
            }
            if b.len() < HEADER_LEN + TRAILER_LEN {
                return Err(DecodeError::Short);
            }
            end -= TRAILER_LEN;
            if flags & (F_CHALLENGE | F_ECHO) != 0
                && (b[field::TYPE] != PacketType::Ack.to_wire()
                    || flags & (F_CHALLENGE | F_ECHO) == F_CHALLENGE | F_ECHO)
            {
                return Err(DecodeError::Flags(flags));
            }
        } else if flags & (F_ENCRYPTED | F_CHALLENGE | F_ECHO) != 0 {
            return Err(DecodeError::Flags(flags));
        } else if flags & F_UNSUMMED != 0 {
            // Nothing to verify, but a sender that leaves the sum out
            // writes zero there, and says nothing else about its coverage.
            if get_u32(b, field::CHECKSUM) != 0 || flags & F_HEADER_SUM != 0 {
                return Err(DecodeError::Flags(flags));
            }
        } else {
            let sealed = if flags & F_HEADER_SUM != 0 { &b[..HEADER_LEN] } else { b };
            if get_u32(b, field::CHECKSUM) != checksum(sealed) {
                return Err(DecodeError::Checksum);
            }
        }
        let ptype = PacketType::from_wire(b[field::TYPE]).ok_or(DecodeError::Type(b[field::TYPE]))?;
        let allowed = F_UNSUMMED
            | F_SEALED
            | F_ENCRYPTED
            | F_CHALLENGE
            | F_ECHO
            | match ptype {
                PacketType::Data => F_FIRST | F_LAST | F_HEADER_SUM,
                PacketType::Direct => F_FIRST | F_LAST,
                PacketType::Ack | PacketType::Datagram => 0,
            };
        if flags & !allowed != 0 {
            return Err(DecodeError::Flags(flags));
        }
        let h = Header {
            ptype,
            first: flags & F_FIRST != 0,
            last: flags & F_LAST != 0,
            job_key: get_u64(b, field::JOB_KEY),
            src_inc: get_u64(b, field::SRC_INC),
            dst_inc: get_u64(b, field::DST_INC),
            psn_or_window: get_u32(b, field::PSN_OR_WINDOW),
            ack: Psn(get_u32(b, field::ACK)),
            sack: get_u64(b, field::SACK),
            header_sum: flags & F_HEADER_SUM != 0,
            unsummed: flags & F_UNSUMMED != 0,
            sealed: match (flags & F_SEALED != 0, flags & F_ENCRYPTED != 0) {
                (false, _) => Sealed::No,
                (true, false) => Sealed::Tagged,
                (true, true) => Sealed::Encrypted,
            },
            hello: match (flags & F_CHALLENGE != 0, flags & F_ECHO != 0) {
                (true, _) => Hello::Challenge,
                (false, true) => Hello::Echo,
                _ => Hello::None,
            },
        };
        Ok((h, &b[HEADER_LEN..end]))
    }

    /// Writes every field of the header, then `payload`, into `buf`, then
    /// the checksum over both (over the header alone with
    /// [`Header::header_sum`]: the rest of such a datagram follows from
    /// elsewhere; none with [`Header::unsummed`]); returns the length written.
    #[inline]
    pub fn encode(&self, payload: &[u8], buf: &mut [u8]) -> usize {
        self.encode_parts(&[payload], buf)
    }

    /// Writes every field but the checksum into `b` (the header's
    /// [`HEADER_LEN`] bytes); returns (UNSUMMED, HEADER_SUM) as written
    /// (both false for a sealed header, which carries no checksum).
    #[inline(always)]
    fn put_fields(&self, b: &mut [u8]) -> (bool, bool) {
        debug_assert_eq!(b.len(), HEADER_LEN);
        b[field::MAGIC] = MAGIC;
        b[field::VERSION] = VERSION;
        b[field::TYPE] = self.ptype.to_wire();
        // Sealing wins over both (a sealed path neither crosses no wire nor
        // gathers); UNSUMMED wins over HEADER_SUM: a path that crosses no
        // wire does not gather from registered memory.
        let sealed = match self.sealed {
            Sealed::No => 0,
            Sealed::Tagged => F_SEALED,
            Sealed::Encrypted => F_SEALED | F_ENCRYPTED,
        };
        let unsummed = self.unsummed && sealed == 0;
        let header_sum = self.header_sum && !unsummed && sealed == 0;
        // A challenge or echo only on a sealed ACK.
        let hello = match (self.hello, sealed != 0 && self.ptype == PacketType::Ack) {
            (Hello::Challenge, true) => F_CHALLENGE,
            (Hello::Echo, true) => F_ECHO,
            _ => 0,
        };
        b[field::FLAGS] = (if self.first { F_FIRST } else { 0 })
            | (if self.last { F_LAST } else { 0 })
            | (if header_sum { F_HEADER_SUM } else { 0 })
            | (if unsummed { F_UNSUMMED } else { 0 })
            | sealed
            | hello;
        b[field::JOB_KEY].copy_from_slice(&self.job_key.to_le_bytes());
        b[field::SRC_INC].copy_from_slice(&self.src_inc.to_le_bytes());
        b[field::DST_INC].copy_from_slice(&self.dst_inc.to_le_bytes());
        b[field::PSN_OR_WINDOW].copy_from_slice(&self.psn_or_window.to_le_bytes());
        b[field::ACK].copy_from_slice(&self.ack.0.to_le_bytes());
        b[field::SACK].copy_from_slice(&self.sack.to_le_bytes());
        (unsummed, header_sum)
    }

    /// [`Header::encode`] with the payload given as a gather list, written
    /// back to back (a message's header and its application bytes, copied
    /// once, straight into a transmit buffer).
    #[inline]
    pub fn encode_parts(&self, parts: &[&[u8]], buf: &mut [u8]) -> usize {
        let n = HEADER_LEN + parts.iter().map(|p| p.len()).sum::<usize>();
        let b = &mut buf[..n];
        let (unsummed, header_sum) = self.put_fields(&mut b[..HEADER_LEN]);
        let mut at = HEADER_LEN;
        for p in parts {
            b[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        if unsummed || self.sealed != Sealed::No {
            b[field::CHECKSUM].fill(0);
        } else if header_sum {
            seal(&mut b[..HEADER_LEN]);
        } else {
            seal(b);
        }
        n
    }

    /// The header alone, for a datagram whose payload is `parts` written
    /// after it by someone else (a device that gathers them straight into a
    /// shared-memory ring cell): the same bytes as the first [`HEADER_LEN`]
    /// of [`Header::encode_parts`], the checksum computed over the parts
    /// where one is due.
    pub fn encode_over(&self, parts: &[&[u8]]) -> [u8; HEADER_LEN] {
        // Into a fixed array (inlined, no slice bounds left to check): this
        // is on every small message of the shm path.
        let mut b = [0u8; HEADER_LEN];
        let (unsummed, header_sum) = self.put_fields(&mut b);
        if header_sum {
            seal(&mut b);
            return b;
        }
        if !unsummed && self.sealed == Sealed::No {
            return sum_over(b, parts);
        }
        b
    }
}

/// `b` (a header whose checksum field is not yet written) with its checksum
/// over itself and the payload `parts` written in.
pub(crate) fn sum_over(mut b: [u8; HEADER_LEN], parts: &[&[u8]]) -> [u8; HEADER_LEN] {
    let mut h = crc32fast::Hasher::new();
    h.update(&b[..field::CHECKSUM.start]);
    h.update(&[0; field::CHECKSUM.end - field::CHECKSUM.start]);
    h.update(&b[field::CHECKSUM.end..]);
    for p in parts {
        h.update(p);
    }
    b[field::CHECKSUM].copy_from_slice(&h.finalize().to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A header encoded over its parts is the head of the whole datagram
    /// encoded at once, summed, unsummed or header-summed alike.
    #[test]
    fn header_over_parts_is_the_head_of_the_whole_datagram() {
        for (unsummed, header_sum) in [(false, false), (true, false), (false, true)] {
            let h = Header {
                ptype: PacketType::Direct,
                first: true,
                last: true,
                job_key: 7,
                src_inc: 3,
                dst_inc: 9,
                psn_or_window: 0,
                ack: Psn(0),
                sack: 0,
                header_sum,
                unsummed,
                sealed: Sealed::No,
                hello: Hello::None,
            };
            let parts: [&[u8]; 3] = [b"header..", b"", b"payload bytes"];
            let mut whole = [0u8; 256];
            let n = h.encode_parts(&parts, &mut whole);
            let over = h.encode_over(&parts);
            assert_eq!(&over[..], &whole[..HEADER_LEN]);
            let mut joined = over.to_vec();
            parts.iter().for_each(|p| joined.extend_from_slice(p));
            assert_eq!(&joined[..], &whole[..n]);
            if !header_sum {
                assert!(Header::decode(&joined).is_ok());
            }
        }
    }

    prop_compose! {
        fn header()(ptype in proptest::sample::select(&PacketType::ALL[..]), first: bool, last: bool, job_key: u64,
                    src_inc: u64, dst_inc: u64, psn_or_window: u32, ack: u32, sack: u64, header_sum: bool, unsummed: bool) -> Header {
            let fragments = ptype.has_fragments();
            Header { ptype, first: first && fragments, last: last && fragments, job_key, src_inc, dst_inc, psn_or_window, ack: Psn(ack), sack,
                     header_sum: header_sum && ptype == PacketType::Data && !unsummed, unsummed, sealed: Sealed::No, hello: Hello::None }
        }
    }

    #[test]
    fn a_header_sum_covers_the_header_only_and_only_data_carries_it() {
        let h = Header {
            ptype: PacketType::Data,
            first: true,
            last: true,
            job_key: 1,
            src_inc: 2,
            dst_inc: 3,
            psn_or_window: 4,
            ack: Psn(5),
            sack: 0,
            header_sum: true,
            unsummed: false,
            sealed: Sealed::No,
            hello: Hello::None,
        };
        let mut buf = [0u8; HEADER_LEN + 8];
        let n = h.encode(b"abcdefgh", &mut buf);
        // The payload may change (it is not covered), the header may not.
        buf[HEADER_LEN] ^= 0xff;
        assert_eq!(Header::decode(&buf[..n]).map(|(h, _)| h), Ok(h));
        buf[field::JOB_KEY.start] ^= 1;
        assert_eq!(Header::decode(&buf[..n]), Err(DecodeError::Checksum));
        // Without the flag the payload is covered.
        let plain = Header { header_sum: false, ..h };
        let n = plain.encode(b"abcdefgh", &mut buf);
        buf[HEADER_LEN] ^= 0xff;
        assert_eq!(Header::decode(&buf[..n]), Err(DecodeError::Checksum));
        // On any other type the flag is malformed.
        for ptype in [PacketType::Direct, PacketType::Ack, PacketType::Datagram] {
            let mut b = [0u8; HEADER_LEN];
            b[field::MAGIC] = MAGIC;
            b[field::VERSION] = VERSION;
            b[field::TYPE] = ptype.to_wire();
            b[field::FLAGS] = F_HEADER_SUM;
            seal(&mut b[..HEADER_LEN]);
            assert_eq!(Header::decode(&b), Err(DecodeError::Flags(F_HEADER_SUM)), "{ptype:?}");
        }
    }

    #[test]
    fn an_unsummed_datagram_carries_a_zero_checksum_on_any_type_and_never_with_header_sum() {
        for ptype in PacketType::ALL {
            let fragments = ptype.has_fragments();
            let h = Header {
                ptype,
                first: fragments,
                last: fragments,
                job_key: 1,
                src_inc: 2,
                dst_inc: 3,
                psn_or_window: 4,
                ack: Psn(5),
                sack: 6,
                header_sum: false,
                unsummed: true,
                sealed: Sealed::No,
                hello: Hello::None,
            };
            let mut buf = [0xaau8; HEADER_LEN + 8];
            let n = h.encode(b"abcdefgh", &mut buf);
            assert_eq!(&buf[field::CHECKSUM], &[0; 4], "{ptype:?}");
            // Nothing is verified: a changed byte goes through (the receiver
            // takes such datagrams only from a shared-memory ring).
            buf[HEADER_LEN] ^= 0xff;
            assert_eq!(Header::decode(&buf[..n]).map(|(h, _)| h), Ok(h), "{ptype:?}");
            // A non-zero checksum, or HEADER_SUM beside it, is malformed.
            let mut b = buf;
            b[field::CHECKSUM.start] = 1;
            assert_eq!(Header::decode(&b[..n]), Err(DecodeError::Flags(b[field::FLAGS])), "{ptype:?}");
            let mut b = buf;
            b[field::FLAGS] |= F_HEADER_SUM;
            assert_eq!(Header::decode(&b[..n]), Err(DecodeError::Flags(b[field::FLAGS])), "{ptype:?}");
        }
        // Asked for both, the encoder leaves the sum out entirely.
        let both = Header {
            ptype: PacketType::Data,
            first: true,
            last: true,
            job_key: 1,
            src_inc: 2,
            dst_inc: 3,
            psn_or_window: 4,
            ack: Psn(5),
            sack: 0,
            header_sum: true,
            unsummed: true,
            sealed: Sealed::No,
            hello: Hello::None,
        };
        let mut buf = [0u8; HEADER_LEN];
        let n = both.encode(b"", &mut buf);
        assert_eq!(Header::decode(&buf[..n]).map(|(h, _)| h), Ok(Header { header_sum: false, ..both }));
    }

    #[test]
    fn the_fields_tile_the_header() {
        let ranges = [
            field::MAGIC..field::MAGIC + 1,
            field::VERSION..field::VERSION + 1,
            field::TYPE..field::TYPE + 1,
            field::FLAGS..field::FLAGS + 1,
            field::CHECKSUM,
            field::JOB_KEY,
            field::SRC_INC,
            field::DST_INC,
            field::PSN_OR_WINDOW,
            field::ACK,
            field::SACK,
        ];
        let mut at = 0;
        for r in ranges {
            assert_eq!(r.start, at, "a gap or an overlap before {r:?}");
            at = r.end;
        }
        assert_eq!(at, HEADER_LEN);
    }

    proptest! {
        /// decode(encode(h)) == h, for every header the engine can send.
        #[test]
        fn encode_then_decode_is_identity(h in header(), payload in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut buf = [0u8; HEADER_LEN + 64];
            let n = h.encode(&payload, &mut buf);
            prop_assert_eq!(Header::decode(&buf[..n]), Ok((h, &payload[..])));
        }

        /// encode(decode(b)) == b, for every datagram the decoder accepts
        /// (arbitrary bytes with a valid magic, version and checksum).
        #[test]
        fn decode_then_encode_is_identity(mut b in proptest::collection::vec(any::<u8>(), HEADER_LEN..HEADER_LEN + 64),
                                          ptype in proptest::sample::select(&PacketType::ALL[..]), flags in 0u8..8, unsummed: bool) {
            b[field::MAGIC] = MAGIC;
            b[field::VERSION] = VERSION;
            b[field::TYPE] = ptype.to_wire();
            b[field::FLAGS] = match ptype {
                PacketType::Data => flags,
                PacketType::Direct => flags & (F_FIRST | F_LAST),
                _ => 0,
            };
            if unsummed {
                b[field::FLAGS] = (b[field::FLAGS] & !F_HEADER_SUM) | F_UNSUMMED;
                b[field::CHECKSUM].fill(0);
            } else if b[field::FLAGS] & F_HEADER_SUM != 0 {
                seal(&mut b[..HEADER_LEN]);
            } else {
                seal(&mut b);
            }
            let (h, payload) = Header::decode(&b).expect("a sealed datagram of a known type decodes");
            let mut again = vec![0u8; b.len()];
            let n = h.encode(payload, &mut again);
            prop_assert_eq!(&again[..n], &b[..]);
        }
    }
}
