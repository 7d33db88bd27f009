//! The endpoint's runtime in the shim: it opens the endpoint's queue on its
//! domain's device, builds the one [`rndv::Endpoint`] that owns everything
//! below libfabric, translates libfabric's arguments into its operations, and
//! drives it from the application's calls (manual progress) and the optional
//! progress thread.
//!
//! Every posting call and every CQ/counter read runs [`EpState::progress`]: one
//! call of [`rndv::Endpoint::progress`] (device, both engines, reads, timers,
//! transmit), then its completions and events reported in libfabric's terms
//! (`completions.rs`). No protocol decision and no packet kind lives here; the
//! application's memory is `process_memory.rs`, the counters
//! `ep_stats.rs` and `stats_json.rs`, the sleep `progress.rs`.
use crate::addr::RdmxAddr;
use crate::args::{RecvArgs, SendArgs};
use crate::av_table::{SharedAv, FI_ADDR_UNSPEC};
use crate::clock::{now, MonotonicClock};
use crate::cntr_queue::CntrShared;
use crate::cq_queue::CqShared;
use crate::dense_cache::DenseCache;
use crate::error::{Error, Result};
use crate::info::Profile;
use crate::log::{fi_info, fi_warn, Subsys};
use crate::params::params;
use crate::process_memory::ProcessMemory;
use crate::progress::{wait_any, IdleGate, Progress};
use crate::regcache::{DomainRegistrations, SharedDomainMr};
use crate::rma::RmaArgs;
use libfabric_sys as fi;
use mr_cache::KeyTable;
use parking_lot::Mutex;
use rdm::device::{DeviceContext, OpenSpec};
use rdm::engine::{JobIdx, PeerId};
use rdm::Device;
use rndv::{
    AtomicRequest, BackgroundStep, Endpoint, EndpointConfig, IoBuf, IoList, MsgHeader, MsgKind, OpMeta, OutMsg,
    PostError, RecvSpec, RmaTarget, Src,
};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// The endpoint below libfabric, over the device its domain opened, the
/// process's memory and the monotonic clock.
pub type RdmxEndpoint = Endpoint<dyn Device, ProcessMemory, MonotonicClock>;

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

#[derive(Clone)]
pub struct CqBinding {
    pub cq: Arc<CqShared>,
    pub selective: bool,
}

/// Keys kept by the per-endpoint address caches: AV slots and peer ids below
/// this. Both are dense (the AV hands out its lowest free slot; the engine
/// numbers peers in order), so a cache holds as many slots as the AV or the
/// peer table has entries, at most 24 MiB for a million of them.
const PEER_CACHE_MAX: usize = 1 << 20;

/// Everything an enabled endpoint needs to move data.
pub struct Running {
    /// Device, engines, staging, reads: every protocol decision lives there.
    pub(crate) ep: RdmxEndpoint,
    pub(crate) local: RdmxAddr,
    /// Cache of sender PeerId → fi_addr for FI_SOURCE, rebuilt on miss.
    pub(crate) src_cache: DenseCache<u64>,
    /// The AV generation `src_cache` was built against.
    pub(crate) src_cache_gen: u64,
    /// Cache of fi_addr → (PeerId, the incarnation its AV entry names) for
    /// sends: every send would otherwise decode the AV entry, route it and
    /// look the device address up again.
    pub(crate) peer_cache: DenseCache<(PeerId, u64)>,
    /// The AV generation `peer_cache` was built against.
    pub(crate) peer_cache_gen: u64,
    /// `FI_AV_AUTH_KEY`: the AV key index of each job the endpoint serves
    /// ([`JobIdx`] order; taken from the AV at enable). Empty otherwise.
    pub(crate) job_keys: Vec<u32>,
}

impl Running {
    /// The job a destination inserted under AV key `key` is reached in.
    fn job_of_key(&self, key: Option<u32>) -> Result<JobIdx> {
        if self.job_keys.is_empty() {
            return Ok(JobIdx::FIRST);
        }
        let key = key.ok_or(Error::Inval("destination has no authorization key"))?;
        self.job_keys
            .iter()
            .position(|&k| k == key)
            .map(|j| JobIdx(j as u8))
            .ok_or(Error::Inval("destination's authorization key was not in the AV when the endpoint was enabled"))
    }
}

