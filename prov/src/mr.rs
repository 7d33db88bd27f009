//! Memory registration. rdmx requires none for send/receive (`mr_mode = 0`, NULL
//! descriptors work); registrations exist for applications that make them
//! (`FI_MR_LOCAL` users, fabtests) and, later, as RMA targets. Keys are
//! provider-chosen or the user's `requested_key` (unique per domain, else
//! `-FI_ENOKEY`).
use crate::domain::Domain;
use crate::entry::{entry, non_null};
use crate::error::{Error, Result};
use crate::fid::{self, FidObject};
use libfabric_sys as fi;
use mr_cache::{Region, Segment};

#[repr(C)]
pub struct Mr {
    pub fid: fi::fid_mr,
    domain: *const Domain,
}

// SAFETY: #[repr(C)] with fid_mr first.
unsafe impl FidObject for Mr {
    const CLASS: u32 = fi::FI_CLASS_MR;
}

static MR_FI_OPS: fi::fi_ops = fid::fi_ops(mr_close, None, None);

#[allow(clippy::too_many_arguments)] // the union of fi_mr_reg/regv/regattr's arguments
fn register(
    f: *mut fi::fid,
    iov: &[(u64, u64)],
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
    out: *mut *mut fi::fid_mr,
    context: *mut libc::c_void,
    reachable_by: Option<Vec<u64>>,
) -> Result<i32> {
    non_null!(out);
    // FI_RMA_EVENT is offered (targets count served requests on their remote
    // counters for every registration alike), so the flag asks for nothing more.
    if flags & !fi::FI_RMA_EVENT != 0 {
        return Err(Error::BadFlags);
    }
    // A segment that wraps the address space names no memory.
    if iov.iter().any(|&(addr, len)| addr.checked_add(len).is_none()) {
        return Err(Error::Inval("registration wraps the address space"));
    }
    // SAFETY: libfabric passes our domain's fid.
    let d = unsafe { Domain::from_fid(f) }?;
    if d.profile.av_auth_key && reachable_by.is_none() {
        // fi_mr(3): such a domain registers through fi_mr_regattr, whose
        // auth_key names the jobs.
        return Err(Error::Inval("a domain of FI_AV_AUTH_KEY registers with fi_mr_regattr and an fi_mr_auth_key"));
    }
    // Exactly the segments given: a multi-segment registration never exposes the
    // memory between them. `offset` is the remote address of the first byte when
    // RMA addresses are offsets (no FI_MR_VIRT_ADDR); with virtual addresses it
    // has no meaning and is ignored.
    let segments = iov.iter().map(|&(addr, len)| Segment { addr, len }).collect();
    let virt = d.profile.mr_mode & fi::FI_MR_VIRT_ADDR as i32 != 0 || d.profile.mr_mode == fi::FI_MR_BASIC as i32;
    let region = Region { segments, access, offset: if virt { 0 } else { offset }, reachable_by };
    let prov_key = d.profile.mr_mode & fi::FI_MR_PROV_KEY as i32 != 0 || d.profile.mr_mode == fi::FI_MR_BASIC as i32;
    let (key, unwatched) = {
        let mut keys = d.mr_keys.lock();
        let key = keys.insert(region, if prov_key { None } else { Some(requested_key) })?;
        (key, keys.unwatched_segment(key))
    };
    if let Some(s) = unwatched {
        crate::domain::warn_unwatched(s);
    }
    d.children.get();
    let mr = fid::leak(Mr {
        fid: fi::fid_mr {
            fid: fid::new_fid(fi::FI_CLASS_MR, context, &MR_FI_OPS),
            mem_desc: std::ptr::null_mut(),
            key,
        },
        domain: d,
    });
    // On a device that registers memory, the registration is also the
    // device's (through the domain's cache): its descriptor then gives sends
    // from it their keys without a lookup.
    if let Some(c) = &d.mr_cache {
        if let Err(e) = c.lock().register_desc(mr as usize, iov, access) {
            let _ = d.mr_keys.lock().remove(key);
            d.children.put();
            // SAFETY: created by fid::leak above and never published.
            unsafe { fid::retire(mr as *const Mr) };
            return Err(Error::Other(format!("device registration failed: {e}")));
        }
    }
    // SAFETY: `mr` was just allocated; mem_desc points at the MR itself so
    // fi_mr_desc() hands back something non-null and unique.
    unsafe {
        (*mr).fid.mem_desc = mr as *mut libc::c_void;
        *out = mr as *mut fi::fid_mr;
    }
    Ok(0)
}

entry! {
    fn rdmx_mr_reg(f: *mut fi::fid, buf: *const libc::c_void, len: usize, access: u64, offset: u64, requested_key: u64, flags: u64, out: *mut *mut fi::fid_mr, context: *mut libc::c_void) -> i32 {
        register(f, &[(buf as u64, len as u64)], access, offset, requested_key, flags, out, context, None)
    }
}

