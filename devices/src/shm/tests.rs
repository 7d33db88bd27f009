//! Unit tests of the shared-memory device and its ring: the ring against a
//! `VecDeque` model and under concurrent producers, and the device's remote
//! reads from an endpoint that closed. Out of line so that `mod.rs` holds the
//! device alone; the loom models of the ring are beside it, in `ring.rs`.
//!
//! Unsafe here: rings built on heap buffers, and the destination buffers of posted reads.
#![allow(unsafe_code)]

use super::*;
use proptest::prelude::*;
use rdm::device::DeviceExt;
use rdm::device::LocalBuf;
use std::collections::VecDeque;

/// A ring in a heap buffer (8-byte aligned).
struct HeapRing {
    _buf: Vec<u64>,
    ring: Ring,
}

fn heap_ring(slots: usize, mtu: usize) -> HeapRing {
    let len = segment_size(slots, mtu);
    let mut buf = vec![0u64; len / 8 + 1];
    // SAFETY: the buffer is 8-aligned, `len` bytes long, and lives in HeapRing
    // beside the Ring.
    let ring = unsafe { Ring::init(buf.as_mut_ptr() as *mut u8, len, slots, mtu, 1, 2) };
    HeapRing { _buf: buf, ring }
}

#[derive(Debug, Clone)]
enum Op {
    Push(Vec<u8>),
    Pop,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(Op::Push),
        2 => Just(Op::Pop),
    ]
}

proptest! {
    /// The ring behaves like a bounded VecDeque.
    #[test]
    fn ring_matches_vecdeque(ops in proptest::collection::vec(op(), 0..300), slots_log in 1u32..5) {
        let slots = 1usize << slots_log;
        let r = heap_ring(slots, 32);
        let mut model: VecDeque<Vec<u8>> = VecDeque::new();
        for op in ops {
            match op {
                Op::Push(mut d) => {
                    d.truncate(32);
                    let ok = r.ring.try_push(7, 9, &d);
                    prop_assert_eq!(ok, model.len() < slots);
                    if ok { model.push_back(d); }
                }
                Op::Pop => {
                    let mut got = None;
                    let ok = r.ring.pop(&mut |pid, ring, data| {
                        assert_eq!((pid, ring), (7, 9));
                        got = Some(data.to_vec());
                    });
                    prop_assert_eq!(ok, !model.is_empty());
                    prop_assert_eq!(got, model.pop_front());
                }
            }
            prop_assert_eq!(r.ring.ready(), !model.is_empty());
        }
    }
}

#[test]
fn concurrent_producers_keep_per_sender_order() {
    let r = heap_ring(64, 16);
    const PER: u32 = 20_000;
    const PRODUCERS: u32 = 3;
    let ring = &r.ring;
    struct Shared<'a>(&'a Ring);
    // SAFETY: test-only: Ring's operations are thread-safe by construction
    // (atomics; one consumer, the main thread).
    unsafe impl Sync for Shared<'_> {}
    let shared = Shared(ring);
    let shared = &shared;
    std::thread::scope(|s| {
        for p in 0..PRODUCERS {
            s.spawn(move || {
                for i in 0..PER {
                    let mut b = [0u8; 8];
                    b[..4].copy_from_slice(&p.to_le_bytes());
                    b[4..].copy_from_slice(&i.to_le_bytes());
                    while !shared.0.try_push(p, 0, &b) {
                        std::thread::yield_now();
                    }
                }
            });
        }
        let mut next = [0u32; PRODUCERS as usize];
        let mut total = 0;
        while total < PER * PRODUCERS {
            let ok = shared.0.pop(&mut |pid, _, d| {
                let p = u32::from_le_bytes(d[..4].try_into().unwrap());
                let i = u32::from_le_bytes(d[4..].try_into().unwrap());
                assert_eq!(p, pid);
                assert_eq!(i, next[p as usize], "per-producer FIFO order");
                next[p as usize] += 1;
            });
            if ok {
                total += 1;
            } else {
                std::thread::yield_now();
            }
        }
    });
}

