//! The rules that depend on the API version an application asks for
//! (libfabric 1.20, 1.21 and 2.0 additions), through the public API.
//!
//! rdmx follows the version the application requested, not the newest one it
//! declares: `fi_getinfo`'s `version`, and after `fi_fabric` the fabric's
//! `api_version` (libfabric sets it to the requested version). The tests
//! below that need a newer libfabric than the one running (`fi_version()`)
//! print a note and pass; `scripts/test-libfabric2.sh` runs this file under
//! libfabric 2.1, where they all run. Fields that 1.17's headers lack are
//! read and written by byte offset (the offsets are the 2.x headers'), so
//! this file builds against either.
use fi_tests::*;
use std::ptr::null_mut;

const fn v(major: u32, minor: u32) -> u32 {
    fi::fi_version_num(major, minor)
}

/// 2.0's capability bits (fabric.h), by value: 1.17's bindings lack them,
/// and in 1.x bit 48 was `FI_VARIABLE_MSG`, bits 45 and 46 MR flags.
const TAGGED_DIRECTED_RECV: u64 = 1 << 45;
const TAGGED_MULTI_RECV: u64 = 1 << 46;
const EXACT_DIRECTED_RECV: u64 = 1 << 48;
/// `FI_PROGRESS_CONTROL_UNIFIED` (1.21).
const PROGRESS_CONTROL_UNIFIED: fi::fi_progress = 3;
/// `fi_domain_attr.max_ep_auth_key` (size_t, 1.20) and `max_group_id`
/// (uint32_t, 2.0); `fi_mr_attr.base_mr` (2.0); `fi_cq_err_entry.src_addr` (1.20).
const DOMAIN_MAX_EP_AUTH_KEY: usize = 192;
const DOMAIN_MAX_GROUP_ID: usize = 200;
const MR_ATTR_BASE_MR: usize = 96;
const CQ_ERR_SRC_ADDR: usize = 80;
/// fi_endpoint(3) options newer than 1.17's headers.
const OPT_CUDA_API_PERMITTED: i32 = 10;
const OPT_SHARED_MEMORY_PERMITTED: i32 = 11;

/// The running libfabric's API version.
fn running() -> u32 {
    running_fi_version()
}

/// The API version of the headers this file was built against: an
/// application asking for version V has V's struct sizes, so a request newer
/// than the headers would hand rdmx structs too short for it.
const BUILT: u32 = v(fi::FI_MAJOR_VERSION, fi::FI_MINOR_VERSION);

/// Whether the running libfabric and the headers are at least `want`; if
/// not, says which check did not run (not a failure: such a build cannot ask
/// for it).
fn runs_on(want: u32, what: &str) -> bool {
    init();
    // Under CI a stage names the library it loads, so a check left out here
    // is one that library cannot run, never one a wrong library skipped.
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        assert!(
            expected_fi_version().is_some(),
            "CI=true: set RDMX_EXPECT_FI_VERSION to the libfabric this stage loads"
        );
    }
    check_expected_libfabric();
    let have = running().min(BUILT);
    if have < want {
        eprintln!(
            "note: {what}: needs libfabric >= {}.{} (running {}.{}, headers {}.{}); not checked here (scripts/test-libfabric2.sh runs it on 2.1)",
            want >> 16,
            want & 0xffff,
            running() >> 16,
            running() & 0xffff,
            BUILT >> 16,
            BUILT & 0xffff
        );
    }
    have >= want
}

/// fi_getinfo at API `version`; Err(negative errno).
fn getinfo_at(version: u32, hints: &Hints) -> Result<Info, i32> {
    init();
    let mut out: *mut fi::fi_info = null_mut();
    // SAFETY: the hints outlive the call; `out` is written by it.
    let ret = unsafe { fi::fi_getinfo(version, std::ptr::null(), std::ptr::null(), 0, hints.0, &mut out) };
    if ret != 0 {
        return Err(ret);
    }
    Ok(Info(out))
}

/// Plain RDM hints (msg and tagged) on the udp domain: one entry, no device
/// besides a UDP socket.
fn rdm_hints(extra_caps: u64) -> Hints {
    let mut h = Hints::rdm();
    h.set_domain_name("udp");
    h.get().caps |= extra_caps;
    h
}

/// Writes a `T` at byte `offset` of the hints' domain attr (allocated by the
/// running library, at its full size).
fn set_dom_raw<T: Copy>(h: &mut Hints, offset: usize, v: T) {
    // SAFETY: the domain attr of fi_dupinfo's hints is the running library's
    // whole struct; callers only name fields of versions it has.
    unsafe { std::ptr::write_unaligned(((*h.0).domain_attr as *mut u8).add(offset) as *mut T, v) };
}

/// Reads a `T` at byte `offset` of an answer's domain attr.
fn dom_raw<T: Copy>(i: &fi::fi_info, offset: usize) -> T {
    // SAFETY: as set_dom_raw, for an fi_info fi_getinfo returned.
    unsafe { std::ptr::read_unaligned((i.domain_attr as *const u8).add(offset) as *const T) }
}

