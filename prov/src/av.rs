//! Address vectors. `fi_addr_t` values are slot indices for both `FI_AV_MAP` and
//! `FI_AV_TABLE` (a MAP value is opaque, so an index is a valid choice); removed
//! slots are reused lowest first, which keeps TABLE indices dense after
//! remove + re-insert.
use crate::addr::{RdmxAddr, ADDR_LEN};
use crate::av_table::{AvTable, SharedAv, AUTH_KEY_ADDR, FI_ADDR_NOTAVAIL};
use crate::domain::{self, Domain};
use crate::entry::{entry, entry_unsupported, non_null, Out};
use crate::error::{Error, Result};
use crate::fid::{self, FidObject, Refs};
use libfabric_sys as fi;
use parking_lot::RwLock;
use std::sync::Arc;

#[repr(C)]
pub struct Av {
    pub fid: fi::fid_av,
    domain: *const Domain,
    pub bound: Refs,
    pub av_type: fi::fi_av_type,
    pub table: SharedAv,
}

// SAFETY: #[repr(C)] with fid_av first.
unsafe impl FidObject for Av {
    const CLASS: u32 = fi::FI_CLASS_AV;
}

static AV_FI_OPS: fi::fi_ops = fid::fi_ops(av_close, None, None);

/// `struct fi_ops_av` as libfabric 1.20 on has it: 1.17's entries, then
/// `insert_auth_key`, `lookup_auth_key` and `set_user_id`. Spelled out here
/// so that a build against 1.17's headers (whose bindings end at `av_set`)
/// offers the authorization-key calls too; libfabric's inline wrappers check
/// `size` before calling an entry. `set_user_id` stays null, which the
/// wrappers answer `-FI_ENOSYS` (no `FI_AV_USER_ID`).
#[repr(C)]
struct AvOps {
    size: usize,
    insert: Option<
        unsafe extern "C" fn(
            *mut fi::fid_av,
            *const libc::c_void,
            usize,
            *mut fi::fi_addr_t,
            u64,
            *mut libc::c_void,
        ) -> i32,
    >,
    insertsvc: Option<
        unsafe extern "C" fn(
            *mut fi::fid_av,
            *const libc::c_char,
            *const libc::c_char,
            *mut fi::fi_addr_t,
            u64,
            *mut libc::c_void,
        ) -> i32,
    >,
    insertsym: Option<
        unsafe extern "C" fn(
            *mut fi::fid_av,
            *const libc::c_char,
            usize,
            *const libc::c_char,
            usize,
            *mut fi::fi_addr_t,
            u64,
            *mut libc::c_void,
        ) -> i32,
    >,
    remove: Option<unsafe extern "C" fn(*mut fi::fid_av, *mut fi::fi_addr_t, usize, u64) -> i32>,
    lookup: Option<unsafe extern "C" fn(*mut fi::fid_av, fi::fi_addr_t, *mut libc::c_void, *mut usize) -> i32>,
    straddr: Option<
        unsafe extern "C" fn(
            *mut fi::fid_av,
            *const libc::c_void,
            *mut libc::c_char,
            *mut usize,
        ) -> *const libc::c_char,
    >,
    av_set: Option<
        unsafe extern "C" fn(
            *mut fi::fid_av,
            *mut fi::fi_av_set_attr,
            *mut *mut fi::fid_av_set,
            *mut libc::c_void,
        ) -> i32,
    >,
    insert_auth_key:
        Option<unsafe extern "C" fn(*mut fi::fid_av, *const libc::c_void, usize, *mut fi::fi_addr_t, u64) -> i32>,
    lookup_auth_key: Option<unsafe extern "C" fn(*mut fi::fid_av, fi::fi_addr_t, *mut libc::c_void, *mut usize) -> i32>,
    set_user_id: Option<unsafe extern "C" fn(*mut fi::fid_av, fi::fi_addr_t, fi::fi_addr_t, u64) -> i32>,
}

// The headers' struct (1.17's or a newer one) is a prefix of this one.
const _: () = assert!(std::mem::size_of::<fi::fi_ops_av>() <= std::mem::size_of::<AvOps>());
const _: () = assert!(std::mem::offset_of!(fi::fi_ops_av, av_set) == std::mem::offset_of!(AvOps, av_set));

static AV_OPS: AvOps = AvOps {
    size: std::mem::size_of::<AvOps>(),
    insert: Some(av_insert),
    insertsvc: Some(av_insertsvc),
    insertsym: Some(no_insertsym),
    remove: Some(av_remove),
    lookup: Some(av_lookup),
    straddr: Some(av_straddr),
    av_set: Some(no_av_set),
    insert_auth_key: Some(av_insert_auth_key),
    lookup_auth_key: Some(av_lookup_auth_key),
    set_user_id: None,
};

