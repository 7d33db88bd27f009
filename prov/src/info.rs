//! `fi_getinfo`: rdmx's attribute profile and the hint matching that libfabric's
//! util code (`ofi_check_info` / `ofi_alter_info`, not exported to DL providers)
//! would do. See ../shared reference PROVIDER_ABI.md §2.10 for the rules.
//!
//! The profile is built as a Rust [`Profile`] first, matched and altered in Rust,
//! and only at the end copied into `fi_info` structs allocated by libfabric's own
//! allocator (`fi_dupinfo(NULL)`, libc `malloc`/`strdup`), so `fi_freeinfo` can free
//! them.
use crate::addr::{RdmxAddr, ADDR_LEN};
use crate::error::{Error, Result};
use crate::job::AuthKey;
use crate::log::{fi_info, fi_warn, Subsys};
use crate::params::{params, DeviceChoice};
use libfabric_sys as fi;
use std::ffi::{CStr, CString};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};

pub const FABRIC_NAME: &str = "rdmx";
/// The fabric of the `verbs` domain: the RDMA network, which an `auto`
/// endpoint reaches over UD too but a `verbs` one reaches by nothing else.
pub const VERBS_FABRIC_NAME: &str = "rdmx-verbs";
/// The fabric of the `efa` domain (likewise: EFA SRD peers only).
pub const EFA_FABRIC_NAME: &str = "rdmx-efa";

/// The fabric a domain of `device` is on.
pub fn fabric_name(device: DeviceChoice) -> &'static str {
    match device {
        DeviceChoice::Verbs => VERBS_FABRIC_NAME,
        DeviceChoice::Efa => EFA_FABRIC_NAME,
        _ => FABRIC_NAME,
    }
}

// Capability bits (all u64).
const MSG: u64 = fi::FI_MSG as u64;
const TAGGED: u64 = fi::FI_TAGGED as u64;
const SEND: u64 = fi::FI_SEND as u64;
const RECV: u64 = fi::FI_RECV as u64;
const DIRECTED_RECV: u64 = fi::FI_DIRECTED_RECV;
const SOURCE: u64 = fi::FI_SOURCE;
/// Reported only when requested: it turns receives from unknown senders into
/// error entries, which applications that did not ask for it do not expect.
const SOURCE_ERR: u64 = fi::FI_SOURCE_ERR;
/// libfabric 2.0's directed-receive capabilities (fabric.h), by value: 1.17's
/// bindings lack them, and in 1.x the same bits meant something else (bit 45
/// and 46 were MR flags, bit 48 `FI_VARIABLE_MSG`), so only a request of API
/// 2.0 or newer may name them ([`asked_only_caps`]). `FI_TAGGED_DIRECTED_RECV`
/// makes tagged receives honour their source address; `FI_EXACT_DIRECTED_RECV`
/// makes every receive honour it and forbids `FI_ADDR_UNSPEC` there
/// (fi_getinfo(3)). rdmx's receives take a source per request either way
/// (`core::recv_source`), so both cost nothing; like `FI_SOURCE_ERR` they
/// change what a receive does, so they are reported only when asked for.
pub const TAGGED_DIRECTED_RECV: u64 = 1 << 45;
pub const EXACT_DIRECTED_RECV: u64 = 1 << 48;
/// `FI_TAGGED_MULTI_RECV` (2.0): `FI_MULTI_RECV` on tagged receives, which
/// rdmx's multi-receive buffers (untagged only) do not do. Never offered.
pub const TAGGED_MULTI_RECV: u64 = 1 << 46;
const LOCAL_COMM: u64 = fi::FI_LOCAL_COMM;
const REMOTE_COMM: u64 = fi::FI_REMOTE_COMM;

const RMA: u64 = fi::FI_RMA as u64;
const ATOMIC: u64 = fi::FI_ATOMIC as u64;
const READ: u64 = fi::FI_READ as u64;
const WRITE: u64 = fi::FI_WRITE as u64;
const REMOTE_READ: u64 = fi::FI_REMOTE_READ as u64;
const REMOTE_WRITE: u64 = fi::FI_REMOTE_WRITE as u64;

/// Primary capabilities rdmx implements (RMA and atomics are emulated over
/// messages).
const PRIMARY_CAPS: u64 = MSG | TAGGED | DIRECTED_RECV | RMA | ATOMIC;
/// Secondary capabilities rdmx implements (reported even when not requested).
const MULTI_RECV: u64 = fi::FI_MULTI_RECV as u64;
/// Target-side RMA and atomic events: a counter bound with `FI_REMOTE_READ` /
/// `FI_REMOTE_WRITE` counts every request the endpoint serves, and a
/// `writedata` lands as an `FI_REMOTE_WRITE | FI_REMOTE_CQ_DATA` CQ entry. The
/// target does that work anyway, so the capability costs nothing and is
/// reported whenever RMA or atomics are (fi_getinfo(3): it needs them).
const RMA_EVENT: u64 = fi::FI_RMA_EVENT;
/// `FI_FENCE` on any operation: requests to one peer travel in one ordered
/// stream and the peer serves them in order, so an operation posted after
/// others to the same peer already takes effect after them.
const FENCE: u64 = fi::FI_FENCE as u64;
const SECONDARY_CAPS: u64 = SOURCE | LOCAL_COMM | REMOTE_COMM | MULTI_RECV | RMA_EVENT | FENCE;
const DIRECTION_CAPS: u64 = SEND | RECV | READ | WRITE | REMOTE_READ | REMOTE_WRITE;
pub const ALL_CAPS: u64 = PRIMARY_CAPS | SECONDARY_CAPS | DIRECTION_CAPS;
const TX_CAPS: u64 = MSG | TAGGED | SEND | RMA | ATOMIC | READ | WRITE | FENCE;
const RX_CAPS: u64 = MSG
    | TAGGED
    | RECV
    | DIRECTED_RECV
    | TAGGED_DIRECTED_RECV
    | EXACT_DIRECTED_RECV
    | SOURCE
    | SOURCE_ERR
    | MULTI_RECV
    | RMA_EVENT
    | RMA
    | ATOMIC
    | REMOTE_READ
    | REMOTE_WRITE;
const DOMAIN_CAPS: u64 = LOCAL_COMM | REMOTE_COMM;

const TX_OP_FLAGS: u64 = (fi::FI_COMPLETION
    | fi::FI_INJECT
    | fi::FI_INJECT_COMPLETE
    | fi::FI_TRANSMIT_COMPLETE
    | fi::FI_DELIVERY_COMPLETE
    | fi::FI_MORE) as u64
    | fi::FI_COMMIT_COMPLETE as u64;
const RX_OP_FLAGS: u64 = (fi::FI_COMPLETION | fi::FI_MORE | fi::FI_MULTI_RECV) as u64;
/// Everything arrives in order per peer (one ordered stream carries messages,
/// RMA and atomics), so every ordering bit holds.
const MSG_ORDER: u64 = fi::FI_ORDER_STRICT as u64
    | fi::FI_ORDER_RMA_RAR
    | fi::FI_ORDER_RMA_RAW
    | fi::FI_ORDER_RMA_WAR
    | fi::FI_ORDER_RMA_WAW
    | fi::FI_ORDER_ATOMIC_RAR
    | fi::FI_ORDER_ATOMIC_RAW
    | fi::FI_ORDER_ATOMIC_WAR
    | fi::FI_ORDER_ATOMIC_WAW;
/// mr_mode bits rdmx honours when an application offers them (it requires none):
/// `FI_MR_LOCAL` registrations are accepted and ignored, `FI_MR_PROV_KEY` makes
/// rdmx choose keys. `FI_MR_ENDPOINT` is not offered (MRs do not bind to
/// endpoints).
const MR_MODE_ACCEPTED: i32 = (fi::FI_MR_LOCAL | fi::FI_MR_ALLOCATED | fi::FI_MR_PROV_KEY | fi::FI_MR_VIRT_ADDR) as i32;

pub const MAX_MSG_SIZE: usize = 1 << 30;

/// What `FI_EP_DGRAM` endpoints offer: plain and tagged messages as single
/// unreliable datagrams. No RMA or atomics (they are request/answer messages
/// that need the reliable stream), no multi-receive, no ordering: UDP reorders.
const DGRAM_PRIMARY_CAPS: u64 = MSG | TAGGED | DIRECTED_RECV;
const DGRAM_SECONDARY_CAPS: u64 = SOURCE | LOCAL_COMM | REMOTE_COMM;
const DGRAM_DIRECTION_CAPS: u64 = SEND | RECV;
/// A send completes once handed to the device: its buffer is free and the
/// datagram is on its way (inject and transmit complete); delivery is never
/// known, so `FI_DELIVERY_COMPLETE` is not offered.
const DGRAM_TX_OP_FLAGS: u64 =
    (fi::FI_COMPLETION | fi::FI_INJECT | fi::FI_INJECT_COMPLETE | fi::FI_TRANSMIT_COMPLETE | fi::FI_MORE) as u64;
const DGRAM_RX_OP_FLAGS: u64 = (fi::FI_COMPLETION | fi::FI_MORE) as u64;

/// The capability and flag sets of one endpoint type, for hint matching.
struct TypeCaps {
    primary: u64,
    secondary: u64,
    direction: u64,
    tx_op_flags: u64,
    rx_op_flags: u64,
    msg_order: u64,
}

impl TypeCaps {
    fn of(ep_type: fi::fi_ep_type) -> TypeCaps {
        if ep_type == fi::FI_EP_DGRAM {
            TypeCaps {
                primary: DGRAM_PRIMARY_CAPS,
                secondary: DGRAM_SECONDARY_CAPS,
                direction: DGRAM_DIRECTION_CAPS,
                tx_op_flags: DGRAM_TX_OP_FLAGS,
                rx_op_flags: DGRAM_RX_OP_FLAGS,
                msg_order: 0,
            }
        } else {
            TypeCaps {
                primary: PRIMARY_CAPS,
                secondary: SECONDARY_CAPS,
                direction: DIRECTION_CAPS,
                tx_op_flags: TX_OP_FLAGS,
                rx_op_flags: RX_OP_FLAGS,
                msg_order: MSG_ORDER,
            }
        }
    }