/// The endpoint state every libfabric object that drives progress can reach.
pub struct EpShared {
    state: Mutex<EpState>,
    /// Set to stop this endpoint's progress thread.
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Idle polls' way past the lock, and whether the application called in
    /// (`IdleGate::app_active`).
    gate: Arc<IdleGate>,
}

/// Provider cleanups so far. A progress thread ends when this moves past the
/// value it started with: cleanup (libfabric's destructor, often at exit) only
/// tells the threads, never waits for them (see [`shutdown_all`]). A count, not
/// a flag, so that a provider initialized again in the same process starts
/// threads that run.
static CLEANUPS: AtomicU64 = AtomicU64::new(0);

pub struct EpState {
    pub profile: Profile,
    pub av: Option<SharedAv>,
    /// The bound AV's generation ([`crate::av_table::AvTable::generation_handle`]).
    pub av_generation: Option<Arc<std::sync::atomic::AtomicU64>>,
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
    pub eq: Option<(Arc<crate::eq_queue::EqQueue>, usize)>,
    /// The domain's registrations (RMA targets) and whether RMA addresses are
    /// virtual addresses (FI_MR_VIRT_ADDR) or offsets into the registration.
    pub mr_keys: Arc<Mutex<KeyTable>>,
    /// The domain's registration cache (devices that register memory only).
    pub mr_cache: Option<SharedDomainMr>,
    pub mr_virt_addr: bool,
    pub min_multi_recv: usize,
    pub device: Option<Box<dyn Device>>,
    pub local: RdmxAddr,
    pub running: Option<Running>,
    /// `FI_RDMX_STATS=<path>`: when this endpoint writes its JSON document
    /// besides at close (SIGUSR1, the interval). None otherwise.
    pub(crate) stats_dump: Option<crate::stats_json::DumpSchedule>,
    /// How the endpoint's traffic over a wire goes (set at enable).
    pub job_traffic: crate::job::Protection,
}

/// The job of an endpoint with `profile` (its `auth_key`, else the
/// environment's; `job.rs`). An `FI_AV_AUTH_KEY` endpoint's are its AV's
/// ([`jobs_of_av`]); until then, the environment's.
fn job_of_profile(profile: &Profile) -> Result<crate::job::Job> {
    let p = params();
    crate::job::job_of(profile.auth_key.as_ref(), p.job_secret.as_ref(), p.job_key, p.job_encrypt)
}

/// The jobs an `FI_AV_AUTH_KEY` endpoint serves: every key in its AV now
/// (fi_av(3): later ones do not reach enabled endpoints), each a job key in
/// clear or a secret as an endpoint's `auth_key` is, and their AV indices;
/// each key is marked used until the endpoint closes.
fn jobs_of_av(av: &SharedAv) -> Result<(Vec<crate::job::Job>, Vec<u32>)> {
    let p = params();
    let mut t = av.write();
    let keys: Vec<(u32, crate::job::AuthKey)> = t.auth_keys().map(|(i, k)| (i, k.key.clone())).collect();
    if keys.is_empty() {
        return Err(Error::Inval("FI_AV_AUTH_KEY: the AV holds no authorization key (fi_av_insert_auth_key)"));
    }
    if keys.len() > crate::info::MAX_EP_AUTH_KEY {
        return Err(Error::Inval("FI_AV_AUTH_KEY: the AV holds more authorization keys than max_ep_auth_key"));
    }
    let mut jobs: Vec<crate::job::Job> = Vec::with_capacity(keys.len());
    for (_, k) in &keys {
        let job = crate::job::job_of(Some(k), p.job_secret.as_ref(), p.job_key, p.job_encrypt)?;
        // fi_av_insert_auth_key refuses them; two jobs of one key would be one.
        if jobs.iter().any(|j| j.key == job.key) {
            return Err(Error::Inval("two authorization keys of the AV carry the same job key"));
        }
        jobs.push(job);
    }
    for (i, _) in &keys {
        t.use_key(*i, true);
    }
    Ok((jobs, keys.into_iter().map(|(i, _)| i).collect()))
}

