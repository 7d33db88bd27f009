//! fi_getinfo hint matching, through the public API.
use fi_tests::*;

#[test]
fn no_hints_lists_rdm_entries_with_msg_and_tagged_and_a_src_addr() {
    // Empty hints (no type named): RDM only. NULL hints add DGRAM entries
    // after them (man_rules.rs).
    let info = getinfo(None, None, 0, Some(&Hints::new())).expect("rdmx answers empty hints");
    let mut n = 0;
    for i in info.iter() {
        n += 1;
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert_eq!(unsafe { (*i.ep_attr).type_ }, fi::FI_EP_RDM);
        assert_ne!(i.caps & fi::FI_MSG as u64, 0);
        assert_ne!(i.caps & fi::FI_TAGGED as u64, 0);
        assert_eq!(i.mode, 0, "rdmx requires no mode bits");
        assert!(!i.src_addr.is_null() && i.src_addrlen == 64, "every entry carries a src_addr");
        // SAFETY: a NUL-terminated string libfabric (or the test) owns and keeps alive here.
        let fab = unsafe { std::ffi::CStr::from_ptr((*i.fabric_attr).name) };
        let want_fabric = if Info::domain_name(i) == "verbs" { "rdmx-verbs" } else { "rdmx" };
        assert_eq!(fab.to_str().unwrap(), want_fabric);
        // SAFETY: a NUL-terminated string libfabric (or the test) owns and keeps alive here.
        let prov = unsafe { std::ffi::CStr::from_ptr((*i.fabric_attr).prov_name) };
        assert_eq!(prov.to_str().unwrap(), "rdmx");
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert!(unsafe { (*i.domain_attr).cq_data_size } >= 4);
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert_ne!(unsafe { (*i.ep_attr).mem_tag_format } & (1 << 63), 0);
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert_eq!(unsafe { (*i.domain_attr).mr_mode }, 0);
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert_eq!(unsafe { (*i.domain_attr).resource_mgmt }, fi::FI_RM_ENABLED);
    }
    assert!(n >= 1);
    let names: Vec<String> = info.iter().map(Info::domain_name).collect();
    if std::env::var_os("FI_RDMX_DEVICE").is_none() {
        // auto only (and verbs, on its own fabric, where an RDMA device is):
        // MPI libraries spread local ranks over the entries that look alike,
        // and every rank belongs on auto (shm to this host, UD or UDP beyond).
        let rdma = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        let want: &[&str] = if rdma { &["auto", "verbs"] } else { &["auto"] };
        assert_eq!(names, want, "only the best path is offered unasked");
    }
}

#[test]
fn a_domain_named_in_the_hints_is_offered_alone() {
    for name in ["auto", "udp", "shm"] {
        let mut h = Hints::rdm();
        h.set_domain_name(name);
        let info = getinfo(None, None, 0, Some(&h)).unwrap_or_else(|e| panic!("domain {name}: {e}"));
        let names: Vec<String> = info.iter().map(Info::domain_name).collect();
        assert_eq!(names, [name]);
    }
}

#[test]
fn msg_endpoints_are_refused_and_dgram_ones_offered() {
    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_MSG;
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)), "no MSG endpoints");
    // DGRAM: see fi_tests/tests/dgram.rs.
    let mut h = Hints::new();
    h.ep().type_ = fi::FI_EP_DGRAM;
    let info = getinfo(None, None, 0, Some(&h)).expect("DGRAM endpoints");
    // SAFETY: attrs of an fi_info this test owns.
    assert!(info.iter().all(|i| unsafe { (*i.ep_attr).type_ } == fi::FI_EP_DGRAM));
}

#[test]
fn unsupported_caps_are_refused() {
    for caps in [fi::FI_HMEM, fi::FI_TRIGGER as u64, fi::FI_MULTICAST as u64, fi::FI_NAMED_RX_CTX] {
        let mut h = Hints::rdm();
        h.get().caps |= caps;
        assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)), "caps {caps:#x}");
    }
}

#[test]
fn requested_primary_caps_are_what_comes_back() {
    let mut h = Hints::new();
    h.get().caps = fi::FI_TAGGED as u64;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    let i = info.first();
    assert_ne!(i.caps & fi::FI_TAGGED as u64, 0);
    assert_eq!(i.caps & fi::FI_MSG as u64, 0, "only requested primary caps");
    assert_ne!(i.caps & (fi::FI_SEND | fi::FI_RECV) as u64, 0, "direction bits added");
}

#[test]
fn names_must_match() {
    let mut h = Hints::rdm();
    h.set_domain_name("no-such-domain");
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
    let mut h = Hints::rdm();
    h.set_fabric_name("not-rdmx");
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    assert!(info.iter().all(|i| Info::domain_name(i) == "udp"));
}

