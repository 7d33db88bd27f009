//! Sealed job traffic (`rdm/PROTOCOL.md` §2.5) between engines, through the
//! public API: what a job with a secret sends, that it carries messages both
//! ways (tagged and enciphered, first contact with or without the peer's
//! incarnation), and that nothing forged, altered, replayed or of another
//! job is acted on — each refusal counted, no peer state made by a forgery.
use rdm::engine::{
    Engine, EngineConfig, Event, Header, Hello, JobAuth, JobSecret, PacketType, Psn, Sealed, HEADER_LEN, TRAILER_LEN,
};
use rdm::{DevAddr, Instant};
use std::sync::Arc;

const SECRET: &[u8] = b"sixteen byte key and then some";

fn auth(secret: &[u8], encrypt: bool) -> Arc<JobAuth> {
    Arc::new(JobAuth { secret: JobSecret::new(secret).unwrap(), encrypt })
}

fn engine(inc: u64, auth: Option<Arc<JobAuth>>) -> Engine {
    Engine::new(EngineConfig { incarnation: inc, auth, ..EngineConfig::default() })
}

fn addr(i: u32) -> DevAddr {
    rdm::simnet::addr(i)
}

/// Two engines at `addr(0)` (a) and `addr(1)` (b) and every datagram that
/// went between them, in order, with its direction (true: a to b).
struct Pair {
    a: Engine,
    b: Engine,
    wire: Vec<(bool, Vec<u8>)>,
}

impl Pair {
    fn new(a: Engine, b: Engine) -> Pair {
        Pair { a, b, wire: Vec::new() }
    }

    /// Moves datagrams both ways until neither side has any (no loss, no
    /// clock: anything that needed a timer to finish does not).
    fn pump(&mut self, t: Instant) {
        let mut buf = vec![0u8; 70_000];
        for _ in 0..10_000 {
            let mut moved = false;
            while let Some(x) = self.a.poll_transmit(t, &mut buf) {
                for d in buf[..x.len].chunks(x.seg) {
                    self.wire.push((true, d.to_vec()));
                    self.b.handle_datagram(t, addr(0), d);
                }
                moved = true;
            }
            while let Some(x) = self.b.poll_transmit(t, &mut buf) {
                for d in buf[..x.len].chunks(x.seg) {
                    self.wire.push((false, d.to_vec()));
                    self.a.handle_datagram(t, addr(1), d);
                }
                moved = true;
            }
            if !moved {
                return;
            }
        }
        panic!("the pair never went quiet");
    }
}

fn delivered(e: &mut Engine) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    while let Some(ev) = e.poll_event() {
        if let Event::Delivered { msg, .. } = ev {
            got.push(msg);
        }
    }
    got
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

fn message(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

const SIZES: [usize; 5] = [0, 11, 1400, 5000, 100_000];

/// Messages of every size both ways, tagged and enciphered, with and without
/// the peer's incarnation known beforehand: all arrive intact, with no
/// timer needed (the first contact's challenge is answered at once), and
/// every datagram on the wire is sealed (enciphered payloads unreadable).
#[test]
fn a_sealed_pair_carries_messages_both_ways() {
    for encrypt in [false, true] {
        for expect in [false, true] {
            let key = auth(SECRET, encrypt);
            let mut p = Pair::new(engine(0xA1, Some(key.clone())), engine(0xB1, Some(key.clone())));
            let (pb, pa) = (p.a.peer(addr(1)), p.b.peer(addr(0)));
            if expect {
                assert!(p.a.expect_incarnation(pb, 0xB1) && p.b.expect_incarnation(pa, 0xA1));
            }
            let t = Instant::ZERO;
            for (i, &n) in SIZES.iter().enumerate() {
                p.a.send(t, pb, &[&message(n, i as u8)], i as u64).unwrap();
                p.b.send(t, pa, &[&message(n, 100 + i as u8)], i as u64).unwrap();
            }
            p.pump(t);
            let want_b: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(i, &n)| message(n, i as u8)).collect();
            let want_a: Vec<Vec<u8>> = SIZES.iter().enumerate().map(|(i, &n)| message(n, 100 + i as u8)).collect();
            assert_eq!(delivered(&mut p.b), want_b, "encrypt {encrypt} expect {expect}");
            assert_eq!(delivered(&mut p.a), want_a, "encrypt {encrypt} expect {expect}");
            let challenges = p.a.stats().sent_challenges + p.b.stats().sent_challenges;
            assert_eq!(challenges == 0, expect, "a challenge exactly when an incarnation was not known");
            for (_, d) in &p.wire {
                let (h, payload) = Header::decode(d).unwrap();
                assert_eq!(h.sealed, if encrypt { Sealed::Encrypted } else { Sealed::Tagged });
                assert_eq!(h.job_key, key.secret.job_id());
                if encrypt && payload.len() >= 64 {
                    let plain = want_a.iter().chain(&want_b).any(|m| m.windows(64).any(|w| w == &payload[..64]));
                    assert!(!plain, "an enciphered payload shows plaintext");
                }
            }
            for e in [&p.a, &p.b] {
                let s = e.stats();
                assert_eq!((s.dropped_auth, s.retransmits > 0 && expect), (0, false), "{s:?}");
            }
        }
    }
}

