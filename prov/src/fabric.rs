//! The fabric object: the root every domain and EQ hangs from.
use crate::domain;
use crate::entry::{entry, entry_unsupported, non_null, Out};
use crate::eq;
use crate::error::{Error, Result};
use crate::fid::{self, FidObject, Refs};
use crate::info::{FABRIC_NAME, VERBS_FABRIC_NAME};
use libfabric_sys as fi;
use std::ffi::CStr;

#[repr(C)]
pub struct Fabric {
    pub fid: fi::fid_fabric,
    pub children: Refs,
}

// SAFETY: #[repr(C)] with fid_fabric (which starts with fid) first.
unsafe impl FidObject for Fabric {
    const CLASS: u32 = fi::FI_CLASS_FABRIC;
}

impl Fabric {
    /// The API version the application asked for, whose rules every object
    /// under this fabric follows. `fi_fabric` overwrites `fid.api_version`
    /// with the attr's `api_version` right after the provider's `fabric()`
    /// returns (libfabric's src/fabric.c, for providers declaring 1.5 or
    /// newer), and `fi_getinfo` stamps that attr with the version the
    /// application requested; see [`requested_api`] for the bounds.
    pub fn api_version(&self) -> u32 {
        requested_api(self.fid.api_version)
    }
}

/// The API version to follow for a fabric whose `api_version` libfabric set
/// to `v`: `v`, but never newer than what rdmx declared (which is never newer
/// than the running library: struct fields a newer version appended may not
/// exist), and 1.17, the oldest rules rdmx knows, for an attr that named none
/// (0: not one `fi_getinfo` returned).
pub fn requested_api(v: u32) -> u32 {
    if v == 0 {
        crate::version::MIN_API
    } else {
        v.min(crate::version::declared())
    }
}

static FABRIC_FI_OPS: fi::fi_ops = fid::fi_ops(fabric_close, None, None);

static FABRIC_OPS: fi::fi_ops_fabric = fi::fi_ops_fabric {
    size: std::mem::size_of::<fi::fi_ops_fabric>(),
    domain: Some(domain::rdmx_domain),
    passive_ep: Some(no_passive_ep),
    eq_open: Some(eq::rdmx_eq_open),
    wait_open: Some(crate::wait::rdmx_wait_open),
    trywait: Some(fabric_trywait),
    domain2: Some(no_domain2),
};

entry_unsupported! {
    fn no_passive_ep(fabric: *mut fi::fid_fabric, info: *mut fi::fi_info, pep: *mut *mut fi::fid_pep, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_domain2(fabric: *mut fi::fid_fabric, info: *mut fi::fi_info, dom: *mut *mut fi::fid_domain, flags: u64, context: *mut libc::c_void) -> i32 = Error::NoSys;
}

entry! {
    /// `fi_trywait`: 0 when every listed CQ is empty, every counter unchanged,
    /// every EQ empty and every wait set's members likewise after a round of
    /// progress (the application may sleep on the fds), -FI_EAGAIN otherwise.
    fn fabric_trywait(fabric: *mut fi::fid_fabric, fids: *mut *mut fi::fid, count: i32) -> i32 {
        let _ = fabric;
        if count <= 0 {
            return Ok(0);
        }
        non_null!(fids);
        // SAFETY: the application passes `count` fids.
        let list = unsafe { std::slice::from_raw_parts(fids, count as usize) };
        for &f in list {
            non_null!(f);
            // SAFETY: non-null fid from the application; every fid starts with its class.
            let class = unsafe { (*f).fclass } as u32;
            match class {
                // SAFETY: class checked.
                fi::FI_CLASS_CQ => crate::cq::trywait(unsafe { crate::cq::Cq::from_fid(f) }?)?,
                // SAFETY: class checked.
                fi::FI_CLASS_CNTR => crate::cntr::trywait(unsafe { crate::cntr::Cntr::from_fid(f) }?)?,
                // SAFETY: class checked.
                fi::FI_CLASS_WAIT => crate::wait::trywait(unsafe { crate::wait::WaitSet::from_fid(f) }?)?,
                // SAFETY: class checked.
                fi::FI_CLASS_EQ => crate::eq::trywait(unsafe { crate::eq::Eq::from_fid(f) }?)?,
                _ => return Err(Error::NoSys),
            }
        }
        Ok(0)
    }
}

entry! {
    /// The provider's `fabric` callback (`fi_fabric`).
    fn rdmx_fabric(attr: *mut fi::fi_fabric_attr, out: *mut *mut fi::fid_fabric => Out<*mut fi::fid_fabric>, context: *mut libc::c_void) -> i32 {
        non_null!(attr);
        // SAFETY: libfabric passes a valid attr.
        let attr = unsafe { &*attr };
        if attr.name.is_null() {
            return Err(Error::Inval("fabric name"));
        }
        // SAFETY: non-null C string from the application.
        let name = unsafe { CStr::from_ptr(attr.name) };
        if name.to_bytes() != FABRIC_NAME.as_bytes() && name.to_bytes() != VERBS_FABRIC_NAME.as_bytes() {
            return Err(Error::Inval("not an rdmx fabric"));
        }
        let f = fid::leak(Fabric {
            fid: fi::fid_fabric {
                fid: fid::new_fid(fi::FI_CLASS_FABRIC, context, &FABRIC_FI_OPS),
                ops: &FABRIC_OPS as *const _ as *mut _,
                api_version: crate::version::declared(),
            },
            children: Refs::default(),
        });
        out.set(f as *mut fi::fid_fabric);
        Ok(0)
    }
}

entry! {
    fn fabric_close(f: *mut fi::fid) -> i32 {
        // SAFETY: libfabric hands back the fid we created.
        let fab = unsafe { Fabric::from_fid(f) }?;
        fab.children.busy()?;
        // SAFETY: created by fid::leak in rdmx_fabric; libfabric drops its pointer.
        unsafe { fid::retire(fab as *const Fabric) };
        Ok(0)
    }
}

/// # Safety
/// `f` must be null or a fabric fid from rdmx.
pub unsafe fn fabric_ref<'a>(f: *mut fi::fid_fabric) -> Result<&'a Fabric> {
    // SAFETY: per contract.
    unsafe { Fabric::from_fid(f as *const fi::fid) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fi::fi_version_num as v;

    #[test]
    fn the_requested_api_is_kept_capped_at_the_declared_one() {
        let declared = crate::version::declared();
        assert_eq!(requested_api(v(1, 17)), v(1, 17));
        assert_eq!(requested_api(v(1, 5)), v(1, 5));
        assert_eq!(requested_api(declared), declared);
        assert_eq!(requested_api(v(9, 0)), declared);
        assert_eq!(requested_api(0), crate::version::MIN_API);
    }
}
