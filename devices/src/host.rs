//! Which host are we on? Peers with the same host id share memory, so the
//! shared-memory device can reach them.
#![forbid(unsafe_code)]

use std::sync::OnceLock;

fn fnv1a64(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A 64-bit identity of this host: a hash of the kernel boot id and the host
/// name (two containers on one kernel with different host names differ; two
/// network namespaces of one host agree, and can indeed share memory).
pub fn host_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let h = fnv1a64(boot.trim().as_bytes(), 0xcbf2_9ce4_8422_2325);
        fnv1a64(name.trim().as_bytes(), h) | 1
    })
}