/// A datagram that fits `rdm/PROTOCOL.md` with the job's id and a valid
/// shape, from someone without the secret: every packet type, with a tag of
/// zeros, unsealed with a valid checksum, and sealed under another secret.
fn forgeries(job_id: u64, dst_inc: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for ptype in PacketType::ALL {
        let frag = ptype.has_fragments();
        for sealed in [Sealed::No, Sealed::Tagged, Sealed::Encrypted] {
            let h = Header {
                ptype,
                first: frag,
                last: frag,
                job_key: job_id,
                src_inc: 0x5EED,
                dst_inc,
                psn_or_window: 0,
                ack: Psn(0),
                sack: 0,
                header_sum: false,
                unsummed: false,
                sealed,
                hello: Hello::None,
            };
            let mut b = vec![0u8; 200];
            let n = h.encode(b"forged message", &mut b);
            let n = if sealed == Sealed::No { n } else { n + TRAILER_LEN };
            out.push(b[..n].to_vec());
        }
    }
    // Sealed properly, under another job's secret but naming this job.
    let mut other = engine(0x5EED, Some(auth(b"another job's secret!!", false)));
    let pb = other.peer(addr(1));
    other.send(Instant::ZERO, pb, &[b"forged message"], 1).unwrap();
    let mut buf = vec![0u8; 2000];
    let x = other.poll_transmit(Instant::ZERO, &mut buf).unwrap();
    let mut d = buf[..x.len].to_vec();
    d[8..16].copy_from_slice(&job_id.to_le_bytes());
    out.push(d);
    out
}

#[test]
fn forged_datagrams_make_no_state_and_are_counted() {
    let key = auth(SECRET, false);
    let mut b = engine(0xB1, Some(key.clone()));
    let forged = forgeries(key.secret.job_id(), 0xB1);
    for d in &forged {
        b.handle_datagram(Instant::ZERO, addr(7), d);
    }
    assert_eq!(b.stats().dropped_auth, forged.len() as u64, "{:?}", b.stats());
    assert_eq!(b.peer_id_of(addr(7)), None, "a forgery made a peer");
    assert!(events(&mut b).is_empty());
    let mut buf = vec![0u8; 2000];
    assert!(b.poll_transmit(Instant::ZERO, &mut buf).is_none(), "a forgery was answered");
}

/// Every datagram of a real exchange, altered in one bit (each bit of the
/// header, the payload and the trailer in turn) or cut short, is refused and
/// counted, and the receiver's state is as if none came.
#[test]
fn altered_and_truncated_datagrams_are_refused() {
    for encrypt in [false, true] {
        let key = auth(SECRET, encrypt);
        let mut p = Pair::new(engine(0xA1, Some(key.clone())), engine(0xB1, Some(key.clone())));
        let (pb, pa) = (p.a.peer(addr(1)), p.b.peer(addr(0)));
        // Both know each other's incarnation (as MPI ranks do from their
        // address vectors): the first datagram is acted on.
        assert!(p.a.expect_incarnation(pb, 0xB1) && p.b.expect_incarnation(pa, 0xA1));
        p.a.send(Instant::ZERO, pb, &[b"the one genuine message"], 1).unwrap();
        let mut buf = vec![0u8; 2000];
        let x = p.a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
        let d = buf[..x.len].to_vec();
        let mut refused = 0u64;
        for bit in 0..d.len() * 8 {
            let mut f = d.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            p.b.handle_datagram(Instant::ZERO, addr(0), &f);
            refused += 1;
        }
        for cut in 0..d.len() {
            p.b.handle_datagram(Instant::ZERO, addr(0), &d[..cut]);
            refused += 1;
        }
        let s = *p.b.stats();
        assert_eq!(s.dropped_auth + s.dropped_malformed + s.dropped_checksum + s.dropped_job_key, refused, "{s:?}");
        assert!(delivered(&mut p.b).is_empty(), "an altered datagram was delivered");
        // The genuine one still goes through afterwards.
        p.b.handle_datagram(Instant::ZERO, addr(0), &d);
        assert_eq!(delivered(&mut p.b), vec![b"the one genuine message".to_vec()]);
    }
}