/// Posts an untagged receive with no source on `s` (a non-directed
/// endpoint), cancels it, and reads its error entry into a 96-byte buffer
/// whose bytes past the 1.17 entry hold a pattern: the buffer's words, and
/// the 1.17 part as an entry.
fn cancelled_error_entry(s: &Stack) -> ([u64; 12], fi::fi_cq_err_entry) {
    let mut buf = [0u8; 8];
    let mut rctx = 7u64;
    let ctx = &mut rctx as *mut u64 as *mut libc::c_void;
    // SAFETY: objects this test opened; the buffer and context outlive the receive (cancelled below).
    unsafe {
        assert_eq!(fi::fi_recv(s.ep, buf.as_mut_ptr() as *mut _, buf.len(), null_mut(), FI_ADDR_UNSPEC, ctx), 0);
        assert_eq!(fi::fi_cancel(&mut (*s.ep).fid, ctx), 0);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: the CQ is open with the tagged format; `e` is one entry.
        let n = unsafe { fi::fi_cq_read(s.cq, &mut e as *mut _ as *mut _, 1) };
        if n == -(fi::FI_EAVAIL as isize) {
            break;
        }
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
        assert!(std::time::Instant::now() < deadline, "no error entry for the cancelled receive");
    }
    // The 1.17 part zeroed (err_data NULL, err_data_size 0), the rest a pattern.
    let mut raw = [0u64; 12];
    raw[CQ_ERR_SRC_ADDR / 8..].fill(0x5a5a_5a5a_5a5a_5a5a);
    // Through the provider's op, not fi_cq_readerr: 1.20+ headers' inline
    // wrapper stores FI_ADDR_NOTAVAIL in src_addr itself before calling it,
    // which would hide what rdmx writes.
    // SAFETY: the stack's open CQ, whose ops table has readerr; `raw` (96
    // bytes) is at least as long as any version's entry.
    let r =
        unsafe { ((*(*s.cq).ops).readerr.expect("readerr"))(s.cq, raw.as_mut_ptr() as *mut fi::fi_cq_err_entry, 0) };
    assert_eq!(r, 1);
    let mut e = fi::fi_cq_err_entry::default();
    // SAFETY: the 1.17 part of the entry rdmx just wrote, into an entry at
    // least that long.
    unsafe { std::ptr::copy_nonoverlapping(raw.as_ptr() as *const u8, &mut e as *mut _ as *mut u8, CQ_ERR_SRC_ADDR) };
    assert_eq!(e.err, fi::FI_ECANCELED as i32);
    (raw, e)
}

// ---- on every libfabric (1.17 on) ----

#[test]
fn caps_of_2_0_are_refused_in_a_1_x_request() {
    for bit in [TAGGED_DIRECTED_RECV, TAGGED_MULTI_RECV, EXACT_DIRECTED_RECV] {
        let h = rdm_hints(bit);
        assert_eq!(getinfo_at(v(1, 17), &h).err(), Some(neg(fi::FI_ENODATA)), "caps bit {bit:#x} at 1.17");
        let mut h = rdm_hints(0);
        h.rx().caps = fi::FI_TAGGED as u64 | bit;
        assert_eq!(getinfo_at(v(1, 17), &h).err(), Some(neg(fi::FI_ENODATA)), "rx caps bit {bit:#x} at 1.17");
    }
    // Without them the same request is answered.
    assert!(getinfo_at(v(1, 17), &rdm_hints(fi::FI_DIRECTED_RECV)).is_ok());
}

#[test]
fn unknown_threading_models_are_refused() {
    let mut h = rdm_hints(0);
    h.dom().threading = 99;
    assert_eq!(getinfo_at(v(1, 17), &h).err(), Some(neg(fi::FI_ENODATA)));
    h.dom().threading = fi::FI_THREAD_DOMAIN;
    let info = getinfo_at(v(1, 17), &h).expect("FI_THREAD_DOMAIN");
    // SAFETY: an answer's domain attr.
    assert_eq!(unsafe { (*info.first().domain_attr).threading }, fi::FI_THREAD_DOMAIN);
}

#[test]
fn control_unified_progress_is_refused_before_1_21() {
    for field in ["control", "data"] {
        let mut h = rdm_hints(0);
        if field == "control" {
            h.dom().control_progress = PROGRESS_CONTROL_UNIFIED;
        } else {
            h.dom().set_data_progress(PROGRESS_CONTROL_UNIFIED);
        }
        assert_eq!(getinfo_at(v(1, 17), &h).err(), Some(neg(fi::FI_ENODATA)), "{field}_progress at 1.17");
    }
}

#[test]
fn mem_tag_formats_below_2_0_are_bit_fields_and_echoed() {
    for f in [1u64, 7, 0x30ff] {
        let mut h = rdm_hints(0);
        h.ep().mem_tag_format = f;
        let info = getinfo_at(v(1, 17), &h).expect("a 1.x bit-field format");
        // SAFETY: an answer's ep attr.
        assert_eq!(unsafe { (*info.first().ep_attr).mem_tag_format }, f);
    }
}

