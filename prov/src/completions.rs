//! The endpoint's outputs in libfabric's terms: each completion of the message
//! engine becomes a CQ entry (flags, source address, error with the failed
//! peer), counter updates, or for an operation without a context an EQ error;
//! endpoint events become EQ errors and log lines.
use crate::addr::RdmxAddr;
use crate::av_table::FI_ADDR_NOTAVAIL;
use crate::cntr_queue::CntrShared;
use crate::core::EpState;
use crate::cq_queue::{Completion, CompletionError};
use crate::error::ErrReason;
use crate::log::{fi_info, fi_warn, Subsys};
use libfabric_sys as fi;
use rdm::engine::{FailReason, PeerId};
use rdm::DevAddr;
use rndv::{EndpointEvent, MsgKind, OpError, OpKind};
use std::sync::Arc;

fn errno_of(e: OpError) -> u32 {
    match e {
        OpError::Truncated { .. } => fi::FI_ETRUNC,
        OpError::Canceled => fi::FI_ECANCELED,
        OpError::NoMessage => fi::FI_ENOMSG,
        OpError::PeerUnreachable => fi::FI_EHOSTUNREACH,
        OpError::Io => fi::FI_EIO,
        OpError::NoKey | OpError::Access => fi::FI_EACCES,
        OpError::Invalid => fi::FI_EINVAL,
    }
}

/// The precise reason of an error that concerns a peer (`None`: canceled, or
/// a peek that found nothing); `failed` is why the peer last failed.
fn reason_of(e: OpError, failed: Option<FailReason>) -> Option<ErrReason> {
    Some(match e {
        OpError::Truncated { .. } => ErrReason::Truncated,
        OpError::Canceled | OpError::NoMessage => return None,
        OpError::PeerUnreachable if failed == Some(FailReason::Timeout) => ErrReason::PeerTimeout,
        OpError::PeerUnreachable => ErrReason::PeerUnreachable,
        OpError::Io if failed == Some(FailReason::PeerRestarted) => ErrReason::PeerRestarted,
        OpError::Io => ErrReason::Transfer,
        OpError::NoKey => ErrReason::RemoteNoKey,
        OpError::Access => ErrReason::RemoteAccess,
        OpError::Invalid => ErrReason::RemoteInvalid,
    })
}

fn msg_flag(kind: MsgKind) -> u64 {
    match kind {
        MsgKind::Msg => fi::FI_MSG as u64,
        MsgKind::Tagged => fi::FI_TAGGED as u64,
    }
}

impl EpState {
    pub(crate) fn push_rx(&self, c: Completion) {
        if let Some(b) = &self.rx_cq {
            b.cq.push(c);
        }
    }

    pub(crate) fn src_fi_addr(&mut self, peer: PeerId) -> u64 {
        let Some(r) = self.running.as_mut() else { return FI_ADDR_NOTAVAIL };
        let generation = self.av_generation.as_ref().map_or(0, |g| g.load(std::sync::atomic::Ordering::Acquire));
        if generation != r.src_cache_gen {
            r.src_cache.clear();
            r.src_cache_gen = generation;
        }
        if let Some(a) = r.src_cache.get(peer.index() as u64) {
            return a;
        }
        let dev = r.ep.peer_addr(peer);
        let local = r.local;
        // Under FI_AV_AUTH_KEY, the entry of that address under the key of
        // the sender's job: one process in two jobs is two fi_addr's.
        let key = r.job_keys.get(r.ep.peer_job(peer).0 as usize).copied();
        let found = self
            .av
            .as_ref()
            .and_then(|av| {
                let t = av.read();
                match key {
                    Some(k) => t.find_keyed(k, |a| a.route(&local) == Some(dev)),
                    None => t.find(|a| a.route(&local) == Some(dev)),
                }
            })
            .unwrap_or(FI_ADDR_NOTAVAIL);
        if found != FI_ADDR_NOTAVAIL {
            r.src_cache.insert(peer.index() as u64, found);
        }
        found
    }

