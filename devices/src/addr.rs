//! The rdmx endpoint address: what `fi_getname` returns and `fi_av_insert`
//! takes (the provider only copies these bytes), made of one slot per device
//! (UDP, shared memory, a verbs UD or EFA SRD queue pair), and the route to a
//! peer: which of our devices reaches which of its slots ([`RdmxAddr::route`]).
//! It lives with the devices, so that a new device touches this file and not
//! the provider.
//!
//! A fixed-size (64-byte) binary struct, because OpenMPI and MPICH pack addresses
//! back to back and need one fixed length, and at most `FI_NAME_MAX` (64) bytes,
//! the buffer OpenMPI's `mtl ofi` hands `fi_getname`. Layout (little-endian
//! unless said):
//!
//! | off | size | field |
//! |----:|-----:|-------|
//! | 0 | 1 | magic `0x52` ('R') |
//! | 1 | 1 | format version (2: the UD queue pair was added) |
//! | 2 | 1 | flags: bit0 has UDP, bit1 UDP is IPv6, bit2 has shm ring, bit3 has a verbs UD queue pair, bit4 that queue pair is EFA SRD (GID and QPN as for UD, LID 0) |
//! | 3 | 3 | UD: queue pair number (24 bits, as verbs defines it) |
//! | 6 | 2 | UDP port (big-endian, as on the wire) |
//! | 8 | 16 | IPv6 address, or IPv4 in the first 4 bytes |
//! | 24 | 8 | host id (boot id + hostname hash): peers with ours use shm |
//! | 32 | 8 | incarnation: random per `fi_enable`, also the shm ring id |
//! | 40 | 4 | pid (for shm single-copy reads) |
//! | 44 | 2 | IPv6 scope id (an interface index; larger ones are not carried) |
//! | 46 | 2 | UD: LID (InfiniBand without GRH; 0 on RoCE) |
//! | 48 | 16 | UD: the port's GID (RoCE v2: the netdev's address, IPv4-mapped) |
#![forbid(unsafe_code)]

use rdm::device::{RawAddr, ShmAddr};
use rdm::DevAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

pub const ADDR_LEN: usize = 64;
// (prov checks ADDR_LEN against libfabric's FI_NAME_MAX, the buffer
// OpenMPI's `mtl ofi` gives fi_getname.)
const MAGIC: u8 = 0x52;
const VERSION: u8 = 2;
const HAS_UDP: u8 = 1;
const UDP_V6: u8 = 2;
const HAS_SHM: u8 = 4;
const HAS_UD: u8 = 8;
const UD_IS_SRD: u8 = 16;

/// A verbs UD queue pair, or an EFA SRD one (`srd`): what a peer's address
/// handle and send name. QPNs are 24 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdAddr {
    pub gid: [u8; 16],
    pub qpn: u32,
    pub lid: u16,
    /// An EFA SRD queue pair (`devices::efa`), reached only from one.
    pub srd: bool,
}

