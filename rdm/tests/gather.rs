//! Messages whose payload the device gathers from registered application
//! memory (`Engine::send_gather`, the windowed rendezvous push on RDMA
//! paths): rdm copies only the head; each datagram names its share of the
//! gathered memory under a checksum of the header alone; the receiver on a
//! registering path gets the whole message. Elsewhere rdm refuses the send,
//! and a receiver drops such datagrams from a peer whose path does not guard
//! payloads.
use rdm::device::LocalBuf;
use rdm::engine::{Engine, EngineConfig, Event, Header, PeerId, SendError, HEADER_LEN};
use rdm::{DevAddr, DeviceCaps, Instant};

const UD: DeviceCaps = DeviceCaps {
    reliable: false,
    ordered: false,
    mtu: 1048,
    remote_read: false,
    gso: false,
    registration: true,
    max_inline: 0,
    max_transmit: 1048,
};

fn addr(port: u16) -> DevAddr {
    DevAddr::Udp(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
}

fn pair(path: DeviceCaps) -> (Engine, Engine, PeerId, PeerId) {
    let mut a = Engine::new(EngineConfig { incarnation: 1, mtu: path.mtu, ..EngineConfig::default() });
    let mut b = Engine::new(EngineConfig { incarnation: 2, mtu: path.mtu, ..EngineConfig::default() });
    let pb = a.peer_with_path(addr(2), &path);
    let pa = b.peer_with_path(addr(1), &path);
    (a, b, pb, pa)
}

fn events(e: &mut Engine) -> Vec<Event> {
    std::iter::from_fn(|| e.poll_event()).collect()
}

#[test]
fn a_gathered_message_leaves_its_payload_to_the_device() {
    let (mut a, mut b, pb, pa) = pair(UD);
    let t = Instant::ZERO;
    let body: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    // SAFETY: `body` outlives the message (carried and completed below).
    let mem = unsafe { LocalBuf::new(body.as_ptr() as u64, body.len() as u64) }.with_key(0x77);
    a.send_gather(t, pb, b"HDR!", mem, 5).unwrap();
    let mut buf = vec![0u8; 9000];
    let (mut shares, mut wire) = (Vec::new(), Vec::new());
    while let Some(x) = a.poll_transmit(t, &mut buf) {
        let g = x.gather.expect("every datagram of the message gathers").buf;
        shares.push((g.addr() - body.as_ptr() as u64, g.len(), g.key(), x.len));
        let mut bytes = buf[..x.len].to_vec();
        // SAFETY: `body` is alive and unchanged until the end of this test.
        unsafe { g.append_to(&mut bytes) };
        assert!(Header::decode(&bytes).unwrap().0.header_sum);
        wire.push(bytes);
    }
    // 1000 payload bytes per datagram: the head and 996 gathered, then the rest.
    let h = HEADER_LEN;
    assert_eq!(
        shares,
        vec![
            (0, 996, Some(0x77), h + 4),
            (996, 1000, Some(0x77), h),
            (1996, 1000, Some(0x77), h),
            (2996, 4, Some(0x77), h)
        ]
    );
    for d in &wire {
        b.handle_datagram(t, addr(1), d);
    }
    let mut want = b"HDR!".to_vec();
    want.extend_from_slice(&body);
    assert_eq!(events(&mut b), vec![Event::Delivered { peer: pa, msg: want }]);
    while let Some(x) = b.poll_transmit(t, &mut buf) {
        a.handle_datagram(t, addr(2), &buf[..x.len]);
    }
    assert_eq!(events(&mut a), vec![Event::SendComplete { token: 5 }]);
    assert_eq!(a.stats().sent_data, 4);

    // No gathering where the path does not register.
    let (mut c, mut d, pd, _) = pair(DeviceCaps::datagram(1048));
    assert_eq!(c.send_gather(t, pd, b"x", mem, 6), Err(SendError::Unsupported));
    assert!(c.poll_transmit(t, &mut buf).is_none());
    // And a datagram under a header-only checksum is dropped from a peer on a
    // UDP path (nothing there guards its payload).
    d.handle_datagram(t, addr(1), &wire[0]);
    assert_eq!(d.stats().dropped_checksum, 1);
    assert!(events(&mut d).is_empty());
}

/// The wire bytes of a gathered transmit: the head rdm wrote, then the share
/// of `body` its gathered part names.
fn wire_bytes(head: &[u8], g: LocalBuf) -> Vec<u8> {
    let mut v = head.to_vec();
    // SAFETY: every `g` here names part of a `body` that lives, unchanged,
    // until the end of its test.
    unsafe { g.append_to(&mut v) };
    v
}

/// A gathered datagram the device did not take goes back to the engine
/// (`Engine::not_transmitted`), which writes it again while its message is
/// pending, and never once the message completed: the caller keeps no copy of
/// the application's address past the device call.
#[test]
fn a_gathered_datagram_given_back_is_formed_again_only_while_its_message_is_pending() {
    let (mut a, mut b, pb, _) = pair(UD);
    let t = Instant::ZERO;
    let body: Vec<u8> = (0..600u32).map(|i| (i * 3) as u8).collect();
    // SAFETY: `body` outlives the message (carried and completed below).
    let mem = unsafe { LocalBuf::new(body.as_ptr() as u64, body.len() as u64) }.with_key(0x77);
    a.send_gather(t, pb, b"HDR!", mem, 9).unwrap();
    let mut buf = vec![0u8; 9000];

    // Not taken: given back, then formed again, the same bytes.
    let x = a.poll_transmit(t, &mut buf).expect("the message's one datagram");
    let g = x.gather.expect("it gathers");
    let first = wire_bytes(&buf[..x.len], g.buf);
    a.not_transmitted(g);
    let again = a.poll_transmit(t, &mut buf).expect("formed again while pending");
    let g2 = again.gather.expect("it gathers");
    assert_eq!(g2, g, "the same segment, the same share of the memory");
    assert_eq!(wire_bytes(&buf[..again.len], g2.buf), first);
    assert!(a.poll_transmit(t, &mut buf).is_none(), "given back once, formed once");
    // A datagram that never left is no retransmission.
    assert_eq!((a.stats().sent_data, a.stats().retransmits), (1, 0), "one data packet sent, none resent");

    // Given back after it went (say a retransmission the device refused),
    // but acknowledged before the next poll: never formed again.
    a.not_transmitted(g2);
    b.handle_datagram(t, addr(1), &first);
    while let Some(y) = b.poll_transmit(t, &mut buf) {
        a.handle_datagram(t, addr(2), &buf[..y.len]);
    }
    assert_eq!(events(&mut a), vec![Event::SendComplete { token: 9 }]);
    while let Some(z) = a.poll_transmit(t, &mut buf) {
        assert!(z.gather.is_none(), "a completed message's memory was named again: {z:?}");
    }
}

/// Several gathered datagrams given back newest first (as the endpoint does)
/// are formed again oldest first, none counted as resent.
#[test]
fn gathered_datagrams_given_back_are_formed_again_in_order() {
    let (mut a, _b, pb, _) = pair(UD);
    let t = Instant::ZERO;
    let body: Vec<u8> = (0..3000u32).map(|i| (i * 5) as u8).collect();
    // SAFETY: `body` outlives the message (it is never completed here).
    let mem = unsafe { LocalBuf::new(body.as_ptr() as u64, body.len() as u64) }.with_key(0x77);
    a.send_gather(t, pb, b"HDR!", mem, 3).unwrap();
    let mut buf = vec![0u8; 9000];
    let shares: Vec<_> =
        std::iter::from_fn(|| a.poll_transmit(t, &mut buf)).map(|x| x.gather.expect("it gathers")).collect();
    assert!(shares.len() >= 3, "{} datagrams", shares.len());
    let sent = a.stats().sent_data;
    // The device took the first; the rest go back, newest first.
    for g in shares[1..].iter().rev() {
        a.not_transmitted(*g);
    }
    let again: Vec<_> =
        std::iter::from_fn(|| a.poll_transmit(t, &mut buf)).map(|x| x.gather.expect("it gathers")).collect();
    assert_eq!(again, shares[1..], "formed again, in order");
    assert_eq!((a.stats().sent_data, a.stats().retransmits), (sent, 0), "nothing counted twice or as resent");
}
