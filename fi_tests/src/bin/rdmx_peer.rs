//! A second process for two-process semantic tests (`fi_tests/tests/two_process.rs`).
//!
//! It opens an rdmx endpoint (domain from argv[1], default `udp`) with MSG,
//! TAGGED, RMA and ATOMIC, registers a 64 KiB window with remote read/write
//! access, and prints `ADDR <hex> KEY <key> BASE <window address>`. It then reads
//! the parent's address (hex) from stdin, inserts it, and echoes every tagged
//! message back with the same tag, remote CQ data + 1 and the payload reversed,
//! until a message with tag 0xDEAD arrives. It never links rdmx: it uses the
//! system libfabric with FI_PROVIDER_PATH like any application.
use fi_tests::*;
use std::io::BufRead;
use std::ptr::null_mut;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
}

fn main() {
    let domain = std::env::args().nth(1).unwrap_or_else(|| "udp".into());
    let s = Stack::open_caps(
        Some(&domain),
        fi::FI_AV_MAP,
        fi::FI_RMA as u64 | fi::FI_ATOMIC as u64 | fi::FI_DIRECTED_RECV,
        0,
    );
    let mut window = vec![0u8; 65536];
    let mut mr = null_mut();
    let access = (fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let ret = unsafe {
        fi::fi_mr_reg(s.domain, window.as_mut_ptr() as *const _, window.len(), access, 0, 0x77, 0, &mut mr, null_mut())
    };
    assert_eq!(ret, 0);
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    let key = unsafe { fi::fi_mr_key(mr) };
    println!("ADDR {} KEY {key} BASE {}", hex(&s.name()), window.as_ptr() as u64);
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("parent address");
    let parent = s.insert(&unhex(line.trim()));
    let mut buf = vec![0u8; 4 << 20];
    loop {
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let ret = unsafe {
            fi::fi_trecv(
                s.ep,
                buf.as_mut_ptr() as *mut _,
                buf.len(),
                null_mut(),
                FI_ADDR_UNSPEC,
                0,
                u64::MAX,
                null_mut(),
            )
        };
        assert_eq!(ret, 0);
        let c = loop {
            match s.wait_cq(&[]) {
                Ok(c) if c.flags & fi::FI_RECV as u64 != 0 => break c,
                Ok(_) => continue,
                Err(e) => panic!("peer: error completion {}", e.err),
            }
        };
        let mut reply: Vec<u8> = buf[..c.len].to_vec();
        reply.reverse();
        // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
        let ret = unsafe {
            fi::fi_tsenddata(
                s.ep,
                reply.as_ptr() as *const _,
                reply.len(),
                null_mut(),
                c.data.wrapping_add(1),
                parent,
                c.tag,
                null_mut(),
            )
        };
        assert_eq!(ret, 0);
        loop {
            match s.wait_cq(&[]) {
                Ok(x) if x.flags & fi::FI_SEND as u64 != 0 => break,
                Ok(_) => continue,
                Err(e) => {
                    // The parent is gone or unreachable (fault tests cut links):
                    // say so and stop, as an application would.
                    eprintln!("peer: send error {}; exiting", e.err);
                    std::process::exit(1);
                }
            }
        }
        if c.tag == 0xDEAD {
            break;
        }
    }
    // The window must still hold what the parent wrote.
    println!("WINDOW {}", hex(&window[..16]));
    // SAFETY: a libfabric call on objects this test opened and still holds; every buffer passed outlives the call (and, for posted operations, their completion).
    unsafe { assert_eq!(fi::fi_close(&mut (*mr).fid), 0) };
}