    fn all(&self) -> u64 {
        self.primary | self.secondary | self.direction
    }
}

/// The default operation flags an endpoint of `ep_type` takes for one direction
/// (`tx_attr`/`rx_attr` `op_flags`, `fi_control(FI_SETOPSFLAG)`).
pub fn op_flags_allowed(ep_type: fi::fi_ep_type, transmit: bool) -> u64 {
    let tc = TypeCaps::of(ep_type);
    if transmit {
        tc.tx_op_flags
    } else {
        tc.rx_op_flags
    }
}

/// The largest `FI_EP_DGRAM` message on `device`: one datagram of the device
/// minus rdm's and the message layer's headers. Under `auto` the smaller of the
/// two paths (UDP), since every peer must take it.
pub fn dgram_max_msg_size(device: DeviceChoice) -> usize {
    let headers = rdm::engine::HEADER_LEN + rndv::HEADER_LEN;
    let udp = params().udp_mtu;
    let shm = ::devices::shm::DEFAULT_MTU;
    let mtu = match device {
        DeviceChoice::Udp => udp,
        DeviceChoice::Shm => shm,
        // With an RDMA device, auto sends to remote peers over SRD or UD too.
        DeviceChoice::Auto => udp.min(shm).min(auto_rdma_mtu().unwrap_or(usize::MAX)),
        // 1024, the smallest a RoCE port over a 1500-byte netdev has, when
        // the device cannot be opened.
        DeviceChoice::Verbs => verbs_mtu().unwrap_or(1024),
        // SRD's max_msg_sz where no device answers (its usual value).
        DeviceChoice::Efa => efa_mtu().unwrap_or(8928),
    };
    // A job secret in the environment seals every datagram over a wire: its
    // trailer takes room from the payload (one given as an `auth_key`
    // takes it in `match_hints`).
    let trailer = if params().job_secret.is_some() { rdm::engine::TRAILER_LEN } else { 0 };
    mtu.saturating_sub(headers + trailer)
}
pub const TX_SIZE: usize = 1024;
pub const RX_SIZE: usize = 1024;
pub const IOV_LIMIT: usize = 4;
pub const CQ_DATA_SIZE: usize = 8;

/// One fi_info entry's worth of attributes, before it is written into C structs.
#[derive(Clone, Debug)]
pub struct Profile {
    pub device: DeviceChoice,
    /// `FI_EP_RDM`, or `FI_EP_DGRAM` (unreliable datagrams over the same devices).
    pub ep_type: fi::fi_ep_type,
    /// Largest message: 1 GiB for RDM, one datagram for DGRAM.
    pub max_msg_size: usize,
    pub caps: u64,
    pub tx_caps: u64,
    pub rx_caps: u64,
    pub tx_op_flags: u64,
    pub rx_op_flags: u64,
    pub msg_order: u64,
    pub inject_size: usize,
    pub tx_size: usize,
    pub rx_size: usize,
    pub tx_iov_limit: usize,
    pub rx_iov_limit: usize,
    pub threading: fi::fi_threading,
    pub progress: fi::fi_progress,
    pub av_type: fi::fi_av_type,
    pub mr_mode: i32,
    pub domain_caps: u64,
    pub mem_tag_format: u64,
    pub src: Option<RdmxAddr>,
    pub dest: Option<Vec<u8>>,
    /// The application's `handle` (an opaque pointer value, echoed back).
    pub handle: usize,
    /// The endpoint's or domain's `auth_key`: a job key in clear (up to 8
    /// bytes, with its length so it is echoed back exactly) or a job secret
    /// (16 to 1024 bytes; `job.rs`).
    pub auth_key: Option<AuthKey>,
    /// `FI_AV_AUTH_KEY` (API 1.20 on): the domain's endpoints serve the
    /// jobs whose keys their AV holds at enable, up to [`MAX_EP_AUTH_KEY`],
    /// and its registrations name which of them may reach them.
    pub av_auth_key: bool,
    /// The API version the application asked for (`fi_getinfo`'s `version`,
    /// or the fabric's `api_version` from `fi_domain` on): which rules and
    /// which appended struct fields apply ([`appended`]).
    pub api_version: u32,
}

pub fn domain_name(d: DeviceChoice) -> &'static str {
    match d {
        DeviceChoice::Auto => "auto",
        DeviceChoice::Udp => "udp",
        DeviceChoice::Shm => "shm",
        DeviceChoice::Verbs => "verbs",
        DeviceChoice::Efa => "efa",
    }
}

/// The settings the device probes take from the parameters.
fn probe_settings() -> ::devices::probe::Settings {
    let p = params();
    ::devices::probe::Settings { iface: p.iface.clone(), rc_max_peers: p.rc_max_peers, odp: p.verbs_odp }
}

/// The verbs device's config (`None`: no RDMA device on this host).
pub fn verbs_config() -> Option<::devices::verbs::VerbsConfig> {
    ::devices::probe::verbs_config(&probe_settings())
}

/// The verbs device's port MTU, when one can be opened.
pub fn verbs_mtu() -> Option<usize> {
    ::devices::probe::verbs_mtu(&probe_settings())
}

/// The EFA device's context config.
pub fn efa_config() -> ::devices::efa::EfaConfig {
    ::devices::probe::efa_config(&probe_settings())
}

/// The EFA device's largest datagram, when one opens.
pub fn efa_mtu() -> Option<usize> {
    ::devices::probe::efa_mtu(&probe_settings())
}

/// Records that an auto domain could not open the EFA device.
pub fn note_auto_efa_failed() {
    ::devices::probe::note_auto_efa_failed()
}

/// The largest datagram of the RDMA device an auto domain uses for remote peers.
pub fn auto_rdma_mtu() -> Option<usize> {
    ::devices::probe::auto_rdma_mtu(&probe_settings())
}

pub fn device_from_domain_name(name: &str) -> Option<DeviceChoice> {
    match name {
        "auto" => Some(DeviceChoice::Auto),
        "udp" => Some(DeviceChoice::Udp),
        "shm" => Some(DeviceChoice::Shm),
        "verbs" => Some(DeviceChoice::Verbs),
        "efa" => Some(DeviceChoice::Efa),
        _ => None,
    }
}

fn base_profile(device: DeviceChoice, ep_type: fi::fi_ep_type) -> Profile {
    if ep_type == fi::FI_EP_DGRAM {
        let max_msg_size = dgram_max_msg_size(device);
        let p = base_profile(device, fi::FI_EP_RDM);
        let caps = DGRAM_PRIMARY_CAPS | DGRAM_SECONDARY_CAPS | DGRAM_DIRECTION_CAPS;
        return Profile {
            ep_type,
            max_msg_size,
            caps,
            tx_caps: caps & TX_CAPS,
            rx_caps: caps & RX_CAPS,
            msg_order: 0,
            inject_size: p.inject_size.min(max_msg_size),
            ..p
        };
    }
    Profile {
        device,
        ep_type: fi::FI_EP_RDM,
        max_msg_size: MAX_MSG_SIZE,
        caps: ALL_CAPS,
        // fi_endpoint(3): the tx and rx caps are subsets of the info's caps
        // (RX_CAPS also holds FI_SOURCE_ERR, reported only when asked for).
        tx_caps: ALL_CAPS & TX_CAPS,
        rx_caps: ALL_CAPS & RX_CAPS,
        tx_op_flags: 0,
        rx_op_flags: 0,
        msg_order: MSG_ORDER,
        inject_size: params().inject_size,
        tx_size: TX_SIZE,
        rx_size: RX_SIZE,
        tx_iov_limit: IOV_LIMIT,
        rx_iov_limit: IOV_LIMIT,
        threading: fi::FI_THREAD_SAFE,
        progress: fi::FI_PROGRESS_MANUAL,
        av_type: fi::FI_AV_UNSPEC,
        mr_mode: 0,
        domain_caps: DOMAIN_CAPS,
        mem_tag_format: u64::MAX,
        src: None,
        dest: None,
        handle: 0,
        auth_key: None,
        av_auth_key: false,
        api_version: crate::version::declared(),
    }
}

/// The domains `fi_getinfo` offers. `FI_RDMX_DEVICE` set: that one. A hint that
/// names a domain (`fi_pingpong -d udp`): that one. Otherwise `auto`, the best
/// path to every peer, and after it `verbs` when an RDMA device is usable
/// (what `fi_info -p rdmx` shows). `udp` and `shm` are not listed: an MPI
/// library that knows nothing about rdmx spreads its local ranks over the
/// entries that look alike (OpenMPI 4.1 does, as for multi-NIC nodes), which
/// would put ranks on the slow UDP path. The verbs entry is on its own fabric
/// ([`VERBS_FABRIC_NAME`]), so it does not look alike to OpenMPI, and a rank
/// that took it still reaches auto ranks over UD. On a host with an EFA
/// device the second entry is `efa` instead (auto uses SRD there too); `efa`
/// asked for on a host without one gets nothing (`-FI_ENODATA`).
fn usable_devices(hinted_domain: Option<&str>) -> Vec<DeviceChoice> {
    let shm_ok = std::path::Path::new("/dev/shm").is_dir();
    let verbs_ok = || verbs_mtu().is_some();
    let efa_ok = || efa_mtu().is_some();
    if std::env::var_os("FI_RDMX_DEVICE").is_some() {
        return match params().device {
            DeviceChoice::Verbs if !verbs_ok() => vec![],
            DeviceChoice::Efa if !efa_ok() => vec![],
            d => vec![d],
        };
    }
    match hinted_domain.and_then(device_from_domain_name) {
        Some(DeviceChoice::Shm) if !shm_ok => vec![],
        Some(DeviceChoice::Verbs) if !verbs_ok() => vec![],
        Some(DeviceChoice::Efa) if !efa_ok() => vec![],
        Some(d) => vec![d],
        None if efa_ok() => vec![DeviceChoice::Auto, DeviceChoice::Efa],
        None if verbs_ok() => vec![DeviceChoice::Auto, DeviceChoice::Verbs],
        None => vec![DeviceChoice::Auto],
    }
}

