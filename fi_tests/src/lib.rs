//! Helpers for tests that drive rdmx only through the system `libfabric.so`.
//!
//! Nothing here links rdmx: the tests point `FI_PROVIDER_PATH` at the directory
//! holding the freshly built `librdmx-fi.so` (`RDMX_PROVIDER_DIR`, set by
//! `scripts/test.sh`; default `build-out/lib` of the workspace) and select it with
//! `FI_PROVIDER=rdmx`, exactly as an application would.

pub mod attack;
pub mod hosts;
pub mod impi;
pub mod jobs;
pub mod procs;
pub mod stats_docs;
pub mod watchdog;

pub use libfabric_sys as fi;
use std::ffi::CString;
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::Once;

pub const API: u32 = fi::fi_version_num(1, 17);
pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

/// Directory holding librdmx-fi.so.
pub fn provider_dir() -> PathBuf {
    let dir = std::env::var_os("RDMX_PROVIDER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build-out/lib"));
    assert!(
        dir.join("librdmx-fi.so").exists(),
        "{}/librdmx-fi.so is missing: run scripts/build.sh (or scripts/test.sh) first",
        dir.display()
    );
    dir
}

static INIT: Once = Once::new();

/// Points libfabric at rdmx. Must run before the first libfabric call of the
/// process; every test calls it first.
pub fn init() {
    watchdog::watch_this_test();
    INIT.call_once(|| {
        let dir = provider_dir();
        // SAFETY: called once, before any thread of this test binary calls into
        // libfabric (every test calls init() first, serialised by the Once).
        unsafe {
            std::env::set_var("FI_PROVIDER_PATH", &dir);
            std::env::set_var("FI_PROVIDER", "rdmx");
        }
        check_expected_libfabric();
    });
}

/// The running libfabric's API version (`fi_version()`).
pub fn running_fi_version() -> u32 {
    // SAFETY: fi_version takes no argument and returns a constant.
    unsafe { fi::fi_version() }
}

/// The libfabric version a test stage says it loads (`RDMX_EXPECT_FI_VERSION=2.1`,
/// set by `scripts/test.sh` and `scripts/test-libfabric2.sh` for each stage), as
/// `fi_version_num(major, minor)`; `None` when unset.
pub fn expected_fi_version() -> Option<u32> {
    let v = std::env::var("RDMX_EXPECT_FI_VERSION").ok()?;
    let (major, minor) = v.trim().split_once('.').unwrap_or_else(|| panic!("RDMX_EXPECT_FI_VERSION={v}: not M.m"));
    Some(fi::fi_version_num(
        major.parse().unwrap_or_else(|_| panic!("RDMX_EXPECT_FI_VERSION={v}: not M.m")),
        minor.parse().unwrap_or_else(|_| panic!("RDMX_EXPECT_FI_VERSION={v}: not M.m")),
    ))
}

/// Fails the test when the stage names the libfabric it means to test and
/// another one loaded (a missed `LD_LIBRARY_PATH` or rpath would otherwise run
/// a 2.x stage on Debian 12's 1.17 and pass having tested nothing of 2.x).
pub fn check_expected_libfabric() {
    if let Some(want) = expected_fi_version() {
        let have = running_fi_version();
        assert_eq!(
            (have >> 16, have & 0xffff),
            (want >> 16, want & 0xffff),
            "this stage expects libfabric {}.{} (RDMX_EXPECT_FI_VERSION) but {}.{} is loaded: check LD_LIBRARY_PATH",
            want >> 16,
            want & 0xffff,
            have >> 16,
            have & 0xffff
        );
    }
}

/// A test that cannot run here (a tool is missing) says so and returns; under
/// `CI=true` (as `.ci/run` sets) that is a failure instead, so that CI never
/// passes by skipping.
pub fn skip(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true and this test cannot run: {reason}");
    }
    eprintln!("SKIP: {reason}");
}

