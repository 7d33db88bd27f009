//! Unit tests of the EFA device's pure parts (addresses, limits and caps
//! from made-up attributes, read splitting, memory access) and of opening
//! without an EFA device, apart from the code they test. The address-handle
//! cache's tests are `crate::ib`'s.
//!
//! Unsafe here: `LocalBuf::new` over a test's own buffer.
#![allow(unsafe_code)]

use super::*;
use rdm::device::{LocalBuf, ReadRun};
use std::io;

fn attr(caps: u32) -> ib::efadv_device_attr {
    ib::efadv_device_attr {
        max_sq_wr: 512,
        max_rq_wr: 8192,
        max_sq_sge: 2,
        max_rq_sge: 1,
        inline_buf_size: 32,
        device_caps: caps,
        max_rdma_size: 1 << 30,
        ..Default::default()
    }
}

#[test]
fn address_round_trip_and_foreign_families() {
    let gid: [u8; 16] = std::array::from_fn(|i| 0xfe - i as u8);
    let a = efa_addr(gid, 0xabcdef);
    assert_eq!(parse_efa_addr(&a), Some((gid, 0xabcdef)));
    let DevAddr::Raw(r) = a else { panic!("raw") };
    assert_eq!(r.family(), RawAddr::FAMILY_EFA);
    assert_eq!(r.bytes().len(), EFA_ADDR_LEN);
    assert_eq!(&r.bytes()[16..], &0xabcdefu32.to_le_bytes());
    // A verbs UD address (another family), a wrong length, a socket.
    assert_eq!(parse_efa_addr(&crate::verbs::ud_addr(gid, 7, 0)), None);
    assert_eq!(parse_efa_addr(&DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_EFA, &[0; 22]).unwrap())), None);
    assert_eq!(parse_efa_addr(&DevAddr::NONE), None);
    assert_eq!(crate::verbs::parse_ud_addr(&a), None);
}

#[test]
fn limits_and_caps_from_the_device_attributes() {
    let all = ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ
        | ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY
        | ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID;
    let l = EfaLimits::from_attr(&attr(all), 8928, 32768, 0, 0);
    assert_eq!(
        l,
        EfaLimits {
            mtu: 8928,
            sq_depth: 256,
            rq_depth: 512,
            max_inline: 32,
            send_sges: 2,
            max_rdma_size: Some(1 << 30),
            rnr_retry: true,
            cq_with_sgid: true
        }
    );
    let c = l.caps();
    assert!(c.reliable && !c.ordered && c.remote_read && c.registration && !c.gso);
    assert_eq!((c.mtu, c.max_inline), (8928, 32));
    // The device's depths bound what is asked for; so do its CQs.
    let l = EfaLimits::from_attr(&attr(all), 8928, 300, 4096, 4096);
    assert_eq!((l.sq_depth, l.rq_depth), (300, 300));
    let l = EfaLimits::from_attr(&attr(all), 8928, 1 << 20, 4096, 4096);
    assert_eq!((l.sq_depth, l.rq_depth), (512, 4096));
    // No RDMA read: the windowed push; no RNR retry cap; no SGID.
    let l = EfaLimits::from_attr(&attr(ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID), 8928, 1024, 0, 0);
    assert_eq!(l.max_rdma_size, None);
    assert!(!l.caps().remote_read && !l.rnr_retry && l.cq_with_sgid);
    let l = EfaLimits::from_attr(&attr(0), 8928, 1024, 0, 0);
    assert!(!l.cq_with_sgid);
    // A read cap with a size of 0 cannot read.
    let mut a = attr(ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ);
    a.max_rdma_size = 0;
    assert_eq!(EfaLimits::from_attr(&a, 8928, 1024, 0, 0).max_rdma_size, None);
    // One SGE; inline larger than the datagram is cut to it.
    let mut a = attr(0);
    a.max_sq_sge = 1;
    a.inline_buf_size = 9000;
    let l = EfaLimits::from_attr(&a, 8928, 1024, 0, 0);
    assert_eq!((l.send_sges, l.max_inline), (1, 8928));
}