/// Threading rank used by libfabric's util code: a provider at rank p satisfies a
/// hint of rank h when h >= p. `None` for a value that is no `FI_THREAD_*`
/// (fi_domain(3) defines only these): a hint naming one asks for a model
/// rdmx knows nothing of, and is refused.
fn threading_rank(t: fi::fi_threading) -> Option<u32> {
    match t {
        fi::FI_THREAD_UNSPEC => Some(0),
        fi::FI_THREAD_SAFE => Some(1),
        fi::FI_THREAD_FID => Some(2),
        fi::FI_THREAD_ENDPOINT => Some(3),
        fi::FI_THREAD_COMPLETION => Some(4),
        fi::FI_THREAD_DOMAIN => Some(5),
        _ => None,
    }
}

/// `FI_PROGRESS_CONTROL_UNIFIED` (fi_domain(3), libfabric 1.21), by value:
/// 1.17's bindings lack it.
pub const PROGRESS_CONTROL_UNIFIED: fi::fi_progress = 3;

/// Whether one progress hint (control or data) can be met under API `version`.
/// rdmx offers manual progress by default and automatic progress (a progress
/// thread per endpoint) when the application asks for it; from 1.21 on also
/// `FI_PROGRESS_CONTROL_UNIFIED`, which is manual progress with the
/// application serialising control and data calls (rdmx locks anyway, so it
/// asks nothing rdmx does not already do).
fn progress_ok(hint: fi::fi_progress, version: u32) -> bool {
    match hint {
        fi::FI_PROGRESS_UNSPEC | fi::FI_PROGRESS_MANUAL => true,
        fi::FI_PROGRESS_AUTO => params().progress_thread,
        PROGRESS_CONTROL_UNIFIED => version >= appended::V1_21,
        _ => false,
    }
}

/// The progress model a domain hint's `control_progress` and
/// `data_progress` ask for, `None` if rdmx cannot meet it: `Some(UNSPEC)`
/// when both are unspecified. `FI_PROGRESS_CONTROL_UNIFIED` in either field
/// (1.21+) is the answer for both (fi_domain(3): it implies manual progress),
/// so it cannot stand beside `FI_PROGRESS_AUTO` in the other. Otherwise the
/// data model, turned automatic by an automatic control model (rdmx has one
/// progress model for both).
fn progress_of(control: fi::fi_progress, data: fi::fi_progress, version: u32) -> Option<fi::fi_progress> {
    if !progress_ok(control, version) || !progress_ok(data, version) {
        return None;
    }
    let has = |p| control == p || data == p;
    if has(PROGRESS_CONTROL_UNIFIED) {
        return (!has(fi::FI_PROGRESS_AUTO)).then_some(PROGRESS_CONTROL_UNIFIED);
    }
    Some(if control == fi::FI_PROGRESS_AUTO { fi::FI_PROGRESS_AUTO } else { data })
}

/// Capabilities a request of API `version` may name beyond the type's caps,
/// each reported only when asked for: `FI_SOURCE_ERR`, and from 2.0 on the
/// directed-receive modifiers (below 2.0 their bits meant other things).
fn asked_only_caps(version: u32) -> u64 {
    if version >= appended::V2_0 {
        SOURCE_ERR | TAGGED_DIRECTED_RECV | EXACT_DIRECTED_RECV
    } else {
        SOURCE_ERR
    }
}

/// `ep_attr.mem_tag_format` as asked under API `version`, `Err` when rdmx
/// cannot honour it, `Ok(None)` to keep its own (all 64 bits). From 2.0 on
/// (fi_endpoint(3)) values below `FI_TAG_MAX_FORMAT` (1 << 16) name formats:
/// 0 is `FI_TAG_BITS` (the default), 1 `FI_TAG_MPI` and 2 `FI_TAG_CCL`, both
/// restrictions of 64-bit tags with ignore masks that rdmx's matching
/// already honours, so they are echoed; any other small value names a format
/// rdmx does not know. Larger values are 1.x bit-field formats, echoed (all
/// rdmx's tags are 64 bits). Before 2.0 every non-zero value is a bit-field format.
fn mem_tag_format(hint: u64, version: u32) -> Result<Option<u64>> {
    const TAG_MPI: u64 = 1;
    const TAG_CCL: u64 = 2;
    const TAG_MAX_FORMAT: u64 = 1 << 16;
    match hint {
        0 => Ok(None),
        TAG_MPI | TAG_CCL if version >= appended::V2_0 => Ok(Some(hint)),
        h if h < TAG_MAX_FORMAT && version >= appended::V2_0 => Err(Error::NoData),
        h => Ok(Some(h)),
    }
}

/// Borrowed view of an application's hints (all pointers checked for null).
struct Hints<'a> {
    info: &'a fi::fi_info,
    tx: Option<&'a fi::fi_tx_attr>,
    rx: Option<&'a fi::fi_rx_attr>,
    ep: Option<&'a fi::fi_ep_attr>,
    dom: Option<&'a fi::fi_domain_attr>,
    fab: Option<&'a fi::fi_fabric_attr>,
}

impl<'a> Hints<'a> {
    /// # Safety
    /// `info` must point to a valid `fi_info` whose attr pointers are null or valid.
    unsafe fn new(info: &'a fi::fi_info) -> Self {
        // SAFETY: per this function's contract, each pointer is null or valid for 'a.
        unsafe {
            Hints {
                info,
                tx: info.tx_attr.as_ref(),
                rx: info.rx_attr.as_ref(),
                ep: info.ep_attr.as_ref(),
                dom: info.domain_attr.as_ref(),
                fab: info.fabric_attr.as_ref(),
            }
        }
    }
}

/// # Safety
/// `p` is null or a valid C string.
unsafe fn opt_cstr<'a>(p: *const libc::c_char) -> Option<&'a str> {
    if p.is_null() {
        None
    } else {
        // SAFETY: non-null and valid per contract.
        unsafe { CStr::from_ptr(p) }.to_str().ok()
    }
}

/// `FI_AV_AUTH_KEY` (fabric.h, 1.20; by value for 1.17's headers): an
/// `auth_key_size` asking for the keys of the AV.
pub const FI_AV_AUTH_KEY: usize = usize::MAX;

/// Jobs one endpoint serves at most (`max_ep_auth_key`) on a path that can
/// tell them apart (udp and shared memory; verbs and EFA filter one job's
/// Q_Key in the NIC).
pub const MAX_EP_AUTH_KEY: usize = rdm::engine::JOBS_MAX;

/// Whether endpoints of `p` may serve several jobs.
fn multi_job(p: &Profile) -> bool {
    p.ep_type == fi::FI_EP_RDM
        && match p.device {
            DeviceChoice::Udp | DeviceChoice::Shm => true,
            DeviceChoice::Auto => auto_rdma_mtu().is_none(),
            DeviceChoice::Verbs | DeviceChoice::Efa => false,
        }
}

/// An `auth_key` as rdmx takes it ([`AuthKey::from_bytes`]).
///
/// # Safety
/// `key` is null or valid for `len` bytes.
unsafe fn auth_key(key: *const u8, len: usize) -> Result<Option<AuthKey>> {
    // Checked before the pointer: `FI_AV_AUTH_KEY` (SIZE_MAX, keys per AV
    // entry) comes with no key, and is not offered.
    if len > rdm::engine::seal::SECRET_MAX_LEN {
        return Err(Error::NoData);
    }
    if key.is_null() || len == 0 {
        return Ok(None);
    }
    // SAFETY: per contract.
    AuthKey::from_bytes(unsafe { std::slice::from_raw_parts(key, len) })
}

/// A DGRAM profile whose `auth_key` is a job secret: each datagram's sealed
/// trailer takes room from the largest message (unless a secret in the
/// environment took it already).
fn sealed_room(p: &mut Profile, k: &AuthKey) {
    if p.ep_type == fi::FI_EP_DGRAM && matches!(k, AuthKey::Secret(_)) && params().job_secret.is_none() {
        p.max_msg_size = p.max_msg_size.saturating_sub(rdm::engine::TRAILER_LEN);
        p.inject_size = p.inject_size.min(p.max_msg_size);
    }
}

