//! What an EFA device offers an endpoint, as pure functions of its
//! attributes: the limits and caps ([`EfaLimits`]), the memory access it
//! takes ([`efa_mr_access_mask`]) and how a read is cut into requests
//! ([`split_read`]). Apart from the queue pair so that the unit tests
//! exercise them with made-up attributes, without hardware.
#![forbid(unsafe_code)]

use super::{DEFAULT_RQ_DEPTH, DEFAULT_SQ_DEPTH};
use crate::ib::mr_keys;
use rdm::device::{DeviceCaps, DeviceError, ReadRun};
use rdma_core_sys as ib;
use std::io;

/// What an EFA device offers an endpoint, from `efadv_query_device` and
/// the port's attributes (pure: tested with made-up attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EfaLimits {
    /// Largest datagram: the port's `max_msg_sz`.
    pub mtu: usize,
    pub sq_depth: u32,
    pub rq_depth: u32,
    /// Bytes a send may carry inline.
    pub max_inline: u16,
    /// SGEs a send may gather (2 lets a datagram name a gathered part).
    pub send_sges: u16,
    /// Largest RDMA read request; `None` when the device cannot read.
    pub max_rdma_size: Option<u32>,
    /// The device takes an RNR retry count at RTS.
    pub rnr_retry: bool,
    /// Receive completions can name the sender's GID.
    pub cq_with_sgid: bool,
}

impl EfaLimits {
    /// The limits for queues of `want_sq` / `want_rq` entries (0: the
    /// defaults), cut to what the device and its CQs (`max_cqe`) take.
    pub fn from_attr(
        attr: &ib::efadv_device_attr,
        port_max_msg: u32,
        max_cqe: u32,
        want_sq: u32,
        want_rq: u32,
    ) -> EfaLimits {
        let caps = attr.device_caps;
        let want_sq = if want_sq == 0 { DEFAULT_SQ_DEPTH } else { want_sq };
        let want_rq = if want_rq == 0 { DEFAULT_RQ_DEPTH } else { want_rq };
        let max_cqe = max_cqe.max(1);
        let mtu = port_max_msg as usize;
        EfaLimits {
            mtu,
            sq_depth: want_sq.min(attr.max_sq_wr).min(max_cqe).max(1),
            rq_depth: want_rq.min(attr.max_rq_wr).min(max_cqe).max(1),
            max_inline: (attr.inline_buf_size as usize).min(mtu) as u16,
            send_sges: attr.max_sq_sge.clamp(1, 2),
            max_rdma_size: (caps & ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ != 0 && attr.max_rdma_size > 0)
                .then_some(attr.max_rdma_size),
            rnr_retry: caps & ib::EFADV_DEVICE_ATTR_CAPS_RNR_RETRY != 0,
            cq_with_sgid: caps & ib::EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID != 0,
        }
    }

    /// The caps of an endpoint with these limits.
    pub fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            reliable: true,
            ordered: false,
            mtu: self.mtu,
            remote_read: self.max_rdma_size.is_some(),
            gso: false,
            max_inline: self.max_inline,
            registration: true,
            max_transmit: self.mtu,
        }
    }
}

/// One RDMA read request of a posted read: `len` bytes from the peer's
/// `remote_addr` (key `rkey`) into local `addr` (key `lkey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPiece {
    pub remote_addr: u64,
    pub rkey: u32,
    pub addr: u64,
    pub lkey: u32,
    pub len: u32,
}

/// The requests of a read of `runs`, each at most `max` bytes (a run of 0
/// bytes asks for nothing). `Config` when a run lacks a key; an I/O error
/// (`InvalidInput`: the read fails, nothing is posted) when a run's remote
/// range, which the peer announced, runs past the end of the address space.
pub fn split_read(runs: &[ReadRun], max: u32) -> Result<Vec<ReadPiece>, DeviceError> {
    let max = max.max(1) as u64;
    let mut out = Vec::new();
    for r in runs {
        let (Some(remote), Some(local)) = (r.remote_key, r.local.key()) else {
            return Err(DeviceError::Config("efa: an RDMA read needs the peer's key and a local one".into()));
        };
        let (_, rkey) = mr_keys(remote);
        let (lkey, _) = mr_keys(local);
        if r.remote_addr.checked_add(r.local.len()).is_none() {
            return Err(DeviceError::io(
                "efa read",
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the peer's range {:#x}+{} wraps past the end of the address space",
                        r.remote_addr,
                        r.local.len()
                    ),
                ),
            ));
        }
        let mut off = 0;
        while off < r.local.len() {
            let len = (r.local.len() - off).min(max);
            // Cannot wrap: remote_addr + len(run) did not, and off < len(run).
            out.push(ReadPiece {
                remote_addr: r.remote_addr + off,
                rkey,
                addr: r.local.addr() + off,
                lkey,
                len: len as u32,
            });
            off += len;
        }
    }
    Ok(out)
}

/// The verbs access bits an EFA device with `device_caps` (from
/// `efadv_query_device`) takes for a memory region: the kernel's
/// `efa_alloc_mr` refuses any other bit with `EOPNOTSUPP`. Local write
/// always; remote read with `EFADV_DEVICE_ATTR_CAPS_RDMA_READ`. Remote
/// write would need `EFADV_DEVICE_ATTR_CAPS_RDMA_WRITE`, which the
/// rdma-core headers this builds against (44) do not have: no remote write.
pub fn efa_mr_access_mask(device_caps: u32) -> u32 {
    let mut mask = ib::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    if device_caps & ib::EFADV_DEVICE_ATTR_CAPS_RDMA_READ != 0 {
        mask |= ib::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    mask
}
