//! rdmx's tunables. Each is registered with `fi_param_define`, so it is read from
//! the environment as `FI_RDMX_<NAME>` and listed by `fi_info -e`.
use crate::provider_ptr;
use libfabric_sys as fi;
use std::ffi::{c_void, CStr};
use std::sync::OnceLock;
use std::time::Duration;

/// Which datagram devices an endpoint opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// Shared memory to peers on this host and UDP to the rest, in one endpoint.
    Auto,
    Udp,
    Shm,
    /// A verbs UD queue pair on an RDMA device (`devices::verbs`).
    Verbs,
    /// An EFA SRD queue pair (`devices::efa`); not run on EFA hardware.
    Efa,
}

/// The values of every `FI_RDMX_*` parameter, read once.
#[derive(Clone, Debug)]
pub struct Params {
    pub device: DeviceChoice,
    pub iface: Option<String>,
    pub udp_mtu: usize,
    pub peer_timeout: Duration,
    pub job_key: u64,
    /// `FI_RDMX_JOB_SECRET_FILE` / `FI_RDMX_JOB_SECRET`: the job's secret
    /// (`job.rs`), or why the one named cannot be used.
    pub job_secret: Option<Result<crate::job::SecretBytes, String>>,
    /// `FI_RDMX_JOB_ENCRYPT`: with a secret, encipher payloads too.
    pub job_encrypt: bool,
    pub progress_thread: bool,
    /// Print the endpoint's counters at close (`rdmx: <name> <value>` lines):
    /// `FI_RDMX_STATS=1`.
    pub stats: bool,
    /// `FI_RDMX_STATS=<path>`: JSON Lines documents appended there (`%p` in
    /// the path is the process id); see `stats_json.rs`.
    pub stats_path: Option<String>,
    /// `FI_RDMX_STATS_INTERVAL`: with a path, also write every this often.
    pub stats_interval: Option<Duration>,
    pub inject_size: usize,
    pub unexpected_limit: usize,
    pub rndv_threshold: usize,
    pub rdma_rndv_threshold: usize,
    pub window_threshold: usize,
    pub shm_cma: bool,
    pub fault_seed: u64,
    pub fault_drop: f64,
    pub fault_dup: f64,
    pub fault_reorder: f64,
    pub fault_corrupt: f64,
    /// The registration cache of each domain (`FI_RDMX_MR_CACHE_*`).
    pub mr_cache: mr_cache::cache::CacheConfig,
    /// `FI_RDMX_RC_MAX_PEERS`: reliable connections for rendezvous reads
    /// per verbs endpoint, each way (`None`: the device's default).
    pub rc_max_peers: Option<usize>,
    /// `FI_RDMX_VERBS_ODP` (`None`: unset, use ODP where offered).
    pub verbs_odp: Option<bool>,
}

impl Default for Params {
    /// The engine's tunables default to the engine's own defaults
    /// (`rndv::EndpointConfig::default()`): one default per parameter, shared
    /// with the simulator and the fuzzers.
    fn default() -> Self {
        let engine = rndv::EndpointConfig::default();
        Params {
            device: DeviceChoice::Auto,
            iface: None,
            udp_mtu: 1472,
            peer_timeout: engine.peer_timeout,
            job_key: engine.job_key,
            job_secret: None,
            job_encrypt: false,
            progress_thread: true,
            stats: false,
            stats_path: None,
            stats_interval: None,
            inject_size: 4096,
            unexpected_limit: engine.unexpected_limit,
            rndv_threshold: engine.rndv_threshold,
            rdma_rndv_threshold: engine.rdma_rndv_threshold.unwrap_or(engine.rndv_threshold),
            window_threshold: engine.window_threshold,
            shm_cma: true,
            fault_seed: 1,
            fault_drop: 0.0,
            fault_dup: 0.0,
            fault_reorder: 0.0,
            fault_corrupt: 0.0,
            mr_cache: mr_cache::cache::CacheConfig::default(),
            rc_max_peers: None,
            verbs_odp: None,
        }
    }
}

