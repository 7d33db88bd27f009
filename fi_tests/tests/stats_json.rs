//! `FI_RDMX_STATS=<path>`: the JSON documents of real two-process fi_pingpong
//! runs over udp and shm, with sizes that go eagerly and by rendezvous, match
//! the schema fi_rdmx(7) documents (RUNTIME STATS, "JSON documents": every
//! field present with its type, none undocumented), and their per-peer counters agree with
//! each other, with the endpoint's counters and with the other process's.
//! And `SIGUSR1` makes a running process write a document before it closes.
use fi_tests::procs::{self, text};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// fi_rdmx(7)'s schema: field path -> type.
fn documented() -> BTreeMap<String, String> {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/fi_rdmx.7")).expect("docs/fi_rdmx.7");
    let fields = schema_of(&page);
    assert!(fields.len() > 20, "schema list not found in fi_rdmx(7): {fields:?}");
    fields
}

/// The fields of the man page's `.SS JSON documents` (up to the next section):
/// each a bullet `.IP \(bu 2` followed by `\f[CR]<path>\f[R] (<type>): meaning`.
fn schema_of(page: &str) -> BTreeMap<String, String> {
    let start = page.find(".SS JSON documents\n").expect("fi_rdmx(7) has no JSON documents subsection");
    let sec = &page[start + 1..];
    let sec = &sec[..sec.find("\n.S").unwrap_or(sec.len())];
    let mut fields = BTreeMap::new();
    let mut lines = sec.lines();
    while let Some(l) = lines.next() {
        if !l.starts_with(".IP ") {
            continue;
        }
        let item = lines.next().unwrap_or_default();
        let rest = item.strip_prefix("\\f[CR]").unwrap_or_else(|| panic!("a schema bullet without a field: {item}"));
        let (path, rest) =
            rest.split_once("\\f[R] (").unwrap_or_else(|| panic!("a schema bullet without a type: {item}"));
        let (ty, _) = rest.split_once("):").unwrap_or_else(|| panic!("a schema bullet without a type: {item}"));
        fields.insert(path.to_string(), ty.to_string());
    }
    fields
}

#[test]
fn schema_parser_reads_the_man_pages_bullets() {
    let page = ".SS JSON documents\n.PP\ntext \\f[CR]x\\f[R]\n.IP \\(bu 2\n\\f[CR]pid\\f[R] (integer): process id\n.IP \\(bu 2\n\\f[CR]peers[].srtt_us\\f[R] (number or null): smoothed\n.SH NEXT\n.IP \\(bu 2\n\\f[CR]other\\f[R] (string): x\n";
    let s = schema_of(page);
    assert_eq!(
        s.into_iter().collect::<Vec<_>>(),
        vec![("peers[].srtt_us".to_string(), "number or null".to_string()), ("pid".to_string(), "integer".to_string())]
    );
}

/// The counter names fi_rdmx(7) lists under RUNTIME STATS (what
/// `FI_RDMX_STATS=1` prints), without `endpoint`.
fn documented_counters() -> BTreeSet<String> {
    let mut names = fi_tests::documented_stats();
    names.remove("endpoint");
    names
}

