//! Unit tests of the engine, through its methods and, where a property needs
//! it, its state: per-peer paths, unsummed datagrams on shared-memory rings,
//! DIRECT packets (lent, written at once, in order with the sequenced stream,
//! held back by a pause, fragmented, dropped, failed), delayed acks of
//! completed messages, unreachable reports, runs of datagrams, unreliable
//! datagrams, what an idle peer costs, incarnations, and property tests of the
//! header, the reorder window and sequence numbers. Out of line so that the
//! engine's files hold the engine and stay readable.
use super::*;
use proptest::prelude::*;

#[test]
fn header_roundtrip_and_corruption_is_detected() {
    let h = Header {
        ptype: PacketType::Data,
        first: true,
        last: false,
        job_key: 7,
        src_inc: 8,
        dst_inc: 9,
        psn_or_window: 10,
        ack: Psn(11),
        sack: 0b101,
        header_sum: false,
        unsummed: false,
        sealed: Sealed::No,
        hello: Hello::None,
    };
    let mut buf = [0u8; 100];
    let n = h.encode(b"hello", &mut buf);
    let (back, p) = Header::decode(&buf[..n]).unwrap();
    assert_eq!((back, p), (h, &b"hello"[..]));
    for i in 0..n {
        let mut c = buf;
        c[i] ^= 0x40;
        assert!(Header::decode(&c[..n]).is_err(), "flip at {i} undetected");
    }
}

#[test]
fn each_peer_uses_its_own_path() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: 1472, ..EngineConfig::default() });
    let shm = DeviceCaps {
        reliable: true,
        ordered: true,
        mtu: 8192,
        remote_read: true,
        gso: false,
        registration: false,
        max_inline: 0,
        max_transmit: 8192,
    };
    let near = a.peer_with_path(crate::simnet::addr(1), &shm);
    let far = a.peer(crate::simnet::addr(2));
    let t = Instant::ZERO;
    a.send(t, near, &[&[1u8; 20_000]], 1).unwrap();
    a.send(t, far, &[&[2u8; 20_000]], 2).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut sizes: std::collections::HashMap<DevAddr, Vec<usize>> = std::collections::HashMap::new();
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        sizes.entry(x.dst).or_default().push(x.len);
    }
    assert_eq!(
        sizes[&crate::simnet::addr(1)].len(),
        3,
        "8 KiB segments on the shm path: {:?}",
        sizes[&crate::simnet::addr(1)]
    );
    assert!(sizes[&crate::simnet::addr(1)].iter().all(|&l| l <= 8192));
    assert_eq!(
        sizes[&crate::simnet::addr(2)].len(),
        20_000usize.div_ceil(1472 - HEADER_LEN),
        "UDP-sized segments elsewhere"
    );
    // The reliable path arms no retransmission timer; the other one does.
    let deadline = a.poll_timeout().expect("the UDP peer's RTO");
    a.handle_timeout(deadline);
    let mut resent: Vec<DevAddr> = Vec::new();
    while let Some(x) = a.poll_transmit(deadline, &mut buf) {
        resent.push(x.dst);
    }
    assert!(!resent.is_empty() && resent.iter().all(|d| *d == crate::simnet::addr(2)), "{resent:?}");
}

/// The path is kept once (the cold entry): a path given before anything
/// was sent is what sends use and what `datagram_max` reports, even when
/// the peer's state exists already (it sent first); one given after data
/// went out on the defaults changes neither.
#[test]
fn a_path_is_taken_until_data_went_out_and_reported_as_used() {
    let shm = DeviceCaps {
        reliable: true,
        ordered: true,
        mtu: 8192,
        remote_read: true,
        gso: false,
        registration: false,
        max_inline: 0,
        max_transmit: 8192,
    };
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: 1472, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, mtu: 1472, ..EngineConfig::default() });
    let t = Instant::ZERO;
    let pa = b.peer(crate::simnet::addr(0));
    b.send(t, pa, &[b"first"], 1).unwrap();
    let mut buf = vec![0u8; 9000];
    let x = b.poll_transmit(t, &mut buf).unwrap();
    a.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
    // a heard from b (hot state, nothing sent): the path is taken.
    let pb = a.peer_with_path(crate::simnet::addr(1), &shm);
    assert_eq!(a.datagram_max(pb), 8192 - HEADER_LEN);
    a.send(t, pb, &[&[0u8; 8000]], 2).unwrap();
    let mut lens = Vec::new();
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        lens.push(x.len);
    }
    assert_eq!(lens, vec![HEADER_LEN + 8000], "one datagram on the shm path");
    // b sent on the defaults already: a path given now changes nothing.
    b.peer_with_path(crate::simnet::addr(0), &shm);
    assert_eq!(b.datagram_max(pa), 1472 - HEADER_LEN);
    assert!(b.has_lossy_peers());
}

/// Two engines joined by a perfect path; `path` is what each knows of the
/// other. Returns (a, b, a's id of b, b's id of a).
fn pair(path: DeviceCaps) -> (Engine, Engine, PeerId, PeerId) {
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: path.mtu, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, mtu: path.mtu, ..EngineConfig::default() });
    let pb = a.peer_with_path(crate::simnet::addr(2), &path);
    let pa = b.peer_with_path(crate::simnet::addr(1), &path);
    (a, b, pb, pa)
}