enum Kind {
    Str,
    Int,
    Bool,
    Size,
}

/// (name, type, help). fi_rdmx(7), RUNTIME PARAMETERS, documents the same
/// parameters with the same defaults (`prov/tests/man_page.rs` checks).
const DEFINITIONS: &[(&CStr, Kind, &CStr)] = &[
    (c"device", Kind::Str, c"Datagram device: auto (shared memory to peers on this host, UDP to the rest; default), udp, shm, verbs (a UD queue pair on an RDMA device), or efa (an SRD queue pair on an AWS EFA device; auto prefers it over verbs where one is present; not run on EFA hardware)"),
    (c"iface", Kind::Str, c"Network interface name or IP address the UDP device binds to (default: the host name's address if it is on an up, non-loopback interface, else the first up non-loopback interface with an address, else 127.0.0.1)"),
    (c"udp_mtu", Kind::Size, c"Largest UDP datagram rdmx sends, headers included (default 1472)"),
    (c"peer_timeout", Kind::Int, c"Milliseconds a peer may stay silent while operations to it are pending before it is declared unreachable and they fail (default 30000)"),
    (c"job_key", Kind::Size, c"Job key carried by every packet when the endpoint has no auth_key; packets with another key are dropped (default 0)"),
    (c"job_secret", Kind::Str, c"The job's secret (16 to 1024 bytes), the same in every rank, when the endpoint's auth_key is not one: every datagram over a wire (UDP, verbs, EFA; not shared memory) is then sealed with an AES-128-GCM tag, and only sealed datagrams of the job are taken. Prefer FI_RDMX_JOB_SECRET_FILE (an environment is readable by more tools than a file of mode 0600). Default: none (the job key in clear)"),
    (c"job_secret_file", Kind::Str, c"A file holding the job's secret (16 to 1024 bytes; one trailing newline is dropped); wins over FI_RDMX_JOB_SECRET. An endpoint fails to open if the file cannot be read or is too short"),
    (c"job_encrypt", Kind::Bool, c"With a job secret: encipher payloads too, not only tag them (default 0)"),
    (c"progress_thread", Kind::Bool, c"Run a background progress thread per endpoint that serves acks, retransmissions and incoming data while the application is not calling in (default 1; 0 = pure manual progress, and FI_PROGRESS_AUTO is then not offered)"),
    (c"inject_size", Kind::Size, c"Largest message sent with fi_inject / FI_INJECT (default 4096)"),
    (c"stats", Kind::Str, c"1 (or yes, true, on): print each endpoint's counters to stderr when it closes, one line per counter: 'rdmx: <name> <value>'. Any other value except 0 (no, false, off) is a path: each endpoint appends a JSON document (one per line) with its counters and per-peer counters there at close, on SIGUSR1 and every FI_RDMX_STATS_INTERVAL ms; %p in the path is replaced by the process id (default 0, off)"),
    (c"stats_interval", Kind::Int, c"With FI_RDMX_STATS=<path>: also write each endpoint's JSON document every this many milliseconds, from its progress (default 0, off)"),
    (c"unexpected_limit", Kind::Size, c"Bytes of unexpected (not yet matched) messages an endpoint buffers before it stops accepting new ones; senders then wait, nothing is dropped (default 268435456)"),
    (c"rndv_threshold", Kind::Size, c"Messages of at least this many bytes to a peer on the same host go by rendezvous: the receiver pulls them straight from the sender's memory with process_vm_readv (default 16384; below it, copying through the ring is faster)"),
    (c"rdma_rndv_threshold", Kind::Size, c"Messages of at least this many bytes to a peer reached over RDMA (verbs, efa) go by rendezvous: the receiver reads them with an RDMA read (default 65536)"),
    (c"window_threshold", Kind::Size, c"Messages of at least this many bytes to a peer whose path cannot read remotely (UDP) go by windowed rendezvous: the receiver grants windows and the bytes land straight in the posted buffer (default 262144)"),
    (c"shm_cma", Kind::Bool, c"Let the receiver of a rendezvous read the sender's memory with process_vm_readv (one copy); 0 makes it ask the sender to push the bytes through the shared-memory ring instead (default 1)"),
    (c"mr_cache_enable", Kind::Bool, c"Cache memory registrations of rendezvous buffers on paths whose remote reads need one (verbs, SRD; udp and shm need none), and invalidate them when the memory is unmapped (default 1; 0 = register per use and deregister when the send completes)"),
    (c"mr_cache_max_count", Kind::Size, c"Most registrations a domain's cache keeps, in use or not; unused ones beyond it are deregistered, least recently used first (default 1024)"),
    (c"mr_cache_max_size", Kind::Size, c"Most bytes of memory a domain's cache keeps registered; unused registrations beyond it are deregistered, least recently used first (default 1073741824)"),
    (c"mr_cache_max_entry_size", Kind::Size, c"Longest registration a domain's cache keeps: a longer buffer is registered for its transfer only and deregistered when it completes, so that one huge buffer does not push the reused smaller registrations out (default 134217728)"),
    (c"verbs_odp", Kind::Bool, c"Verbs: 1 = register application memory on demand (IBV_ACCESS_ON_DEMAND, no pinning) where the device offers ODP for RC RDMA reads and UD sends (default 0, always pin: Soft-RoCE's ODP, the one tried, moves the wrong bytes for buffers not aligned to a page)"),
    (c"rc_max_peers", Kind::Size, c"Verbs: reliable connections (RC queue pairs) an endpoint keeps for rendezvous reads, each way (default 64). A connection is made the first time the endpoint would read a peer's memory (that message is pushed over UD meanwhile) and closed when least recently used at the bound or idle for 30 s; 0 = no connection, every long message is pushed over UD"),
    (c"fault_seed", Kind::Size, c"Seed of the fault-injecting device decorator (default 1)"),
    (c"fault_drop", Kind::Str, c"Percent of outgoing datagrams the fault injector drops (default 0, off)"),
    (c"fault_dup", Kind::Str, c"Percent of outgoing datagrams the fault injector duplicates (default 0)"),
    (c"fault_reorder", Kind::Str, c"Percent of outgoing datagrams the fault injector delays behind later ones (default 0)"),
    (c"fault_corrupt", Kind::Str, c"Percent of outgoing datagrams the fault injector corrupts (default 0)"),
];