/// Applies one hint set to a profile: `Err(NoData)` if it cannot be satisfied,
/// otherwise the altered profile (ofi_check_info + ofi_alter_info).
fn match_hints(mut p: Profile, h: &Hints<'_>, version: u32) -> Result<Profile> {
    let hi = h.info;
    let tc = TypeCaps::of(p.ep_type);
    p.api_version = version;
    // Capabilities. FI_TAGGED_MULTI_RECV and, below 2.0, bits 45 and 48 are
    // refused here: nothing allows them.
    let asked_only = asked_only_caps(version);
    if hi.caps & !(tc.all() | asked_only) != 0 || (hi.caps & SOURCE_ERR != 0 && hi.caps & SOURCE == 0) {
        return Err(Error::NoData);
    }
    // Modes: rdmx requires none, so any hinted mode set is fine.
    // Address format.
    if hi.addr_format != fi::FI_FORMAT_UNSPEC {
        return Err(Error::NoData);
    }
    if let Some(ep) = h.ep {
        if ep.type_ != fi::FI_EP_UNSPEC && ep.type_ != p.ep_type {
            return Err(Error::NoData);
        }
        if ep.protocol != fi::FI_PROTO_UNSPEC {
            return Err(Error::NoData);
        }
        if ep.max_msg_size > p.max_msg_size {
            return Err(Error::NoData);
        }
        // RMA and atomic requests are messages delivered in order per peer, and
        // the target serves them in that order: any size up to max_msg_size is
        // ordered. A hint asking for more than that cannot be met (nor any for
        // DGRAM endpoints, which have no RMA).
        let order_max = max_order_size(&p);
        if ep.max_order_raw_size > order_max || ep.max_order_war_size > order_max || ep.max_order_waw_size > order_max {
            return Err(Error::NoData);
        }
        if ep.tx_ctx_cnt > 1 || ep.rx_ctx_cnt > 1 {
            // Includes FI_SHARED_CONTEXT (usize::MAX): no shared or scalable contexts.
            return Err(Error::NoData);
        }
        if let Some(f) = mem_tag_format(ep.mem_tag_format, version)? {
            p.mem_tag_format = f;
        }
        // SAFETY: auth_key points at auth_key_size bytes when non-null.
        if let Some(k) = unsafe { auth_key(ep.auth_key, ep.auth_key_size) }? {
            sealed_room(&mut p, &k);
            p.auth_key = Some(k);
        }
    }
    if let Some(fab) = h.fab {
        // SAFETY: hints come from the application; names are C strings or null.
        if let Some(name) = unsafe { opt_cstr(fab.name) } {
            if name != fabric_name(p.device) {
                return Err(Error::NoData);
            }
        }
        if fab.api_version != 0 && fab.api_version > crate::version::declared() {
            return Err(Error::NoData);
        }
    }
    if let Some(dom) = h.dom {
        // SAFETY: as above.
        if let Some(name) = unsafe { opt_cstr(dom.name) } {
            if name != domain_name(p.device) {
                return Err(Error::NoData);
            }
        }
        // rdmx is FI_THREAD_SAFE, the lowest rank: every known model is met.
        if threading_rank(dom.threading).is_none() {
            return Err(Error::NoData);
        }
        let progress = progress_of(dom.control_progress, dom.get_data_progress(), version).ok_or(Error::NoData)?;
        if dom.caps & !DOMAIN_CAPS != 0 {
            return Err(Error::NoData);
        }
        if dom.cq_data_size > CQ_DATA_SIZE
            || dom.mr_key_size > 8
            || dom.max_ep_tx_ctx > 1
            || dom.max_ep_rx_ctx > 1
            || dom.max_ep_stx_ctx > 0
            || dom.max_ep_srx_ctx > 0
            || dom.max_err_data > 0
        {
            return Err(Error::NoData);
        }
        if dom.auth_key_size == FI_AV_AUTH_KEY {
            // Keys per AV entry (fi_domain(3), 1.20): none beside them, and
            // only where an endpoint can serve several jobs.
            if version < appended::V1_20 || !dom.auth_key.is_null() || p.auth_key.is_some() || !multi_job(&p) {
                return Err(Error::NoData);
            }
            p.av_auth_key = true;
        } else if p.auth_key.is_none() {
            // SAFETY: as above.
            p.auth_key = unsafe { auth_key(dom.auth_key, dom.auth_key_size) }?;
            if let Some(k) = p.auth_key.clone() {
                sealed_room(&mut p, &k);
            }
        }
        // SAFETY: `domain_attr` is non-null (`h.dom` is Some) and, as the
        // hints of a request of API `version` (<= the running library's), was
        // allocated with every field that version has (`appended`).
        let (max_ep_auth_key, max_group_id) = unsafe {
            (appended::max_ep_auth_key(hi.domain_attr, version), appended::max_group_id(hi.domain_attr, version))
        };
        // Several authorization keys per endpoint where jobs are told apart
        // in software; no peer groups.
        let keys_max = if multi_job(&p) { MAX_EP_AUTH_KEY } else { 1 };
        if max_ep_auth_key > keys_max || max_group_id != 0 {
            return Err(Error::NoData);
        }
        if dom.av_type != fi::FI_AV_UNSPEC {
            if dom.av_type != fi::FI_AV_MAP && dom.av_type != fi::FI_AV_TABLE {
                return Err(Error::NoData);
            }
            p.av_type = dom.av_type;
        }
        if dom.threading != fi::FI_THREAD_UNSPEC {
            p.threading = dom.threading;
        }
        let mr = dom.mr_mode;
        p.mr_mode = if mr == fi::FI_MR_BASIC as i32 || mr == fi::FI_MR_SCALABLE as i32 {
            // Legacy values are echoed exactly (rdmx needs no registration).
            mr
        } else if mr == fi::FI_MR_UNSPEC as i32 && version < fi::fi_version_num(1, 5) {
            fi::FI_MR_SCALABLE as i32
        } else {
            mr & MR_MODE_ACCEPTED
        };
        if progress != fi::FI_PROGRESS_UNSPEC {
            p.progress = progress;
        }
        p.domain_caps = if dom.caps != 0 { dom.caps & DOMAIN_CAPS } else { DOMAIN_CAPS };
    }
    // Direction-specific attributes.
    if let Some(tx) = h.tx {
        if tx.caps & !(tc.all() | asked_only) != 0
            || tx.op_flags & !tc.tx_op_flags != 0
            || tx.msg_order & !tc.msg_order != 0
            || tx.comp_order & !(fi::FI_ORDER_NONE as u64) != 0
            || tx.inject_size > p.inject_size
            || tx.size > TX_SIZE
            || tx.iov_limit > IOV_LIMIT
            || tx.rma_iov_limit > 1
        {
            return Err(Error::NoData);
        }
        p.tx_op_flags = tx.op_flags;
        if tx.inject_size != 0 {
            p.inject_size = tx.inject_size;
        }
        if tx.size != 0 {
            p.tx_size = tx.size;
        }
        if tx.iov_limit != 0 {
            p.tx_iov_limit = tx.iov_limit;
        }
    }
    if let Some(rx) = h.rx {
        if rx.caps & !(tc.all() | asked_only) != 0
            || rx.op_flags & !tc.rx_op_flags != 0
            || rx.msg_order & !tc.msg_order != 0
            || rx.comp_order & !(fi::FI_ORDER_NONE as u64) != 0
            || rx.size > RX_SIZE
            || rx.iov_limit > IOV_LIMIT
        {
            return Err(Error::NoData);
        }
        p.rx_op_flags = rx.op_flags;
        if rx.size != 0 {
            p.rx_size = rx.size;
        }
        if rx.iov_limit != 0 {
            p.rx_iov_limit = rx.iov_limit;
        }
    }
    // Output capabilities: what was asked (or everything), plus secondary caps.
    // The 2.0 directed-receive caps are primary ones (fi_getinfo(3)) that are
    // never in the default set: asking for one alone asks for it alone.
    let directed = asked_only & !SOURCE_ERR;
    let primary_req = hi.caps & (tc.primary | directed | tc.direction);
    let mut caps =
        if hi.caps & (tc.primary | directed) != 0 { primary_req } else { tc.primary | (hi.caps & tc.direction) };
    if caps & tc.direction == 0 {
        caps |= tc.direction;
    }
    caps |= tc.secondary | (hi.caps & SOURCE_ERR);
    if caps & (RMA | ATOMIC) == 0 || caps & (REMOTE_READ | REMOTE_WRITE) == 0 {
        // FI_RMA_EVENT needs something to be the target of (fi_getinfo(3)).
        if hi.caps & RMA_EVENT != 0 {
            return Err(Error::NoData);
        }
        caps &= !RMA_EVENT;
    }
    p.caps = caps;
    p.tx_caps = caps & TX_CAPS;
    p.rx_caps = caps & RX_CAPS;
    p.handle = hi.handle as usize;
    Ok(p)
}

/// The largest RMA/atomic size ordered (`max_order_*_size`): everything for
/// RDM, nothing for DGRAM (no RMA, no order).
fn max_order_size(p: &Profile) -> usize {
    if p.ep_type == fi::FI_EP_DGRAM {
        0
    } else {
        p.max_msg_size
    }
}

/// libfabric's internal `fi_getinfo` flag (`ofi.h`) with which a utility
/// provider asks for core providers to layer on.
const OFI_CORE_PROV_ONLY: u64 = 1 << 59;

/// The endpoint types a hint asks for: the one it names; unnamed, only RDM. An
/// application with no preference wants the reliable endpoint, and one entry
/// per domain keeps MPI libraries from taking a DGRAM entry for another rail.
/// No hints at all ask what the provider offers (fi_getinfo(3): "all
/// available communication interfaces"): RDM first, then DGRAM.
///
/// DGRAM is not offered to utility providers (`OFI_CORE_PROV_ONLY`): ofi_rxd
/// would layer an RDM endpoint on it, and every RDM answer of `FI_PROVIDER=rdmx`
/// would carry an `rdmx;ofi_rxd` entry beside rdmx's own (MPI libraries spread
/// ranks over entries) that only adds a second reliability layer.
fn ep_types(hints: Option<&Hints<'_>>, flags: u64) -> Vec<fi::fi_ep_type> {
    if hints.is_none() {
        return if flags & OFI_CORE_PROV_ONLY == 0 {
            vec![fi::FI_EP_RDM, fi::FI_EP_DGRAM]
        } else {
            vec![fi::FI_EP_RDM]
        };
    }
    match hints.and_then(|h| h.ep).map(|e| e.type_) {
        Some(fi::FI_EP_DGRAM) if flags & OFI_CORE_PROV_ONLY == 0 => vec![fi::FI_EP_DGRAM],
        Some(fi::FI_EP_RDM) | Some(fi::FI_EP_UNSPEC) | None => vec![fi::FI_EP_RDM],
        Some(_) => vec![],
    }
}

/// Resolves `node`/`service` to a socket address (service = UDP port).
fn resolve(node: Option<&str>, service: Option<&str>, passive: bool) -> Result<SocketAddr> {
    let port: u16 = match service {
        Some(s) => s.parse().map_err(|_| Error::NoData)?,
        None => 0,
    };
    match node {
        Some(n) => {
            let found = (n, port).to_socket_addrs().map_err(|_| Error::NoData)?;
            let v: Vec<SocketAddr> = found.collect();
            v.iter().find(|a| a.is_ipv4()).or(v.first()).copied().ok_or(Error::NoData)
        }
        None if passive => Ok(SocketAddr::new(default_ip(), port)),
        None => Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)),
    }
}

/// The IP the UDP device binds to when the application names none: `FI_RDMX_IFACE`
/// (an IP, or an interface name), else the interface chosen by
/// `devices::iface`'s documented order (never the host name's address
/// blindly: Debian maps it to 127.0.1.1), else 127.0.0.1. The choice is logged once
/// at info level.
pub fn default_ip() -> IpAddr {
    if let Some(iface) = &params().iface {
        if let Ok(ip) = iface.parse::<IpAddr>() {
            return ip;
        }
        if let Some(ip) = ::devices::iface::addrs_of(iface, true).ok().and_then(|v| v.first().copied()) {
            return ip;
        }
        fi_warn!(Subsys::Core, "FI_RDMX_IFACE={iface:?}: no such interface with an address; choosing one as if unset");
    }
    static LOGGED: std::sync::Once = std::sync::Once::new();
    let choice = ::devices::iface::default_choice(true);
    LOGGED.call_once(|| {
        let on = choice.iface.as_deref().unwrap_or("loopback");
        if choice.iface.is_none() {
            fi_warn!(Subsys::Core, "UDP address {} ({on}): {}", choice.ip, choice.reason);
        } else {
            fi_info!(
                Subsys::Core,
                "UDP address {} on {on}: {} (set FI_RDMX_IFACE to choose another)",
                choice.ip,
                choice.reason
            );
        }
    });
    choice.ip
}