/// Opens the endpoint's queue on its domain's device and returns it with the
/// local address (built from every address the device answers on).
fn open_device(profile: &Profile, devices: &dyn DeviceContext) -> Result<(Box<dyn Device>, RdmxAddr)> {
    let src = profile.src.unwrap_or(RdmxAddr::EMPTY);
    let incarnation = random_u64();
    let job_key = job_of_profile(profile)?.key;
    let dev = devices.open(&OpenSpec { bind: src.udp, incarnation, job_key })?;
    let local = RdmxAddr::of_local(&dev.local_addrs(), incarnation);
    Ok((dev, local))
}

/// The progress thread's loop: what to do when is [`rndv::BackgroundProgress`]'s
/// decision, from whether the application called in (`app_active`); this
/// thread only sleeps and progresses as it says.
fn progress_loop(weak: &Weak<EpShared>, stop: &AtomicBool, cleanups: u64) {
    let policy = rndv::BackgroundProgress;
    let stopped = || stop.load(Ordering::Acquire) || CLEANUPS.load(Ordering::Acquire) != cleanups;
    while !stopped() {
        let Some(ep) = weak.upgrade() else { break };
        match policy.next(ep.gate.app_active.swap(false, Ordering::Relaxed)) {
            BackgroundStep::StandBy(period) => {
                drop(ep);
                std::thread::sleep(period);
            }
            BackgroundStep::Wait(max) => {
                wait_any(std::slice::from_ref(&ep), max);
                if !stopped() && policy.after_wait(ep.gate.app_active.load(Ordering::Relaxed)) {
                    ep.progress_background();
                }
            }
        }
    }
}

impl EpShared {
    pub fn new(
        profile: Profile,
        devices: &dyn DeviceContext,
        mr_keys: Arc<Mutex<KeyTable>>,
        mr_cache: Option<SharedDomainMr>,
        mr_virt_addr: bool,
    ) -> Result<Arc<EpShared>> {
        let (device, local) = open_device(&profile, devices)?;
        let gate = Arc::new(IdleGate::new(device.input_probe()));
        Ok(Arc::new(EpShared {
            state: Mutex::new(EpState {
                profile,
                av: None,
                av_generation: None,
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
                mr_cache,
                mr_virt_addr,
                min_multi_recv: 0,
                device: Some(device),
                local,
                running: None,
                stats_dump: None,
                job_traffic: crate::job::Protection::Clear,
            }),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(None),
            gate,
        }))
    }

