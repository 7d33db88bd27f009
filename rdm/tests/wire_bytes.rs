//! The bytes on the wire, pinned: each packet type encoded from fixed field
//! values must stay byte-for-byte what the protocol version 2 peers send
//! (`rdm/PROTOCOL.md`), so that refactoring the encoder cannot silently break
//! interoperation with a peer built from an earlier commit. The expected
//! strings were produced by the encoder before the field table existed.
use rdm::engine::{Header, Hello, PacketType, Psn, Sealed, HEADER_LEN};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn encoded(h: Header, payload: &[u8]) -> String {
    let mut buf = [0u8; 128];
    let n = h.encode(payload, &mut buf);
    assert_eq!(n, HEADER_LEN + payload.len());
    let (back, p) = Header::decode(&buf[..n]).expect("its own encoding decodes");
    assert_eq!((back, p), (h, payload));
    hex(&buf[..n])
}

fn header(ptype: PacketType, first: bool, last: bool) -> Header {
    Header {
        header_sum: false,
        unsummed: false,
        sealed: Sealed::No,
        hello: Hello::None,
        ptype,
        first,
        last,
        job_key: 0x0102_0304_0506_0708,
        src_inc: 0x1112_1314_1516_1718,
        dst_inc: 0x2122_2324_2526_2728,
        psn_or_window: 0x3132_3334,
        ack: Psn(0x4142_4344),
        sack: 0x5152_5354_5556_5758,
    }
}

#[test]
fn every_packet_type_encodes_to_the_pinned_bytes() {
    let got = [
        encoded(header(PacketType::Data, true, false), b"abc"),
        encoded(header(PacketType::Data, false, true), b""),
        encoded(header(PacketType::Ack, false, false), b""),
        encoded(Header { sack: 0, ..header(PacketType::Datagram, false, false) }, b"dgram"),
        encoded(header(PacketType::Direct, true, true), b"direct"),
        encoded(Header { unsummed: true, ..header(PacketType::Direct, true, true) }, b"direct"),
    ];
    let want = [
        "d702010192cda72808070605040302011817161514131211282726252423222134333231444342415857565554535251616263",
        "d7020102c65927b008070605040302011817161514131211282726252423222134333231444342415857565554535251",
        "d7020200aaa320ac08070605040302011817161514131211282726252423222134333231444342415857565554535251",
        "d70203003aafaad208070605040302011817161514131211282726252423222134333231444342410000000000000000646772616d",
        "d702040321d5aef508070605040302011817161514131211282726252423222134333231444342415857565554535251646972656374",
        // UNSUMMED (flag bit3, shared memory only): the checksum field is zero.
        "d702040b0000000008070605040302011817161514131211282726252423222134333231444342415857565554535251646972656374",
    ];
    assert_eq!(got, want);
}
