//! The device conformance suite: every device runs the same tests through the
//! [`Device`] trait. A device is added by one `conformance!` line naming a function
//! that opens two connected instances of it.
use devices::composite::{AutoDevice, NetPair};
use devices::fault::{FaultConfig, FaultDevice};
use devices::shm::{ShmConfig, ShmDevice};
use devices::udp::{UdpConfig, UdpDevice, UdpOffloads};
use rdm::device::DeviceExt;
use rdm::device::ShmAddr;
use rdm::device::{LocalBuf, ReadRun, RemoteReads, TxDatagram};
use rdm::{DevAddr, Device, DeviceError};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// The clock the tests pass to remote reads, as an endpoint passes its own
/// (devices read none).
fn now() -> rdm::time::Instant {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    rdm::time::Instant::from_nanos(EPOCH.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64)
}

type Pair = (Box<dyn Device>, Box<dyn Device>);

/// How long a test waits for datagrams that must arrive.
const PATIENCE: Duration = Duration::from_secs(5);

/// `poll(2)` on `fd` for readability.
fn readable(fd: RawFd, timeout_ms: i32) -> bool {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::BorrowedFd;
    // SAFETY: the device owning `fd` outlives this call.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(bfd, PollFlags::POLLIN)];
    let t = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX);
    matches!(poll(&mut fds, t), Ok(n) if n > 0)
}

/// Receives until `n` datagrams arrived or `PATIENCE` passed.
fn recv_n(dev: &mut dyn Device, n: usize) -> Vec<(DevAddr, Vec<u8>)> {
    let mut out = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while out.len() < n && Instant::now() < deadline {
        let got = dev.recv_batch(n - out.len(), &mut |src, data| out.push((src, data.to_vec()))).expect("recv_batch");
        if got == 0 {
            sleep_on(dev, 10);
        }
    }
    out
}

/// What every caller does before it sleeps: arm the device, then sleep on its
/// fd unless input is already waiting.
fn sleep_on(dev: &mut dyn Device, timeout_ms: i32) {
    if dev.prepare_wait() {
        return;
    }
    match dev.wait_fd() {
        Some(fd) => {
            readable(fd, timeout_ms);
        }
        None => std::thread::sleep(Duration::from_micros(100)),
    }
}

/// Drains whatever is there now (a short grace period for in-flight datagrams).
fn drain(dev: &mut dyn Device) -> usize {
    let mut n = 0;
    let until = Instant::now() + Duration::from_millis(20);
    while Instant::now() < until {
        n += dev.recv_batch(64, &mut |_, _| {}).expect("recv_batch");
    }
    n
}

/// Sends the whole batch, retrying on back-pressure.
fn send_all(dev: &mut dyn Device, batch: &[TxDatagram<'_>]) {
    let mut done = 0;
    let deadline = Instant::now() + PATIENCE;
    while done < batch.len() {
        done += dev.send_batch(now(), &batch[done..]).expect("send_batch");
        assert!(Instant::now() < deadline, "device never took the batch");
    }
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
}

fn send_and_receive_batch((mut a, mut b): Pair) {
    let dst = b.local_addr();
    let msgs: Vec<Vec<u8>> = (0..100).map(|i| payload(i, 1 + i * 13 % 1000)).collect();
    let batch: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(dst, m)).collect();
    send_all(a.as_mut(), &batch);
    let got = recv_n(b.as_mut(), msgs.len());
    assert_eq!(got.len(), msgs.len(), "all datagrams arrive on an idle local path");
    for (src, _) in &got {
        assert_eq!(*src, a.local_addr(), "source address is the sender's local address");
    }
    let mut got_data: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
    if b.caps().ordered && a.caps().ordered {
        assert_eq!(got_data, msgs);
    } else {
        let mut want = msgs.clone();
        want.sort();
        got_data.sort();
        assert_eq!(got_data, want);
    }
    // The receiver answers to the address it saw.
    let src = a.local_addr();
    send_all(b.as_mut(), &[TxDatagram::new(src, b"pong")]);
    let back = recv_n(a.as_mut(), 1);
    assert_eq!(back, vec![(b.local_addr(), b"pong".to_vec())]);
}

fn mtu_edges((mut a, mut b): Pair) {
    let mtu = a.caps().mtu;
    let dst = b.local_addr();
    let big = payload(1, mtu);
    send_all(a.as_mut(), &[TxDatagram::new(dst, &big)]);
    let got = recv_n(b.as_mut(), 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1, big);
    let too_big = payload(2, mtu + 1);
    match a.send_batch(now(), &[TxDatagram::new(dst, &too_big)]) {
        Err(DeviceError::TooLarge { len, mtu: m }) => assert_eq!((len, m), (mtu + 1, mtu)),
        other => panic!("mtu + 1 must be rejected with TooLarge, got {other:?}"),
    }
    // An oversized datagram in the middle stops the batch there.
    let ok = payload(3, 10);
    let n = a
        .send_batch(now(), &[TxDatagram::new(dst, &ok), TxDatagram::new(dst, &too_big), TxDatagram::new(dst, &ok)])
        .expect("a valid head is sent");
    assert_eq!(n, 1);
    assert_eq!(recv_n(b.as_mut(), 1).len(), 1);
}

fn zero_length((mut a, mut b): Pair) {
    let dst = b.local_addr();
    send_all(a.as_mut(), &[TxDatagram::new(dst, &[]), TxDatagram::new(dst, b"x")]);
    let mut got: Vec<Vec<u8>> = recv_n(b.as_mut(), 2).into_iter().map(|(_, d)| d).collect();
    got.sort();
    assert_eq!(got, vec![Vec::new(), b"x".to_vec()]);
}

fn lending_and_max((mut a, mut b): Pair) {
    let dst = b.local_addr();
    let msgs: Vec<Vec<u8>> = (0..10).map(|i| payload(i, 100 + i)).collect();
    let batch: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(dst, m)).collect();
    send_all(a.as_mut(), &batch);
    // recv_batch honours `max`, and each lent slice is intact inside the callback.
    let deadline = Instant::now() + PATIENCE;
    let mut seen = 0;
    while seen < msgs.len() && Instant::now() < deadline {
        let mut calls = 0;
        let n = b
            .recv_batch(3, &mut |_, data| {
                calls += 1;
                let i = data.len() - 100;
                assert_eq!(data, &msgs[i][..], "lent buffer valid in the callback");
            })
            .unwrap();
        assert!(n <= 3);
        assert_eq!(n, calls);
        seen += n;
    }
    assert_eq!(seen, msgs.len());
    assert_eq!(b.recv_batch(0, &mut |_, _| panic!("max = 0")).unwrap(), 0);
}

fn wait_fd_wakes((mut a, mut b): Pair) {
    let Some(fd) = b.wait_fd() else { return };
    drain(b.as_mut());
    assert!(!b.prepare_wait(), "nothing waiting");
    assert!(!readable(fd, 0), "idle device is not readable");
    let dst = b.local_addr();
    send_all(a.as_mut(), &[TxDatagram::new(dst, b"wake")]);
    assert!(readable(fd, 2000), "wait_fd becomes readable after a send");
    assert_eq!(recv_n(b.as_mut(), 1).len(), 1);
    // Data that arrived before the arm: prepare_wait says so (the fd of a device
    // that arms lazily may not be readable for it).
    drain(b.as_mut());
    send_all(a.as_mut(), &[TxDatagram::new(dst, b"early")]);
    let deadline = Instant::now() + PATIENCE;
    let mut noticed = false;
    while !noticed && Instant::now() < deadline {
        noticed = b.prepare_wait() || readable(fd, 10);
    }
    assert!(noticed, "input that arrived before the arm is noticed");
    assert_eq!(recv_n(b.as_mut(), 1).len(), 1);
}

fn no_spurious_data((mut a, mut b): Pair) {
    assert_eq!(drain(a.as_mut()), 0);
    assert_eq!(drain(b.as_mut()), 0);
    assert_ne!(a.local_addr(), b.local_addr());
}

fn flood_never_errors((mut a, b): Pair) {
    // Back-pressure is a short count, never an error; what is not taken may be
    // retried later.
    let dst = b.local_addr();
    let data = payload(0, 1000.min(a.caps().mtu));
    let batch: Vec<TxDatagram> = (0..4096).map(|_| TxDatagram::new(dst, &data)).collect();
    let mut total = 0;
    for _ in 0..4 {
        let n = a.send_batch(now(), &batch).expect("flooding is not an error");
        assert!(n <= batch.len());
        total += n;
    }
    assert!(total > 0);
    drop(b);
}

/// [`Device::quiet`] never hides input: with a datagram sent to it and
/// waiting (the send returned, so it is in the ring or the socket), a device
/// does not say it is quiet; and a device that says so has nothing to
/// deliver.
fn quiet_never_hides_input((mut a, mut b): Pair) {
    drain(b.as_mut());
    let dst = b.local_addr();
    for i in 0..64 {
        if b.quiet() {
            assert_eq!(drain(b.as_mut()), 0, "quiet, yet a datagram was there");
        }
        let data = payload(i, 64);
        send_all(a.as_mut(), &[TxDatagram::new(dst, &data)]);
        assert!(!b.quiet(), "datagram {i} waits, yet the device says it is quiet");
        assert_eq!(recv_n(b.as_mut(), 1), [(a.local_addr(), data)]);
    }
}

/// A device's lock-free input probe ([`Device::input_probe`]), where it has
/// one, never lets a round be skipped that would take input: while
/// [`Device::quiet_rounds`] allows skipping and the probe sees no input, the
/// device would call the round quiet ([`Device::quiet`]) — with a datagram
/// sent to it and waiting too. And skipping the rounds allowed and
/// reporting them ([`Device::rounds_skipped`]) leaves the device's schedule
/// where as many quiet rounds would.
fn input_probe_never_hides_input((mut a, mut b): Pair) {
    let Some(probe) = b.input_probe() else {
        assert_eq!(b.quiet_rounds(), 0, "rounds to skip without a probe to skip them on");
        return;
    };
    drain(b.as_mut());
    let dst = b.local_addr();
    for i in 0..64 {
        let data = payload(i, 64);
        send_all(a.as_mut(), &[TxDatagram::new(dst, &data)]);
        if b.quiet_rounds() > 0 && !probe.may_have_input() {
            assert!(b.quiet(), "datagram {i}: the probe lets a round be skipped, yet the device is not quiet");
        }
        assert_eq!(recv_n(b.as_mut(), 1), [(a.local_addr(), data)]);
    }
    drain(b.as_mut());
    let n = b.quiet_rounds().min(100);
    for k in 0..n {
        assert!(!probe.may_have_input(), "nothing sent, yet the probe sees input");
        assert!(b.quiet(), "round {k} of {n} allowed to be skipped, yet not quiet");
    }
    let after_asking = b.quiet_rounds();
    let m = after_asking.min(100);
    b.rounds_skipped(m);
    assert_eq!(b.quiet_rounds(), after_asking - m, "skipping {m} rounds moved the schedule otherwise");
}

macro_rules! conformance {
    ($name:ident, $open:expr) => {
        mod $name {
            use super::*;
            fn pair() -> Option<Pair> {
                $open
            }
            #[test]
            fn send_and_receive_batch() {
                if let Some(p) = pair() {
                    super::send_and_receive_batch(p)
                }
            }
            #[test]
            fn mtu_edges() {
                if let Some(p) = pair() {
                    super::mtu_edges(p)
                }
            }
            #[test]
            fn zero_length() {
                if let Some(p) = pair() {
                    super::zero_length(p)
                }
            }
            #[test]
            fn lending_and_max() {
                if let Some(p) = pair() {
                    super::lending_and_max(p)
                }
            }
            #[test]
            fn wait_fd_wakes() {
                if let Some(p) = pair() {
                    super::wait_fd_wakes(p)
                }
            }
            #[test]
            fn no_spurious_data() {
                if let Some(p) = pair() {
                    super::no_spurious_data(p)
                }
            }
            #[test]
            fn quiet_never_hides_input() {
                if let Some(p) = pair() {
                    super::quiet_never_hides_input(p)
                }
            }
            #[test]
            fn input_probe_never_hides_input() {
                if let Some(p) = pair() {
                    super::input_probe_never_hides_input(p)
                }
            }
            #[test]
            fn flood_never_errors() {
                if let Some(p) = pair() {
                    super::flood_never_errors(p)
                }
            }
        }
    };
}

