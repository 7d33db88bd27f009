//! The registration cache of a domain, on the data path.
//!
//! Layering (ARCHITECTURE.md): the device provides a [`Registrar`]
//! ([`rdm::device::DeviceContext::registrar`]), `mr_cache` caches its registrations,
//! `rndv` asks for them through [`rndv::Registrations`] when it announces a
//! rendezvous on a path whose remote reads need a key
//! (`DeviceCaps::registration`), and this module glues the three: one
//! [`MrCache`] per domain behind that domain's lock, and per endpoint a
//! [`DomainRegistrations`] handed to its message engine.
//!
//! udp and shm need no registration (udp pushes, shm reads with
//! `process_vm_readv`): their domains have no registrar and so no cache, their
//! paths never ask, and nothing here runs. With `FI_RDMX_MR_CACHE_ENABLE=0`
//! a domain that has a registrar registers per use: every acquire registers,
//! every release deregisters.
//!
//! The application's own registrations (`fi_mr_reg`) are registered with the
//! device through the same cache when the domain has one; their descriptors
//! ([`DomainMr::desc_keys`]) then give a send's buffers their keys, and the
//! engine looks nothing up for them.
use mr_cache::cache::{CacheConfig, CacheStats, EntryId, MrCache, Registrar};
use parking_lot::Mutex;
use rdm::DeviceError;
use rustc_hash::FxHashMap as HashMap;
use slab::Slab;
use std::sync::Arc;

/// A device's registrar: registers memory and returns the key a peer's
/// remote read names.
pub type BoxedRegistrar = Box<dyn rdm::device::Registrar>;

/// [`BoxedRegistrar`] as a [`Registrar`] the cache can own.
pub struct DeviceRegistrar(pub BoxedRegistrar);

impl Registrar for DeviceRegistrar {
    type Handle = u64;
    type Error = DeviceError;
    fn register(&mut self, addr: u64, len: u64, access: u64) -> Result<u64, DeviceError> {
        self.0.register(addr, len, access)
    }
    fn deregister(&mut self, key: u64) {
        self.0.deregister(key)
    }
    /// `ibv_reg_mr` says `ENOMEM` at the memlock limit or when the device's
    /// table of registrations is full, `EAGAIN` on some drivers for the latter.
    fn exhausted(error: &DeviceError) -> bool {
        matches!(error, DeviceError::Io { source, .. } if matches!(source.raw_os_error(), Some(libc::ENOMEM | libc::EAGAIN)))
    }
}

/// One application registration made through the cache.
#[derive(Clone, Copy, Debug)]
struct AppReg {
    addr: u64,
    len: u64,
    entry: EntryId,
    key: u64,
}

/// A domain's registrations: the cache, and the device keys of the
/// application's `fi_mr_reg` registrations by descriptor.
pub struct DomainMr {
    cache: MrCache<DeviceRegistrar>,
    /// By descriptor (the `Mr`'s address): its segments' registrations.
    descs: HashMap<usize, Vec<AppReg>>,
}

/// Shared by the domain, its endpoints and its MRs.
pub type SharedDomainMr = Arc<Mutex<DomainMr>>;

/// The process's unmap monitor; says once in the log when it cannot watch
/// memory (registrations then stay unprotected against the application
/// unmapping their memory while they are open).
pub(crate) fn unmap_monitor() -> &'static mr_cache::monitor::Monitor {
    static SAID: std::sync::Once = std::sync::Once::new();
    let m = mr_cache::monitor::Monitor::global();
    if let Some(why) = m.unavailable_reason() {
        SAID.call_once(|| crate::log::warn(crate::log::Subsys::Mr, "unmap_monitor", why));
    }
    m
}

/// The cache of a domain whose device registers memory (`None` for udp and
/// shm, which need no registration).
pub fn open(registrar: Option<BoxedRegistrar>, cfg: CacheConfig) -> Option<SharedDomainMr> {
    let reg = registrar?;
    Some(Arc::new(Mutex::new(DomainMr {
        cache: MrCache::new(DeviceRegistrar(reg), cfg, unmap_monitor()),
        descs: HashMap::default(),
    })))
}

impl DomainMr {
    pub fn stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The device registers on demand (verbs ODP): nothing is pinned, and
    /// a registration follows its memory across an unmap and a new mapping
    /// at the same address (the cache still saves the registration calls).
    pub fn on_demand(&self) -> bool {
        self.cache.registrar().0.on_demand()
    }

    /// `fi_mr_reg`: registers each segment with the device (through the
    /// cache), remembered under the descriptor `desc` until
    /// [`DomainMr::forget_desc`].
    pub fn register_desc(&mut self, desc: usize, segments: &[(u64, u64)], access: u64) -> Result<(), DeviceError> {
        let mut regs = Vec::with_capacity(segments.len());
        for &(addr, len) in segments {
            match self.cache.acquire(addr, len, access) {
                Ok(entry) => {
                    let key = self.cache.handle(entry).copied().unwrap_or_default();
                    regs.push(AppReg { addr, len, entry, key });
                }
                Err(e) => {
                    for r in regs {
                        self.cache.release(r.entry);
                    }
                    return Err(e);
                }
            }
        }
        self.descs.insert(desc, regs);
        Ok(())
    }

    /// `fi_close` of the MR: its registrations go back to the cache.
    pub fn forget_desc(&mut self, desc: usize) {
        for r in self.descs.remove(&desc).unwrap_or_default() {
            self.cache.release(r.entry);
        }
    }