/// Moves everything `from` wants to send into `to`; returns the packet
/// types that crossed.
fn carry(from: &mut Engine, from_addr: DevAddr, to: &mut Engine, t: Instant) -> Vec<PacketType> {
    let mut buf = vec![0u8; 9000];
    let mut types = Vec::new();
    while let Some(x) = from.poll_transmit(t, &mut buf) {
        types.push(Header::decode(&buf[..x.len]).unwrap().0.ptype);
        to.handle_datagram(t, from_addr, &buf[..x.len]);
    }
    types
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

/// One acknowledged message each way, so that each has heard the other.
fn introduce(a: &mut Engine, pb: PeerId, b: &mut Engine, pa: PeerId) {
    let t = Instant::ZERO;
    a.send(t, pb, &[b"hi"], 900).unwrap();
    b.send(t, pa, &[b"hi"], 901).unwrap();
    for _ in 0..3 {
        carry(a, crate::simnet::addr(1), b, t);
        carry(b, crate::simnet::addr(2), a, t);
    }
    events(a);
    events(b);
}

/// What a UDP socket offers: unreliable, unordered, one Ethernet MTU, no
/// segmentation offload.
const UDP: DeviceCaps = DeviceCaps {
    reliable: false,
    ordered: false,
    mtu: 1472,
    remote_read: false,
    gso: false,
    registration: false,
    max_inline: 0,
    max_transmit: 1472,
};

const SHM: DeviceCaps = DeviceCaps {
    reliable: true,
    ordered: true,
    mtu: 8192,
    remote_read: true,
    gso: false,
    registration: false,
    max_inline: 0,
    max_transmit: 8192,
};

/// On a shared-memory ring the sender leaves the checksum out (the bytes
/// cross no wire); a receiver takes such a datagram only from a ring. A
/// path that may corrupt (a fault decorator drops `reliable`) or any other
/// address keeps the sum.
#[test]
fn datagrams_to_a_shared_memory_ring_go_unsummed_and_only_a_ring_may_send_them() {
    let ring = |pid: u32| DevAddr::Shm(crate::device::ShmAddr { host_id: 7, pid, ring_id: u64::from(pid) });
    let (sa, sb) = (ring(1), ring(2));
    let t = Instant::ZERO;
    let mut buf = vec![0u8; 9000];
    let mut first_packet = |path: DeviceCaps, to: DevAddr, parts: &[&[u8]]| {
        let mut e = Engine::new(EngineConfig { incarnation: 1, mtu: path.mtu, ..EngineConfig::default() });
        let p = e.peer_with_path(to, &path);
        e.send(t, p, parts, 1).unwrap();
        let x = e.poll_transmit(t, &mut buf).unwrap();
        buf[..x.len].to_vec()
    };
    let unsummed = |d: &[u8]| Header::decode(d).unwrap().0.unsummed;
    let on_ring = first_packet(SHM, sb, &[b"hello"]);
    assert!(unsummed(&on_ring));
    assert!(
        !unsummed(&first_packet(DeviceCaps { reliable: false, ordered: false, ..SHM }, sb, &[b"hello"])),
        "a path that may corrupt keeps its sum"
    );
    assert!(
        !unsummed(&first_packet(SHM, crate::simnet::addr(2), &[b"hello"])),
        "a reliable path that is not a ring keeps its sum"
    );
    let mut b = Engine::new(EngineConfig { incarnation: 2, mtu: SHM.mtu, ..EngineConfig::default() });
    b.peer_with_path(sa, &SHM);
    // The same bytes from anywhere but a ring: dropped as unchecked.
    b.handle_datagram(t, DevAddr::Udp("127.0.0.1:9".parse().unwrap()), &on_ring);
    b.handle_datagram(t, crate::simnet::addr(1), &on_ring);
    assert_eq!(b.stats().dropped_checksum, 2);
    assert!(events(&mut b).is_empty());
    // From the ring: delivered.
    b.handle_datagram(t, sa, &on_ring);
    assert!(matches!(&events(&mut b)[..], [Event::Delivered { msg, .. }] if msg == b"hello"));
    assert_eq!(b.stats().dropped_checksum, 2);
}

/// A whole message in one DIRECT datagram is lent to the caller instead of
/// queued, only while nothing is queued ahead of it; a fragment, or one
/// arriving behind a queued event, takes the usual way.
#[test]
fn a_direct_message_is_lent_only_whole_and_with_nothing_queued_ahead() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    let t = Instant::ZERO;
    introduce(&mut a, pb, &mut b, pa);
    let mut buf = vec![0u8; 20000];
    let mut next = |a: &mut Engine, parts: &[&[u8]]| {
        a.send_transmit_complete(t, pb, parts, 1).unwrap();
        let mut out = Vec::new();
        while let Some(x) = a.poll_transmit(t, &mut buf) {
            out.push(buf[..x.len].to_vec());
        }
        events(a);
        out
    };
    let d = next(&mut a, &[b"whole"]);
    assert_eq!(b.handle_datagram_lending(t, crate::simnet::addr(1), &d[0]), Some(pa));
    assert_eq!(&d[0][HEADER_LEN..], b"whole");
    assert!(events(&mut b).is_empty(), "lent, not queued");
    // Behind a queued event: queued too, in order.
    let (d1, d2) = (next(&mut a, &[b"one"]), next(&mut a, &[b"two"]));
    b.handle_datagram(t, crate::simnet::addr(1), &d1[0]);
    assert_eq!(b.handle_datagram_lending(t, crate::simnet::addr(1), &d2[0]), None);
    assert_eq!(
        events(&mut b),
        vec![Event::Delivered { peer: pa, msg: b"one".to_vec() }, Event::Delivered { peer: pa, msg: b"two".to_vec() }]
    );
    // Fragments of a longer message are put together as always.
    let frags = next(&mut a, &[&[7u8; 12000]]);
    assert!(frags.len() > 1);
    for f in &frags {
        assert_eq!(b.handle_datagram_lending(t, crate::simnet::addr(1), f), None);
    }
    assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: vec![7u8; 12000] }]);
    assert_eq!(b.stats().delivered_msgs, 5, "the introduction, whole, one, two and the long one");
}

