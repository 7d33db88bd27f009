//! An endpoint's data path: the device, the `rdm` engine and the `rndv` matcher,
//! driven by the application's calls (manual progress).
//!
//! Every posting call and every CQ/counter read runs [`EpShared::progress`]:
//! receive a batch from the device into the engine, fire due timers, turn engine
//! events into completions, and flush what the engine wants to transmit.
use crate::addr::RdmxAddr;
use crate::av::{SharedAv, FI_ADDR_NOTAVAIL, FI_ADDR_UNSPEC};
use crate::cntr::CntrShared;
use crate::cq::{Completion, CompletionError, CqShared};
use crate::error::{Error, Result};
use crate::info::Profile;
use crate::log::{fi_info, fi_warn, Subsys};
use crate::params::{params, DeviceChoice};
use crate::rendezvous::Landing;
use libfabric_sys as fi;
use parking_lot::Mutex;
use rdm::device::TxDatagram;
use rdm::engine::{Engine, EngineConfig, Event, PeerId};
use rdm::{DevAddr, Device};
use rndv::{Arrived, Matcher, MsgHeader, MsgKind, RecvPost, Src, HEADER_LEN};
use mr_cache::KeyTable;
use slab::Slab;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

/// Monotonic time for the engine, from one process-wide epoch.
pub fn now() -> rdm::Instant {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    rdm::Instant::from_nanos(epoch.elapsed().as_nanos() as u64)
}

