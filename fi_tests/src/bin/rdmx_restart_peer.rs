//! A receiver at a fixed UDP port, for the restart test
//! (`fi_tests/tests/restart.rs`): opens an rdmx endpoint on `domain` (argv[1])
//! bound to 127.0.0.1:`port` (argv[2], `FI_SOURCE`), prints `ADDR <hex>`, then
//! receives tagged messages from anyone and prints `GOT <tag> <len>` for each
//! until tag 0xDEAD arrives. It never links rdmx: it uses the system libfabric
//! with FI_PROVIDER_PATH like any application.
use fi_tests::*;
use std::io::Write;
use std::ptr::null_mut;

fn main() {
    let domain = std::env::args().nth(1).expect("domain");
    let port = std::env::args().nth(2).expect("port");
    let mut h = Hints::rdm();
    h.set_domain_name(&domain);
    let info = getinfo(Some("127.0.0.1"), Some(&port), fi::FI_SOURCE, Some(&h)).expect("fi_getinfo at the port");
    let s = Stack::open_with(info, fi::FI_AV_MAP, 0);
    let hex: String = s.name().iter().map(|x| format!("{x:02x}")).collect();
    println!("ADDR {hex}");
    std::io::stdout().flush().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: a libfabric call on objects this program opened and still holds; `buf` outlives the receive.
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
                Err(e) => panic!("restart peer: error completion {}", e.err),
            }
        };
        println!("GOT {:x} {}", c.tag, c.len);
        std::io::stdout().flush().unwrap();
        if c.tag == 0xDEAD {
            break;
        }
    }
}