#[test]
fn threading_progress_av_type_and_mr_mode_are_echoed() {
    let mut h = Hints::rdm();
    h.dom().threading = fi::FI_THREAD_DOMAIN;
    h.dom().control_progress = fi::FI_PROGRESS_MANUAL;
    h.dom().set_data_progress(fi::FI_PROGRESS_MANUAL);
    h.dom().av_type = fi::FI_AV_TABLE;
    h.dom().mr_mode = (fi::FI_MR_LOCAL | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY | fi::FI_MR_VIRT_ADDR) as i32;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let d = unsafe { &*info.first().domain_attr };
    assert_eq!(d.threading, fi::FI_THREAD_DOMAIN);
    assert_eq!(d.get_data_progress(), fi::FI_PROGRESS_MANUAL);
    assert_eq!(d.av_type, fi::FI_AV_TABLE);
    assert_eq!(d.mr_mode & !(h.dom().mr_mode), 0, "output mr_mode is a subset of the request");
    for legacy in [fi::FI_MR_BASIC as i32, fi::FI_MR_SCALABLE as i32] {
        let mut h = Hints::rdm();
        h.dom().mr_mode = legacy;
        let info = getinfo(None, None, 0, Some(&h)).unwrap();
        // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
        assert_eq!(unsafe { (*info.first().domain_attr).mr_mode }, legacy);
    }
}

#[test]
fn auto_progress_is_offered_and_echoed() {
    let mut h = Hints::rdm();
    h.dom().set_data_progress(fi::FI_PROGRESS_AUTO);
    h.dom().control_progress = fi::FI_PROGRESS_AUTO;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    assert_eq!(unsafe { (*info.first().domain_attr).get_data_progress() }, fi::FI_PROGRESS_AUTO);
}

#[test]
fn sizes_and_order_beyond_ours_are_refused_and_smaller_ones_echoed() {
    let mut h = Hints::rdm();
    h.tx().inject_size = 1 << 20;
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
    let mut h = Hints::rdm();
    h.tx().msg_order = fi::FI_ORDER_SAS as u64;
    h.rx().msg_order = fi::FI_ORDER_SAS as u64;
    h.tx().op_flags = (fi::FI_COMPLETION | fi::FI_DELIVERY_COMPLETE) as u64;
    h.tx().inject_size = 64;
    let info = getinfo(None, None, 0, Some(&h)).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let tx = unsafe { &*info.first().tx_attr };
    assert_ne!(tx.msg_order & fi::FI_ORDER_SAS as u64, 0);
    assert_eq!(tx.op_flags, (fi::FI_COMPLETION | fi::FI_DELIVERY_COMPLETE) as u64);
    assert_eq!(tx.inject_size, 64);
    let mut h = Hints::rdm();
    h.ep().tx_ctx_cnt = usize::MAX; // FI_SHARED_CONTEXT
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
}

#[test]
fn fi_source_needs_node_or_service_and_sets_src_addr() {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    // rdmx answers -FI_EINVAL; libfabric's core turns a failing provider into
    // "no data" for the application.
    assert!(getinfo(None, None, fi::FI_SOURCE, Some(&h)).is_err());
    let info = getinfo(Some("127.0.0.1"), Some("45111"), fi::FI_SOURCE, Some(&h)).unwrap();
    let i = info.first();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let a = unsafe { std::slice::from_raw_parts(i.src_addr as *const u8, i.src_addrlen) };
    assert_eq!(&a[6..8], &45111u16.to_be_bytes(), "port in the address");
    assert_eq!(&a[8..12], &[127, 0, 0, 1]);
    // Without FI_SOURCE, node/service name the destination.
    let info = getinfo(Some("127.0.0.1"), Some("45112"), 0, Some(&h)).unwrap();
    assert!(!info.first().dest_addr.is_null());
}

#[test]
fn unresolvable_node_is_enodata() {
    assert_eq!(getinfo(Some("g00n13s.invalid"), Some("1"), 0, None).err(), Some(neg(fi::FI_ENODATA)));
}

#[test]
fn returned_info_works_as_hints_again() {
    let info = getinfo(None, None, 0, None).unwrap();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let again = unsafe { fi::fi_dupinfo(info.0) };
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    unsafe {
        (*again).mode = fi::FI_CONTEXT;
        (*(*again).domain_attr).mr_mode =
            (fi::FI_MR_LOCAL | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY | fi::FI_MR_VIRT_ADDR) as i32;
        (*again).next = std::ptr::null_mut();
    }
    let h = Hints(again);
    assert!(getinfo(None, None, 0, Some(&h)).is_ok());
}