/// The DIRECT fast path writes the message at once, as the queued path
/// would have, and only where the queued path would have sent it DIRECT
/// with nothing waiting ahead of it.
#[test]
fn a_direct_message_written_at_once_is_the_queued_one_and_never_overtakes() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    let t = Instant::ZERO;
    let mut buf = vec![0u8; 9000];
    assert!(a.transmit_direct_now(pb, &[b"hi"], 1, &mut buf).is_none(), "not before the peer was heard from");
    introduce(&mut a, pb, &mut b, pa);
    let x = a.transmit_direct_now(pb, &[b"ab", b"", b"cde"], 2, &mut buf).expect("heard from, nothing waiting");
    let (h, payload) = Header::decode(&buf[..x.len]).unwrap();
    assert_eq!((h.ptype, h.first, h.last, payload), (PacketType::Direct, true, true, &b"abcde"[..]));
    assert_eq!(events(&mut a), vec![Event::SendComplete { token: 2 }]);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
    assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: b"abcde".to_vec() }]);
    // A datagram queued ahead (written out by the next poll_transmit)
    // is never overtaken; one larger than a datagram takes the queue.
    a.send_transmit_complete(t, pb, &[b"queued"], 3).unwrap();
    assert!(a.transmit_direct_now(pb, &[b"later"], 4, &mut buf).is_none());
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert!(a.transmit_direct_now(pb, &[&vec![0u8; 8192]], 5, &mut buf).is_none(), "more than one datagram");
    assert!(a.transmit_direct_now(pb, &[b"x"], 6, &mut buf[..HEADER_LEN]).is_none(), "more than the buffer");
    assert_eq!(a.stats().sent_direct, 2);
}

#[test]
fn a_small_message_on_a_reliable_ordered_path_is_one_unacknowledged_packet() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    let t = Instant::ZERO;
    // Not before the peer was heard from (it could be of another job,
    // which drops what nothing would acknowledge).
    a.send_transmit_complete(t, pb, &[b"first"], 9).unwrap();
    assert_eq!(carry(&mut a, crate::simnet::addr(1), &mut b, t), vec![PacketType::Data]);
    assert!(events(&mut a).is_empty(), "the first message waits for its ack");
    events(&mut b);
    carry(&mut b, crate::simnet::addr(2), &mut a, t);
    assert_eq!(events(&mut a), vec![Event::SendComplete { token: 9 }]);
    for i in 0..3u8 {
        a.send_transmit_complete(t, pb, &[&[i; 8]], 10 + i as u64).unwrap();
        assert!(events(&mut a).is_empty(), "not complete before it is written out");
        assert_eq!(carry(&mut a, crate::simnet::addr(1), &mut b, t), vec![PacketType::Direct]);
        assert_eq!(events(&mut a), vec![Event::SendComplete { token: 10 + i as u64 }], "complete once written");
        assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: vec![i; 8] }]);
        assert!(carry(&mut b, crate::simnet::addr(2), &mut a, t).is_empty(), "no acknowledgement");
    }
    assert_eq!(
        (a.stats().sent_direct, a.stats().sent_data, b.stats().received_direct, b.stats().sent_acks),
        (3, 1, 3, 1)
    );
    // Nothing waits on a timer: firing whatever is armed resends nothing.
    if let Some(d) = a.poll_timeout() {
        a.handle_timeout(d);
    }
    assert!(carry(&mut a, crate::simnet::addr(1), &mut b, t).is_empty());
    assert_eq!(a.stats().retransmits, 0);
}

#[test]
fn unreliable_or_unordered_paths_never_skip_the_sequence() {
    for path in [
        UDP,
        DeviceCaps {
            reliable: true,
            ordered: false,
            mtu: 8192,
            remote_read: true,
            gso: false,
            registration: false,
            max_inline: 0,
            max_transmit: 8192,
        },
        DeviceCaps { ordered: true, ..UDP },
    ] {
        let (mut a, mut b, pb, pa) = pair(path);
        let t = Instant::ZERO;
        a.send_transmit_complete(t, pb, &[b"x"], 1).unwrap();
        assert_eq!(carry(&mut a, crate::simnet::addr(1), &mut b, t), vec![PacketType::Data], "{path:?}");
        assert!(events(&mut a).is_empty(), "completes on the ack only: {path:?}");
        assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: b"x".to_vec() }]);
        carry(&mut b, crate::simnet::addr(2), &mut a, t);
        assert_eq!(events(&mut a), vec![Event::SendComplete { token: 1 }]);
    }
}

#[test]
fn direct_messages_keep_order_with_sequenced_ones() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    // A long message (segmented, sequenced), then short ones: they may not
    // overtake it, so they go sequenced too until it is acknowledged.
    a.send_transmit_complete(t, pb, &[&[7u8; DIRECT_MAX + 4000]], 1).unwrap();
    a.send_transmit_complete(t, pb, &[b"after"], 2).unwrap();
    a.send(t, pb, &[b"delivery"], 3).unwrap();
    a.send_transmit_complete(t, pb, &[b"last"], 4).unwrap();
    let types = carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert!(types.iter().all(|p| *p == PacketType::Data), "{types:?}");
    let got: Vec<Vec<u8>> = events(&mut b)
        .into_iter()
        .map(|e| match e {
            Event::Delivered { peer, msg } if peer == pa => msg,
            e => panic!("{e:?}"),
        })
        .collect();
    assert_eq!(got, vec![vec![7u8; DIRECT_MAX + 4000], b"after".to_vec(), b"delivery".to_vec(), b"last".to_vec()]);
    carry(&mut b, crate::simnet::addr(2), &mut a, t);
    assert_eq!(events(&mut a).len(), 4);
    // Everything acknowledged: the fast path again, and a long message
    // queued after a DIRECT one still arrives after it.
    a.send_transmit_complete(t, pb, &[b"fast"], 5).unwrap();
    a.send_transmit_complete(t, pb, &[&[9u8; 20_000]], 7).unwrap();
    a.send(t, pb, &[&[8u8; 20_000]], 6).unwrap();
    let types = carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert_eq!(types[0], PacketType::Direct, "{types:?}");
    let got: Vec<usize> =
        events(&mut b).into_iter().map(|e| if let Event::Delivered { msg, .. } = e { msg.len() } else { 0 }).collect();
    assert_eq!(got, vec![4, 20_000, 20_000]);
}

