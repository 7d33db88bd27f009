//! The message layer's packets, one registry of kinds ([`Kind`]) and one file per
//! packet family: two-sided messages ([`msg`]), the rendezvous packets
//! ([`rendezvous`]) and the emulated one-sided operations ([`rma`]). Every packet
//! arriving from the network is parsed exactly once, by [`Packet::decode`], into
//! typed fields, and every packet sent is written by its inverse,
//! [`Packet::encode_header`] (the payload follows as a gather list, not
//! copied). Each family's file holds the table of its field offsets
//! (`field`), which both sides read. The first byte of every packet is its
//! kind. Each packet has exactly one encoding: reserved bytes and fields their
//! flags mark absent are zero, and the decoder refuses anything else (every
//! earlier encoder wrote zeros there), so `encode(decode(b)) == b`.
pub mod msg;
pub mod rendezvous;
pub mod rma;

use core::ops::Range;
pub use msg::HeaderError as WireError;
use msg::HeaderError;
use msg::MsgHeader;
use rendezvous::{FinStatus, Rts, RTS_MAX};
use rma::Status;

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
    /// Bytes one device sends to the peer's device (the handshake of a
    /// connection for remote reads, `rdm::device::rc`): opaque here, at
    /// most [`rdm::device::CONTROL_MAX`] of them after an 8-byte header of
    /// kind and zeros.
    DeviceCtl = 13,
}

impl Kind {
    /// Every kind, in wire-number order (`ALL[k as usize] == k`).
    pub const ALL: [Kind; 14] = [
        Kind::Msg,
        Kind::Tagged,
        Kind::Write,
        Kind::ReadReq,
        Kind::ReadResp,
        Kind::Atomic,
        Kind::AtomicResp,
        Kind::WriteAck,
        Kind::Rts,
        Kind::Fin,
        Kind::Push,
        Kind::Keepalive,
        Kind::Cts,
        Kind::DeviceCtl,
    ];

    #[inline]
    pub fn from_wire(b: u8) -> Option<Kind> {
        Kind::ALL.get(b as usize).copied()
    }
}

/// The fields every packet kind shares: the kind, then a flags or status
/// byte; every kind but keepalive carries a request id at [`field::REQ`].
/// Each family's file has the table of its other fields.
pub mod field {
    use core::ops::Range;
    pub const KIND: usize = 0;
    /// Flags (messages, writes, atomics, RTS) or a status (answers, Fin).
    pub const FLAGS: usize = 1;
    pub const REQ: Range<usize> = 8..16;
}

/// Bytes of a keepalive: its kind, then zeros.
pub const KEEPALIVE_LEN: usize = 8;
/// The bytes of a keepalive (what [`Packet::Keepalive`] encodes to).
pub const KEEPALIVE: [u8; KEEPALIVE_LEN] = [Kind::Keepalive as u8, 0, 0, 0, 0, 0, 0, 0];

/// Longest header of any packet (an RTS with keys): a buffer this long takes
/// [`Packet::encode_header`] of every packet.
pub const MAX_HEADER_LEN: usize = RTS_MAX;