/// fi_getinfo(3): the RMA ordering sizes are reported (rdmx orders RMA and
/// atomics of any size up to max_msg_size per peer), a hint up to them is met,
/// and a hint beyond them is refused.
#[test]
fn rma_ordering_sizes_are_reported_and_matched() {
    let info = getinfo(None, None, 0, None).unwrap();
    // SAFETY: fields of an fi_info that fi_getinfo returned and this test still owns.
    let ep = unsafe { &*info.first().ep_attr };
    assert!(
        ep.max_order_raw_size > 0 && ep.max_order_war_size > 0 && ep.max_order_waw_size > 0,
        "ordering sizes not reported"
    );
    assert_eq!(ep.max_order_raw_size, ep.max_msg_size);
    let mut h = Hints::rdm();
    h.ep().max_order_raw_size = 4096;
    h.ep().max_order_waw_size = 1 << 20;
    let got = getinfo(None, None, 0, Some(&h)).expect("hint within the sizes");
    // SAFETY: as above.
    assert!(unsafe { (*got.first().ep_attr).max_order_raw_size } >= 4096);
    let mut h = Hints::rdm();
    h.ep().max_order_war_size = usize::MAX;
    assert_eq!(getinfo(None, None, 0, Some(&h)).err(), Some(neg(fi::FI_ENODATA)));
}

/// The README's Features table and docs/design.md state the RDM
/// `max_msg_size` ("`max_msg_size` = 1 GiB"): it is what fi_getinfo answers
/// on every domain.
#[test]
fn the_readmes_max_msg_size_is_what_getinfo_answers() {
    let info = getinfo(None, None, 0, Some(&Hints::rdm())).expect("fi_getinfo");
    let sizes: std::collections::BTreeSet<usize> = info
        .iter()
        .map(|i| {
            // SAFETY: an fi_info this test owns.
            unsafe { (*i.ep_attr).max_msg_size }
        })
        .collect();
    assert_eq!(sizes.len(), 1, "every RDM entry offers the same max_msg_size: {sizes:?}");
    let size = *sizes.first().unwrap();
    assert_eq!(size % (1 << 30), 0, "{size} is a whole number of GiB");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let want = format!("`max_msg_size` = {} GiB", size >> 30);
    assert!(readme.contains(&want), "README.md should say {want:?}");
    let design = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/design.md")).unwrap();
    assert!(design.contains(&format!("up to {want}")), "docs/design.md should say \"up to {want}\"");
}

/// The README's Features table states the limits fi_getinfo answers:
/// `rma_iov_limit` = 1 and `max_ep_tx_ctx = max_ep_rx_ctx = 1` (read from
/// every RDM entry that offers RMA), and job keys of at most 8 bytes (`auth_key` ≤ 8 bytes:
/// an `auth_key` of that size is accepted in the hints, one byte more is not).
#[test]
fn the_readmes_limits_are_what_getinfo_answers() {
    let mut rma = Hints::rdm();
    rma.get().caps |= fi::FI_RMA as u64;
    let info = getinfo(None, None, 0, Some(&rma)).expect("fi_getinfo");
    let one = |what: &str, values: std::collections::BTreeSet<usize>| {
        assert_eq!(values.len(), 1, "every RDM entry offers the same {what}: {values:?}");
        *values.first().unwrap()
    };
    let rma_iov = one(
        "rma_iov_limit",
        info.iter()
            .map(|i| {
                // SAFETY: an fi_info this test owns, with its attributes.
                unsafe { (*i.tx_attr).rma_iov_limit }
            })
            .collect(),
    );
    let (tx_ctx, rx_ctx) = (
        one(
            "max_ep_tx_ctx",
            info.iter()
                .map(|i| {
                    // SAFETY: as above.
                    unsafe { (*i.domain_attr).max_ep_tx_ctx }
                })
                .collect(),
        ),
        one(
            "max_ep_rx_ctx",
            info.iter()
                .map(|i| {
                    // SAFETY: as above.
                    unsafe { (*i.domain_attr).max_ep_rx_ctx }
                })
                .collect(),
        ),
    );
    assert_eq!(tx_ctx, rx_ctx);
    let longest_key =
        (1..=64usize).take_while(|&n| getinfo(None, None, 0, Some(&with_auth_key(n))).is_ok()).last().unwrap_or(0);
    assert!(longest_key >= 1, "a job key of one byte is taken");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    for want in [
        format!("`rma_iov_limit` = {rma_iov}"),
        format!("`max_ep_tx_ctx = max_ep_rx_ctx = {tx_ctx}`"),
        format!("`auth_key` ≤ {longest_key} bytes"),
    ] {
        assert!(readme.contains(&want), "README.md should say {want:?}");
    }
}

/// RDM hints asking for an `auth_key` of `n` bytes (allocated with malloc:
/// fi_freeinfo frees it with the hints).
fn with_auth_key(n: usize) -> Hints {
    let mut h = Hints::rdm();
    // SAFETY: a fresh allocation of n bytes, filled before use; the hints own
    // it from here on (fi_freeinfo frees ep_attr->auth_key).
    unsafe {
        let key = libc::malloc(n) as *mut u8;
        assert!(!key.is_null());
        std::ptr::write_bytes(key, 7, n);
        h.ep().auth_key = key;
    }
    h.ep().auth_key_size = n;
    h
}