#[test]
fn a_paused_receiver_stops_direct_messages_until_its_window_opens() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    a.send_transmit_complete(t, pb, &[b"one"], 1).unwrap();
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    b.set_paused(true);
    assert_eq!(carry(&mut b, crate::simnet::addr(2), &mut a, t), vec![PacketType::Ack], "a zero window, told at once");
    a.send_transmit_complete(t, pb, &[b"two"], 2).unwrap();
    assert_eq!(
        carry(&mut a, crate::simnet::addr(1), &mut b, t),
        vec![PacketType::Data],
        "held by the window, not DIRECT"
    );
    events(&mut a);
    assert!(
        !events(&mut b).iter().any(|e| matches!(e, Event::Delivered { msg, .. } if msg == b"two")),
        "refused while paused"
    );
    b.set_paused(false);
    carry(&mut b, crate::simnet::addr(2), &mut a, t);
    // The refused DATA packet waits for the sender's retransmission; the
    // window is open again, so once the stream drains DIRECT resumes.
    // A reliable path has no retransmission timer: the reopened window
    // itself makes the sender resend what was refused, with no time passing.
    let now = t;
    carry(&mut a, crate::simnet::addr(1), &mut b, now);
    assert!(events(&mut b).iter().any(|e| matches!(e, Event::Delivered { msg, .. } if msg == b"two")));
    carry(&mut b, crate::simnet::addr(2), &mut a, now);
    let ev = events(&mut a);
    assert!(ev.contains(&Event::SendComplete { token: 2 }), "{ev:?} {}", a.describe_peer(pb));
    a.send_transmit_complete(now, pb, &[b"three"], 3).unwrap();
    assert_eq!(carry(&mut a, crate::simnet::addr(1), &mut b, now), vec![PacketType::Direct]);
}

/// What `b` delivered, as (first byte, length) per message.
fn delivered(b: &mut Engine) -> Vec<(u8, usize)> {
    events(b)
        .into_iter()
        .filter_map(|e| if let Event::Delivered { msg, .. } = e { Some((msg[0], msg.len())) } else { None })
        .collect()
}

/// `rounds` of b's packets to a and a's to b: what b delivered, and a's
/// events.
fn exchange(a: &mut Engine, b: &mut Engine, rounds: usize) -> (Vec<(u8, usize)>, Vec<Event>) {
    let t = Instant::ZERO;
    let (mut got, mut done) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        carry(b, crate::simnet::addr(2), a, t);
        carry(a, crate::simnet::addr(1), b, t);
        got.extend(delivered(b));
        done.extend(events(a));
    }
    (got, done)
}

/// DIRECT messages queued to a peer that then pauses go sequenced
/// instead: its window holds them (a paused receiver still takes DIRECT
/// packets, so they would have landed beyond its limit), and once it
/// resumes they arrive, in order, and complete. The rest of a message
/// already begun still goes DIRECT, ahead of them.
#[test]
fn direct_messages_queued_to_a_peer_that_pauses_wait_for_its_window() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    // A message of two fragments, then four small ones, all queued DIRECT.
    a.send_transmit_complete(t, pb, &[&[9u8; 12000]], 9).unwrap();
    for i in 0..4u8 {
        a.send_transmit_complete(t, pb, &[&[i; 8]], 10 + i as u64).unwrap();
    }
    // The long message's first fragment leaves; then b pauses and its
    // zero-window ACK reaches a.
    let mut buf = vec![0u8; 9000];
    let x = a.poll_transmit(t, &mut buf).unwrap();
    assert_eq!(Header::decode(&buf[..x.len]).unwrap().0.ptype, PacketType::Direct);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
    b.set_paused(true);
    assert_eq!(carry(&mut b, crate::simnet::addr(2), &mut a, t), vec![PacketType::Ack]);
    assert_eq!(a.stats().direct_requeued, 4);
    // The long message's last fragment still goes DIRECT (b is putting it
    // together); the four small ones go sequenced and b refuses them.
    let types = carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert_eq!(types[0], PacketType::Direct, "{types:?}");
    assert!(types[1..].iter().all(|p| *p == PacketType::Data), "{types:?}");
    assert_eq!(delivered(&mut b), vec![(9, 12000)]);
    assert_eq!(events(&mut a), vec![Event::SendComplete { token: 9 }]);
    assert_eq!(a.stats().sent_direct, 2);
    b.set_paused(false);
    let (got, done) = exchange(&mut a, &mut b, 10);
    assert_eq!(got, (0..4u8).map(|i| (i, 8)).collect::<Vec<_>>());
    assert_eq!(done, (10..14u64).map(|token| Event::SendComplete { token }).collect::<Vec<_>>());
    assert_eq!(a.stats().sent_direct, 2, "no DIRECT packet after the pause");
}

