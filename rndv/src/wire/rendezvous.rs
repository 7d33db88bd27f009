//! The rendezvous (long-message) protocol: the receiver pulls the data.
//!
//! A message too long for the eager path is announced, not sent: the sender's
//! provider sends a *ready-to-send* ([`Rts`]) that carries the header fields of the
//! message (kind, tag, remote CQ data), its total length and where its bytes lie
//! in the sender's memory. The RTS is matched like an eager message. When it
//! matches, the receiver's provider reads the bytes straight from the sender's
//! memory into the posted buffer with the device's remote read
//! (`process_vm_readv` on the shared-memory device: one copy, no bytes through
//! the ring) and answers with a [`Fin`]; the sender's send completes on the `Fin`.
//!
//! If the receiver cannot read the sender's memory (a path without remote read,
//! such as UDP; or a different user, Yama `ptrace_scope`), it grants the sender
//! windows instead: a [`Packet::Cts`](super::Packet::Cts) names a byte range of
//! the message, and the sender streams that range as
//! [`Packet::Push`](super::Packet::Push) messages, each carrying its offset, which
//! the receiver places straight into the posted buffer (no reassembly of the
//! whole message, no unexpected-message memory). The receiver grants the next
//! window while the current one is still arriving (a sliding window), and
//! answers `Fin(Done)` when every byte it can take has landed; the send
//! completes on the `Fin`. A sender told to push to a peer its path claimed it
//! could read remembers the refusal and sends later long messages to that peer
//! eagerly.
//!
//! | kind | packet | layout |
//! |----:|--------|--------|
//! | 8 | `Rts` | flags (bit0 remote CQ data, bit1 tagged, bit2 keys), iov count (1..=4) at byte 2; req id, tag, data, total length at 8, 16, 24, 32; then per iov (address, length); with bit2, then per iov its registration key |
//! | 9 | `Fin` | status at byte 1; req id at 8; bytes read at 16 |
//! | 10 | `Push` | req id at 8, offset at 16; payload = those bytes of the message |
//! | 12 | `Cts` | req id at 8, offset at 16, length at 24: "send me these bytes" |
//!
//! All integers little-endian. The request id is the sender's operation id: the
//! receiver echoes it and never interprets it.
//!
//! **Registration keys.** On a path whose remote reads need a registration
//! (`DeviceCaps::registration`: verbs UD, EFA SRD) the sender registers each
//! iov buffer (or uses the application's own registration, from its
//! `fi_mr_desc`) and sets flag bit 2: the RTS then carries one 8-byte key per
//! iov after the iov list (`RTS_FIXED + 24 * count` bytes in all), and the
//! receiver's remote read of that iov names that key. The key stays valid until
//! the sender's send completes (on the `Fin`, a failure of the peer, or the
//! endpoint's close). Without bit 2 the layout is exactly the earlier one, so
//! paths that need no registration (udp, shm) send the same bytes as before; a
//! receiver built before bit 2 existed refuses an RTS with it as malformed
//! (unknown flag), which only a registering path, new with bit 2, sends.

use super::msg::{HeaderError, MsgHeader, MsgKind};
use super::{check_zero, get_u64, put_u64, Kind, Packet};

/// Where the fields of the rendezvous packets lie (the table above).
pub mod field {
    pub use crate::wire::field::{FLAGS, KIND, REQ};
    use core::ops::Range;
    pub const RTS_IOV_COUNT: usize = 2;
    pub const RTS_RESERVED: Range<usize> = 3..8;
    pub const RTS_TAG: Range<usize> = 16..24;
    /// Remote CQ data; zero when absent.
    pub const RTS_DATA: Range<usize> = 24..32;
    pub const RTS_TOTAL: Range<usize> = 32..40;
    /// Bytes of an RTS before its iov list.
    pub const RTS_FIXED: usize = RTS_TOTAL.end;
    /// Within one entry of the iov list, which starts at [`RTS_FIXED`].
    pub const IOV_ADDR: Range<usize> = 0..8;
    pub const IOV_LEN: Range<usize> = 8..16;
    pub const IOV_ENTRY: usize = IOV_LEN.end;
    /// One registration key per iov, after the iov list (flag bit 2).
    pub const KEY_ENTRY: usize = 8;
    pub const FIN_RESERVED: Range<usize> = 2..8;
    pub const FIN_READ: Range<usize> = 16..24;
    pub const FIN_LEN: usize = FIN_READ.end;
    pub const PUSH_RESERVED: Range<usize> = 1..8;
    pub const PUSH_OFFSET: Range<usize> = 16..24;
    pub const PUSH_HEADER_LEN: usize = PUSH_OFFSET.end;
    pub const CTS_RESERVED: Range<usize> = 1..8;
    pub const CTS_OFFSET: Range<usize> = 16..24;
    /// Bytes granted.
    pub const CTS_GRANT: Range<usize> = 24..32;
    pub const CTS_LEN: usize = CTS_GRANT.end;
}

