//! The simulated network as a [`Device`]: each node of a [`SimNet`] gets a
//! [`SimDevice`] that an endpoint owns like any other device, so the code above
//! the device seam (the whole endpoint, its staging, its reads) runs unchanged
//! on a virtual clock. Links lose, duplicate, reorder, delay and corrupt with a
//! seeded generator, as in [`crate::sim`]; every run replays from its seed.
//!
//! The device is also the model of the seam a verbs or SRD device will fill:
//! its addresses are [`DevAddr::Raw`] bytes only it interprets; its remote
//! reads are posted and complete later (the test harness serves them between
//! steps, from the peer's model memory); on paths whose caps say
//! `registration` a read must carry both keys; and it lends the transmit
//! buffers and counts datagrams sent from anywhere else.
#![forbid(unsafe_code)]

use crate::device::rc::{ConnStats, ConnTable, QueueFactory, QueueInfo};
use crate::device::{
    ControlMsg, Dest, DevAddr, Device, DeviceCaps, DeviceContext, DeviceError, OpenSpec, RawAddr, ReadDone, ReadRun,
    Registrar, RemoteReads, TxDatagram,
};
use crate::sim::{Link, Wire};
use crate::time::Instant;
use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// One node's side of the network.
struct Port {
    alive: bool,
    caps: DeviceCaps,
    /// Per-peer caps where they differ from `caps` (a path without remote read).
    paths: HashMap<u32, DeviceCaps>,
    /// Every posted read is refused (a process the ptrace policy forbids to read).
    deny_reads: bool,
    inbox: VecDeque<(u32, Vec<u8>)>,
    backlog_cap: usize,
    backlog_drops: u64,
    rx_per_ms: Option<u32>,
    rx_budget: u32,
    rx_window_start: Instant,
    reads_done: VecDeque<ReadDone>,
    /// Address ranges of the transmit buffers this port lent.
    lent: Vec<(usize, usize)>,
    sent: u64,
    sent_from_elsewhere: u64,
    /// The domain ([`SimContext`]) the node's device was opened from: its
    /// reads' local keys must be that domain's.
    domain: Option<usize>,
    /// Reads need a connection to the peer first (the model of verbs RC
    /// behind UD: [`SimNet::connect_reads`]).
    conns: Option<ConnTable<u32>>,
}

/// The model's queues: numbers, connected at once.
struct ModelQueues;

impl QueueFactory for ModelQueues {
    type Queue = u32;
    fn create(&mut self) -> Result<(u32, QueueInfo), DeviceError> {
        Ok((0, QueueInfo::default()))
    }
    fn connect(&mut self, _q: &mut u32, _remote: &QueueInfo) -> Result<(), DeviceError> {
        Ok(())
    }
    fn retire(&mut self, _q: u32) {}
}

struct NetState {
    now: Instant,
    wire: Wire,
    ports: Vec<Port>,
    reads: VecDeque<PostedRead>,
    datagrams: u64,
    /// Each domain's live registrations: key -> (addr, len).
    domains: Vec<HashMap<u64, (u64, u64)>>,
    next_key: u64,
    /// Devices take gathered writes ([`Device::write`]) on reliable,
    /// ordered paths, as shm does (on unless a test compares without).
    gathered_writes: bool,
}

/// A read a node posted, waiting for the harness to serve it.
#[derive(Debug)]
pub struct PostedRead {
    pub node: u32,
    pub peer: u32,
    pub id: u64,
    pub runs: Vec<ReadRun>,
}

/// The network shared by every node's device and the test harness.
#[derive(Clone)]
pub struct SimNet(Arc<Mutex<NetState>>);

/// The address of node `i`.
pub fn addr(i: u32) -> DevAddr {
    DevAddr::Raw(RawAddr::new(RawAddr::FAMILY_MODEL, &i.to_le_bytes()).expect("4 bytes fit"))
}

/// The node an address names, if it is a simulated one.
pub fn node_of(a: &DevAddr) -> Option<u32> {
    match a {
        DevAddr::Raw(r) if r.family() == RawAddr::FAMILY_MODEL => Some(u32::from_le_bytes(r.bytes().try_into().ok()?)),
        _ => None,
    }
}