fn type_ok(ty: &str, v: &Value) -> bool {
    match ty {
        "integer" => v.is_u64(),
        "number" => v.is_number(),
        "number or null" => v.is_number() || v.is_null(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => panic!("fi_rdmx(7)'s schema uses an unknown type {other:?}"),
    }
}

/// Every field of `v` as (documented path, value): `counters.<name>` is
/// `counters.*`, array elements are `name[]`.
fn flatten<'a>(v: &'a Value, prefix: &str, out: &mut Vec<(String, &'a Value)>) {
    if let Value::Object(m) = v {
        for (k, x) in m {
            let path = if prefix.is_empty() {
                k.clone()
            } else if prefix == "counters" {
                "counters.*".to_string()
            } else {
                format!("{prefix}.{k}")
            };
            out.push((path.clone(), x));
            match x {
                Value::Array(a) => {
                    for e in a {
                        flatten(e, &format!("{path}[]"), out);
                    }
                }
                Value::Object(_) => flatten(x, &path, out),
                _ => {}
            }
        }
    }
}

/// Checks one document against the schema; returns the documented paths it had.
fn check_schema(doc: &Value, schema: &BTreeMap<String, String>, counters: &BTreeSet<String>) -> BTreeSet<String> {
    let mut fields = Vec::new();
    flatten(doc, "", &mut fields);
    let mut seen = BTreeSet::new();
    for (path, v) in fields {
        let ty = schema.get(&path).unwrap_or_else(|| panic!("undocumented field {path} = {v} in {doc}"));
        assert!(type_ok(ty, v), "{path} should be {ty}, is {v}");
        seen.insert(path);
    }
    let names: BTreeSet<String> = doc["counters"].as_object().expect("counters").keys().cloned().collect();
    assert_eq!(&names, counters, "the JSON counters are not the ones fi_rdmx(7) lists");
    seen
}

/// One JSON document per line (a last line still being written left out).
fn read_docs(path: &std::path::Path) -> Vec<Value> {
    fi_tests::stats_docs::documents(path)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rdmx-stats-json-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn json_stats_of_a_real_pingpong_match_the_schema_and_each_other() {
    let schema = documented();
    let counters = documented_counters();
    assert!(counters.contains("packets_sent") && counters.contains("mr_cache_hits"), "{counters:?}");
    for device in ["udp", "shm"] {
        fi_tests::init();
        // Both processes append to one file (no %p): JSON Lines from two writers.
        let path = tmp(&format!("{device}.jsonl"));
        let p = path.display().to_string();
        // Every size fi_pingpong knows (1 B to 8 MiB with -S all): eager below
        // the thresholds, rendezvous above (pulled on shm, windowed on udp).
        let (s, c) =
            procs::pingpong(&["-d", device, "-I", "5", "-S", "all"], &[("FI_RDMX_STATS", &p)], "127.0.0.1", &[], &[]);
        assert!(c.status.success() && s.status.success(), "fi_pingpong on {device}:\n{}\n{}", text(&c), text(&s));
        assert!(!text(&s).contains("rdmx: packets_sent"), "a path must not print the text lines");
        let docs = read_docs(&path);
        assert_eq!(docs.len(), 2, "one document per endpoint at close, two processes: {docs:?}");
        let pids: BTreeSet<u64> = docs.iter().map(|d| u(&d["pid"])).collect();
        assert_eq!(pids.len(), 2, "two writers");
        let mut seen = BTreeSet::new();
        for d in &docs {
            seen.extend(check_schema(d, &schema, &counters));
            assert_eq!(d["reason"], "close");
            assert_eq!(u(&d["rdmx_stats"]), 1);
            assert!(d["endpoint"].as_str().unwrap().starts_with("rdmx://"), "{}", d["endpoint"]);
            let peers = d["peers"].as_array().unwrap();
            assert_eq!(peers.len(), 1, "fi_pingpong has one peer: {d}");
            let peer = &peers[0];
            let prefix = format!("{device}:");
            assert!(
                peer["address"].as_str().unwrap().starts_with(&prefix),
                "{device} peer address: {}",
                peer["address"]
            );
            let sent = &peer["sent"];
            let recv = &peer["received"];
            for (what, mb) in [
                ("sent eager", &sent["eager"]),
                ("sent rendezvous", &sent["rendezvous"]),
                ("received eager", &recv["eager"]),
            ] {
                assert!(u(&mb["messages"]) > 0, "{device}: no {what} message counted: {peer}");
                assert!(u(&mb["bytes"]) >= u(&mb["messages"]), "{device}: {what} bytes < messages: {peer}");
            }
            // Every message of the run is counted once, by its protocol.
            let c = &d["counters"];
            assert_eq!(u(&sent["eager"]["messages"]), u(&c["eager_sent"]), "{device}: {d}");
            assert_eq!(u(&sent["rendezvous"]["messages"]), u(&c["rendezvous_sent"]), "{device}: {d}");
            assert_eq!(u(&recv["rendezvous_pulled"]["messages"]), u(&c["rendezvous_pulled"]), "{device}: {d}");
            assert_eq!(u(&recv["rendezvous_windowed"]["messages"]), u(&c["rendezvous_windowed"]), "{device}: {d}");
            assert_eq!(u(&peer["retransmits"]), u(&c["packets_resent"]), "one peer: all resends are its: {d}");
            assert!(u(&d["unexpected_bytes_max"]) >= u(&c["unexpected_bytes"]));
            match device {
                "udp" => {
                    // No remote reads over UDP: long messages are pushed in windows.
                    assert_eq!(u(&recv["rendezvous_pulled"]["messages"]), 0, "{peer}");
                    assert!(u(&recv["rendezvous_windowed"]["messages"]) > 0, "{peer}");
                    let srtt =
                        peer["srtt_us"].as_f64().unwrap_or_else(|| panic!("udp peer without an RTT sample: {peer}"));
                    assert!(srtt > 0.0 && srtt < 1e6, "srtt {srtt} us");
                    assert!(peer["cwnd"].as_f64().unwrap() >= 1.0, "{peer}");
                }
                _ => {
                    let long = u(&recv["rendezvous_pulled"]["messages"]) + u(&recv["rendezvous_windowed"]["messages"]);
                    assert!(long > 0, "{peer}");
                }
            }
        }
        // What one process sent the other received, message for message and byte for byte.
        for (a, b) in [(&docs[0], &docs[1]), (&docs[1], &docs[0])] {
            let (sa, rb) = (&a["peers"][0]["sent"], &b["peers"][0]["received"]);
            assert_eq!(sa["eager"], rb["eager"], "{device}: eager sent by {} vs received by {}", a["pid"], b["pid"]);
            let pulled = &rb["rendezvous_pulled"];
            let windowed = &rb["rendezvous_windowed"];
            assert_eq!(u(&sa["rendezvous"]["messages"]), u(&pulled["messages"]) + u(&windowed["messages"]), "{device}");
            assert_eq!(u(&sa["rendezvous"]["bytes"]), u(&pulled["bytes"]) + u(&windowed["bytes"]), "{device}");
        }
        // An endpoint of one job has no `jobs` element: tests/multi_job.rs
        // checks those fields against the schema on an endpoint of two.
        let missing: Vec<_> = schema.keys().filter(|k| !seen.contains(*k) && !k.starts_with("jobs[].")).collect();
        assert!(missing.is_empty(), "documented fields no document of the {device} run has: {missing:?}");
    }
}

/// SIGUSR1 bit in /proc/<pid>/status's SigCgt: the handler is installed.
fn catches_sigusr1(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (libc::SIGUSR1 - 1)) != 0)
}