/// # Safety
/// `ptr` is null or valid for `len` bytes.
unsafe fn addr_from_raw(ptr: *const libc::c_void, len: usize) -> Option<Vec<u8>> {
    if ptr.is_null() || len == 0 {
        return None;
    }
    // SAFETY: per contract.
    Some(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec())
}

/// The whole getinfo: returns the matching profiles, best first.
///
/// # Safety
/// `node`, `service` are null or C strings; `hints` is null or a valid fi_info.
pub unsafe fn getinfo(
    version: u32,
    node: *const libc::c_char,
    service: *const libc::c_char,
    flags: u64,
    hints: *const fi::fi_info,
) -> Result<Vec<Profile>> {
    if version > crate::version::declared() {
        return Err(Error::NoData);
    }
    // Once per process, at info level: how job traffic goes for endpoints
    // that bring no key of their own (`FI_LOG_LEVEL=info fi_info -p rdmx`
    // shows it; fi_info has no attribute for it).
    static JOB_MODE_LOGGED: std::sync::Once = std::sync::Once::new();
    JOB_MODE_LOGGED.call_once(|| {
        let p = params();
        fi_info!(Subsys::Core, "{}", crate::job::environment_mode(p.job_secret.as_ref(), p.job_key, p.job_encrypt))
    });
    // SAFETY: per contract.
    let (node, service) = unsafe { (opt_cstr(node), opt_cstr(service)) };
    // SAFETY: per contract.
    let hints = unsafe { hints.as_ref().map(|h| Hints::new(h)) };
    let source = flags & fi::FI_SOURCE != 0;
    if source && node.is_none() && service.is_none() {
        return Err(Error::Inval("FI_SOURCE without node or service"));
    }
    // Addresses: FI_SOURCE names the local address; otherwise node/service name the
    // destination.
    let mut src_sock: Option<SocketAddr> = None;
    let mut dest: Option<Vec<u8>> = None;
    if node.is_some() || service.is_some() {
        let sa = resolve(node, service, source)?;
        if source {
            src_sock = Some(sa);
        } else {
            dest = Some(RdmxAddr { udp: Some(sa), ..RdmxAddr::EMPTY }.encode().to_vec());
        }
    }
    if let Some(h) = &hints {
        // SAFETY: the application's hint addresses are valid for their lengths.
        unsafe {
            if let Some(src) = addr_from_raw(h.info.src_addr, h.info.src_addrlen) {
                let a = RdmxAddr::decode(&src).ok_or(Error::NoData)?;
                src_sock = src_sock.or(a.udp);
            }
            if dest.is_none() {
                if let Some(d) = addr_from_raw(h.info.dest_addr, h.info.dest_addrlen) {
                    RdmxAddr::decode(&d).ok_or(Error::NoData)?;
                    dest = Some(d);
                }
            }
        }
    }
    let host_id = ::devices::host::host_id();
    let mut out = Vec::new();
    // SAFETY: hints come from the application; the name is a C string or null.
    let hinted_domain = hints.as_ref().and_then(|h| h.dom).and_then(|d| unsafe { opt_cstr(d.name) });
    for (dev, ep_type) in usable_devices(hinted_domain)
        .into_iter()
        .flat_map(|d| ep_types(hints.as_ref(), flags).into_iter().map(move |t| (d, t)))
    {
        let mut p = base_profile(dev, ep_type);
        p.api_version = version;
        if let Some(h) = &hints {
            match match_hints(p, h, version) {
                Ok(m) => p = m,
                Err(_) => continue,
            }
        }
        let udp = match dev {
            DeviceChoice::Shm | DeviceChoice::Verbs | DeviceChoice::Efa => None,
            _ => Some(src_sock.unwrap_or_else(|| SocketAddr::new(default_ip(), 0))),
        };
        p.src = Some(RdmxAddr {
            udp,
            host_id,
            incarnation: 0,
            pid: std::process::id(),
            has_shm: matches!(dev, DeviceChoice::Auto | DeviceChoice::Shm),
            ud: None,
        });
        if let Some(d) = &dest {
            // A shm-only domain cannot reach a peer on another host.
            if dev == DeviceChoice::Shm {
                match RdmxAddr::decode(d) {
                    Some(a) if a.has_shm && a.host_id == host_id => {}
                    _ => continue,
                }
            }
            p.dest = Some(d.clone());
        }
        out.push(p);
    }
    if out.is_empty() {
        Err(Error::NoData)
    } else {
        Ok(out)
    }
}

fn strdup(s: &str) -> *mut libc::c_char {
    let c = CString::new(s).unwrap_or_default();
    // SAFETY: `c` is a valid C string; strdup allocates with libc malloc, which is
    // what fi_freeinfo uses to free it.
    unsafe { libc::strdup(c.as_ptr()) }
}

fn malloc_copy(bytes: &[u8]) -> *mut libc::c_void {
    // SAFETY: malloc returns null or a block of the requested size; fi_freeinfo
    // frees it with free().
    let p = unsafe { libc::malloc(bytes.len().max(1)) };
    if !p.is_null() {
        // SAFETY: `p` has room for bytes.len() bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p as *mut u8, bytes.len()) };
    }
    p
}

/// Writes a profile into a freshly allocated `fi_info` (libfabric-owned memory).
pub fn to_fi_info(p: &Profile) -> Result<*mut fi::fi_info> {
    // SAFETY: fi_dupinfo(NULL) allocates an fi_info with all attr structs zeroed.
    let info = unsafe { fi::fi_dupinfo(std::ptr::null()) };
    if info.is_null() {
        return Err(Error::NoMem);
    }
    // SAFETY: `info` and its attr structs were just allocated by libfabric and are
    // exclusively ours until returned.
    unsafe {
        let i = &mut *info;
        i.caps = p.caps;
        i.mode = 0;
        i.addr_format = fi::FI_FORMAT_UNSPEC;
        i.handle = p.handle as fi::fid_t;
        if let Some(src) = &p.src {
            i.src_addr = malloc_copy(&src.encode());
            i.src_addrlen = ADDR_LEN;
        }
        if let Some(dest) = &p.dest {
            i.dest_addr = malloc_copy(dest);
            i.dest_addrlen = dest.len();
        }
        let tx = &mut *i.tx_attr;
        tx.caps = p.tx_caps;
        tx.mode = 0;
        tx.op_flags = p.tx_op_flags;
        tx.msg_order = p.msg_order;
        tx.comp_order = fi::FI_ORDER_NONE as u64;
        tx.inject_size = p.inject_size;
        tx.size = p.tx_size;
        tx.iov_limit = p.tx_iov_limit;
        tx.rma_iov_limit = if p.caps & RMA != 0 { 1 } else { 0 };
        let rx = &mut *i.rx_attr;
        rx.caps = p.rx_caps;
        rx.mode = 0;
        rx.op_flags = p.rx_op_flags;
        rx.msg_order = p.msg_order;
        rx.comp_order = fi::FI_ORDER_NONE as u64;
        rx.total_buffered_recv = 0;
        rx.size = p.rx_size;
        rx.iov_limit = p.rx_iov_limit;
        let ep = &mut *i.ep_attr;
        ep.type_ = p.ep_type;
        ep.protocol = fi::FI_PROTO_UNSPEC;
        ep.protocol_version = 1;
        ep.max_msg_size = p.max_msg_size;
        ep.max_order_raw_size = max_order_size(p);
        ep.max_order_war_size = max_order_size(p);
        ep.max_order_waw_size = max_order_size(p);
        ep.msg_prefix_size = 0;
        ep.mem_tag_format = p.mem_tag_format;
        ep.tx_ctx_cnt = 1;
        ep.rx_ctx_cnt = 1;
        if let Some(k) = &p.auth_key {
            let bytes = k.bytes();
            ep.auth_key = malloc_copy(&bytes) as *mut u8;
            ep.auth_key_size = if ep.auth_key.is_null() { 0 } else { bytes.len() };
        }
        let d = &mut *i.domain_attr;
        if p.av_auth_key {
            // Echoed, so that fi_domain on this info opens the same kind.
            d.auth_key = std::ptr::null_mut();
            d.auth_key_size = FI_AV_AUTH_KEY;
        }
        d.name = strdup(domain_name(p.device));
        d.threading = p.threading;
        d.control_progress = p.progress;
        d.set_data_progress(p.progress);
        d.resource_mgmt = fi::FI_RM_ENABLED;
        d.av_type = p.av_type;
        d.mr_mode = p.mr_mode;
        d.mr_key_size = 8;
        d.cq_data_size = CQ_DATA_SIZE;
        d.cq_cnt = 1024;
        d.ep_cnt = 1024;
        d.tx_ctx_cnt = 1024;
        d.rx_ctx_cnt = 1024;
        d.max_ep_tx_ctx = 1;
        d.max_ep_rx_ctx = 1;
        d.max_ep_stx_ctx = 0;
        d.max_ep_srx_ctx = 0;
        d.cntr_cnt = 1024;
        d.mr_iov_limit = IOV_LIMIT;
        d.caps = p.domain_caps;
        d.mode = 0;
        d.max_err_data = 0;
        d.mr_cnt = 1 << 16;
        // fi_dupinfo(NULL) of the running library allocated every field of
        // p.api_version (never newer than it: getinfo refuses that). Every
        // symbol version of fi_dupinfo, the compat ones a 1.x-header build
        // binds included, allocates the running library's whole struct for
        // NULL (ofi_allocinfo_internal).
        appended::set_max_ep_auth_key(i.domain_attr, p.api_version, if multi_job(p) { MAX_EP_AUTH_KEY } else { 1 });
        // Counters are full 64-bit values (fi_domain(3) 2.5: UINT64_MAX is
        // "the full counter range"); no hint can ask for more, so none is
        // refused for these fields.
        appended::set_max_cntr_values(i.domain_attr, p.api_version, u64::MAX, u64::MAX);
        let f = &mut *i.fabric_attr;
        f.name = strdup(fabric_name(p.device));
        f.prov_name = std::ptr::null_mut();
        f.prov_version = crate::PROVIDER_VERSION;
        f.api_version = crate::version::declared();
    }
    Ok(info)
}