    /// The endpoint state, for an application call (which counts as the
    /// application driving progress).
    pub fn lock(&self) -> parking_lot::MutexGuard<'_, EpState> {
        // A plain store, not a clock read: this is on every data-path call.
        self.gate.app_active.store(true, Ordering::Relaxed);
        self.locked(self.state.lock())
    }

    /// The state just locked: the idle gate closes before anything changes,
    /// and the rounds idle polls skipped go to the device's schedule.
    #[inline]
    fn locked<'a>(&self, mut st: parking_lot::MutexGuard<'a, EpState>) -> parking_lot::MutexGuard<'a, EpState> {
        let skipped = self.gate.close();
        if skipped > 0 {
            if let Some(r) = st.running.as_mut() {
                r.ep.rounds_skipped(skipped);
            }
        }
        st
    }

    /// A round of progress on the locked state, opening the idle gate for
    /// the rounds that may be skipped after it. (A stats dump that falls due
    /// meanwhile, by its interval or SIGUSR1, waits for the next round that
    /// runs: at most the device's quiet rounds, 4095 polls on shm.)
    fn round(&self, st: &mut EpState) {
        st.progress();
        self.gate.open(st.running.as_ref().map_or(0, |r| r.ep.idle_rounds()));
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
        let cleanups = CLEANUPS.load(Ordering::Acquire);
        let spawned = std::thread::Builder::new().name("rdmx-progress".into()).spawn(move || {
            // The same panic barrier as every C entry point: a bug here must not
            // unwind out of a thread of the application's process. The endpoint
            // keeps working under manual progress.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| progress_loop(&weak, &stop, cleanups)));
            if ran.is_err() {
                fi_warn!(
                    Subsys::EpCtrl,
                    "the progress thread panicked and stopped; progress continues from application calls"
                );
            }
        });
        match spawned {
            Ok(h) => *self.thread.lock() = Some(h),
            Err(e) => fi_warn!(Subsys::EpCtrl, "cannot start the progress thread: {e}"),
        }
    }

    /// Stops and joins this endpoint's progress thread (endpoint close).
    pub fn stop_progress_thread(&self) {
        self.stop.store(true, Ordering::Release);
        // Not joined under the handle's lock.
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Returns whether a progress thread is wanted.
    fn enable_engine(&self) -> Result<bool> {
        let mut st = self.locked(self.state.lock());
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
        // The jobs first: an endpoint that cannot have them (no key in its AV
        // yet) keeps its device for a later fi_enable.
        let (mut jobs, job_keys) = if st.profile.av_auth_key {
            jobs_of_av(st.av.as_ref().ok_or(Error::Inval("endpoint has no AV bound"))?)?
        } else {
            (vec![job_of_profile(&st.profile)?], Vec::new())
        };
        let device = st.device.take().ok_or(Error::Other("endpoint lost its device".into()))?;
        let caps = device.caps();
        let p = params();
        let job = jobs.remove(0);
        st.job_traffic = job.protection();
        let other_jobs: Vec<rdm::engine::JobConfig> =
            jobs.iter().map(|j| rdm::engine::JobConfig { job_key: j.key, auth: j.auth.clone() }).collect();
        let cfg = EndpointConfig {
            job_key: job.key,
            auth: job.auth.clone(),
            other_jobs,
            incarnation: st.local.incarnation,
            peer_timeout: p.peer_timeout,
            background_progress: auto,
            rndv_threshold: p.rndv_threshold,
            rdma_rndv_threshold: Some(p.rdma_rndv_threshold),
            window_threshold: p.window_threshold,
            min_multi_recv: st.min_multi_recv,
            unexpected_limit: p.unexpected_limit,
            datagram: st.profile.ep_type == fi::FI_EP_DGRAM,
            remote_reads: p.shm_cma,
            tx_size: st.profile.tx_size,
            rx_size: st.profile.rx_size,
        };
        let local = st.local;
        fi_info!(
            Subsys::EpCtrl,
            "endpoint enabled at {} (mtu {}, reliable device: {}, job traffic over a wire: {}, jobs: {})",
            local.to_uri(),
            caps.mtu,
            caps.reliable,
            st.job_traffic.name(),
            1 + jobs.len()
        );
        let mem = ProcessMemory { keys: st.mr_keys.clone(), virt_addr: st.mr_virt_addr };
        let mut ep = Endpoint::new(device, cfg, mem, MonotonicClock);
        if let Some(c) = &st.mr_cache {
            ep.set_registrations(Box::new(DomainRegistrations::new(c.clone())));
        }
        if p.stats_path.is_some() {
            crate::stats_json::install_signal_handler();
            st.stats_dump = Some(crate::stats_json::DumpSchedule::new(p.stats_interval));
        }
        st.running = Some(Running {
            ep,
            local,
            src_cache: DenseCache::new(PEER_CACHE_MAX),
            src_cache_gen: 0,
            peer_cache: DenseCache::new(PEER_CACHE_MAX),
            peer_cache_gen: 0,
            job_keys,
        });
        Ok(auto)
    }

    /// Progress on behalf of an application that is not calling in.
    /// Progress from the progress thread, unless an application call holds
    /// the endpoint (it progresses then): never wait for the lock, which
    /// would let a preempted thread stall the application behind it on a
    /// machine with fewer cores than busy threads.
    fn progress_background(&self) {
        if let Some(st) = self.state.try_lock() {
            let mut st = self.locked(st);
            self.round(&mut st);
        }
    }
}

impl Progress for EpShared {
    fn progress(&self) {
        if self.gate.skip() {
            return;
        }
        let mut st = self.lock();
        self.round(&mut st);
    }

    fn idle_gate(&self) -> Arc<IdleGate> {
        self.gate.clone()
    }