/// A tag no other run on this machine uses: this process's id and a counter,
/// `<pid in hex>n<counter>` (at most 9 characters until the counter passes
/// 99, so `rx<tag>a` still fits an interface name's 15). Namespaces, interfaces
/// and files a test creates are named with it, so that two runs (or two tests
/// of one binary, run in parallel) never share one, and a teardown removes
/// only what its own run made.
pub fn unique_tag() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!("{:x}n{}", std::process::id(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// Environment for child processes (fi_pingpong, fi_info, MPI programs).
pub fn child_env() -> Vec<(String, String)> {
    vec![("FI_PROVIDER_PATH".into(), provider_dir().display().to_string()), ("FI_PROVIDER".into(), "rdmx".into())]
}

/// An owned `fi_info` list (freed with fi_freeinfo).
pub struct Info(pub *mut fi::fi_info);

impl Info {
    pub fn first(&self) -> &fi::fi_info {
        // SAFETY: the list fi_getinfo returned is non-null (getinfo returns Err otherwise) and lives as long as `self`.
        unsafe { &*self.0 }
    }
    pub fn iter(&self) -> impl Iterator<Item = &fi::fi_info> {
        let mut cur = self.0;
        std::iter::from_fn(move || {
            if cur.is_null() {
                return None;
            }
            // SAFETY: `cur` is a non-null element of the list `self` owns.
            let i = unsafe { &*cur };
            cur = i.next;
            Some(i)
        })
    }
    pub fn domain_name(i: &fi::fi_info) -> String {
        // SAFETY: every fi_info from fi_getinfo has a domain_attr with a NUL-terminated name.
        unsafe { std::ffi::CStr::from_ptr((*i.domain_attr).name) }.to_string_lossy().into_owned()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: the list came from fi_getinfo and is freed once, here.
        unsafe { fi::fi_freeinfo(self.0) };
    }
}

/// Fresh hints (fi_allocinfo) that the closure may edit, freed afterwards.
pub struct Hints(pub *mut fi::fi_info);

impl Hints {
    pub fn new() -> Hints {
        // SAFETY: fi_dupinfo(NULL) allocates fresh hints (checked non-null below).
        let h = unsafe { fi::fi_dupinfo(std::ptr::null()) };
        assert!(!h.is_null());
        Hints(h)
    }
    pub fn rdm() -> Hints {
        let h = Hints::new();
        // SAFETY: the hints from fi_dupinfo have their attribute structs allocated.
        unsafe {
            (*(*h.0).ep_attr).type_ = fi::FI_EP_RDM;
            (*h.0).caps = (fi::FI_MSG | fi::FI_TAGGED) as u64;
        }
        h
    }
    /// `FI_EP_DGRAM` with `FI_MSG`, on the named domain if any.
    pub fn dgram(domain_name: Option<&str>) -> Hints {
        let mut h = Hints::new();
        h.ep().type_ = fi::FI_EP_DGRAM;
        h.get().caps = fi::FI_MSG as u64;
        if let Some(d) = domain_name {
            h.set_domain_name(d);
        }
        h
    }
    pub fn get(&mut self) -> &mut fi::fi_info {
        // SAFETY: fi_dupinfo's hints, owned by `self`.
        unsafe { &mut *self.0 }
    }
    pub fn ep(&mut self) -> &mut fi::fi_ep_attr {
        // SAFETY: fi_dupinfo allocates ep_attr with the hints.
        unsafe { &mut *(*self.0).ep_attr }
    }
    pub fn dom(&mut self) -> &mut fi::fi_domain_attr {
        // SAFETY: fi_dupinfo allocates domain_attr with the hints.
        unsafe { &mut *(*self.0).domain_attr }
    }
    pub fn fab(&mut self) -> &mut fi::fi_fabric_attr {
        // SAFETY: fi_dupinfo allocates fabric_attr with the hints.
        unsafe { &mut *(*self.0).fabric_attr }
    }
    pub fn tx(&mut self) -> &mut fi::fi_tx_attr {
        // SAFETY: fi_dupinfo allocates tx_attr with the hints.
        unsafe { &mut *(*self.0).tx_attr }
    }
    pub fn rx(&mut self) -> &mut fi::fi_rx_attr {
        // SAFETY: fi_dupinfo allocates rx_attr with the hints.
        unsafe { &mut *(*self.0).rx_attr }
    }
    /// Sets a string field the way applications do (strdup, freed by fi_freeinfo).
    pub fn set_domain_name(&mut self, name: &str) {
        let c = CString::new(name).unwrap();
        // SAFETY: `c` is a valid C string; fi_freeinfo frees the copy.
        self.dom().name = unsafe { libc::strdup(c.as_ptr()) };
    }
    pub fn set_fabric_name(&mut self, name: &str) {
        let c = CString::new(name).unwrap();
        // SAFETY: `c` is a valid C string; fi_freeinfo frees the copy.
        self.fab().name = unsafe { libc::strdup(c.as_ptr()) };
    }
}

impl Default for Hints {
    fn default() -> Self {
        Hints::new()
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        // SAFETY: the hints came from fi_dupinfo and are freed once, here.
        unsafe { fi::fi_freeinfo(self.0) };
    }
}

/// fi_getinfo; Err(negative errno).
pub fn getinfo(node: Option<&str>, service: Option<&str>, flags: u64, hints: Option<&Hints>) -> Result<Info, i32> {
    init();
    let node = node.map(|s| CString::new(s).unwrap());
    let service = service.map(|s| CString::new(s).unwrap());
    let mut out: *mut fi::fi_info = null_mut();
    // SAFETY: the strings and hints outlive the call; `out` is written by it.
    let ret = unsafe {
        fi::fi_getinfo(
            API,
            node.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            service.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            hints.map_or(std::ptr::null(), |h| h.0 as *const _),
            &mut out,
        )
    };
    if ret != 0 {
        return Err(ret);
    }
    Ok(Info(out))
}

pub fn neg(e: u32) -> i32 {
    -(e as i32)
}

/// The rdmx objects of one endpoint, opened in the usual order.
pub struct Stack {
    pub info: Info,
    pub fabric: *mut fi::fid_fabric,
    pub domain: *mut fi::fid_domain,
    pub av: *mut fi::fid_av,
    pub cq: *mut fi::fid_cq,
    pub ep: *mut fi::fid_ep,
    /// An EQ bound to the endpoint ([`Stack::open_with_eq`]), else null.
    pub eq: *mut fi::fid_eq,
}

impl Stack {
    /// Opens fabric, domain, AV (`av_type`), one CQ (tagged format) for both
    /// directions, and an enabled endpoint.
    pub fn open(domain_name: Option<&str>, av_type: fi::fi_av_type) -> Stack {
        Stack::open_caps(domain_name, av_type, fi::FI_DIRECTED_RECV, 0)
    }

    /// Like [`Stack::open`] with extra capabilities and a hinted mr_mode.
    pub fn open_caps(domain_name: Option<&str>, av_type: fi::fi_av_type, caps: u64, mr_mode: i32) -> Stack {
        let mut h = Hints::rdm();
        if let Some(d) = domain_name {
            h.set_domain_name(d);
        }
        h.get().caps |= caps;
        h.dom().mr_mode = mr_mode;
        let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
        Stack::open_with(info, av_type, 0)
    }

    pub fn open_with(info: Info, av_type: fi::fi_av_type, cq_bind_flags: u64) -> Stack {
        let cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, size: 128, ..Default::default() };
        Stack::open_with_cq(info, av_type, cq_bind_flags, cq_attr)
    }

    /// Like [`Stack::open`] with an EQ (`FI_WAIT_UNSPEC`) bound to the endpoint.
    pub fn open_with_eq(domain_name: Option<&str>, av_type: fi::fi_av_type) -> Stack {
        let mut h = Hints::rdm();
        if let Some(d) = domain_name {
            h.set_domain_name(d);
        }
        h.get().caps |= fi::FI_DIRECTED_RECV;
        let info = getinfo(None, None, 0, Some(&h)).expect("fi_getinfo");
        let cq_attr = fi::fi_cq_attr { format: fi::FI_CQ_FORMAT_TAGGED, size: 128, ..Default::default() };
        Stack::open_full(info, av_type, 0, cq_attr, true)
    }

    /// Like [`Stack::open_with`] with the CQ opened from `cq_attr` (a wait object).
    pub fn open_with_cq(info: Info, av_type: fi::fi_av_type, cq_bind_flags: u64, cq_attr: fi::fi_cq_attr) -> Stack {
        Stack::open_full(info, av_type, cq_bind_flags, cq_attr, false)
    }

    fn open_full(
        info: Info,
        av_type: fi::fi_av_type,
        cq_bind_flags: u64,
        mut cq_attr: fi::fi_cq_attr,
        with_eq: bool,
    ) -> Stack {
        // SAFETY: libfabric calls on objects opened here in order, each from the one before; every attr and out-pointer outlives its call.
        unsafe {
            let mut fabric = null_mut();
            assert_eq!(fi::fi_fabric((*info.0).fabric_attr, &mut fabric, null_mut()), 0);
            let mut domain = null_mut();
            assert_eq!(fi::fi_domain(fabric, info.0, &mut domain, null_mut()), 0);
            let mut av_attr = fi::fi_av_attr { type_: av_type, ..Default::default() };
            let mut av = null_mut();
            assert_eq!(fi::fi_av_open(domain, &mut av_attr, &mut av, null_mut()), 0);
            let mut cq = null_mut();
            assert_eq!(fi::fi_cq_open(domain, &mut cq_attr, &mut cq, null_mut()), 0);
            let mut ep = null_mut();
            assert_eq!(fi::fi_endpoint(domain, info.0, &mut ep, null_mut()), 0);
            assert_eq!(fi::fi_ep_bind(ep, &mut (*av).fid, 0), 0);
            assert_eq!(fi::fi_ep_bind(ep, &mut (*cq).fid, (fi::FI_TRANSMIT | fi::FI_RECV) as u64 | cq_bind_flags), 0);
            let mut eq = null_mut();
            if with_eq {
                let mut eq_attr = fi::fi_eq_attr { size: 16, wait_obj: fi::FI_WAIT_UNSPEC, ..Default::default() };
                assert_eq!(fi::fi_eq_open(fabric, &mut eq_attr, &mut eq, null_mut()), 0);
                assert_eq!(fi::fi_ep_bind(ep, &mut (*eq).fid, 0), 0);
            }
            assert_eq!(fi::fi_enable(ep), 0);
            Stack { info, fabric, domain, av, cq, ep, eq }
        }
    }

    /// The endpoint's address as `fi_av_straddr` writes it (`rdmx://...`, the
    /// `endpoint` of its stats documents).
    pub fn uri(&self) -> String {
        let name = self.name();
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: the AV is open; `name` is one address from fi_getname, `buf` holds `len` bytes.
        let p = unsafe { fi::fi_av_straddr(self.av, name.as_ptr() as *const _, buf.as_mut_ptr() as *mut _, &mut len) };
        assert!(!p.is_null(), "fi_av_straddr");
        String::from_utf8_lossy(&buf[..len.min(buf.len())]).trim_end_matches('\0').to_string()
    }

    pub fn name(&self) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let mut len = buf.len();
        // SAFETY: the endpoint is open; `buf` holds `len` bytes.
        let ret = unsafe { fi::fi_getname(&mut (*self.ep).fid, buf.as_mut_ptr() as *mut _, &mut len) };
        assert_eq!(ret, 0);
        buf.truncate(len);
        buf
    }

    pub fn insert(&self, addr: &[u8]) -> u64 {
        let mut fa = 0u64;
        // SAFETY: the AV is open; `addr` is one address of the length fi_getname gave.
        let n = unsafe { fi::fi_av_insert(self.av, addr.as_ptr() as *const _, 1, &mut fa, 0, null_mut()) };
        assert_eq!(n, 1, "fi_av_insert");
        fa
    }

    /// FI_PEEK on this endpoint until a message tagged `tag` is there (held
    /// unexpected), progressing `others` meanwhile; returns its length. The
    /// event tests wait on instead of a sleep: a peek that finds nothing answers
    /// `FI_ENOMSG`, and the test asks again, up to `limit` (then it fails,
    /// saying what never arrived).
    pub fn peek_tagged(&self, tag: u64, others: &[&Stack], limit: std::time::Duration) -> usize {
        let deadline = std::time::Instant::now() + limit;
        let mut ctx = 0u64;
        loop {
            let msg = fi::fi_msg_tagged {
                msg_iov: std::ptr::null(),
                desc: null_mut(),
                iov_count: 0,
                addr: FI_ADDR_UNSPEC,
                tag,
                ignore: 0,
                context: &mut ctx as *mut _ as *mut _,
                data: 0,
            };
            // SAFETY: the endpoint is open; `msg` and `ctx` outlive the call (a
            // peek completes before it returns or at the CQ read below).
            unsafe { assert_eq!(fi::fi_trecvmsg(self.ep, &msg, fi::FI_PEEK as u64), 0) };
            match self.wait_cq(others) {
                Ok(c) => {
                    assert_eq!(c.tag, tag, "peek");
                    return c.len;
                }
                Err(e) => assert_eq!(e.err, fi::FI_ENOMSG as i32, "peek"),
            }
            // Not there yet: let the sender (maybe another process) run.
            std::thread::sleep(std::time::Duration::from_millis(1));
            assert!(
                std::time::Instant::now() < deadline,
                "no message tagged {tag:#x} arrived within {limit:?} (FI_PEEK)"
            );
        }
    }

    /// Reads one completion within `limit`: `None` if none came (no panic, for
    /// tests where nothing must arrive).
    pub fn poll_cq(&self, limit: std::time::Duration) -> Option<Result<fi::fi_cq_tagged_entry, fi::fi_cq_err_entry>> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let mut e = fi::fi_cq_tagged_entry::default();
            // SAFETY: the CQ is open and has the tagged format; `e` is one entry.
            let n = unsafe { fi::fi_cq_read(self.cq, &mut e as *mut _ as *mut _, 1) };
            if n == 1 {
                return Some(Ok(e));
            }
            if n == -(fi::FI_EAVAIL as isize) {
                let mut err = fi::fi_cq_err_entry::default();
                // SAFETY: one error entry into `err`.
                let r = unsafe { fi::fi_cq_readerr(self.cq, &mut err, 0) };
                assert_eq!(r, 1);
                return Some(Err(err));
            }
            assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
            if std::time::Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Reads one completion, driving progress of `others` too (so two endpoints
    /// in one process both move). Err(FI_EAVAIL) returns the error entry.
    pub fn wait_cq(&self, others: &[&Stack]) -> Result<fi::fi_cq_tagged_entry, fi::fi_cq_err_entry> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let mut e = fi::fi_cq_tagged_entry::default();
            // SAFETY: the CQ is open and has the tagged format; `e` is one entry.
            let n = unsafe { fi::fi_cq_read(self.cq, &mut e as *mut _ as *mut _, 1) };
            if n == 1 {
                return Ok(e);
            }
            if n == -(fi::FI_EAVAIL as isize) {
                let mut err = fi::fi_cq_err_entry::default();
                // SAFETY: one error entry into `err`.
                let r = unsafe { fi::fi_cq_readerr(self.cq, &mut err, 0) };
                assert_eq!(r, 1);
                return Err(err);
            }
            assert_eq!(n, -(fi::FI_EAGAIN as isize), "fi_cq_read");
            for o in others {
                // SAFETY: a zero-count read only drives progress.
                unsafe { fi::fi_cq_read(o.cq, null_mut(), 0) };
            }
            assert!(std::time::Instant::now() < deadline, "no completion within 20 s");
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: closes each object this stack opened, once, children before parents.
        unsafe {
            assert_eq!(fi::fi_close(&mut (*self.ep).fid), 0);
            if !self.eq.is_null() {
                assert_eq!(fi::fi_close(&mut (*self.eq).fid), 0);
            }
            assert_eq!(fi::fi_close(&mut (*self.av).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.cq).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.domain).fid), 0);
            assert_eq!(fi::fi_close(&mut (*self.fabric).fid), 0);
        }
    }
}