/// Reads back what the application passed to `fi_domain` / `fi_endpoint` (an info
/// we returned, possibly edited), under API `version`: the fabric's
/// `api_version`, which libfabric sets to the version the application asked
/// for after `fi_fabric` (see `Fabric::api_version`).
///
/// # Safety
/// `info` is null or a valid fi_info.
pub unsafe fn profile_from_info(info: *const fi::fi_info, version: u32) -> Result<Profile> {
    // SAFETY: per contract.
    let Some(i) = (unsafe { info.as_ref() }) else {
        return Ok(Profile { api_version: version, ..base_profile(params().device, fi::FI_EP_RDM) });
    };
    // SAFETY: per contract, attrs are null or valid.
    let h = unsafe { Hints::new(i) };
    let dev = h
        .dom
        // SAFETY: as above.
        .and_then(|d| unsafe { opt_cstr(d.name) })
        .map(|n| device_from_domain_name(n).ok_or(Error::Inval("unknown rdmx domain name")))
        .transpose()?
        .unwrap_or(params().device);
    let ep_type = match h.ep.map(|e| e.type_) {
        Some(fi::FI_EP_DGRAM) => fi::FI_EP_DGRAM,
        Some(fi::FI_EP_RDM) | Some(fi::FI_EP_UNSPEC) | None => fi::FI_EP_RDM,
        Some(_) => return Err(Error::Inval("rdmx endpoints are FI_EP_RDM or FI_EP_DGRAM")),
    };
    let mut p = match_hints(base_profile(dev, ep_type), &h, version)
        .map_err(|_| Error::Inval("info does not describe an rdmx endpoint"))?;
    // SAFETY: as above.
    unsafe {
        if let Some(src) = addr_from_raw(i.src_addr, i.src_addrlen) {
            p.src = RdmxAddr::decode(&src);
        }
    }
    Ok(p)
}

/// Fields libfabric appended to its structs after 1.17, read and written by
/// byte offset so that one rdmx reaches them whichever headers it was built
/// against (1.17's bindings have no name for them), and only when the API
/// version in play has them: a struct the application compiled against an
/// older libfabric, or allocated itself, ends where that version's ends.
/// Every struct here grows at its end only (fabric(7)), so an offset never
/// moves once defined. The offsets are tied to the bindings by the
/// assertions below: each new field starts where the last 1.17 field ends
/// (checked against whichever headers are in use), and headers that have
/// the fields are at least that long.
pub mod appended {
    use libfabric_sys as fi;
    use std::mem::{offset_of, size_of};

    pub const V1_20: u32 = fi::fi_version_num(1, 20);
    pub const V1_21: u32 = fi::fi_version_num(1, 21);
    pub const V2_0: u32 = fi::fi_version_num(2, 0);
    pub const V2_5: u32 = fi::fi_version_num(2, 5);

    /// `fi_domain_attr.max_ep_auth_key` (size_t, 1.20): after `tclass`, the
    /// last 1.17 field (a u32, padded to 8).
    pub const DOMAIN_MAX_EP_AUTH_KEY: usize = 192;
    /// `fi_domain_attr.max_group_id` (uint32_t, 2.0).
    pub const DOMAIN_MAX_GROUP_ID: usize = DOMAIN_MAX_EP_AUTH_KEY + 8;
    /// `fi_domain_attr.max_cntr_value` (uint64_t, 2.5): after `max_group_id`,
    /// a u32 padded to 8.
    pub const DOMAIN_MAX_CNTR_VALUE: usize = DOMAIN_MAX_GROUP_ID + 8;
    /// `fi_domain_attr.max_err_cntr_value` (uint64_t, 2.5), the last field
    /// of a 2.5 domain attr (224 bytes).
    pub const DOMAIN_MAX_ERR_CNTR_VALUE: usize = DOMAIN_MAX_CNTR_VALUE + 8;
    /// `fi_mr_attr.base_mr` (const struct fid_mr *, 2.0): after `device` (the
    /// last 1.17 field, 8 bytes), `hmem_data` (1.19) and `page_size` (2.0).
    pub const MR_ATTR_BASE_MR: usize = 96;
    /// `fi_cq_err_entry.src_addr` (fi_addr_t, 1.20): after `err_data_size`,
    /// the last 1.17 field.
    pub const CQ_ERR_SRC_ADDR: usize = 80;

    const BUILT: u32 = crate::version::BUILT_API;
    const _: () = assert!(offset_of!(fi::fi_domain_attr, tclass) + 8 == DOMAIN_MAX_EP_AUTH_KEY);
    const _: () = assert!(offset_of!(fi::fi_mr_attr, device) + 8 + 8 + 8 == MR_ATTR_BASE_MR);
    const _: () = assert!(offset_of!(fi::fi_cq_err_entry, err_data_size) + 8 == CQ_ERR_SRC_ADDR);
    // The first field of fi_mr_attr (`mr_iov`, in 2.x a union with `dmabuf`)
    // is one pointer at offset 0 (read by `mr.rs` without naming it).
    const _: () = assert!(offset_of!(fi::fi_mr_attr, iov_count) == size_of::<*const fi::iovec>());
    // Headers older than a field end where it starts; headers that have it
    // reach past it.
    const _: () = assert!(if BUILT >= V1_20 {
        size_of::<fi::fi_domain_attr>() >= DOMAIN_MAX_EP_AUTH_KEY + 8
    } else {
        size_of::<fi::fi_domain_attr>() == DOMAIN_MAX_EP_AUTH_KEY
    });
    const _: () = assert!(BUILT < V2_0 || size_of::<fi::fi_domain_attr>() >= DOMAIN_MAX_GROUP_ID + 4);
    const _: () = assert!(BUILT < V2_0 || size_of::<fi::fi_mr_attr>() >= MR_ATTR_BASE_MR + 8);
    // 2.0 to 2.4 headers end after max_group_id's padding, where the 2.5
    // fields start; 2.5 headers reach past both.
    const _: () = assert!(if BUILT >= V2_5 {
        size_of::<fi::fi_domain_attr>() >= DOMAIN_MAX_ERR_CNTR_VALUE + 8
    } else {
        BUILT < V2_0 || size_of::<fi::fi_domain_attr>() == DOMAIN_MAX_CNTR_VALUE
    });
    const _: () = assert!(if BUILT >= V1_20 {
        size_of::<fi::fi_cq_err_entry>() >= CQ_ERR_SRC_ADDR + 8
    } else {
        size_of::<fi::fi_cq_err_entry>() == CQ_ERR_SRC_ADDR
    });

    /// Reads a `T` at byte `offset` of the struct at `base`.
    ///
    /// # Safety
    /// `base` points at a live struct at least `offset + size_of::<T>()` bytes long.
    unsafe fn read_at<T: Copy>(base: *const u8, offset: usize) -> T {
        // SAFETY: per contract; unaligned, since nothing here promises more
        // than the C layout's alignment.
        unsafe { std::ptr::read_unaligned(base.add(offset) as *const T) }
    }

    /// Writes a `T` at byte `offset` of the struct at `base`.
    ///
    /// # Safety
    /// `base` points at a live, writable struct at least `offset + size_of::<T>()` bytes long.
    unsafe fn write_at<T: Copy>(base: *mut u8, offset: usize, v: T) {
        // SAFETY: per contract.
        unsafe { std::ptr::write_unaligned(base.add(offset) as *mut T, v) }
    }

    /// `max_ep_auth_key` of a domain attr under API `version`; 0 (unset)
    /// before 1.20.
    ///
    /// # Safety
    /// `attr` points at an `fi_domain_attr` with every field of `version`.
    pub unsafe fn max_ep_auth_key(attr: *const fi::fi_domain_attr, version: u32) -> usize {
        if version < V1_20 {
            return 0;
        }
        // SAFETY: per contract, the struct reaches past the 1.20 field.
        unsafe { read_at(attr as *const u8, DOMAIN_MAX_EP_AUTH_KEY) }
    }

    /// `max_group_id` of a domain attr under API `version`; 0 (no peer
    /// groups) before 2.0.
    ///
    /// # Safety
    /// As [`max_ep_auth_key`].
    pub unsafe fn max_group_id(attr: *const fi::fi_domain_attr, version: u32) -> u32 {
        if version < V2_0 {
            return 0;
        }
        // SAFETY: per contract, the struct reaches past the 2.0 field.
        unsafe { read_at(attr as *const u8, DOMAIN_MAX_GROUP_ID) }
    }

    /// Whether the heap block at `attr` holds `end` bytes. `fi_version()` says
    /// which struct the running library allocates, but a library can answer a
    /// version it does not have (an LD_PRELOADed `fi_version`, as the version
    /// test does; a wrapper library): a write past the block the library
    /// really allocated would corrupt its heap, so the block itself decides.
    ///
    /// # Safety
    /// `attr` is a block from the C allocator (libfabric's `fi_dupinfo` callocs
    /// each attr struct).
    unsafe fn block_holds(attr: *const fi::fi_domain_attr, end: usize) -> bool {
        // SAFETY: per contract, a live malloc'd block.
        unsafe { libc::malloc_usable_size(attr as *mut libc::c_void) >= end }
    }