impl UdAddr {
    /// The device address of this queue pair: GID ++ QPN ++ LID, the verbs
    /// device's encoding of `DevAddr::Raw` (`devices::verbs`), or the
    /// EFA device's GID ++ QPN.
    pub fn dev_addr(&self) -> DevAddr {
        if self.srd {
            return crate::efa::efa_addr(self.gid, self.qpn);
        }
        let mut b = [0u8; 22];
        b[..16].copy_from_slice(&self.gid);
        b[16..20].copy_from_slice(&self.qpn.to_le_bytes());
        b[20..22].copy_from_slice(&self.lid.to_le_bytes());
        DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_VERBS_UD, &b).expect("22 bytes fit a raw address"))
    }

    /// Whether a queue pair with this address can send to `other`, as far as
    /// the addresses tell: RoCE v2 GIDs that map IPv4 addresses reach each
    /// other (IP routes them); other GIDs (InfiniBand, RoCE v1, IPv6) when
    /// they share the 64-bit subnet prefix. Symmetric, so both ends of a pair
    /// choose the same path and know each other by one address.
    pub fn reaches(&self, other: &UdAddr) -> bool {
        if self.srd != other.srd {
            return false;
        }
        const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];
        let v4 = |g: &[u8; 16]| g[..12] == V4_MAPPED;
        match (v4(&self.gid), v4(&other.gid)) {
            (true, true) => true,
            (false, false) => self.gid[..8] == other.gid[..8],
            _ => false,
        }
    }

    /// `ud:<gid as 8 groups of 4 hex digits>/qpn:<qpn in hex>`.
    pub fn to_text(&self) -> String {
        let gid: Vec<String> = self.gid.chunks(2).map(|c| format!("{:02x}{:02x}", c[0], c[1])).collect();
        format!("{}:{}/qpn:{:#x}", if self.srd { "srd" } else { "ud" }, gid.join(":"), self.qpn)
    }

    /// The queue pair a verbs device address names.
    pub fn from_dev_addr(a: &DevAddr) -> Option<UdAddr> {
        if let Some((gid, qpn)) = crate::efa::parse_efa_addr(a) {
            return Some(UdAddr { gid, qpn, lid: 0, srd: true });
        }
        let DevAddr::Raw(r) = a else { return None };
        let b = r.bytes();
        if r.family() != RawAddr::FAMILY_VERBS_UD || b.len() != 22 {
            return None;
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[..16]);
        Some(UdAddr {
            gid,
            qpn: u32::from_le_bytes([b[16], b[17], b[18], b[19]]),
            lid: u16::from_le_bytes([b[20], b[21]]),
            srd: false,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RdmxAddr {
    pub udp: Option<SocketAddr>,
    pub host_id: u64,
    pub incarnation: u64,
    pub pid: u32,
    pub has_shm: bool,
    pub ud: Option<UdAddr>,
}

impl RdmxAddr {
    /// An address with nothing in it but what the caller sets.
    pub const EMPTY: RdmxAddr = RdmxAddr { udp: None, host_id: 0, incarnation: 0, pid: 0, has_shm: false, ud: None };

    /// The address of an endpoint of this process whose device answers on
    /// `addrs` (`Device::local_addrs`): a slot for each kind it has.
    pub fn of_local(addrs: &[DevAddr], incarnation: u64) -> RdmxAddr {
        let udp = addrs.iter().find_map(|a| match a {
            DevAddr::Udp(sa) => Some(*sa),
            _ => None,
        });
        let has_shm = addrs.iter().any(|a| matches!(a, DevAddr::Shm(_)));
        let ud = addrs.iter().find_map(UdAddr::from_dev_addr);
        RdmxAddr { udp, host_id: crate::host::host_id(), incarnation, pid: std::process::id(), has_shm, ud }
    }

    /// An insertable address for a peer known only by the device address it
    /// sent from (a CQ entry's source): the one slot that address fills.
    pub fn of_sender(dev: DevAddr) -> RdmxAddr {
        match dev {
            DevAddr::Udp(sa) => RdmxAddr { udp: Some(sa), ..RdmxAddr::EMPTY },
            DevAddr::Shm(s) => {
                RdmxAddr { host_id: s.host_id, incarnation: s.ring_id, pid: s.pid, has_shm: true, ..RdmxAddr::EMPTY }
            }
            // A queue pair's, or nothing for a family without a slot.
            DevAddr::Raw(_) => RdmxAddr { ud: UdAddr::from_dev_addr(&dev), ..RdmxAddr::EMPTY },
        }
    }
}

/// A peer's device address as text: `udp:<ip>:<port>`, `shm:<host>:<pid>:<ring>`,
/// `ud:<gid>/qpn:<qpn>` (a verbs UD queue pair), `srd:<gid>/qpn:<qpn>` (EFA).
pub fn dev_addr_text(a: &DevAddr) -> String {
    match a {
        DevAddr::Udp(sa) => format!("udp:{sa}"),
        DevAddr::Shm(s) => format!("shm:{:x}:{}:{:x}", s.host_id, s.pid, s.ring_id),
        other => match UdAddr::from_dev_addr(other) {
            Some(ud) => ud.to_text(),
            None => format!("{other:?}"),
        },
    }
}

impl RdmxAddr {
    pub fn encode(&self) -> [u8; ADDR_LEN] {
        let mut b = [0u8; ADDR_LEN];
        b[0] = MAGIC;
        b[1] = VERSION;
        let mut flags = 0u8;
        if self.has_shm {
            flags |= HAS_SHM;
        }
        if let Some(sa) = self.udp {
            flags |= HAS_UDP;
            b[6..8].copy_from_slice(&sa.port().to_be_bytes());
            match sa {
                SocketAddr::V4(v4) => b[8..12].copy_from_slice(&v4.ip().octets()),
                SocketAddr::V6(v6) => {
                    flags |= UDP_V6;
                    b[8..24].copy_from_slice(&v6.ip().octets());
                    b[44..46].copy_from_slice(&u16::try_from(v6.scope_id()).unwrap_or(0).to_le_bytes());
                }
            }
        }
        b[24..32].copy_from_slice(&self.host_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.incarnation.to_le_bytes());
        b[40..44].copy_from_slice(&self.pid.to_le_bytes());
        if let Some(ud) = self.ud {
            flags |= HAS_UD;
            if ud.srd {
                flags |= UD_IS_SRD;
            }
            b[3..6].copy_from_slice(&ud.qpn.to_le_bytes()[..3]);
            b[46..48].copy_from_slice(&ud.lid.to_le_bytes());
            b[48..64].copy_from_slice(&ud.gid);
        }
        b[2] = flags;
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
        let flags = b[2];
        if flags & !(HAS_UDP | UDP_V6 | HAS_SHM | HAS_UD | UD_IS_SRD) != 0 {
            return None;
        }
        let port = u16::from_be_bytes([b[6], b[7]]);
        let udp = (flags & HAS_UDP != 0).then(|| {
            if flags & UDP_V6 != 0 {
                let mut ip = [0u8; 16];
                ip.copy_from_slice(&b[8..24]);
                SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(ip),
                    port,
                    0,
                    u16::from_le_bytes([b[44], b[45]]) as u32,
                ))
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::new(b[8], b[9], b[10], b[11])), port)
            }
        });
        Some(RdmxAddr {
            udp,
            host_id: le64(24..32),
            incarnation: le64(32..40),
            pid: u32::from_le_bytes([b[40], b[41], b[42], b[43]]),
            has_shm: flags & HAS_SHM != 0,
            ud: (flags & HAS_UD != 0).then(|| {
                let mut gid = [0u8; 16];
                gid.copy_from_slice(&b[48..64]);
                UdAddr {
                    gid,
                    qpn: u32::from_le_bytes([b[3], b[4], b[5], 0]),
                    lid: u16::from_le_bytes([b[46], b[47]]),
                    srd: flags & UD_IS_SRD != 0,
                }
            }),
        })
    }

    pub fn shm(&self) -> Option<ShmAddr> {
        self.has_shm.then_some(ShmAddr { host_id: self.host_id, pid: self.pid, ring_id: self.incarnation })
    }

    /// The device address rdmx uses to reach this peer from an endpoint on
    /// `local_host` that has the given devices: shared memory when both sides have
    /// it on the same host, else its verbs queue pair when both have one on a
    /// fabric that joins them ([`UdAddr::reaches`]), else UDP.
    pub fn route(&self, local: &RdmxAddr) -> Option<DevAddr> {
        if local.has_shm && self.host_id == local.host_id {
            if let Some(s) = self.shm() {
                return Some(DevAddr::Shm(s));
            }
        }
        if let (Some(mine), Some(theirs)) = (local.ud, self.ud) {
            if mine.reaches(&theirs) {
                return Some(theirs.dev_addr());
            }
        }
        if local.udp.is_some() {
            return self.udp.map(DevAddr::Udp);
        }
        None
    }

    /// `rdmx://<host id>/<ip:port>/<incarnation>[/shm:<pid>][/ud:<gid>/qpn:<qpn>[/lid:<lid>] or /srd:<gid>/qpn:<qpn>]`,
    /// for fi_av_straddr.
    pub fn to_uri(&self) -> String {
        let udp = self.udp.map(|a| a.to_string()).unwrap_or_else(|| "-".into());
        let mut s = format!("rdmx://{:016x}/{}/{:016x}", self.host_id, udp, self.incarnation);
        if self.has_shm {
            s.push_str(&format!("/shm:{}", self.pid));
        }
        if let Some(ud) = self.ud {
            s.push_str(&format!("/{}", ud.to_text()));
            if ud.lid != 0 {
                s.push_str(&format!("/lid:{}", ud.lid));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_v4_v6_and_rejects_garbage() {
        for udp in [Some("10.1.2.3:4567".parse().unwrap()), Some("[fe80::1%3]:99".parse::<SocketAddr>().unwrap()), None]
        {
            for ud in [
                None,
                Some(UdAddr { gid: [0xfe; 16], qpn: 0xff_2233, lid: 9, srd: false }),
                Some(UdAddr { gid: [0xfe; 16], qpn: 0xff_2233, lid: 0, srd: true }),
            ] {
                let a = RdmxAddr { udp, host_id: 7, incarnation: 0xdead_beef, pid: 42, has_shm: true, ud };
                assert_eq!(RdmxAddr::decode(&a.encode()), Some(a));
            }
        }
        assert_eq!(RdmxAddr::decode(&[0u8; ADDR_LEN]), None);
        assert_eq!(RdmxAddr::decode(&[MAGIC, VERSION]), None);
        let mut bad = RdmxAddr { host_id: 1, incarnation: 1, pid: 1, ..RdmxAddr::EMPTY }.encode();
        bad[2] = 0x80;
        assert_eq!(RdmxAddr::decode(&bad), None);
        // A version-1 address of an older rdmx is not taken for one.
        let mut v1 = RdmxAddr { host_id: 1, ..RdmxAddr::EMPTY }.encode();
        v1[1] = 1;
        assert_eq!(RdmxAddr::decode(&v1), None);
    }

    #[test]
    fn routes_shm_then_ud_then_udp() {
        let ud = |qpn| Some(UdAddr { gid: [1; 16], qpn, lid: 0, srd: false });
        let udp = Some("10.0.0.1:5".parse().unwrap());
        let local = RdmxAddr { udp, host_id: 1, has_shm: true, ud: ud(1), ..RdmxAddr::EMPTY };
        let same_host = RdmxAddr { udp, host_id: 1, pid: 3, incarnation: 4, has_shm: true, ud: ud(2) };
        assert!(matches!(same_host.route(&local), Some(DevAddr::Shm(_))));
        let remote = RdmxAddr { host_id: 2, ..same_host };
        let via_ud = remote.route(&local).unwrap();
        assert_eq!(UdAddr::from_dev_addr(&via_ud), ud(2));
        let no_ud_here = RdmxAddr { ud: None, ..local };
        assert_eq!(remote.route(&no_ud_here), udp.map(DevAddr::Udp));
        let no_ud_there = RdmxAddr { ud: None, ..remote };
        assert_eq!(no_ud_there.route(&local), udp.map(DevAddr::Udp));
        // A queue pair on another InfiniBand subnet is not reachable: UDP.
        let ib = |prefix: u8, qpn| {
            let mut gid = [0u8; 16];
            gid[0] = 0xfe;
            gid[1] = 0x80;
            gid[7] = prefix;
            gid[15] = 1;
            Some(UdAddr { gid, qpn, lid: 5, srd: false })
        };
        let ib_local = RdmxAddr { ud: ib(0, 1), ..local };
        assert!(matches!(RdmxAddr { ud: ib(0, 2), ..remote }.route(&ib_local), Some(DevAddr::Raw(_))));
        assert_eq!(RdmxAddr { ud: ib(9, 2), ..remote }.route(&ib_local), udp.map(DevAddr::Udp));
        // RoCE v2 IPv4-mapped GIDs reach each other; an IB GID does not reach them.
        let roce = |a: u8| {
            let mut gid = [0u8; 16];
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&[10, 0, 0, a]);
            Some(UdAddr { gid, qpn: 7, lid: 0, srd: false })
        };
        let roce_local = RdmxAddr { ud: roce(1), ..local };
        assert!(matches!(RdmxAddr { ud: roce(2), ..remote }.route(&roce_local), Some(DevAddr::Raw(_))));
        assert_eq!(RdmxAddr { ud: ib(0, 2), ..remote }.route(&roce_local), udp.map(DevAddr::Udp));
        // EFA SRD queue pairs reach each other (EFA GIDs share fe80::/64)
        // as the EFA device's address, never a UD one, and not from UD.
        let srd = |qpn| ib(0, qpn).map(|u| UdAddr { lid: 0, srd: true, ..u });
        let srd_local = RdmxAddr { ud: srd(1), ..local };
        let via_srd = RdmxAddr { ud: srd(2), ..remote }.route(&srd_local).unwrap();
        assert_eq!(crate::efa::parse_efa_addr(&via_srd).map(|(_, q)| q), Some(2));
        assert_eq!(UdAddr::from_dev_addr(&via_srd), srd(2));
        assert_eq!(RdmxAddr { ud: ib(0, 2), ..remote }.route(&srd_local), udp.map(DevAddr::Udp));
        assert_eq!(RdmxAddr { ud: srd(2), ..remote }.route(&ib_local), udp.map(DevAddr::Udp));
        assert!(srd(2).unwrap().to_text().starts_with("srd:fe80:"));
        assert_eq!(RdmxAddr { ud: roce(2), ..remote }.route(&ib_local), udp.map(DevAddr::Udp));
    }
}