/// Whether an RDMA device is here for the verbs tests. They run in the
/// Soft-RoCE VM (`scripts/test-verbs.sh` sets `RDMX_VERBS_REQUIRED=1`, and then
/// a missing device fails the test); elsewhere they say so and pass, even
/// under `CI=true`: the host has no RDMA device by design, the VM run is the
/// one CI counts.
pub fn verbs_device_present() -> bool {
    let present = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if !present {
        assert!(
            std::env::var("RDMX_VERBS_REQUIRED").map_or(true, |v| v != "1"),
            "RDMX_VERBS_REQUIRED=1 and no RDMA device in /sys/class/infiniband"
        );
        eprintln!("skip: no RDMA device (the verbs tests run in the Soft-RoCE VM: scripts/test-verbs.sh)");
    }
    present
}

/// Whether this runs in the Soft-RoCE VM under software emulation (qemu TCG,
/// where no usable KVM is: `scripts/rxe-vm.sh` then sets `RDMX_VM_TCG=1`),
/// where everything runs about ten times slower than under KVM. Verbs tests
/// there scale their iterations and sizes down where what they prove
/// survives; each says why its smaller figure still proves it.
pub fn vm_tcg() -> bool {
    std::env::var("RDMX_VM_TCG").is_ok_and(|v| v == "1")
}

