//! Which local address the UDP device advertises when the user names none.
//!
//! The address goes into the endpoint's name and from there, through the
//! application's out-of-band exchange, to every peer, so it must be one that other
//! hosts can send to. The host name's address is *not* that: Debian's default
//! `/etc/hosts` maps the host name to `127.0.1.1`, and so do most containers, so a
//! server that advertised it would hang every peer on another host.
//!
//! The order, documented in fi_rdmx(7) (`FI_RDMX_IFACE`), as libfabric's TCP
//! providers and OpenMPI's `btl tcp` do it:
//!
//! 1. the host name's address, if it is assigned to an interface that is up and
//!    running and is not loopback (on a multi-homed host that is usually the
//!    interface the administrator meant);
//! 2. else the first interface, in kernel interface-index order, that is up,
//!    running, not loopback and has an address of the wanted family (IPv4 unless
//!    asked for IPv6); global addresses before IPv6 link-local ones;
//! 3. else an address of the other family by the same rule;
//! 4. else loopback: a host without a network can still talk to itself.
#![forbid(unsafe_code)]

use rdm::device::DeviceError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

/// One address of one interface, as `getifaddrs` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceAddr {
    pub name: String,
    /// Kernel interface index (the order `ip link` lists interfaces in).
    pub index: u32,
    pub up: bool,
    pub running: bool,
    pub loopback: bool,
    pub ip: IpAddr,
}

/// Why [`choose`] picked what it picked (logged at info level by the caller).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ip: IpAddr,
    /// Interface the address belongs to (`None` for the loopback fallback).
    pub iface: Option<String>,
    pub reason: &'static str,
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

fn usable(a: &IfaceAddr) -> bool {
    a.up && a.running && !a.loopback && !a.ip.is_loopback() && !a.ip.is_unspecified()
}

/// Pure policy over a snapshot of the interfaces (unit-tested without a network).
pub fn choose(addrs: &[IfaceAddr], hostname_ips: &[IpAddr], want_v4: bool) -> Choice {
    let mut usable: Vec<&IfaceAddr> = addrs.iter().filter(|a| usable(a)).collect();
    if let Some(a) = hostname_ips
        .iter()
        .filter(|ip| ip.is_ipv4() == want_v4)
        .chain(hostname_ips.iter().filter(|ip| ip.is_ipv4() != want_v4))
        .find_map(|ip| usable.iter().find(|a| a.ip == *ip))
    {
        return Choice {
            ip: a.ip,
            iface: Some(a.name.clone()),
            reason: "the host name's address, on an interface that is up",
        };
    }
    // Stable sort: within one interface, getifaddrs order is kept.
    usable.sort_by_key(|a| (a.index, is_link_local(&a.ip)));
    for family_v4 in [want_v4, !want_v4] {
        if let Some(a) = usable.iter().find(|a| a.ip.is_ipv4() == family_v4) {
            return Choice {
                ip: a.ip,
                iface: Some(a.name.clone()),
                reason: "the first non-loopback interface that is up",
            };
        }
    }
    let ip = if want_v4 { IpAddr::V4(Ipv4Addr::LOCALHOST) } else { IpAddr::V6(Ipv6Addr::LOCALHOST) };
    Choice {
        ip,
        iface: None,
        reason: "no non-loopback interface is up: peers on other hosts cannot reach this endpoint",
    }
}

/// Every address of every interface on this host.
pub fn local_addrs() -> Vec<IfaceAddr> {
    use nix::net::if_::InterfaceFlags;
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    let mut out = Vec::new();
    for ifa in ifs {
        let Some(addr) = ifa.address else { continue };
        let ip = if let Some(sin) = addr.as_sockaddr_in() {
            IpAddr::V4(sin.ip())
        } else if let Some(sin6) = addr.as_sockaddr_in6() {
            IpAddr::V6(sin6.ip())
        } else {
            continue;
        };
        let index = nix::net::if_::if_nametoindex(ifa.interface_name.as_str()).unwrap_or(u32::MAX);
        out.push(IfaceAddr {
            index,
            up: ifa.flags.contains(InterfaceFlags::IFF_UP),
            running: ifa.flags.contains(InterfaceFlags::IFF_RUNNING),
            loopback: ifa.flags.contains(InterfaceFlags::IFF_LOOPBACK),
            name: ifa.interface_name,
            ip,
        });
    }
    out
}

