//! A sender for fault tests (`fi_tests/tests/faults.rs`): opens an rdmx endpoint
//! (domain argv[1], default `auto`), prints `ADDR <hex>`, reads one line of
//! peers' addresses (hex, separated by spaces) from stdin,
//! posts `count` (argv[2]) tagged sends of `size` bytes (argv[3]), send `i` to
//! peer `i % peers`, and
//! reports every completion as it comes:
//! `OK <i> <ms>` or `ERR <i> <ms> <errno> <fi_cq_strerror text>`, with the
//! milliseconds since the sends were posted; `DONE` at the end. With argv[4]
//! `echoes` it also takes in what `rdmx_peer` echoes back (a receive per
//! send, not reported), so that a peer that lives goes on receiving; without
//! it, a peer's first echo waits unmatched. It uses only
//! the system libfabric, like any application.
use fi_tests::*;
use std::io::{BufRead, Write};
use std::ptr::null_mut;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
}

/// Contexts of the echo receives start here.
const ECHO: u64 = 1 << 32;

fn main() {
    let mut args = std::env::args().skip(1);
    let domain = args.next().unwrap_or_else(|| "auto".into());
    let count: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(8);
    let size: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(4 << 20);
    let echoes = args.next().is_some_and(|a| a == "echoes");
    let s = Stack::open(Some(&domain), fi::FI_AV_MAP);
    println!("ADDR {}", s.name().iter().map(|x| format!("{x:02x}")).collect::<String>());
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("peer address");
    let peers: Vec<_> = line.split_whitespace().map(|a| s.insert(&unhex(a))).collect();
    assert!(!peers.is_empty(), "no peer address");
    let bufs: Vec<Vec<u8>> = (0..count).map(|i| vec![i as u8; size]).collect();
    let mut contexts: Vec<u64> = (0..count as u64).collect();
    // Receives for the echoes, their contexts past the sends'.
    let mut echo_bufs: Vec<Vec<u8>> = if echoes { (0..count).map(|_| vec![0u8; size]).collect() } else { Vec::new() };
    let mut echo_contexts: Vec<u64> = (0..echo_bufs.len() as u64).map(|i| ECHO + i).collect();
    for (b, c) in echo_bufs.iter_mut().zip(echo_contexts.iter_mut()) {
        // SAFETY: a libfabric call on objects this test opened and still holds; the buffer and context outlive the receive (the program ends with them).
        let r = unsafe {
            fi::fi_trecv(
                s.ep,
                b.as_mut_ptr() as *mut _,
                b.len(),
                null_mut(),
                FI_ADDR_UNSPEC,
                0x77,
                0,
                c as *mut u64 as *mut libc::c_void,
            )
        };
        assert_eq!(r, 0, "fi_trecv");
    }
    let t0 = std::time::Instant::now();
    for (i, b) in bufs.iter().enumerate() {
        let ctx = &mut contexts[i] as *mut u64 as *mut libc::c_void;
        loop {
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            let r = unsafe {
                fi::fi_tsend(s.ep, b.as_ptr() as *const _, b.len(), null_mut(), peers[i % peers.len()], 0x77, ctx)
            };
            if r == 0 {
                break;
            }
            assert_eq!(r, -(fi::FI_EAGAIN as isize), "fi_tsend");
            // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
            unsafe { fi::fi_cq_read(s.cq, null_mut(), 0) };
        }
    }
    println!("SENT {count}");
    let mut out = std::io::stdout();
    let _ = out.flush();
    let mut left = count;
    while left > 0 {
        let mut e = fi::fi_cq_tagged_entry::default();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let n = unsafe { fi::fi_cq_read(s.cq, &mut e as *mut _ as *mut _, 1) };
        let ms = t0.elapsed().as_millis();
        if n == 1 {
            // SAFETY: the context points at a u64 this program passed with the operation and still owns.
            let i = unsafe { *(e.op_context as *const u64) };
            if i >= ECHO {
                continue;
            }
            println!("OK {i} {ms}");
            left -= 1;
        } else if n == -(fi::FI_EAVAIL as isize) {
            let mut err = fi::fi_cq_err_entry::default();
            // SAFETY: a NUL-terminated string libfabric (or the test) owns and keeps alive here.
            assert_eq!(unsafe { fi::fi_cq_readerr(s.cq, &mut err, 0) }, 1);
            // SAFETY: a NUL-terminated string libfabric (or the test) owns and keeps alive here.
            let text = unsafe {
                std::ffi::CStr::from_ptr(fi::fi_cq_strerror(s.cq, err.prov_errno, err.err_data, null_mut(), 0))
            };
            // SAFETY: the context points at a u64 this program passed with the operation and still owns.
            let i = if err.op_context.is_null() { u64::MAX } else { unsafe { *(err.op_context as *const u64) } };
            if i != u64::MAX && i >= ECHO {
                // An echo that broke off (its peer died): not a send.
                continue;
            }
            println!("ERR {i} {ms} {} {}", err.err, text.to_string_lossy());
            left -= 1;
        } else {
            assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let _ = out.flush();
    }
    println!("DONE");
}
