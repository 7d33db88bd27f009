//! A send buffer freed and mapped again at the same address with new content,
//! on the verbs domain, where receivers read long messages by RDMA read through
//! registrations the domain's cache keeps: every message carries the new
//! content (never bytes read through the old registration, which pinned the
//! old pages), and the stats show the cache's invalidations. Its own test
//! binary: it sets `FI_RDMX_STATS` before rdmx reads its parameters. Run in the
//! Soft-RoCE VM by `scripts/test-verbs.sh`.
use fi_tests::*;
use std::ptr::null_mut;

/// Sum of the endpoint-wide counter `name` over every JSON document in `text`
/// (per-peer objects of the same name hold objects, not numbers).
fn counter(text: &str, name: &str) -> u64 {
    let key = format!("\"{name}\":");
    text.match_indices(&key)
        .filter_map(|(i, _)| {
            let digits: String = text[i + key.len()..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .sum()
}

/// Whether `ibv_devinfo -v` says the first device offers what rdmx needs to
/// register on demand: general ODP, RC reads and UD sends over ODP memory.
fn device_offers_odp() -> bool {
    let out = std::process::Command::new("ibv_devinfo").arg("-v").output().expect("ibv_devinfo");
    let text = String::from_utf8_lossy(&out.stdout);
    // The lines under each `<name>_odp_caps:` heading, up to the next heading.
    let section = |name: &str| -> Vec<String> {
        let head = format!("{name}_odp_caps:");
        text.lines()
            .skip_while(|l| l.trim() != head)
            .skip(1)
            .take_while(|l| !l.trim().ends_with(':') && !l.contains("odp_caps"))
            .map(|l| l.trim().to_string())
            .collect()
    };
    section("general").iter().any(|l| l == "ODP_SUPPORT")
        && section("rc").iter().any(|l| l == "SUPPORT_READ")
        && section("ud").iter().any(|l| l == "SUPPORT_SEND")
}

#[test]
fn verbs_a_send_buffer_unmapped_and_mapped_again_is_never_read_through_its_old_registration() {
    if !verbs_device_present() {
        return;
    }
    let stats = std::env::temp_dir().join(format!("rdmx-verbs-unmap-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&stats);
    // SAFETY: this binary's only test, before any libfabric call.
    unsafe { std::env::set_var("FI_RDMX_STATS", &stats) };
    init();
    const LEN: usize = 1 << 20;
    const GENERATIONS: u8 = 3;
    const PER_GENERATION: u8 = 3;
    {
        let a = Stack::open(Some("verbs"), fi::FI_AV_MAP);
        let b = Stack::open(Some("verbs"), fi::FI_AV_MAP);
        let b_at_a = a.insert(&b.name());
        let mut rbuf = vec![0u8; LEN];
        let map = |at: *mut libc::c_void, flags: i32| {
            // SAFETY: an anonymous private mapping; MAP_FIXED_NOREPLACE never
            // replaces another mapping.
            let p = unsafe {
                libc::mmap(
                    at,
                    LEN,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                    -1,
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
            p
        };
        let addr = map(null_mut(), 0);
        for generation in 0..GENERATIONS {
            if generation > 0 {
                // Freed after its sends completed, mapped again at the same
                // address: new pages, whatever the old registration pinned.
                // SAFETY: the mapping made above; no operation uses it now.
                assert_eq!(unsafe { libc::munmap(addr, LEN) }, 0);
                let again = map(addr, libc::MAP_FIXED_NOREPLACE);
                assert_eq!(again, addr, "mapped again elsewhere");
            }
            // SAFETY: LEN bytes of the live mapping at `addr`.
            let sbuf = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, LEN) };
            for k in 0..PER_GENERATION {
                let tag = (generation * PER_GENERATION + k) as u64;
                for (i, x) in sbuf.iter_mut().enumerate() {
                    *x = (i as u8).wrapping_mul(13).wrapping_add(generation.wrapping_mul(71)).wrapping_add(k);
                }
                rbuf.fill(0xee);
                // SAFETY: open objects of this test; the buffers outlive the operations (waited for below).
                unsafe {
                    assert_eq!(
                        fi::fi_trecv(
                            b.ep,
                            rbuf.as_mut_ptr() as *mut _,
                            LEN,
                            null_mut(),
                            FI_ADDR_UNSPEC,
                            tag,
                            0,
                            null_mut()
                        ),
                        0
                    );
                    assert_eq!(
                        fi::fi_tsend(a.ep, sbuf.as_ptr() as *const _, LEN, null_mut(), b_at_a, tag, null_mut()),
                        0
                    );
                }
                b.wait_cq(&[&a]).expect("receive completion");
                a.wait_cq(&[&b]).expect("send completion");
                if let Some(i) = (0..LEN).find(|&i| rbuf[i] != sbuf[i]) {
                    panic!(
                        "generation {generation}, message {k}: byte {i} is {:#x}, sent {:#x} (stale pages read?)",
                        rbuf[i], sbuf[i]
                    );
                }
            }
        }
        // SAFETY: the mapping made above; no operation uses it now.
        assert_eq!(unsafe { libc::munmap(addr, LEN) }, 0);
    }
    // The endpoints closed: each appended its JSON document.
    let text = std::fs::read_to_string(&stats).expect("FI_RDMX_STATS documents");
    let _ = std::fs::remove_file(&stats);
    let (pulled, windowed, invalidations, misses) = (
        counter(&text, "rendezvous_pulled"),
        counter(&text, "rendezvous_windowed"),
        counter(&text, "mr_cache_invalidations"),
        counter(&text, "mr_cache_misses"),
    );
    let on_demand = counter(&text, "mr_on_demand");
    println!("pulled {pulled}, windowed {windowed}, mr_cache_invalidations {invalidations}, mr_cache_misses {misses}, mr_on_demand {on_demand} (of 2 endpoints)");
    // Registrations pin unless FI_RDMX_VERBS_ODP=1 asks for ODP, also where
    // the device offers it (Soft-RoCE in the 7.3 kernel does, and moves the
    // wrong bytes for buffers not aligned to a page).
    println!("the device offers ODP: {}", device_offers_odp());
    assert_eq!(on_demand, 0, "ODP without FI_RDMX_VERBS_ODP=1");
    let messages = (GENERATIONS * PER_GENERATION) as u64;
    assert_eq!(pulled + windowed, messages, "every message by rendezvous");
    assert!(pulled >= messages - 2, "{pulled} of {messages} pulled by RDMA read");
    // Each unmap invalidated the send buffer's registration (counted once per
    // endpoint document: the domain's cache is shared, so both report it).
    assert!(invalidations >= (GENERATIONS - 1) as u64, "{invalidations} invalidations for {} unmaps", GENERATIONS - 1);
    assert!(misses >= GENERATIONS as u64, "{misses} misses: each new mapping is registered anew");
}