/// `FI_AUTH_KEY` (fabric.h, 1.20; by value, so a build against 1.17's
/// headers knows it too): an `fi_addr_t` given is an authorization key's.
pub const FI_AUTH_KEY: u64 = 1 << 57;

entry_unsupported! {
    fn no_insertsym(av: *mut fi::fid_av, node: *const libc::c_char, nodecnt: usize, service: *const libc::c_char, svccnt: usize, fi_addr: *mut fi::fi_addr_t, flags: u64, context: *mut libc::c_void) -> i32 = Error::NoSys;
    fn no_av_set(av: *mut fi::fid_av, attr: *mut fi::fi_av_set_attr, av_set: *mut *mut fi::fid_av_set, context: *mut libc::c_void) -> i32 = Error::NoSys;
}

impl Av {
    /// Whether the AV holds authorization keys (its domain was opened with
    /// `FI_AV_AUTH_KEY`): every address is then inserted under one.
    pub fn keyed(&self) -> bool {
        // SAFETY: the domain outlives its children (its close checks).
        unsafe { (*self.domain).profile.av_auth_key }
    }
}

entry! {
    fn av_insert_auth_key(av: *mut fi::fid_av, auth_key: *const libc::c_void, auth_key_size: usize, fi_addr: *mut fi::fi_addr_t, flags: u64) -> i32 {
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        non_null!(fi_addr);
        if !av.keyed() {
            return Err(Error::Inval("fi_av_insert_auth_key needs a domain opened with FI_AV_AUTH_KEY"));
        }
        if flags != 0 {
            return Err(Error::BadFlags);
        }
        // The key's form is rdmx's, as for an endpoint's auth_key: 1 to 8
        // bytes a job key in clear, 16 to 1024 a job secret (`job.rs`).
        if auth_key_size == 0 || auth_key_size > rdm::engine::seal::SECRET_MAX_LEN {
            return Err(Error::Inval("auth_key_size: 1 to 8 bytes (a job key) or 16 to 1024 (a job secret)"));
        }
        non_null!(auth_key);
        // SAFETY: the application's key of `auth_key_size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(auth_key as *const u8, auth_key_size) };
        let key = crate::job::AuthKey::from_bytes(bytes)
            .ok()
            .flatten()
            .ok_or(Error::Inval("auth_key_size: 1 to 8 bytes (a job key) or 16 to 1024 (a job secret)"))?;
        let i = av.table.write().insert_key(key)?;
        // SAFETY: checked non-null; the application's output slot.
        unsafe { *fi_addr = AUTH_KEY_ADDR | u64::from(i) };
        Ok(0)
    }
}

/// The key index an authorization-key `fi_addr_t` names.
pub fn auth_key_index(fi_addr: u64) -> Option<u32> {
    if fi_addr & AUTH_KEY_ADDR == 0 || fi_addr == FI_ADDR_NOTAVAIL {
        return None;
    }
    u32::try_from(fi_addr & !AUTH_KEY_ADDR).ok()
}

entry! {
    fn av_lookup_auth_key(av: *mut fi::fid_av, fi_addr: fi::fi_addr_t, auth_key: *mut libc::c_void, auth_key_size: *mut usize) -> i32 {
        non_null!(auth_key_size);
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        let t = av.table.read();
        // Either an authorization key's fi_addr_t or an address's (the key
        // it was inserted under).
        let i = match auth_key_index(fi_addr) {
            Some(i) => i,
            None => t.key_of(fi_addr).ok_or(Error::Inval("fi_addr has no authorization key in this AV"))?,
        };
        let bytes = t.auth_key(i).ok_or(Error::Inval("authorization key removed"))?.key.bytes();
        drop(t);
        // SAFETY: checked non-null.
        let have = unsafe { *auth_key_size };
        // SAFETY: checked non-null.
        unsafe { *auth_key_size = bytes.len() };
        // fi_av(3): truncated to the buffer, and the size needed returned.
        let n = have.min(bytes.len());
        if n > 0 {
            non_null!(auth_key);
            // SAFETY: the application's buffer holds `have` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), auth_key as *mut u8, n) };
        }
        Ok(0)
    }
}