    /// The key of the descriptor's registration that covers
    /// `[addr, addr+len)`, if `desc` is one of this domain's and one does. An
    /// unknown descriptor (another provider's, a stale one) is never
    /// dereferenced, only looked up.
    pub fn desc_key(&self, desc: usize, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        self.descs.get(&desc)?.iter().find(|r| r.addr <= addr && end <= r.addr.saturating_add(r.len)).map(|r| r.key)
    }
}

/// An endpoint's way to the domain's cache, for its message engine.
pub struct DomainRegistrations {
    domain: SharedDomainMr,
    /// Entries the engine holds, by the handle it was given.
    held: Slab<EntryId>,
}

impl DomainRegistrations {
    pub fn new(domain: SharedDomainMr) -> DomainRegistrations {
        DomainRegistrations { domain, held: Slab::new() }
    }
}

impl rndv::Registrations for DomainRegistrations {
    fn acquire(
        &mut self,
        addr: u64,
        len: u64,
        access: rndv::Access,
    ) -> Result<rndv::Registration, rndv::RegistrationError> {
        let want = match access {
            rndv::Access::RemoteRead => libfabric_sys::FI_REMOTE_READ as u64,
            rndv::Access::RemoteWrite => libfabric_sys::FI_REMOTE_WRITE as u64,
            // The destination of a device read: libfabric's FI_READ ("the
            // target of a read"), which is local write access on verbs.
            rndv::Access::LocalWrite => libfabric_sys::FI_READ as u64,
        };
        let mut d = self.domain.lock();
        let entry = d.cache.acquire(addr, len, want).map_err(|e| {
            crate::log::warn(
                crate::log::Subsys::Mr,
                "registration",
                &format!("registering {len} bytes at {addr:#x} failed: {e}"),
            );
            rndv::RegistrationError
        })?;
        let key = d.cache.handle(entry).copied().unwrap_or_default();
        Ok(rndv::Registration { handle: rndv::RegHandle(self.held.insert(entry) as u64), key })
    }

    fn release(&mut self, handle: rndv::RegHandle) {
        if let Some(entry) = self.held.try_remove(handle.0 as usize) {
            self.domain.lock().cache.release(entry);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rndv::Registrations;

    /// Only a limit reached makes the cache give back its unused
    /// registrations; a bad address does not flush it.
    #[test]
    fn exhaustion_is_enomem_or_eagain_only() {
        let io = |e| DeviceError::io("ibv_reg_mr", std::io::Error::from_raw_os_error(e));
        assert!(DeviceRegistrar::exhausted(&io(libc::ENOMEM)));
        assert!(DeviceRegistrar::exhausted(&io(libc::EAGAIN)));
        assert!(!DeviceRegistrar::exhausted(&io(libc::EFAULT)));
        assert!(!DeviceRegistrar::exhausted(&DeviceError::Unsupported));
    }

    /// A registrar that counts live registrations.
    struct Counting(Arc<Mutex<(u64, u64)>>);

    impl rdm::device::Registrar for Counting {
        fn register(&mut self, _addr: u64, _len: u64, _access: u64) -> Result<u64, DeviceError> {
            let mut c = self.0.lock();
            c.0 += 1;
            c.1 += 1;
            Ok(c.0)
        }
        fn deregister(&mut self, _key: u64) {
            self.0.lock().1 -= 1;
        }
    }

    fn domain(enabled: bool) -> (SharedDomainMr, Arc<Mutex<(u64, u64)>>) {
        let counts = Arc::new(Mutex::new((0, 0)));
        let cfg = CacheConfig { enabled, ..CacheConfig::default() };
        (open(Some(Box::new(Counting(counts.clone()))), cfg).expect("a registrar"), counts)
    }

    #[test]
    fn no_registrar_no_cache() {
        assert!(open(None, CacheConfig::default()).is_none());
    }

    /// With the cache on, a buffer sent twice is registered once; with it off
    /// (FI_RDMX_MR_CACHE_ENABLE=0), per use, deregistered at each release.
    #[test]
    fn cached_or_per_use() {
        let buf = vec![0u8; 1 << 16];
        let addr = buf.as_ptr() as u64;
        for enabled in [true, false] {
            let (d, counts) = domain(enabled);
            let mut r = DomainRegistrations::new(d.clone());
            for _ in 0..2 {
                let a = r.acquire(addr, 4096, rndv::Access::RemoteRead).unwrap();
                r.release(a.handle);
            }
            let (registered, live) = *counts.lock();
            // The unmap monitor decides what can be cached: memory it cannot
            // watch (no userfaultfd here) is registered per use either way.
            let watchable = d.lock().stats().uncached == 0;
            if enabled && watchable {
                assert_eq!((registered, live, d.lock().stats().hits), (1, 1, 1));
            } else {
                assert_eq!((registered, live), (2, 0), "enabled {enabled}");
            }
        }
    }

    #[test]
    fn descriptors_give_keys_only_inside_their_segments() {
        let (d, counts) = domain(true);
        let mut m = d.lock();
        m.register_desc(0x1234, &[(0x10_000, 0x1000), (0x20_000, 0x100)], 0).unwrap();
        assert_eq!(counts.lock().0, 2);
        let k = m.desc_key(0x1234, 0x10_010, 0x10).expect("inside the first segment");
        assert_eq!(m.desc_key(0x1234, 0x20_000, 0x100), Some(k + 1));
        assert_eq!(m.desc_key(0x1234, 0x10_ff0, 0x20), None, "runs past the segment");
        assert_eq!(m.desc_key(0x9999, 0x10_010, 0x10), None, "not a descriptor of this domain");
        m.forget_desc(0x1234);
        assert_eq!(m.desc_key(0x1234, 0x10_010, 0x10), None);
    }
}