/// Most pieces a long message is gathered from (libfabric's iov limit).
pub const MAX_IOV: usize = 4;
/// Bytes of an RTS header before its iov list.
pub const RTS_FIXED: usize = field::RTS_FIXED;
/// Largest RTS (with keys).
pub const RTS_MAX: usize = RTS_FIXED + (field::IOV_ENTRY + field::KEY_ENTRY) * MAX_IOV;
/// Bytes of a `Fin`.
pub const FIN_LEN: usize = field::FIN_LEN;
/// Bytes of a `Push` header before the payload.
pub const PUSH_HEADER_LEN: usize = field::PUSH_HEADER_LEN;
/// Bytes of a `Cts`.
pub const CTS_LEN: usize = field::CTS_LEN;

const FLAG_DATA: u8 = 1;
const FLAG_TAGGED: u8 = 2;
const FLAG_KEYS: u8 = 4;

/// One piece of the sender's message in the sender's address space.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RemoteIov {
    pub addr: u64,
    pub len: u64,
    /// The registration key a remote read of this piece names (paths with
    /// `DeviceCaps::registration`); `None` where reads need none.
    pub key: Option<u64>,
}

/// A parsed ready-to-send: a long message announced by its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rts {
    pub header: MsgHeader,
    /// The sender's operation id, echoed in `Fin` and `Push`.
    pub req: u64,
    /// Message length: the sum of the iov lengths (checked when parsing).
    pub total: u64,
    pub iov: [RemoteIov; MAX_IOV],
    pub iov_count: usize,
}

impl Rts {
    pub fn iovs(&self) -> &[RemoteIov] {
        &self.iov[..self.iov_count]
    }

    fn has_keys(&self) -> bool {
        self.iovs().iter().any(|v| v.key.is_some())
    }

    /// Bytes of this RTS on the wire.
    #[inline]
    pub fn encoded_len(&self) -> usize {
        let per_iov = if self.has_keys() { field::IOV_ENTRY + field::KEY_ENTRY } else { field::IOV_ENTRY };
        RTS_FIXED + per_iov * self.iov_count
    }

    /// Encodes the RTS into `out`; returns its length.
    #[inline]
    pub fn encode(&self, out: &mut [u8; RTS_MAX]) -> usize {
        self.encode_into(out)
    }

    /// Writes all [`Rts::encoded_len`] bytes of the RTS at the start of
    /// `out`; [`Rts::decode`] is its inverse. With any key, every iov gets
    /// one (a missing one as 0).
    pub(super) fn encode_into(&self, out: &mut [u8]) -> usize {
        use field::*;
        let keys = self.has_keys();
        let n = self.encoded_len();
        let out = &mut out[..n];
        out[..RTS_FIXED].fill(0);
        out[KIND] = Kind::Rts as u8;
        out[FLAGS] = if self.header.data.is_some() { FLAG_DATA } else { 0 }
            | if self.header.kind == MsgKind::Tagged { FLAG_TAGGED } else { 0 }
            | if keys { FLAG_KEYS } else { 0 };
        out[RTS_IOV_COUNT] = self.iov_count as u8;
        put_u64(out, REQ, self.req);
        put_u64(out, RTS_TAG, self.header.tag);
        put_u64(out, RTS_DATA, self.header.data.unwrap_or(0));
        put_u64(out, RTS_TOTAL, self.total);
        let keys_at = RTS_FIXED + IOV_ENTRY * self.iov_count;
        for (i, v) in self.iovs().iter().enumerate() {
            let entry = &mut out[RTS_FIXED + IOV_ENTRY * i..][..IOV_ENTRY];
            put_u64(entry, IOV_ADDR, v.addr);
            put_u64(entry, IOV_LEN, v.len);
            if keys {
                let at = keys_at + KEY_ENTRY * i;
                put_u64(out, at..at + KEY_ENTRY, v.key.unwrap_or(0));
            }
        }
        n
    }