/// Registers every parameter. Called once from `fi_prov_ini`.
pub fn define_all() {
    for (name, kind, help) in DEFINITIONS {
        let ty = match kind {
            Kind::Str => fi::FI_PARAM_STRING,
            Kind::Int => fi::FI_PARAM_INT,
            Kind::Bool => fi::FI_PARAM_BOOL,
            Kind::Size => fi::FI_PARAM_SIZE_T,
        };
        // SAFETY: the provider struct is static; name and help are static C strings;
        // the help text contains no '%' so the variadic part is empty.
        unsafe {
            fi::fi_param_define(provider_ptr(), name.as_ptr(), ty, help.as_ptr());
        }
    }
}

fn get_str(name: &CStr) -> Option<String> {
    let mut val: *mut libc::c_char = std::ptr::null_mut();
    // SAFETY: FI_PARAM_STRING writes a `char *` (owned by the environment) to `val`.
    let ret = unsafe { fi::fi_param_get(provider_ptr(), name.as_ptr(), &mut val as *mut _ as *mut c_void) };
    if ret != 0 || val.is_null() {
        return None;
    }
    // SAFETY: libfabric returned a getenv() pointer: a valid NUL-terminated string.
    Some(unsafe { CStr::from_ptr(val) }.to_string_lossy().into_owned())
}

/// `FI_RDMX_JOB_SECRET`, read from the environment directly: libfabric's
/// `fi_param_get` logs every string it reads at info level, value and all,
/// and the secret must never reach a log (`fi_tests/tests/tools.rs`). The
/// parameter is still defined, so `fi_info -e` lists it.
fn secret_var() -> Option<String> {
    std::env::var_os("FI_RDMX_JOB_SECRET").map(|v| v.to_string_lossy().into_owned())
}