    /// Sets `max_ep_auth_key` of a domain attr when API `version` has it
    /// (and the running library allocated it): nothing before 1.20.
    ///
    /// # Safety
    /// `attr` points at a writable `fi_domain_attr` that the running
    /// library allocated with the C allocator (`fi_dupinfo`).
    pub unsafe fn set_max_ep_auth_key(attr: *mut fi::fi_domain_attr, version: u32, v: usize) {
        if version < V1_20
            || !crate::version::running_at_least(V1_20)
            // SAFETY: per contract.
            || !unsafe { block_holds(attr, DOMAIN_MAX_EP_AUTH_KEY + 8) }
        {
            return;
        }
        // SAFETY: per contract, the struct reaches past the 1.20 field.
        unsafe { write_at(attr as *mut u8, DOMAIN_MAX_EP_AUTH_KEY, v) }
    }

    /// Sets `max_cntr_value` and `max_err_cntr_value` of a domain attr when
    /// API `version` has them (and the running library allocated them):
    /// nothing before 2.5.
    ///
    /// # Safety
    /// As [`set_max_ep_auth_key`].
    pub unsafe fn set_max_cntr_values(attr: *mut fi::fi_domain_attr, version: u32, v: u64, err: u64) {
        if version < V2_5
            || !crate::version::running_at_least(V2_5)
            // SAFETY: per contract.
            || !unsafe { block_holds(attr, DOMAIN_MAX_ERR_CNTR_VALUE + 8) }
        {
            return;
        }
        // SAFETY: per contract, the struct reaches past the 2.5 fields.
        unsafe {
            write_at(attr as *mut u8, DOMAIN_MAX_CNTR_VALUE, v);
            write_at(attr as *mut u8, DOMAIN_MAX_ERR_CNTR_VALUE, err);
        }
    }

    /// `base_mr` of an MR attr under API `version`; null before 2.0.
    ///
    /// # Safety
    /// `attr` points at an `fi_mr_attr` with every field of `version`.
    pub unsafe fn base_mr(attr: *const fi::fi_mr_attr, version: u32) -> *const libc::c_void {
        if version < V2_0 {
            return std::ptr::null();
        }
        // SAFETY: per contract, the struct reaches past the 2.0 field.
        unsafe { read_at(attr as *const u8, MR_ATTR_BASE_MR) }
    }

    /// Sets `src_addr` of a CQ error entry when API `version` has it: nothing before 1.20.
    ///
    /// # Safety
    /// `entry` points at a writable `fi_cq_err_entry` with every field of `version`.
    pub unsafe fn set_cq_err_src_addr(entry: *mut fi::fi_cq_err_entry, version: u32, addr: u64) {
        if version < V1_20 {
            return;
        }
        // SAFETY: per contract, the struct reaches past the 1.20 field.
        unsafe { write_at(entry as *mut u8, CQ_ERR_SRC_ADDR, addr) }
    }
}

#[cfg(test)]
mod efa_tests {
    use super::*;

    /// `efa` is offered only where an EFA device opens: asked for by domain
    /// name on a host without one (every host this has run on), fi_getinfo
    /// finds nothing (`-FI_ENODATA`), as verbs does without RDMA hardware.
    #[test]
    fn efa_without_a_device_is_no_data() {
        if std::env::var_os("FI_RDMX_DEVICE").is_some() {
            return;
        }
        assert_eq!(device_from_domain_name("efa"), Some(DeviceChoice::Efa));
        assert_eq!((domain_name(DeviceChoice::Efa), fabric_name(DeviceChoice::Efa)), ("efa", EFA_FABRIC_NAME));
        let here = efa_mtu().is_some();
        assert_eq!(usable_devices(Some("efa")), if here { vec![DeviceChoice::Efa] } else { vec![] });
        assert_eq!(usable_devices(None).contains(&DeviceChoice::Efa), here);
        let mut dom = fi::fi_domain_attr { name: c"efa".as_ptr() as *mut _, ..Default::default() };
        let hints = fi::fi_info { domain_attr: &mut dom, ..Default::default() };
        // SAFETY: null node and service; hints a valid fi_info whose one
        // pointer names a live domain attr with a C string name.
        let got = unsafe { getinfo(crate::version::declared(), std::ptr::null(), std::ptr::null(), 0, &hints) };
        if here {
            assert!(got.is_ok_and(|v| v.iter().all(|p| p.device == DeviceChoice::Efa)));
        } else {
            assert!(matches!(got, Err(Error::NoData)), "{got:?}");
        }
    }
}

#[cfg(test)]
mod api_version_tests {
    use super::appended::*;
    use super::*;
    use fi::fi_version_num as v;

    /// A domain attr with room for every appended field whichever headers
    /// the bindings came from (1.17's end at max_ep_auth_key).
    #[repr(C)]
    #[derive(Default)]
    struct Dom {
        attr: fi::fi_domain_attr,
        _tail: [u64; 4],
    }

    /// Hints as an application of any version lays them out.
    struct TestHints {
        info: fi::fi_info,
        dom: Box<Dom>,
        ep: Box<fi::fi_ep_attr>,
        tx: Box<fi::fi_tx_attr>,
        rx: Box<fi::fi_rx_attr>,
    }

    impl TestHints {
        fn new(caps: u64) -> TestHints {
            let mut h = TestHints {
                info: fi::fi_info { caps, ..Default::default() },
                dom: Box::default(),
                ep: Box::default(),
                tx: Box::default(),
                rx: Box::default(),
            };
            h.info.domain_attr = &mut h.dom.attr;
            h.info.ep_attr = &mut *h.ep;
            h.info.tx_attr = &mut *h.tx;
            h.info.rx_attr = &mut *h.rx;
            h
        }

        /// Writes an appended domain attr field by offset.
        fn set_dom<T: Copy>(&mut self, offset: usize, v: T) {
            assert!(offset + std::mem::size_of::<T>() <= std::mem::size_of::<Dom>());
            // SAFETY: inside `Dom` (asserted), which the attr pointer covers.
            unsafe { std::ptr::write_unaligned((self.info.domain_attr as *mut u8).add(offset) as *mut T, v) };
        }

        fn match_as(&self, ep_type: fi::fi_ep_type, version: u32) -> Result<Profile> {
            // SAFETY: every attr pointer names a live box of this struct.
            let h = unsafe { Hints::new(&self.info) };
            let mut base = base_profile(DeviceChoice::Udp, fi::FI_EP_RDM);
            if ep_type == fi::FI_EP_DGRAM {
                // The DGRAM profile without asking the devices for an MTU.
                let caps = DGRAM_PRIMARY_CAPS | DGRAM_SECONDARY_CAPS | DGRAM_DIRECTION_CAPS;
                base = Profile {
                    ep_type,
                    caps,
                    tx_caps: caps & TX_CAPS,
                    rx_caps: caps & RX_CAPS,
                    msg_order: 0,
                    max_msg_size: 1024,
                    ..base
                };
            }
            match_hints(base, &h, version)
        }

        fn rdm(&self, version: u32) -> Result<Profile> {
            self.match_as(fi::FI_EP_RDM, version)
        }
    }

    const V1_17: u32 = v(1, 17);
    const V1_22: u32 = v(1, 22);

    #[test]
    fn directed_recv_caps_of_2_0_are_refused_before_it() {
        for bit in [TAGGED_DIRECTED_RECV, EXACT_DIRECTED_RECV, TAGGED_MULTI_RECV] {
            for version in [V1_17, V1_20, V1_22] {
                let h = TestHints::new(TAGGED | bit);
                assert!(
                    matches!(h.rdm(version), Err(Error::NoData)),
                    "{bit:#x} at {}",
                    crate::version::dotted(version)
                );
                let mut h = TestHints::new(TAGGED);
                h.rx.caps = TAGGED | bit;
                assert!(matches!(h.rdm(version), Err(Error::NoData)), "rx {bit:#x}");
            }
        }
    }

    #[test]
    fn directed_recv_caps_of_2_0_are_accepted_and_reported_only_when_asked() {
        for ep_type in [fi::FI_EP_RDM, fi::FI_EP_DGRAM] {
            let p = TestHints::new(TAGGED | TAGGED_DIRECTED_RECV).match_as(ep_type, V2_0).unwrap();
            assert_eq!(
                p.caps & (TAGGED | TAGGED_DIRECTED_RECV | EXACT_DIRECTED_RECV | MSG),
                TAGGED | TAGGED_DIRECTED_RECV
            );
            assert_ne!(p.rx_caps & TAGGED_DIRECTED_RECV, 0);
            assert_eq!(p.tx_caps & TAGGED_DIRECTED_RECV, 0);
            let p = TestHints::new(MSG | TAGGED | EXACT_DIRECTED_RECV | DIRECTED_RECV).match_as(ep_type, V2_0).unwrap();
            assert_eq!(p.caps & (EXACT_DIRECTED_RECV | DIRECTED_RECV), EXACT_DIRECTED_RECV | DIRECTED_RECV);
            assert_ne!(p.rx_caps & EXACT_DIRECTED_RECV, 0);
            // Not asked: not reported (they change what a receive does).
            for caps in [0, MSG | TAGGED] {
                let p = TestHints::new(caps).match_as(ep_type, v(2, 6)).unwrap();
                assert_eq!(p.caps & (TAGGED_DIRECTED_RECV | EXACT_DIRECTED_RECV), 0, "{caps:#x}");
                assert_eq!(p.rx_caps & (TAGGED_DIRECTED_RECV | EXACT_DIRECTED_RECV), 0);
            }
            let mut h = TestHints::new(TAGGED);
            h.rx.caps = TAGGED | TAGGED_DIRECTED_RECV;
            assert!(h.match_as(ep_type, V2_0).is_ok());
            // Tagged multi-receive is refused at every version.
            assert!(matches!(
                TestHints::new(TAGGED | TAGGED_MULTI_RECV).match_as(ep_type, v(2, 6)),
                Err(Error::NoData)
            ));
        }
    }

