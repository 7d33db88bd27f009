//! An endpoint's counters at close: a summary at `FI_LOG_LEVEL=info`, and with
//! `FI_RDMX_STATS=1` every counter on stderr, one line each.
use crate::addr::RdmxAddr;
use crate::core::EpState;
use crate::log::{fi_info, Subsys};
use crate::params::params;

impl EpState {
    /// Logs the endpoint's counters as it closes.
    pub(crate) fn log_close_stats(&self) {
        if let Some(r) = self.running.as_ref() {
            let s = r.ep.stats();
            let (st, m) = (&s.rdm, &s.msg);
            fi_info!(
                Subsys::EpCtrl,
                "endpoint {} closed: {} messages delivered, {} data packets sent ({} retransmitted), {} RMA/atomic operations started, {} served, rendezvous: {} sent, {} pulled, {} pushed; {} malformed and {} stray messages dropped",
                r.local.to_uri(),
                st.delivered_msgs,
                st.sent_data,
                st.retransmits,
                m.rma_started,
                m.rma_served,
                m.rts_sent,
                m.pulled,
                m.pushed,
                m.dropped_malformed,
                m.stray
            );
            if m.dropped_unmatched > 0 {
                fi_info!(Subsys::EpCtrl, "endpoint {}: {} datagrams dropped (no receive posted)", r.local.to_uri(), m.dropped_unmatched);
            }
            if params().stats {
                let revoked = self.mr_keys.lock().revoked_by_unmap();
                // The domain's cache (shared by its endpoints): zeros where
                // the device registers nothing (udp, shm).
                let cache = self.mr_cache.as_ref().map(|c| c.lock().stats()).unwrap_or_default();
                print_stats(&r.local, st, m, s.unexpected_bytes, revoked, &cache);
            }
        }
    }
}

/// `FI_RDMX_STATS=1`: the endpoint's counters at close, one line each
/// (`rdmx: <name> <value>`), to stderr: the documented way for scripts and tests
/// to read them.
fn print_stats(local: &RdmxAddr, st: &rdm::engine::Stats, m: &rndv::engine::Stats, unexpected_bytes: usize, mr_revoked_by_unmap: u64, cache: &mr_cache::cache::CacheStats) {
    let lines = [
        ("endpoint", local.to_uri()),
        ("packets_sent", st.sent_data.to_string()),
        // Messages sent / received as DIRECT packets on reliable, ordered
        // paths (shm): no sequence number, no acknowledgement.
        ("direct_sent", st.sent_direct.to_string()),
        ("direct_received", st.received_direct.to_string()),
        ("acks_sent", st.sent_acks.to_string()),
        ("packets_resent", st.retransmits.to_string()),
        ("timeouts", st.timeouts.to_string()),
        // Tail loss probes that fired, and window reductions for congestion
        // (random losses without a queue on the path reduce nothing).
        ("probes", st.probes.to_string()),
        ("congestion_reductions", st.congestion_reductions.to_string()),
        ("fast_retransmits", st.fast_retransmits.to_string()),
        ("packets_received", st.received.to_string()),
        ("messages_delivered", st.delivered_msgs.to_string()),
        ("duplicates", st.duplicates.to_string()),
        ("dropped_malformed_packets", st.dropped_malformed.to_string()),
        ("dropped_checksum", st.dropped_checksum.to_string()),
        ("dropped_job_key", st.dropped_job_key.to_string()),
        ("dropped_stale", st.dropped_stale.to_string()),
        ("peers_failed", st.peers_failed.to_string()),
        ("eager_sent", m.eager_sent.to_string()),
        ("rendezvous_sent", m.rts_sent.to_string()),
        ("rendezvous_pulled", m.pulled.to_string()),
        ("rendezvous_windowed", m.pushed.to_string()),
        ("windows_granted", m.windows_granted.to_string()),
        ("rma_started", m.rma_started.to_string()),
        ("rma_served", m.rma_served.to_string()),
        ("dropped_malformed_messages", m.dropped_malformed.to_string()),
        ("dropped_stray_answers", m.stray.to_string()),
        ("unexpected_bytes", unexpected_bytes.to_string()),
        // The domain's registrations whose memory the application unmapped
        // while they were open (remote accesses through them now fail).
        ("mr_keys_revoked_by_unmap", mr_revoked_by_unmap.to_string()),
        // Rendezvous keys: registrations this endpoint acquired, and buffers
        // announced with the application's own (its fi_mr_desc).
        ("rendezvous_registrations", m.registrations_acquired.to_string()),
        ("rendezvous_registrations_from_desc", m.registrations_from_desc.to_string()),
        // The domain's registration cache (shared by its endpoints).
        ("mr_cache_hits", cache.hits.to_string()),
        ("mr_cache_misses", cache.misses.to_string()),
        ("mr_cache_evictions", cache.evictions.to_string()),
        ("mr_cache_invalidations", cache.invalidations.to_string()),
        ("mr_cache_bytes_cached", cache.bytes_cached.to_string()),
        // Registrations the device refused (the cache then evicts what is
        // unused and retries; a send falls back to windows, never fails).
        ("mr_cache_register_failures", cache.register_failures.to_string()),
    ];
    let mut out = String::new();
    for (k, v) in lines {
        out.push_str(&format!("rdmx: {k} {v}\n"));
    }
    eprint!("{out}");
}