fn get_int(name: &CStr) -> Option<i64> {
    let mut val: libc::c_int = 0;
    // SAFETY: FI_PARAM_INT writes an `int`.
    let ret = unsafe { fi::fi_param_get(provider_ptr(), name.as_ptr(), &mut val as *mut _ as *mut c_void) };
    (ret == 0).then_some(val as i64)
}

fn get_size(name: &CStr) -> Option<u64> {
    let mut val: usize = 0;
    // SAFETY: FI_PARAM_SIZE_T writes a `size_t`.
    let ret = unsafe { fi::fi_param_get(provider_ptr(), name.as_ptr(), &mut val as *mut _ as *mut c_void) };
    (ret == 0).then_some(val as u64)
}

fn get_bool(name: &CStr) -> Option<bool> {
    let mut val: libc::c_int = 0;
    // SAFETY: FI_PARAM_BOOL writes an `int`.
    let ret = unsafe { fi::fi_param_get(provider_ptr(), name.as_ptr(), &mut val as *mut _ as *mut c_void) };
    (ret == 0).then_some(val != 0)
}

fn get_pct(name: &CStr) -> f64 {
    get_str(name)
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite())
        .map(|v| v.clamp(0.0, 100.0))
        .unwrap_or(0.0)
}

/// `FI_RDMX_STATS`: (text lines at close, JSON path). The words libfabric
/// takes for a boolean keep their meaning (so `FI_RDMX_STATS=1` prints the
/// text lines as it always did); anything else names a file (a file named
/// `1` is `./1`).
pub(crate) fn parse_stats(v: Option<&str>) -> (bool, Option<String>) {
    let Some(v) = v.map(str::trim) else { return (false, None) };
    match v.to_ascii_lowercase().as_str() {
        "" | "0" | "no" | "n" | "false" | "f" | "off" => (false, None),
        "1" | "yes" | "y" | "true" | "t" | "on" => (true, None),
        _ => (false, Some(v.to_string())),
    }
}

fn read() -> Params {
    let d = Params::default();
    let device = match get_str(c"device").as_deref().map(str::trim) {
        Some("udp") => DeviceChoice::Udp,
        Some("shm") => DeviceChoice::Shm,
        Some("verbs") => DeviceChoice::Verbs,
        Some("efa") => DeviceChoice::Efa,
        Some("auto") | Some("") | None => DeviceChoice::Auto,
        Some(other) => {
            crate::log::warn(
                crate::log::Subsys::Core,
                "params",
                &format!("FI_RDMX_DEVICE={other} is not auto|udp|shm|verbs|efa; using auto"),
            );
            DeviceChoice::Auto
        }
    };
    let stats_mode = parse_stats(get_str(c"stats").as_deref());
    Params {
        device,
        iface: get_str(c"iface").filter(|s| !s.is_empty()),
        udp_mtu: get_size(c"udp_mtu").map(|v| v.clamp(576, 65507) as usize).unwrap_or(d.udp_mtu),
        peer_timeout: get_int(c"peer_timeout")
            .filter(|v| *v > 0)
            .map(|v| Duration::from_millis(v as u64))
            .unwrap_or(d.peer_timeout),
        job_key: get_size(c"job_key").unwrap_or(d.job_key),
        job_secret: crate::job::secret_from_env(secret_var(), get_str(c"job_secret_file")),
        job_encrypt: get_bool(c"job_encrypt").unwrap_or(d.job_encrypt),
        progress_thread: get_bool(c"progress_thread").unwrap_or(d.progress_thread),
        stats: stats_mode.0,
        stats_path: stats_mode.1,
        stats_interval: get_int(c"stats_interval").filter(|v| *v > 0).map(|v| Duration::from_millis(v as u64)),
        inject_size: get_size(c"inject_size").map(|v| v.min(65536) as usize).unwrap_or(d.inject_size),
        unexpected_limit: get_size(c"unexpected_limit").map(|v| v.max(1 << 16) as usize).unwrap_or(d.unexpected_limit),
        rndv_threshold: get_size(c"rndv_threshold").map(|v| v as usize).unwrap_or(d.rndv_threshold),
        rdma_rndv_threshold: get_size(c"rdma_rndv_threshold").map(|v| v as usize).unwrap_or(d.rdma_rndv_threshold),
        window_threshold: get_size(c"window_threshold").map(|v| v as usize).unwrap_or(d.window_threshold),
        shm_cma: get_bool(c"shm_cma").unwrap_or(d.shm_cma),
        fault_seed: get_size(c"fault_seed").unwrap_or(d.fault_seed),
        fault_drop: get_pct(c"fault_drop"),
        fault_dup: get_pct(c"fault_dup"),
        fault_reorder: get_pct(c"fault_reorder"),
        fault_corrupt: get_pct(c"fault_corrupt"),
        mr_cache: mr_cache::cache::CacheConfig {
            enabled: get_bool(c"mr_cache_enable").unwrap_or(d.mr_cache.enabled),
            max_count: get_size(c"mr_cache_max_count").map(|v| v as usize).unwrap_or(d.mr_cache.max_count),
            max_bytes: get_size(c"mr_cache_max_size").unwrap_or(d.mr_cache.max_bytes),
            max_entry_bytes: get_size(c"mr_cache_max_entry_size").unwrap_or(d.mr_cache.max_entry_bytes),
        },
        rc_max_peers: get_size(c"rc_max_peers").map(|v| v as usize),
        verbs_odp: get_bool(c"verbs_odp"),
    }
}