    /// Parses an RTS from untrusted bytes (the kind byte included).
    pub(crate) fn decode(b: &[u8]) -> Result<Rts, HeaderError> {
        use field::*;
        let h = b.get(..RTS_FIXED).ok_or(HeaderError::Short)?;
        let flags = h[FLAGS];
        if flags & !(FLAG_DATA | FLAG_TAGGED | FLAG_KEYS) != 0 {
            return Err(HeaderError::Flags(flags));
        }
        check_zero(h, RTS_RESERVED)?;
        let count = h[RTS_IOV_COUNT] as usize;
        if count == 0 || count > MAX_IOV {
            return Err(HeaderError::Malformed("rendezvous iov count"));
        }
        let keys = flags & FLAG_KEYS != 0;
        let per_iov = if keys { IOV_ENTRY + KEY_ENTRY } else { IOV_ENTRY };
        if b.len() != RTS_FIXED + per_iov * count {
            return Err(HeaderError::Malformed("rendezvous length"));
        }
        let keys_at = RTS_FIXED + IOV_ENTRY * count;
        let mut iov = [RemoteIov::default(); MAX_IOV];
        let mut sum: u64 = 0;
        for (i, v) in iov.iter_mut().take(count).enumerate() {
            let entry = &b[RTS_FIXED + IOV_ENTRY * i..][..IOV_ENTRY];
            let at = keys_at + KEY_ENTRY * i;
            let key = keys.then(|| get_u64(b, at..at + KEY_ENTRY));
            *v = RemoteIov { addr: get_u64(entry, IOV_ADDR), len: get_u64(entry, IOV_LEN), key };
            sum = sum.checked_add(v.len).ok_or(HeaderError::Malformed("rendezvous length"))?;
            if v.addr.checked_add(v.len).is_none() {
                return Err(HeaderError::Malformed("rendezvous address"));
            }
        }
        let total = get_u64(h, RTS_TOTAL);
        if sum != total {
            return Err(HeaderError::Malformed("rendezvous length"));
        }
        let kind = if flags & FLAG_TAGGED != 0 { MsgKind::Tagged } else { MsgKind::Msg };
        let has_data = flags & FLAG_DATA != 0;
        if !has_data {
            check_zero(h, RTS_DATA)?;
        }
        let data = has_data.then(|| get_u64(h, RTS_DATA));
        Ok(Rts {
            header: MsgHeader { kind, tag: get_u64(h, RTS_TAG), data },
            req: get_u64(h, REQ),
            total,
            iov,
            iov_count: count,
        })
    }
}

/// How the receiver finished a rendezvous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinStatus {
    /// The receiver has the bytes (or as many as its buffer took): complete.
    Done,
    /// The receiver discarded the message (FI_DISCARD): complete, nothing read.
    Discarded,
    /// Reading the sender's memory failed (bad address, peer gone): complete the
    /// send with an error.
    Failed,
}

impl FinStatus {
    pub(crate) fn to_byte(self) -> u8 {
        match self {
            FinStatus::Done => 0,
            FinStatus::Discarded => 2,
            FinStatus::Failed => 3,
        }
    }

    pub(crate) fn from_byte(b: u8) -> Result<FinStatus, HeaderError> {
        Ok(match b {
            0 => FinStatus::Done,
            2 => FinStatus::Discarded,
            3 => FinStatus::Failed,
            other => return Err(HeaderError::Flags(other)),
        })
    }
}

// The engine's shorthands: each packet's header through `Packet::encode_header`.