/// netem on a device for the life of the guard.
pub struct Netem(&'static str);

impl Netem {
    pub fn loss(dev: &'static str, pct: u32) -> Netem {
        let st = std::process::Command::new("tc")
            .args(["qdisc", "add", "dev", dev, "root", "netem", "loss", &format!("{pct}%")])
            .status()
            .expect("tc");
        assert!(st.success(), "tc qdisc add dev {dev} root netem loss {pct}% failed (sch_netem missing?)");
        Netem(dev)
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tc").args(["qdisc", "del", "dev", self.0, "root"]).status();
    }
}

/// RoCE packets sent by every rxe device of the VM, summed (hardware
/// counters: what went through a verbs device, whoever sent it).
pub fn rxe_packets_sent() -> u64 {
    let Ok(devs) = std::fs::read_dir("/sys/class/infiniband") else { return 0 };
    devs.filter_map(Result::ok)
        .filter_map(|d| std::fs::read_to_string(d.path().join("ports/1/hw_counters/sent_pkts")).ok())
        .filter_map(|s| s.trim().parse::<u64>().ok())
        .sum()
}

/// The counter names fi_rdmx(7) lists in the `.TP` tags of its RUNTIME STATS
/// section (`\f[CR]name\f[R], \f[CR]other\f[R]`; `\f[CR]`, not `\f[C]`,
/// which groff 1.23 cannot select on a terminal): what `FI_RDMX_STATS=1`
/// prints, `endpoint` included.
pub fn documented_stats() -> std::collections::BTreeSet<String> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fi_rdmx.7")).expect("docs/fi_rdmx.7");
    let start = page.find(".SH RUNTIME STATS\n").expect("RUNTIME STATS section");
    let sec = &page[start + 1..];
    let sec = &sec[..sec.find("\n.SH ").unwrap_or(sec.len())];
    let mut names = std::collections::BTreeSet::new();
    let mut lines = sec.lines();
    while let Some(l) = lines.next() {
        if l == ".TP" {
            for part in lines.next().unwrap_or_default().split(", ") {
                let n =
                    part.trim().trim_start_matches("\\f[CR]").trim_start_matches("\\f[C]").trim_end_matches("\\f[R]");
                names.insert(n.replace("\\-", "-"));
            }
        }
    }
    names
}