#[test]
fn reads_split_by_max_rdma_size() {
    let buf = vec![0u8; 10_000];
    // SAFETY: `buf` outlives the runs; nothing reads through them.
    let local = unsafe { LocalBuf::new(buf.as_ptr() as u64, 10_000) }.with_key(crate::verbs::mr_key(0x11, 0x22));
    let remote_key = Some(crate::verbs::mr_key(0x33, 0x44));
    let runs = [
        ReadRun { remote_addr: 0x1000_0000, remote_key, local: local.sub(0, 9000).unwrap() },
        ReadRun { remote_addr: 0x2000_0000, remote_key, local: local.sub(9000, 0).unwrap() },
        ReadRun { remote_addr: 0x3000_0000, remote_key, local: local.sub(9000, 1000).unwrap() },
    ];
    let p = split_read(&runs, 4096).unwrap();
    let base = buf.as_ptr() as u64;
    assert_eq!(
        p,
        vec![
            ReadPiece { remote_addr: 0x1000_0000, rkey: 0x44, addr: base, lkey: 0x11, len: 4096 },
            ReadPiece { remote_addr: 0x1000_1000, rkey: 0x44, addr: base + 4096, lkey: 0x11, len: 4096 },
            ReadPiece { remote_addr: 0x1000_2000, rkey: 0x44, addr: base + 8192, lkey: 0x11, len: 808 },
            ReadPiece { remote_addr: 0x3000_0000, rkey: 0x44, addr: base + 9000, lkey: 0x11, len: 1000 },
        ]
    );
    assert_eq!(p.iter().map(|p| p.len as u64).sum::<u64>(), 10_000);
    assert_eq!(split_read(&runs, 1 << 30).unwrap().len(), 2);
    let no_key = [ReadRun { remote_addr: 0, remote_key: None, local }];
    assert!(matches!(split_read(&no_key, 4096), Err(DeviceError::Config(_))));
}

/// Hosts without an EFA device (this one, CI's, the Soft-RoCE VM):
/// opening is a `Config` error that says why, never a panic.
#[test]
fn opening_without_an_efa_device_is_a_config_error() {
    match EfaContext::open(&EfaConfig::default()) {
        Ok(c) => eprintln!("an EFA device is here: {c:?}"),
        Err(DeviceError::Config(why)) => {
            assert!(why.starts_with("efa: no"), "{why}");
            if crate::verbs::VerbsContext::available() {
                // RDMA devices of another provider (Soft-RoCE in the
                // VM): asked, each refused by name.
                assert!(why.contains("efadv_query_device refuses"), "{why}");
            }
            assert!(!EfaContext::available());
        }
        Err(e) => panic!("not a Config error: {e}"),
    }
    match EfaContext::open(&EfaConfig { device: Some("no-such-rdma-device".into()), ..Default::default() }) {
        Err(DeviceError::Config(why)) => assert!(why.contains("no RDMA device"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn mr_access_mask_follows_the_device_caps() {
    let lw = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    let rr = ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    let rw = ib::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    let read = efa_mr_access_mask(ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ | ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID);
    assert_eq!(read, lw | rr);
    assert_eq!(efa_mr_access_mask(ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY), lw);
    assert_eq!(efa_mr_access_mask(u32::MAX) & rw, 0, "no remote write on EFA here");
    // What the registrar asks for, cut to the mask: never a bit
    // efa_alloc_mr refuses.
    use crate::verbs::{ibv_access, FI_READ, FI_RECV, FI_REMOTE_READ, FI_REMOTE_WRITE, FI_SEND};
    for access in [
        0,
        FI_SEND,
        FI_RECV,
        FI_READ,
        FI_REMOTE_READ,
        FI_REMOTE_WRITE,
        FI_SEND | FI_RECV | FI_REMOTE_READ | FI_REMOTE_WRITE,
    ] {
        for mask in [read, lw] {
            let got = ibv_access(access) & mask;
            assert_eq!(got & !mask, 0);
            if mask == read && access & (FI_SEND | FI_REMOTE_READ) != 0 {
                assert_ne!(got & rr, 0, "readable where the device reads");
            }
        }
    }
    assert_eq!(ibv_access(FI_REMOTE_WRITE) & read, lw);
    assert_eq!(ibv_access(FI_SEND) & lw, 0);
}

#[test]
fn a_read_whose_remote_range_wraps_fails_without_a_panic() {
    let buf = vec![0u8; 4096];
    // SAFETY: `buf` outlives the runs; nothing reads through them.
    let local = unsafe { LocalBuf::new(buf.as_ptr() as u64, 4096) }.with_key(crate::verbs::mr_key(0x11, 0x22));
    let remote_key = Some(crate::verbs::mr_key(0x33, 0x44));
    let wraps = [ReadRun { remote_addr: u64::MAX - 100, remote_key, local }];
    match split_read(&wraps, 1024) {
        Err(DeviceError::Io { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::InvalidInput),
        other => panic!("{other:?}"),
    }
    // The last byte at the top of the address space is fine.
    let top = [ReadRun { remote_addr: u64::MAX - 4096, remote_key, local }];
    let p = split_read(&top, 1024).unwrap();
    assert_eq!(p.last().map(|p| p.remote_addr + p.len as u64), Some(u64::MAX));
}
