//! The application's memory as the endpoint ([`rndv::Endpoint`]) reaches it:
//! raw pointers the application posted or registered, under libfabric's
//! contract that they stay valid until the operation completes. The one place
//! rdmx turns an address into bytes.
use libfabric_sys as fi;
use mr_cache::KeyTable;
use parking_lot::Mutex;
use rdm::device::LocalBuf;
use rndv::IoBuf;
use std::sync::Arc;

/// The application's memory as the endpoint sees it: received bytes are
/// copied into posted buffers, reads land in them, and one-sided requests are
/// checked against the domain's registrations before memory is touched.
pub struct ProcessMemory {
    pub(crate) keys: Arc<Mutex<KeyTable>>,
    pub(crate) virt_addr: bool,
}

impl rndv::Memory for ProcessMemory {
    fn write(&mut self, addr: u64, data: &[u8]) {
        // SAFETY: the engine writes only into buffers the application posted
        // (receives, read results) or registered (RMA targets, checked by
        // rma_target, which also refuses registrations whose memory was
        // unmapped before the check), which libfabric's contract keeps valid
        // and unaliased until the operation completes or the MR is closed.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, data.len()) };
    }

    fn read(&self, addr: u64, len: usize, out: &mut Vec<u8>) {
        if len == 0 {
            return;
        }
        // SAFETY: as for `write`: a posted send buffer (valid until its send
        // completes) or a registered range checked by rma_target.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
    }

    fn bytes(&self, addr: u64, len: usize) -> &[u8] {
        if len == 0 {
            return &[];
        }
        // SAFETY: the engine asks only for bytes of a send buffer whose send is
        // still pending, which the application keeps valid until it completes.
        unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
    }

    fn read_target(&mut self, addr: u64, len: u64) -> Option<LocalBuf> {
        // SAFETY: the endpoint names only pieces of a buffer the application
        // posted for a receive still pending (the engine pairs runs inside
        // the pieces), which libfabric's contract keeps valid and leaves to
        // the provider until the receive completes, after the read.
        Some(unsafe { LocalBuf::new(addr, len) })
    }

    fn send_source(&self, addr: u64, len: u64) -> Option<LocalBuf> {
        // SAFETY: the engine names only pieces of a pending send's buffer,
        // which libfabric's contract keeps valid and unchanged until the send
        // completes; the engine completes it only after every datagram
        // gathered from it has completed.
        Some(unsafe { LocalBuf::new(addr, len) })
    }

    fn rma_target(
        &mut self,
        key: u64,
        addr: u64,
        len: u64,
        access: rndv::Access,
        job: u64,
    ) -> std::result::Result<Vec<IoBuf>, rndv::Status> {
        let mut keys = self.keys.lock();
        let region = keys.get(key).ok_or(rndv::Status::NoKey)?;
        // A registration limited to some jobs is out of every other job's
        // reach, whatever its key and range (checked before any byte moves).
        if region.reachable_by.as_ref().is_some_and(|jobs| !jobs.contains(&job)) {
            return Err(rndv::Status::Access);
        }
        let want = match access {
            rndv::Access::RemoteRead => fi::FI_REMOTE_READ as u64,
            rndv::Access::RemoteWrite => fi::FI_REMOTE_WRITE as u64,
            rndv::Access::LocalWrite => fi::FI_WRITE as u64,
        };
        // Registrations made without any access flag allow every access.
        let access_flags =
            (fi::FI_READ | fi::FI_WRITE | fi::FI_SEND | fi::FI_RECV | fi::FI_REMOTE_READ | fi::FI_REMOTE_WRITE) as u64;
        let want = if region.access & access_flags == 0 { 0 } else { want };
        let pieces = keys.check(key, addr, len, want, self.virt_addr).map_err(|e| match e {
            // A key whose memory the application unmapped reaches nothing,
            // like a closed one.
            mr_cache::MrError::NoKey(_) | mr_cache::MrError::KeyInUse(_) | mr_cache::MrError::Unmapped(_) => {
                rndv::Status::NoKey
            }
            _ => rndv::Status::Access,
        })?;
        Ok(pieces.into_iter().map(|p| IoBuf { addr: p.addr, len: p.len }).collect())
    }
}