#[test]
fn sigusr1_writes_a_document_before_close_and_the_interval_too() {
    fi_tests::init();
    let port = procs::free_port();
    let template = tmp("sig.%p.jsonl");
    let t = template.display().to_string();
    let env = [("FI_RDMX_STATS", t.as_str()), ("FI_RDMX_STATS_INTERVAL", "300")];
    let mk = |extra: &[&str]| {
        let mut c = procs::command("fi_pingpong", &env);
        c.args(["-p", "rdmx", "-e", "rdm", "-d", "udp", "-S", "64", "-I", "400000"]).args(extra);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let server = procs::wait_listening(mk(&["-B", &port.to_string()]).spawn().expect("spawn fi_pingpong server"), port);
    let mut client = mk(&["-P", &port.to_string(), "127.0.0.1"]).spawn().expect("spawn fi_pingpong client");
    let pid = client.id();
    let file = std::path::PathBuf::from(t.replace("%p", &pid.to_string()));
    // The handler is installed when the endpoint is enabled; before that the
    // signal would kill the process.
    let t0 = Instant::now();
    while !catches_sigusr1(pid) {
        assert!(
            t0.elapsed() < Duration::from_secs(20) && client.try_wait().unwrap().is_none(),
            "the client never installed a SIGUSR1 handler"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Ask once traffic has been counted: an interval document (every 300 ms)
    // that shows messages sent, rather than a guess at how long that takes.
    let t0 = Instant::now();
    while !read_docs(&file).iter().any(|d| {
        d["reason"] == "interval" && d["peers"][0]["sent"]["eager"]["messages"].as_u64().is_some_and(|n| n > 0)
    }) {
        assert!(client.try_wait().unwrap().is_none(), "the client ended before an interval document counted traffic");
        assert!(t0.elapsed() < Duration::from_secs(60), "no interval document with traffic after 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    let t0 = Instant::now();
    let signal_doc = loop {
        if let Some(d) = read_docs(&file).into_iter().find(|d| d["reason"] == "signal") {
            break d;
        }
        assert!(client.try_wait().unwrap().is_none(), "the client ended before it wrote a document for SIGUSR1");
        assert!(t0.elapsed() < Duration::from_secs(10), "no document after SIGUSR1");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(client.try_wait().unwrap().is_none(), "the signal's document must come before the close");
    let c = procs::wait_output(client, Duration::from_secs(240));
    let s = procs::wait_output(server, Duration::from_secs(60));
    assert!(c.status.success() && s.status.success(), "fi_pingpong:\n{}\n{}", text(&c), text(&s));
    let docs = read_docs(&file);
    let reasons: Vec<&str> = docs.iter().map(|d| d["reason"].as_str().unwrap()).collect();
    assert_eq!(reasons.last(), Some(&"close"), "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| **r == "close").count(), 1, "{reasons:?}");
    assert_eq!(reasons.iter().filter(|r| **r == "signal").count(), 1, "{reasons:?}");
    assert!(reasons.contains(&"interval"), "FI_RDMX_STATS_INTERVAL=300 over a run of seconds: {reasons:?}");
    let schema = documented();
    let counters = documented_counters();
    for d in &docs {
        check_schema(d, &schema, &counters);
        assert_eq!(u(&d["pid"]), pid as u64, "%p names the writer");
    }
    // The signal came mid-run: traffic already counted, and less than at close.
    let close = docs.last().unwrap();
    let sent_at = |d: &Value| u(&d["peers"][0]["sent"]["eager"]["messages"]);
    assert!(signal_doc["peers"].as_array().is_some_and(|p| p.len() == 1), "{signal_doc}");
    assert!(
        sent_at(&signal_doc) > 0 && sent_at(&signal_doc) < sent_at(close),
        "signal {} close {}",
        sent_at(&signal_doc),
        sent_at(close)
    );
    // Documents in file order never go backwards.
    for w in docs.windows(2) {
        assert!(u(&w[0]["counters"]["packets_sent"]) <= u(&w[1]["counters"]["packets_sent"]));
    }
}
