//! The rdmx endpoint address: what `fi_getname` returns and `fi_av_insert` takes.
//!
//! A fixed-size (48-byte) binary struct, because OpenMPI and MPICH pack addresses
//! back to back and need one fixed length. Layout (little-endian):
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 1 | magic `0x52` ('R') |
//! | 1 | 1 | format version (1) |
//! | 2 | 2 | flags: bit0 has UDP, bit1 UDP is IPv6, bit2 has shm ring |
//! | 4 | 2 | UDP port (big-endian, as on the wire) |
//! | 6 | 2 | reserved (0) |
//! | 8 | 16 | IPv6 address, or IPv4 in the first 4 bytes |
//! | 24 | 8 | host id (boot id + hostname hash): peers with ours use shm |
//! | 32 | 8 | incarnation: random per `fi_enable`, also the shm ring id |
//! | 40 | 4 | pid (for shm single-copy reads) |
//! | 44 | 4 | IPv6 scope id |
use rdm::device::ShmAddr;
use rdm::DevAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

pub const ADDR_LEN: usize = 48;
const MAGIC: u8 = 0x52;
const VERSION: u8 = 1;
const HAS_UDP: u16 = 1;
const UDP_V6: u16 = 2;
const HAS_SHM: u16 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RdmxAddr {
    pub udp: Option<SocketAddr>,
    pub host_id: u64,
    pub incarnation: u64,
    pub pid: u32,
    pub has_shm: bool,
}

impl RdmxAddr {
    pub fn encode(&self) -> [u8; ADDR_LEN] {
        let mut b = [0u8; ADDR_LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        let mut flags = 0u16;
        if self.has_shm {
            flags |= HAS_SHM;
        }
        if let Some(sa) = self.udp {
            flags |= HAS_UDP;
            b[4..6].copy_from_slice(&sa.port().to_be_bytes());
            match sa {
                SocketAddr::V4(v4) => b[8..12].copy_from_slice(&v4.ip().octets()),
                SocketAddr::V6(v6) => {
                    flags |= UDP_V6;
                    b[8..24].copy_from_slice(&v6.ip().octets());
                    b[44..48].copy_from_slice(&v6.scope_id().to_le_bytes());
                }
            }
        }
        b[2..4].copy_from_slice(&flags.to_le_bytes());
        b[24..32].copy_from_slice(&self.host_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.incarnation.to_le_bytes());
        b[40..44].copy_from_slice(&self.pid.to_le_bytes());
        b
    }

    /// Parses untrusted bytes (from the application or another process).
    pub fn decode(b: &[u8]) -> Option<RdmxAddr> {
        let b: &[u8; ADDR_LEN] = b.get(..ADDR_LEN)?.try_into().ok()?;
        if b[0] != MAGIC || b[1] != VERSION {
            return None;
        }
        let le64 = |r: core::ops::Range<usize>| -> u64 {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        let le32 = |r: core::ops::Range<usize>| -> u32 {
            let mut a = [0u8; 4];
            a.copy_from_slice(&b[r]);
            u32::from_le_bytes(a)
        };
        let flags = u16::from_le_bytes([b[2], b[3]]);
        if flags & !(HAS_UDP | UDP_V6 | HAS_SHM) != 0 {
            return None;
        }
        let port = u16::from_be_bytes([b[4], b[5]]);
        let udp = (flags & HAS_UDP != 0).then(|| {
            if flags & UDP_V6 != 0 {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, le32(44..48)))
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])), port)
            }
        });
        Some(RdmxAddr {
            udp,
            host_id: le64(24..32),
            incarnation: le64(32..40),
            pid: le32(40..44),
            has_shm: flags & HAS_SHM != 0,
        })
    }

    pub fn shm(&self) -> Option<ShmAddr> {
        self.has_shm.then_some(ShmAddr { host_id: self.host_id, pid: self.pid, ring_id: self.incarnation })
    }

    /// The device address rdmx uses to reach this peer from an endpoint on
    /// `local_host` that has the given devices: shared memory when both sides have
    /// it on the same host, else UDP.
    pub fn route(&self, local_host: u64, local_has_shm: bool, local_has_udp: bool) -> Option<DevAddr> {
        if local_has_shm && self.host_id == local_host {
            if let Some(s) = self.shm() {
                return Some(DevAddr::Shm(s));
            }
        }
        if local_has_udp {
            return self.udp.map(DevAddr::Udp);
        }
        None
    }

    /// `rdmx://<host id>/<ip:port>/<incarnation>[/shm:<pid>]`, for fi_av_straddr.
    pub fn to_uri(&self) -> String {
        let udp = self.udp.map(|a| a.to_string()).unwrap_or_else(|| "-".into());
        let mut s = format!("rdmx://{:016x}/{}/{:016x}", self.host_id, udp, self.incarnation);
        if self.has_shm {
            s.push_str(&format!("/shm:{}", self.pid));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_v4_v6_and_rejects_garbage() {
        for udp in [
            Some("10.1.2.3:4567".parse().unwrap()),
            Some("[fe80::1%3]:99".parse::<SocketAddr>().unwrap()),
            None,
        ] {
            let a = RdmxAddr { udp, host_id: 7, incarnation: 0xdead_beef, pid: 42, has_shm: true };
            assert_eq!(RdmxAddr::decode(&a.encode()), Some(a));
        }
        assert_eq!(RdmxAddr::decode(&[0u8; 48]), None);
        assert_eq!(RdmxAddr::decode(&[MAGIC, VERSION]), None);
        let mut bad = RdmxAddr { udp: None, host_id: 1, incarnation: 1, pid: 1, has_shm: false }.encode();
        bad[2] = 0x80;
        assert_eq!(RdmxAddr::decode(&bad), None);
    }
}