/// A test (or part of one) that cannot run on this host says so and the caller
/// returns; under `CI=true` (as `.ci/run` sets) that is a failure instead, so
/// that CI never passes by skipping (the rule of `fi_tests::skip`, which rdm
/// cannot use: fi_tests links libfabric).
fn skip(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true and this test cannot run: {reason}");
    }
    eprintln!("SKIP: {reason}");
}

fn udp(addr: &str) -> Option<Box<dyn Device>> {
    let a: SocketAddr = addr.parse().unwrap();
    match UdpDevice::bind(a) {
        Ok(d) => Some(Box::new(d)),
        // No IPv6 on this host: the v6 instance is skipped.
        Err(e) if a.is_ipv6() => {
            skip(&format!("no IPv6 here: {e}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn udp_pair(addr: &str) -> Option<Pair> {
    Some((udp(addr)?, udp(addr)?))
}

/// A UDP device on `addr` with GSO / GRO asked for or not; `None` when the host
/// has no IPv6.
fn udp_with(addr: &str, gso: bool, gro: bool) -> Option<UdpDevice> {
    let a: SocketAddr = addr.parse().unwrap();
    let cfg = UdpConfig { gso, gro, ..UdpConfig::new(a) };
    match UdpDevice::open(&cfg) {
        Ok(d) => Some(d),
        Err(e) if a.is_ipv6() => {
            skip(&format!("no IPv6 here: {e}"));
            None
        }
        Err(e) => panic!("{e}"),
    }
}

// The default UDP instances use GSO / GRO where the kernel has them; these do not.
conformance!(udp_v4, udp_pair("127.0.0.1:0"));
conformance!(udp_v6, udp_pair("[::1]:0"));
conformance!(udp_v4_no_offloads, {
    let a = udp_with("127.0.0.1:0", false, false)?;
    let b = udp_with("127.0.0.1:0", false, false)?;
    assert_eq!(a.offloads(), UdpOffloads { gso: false, gro: false });
    Some((Box::new(a) as Box<dyn Device>, Box::new(b) as Box<dyn Device>))
});
conformance!(fault_udp_zero_rates, {
    let (a, b) = udp_pair("127.0.0.1:0")?;
    let cfg = FaultConfig { seed: 1, ..FaultConfig::default() };
    Some((Box::new(FaultDevice::new(a, cfg)) as Box<dyn Device>, Box::new(FaultDevice::new(b, cfg)) as Box<dyn Device>))
});

/// A receiver that only polls never arms its ring, so its senders make no
/// wake-up system call per message; one that prepares to sleep gets exactly one.
#[test]
fn shm_polling_receiver_costs_senders_no_wakeups() {
    let mut a = ShmDevice::new().unwrap();
    let mut b = ShmDevice::new().unwrap();
    let dst = b.local_addr();
    for i in 0..200u32 {
        send_all(&mut a, &[TxDatagram::new(dst, &i.to_le_bytes())]);
        let mut got = 0;
        while got == 0 {
            got = b.recv_batch(8, &mut |_, m| assert_eq!(m, i.to_le_bytes())).unwrap();
        }
    }
    assert_eq!(a.stats.wakeups_sent, 0, "no receiver armed, no FIFO writes");
    let fd = b.wait_fd().unwrap();
    assert!(!b.prepare_wait());
    send_all(&mut a, &[TxDatagram::new(dst, b"one")]);
    send_all(&mut a, &[TxDatagram::new(dst, b"two")]);
    assert!(readable(fd, 2000));
    assert_eq!(a.stats.wakeups_sent, 1, "one wake-up per arm");
    assert_eq!(recv_n(&mut b, 2).len(), 2);
}

/// A device with EFA SRD's semantics, modelled (the real one, `efa/`,
/// needs EFA hardware): the simulator's device on a network that never loses
/// a datagram but reorders them, whose reads name the peer's registration
/// keys. Each call moves the virtual clock to the next arrival, so datagrams
/// arrive in real time; reads are served from this process's memory, and
/// only through a live key of the peer's domain that covers the range.
struct SrdModel {
    dev: rdm::simnet::SimDevice,
    net: rdm::simnet::SimNet,
}

impl SrdModel {
    fn caps() -> rdm::DeviceCaps {
        rdm::DeviceCaps {
            reliable: true,
            ordered: false,
            remote_read: true,
            registration: true,
            ..rdm::DeviceCaps::datagram(8192)
        }
    }

    /// Two endpoints, each opened from its own domain (protection domain),
    /// and the registrars of those domains.
    fn pair() -> (SrdModel, SrdModel, Box<dyn rdm::device::Registrar>, Box<dyn rdm::device::Registrar>) {
        use rdm::device::{DeviceContext, OpenSpec};
        let link = rdm::sim::Link { reorder_pct: 30.0, jitter: Duration::from_micros(40), ..rdm::sim::Link::default() };
        let net = rdm::simnet::SimNet::new(2, SrdModel::caps(), link, 7);
        let spec = OpenSpec { bind: None, incarnation: 1, job_key: 0 };
        let (c0, c1) = (net.context(&[0]), net.context(&[1]));
        // Opening from a context ties the node to its domain.
        drop(c0.open(&spec).expect("node 0"));
        drop(c1.open(&spec).expect("node 1"));
        let (r0, r1) = (c0.registrar().expect("keys"), c1.registrar().expect("keys"));
        (SrdModel { dev: net.device(0), net: net.clone() }, SrdModel { dev: net.device(1), net }, r0, r1)
    }

    /// Delivers what is in flight, then serves posted reads.
    fn pump(&self) {
        // Everything in flight arrives, in the order of its (jittered)
        // arrival times: the virtual clock jumps a second at each call.
        self.net.advance(self.net.now() + Duration::from_secs(1));
        for r in self.net.take_reads() {
            let mut bytes = 0;
            let mut error = None;
            for run in &r.runs {
                let len = run.local.len();
                if !run.remote_key.is_some_and(|k| self.net.key_covers(r.peer, k, run.remote_addr, len)) {
                    error = Some(DeviceError::Config(format!("remote access error at {:#x}+{len}", run.remote_addr)));
                    break;
                }
                // SAFETY: the peer's range is covered by a live registration
                // of memory of this process, and the local one was checked
                // against the reader's domain at post.
                unsafe { std::ptr::copy(run.remote_addr as *const u8, run.local.addr() as *mut u8, len as usize) };
                bytes += len;
            }
            self.net.complete_read(r.node, rdm::device::ReadDone { id: r.id, bytes, error });
        }
    }
}

impl Device for SrdModel {
    fn caps(&self) -> rdm::DeviceCaps {
        self.dev.caps()
    }
    fn local_addrs(&self) -> Vec<DevAddr> {
        self.dev.local_addrs()
    }
    fn owns(&self, a: &DevAddr) -> bool {
        self.dev.owns(a)
    }
    fn send_batch(&mut self, now: rdm::Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.dev.send_batch(now, batch)
    }
    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        self.pump();
        self.dev.recv_batch(max, deliver)
    }
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }

    fn remote_reads(&mut self) -> Option<&mut dyn RemoteReads> {
        Some(self)
    }
}

impl RemoteReads for SrdModel {
    fn post_read(
        &mut self,
        now: rdm::time::Instant,
        id: u64,
        peer: DevAddr,
        runs: &[ReadRun],
    ) -> Result<(), DeviceError> {
        self.dev.remote_reads().unwrap().post_read(now, id, peer, runs)
    }

    fn poll_read(&mut self, now: rdm::time::Instant) -> Option<rdm::device::ReadDone> {
        self.pump();
        self.dev.remote_reads().unwrap().poll_read(now)
    }
}

conformance!(srd_model, {
    let (a, b, _, _) = SrdModel::pair();
    Some((Box::new(a) as Box<dyn Device>, Box::new(b) as Box<dyn Device>))
});

/// The SRD model never loses a datagram but does not keep their order: the
/// engine relies on the first and must not assume the second.
#[test]
fn srd_model_is_reliable_and_unordered() {
    let (mut a, mut b, _, _) = SrdModel::pair();
    let dst = b.local_addr();
    let msgs: Vec<Vec<u8>> = (0..500u32).map(|i| i.to_le_bytes().to_vec()).collect();
    let batch: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(dst, m)).collect();
    send_all(&mut a, &batch);
    let got: Vec<u32> =
        recv_n(&mut b, msgs.len()).into_iter().map(|(_, d)| u32::from_le_bytes(d.try_into().unwrap())).collect();
    assert_eq!(got.len(), 500, "every datagram arrives");
    assert!(got.windows(2).any(|w| w[0] > w[1]), "some arrive out of order");
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, (0..500).collect::<Vec<u32>>());
}

/// Reads on the SRD model name the peer's key and a local one of the
/// reader's own domain: through a live key the bytes arrive; through a key
/// the peer deregistered, the read completes in error and writes nothing; a
/// local key of another domain is refused at post.
#[test]
fn srd_model_reads_through_keys_only() {
    let (mut a, b, mut ra, mut rb) = SrdModel::pair();
    let src: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let skey = rb.register(src.as_ptr() as u64, src.len() as u64, 0).unwrap();
    let dkey = ra.register(dst.as_mut_ptr() as u64, dst.len() as u64, 0).unwrap();
    // SAFETY: `dst` outlives the reads below, which complete before it is read.
    let local = unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, dst.len() as u64) }.with_key(dkey);
    let half = src.len() as u64 / 2;
    let runs = [
        ReadRun { remote_addr: src.as_ptr() as u64, remote_key: Some(skey), local: local.sub(0, half).unwrap() },
        ReadRun {
            remote_addr: src.as_ptr() as u64 + half,
            remote_key: Some(skey),
            local: local.sub(half, half).unwrap(),
        },
    ];
    a.remote_reads().unwrap().post_read(now(), 1, b.local_addr(), &runs).unwrap();
    let done = a.remote_reads().unwrap().poll_read(now()).expect("served");
    assert_eq!((done.id, done.bytes, done.error.is_none()), (1, src.len() as u64, true));
    assert!(dst == src);
    dst.fill(0);
    rb.deregister(skey);
    a.remote_reads().unwrap().post_read(now(), 2, b.local_addr(), &runs).unwrap();
    let done = a.remote_reads().unwrap().poll_read(now()).expect("served");
    assert!(done.id == 2 && done.bytes == 0 && done.error.is_some(), "{done:?}");
    assert!(dst.iter().all(|&x| x == 0), "a refused read wrote nothing");
    let skey = rb.register(src.as_ptr() as u64, src.len() as u64, 0).unwrap();
    let foreign = rb.register(dst.as_mut_ptr() as u64, dst.len() as u64, 0).unwrap();
    let bad = [ReadRun { remote_addr: src.as_ptr() as u64, remote_key: Some(skey), local: local.with_key(foreign) }];
    assert!(
        matches!(a.remote_reads().unwrap().post_read(now(), 3, b.local_addr(), &bad), Err(DeviceError::Config(_))),
        "a local key of another domain"
    );
    assert!(a.remote_reads().unwrap().poll_read(now()).is_none());
    drop(b);
}

fn shm() -> Box<dyn Device> {
    Box::new(ShmDevice::new().expect("shm device"))
}

conformance!(shm, Some((shm(), shm())));

fn auto() -> AutoDevice {
    let udp = UdpDevice::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    AutoDevice::new(Some(ShmDevice::new().unwrap()), Some(Box::new(udp))).unwrap()
}

conformance!(auto_udp_route, Some((Box::new(auto()) as Box<dyn Device>, Box::new(auto()) as Box<dyn Device>)));

/// The network half of auto on a host with an RDMA device, modelled with shm
/// as the preferred device (it owns its own addresses, as UD does): the suite
/// runs through the fallback (UDP, the pair's `local_addr`).
fn net_pair() -> NetPair<ShmDevice, UdpDevice> {
    NetPair::new(
        Box::new(ShmDevice::new().unwrap()),
        Box::new(UdpDevice::bind("127.0.0.1:0".parse().unwrap()).unwrap()),
    )
    .unwrap()
}

conformance!(
    net_pair_fallback_route,
    Some((Box::new(net_pair()) as Box<dyn Device>, Box::new(net_pair()) as Box<dyn Device>))
);

