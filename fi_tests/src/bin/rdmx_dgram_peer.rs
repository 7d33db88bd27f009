//! A second process for the `FI_EP_DGRAM` tests (`fi_tests/tests/dgram.rs`).
//!
//! It opens an rdmx DGRAM endpoint (domain from argv[1], default `udp`), prints
//! `ADDR <hex> MAX <max_msg_size>`, reads the parent's address (hex) from stdin
//! and inserts it, then obeys one command per line:
//!
//! - `drain <ms>`: drives progress for `ms` milliseconds with no receive posted
//!   (whatever arrives meanwhile must be dropped), then prints `DRAINED`;
//! - `echo <ms>`: posts one receive, prints `POSTED`, waits up to `ms` for a
//!   datagram and sends it back unchanged (`ECHO <len>`), or cancels the
//!   receive (`NONE`);
//! - `quit`: closes everything and exits.
//!
//! It uses only the system libfabric with FI_PROVIDER_PATH, like any application.
use fi_tests::*;
use std::io::{BufRead, Write};
use std::ptr::null_mut;
use std::time::{Duration, Instant};

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
}

fn main() {
    let domain = std::env::args().nth(1).unwrap_or_else(|| "udp".into());
    let info = getinfo(None, None, 0, Some(&Hints::dgram(Some(&domain)))).expect("DGRAM fi_getinfo");
    let s = Stack::open_with(info, fi::FI_AV_MAP, 0);
    // SAFETY: the ep_attr of an fi_info this program owns.
    let max = unsafe { (*s.info.first().ep_attr).max_msg_size };
    println!("ADDR {} MAX {max}", s.name().iter().map(|x| format!("{x:02x}")).collect::<String>());
    let _ = std::io::stdout().flush();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let parent = s.insert(&unhex(lines.next().and_then(|l| l.ok()).unwrap_or_default().trim()));
    let mut buf = vec![0u8; max];
    let mut ctx = 0u64;
    for line in lines {
        let line = line.unwrap_or_default();
        let mut f = line.split_whitespace();
        let cmd = f.next().unwrap_or("");
        let ms: u64 = f.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        match cmd {
            "drain" => {
                let end = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < end {
                    // SAFETY: a libfabric call on objects this program opened; a zero-count read only progresses.
                    unsafe { fi::fi_cq_read(s.cq, null_mut(), 0) };
                }
                println!("DRAINED");
            }
            "echo" => {
                let c = &mut ctx as *mut u64 as *mut libc::c_void;
                assert_eq!(
                    // SAFETY: `buf` outlives the receive (it completes or is canceled below).
                    unsafe { fi::fi_recv(s.ep, buf.as_mut_ptr() as *mut _, max, null_mut(), FI_ADDR_UNSPEC, c) },
                    0
                );
                println!("POSTED");
                let _ = std::io::stdout().flush();
                match s.poll_cq(Duration::from_millis(ms)) {
                    Some(Ok(e)) => {
                        // SAFETY: `buf` holds the received bytes and outlives the send's completion, awaited below.
                        let r = unsafe { fi::fi_send(s.ep, buf.as_ptr() as *const _, e.len, null_mut(), parent, c) };
                        assert_eq!(r, 0, "echo send");
                        let sent = s.wait_cq(&[]).expect("echo send completion");
                        assert_ne!(sent.flags & fi::FI_SEND as u64, 0);
                        println!("ECHO {}", e.len);
                    }
                    Some(Err(e)) => println!("ERR {}", e.err),
                    None => {
                        // SAFETY: cancels the receive posted above with context `c`.
                        assert_eq!(unsafe { fi::fi_cancel(&mut (*s.ep).fid, c) }, 0);
                        let e = s.wait_cq(&[]).expect_err("the canceled receive's error entry");
                        assert_eq!(e.err, fi::FI_ECANCELED as i32);
                        println!("NONE");
                    }
                }
            }
            "quit" => break,
            _ => println!("UNKNOWN {line}"),
        }
        let _ = std::io::stdout().flush();
    }
}