#[test]
fn av_open_flags_rdmx_does_not_implement_are_refused() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    // Defined by fi_av(3), not implemented: -FI_ENOSYS. Not defined: -FI_EINVAL.
    for (flags, want) in [
        (fi::FI_AV_USER_ID, fi::FI_ENOSYS),
        (fi::FI_EVENT as u64, fi::FI_ENOSYS),
        (fi::FI_SYMMETRIC, fi::FI_ENOSYS),
        (1 << 1, fi::FI_EINVAL),
        (fi::FI_AV_USER_ID | 1 << 1, fi::FI_EINVAL),
    ] {
        let mut attr = fi::fi_av_attr { type_: fi::FI_AV_TABLE, flags, ..Default::default() };
        let mut av = null_mut();
        // SAFETY: the stack's open domain; `attr` and `av` outlive the call.
        let r = unsafe { fi::fi_av_open(s.domain, &mut attr, &mut av, null_mut()) };
        assert_eq!(r, neg(want), "flags {flags:#x}");
        assert!(av.is_null());
    }
}

#[test]
fn av_remove_with_flags_is_ebadflags() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let mut fa = s.insert(&s.name());
    // Any flag but FI_AUTH_KEY (1 << 57), which names authorization-key
    // fi_addr_t's: an address's is not one.
    // SAFETY: the stack's AV; `fa` is one fi_addr.
    unsafe {
        assert_eq!(fi::fi_av_remove(s.av, &mut fa, 1, 1 << 3), neg(fi::FI_EBADFLAGS));
        assert_eq!(fi::fi_av_remove(s.av, &mut fa, 1, 1 << 57), neg(fi::FI_EINVAL));
        assert_eq!(fi::fi_av_remove(s.av, &mut fa, 1, 0), 0);
    }
}

#[test]
fn cuda_and_shared_memory_options_are_not_rdmx_options() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let permitted = false;
    for opt in [OPT_CUDA_API_PERMITTED, OPT_SHARED_MEMORY_PERMITTED] {
        // SAFETY: the stack's endpoint; the bool outlives the call.
        let r = unsafe {
            fi::fi_setopt(&mut (*s.ep).fid, fi::FI_OPT_ENDPOINT as i32, opt, &permitted as *const bool as *const _, 1)
        };
        assert_eq!(r, neg(fi::FI_ENOPROTOOPT), "option {opt}");
    }
}

/// The fabric carries the requested version, and rdmx follows it rather
/// than the newer one it declares: a 1.17 application's error entry is 80
/// bytes and nothing past them is written, whichever libfabric runs.
#[test]
fn a_1_17_application_gets_a_1_17_cq_error_entry() {
    let info = getinfo_at(v(1, 17), &rdm_hints(0)).expect("1.17 request");
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    // SAFETY: the stack's open fabric.
    assert_eq!(unsafe { (*s.fabric).api_version }, v(1, 17), "fi_fabric stamps the requested version");
    let (raw, e) = cancelled_error_entry(&s);
    assert_eq!(raw[CQ_ERR_SRC_ADDR / 8..], [0x5a5a_5a5a_5a5a_5a5au64; 2], "bytes past a 1.17 entry were written");
    assert_ne!(e.flags & fi::FI_RECV as u64, 0);
}

// ---- on libfabric 1.20 / 1.21 and newer ----

#[test]
fn cq_error_entries_carry_src_addr_from_1_20() {
    if !runs_on(v(1, 20), "fi_cq_err_entry.src_addr") {
        return;
    }
    let info = getinfo_at(v(1, 20), &rdm_hints(0)).expect("1.20 request");
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    let (raw, _) = cancelled_error_entry(&s);
    assert_eq!(raw[CQ_ERR_SRC_ADDR / 8], FI_ADDR_NOTAVAIL, "src_addr of a 1.20 entry");
    assert_eq!(raw[CQ_ERR_SRC_ADDR / 8 + 1], 0x5a5a_5a5a_5a5a_5a5a, "nothing past it");
}

/// Jobs an RDM endpoint serves at most where jobs are told apart in
/// software (udp, shm): rdmx's `JOBS_MAX`.
const MAX_EP_AUTH_KEY: usize = 16;

#[test]
fn several_auth_keys_per_rdm_endpoint_from_1_20() {
    if !runs_on(v(1, 20), "fi_domain_attr.max_ep_auth_key") {
        return;
    }
    let info = getinfo_at(v(1, 20), &rdm_hints(0)).expect("1.20 request");
    assert_eq!(dom_raw::<usize>(info.first(), DOMAIN_MAX_EP_AUTH_KEY), MAX_EP_AUTH_KEY);
    let mut h = rdm_hints(0);
    set_dom_raw(&mut h, DOMAIN_MAX_EP_AUTH_KEY, MAX_EP_AUTH_KEY + 1);
    assert_eq!(getinfo_at(v(1, 20), &h).err(), Some(neg(fi::FI_ENODATA)));
    set_dom_raw(&mut h, DOMAIN_MAX_EP_AUTH_KEY, MAX_EP_AUTH_KEY);
    assert!(getinfo_at(v(1, 20), &h).is_ok());
    // Datagram endpoints serve one job.
    let mut h = Hints::dgram(Some("udp"));
    let info = getinfo_at(v(1, 20), &h).expect("1.20 DGRAM request");
    assert_eq!(dom_raw::<usize>(info.first(), DOMAIN_MAX_EP_AUTH_KEY), 1);
    set_dom_raw(&mut h, DOMAIN_MAX_EP_AUTH_KEY, 2usize);
    assert_eq!(getinfo_at(v(1, 20), &h).err(), Some(neg(fi::FI_ENODATA)));
    // A 1.17 request has no such field: rdmx neither reads nor writes it.
    let mut h = rdm_hints(0);
    set_dom_raw(&mut h, DOMAIN_MAX_EP_AUTH_KEY, MAX_EP_AUTH_KEY + 1);
    let info = getinfo_at(v(1, 17), &h).expect("1.17 request ignores the field");
    assert_eq!(dom_raw::<usize>(info.first(), DOMAIN_MAX_EP_AUTH_KEY), 0);
}