/// A sender told by the device that its peer holds senders back (shm's
/// ring flag) acts as on the zero-window ACK, before that ACK arrives.
#[test]
fn a_peer_holding_back_takes_the_queued_direct_messages_off_the_fast_path() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    a.send_transmit_complete(t, pb, &[b"one"], 1).unwrap();
    a.peer_holds_back(t, pb);
    assert_eq!(a.stats().direct_requeued, 1);
    let mut buf = vec![0u8; 9000];
    assert!(a.transmit_direct_now(pb, &[b"two"], 2, &mut buf).is_none(), "no DIRECT while held back");
    a.send_transmit_complete(t, pb, &[b"two"], 2).unwrap();
    assert_eq!(
        carry(&mut a, crate::simnet::addr(1), &mut b, t),
        vec![PacketType::Data],
        "one packet: the window of a paused peer"
    );
    let (got, _) = exchange(&mut a, &mut b, 6);
    assert_eq!(got, vec![(b'o', 3), (b't', 3)], "b never paused: its ACKs open the window again");
    a.send_transmit_complete(t, pb, &[b"three"], 3).unwrap();
    assert_eq!(
        carry(&mut a, crate::simnet::addr(1), &mut b, t),
        vec![PacketType::Direct],
        "DIRECT again once everything was acknowledged"
    );
}

#[test]
fn a_message_of_several_datagrams_goes_as_direct_fragments() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    let big: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    // A gather list cut across its parts, then a whole small message.
    a.send_transmit_complete(t, pb, &[&big[..5], &big[5..9000], &big[9000..]], 1).unwrap();
    a.send_transmit_complete(t, pb, &[b"tail"], 2).unwrap();
    let mut buf = vec![0u8; 9000];
    let mut flags = Vec::new();
    let mut done = Vec::new();
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        let (h, _) = Header::decode(&buf[..x.len]).unwrap();
        flags.push((h.ptype, h.first, h.last));
        b.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
        done.extend(events(&mut a));
    }
    assert_eq!(
        flags,
        vec![
            (PacketType::Direct, true, false),
            (PacketType::Direct, false, false),
            (PacketType::Direct, false, true),
            (PacketType::Direct, true, true)
        ]
    );
    assert_eq!(
        done,
        vec![Event::SendComplete { token: 1 }, Event::SendComplete { token: 2 }],
        "one completion each, after the last fragment"
    );
    assert_eq!(
        events(&mut b),
        vec![Event::Delivered { peer: pa, msg: big.clone() }, Event::Delivered { peer: pa, msg: b"tail".to_vec() }]
    );
    assert!(carry(&mut b, crate::simnet::addr(2), &mut a, t).is_empty(), "no acknowledgement");
    // Larger than DIRECT_MAX: sequenced.
    a.send_transmit_complete(t, pb, &[&vec![1u8; DIRECT_MAX + 1]], 3).unwrap();
    assert!(carry(&mut a, crate::simnet::addr(1), &mut b, t).iter().all(|p| *p == PacketType::Data));
}

#[test]
fn a_direct_fragment_out_of_place_is_dropped_and_counted() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    let mut hdr = Header {
        ptype: PacketType::Direct,
        first: false,
        last: true,
        job_key: 0,
        src_inc: 1,
        dst_inc: 2,
        psn_or_window: 0,
        ack: Psn(0),
        sack: 0,
        header_sum: false,
        unsummed: false,
        sealed: Sealed::No,
        hello: Hello::None,
    };
    let mut buf = vec![0u8; 200];
    // A LAST with no message open; then a FIRST, and a FIRST again.
    let n = hdr.encode(b"orphan", &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    hdr.first = true;
    hdr.last = false;
    let n = hdr.encode(b"one", &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    let n = hdr.encode(b"two", &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    hdr.first = false;
    hdr.last = true;
    let n = hdr.encode(b"!", &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: b"two!".to_vec() }]);
    assert_eq!(b.stats().dropped_malformed, 2);
}

#[test]
fn direct_packets_of_another_job_or_to_an_old_incarnation_are_dropped() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    a.send_transmit_complete(t, pb, &[b"hello"], 1).unwrap();
    let mut buf = vec![0u8; 9000];
    let x = a.poll_transmit(t, &mut buf).unwrap();
    let (mut hdr, payload) = Header::decode(&buf[..x.len]).unwrap();
    let payload = payload.to_vec();
    hdr.job_key = 99;
    let n = hdr.encode(&payload, &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    hdr.job_key = 0;
    hdr.dst_inc = 77;
    let n = hdr.encode(&payload, &mut buf);
    b.handle_datagram(t, crate::simnet::addr(1), &buf[..n]);
    assert!(!events(&mut b).iter().any(|e| matches!(e, Event::Delivered { .. })));
    assert_eq!((b.stats().dropped_job_key, b.stats().dropped_stale), (1, 1));
}

/// A stream of 64 KiB messages behind a header allocates nothing once
/// started: the sender's copy and the receiver's assembled message both end
/// in buffers the pools take back (a bound of exactly 64 KiB, with the
/// receiver's buffer doubling to 128 KiB, freed and allocated one per
/// message on each side). Fails if either buffer outgrows `POOL_MAX_CAPACITY`
/// or is not kept, or if the bytes change on the way.
#[test]
fn a_stream_of_64_kib_messages_reuses_its_buffers_on_both_sides() {
    let (mut a, mut b, pb, pa) = pair(UDP);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    let header = [7u8; 32];
    let payload: Vec<u8> = (0..64u32 << 10).map(|i| (i % 253) as u8).collect();
    let (mut tx_kept, mut rx_kept) = (0, 0);
    for token in 1..=8u64 {
        a.send(t, pb, &[&header, &payload], token).unwrap();
        let mut got = None;
        for _ in 0..200 {
            carry(&mut a, crate::simnet::addr(1), &mut b, t);
            for e in events(&mut b) {
                if let Event::Delivered { msg, .. } = e {
                    got = Some(msg);
                }
            }
            carry(&mut b, crate::simnet::addr(2), &mut a, t);
            if events(&mut a).contains(&Event::SendComplete { token }) {
                break;
            }
        }
        let msg = got.expect("delivered");
        assert_eq!((&msg[..32], &msg[32..]), (&header[..], &payload[..]));
        assert!(msg.capacity() <= POOL_MAX_CAPACITY, "assembled in {} bytes", msg.capacity());
        b.recycle(msg);
        // Each side keeps what it used: the pools hold a message's buffer.
        tx_kept = tx_kept.max(a.tx_pool.iter().filter(|v| v.capacity() >= payload.len()).count());
        rx_kept = rx_kept.max(b.pool.iter().filter(|v| v.capacity() >= payload.len()).count());
    }
    assert_eq!((tx_kept, rx_kept), (1, 1), "one buffer each, reused by every message");
}