/// One posted read of all of `src` (a buffer of this process, read
/// through `process_vm_readv` as any other's) into `dst`, from the
/// endpoint `from`: what completed.
fn read_all(r: &mut ShmDevice, id: u64, from: DevAddr, src: &[u8], dst: &mut [u8]) -> ReadDone {
    let run = ReadRun {
        remote_addr: src.as_ptr() as u64,
        remote_key: None,
        // SAFETY: `dst` outlives the read, which completes before post_read
        // returns (shm reads synchronously), and nothing else touches it.
        local: unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, dst.len() as u64) },
    };
    r.post_read(rdm::time::Instant::ZERO, id, from, &[run]).unwrap();
    r.poll_read(rdm::time::Instant::ZERO).unwrap()
}

/// fi_endpoint(3): after fi_close(ep) returns, the provider touches the
/// endpoint's buffers no more. The sender's process lives on (its memory
/// stays readable), yet a read of its buffer after its device dropped
/// fails, whether or not the reader had its ring mapped (it sent to it
/// first, or never).
#[test]
fn a_read_from_an_endpoint_that_closed_fails_while_its_process_lives() {
    let mut r = ShmDevice::new().unwrap();
    if !r.caps().remote_read {
        eprintln!("SKIP: process_vm_readv unavailable here");
        return;
    }
    let src: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    for mapped in [false, true] {
        let s = ShmDevice::new().unwrap();
        let from = s.local_addr();
        if mapped {
            assert_eq!(r.send_batch(Instant::ZERO, &[TxDatagram::new(from, b"x")]).unwrap(), 1);
        }
        let mut dst = vec![0u8; src.len()];
        let done = read_all(&mut r, 1, from, &src, &mut dst);
        assert!(done.error.is_none(), "mapped {mapped}: open sender: {:?}", done.error);
        assert_eq!((done.id, done.bytes), (1, src.len() as u64));
        assert!(dst == src);
        if !mapped {
            // The read above mapped the ring: unmap it, so that the read
            // below must find the ring (its file is gone by then).
            let DevAddr::Shm(a) = from else { unreachable!() };
            r.forget_peer(&a);
        }
        let before = r.stats.reads_after_close;
        drop(s);
        let done = read_all(&mut r, 2, from, &src, &mut dst);
        assert_eq!(done.id, 2);
        assert!(
            matches!(done.error, Some(DeviceError::Unreachable(a)) if a == from),
            "mapped {mapped}: {:?}",
            done.error
        );
        assert_eq!(r.stats.reads_after_close, before + 1);
    }
    // Our own endpoint is readable (it is open while we run).
    let own = r.local_addr();
    let mut dst = vec![0u8; 100];
    assert!(read_all(&mut r, 3, own, &src[..100], &mut dst).error.is_none());
}

/// The check after the copy: a sender that closes while the copy runs
/// (here: its flag set after the copy, as its drop would) fails the read.
#[test]
fn a_close_during_the_copy_is_seen_after_it() {
    let mut r = ShmDevice::new().unwrap();
    if !r.caps().remote_read {
        eprintln!("SKIP: process_vm_readv unavailable here");
        return;
    }
    let s = ShmDevice::new().unwrap();
    let DevAddr::Shm(a) = s.local_addr() else { unreachable!() };
    r.peer(&a).unwrap();
    let src = vec![7u8; 4096];
    let mut dst = vec![0u8; 4096];
    let run = ReadRun {
        remote_addr: src.as_ptr() as u64,
        remote_key: None,
        // SAFETY: `dst` outlives the synchronous copy and nothing else touches it.
        local: unsafe { LocalBuf::new(dst.as_mut_ptr() as u64, 4096) },
    };
    assert!(matches!(r.copy_runs(s.local_addr(), &[run]), Ok((4096, None))));
    assert!(!r.sender_closed(&a), "an open sender");
    s.seg.ring.header().closed.store(1, Ordering::SeqCst);
    assert!(r.sender_closed(&a), "a sender that closed during the copy");
}

