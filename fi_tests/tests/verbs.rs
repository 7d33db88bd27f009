//! The verbs UD device through libfabric's own tools, as users run them: two
//! `fi_pingpong` processes on the `verbs` domain (`-d verbs`), every size with
//! data checks, on one device (no rdmx variable) and between two (`rxe0` and
//! `rxe1` on the two ends of a veth pair in the VM, each process's device named
//! by `FI_RDMX_IFACE`, so datagrams leave one device and enter the other); the
//! latter under 5% loss on the wire (netem on `veth1`) and under rdmx's fault
//! decorator. Run in the Soft-RoCE VM by `scripts/test-verbs.sh`; on a host
//! without an RDMA device they pass saying so (see `verbs_device_present`).
use fi_tests::procs::{pingpong, text};
use fi_tests::*;

/// Each process on its own device (the VM's rxe0 and rxe1).
const SERVER_ON_RXE0: &[&str] = &["env", "FI_RDMX_IFACE=rxe0"];
const CLIENT_ON_RXE1: &[&str] = &["env", "FI_RDMX_IFACE=rxe1"];

fn two_devices_present() -> bool {
    let both = ["rxe0", "rxe1"].iter().all(|d| std::path::Path::new("/sys/class/infiniband").join(d).exists());
    if !both {
        assert!(
            std::env::var("RDMX_VERBS_REQUIRED").map_or(true, |v| v != "1"),
            "RDMX_VERBS_REQUIRED=1 and not both rxe0 and rxe1 are here"
        );
        eprintln!("skip: the two-device tests need rxe0 and rxe1 (the Soft-RoCE VM)");
    }
    both
}

fn checked_pingpong(args: &[&str], env: &[(&str, &str)]) {
    checked_pingpong_on(args, env, &[], &[]);
}

fn checked_pingpong_on(args: &[&str], env: &[(&str, &str)], server: &[&str], client: &[&str]) {
    let t0 = std::time::Instant::now();
    let (s, c) = pingpong(args, env, "127.0.0.1", server, client);
    let (st, ct) = (text(&s), text(&c));
    assert!(
        s.status.success() && c.status.success(),
        "fi_pingpong {args:?} {env:?} failed\nserver:\n{st}\nclient:\n{ct}"
    );
    // fi_pingpong -c verifies the data and prints one line of figures per size.
    assert!(ct.lines().any(|l| l.starts_with("bytes")), "no result lines:\n{ct}");
    println!("{}", ct.lines().filter(|l| !l.starts_with("libfabric:")).collect::<Vec<_>>().join("\n"));
    // (What each run costs in the VM: the budgets of scripts/test-verbs.sh.)
    println!("fi_pingpong {args:?} {env:?}: {:.1} s", t0.elapsed().as_secs_f64());
}

/// Every size with data checks on one device, tagged and untagged. The same
/// between two devices is `verbs_pulls_by_rdma_read_between_two_devices`
/// (which checks the stats as well: one run of it, not two).
#[test]
fn verbs_pingpong_every_size_with_data_checks_on_one_device() {
    if !verbs_device_present() {
        return;
    }
    init();
    checked_pingpong(&["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"], &[]);
    // Untagged sends differ from tagged ones above the device only (the
    // same engine, rendezvous and device calls: the msg path is checked on
    // udp and shm on the host); under emulation, where each -S all run costs
    // ~40 s, the tagged run alone stands for the device.
    if !vm_tcg() {
        checked_pingpong(&["-d", "verbs", "-S", "all", "-c", "-I", "10"], &[]);
    }
}