#[test]
fn control_unified_progress_from_1_21() {
    if !runs_on(v(1, 21), "FI_PROGRESS_CONTROL_UNIFIED") {
        return;
    }
    for field in ["control", "data"] {
        let mut h = rdm_hints(0);
        if field == "control" {
            h.dom().control_progress = PROGRESS_CONTROL_UNIFIED;
        } else {
            h.dom().set_data_progress(PROGRESS_CONTROL_UNIFIED);
        }
        let info = getinfo_at(v(1, 21), &h).unwrap_or_else(|e| panic!("{field}_progress unified: {e}"));
        // SAFETY: an answer's domain attr.
        let d = unsafe { &*info.first().domain_attr };
        assert_eq!(
            (d.control_progress, d.get_data_progress()),
            (PROGRESS_CONTROL_UNIFIED, PROGRESS_CONTROL_UNIFIED),
            "{field}"
        );
        // The answer works as hints again, and opens a domain and endpoint.
        drop(Stack::open_with(info, fi::FI_AV_TABLE, 0));
    }
    // Unified implies manual progress: never beside automatic.
    let mut h = rdm_hints(0);
    h.dom().control_progress = fi::FI_PROGRESS_AUTO;
    h.dom().set_data_progress(PROGRESS_CONTROL_UNIFIED);
    assert_eq!(getinfo_at(v(1, 21), &h).err(), Some(neg(fi::FI_ENODATA)));
}

// ---- on libfabric 2.0 and newer ----

#[test]
fn directed_recv_caps_of_2_0_are_offered_when_asked() {
    if !runs_on(v(2, 0), "FI_TAGGED_DIRECTED_RECV / FI_EXACT_DIRECTED_RECV") {
        return;
    }
    let info = getinfo_at(v(2, 0), &rdm_hints(TAGGED_DIRECTED_RECV)).expect("FI_TAGGED_DIRECTED_RECV");
    let i = info.first();
    assert_ne!(i.caps & TAGGED_DIRECTED_RECV, 0);
    assert_eq!(i.caps & EXACT_DIRECTED_RECV, 0);
    // SAFETY: an answer's rx attr.
    assert_ne!(unsafe { (*i.rx_attr).caps } & TAGGED_DIRECTED_RECV, 0);
    // Not asked, not reported (they change what a receive does).
    let info = getinfo_at(v(2, 0), &rdm_hints(0)).expect("plain request");
    assert_eq!(info.first().caps & (TAGGED_DIRECTED_RECV | EXACT_DIRECTED_RECV), 0);
    // DGRAM endpoints take them too.
    let mut h = Hints::dgram(Some("udp"));
    h.get().caps |= EXACT_DIRECTED_RECV;
    let info = getinfo_at(v(2, 0), &h).expect("DGRAM with FI_EXACT_DIRECTED_RECV");
    assert_ne!(info.first().caps & EXACT_DIRECTED_RECV, 0);
    // Tagged multi-receive is not offered at any version.
    assert_eq!(getinfo_at(v(2, 0), &rdm_hints(TAGGED_MULTI_RECV)).err(), Some(neg(fi::FI_ENODATA)));
}

#[test]
fn exact_directed_recv_refuses_receives_from_any_source() {
    if !runs_on(v(2, 0), "FI_EXACT_DIRECTED_RECV") {
        return;
    }
    let info = getinfo_at(v(2, 0), &rdm_hints(EXACT_DIRECTED_RECV)).expect("FI_EXACT_DIRECTED_RECV");
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    let me = s.insert(&s.name());
    let mut buf = [0u8; 8];
    let mut rctx = 1u64;
    let ctx = &mut rctx as *mut u64 as *mut libc::c_void;
    // SAFETY: the stack's endpoint; the buffer and context outlive the
    // receives (the one posted is cancelled before they go).
    unsafe {
        assert_eq!(
            fi::fi_recv(s.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, ctx),
            neg(fi::FI_EINVAL) as isize
        );
        assert_eq!(
            fi::fi_trecv(s.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), FI_ADDR_UNSPEC, 5, 0, ctx),
            neg(fi::FI_EINVAL) as isize
        );
        assert_eq!(fi::fi_trecv(s.ep, buf.as_mut_ptr() as *mut _, 8, null_mut(), me, 5, 0, ctx), 0);
        assert_eq!(fi::fi_cancel(&mut (*s.ep).fid, ctx), 0);
    }
    let err = s.wait_cq(&[]).unwrap_err();
    assert_eq!(err.err, fi::FI_ECANCELED as i32);
}