entry! {
    fn rdmx_av_open(domain: *mut fi::fid_domain, attr: *mut fi::fi_av_attr, out: *mut *mut fi::fid_av => Out<*mut fi::fid_av>, context: *mut libc::c_void) -> i32 {
        non_null!(attr);
        // SAFETY: our domain.
        let d = unsafe { domain::domain_ref(domain) }?;
        // SAFETY: checked non-null; the application's attr, written back below.
        let attr = unsafe { &mut *attr };
        if !attr.name.is_null() {
            // Named (shared) AVs are not supported; MPICH falls back to a local AV.
            return Err(Error::NoSys);
        }
        check_open_flags(attr.flags)?;
        if attr.rx_ctx_bits != 0 {
            return Err(Error::NoSys);
        }
        let av_type = match attr.type_ {
            fi::FI_AV_UNSPEC => fi::FI_AV_MAP,
            t @ (fi::FI_AV_MAP | fi::FI_AV_TABLE) => t,
            _ => return Err(Error::Inval("av type")),
        };
        // fi_av(3): with FI_AV_UNSPEC "the AV type used will be returned
        // through the type field".
        attr.type_ = av_type;
        d.children.get();
        let av = fid::leak(Av {
            // The ops are the headers' struct extended (`AvOps`).
            fid: fi::fid_av {
                fid: fid::new_fid(fi::FI_CLASS_AV, context, &AV_FI_OPS),
                ops: &AV_OPS as *const AvOps as *mut fi::fi_ops_av,
            },
            domain: d,
            bound: Refs::default(),
            av_type,
            table: Arc::new(RwLock::new(AvTable::default())),
        });
        out.set(av as *mut fi::fid_av);
        Ok(0)
    }
}

entry! {
    fn av_close(f: *mut fi::fid) -> i32 {
        // SAFETY: our fid.
        let av = unsafe { Av::from_fid(f) }?;
        av.bound.busy()?;
        // SAFETY: the domain outlives its children.
        unsafe { (*av.domain).children.put() };
        // SAFETY: created by fid::leak in rdmx_av_open.
        unsafe { fid::retire(av as *const Av) };
        Ok(0)
    }
}

/// # Safety
/// `av` is null or an AV fid from rdmx.
pub unsafe fn av_ref<'a>(av: *mut fi::fid_av) -> Result<&'a Av> {
    // SAFETY: per contract.
    let a = unsafe { Av::from_fid(av as *const fi::fid) }?;
    // The class alone does not make it ours: an application may hand another
    // provider's AV (or a closed one's husk keeps our ops, which `from_fid`'s
    // class check already refuses once retired).
    if !std::ptr::eq(a.fid.fid.ops, &AV_FI_OPS) {
        return Err(Error::Inval("not an rdmx AV"));
    }
    Ok(a)
}

impl Av {
    /// Whether this AV was opened on domain `d`.
    pub fn of_domain(&self, d: &Domain) -> bool {
        std::ptr::eq(self.domain, d)
    }
}

entry! {
    fn av_insert(av: *mut fi::fid_av, addr: *const libc::c_void, count: usize, fi_addr: *mut fi::fi_addr_t, flags: u64, context: *mut libc::c_void) -> i32 {
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        let keys = insert_keys(av, flags, fi_addr, count)?;
        check_insert_flags(flags & !FI_AUTH_KEY, context)?;
        if count == 0 {
            return Ok(0);
        }
        non_null!(addr);
        // SAFETY: the application passes `count` packed addresses of our fixed size.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, count * ADDR_LEN) };
        let mut t = av.table.write();
        let mut inserted = 0;
        for (i, chunk) in bytes.chunks_exact(ADDR_LEN).enumerate() {
            let out = match (RdmxAddr::decode(chunk), &keys) {
                (Some(a), None) => {
                    inserted += 1;
                    t.insert(a)
                }
                // An entry whose slot held no key of this AV fails alone.
                (Some(a), Some(keys)) => match keys[i].map(|k| t.insert_keyed(a, k)) {
                    Some(Ok(x)) => {
                        inserted += 1;
                        x
                    }
                    _ => FI_ADDR_NOTAVAIL,
                },
                (None, _) => FI_ADDR_NOTAVAIL,
            };
            if !fi_addr.is_null() {
                // SAFETY: the application's output array has `count` entries.
                unsafe { *fi_addr.add(i) = out };
            }
            // SAFETY: with FI_SYNC_ERR, `context` is the application's array of
            // `count` ints (checked non-null).
            unsafe { sync_err(flags, context, i, out != FI_ADDR_NOTAVAIL) };
        }
        Ok(inserted)
    }
}