/// Any packet of the message layer, parsed once from untrusted bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Packet<'a> {
    Msg(MsgHeader, &'a [u8]),
    Write {
        req: u64,
        key: u64,
        addr: u64,
        data: Option<u64>,
        payload: &'a [u8],
    },
    ReadReq {
        req: u64,
        key: u64,
        addr: u64,
        len: u64,
    },
    ReadResp {
        req: u64,
        status: Status,
        payload: &'a [u8],
    },
    Atomic {
        req: u64,
        key: u64,
        addr: u64,
        datatype: u8,
        op: u8,
        count: u32,
        fetch: bool,
        payload: &'a [u8],
    },
    AtomicResp {
        req: u64,
        status: Status,
        payload: &'a [u8],
    },
    WriteAck {
        req: u64,
        status: Status,
    },
    /// A long message announced for the receiver to pull ([`rendezvous`]).
    Rts(Rts),
    /// The receiver finished (or redirected) a rendezvous.
    Fin {
        req: u64,
        status: FinStatus,
        read: u64,
    },
    /// The bytes of a long message the receiver could not pull.
    Push {
        req: u64,
        offset: u64,
        payload: &'a [u8],
    },
    /// The receiver grants bytes `offset..offset+len` of a long message.
    Cts {
        req: u64,
        offset: u64,
        len: u64,
    },
    Keepalive,
    /// Control bytes for the peer's device (1..=`CONTROL_MAX` of them).
    DeviceCtl(&'a [u8]),
}

/// Bytes of a device control packet's header: its kind, then zeros.
pub const DEVICE_CTL_HEADER_LEN: usize = 8;

/// The little-endian u64 in field `f` of `b`, or 0 past the end (callers
/// check lengths first).
#[inline]
pub(crate) fn get_u64(b: &[u8], f: Range<usize>) -> u64 {
    let mut a = [0u8; 8];
    if let Some(s) = b.get(f) {
        a.copy_from_slice(s);
    }
    u64::from_le_bytes(a)
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], f: Range<usize>, v: u64) {
    b[f].copy_from_slice(&v.to_le_bytes());
}

/// Reserved bytes, and fields their flags say are absent, must be zero: every
/// encoder writes zeros there, so a packet has exactly one encoding and
/// re-encoding what was decoded gives back the bytes received.
#[inline]
pub(crate) fn check_zero(b: &[u8], f: Range<usize>) -> Result<(), HeaderError> {
    match b.get(f) {
        Some(r) if r.iter().any(|&x| x != 0) => Err(HeaderError::Malformed("nonzero reserved bytes")),
        _ => Ok(()),
    }
}

fn split(b: &[u8], n: usize) -> Result<(&[u8], &[u8]), HeaderError> {
    b.split_at_checked(n).ok_or(HeaderError::Short)
}

/// Exactly `n` bytes (a packet without payload).
fn exact(b: &[u8], n: usize, what: &'static str) -> Result<(), HeaderError> {
    match b.len() {
        l if l < n => Err(HeaderError::Short),
        l if l > n => Err(HeaderError::Malformed(what)),
        _ => Ok(()),
    }
}

