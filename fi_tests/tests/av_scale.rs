//! Memory per AV entry: one million addresses inserted through fi_av_insert.
//! An AV entry that never carries traffic costs its address (64 bytes, the most
//! `fi_getname` may return to OpenMPI) and nothing else of note: at most 72.
use fi_tests::*;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_million_av_entries_cost_at_most_72_bytes_each() {
    let s = Stack::open(Some("udp"), fi::FI_AV_TABLE);
    let template = s.name();
    const N: usize = 1_000_000;
    const BATCH: usize = 10_000;
    let len = template.len();
    let mut addrs = vec![0u8; BATCH * len];
    let mut out = vec![0u64; BATCH];
    let before = rss_bytes();
    for b in 0..N / BATCH {
        for i in 0..BATCH {
            let k = (b * BATCH + i) as u32;
            let a = &mut addrs[i * len..(i + 1) * len];
            a.copy_from_slice(&template);
            // A distinct IPv4 address and port per entry; a distinct incarnation.
            a[6..8].copy_from_slice(&((k % 60000) as u16 + 1024).to_be_bytes());
            a[8..12].copy_from_slice(&[10, (k >> 16) as u8, (k >> 8) as u8, k as u8]);
            a[32..40].copy_from_slice(&(k as u64 + 1).to_le_bytes());
        }
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let n = unsafe {
            fi::fi_av_insert(s.av, addrs.as_ptr() as *const _, BATCH, out.as_mut_ptr(), 0, std::ptr::null_mut())
        };
        assert_eq!(n, BATCH as i32);
        assert_eq!(out[BATCH - 1], (b * BATCH + BATCH - 1) as u64, "FI_AV_TABLE indices");
    }
    let after = rss_bytes();
    let per = (after.saturating_sub(before)) as f64 / N as f64;
    println!("1,000,000 AV entries: {:.1} MB resident, {per:.1} bytes per entry", (after - before) as f64 / 1e6);
    assert!(per <= 72.0, "{per:.1} bytes per AV entry");
    // The last entry still round-trips.
    let mut back = vec![0u8; len];
    let mut len = back.len();
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    assert_eq!(unsafe { fi::fi_av_lookup(s.av, (N - 1) as u64, back.as_mut_ptr() as *mut _, &mut len) }, 0);
    assert_eq!(&back[8..12], &[10, ((N - 1) >> 16) as u8, ((N - 1) >> 8) as u8, (N - 1) as u8]);
}