fn random_u64() -> u64 {
    let mut v = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom(v.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if n == 8 {
        u64::from_le_bytes(v)
    } else {
        // No entropy syscall: time and pid still make a restart distinguishable.
        now().as_nanos() ^ ((std::process::id() as u64) << 32)
    }
}

/// A piece of application memory the provider writes received data into. The
/// application owns it and guarantees it stays valid until the receive completes
/// (libfabric's contract for posted buffers).
#[derive(Clone, Copy, Debug, Default)]
pub struct UserBuf {
    pub ptr: usize,
    pub len: usize,
}

const MAX_IOV: usize = crate::info::IOV_LIMIT;

#[derive(Clone, Copy, Debug, Default)]
pub struct UserIov {
    pub bufs: [UserBuf; MAX_IOV],
    pub count: usize,
}

impl UserIov {
    pub fn total(&self) -> usize {
        self.bufs[..self.count].iter().map(|b| b.len).sum()
    }

    /// Copies `data` into the buffers; returns the bytes written.
    pub(crate) fn scatter(&self, data: &[u8]) -> usize {
        let mut off = 0;
        for b in &self.bufs[..self.count] {
            if off >= data.len() {
                break;
            }
            let n = b.len.min(data.len() - off);
            if n > 0 {
                // SAFETY: the application posted this buffer of `b.len` bytes and
                // keeps it valid until its receive completes, which is now.
                unsafe { std::ptr::copy_nonoverlapping(data[off..].as_ptr(), b.ptr as *mut u8, n) };
            }
            off += n;
        }
        off
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct TxOp {
    context: usize,
    flags: u64,
    len: usize,
    completion: bool,
    /// An `fi_inject*` call: it has no context, so a failure cannot go to a CQ
    /// (OpenMPI dereferences the context of every error entry).
    inject: bool,
    /// A long message announced by a ready-to-send: the send completes when the
    /// receiver's `Fin` arrives (see [`crate::rendezvous`]).
    pub(crate) rndv: Option<crate::rendezvous::RndvTx>,
}

impl TxOp {
    pub(crate) fn new(context: usize, flags: u64, len: usize, completion: bool, rndv: Option<crate::rendezvous::RndvTx>) -> TxOp {
        TxOp { context, flags, len, completion, inject: false, rndv }
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct RxOp {
    iov: UserIov,
    context: usize,
    completion: bool,
    /// FI_MULTI_RECV: bytes of the buffer already filled.
    multi_offset: Option<usize>,
}

/// What a send carries.
pub struct SendArgs<'a> {
    pub kind: MsgKind,
    pub dest: u64,
    pub payload: &'a [&'a [u8]],
    pub tag: u64,
    pub data: Option<u64>,
    pub context: usize,
    pub flags: u64,
    /// An `fi_inject*` call: never generates a completion.
    pub inject: bool,
}

/// What a receive accepts.
pub struct RecvArgs {
    pub kind: MsgKind,
    pub src: u64,
    pub iov: UserIov,
    pub tag: u64,
    pub ignore: u64,
    pub context: usize,
    pub flags: u64,
}

#[derive(Clone)]
pub struct CqBinding {
    pub cq: Arc<CqShared>,
    pub selective: bool,
}

const TX_BATCH: usize = 32;

/// Everything an enabled endpoint needs to move data.
pub struct Running {
    pub(crate) device: Box<dyn Device>,
    pub(crate) engine: Engine,
    pub(crate) matcher: Matcher,
    pub(crate) local: RdmxAddr,
    pub(crate) tx_ops: Slab<TxOp>,
    /// Outstanding RMA / atomic operations, keyed by the request id on the wire.
    pub(crate) rma_ops: Slab<crate::rma::RmaOp>,
    pub(crate) rx_ops: Slab<RxOp>,
    /// Datagrams pulled from the engine but not yet taken by the device.
    pub(crate) stage: Vec<Vec<u8>>,
    pub(crate) stage_dst: [DevAddr; TX_BATCH],
    pub(crate) stage_len: [usize; TX_BATCH],
    pub(crate) staged: usize,
    /// Cache of sender PeerId → fi_addr for FI_SOURCE, rebuilt on miss.
    pub(crate) src_cache: HashMap<PeerId, u64>,
    /// The AV generation `src_cache` was built against.
    pub(crate) src_cache_gen: u64,
    pub dropped_headers: u64,
    /// One-sided operations this endpoint started / served as target.
    pub(crate) rma_started: u64,
    pub(crate) rma_served: u64,
    /// Rendezvous state (see [`crate::rendezvous`]).
    pub(crate) rndv: crate::rendezvous::RndvState,
}

/// The endpoint state every libfabric object that drives progress can reach.
pub struct EpShared {
    state: Mutex<EpState>,
    /// Set to stop this endpoint's progress thread.
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by every application call, cleared by the background thread each
    /// period: the thread steps in only when the application has gone quiet.
    app_active: AtomicBool,
}

/// Stops every progress thread at provider cleanup (endpoints the application
/// never closed); threads must be gone before libfabric dlcloses us.
static STOP_ALL: AtomicBool = AtomicBool::new(false);
static THREADED: Mutex<Vec<Weak<EpShared>>> = Mutex::new(Vec::new());

pub struct EpState {
    pub profile: Profile,
    pub av: Option<SharedAv>,
    pub tx_cq: Option<CqBinding>,
    pub rx_cq: Option<CqBinding>,
    pub send_cntr: Option<Arc<CntrShared>>,
    pub recv_cntr: Option<Arc<CntrShared>>,
    /// RMA counters: initiator reads / writes (atomics count as writes), and
    /// target-side remote reads / writes.
    pub read_cntr: Option<Arc<CntrShared>>,
    pub write_cntr: Option<Arc<CntrShared>>,
    pub rread_cntr: Option<Arc<CntrShared>>,
    pub rwrite_cntr: Option<Arc<CntrShared>>,
    /// The EQ bound to the endpoint, and the endpoint's fid for its error
    /// events: where failures without an operation context are reported.
    pub eq: Option<(Arc<crate::eq::EqQueue>, usize)>,
    /// The domain's registrations (RMA targets) and whether RMA addresses are
    /// virtual addresses (FI_MR_VIRT_ADDR) or offsets into the registration.
    pub mr_keys: Arc<Mutex<KeyTable>>,
    pub mr_virt_addr: bool,
    pub min_multi_recv: usize,
    /// Messages reserved by FI_PEEK|FI_CLAIM, keyed by the operation context the
    /// later FI_CLAIM receive passes again.
    pub(crate) claimed: HashMap<usize, Arrived>,
    pub device: Option<Box<dyn Device>>,
    pub local: RdmxAddr,
    pub running: Option<Running>,
}

/// Opens the devices an endpoint uses and returns them with the local address.
fn open_device(profile: &Profile) -> Result<(Box<dyn Device>, RdmxAddr)> {
    let src = profile.src.unwrap_or(RdmxAddr { udp: None, host_id: 0, incarnation: 0, pid: 0, has_shm: false });
    let host_id = rdm::device::host::host_id();
    let incarnation = random_u64();
    let pid = std::process::id();
    let p = params();
    let udp_bind = || -> SocketAddr { src.udp.unwrap_or_else(|| SocketAddr::new(crate::info::default_ip(), 0)) };
    let choice = profile.device;
    let (dev, udp, has_shm): (Box<dyn Device>, Option<SocketAddr>, bool) = match choice {
        DeviceChoice::Udp => {
            let d = crate::devices::open_udp(udp_bind(), p.udp_mtu)?;
            let a = d.1;
            (d.0, Some(a), false)
        }
        DeviceChoice::Shm => (crate::devices::open_shm(incarnation)?, None, true),
        DeviceChoice::Auto => {
            let (d, a, shm) = crate::devices::open_auto(udp_bind(), p.udp_mtu, incarnation)?;
            (d, Some(a), shm)
        }
    };
    let dev = crate::devices::maybe_fault(dev, p);
    Ok((dev, RdmxAddr { udp, host_id, incarnation, pid, has_shm }))
}

impl EpShared {
    pub fn new(profile: Profile, mr_keys: Arc<Mutex<KeyTable>>, mr_virt_addr: bool) -> Result<Arc<EpShared>> {
        let (device, local) = open_device(&profile)?;
        Ok(Arc::new(EpShared {
            state: Mutex::new(EpState {
                profile,
                av: None,
                tx_cq: None,
                rx_cq: None,
                send_cntr: None,
                recv_cntr: None,
                read_cntr: None,
                write_cntr: None,
                rread_cntr: None,
                rwrite_cntr: None,
                eq: None,
                mr_keys,
                mr_virt_addr,
                min_multi_recv: 0,
                claimed: HashMap::new(),
                device: Some(device),
                local,
                running: None,
            }),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            app_active: AtomicBool::new(false),
        }))
    }

    /// The endpoint state, for an application call (which counts as the
    /// application driving progress).
    pub fn lock(&self) -> parking_lot::MutexGuard<'_, EpState> {
        // A plain store, not a clock read: this is on every data-path call.
        self.app_active.store(true, Ordering::Relaxed);
        self.state.lock()
    }

    /// Builds the engine and starts moving data (`fi_enable`).
    pub fn enable(self: &Arc<Self>) -> Result<()> {
        let auto = self.enable_engine()?;
        if auto && self.thread.lock().is_none() {
            self.start_progress_thread();
        }
        Ok(())
    }

    /// A thread that serves acks, retransmissions and incoming data while the
    /// application does not call into rdmx (it sleeps on the device and the
    /// engine's next timer). While the application is calling in, the thread
    /// stays out of its way. Without it, a manual-progress application that
    /// stops calling in after its last send would never retransmit a lost
    /// datagram, and its peer would wait forever.
    fn start_progress_thread(self: &Arc<Self>) {
        let weak: Weak<EpShared> = Arc::downgrade(self);
        let stop = self.stop.clone();
        let spawned = std::thread::Builder::new().name("rdmx-progress".into()).spawn(move || {
            // The application counts as active if it called in during the last
            // period; the thread then leaves progress to it.
            const APP_ACTIVE: Duration = Duration::from_millis(2);
            while !stop.load(Ordering::Acquire) && !STOP_ALL.load(Ordering::Acquire) {
                let Some(ep) = weak.upgrade() else { break };
                if ep.app_active.swap(false, Ordering::Relaxed) {
                    drop(ep);
                    std::thread::sleep(APP_ACTIVE);
                    continue;
                }
                wait_any(std::slice::from_ref(&ep), Duration::from_millis(10));
                if stop.load(Ordering::Acquire) {
                    break;
                }
                ep.progress_background();
            }
        });
        match spawned {
            Ok(h) => {
                *self.thread.lock() = Some(h);
                let mut all = THREADED.lock();
                all.retain(|w| w.strong_count() > 0);
                all.push(Arc::downgrade(self));
            }
            Err(e) => fi_warn!(Subsys::EpCtrl, "cannot start the progress thread: {e}"),
        }
    }

    /// Stops and joins this endpoint's progress thread (endpoint close).
    pub fn stop_progress_thread(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.thread.lock().take() {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Returns whether a progress thread is wanted.
    fn enable_engine(&self) -> Result<bool> {
        let mut st = self.state.lock();
        let auto = params().progress_thread;
        if st.running.is_some() {
            return Ok(auto);
        }
        if st.av.is_none() {
            return Err(Error::Inval("endpoint has no AV bound"));
        }
        if st.tx_cq.is_none() && st.rx_cq.is_none() && st.send_cntr.is_none() && st.recv_cntr.is_none() {
            return Err(Error::Inval("endpoint has no CQ or counter bound"));
        }
        let device = st.device.take().ok_or(Error::Other("endpoint lost its device".into()))?;
        let caps = device.caps();
        let p = params();
        let cfg = EngineConfig {
            mtu: caps.mtu,
            reliable: caps.reliable,
            ordered: caps.ordered,
            job_key: st.profile.auth_key.map(|(k, _)| k).unwrap_or(p.job_key),
            incarnation: st.local.incarnation,
            peer_timeout: p.peer_timeout,
            seed: st.local.incarnation,
            ..EngineConfig::default()
        };
        let local = st.local;
        fi_info!(Subsys::EpCtrl, "endpoint enabled at {} (mtu {}, reliable device: {})", local.to_uri(), caps.mtu, caps.reliable);
        st.running = Some(Running {
            device,
            engine: Engine::new(cfg),
            matcher: Matcher::new(),
            local,
            tx_ops: Slab::with_capacity(st.profile.tx_size),
            rma_ops: Slab::new(),
            rx_ops: Slab::with_capacity(st.profile.rx_size),
            stage: (0..TX_BATCH).map(|_| vec![0u8; caps.mtu.max(64)]).collect(),
            stage_dst: [DevAddr::Sim(0); TX_BATCH],
            stage_len: [0; TX_BATCH],
            staged: 0,
            src_cache: HashMap::new(),
            src_cache_gen: 0,
            dropped_headers: 0,
            rma_started: 0,
            rma_served: 0,
            rndv: Default::default(),
        });
        Ok(auto)
    }

    pub fn progress(&self) {
        let mut st = self.lock();
        st.progress();
    }

    /// Progress on behalf of an application that is not calling in.
    fn progress_background(&self) {
        let mut st = self.state.lock();
        st.progress();
    }

    /// Before a sleep: arms the device's wait fd and returns it with the engine's
    /// next deadline and whether input is already waiting (then do not sleep).
    fn prepare_wait(&self) -> (Option<RawFd>, Option<rdm::Instant>, bool) {
        let mut st = self.state.lock();
        match &mut st.running {
            Some(r) => {
                let ready = r.device.prepare_wait();
                (r.device.wait_fd(), r.engine.poll_timeout(), ready)
            }
            None => (None, None, false),
        }
    }

    /// `fi_trywait` for this endpoint: false when sleeping on the wait fd now
    /// could miss input that already arrived.
    pub fn try_wait(&self) -> bool {
        !self.prepare_wait().2
    }
}

impl EpState {
    pub(crate) fn peer_for(&mut self, fi_addr: u64) -> Result<PeerId> {
        let av = self.av.as_ref().ok_or(Error::Inval("no AV bound"))?;
        let a = av.read().get(fi_addr).ok_or(Error::Inval("destination not in the AV"))?;
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let dev = a
            .route(r.local.host_id, r.local.has_shm, r.local.udp.is_some())
            .ok_or(Error::AddrNotAvail)?;
        Ok(r.engine.peer(dev))
    }

    pub fn send(&mut self, args: SendArgs<'_>) -> Result<()> {
        let total: usize = args.payload.iter().map(|s| s.len()).sum();
        if total > crate::info::MAX_MSG_SIZE {
            return Err(Error::Inval("message larger than max_msg_size"));
        }
        if (args.inject || args.flags & fi::FI_INJECT as u64 != 0) && total > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let peer = self.peer_for(args.dest)?;
        let completion = !args.inject
            && match &self.tx_cq {
                Some(b) => !b.selective || args.flags & fi::FI_COMPLETION as u64 != 0,
                None => false,
            };
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        if r.tx_ops.len() >= self.profile.tx_size.max(1) * 4 {
            self.progress();
            return Err(Error::Again);
        }
        let op_flags = fi::FI_SEND as u64
            | match args.kind {
                MsgKind::Msg => fi::FI_MSG as u64,
                MsgKind::Tagged => fi::FI_TAGGED as u64,
            };
        let header = MsgHeader { kind: args.kind, tag: args.tag, data: args.data };
        if !args.inject && total >= params().rndv_threshold && r.rndv_possible(peer) {
            return self.send_rts(peer, header, &args, total, op_flags, completion);
        }
        let token = r.tx_ops.insert(TxOp { inject: args.inject, ..TxOp::new(args.context, op_flags, total, completion, None) });
        crate::log::debug_with(Subsys::EpData, "send", || format!("{total} bytes to {:?} token {token} inject {}", r.engine.peer_addr(peer), args.inject));
        let hdr = header.encode();
        let mut parts: [&[u8]; MAX_IOV + 1] = [&[]; MAX_IOV + 1];
        parts[0] = &hdr;
        let n = args.payload.len().min(MAX_IOV);
        parts[1..=n].copy_from_slice(&args.payload[..n]);
        if let Err(e) = r.engine.send(now(), peer, &parts[..=n], token as u64) {
            r.tx_ops.remove(token);
            self.progress();
            return Err(e.into());
        }
        self.progress();
        Ok(())
    }

    pub fn post_recv(&mut self, args: RecvArgs) -> Result<()> {
        let directed = self.profile.caps & fi::FI_DIRECTED_RECV != 0;
        let src = if directed && args.src != FI_ADDR_UNSPEC { Src::Peer(self.peer_for(args.src)?) } else { Src::Any };
        let completion = match &self.rx_cq {
            Some(b) => !b.selective || args.flags & fi::FI_COMPLETION as u64 != 0,
            None => false,
        };
        let peek = args.flags & fi::FI_PEEK as u64 != 0;
        let claim = args.flags & fi::FI_CLAIM != 0;
        let discard = args.flags & fi::FI_DISCARD != 0;
        let multi = args.flags & fi::FI_MULTI_RECV as u64 != 0;
        if multi && (args.kind != MsgKind::Msg || args.iov.count != 1) {
            return Err(Error::Inval("FI_MULTI_RECV takes one untagged buffer"));
        }
        self.progress();
        let probe = RecvPost { token: 0, kind: args.kind, src, tag: args.tag, ignore: args.ignore, persistent: multi };
        if peek {
            return self.peek(probe, &args, claim, discard);
        }
        if claim {
            let arrived = self.claimed.remove(&args.context).ok_or(Error::Inval("FI_CLAIM without a claimed message"))?;
            let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
            let token = r.rx_ops.insert(RxOp { iov: args.iov, context: args.context, completion: true, multi_offset: None });
            if discard {
                let op = r.rx_ops.remove(token);
                r.discard_arrived(arrived.peer, arrived.rndv, arrived.msg);
                self.push_rx(Completion { op_context: op.context, flags: recv_flags(arrived.kind, None), tag: arrived.tag, ..Completion::default() });
            } else {
                self.complete_recv(token, arrived);
            }
            return Ok(());
        }
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let token = r.rx_ops.insert(RxOp {
            iov: args.iov,
            context: args.context,
            completion,
            multi_offset: multi.then_some(0),
        });
        let post = RecvPost { token: token as u64, ..probe };
        if multi {
            // Fill the buffer from the unexpected queue first, then leave it posted
            // (in order) if room remains.
            loop {
                let Some(r) = self.running.as_mut() else { return Ok(()) };
                if !r.rx_ops.contains(token) {
                    return Ok(());
                }
                match r.matcher.take_unexpected(&post) {
                    Some(arrived) => self.complete_recv(token, arrived),
                    None => {
                        r.matcher.post_only(post);
                        break;
                    }
                }
            }
        } else if let Some(arrived) = r.matcher.post(post) {
            self.complete_recv(token, arrived);
        }
        self.progress();
        Ok(())
    }

    /// FI_PEEK (optionally with FI_CLAIM or FI_DISCARD): reports an unexpected
    /// message without receiving it, or FI_ENOMSG at once.
    fn peek(&mut self, probe: RecvPost, args: &RecvArgs, claim: bool, discard: bool) -> Result<()> {
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let found = r.matcher.peek(&probe).map(|m| (m.peer, m.kind, m.tag, m.data, m.len()));
        let Some((peer, kind, tag, data, len)) = found else {
            self.push_rx(Completion {
                op_context: args.context,
                flags: recv_flags(args.kind, None),
                tag: args.tag,
                err: Some(CompletionError::new(fi::FI_ENOMSG)),
                ..Completion::default()
            });
            return Ok(());
        };
        if claim || discard {
            if let Some(m) = r.matcher.take_unexpected(&probe) {
                if discard {
                    r.discard_arrived(m.peer, m.rndv, m.msg);
                } else {
                    self.claimed.insert(args.context, m);
                }
            }
        }
        let src = self.src_fi_addr(peer);
        self.push_rx(Completion {
            op_context: args.context,
            flags: recv_flags(kind, data),
            len,
            data: data.unwrap_or(0),
            tag,
            src,
            ..Completion::default()
        });
        Ok(())
    }

    pub(crate) fn push_rx(&self, c: Completion) {
        if let Some(b) = &self.rx_cq {
            b.cq.push(c);
        }
    }

    /// fi_cancel of a posted receive: completes it with FI_ECANCELED.
    pub fn cancel(&mut self, context: usize) -> Result<()> {
        let r = self.running.as_mut().ok_or(Error::NoEnt)?;
        let token = r
            .rx_ops
            .iter()
            .find(|(_, op)| op.context == context)
            .map(|(t, _)| t)
            .ok_or(Error::NoEnt)?;
        let post = r.matcher.cancel(token as u64).ok_or(Error::NoEnt)?;
        let op = r.rx_ops.remove(token);
        let kind_flag = match post.kind {
            MsgKind::Msg => fi::FI_MSG as u64,
            MsgKind::Tagged => fi::FI_TAGGED as u64,
        };
        if let Some(b) = &self.rx_cq {
            b.cq.push(Completion {
                op_context: op.context,
                flags: fi::FI_RECV as u64 | kind_flag,
                tag: post.tag,
                err: Some(CompletionError::new(fi::FI_ECANCELED)),
                ..Completion::default()
            });
        }
        Ok(())
    }

    pub(crate) fn src_fi_addr(&mut self, peer: PeerId) -> u64 {
        let Some(r) = self.running.as_mut() else { return FI_ADDR_NOTAVAIL };
        let generation = self.av.as_ref().map(|av| av.read().generation()).unwrap_or(0);
        if generation != r.src_cache_gen {
            r.src_cache.clear();
            r.src_cache_gen = generation;
        }
        if let Some(a) = r.src_cache.get(&peer) {
            return *a;
        }
        let dev = r.engine.peer_addr(peer);
        let (host, shm, udp) = (r.local.host_id, r.local.has_shm, r.local.udp.is_some());
        let found = self
            .av
            .as_ref()
            .and_then(|av| av.read().find(|a| a.route(host, shm, udp) == Some(dev)))
            .unwrap_or(FI_ADDR_NOTAVAIL);
        if found != FI_ADDR_NOTAVAIL {
            r.src_cache.insert(peer, found);
        }
        found
    }

    fn complete_recv(&mut self, token: usize, arrived: Arrived) {
        let src = self.src_fi_addr(arrived.peer);
        // FI_SOURCE_ERR: a sender missing from the AV is reported as an error
        // entry carrying its address, so the application can insert it.
        let src_err = (src == FI_ADDR_NOTAVAIL && self.profile.caps & fi::FI_SOURCE_ERR != 0)
            .then(|| self.running.as_ref().map(|r| sender_addr(r.engine.peer_addr(arrived.peer))))
            .flatten();
        let min_multi = self.min_multi_recv;
        let Some(r) = self.running.as_mut() else { return };
        let Some(op) = r.rx_ops.get(token).copied() else { return };
        let msg_len = arrived.len();
        let mut flags = recv_flags(arrived.kind, arrived.data);
        // Where the message lands.
        let (target, buf) = match op.multi_offset {
            None => {
                r.rx_ops.remove(token);
                (op.iov, 0)
            }
            Some(off) => {
                // One message lands after the previous one, with no padding.
                let base = op.iov.bufs[0];
                let room = UserIov {
                    bufs: [UserBuf { ptr: base.ptr + off, len: base.len - off }, UserBuf::default(), UserBuf::default(), UserBuf::default()],
                    count: 1,
                };
                let n = msg_len.min(room.bufs[0].len);
                let new_off = off + n;
                let release = base.len - new_off < min_multi.max(1) || n < msg_len;
                if release {
                    r.matcher.cancel(token as u64);
                    r.rx_ops.remove(token);
                    flags |= fi::FI_MULTI_RECV as u64;
                } else if let Some(o) = r.rx_ops.get_mut(token) {
                    o.multi_offset = Some(new_off);
                }
                (room, base.ptr + off)
            }
        };
        let landing = Landing {
            target,
            context: op.context,
            completion: op.completion,
            flags,
            buf,
            msg_len,
            data: arrived.data.unwrap_or(0),
            tag: arrived.tag,
            src,
            src_err,
        };
        match arrived.rndv {
            None => {
                let written = target.scatter(arrived.payload());
                r.engine.recycle(arrived.msg);
                self.finish_recv(&landing, written, None);
            }
            Some(rts) => {
                r.engine.recycle(arrived.msg);
                self.pull(arrived.peer, rts, landing);
            }
        }
    }

    /// Reports a receive whose bytes have landed (`written` of `msg_len`), or
    /// failed with `err`.
    pub(crate) fn finish_recv(&mut self, l: &Landing, written: usize, err: Option<u32>) {
        let truncated = err.is_none() && l.msg_len > written;
        let c = Completion {
            op_context: l.context,
            flags: l.flags,
            len: written,
            buf: l.buf,
            data: l.data,
            tag: l.tag,
            src: l.src,
            err: if let Some(e) = err {
                Some(CompletionError::new(e))
            } else if truncated {
                Some(CompletionError { olen: l.msg_len - written, ..CompletionError::new(fi::FI_ETRUNC) })
            } else if l.src_err.is_some() {
                Some(CompletionError { src_addr: l.src_err, ..CompletionError::new(fi::FI_EADDRNOTAVAIL) })
            } else {
                None
            },
        };
        let failed = c.err.is_some();
        if failed || l.completion || l.flags & fi::FI_MULTI_RECV as u64 != 0 {
            self.push_rx(c);
        }
        if let Some(c) = &self.recv_cntr {
            if truncated || err.is_some() {
                c.inc_err();
            } else {
                c.inc();
            }
        }
    }

    fn handle_event(&mut self, ev: Event) {
        match ev {
            Event::Delivered { peer, msg } => {
                crate::log::debug_with(Subsys::EpData, "delivered", || format!("{} bytes from {peer:?}", msg.len()));
                let kind = rndv::Packet::decode(&msg).map(|p| match p {
                    rndv::Packet::Msg(h, _) => Some((h, None)),
                    rndv::Packet::Rts(rts) => Some((rts.header, Some(rts))),
                    _ => None,
                });
                match kind {
                    Ok(Some((h, rndv))) => {
                        let Some(r) = self.running.as_mut() else { return };
                        let arrived = Arrived { peer, kind: h.kind, tag: h.tag, data: h.data, msg, offset: HEADER_LEN, rndv };
                        if let Some((post, arrived)) = r.matcher.arrive(arrived) {
                            self.complete_recv(post.token as usize, arrived);
                        }
                    }
                    Ok(None) => self.handle_control(peer, msg),
                    Err(e) => {
                        let Some(r) = self.running.as_mut() else { return };
                        r.dropped_headers += 1;
                        fi_warn!(Subsys::EpData, "dropping message with a bad header from {:?}: {e}", r.engine.peer_addr(peer));
                        r.engine.recycle(msg);
                    }
                }
            }
            Event::SendComplete { token } => self.complete_send(token, None),
            Event::SendFailed { token, peer, reason } => {
                if let Some(r) = self.running.as_ref() {
                    fi_warn!(Subsys::EpData, "send to {:?} failed: {reason:?}", r.engine.peer_addr(peer));
                }
                self.complete_send(token, Some(fi::FI_EIO as i32));
            }
            Event::PeerUnreachable { peer } => self.fail_peer(peer),
            #[allow(unreachable_patterns)]
            _ => {}
        }
    }

    pub(crate) fn complete_send(&mut self, token: u64, err: Option<i32>) {
        if token & crate::rma::RMA_TOKEN == 0 && token & crate::rendezvous::RTS_TOKEN != 0 {
            // A ready-to-send: the send completes on the receiver's Fin; only a
            // failure to deliver the RTS ends it here.
            if err.is_some() {
                self.complete_send(token & !crate::rendezvous::RTS_TOKEN, err);
            }
            return;
        }
        if token & crate::rma::RMA_TOKEN != 0 {
            // RMA requests complete when the target answers; only a failure to
            // deliver the request (or a response) matters here.
            if err.is_some() {
                self.fail_rma(token);
            }
            return;
        }
        let Some(r) = self.running.as_mut() else { return };
        let Some(op) = r.tx_ops.try_remove(token as usize) else { return };
        if let (true, Some(e)) = (op.inject, err) {
            self.report_contextless_error("fi_inject", e);
        } else if op.completion || err.is_some() {
            if let Some(b) = &self.tx_cq {
                b.cq.push(Completion {
                    op_context: op.context,
                    flags: op.flags,
                    len: op.len,
                    err: err.map(|e| CompletionError { err: e, olen: 0, prov_errno: e, src_addr: None }),
                    ..Completion::default()
                });
            }
        }
        if let Some(c) = &self.send_cntr {
            if err.is_some() {
                c.inc_err();
            } else {
                c.inc();
            }
        }
    }

    /// A failure of an operation that has no context (an inject): the send
    /// counter's error count, an EQ error event if an EQ is bound, and the log.
    /// Never a CQ entry: its `op_context` would be NULL, and MPI libraries
    /// dereference the context of every error entry.
    pub(crate) fn report_contextless_error(&mut self, what: &str, err: i32) {
        fi_warn!(Subsys::EpData, "{what} failed: {} (reported on the EQ and the send counter)", std::io::Error::from_raw_os_error(err));
        if let Some((eq, fid)) = &self.eq {
            eq.push_error(*fid, err as u32);
        }
    }

    /// The engine declared `peer` unreachable (it stayed silent past
    /// `FI_RDMX_PEER_TIMEOUT`, or the kernel reported it unreachable): its pending
    /// sends have already failed; receives directed at it alone can never
    /// complete, so they fail too (`FI_EHOSTUNREACH`), and an EQ error event
    /// names the failure for applications that wait on nothing else.
    fn fail_peer(&mut self, peer: PeerId) {
        let Some(r) = self.running.as_mut() else { return };
        fi_warn!(Subsys::EpData, "peer {:?} is unreachable", r.engine.peer_addr(peer));
        let posts = r.matcher.take_posted_from(peer);
        let mut failed = Vec::with_capacity(posts.len());
        for post in posts {
            if let Some(op) = r.rx_ops.try_remove(post.token as usize) {
                let kind_flag = match post.kind {
                    MsgKind::Msg => fi::FI_MSG as u64,
                    MsgKind::Tagged => fi::FI_TAGGED as u64,
                };
                failed.push(Completion {
                    op_context: op.context,
                    flags: fi::FI_RECV as u64 | kind_flag,
                    tag: post.tag,
                    err: Some(CompletionError::new(fi::FI_EHOSTUNREACH)),
                    ..Completion::default()
                });
            }
        }
        for c in failed {
            if let Some(cntr) = &self.recv_cntr {
                cntr.inc_err();
            }
            if let Some(b) = &self.rx_cq {
                b.cq.push(c);
            }
        }
        if let Some((eq, fid)) = &self.eq {
            eq.push_error(*fid, fi::FI_EHOSTUNREACH);
        }
    }

    /// Unexpected messages are buffered without a count limit but with a memory
    /// limit: above it the engine stops accepting new messages (senders keep
    /// them and wait); below half of it, it resumes.
    fn update_backpressure(&mut self) {
        let limit = params().unexpected_limit;
        let Some(r) = self.running.as_mut() else { return };
        let held = r.matcher.unexpected_bytes();
        if !r.engine.is_paused() && held > limit {
            fi_warn!(Subsys::EpData, "{held} bytes of unexpected messages buffered (limit {limit}): pausing senders");
            r.engine.set_paused(true);
        } else if r.engine.is_paused() && held <= limit / 2 {
            r.engine.set_paused(false);
        }
    }

    /// Endpoint close: acknowledge everything received so far, so no peer waits
    /// on an ack that would have been delayed, and push it out.
    pub fn flush_on_close(&mut self) {
        self.progress();
        if let Some(r) = self.running.as_mut() {
            r.engine.flush_acks();
            r.flush(now());
            let st = r.engine.stats();
            fi_info!(
                Subsys::EpCtrl,
                "endpoint {} closed: {} messages delivered, {} data packets sent ({} retransmitted), {} RMA/atomic operations started, {} served, rendezvous: {} sent, {} pulled, {} pushed",
                r.local.to_uri(),
                st.delivered_msgs,
                st.sent_data,
                st.retransmits,
                r.rma_started,
                r.rma_served,
                r.rndv.rts_sent,
                r.rndv.pulled,
                r.rndv.pushed
            );
        }
    }

    /// One round of progress: receive, timers, events, transmit.
    ///
    /// The order matters for completion semantics: acknowledgements produced
    /// while receiving leave only in the transmit step, after the events step
    /// matched every delivered message (or buffered it as unexpected). So a
    /// sender's completion always means "processed by the peer": delivery
    /// complete.
    pub fn progress(&mut self) {
        let Some(r) = self.running.as_mut() else { return };
        // The clock is read only when something needs it: an idle poll (nothing
        // received, no timer, nothing to send) costs no clock read.
        let mut clock: Option<rdm::Instant> = None;
        {
            let Running { device, engine, .. } = r;
            for _ in 0..4 {
                match device.recv_batch(64, &mut |from, bytes| engine.handle_datagram(*clock.get_or_insert_with(now), from, bytes)) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        fi_warn!(Subsys::EpData, "device receive failed: {e}");
                        break;
                    }
                }
            }
            while let Some(addr) = device.poll_unreachable() {
                engine.handle_unreachable(addr);
            }
        }
        if let Some(deadline) = r.engine.poll_timeout() {
            let t = *clock.get_or_insert_with(now);
            if deadline <= t {
                r.engine.handle_timeout(t);
            }
        }
        self.retry_pushes();
        while let Some(ev) = self.running.as_mut().and_then(|r| r.engine.poll_event()) {
            self.handle_event(ev);
        }
        self.update_backpressure();
        if let Some(r) = self.running.as_mut() {
            if r.staged > 0 || r.engine.wants_transmit() {
                r.flush(clock.unwrap_or_else(now));
            }
        }
    }
}

impl Running {
    /// Moves datagrams from the engine to the device until either runs dry.
    fn flush(&mut self, t: rdm::Instant) {
        loop {
            while self.staged < TX_BATCH {
                let i = self.staged;
                match self.engine.poll_transmit(t, &mut self.stage[i]) {
                    Some(tx) => {
                        self.stage_dst[i] = tx.dst;
                        self.stage_len[i] = tx.len;
                        self.staged += 1;
                    }
                    None => break,
                }
            }
            if self.staged == 0 {
                return;
            }
            let mut batch = [TxDatagram { dst: DevAddr::Sim(0), data: &[] }; TX_BATCH];
            for i in 0..self.staged {
                batch[i] = TxDatagram { dst: self.stage_dst[i], data: &self.stage[i][..self.stage_len[i]] };
            }
            let taken = match self.device.send_batch(&batch[..self.staged]) {
                Ok(n) => n,
                Err(e) => {
                    // The first datagram cannot go out (peer gone, unroutable): drop
                    // it; reliability retransmits or times the peer out.
                    fi_warn!(Subsys::EpData, "device send to {:?} failed: {e}", self.stage_dst[0]);
                    1
                }
            };
            let taken = taken.min(self.staged);
            if taken == 0 {
                return;
            }
            // Keep the untaken tail at the front, in order.
            for i in taken..self.staged {
                self.stage.swap(i - taken, i);
                self.stage_dst[i - taken] = self.stage_dst[i];
                self.stage_len[i - taken] = self.stage_len[i];
            }
            self.staged -= taken;
            if self.staged > 0 {
                return;
            }
        }
    }
}

/// An insertable rdmx address for a sender known only by its device address.
fn sender_addr(dev: DevAddr) -> [u8; crate::addr::ADDR_LEN] {
    let a = match dev {
        DevAddr::Udp(sa) => RdmxAddr { udp: Some(sa), host_id: 0, incarnation: 0, pid: 0, has_shm: false },
        DevAddr::Shm(s) => RdmxAddr { udp: None, host_id: s.host_id, incarnation: s.ring_id, pid: s.pid, has_shm: true },
        DevAddr::Sim(_) => RdmxAddr { udp: None, host_id: 0, incarnation: 0, pid: 0, has_shm: false },
    };
    a.encode()
}

fn recv_flags(kind: MsgKind, data: Option<u64>) -> u64 {
    let mut f = fi::FI_RECV as u64
        | match kind {
            MsgKind::Msg => fi::FI_MSG as u64,
            MsgKind::Tagged => fi::FI_TAGGED as u64,
        };
    if data.is_some() {
        f |= fi::FI_REMOTE_CQ_DATA as u64;
    }
    f
}

/// The endpoints bound to a CQ or counter, whose progress reading it drives.
/// Weak references: an endpoint's close detaches it, and a dangling one is
/// simply skipped.
#[derive(Default)]
pub struct BoundEndpoints(Mutex<Vec<Weak<EpShared>>>);

impl BoundEndpoints {
    pub fn attach(&self, ep: &Arc<EpShared>) {
        let mut eps = self.0.lock();
        eps.retain(|w| w.strong_count() > 0);
        if !eps.iter().any(|w| w.as_ptr() == Arc::as_ptr(ep)) {
            eps.push(Arc::downgrade(ep));
        }
    }

    pub fn detach(&self, ep: &EpShared) {
        self.0.lock().retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), ep));
    }

    /// The live endpoints (on the stack for the usual few: this runs on every
    /// CQ read).
    pub fn endpoints(&self) -> SmallVec<[Arc<EpShared>; 4]> {
        self.0.lock().iter().filter_map(Weak::upgrade).collect()
    }

    /// Runs one round of progress on every bound endpoint.
    pub fn progress(&self) {
        for ep in self.endpoints() {
            ep.progress();
        }
    }

    /// `fi_trywait` on every bound endpoint (all of them: each must arm its
    /// device); false if any has input waiting.
    pub fn try_wait(&self) -> bool {
        self.endpoints().iter().fold(true, |ok, ep| ep.try_wait() && ok)
    }
}

/// Sleeps until one of the endpoints' devices has input, an engine timer is due,
/// or `max` has passed.
pub fn wait_any(eps: &[Arc<EpShared>], max: Duration) {
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(eps.len());
    let mut wait = max;
    let t = now();
    for ep in eps {
        let (fd, deadline, ready) = ep.prepare_wait();
        if ready {
            return;
        }
        if let Some(fd) = fd {
            fds.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 });
        }
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(t));
        }
    }
    if fds.is_empty() {
        // Nothing to sleep on: yield briefly so a polling-only device still moves.
        std::thread::sleep(wait.min(Duration::from_micros(50)));
        return;
    }
    let ms = wait.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `fds` is a valid array of pollfd for its length.
    unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
}

/// Provider cleanup: stops and joins every progress thread still running.
pub fn shutdown_all() {
    STOP_ALL.store(true, Ordering::Release);
    let eps = std::mem::take(&mut *THREADED.lock());
    for ep in eps.iter().filter_map(Weak::upgrade) {
        ep.stop_progress_thread();
    }
}