    /// Turns one of the message engine's completions into libfabric's: CQ entry
    /// (flags, source address, error), counters, and for a failed inject a
    /// CQ error entry without context (API 2.5 on) or an EQ error (before).
    pub(crate) fn report(&mut self, c: rndv::Completion) {
        let err = c.err.map(errno_of);
        let inc = |cntr: &Option<Arc<CntrShared>>, failed: bool| {
            if let Some(k) = cntr {
                if failed {
                    k.inc_err();
                } else {
                    k.inc();
                }
            }
        };
        match c.kind {
            OpKind::Send | OpKind::Write | OpKind::Read | OpKind::Atomic { .. } => {
                let (flags, cntr) = match c.kind {
                    OpKind::Send => (fi::FI_SEND as u64 | c.msg.map(msg_flag).unwrap_or(0), &self.send_cntr),
                    OpKind::Write => ((fi::FI_RMA | fi::FI_WRITE) as u64, &self.write_cntr),
                    OpKind::Read => ((fi::FI_RMA | fi::FI_READ) as u64, &self.read_cntr),
                    OpKind::Atomic { fetch: false } => ((fi::FI_ATOMIC | fi::FI_WRITE) as u64, &self.write_cntr),
                    _ => ((fi::FI_ATOMIC | fi::FI_READ) as u64, &self.read_cntr),
                };
                inc(cntr, err.is_some());
                if let (true, Some(e)) = (c.meta.inject, c.err) {
                    self.report_failed_inject(&c, e, flags);
                } else if c.meta.wanted || err.is_some() {
                    let cerr = c.err.map(|e| self.error_entry(&c, e));
                    if let Some(b) = &self.tx_cq {
                        b.cq.push(Completion {
                            op_context: c.meta.context as usize,
                            flags,
                            len: c.len,
                            err: cerr.map(Box::new),
                            ..Completion::default()
                        });
                    }
                }
            }
            OpKind::Recv => {
                let kind = c.msg.unwrap_or(MsgKind::Msg);
                let mut flags = recv_flags(kind, c.data);
                if c.multi_done {
                    flags |= fi::FI_MULTI_RECV as u64;
                }
                let src = c.src.map(|p| self.src_fi_addr(p)).unwrap_or(FI_ADDR_NOTAVAIL);
                // FI_SOURCE_ERR: a sender missing from the AV is reported as an
                // error entry carrying its address, so the application can insert it.
                let src_err = (err.is_none()
                    && c.src.is_some()
                    && src == FI_ADDR_NOTAVAIL
                    && self.profile.caps & fi::FI_SOURCE_ERR != 0)
                    .then(|| self.running.as_ref().zip(c.src).map(|(r, p)| sender_addr(r.ep.peer_addr(p))))
                    .flatten();
                let cerr = match c.err {
                    Some(e) => Some(self.error_entry(&c, e)),
                    None => src_err
                        .map(|a| CompletionError { src_addr: Some(a), ..CompletionError::new(fi::FI_EADDRNOTAVAIL) }),
                };
                // A peek's answer is not a receive: counters count receives only.
                if c.err != Some(OpError::NoMessage) {
                    inc(&self.recv_cntr, matches!(c.err, Some(e) if e != OpError::NoMessage));
                }
                if cerr.is_some() || c.meta.wanted || c.multi_done {
                    self.push_rx(Completion {
                        op_context: c.meta.context as usize,
                        flags,
                        len: c.len,
                        buf: c.buf as usize,
                        data: c.data.unwrap_or(0),
                        tag: c.tag,
                        src,
                        err: cerr.map(Box::new),
                    });
                }
            }
            OpKind::RemoteWrite | OpKind::RemoteRead => {
                let write = c.kind == OpKind::RemoteWrite;
                inc(if write { &self.rwrite_cntr } else { &self.rread_cntr }, false);
                if let Some(d) = c.data {
                    self.push_rx(Completion {
                        flags: (fi::FI_RMA | fi::FI_REMOTE_WRITE | fi::FI_REMOTE_CQ_DATA) as u64,
                        len: c.len,
                        data: d,
                        ..Completion::default()
                    });
                }
            }
        }
    }

    /// The CQ error entry of `c`, failed with `e`: the `FI_E*` value, the
    /// precise reason as `prov_errno`, and the peer it concerns as `err_data`
    /// (its whole AV address, host id and incarnation included, where the AV
    /// has it), so that `fi_cq_strerror` says why and with whom; the same
    /// goes to the log at warn.
    fn error_entry(&mut self, c: &rndv::Completion, e: OpError) -> CompletionError {
        let olen = match e {
            OpError::Truncated { olen } => olen,
            _ => 0,
        };
        let mut entry = CompletionError { olen, ..CompletionError::new(errno_of(e)) };
        let Some(peer) = c.src else { return entry };
        let Some(why) = reason_of(e, self.running.as_ref().and_then(|r| r.ep.fail_reason(peer))) else { return entry };
        let addr = self.peer_rdmx_addr(peer);
        entry.prov_errno = why.prov_errno();
        entry.src_addr = addr.map(|a| a.encode());
        // A failed peer is logged once, as it fails (drain_outputs); what
        // else fails with a peer is logged per operation, truncation (the
        // application's buffer) only at info.
        let per_op = !matches!(why, ErrReason::PeerTimeout | ErrReason::PeerUnreachable);
        if per_op {
            let uri = addr.map(|a| a.to_uri()).unwrap_or_else(|| "unknown".into());
            if why == ErrReason::Truncated {
                fi_info!(
                    Subsys::EpData,
                    "{:?} with context {:#x} failed: {} (peer {uri})",
                    c.kind,
                    c.meta.context,
                    why.text().to_string_lossy()
                );
            } else {
                fi_warn!(
                    Subsys::EpData,
                    "{:?} with context {:#x} failed: {} (peer {uri})",
                    c.kind,
                    c.meta.context,
                    why.text().to_string_lossy()
                );
            }
        }
        entry
    }