impl<'a> Packet<'a> {
    /// Parses one packet from untrusted bytes; every packet is parsed once,
    /// here. [`Packet::encode_header`] is its inverse, arm for arm.
    pub fn decode(b: &'a [u8]) -> Result<Packet<'a>, HeaderError> {
        let k = *b.first().ok_or(HeaderError::Short)?;
        let kind = Kind::from_wire(k).ok_or(HeaderError::Kind(k))?;
        match kind {
            Kind::Msg | Kind::Tagged => {
                let (h, p) = MsgHeader::decode(b)?;
                Ok(Packet::Msg(h, p))
            }
            Kind::Write => {
                use rma::field::*;
                let (h, payload) = split(b, WRITE_LEN)?;
                let flags = h[FLAGS];
                if flags & !rma::FLAG_DATA != 0 {
                    return Err(HeaderError::Flags(flags));
                }
                check_zero(h, WRITE_RESERVED)?;
                let data = flags & rma::FLAG_DATA != 0;
                if !data {
                    check_zero(h, WRITE_DATA)?;
                }
                Ok(Packet::Write {
                    req: get_u64(h, REQ),
                    key: get_u64(h, KEY),
                    addr: get_u64(h, ADDR),
                    data: data.then(|| get_u64(h, WRITE_DATA)),
                    payload,
                })
            }
            Kind::ReadReq => {
                use rma::field::*;
                exact(b, READ_REQ_LEN, "read request length")?;
                check_zero(b, READ_REQ_RESERVED)?;
                Ok(Packet::ReadReq {
                    req: get_u64(b, REQ),
                    key: get_u64(b, KEY),
                    addr: get_u64(b, ADDR),
                    len: get_u64(b, READ_LEN),
                })
            }
            Kind::ReadResp | Kind::AtomicResp | Kind::WriteAck => {
                use rma::field::*;
                let (h, payload) = split(b, RESP_LEN)?;
                let status = Status::from_byte(h[FLAGS])?;
                check_zero(h, RESP_RESERVED)?;
                let req = get_u64(h, REQ);
                Ok(match kind {
                    Kind::ReadResp => Packet::ReadResp { req, status, payload },
                    Kind::AtomicResp => Packet::AtomicResp { req, status, payload },
                    _ => {
                        exact(b, RESP_LEN, "write ack length")?;
                        Packet::WriteAck { req, status }
                    }
                })
            }
            Kind::Atomic => {
                use rma::field::*;
                let (h, payload) = split(b, ATOMIC_LEN)?;
                let flags = h[FLAGS];
                if flags & !rma::FLAG_FETCH != 0 {
                    return Err(HeaderError::Flags(flags));
                }
                let mut count = [0u8; 4];
                count.copy_from_slice(&h[ATOMIC_COUNT]);
                Ok(Packet::Atomic {
                    req: get_u64(h, REQ),
                    key: get_u64(h, KEY),
                    addr: get_u64(h, ADDR),
                    datatype: h[ATOMIC_DATATYPE],
                    op: h[ATOMIC_OP],
                    count: u32::from_le_bytes(count),
                    fetch: flags & rma::FLAG_FETCH != 0,
                    payload,
                })
            }
            Kind::Rts => Ok(Packet::Rts(Rts::decode(b)?)),
            Kind::Fin => {
                use rendezvous::field::*;
                exact(b, FIN_LEN, "fin length")?;
                let status = FinStatus::from_byte(b[FLAGS])?;
                check_zero(b, FIN_RESERVED)?;
                Ok(Packet::Fin { req: get_u64(b, REQ), status, read: get_u64(b, FIN_READ) })
            }
            Kind::Push => {
                use rendezvous::field::*;
                let (h, payload) = split(b, PUSH_HEADER_LEN)?;
                check_zero(h, PUSH_RESERVED)?;
                Ok(Packet::Push { req: get_u64(h, REQ), offset: get_u64(h, PUSH_OFFSET), payload })
            }
            Kind::Cts => {
                use rendezvous::field::*;
                exact(b, CTS_LEN, "cts length")?;
                check_zero(b, CTS_RESERVED)?;
                Ok(Packet::Cts { req: get_u64(b, REQ), offset: get_u64(b, CTS_OFFSET), len: get_u64(b, CTS_GRANT) })
            }
            Kind::Keepalive => {
                exact(b, KEEPALIVE_LEN, "keepalive length")?;
                check_zero(b, 1..KEEPALIVE_LEN)?;
                Ok(Packet::Keepalive)
            }
            Kind::DeviceCtl => {
                let (h, payload) = split(b, DEVICE_CTL_HEADER_LEN)?;
                check_zero(h, 1..DEVICE_CTL_HEADER_LEN)?;
                if payload.is_empty() || payload.len() > rdm::device::CONTROL_MAX {
                    return Err(HeaderError::Malformed("device control length"));
                }
                Ok(Packet::DeviceCtl(payload))
            }
        }
    }

    /// Bytes of the packet's header: everything before [`Packet::payload`].
    #[inline]
    pub fn header_len(&self) -> usize {
        match self {
            Packet::Msg(..) => msg::HEADER_LEN,
            Packet::Write { .. } => rma::field::WRITE_LEN,
            Packet::ReadReq { .. } => rma::field::READ_REQ_LEN,
            Packet::ReadResp { .. } | Packet::AtomicResp { .. } | Packet::WriteAck { .. } => rma::field::RESP_LEN,
            Packet::Atomic { .. } => rma::field::ATOMIC_LEN,
            Packet::Rts(rts) => rts.encoded_len(),
            Packet::Fin { .. } => rendezvous::field::FIN_LEN,
            Packet::Push { .. } => rendezvous::field::PUSH_HEADER_LEN,
            Packet::Cts { .. } => rendezvous::field::CTS_LEN,
            Packet::Keepalive => KEEPALIVE_LEN,
            Packet::DeviceCtl(_) => DEVICE_CTL_HEADER_LEN,
        }
    }

    /// The bytes after the header (empty for kinds without a payload).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        match *self {
            Packet::Msg(_, p)
            | Packet::Write { payload: p, .. }
            | Packet::ReadResp { payload: p, .. }
            | Packet::Atomic { payload: p, .. }
            | Packet::AtomicResp { payload: p, .. }
            | Packet::Push { payload: p, .. }
            | Packet::DeviceCtl(p) => p,
            _ => &[],
        }
    }

    /// Writes every byte of the packet's header, reserved ones as zero, into
    /// `out[..self.header_len()]` and returns that length; the inverse of
    /// [`Packet::decode`], arm for arm. The payload is not copied: the
    /// engine sends it after the header as a gather list, straight from
    /// where it lies (a packet built to be sent may leave its `payload`
    /// empty and pass the bytes that way).
    ///
    /// # Panics
    /// If `out` is shorter than `self.header_len()` ([`MAX_HEADER_LEN`] is
    /// always enough).
    #[inline]
    pub fn encode_header(&self, out: &mut [u8]) -> usize {
        let n = self.header_len();
        let h = &mut out[..n];
        match *self {
            Packet::Msg(header, _) => h.copy_from_slice(&header.encode()),
            Packet::Write { req, key, addr, data, .. } => {
                use rma::field::*;
                h.fill(0);
                h[KIND] = Kind::Write as u8;
                h[FLAGS] = if data.is_some() { rma::FLAG_DATA } else { 0 };
                put_u64(h, REQ, req);
                put_u64(h, KEY, key);
                put_u64(h, ADDR, addr);
                put_u64(h, WRITE_DATA, data.unwrap_or(0));
            }
            Packet::ReadReq { req, key, addr, len } => {
                use rma::field::*;
                h.fill(0);
                h[KIND] = Kind::ReadReq as u8;
                put_u64(h, REQ, req);
                put_u64(h, KEY, key);
                put_u64(h, ADDR, addr);
                put_u64(h, READ_LEN, len);
            }
            Packet::ReadResp { req, status, .. } => rma::put_resp(h, Kind::ReadResp, req, status),
            Packet::AtomicResp { req, status, .. } => rma::put_resp(h, Kind::AtomicResp, req, status),
            Packet::WriteAck { req, status } => rma::put_resp(h, Kind::WriteAck, req, status),
            Packet::Atomic { req, key, addr, datatype, op, count, fetch, .. } => {
                use rma::field::*;
                h[KIND] = Kind::Atomic as u8;
                h[FLAGS] = if fetch { rma::FLAG_FETCH } else { 0 };
                h[ATOMIC_DATATYPE] = datatype;
                h[ATOMIC_OP] = op;
                h[ATOMIC_COUNT].copy_from_slice(&count.to_le_bytes());
                put_u64(h, REQ, req);
                put_u64(h, KEY, key);
                put_u64(h, ADDR, addr);
            }
            Packet::Rts(ref rts) => {
                rts.encode_into(h);
            }
            Packet::Fin { req, status, read } => {
                use rendezvous::field::*;
                h.fill(0);
                h[KIND] = Kind::Fin as u8;
                h[FLAGS] = status.to_byte();
                put_u64(h, REQ, req);
                put_u64(h, FIN_READ, read);
            }
            Packet::Push { req, offset, .. } => {
                use rendezvous::field::*;
                h.fill(0);
                h[KIND] = Kind::Push as u8;
                put_u64(h, REQ, req);
                put_u64(h, PUSH_OFFSET, offset);
            }
            Packet::Cts { req, offset, len } => {
                use rendezvous::field::*;
                h.fill(0);
                h[KIND] = Kind::Cts as u8;
                put_u64(h, REQ, req);
                put_u64(h, CTS_OFFSET, offset);
                put_u64(h, CTS_GRANT, len);
            }
            Packet::Keepalive => h.copy_from_slice(&KEEPALIVE),
            Packet::DeviceCtl(_) => {
                h.fill(0);
                h[field::KIND] = Kind::DeviceCtl as u8;
            }
        }
        n
    }

    /// Appends the whole packet, header then payload, to `out` (tests and
    /// tools; the engine sends header and payload as a gather list instead).
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut h = [0u8; MAX_HEADER_LEN];
        let n = self.encode_header(&mut h);
        out.extend_from_slice(&h[..n]);
        out.extend_from_slice(self.payload());
    }
}