#[test]
fn mem_tag_formats_of_2_0() {
    if !runs_on(v(2, 0), "FI_TAG_MPI / FI_TAG_CCL") {
        return;
    }
    for f in [1u64, 2, 1 << 16, 0x0000_ffff_ffff_ffff] {
        let mut h = rdm_hints(0);
        h.ep().mem_tag_format = f;
        let info = getinfo_at(v(2, 0), &h).unwrap_or_else(|e| panic!("mem_tag_format {f:#x}: {e}"));
        // SAFETY: an answer's ep attr.
        assert_eq!(unsafe { (*info.first().ep_attr).mem_tag_format }, f);
    }
    for f in [3u64, 0x30ff, 0xffff] {
        let mut h = rdm_hints(0);
        h.ep().mem_tag_format = f;
        assert_eq!(getinfo_at(v(2, 0), &h).err(), Some(neg(fi::FI_ENODATA)), "mem_tag_format {f:#x}");
    }
}

#[test]
fn peer_groups_are_not_offered() {
    if !runs_on(v(2, 0), "fi_domain_attr.max_group_id") {
        return;
    }
    let mut h = rdm_hints(0);
    set_dom_raw(&mut h, DOMAIN_MAX_GROUP_ID, 1u32);
    assert_eq!(getinfo_at(v(2, 0), &h).err(), Some(neg(fi::FI_ENODATA)));
    set_dom_raw(&mut h, DOMAIN_MAX_GROUP_ID, 0u32);
    let info = getinfo_at(v(2, 0), &h).expect("max_group_id 0");
    assert_eq!(dom_raw::<u32>(info.first(), DOMAIN_MAX_GROUP_ID), 0);
}

#[test]
fn sub_mrs_are_not_offered() {
    if !runs_on(v(2, 0), "fi_mr_attr.base_mr") {
        return;
    }
    let info = getinfo_at(v(2, 0), &rdm_hints(fi::FI_RMA as u64)).expect("2.0 request");
    let s = Stack::open_with(info, fi::FI_AV_TABLE, 0);
    let mut mem = vec![0u8; 4096];
    let mut base = null_mut();
    // SAFETY: the stack's domain; `mem` outlives the registration (closed below).
    unsafe {
        assert_eq!(
            fi::fi_mr_reg(
                s.domain,
                mem.as_mut_ptr() as *const _,
                mem.len(),
                fi::FI_REMOTE_READ as u64,
                0,
                1,
                0,
                &mut base,
                null_mut()
            ),
            0
        )
    };
    let iov = libc::iovec { iov_base: mem.as_mut_ptr() as *mut _, iov_len: 64 };
    // A 2.x fi_mr_attr (112 bytes) built by offset: mr_iov at 0, then the
    // 1.17 fields the bindings name, then base_mr.
    let mut raw = [0u64; 14];
    raw[0] = &iov as *const libc::iovec as u64;
    raw[std::mem::offset_of!(fi::fi_mr_attr, iov_count) / 8] = 1;
    raw[std::mem::offset_of!(fi::fi_mr_attr, access) / 8] = fi::FI_REMOTE_READ as u64;
    raw[std::mem::offset_of!(fi::fi_mr_attr, requested_key) / 8] = 2;
    raw[MR_ATTR_BASE_MR / 8] = base as u64;
    let words = raw.as_mut_ptr();
    let attr = words as *const fi::fi_mr_attr;
    let mut sub = null_mut();
    // SAFETY: the stack's domain; `raw` is a whole 2.x attr whose iov and
    // base MR are alive, written only through `words` from here on.
    unsafe {
        assert_eq!(fi::fi_mr_regattr(s.domain, attr, 0, &mut sub), neg(fi::FI_EOPNOTSUPP));
        assert!(sub.is_null());
        // Without base_mr the same attr registers.
        words.add(MR_ATTR_BASE_MR / 8).write(0);
        assert_eq!(fi::fi_mr_regattr(s.domain, attr, 0, &mut sub), 0);
        assert_eq!(fi::fi_close(&mut (*sub).fid), 0);
        assert_eq!(fi::fi_close(&mut (*base).fid), 0);
    }
}

// ---- FI_GETWAITOBJ (fi_cq(3), documented from 2.4; the command exists in 1.17's headers) ----