impl SimNet {
    /// A network of `n` nodes whose devices offer `caps` on every path.
    pub fn new(n: usize, caps: DeviceCaps, link: Link, seed: u64) -> SimNet {
        let ports = (0..n)
            .map(|_| Port {
                alive: true,
                caps,
                paths: HashMap::new(),
                deny_reads: false,
                inbox: VecDeque::new(),
                backlog_cap: usize::MAX,
                backlog_drops: 0,
                rx_per_ms: None,
                rx_budget: 0,
                rx_window_start: Instant::ZERO,
                reads_done: VecDeque::new(),
                lent: Vec::new(),
                sent: 0,
                sent_from_elsewhere: 0,
                domain: None,
                conns: None,
            })
            .collect();
        SimNet(Arc::new(Mutex::new(NetState {
            now: Instant::ZERO,
            wire: Wire::new(n, link, seed),
            ports,
            reads: VecDeque::new(),
            datagrams: 0,
            domains: Vec::new(),
            next_key: 1,
            gathered_writes: true,
        })))
    }

    /// Whether devices take gathered writes on reliable, ordered paths (the
    /// shm fast path of the layers above); on by default.
    pub fn set_gathered_writes(&self, on: bool) {
        self.lock().gathered_writes = on;
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Node `i`'s device.
    pub fn device(&self, i: u32) -> SimDevice {
        SimDevice { net: self.clone(), me: i }
    }

    /// A domain (the model of one protection domain) whose endpoints are
    /// `nodes`, handed out in this order by [`DeviceContext::open`].
    pub fn context(&self, nodes: &[u32]) -> SimContext {
        let mut n = self.lock();
        n.domains.push(HashMap::new());
        SimContext {
            net: self.clone(),
            domain: n.domains.len() - 1,
            nodes: Mutex::new(nodes.iter().copied().collect()),
        }
    }

    /// Whether `key` is a live registration of node `i`'s domain covering
    /// `[addr, addr+len)`: what a peer's read of node `i`'s memory needs.
    pub fn key_covers(&self, i: u32, key: u64, addr: u64, len: u64) -> bool {
        let n = self.lock();
        n.ports[i as usize].domain.is_some_and(|d| covers(&n.domains[d], key, addr, len))
    }

    pub fn now(&self) -> Instant {
        self.lock().now
    }

    pub fn nodes(&self) -> usize {
        self.lock().ports.len()
    }

    /// The caps node `from` sees toward `to`.
    pub fn set_path(&self, from: u32, to: u32, caps: DeviceCaps) {
        self.lock().ports[from as usize].paths.insert(to, caps);
    }

    /// The caps node `i` sees on every path without its own.
    pub fn set_caps(&self, i: u32, caps: DeviceCaps) {
        self.lock().ports[i as usize].caps = caps;
    }

    /// Node `i` reads a peer only through a connection, set up lazily by a
    /// handshake over the endpoint's reliable stream (at most `max` each
    /// way, idle ones closed after `idle`): the model of verbs RC queue
    /// pairs behind a UD queue ([`crate::device::rc`]).
    pub fn connect_reads(&self, i: u32, max: usize, idle: Duration) {
        self.lock().ports[i as usize].conns = Some(ConnTable::new(max, idle, i as u64 + 1));
    }

    /// The connection counters of node `i` (see [`SimNet::connect_reads`]),
    /// with its active and passive connections now.
    pub fn conn_stats(&self, i: u32) -> Option<(ConnStats, usize, usize)> {
        self.lock().ports[i as usize].conns.as_ref().map(|c| (c.stats, c.active_len(), c.passive_len()))
    }

    /// Node `i` may not read anyone (every posted read is refused).
    pub fn deny_reads(&self, i: u32) {
        self.lock().ports[i as usize].deny_reads = true;
    }

    /// Receiver pacing: node `i` takes at most this many datagrams a millisecond.
    pub fn set_rx_per_ms(&self, i: u32, limit: u32) {
        self.lock().ports[i as usize].rx_per_ms = Some(limit);
    }

    /// Datagrams waiting at node `i` beyond this many are dropped.
    pub fn set_backlog_cap(&self, i: u32, cap: usize) {
        self.lock().ports[i as usize].backlog_cap = cap;
    }

    pub fn backlog_drops(&self, i: u32) -> u64 {
        self.lock().ports[i as usize].backlog_drops
    }

    pub fn set_link(&self, link: Link) {
        self.lock().wire.link = link;
    }

    /// The process of node `i` dies: it sends and receives nothing more, and
    /// datagrams to it are reported unreachable (as shm reports a dead pid).
    pub fn kill(&self, i: u32) {
        let mut n = self.lock();
        let p = &mut n.ports[i as usize];
        p.alive = false;
        p.inbox.clear();
    }

    /// Node `i` runs again (a restarted process on the same address).
    pub fn revive(&self, i: u32) {
        self.lock().ports[i as usize].alive = true;
    }

    pub fn alive(&self, i: u32) -> bool {
        self.lock().ports[i as usize].alive
    }

    /// Datagrams node `i` sent, and how many of them did not come from a
    /// transmit buffer it lent.
    pub fn sent(&self, i: u32) -> (u64, u64) {
        let n = self.lock();
        (n.ports[i as usize].sent, n.ports[i as usize].sent_from_elsewhere)
    }

    /// Datagrams put on the wire so far.
    pub fn datagrams(&self) -> u64 {
        self.lock().datagrams
    }

    /// Injects a raw datagram.
    pub fn inject(&self, from: u32, to: u32, data: Vec<u8>) {
        let mut n = self.lock();
        let at = n.now;
        n.wire.push(at, from, to, data);
    }

    /// Reads posted since the last call, for the harness to serve.
    pub fn take_reads(&self) -> Vec<PostedRead> {
        self.lock().reads.drain(..).collect()
    }

    pub fn has_reads(&self) -> bool {
        !self.lock().reads.is_empty()
    }

    /// Finishes a read of node `node` (the harness served it).
    pub fn complete_read(&self, node: u32, done: ReadDone) {
        self.lock().ports[node as usize].reads_done.push_back(done);
    }

    /// When the network next has something to do (a datagram to deliver, a
    /// paced backlog to drain).
    pub fn next_event(&self) -> Option<Instant> {
        let n = self.lock();
        let packet = n.wire.next_arrival();
        let backlog = n
            .ports
            .iter()
            .any(|p| p.alive && !p.inbox.is_empty() && p.rx_per_ms.is_some())
            .then(|| n.now + Duration::from_micros(100));
        let inbox = n.ports.iter().any(|p| p.alive && !p.inbox.is_empty() && p.rx_per_ms.is_none()).then_some(n.now);
        [packet, backlog, inbox].into_iter().flatten().min()
    }

    /// Moves the clock to `t` (never back) and delivers what is due into the
    /// nodes' receive queues.
    pub fn advance(&self, t: Instant) {
        let mut n = self.lock();
        n.now = n.now.max(t);
        let now = n.now;
        while let Some(p) = n.wire.pop_arrived(now) {
            let port = &mut n.ports[p.to as usize];
            if !port.alive {
                continue;
            }
            if port.inbox.len() >= port.backlog_cap {
                port.backlog_drops += 1;
            } else {
                port.inbox.push_back((p.from, p.data));
            }
        }
    }
}

impl NetState {
    fn put(&mut self, from: u32, to: u32, data: Vec<u8>) {
        self.datagrams += 1;
        let now = self.now;
        self.wire.put(now, from, to, data);
    }
}

/// One node's device on a [`SimNet`].
pub struct SimDevice {
    net: SimNet,
    me: u32,
}

impl SimDevice {
    pub fn node(&self) -> u32 {
        self.me
    }
}

impl Device for SimDevice {
    /// The port's caps, with the largest transmit any of its paths takes.
    fn caps(&self) -> DeviceCaps {
        let n = self.net.lock();
        let port = &n.ports[self.me as usize];
        let largest =
            port.paths.values().map(|c| c.max_transmit.max(c.mtu)).chain([port.caps.max_transmit, port.caps.mtu]).max();
        DeviceCaps { max_transmit: largest.unwrap_or(0), ..port.caps }
    }