#[test]
fn net_pair_routes_each_address_to_the_device_that_owns_it() {
    let (mut a, mut b) = (net_pair(), net_pair());
    let addrs = b.local_addrs();
    assert_eq!(addrs.len(), 2);
    assert_eq!(b.local_addr(), addrs[0], "the fallback's address first");
    let (udp, shm) = (addrs[0], addrs[1]);
    assert!(matches!(udp, DevAddr::Udp(_)) && matches!(shm, DevAddr::Shm(_)));
    assert!(a.caps_for(&shm).reliable && !a.caps_for(&udp).reliable);
    assert!(!a.caps().reliable, "the combination is the weaker");
    let fd = b.wait_fd().expect("an epoll fd over both halves");
    for (i, dst) in [shm, udp, shm].into_iter().enumerate() {
        assert!(!b.prepare_wait());
        let msg = payload(i, 100 + i);
        send_all(&mut a, &[TxDatagram::new(dst, &msg)]);
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call.
        assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1, "the wait fd did not wake for a datagram to {dst:?}");
        let got = recv_n(&mut b, 1);
        assert_eq!(got[0].1, msg);
        // The source is a's address on the half it came through.
        assert_eq!(std::mem::discriminant(&got[0].0), std::mem::discriminant(&dst));
        assert!(a.local_addrs().contains(&got[0].0), "{:?} is not one of a's addresses", got[0].0);
    }
    // A mixed batch goes out in runs, in order.
    let msgs: Vec<Vec<u8>> = (0..4).map(|i| payload(10 + i, 50)).collect();
    let batch: Vec<TxDatagram> = msgs.iter().zip([udp, shm, shm, udp]).map(|(m, d)| TxDatagram::new(d, m)).collect();
    send_all(&mut a, &batch);
    let mut got: Vec<Vec<u8>> = recv_n(&mut b, 4).into_iter().map(|(_, d)| d).collect();
    got.sort();
    let mut want = msgs.clone();
    want.sort();
    assert_eq!(got, want);
}

/// `auto` asks its network half for the caps of each address, and a pair
/// answers for the device that carries it: here two UDP devices of different
/// MTUs (the preferred takes every UDP address), so a remote peer gets the
/// preferred's 1472 bytes, not the pair's conservative 1000. (With UD as the
/// preferred half, a UD peer gets registration and its MTU this way.)
#[test]
fn auto_answers_caps_per_address_through_its_network_pair() {
    let udp = |mtu| {
        let mut c = devices::udp::UdpConfig::new("127.0.0.1:0".parse().unwrap());
        c.mtu = mtu;
        UdpDevice::open(&c).unwrap()
    };
    let pair = NetPair::new(Box::new(udp(1472)), Box::new(udp(1000))).unwrap();
    assert_eq!(pair.caps().mtu, 1000);
    let auto = AutoDevice::new(Some(ShmDevice::new().unwrap()), Some(Box::new(pair))).unwrap();
    let peer = DevAddr::Udp("127.0.0.1:9".parse().unwrap());
    assert_eq!(auto.caps_for(&peer).mtu, 1472);
    let shm_peer = DevAddr::Shm(auto.shm_addr().unwrap());
    assert!(auto.caps_for(&shm_peer).reliable);
}

// ---- device-specific tests ----

#[test]
fn udp_bad_iface_is_a_config_error() {
    let cfg = UdpConfig { iface: Some("rdmx-no-such0".into()), ..UdpConfig::default() };
    assert!(matches!(UdpDevice::open(&cfg), Err(DeviceError::Config(_))));
    let cfg = UdpConfig { node: Some("127.0.0.1".into()), service: Some("not-a-port".into()), ..UdpConfig::default() };
    assert!(matches!(UdpDevice::open(&cfg), Err(DeviceError::Config(_))));
}

#[test]
fn udp_iface_by_name_and_defaults() {
    let cfg = UdpConfig { iface: Some("lo".into()), ..UdpConfig::default() };
    let d = UdpDevice::open(&cfg).unwrap();
    assert!(d.local_socket_addr().ip().is_loopback());
    assert_ne!(d.local_socket_addr().port(), 0);
    assert_eq!(d.caps().mtu, 1472);
    assert!(!d.caps().reliable);
    assert!(!d.caps().registration, "udp pushes: nothing to register");
    // Default: the host name's address (or loopback), never a wildcard.
    let d = UdpDevice::open(&UdpConfig::default()).unwrap();
    assert!(!d.local_socket_addr().ip().is_unspecified());
    // A configured MTU is honoured, an impossible one refused.
    let mut cfg = UdpConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.mtu = 65000;
    assert_eq!(UdpDevice::open(&cfg).unwrap().caps().mtu, 65000);
    cfg.mtu = 70000;
    assert!(matches!(UdpDevice::open(&cfg), Err(DeviceError::Config(_))));
}

#[test]
fn udp_wrong_address_kind_is_unreachable() {
    let mut a = udp("127.0.0.1:0").unwrap();
    let b = udp("127.0.0.1:0").unwrap();
    let sim = rdm::simnet::addr(3);
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(sim, b"x")]), Err(DeviceError::Unreachable(_))));
    // A bad address after a good one shortens the batch instead.
    let n = a.send_batch(now(), &[TxDatagram::new(b.local_addr(), b"x"), TxDatagram::new(sim, b"x")]).unwrap();
    assert_eq!(n, 1);
}

#[test]
fn udp_dead_peer_does_not_poison_the_socket() {
    let mut a = udp("127.0.0.1:0").unwrap();
    let mut b = udp("127.0.0.1:0").unwrap();
    let dead = {
        let d = udp("127.0.0.1:0").unwrap();
        d.local_addr()
    };
    for _ in 0..5 {
        let _ = a.send_batch(now(), &[TxDatagram::new(dead, b"to nobody")]);
        std::thread::sleep(Duration::from_millis(2));
    }
    drain(a.as_mut());
    send_all(a.as_mut(), &[TxDatagram::new(b.local_addr(), b"alive")]);
    assert_eq!(recv_n(b.as_mut(), 1).len(), 1);
}

/// A datagram that says which it is: its index up front (when it has room),
/// then a pattern.
fn tagged(i: usize, len: usize) -> Vec<u8> {
    let mut d = payload(i, len);
    let tag = (i as u32).to_le_bytes();
    let n = len.min(4);
    d[..n].copy_from_slice(&tag[..n]);
    d
}

fn sorted(mut v: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    v.sort();
    v
}

/// Sends every group of `(to_b, len)` datagrams from `a` and checks that `b` and
/// `c` receive exactly their datagrams, boundaries and bytes intact. Returns the
/// datagrams sent.
fn gso_groups(a: &mut UdpDevice, b: &mut UdpDevice, c: &mut UdpDevice, groups: &[Vec<(bool, usize)>]) -> u64 {
    let mut idx = 0;
    let mut sent = 0;
    for (g, group) in groups.iter().enumerate() {
        let msgs: Vec<(bool, Vec<u8>)> = group
            .iter()
            .map(|&(to_b, len)| {
                idx += 1;
                (to_b, tagged(idx, len))
            })
            .collect();
        let (db, dc) = (b.local_addr(), c.local_addr());
        let batch: Vec<TxDatagram> =
            msgs.iter().map(|(to_b, m)| TxDatagram::new(if *to_b { db } else { dc }, m)).collect();
        send_all(a, &batch);
        sent += batch.len() as u64;
        for (dev, want_b) in [(&mut *b, true), (&mut *c, false)] {
            let want: Vec<Vec<u8>> = msgs.iter().filter(|(to_b, _)| *to_b == want_b).map(|(_, m)| m.clone()).collect();
            let got = recv_n(dev, want.len());
            assert!(got.iter().all(|(src, _)| *src == a.local_addr()), "group {g}: source address");
            let got: Vec<Vec<u8>> = got.into_iter().map(|(_, d)| d).collect();
            assert_eq!(got.len(), want.len(), "group {g}: datagram count");
            assert!(sorted(got) == sorted(want), "group {g}: datagrams differ (boundaries or bytes)");
        }
    }
    assert_eq!(drain(b) + drain(c), 0, "nothing extra arrives");
    sent
}

/// Runs, short last datagrams, mixed destinations and sizes, empty datagrams,
/// runs longer than GSO_MAX_SEGMENTS and than GSO_MAX_BYTES.
fn gso_test_groups(mtu: usize) -> Vec<Vec<(bool, usize)>> {
    let run = |to_b: bool, n: usize, len: usize| vec![(to_b, len); n];
    vec![
        run(true, 100, 1000),
        [run(false, 5, 1200), vec![(false, 300)], run(false, 7, 1200)].concat(),
        (0..20).map(|i| (i % 2 == 0, 500)).collect(),
        (0..30).map(|i| (i % 3 != 0, 1 + i * 37 % mtu)).collect(),
        vec![(true, 800), (true, 800), (true, 0), (true, 800), (true, 800), (true, 1)],
        run(false, 150, 100),
        run(true, 120, mtu),
        [run(false, 3, 600), run(false, 3, 900), run(false, 2, 900), vec![(false, 899), (false, 900)]].concat(),
        [run(true, 40, mtu), vec![(true, 17)], run(false, 40, mtu), vec![(false, mtu - 1)], run(true, 3, 5)].concat(),
    ]
}

fn udp_gso_boundaries(addr: &str) {
    for (gso, gro) in [(true, true), (true, false), (false, true), (false, false)] {
        let (Some(mut a), Some(mut b), Some(mut c)) =
            (udp_with(addr, gso, false), udp_with(addr, false, gro), udp_with(addr, false, gro))
        else {
            return;
        };
        if gso && !a.offloads().gso {
            skip("the kernel offers no UDP GSO here: the GSO half only checks the fallback");
        }
        let mtu = a.caps().mtu;
        let sent = gso_groups(&mut a, &mut b, &mut c, &gso_test_groups(mtu));
        let st = a.stats;
        assert_eq!(st.sent, sent, "send_batch counts datagrams, GSO or not");
        if a.offloads().gso {
            assert!(st.gso_sends > 0 && st.gso_segments >= 2 * st.gso_sends, "GSO was used: {st:?}");
        } else {
            assert_eq!((st.gso_sends, st.gso_segments), (0, 0));
        }
        let (rb, rc) = (b.stats, c.stats);
        assert_eq!(rb.received + rc.received, sent);
        // On loopback the kernel hands a GSO send whole to a GRO socket; it is
        // counted only if the kernel did coalesce (the bytes were checked above).
        let coalesced = rb.gro_segments + rc.gro_segments;
        eprintln!(
            "{addr} gso {gso} gro {gro}: {} GSO sends of {} datagrams; {coalesced} datagrams arrived coalesced",
            st.gso_sends, st.gso_segments
        );
        if !b.offloads().gro {
            assert_eq!(coalesced, 0);
        }
        assert!(rb.gro_segments >= 2 * rb.gro_messages && rc.gro_segments >= 2 * rc.gro_messages);
    }
}

#[test]
fn udp_gso_keeps_datagram_boundaries_v4() {
    udp_gso_boundaries("127.0.0.1:0");
}

#[test]
fn udp_gso_keeps_datagram_boundaries_v6() {
    udp_gso_boundaries("[::1]:0");
}