#[test]
fn attach_rejects_garbage() {
    let mut buf = vec![0u64; 1024];
    // SAFETY: an 8 KiB aligned heap buffer that outlives the call.
    assert!(unsafe { Ring::attach(buf.as_mut_ptr() as *mut u8, 8192) }.is_err());
    let r = heap_ring(4, 64);
    let len = segment_size(4, 64);
    // SAFETY: as above; the ring's buffer outlives the attached view.
    let view = unsafe { Ring::attach(r.ring.base, len) }.unwrap();
    assert_eq!((view.slots, view.mtu), (4, 64));
    // SAFETY: as above, but claims fewer bytes than the geometry needs.
    assert!(unsafe { Ring::attach(r.ring.base, len - 1) }.is_err());
}

/// An idle device's quiet rounds count toward its liveness checks: a
/// progress round that asks [`Device::quiet`] first, and polls only when
/// told to, still polls (and so checks its peers) once every
/// `LIVENESS_EVERY` rounds, and a datagram waiting is never called quiet.
#[test]
fn quiet_rounds_keep_the_liveness_schedule_and_never_hide_input() {
    let mut a = ShmDevice::new().expect("shm device");
    let mut b = ShmDevice::new().expect("shm device");
    let round = |d: &mut ShmDevice| -> Option<usize> {
        if d.quiet() {
            return None;
        }
        let got = d.recv_batch(64, &mut |_, _| {}).unwrap();
        while d.poll_unreachable().is_some() {}
        Some(got)
    };
    let rounds = LIVENESS_EVERY as usize * 3;
    let polled: Vec<usize> = (0..rounds).filter_map(|_| round(&mut b)).collect();
    assert_eq!(polled, [0, 0, 0], "one polled round in LIVENESS_EVERY, finding nothing");
    let dst = b.local_addr();
    for i in 0..3 * LIVENESS_EVERY as usize / 2 {
        assert_eq!(a.send_batch(rdm::Instant::from_nanos(0), &[TxDatagram::new(dst, &[i as u8; 8])]).unwrap(), 1);
        assert!(!b.quiet(), "round {i}: a datagram waits, yet the device says it is quiet");
        assert_eq!(round(&mut b), Some(1));
    }
    // Rounds skipped on the input probe's word, as an endpoint's idle polls
    // skip them (the rounds `quiet_rounds` allows, reported before the next
    // round asks): the same schedule, one polled round in LIVENESS_EVERY, and
    // never a skip past a waiting datagram.
    let probe = b.input_probe().expect("shm has an input probe");
    let (mut budget, mut skipped, mut polled) = (0u32, 0u32, Vec::new());
    for i in 0..rounds {
        if i % 1000 == 999 {
            assert_eq!(a.send_batch(rdm::Instant::from_nanos(0), &[TxDatagram::new(dst, &[1; 8])]).unwrap(), 1);
        }
        if budget > 0 && !probe.may_have_input() {
            budget -= 1;
            skipped += 1;
            continue;
        }
        b.rounds_skipped(std::mem::take(&mut skipped));
        if let Some(got) = round(&mut b) {
            polled.push(got);
        }
        budget = b.quiet_rounds();
    }
    let received: usize = polled.iter().sum();
    assert_eq!(received, rounds / 1000, "every datagram received: {polled:?}");
    assert_eq!(polled.iter().filter(|&&n| n == 0).count(), 3, "one empty poll in LIVENESS_EVERY: {polled:?}");
    // A peer found dead and not yet reported is not quiet either.
    let gone = a.local_addr();
    b.dead.push_back(gone);
    assert!(!b.quiet(), "a dead peer waits to be reported, yet the device says it is quiet");
    assert_eq!(b.poll_unreachable(), Some(gone));
}