    fn caps_for(&self, peer: &DevAddr) -> DeviceCaps {
        let n = self.net.lock();
        let port = &n.ports[self.me as usize];
        node_of(peer).and_then(|j| port.paths.get(&j).copied()).unwrap_or(port.caps)
    }

    fn local_addrs(&self) -> Vec<DevAddr> {
        vec![addr(self.me)]
    }

    fn owns(&self, a: &DevAddr) -> bool {
        node_of(a).is_some()
    }

    /// As shm: on a reliable, ordered path, a destination resolves to its
    /// node, and a write puts the datagram together from its parts and sends
    /// it as `send_batch` would.
    fn resolve(&mut self, dst: &DevAddr) -> Result<Option<Dest>, DeviceError> {
        let path = self.caps_for(dst);
        if !(self.net.lock().gathered_writes && path.reliable && path.ordered) {
            return Ok(None);
        }
        Ok(node_of(dst).map(|j| Dest(j as u64)))
    }

    fn write(&mut self, now: Instant, dest: Dest, parts: &[&[u8]]) -> Result<bool, DeviceError> {
        if !self.net.lock().gathered_writes {
            return Ok(false);
        }
        let whole: Vec<u8> = parts.concat();
        Ok(self.send_batch(now, &[TxDatagram::new(addr(dest.0 as u32), &whole)])? == 1)
    }