/// The addresses this host's name resolves to (through `/etc/hosts` and DNS).
pub fn hostname_ips() -> Vec<IpAddr> {
    let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") else { return Vec::new() };
    let host = host.trim();
    if host.is_empty() {
        return Vec::new();
    }
    (host, 0u16).to_socket_addrs().map(|it| it.map(|a| a.ip()).collect()).unwrap_or_default()
}

/// The address to advertise on this host when the user configured none.
pub fn default_choice(want_v4: bool) -> Choice {
    choose(&local_addrs(), &hostname_ips(), want_v4)
}

/// The addresses of interface `name` (`FI_RDMX_IFACE`), whatever its state
/// (the user named it): the wanted family first, global before link-local.
pub fn addrs_of(name: &str, want_v4: bool) -> Result<Vec<IpAddr>, DeviceError> {
    if nix::net::if_::if_nametoindex(name).is_err() {
        return Err(DeviceError::Config(format!("FI_RDMX_IFACE: no network interface named {name:?}")));
    }
    let mut mine: Vec<IpAddr> = local_addrs().into_iter().filter(|a| a.name == name).map(|a| a.ip).collect();
    if mine.is_empty() {
        return Err(DeviceError::Config(format!("FI_RDMX_IFACE: interface {name:?} has no IP address")));
    }
    mine.sort_by_key(|ip| (ip.is_ipv4() != want_v4, is_link_local(ip)));
    Ok(mine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str, index: u32, ip: &str, up: bool, running: bool) -> IfaceAddr {
        let ip: IpAddr = ip.parse().unwrap();
        IfaceAddr { name: name.into(), index, up, running, loopback: ip.is_loopback(), ip }
    }

    #[test]
    fn debian_hosts_file_loopback_name_is_not_advertised() {
        let addrs = [a("lo", 1, "127.0.0.1", true, true), a("veth0", 7, "10.198.0.1", true, true)];
        let c = choose(&addrs, &["127.0.1.1".parse().unwrap()], true);
        assert_eq!(c.ip, "10.198.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(c.iface.as_deref(), Some("veth0"));
    }

    #[test]
    fn hostname_address_wins_when_it_is_on_an_up_interface() {
        let addrs = [a("eth0", 2, "192.0.2.2", true, true), a("eth1", 3, "198.51.100.4", true, true)];
        let c = choose(&addrs, &["198.51.100.4".parse().unwrap()], true);
        assert_eq!(c.iface.as_deref(), Some("eth1"));
    }

    #[test]
    fn down_and_not_running_interfaces_are_skipped_in_index_order() {
        let addrs = [
            a("eth2", 9, "203.0.113.9", true, true),
            a("docker0", 3, "172.17.0.1", true, false),
            a("eth1", 4, "198.51.100.4", false, false),
            a("eth0", 5, "fe80::1", true, true),
            a("eth0", 5, "192.0.2.2", true, true),
        ];
        assert_eq!(choose(&addrs, &[], true).ip, "192.0.2.2".parse::<IpAddr>().unwrap());
        // IPv6 wanted: global before link-local, then the other family.
        let v6 = [a("eth0", 5, "fe80::1", true, true), a("eth0", 5, "fd00::2", true, true)];
        assert_eq!(choose(&v6, &[], false).ip, "fd00::2".parse::<IpAddr>().unwrap());
        assert_eq!(choose(&v6, &[], true).ip, "fd00::2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn loopback_only_when_nothing_else_exists() {
        let addrs = [a("lo", 1, "127.0.0.1", true, true), a("eth0", 2, "192.0.2.2", false, false)];
        let c = choose(&addrs, &["127.0.1.1".parse().unwrap()], true);
        assert_eq!(c.ip, IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(c.iface, None);
    }
}