#[test]
fn a_completed_message_waits_briefly_for_an_answer_to_carry_its_ack() {
    let udp = UDP;
    let delay = Duration::from_micros(50);
    let mut a = Engine::new(EngineConfig { incarnation: 1, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, completed_ack_delay: delay, ..EngineConfig::default() });
    let pb = a.peer_with_path(crate::simnet::addr(2), &udp);
    let pa = b.peer_with_path(crate::simnet::addr(1), &udp);
    let t = Instant::ZERO;
    // An answer within the delay carries the ack: no ACK packet at all.
    a.send(t, pb, &[b"ping"], 1).unwrap();
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert!(carry(&mut b, crate::simnet::addr(2), &mut a, t).is_empty(), "the ack waits");
    b.send(t, pa, &[b"pong"], 2).unwrap();
    assert_eq!(carry(&mut b, crate::simnet::addr(2), &mut a, t), vec![PacketType::Data]);
    assert!(events(&mut a).contains(&Event::SendComplete { token: 1 }), "acknowledged by the answer");
    assert_eq!(b.stats().sent_acks, 0);
    // No answer: the timer sends the ack once the delay has passed.
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    a.send(t, pb, &[b"alone"], 3).unwrap();
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    assert!(carry(&mut b, crate::simnet::addr(2), &mut a, t).is_empty());
    let due = b.poll_timeout().expect("the delayed ack's deadline");
    assert!(due <= t + delay, "{due:?}");
    b.handle_timeout(due);
    assert_eq!(carry(&mut b, crate::simnet::addr(2), &mut a, due), vec![PacketType::Ack]);
    assert!(events(&mut a).contains(&Event::SendComplete { token: 3 }));
    // Without the delay (manual progress), at once.
    let mut c = Engine::new(EngineConfig { incarnation: 3, ..EngineConfig::default() });
    c.peer_with_path(crate::simnet::addr(1), &udp);
    a.peer_with_path(crate::simnet::addr(3), &udp);
    let pc = a.peer(crate::simnet::addr(3));
    a.send(t, pc, &[b"x"], 4).unwrap();
    carry(&mut a, crate::simnet::addr(1), &mut c, t);
    assert_eq!(carry(&mut c, crate::simnet::addr(3), &mut a, t), vec![PacketType::Ack]);
}

#[test]
fn a_direct_message_the_device_could_not_deliver_fails_instead_of_completing() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    a.send_transmit_complete(t, pb, &[b"to a dead process"], 7).unwrap();
    let mut buf = vec![0u8; 9000];
    assert!(a.poll_transmit(t, &mut buf).is_some());
    // The provider hands the datagram to the device, which says the peer
    // is gone, before anyone polled the engine's events.
    a.handle_unreachable(crate::simnet::addr(2));
    assert_eq!(
        events(&mut a),
        vec![
            Event::SendFailed { token: 7, peer: pb, reason: FailReason::Unreachable },
            Event::PeerUnreachable { peer: pb }
        ]
    );
}

#[test]
fn a_reliable_peer_reported_unreachable_fails_even_when_idle() {
    let (mut a, mut b, pb, pa) = pair(SHM);
    introduce(&mut a, pb, &mut b, pa);
    let t = Instant::ZERO;
    a.send_transmit_complete(t, pb, &[b"lost"], 1).unwrap();
    carry(&mut a, crate::simnet::addr(1), &mut b, t);
    events(&mut a);
    a.handle_unreachable(crate::simnet::addr(2));
    assert_eq!(events(&mut a), vec![Event::PeerUnreachable { peer: pb }]);
    a.send_transmit_complete(t, pb, &[b"next"], 2).unwrap();
    assert!(matches!(events(&mut a)[..], [Event::SendFailed { token: 2, .. }]));
}

#[test]
fn runs_of_datagrams_only_where_the_device_takes_them() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: 1472, ..EngineConfig::default() });
    let udp_gso = DeviceCaps { gso: true, ..UDP };
    let gso_peer = a.peer_with_path(crate::simnet::addr(1), &udp_gso);
    let plain = a.peer(crate::simnet::addr(2));
    let t = Instant::ZERO;
    let msg: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    a.send(t, gso_peer, &[&msg], 1).unwrap();
    a.send(t, plain, &[&msg], 2).unwrap();
    let mut buf = vec![0u8; 65536];
    let mut runs = Vec::new();
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        // Every datagram of a run parses on its own.
        let mut off = 0;
        while off < x.len {
            let n = x.seg.min(x.len - off);
            assert!(Header::decode(&buf[off..off + n]).is_ok(), "datagram at {off} of a run");
            off += n;
        }
        runs.push((x.dst, x.len, x.seg));
    }
    let seg = 1472;
    let segments = 10_000usize.div_ceil(1472 - HEADER_LEN);
    let gso: Vec<_> = runs.iter().filter(|r| r.0 == crate::simnet::addr(1)).collect();
    assert_eq!(gso.len(), 1, "one run carries the whole message: {gso:?}");
    assert_eq!(gso[0].2, seg);
    assert_eq!(gso[0].1, 10_000 + segments * HEADER_LEN);
    let single: Vec<_> = runs.iter().filter(|r| r.0 == crate::simnet::addr(2)).collect();
    assert_eq!(single.len(), segments);
    assert!(single.iter().all(|r| r.1 == r.2), "no runs to a path without gso");
    // After a device refused a run, single datagrams only.
    a.disable_runs();
    a.send(t, gso_peer, &[&msg], 3).unwrap();
    let mut n = 0;
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        assert_eq!(x.len, x.seg);
        n += 1;
    }
    assert_eq!(n, segments);
}