    fn send_batch(&mut self, _now: Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        // It cannot gather (only RDMA paths form such datagrams).
        let batch = crate::device::until_gathered(batch)?;
        let mut n = self.net.lock();
        if !n.ports[self.me as usize].alive {
            return Ok(batch.len());
        }
        for (k, d) in batch.iter().enumerate() {
            let Some(to) = node_of(&d.dst).filter(|&j| (j as usize) < n.ports.len()) else {
                if k == 0 {
                    return Err(DeviceError::Unreachable(d.dst));
                }
                return Ok(k);
            };
            // A dead process's queue is gone: the send fails at once, as shm
            // fails a ring whose owner died.
            if !n.ports[to as usize].alive {
                if k == 0 {
                    return Err(DeviceError::Unreachable(d.dst));
                }
                return Ok(k);
            }
            // Larger than the path carries: refused, as a real device does.
            let mtu = n.ports[self.me as usize].paths.get(&to).copied().unwrap_or(n.ports[self.me as usize].caps).mtu;
            let longest = if d.is_run() { d.seg } else { d.wire_len() };
            if longest > mtu {
                if k == 0 {
                    return Err(DeviceError::TooLarge { len: longest, mtu });
                }
                return Ok(k);
            }
            let start = d.data.as_ptr() as usize;
            let port = &mut n.ports[self.me as usize];
            let lent = port.lent.iter().any(|&(a, len)| a <= start && start + d.data.len() <= a + len);
            // A zero-length datagram is one datagram (chunks() yields none).
            let empty: &[&[u8]] = &[&[]];
            let pieces: Box<dyn Iterator<Item = &[u8]>> =
                if d.data.is_empty() { Box::new(empty.iter().copied()) } else { Box::new(d.data.chunks(d.seg.max(1))) };
            for piece in pieces {
                let port = &mut n.ports[self.me as usize];
                port.sent += 1;
                if !lent {
                    port.sent_from_elsewhere += 1;
                }
                n.put(self.me, to, piece.to_vec());
            }
        }
        Ok(batch.len())
    }

    /// Quiet when nothing waits in the port's inbox (it reports no
    /// unreachable destination: a send to a dead process fails at once), so
    /// that every simulated endpoint takes the idle check real ones take.
    fn quiet(&mut self) -> bool {
        let n = self.net.lock();
        let port = &n.ports[self.me as usize];
        !port.alive || port.inbox.is_empty()
    }

    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        let mut got = Vec::new();
        {
            let mut n = self.net.lock();
            let now = n.now;
            let port = &mut n.ports[self.me as usize];
            if !port.alive {
                return Ok(0);
            }
            if let Some(limit) = port.rx_per_ms {
                if now.saturating_duration_since(port.rx_window_start) >= Duration::from_millis(1) {
                    port.rx_window_start = now;
                    port.rx_budget = limit;
                }
            }
            while got.len() < max {
                if port.rx_per_ms.is_some() {
                    if port.rx_budget == 0 {
                        break;
                    }
                    port.rx_budget -= 1;
                }
                let Some(d) = port.inbox.pop_front() else { break };
                got.push(d);
            }
        }
        for (from, data) in &got {
            deliver(addr(*from), data);
        }
        Ok(got.len())
    }

    fn transmit_buffers(&mut self, count: usize, len: usize) -> Vec<Box<[u8]>> {
        let bufs: Vec<Box<[u8]>> = (0..count).map(|_| vec![0u8; len].into_boxed_slice()).collect();
        let mut n = self.net.lock();
        let port = &mut n.ports[self.me as usize];
        port.lent.extend(bufs.iter().map(|b| (b.as_ptr() as usize, b.len())));
        bufs
    }

    fn wait_fd(&self) -> Option<RawFd> {
        None
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }
}