#[inline]
pub fn encode_fin(req: u64, status: FinStatus, read: u64) -> [u8; FIN_LEN] {
    let mut h = [0u8; FIN_LEN];
    Packet::Fin { req, status, read }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_push(req: u64, offset: u64) -> [u8; PUSH_HEADER_LEN] {
    let mut h = [0u8; PUSH_HEADER_LEN];
    Packet::Push { req, offset, payload: &[] }.encode_header(&mut h);
    h
}

#[inline]
pub fn encode_cts(req: u64, offset: u64, len: u64) -> [u8; CTS_LEN] {
    let mut h = [0u8; CTS_LEN];
    Packet::Cts { req, offset, len }.encode_header(&mut h);
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rts(count: usize) -> Rts {
        let mut iov = [RemoteIov::default(); MAX_IOV];
        for (i, v) in iov.iter_mut().take(count).enumerate() {
            *v = RemoteIov { addr: 0x1000 * (i as u64 + 1), len: 100 + i as u64, key: None };
        }
        let total = iov.iter().map(|v| v.len).sum();
        Rts {
            header: MsgHeader { kind: MsgKind::Tagged, tag: 7, data: Some(9) },
            req: 42,
            total,
            iov,
            iov_count: count,
        }
    }

    #[test]
    fn rts_fin_push_roundtrip() {
        for count in 1..=MAX_IOV {
            let r = rts(count);
            let mut a = [0u8; RTS_MAX];
            let n = r.encode(&mut a);
            let b = &a[..n];
            assert_eq!(b.len(), RTS_FIXED + 16 * count);
            assert_eq!(Packet::decode(b), Ok(Packet::Rts(r)));
        }
        // With keys: 8 more bytes per iov; without, the earlier layout.
        for count in 1..=MAX_IOV {
            let mut r = rts(count);
            for (i, v) in r.iov.iter_mut().take(count).enumerate() {
                v.key = Some(0xabc0 + i as u64);
            }
            let mut a = [0u8; RTS_MAX];
            let n = r.encode(&mut a);
            assert_eq!(n, RTS_FIXED + 24 * count);
            assert_eq!(Packet::decode(&a[..n]), Ok(Packet::Rts(r)));
            assert!(Packet::decode(&a[..n - 8]).is_err(), "a key missing");
            let mut no_flag = a[..n].to_vec();
            no_flag[1] &= !FLAG_KEYS;
            assert!(Packet::decode(&no_flag).is_err(), "keys without the flag");
        }
        let f = encode_fin(5, FinStatus::Discarded, 77);
        assert_eq!(Packet::decode(&f), Ok(Packet::Fin { req: 5, status: FinStatus::Discarded, read: 77 }));
        let mut p = encode_push(6, 4096).to_vec();
        p.extend_from_slice(b"abc");
        assert_eq!(Packet::decode(&p), Ok(Packet::Push { req: 6, offset: 4096, payload: b"abc" }));
        assert_eq!(Packet::decode(&encode_cts(7, 8, 9)), Ok(Packet::Cts { req: 7, offset: 8, len: 9 }));
        assert!(Packet::decode(&encode_cts(7, 8, 9)[..31]).is_err());
        let mut old_push = encode_fin(5, FinStatus::Done, 0);
        old_push[1] = 1;
        assert!(Packet::decode(&old_push).is_err(), "status 1 (the old Push) is no longer valid");
    }

    #[test]
    fn inconsistent_rts_is_refused() {
        let mut a = [0u8; RTS_MAX];
        let n = rts(2).encode(&mut a);
        let b = a[..n].to_vec();
        let mut wrong_total = b.clone();
        wrong_total[32] ^= 1;
        assert!(Packet::decode(&wrong_total).is_err());
        let mut zero = b.clone();
        zero[2] = 0;
        assert!(Packet::decode(&zero).is_err());
        let mut five = b.clone();
        five[2] = 5;
        assert!(Packet::decode(&five).is_err());
        assert!(Packet::decode(&b[..b.len() - 1]).is_err());
        let mut wrap = b.clone();
        wrap[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Packet::decode(&wrap).is_err());
        let mut flags = b;
        flags[1] = 0x80;
        assert!(Packet::decode(&flags).is_err());
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes: Vec<u8>) {
            let _ = Packet::decode(&bytes);
        }
    }
}