    /// The rdmx address of `peer`: its AV entry when the AV has it (the whole
    /// identity: host id, incarnation, every device address), else what its
    /// device address says.
    fn peer_rdmx_addr(&mut self, peer: PeerId) -> Option<RdmxAddr> {
        let fi_addr = self.src_fi_addr(peer);
        if fi_addr != FI_ADDR_NOTAVAIL {
            if let Some(a) = self.av.as_ref().and_then(|av| av.read().get(fi_addr)) {
                return Some(a);
            }
        }
        let r = self.running.as_ref()?;
        RdmxAddr::decode(&sender_addr(r.ep.peer_addr(peer)))
    }

    /// A failed inject (`fi_inject*`, which takes no context; the counter
    /// already counted the error), `flags` the op's CQ flags.
    ///
    /// From API 2.5 on, fi_msg(3) and fi_cq(3) say a failed inject writes an
    /// error entry to the CQ, with `op_context` NULL: so it does, when the
    /// application asked for 2.5 or newer and a CQ takes transmit
    /// completions. Before 2.5 no version promised one, and applications
    /// written for those rules dereference the context of every error entry
    /// (OpenMPI 5, which asks 1.18, asserts it is non-NULL): there, and on an
    /// endpoint without a transmit CQ, the failure goes to the EQ instead.
    fn report_failed_inject(&mut self, c: &rndv::Completion, e: OpError, flags: u64) {
        if self.profile.api_version < crate::info::appended::V2_5 || self.tx_cq.is_none() {
            self.report_contextless_error("inject", errno_of(e) as i32);
            return;
        }
        let cerr = self.error_entry(c, e);
        fi_warn!(
            Subsys::EpData,
            "inject failed: {} (reported on the CQ without a context)",
            std::io::Error::from_raw_os_error(cerr.err)
        );
        if let Some(b) = &self.tx_cq {
            b.cq.push(Completion {
                op_context: 0,
                flags,
                len: c.len,
                err: Some(Box::new(cerr)),
                ..Completion::default()
            });
        }
    }

    /// A failure of an operation that has no context (an inject under API
    /// rules older than 2.5): an EQ error event if an EQ is bound, and the
    /// log. Never a CQ entry: its `op_context` would be NULL, and MPI
    /// libraries dereference the context of every error entry.
    pub(crate) fn report_contextless_error(&mut self, what: &str, err: i32) {
        fi_warn!(
            Subsys::EpData,
            "{what} failed: {} (reported on the EQ and the counter)",
            std::io::Error::from_raw_os_error(err)
        );
        if let Some((eq, fid)) = &self.eq {
            eq.push_error(*fid, err as u32);
        }
    }

    /// Reports the endpoint's completions and events.
    pub(crate) fn drain_outputs(&mut self) {
        loop {
            let Some(r) = self.running.as_mut() else { return };
            if let Some(e) = r.ep.poll_event() {
                match e {
                    EndpointEvent::PeerFailed { peer, .. } => {
                        let why = match r.ep.fail_reason(peer) {
                            Some(FailReason::Timeout) => ErrReason::PeerTimeout,
                            Some(FailReason::PeerRestarted) => ErrReason::PeerRestarted,
                            _ => ErrReason::PeerUnreachable,
                        };
                        let uri = self.peer_rdmx_addr(peer).map(|a| a.to_uri()).unwrap_or_else(|| "unknown".into());
                        fi_warn!(Subsys::EpData, "peer {uri} failed: {}", why.text().to_string_lossy());
                        if let Some((eq, fid)) = &self.eq {
                            eq.push_error(*fid, fi::FI_EHOSTUNREACH);
                        }
                    }
                    EndpointEvent::DeviceFailed { op, error } => {
                        fi_warn!(Subsys::EpData, "device {op} failed: {error}")
                    }
                    EndpointEvent::ReadFailed { addr, bytes, error } => {
                        fi_warn!(Subsys::EpData, "rendezvous read from {addr:?} failed after {bytes} bytes: {error:?}")
                    }
                }
                continue;
            }
            let Some(c) = r.ep.poll_completion() else { return };
            self.report(c);
        }
    }
}

/// An insertable rdmx address for a sender known only by its device address.
fn sender_addr(dev: DevAddr) -> [u8; crate::addr::ADDR_LEN] {
    RdmxAddr::of_sender(dev).encode()
}

fn recv_flags(kind: MsgKind, data: Option<u64>) -> u64 {
    let mut f = fi::FI_RECV as u64
        | match kind {
            MsgKind::Msg => fi::FI_MSG as u64,
            MsgKind::Tagged => fi::FI_TAGGED as u64,
        };
    if data.is_some() {
        f |= fi::FI_REMOTE_CQ_DATA as u64;
    }
    f
}