/// Every rank's OFI mtl selected rdmx: with `mtl_ofi_verbose 1` each rank
/// prints the provider it chose once, `<file>:<line>: mtl:ofi:prov: <name>`
/// (OpenMPI 4.1, `select_ofi_provider`; 5 says `mtl:ofi:provider: <name>`,
/// as tests/mpi_wheels.rs asserts). The bare string "rdmx" is no proof:
/// `mtl_ofi_provider_include = "rdmx"`, `FI_PROVIDER_PATH` and rdmx's own
/// log lines contain it whichever provider carried the job.
pub fn assert_mtl_chose_rdmx(out: &str, np: usize) {
    let chosen: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(": mtl:ofi:prov: ").or_else(|| l.split_once(": mtl:ofi:provider: ")))
        .map(|(_, name)| name.trim())
        .collect();
    assert_eq!(chosen, vec!["rdmx"; np], "want each of the {np} ranks' mtl to report rdmx as its provider:\n{out}");
}

/// Intel MPI chose rdmx: with `I_MPI_DEBUG=5` its rank 0 prints
/// `libfabric provider: <name>`.
pub fn assert_impi_chose_rdmx(out: &str) {
    let chosen: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("libfabric provider: "))
        .filter_map(|(_, rest)| rest.split_whitespace().next())
        .collect();
    assert!(
        !chosen.is_empty() && chosen.iter().all(|n| *n == "rdmx"),
        "want Intel MPI to report rdmx as its libfabric provider:\n{out}"
    );
}
