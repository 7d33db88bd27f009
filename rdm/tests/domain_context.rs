//! The domain seam on the model device: [`SimContext`] stands for a verbs or
//! SRD domain (one protection domain), from which endpoints open their queues
//! and through which memory is registered.
use rdm::device::DeviceExt;
use rdm::device::{DeviceContext, LocalBuf, OpenSpec, ReadRun};
use rdm::sim::Link;
use rdm::simnet::{addr, SimNet};
use rdm::DeviceCaps;

fn spec() -> OpenSpec {
    OpenSpec { bind: None, incarnation: 1, job_key: 0 }
}

fn read(key: Option<u64>, addr: u64) -> [ReadRun; 1] {
    // SAFETY: the simulated device never dereferences a local buffer.
    let local = unsafe { LocalBuf::new(addr, 4096) };
    [ReadRun { remote_addr: 0x9000, remote_key: Some(77), local: key.map_or(local, |k| local.with_key(k)) }]
}

/// The domain seam: a registration made through a domain's registrar is a
/// valid local key for every endpoint opened from that domain, for no
/// endpoint of another, and for nobody once deregistered.
#[test]
fn a_domains_registrations_are_valid_on_each_of_its_endpoints_and_only_there() {
    let caps = DeviceCaps { remote_read: true, registration: true, ..DeviceCaps::datagram(1400) };
    let net = SimNet::new(3, caps, Link::default(), 1);
    let (a, b) = (net.context(&[0, 1]), net.context(&[2]));
    let mut a0 = a.open(&spec()).unwrap();
    let mut a1 = a.open(&spec()).unwrap();
    let mut b2 = b.open(&spec()).unwrap();
    assert!(a.open(&spec()).is_err(), "domain a has two endpoints");
    assert_eq!((a0.local_addr(), a1.local_addr(), b2.local_addr()), (addr(0), addr(1), addr(2)));
    let mut reg_a = a.registrar().unwrap();
    let key = reg_a.register(0x1000, 8192, 0).unwrap();
    let key_b = b.registrar().unwrap().register(0x1000, 8192, 0).unwrap();
    a0.remote_reads()
        .unwrap()
        .post_read(rdm::time::Instant::ZERO, 1, addr(2), &read(Some(key), 0x1000))
        .expect("a's key on a's first endpoint");
    a1.remote_reads()
        .unwrap()
        .post_read(rdm::time::Instant::ZERO, 2, addr(2), &read(Some(key), 0x2000))
        .expect("a's key on a's second endpoint");
    assert!(
        a1.remote_reads().unwrap().post_read(rdm::time::Instant::ZERO, 3, addr(2), &read(Some(key), 0x2800)).is_err(),
        "past the registration's end"
    );
    assert!(
        b2.remote_reads().unwrap().post_read(rdm::time::Instant::ZERO, 4, addr(0), &read(Some(key), 0x1000)).is_err(),
        "a's key on b's endpoint"
    );
    assert!(
        a0.remote_reads().unwrap().post_read(rdm::time::Instant::ZERO, 5, addr(2), &read(Some(key_b), 0x1000)).is_err(),
        "b's key on a's endpoint"
    );
    assert!(
        a0.remote_reads().unwrap().post_read(rdm::time::Instant::ZERO, 6, addr(2), &read(None, 0x1000)).is_err(),
        "no key on a registering path"
    );
    assert!(net.key_covers(1, key, 0x1000, 8192) && net.key_covers(0, key, 0x1800, 16));
    assert!(!net.key_covers(2, key, 0x1000, 16), "a's key read from b's memory");
    reg_a.deregister(key);
    assert!(
        a0.remote_reads().unwrap().post_read(rdm::time::Instant::ZERO, 7, addr(2), &read(Some(key), 0x1000)).is_err(),
        "a deregistered key"
    );
    assert!(!net.key_covers(1, key, 0x1000, 16));
    assert_eq!(
        net.take_reads().iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![1, 2],
        "only the valid reads were posted"
    );
}
