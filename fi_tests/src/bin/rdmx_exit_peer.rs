//! A process that is stopped by a signal whose handler calls `exit()` while it
//! and rdmx are busy (`fi_tests/tests/exit.rs`), as a job killed by its launcher
//! or a time limit is: MPI libraries and runtimes install such handlers.
//!
//! It opens an rdmx endpoint (domain from argv[1]), prints `ADDR <hex>`, reads
//! the peer's address from stdin and then exchanges 16 KiB tagged messages with
//! it without end: bursts of sends, receives and `fi_cq_read`, with pauses
//! between them long enough for rdmx's progress thread to take over (and then
//! contend with the application for the endpoint). Once the exchange is warm,
//! after argv[2] more milliseconds a thread of its own sends SIGUSR1 to the
//! main thread, wherever it is (often
//! inside `fi_cq_read` with the endpoint locked); the handler calls `exit(42)`,
//! which runs libfabric's destructor and rdmx's cleanup on that thread. The
//! process must end with status 42.
use fi_tests::*;
use std::io::BufRead;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2).map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0)).collect()
}

extern "C" fn exit_now(_sig: libc::c_int) {
    // SAFETY: exit() is what the handlers this test imitates call (not
    // async-signal-safe in general; that is the point of the test).
    unsafe { libc::exit(42) }
}

/// A small xorshift generator: the pauses differ from run to run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn main() {
    let domain = std::env::args().nth(1).unwrap_or_else(|| "udp".into());
    let after_ms: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(50);
    let s = Stack::open(Some(&domain), fi::FI_AV_MAP);
    println!("ADDR {}", hex(&s.name()));
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("peer address");
    let peer = s.insert(&unhex(line.trim()));

    // SAFETY: installs a handler for SIGUSR1 (a plain function).
    unsafe { libc::signal(libc::SIGUSR1, exit_now as *const () as libc::sighandler_t) };
    // SAFETY: gettid/getpid have no preconditions.
    let (pid, main_tid) = unsafe { (libc::getpid(), libc::gettid()) };
    // The signal comes only once the exchange runs in its steady state (after
    // WARM messages received), at a moment that differs from run to run.
    static RECEIVED: AtomicU64 = AtomicU64::new(0);
    const WARM: u64 = 200;
    std::thread::spawn(move || {
        while RECEIVED.load(Ordering::Relaxed) < WARM {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(after_ms));
        // SAFETY: signals this process's main thread, which runs until then.
        unsafe { libc::syscall(libc::SYS_tgkill, pid, main_tid, libc::SIGUSR1) };
        // If the handler's exit() never ends the process, the test sees it
        // run on and fails it; nothing here ends it instead.
    });

    let mut rng = Rng(u64::from(pid as u32) << 17 | 0x9e37_79b9);
    // Messages circulate as tokens: each side starts with TOKENS sends and
    // answers every message it receives with one, so at most 2 * TOKENS are
    // ever on their way to one side, which always has that many receives
    // posted. Nothing arrives unexpected: the exchange allocates nothing once
    // warm, so the signal never interrupts rdmx inside malloc (exit() would
    // then deadlock in any library's destructor that frees memory, libfabric's
    // own among them: the application's hazard, not what this test is about).
    const LEN: usize = 16 << 10;
    const TOKENS: usize = 4;
    const DEPTH: usize = 2 * TOKENS;
    let mut rx: Vec<Vec<u8>> = (0..DEPTH).map(|_| vec![0u8; LEN]).collect();
    let tx = vec![0x5au8; LEN];
    for b in rx.iter_mut() {
        // SAFETY: the buffers live until the process exits.
        unsafe { fi::fi_trecv(s.ep, b.as_mut_ptr() as *mut _, LEN, null_mut(), FI_ADDR_UNSPEC, 1, 0, null_mut()) };
    }
    let mut owed = TOKENS;
    let mut next_rx = 0usize;
    loop {
        // A burst of calls (the endpoint is locked most of the time), then a
        // pause longer than the 2 ms after which rdmx's progress thread takes
        // over: it then waits for the endpoint lock while the next burst holds
        // it, the moment the exit hang of a progress-thread join needs.
        let burst = Duration::from_micros(200 + rng.below(1300));
        let t = Instant::now();
        while t.elapsed() < burst {
            while owed > 0 {
                // SAFETY: `tx` lives until the process exits.
                let r = unsafe { fi::fi_tsend(s.ep, tx.as_ptr() as *const _, LEN, null_mut(), peer, 1, null_mut()) };
                if r != 0 {
                    break;
                }
                owed -= 1;
            }
            let mut e = [fi::fi_cq_tagged_entry::default(); 8];
            // SAFETY: `e` holds 8 entries of the CQ's (tagged) format.
            let n = unsafe { fi::fi_cq_read(s.cq, e.as_mut_ptr() as *mut _, e.len()) };
            if n == -(fi::FI_EAVAIL as isize) {
                // The peer ended first: its sends fail; keep going until our
                // own signal comes.
                let mut err = fi::fi_cq_err_entry::default();
                // SAFETY: reads one error entry into `err`.
                unsafe { fi::fi_cq_readerr(s.cq, &mut err, 0) };
            }
            for c in e.iter().take(n.max(0) as usize) {
                if c.flags & fi::FI_RECV as u64 != 0 {
                    let b = &mut rx[next_rx % DEPTH];
                    next_rx += 1;
                    // SAFETY: as above.
                    unsafe {
                        fi::fi_trecv(s.ep, b.as_mut_ptr() as *mut _, LEN, null_mut(), FI_ADDR_UNSPEC, 1, 0, null_mut())
                    };
                    owed += 1;
                    RECEIVED.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // A pause without calling rdmx: its progress thread takes over.
        let pause = Duration::from_micros(2200 + rng.below(1500));
        let t = Instant::now();
        while t.elapsed() < pause {
            std::hint::spin_loop();
        }
    }
}