impl RemoteReads for SimDevice {
    /// Queued for the harness, which serves it between steps (so it
    /// completes later, as an RDMA read does). On a path that needs keys,
    /// each run must carry the peer's key and a local one.
    fn post_read(
        &mut self,
        _now: crate::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        let Some(j) = node_of(&peer) else { return Err(DeviceError::Unreachable(peer)) };
        let caps = self.caps_for(&peer);
        let mut n = self.net.lock();
        if n.ports[self.me as usize].deny_reads || !caps.remote_read {
            return Err(DeviceError::Unsupported);
        }
        if n.ports[self.me as usize].conns.is_some() {
            let now = n.now;
            let me = addr(self.me);
            let peer_has_end = n.ports[j as usize].conns.as_ref().is_some_and(|c| c.has_passive(&me));
            let conns = n.ports[self.me as usize].conns.as_mut().expect("checked");
            conns.expire(now, &mut ModelQueues);
            if conns.route(now, peer, &mut ModelQueues).is_none() {
                return Err(DeviceError::NotConnected);
            }
            if !peer_has_end {
                // The peer's end is gone (it restarted): the read fails as
                // on a broken queue pair, and the connection goes.
                conns.broken(now, peer, &mut ModelQueues);
                n.ports[self.me as usize].reads_done.push_back(ReadDone {
                    id,
                    bytes: 0,
                    error: Some(DeviceError::NotConnected),
                });
                return Ok(());
            }
        }
        if caps.registration && runs.iter().any(|r| r.remote_key.is_none() || r.local.key().is_none()) {
            return Err(DeviceError::Config("a read on a registering path without a key".into()));
        }
        // Opened from a domain: each local key must be one of its live
        // registrations over the run's destination (verbs checks the lkey
        // against the queue pair's protection domain the same way).
        if let Some(d) = n.ports[self.me as usize].domain {
            if let Some(r) = runs
                .iter()
                .find(|r| !r.local.key().is_some_and(|k| covers(&n.domains[d], k, r.local.addr(), r.local.len())))
            {
                return Err(DeviceError::Config(format!(
                    "local protection error: key {:?} is not a registration of this domain over {:#x}+{}",
                    r.local.key(),
                    r.local.addr(),
                    r.local.len()
                )));
            }
        }
        n.reads.push_back(PostedRead { node: self.me, peer: j, id, runs: runs.to_vec() });
        Ok(())
    }

    fn poll_read(&mut self, _now: crate::time::Instant) -> Option<ReadDone> {
        self.net.lock().ports[self.me as usize].reads_done.pop_front()
    }

    fn poll_control(&mut self) -> Option<(DevAddr, ControlMsg)> {
        let mut n = self.net.lock();
        let (to, m) = n.ports[self.me as usize].conns.as_mut()?.poll_message()?;
        Some((to, ControlMsg::new(&m.encode()).expect("a handshake message fits")))
    }

    fn handle_control(&mut self, _now: crate::time::Instant, from: DevAddr, bytes: &[u8]) {
        let mut n = self.net.lock();
        let now = n.now;
        if let Some(c) = n.ports[self.me as usize].conns.as_mut() {
            c.handle(now, from, bytes, &mut ModelQueues);
        }
    }

    fn peer_failed(&mut self, peer: DevAddr) {
        if let Some(c) = self.net.lock().ports[self.me as usize].conns.as_mut() {
            c.peer_failed(&peer, &mut ModelQueues);
        }
    }

    fn read_conn_stats(&mut self) -> crate::device::ReadConnStats {
        let n = self.net.lock();
        n.ports[self.me as usize]
            .conns
            .as_ref()
            .map(|c| crate::device::ReadConnStats {
                conns: c.stats,
                open_active: c.active_len(),
                open_passive: c.passive_len(),
                queue_pairs: (c.active_len() + c.passive_len()) as u64,
                ..Default::default()
            })
            .unwrap_or_default()
    }
}

fn covers(regs: &HashMap<u64, (u64, u64)>, key: u64, addr: u64, len: u64) -> bool {
    regs.get(&key).is_some_and(|&(a, l)| a <= addr && addr.checked_add(len).is_some_and(|e| e <= a + l))
}

/// A domain of the simulated network: the model of the device context a
/// verbs or SRD domain has. Endpoints open their queues from it, and memory
/// registered through its registrar is valid as a local read key on every one
/// of them, and on no endpoint of another domain.
pub struct SimContext {
    net: SimNet,
    domain: usize,
    nodes: Mutex<VecDeque<u32>>,
}

impl DeviceContext for SimContext {
    fn open(&self, _spec: &OpenSpec) -> Result<Box<dyn Device>, DeviceError> {
        let me = self
            .nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
            .ok_or_else(|| DeviceError::Config("every node of this domain is open".into()))?;
        self.net.lock().ports[me as usize].domain = Some(self.domain);
        Ok(Box::new(self.net.device(me)))
    }

    fn registrar(&self) -> Option<Box<dyn Registrar>> {
        Some(Box::new(SimRegistrar { net: self.net.clone(), domain: self.domain }))
    }
}

struct SimRegistrar {
    net: SimNet,
    domain: usize,
}

impl Registrar for SimRegistrar {
    fn register(&mut self, addr: u64, len: u64, _access: u64) -> Result<u64, DeviceError> {
        let mut n = self.net.lock();
        let key = n.next_key;
        n.next_key += 1;
        n.domains[self.domain].insert(key, (addr, len));
        Ok(key)
    }

    fn deregister(&mut self, key: u64) {
        self.net.lock().domains[self.domain].remove(&key);
    }
}