static PARAMS: OnceLock<Params> = OnceLock::new();

/// The parameters, read at first use (after `define_all`).
pub fn params() -> &'static Params {
    PARAMS.get_or_init(read)
}

/// For the docs tests: the parameter names as `FI_RDMX_*` with their help.
pub fn documented() -> Vec<(String, String)> {
    DEFINITIONS
        .iter()
        .map(|(n, _, h)| (format!("FI_RDMX_{}", n.to_string_lossy().to_uppercase()), h.to_string_lossy().into_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The number a parameter's help text gives as its default ("(default N" or
    /// "(default N;" or "(default N)"), where it gives a number.
    fn stated_default(name: &str) -> Option<u64> {
        let (_, _, help) = DEFINITIONS.iter().find(|(n, _, _)| n.to_str() == Ok(name))?;
        let help = help.to_str().ok()?;
        let rest = &help[help.find("(default ")? + "(default ".len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    }

    /// Every numeric default the help texts (and so `fi_info -e` and fi_rdmx(7),
    /// which `man_page.rs` holds to them) state is the default in force, the
    /// engine's own for its tunables.
    #[test]
    fn help_texts_state_the_defaults_in_force() {
        let d = Params::default();
        let engine = rndv::engine::Config::default();
        let cases: [(&str, u64); 10] = [
            ("udp_mtu", d.udp_mtu as u64),
            ("peer_timeout", d.peer_timeout.as_millis() as u64),
            ("job_key", d.job_key),
            ("inject_size", d.inject_size as u64),
            ("unexpected_limit", engine.unexpected_limit as u64),
            ("rndv_threshold", engine.rndv_threshold as u64),
            ("rdma_rndv_threshold", engine.rdma_rndv_threshold.unwrap_or(engine.rndv_threshold) as u64),
            ("window_threshold", engine.window_threshold as u64),
            ("mr_cache_max_count", d.mr_cache.max_count as u64),
            ("mr_cache_max_size", d.mr_cache.max_bytes),
        ];
        for (name, value) in cases {
            assert_eq!(stated_default(name), Some(value), "FI_RDMX_{}: help text vs default", name.to_uppercase());
        }
        assert_eq!(d.rndv_threshold, engine.rndv_threshold);
        assert_eq!(Some(d.rdma_rndv_threshold), engine.rdma_rndv_threshold);
        assert_eq!(d.window_threshold, engine.window_threshold);
        assert_eq!(d.unexpected_limit, engine.unexpected_limit);
    }
}
