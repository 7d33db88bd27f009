//! The message engine fed arbitrary messages from a peer, with receives,
//! sends, one-sided operations and remote reads of its own in flight.
//!
//! `M` (`Sim(0)`) is a [`MsgEngine`] and its rdm engine, side by side as an
//! endpoint holds them, over application memory modelled as a `Vec`; the peer (`Sim(1)`) is a bare rdm engine whose messages the fuzzer
//! writes: any rndv packet with any field values (request ids kept small so
//! they hit live operations), or raw bytes. Strangers also throw raw
//! datagrams at `M`'s rdm engine. Checked:
//!
//! * nothing panics;
//! * the engine touches application memory only where it may: writes land in
//!   the receive area or in the writable registration, never in a send buffer
//!   or out of bounds; remote reads it asks for land in the receive area;
//! * each operation completes at most once, with a context that was posted;
//!   a receive reports at most the bytes of its buffer.
//!
//! It stays below [`rndv::Endpoint`] on purpose: the fuzzer writes the peer's
//! packets field by field and finishes remote reads in any order and any way,
//! which a whole endpoint over a device would never let it reach. The
//! `endpoint` target covers the object the provider calls.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rdm::engine::{Engine, EngineConfig, Event};
use rdm::{DeviceCaps, Instant};
use rndv::atomic::{Datatype, Op as AOp};
use rndv::engine::{
    Access, Action, AtomicRequest, Config, Io, IoBuf, IoList, Memory, MsgEngine, OpKind, OpMeta, OutMsg, ReadOutcome,
    RecvSpec, RmaTarget,
};
use rndv::wire::rendezvous::{RemoteIov, Rts, MAX_IOV};
use rndv::wire::rma::Status;
use rndv::wire::Packet;
use rndv::{FinStatus, MsgHeader, MsgKind, Src};
use std::collections::HashSet;
use std::time::Duration;

const JOB: u64 = 77;
const BASE: u64 = 0x10_0000;
/// Receive area, writable registration, send area: 16 KiB each.
const AREA: u64 = 16 << 10;
const RECV: u64 = BASE;
const REG: u64 = BASE + AREA;
const SEND: u64 = BASE + 2 * AREA;
const KEY_RW: u64 = 1;
const KEY_RO: u64 = 2;

struct Mem {
    bytes: Vec<u8>,
}

impl Mem {
    fn range(&self, addr: u64, len: usize) -> std::ops::Range<usize> {
        let o = addr.checked_sub(BASE).expect("address below application memory") as usize;
        assert!(o + len <= self.bytes.len(), "access past application memory: {addr:#x}+{len}");
        o..o + len
    }
}