fn udp_gro_split(addr: &str) {
    let Some(mut d) = udp_with(addr, false, true) else { return };
    let dst = d.local_socket_addr();
    let plain = std::net::UdpSocket::bind(addr).unwrap();
    // A burst of same-size datagrams from an ordinary socket.
    let burst: Vec<Vec<u8>> = (0..50).map(|i| tagged(i, 1000)).collect();
    for m in &burst {
        plain.send_to(m, dst).unwrap();
    }
    let got: Vec<Vec<u8>> = recv_n(&mut d, burst.len()).into_iter().map(|(_, m)| m).collect();
    assert!(sorted(got) == sorted(burst.clone()), "burst of single datagrams intact");
    // One socket-wide GSO send (the kernel cuts 10 500 bytes every 1000): a GRO
    // socket may receive it whole.
    let gso = std::net::UdpSocket::bind(addr).unwrap();
    if nix::sys::socket::setsockopt(&gso, nix::sys::socket::sockopt::UdpGsoSegment, &1000).is_err() {
        skip("no UDP_SEGMENT here: the coalesced half");
        return;
    }
    let whole: Vec<u8> = (0..11).flat_map(|i| tagged(100 + i, if i == 10 { 500 } else { 1000 })).collect();
    let want: Vec<Vec<u8>> = whole.chunks(1000).map(|c| c.to_vec()).collect();
    let before = d.stats;
    let fd = d.wait_fd().unwrap();
    for round in 0..2 {
        gso.send_to(&whole, dst).unwrap();
        assert!(readable(fd, 2000));
        // Three at a time: what a coalesced message holds beyond `max` waits for
        // the next call, and a caller about to sleep learns of it.
        let mut got = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while got.len() < want.len() && Instant::now() < deadline {
            let n = d.recv_batch(3, &mut |_, m| got.push(m.to_vec())).unwrap();
            assert!(n <= 3, "recv_batch honours max");
            let coalesced = d.stats.gro_messages > before.gro_messages;
            if n == 3 && got.len() < want.len() && coalesced {
                assert!(
                    d.prepare_wait() || readable(fd, 0),
                    "round {round}: held-back datagrams are reported before a sleep"
                );
            }
            if n == 0 {
                sleep_on(&mut d, 10);
            }
        }
        assert_eq!(got, want, "round {round}: split back in order, boundaries exact");
        assert!(!d.prepare_wait() && !readable(fd, 0), "round {round}: nothing left, nothing reported");
    }
    let st = d.stats;
    let msgs = st.gro_messages - before.gro_messages;
    let segs = st.gro_segments - before.gro_segments;
    eprintln!("{addr}: kernel coalesced {msgs} messages of {segs} datagrams");
    if msgs > 0 {
        assert_eq!(segs, 11 * msgs, "each coalesced message is one GSO send of 11");
    }
    // A receiver without GRO gets the same datagrams, cut by the kernel.
    let Some(mut e) = udp_with(addr, false, false) else { return };
    gso.send_to(&whole, e.local_socket_addr()).unwrap();
    let got: Vec<Vec<u8>> = recv_n(&mut e, want.len()).into_iter().map(|(_, m)| m).collect();
    assert_eq!(sorted(got), sorted(want));
    assert_eq!(e.stats.gro_messages, 0);
}

#[test]
fn udp_gro_splits_coalesced_receives_v4() {
    udp_gro_split("127.0.0.1:0");
}

#[test]
fn udp_gro_splits_coalesced_receives_v6() {
    udp_gro_split("[::1]:0");
}

#[test]
fn udp_gso_run_to_unreachable_does_not_poison() {
    let mut a = udp_with("127.0.0.1:0", true, true).unwrap();
    let mut b = udp_with("127.0.0.1:0", true, true).unwrap();
    let dead = udp_with("127.0.0.1:0", false, false).unwrap().local_addr();
    // Refused at once (broadcast without SO_BROADCAST), and silently lost.
    let refused = DevAddr::Udp("255.255.255.255:9".parse().unwrap());
    let data: Vec<Vec<u8>> = (0..30).map(|i| tagged(i, 1000)).collect();
    let dsts = [refused, dead, b.local_addr()];
    let batch: Vec<TxDatagram> = data.iter().enumerate().map(|(i, m)| TxDatagram::new(dsts[i / 10], m)).collect();
    // What the provider does: a failing head datagram is dropped, the rest retried.
    let mut done = 0;
    let mut errors = 0;
    let deadline = Instant::now() + PATIENCE;
    while done < batch.len() {
        match a.send_batch(now(), &batch[done..]) {
            Ok(n) => done += n,
            Err(e) => {
                assert!(done < 10, "only the refused run fails: {e}");
                if errors == 0 {
                    eprintln!("broadcast run refused: {e}");
                }
                errors += 1;
                done += 1;
            }
        }
        assert!(Instant::now() < deadline);
    }
    assert!(errors > 0, "the broadcast run is refused");
    let got: Vec<Vec<u8>> = recv_n(&mut b, 10).into_iter().map(|(_, m)| m).collect();
    assert_eq!(sorted(got), data[20..].to_vec());
    // GSO is still on and still works.
    assert_eq!(a.offloads().gso, b.offloads().gso);
    let gso_before = a.stats.gso_sends;
    for _ in 0..3 {
        send_all(&mut a, &batch[10..]);
        let got: Vec<Vec<u8>> = recv_n(&mut b, 10).into_iter().map(|(_, m)| m).collect();
        assert_eq!(sorted(got), data[20..].to_vec());
    }
    if a.offloads().gso {
        assert!(a.stats.gso_sends >= gso_before + 6, "{:?}", a.stats);
        assert_eq!(a.stats.gso_fallbacks, 0);
    }
    assert_eq!(drain(&mut b), 0);
}

#[test]
fn udp_gso_refused_falls_back() {
    // Without GRO the wait fd is the socket itself. With UDP checksums off
    // (SO_NO_CHECK) the kernel refuses every GSO send with EINVAL, as it refuses
    // one with EIO on a device without checksum offload.
    let mut a = udp_with("127.0.0.1:0", true, false).unwrap();
    let mut b = udp_with("127.0.0.1:0", false, true).unwrap();
    if !a.offloads().gso {
        skip("no UDP GSO here: nothing to fall back from");
        return;
    }
    let one: libc::c_int = 1;
    // SAFETY: the fd is the open socket of `a`, `one` a live c_int of the size given.
    let r = unsafe {
        libc::setsockopt(
            a.wait_fd().unwrap(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            &one as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    let data: Vec<Vec<u8>> = (0..25).map(|i| tagged(i, if i < 20 { 1000 } else { 500 })).collect();
    let dst = b.local_addr();
    let batch: Vec<TxDatagram> = data.iter().map(|m| TxDatagram::new(dst, m)).collect();
    assert_eq!(a.send_batch(now(), &batch).unwrap(), batch.len(), "refused GSO is resent without it, in the same call");
    let got: Vec<Vec<u8>> = recv_n(&mut b, data.len()).into_iter().map(|(_, m)| m).collect();
    assert_eq!(sorted(got), sorted(data));
    assert!(!a.offloads().gso, "GSO is off for good");
    assert_eq!((a.stats.gso_fallbacks, a.stats.gso_sends, a.stats.sent), (1, 0, 25));
    assert_eq!(b.stats.gro_messages, 0);
}

/// One throughput run: `a` sends `per_call` datagrams of `len` bytes per
/// `send_batch` for `secs` while another thread receives on `b`. Returns
/// (sent/s, received/s, received MB/s, GSO sends, coalesced receives).
fn udp_throughput_run(
    mut a: UdpDevice,
    mut b: UdpDevice,
    per_call: usize,
    len: usize,
    secs: f64,
) -> (f64, f64, f64, u64, u64) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dst = b.local_addr();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let stop_rx = stop.clone();
    let rx = std::thread::spawn(move || {
        let (mut n, mut bytes) = (0u64, 0u64);
        let fd = b.wait_fd().unwrap();
        while !stop_rx.load(Ordering::Relaxed) {
            let got = b
                .recv_batch(256, &mut |_, m| {
                    n += 1;
                    bytes += m.len() as u64;
                })
                .unwrap();
            if got == 0 {
                readable(fd, 1);
            }
        }
        (n, bytes, b.stats.gro_messages)
    });
    let data = payload(7, len);
    let batch: Vec<TxDatagram> = (0..per_call).map(|_| TxDatagram::new(dst, &data)).collect();
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let n = a.send_batch(now(), &batch).unwrap();
        sent += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    let t = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let (n, bytes, coalesced) = rx.join().unwrap();
    (sent as f64 / t, n as f64 / t, bytes as f64 / t / 1e6, a.stats.gso_sends, coalesced)
}

/// Throughput of 1472-byte datagrams over loopback between two devices, GSO / GRO
/// on and off, as the provider calls (32 datagrams per `send_batch`) and in larger
/// batches; the median of three interleaved rounds of one second. Run with
/// `cargo test --release -p rdm --test device_conformance udp_offload_throughput -- --ignored --nocapture`.
#[test]
#[ignore]
fn udp_offload_throughput() {
    const ROUNDS: usize = 3;
    let configs: Vec<(usize, bool, bool)> = [32, 256]
        .into_iter()
        .flat_map(|per_call| {
            [(false, false), (true, false), (false, true), (true, true)].map(|(gso, gro)| (per_call, gso, gro))
        })
        .collect();
    let mut results = vec![Vec::new(); configs.len()];
    for _ in 0..ROUNDS {
        for (i, &(per_call, gso, gro)) in configs.iter().enumerate() {
            let a = udp_with("127.0.0.1:0", gso, false).unwrap();
            let b = udp_with("127.0.0.1:0", false, gro).unwrap();
            let used = (a.offloads().gso, b.offloads().gro);
            results[i].push((udp_throughput_run(a, b, per_call, 1472, 1.0), used));
        }
    }
    println!(
        "per call | GSO | GRO | sent dgrams/s | received dgrams/s | received MB/s | GSO sends | coalesced receives"
    );
    for (i, &(per_call, _, _)) in configs.iter().enumerate() {
        let r = &mut results[i];
        r.sort_by(|x, y| x.0 .1.total_cmp(&y.0 .1));
        let ((sent, recv, mbs, gso_sends, coalesced), (gso, gro)) = r[ROUNDS / 2];
        println!("{per_call} | {gso} | {gro} | {sent:.0} | {recv:.0} | {mbs:.0} | {gso_sends} | {coalesced}");
    }
}

#[test]
fn shm_caps_and_names() {
    let d = ShmDevice::new().unwrap();
    let c = d.caps();
    assert!(c.reliable && c.ordered);
    assert!(!c.registration, "process_vm_readv reads without a registration");
    assert_eq!(c.mtu, devices::shm::DEFAULT_MTU);
    let DevAddr::Shm(a) = d.local_addr() else { panic!() };
    assert_eq!(a.pid, std::process::id());
    assert_eq!(a.host_id, devices::shm::host_id());
    assert!(d.path().exists());
    let path = d.path().to_owned();
    drop(d);
    assert!(!path.exists(), "ring file removed on drop");
}

/// The gathered write of the small-message path, to a resolved destination:
/// the parts arrive as one datagram, back to back, in order with batched
/// sends; a full ring takes nothing (`Ok(false)`, the caller sends it another
/// way) and takes again once drained; an oversized datagram and a closed
/// peer are errors, as for `send_batch`; a destination of another kind does
/// not resolve; a destination kept past its peer's removal is refused, also
/// once its slot serves another peer, whose writes land in its own ring.
#[test]
fn shm_gathered_write_is_one_datagram_and_honours_the_ring() {
    let cfg = ShmConfig { slots: 4, ..ShmConfig::default() };
    let mut a = ShmDevice::open(&cfg).unwrap();
    let mut b = ShmDevice::open(&cfg).unwrap();
    let dst = b.local_addr();
    let me = a.local_addr();
    let d = a.resolve(&dst).unwrap().expect("a same-host peer resolves");
    send_all(&mut a, &[TxDatagram::new(dst, b"first")]);
    assert!(a.write(now(), d, &[b"head|", b"", b"payload"]).unwrap());
    send_all(&mut a, &[TxDatagram::new(dst, b"third")]);
    assert!(a.write(now(), d, &[b"fourth"]).unwrap());
    assert!(!a.write(now(), d, &[b"fifth"]).unwrap(), "full ring: not taken");
    let got = recv_n(&mut b, 4);
    let bytes: Vec<&[u8]> = got.iter().map(|(_, d)| &d[..]).collect();
    assert_eq!(bytes, [&b"first"[..], b"head|payload", b"third", b"fourth"]);
    assert!(got.iter().all(|(from, _)| *from == me));
    assert_eq!(b.recv_batch(8, &mut |_, _| {}).unwrap(), 0, "the refused write left nothing behind");
    assert!(a.write(now(), d, &[b"fifth"]).unwrap(), "drained: taken again");
    assert_eq!(recv_n(&mut b, 1)[0].1, b"fifth");
    let big = vec![0u8; a.caps().mtu + 1];
    assert!(matches!(a.write(now(), d, &[&big[..8], &big[8..]]), Err(DeviceError::TooLarge { .. })));
    let udp: DevAddr = DevAddr::Udp("127.0.0.1:9".parse().unwrap());
    assert_eq!(a.resolve(&udp).unwrap(), None, "only a same-host peer resolves");
    drop(b);
    assert!(matches!(a.write(now(), d, &[b"x"]), Err(DeviceError::Unreachable(_))), "its owner closed the ring");
    assert!(!a.write(now(), d, &[b"x"]).unwrap(), "a destination outliving its peer is refused");
    assert!(matches!(a.resolve(&dst), Err(DeviceError::Unreachable(_))));
    // The freed slot serves the next peer; the old destination still names nobody.
    let mut c = ShmDevice::open(&cfg).unwrap();
    let dc = a.resolve(&c.local_addr()).unwrap().expect("resolves");
    assert_ne!(dc, d);
    assert!(!a.write(now(), d, &[b"stale"]).unwrap(), "never misdirected to the slot's new peer");
    assert!(a.write(now(), dc, &[b"to c"]).unwrap());
    assert_eq!(recv_n(&mut c, 1)[0].1, b"to c");
    assert_eq!(c.recv_batch(8, &mut |_, _| {}).unwrap(), 0, "c got its own datagram only");
}

/// A device that does not offer gathered writes (udp; the fault decorator,
/// whose faults must apply) resolves nothing: the caller sends another way.
#[test]
fn gathered_writes_are_only_where_offered() {
    let mut u = UdpDevice::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dst = u.local_addr();
    assert_eq!(u.resolve(&dst).unwrap(), None);
    let shm = ShmDevice::new().unwrap();
    let shm_dst = shm.local_addr();
    let mut f = FaultDevice::new(Box::new(ShmDevice::new().unwrap()), FaultConfig::default());
    assert_eq!(f.resolve(&shm_dst).unwrap(), None);
}

#[test]
fn shm_full_ring_is_back_pressure() {
    let cfg = ShmConfig { slots: 8, ..ShmConfig::default() };
    let mut a = ShmDevice::open(&cfg).unwrap();
    let mut b = ShmDevice::open(&cfg).unwrap();
    let dst = b.local_addr();
    let batch: Vec<TxDatagram> = (0..20).map(|_| TxDatagram::new(dst, b"0123456789")).collect();
    assert_eq!(a.send_batch(now(), &batch).unwrap(), 8);
    assert_eq!(a.send_batch(now(), &batch).unwrap(), 0, "full ring: short count, not an error");
    assert_eq!(recv_n(&mut b, 8).len(), 8);
    assert_eq!(a.send_batch(now(), &batch).unwrap(), 8);
}

#[test]
fn shm_dead_peer_is_unreachable() {
    let mut a = ShmDevice::new().unwrap();
    // A peer that closed (cached mapping and fresh lookup both fail).
    let b = ShmDevice::new().unwrap();
    let dst = b.local_addr();
    send_all(&mut a, &[TxDatagram::new(dst, b"hi")]);
    drop(b);
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(dst, b"hi")]), Err(DeviceError::Unreachable(_))));
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(dst, b"hi")]), Err(DeviceError::Unreachable(_))));
    // A peer whose process does not exist.
    let DevAddr::Shm(mut ghost) = a.local_addr() else { panic!() };
    ghost.pid = 0x3fff_fff0;
    let ghost = DevAddr::Shm(ghost);
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(ghost, b"x")]), Err(DeviceError::Unreachable(_))));
    // Another host, or another kind of address.
    let DevAddr::Shm(mut remote) = a.local_addr() else { panic!() };
    remote.host_id ^= 0x10;
    let remote = DevAddr::Shm(remote);
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(remote, b"x")]), Err(DeviceError::Unreachable(_))));
    let udp: DevAddr = DevAddr::Udp("127.0.0.1:9".parse().unwrap());
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(udp, b"x")]), Err(DeviceError::Unreachable(_))));
    // After a good datagram, the bad one shortens the batch.
    let me = a.local_addr();
    assert_eq!(a.send_batch(now(), &[TxDatagram::new(me, b"x"), TxDatagram::new(ghost, b"x")]).unwrap(), 1);
}