    fn prepare_wait(&self) -> (Option<RawFd>, Option<rdm::Instant>, bool) {
        let mut st = self.locked(self.state.lock());
        match &mut st.running {
            Some(r) => {
                let w = r.ep.prepare_wait();
                (w.fd, w.deadline, w.ready)
            }
            None => (None, None, false),
        }
    }

    fn try_wait(&self) -> bool {
        !self.prepare_wait().2
    }
}

/// The sender a receive matches, from the endpoint's capabilities
/// (fi_getinfo(3)): `Some(fi_addr)` when the receive is directed and names
/// one, `None` for any sender. A receive is directed under
/// `FI_DIRECTED_RECV`, under `FI_TAGGED_DIRECTED_RECV` when tagged, and
/// under `FI_EXACT_DIRECTED_RECV`, which also refuses `FI_ADDR_UNSPEC`
/// (`-FI_EINVAL`) except on an `FI_CLAIM`, which takes the message a
/// directed peek already matched. Without a directed capability the address
/// is ignored, as fi_msg(3) says.
pub(crate) fn recv_source(caps: u64, tagged: bool, src: u64, claim: bool) -> Result<Option<u64>> {
    let exact = caps & crate::info::EXACT_DIRECTED_RECV != 0;
    let directed =
        exact || caps & fi::FI_DIRECTED_RECV != 0 || (tagged && caps & crate::info::TAGGED_DIRECTED_RECV != 0);
    if !directed {
        return Ok(None);
    }
    if src != FI_ADDR_UNSPEC {
        return Ok(Some(src));
    }
    if exact && !claim {
        return Err(Error::Inval("FI_EXACT_DIRECTED_RECV: a receive must name its source, not FI_ADDR_UNSPEC"));
    }
    Ok(None)
}

fn post_error(e: PostError) -> Error {
    match e {
        PostError::Again => Error::Again,
        PostError::NotClaimed => Error::Inval("FI_CLAIM without a claimed message"),
        PostError::AtomicUnsupported => Error::OpNotSupp,
        PostError::AtomicOperands => Error::Inval("atomic operand size"),
        PostError::TooLarge => Error::MsgSize,
    }
}

impl EpState {
    pub(crate) fn peer_for(&mut self, fi_addr: u64) -> Result<PeerId> {
        let generation = self.av_generation.as_ref().ok_or(Error::Inval("no AV bound"))?.load(Ordering::Acquire);
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        if r.peer_cache_gen != generation {
            r.peer_cache.clear();
            r.peer_cache_gen = generation;
        }
        if let Some((peer, inc)) = r.peer_cache.get(fi_addr) {
            return if r.ep.expect_incarnation(peer, inc) { Ok(peer) } else { Err(Error::HostUnreach) };
        }
        // A miss reads the table under its lock. Should an insert or removal
        // land after the generation was read, the entry cached below is
        // dropped at the next call, which sees the new generation.
        let av = self.av.as_ref().ok_or(Error::Inval("no AV bound"))?.read();
        let a = av.get(fi_addr).ok_or(Error::Inval("destination not in the AV"))?;
        let key = av.key_of(fi_addr);
        drop(av);
        let dev = a.route(&r.local).ok_or(Error::AddrNotAvail)?;
        // The process at that address in the job of the key it was
        // inserted under (`FI_AV_AUTH_KEY`), else in the endpoint's one job.
        let job = r.job_of_key(key)?;
        // The peer's path is fixed here, from what the device offers toward it.
        let peer = r.ep.peer_in(dev, job);
        // The AV entry names one incarnation of the process at that address;
        // after a restart there, it names a process that is gone, and nothing
        // sent on it may reach the new one.
        if !r.ep.expect_incarnation(peer, a.incarnation) {
            return Err(Error::HostUnreach);
        }
        r.peer_cache.insert(fi_addr, (peer, a.incarnation));
        Ok(peer)
    }

    fn tx_wanted(&self, flags: u64, inject: bool) -> bool {
        !inject
            && match &self.tx_cq {
                Some(b) => !b.selective || flags & fi::FI_COMPLETION as u64 != 0,
                None => false,
            }
    }

