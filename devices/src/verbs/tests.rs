//! Unit tests of the verbs device's pure parts (addresses, keys, access
//! bits, ODP caps, Q_Keys, the GRH's source), apart from the code they test.
#![forbid(unsafe_code)]

use super::*;

#[test]
fn address_round_trip() {
    let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 12, 1];
    let a = ud_addr(gid, 0x12345, 7);
    assert_eq!(parse_ud_addr(&a), Some((gid, 0x12345, 7)));
    let DevAddr::Raw(r) = a else { panic!() };
    assert_eq!(r.bytes().len(), UD_ADDR_LEN);
    assert_eq!(&r.bytes()[16..20], &0x12345u32.to_le_bytes());
    assert_eq!(parse_ud_addr(&DevAddr::NONE), None);
    let efa = DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_EFA, &[0; 22]).unwrap());
    assert_eq!(parse_ud_addr(&efa), None);
}

#[test]
fn keys_and_access() {
    let k = mr_key(0x1111, 0x2222);
    assert_eq!(k, 0x2222_0000_1111);
    assert_eq!(mr_keys(k), (0x1111, 0x2222));
    let lw = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    let rr = ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    let rw = ib::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    assert_eq!(ibv_access(FI_SEND), rr, "a rendezvous receiver reads what is sent");
    assert_eq!(ibv_access(FI_REMOTE_READ), rr);
    assert_eq!(ibv_access(FI_REMOTE_WRITE), rw | lw);
    assert_eq!(ibv_access(FI_READ), lw);
    assert_eq!(ibv_access(FI_RECV | FI_REMOTE_READ), lw | rr);
}

#[test]
fn on_demand_needs_rc_read_and_ud_send() {
    let (gen, read, send) = (
        ib::ibv_odp_general_caps_IBV_ODP_SUPPORT as u64,
        ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_READ,
        ib::ibv_odp_transport_cap_bits_IBV_ODP_SUPPORT_SEND,
    );
    // Soft-RoCE in Debian's 7.3 kernel: RC send/recv/write/read/atomic/srq, UD send/recv/srq.
    assert!(odp_offered(gen, 0x3f | 0xc0, 0x23));
    assert!(!odp_offered(0, read | send, send), "no general ODP");
    assert!(!odp_offered(gen, send, send), "no RC read");
    assert!(!odp_offered(gen, read, 0), "no UD send (gathered pushes)");
    assert!(!odp_offered(0, 0, 0), "6.1: nothing");
}

#[test]
fn qkeys_are_unprivileged_and_spread() {
    let keys: Vec<u32> = (0..1000u64).map(qkey_for).collect();
    assert!(keys.iter().all(|k| k & 0x8000_0000 == 0));
    let mut d = keys.clone();
    d.sort();
    d.dedup();
    assert_eq!(d.len(), keys.len());
    assert_eq!(qkey_for(42), qkey_for(42));
}

#[test]
fn grh_source_of_ipv4_and_ipv6() {
    // RoCE v2 over IPv4: 20 bytes unused, then an IPv4 header.
    let mut g = [0u8; GRH_LEN];
    let ip4: [u8; 20] = [0x45, 0, 0, 60, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 11, 12, 1, 10, 11, 13, 1];
    g[20..].copy_from_slice(&ip4);
    let mut sum: u32 = ip4.chunks(2).map(|w| u16::from_be_bytes([w[0], w[1]]) as u32).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let ck = !(sum as u16);
    g[30..32].copy_from_slice(&ck.to_be_bytes());
    assert_eq!(grh_source_gid(&g), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 11, 12, 1]);
    // A GRH proper (IPv6 version): sgid at bytes 8..24.
    let mut g = [0u8; GRH_LEN];
    g[0] = 0x60;
    for (i, b) in g[8..24].iter_mut().enumerate() {
        *b = 0xf0 + i as u8;
    }
    let want: [u8; 16] = std::array::from_fn(|i| 0xf0 + i as u8);
    assert_eq!(grh_source_gid(&g), want);
}