impl Memory for Mem {
    fn write(&mut self, addr: u64, data: &[u8]) {
        assert!(
            addr >= RECV && addr + data.len() as u64 <= SEND,
            "write outside the receive area and registration: {addr:#x}+{}",
            data.len()
        );
        let r = self.range(addr, data.len());
        self.bytes[r].copy_from_slice(data);
    }
    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        let r = self.range(addr, len);
        out.extend_from_slice(&self.bytes[r]);
    }
    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        let r = self.range(addr, len);
        &self.bytes[r]
    }
    fn rma_target(&mut self, key: u64, addr: u64, len: u64, access: Access, _job: u64) -> Result<Vec<IoBuf>, Status> {
        // The writable registration, or a read-only view of the send area.
        let (a, l) = match key {
            KEY_RW => (REG, AREA),
            KEY_RO if access == Access::RemoteRead => (SEND, AREA),
            KEY_RO => return Err(Status::Access),
            _ => return Err(Status::NoKey),
        };
        if addr < a || addr.checked_add(len).is_none_or(|e| e > a + l) {
            return Err(Status::Access);
        }
        // Two pieces when it can be split, to exercise gathers.
        if len >= 2 {
            Ok(vec![IoBuf { addr, len: len / 2 }, IoBuf { addr: addr + len / 2, len: len - len / 2 }])
        } else {
            Ok(vec![IoBuf { addr, len }])
        }
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Iov {
    off: u16,
    len: u16,
}

fn iolist(base: u64, iovs: &[Iov]) -> IoList {
    let mut l = IoList::default();
    for v in iovs.iter().take(MAX_IOV) {
        let off = v.off as u64 % AREA;
        let len = v.len as u64 % (AREA - off + 1);
        l.bufs[l.count] = IoBuf { addr: base + off, len };
        l.count += 1;
    }
    l
}

/// A packet the peer sends, field by field; request ids are small.
#[derive(Arbitrary, Debug)]
enum Pkt {
    Msg { tagged: bool, tag: u8, data: Option<u64>, len: u16 },
    Rts { tagged: bool, tag: u8, req: u8, iov: Vec<(u64, u16)> },
    Fin { req: u8, status: u8, read: u64 },
    Push { req: u8, offset: u16, len: u16 },
    Cts { req: u8, offset: u16, len: u32 },
    Write { req: u8, key: u8, off: u16, data: Option<u64>, len: u16 },
    ReadReq { req: u8, key: u8, off: u16, len: u16 },
    ReadResp { req: u8, status: u8, len: u16 },
    Atomic { req: u8, key: u8, off: u16, datatype: u8, op: u8, count: u8, fetch: bool, payload: Vec<u8> },
    AtomicResp { req: u8, status: u8, payload: Vec<u8> },
    WriteAck { req: u8, status: u8 },
    Keepalive,
    Raw(Vec<u8>),
}

fn status(b: u8) -> Status {
    [Status::Ok, Status::NoKey, Status::Access, Status::Invalid][b as usize % 4]
}

/// The bytes the peer sends for `p`, through the real encoder
/// (`Packet::encode`); `Raw` bytes as given.
fn encode(p: &Pkt) -> Vec<u8> {
    let fill = |n: u16| -> Vec<u8> { (0..n % 9000).map(|i| i as u8).collect() };
    let kind = |tagged: bool| if tagged { MsgKind::Tagged } else { MsgKind::Msg };
    let mut v = Vec::new();
    let payload: Vec<u8>;
    let packet = match p {
        Pkt::Msg { tagged, tag, data, len } => {
            payload = fill(*len);
            Packet::Msg(MsgHeader { kind: kind(*tagged), tag: *tag as u64, data: *data }, &payload)
        }
        Pkt::Rts { tagged, tag, req, iov } => {
            let mut r = Rts {
                header: MsgHeader { kind: kind(*tagged), tag: *tag as u64, data: None },
                req: *req as u64,
                total: 0,
                iov: [RemoteIov::default(); MAX_IOV],
                iov_count: 0,
            };
            for &(addr, len) in iov.iter().take(MAX_IOV) {
                r.iov[r.iov_count] = RemoteIov { addr: addr % (1 << 48), len: len as u64, key: None };
                r.total += len as u64;
                r.iov_count += 1;
            }
            Packet::Rts(r)
        }
        Pkt::Fin { req, status, read } => {
            let status = [FinStatus::Done, FinStatus::Discarded, FinStatus::Failed][*status as usize % 3];
            Packet::Fin { req: *req as u64, status, read: *read }
        }
        Pkt::Push { req, offset, len } => {
            payload = fill(*len);
            Packet::Push { req: *req as u64, offset: *offset as u64, payload: &payload }
        }
        Pkt::Cts { req, offset, len } => Packet::Cts { req: *req as u64, offset: *offset as u64, len: *len as u64 },
        Pkt::Write { req, key, off, data, len } => {
            payload = fill(*len);
            Packet::Write {
                req: *req as u64,
                key: *key as u64 % 4,
                addr: REG + *off as u64,
                data: *data,
                payload: &payload,
            }
        }
        Pkt::ReadReq { req, key, off, len } => {
            let base = if key % 2 == 0 { REG } else { SEND };
            Packet::ReadReq { req: *req as u64, key: *key as u64 % 4, addr: base + *off as u64, len: *len as u64 }
        }
        Pkt::ReadResp { req, status: s, len } => {
            payload = fill(*len);
            Packet::ReadResp { req: *req as u64, status: status(*s), payload: &payload }
        }
        Pkt::Atomic { req, key, off, datatype, op, count, fetch, payload } => Packet::Atomic {
            req: *req as u64,
            key: *key as u64 % 4,
            addr: REG + *off as u64,
            datatype: *datatype % 16,
            op: *op % 24,
            count: *count as u32,
            fetch: *fetch,
            payload,
        },
        Pkt::AtomicResp { req, status: s, payload } => {
            Packet::AtomicResp { req: *req as u64, status: status(*s), payload }
        }
        Pkt::WriteAck { req, status: s } => Packet::WriteAck { req: *req as u64, status: status(*s) },
        Pkt::Keepalive => Packet::Keepalive,
        Pkt::Raw(b) => return b.clone(),
    };
    packet.encode(&mut v);
    v
}

#[derive(Arbitrary, Debug)]
enum Op {
    FromPeer(Pkt),
    /// A raw datagram at M's rdm engine from a stranger.
    Stranger {
        n: u8,
        bytes: Vec<u8>,
    },
    PostRecv {
        tagged: bool,
        any: bool,
        tag: u8,
        ignore: u8,
        iov: Vec<Iov>,
        multi: bool,
    },
    Send {
        tagged: bool,
        tag: u8,
        iov: Vec<Iov>,
    },
    RmaWrite {
        key: u64,
        addr: u64,
        iov: Iov,
    },
    RmaRead {
        key: u64,
        addr: u64,
        iov: Vec<Iov>,
    },
    Atomic {
        datatype: u8,
        op: u8,
        count: u8,
        fetch: bool,
        compare: bool,
        res: Iov,
    },
    Peek {
        tagged: bool,
        tag: u8,
        claim: bool,
        discard: bool,
    },
    Claim {
        which: u8,
        discard: bool,
        iov: Vec<Iov>,
    },
    Cancel {
        which: u8,
    },
    /// Finish the oldest remote read asked for.
    ReadDone {
        outcome: u8,
        n: u16,
    },
    /// Deliver M's datagrams to the peer (acks flow), or lose them.
    Flush {
        lose: bool,
    },
    Advance {
        millis: u16,
    },
    Unreachable,
}

struct Harness {
    /// M's two engines, side by side as the endpoint holds them.
    rdm: Engine,
    m: MsgEngine,
    mem: Mem,
    peer: Engine,
    /// M's handle for the peer.
    p: rdm::engine::PeerId,
    now: Instant,
    buf: Vec<u8>,
    next_ctx: u64,
    /// Contexts of operations not yet completed (multi-receives may complete
    /// several times).
    open: HashSet<u64>,
    multi: HashSet<u64>,
    done: HashSet<u64>,
    /// Receive contexts -> buffer length.
    recv_len: std::collections::HashMap<u64, u64>,
    peeked: Vec<u64>,
    /// Peeks not yet answered (their completion reports the message's length).
    peeking: HashSet<u64>,
    actions: std::collections::VecDeque<Action>,
}

impl Harness {
    fn ctx(&mut self) -> u64 {
        self.next_ctx += 1;
        self.open.insert(self.next_ctx);
        self.next_ctx
    }

    fn meta(ctx: u64) -> OpMeta {
        OpMeta { context: ctx, wanted: true, ..OpMeta::default() }
    }

    fn from_peer(&mut self, msg: &[u8]) {
        let m_addr = rdm::simnet::addr(0);
        let pid = self.peer.peer(m_addr);
        let _ = self.peer.send(self.now, pid, &[msg], 0);
        while let Some(t) = self.peer.poll_transmit(self.now, &mut self.buf) {
            for d in self.buf[..t.len].chunks(t.seg) {
                self.rdm.handle_datagram(self.now, rdm::simnet::addr(1), d);
            }
        }
    }

    fn flush(&mut self, lose: bool) {
        while let Some(t) = self.rdm.poll_transmit(self.now, &mut self.buf) {
            if !lose && t.dst == rdm::simnet::addr(1) {
                let d = self.buf[..t.len].to_vec();
                for s in d.chunks(t.seg) {
                    self.peer.handle_datagram(self.now, rdm::simnet::addr(0), s);
                }
            }
        }
        while let Some(ev) = self.peer.poll_event() {
            if let Event::Delivered { msg, .. } = ev {
                self.peer.recycle(msg);
            }
        }
    }

    fn spec(&mut self, tagged: bool, any: bool, tag: u8, ignore: u8, iov: &[Iov], multi: bool) -> RecvSpec {
        let ctx = self.ctx();
        let iov = iolist(RECV, if multi { &iov[..iov.len().min(1)] } else { iov });
        let iov = if multi && iov.count == 0 { IoList::one(RECV, 64) } else { iov };
        self.recv_len.insert(ctx, iov.total());
        if multi {
            self.multi.insert(ctx);
        }
        RecvSpec {
            kind: if tagged { MsgKind::Tagged } else { MsgKind::Msg },
            src: if any { Src::Any } else { Src::Peer(self.p) },
            tag: tag as u64,
            ignore: ignore as u64,
            iov,
            multi: multi && !tagged,
            meta: Self::meta(ctx),
        }
    }

    fn run(&mut self, op: Op) {
        let now = self.now;
        match op {
            Op::FromPeer(p) => {
                let b = encode(&p);
                self.from_peer(&b);
            }
            Op::Stranger { n, bytes } => self.rdm.handle_datagram(now, rdm::simnet::addr(2 + n as u32 % 4), &bytes),
            Op::PostRecv { tagged, any, tag, ignore, iov, multi } => {
                let spec = self.spec(tagged, any, tag, ignore, &iov, multi);
                self.m.post_recv(Io::new(&mut self.rdm, now), spec, &mut self.mem);
            }
            Op::Send { tagged, tag, iov } => {
                let user = iolist(SEND, &iov);
                let ctx = self.ctx();
                let parts: Vec<&[u8]> = user.iter().map(|b| self.mem.bytes(b.addr, b.len as usize)).collect();
                let h = MsgHeader {
                    kind: if tagged { MsgKind::Tagged } else { MsgKind::Msg },
                    tag: tag as u64,
                    data: None,
                };
                if self
                    .m
                    .send(
                        Io::new(&mut self.rdm, now),
                        OutMsg { peer: self.p, header: h, payload: &parts, user, meta: Self::meta(ctx) },
                    )
                    .is_err()
                {
                    self.open.remove(&ctx);
                }
            }
            Op::RmaWrite { key, addr, iov } => {
                let src = iolist(SEND, &[iov]);
                let data = self.mem.bytes(src.bufs[0].addr, src.bufs[0].len as usize).to_vec();
                let ctx = self.ctx();
                if self
                    .m
                    .rma_write(
                        Io::new(&mut self.rdm, now),
                        RmaTarget { peer: self.p, key, addr },
                        &[&data],
                        None,
                        Self::meta(ctx),
                    )
                    .is_err()
                {
                    self.open.remove(&ctx);
                }
            }
            Op::RmaRead { key, addr, iov } => {
                let dst = iolist(RECV, &iov);
                let ctx = self.ctx();
                if self
                    .m
                    .rma_read(Io::new(&mut self.rdm, now), RmaTarget { peer: self.p, key, addr }, dst, Self::meta(ctx))
                    .is_err()
                {
                    self.open.remove(&ctx);
                }
            }
            Op::Atomic { datatype, op, count, fetch, compare, res } => {
                let (Some(dt), Some(o)) = (Datatype::from_wire(datatype % 16), AOp::from_wire(op % 24)) else { return };
                let count = count as usize % 8;
                let bytes = count * dt.size();
                let operand = vec![1u8; bytes];
                let cmp = vec![2u8; bytes];
                let result = iolist(RECV, &[res]);
                let ctx = self.ctx();
                let compare: Vec<&[u8]> = if compare { vec![&cmp] } else { vec![] };
                if self
                    .m
                    .atomic(
                        Io::new(&mut self.rdm, now),
                        AtomicRequest {
                            target: RmaTarget { peer: self.p, key: KEY_RW, addr: REG },
                            datatype: dt,
                            op: o,
                            count,
                            operand: &[&operand],
                            compare: &compare,
                            result,
                            fetch,
                        },
                        Self::meta(ctx),
                    )
                    .is_err()
                {
                    self.open.remove(&ctx);
                }
            }
            Op::Peek { tagged, tag, claim, discard } => {
                let spec = self.spec(tagged, true, tag, 0, &[], false);
                let ctx = spec.meta.context;
                self.peeking.insert(ctx);
                self.m.peek(Io::new(&mut self.rdm, now), spec, claim, discard);
                if claim && !discard {
                    self.peeked.push(ctx);
                }
            }
            Op::Claim { which, discard, iov } => {
                if self.peeked.is_empty() {
                    return;
                }
                let ctx = self.peeked.remove(which as usize % self.peeked.len());
                // The claiming receive reuses the peek's context.
                self.open.insert(ctx);
                self.done.remove(&ctx);
                let mut spec = self.spec(false, true, 0, 0, &iov, false);
                self.open.remove(&spec.meta.context);
                self.recv_len.insert(ctx, spec.iov.total());
                spec.meta.context = ctx;
                let _ = self.m.claim(Io::new(&mut self.rdm, now), spec, discard, &mut self.mem);
            }
            Op::Cancel { which } => {
                let ctx = which as u64 % (self.next_ctx + 1);
                self.m.cancel(ctx);
            }
            Op::ReadDone { outcome, n } => {
                let Some(Action::RemoteRead { id, src, src_count, dst, .. }) = self.actions.pop_front() else { return };
                assert!(src_count >= 1 && src_count <= MAX_IOV);
                for b in dst.iter() {
                    assert!(
                        b.addr >= RECV && b.addr + b.len <= RECV + AREA,
                        "a remote read into {:#x}+{}",
                        b.addr,
                        b.len
                    );
                }
                let n = (n as u64).min(dst.total()).min(src[..src_count].iter().map(|v| v.len).sum());
                let outcome = match outcome % 3 {
                    0 => ReadOutcome::Done(n),
                    1 => ReadOutcome::NotPermitted,
                    _ => ReadOutcome::Failed(n),
                };
                self.m.remote_read_done(Io::new(&mut self.rdm, now), id, outcome);
            }
            Op::Flush { lose } => self.flush(lose),
            Op::Advance { millis } => self.now = self.now + Duration::from_millis(millis as u64 % 10_000),
            Op::Unreachable => self.m.handle_unreachable(&mut self.rdm, rdm::simnet::addr(1)),
        }
        self.step();
    }

    fn step(&mut self) {
        let now = self.now;
        if self.m.poll_timeout().is_some_and(|t| t <= now) {
            self.m.handle_timeout(Io::new(&mut self.rdm, now));
        }
        if self.rdm.poll_timeout().is_some_and(|t| t <= now) {
            self.rdm.handle_timeout(now);
        }
        if self.peer.poll_timeout().is_some_and(|t| t <= now) {
            self.peer.handle_timeout(now);
        }
        self.m.handle_events(Io::new(&mut self.rdm, now), &mut self.mem);
        while let Some(a) = self.m.poll_action() {
            self.actions.push_back(a);
        }
        while let Some(c) = self.m.poll_completion() {
            let ctx = c.meta.context;
            if matches!(c.kind, OpKind::RemoteWrite | OpKind::RemoteRead) {
                assert_eq!(ctx, 0, "a served operation with a context");
                continue;
            }
            assert!(
                self.open.contains(&ctx) || (self.multi.contains(&ctx) && self.done.contains(&ctx)),
                "completion for context {ctx} not open: {c:?}"
            );
            if c.kind == OpKind::Recv && !self.peeking.remove(&ctx) {
                let cap = self.recv_len.get(&ctx).copied().unwrap_or(0);
                assert!(c.len as u64 <= cap, "receive {ctx} reports {} bytes in a {cap}-byte buffer", c.len);
            }
            if !self.multi.contains(&ctx) || c.multi_done || c.err.is_some() {
                self.open.remove(&ctx);
            }
            self.done.insert(ctx);
        }
        // Drop M's datagrams to strangers; those to the peer wait for Flush.
    }
}

fuzz_target!(|input: (bool, Vec<Op>)| {
    let (remote_read, ops) = input;
    let cfg = EngineConfig {
        job_key: JOB,
        incarnation: 1,
        mtu: 1400,
        peer_timeout: Duration::from_secs(2),
        ..EngineConfig::default()
    };
    let mut rdm = Engine::new(cfg.clone());
    let m = MsgEngine::new(Config {
        rndv_threshold: 512,
        window_threshold: 1024,
        window: 4096,
        unexpected_limit: 64 << 10,
        keepalive: Duration::from_millis(200),
        ..Config::default()
    });
    let p = rdm.peer_with_path(
        rdm::simnet::addr(1),
        &DeviceCaps {
            reliable: false,
            ordered: false,
            mtu: 1400,
            remote_read,
            gso: false,
            registration: false,
            max_inline: 0,
            max_transmit: 1400,
        },
    );
    let mut bytes = vec![0u8; 3 * AREA as usize];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 7) as u8;
    }
    let mut h = Harness {
        rdm,
        m,
        mem: Mem { bytes },
        peer: Engine::new(EngineConfig { incarnation: 2, ..cfg }),
        p,
        now: Instant::from_nanos(1_000_000),
        buf: vec![0u8; 65536],
        next_ctx: 0,
        open: HashSet::new(),
        multi: HashSet::new(),
        done: HashSet::new(),
        recv_len: Default::default(),
        peeked: Vec::new(),
        peeking: HashSet::new(),
        actions: Default::default(),
    };
    for op in ops.into_iter().take(300) {
        h.run(op);
    }
});