    pub fn send(&mut self, args: SendArgs<'_>) -> Result<()> {
        let total: usize = args.payload.iter().map(|s| s.len()).sum();
        if total > self.profile.max_msg_size {
            // DGRAM: one datagram is the limit, and libfabric's code for it is
            // EMSGSIZE (RDM keeps its historical EINVAL beyond 1 GiB).
            return Err(if self.profile.ep_type == fi::FI_EP_DGRAM {
                Error::MsgSize
            } else {
                Error::Inval("message larger than max_msg_size")
            });
        }
        // FI_INJECT as a flag (fi_sendmsg, or the endpoint's default op flags)
        // hands the buffer back at return like fi_inject, but still completes
        // on the CQ (`meta.inject` means "no context").
        let copy_at_post = args.inject || args.flags & fi::FI_INJECT as u64 != 0;
        if copy_at_post && total > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let peer = self.peer_for(args.dest)?;
        let delivery_complete = args.flags & fi::FI_DELIVERY_COMPLETE as u64 != 0;
        let wanted = self.tx_wanted(args.flags, args.inject);
        let silent = !wanted && self.send_cntr.is_none();
        let meta = OpMeta {
            context: args.context as u64,
            wanted,
            inject: args.inject,
            copy_at_post,
            delivery_complete,
            silent,
        };
        let header = MsgHeader { kind: args.kind, tag: args.tag, data: args.data };
        // The message is built in place (its iov list is the larger part of
        // it) and handed down by reference.
        let mut msg = OutMsg { peer, header, payload: args.payload, user: IoList::default(), meta };
        let user = &mut msg.user;
        for s in args.payload.iter().take(user.bufs.len()) {
            user.bufs[user.count] = IoBuf { addr: s.as_ptr() as u64, len: s.len() as u64 };
            user.count += 1;
        }
        // Only a domain whose device registers memory has keys to give; on
        // udp and shm nothing is looked up.
        if let Some(c) = &self.mr_cache {
            if args.desc.iter().any(|&d| d != 0) {
                let c = c.lock();
                for i in 0..user.count {
                    if args.desc[i] != 0 {
                        user.keys[i] = c.desc_key(args.desc[i], user.bufs[i].addr, user.bufs[i].len);
                    }
                }
            }
        }
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        crate::log::debug_with(Subsys::EpData, "send", || {
            format!("{total} bytes to {:?} inject {}", r.ep.peer_addr(peer), copy_at_post)
        });
        let sent = r.ep.send_reporting(&msg);
        let has_output = r.ep.has_output();
        // A small message completed in the call: reported now, ahead of
        // nothing (the endpoint queues it instead when completions wait).
        if let Ok(Some(c)) = sent {
            self.report(c);
        }
        if has_output {
            self.drain_outputs();
        }
        sent.map(|_| ()).map_err(post_error)
    }

    pub fn post_recv(&mut self, args: RecvArgs) -> Result<()> {
        let claim = args.flags & fi::FI_CLAIM != 0;
        let src = match recv_source(self.profile.caps, args.kind == MsgKind::Tagged, args.src, claim)? {
            Some(a) => Src::Peer(self.peer_for(a)?),
            None => Src::Any,
        };
        let wanted = match &self.rx_cq {
            Some(b) => !b.selective || args.flags & fi::FI_COMPLETION as u64 != 0,
            None => false,
        };
        let peek = args.flags & fi::FI_PEEK as u64 != 0;
        let discard = args.flags & fi::FI_DISCARD != 0;
        let multi = args.flags & fi::FI_MULTI_RECV as u64 != 0;
        if multi && self.profile.caps & fi::FI_MULTI_RECV as u64 == 0 {
            return Err(Error::BadFlags);
        }
        if multi && (args.kind != MsgKind::Msg || args.iov.count != 1) {
            return Err(Error::Inval("FI_MULTI_RECV takes one untagged buffer"));
        }
        // A peek always reports (its answer is the point); so does a claim.
        let meta = OpMeta { context: args.context as u64, wanted: wanted || peek || claim, ..OpMeta::default() };
        let spec =
            RecvSpec { kind: args.kind, src, tag: args.tag, ignore: args.ignore, iov: args.iov.io(), multi, meta };
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        // A peek or claim takes in what the device holds first (MPI_Iprobe
        // must see a message already sent); a receive queue that is full
        // answers -FI_EAGAIN (an application that posts without reading
        // completions gets that, not unbounded provider memory).
        let posted = if peek {
            r.ep.peek(spec, claim, discard);
            Ok(())
        } else if claim {
            r.ep.claim(spec, discard)
        } else {
            r.ep.post_recv(spec)
        };
        if r.ep.has_output() {
            self.drain_outputs();
        }
        posted.map_err(post_error)
    }

