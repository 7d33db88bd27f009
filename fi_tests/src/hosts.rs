//! Simulated hosts for multi-host tests: each "host" is a network namespace
//! with its own address on a bridge (in a switch namespace of its own), its own
//! `/etc/hosts` (through `ip netns exec`'s `/etc/netns/<ns>/hosts`) that maps its
//! own host name to `127.0.1.1` as Debian does, and nftables dropping a share of
//! the UDP datagrams it receives. Programs run on a host through
//! [`Hosts::run_on`], which also gives them the host's name in a new UTS
//! namespace. Needs root, iproute2, nftables and util-linux `unshare`.
use std::path::PathBuf;
use std::process::Command;

fn sh(cmd: &str) -> bool {
    Command::new("sh").arg("-c").arg(cmd).status().map(|s| s.success()).unwrap_or(false)
}

pub struct Host {
    pub ns: String,
    /// The host's end of its veth pair (inside `ns`).
    pub dev: String,
    pub name: String,
    pub ip: String,
}

pub struct Hosts {
    pub hosts: Vec<Host>,
    switch: String,
    /// The `plm_rsh_agent` script for OpenMPI, and Intel MPI's `-bootstrap-exec`
    /// (any launcher that calls `<agent> [ssh options] <host> <command...>`).
    pub agent: PathBuf,
    hostfile: PathBuf,
    tag: String,
}