#[test]
fn datagrams_are_stateless_whole_and_isolated_by_job_key() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, job_key: 5, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, job_key: 5, ..EngineConfig::default() });
    let mut other_job = Engine::new(EngineConfig { incarnation: 3, job_key: 6, ..EngineConfig::default() });
    let t = Instant::ZERO;
    let pb = a.peer(crate::simnet::addr(1));
    let max = a.datagram_max(pb);
    assert_eq!(max, 1472 - HEADER_LEN);
    assert_eq!(
        a.send_datagram(pb, &[&[1u8; 1472 - HEADER_LEN], &[2]], 9),
        Err(SendError::TooLarge { len: max + 1, max })
    );
    a.send_datagram(pb, &[b"hel", b"lo"], 7).unwrap();
    a.send_datagram(pb, &[&[3u8; 1472 - HEADER_LEN]], 8).unwrap();
    assert!(a.wants_transmit());
    // Not complete before it is written out for the device.
    assert_eq!(a.poll_event(), None);
    let mut buf = vec![0u8; 2000];
    let mut wire = Vec::new();
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        assert_eq!(x.dst, crate::simnet::addr(1));
        wire.push(buf[..x.len].to_vec());
    }
    assert_eq!(wire.len(), 2, "one datagram each, no acks or segments");
    assert_eq!(a.poll_event(), Some(Event::SendComplete { token: 7 }));
    assert_eq!(a.poll_event(), Some(Event::SendComplete { token: 8 }));
    assert!(!a.wants_transmit() && a.poll_timeout().is_none() && a.hot_peers() == 0, "no state, no timer");
    // Delivered whole, in any order, once per copy; nothing is sent back.
    for d in wire.iter().rev() {
        b.handle_datagram(t, crate::simnet::addr(0), d);
        other_job.handle_datagram(t, crate::simnet::addr(0), d);
    }
    let pa = b.peer_id_of(crate::simnet::addr(0)).unwrap();
    assert_eq!(b.poll_event(), Some(Event::Datagram { peer: pa, msg: vec![3u8; 1472 - HEADER_LEN] }));
    assert_eq!(b.poll_event(), Some(Event::Datagram { peer: pa, msg: b"hello".to_vec() }));
    assert!(b.poll_transmit(t, &mut buf).is_none() && b.hot_peers() == 0);
    assert_eq!((b.stats().received_datagrams, a.stats().sent_datagrams), (2, 2));
    // Another job's endpoint drops them.
    assert_eq!(other_job.poll_event(), None);
    assert_eq!(other_job.stats().dropped_job_key, 2);
}

#[test]
fn unreachable_report_fails_a_busy_peer_at_once_and_leaves_idle_ones() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, ..EngineConfig::default() });
    let busy = a.peer(crate::simnet::addr(1));
    let idle = a.peer(crate::simnet::addr(2));
    let t = Instant::ZERO;
    a.send(t, busy, &[b"one"], 10).unwrap();
    a.send(t, busy, &[b"two"], 11).unwrap();
    let mut buf = vec![0u8; 2000];
    while a.poll_transmit(t, &mut buf).is_some() {}
    // Unknown and idle addresses change nothing.
    a.handle_unreachable(crate::simnet::addr(9));
    a.handle_unreachable(a.peer_addr(idle));
    assert_eq!(a.poll_event(), None);
    a.handle_unreachable(crate::simnet::addr(1));
    let mut events = Vec::new();
    while let Some(e) = a.poll_event() {
        events.push(e);
    }
    assert_eq!(
        events,
        [
            Event::SendFailed { token: 10, peer: busy, reason: FailReason::Unreachable },
            Event::SendFailed { token: 11, peer: busy, reason: FailReason::Unreachable },
            Event::PeerUnreachable { peer: busy },
        ]
    );
    assert_eq!(a.stats().peers_failed, 1);
    // A second report of the same peer is not a second failure.
    a.handle_unreachable(crate::simnet::addr(1));
    assert_eq!(a.poll_event(), None);
}

#[test]
fn an_idle_peer_after_traffic_costs_at_most_640_bytes() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, ..EngineConfig::default() });
    let pa = a.peer(crate::simnet::addr(1));
    let pb = b.peer(crate::simnet::addr(0));
    // An AV entry creates no engine state at all (the provider keeps the 48-byte
    // address); a peer the engine was asked about but never used costs this:
    let cold = a.peer_bytes(pa);
    assert!(cold <= 96, "a cold peer costs {cold} bytes");
    let mut buf = vec![0u8; 2000];
    let mut t = Instant::ZERO;
    for i in 0..2000u64 {
        a.send(t, pa, &[&[7u8; 3000]], i).unwrap();
    }
    // Shuttle datagrams until everything is acknowledged.
    for _ in 0..100_000 {
        t = t + Duration::from_micros(5);
        let mut moved = false;
        while let Some(x) = a.poll_transmit(t, &mut buf) {
            b.handle_datagram(t, crate::simnet::addr(0), &buf[..x.len]);
            moved = true;
        }
        while let Some(x) = b.poll_transmit(t, &mut buf) {
            a.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
            moved = true;
        }
        for e in [&mut a, &mut b] {
            if e.poll_timeout().is_some_and(|d| d <= t) {
                e.handle_timeout(t);
                moved = true;
            }
        }
        while let Some(ev) = b.poll_event() {
            if let Event::Delivered { msg, .. } = ev {
                b.recycle(msg);
            }
        }
        if !moved && a.stats().sent_data > 0 && a.hot.iter().all(|(_, h)| !h.tx.busy()) {
            break;
        }
    }
    assert_eq!(b.stats().delivered_msgs, 2000);
    let idle_a = a.peer_bytes(pa);
    let idle_b = b.peer_bytes(pb);
    println!("cold peer {cold} B, idle sender {idle_a} B, idle receiver {idle_b} B");
    // 512 before the per-peer stats counters (PeerCounters: 14 u64, 112
    // bytes in the hot state) took the idle peer from 497 to 609 bytes.
    assert!(idle_a <= 640 && idle_b <= 640, "idle peer state: sender {idle_a} B, receiver {idle_b} B");
}