/// Every datagram of a finished exchange sent again, to the same receiver
/// (inside and beyond its windows, from the sender's address and from
/// another), to the receiver restarted, and from an
/// incarnation of the sender left behind several restarts ago: nothing is
/// delivered twice or again, no send fails, and each is counted.
#[test]
fn replayed_datagrams_are_refused_across_restarts() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    // a1 to b1, first contact by address alone (the datagrams naming no one
    // are the ones a restarted receiver must not take).
    let mut p = Pair::new(engine(0xA1, Some(key.clone())), engine(0xB1, Some(key.clone())));
    let pb = p.a.peer(addr(1));
    for i in 0..300u64 {
        p.a.send(t, pb, &[&message(2000, i as u8)], i).unwrap();
    }
    p.pump(t);
    assert_eq!(delivered(&mut p.b).len(), 300);
    let captured: Vec<Vec<u8>> = p.wire.iter().filter(|(ab, _)| *ab).map(|(_, d)| d.clone()).collect();
    let counted = |e: &Engine| {
        let s = e.stats();
        s.dropped_replay + s.dropped_unnamed + s.dropped_stale + s.duplicates
    };

    // The same receiver.
    let before = counted(&p.b);
    for d in &captured {
        p.b.handle_datagram(t, addr(0), d);
    }
    assert!(delivered(&mut p.b).is_empty(), "a replay was delivered");
    assert_eq!(counted(&p.b) - before, captured.len() as u64, "{:?}", p.b.stats());
    assert_eq!(p.b.stats().received_datagrams, 0);
    // And b's acknowledgements to a (no sequence number: the packet counter
    // alone tells a replay).
    let acks: Vec<Vec<u8>> = p.wire.iter().filter(|(ab, _)| !*ab).map(|(_, d)| d.clone()).collect();
    assert!(acks.iter().all(|d| Header::decode(d).unwrap().0.ptype == PacketType::Ack));
    let before = counted(&p.a);
    for d in &acks {
        p.a.handle_datagram(t, addr(1), d);
    }
    assert_eq!(counted(&p.a) - before, acks.len() as u64, "{:?}", p.a.stats());

    // The same receiver, sent from another address (a new peer to it).
    let before = counted(&p.b);
    for d in &captured {
        p.b.handle_datagram(t, addr(9), d);
    }
    assert!(delivered(&mut p.b).is_empty(), "a replay from elsewhere was delivered");
    assert_eq!(counted(&p.b) - before, captured.len() as u64, "{:?}", p.b.stats());
    assert_eq!(p.b.peer_id_of(addr(9)), None, "a replay from elsewhere made a peer");

    // The receiver restarted (same address, new incarnation).
    let mut b2 = engine(0xB2, Some(key.clone()));
    for d in &captured {
        b2.handle_datagram(t, addr(0), d);
    }
    assert!(delivered(&mut b2).is_empty(), "a replay to a restarted receiver was delivered");
    assert_eq!(counted(&b2), captured.len() as u64, "{:?}", b2.stats());

    // The sender restarted three times since (b remembers two retired
    // incarnations without a secret); each new one talked to b.
    let mut b = p.b;
    for inc in [0xA2, 0xA3, 0xA4] {
        let mut q = Pair::new(engine(inc, Some(key.clone())), b);
        let pb = q.a.peer(addr(1));
        q.a.send(t, pb, &[b"hello from a new incarnation"], 1).unwrap();
        q.pump(t);
        assert_eq!(delivered(&mut q.b), vec![b"hello from a new incarnation".to_vec()]);
        b = q.b;
    }
    let pa = b.peer(addr(0));
    b.send(t, pa, &[b"to a4"], 77).unwrap();
    let before = counted(&b);
    for d in &captured {
        b.handle_datagram(t, addr(0), d);
    }
    let evs = events(&mut b);
    assert!(
        !evs.iter()
            .any(|e| matches!(e, Event::Delivered { .. } | Event::PeerRestarted { .. } | Event::SendFailed { .. })),
        "a1's replays acted on: {evs:?}"
    );
    assert_eq!(counted(&b) - before, captured.len() as u64, "{:?}", b.stats());
}

