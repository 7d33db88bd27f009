//! The domain: one per device choice (`auto`, `udp`, `shm`); parent of AVs, CQs,
//! counters, endpoints and memory registrations.
use crate::entry::{entry, entry_unsupported, non_null, Out};
use crate::error::{Error, Result};
use crate::fabric::{self, Fabric};
use crate::fid::{self, FidObject, Refs};
use crate::info::{self, Profile};
use crate::{av, cntr, cq, ep, mr};
use libfabric_sys as fi;
use mr_cache::KeyTable;
use parking_lot::Mutex;
use std::sync::Arc;

#[repr(C)]
pub struct Domain {
    pub fid: fi::fid_domain,
    fabric: *const Fabric,
    pub children: Refs,
    pub profile: Profile,
    pub mr_keys: Arc<Mutex<KeyTable>>,
    /// The registration cache, when the domain's device registers memory
    /// (none for udp and shm).
    pub mr_cache: Option<crate::regcache::SharedDomainMr>,
    /// The domain's device: endpoints open their queues on it.
    pub devices: Arc<crate::devices::DomainDevices>,
}

// SAFETY: #[repr(C)] with fid_domain first.
unsafe impl FidObject for Domain {
    const CLASS: u32 = fi::FI_CLASS_DOMAIN;
}

impl Domain {
    /// The API version the application asked for ([`Fabric::api_version`]):
    /// what decides which rules and appended struct fields apply to calls
    /// on this domain and its children.
    pub fn api_version(&self) -> u32 {
        // SAFETY: the fabric outlives its domains (its close refuses while
        // they are open: `children`).
        unsafe { (*self.fabric).api_version() }
    }
}

static DOMAIN_FI_OPS: fi::fi_ops = fid::fi_ops(domain_close, None, None);

static DOMAIN_OPS: fi::fi_ops_domain = fi::fi_ops_domain {
    size: std::mem::size_of::<fi::fi_ops_domain>(),
    av_open: Some(av::rdmx_av_open),
    cq_open: Some(cq::rdmx_cq_open),
    endpoint: Some(ep::rdmx_endpoint),
    scalable_ep: Some(no_scalable_ep),
    cntr_open: Some(cntr::rdmx_cntr_open),
    poll_open: Some(crate::poll::rdmx_poll_open),
    stx_ctx: Some(no_stx_ctx),
    srx_ctx: Some(no_srx_ctx),
    query_atomic: Some(domain_query_atomic),
    query_collective: Some(no_query_collective),
    endpoint2: Some(no_endpoint2),
};

static MR_OPS: fi::fi_ops_mr = fi::fi_ops_mr {
    size: std::mem::size_of::<fi::fi_ops_mr>(),
    reg: Some(mr::rdmx_mr_reg),
    regv: Some(mr::rdmx_mr_regv),
    regattr: Some(mr::rdmx_mr_regattr),
};