/// The keys addresses are inserted under: with `FI_AUTH_KEY`, the
/// authorization-key `fi_addr_t` each output slot holds on input (fi_av(3)),
/// required in an AV of keys and refused in one without.
fn insert_keys(av: &Av, flags: u64, fi_addr: *const fi::fi_addr_t, count: usize) -> Result<Option<Vec<Option<u32>>>> {
    match (av.keyed(), flags & FI_AUTH_KEY != 0) {
        (false, false) => Ok(None),
        (false, true) => Err(Error::Inval("FI_AUTH_KEY needs a domain opened with FI_AV_AUTH_KEY")),
        // rdmx cannot serve an address without a job.
        (true, false) => Err(Error::Inval("an AV of FI_AV_AUTH_KEY takes addresses only under a key (FI_AUTH_KEY)")),
        (true, true) => {
            if count == 0 {
                return Ok(Some(Vec::new()));
            }
            non_null!(fi_addr);
            // SAFETY: with FI_AUTH_KEY the application's fi_addr array of
            // `count` entries holds the keys on input.
            let given = unsafe { std::slice::from_raw_parts(fi_addr, count) };
            Ok(Some(given.iter().map(|&a| auth_key_index(a)).collect()))
        }
    }
}

/// `fi_av_attr.flags` rdmx knows from fi_av(3) but does not implement:
/// asynchronous inserts (`FI_EVENT`), read-only shared AVs (`FI_READ`),
/// symmetric AVs (`FI_SYMMETRIC`), user IDs set by `fi_av_set_user_id`
/// (`FI_AV_USER_ID`; the 2.x `fi_ops_av` entries stay null, which
/// libfabric's wrappers answer `-FI_ENOSYS`) and the peer API (`FI_PEER`).
const UNIMPLEMENTED_OPEN_FLAGS: u64 =
    fi::FI_EVENT as u64 | fi::FI_READ as u64 | fi::FI_SYMMETRIC | fi::FI_AV_USER_ID | fi::FI_PEER;

/// Open flags: rdmx implements none. A defined flag it does not implement
/// is `-FI_ENOSYS` (the operation exists, rdmx lacks it, as for named AVs);
/// any other bit is `-FI_EINVAL`, as libfabric's util AV answers.
fn check_open_flags(flags: u64) -> Result<()> {
    if flags & !UNIMPLEMENTED_OPEN_FLAGS != 0 {
        return Err(Error::Inval("unknown fi_av_attr flags"));
    }
    if flags != 0 {
        return Err(Error::NoSys);
    }
    Ok(())
}

/// Insert flags (fi_av(3)): `FI_MORE` (a hint, ignored) and `FI_SYNC_ERR`,
/// whose status array is the context and must be there.
fn check_insert_flags(flags: u64, context: *mut libc::c_void) -> Result<()> {
    if flags & !(fi::FI_SYNC_ERR | fi::FI_MORE as u64) != 0 {
        return Err(Error::BadFlags);
    }
    if flags & fi::FI_SYNC_ERR != 0 && context.is_null() {
        return Err(Error::Inval("FI_SYNC_ERR needs the status array as context"));
    }
    Ok(())
}

/// FI_SYNC_ERR: writes address `i`'s status into the application's int array,
/// 0 when inserted, else the fabric errno (`FI_EINVAL`: not an rdmx address).
///
/// # Safety
/// With `FI_SYNC_ERR` in `flags`, `context` is non-null and valid for more than
/// `i` ints.
unsafe fn sync_err(flags: u64, context: *mut libc::c_void, i: usize, ok: bool) {
    if flags & fi::FI_SYNC_ERR != 0 {
        // SAFETY: per contract.
        unsafe { *(context as *mut libc::c_int).add(i) = if ok { 0 } else { fi::FI_EINVAL as libc::c_int } };
    }
}

entry! {
    fn av_insertsvc(av: *mut fi::fid_av, node: *const libc::c_char, service: *const libc::c_char, fi_addr: *mut fi::fi_addr_t, flags: u64, context: *mut libc::c_void) -> i32 {
        non_null!(node, service);
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        let keys = insert_keys(av, flags, fi_addr, 1)?;
        check_insert_flags(flags & !FI_AUTH_KEY, context)?;
        // SAFETY: non-null C strings.
        let (node, service) = unsafe { (std::ffi::CStr::from_ptr(node).to_string_lossy(), std::ffi::CStr::from_ptr(service).to_string_lossy()) };
        let port: u16 = service.parse().map_err(|_| Error::Inval("service must be a UDP port"))?;
        use std::net::ToSocketAddrs;
        let sa = (node.as_ref(), port)
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or(Error::Inval("node does not resolve"))?;
        let a = RdmxAddr { udp: Some(sa), ..RdmxAddr::EMPTY };
        let idx = match keys {
            Some(k) => av
                .table
                .write()
                .insert_keyed(a, k[0].ok_or(Error::Inval("FI_AUTH_KEY: fi_addr is not an authorization key"))?)?,
            None => av.table.write().insert(a),
        };
        if !fi_addr.is_null() {
            // SAFETY: the application's output slot.
            unsafe { *fi_addr = idx };
        }
        // SAFETY: with FI_SYNC_ERR the context is an int array (checked non-null).
        unsafe { sync_err(flags, context, 0, true) };
        Ok(1)
    }
}