/// `fi_control(FI_GETWAITOBJ)` on a CQ: `FI_WAIT_FD` where `FI_GETWAIT`
/// hands out an fd (an `FI_WAIT_FD` CQ and a wait set's member),
/// `FI_WAIT_YIELD` for `FI_WAIT_YIELD` and `FI_WAIT_UNSPEC` (no fd: waiting
/// is `fi_cq_sread`'s), `-FI_ENODATA` without a wait object.
#[test]
fn getwaitobj_names_the_cq_wait_object() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let mut set = null_mut();
    let mut wa = fi::fi_wait_attr { wait_obj: fi::FI_WAIT_FD, flags: 0 };
    // SAFETY: the stack's open fabric; `wa` and `set` outlive the call.
    assert_eq!(unsafe { fi::fi_wait_open(s.fabric, &mut wa, &mut set) }, 0);
    const NONE: i32 = -1;
    for (asked, want) in [
        (fi::FI_WAIT_NONE, NONE),
        (fi::FI_WAIT_UNSPEC, fi::FI_WAIT_YIELD as i32),
        (fi::FI_WAIT_YIELD, fi::FI_WAIT_YIELD as i32),
        (fi::FI_WAIT_FD, fi::FI_WAIT_FD as i32),
        (fi::FI_WAIT_SET, fi::FI_WAIT_FD as i32),
    ] {
        let wait_set = if asked == fi::FI_WAIT_SET { set } else { null_mut() };
        let mut attr = fi::fi_cq_attr {
            format: fi::FI_CQ_FORMAT_CONTEXT,
            size: 16,
            wait_obj: asked,
            wait_set,
            ..Default::default()
        };
        let mut cq = null_mut();
        // SAFETY: the stack's open domain; `attr` and `cq` outlive the call.
        assert_eq!(unsafe { fi::fi_cq_open(s.domain, &mut attr, &mut cq, null_mut()) }, 0, "wait_obj {asked}");
        let mut obj: fi::fi_wait_obj = 0x7777;
        let mut fd: libc::c_int = -1;
        // SAFETY: the CQ just opened; FI_GETWAITOBJ takes an enum fi_wait_obj *,
        // FI_GETWAIT (for an fd) an int *; both outlive the calls.
        let (r, rfd) = unsafe {
            (
                fi::fi_control(&mut (*cq).fid, fi::FI_GETWAITOBJ as i32, &mut obj as *mut _ as *mut _),
                fi::fi_control(&mut (*cq).fid, fi::FI_GETWAIT as i32, &mut fd as *mut _ as *mut _),
            )
        };
        if want == NONE {
            assert_eq!((r, obj), (neg(fi::FI_ENODATA), 0x7777), "wait_obj {asked}: no wait object, nothing written");
        } else {
            assert_eq!((r, obj as i32), (0, want), "wait_obj {asked}");
        }
        // FI_GETWAIT agrees: an fd exactly where FI_GETWAITOBJ says FI_WAIT_FD.
        if want == fi::FI_WAIT_FD as i32 {
            assert_eq!(rfd, 0, "wait_obj {asked}: FI_GETWAIT");
            assert!(fd >= 0, "wait_obj {asked}: fd {fd}");
        } else {
            assert_eq!(rfd, neg(fi::FI_ENODATA), "wait_obj {asked}: FI_GETWAIT without an fd");
        }
        if want != NONE {
            // A NULL argument is refused, not written through.
            assert_eq!(
                // SAFETY: as above; rdmx checks the argument before writing.
                unsafe { fi::fi_control(&mut (*cq).fid, fi::FI_GETWAITOBJ as i32, null_mut()) },
                neg(fi::FI_EINVAL),
                "wait_obj {asked}: NULL"
            );
        }
        // SAFETY: the CQ opened above, closed once (before its wait set).
        assert_eq!(unsafe { fi::fi_close(&mut (*cq).fid) }, 0);
    }
    // SAFETY: the wait set opened above, its members closed.
    assert_eq!(unsafe { fi::fi_close(&mut (*set).fid) }, 0);
}

// ---- on libfabric 2.5 and newer ----

/// Whether the running libfabric is at least `want`, whatever the headers:
/// for checks whose structs are all the library's (fi_getinfo's answers,
/// fi_dupinfo's hints) or read by offset into buffers long enough for any
/// version, so that a build against older headers checks them under a newer
/// library (the PyPI MPI wheels' libfabric 2.5, through `LD_LIBRARY_PATH`).
fn library_runs_on(want: u32, what: &str) -> bool {
    let have = running();
    if have < want {
        eprintln!(
            "note: {what}: needs libfabric >= {}.{} (running {}.{}); not checked here",
            want >> 16,
            want & 0xffff,
            have >> 16,
            have & 0xffff
        );
    }
    have >= want
}

/// fabric, domain, AV, CQ (tagged format), an EQ and an enabled endpoint
/// from `info` (as `Stack::open_with_eq`, at the version `info` was asked at).
fn stack_with_eq(info: Info) -> Stack {
    // SAFETY: libfabric calls on objects opened here in order, each from the
    // one before; every attr and out-pointer outlives its call; the Stack
    // closes them all once.
    unsafe {
        let mut fabric = null_mut();
        assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
        let mut domain = null_mut();
        assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
        let mut av_attr = fi::fi_av_attr { type_: fi::FI_AV_MAP, ..Default::default() };
        let mut av = null_mut();
        assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
        let mut cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, size: 128, ..Default::default() };
        let mut cq = null_mut();
        assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
        let mut ep = null_mut();
        assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64), 0);
        let mut eq_attr = fi::fi_eq_attr { size: 16, wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
        let mut eq = null_mut();
        assert_eq!(fi::fi_eq_open(fabric, &mut eq_attr, &mut eq, null_mut()), 0);
        assert_eq!(fi::fi_ep_bind(ep, &mut (*eq).fid, 0), 0);
        assert_eq!(fi::fi_enable(ep), 0);
        Stack { info, fabric, domain, av, cq, ep, eq }
    }
}

/// The AV address of an endpoint that was opened and closed again: its UDP
/// port is closed, the kernel answers with ICMP port unreachable.
fn dead_peer(s: &Stack) -> u64 {
    let gone = Stack::open(Some("udp"), fi::FI_AV_MAP);
    s.insert(&gone.name())
}