/// A job with a secret takes nothing unsealed from a wire (even with its
/// job id and a valid checksum), and one without takes nothing sealed (even
/// with the same job key): neither is ever half-protected.
#[test]
fn sealed_and_plain_engines_do_not_mix() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    let mut plain = engine(0xA1, None);
    let mut sealed = engine(0xB1, Some(key.clone()));
    let mut plain_same_key =
        Engine::new(EngineConfig { incarnation: 0xC1, job_key: key.secret.job_id(), ..EngineConfig::default() });
    let mut buf = vec![0u8; 2000];
    let pb = plain_same_key.peer(addr(1));
    plain_same_key.send(t, pb, &[b"unsealed"], 1).unwrap();
    let x = plain_same_key.poll_transmit(t, &mut buf).unwrap();
    sealed.handle_datagram(t, addr(0), &buf[..x.len]);
    assert_eq!(sealed.stats().dropped_auth, 1);
    assert!(delivered(&mut sealed).is_empty());

    let pa = sealed.peer(addr(0));
    sealed.send(t, pa, &[b"sealed"], 1).unwrap();
    let x = sealed.poll_transmit(t, &mut buf).unwrap();
    plain_same_key.handle_datagram(t, addr(1), &buf[..x.len]);
    plain.handle_datagram(t, addr(1), &buf[..x.len]);
    assert_eq!(plain_same_key.stats().dropped_auth, 1);
    assert_eq!(plain.stats().dropped_job_key, 1);
    assert!(delivered(&mut plain_same_key).is_empty() && delivered(&mut plain).is_empty());
    assert_eq!(HEADER_LEN + b"sealed".len() + TRAILER_LEN, x.len);
}

/// Sealed unreliable datagrams (`FI_EP_DGRAM`) are refused when sent again,
/// from the sender's address or any other, and a copy from a forged
/// address makes no peer.
/// `n` unreliable datagrams from `a` to `peer` (100 bytes of `i` each), as
/// they went on the wire.
fn datagrams(a: &mut Engine, peer: rdm::engine::PeerId, n: u8) -> Vec<Vec<u8>> {
    let mut buf = vec![0u8; 2000];
    (0..n)
        .map(|i| {
            a.send_datagram(peer, &[&[i; 100]], i as u64).unwrap();
            let x = a.poll_transmit(Instant::ZERO, &mut buf).unwrap();
            buf[..x.len].to_vec()
        })
        .collect()
}

#[test]
fn sealed_unreliable_datagrams_are_not_taken_twice() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    let (mut a, mut b) = (engine(0xA1, Some(key.clone())), engine(0xB1, Some(key)));
    let pb = a.peer(addr(1));
    let sent = datagrams(&mut a, pb, 5u8);
    for d in &sent {
        b.handle_datagram(t, addr(0), d);
    }
    let got =
        |b: &mut Engine| std::iter::from_fn(|| b.poll_event()).filter(|e| matches!(e, Event::Datagram { .. })).count();
    assert_eq!(got(&mut b), 5);
    for d in &sent {
        b.handle_datagram(t, addr(0), d);
        b.handle_datagram(t, addr(8), d);
    }
    assert_eq!(got(&mut b), 0, "a copy of a datagram was taken");
    assert_eq!(b.stats().dropped_replay, 10);
    assert_eq!(b.peer_id_of(addr(8)), None, "a copy from a forged address made a peer");
}

/// DGRAM datagrams carry the incarnation their sender's application
/// addressed: a receiver that restarted since takes none of them, copies
/// sent again included, while one addressed to no incarnation is still
/// taken (nothing tells it apart).
#[test]
fn sealed_unreliable_datagrams_to_a_restarted_receiver_are_refused() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    let mut a = engine(0xA1, Some(key.clone()));
    let pb = a.peer(addr(1));
    assert!(a.expect_incarnation(pb, 0xB1));
    let sent = datagrams(&mut a, pb, 3u8);
    let got =
        |b: &mut Engine| std::iter::from_fn(|| b.poll_event()).filter(|e| matches!(e, Event::Datagram { .. })).count();
    let mut b = engine(0xB1, Some(key.clone()));
    for d in &sent {
        b.handle_datagram(t, addr(0), d);
    }
    assert_eq!(got(&mut b), 3, "the incarnation addressed takes them");
    // B restarts at the same address: the copies name the old incarnation.
    let mut b = engine(0xB3, Some(key.clone()));
    for d in &sent {
        b.handle_datagram(t, addr(0), d);
    }
    assert_eq!(got(&mut b), 0, "a copy to a restarted receiver was taken");
    assert_eq!(b.stats().dropped_stale, 3);
    assert_eq!(b.peer_id_of(addr(0)), None, "a refused copy made a peer");
    // Addressed to no incarnation: taken (not protected, PROTOCOL.md §2.5).
    let mut c = engine(0xA3, Some(key));
    let pb = c.peer(addr(1));
    for d in datagrams(&mut c, pb, 1) {
        b.handle_datagram(t, addr(2), &d);
    }
    assert_eq!(got(&mut b), 1);
}