entry_unsupported! {
    fn no_scalable_ep(domain: *mut fi::fid_domain, info: *mut fi::fi_info, sep: *mut *mut fi::fid_ep, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_stx_ctx(domain: *mut fi::fid_domain, attr: *mut fi::fi_tx_attr, stx: *mut *mut fi::fid_stx, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_srx_ctx(domain: *mut fi::fid_domain, attr: *mut fi::fi_rx_attr, rx_ep: *mut *mut fi::fid_ep, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_query_collective(domain: *mut fi::fid_domain, coll: fi::fi_collective_op, attr: *mut fi::fi_collective_attr, flags: u64) -> i32 = Error::NoSys;
    fn no_endpoint2(domain: *mut fi::fid_domain, info: *mut fi::fi_info, ep: *mut *mut fi::fid_ep, flags: u64, context: *mut libc::c_void) -> i32 = Error::NoSys;
}

entry! {
    /// `fi_domain`.
    fn rdmx_domain(fabric: *mut fi::fid_fabric, info: *mut fi::fi_info, out: *mut *mut fi::fid_domain => Out<*mut fi::fid_domain>, context: *mut libc::c_void) -> i32 {
        non_null!(info);
        // SAFETY: libfabric passes our fabric.
        let fab = unsafe { fabric::fabric_ref(fabric) }?;
        // SAFETY: the application passes an fi_info (normally one we returned).
        let profile = unsafe { info::profile_from_info(info, fab.api_version()) }?;
        let devices = Arc::new(crate::devices::DomainDevices::new(profile.device)?);
        let mr_cache = crate::regcache::open(rdm::device::DeviceContext::registrar(&*devices), crate::params::params().mr_cache);
        fab.children.get();
        let d = fid::leak(Domain {
            fid: fi::fid_domain {
                fid: fid::new_fid(fi::FI_CLASS_DOMAIN, context, &DOMAIN_FI_OPS),
                ops: &DOMAIN_OPS as *const _ as *mut _,
                mr: &MR_OPS as *const _ as *mut _,
            },
            fabric: fab,
            children: Refs::default(),
            profile,
            mr_keys: Arc::new(Mutex::new(KeyTable::new(crate::regcache::unmap_monitor()))),
            mr_cache,
            devices,
        });
        out.set(d as *mut fi::fid_domain);
        Ok(0)
    }
}

/// Says once per process that registered memory cannot be watched for
/// unmapping (file-backed mappings, memory another userfaultfd watches,
/// kernels without userfaultfd write-protect): its key is not revoked if the
/// application unmaps it while registered. Not repeated where the monitor is
/// unavailable altogether ([`crate::regcache::unmap_monitor`] said so then).
pub(crate) fn warn_unwatched(s: mr_cache::Segment) {
    static SAID: std::sync::Once = std::sync::Once::new();
    if crate::regcache::unmap_monitor().unavailable_reason().is_some() {
        return;
    }
    SAID.call_once(|| {
        let msg = format!(
            "memory registered at {:#x} (+{} bytes) cannot be watched for unmapping (file-backed, or watched by another userfaultfd): its key is not revoked if it is unmapped while registered; said once",
            s.addr, s.len
        );
        crate::log::warn(crate::log::Subsys::Mr, "mr_reg", &msg);
    });
}

entry! {
    fn domain_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let d = unsafe { Domain::from_fid(f) }?;
        d.children.busy()?;
        // SAFETY: the fabric outlives its children.
        unsafe { (*d.fabric).children.put() };
        // SAFETY: created by fid::leak in rdmx_domain.
        unsafe { fid::retire(d as *const Domain) };
        Ok(0)
    }
}

/// # Safety
/// `d` must be null or a domain fid from rdmx.
pub unsafe fn domain_ref<'a>(d: *mut fi::fid_domain) -> Result<&'a Domain> {
    // SAFETY: per contract.
    unsafe { Domain::from_fid(d as *const fi::fid) }
}

/// Largest element count one emulated atomic carries (operands travel in one
/// message; keep them well inside the engine's buffers).
pub const ATOMIC_MAX_BYTES: usize = 64 * 1024;

/// Answers `fi_query_atomic` and the endpoint's `*valid` calls.
pub fn atomic_count(datatype: fi::fi_datatype, op: fi::fi_op, flags: u64) -> Result<(usize, usize)> {
    use rndv::atomic::{valid, Family};
    let dt = crate::rma::datatype_from_fi(datatype).ok_or(Error::OpNotSupp)?;
    let o = crate::rma::op_from_fi(op).ok_or(Error::OpNotSupp)?;
    let family = if flags & fi::FI_COMPARE_ATOMIC != 0 {
        Family::Compare
    } else if flags & fi::FI_FETCH_ATOMIC != 0 {
        Family::Fetch
    } else {
        Family::Write
    };
    if !valid(family, dt, o) {
        return Err(Error::OpNotSupp);
    }
    Ok((ATOMIC_MAX_BYTES / dt.size(), dt.size()))
}

entry! {
    fn domain_query_atomic(domain: *mut fi::fid_domain, datatype: fi::fi_datatype, op: fi::fi_op, attr: *mut fi::fi_atomic_attr, flags: u64) -> i32 {
        non_null!(attr);
        // SAFETY: our domain.
        let _ = unsafe { domain_ref(domain) }?;
        let (count, size) = atomic_count(datatype, op, flags)?;
        // SAFETY: checked non-null.
        unsafe { *attr = fi::fi_atomic_attr { count, size } };
        Ok(0)
    }
}