#[cfg(test)]
mod tests {
    use super::rendezvous::{RemoteIov, MAX_IOV};
    use super::*;
    use msg::MsgKind;
    use proptest::prelude::*;

    /// Field values for any packet: which kind, its integers, its small
    /// fields, its payload and (RTS) its iovs.
    #[derive(Debug, Clone)]
    struct Fields {
        kind: Kind,
        w: [u64; 4],
        small: [u8; 3],
        count: u32,
        flag: bool,
        data: Option<u64>,
        payload: Vec<u8>,
        iov: Vec<(u64, u64)>,
        keys: bool,
    }

    fn fields() -> impl Strategy<Value = Fields> {
        (
            proptest::sample::select(&Kind::ALL[..]),
            any::<[u64; 4]>(),
            any::<[u8; 3]>(),
            any::<u32>(),
            any::<bool>(),
            any::<Option<u64>>(),
            proptest::collection::vec(any::<u8>(), 0..40),
            proptest::collection::vec((0u64..1 << 62, 0u64..1 << 60), 1..=MAX_IOV),
            any::<bool>(),
        )
            .prop_map(|(kind, w, small, count, flag, data, payload, iov, keys)| Fields {
                kind,
                w,
                small,
                count,
                flag,
                data,
                payload,
                iov,
                keys,
            })
    }