#[test]
fn shm_remote_read_own_process() {
    let a = ShmDevice::new().unwrap();
    let mut b = ShmDevice::new().unwrap();
    if !a.caps().remote_read {
        skip("process_vm_readv unavailable here");
        return;
    }
    let DevAddr::Shm(pa) = a.local_addr() else { panic!() };
    assert!(b.probe_remote_read(&pa));
    let src: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let mut dst = vec![0u8; src.len()];
    let n = b.remote_read(a.local_addr(), src.as_ptr() as u64, &mut dst).unwrap();
    assert_eq!(n, src.len());
    assert_eq!(dst, src);
    // An unmapped address is an error, not a crash.
    let mut small = [0u8; 8];
    assert!(b.remote_read(a.local_addr(), 8, &mut small).is_err());
    // Posted: two runs land in order; a bad address stops the read with an
    // error after the bytes before it, in its one completion.
    let mut two = vec![0u8; 300];
    let (lo, hi) = two.split_at_mut(100);
    // SAFETY: both halves of `two` outlive the read (synchronous on shm) and
    // nothing else touches them.
    let runs = unsafe {
        [
            ReadRun {
                remote_addr: src.as_ptr() as u64 + 10,
                remote_key: None,
                local: LocalBuf::new(lo.as_mut_ptr() as u64, 100),
            },
            ReadRun {
                remote_addr: src.as_ptr() as u64 + 5000,
                remote_key: None,
                local: LocalBuf::new(hi.as_mut_ptr() as u64, 200),
            },
        ]
    };
    b.remote_reads().unwrap().post_read(now(), 1, a.local_addr(), &runs).unwrap();
    let done = b.remote_reads().unwrap().poll_read(now()).unwrap();
    assert_eq!((done.id, done.bytes, done.error.is_none()), (1, 300, true));
    assert_eq!(&two[..100], &src[10..110]);
    assert_eq!(&two[100..], &src[5000..5200]);
    // SAFETY: as above.
    let runs = unsafe {
        [
            ReadRun {
                remote_addr: src.as_ptr() as u64,
                remote_key: None,
                local: LocalBuf::new(two.as_mut_ptr() as u64, 100),
            },
            ReadRun { remote_addr: 8, remote_key: None, local: LocalBuf::new(two.as_mut_ptr() as u64 + 100, 8) },
        ]
    };
    b.remote_reads().unwrap().post_read(now(), 2, a.local_addr(), &runs).unwrap();
    let done = b.remote_reads().unwrap().poll_read(now()).unwrap();
    assert_eq!((done.id, done.bytes), (2, 100));
    assert!(done.error.is_some(), "an unmapped address fails the read");
}

#[test]
fn shm_stale_segments_are_cleaned() {
    let dir = std::env::temp_dir().join(format!("rdmx-shm-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let host = devices::shm::host_id();
    let stale = dir.join(format!("rdmx-{host:016x}-{}-{:016x}", 0x3fff_fff1u32, 5));
    let other_host = dir.join(format!("rdmx-{:016x}-{}-{:016x}", host ^ 1, 0x3fff_fff1u32, 5));
    std::fs::write(&stale, b"x").unwrap();
    std::fs::write(&other_host, b"x").unwrap();
    let cfg = ShmConfig { dir: dir.clone(), ..ShmConfig::default() };
    let d = ShmDevice::open(&cfg).unwrap();
    assert!(!stale.exists(), "ring of a dead process removed");
    assert!(other_host.exists(), "rings of other hosts untouched");
    assert!(d.path().exists(), "our own ring kept");
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shm_config_errors() {
    assert!(matches!(ShmDevice::open(&ShmConfig { mtu: 0, ..ShmConfig::default() }), Err(DeviceError::Config(_))));
    assert!(matches!(ShmDevice::open(&ShmConfig { slots: 1, ..ShmConfig::default() }), Err(DeviceError::Config(_))));
    let cfg = ShmConfig { dir: "/nonexistent-rdmx-dir".into(), ..ShmConfig::default() };
    assert!(matches!(ShmDevice::open(&cfg), Err(DeviceError::Io { .. })));
}

#[test]
fn auto_routes_by_address_kind() {
    let mut a = auto();
    let mut b = auto();
    let b_shm = DevAddr::Shm(b.shm_addr().unwrap());
    let b_udp = b.local_addr();
    assert!(matches!(b_udp, DevAddr::Udp(_)));
    // Per-address caps; the composite is conservative.
    assert!(a.caps_for(&b_shm).reliable && a.caps_for(&b_shm).ordered);
    assert!(!a.caps_for(&b_udp).reliable);
    assert!(!a.caps().reliable && !a.caps().remote_read);
    assert_eq!(a.caps().mtu, a.caps_for(&b_udp).mtu.min(a.caps_for(&b_shm).mtu));
    // A mixed batch: each datagram on its route, the source telling which.
    drain(&mut b);
    let fd = b.wait_fd().expect("epoll fd");
    assert!(!b.prepare_wait());
    assert!(!readable(fd, 0));
    let batch = [TxDatagram::new(b_shm, b"s1"), TxDatagram::new(b_udp, b"u1"), TxDatagram::new(b_shm, b"s2")];
    send_all(&mut a, &batch);
    assert!(readable(fd, 2000));
    let mut got = recv_n(&mut b, 3);
    got.sort_by(|x, y| x.1.cmp(&y.1));
    let a_shm = DevAddr::Shm(a.shm_addr().unwrap());
    assert_eq!(got, vec![(a_shm, b"s1".to_vec()), (a_shm, b"s2".to_vec()), (a.local_addr(), b"u1".to_vec())]);
    // The epoll fd also wakes for the shm half alone.
    drain(&mut b);
    assert!(!b.prepare_wait());
    assert!(!readable(fd, 0));
    send_all(&mut a, &[TxDatagram::new(b_shm, b"s3")]);
    assert!(readable(fd, 2000));
    assert_eq!(recv_n(&mut b, 1), vec![(a_shm, b"s3".to_vec())]);
    // Remote read goes through the shm half.
    if a.shm().unwrap().caps().remote_read {
        let buf = vec![42u8; 64];
        let mut dst = vec![0u8; 64];
        // SAFETY: `dst` outlives the read, which shm completes before
        // post_read returns, and nothing else touches it meanwhile.
        let local = unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, 64) };
        b.remote_reads()
            .unwrap()
            .post_read(now(), 7, a_shm, &[ReadRun { remote_addr: buf.as_ptr() as u64, remote_key: None, local }])
            .unwrap();
        let done = b.remote_reads().unwrap().poll_read(now()).expect("a synchronous read completes at once");
        assert_eq!((done.id, done.bytes, done.error.is_none()), (7, 64, true));
        assert_eq!(dst, buf);
        assert!(b.remote_reads().unwrap().poll_read(now()).is_none(), "one completion per read");
    }
    // The UDP half cannot read: refused at the post, no completion follows.
    let mut one = [0u8; 1];
    // SAFETY: `one` outlives the call; a refused post touches nothing.
    let local = unsafe { LocalBuf::new(one.as_mut_ptr() as u64, 1) };
    assert!(matches!(
        b.remote_reads().unwrap().post_read(
            now(),
            8,
            a.local_addr(),
            &[ReadRun { remote_addr: 0, remote_key: None, local }]
        ),
        Err(DeviceError::Unsupported)
    ));
    assert!(b.remote_reads().unwrap().poll_read(now()).is_none());
}

/// A UDP device that counts its receive polls (each a `recvmmsg`).
struct CountingUdp {
    udp: UdpDevice,
    polls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Device for CountingUdp {
    fn caps(&self) -> rdm::device::DeviceCaps {
        self.udp.caps()
    }
    fn local_addrs(&self) -> Vec<DevAddr> {
        self.udp.local_addrs()
    }
    fn send_batch(&mut self, now: rdm::time::Instant, batch: &[TxDatagram<'_>]) -> Result<usize, DeviceError> {
        self.udp.send_batch(now, batch)
    }
    fn recv_batch(&mut self, max: usize, deliver: &mut dyn FnMut(DevAddr, &[u8])) -> Result<usize, DeviceError> {
        self.polls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.udp.recv_batch(max, deliver)
    }
    fn wait_fd(&self) -> Option<RawFd> {
        self.udp.wait_fd()
    }
    fn prepare_wait(&mut self) -> bool {
        self.udp.prepare_wait()
    }
}

/// `auto` polls its network half (a system call) by what it has heard: every
/// call before any on-host traffic; once per 1024 calls at most while only
/// on-host peers have spoken, yet an off-host datagram is still taken within
/// 1024 calls; once per 64 once off-host peers have spoken too.
#[test]
fn auto_polls_the_network_by_what_it_has_heard() {
    use std::sync::atomic::Ordering::Relaxed;
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let udp = CountingUdp { udp: UdpDevice::bind("127.0.0.1:0".parse().unwrap()).unwrap(), polls: polls.clone() };
    let mut b = AutoDevice::new(Some(ShmDevice::new().unwrap()), Some(Box::new(udp))).unwrap();
    let mut a = auto();
    let (b_shm, b_udp) = (DevAddr::Shm(b.shm_addr().unwrap()), b.local_addr());
    assert!(matches!(b_udp, DevAddr::Udp(_)), "auto's first address, the one peers use, is the network half's");
    assert_eq!(b.local_addrs(), vec![b_udp, b_shm], "the network half's address, then the shm half's");
    let calls = |b: &mut AutoDevice<CountingUdp>, n: usize| {
        let before = polls.load(Relaxed);
        let mut got = 0;
        for _ in 0..n {
            got += b.recv_batch(64, &mut |_, _| {}).unwrap();
        }
        (polls.load(Relaxed) - before, got)
    };
    assert_eq!(calls(&mut b, 1000), (1000, 0), "nothing heard yet: the socket every call");
    // On-host traffic.
    send_all(&mut a, &[TxDatagram::new(b_shm, b"on-host")]);
    assert_eq!(calls(&mut b, 1).1, 1);
    let (n, _) = calls(&mut b, 8192);
    // Skips of 7, 15, ... 1023, then 1023 each: 8 polls in the first 2047
    // calls, one per 1024 after.
    assert!((8..=16).contains(&n), "{n} network polls in 8192 calls with only on-host traffic");
    // An off-host datagram arrives in the longest skip: taken within 1024 calls.
    send_all(&mut a, &[TxDatagram::new(b_udp, b"off-host")]);
    std::thread::sleep(Duration::from_millis(20));
    let mut taken = None;
    for i in 0..1025 {
        if calls(&mut b, 1).1 == 1 {
            taken = Some(i);
            break;
        }
    }
    assert!(taken.is_some(), "the off-host datagram was not taken within 1024 calls");
    // Both heard: the skip grows to 63 at most.
    let (n, _) = calls(&mut b, 8192);
    assert!((8192 / 64..=8192 / 64 + 8).contains(&n), "{n} network polls in 8192 calls with off-host peers heard");
}

#[test]
fn auto_dead_shm_peer_stops_the_batch() {
    let mut a = auto();
    let b = auto();
    let dead = DevAddr::Shm(b.shm_addr().unwrap());
    let b_udp = b.local_addr();
    drop(b);
    assert!(matches!(a.send_batch(now(), &[TxDatagram::new(dead, b"x")]), Err(DeviceError::Unreachable(_))));
    assert_eq!(a.send_batch(now(), &[TxDatagram::new(b_udp, b"x"), TxDatagram::new(dead, b"x")]).unwrap(), 1);
    let only_net: AutoDevice =
        AutoDevice::new(None, Some(Box::new(UdpDevice::bind("127.0.0.1:0".parse().unwrap()).unwrap()))).unwrap();
    assert!(!only_net.caps().reliable);
    assert!(AutoDevice::<UdpDevice>::new(None, None).is_err());
}

// ---- shm across processes: the test binary re-runs itself as the peer ----

const CHILD_ENV: &str = "RDMX_SHM_CHILD";

fn spawn_child(test: &str, mode: &str) -> (std::process::Child, u64, u64) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    while let Some(Ok(line)) = lines.next() {
        // libtest prints "test <name> ... " without a newline first, so the
        // marker can sit mid-line.
        if let Some(rest) = line.split("RDMX-CHILD ").nth(1) {
            let mut it = rest.split(' ').map(|v| v.parse::<u64>().unwrap());
            let (ring, buf) = (it.next().unwrap(), it.next().unwrap());
            // Keep draining the child's output, or its last prints hit a closed
            // pipe and it fails.
            std::thread::spawn(move || for _ in lines.by_ref() {});
            return (child, ring, buf);
        }
    }
    let status = child.wait();
    panic!("child printed no address (it ended: {status:?})");
}

/// The child side: opens a ring, prints its id and a buffer address, answers
/// "ping" with "pong", and leaves on "bye" (or never, in mode "hang").
fn shm_child(mode: &str) {
    let mut d = ShmDevice::new().unwrap();
    let DevAddr::Shm(me) = d.local_addr() else { unreachable!() };
    let buf: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 256) as u8).collect();
    println!("RDMX-CHILD {} {}", me.ring_id, buf.as_ptr() as u64);
    if mode == "hang" {
        loop {
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut done = false;
    while !done && Instant::now() < deadline {
        let mut reply = None;
        d.recv_batch(8, &mut |src, data| match data {
            b"ping" => reply = Some(src),
            b"bye" => done = true,
            _ => {}
        })
        .unwrap();
        if let Some(src) = reply {
            send_all(&mut d, &[TxDatagram::new(src, b"pong")]);
        }
        sleep_on(&mut d, 10);
    }
    std::hint::black_box(&buf);
}

#[test]
fn shm_cross_process() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        return shm_child(&mode);
    }
    let (mut child, ring_id, buf_addr) = spawn_child("shm_cross_process", "serve");
    let peer = ShmAddr { host_id: devices::shm::host_id(), pid: child.id(), ring_id };
    let dst = DevAddr::Shm(peer);
    let mut d = ShmDevice::new().unwrap();
    send_all(&mut d, &[TxDatagram::new(dst, b"ping")]);
    // Sleep on the wait fd between receive attempts (prepare_wait arms the
    // wake-up); the child's answer must arrive.
    let fd = d.wait_fd().unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.is_empty() && Instant::now() < deadline {
        d.recv_batch(8, &mut |src, data| got.push((src, data.to_vec()))).unwrap();
        if got.is_empty() && !d.prepare_wait() {
            readable(fd, 100);
        }
    }
    assert_eq!(got, vec![(dst, b"pong".to_vec())]);
    if d.probe_remote_read(&peer) {
        let mut got = vec![0u8; 65536];
        assert_eq!(d.remote_read(dst, buf_addr, &mut got).unwrap(), got.len());
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i * 7 % 256) as u8));
    } else {
        skip("cross-process remote read refused here (ptrace policy)");
    }
    send_all(&mut d, &[TxDatagram::new(dst, b"bye")]);
    assert!(child.wait().unwrap().success());
    assert!(matches!(d.send_batch(now(), &[TxDatagram::new(dst, b"x")]), Err(DeviceError::Unreachable(_))));
}