#[test]
fn verbs_pingpong_between_two_devices_under_wire_loss_and_injected_faults() {
    if !verbs_device_present() || !two_devices_present() {
        return;
    }
    init();
    // Round trips per size. Under emulation the large sizes take 10, not
    // 30: a 64 KiB message is 16 datagrams (or an RC read) each way and a
    // 1 MiB one 256, so at 5% loss 10 round trips still lose ~16 and ~260
    // packets to recover, where 30 cost a minute more; the small sizes keep
    // 30 (at 1-2 packets a trip, fewer could pass without a single loss).
    let iters = |size: &str| if vm_tcg() && size.parse::<usize>().unwrap() >= 65536 { "10" } else { "30" };
    {
        // Loss on both ends of the pair: each direction leaves through one.
        let _loss = (Netem::loss("veth0", 5), Netem::loss("veth1", 5));
        for size in ["8", "4096", "65536", "1048576"] {
            checked_pingpong_on(
                &["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", iters(size)],
                &[],
                SERVER_ON_RXE0,
                CLIENT_ON_RXE1,
            );
        }
    }
    let faults = [("FI_RDMX_FAULT_DROP", "5"), ("FI_RDMX_FAULT_DUP", "2"), ("FI_RDMX_FAULT_REORDER", "5")];
    for size in ["8", "65536", "1048576"] {
        checked_pingpong_on(
            &["-d", "verbs", "-m", "tagged", "-S", size, "-c", "-I", iters(size)],
            &faults,
            SERVER_ON_RXE0,
            CLIENT_ON_RXE1,
        );
    }
}

/// The value of `rdmx: <name> <n>` in one process's `FI_RDMX_STATS=1` output.
fn stat(out: &str, name: &str) -> u64 {
    let key = format!("rdmx: {name} ");
    out.lines()
        .find_map(|l| l.trim().strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{out}"))
}

/// A rendezvous on the verbs domain goes through the registration cache and
/// is pulled by RDMA read: fi_pingpong registers its buffers (`fi_mr_reg`,
/// which on the verbs domain is an `ibv_reg_mr` through the cache: a miss),
/// every 1 MiB message is announced with a key (the application's, from its
/// descriptor, so nothing more is looked up), the first message to each
/// peer is pushed by windows while the RC connection is made (the sender
/// pushes each chunk straight from the registered buffer: the NIC gathers it
/// behind its header, `rendezvous_pushes_gathered`), and the later ones are
/// read by the receiver through the connection (`rendezvous_pulled`). With
/// `FI_RDMX_RC_MAX_PEERS=0` no connection is made and every message is
/// pushed, gathered.
#[test]
fn verbs_rendezvous_moves_the_registration_cache_counters() {
    if !verbs_device_present() {
        return;
    }
    init();
    let (s, c) = pingpong(
        &["-d", "verbs", "-m", "tagged", "-S", "1048576", "-c", "-I", "20"],
        &[("FI_RDMX_STATS", "1")],
        "127.0.0.1",
        &[],
        &[],
    );
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        let (misses, cached) = (stat(out, "mr_cache_misses"), stat(out, "mr_cache_bytes_cached"));
        let keyed = stat(out, "rendezvous_registrations") + stat(out, "rendezvous_registrations_from_desc");
        let (pulled, windowed) = (stat(out, "rendezvous_pulled"), stat(out, "rendezvous_windowed"));
        println!("{who}: mr_cache_misses {misses}, mr_cache_bytes_cached {cached}, rendezvous keys {keyed}, pulled {pulled}, windowed {windowed}");
        assert!(
            misses >= 1 && cached >= 1 << 20,
            "{who}: the registration went around the cache (misses {misses}, {cached} bytes cached)"
        );
        assert!(keyed >= 20, "{who}: {keyed} keys announced for at least 20 rendezvous messages");
        assert!(pulled + windowed >= 20, "{who}: fewer than 20 rendezvous received");
        assert!(pulled >= 15, "{who}: {pulled} of {} rendezvous pulled by RDMA read", pulled + windowed);
        assert!(windowed >= 1, "{who}: the first message goes by windows while the connection is made");
        let (est, reads, failed) =
            (stat(out, "rc_connections_established"), stat(out, "rc_reads"), stat(out, "rc_read_failures"));
        println!(
            "{who}: rc_connections_established {est}, rc_reads {reads}, rc_read_failures {failed}, rc_read_bytes {}",
            stat(out, "rc_read_bytes")
        );
        assert_eq!(est, 1, "{who}: one connection to its one peer");
        assert!(reads >= pulled, "{who}: every pull was an RDMA read ({reads} reads, {pulled} pulled)");
        assert!(stat(out, "rc_read_bytes") >= pulled << 20, "{who}: a MiB read per pulled message");
    }
    let (s, c) = pingpong(
        &["-d", "verbs", "-m", "tagged", "-S", "1048576", "-c", "-I", "20"],
        &[("FI_RDMX_STATS", "1"), ("FI_RDMX_RC_MAX_PEERS", "0")],
        "127.0.0.1",
        &[],
        &[],
    );
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        assert_eq!(stat(out, "rendezvous_pulled"), 0, "{who}: no connection, no read");
        assert!(stat(out, "rendezvous_windowed") >= 20, "{who}: fewer than 20 windowed rendezvous received");
        // Each pushed chunk went from the registered buffer, gathered by
        // the NIC behind its header: at least one per message (-c checked
        // every byte).
        let gathered = stat(out, "rendezvous_pushes_gathered");
        println!("{who}: {gathered} pushed chunks gathered from the application's memory");
        assert!(gathered >= 20, "{who}: {gathered} chunks gathered for 20 windowed messages");
    }
}