    /// fi_cancel of a posted receive: completes it with FI_ECANCELED.
    pub fn cancel(&mut self, context: usize) -> Result<()> {
        let r = self.running.as_mut().ok_or(Error::NoEnt)?;
        if !r.ep.cancel(context as u64) {
            return Err(Error::NoEnt);
        }
        self.drain_outputs();
        Ok(())
    }

    pub fn rma_write(&mut self, args: RmaArgs<'_>, data: Option<u64>) -> Result<()> {
        let len: usize = args.payload.iter().map(|p| p.len()).sum();
        // RMA writes are always copied at post; FI_INJECT as a flag still
        // limits the size, as fi_writemsg(3) says.
        let copy_at_post = args.inject || args.flags & fi::FI_INJECT as u64 != 0;
        if copy_at_post && len > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let peer = self.peer_for(args.peer_addr)?;
        let meta = OpMeta {
            context: args.context as u64,
            wanted: self.tx_wanted(args.flags, args.inject),
            inject: args.inject,
            copy_at_post,
            delivery_complete: false,
            silent: false,
        };
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let posted = r.ep.rma_write(RmaTarget { peer, key: args.key, addr: args.addr }, args.payload, data, meta);
        self.drain_outputs();
        posted.map(|_| ()).map_err(post_error)
    }

    pub fn rma_read(&mut self, args: RmaArgs<'_>) -> Result<()> {
        let peer = self.peer_for(args.peer_addr)?;
        let meta =
            OpMeta { context: args.context as u64, wanted: self.tx_wanted(args.flags, false), ..OpMeta::default() };
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let posted = r.ep.rma_read(RmaTarget { peer, key: args.key, addr: args.addr }, args.result.io(), meta);
        self.drain_outputs();
        posted.map(|_| ()).map_err(post_error)
    }

    pub fn atomic(&mut self, args: RmaArgs<'_>, datatype: u32, op: u32, count: usize, fetch: bool) -> Result<()> {
        let dt = crate::rma::datatype_from_fi(datatype).ok_or(Error::OpNotSupp)?;
        let o = crate::rma::op_from_fi(op).ok_or(Error::OpNotSupp)?;
        let bytes = count.checked_mul(dt.size()).ok_or(Error::Inval("atomic count"))?;
        let copy_at_post = args.inject || args.flags & fi::FI_INJECT as u64 != 0;
        if copy_at_post && bytes > self.profile.inject_size {
            return Err(Error::Inval("inject larger than inject_size"));
        }
        let peer = self.peer_for(args.peer_addr)?;
        let meta = OpMeta {
            context: args.context as u64,
            wanted: self.tx_wanted(args.flags, args.inject),
            inject: args.inject,
            copy_at_post,
            delivery_complete: false,
            silent: false,
        };
        let r = self.running.as_mut().ok_or(Error::OpNotSupp)?;
        let posted = r.ep.atomic(
            AtomicRequest {
                target: RmaTarget { peer, key: args.key, addr: args.addr },
                datatype: dt,
                op: o,
                count,
                operand: args.payload,
                compare: args.compare,
                result: args.result.io(),
                fetch,
            },
            meta,
        );
        self.drain_outputs();
        posted.map(|_| ()).map_err(post_error)
    }