#[test]
fn shm_crashed_peer() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        return shm_child(&mode);
    }
    let mut d = ShmDevice::open(&ShmConfig { slots: 4, ..ShmConfig::default() }).unwrap();
    let t0 = rdm::Instant::from_nanos(1_000_000_000);
    let one = |dst| [TxDatagram::new(dst, b"x")];

    // The liveness check on send runs by the time the endpoint passes in:
    // within a millisecond of the last check, a datagram to a killed owner's
    // ring is taken (nobody will read it); past it, the first is refused.
    let (mut child, ring_id, _) = spawn_child("shm_crashed_peer", "hang");
    let peer = ShmAddr { host_id: devices::shm::host_id(), pid: child.id(), ring_id };
    let dst = DevAddr::Shm(peer);
    assert_eq!(d.send_batch(t0, &one(dst)).unwrap(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let path = std::path::Path::new(devices::shm::DEFAULT_DIR).join(devices::shm::segment_name(&peer));
    assert!(path.exists(), "a killed process leaves its ring behind");
    assert_eq!(
        d.send_batch(t0 + Duration::from_micros(500), &one(dst)).unwrap(),
        1,
        "checked again before a millisecond passed"
    );
    let late = d.send_batch(t0 + Duration::from_millis(2), &one(dst));
    assert!(matches!(late, Err(DeviceError::Unreachable(_))), "{late:?}");

    // Time standing still (a burst of sends): the dead owner's ring fills
    // (nobody drains it), and a full ring has its owner checked.
    let (mut child, ring_id, _) = spawn_child("shm_crashed_peer", "hang");
    let peer = ShmAddr { host_id: devices::shm::host_id(), pid: child.id(), ring_id };
    let dst = DevAddr::Shm(peer);
    assert_eq!(d.send_batch(t0, &one(dst)).unwrap(), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    let batch = [TxDatagram::new(dst, b"2"); 8];
    let err = (0..10_000).find_map(|_| d.send_batch(t0, &batch).err());
    assert!(matches!(err, Some(DeviceError::Unreachable(_))), "{err:?}");
    // The next open removes the stale rings.
    let _e = ShmDevice::new().unwrap();
    assert!(!path.exists(), "stale ring cleaned at open");
    assert!(!std::path::Path::new(devices::shm::DEFAULT_DIR).join(devices::shm::segment_name(&peer)).exists());
}

// ---- verbs UD: skips on a host without an RDMA device, unless
// RDMX_VERBS_REQUIRED=1 (the rxe VM test script sets it), then fails ----

mod verbs {
    use super::*;
    use devices::verbs::{
        mr_keys, parse_ud_addr, ud_addr, VerbsConfig, VerbsContext, VerbsDevice, FI_REMOTE_READ, FI_SEND,
    };
    use rdm::device::{DeviceContext, OpenSpec};

    fn required() -> bool {
        std::env::var("RDMX_VERBS_REQUIRED").is_ok_and(|v| v == "1")
    }

    /// A context as `cfg` asks, or `None` (skip) without an RDMA device.
    pub fn ctx(cfg: &VerbsConfig) -> Option<VerbsContext> {
        if !VerbsContext::available() {
            assert!(!required(), "RDMX_VERBS_REQUIRED=1 and this host has no RDMA device");
            eprintln!("skip: no RDMA device");
            return None;
        }
        Some(VerbsContext::open(cfg).unwrap_or_else(|e| panic!("verbs context {cfg:?}: {e}")))
    }

    /// A part of a test that needs more than one RDMA device or address:
    /// skipped (said so), a failure under RDMX_VERBS_REQUIRED=1.
    fn skip_part(reason: &str) {
        assert!(!required(), "RDMX_VERBS_REQUIRED=1 and {reason}");
        eprintln!("skip: {reason}");
    }

    pub fn spec(job_key: u64) -> OpenSpec {
        OpenSpec { bind: None, incarnation: 1, job_key }
    }

    pub fn pair() -> Option<Pair> {
        let c = ctx(&VerbsConfig::default())?;
        Some((c.open(&spec(7)).unwrap(), c.open(&spec(7)).unwrap()))
    }

    fn dev(c: &VerbsContext, job: u64) -> VerbsDevice {
        c.open_device(&spec(job)).unwrap()
    }

    /// Sends `msgs` from `a` to `b` and checks they arrive, from `a`.
    fn exchange(a: &mut dyn Device, b: &mut dyn Device, msgs: &[Vec<u8>]) {
        let dst = b.local_addr();
        let batch: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(dst, m)).collect();
        send_all(a, &batch);
        let got = recv_n(b, msgs.len());
        assert_eq!(got.len(), msgs.len());
        let mut data: Vec<Vec<u8>> = got.iter().map(|(_, d)| d.clone()).collect();
        for (src, _) in &got {
            assert_eq!(*src, a.local_addr());
        }
        let mut want = msgs.to_vec();
        want.sort();
        data.sort();
        assert_eq!(data, want);
    }

    /// Hands every control message of `a` and `b` to the other until none
    /// is left (the endpoint carries them over its reliable stream).
    fn pump_control(a: &mut VerbsDevice, b: &mut VerbsDevice) {
        loop {
            let mut moved = false;
            while let Some((to, m)) = a.remote_reads().unwrap().poll_control() {
                assert_eq!(to, b.local_addr());
                b.remote_reads().unwrap().handle_control(now(), a.local_addr(), m.bytes());
                moved = true;
            }
            while let Some((to, m)) = b.remote_reads().unwrap().poll_control() {
                assert_eq!(to, a.local_addr());
                a.remote_reads().unwrap().handle_control(now(), b.local_addr(), m.bytes());
                moved = true;
            }
            if !moved {
                return;
            }
        }
    }

    /// The RDMA read path of the device: a read of a peer without a
    /// connection answers `NotConnected` and queues a handshake; once it has
    /// crossed, reads of 1 MiB (two runs, one larger than a piece would be
    /// if the port's max message were small) go through the RC connection
    /// and every byte lands; the peer's failure retires the connection and
    /// the next read asks for a new one. On one device (two queue pairs of
    /// one host), and between two devices when both rxe exist.
    #[test]
    fn rdma_read_through_a_lazily_made_rc_connection() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        // Two queue pairs of one device (two processes of one host on the
        // verbs domain).
        read_through_connection(&c, &c.clone());
        if ["rxe0", "rxe1"].iter().all(|d| std::path::Path::new("/sys/class/infiniband").join(d).exists()) {
            let at = |d: &str| ctx(&VerbsConfig { iface: Some(d.into()), ..VerbsConfig::default() }).unwrap();
            read_through_connection(&at("rxe0"), &at("rxe1"));
        }
    }

    fn read_through_connection(c0: &VerbsContext, c1: &VerbsContext) {
        eprintln!("reader on {}, owner on {}", c0.device_name(), c1.device_name());
        let (mut reader, mut owner) = (dev(c0, 5), dev(c1, 5));
        let (mut rreg, mut oreg) = (c0.registrar().unwrap(), c1.registrar().unwrap());
        const LEN: usize = 1 << 20;
        let src: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut dst = vec![0u8; LEN];
        let skey = oreg.register(src.as_ptr() as u64, LEN as u64, FI_REMOTE_READ).unwrap();
        let dkey = rreg.register(dst.as_mut_ptr() as u64, LEN as u64, devices::verbs::FI_READ).unwrap();
        // SAFETY: `dst` outlives every read naming it (each is waited for).
        let whole = unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, LEN as u64) }.with_key(dkey);
        let runs = |off: u64| {
            [
                ReadRun {
                    remote_addr: src.as_ptr() as u64 + off,
                    remote_key: Some(skey),
                    local: whole.sub(off, (LEN as u64 / 2) - off).unwrap(),
                },
                ReadRun {
                    remote_addr: src.as_ptr() as u64 + LEN as u64 / 2,
                    remote_key: Some(skey),
                    local: whole.sub(LEN as u64 / 2, LEN as u64 / 2).unwrap(),
                },
            ]
        };
        let peer = owner.local_addr();
        assert!(matches!(
            reader.remote_reads().unwrap().post_read(now(), 1, peer, &runs(0)),
            Err(DeviceError::NotConnected)
        ));
        pump_control(&mut reader, &mut owner);
        let (st, active, _) = reader.rc_stats();
        assert_eq!((st.requested, st.established, active), (1, 1, 1), "{st:?}");
        assert_eq!(owner.rc_stats().2, 1, "the owner keeps the passive end");
        for round in 0..3u64 {
            dst.fill(0);
            reader
                .remote_reads()
                .unwrap()
                .post_read(now(), 10 + round, peer, &runs(round * 4096))
                .expect("a read through the connection");
            let t0 = std::time::Instant::now();
            let done = loop {
                if let Some(d) = reader.remote_reads().unwrap().poll_read(now()) {
                    break d;
                }
                // The owner's side needs no call: the NIC serves the read.
                assert!(
                    t0.elapsed() < std::time::Duration::from_secs(20),
                    "the read never completed: {:?} {:?}",
                    reader.stats,
                    reader.rc_stats()
                );
            };
            assert_eq!(done.id, 10 + round);
            assert!(done.error.is_none(), "{:?}", done.error);
            assert_eq!(done.bytes, LEN as u64 - round * 4096);
            let off = round as usize * 4096;
            assert!(dst[off..] == src[off..], "round {round}: the bytes read differ");
        }
        assert!(reader.stats.rc_read_bytes >= 3 * (LEN as u64 - 8192));
        // The owner fails: its connection goes; the next read asks anew.
        reader.remote_reads().unwrap().peer_failed(peer);
        assert_eq!(reader.rc_stats().1, 0);
        assert!(matches!(
            reader.remote_reads().unwrap().post_read(now(), 20, peer, &runs(0)),
            Err(DeviceError::NotConnected)
        ));
        assert!(matches!(reader.remote_reads().unwrap().poll_control(), Some((to, _)) if to == peer));
        rreg.deregister(dkey);
        oreg.deregister(skey);
    }

    /// A read whose packets the path drops: in the VM rxe2 (on dummy0) has
    /// no route to rxe1's address, so RC packets vanish (the handshake,
    /// carried here in-process, still crosses). The device gives the read up
    /// (a retry error, or its own read timeout when no completion comes at
    /// all), reports it `NotConnected` so its message would be pushed, and
    /// closes the connection.
    #[test]
    fn a_read_the_path_never_answers_is_given_up() {
        if !["rxe1", "rxe2"].iter().all(|d| std::path::Path::new("/sys/class/infiniband").join(d).exists()) {
            eprintln!("skip: needs the VM's rxe1 and rxe2");
            return;
        }
        let timeout = std::time::Duration::from_secs(2);
        let at = |d: &str| {
            ctx(&VerbsConfig { iface: Some(d.into()), rc_read_timeout: Some(timeout), ..VerbsConfig::default() })
                .unwrap()
        };
        let (c0, c1) = (at("rxe2"), at("rxe1"));
        let (mut reader, mut owner) = (dev(&c0, 6), dev(&c1, 6));
        let (mut rreg, mut oreg) = (c0.registrar().unwrap(), c1.registrar().unwrap());
        let src = vec![7u8; 1 << 16];
        let mut dst = vec![0u8; 1 << 16];
        let skey = oreg.register(src.as_ptr() as u64, src.len() as u64, FI_REMOTE_READ).unwrap();
        let dkey = rreg.register(dst.as_mut_ptr() as u64, dst.len() as u64, devices::verbs::FI_READ).unwrap();
        // SAFETY: `dst` outlives the read (waited for, then its QP is in error).
        let local = unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, dst.len() as u64) }.with_key(dkey);
        let run = [ReadRun { remote_addr: src.as_ptr() as u64, remote_key: Some(skey), local }];
        let peer = owner.local_addr();
        assert!(matches!(
            reader.remote_reads().unwrap().post_read(now(), 1, peer, &run),
            Err(DeviceError::NotConnected)
        ));
        pump_control(&mut reader, &mut owner);
        reader.remote_reads().unwrap().post_read(now(), 2, peer, &run).expect("posted on the connection");
        let t0 = std::time::Instant::now();
        let done = loop {
            if let Some(d) = reader.remote_reads().unwrap().poll_read(now()) {
                break d;
            }
            assert!(t0.elapsed() < timeout * 5, "the read was never given up: {:?}", reader.stats);
        };
        eprintln!("given up after {:?}: {:?}", t0.elapsed(), reader.stats);
        assert_eq!(done.id, 2);
        assert!(matches!(done.error, Some(DeviceError::NotConnected)), "{:?}", done.error);
        assert_eq!(reader.rc_stats().1, 0, "the connection is closed");
        assert!(
            matches!(reader.remote_reads().unwrap().poll_control(), Some((to, _)) if to == peer),
            "the owner is told to free its end"
        );
        drop(reader);
        rreg.deregister(dkey);
        oreg.deregister(skey);
    }

    #[test]
    fn caps_address_and_read() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        eprintln!("verbs context: {c:?}");
        let d = dev(&c, 1);
        let caps = d.caps();
        // Remote read through RC connections made on demand.
        assert!(!caps.reliable && !caps.ordered && caps.remote_read && !caps.gso);
        assert!(caps.registration);
        assert_eq!(caps.mtu, c.mtu());
        assert!(caps.max_inline as usize <= caps.mtu);
        let (gid, qpn, lid) = parse_ud_addr(&d.local_addr()).expect("a verbs UD address");
        assert_eq!((gid, qpn, lid), (c.gid(), d.qpn(), c.lid()));
        assert_eq!(d.local_addr(), ud_addr(gid, qpn, lid));
        assert_ne!(c.gid_index(), 0, "never the link-local GID 0 on RoCE");
        assert!(d.owns(&d.local_addr()));
        assert!(!d.owns(&DevAddr::Udp("127.0.0.1:1".parse().unwrap())));
        assert_eq!(d.local_addrs(), vec![d.local_addr()]);
        let mut d = d;
        let mut one = [0u8; 8];
        // SAFETY: `one` outlives the call; a refused post touches nothing.
        let local = unsafe { LocalBuf::new(one.as_mut_ptr() as u64, 8) };
        let me = d.local_addr();
        // No connection to anyone yet: the first read asks for one.
        assert!(matches!(
            d.remote_reads().unwrap().post_read(
                now(),
                1,
                me,
                &[ReadRun { remote_addr: 0, remote_key: Some(1), local }]
            ),
            Err(DeviceError::NotConnected)
        ));
        assert!(d.remote_reads().unwrap().poll_read(now()).is_none());
        assert!(d.remote_reads().unwrap().poll_control().is_some(), "a connection request for the peer");
        // Without RC connections, UD cannot read at all.
        let no_rc = ctx(&VerbsConfig { rc_max_peers: Some(0), ..VerbsConfig::default() }).unwrap();
        let mut n = dev(&no_rc, 1);
        assert!(!n.caps().remote_read);
        assert!(matches!(
            n.remote_reads().unwrap().post_read(
                now(),
                1,
                me,
                &[ReadRun { remote_addr: 0, remote_key: Some(1), local }]
            ),
            Err(DeviceError::Unsupported)
        ));
        // A datagram of the wrong kind is refused, not sent.
        let udp = DevAddr::Udp("127.0.0.1:9".parse().unwrap());
        assert!(matches!(d.send_batch(now(), &[TxDatagram::new(udp, b"x")]), Err(DeviceError::Unreachable(_))));
    }

    #[test]
    fn config_names_device_netdev_or_address() {
        let bad = VerbsConfig { iface: Some("rdmx-no-such0".into()), ..VerbsConfig::default() };
        assert!(matches!(VerbsContext::open(&bad), Err(DeviceError::Config(_))));
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let by_dev = ctx(&VerbsConfig { iface: Some(c.device_name().into()), ..VerbsConfig::default() }).unwrap();
        assert_eq!(by_dev.device_name(), c.device_name());
        if let Some(n) = c.netdev() {
            let by_net = ctx(&VerbsConfig { iface: Some(n.into()), ..VerbsConfig::default() }).unwrap();
            assert_eq!((by_net.device_name(), by_net.gid()), (c.device_name(), c.gid()));
        }
    }

    #[test]
    fn two_devices() {
        let have = |d: &str| std::path::Path::new("/sys/class/infiniband").join(d).exists();
        if !(have("rxe0") && have("rxe1")) {
            if ctx(&VerbsConfig::default()).is_some() {
                skip_part("no second RDMA device rxe1");
            }
            return;
        }
        let c0 = ctx(&VerbsConfig { iface: Some("rxe0".into()), ..VerbsConfig::default() }).unwrap();
        let c1 = ctx(&VerbsConfig { iface: Some("rxe1".into()), ..VerbsConfig::default() }).unwrap();
        assert_ne!(c0.gid(), c1.gid());
        // Across the devices, both ways, with both open at once. In the VM
        // (scripts/rxe-vm.sh) rxe0 and rxe1 sit on the two ends of a veth
        // pair, so a datagram leaves one device and enters the other. (Over
        // two dummy netdevs Soft-RoCE in Linux 6.1 loops it back into the
        // sending device, to whichever QP has the destination's number:
        // ibv_ud_pingpong between such devices only seems to work.)
        let (mut a0, mut a1) = (dev(&c0, 3), dev(&c1, 3));
        let msgs: Vec<Vec<u8>> = (0..50).map(|i| payload(i, 1 + i * 80 % c0.mtu())).collect();
        exchange(&mut a0, &mut a1, &msgs);
        exchange(&mut a1, &mut a0, &msgs);
        assert_eq!(drain(&mut a0), 0, "nothing looped back into the sender");
    }

    /// The NIC drops a datagram whose Q_Key is not the receiving queue
    /// pair's: another job's. Shown against a positive control, not a quiet
    /// spell: once another job's datagrams have completed (left `a`), one of
    /// `other`'s own job goes to `other` through the same device; when that
    /// one has arrived, the earlier ones had their chance, and none came.
    #[test]
    fn qkey_drops_other_jobs() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let mut a = dev(&c, 100);
        let mut other = dev(&c, 200);
        let mut others_job = dev(&c, 200);
        let mut same = dev(&c, 100);
        assert_ne!(a.qkey(), other.qkey());
        assert_eq!(a.qkey(), same.qkey());
        assert_eq!(other.qkey(), others_job.qkey());
        let to_other = other.local_addr();
        send_all(&mut a, &[TxDatagram::new(to_other, b"not for you"); 8]);
        let deadline = Instant::now() + PATIENCE;
        while a.outstanding() > 0 {
            assert!(Instant::now() < deadline, "another job's sends never completed");
            a.send_batch(now(), &[]).unwrap();
        }
        send_all(&mut others_job, &[TxDatagram::new(to_other, b"control")]);
        let mut got: Vec<(DevAddr, Vec<u8>)> = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while !got.iter().any(|(_, d)| d == b"control") && Instant::now() < deadline {
            if other.recv_batch(16, &mut |src, d| got.push((src, d.to_vec()))).unwrap() == 0 {
                sleep_on(&mut other, 10);
            }
        }
        assert_eq!(
            got,
            vec![(others_job.local_addr(), b"control".to_vec())],
            "the control of other's own job arrives, and before it none of another job's: the NIC drops them"
        );
        assert_eq!(drain(&mut other), 0, "nor after it");
        exchange(&mut a, &mut same, &[b"same job".to_vec()]);
        assert_eq!(a.stats.send_errors, 0, "a dropped UD datagram is no send error");
    }

    #[test]
    fn back_pressure_is_a_short_count() {
        let Some(c) = ctx(&VerbsConfig { sq_depth: 16, ..VerbsConfig::default() }) else { return };
        let mut a = dev(&c, 5);
        let mut b = dev(&c, 5);
        let dst = b.local_addr();
        let len = (a.caps().max_inline as usize + 1).min(a.caps().mtu);
        let msgs: Vec<Vec<u8>> = (0..100).map(|i| payload(i, len)).collect();
        let batch: Vec<TxDatagram> = msgs.iter().map(|m| TxDatagram::new(dst, m)).collect();
        let n = a.send_batch(now(), &batch).unwrap();
        assert!(n > 0 && n <= 16, "took {n} with a send queue of 16");
        assert!(a.outstanding() <= 16);
        send_all(&mut a, &batch[n..]);
        let got = recv_n(&mut b, 100);
        assert_eq!(got.len(), 100);
        assert!(a.stats.sq_full > 0);
    }

    /// A datagram leaves as it was when `send_batch` took it: the device
    /// copies it (or puts it inline), so the caller may write the next one
    /// into the same buffer at once, as the endpoint's staging does (a NIC
    /// reads a request's bytes after the post returns: sending from the
    /// caller's buffer in place raced with that rewrite).
    #[test]
    fn a_buffer_rewritten_after_send_batch_changes_nothing_sent() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let mut a = dev(&c, 9);
        let mut b = dev(&c, 9);
        let mtu = a.caps().mtu;
        let inline = a.caps().max_inline as usize;
        let dst = b.local_addr();
        let mut stage = a.transmit_buffers(1, mtu).pop().expect("a buffer");
        let mut sent = Vec::new();
        for i in 0..64usize {
            let len = if i % 4 == 0 { inline.max(1).min(mtu) } else { mtu - i };
            stage[..len].copy_from_slice(&payload(i, len));
            send_all(&mut a, &[TxDatagram::new(dst, &stage[..len])]);
            sent.push(stage[..len].to_vec());
            stage.fill(0xee);
        }
        assert!(a.stats.bounce_copies >= 48 && (inline == 0 || a.stats.inline_sends >= 16), "{:?}", a.stats);
        let mut got: Vec<Vec<u8>> = recv_n(&mut b, 64).into_iter().map(|(_, d)| d).collect();
        got.sort();
        sent.sort();
        assert!(got == sent, "a datagram carried bytes written after its send_batch");
    }

    /// Contexts of RDMA ports on `c`'s device with GIDs other than `c`'s,
    /// one per GID: every address of the VM script's netdevs that some RDMA
    /// port carries.
    fn distinct_gid_peers(c: &VerbsContext) -> Vec<VerbsContext> {
        let ips = ["10.11.13.1", "10.11.13.2", "10.11.13.3", "10.11.13.4", "10.11.12.1", "10.11.12.2"];
        let ctxs: Vec<VerbsContext> = ips
            .iter()
            .filter_map(|ip| {
                VerbsContext::open(&VerbsConfig { iface: Some((*ip).into()), ..VerbsConfig::default() }).ok()
            })
            .filter(|p| p.gid() != c.gid())
            // Soft-RoCE on one host cannot carry datagrams between two of
            // its devices (see `two_devices`): peers on the sender's device.
            .filter(|p| p.device_name() == c.device_name())
            .collect();
        let mut seen = Vec::new();
        ctxs.into_iter()
            .filter(|p| {
                if seen.contains(&p.gid()) {
                    false
                } else {
                    seen.push(p.gid());
                    true
                }
            })
            .collect()
    }

    #[test]
    fn ah_cache_is_bounded() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let ctxs = distinct_gid_peers(&c);
        if ctxs.len() < 3 {
            skip_part("fewer than 3 RDMA peers with distinct GIDs (scripts/rxe-vm.sh gives dummy0 10.11.13.1-4)");
            return;
        }
        let sender_ctx = ctx(&VerbsConfig { ah_cache: 2, ..VerbsConfig::default() }).unwrap();
        let mut a = dev(&sender_ctx, 11);
        assert_eq!(a.ah_cache_cap(), 2);
        let mut peers: Vec<VerbsDevice> = ctxs.iter().map(|p| dev(p, 11)).collect();
        for round in 0..5 {
            for p in peers.iter_mut() {
                let msgs: Vec<Vec<u8>> = (0..3).map(|i| payload(round * 10 + i, 64 + i)).collect();
                exchange(&mut a, p, &msgs);
                assert!(a.ah_cache_len() <= 2, "{} address handles cached", a.ah_cache_len());
            }
        }
        assert_eq!(a.stats.ah_overflow, 0);
        assert!(a.stats.ah_evicted > 0);
        assert_eq!(a.stats.send_errors, 0);
        eprintln!("{} peers, ah stats: created {} evicted {}", peers.len(), a.stats.ah_created, a.stats.ah_evicted);
    }

    /// A device out of address handles (its limit can be below `max_ah`)
    /// makes a send wait or evict, never fail: a refused creation with
    /// nothing to evict is back-pressure (nothing sent, no peer reported
    /// unreachable, the next try goes); with a cached handle no send uses,
    /// that one is evicted and the creation retried at once.
    #[test]
    fn an_address_handle_the_device_refuses_is_retried_not_failed() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let ctxs = distinct_gid_peers(&c);
        if ctxs.len() < 2 {
            skip_part("fewer than 2 RDMA peers with distinct GIDs (scripts/rxe-vm.sh gives dummy0 10.11.13.1-4)");
            return;
        }
        let mut a = dev(&c, 12);
        let (mut p, mut q) = (dev(&ctxs[0], 12), dev(&ctxs[1], 12));
        a.refuse_next_ahs_for_test(2);
        let msg = payload(1, 200);
        assert_eq!(
            a.send_batch(now(), &[TxDatagram::new(p.local_addr(), &msg)]).unwrap(),
            0,
            "a refused address handle is back-pressure"
        );
        assert_eq!(a.poll_unreachable(), None);
        exchange(&mut a, &mut p, &[payload(2, 200)]);
        assert_eq!(a.stats.ah_refused, 2);
        // p's handle is cached and idle once its send completed: q's
        // creation, refused once, evicts it and succeeds.
        while a.outstanding() > 0 {
            let _ = a.send_batch(now(), &[]);
        }
        a.refuse_next_ahs_for_test(1);
        let evicted = a.stats.ah_evicted;
        exchange(&mut a, &mut q, &[payload(3, 200)]);
        assert_eq!(a.stats.ah_refused, 3);
        assert_eq!(a.stats.ah_evicted, evicted + 1);
        assert_eq!((a.stats.ah_failed, a.stats.send_errors), (0, 0));
        assert_eq!(a.poll_unreachable(), None);
    }

    #[test]
    fn registrar_register_deregister() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let mut r = c.registrar().expect("verbs registers");
        let buf = vec![0u8; 1 << 16];
        let k1 = r.register(buf.as_ptr() as u64, buf.len() as u64, FI_REMOTE_READ).unwrap();
        let k2 = r.register(buf.as_ptr() as u64 + 4096, 4096, FI_SEND).unwrap();
        assert_ne!(k1, k2);
        let (l1, r1) = mr_keys(k1);
        assert_eq!(k1, (r1 as u64) << 32 | l1 as u64);
        r.deregister(k1);
        r.deregister(k1); // unknown now: ignored
                          // Unmapped memory cannot be registered.
        assert!(r.register(8, 4096, FI_REMOTE_READ).is_err());
        // A registration survives its registrar's siblings and endpoints.
        let d = dev(&c, 1);
        drop(d);
        r.deregister(k2);
        drop(r);
    }

    /// A send to an address nothing routes to (TEST-NET-3) harms nothing,
    /// and whatever the device makes of it, it says so consistently. Three
    /// outcomes are allowed, as devices differ:
    /// - the address handle is refused (hardware may): `Unreachable(ghost)`
    ///   at once, counted in `ah_failed`, and `ghost` on `poll_unreachable`;
    /// - the send completes in error (hardware may): counted in
    ///   `send_errors`, and `ghost` on `poll_unreachable`;
    /// - the send completes successfully and the datagram is lost on the
    ///   way (Soft-RoCE creates the handle and drops it silently: the
    ///   module docs): no error counted, nothing reported.
    ///
    /// The report is waited for by the send's completion, not a sleep; no
    /// other address is ever reported; the device still works.
    #[test]
    fn unroutable_destination_is_harmless() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let mut a = dev(&c, 12);
        let mut b = dev(&c, 12);
        let ghost = ud_addr([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 203, 0, 113, 77], 0x99, 0);
        let res = a.send_batch(now(), &[TxDatagram::new(ghost, b"to nobody")]);
        match res {
            Ok(1) => {
                // The send's completion decides whether there is anything to report.
                let deadline = Instant::now() + PATIENCE;
                while a.outstanding() > 0 {
                    assert!(Instant::now() < deadline, "the send to the unroutable address never completed");
                    a.send_batch(now(), &[]).unwrap();
                }
                assert_eq!(a.stats.ah_failed, 0);
            }
            Err(DeviceError::Unreachable(to)) => {
                assert_eq!(to, ghost, "the refusal names the destination");
                assert_eq!(a.stats.ah_failed, 1, "a refused address handle is counted");
            }
            other => panic!("a send to an unroutable address: {other:?}"),
        }
        let failed = a.stats.ah_failed + a.stats.send_errors;
        let reported = a.poll_unreachable();
        eprintln!("send to an unroutable GID: {res:?}, reported: {reported:?}, {:?}", a.stats);
        assert!(failed <= 1, "one send, at most one failure: {:?}", a.stats);
        assert_eq!(
            reported,
            (failed == 1).then_some(ghost),
            "reported exactly when the device saw a failure, and only the destination it failed: {:?}",
            a.stats
        );
        exchange(&mut a, &mut b, &[b"still alive".to_vec()]);
        exchange(&mut b, &mut a, &[b"both ways".to_vec()]);
        assert_eq!(a.poll_unreachable(), None, "nothing else was reported");
        assert_eq!(a.stats.send_errors + a.stats.ah_failed, failed, "the device's later sends all succeeded");
    }

    #[test]
    fn send_error_is_reported_and_the_queue_recovers() {
        let Some(c) = ctx(&VerbsConfig::default()) else { return };
        let mut a = dev(&c, 13);
        let mut b = dev(&c, 13);
        let dst = b.local_addr();
        let big = payload(1, (a.caps().max_inline as usize + 1).min(a.caps().mtu));
        a.corrupt_next_send_key_for_test();
        assert_eq!(a.send_batch(now(), &[TxDatagram::new(dst, &big)]).unwrap(), 1);
        let deadline = Instant::now() + PATIENCE;
        let mut reported = None;
        while reported.is_none() && Instant::now() < deadline {
            a.recv_batch(8, &mut |_, _| {}).unwrap();
            reported = a.poll_unreachable();
        }
        assert_eq!(reported, Some(dst), "the failed send's destination is reported");
        assert!(a.stats.send_errors >= 1);
        assert_eq!(a.outstanding(), 0, "the failed send released what it held");
        assert_eq!(drain(&mut b), 0);
        // The queue pair works again, both ways.
        exchange(&mut a, &mut b, &[big.clone(), b"small".to_vec()]);
        exchange(&mut b, &mut a, &[big, b"small".to_vec()]);
        eprintln!("after a send error: {:?}", a.stats);
    }
}

conformance!(verbs_ud, verbs::pair());