/// One EQ error of the endpoint's if one is queued (its `err`).
fn eq_error(s: &Stack) -> Option<i32> {
    let mut ev = 0u32;
    let mut buf = [0u8; 64];
    // SAFETY: the stack's EQ; `ev` and `buf` outlive the call.
    let r = unsafe { fi::fi_eq_read(s.eq, &mut ev, buf.as_mut_ptr() as *mut _, buf.len(), 0) };
    if r != -(fi::FI_EAVAIL as isize) {
        assert_eq!(r, -(fi::FI_EAGAIN as isize), "fi_eq_read");
        return None;
    }
    let mut err = fi::fi_eq_err_entry::default();
    // SAFETY: as above, one error entry into `err`.
    assert_eq!(unsafe { fi::fi_eq_readerr(s.eq, &mut err, 0) }, 1);
    // SAFETY: the stack's endpoint, open.
    assert_eq!(err.fid, unsafe { &mut (*s.ep).fid } as *mut fi::fid, "the error names the endpoint");
    Some(err.err)
}

/// Reads the CQ's next error entry through the provider's readerr op into
/// 96 bytes (long enough for every version's entry, whatever the headers):
/// its words, or `None` if none came within `limit` (and no entry at all).
fn cq_error_words(s: &Stack, limit: std::time::Duration) -> Option<[u64; 12]> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: the stack's CQ, tagged format; `e` is one entry.
        let n = unsafe { fi::fi_cq_read(s.cq, &mut e as *mut _ as *mut _, 1) };
        if n == -(fi::FI_EAVAIL as isize) {
            break;
        }
        assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read: no successful entry for an inject");
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let mut raw = [0x5a5a_5a5a_5a5a_5a5au64; 12];
    // err_data / err_data_size (offsets 64, 72) zero: no buffer of ours.
    raw[8] = 0;
    raw[9] = 0;
    // SAFETY: the stack's open CQ, whose ops table has readerr; `raw` (96
    // bytes) is at least as long as any version's entry.
    let r =
        unsafe { ((*(*s.cq).ops).readerr.expect("readerr"))(s.cq, raw.as_mut_ptr() as *mut fi::fi_cq_err_entry, 0) };
    assert_eq!(r, 1);
    Some(raw)
}