/// # Safety
/// `iov` is null or valid for `count` entries.
unsafe fn iov_list(iov: *const libc::iovec, count: usize) -> Result<Vec<(u64, u64)>> {
    if count > crate::info::IOV_LIMIT {
        return Err(Error::Inval("too many iov entries"));
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    non_null!(iov);
    // SAFETY: per contract.
    let s = unsafe { std::slice::from_raw_parts(iov, count) };
    Ok(s.iter().map(|v| (v.iov_base as u64, v.iov_len as u64)).collect())
}

entry! {
    fn rdmx_mr_regv(f: *mut fi::fid, iov: *const fi::iovec, count: usize, access: u64, offset: u64, requested_key: u64, flags: u64, out: *mut *mut fi::fid_mr, context: *mut libc::c_void) -> i32 {
        // SAFETY: the application's iov array of `count` entries.
        let list = unsafe { iov_list(iov as *const libc::iovec, count) }?;
        register(f, &list, access, offset, requested_key, flags, out, context, None)
    }
}

/// `FI_MR_DMABUF` (fi_mr(3), libfabric 1.20; by value, so a build against older
/// headers knows it too).
const FI_MR_DMABUF: u64 = 1 << 40;

entry! {
    fn rdmx_mr_regattr(f: *mut fi::fid, attr: *const fi::fi_mr_attr, flags: u64, out: *mut *mut fi::fid_mr) -> i32 {
        non_null!(attr);
        // SAFETY: libfabric passes our domain's fid.
        let d = unsafe { Domain::from_fid(f) }?;
        let version = d.api_version();
        // SAFETY: checked non-null; the application's attr has every field of
        // the API version it asked for (`version`), at least 1.17's.
        let a = unsafe { MrAttr::read(attr, version) };
        // Device memory and dma-buf descriptors (1.20's FI_MR_DMABUF: then the
        // union holds `dmabuf`, not `mr_iov`) need FI_HMEM, which rdmx does not offer.
        if a.iface != fi::FI_HMEM_SYSTEM || flags & FI_MR_DMABUF != 0 {
            return Err(Error::NoSys);
        }
        // fi_mr(3), 2.0: a non-NULL base_mr asks for a sub-MR of it, which
        // rdmx does not offer (every registration stands alone).
        if !a.base_mr.is_null() {
            return Err(Error::OpNotSupp);
        }
        let reachable_by = if d.profile.av_auth_key {
            // SAFETY: the application's fi_mr_auth_key when the size says so.
            Some(unsafe { jobs_of_mr_auth_key(d, a.auth_key, a.auth_key_size, flags) }?)
        } else if flags & crate::av::FI_AUTH_KEY != 0 {
            // fi_mr(3): only valid in a domain of FI_AV_AUTH_KEY.
            return Err(Error::Inval("FI_AUTH_KEY registers only in a domain of FI_AV_AUTH_KEY"));
        } else {
            None
        };
        // SAFETY: the application's iov array.
        let list = unsafe { iov_list(a.mr_iov, a.iov_count) }?;
        register(f, &list, a.access, a.offset, a.requested_key, flags & !crate::av::FI_AUTH_KEY, out, a.context, reachable_by)
    }
}

/// `struct fi_mr_auth_key` (fi_mr(3), 1.20): the AV whose authorization
/// keys a registration of an `FI_AV_AUTH_KEY` domain is reachable by, and
/// which of them.
#[repr(C)]
struct MrAuthKey {
    av: *mut fi::fid_av,
    src_addr: fi::fi_addr_t,
}

/// The job keys a registration's `fi_mr_auth_key` names: every key of its AV
/// now (`src_addr` `FI_ADDR_UNSPEC`), or one (`FI_AUTH_KEY`: `src_addr` is
/// an authorization key's `fi_addr_t`). A single address is not offered.
///
/// # Safety
/// `key` is null or valid for `size` bytes.
unsafe fn jobs_of_mr_auth_key(d: &Domain, key: *const u8, size: usize, flags: u64) -> Result<Vec<u64>> {
    if size != std::mem::size_of::<MrAuthKey>() {
        return Err(Error::Inval("auth_key_size must be sizeof(struct fi_mr_auth_key) in a domain of FI_AV_AUTH_KEY"));
    }
    non_null!(key);
    // SAFETY: per contract, `size` bytes: one fi_mr_auth_key (maybe unaligned).
    let k = unsafe { std::ptr::read_unaligned(key as *const MrAuthKey) };
    // SAFETY: the application's AV fid, checked to be an rdmx AV (its ops)
    // and of this domain before it is used.
    let av = unsafe { crate::av::av_ref(k.av) }?;
    if !av.of_domain(d) {
        return Err(Error::Inval("fi_mr_auth_key.av is not an AV of this domain"));
    }
    let t = av.table.read();
    let keys: Vec<&crate::job::AuthKey> = if k.src_addr == crate::av_table::FI_ADDR_UNSPEC {
        t.auth_keys().map(|(_, a)| &a.key).collect()
    } else if flags & crate::av::FI_AUTH_KEY != 0 {
        let i = crate::av::auth_key_index(k.src_addr)
            .ok_or(Error::Inval("FI_AUTH_KEY: src_addr is not an authorization key"))?;
        vec![&t.auth_key(i).ok_or(Error::Inval("FI_AUTH_KEY: no such authorization key"))?.key]
    } else {
        return Err(Error::NoSys);
    };
    keys.into_iter().map(crate::job::job_key_of).collect()
}

/// What rdmx reads of an application's `fi_mr_attr`. The struct grew in 1.19
/// and 2.0 (`hmem_data`, `page_size`, `base_mr`, `sub_mr_cnt`), and an
/// application built against 1.17's headers hands a shorter one than 2.x's
/// bindings describe: a Rust reference to the whole struct could reach past
/// its end. Every field is read through its own raw pointer instead, the
/// appended ones only when the application's API version has them.
struct MrAttr {
    mr_iov: *const libc::iovec,
    iov_count: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    context: *mut libc::c_void,
    iface: fi::fi_hmem_iface,
    base_mr: *const libc::c_void,
    auth_key_size: usize,
    auth_key: *const u8,
}

impl MrAttr {
    /// # Safety
    /// `attr` points at an `fi_mr_attr` with every field of API `version`
    /// (1.17's at least).
    unsafe fn read(attr: *const fi::fi_mr_attr, version: u32) -> MrAttr {
        use std::ptr::addr_of;
        // SAFETY: every field named here is a 1.17 one, inside the
        // application's struct (this function's contract); `mr_iov` (a union
        // member in 2.x headers) is the pointer at offset 0, as
        // `info::appended` asserts; base_mr is read only under 2.0+.
        unsafe {
            MrAttr {
                mr_iov: std::ptr::read(attr as *const *const libc::iovec),
                iov_count: addr_of!((*attr).iov_count).read(),
                access: addr_of!((*attr).access).read(),
                offset: addr_of!((*attr).offset).read(),
                requested_key: addr_of!((*attr).requested_key).read(),
                context: addr_of!((*attr).context).read(),
                iface: addr_of!((*attr).iface).read(),
                auth_key_size: addr_of!((*attr).auth_key_size).read(),
                auth_key: addr_of!((*attr).auth_key).read(),
                base_mr: crate::info::appended::base_mr(attr, version),
            }
        }
    }
}

entry! {
    fn mr_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let mr = unsafe { Mr::from_fid(f) }?;
        // SAFETY: the domain outlives its MRs (its close checks the count).
        let d = unsafe { &*mr.domain };
        let _ = d.mr_keys.lock().remove(mr.fid.key);
        if let Some(c) = &d.mr_cache {
            c.lock().forget_desc(mr as *const Mr as usize);
        }
        d.children.put();
        // SAFETY: created by fid::leak in register().
        unsafe { fid::retire(mr as *const Mr) };
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::info::appended::{MR_ATTR_BASE_MR, V2_0};

    /// An fi_mr_attr as a 2.x application lays it out (112 bytes), built
    /// from its 1.17 part and the appended base_mr, whichever headers the
    /// bindings came from.
    fn attr_2x(iov: *const libc::iovec, base_mr: usize) -> [u64; 14] {
        let mut raw = [0u64; 14];
        let head =
            fi::fi_mr_attr { iov_count: 1, access: fi::FI_REMOTE_READ as u64, requested_key: 42, ..Default::default() };
        // SAFETY: the 1.17 part of the struct is its first 80 bytes, all
        // inside `raw` (112); bindings of any version put it there.
        unsafe {
            std::ptr::copy_nonoverlapping(&head as *const _ as *const u8, raw.as_mut_ptr() as *mut u8, 80);
            std::ptr::write(raw.as_mut_ptr() as *mut *const libc::iovec, iov);
        }
        raw[MR_ATTR_BASE_MR / 8] = base_mr as u64;
        raw
    }

    #[test]
    fn base_mr_is_read_from_2_0_on_only() {
        let iov = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
        let raw = attr_2x(&iov, 0x1000);
        let attr = raw.as_ptr() as *const fi::fi_mr_attr;
        // SAFETY: `raw` is a whole 2.x fi_mr_attr.
        let a = unsafe { MrAttr::read(attr, V2_0) };
        assert_eq!(a.base_mr as usize, 0x1000);
        assert_eq!((a.mr_iov, a.iov_count, a.requested_key, a.iface), (&iov as *const _, 1, 42, fi::FI_HMEM_SYSTEM));
        assert_eq!(a.access, fi::FI_REMOTE_READ as u64);
        // SAFETY: as above (a 1.22 application's struct is its first 88 bytes).
        let a = unsafe { MrAttr::read(attr, fi::fi_version_num(1, 22)) };
        assert!(a.base_mr.is_null());
    }

    #[test]
    fn a_1_17_attr_is_read_within_its_80_bytes() {
        // Exactly 1.17's size: nothing past it is touched (Miri would say).
        let mut raw = [0u64; 10];
        raw[1] = 3; // iov_count
                    // SAFETY: `raw` is a whole 1.17 fi_mr_attr.
        let a = unsafe { MrAttr::read(raw.as_ptr() as *const fi::fi_mr_attr, fi::fi_version_num(1, 17)) };
        assert_eq!((a.iov_count, a.base_mr), (3, std::ptr::null()));
    }
}