entry! {
    fn av_remove(av: *mut fi::fid_av, fi_addr: *mut fi::fi_addr_t, count: usize, flags: u64) -> i32 {
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        // fi_av(3) defines only FI_AUTH_KEY here: the fi_addr_t's are
        // authorization keys, removed only once no enabled endpoint uses
        // them (-FI_EBUSY).
        if flags & !FI_AUTH_KEY != 0 {
            return Err(Error::BadFlags);
        }
        if count == 0 {
            return Ok(0);
        }
        non_null!(fi_addr);
        // SAFETY: the application's array of `count` fi_addr values.
        let addrs = unsafe { std::slice::from_raw_parts(fi_addr, count) };
        let mut t = av.table.write();
        let mut result = Ok(0);
        for a in addrs {
            let r = if flags & FI_AUTH_KEY != 0 {
                auth_key_index(*a).ok_or(Error::Inval("FI_AUTH_KEY: not an authorization key")).and_then(|i| t.remove_key(i))
            } else {
                t.remove(*a)
            };
            if let Err(e) = r {
                result = Err(e);
            }
        }
        result
    }
}

entry! {
    fn av_lookup(av: *mut fi::fid_av, fi_addr: fi::fi_addr_t, addr: *mut libc::c_void, addrlen: *mut usize) -> i32 {
        non_null!(addrlen);
        // SAFETY: our fid.
        let av = unsafe { av_ref(av) }?;
        let a = av.table.read().get(fi_addr).ok_or(Error::Inval("fi_addr not in AV"))?;
        let bytes = a.encode();
        // SAFETY: checked non-null.
        let have = unsafe { *addrlen };
        // SAFETY: checked non-null.
        unsafe { *addrlen = ADDR_LEN };
        // fi_av(3): a buffer too small for the address gets it truncated, and
        // addrlen says how much it needs; that is not an error (unlike
        // fi_getname, whose page says -FI_ETOOSMALL).
        let n = have.min(ADDR_LEN);
        if n > 0 {
            non_null!(addr);
            // SAFETY: the application's buffer holds `have` bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, n) };
        }
        Ok(0)
    }
}

entry! {
    fn av_straddr(av: *mut fi::fid_av, addr: *const libc::c_void, buf: *mut libc::c_char, len: *mut usize) -> *const libc::c_char {
        let _ = av;
        non_null!(addr, len);
        // SAFETY: the application passes one address of our size.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, ADDR_LEN) };
        let s = RdmxAddr::decode(bytes).map(|a| a.to_uri()).unwrap_or_else(|| "rdmx://invalid".into());
        // SAFETY: checked non-null.
        let cap = unsafe { *len };
        // SAFETY: as above.
        unsafe { *len = s.len() + 1 };
        if !buf.is_null() && cap > 0 {
            let n = s.len().min(cap - 1);
            // SAFETY: the application's buffer holds `cap` bytes; we write n + 1.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
                *buf.add(n) = 0;
            }
        }
        Ok(buf as *const libc::c_char)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_flags_are_refused_known_ones_as_not_implemented() {
        assert_eq!(check_open_flags(0), Ok(()));
        for f in [fi::FI_EVENT as u64, fi::FI_READ as u64, fi::FI_SYMMETRIC, fi::FI_AV_USER_ID, fi::FI_PEER] {
            assert_eq!(check_open_flags(f), Err(Error::NoSys), "{f:#x}");
        }
        for f in [1u64, 1 << 30, fi::FI_AV_USER_ID | 1 << 2] {
            assert!(matches!(check_open_flags(f), Err(Error::Inval(_))), "{f:#x}");
        }
    }

    #[test]
    fn insert_flags_beyond_more_and_sync_err_are_bad_flags() {
        let mut status = [0i32; 1];
        let ctx = status.as_mut_ptr() as *mut libc::c_void;
        assert_eq!(check_insert_flags(fi::FI_MORE as u64, std::ptr::null_mut()), Ok(()));
        assert_eq!(check_insert_flags(fi::FI_SYNC_ERR, ctx), Ok(()));
        assert_eq!(check_insert_flags(fi::FI_AV_USER_ID, std::ptr::null_mut()), Err(Error::BadFlags));
    }
}