    #[test]
    fn control_unified_progress_from_1_21_answers_both_fields_and_never_beside_auto() {
        let u = PROGRESS_CONTROL_UNIFIED;
        let (a, m, n) = (fi::FI_PROGRESS_AUTO, fi::FI_PROGRESS_MANUAL, fi::FI_PROGRESS_UNSPEC);
        for (c, d) in [(u, n), (n, u), (u, u), (u, m), (m, u)] {
            assert_eq!(progress_of(c, d, V1_21), Some(u), "{c} {d}");
            assert_eq!(progress_of(c, d, v(1, 20)), None, "{c} {d} before 1.21");
        }
        assert_eq!(progress_of(u, a, V1_21), None);
        assert_eq!(progress_of(a, u, V1_21), None);
        assert_eq!(progress_of(4, n, V1_21), None);
        assert_eq!(progress_of(n, n, V1_21), Some(n));
        assert_eq!(progress_of(m, n, V1_17), Some(n));
        assert_eq!(progress_of(n, m, V1_17), Some(m));

        let mut h = TestHints::new(0);
        h.dom.attr.control_progress = u;
        assert!(matches!(h.rdm(v(1, 20)), Err(Error::NoData)));
        assert_eq!(h.rdm(V1_21).unwrap().progress, u);
        h.dom.attr.control_progress = n;
        h.dom.attr.set_data_progress(u);
        assert_eq!(h.rdm(V2_0).unwrap().progress, u);
        h.dom.attr.control_progress = a;
        assert!(matches!(h.rdm(V2_0), Err(Error::NoData)));
    }

    #[test]
    fn max_ep_auth_key_beyond_the_jobs_served_is_refused_from_1_20_and_unread_before() {
        let mut h = TestHints::new(0);
        h.set_dom(DOMAIN_MAX_EP_AUTH_KEY, MAX_EP_AUTH_KEY + 1);
        assert!(matches!(h.rdm(V1_20), Err(Error::NoData)));
        assert!(matches!(h.rdm(V2_0), Err(Error::NoData)));
        // An older application's struct ends before the field: never read.
        assert!(h.rdm(V1_17).is_ok());
        for ok in [0usize, 1, 2, MAX_EP_AUTH_KEY] {
            h.set_dom(DOMAIN_MAX_EP_AUTH_KEY, ok);
            assert!(h.rdm(V1_20).is_ok(), "{ok}");
        }
        // A datagram endpoint serves one job.
        h.set_dom(DOMAIN_MAX_EP_AUTH_KEY, 2usize);
        assert!(matches!(h.match_as(fi::FI_EP_DGRAM, V1_20), Err(Error::NoData)));
    }

    #[test]
    fn a_max_group_id_is_refused_from_2_0_and_unread_before() {
        let mut h = TestHints::new(0);
        h.set_dom(DOMAIN_MAX_GROUP_ID, 1u32);
        assert!(matches!(h.rdm(V2_0), Err(Error::NoData)));
        assert!(h.rdm(V1_22).is_ok());
        h.set_dom(DOMAIN_MAX_GROUP_ID, 0u32);
        assert!(h.rdm(V2_0).is_ok());
    }

    #[test]
    fn mem_tag_formats_of_2_0() {
        // 0 is FI_TAG_BITS / unset: rdmx's own (all 64 bits).
        assert_eq!(mem_tag_format(0, V2_0).unwrap(), None);
        assert_eq!(mem_tag_format(1, V2_0).unwrap(), Some(1));
        assert_eq!(mem_tag_format(2, V2_0).unwrap(), Some(2));
        for f in [3, 4, 0x30ff, 0xffff] {
            assert!(matches!(mem_tag_format(f, V2_0), Err(Error::NoData)), "{f:#x}");
            assert!(matches!(mem_tag_format(f, v(2, 6)), Err(Error::NoData)), "{f:#x}");
            // Before 2.0 a bit-field format, echoed.
            assert_eq!(mem_tag_format(f, V1_22).unwrap(), Some(f));
        }
        for f in [1 << 16, 0x0000_ffff_ffff_ffff, u64::MAX] {
            assert_eq!(mem_tag_format(f, V2_0).unwrap(), Some(f));
        }
        assert_eq!(mem_tag_format(1, V1_17).unwrap(), Some(1));
        let mut h = TestHints::new(TAGGED);
        h.ep.mem_tag_format = 1;
        assert_eq!(h.rdm(V2_0).unwrap().mem_tag_format, 1);
        h.ep.mem_tag_format = 7;
        assert!(matches!(h.rdm(V2_0), Err(Error::NoData)));
        assert_eq!(h.rdm(V1_17).unwrap().mem_tag_format, 7);
    }

    #[test]
    fn unknown_threading_models_are_refused() {
        let mut h = TestHints::new(0);
        for t in [
            fi::FI_THREAD_UNSPEC,
            fi::FI_THREAD_SAFE,
            fi::FI_THREAD_FID,
            fi::FI_THREAD_DOMAIN,
            fi::FI_THREAD_COMPLETION,
            fi::FI_THREAD_ENDPOINT,
        ] {
            h.dom.attr.threading = t;
            assert!(h.rdm(V1_17).is_ok(), "{t}");
        }
        for t in [6, 99, u32::MAX] {
            h.dom.attr.threading = t;
            assert!(matches!(h.rdm(V1_17), Err(Error::NoData)), "{t}");
        }
    }

    #[test]
    fn the_profile_keeps_the_version_it_was_matched_under() {
        assert_eq!(TestHints::new(0).rdm(V1_22).unwrap().api_version, V1_22);
    }

    #[test]
    fn cq_err_src_addr_is_written_from_1_20_at_its_offset() {
        // Room for a 1.20 entry whichever bindings describe it.
        let mut raw = [0x5a5a_5a5a_5a5a_5a5au64; 12];
        let e = raw.as_mut_ptr() as *mut fi::fi_cq_err_entry;
        // SAFETY: `raw` (96 bytes) holds a 1.20 entry (88).
        unsafe { set_cq_err_src_addr(e, V1_17, 7) };
        assert_eq!(raw[CQ_ERR_SRC_ADDR / 8], 0x5a5a_5a5a_5a5a_5a5a, "untouched before 1.20");
        // SAFETY: as above.
        unsafe { set_cq_err_src_addr(e, V1_20, u64::MAX) };
        assert_eq!(raw[CQ_ERR_SRC_ADDR / 8], u64::MAX);
        assert_eq!(raw[CQ_ERR_SRC_ADDR / 8 + 1], 0x5a5a_5a5a_5a5a_5a5a, "nothing past it");
        // Headers that have the field name it at that offset (fi_cq_err_entry
        // derives Debug in every version's bindings).
        let mut entry = fi::fi_cq_err_entry::default();
        if std::mem::size_of::<fi::fi_cq_err_entry>() > CQ_ERR_SRC_ADDR {
            // SAFETY: the bindings' entry reaches past the field.
            unsafe { set_cq_err_src_addr(&mut entry, V1_20, 0x1234) };
            assert!(format!("{entry:?}").contains("src_addr: 4660"), "{entry:?}");
        } else {
            assert!(!format!("{entry:?}").contains("src_addr"));
        }
    }

    #[test]
    fn max_cntr_values_are_written_when_asked_under_2_5_and_the_library_has_them() {
        // On the heap (the C allocator, as libfabric's attrs): the setters ask
        // the block's size.
        let mut dom = Box::new(Dom::default());
        let attr = &mut dom.attr as *mut fi::fi_domain_attr;
        let read = |d: &Dom, off: usize| -> u64 {
            // SAFETY: `Dom` reaches past the 2.5 fields whichever bindings.
            unsafe {
                std::ptr::read_unaligned((&d.attr as *const fi::fi_domain_attr as *const u8).add(off) as *const u64)
            }
        };
        // SAFETY: `dom` reaches past the 2.5 fields whichever bindings.
        unsafe { set_max_cntr_values(attr, v(2, 4), u64::MAX, u64::MAX) };
        assert_eq!(
            (read(&dom, DOMAIN_MAX_CNTR_VALUE), read(&dom, DOMAIN_MAX_ERR_CNTR_VALUE)),
            (0, 0),
            "untouched before 2.5"
        );
        // SAFETY: as above.
        unsafe { set_max_cntr_values(attr, V2_5, 7, 8) };
        let want = if crate::version::running_at_least(V2_5) { (7, 8) } else { (0, 0) };
        assert_eq!((read(&dom, DOMAIN_MAX_CNTR_VALUE), read(&dom, DOMAIN_MAX_ERR_CNTR_VALUE)), want);
        assert_eq!(read(&dom, DOMAIN_MAX_GROUP_ID) & 0xffff_ffff, 0, "max_group_id untouched");
        assert_eq!((DOMAIN_MAX_CNTR_VALUE, DOMAIN_MAX_ERR_CNTR_VALUE), (208, 216));
    }

    #[test]
    fn max_ep_auth_key_is_written_when_asked_under_1_20_and_the_library_has_it() {
        let mut dom = Box::new(Dom::default());
        let attr = &mut dom.attr as *mut fi::fi_domain_attr;
        // SAFETY: `dom` reaches past the 1.20 field whichever bindings.
        unsafe { set_max_ep_auth_key(attr, V1_17, 1) };
        // SAFETY: as above.
        assert_eq!(unsafe { max_ep_auth_key(attr, V1_20) }, 0);
        // SAFETY: as above.
        unsafe { set_max_ep_auth_key(attr, V1_20, 1) };
        let want = if crate::version::running_at_least(V1_20) { 1 } else { 0 };
        // SAFETY: as above.
        assert_eq!(unsafe { max_ep_auth_key(attr, V1_20) }, want);
        // SAFETY: as above.
        assert_eq!(unsafe { max_ep_auth_key(attr, V1_17) }, 0);
    }

    /// The whole fi_getinfo answer under the running library: from 1.20 on
    /// it reports one authorization key per endpoint.
    #[test]
    fn getinfo_reports_max_ep_auth_key_when_the_request_has_it() {
        if std::env::var_os("FI_RDMX_DEVICE").is_some() {
            return;
        }
        let version = crate::version::declared();
        // SAFETY: no node, service or hints.
        let got = unsafe { getinfo(version, std::ptr::null(), std::ptr::null(), 0, std::ptr::null()) }.unwrap();
        let info = to_fi_info(&got[0]).unwrap();
        // SAFETY: `info` was just allocated by the running library, at its
        // full size, which `version` (declared) never exceeds.
        let n = unsafe { max_ep_auth_key((*info).domain_attr, version) };
        // SAFETY: ours, freed once.
        unsafe { fi::fi_freeinfo(info) };
        assert_eq!(n, if version >= V1_20 { 1 } else { 0 });
    }
}