/// Found by `fuzz/rdm_engine`: an incarnation expected for a peer after
/// data already went to it unaddressed made the peer's first answer look
/// like a restart; the sender restarted its sequence numbers while the
/// peer (the same process) kept its receive state, so the next message was
/// taken for duplicates and lost, yet reported complete.
#[test]
fn late_expected_incarnation_loses_no_message() {
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: 200, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, mtu: 200, ..EngineConfig::default() });
    let pa = b.peer(crate::simnet::addr(0));
    let t = Instant::ZERO;
    let mut buf = vec![0u8; 65536];
    let mut pump = |a: &mut Engine, b: &mut Engine| {
        for _ in 0..8 {
            while let Some(x) = b.poll_transmit(t, &mut buf) {
                a.handle_datagram(t, crate::simnet::addr(1), &buf[..x.len]);
            }
            while let Some(x) = a.poll_transmit(t, &mut buf) {
                b.handle_datagram(t, crate::simnet::addr(0), &buf[..x.len]);
            }
        }
    };
    b.send(t, pa, &[&[1u8; 1000]], 1).unwrap();
    let mut first = vec![0u8; 2000];
    let n = b.poll_transmit(t, &mut first).unwrap().len;
    first.truncate(n);
    // The application now names an incarnation that is not a's.
    assert!(b.expect_incarnation(pa, 999));
    a.handle_datagram(t, crate::simnet::addr(1), &first);
    pump(&mut a, &mut b);
    b.send(t, pa, &[&[2u8; 1000]], 2).unwrap();
    pump(&mut a, &mut b);
    let mut got = Vec::new();
    while let Some(ev) = a.poll_event() {
        if let Event::Delivered { msg, .. } = ev {
            got.push(msg[0]);
        }
    }
    let mut completed = Vec::new();
    while let Some(ev) = b.poll_event() {
        if let Event::SendComplete { token } = ev {
            completed.push(token);
        }
    }
    assert_eq!(got, vec![1, 2], "both messages arrive");
    assert_eq!(completed, vec![1, 2]);
    // a is now heard from: the address naming another incarnation is refused.
    assert!(!b.expect_incarnation(pa, 999));
}

proptest! {
    #[test]
    fn decode_never_panics(bytes: Vec<u8>) {
        let _ = Header::decode(&bytes);
    }

    /// The reorder window against a model: whatever order (and duplication)
    /// the datagrams of a stream arrive in, the receiver delivers exactly the
    /// sent messages, once, in order; and its SACK bits always name exactly
    /// the buffered PSNs within 64 of the cumulative point.
    #[test]
    fn reorder_window_and_sack_bits_match_model(
        // At most 40 segments, inside the initial window: one transmit round.
        sizes in proptest::collection::vec(0usize..2800, 1..20),
        perm_seed: u64,
        dup_every in 2usize..9,
    ) {
        let mut a = Engine::new(EngineConfig { incarnation: 1, ..EngineConfig::default() });
        let mut b = Engine::new(EngineConfig { incarnation: 2, ..EngineConfig::default() });
        let pa = a.peer(crate::simnet::addr(1));
        let t = Instant::ZERO;
        let msgs: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| vec![i as u8; n]).collect();
        for (i, m) in msgs.iter().enumerate() {
            a.send(t, pa, &[m], i as u64).unwrap();
        }
        let mut buf = vec![0u8; 2000];
        let mut dgrams = Vec::new();
        while let Some(x) = a.poll_transmit(t, &mut buf) {
            dgrams.push(buf[..x.len].to_vec());
        }
        // A seeded shuffle plus duplicates.
        let mut rng = crate::rng::Rng::new(perm_seed);
        for i in (1..dgrams.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            dgrams.swap(i, j);
        }
        let dups: Vec<Vec<u8>> = dgrams.iter().step_by(dup_every).cloned().collect();
        dgrams.extend(dups);
        let mut got = Vec::new();
        for d in &dgrams {
            b.handle_datagram(t, crate::simnet::addr(0), d);
            // SACK bits vs the model: exactly the buffered PSNs in range.
            let hot = &b.hot[b.cold[0].hot().unwrap() as usize];
            let bits = hot.rx.sack_bits();
            for k in 1..=64u32 {
                let psn = hot.rx.rx_next.plus(k);
                prop_assert_eq!(bits & (1 << (k - 1)) != 0, hot.rx.ooo.contains_key(&psn.0));
            }
            while let Some(ev) = b.poll_event() {
                if let Event::Delivered { msg, .. } = ev {
                    got.push(msg);
                }
            }
        }
        prop_assert!(got == msgs, "delivered {} messages of {}, or out of order", got.len(), msgs.len());
    }

    /// Psn ordering agrees with i64 arithmetic within half the space.
    #[test]
    fn psn_order_matches_model(a: u32, d in -(1i64 << 30)..(1i64 << 30)) {
        let b = Psn(a).plus(d as i32 as u32);
        prop_assert_eq!(b.diff(Psn(a)) as i64, d);
        prop_assert_eq!(Psn(a).lt(b), d > 0);
    }
}