/// Every size, every byte checked, between the two devices: sizes from the
/// pull threshold (64 KiB) up go by RDMA read through an RC connection
/// (the counters of both processes show pulls), the rest eagerly over UD.
#[test]
fn verbs_pulls_by_rdma_read_between_two_devices() {
    if !verbs_device_present() || !two_devices_present() {
        return;
    }
    init();
    let env = [("FI_RDMX_STATS", "1")];
    let (s, c) = pingpong(
        &["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"],
        &env,
        "127.0.0.1",
        SERVER_ON_RXE0,
        CLIENT_ON_RXE1,
    );
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        let (pulled, windowed) = (stat(out, "rendezvous_pulled"), stat(out, "rendezvous_windowed"));
        println!("{who}: pulled {pulled}, windowed {windowed}");
        assert!(pulled >= 10, "{who}: {pulled} rendezvous pulled by RDMA read, {windowed} windowed");
    }
}

/// Sealed job traffic over verbs UD (`docs/security.md`): a job secret
/// tags every datagram between the two devices; every size arrives intact,
/// both endpoints say their traffic was tagged, and long messages go by
/// windows pushed in sealed datagrams, never by an RDMA read (which the tag
/// would not cover).
#[test]
fn verbs_sealed_job_traffic_between_two_devices() {
    if !verbs_device_present() || !two_devices_present() {
        return;
    }
    init();
    let env = [("FI_RDMX_STATS", "1"), ("FI_RDMX_JOB_SECRET", "a job secret for the verbs VM")];
    let (s, c) = pingpong(
        &["-d", "verbs", "-m", "tagged", "-S", "all", "-c", "-I", "10"],
        &env,
        "127.0.0.1",
        SERVER_ON_RXE0,
        CLIENT_ON_RXE1,
    );
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        let (pulled, windowed) = (stat(out, "rendezvous_pulled"), stat(out, "rendezvous_windowed"));
        println!("{who}: pulled {pulled}, windowed {windowed}, dropped_auth {}", stat(out, "dropped_auth"));
        assert_eq!(stat(out, "job_traffic_sealed"), 1, "{who}: not tagged");
        assert_eq!(pulled, 0, "{who}: an RDMA read on a sealed path");
        assert!(windowed >= 10, "{who}: {windowed} rendezvous windowed");
        assert_eq!(stat(out, "dropped_auth"), 0, "{who}: a genuine datagram failed its tag");
    }
}