    fn status(b: u8) -> Status {
        [Status::Ok, Status::NoKey, Status::Access, Status::Invalid][b as usize % 4]
    }

    /// The packet `f` describes (every packet the engine can send is one).
    fn packet(f: &Fields) -> Packet<'_> {
        let [a, b, c, d] = f.w;
        let p = &f.payload[..];
        match f.kind {
            Kind::Msg | Kind::Tagged => {
                let kind = if f.kind == Kind::Tagged { MsgKind::Tagged } else { MsgKind::Msg };
                Packet::Msg(MsgHeader { kind, tag: a, data: f.data }, p)
            }
            Kind::Write => Packet::Write { req: a, key: b, addr: c, data: f.data, payload: p },
            Kind::ReadReq => Packet::ReadReq { req: a, key: b, addr: c, len: d },
            Kind::ReadResp => Packet::ReadResp { req: a, status: status(f.small[0]), payload: p },
            Kind::Atomic => Packet::Atomic {
                req: a,
                key: b,
                addr: c,
                datatype: f.small[0],
                op: f.small[1],
                count: f.count,
                fetch: f.flag,
                payload: p,
            },
            Kind::AtomicResp => Packet::AtomicResp { req: a, status: status(f.small[0]), payload: p },
            Kind::WriteAck => Packet::WriteAck { req: a, status: status(f.small[0]) },
            Kind::Rts => {
                let mut iov = [RemoteIov::default(); MAX_IOV];
                for (i, &(addr, len)) in f.iov.iter().enumerate() {
                    iov[i] = RemoteIov { addr, len, key: f.keys.then_some(b ^ i as u64) };
                }
                let kind = if f.flag { MsgKind::Tagged } else { MsgKind::Msg };
                let total = f.iov.iter().map(|v| v.1).sum();
                Packet::Rts(Rts {
                    header: MsgHeader { kind, tag: c, data: f.data },
                    req: a,
                    total,
                    iov,
                    iov_count: f.iov.len(),
                })
            }
            Kind::Fin => Packet::Fin {
                req: a,
                status: [FinStatus::Done, FinStatus::Discarded, FinStatus::Failed][f.small[0] as usize % 3],
                read: b,
            },
            Kind::Push => Packet::Push { req: a, offset: b, payload: p },
            Kind::Cts => Packet::Cts { req: a, offset: b, len: c },
            Kind::Keepalive => Packet::Keepalive,
            Kind::DeviceCtl => {
                Packet::DeviceCtl(if p.is_empty() { &[1] } else { &p[..p.len().min(rdm::device::CONTROL_MAX)] })
            }
        }
    }

    fn encoded(p: &Packet<'_>) -> Vec<u8> {
        let mut v = Vec::new();
        p.encode(&mut v);
        v
    }

    /// encode(decode(b)) == b whenever `b` decodes.
    fn reencodes(b: &[u8]) -> Result<(), TestCaseError> {
        if let Ok(p) = Packet::decode(b) {
            prop_assert_eq!(encoded(&p), b, "{:?} re-encodes to other bytes", p);
        }
        Ok(())
    }

    #[test]
    fn kinds_are_numbered_by_their_position() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(Kind::from_wire(i as u8), Some(*k));
        }
        assert_eq!(Kind::from_wire(Kind::ALL.len() as u8), None);
        assert_eq!(encoded(&Packet::Keepalive), KEEPALIVE);
    }

    #[test]
    fn nonzero_reserved_bytes_are_refused() {
        let mut fin = encoded(&Packet::Fin { req: 1, status: FinStatus::Done, read: 2 });
        fin[rendezvous::field::FIN_RESERVED.start] = 1;
        assert!(Packet::decode(&fin).is_err());
        let mut no_data = encoded(&Packet::Msg(MsgHeader { kind: MsgKind::Tagged, tag: 3, data: None }, b"x"));
        no_data[msg::field::DATA.start] = 1;
        assert!(Packet::decode(&no_data).is_err(), "remote CQ data without its flag");
        let mut ack = encoded(&Packet::WriteAck { req: 4, status: Status::Ok });
        ack.push(0);
        assert!(Packet::decode(&ack).is_err(), "a write ack with a payload");
    }

    proptest! {
        /// decode(encode(p)) == p, for generated packets of every kind.
        #[test]
        fn encode_then_decode_is_identity(f in fields()) {
            let p = packet(&f);
            let b = encoded(&p);
            prop_assert_eq!(b.len(), p.header_len() + p.payload().len());
            prop_assert_eq!(Packet::decode(&b), Ok(p));
        }

        /// encode(decode(b)) == b, for any byte of a valid packet changed:
        /// whatever still decodes has exactly one encoding.
        #[test]
        fn decode_then_encode_is_identity_near_valid_packets(f in fields(), at: usize, xor: u8, cut: usize) {
            let mut b = encoded(&packet(&f));
            let at = at % b.len();
            b[at] ^= xor;
            reencodes(&b)?;
            b.truncate(cut % (b.len() + 1));
            reencodes(&b)?;
        }

        /// encode(decode(b)) == b, for arbitrary bytes of any kind.
        #[test]
        fn decode_then_encode_is_identity(kind in proptest::sample::select(&Kind::ALL[..]), mut b in proptest::collection::vec(any::<u8>(), 1..160)) {
            b[0] = kind as u8;
            reencodes(&b)?;
        }
    }
}