/// Data older than the packet counters tell apart (the sender sent more than
/// the window to others meanwhile): a copy of one received before is still
/// refused (by its sequence number) and counted, and nothing is answered.
#[test]
fn sealed_data_beyond_the_counter_window_is_taken_only_if_new() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    let mut p = Pair::new(engine(0xA1, Some(key.clone())), engine(0xB1, Some(key)));
    let pb = p.a.peer(addr(1));
    assert!(p.a.expect_incarnation(pb, 0xB1));
    p.a.send(t, pb, &[b"first"], 1).unwrap();
    p.pump(t);
    let first = p.wire.iter().find(|(ab, _)| *ab).unwrap().1.clone();
    // 1100 datagrams to someone else move a's packet counter past the window.
    let elsewhere = p.a.peer(addr(5));
    let mut buf = vec![0u8; 2000];
    for i in 0..1100u64 {
        p.a.send_datagram(elsewhere, &[b"x"], 100 + i).unwrap();
        p.a.poll_transmit(t, &mut buf).unwrap();
    }
    p.a.send(t, pb, &[b"second"], 2).unwrap();
    p.pump(t);
    assert_eq!(delivered(&mut p.b), vec![b"first".to_vec(), b"second".to_vec()]);
    let before = (p.b.stats().dropped_replay, p.b.stats().sent_acks);
    p.b.handle_datagram(t, addr(0), &first);
    assert!(delivered(&mut p.b).is_empty());
    assert_eq!(p.b.stats().dropped_replay, before.0 + 1);
    let mut out = vec![0u8; 2000];
    assert!(p.b.poll_transmit(t, &mut out).is_none(), "an old copy was answered");
    assert_eq!(p.b.stats().sent_acks, before.1);
}

/// A datagram of an incarnation the receiver never heard from, which named
/// the receiver (the sender had its address) and never arrived, sent to it
/// later: from the sender's address while a newer incarnation is current,
/// it is no restart (nothing fails, the current one stays); from another
/// address, it is taken nowhere. Only an echo of the receiver's own
/// challenge, or the application's address, makes an incarnation current.
#[test]
fn an_incarnation_never_heard_from_is_not_taken_from_a_replay() {
    let key = auth(SECRET, false);
    let t = Instant::ZERO;
    let mut buf = vec![0u8; 2000];
    // a0 knew c's incarnation and sent it a message that never arrived.
    let mut a0 = engine(0xA0, Some(key.clone()));
    let pc = a0.peer(addr(1));
    assert!(a0.expect_incarnation(pc, 0xC1));
    a0.send(t, pc, &[b"from a0, lost"], 1).unwrap();
    let lost = a0.poll_transmit(t, &mut buf).map(|x| buf[..x.len].to_vec()).unwrap();
    // a1, at the same address later, and c know each other and talk.
    let mut p = Pair::new(engine(0xA1, Some(key.clone())), engine(0xC1, Some(key)));
    let (pc, pa) = (p.a.peer(addr(1)), p.b.peer(addr(0)));
    assert!(p.a.expect_incarnation(pc, 0xC1) && p.b.expect_incarnation(pa, 0xA1));
    p.a.send(t, pc, &[b"from a1"], 1).unwrap();
    p.pump(t);
    assert_eq!(delivered(&mut p.b), vec![b"from a1".to_vec()]);
    p.b.send(t, pa, &[b"to a1"], 7).unwrap();
    p.b.handle_datagram(t, addr(0), &lost);
    p.b.handle_datagram(t, addr(6), &lost);
    let evs = events(&mut p.b);
    assert!(
        !evs.iter()
            .any(|e| matches!(e, Event::Delivered { .. } | Event::PeerRestarted { .. } | Event::SendFailed { .. })),
        "a0's datagram acted on: {evs:?}"
    );
    p.pump(t);
    assert_eq!(delivered(&mut p.a), vec![b"to a1".to_vec()], "c's send to a1 still arrives");
    assert!(events(&mut p.b).contains(&Event::SendComplete { token: 7 }));
    assert!(delivered(&mut p.b).is_empty());
}