/// Runs the rest of the command in a new UTS namespace whose host name is
/// the next argument: another "host" for rdmx (its host id hashes the host
/// name), on the same kernel and the same rxe devices (which a network
/// namespace would not reach: rxe keeps its socket in the first one).
fn as_host(name: &str) -> Vec<String> {
    ["unshare", "-u", "sh", "-c", &format!("hostname {name} && exec \"$@\""), "sh"]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// With no rdmx variable, `fi_getinfo` offers `auto` first and the `verbs`
/// domain after it (on its own fabric), and an `auto` endpoint talks to a
/// peer on another host over UD and to one on its own host over shared
/// memory: the rxe devices' packet counters move for the first pair (by at
/// least a packet per message each way) and stay still for the second.
#[test]
fn verbs_auto_lists_the_verbs_domain_and_reaches_other_hosts_over_ud() {
    if !verbs_device_present() {
        return;
    }
    init();
    if std::env::var_os("FI_RDMX_DEVICE").is_none() {
        let info = getinfo(None, None, 0, Some(&Hints::rdm())).expect("fi_getinfo");
        let names: Vec<(String, String)> = info
            .iter()
            .map(|i| {
                (
                    Info::domain_name(i),
                    // SAFETY: a NUL-terminated string of an fi_info this test owns.
                    unsafe { std::ffi::CStr::from_ptr((*i.fabric_attr).name) }.to_string_lossy().into_owned(),
                )
            })
            .collect();
        let want = [("auto", "rdmx"), ("verbs", "rdmx-verbs")].map(|(d, f)| (d.to_string(), f.to_string()));
        assert_eq!(names, want, "auto first, then the verbs domain on its own fabric");
    }
    let iters = 200u64;
    let iters_s = iters.to_string();
    let args = ["-m", "tagged", "-S", "8", "-c", "-I", &iters_s];
    let (a, b) = (as_host("rdmx-host-a"), as_host("rdmx-host-b"));
    let (a, b): (Vec<&str>, Vec<&str>) =
        (a.iter().map(String::as_str).collect(), b.iter().map(String::as_str).collect());
    let before = rxe_packets_sent();
    checked_pingpong_on(&args, &[], &a, &b);
    let remote = rxe_packets_sent() - before;
    assert!(remote >= 2 * iters, "two hosts: {remote} RoCE packets for {iters} round trips; auto did not take UD");
    let before = rxe_packets_sent();
    checked_pingpong_on(&args, &[], &[], &[]);
    let local = rxe_packets_sent() - before;
    assert!(local < iters / 4, "one host: {local} RoCE packets for {iters} round trips; auto should use shm");
    println!("auto: {remote} RoCE packets between two hosts, {local} within one, for {iters} round trips");
    // Every size, data checked, between the two hosts; from 64 KiB up the
    // receiver reads by RDMA read (no variable but the stats printout).
    let (s, c) = pingpong(&["-S", "all", "-c", "-I", "10"], &[("FI_RDMX_STATS", "1")], "127.0.0.1", &a, &b);
    let (st, ct) = (text(&s), text(&c));
    assert!(s.status.success() && c.status.success(), "server:\n{st}\nclient:\n{ct}");
    for (who, out) in [("server", &st), ("client", &ct)] {
        let (pulled, windowed) = (stat(out, "rendezvous_pulled"), stat(out, "rendezvous_windowed"));
        println!("auto between two hosts, {who}: pulled {pulled}, windowed {windowed}");
        assert!(pulled >= 10, "{who}: auto between two hosts pulled {pulled} by RDMA read, windowed {windowed}");
    }
    // A verbs-only endpoint and an auto one reach each other over UD, both
    // ways, rendezvous pushes gathered from the sender's memory included.
    checked_pingpong_on(
        &["-m", "tagged", "-S", "1048576", "-c", "-I", "10"],
        &[],
        &["env", "FI_RDMX_DEVICE=verbs"],
        &[],
    );
}

/// `fork()` with registered memory: rdmx leaves it to the kernel (since 5.12
/// a fork copies the pinned pages of an anonymous mapping into the child up
/// front, so the parent keeps the pages the device uses; rdma-core then
/// reports fork support as unneeded). Here the parent has its buffers
/// registered (`fi_mr_reg`) and a 1 MiB rendezvous in flight; each round it
/// forks a child that waits 100 ms and then execs `/bin/true`. While the
/// child still shares the parent's memory, rdmx writes its registered
/// transmit buffers (each window of the push) and the device writes its
/// receive buffers: under a plain copy-on-write fork the parent's writes
/// would land on new pages the device never sends from. Every byte must
/// arrive right.
#[test]
fn verbs_a_child_that_execs_leaves_the_parents_transfers_intact() {
    if !verbs_device_present() {
        return;
    }
    init();
    let a = Stack::open(Some("verbs"), fi::FI_AV_MAP);
    let b = Stack::open(Some("verbs"), fi::FI_AV_MAP);
    let b_at_a = a.insert(&b.name());
    const LEN: usize = 1 << 20;
    let mut sbuf = vec![0u8; LEN];
    let mut rbuf = vec![0u8; LEN];
    let reg = |s: &Stack, buf: &mut [u8], access: u64| {
        let mut mr = std::ptr::null_mut();
        // SAFETY: an open domain; the buffer outlives the registration (closed below).
        let ret = unsafe {
            fi::fi_mr_reg(
                s.domain,
                buf.as_mut_ptr() as *const _,
                buf.len(),
                access,
                0,
                0,
                0,
                &mut mr,
                std::ptr::null_mut(),
            )
        };
        assert_eq!(ret, 0, "fi_mr_reg");
        mr
    };
    let (smr, rmr) = (reg(&a, &mut sbuf, fi::FI_SEND as u64), reg(&b, &mut rbuf, fi::FI_RECV as u64));
    let true_path = std::ffi::CString::new("/bin/true").unwrap();
    let argv = [true_path.as_ptr(), std::ptr::null()];
    for round in 0..10u8 {
        for (i, x) in sbuf.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(7).wrapping_add(round);
        }
        rbuf.fill(0xee);
        // SAFETY: libfabric calls on objects this test opened; the buffers outlive the operations (waited for below).
        unsafe {
            assert_eq!(
                fi::fi_trecv(
                    b.ep,
                    rbuf.as_mut_ptr() as *mut _,
                    LEN,
                    fi::fi_mr_desc(rmr),
                    FI_ADDR_UNSPEC,
                    9,
                    0,
                    std::ptr::null_mut()
                ),
                0
            );
            assert_eq!(
                fi::fi_tsend(
                    a.ep,
                    sbuf.as_ptr() as *const _,
                    LEN,
                    fi::fi_mr_desc(smr),
                    b_at_a,
                    9,
                    std::ptr::null_mut()
                ),
                0
            );
        }
        let pause = libc::timespec { tv_sec: 0, tv_nsec: 100_000_000 };
        // SAFETY: the child calls only nanosleep, execv and _exit
        // (async-signal-safe) with arguments prepared before the fork.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe {
                libc::nanosleep(&pause, std::ptr::null_mut());
                libc::execv(argv[0], argv.as_ptr());
                libc::_exit(127);
            }
        }
        assert!(pid > 0, "fork");
        b.wait_cq(&[&a]).expect("receive completion");
        a.wait_cq(&[&b]).expect("send completion");
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child did not exec /bin/true: {status:#x}"
        );
        if let Some(i) = (0..LEN).find(|&i| rbuf[i] != sbuf[i]) {
            panic!("round {round}: byte {i} is {:#x}, sent {:#x}", rbuf[i], sbuf[i]);
        }
    }
    // SAFETY: registrations opened above, no operation uses them now.
    unsafe {
        fi::fi_close(&mut (*smr).fid);
        fi::fi_close(&mut (*rmr).fid);
    }
}