/// fi_msg(3) and fi_cq(3) from 2.5: "If the transfer fails, an error entry
/// will be written to the CQ", without a context. Under a 2.5 request a
/// failed fi_inject, fi_tinject and fi_inject_write each write one, with
/// their op's flags and the error, and nothing goes to the EQ for them (the
/// EQ still hears of the peer's failure).
#[test]
fn a_failed_inject_writes_a_cq_error_entry_from_2_5() {
    if !library_runs_on(v(2, 5), "inject failure as a CQ error entry") {
        return;
    }
    let info = getinfo_at(v(2, 5), &rdm_hints(fi::FI_RMA as u64)).expect("2.5 request");
    let s = stack_with_eq(info);
    // SAFETY: the stack's open fabric.
    assert_eq!(unsafe { (*s.fabric).api_version }, v(2, 5));
    let payload = b"fire and forget";
    let ops: [(&str, u64); 3] = [
        ("fi_inject", (fi::FI_SEND | fi::FI_MSG) as u64),
        ("fi_tinject", (fi::FI_SEND | fi::FI_TAGGED) as u64),
        ("fi_inject_write", (fi::FI_RMA | fi::FI_WRITE) as u64),
    ];
    for (name, flags) in ops {
        // A peer of its own each: a failed peer refuses later posts at once.
        let dead = dead_peer(&s);
        // SAFETY: the stack's endpoint; the payload is copied before return.
        let r = unsafe {
            match name {
                "fi_inject" => fi::fi_inject(s.ep, payload.as_ptr() as *const _, payload.len(), dead),
                "fi_tinject" => fi::fi_tinject(s.ep, payload.as_ptr() as *const _, payload.len(), dead, 5),
                _ => fi::fi_inject_write(s.ep, payload.as_ptr() as *const _, payload.len(), dead, 0, 1),
            }
        };
        assert_eq!(r, 0, "{name}");
        let raw = cq_error_words(&s, std::time::Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{name}: no CQ error entry"));
        assert_eq!(raw[0], 0, "{name}: op_context NULL");
        assert_eq!(raw[1] & flags, flags, "{name}: flags {:#x}", raw[1]);
        assert_eq!(raw[7] as u32 as i32, fi::FI_EHOSTUNREACH as i32, "{name}: err");
        assert_eq!(raw[CQ_ERR_SRC_ADDR / 8], FI_ADDR_NOTAVAIL, "{name}: src_addr of a 2.x entry");
        assert_eq!(raw[CQ_ERR_SRC_ADDR / 8 + 1], 0x5a5a_5a5a_5a5a_5a5a, "{name}: nothing past the entry");
    }
    // The EQ: one error per failed peer, none for the injects.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    let mut eq_errs = Vec::new();
    while std::time::Instant::now() < deadline {
        eq_errs.extend(eq_error(&s));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert_eq!(eq_errs, [fi::FI_EHOSTUNREACH as i32; 3], "EQ errors: the three peers' failures only");
}

/// Below 2.5 a failed inject keeps the rules it was written for: no CQ
/// entry (MPI libraries of those versions dereference every error entry's
/// context), an EQ error instead.
#[test]
fn a_failed_inject_below_2_5_goes_to_the_eq_not_the_cq() {
    let version = running().min(BUILT).min(v(2, 4));
    let info = getinfo_at(version, &rdm_hints(0)).expect("request below 2.5");
    let s = stack_with_eq(info);
    let dead = dead_peer(&s);
    // SAFETY: the stack's endpoint; the payload is copied before return.
    assert_eq!(unsafe { fi::fi_inject(s.ep, b"x".as_ptr() as *const _, 1, dead) }, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut eq_errs = Vec::new();
    while eq_errs.len() < 2 && std::time::Instant::now() < deadline {
        assert!(
            cq_error_words(&s, std::time::Duration::ZERO).is_none(),
            "a CQ entry for an inject under {}.{}",
            version >> 16,
            version & 0xffff
        );
        eq_errs.extend(eq_error(&s));
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // One for the failed inject, one naming the peer's failure.
    assert_eq!(eq_errs, [fi::FI_EHOSTUNREACH as i32; 2], "EQ errors");
}

/// fi_domain(3) 2.5: `max_cntr_value` and `max_err_cntr_value` (offsets 208
/// and 216 of a 2.5 domain attr); rdmx's counters are full 64-bit values, so
/// a 2.5 answer says UINT64_MAX for both, and any hint is met.
#[test]
fn max_cntr_values_are_u64_max_from_2_5() {
    if !library_runs_on(v(2, 5), "fi_domain_attr.max_cntr_value") {
        return;
    }
    const MAX_CNTR_VALUE: usize = 208;
    const MAX_ERR_CNTR_VALUE: usize = 216;
    let info = getinfo_at(v(2, 5), &rdm_hints(0)).expect("2.5 request");
    assert_eq!(dom_raw::<u64>(info.first(), MAX_CNTR_VALUE), u64::MAX);
    assert_eq!(dom_raw::<u64>(info.first(), MAX_ERR_CNTR_VALUE), u64::MAX);
    for want in [1u64, 1 << 48, u64::MAX] {
        let mut h = rdm_hints(0);
        set_dom_raw(&mut h, MAX_CNTR_VALUE, want);
        set_dom_raw(&mut h, MAX_ERR_CNTR_VALUE, want);
        let info = getinfo_at(v(2, 5), &h).unwrap_or_else(|e| panic!("hint {want:#x}: {e}"));
        assert_eq!(dom_raw::<u64>(info.first(), MAX_CNTR_VALUE), u64::MAX);
    }
    // A 2.4 request has no such fields: rdmx leaves them as allocated (0).
    let info = getinfo_at(v(2, 4), &rdm_hints(0)).expect("2.4 request");
    assert_eq!(dom_raw::<u64>(info.first(), MAX_CNTR_VALUE), 0);
    assert_eq!(dom_raw::<u64>(info.first(), MAX_ERR_CNTR_VALUE), 0);
}

/// What fi_rdmx(7) says rdmx answers for AV user ids and AV authorization
/// keys: `FI_AV_USER_ID` as a capability is `-FI_ENODATA`; `auth_key_size`
/// = `FI_AV_AUTH_KEY` (SIZE_MAX, 1.20: keys per AV entry) is offered in the
/// domain attributes of an RDM request of 1.20 on (and echoed), and
/// `-FI_ENODATA` in an endpoint's, beside a key, for DGRAM and before 1.20.
#[test]
fn av_user_ids_are_not_offered_and_av_auth_keys_are_from_1_20() {
    let version = running().min(BUILT);
    assert_eq!(getinfo_at(version, &rdm_hints(fi::FI_AV_USER_ID)).err(), Some(neg(fi::FI_ENODATA)), "FI_AV_USER_ID");
    let mut h = rdm_hints(0);
    h.ep().auth_key_size = usize::MAX;
    assert_eq!(getinfo_at(version, &h).err(), Some(neg(fi::FI_ENODATA)), "ep auth_key_size FI_AV_AUTH_KEY");
    let mut h = rdm_hints(0);
    h.dom().auth_key_size = usize::MAX;
    assert_eq!(getinfo_at(v(1, 17), &h).err(), Some(neg(fi::FI_ENODATA)), "FI_AV_AUTH_KEY in a 1.17 request");
    if !runs_on(v(1, 20), "FI_AV_AUTH_KEY") {
        return;
    }
    let info = getinfo_at(v(1, 20), &h).expect("FI_AV_AUTH_KEY in a 1.20 RDM request");
    // SAFETY: fi_getinfo's output has a domain attr.
    let dom = unsafe { &*info.first().domain_attr };
    assert_eq!(dom.auth_key_size, usize::MAX, "FI_AV_AUTH_KEY echoed");
    assert!(dom.auth_key.is_null());
    // SAFETY: a malloc'd key, which fi_freeinfo frees with the hints.
    unsafe {
        let key = libc::malloc(8) as *mut u8;
        std::ptr::copy_nonoverlapping(b"jobkey!!".as_ptr(), key, 8);
        h.ep().auth_key = key;
    }
    h.ep().auth_key_size = 8;
    assert_eq!(getinfo_at(v(1, 20), &h).err(), Some(neg(fi::FI_ENODATA)), "FI_AV_AUTH_KEY beside a key");
    let mut d = Hints::dgram(Some("udp"));
    d.dom().auth_key_size = usize::MAX;
    assert_eq!(getinfo_at(v(1, 20), &d).err(), Some(neg(fi::FI_ENODATA)), "FI_AV_AUTH_KEY for DGRAM");
}