    /// Endpoint close: acknowledge everything received so far, so no peer waits
    /// on an ack that would have been delayed, and push it out; on a lossy
    /// path linger a moment answering peers (see [`rndv::Endpoint::close`]).
    pub fn flush_on_close(&mut self) {
        let Some(r) = self.running.as_mut() else { return };
        r.ep.close();
        self.drain_outputs();
        loop {
            let Some(r) = self.running.as_mut() else { return };
            if r.ep.poll_close() {
                break;
            }
            self.drain_outputs();
            // How long the linger lasts is the endpoint's decision: sleep on
            // what it says (input, its timers, the linger's end).
            let Some(r) = self.running.as_mut() else { return };
            let w = r.ep.prepare_wait();
            if !w.ready {
                crate::progress::sleep_on(w.fd, w.deadline, rndv::BackgroundProgress::MAX_WAIT);
            }
        }
        self.drain_outputs();
        self.log_close_stats();
    }

    /// One round of progress (see [`rndv::Endpoint::progress`]), then the
    /// completions and events it produced, reported.
    pub fn progress(&mut self) {
        let Some(r) = self.running.as_mut() else { return };
        r.ep.progress();
        if r.ep.has_output() {
            self.drain_outputs();
        }
        if let Some(reason) = self.stats_dump.as_mut().and_then(|d| d.due()) {
            self.write_json_stats(reason);
        }
    }
}

/// Provider cleanup (libfabric's destructor, at exit or when libfabric is
/// unloaded), for endpoints the application never closed. It often runs on a
/// thread that `exit()` interrupted anywhere, maybe inside rdmx with an
/// endpoint locked (a signal handler calling `exit`, as MPI runtimes install),
/// so it never takes a lock and never joins a thread that could wait for one:
/// it tells the progress threads to end (each sees it at its next wake-up,
/// within 10 ms, or dies with the process) and removes the files the kernel
/// would leave behind (shared-memory rings). The library is linked `-z
/// nodelete` (prov/build.rs), so libfabric's dlclose after this call never unmaps
/// code a thread of ours may still run.
pub fn shutdown_all() {
    CLEANUPS.fetch_add(1, Ordering::AcqRel);
    ::devices::shm::unlink_own_at_exit();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::{EXACT_DIRECTED_RECV, TAGGED_DIRECTED_RECV};

    const PEER: u64 = 3;

    #[test]
    fn without_a_directed_cap_the_source_is_ignored() {
        for tagged in [false, true] {
            assert_eq!(recv_source(0, tagged, PEER, false).unwrap(), None);
            assert_eq!(recv_source(0, tagged, FI_ADDR_UNSPEC, false).unwrap(), None);
        }
    }

    #[test]
    fn directed_recv_directs_every_receive_and_takes_unspec_as_any() {
        for tagged in [false, true] {
            assert_eq!(recv_source(fi::FI_DIRECTED_RECV, tagged, PEER, false).unwrap(), Some(PEER));
            assert_eq!(recv_source(fi::FI_DIRECTED_RECV, tagged, FI_ADDR_UNSPEC, false).unwrap(), None);
        }
    }

    #[test]
    fn tagged_directed_recv_directs_tagged_receives_only() {
        assert_eq!(recv_source(TAGGED_DIRECTED_RECV, true, PEER, false).unwrap(), Some(PEER));
        assert_eq!(recv_source(TAGGED_DIRECTED_RECV, false, PEER, false).unwrap(), None);
        assert_eq!(recv_source(TAGGED_DIRECTED_RECV, true, FI_ADDR_UNSPEC, false).unwrap(), None);
    }

    #[test]
    fn exact_directed_recv_refuses_unspec_but_not_on_a_claim() {
        for caps in [
            EXACT_DIRECTED_RECV,
            EXACT_DIRECTED_RECV | fi::FI_DIRECTED_RECV,
            EXACT_DIRECTED_RECV | TAGGED_DIRECTED_RECV,
        ] {
            for tagged in [false, true] {
                assert_eq!(recv_source(caps, tagged, PEER, false).unwrap(), Some(PEER));
                let e = recv_source(caps, tagged, FI_ADDR_UNSPEC, false).unwrap_err();
                assert_eq!(e.errno(), fi::FI_EINVAL as i32, "{caps:#x} tagged {tagged}");
                assert_eq!(recv_source(caps, tagged, FI_ADDR_UNSPEC, true).unwrap(), None);
            }
        }
    }
}
