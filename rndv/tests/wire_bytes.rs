//! The bytes on the wire, pinned: every message-layer packet kind encoded from
//! fixed field values must stay byte-for-byte what earlier commits sent, so
//! that refactoring the encoders cannot silently break interoperation with a
//! peer built from an earlier commit. The expected strings were produced by the
//! per-kind `encode_*` functions before `Packet::encode` existed (commit
//! 33703be); the test now encodes with `Packet::encode`.
use rndv::wire::rendezvous::{RemoteIov, Rts, MAX_IOV};
use rndv::wire::rma::Status;
use rndv::{FinStatus, MsgHeader, MsgKind, Packet};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn rts(keys: bool) -> Rts {
    let mut iov = [RemoteIov::default(); MAX_IOV];
    iov[0] = RemoteIov { addr: 0x1000, len: 7, key: keys.then_some(0xaa) };
    iov[1] = RemoteIov { addr: 0x2000, len: 9, key: keys.then_some(0xbb) };
    Rts {
        header: MsgHeader { kind: MsgKind::Tagged, tag: 0x77, data: Some(0x99) },
        req: 42,
        total: 16,
        iov,
        iov_count: 2,
    }
}

fn packets() -> Vec<Packet<'static>> {
    vec![
        Packet::Msg(MsgHeader { kind: MsgKind::Msg, tag: 0, data: None }, b"hi"),
        Packet::Msg(
            MsgHeader { kind: MsgKind::Tagged, tag: 0x0102_0304_0506_0708, data: Some(0x1112_1314_1516_1718) },
            b"",
        ),
        Packet::Write { req: 1, key: 2, addr: 3, data: Some(4), payload: b"wr" },
        Packet::Write { req: 1, key: 2, addr: 3, data: None, payload: b"" },
        Packet::ReadReq { req: 5, key: 6, addr: 7, len: 8 },
        Packet::ReadResp { req: 9, status: Status::Access, payload: b"rd" },
        Packet::Atomic { req: 10, key: 11, addr: 12, datatype: 7, op: 2, count: 3, fetch: true, payload: b"op" },
        Packet::AtomicResp { req: 13, status: Status::NoKey, payload: b"" },
        Packet::WriteAck { req: 14, status: Status::Invalid },
        Packet::Rts(rts(false)),
        Packet::Rts(rts(true)),
        Packet::Fin { req: 15, status: FinStatus::Discarded, read: 16 },
        Packet::Push { req: 17, offset: 18, payload: b"push" },
        Packet::Cts { req: 19, offset: 20, len: 21 },
        Packet::Keepalive,
    ]
}

fn encode(p: &Packet<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode(&mut v);
    v
}

#[test]
fn every_packet_kind_encodes_to_the_pinned_bytes() {
    let got: Vec<String> = packets()
        .iter()
        .map(|p| {
            let b = encode(p);
            assert_eq!(Packet::decode(&b).as_ref(), Ok(p), "its own encoding decodes");
            hex(&b)
        })
        .collect();
    let want = [
        "0000000000000000000000000000000000000000000000006869",
        "010100000000000008070605040302011817161514131211",
        "020100000000000001000000000000000200000000000000030000000000000004000000000000007772",
        "02000000000000000100000000000000020000000000000003000000000000000000000000000000",
        "03000000000000000500000000000000060000000000000007000000000000000800000000000000",
        "040200000000000009000000000000007264",
        "05010702030000000a000000000000000b000000000000000c000000000000006f70",
        "06010000000000000d00000000000000",
        "07030000000000000e00000000000000",
        "08030200000000002a000000000000007700000000000000990000000000000010000000000000000010000000000000070000000000000000200000000000000900000000000000",
        "08070200000000002a000000000000007700000000000000990000000000000010000000000000000010000000000000070000000000000000200000000000000900000000000000aa00000000000000bb00000000000000",
        "09020000000000000f000000000000001000000000000000",
        "0a000000000000001100000000000000120000000000000070757368",
        "0c00000000000000130000000000000014000000000000001500000000000000",
        "0b00000000000000",
    ];
    assert_eq!(got, want);
}