impl Hosts {
    /// `n` hosts `<prefix>-host-<i>` on 10.<net>.0.<i+1>/24, dropping
    /// `drop_pct` % of incoming UDP. `None` (with a SKIP line) when the machine
    /// cannot make namespaces. Namespaces, interfaces and the agent script are
    /// named for this run ([`crate::unique_tag`]), so that runs and tests in
    /// parallel never share one, and dropping the `Hosts` removes only them;
    /// host names and addresses live inside the namespaces, so they may repeat.
    pub fn create(prefix: &str, net: u8, n: usize, drop_pct: u32) -> Option<Hosts> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0
            || !sh("command -v ip >/dev/null && command -v nft >/dev/null && command -v unshare >/dev/null")
        {
            crate::skip("multi-host test needs root, iproute2, nftables and unshare");
            return None;
        }
        let tag = crate::unique_tag();
        let hosts: Vec<Host> = (0..n)
            .map(|i| Host {
                ns: format!("{prefix}_{tag}_h{i}"),
                dev: format!("rx{tag}v{i}"),
                name: format!("{prefix}-host-{i}"),
                ip: format!("10.{net}.0.{}", i + 1),
            })
            .collect();
        let me = Hosts {
            switch: format!("{prefix}_{tag}_sw"),
            agent: std::env::temp_dir().join(format!("{prefix}-{tag}-agent.sh")),
            hostfile: std::env::temp_dir().join(format!("{prefix}-{tag}-hostfile")),
            tag,
            hosts,
        };
        let mut script = format!(
            "set -e\nip netns add {sw}\nip -n {sw} link add br0 type bridge\nip -n {sw} link set br0 up\n",
            sw = me.switch
        );
        let all_hosts: String = me.hosts.iter().map(|h| format!("{} {}\\n", h.ip, h.name)).collect();
        for (i, h) in me.hosts.iter().enumerate() {
            script += &format!(
                "mkdir -p /etc/netns/{ns}
                 printf '127.0.0.1 localhost\\n127.0.1.1 {name}\\n{all_hosts}' | grep -v '^10.* {name}$' > /etc/netns/{ns}/hosts
                 ip netns add {ns}
                 ip link add {dev} type veth peer name rx{tag}p{i}
                 ip link set {dev} netns {ns}
                 ip link set rx{tag}p{i} netns {sw}
                 ip -n {sw} link set rx{tag}p{i} master br0 up
                 ip -n {ns} addr add {ip}/24 dev {dev}
                 ip -n {ns} link set {dev} up
                 ip -n {ns} link set lo up
                 ip netns exec {ns} nft add table inet rdmxloss
                 ip netns exec {ns} nft add chain inet rdmxloss input '{{ type filter hook input priority 0; }}'
                 ip netns exec {ns} nft add rule inet rdmxloss input meta l4proto udp numgen random mod 100 '<' {drop_pct} counter drop\n",
                ns = h.ns,
                dev = h.dev,
                tag = me.tag,
                name = h.name,
                ip = h.ip,
                sw = me.switch,
            );
        }
        assert!(sh(&script), "creating the hosts failed");
        let mut agent = String::from(
            "#!/bin/sh\n# <agent> [ssh options] <host> <command...>: run the command on that simulated host.\nwhile [ $# -gt 0 ]; do case \"$1\" in -o|-p|-l|-i) shift 2;; -*) shift;; *) break;; esac; done\nhost=$1; shift\ncase \"$host\" in\n",
        );
        for h in &me.hosts {
            agent += &format!("  {}) ns={} ;;\n", h.name, h.ns);
        }
        agent += "  *) echo \"unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" unshare --uts sh -c \"hostname $host; $*\"\n";
        std::fs::write(&me.agent, agent).unwrap();
        assert!(sh(&format!("chmod +x {}", me.agent.display())));
        Some(me)
    }

    /// Writes a hostfile of every host with `slots` slots each (`<name>
    /// slots=<n>` lines, as OpenMPI reads), named for this run like the
    /// agent and removed with it; returns its path.
    pub fn hostfile(&self, slots: usize) -> PathBuf {
        std::fs::write(
            &self.hostfile,
            self.hosts.iter().map(|h| format!("{} slots={slots}\n", h.name)).collect::<String>(),
        )
        .unwrap();
        self.hostfile.clone()
    }

    /// The words that run a command on the switch between the hosts, where
    /// every frame between them passes (an observer, or an attacker), with
    /// the address `10.<net>.0.250` there so that it can also send from
    /// an address of its own.
    pub fn run_on_switch(&self) -> Vec<String> {
        let _ = sh(&format!("ip -n {} addr add {}/24 dev br0 2>/dev/null", self.switch, self.switch_ip()));
        ["ip", "netns", "exec", &self.switch].iter().map(|x| x.to_string()).collect()
    }

    /// The switch's own address ([`Hosts::run_on_switch`]).
    pub fn switch_ip(&self) -> String {
        let ip = &self.hosts[0].ip;
        format!("{}.250", &ip[..ip.rfind('.').unwrap()])
    }

    /// The words that run a command on host `i` (prefix them to the command).
    pub fn run_on(&self, i: usize) -> Vec<String> {
        vec![self.agent.display().to_string(), self.hosts[i].name.clone()]
    }

    /// UDP datagrams host `i`'s kernel dropped so far for a full socket
    /// buffer or a closed port (`RcvbufErrors` and `NoPorts` of its
    /// `/proc/net/snmp`).
    pub fn udp_kernel_drops(&self, i: usize) -> u64 {
        self.udp_snmp(i, "RcvbufErrors") + self.udp_snmp(i, "NoPorts")
    }

    fn udp_snmp(&self, i: usize, name: &str) -> u64 {
        let out =
            Command::new("ip").args(["netns", "exec", &self.hosts[i].ns, "cat", "/proc/net/snmp"]).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
        let (Some(head), Some(vals)) = (udp.next(), udp.next()) else { return 0 };
        head.split_whitespace()
            .zip(vals.split_whitespace())
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0)
    }

    /// UDP datagrams nftables dropped on host `i` so far.
    pub fn dropped(&self, i: usize) -> u64 {
        let out =
            Command::new("ip").args(["netns", "exec", &self.hosts[i].ns, "nft", "list", "ruleset"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split("counter packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    fn destroy(&self) {
        // Deleting a namespace deletes the veth ends in it; a pair creation
        // left in the root namespace goes by its own (unique) name.
        let mut cmd = format!("ip netns del {} 2>/dev/null;", self.switch);
        for h in &self.hosts {
            cmd += &format!(
                " ip netns del {ns} 2>/dev/null; ip link del {dev} 2>/dev/null; rm -rf /etc/netns/{ns};",
                ns = h.ns,
                dev = h.dev
            );
        }
        sh(&format!("{cmd} true"));
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.destroy();
        let _ = std::fs::remove_file(&self.agent);
        let _ = std::fs::remove_file(&self.hostfile);
    }
}
