//! An endpoint's counters: a summary at `FI_LOG_LEVEL=info` at close; with
//! `FI_RDMX_STATS=1` every counter on stderr at close, one line each; with
//! `FI_RDMX_STATS=<path>` a JSON document per endpoint appended to the path
//! at close, on `SIGUSR1` and every `FI_RDMX_STATS_INTERVAL` ms
//! (`stats_json.rs`; the schema is in fi_rdmx(7), RUNTIME STATS).
use crate::addr::RdmxAddr;
use crate::core::EpState;
use crate::log::{fi_info, Subsys};
use crate::params::params;
use crate::stats_json::{DumpReason, Json};

impl EpState {
    /// Logs the endpoint's counters as it closes.
    pub(crate) fn log_close_stats(&mut self) {
        if let Some(r) = self.running.as_mut() {
            let s = r.ep.stats();
            let local = r.local;
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
                fi_info!(
                    Subsys::EpCtrl,
                    "endpoint {}: {} datagrams dropped (no receive posted)",
                    r.local.to_uri(),
                    m.dropped_unmatched
                );
            }
            if params().stats {
                let counters = self.counters();
                print_stats(&local, &counters);
                print_job_stats(&self.job_stats());
            }
            if params().stats_path.is_some() {
                self.write_json_stats(DumpReason::Close);
            }
        }
    }

    /// Every counter of the endpoint, as `FI_RDMX_STATS=1` prints them (the
    /// JSON document's `counters` holds the same names and values).
    fn counters(&mut self) -> Vec<(&'static str, u64)> {
        let Some(r) = self.running.as_mut() else { return Vec::new() };
        let s = r.ep.stats();
        let (st, m, rc) = (&s.rdm, &s.msg, &s.read_conns);
        let revoked = self.mr_keys.lock().revoked_by_unmap();
        // The domain's cache (shared by its endpoints): zeros where the
        // device registers nothing (udp, shm).
        let cache = self.mr_cache.as_ref().map(|c| c.lock().stats()).unwrap_or_default();
        let on_demand = self.mr_cache.as_ref().is_some_and(|c| c.lock().on_demand());
        vec![
            ("packets_sent", st.sent_data),
            // Messages sent / received as DIRECT packets on reliable, ordered
            // paths (shm): no sequence number, no acknowledgement.
            ("direct_sent", st.sent_direct),
            ("direct_received", st.received_direct),
            // Of direct_sent, those the device wrote straight from the
            // application's buffer into the peer's ring (shm's small-message path).
            ("direct_written", st.sent_direct_written),
            ("acks_sent", st.sent_acks),
            ("packets_resent", st.retransmits),
            ("timeouts", st.timeouts),
            // Tail loss probes that fired, and window reductions for congestion
            // (random losses without a queue on the path reduce nothing).
            ("probes", st.probes),
            ("congestion_reductions", st.congestion_reductions),
            ("fast_retransmits", st.fast_retransmits),
            ("packets_received", st.received),
            ("messages_delivered", st.delivered_msgs),
            ("duplicates", st.duplicates),
            ("dropped_malformed_packets", st.dropped_malformed),
            ("dropped_checksum", st.dropped_checksum),
            ("dropped_job_key", st.dropped_job_key),
            ("dropped_stale", st.dropped_stale),
            // Sealed job traffic (a job secret; rdm/PROTOCOL.md §2.5): how it
            // goes (0 the job key in clear, 1 tagged, 2 tagged and
            // enciphered), datagrams refused as unsealed or forged, as
            // replays, as naming no incarnation of ours, and the challenges
            // that asked their senders to name it.
            ("job_traffic_sealed", self.job_traffic as u64),
            ("dropped_auth", st.dropped_auth),
            ("dropped_replay", st.dropped_replay),
            ("dropped_unnamed", st.dropped_unnamed),
            ("challenges_sent", st.sent_challenges),
            ("peers_failed", st.peers_failed),
            ("eager_sent", m.eager_sent),
            ("rendezvous_sent", m.rts_sent),
            ("rendezvous_pulled", m.pulled),
            ("rendezvous_windowed", m.pushed),
            ("windows_granted", m.windows_granted),
            // Pushed chunks the NIC gathered from the application's
            // registered memory (verbs: no copy on the sender).
            ("rendezvous_pushes_gathered", m.pushes_gathered),
            ("rma_started", m.rma_started),
            ("rma_served", m.rma_served),
            ("dropped_malformed_messages", m.dropped_malformed),
            ("dropped_stray_answers", m.stray),
            ("unexpected_bytes", s.unexpected_bytes as u64),
            // The domain's registrations whose memory the application unmapped
            // while they were open (remote accesses through them now fail).
            ("mr_keys_revoked_by_unmap", revoked),
            // Rendezvous keys: registrations this endpoint acquired, and buffers
            // announced with the application's own (its fi_mr_desc).
            ("rendezvous_registrations", m.registrations_acquired),
            ("rendezvous_registrations_from_desc", m.registrations_from_desc),
            // The domain's registration cache (shared by its endpoints).
            ("mr_cache_hits", cache.hits),
            ("mr_cache_misses", cache.misses),
            ("mr_cache_evictions", cache.evictions),
            ("mr_cache_invalidations", cache.invalidations),
            ("mr_cache_bytes_cached", cache.bytes_cached),
            // Registrations the device refused (the cache then evicts what is
            // unused and retries; a send falls back to windows, never fails).
            ("mr_cache_register_failures", cache.register_failures),
            // Registrations longer than FI_RDMX_MR_CACHE_MAX_ENTRY_SIZE, made
            // for one transfer and not kept.
            ("mr_cache_oversize", cache.oversize),
            // 1: the device registers on demand (verbs ODP), nothing pinned.
            ("mr_on_demand", on_demand as u64),
            // Reliable connections for rendezvous reads (verbs RC; zeros
            // elsewhere): handshakes, closes, reads through them.
            ("rc_connections_requested", rc.conns.requested),
            ("rc_connections_established", rc.conns.established),
            ("rc_connections_accepted", rc.conns.accepted),
            ("rc_connections_rejected", rc.conns.rejected + rc.conns.refused_by_peer),
            (
                "rc_connections_closed",
                rc.conns.closed_lru + rc.conns.closed_idle + rc.conns.closed_broken + rc.conns.closed_peer_failed,
            ),
            ("rc_connections_closed_lru", rc.conns.closed_lru),
            ("rc_connections_open", (rc.open_active + rc.open_passive) as u64),
            ("rc_queue_pairs", rc.queue_pairs),
            ("rc_reads", rc.reads),
            ("rc_read_bytes", rc.read_bytes),
            ("rc_read_failures", rc.read_failures),
            // Of those, reads no completion answered in time; and the
            // device's status code of the last failed read request (verbs:
            // ibv_wc_status, e.g. 12 = retries exceeded; 0 = none failed).
            ("rc_read_timeouts", rc.read_timeouts),
            ("rc_last_read_error", rc.last_read_error as u64),
        ]
    }

    /// Each job's counters, for an endpoint that serves several
    /// (`FI_AV_AUTH_KEY`; none for an endpoint of one job, whose counters
    /// are the endpoint's).
    pub(crate) fn job_stats(&self) -> Vec<JobStats> {
        let Some(r) = self.running.as_ref() else { return Vec::new() };
        if r.job_keys.is_empty() {
            return Vec::new();
        }
        let encrypt = params().job_encrypt;
        (0..r.ep.jobs())
            .map(|j| {
                let job = rdm::engine::JobIdx(j as u8);
                let c = r.ep.job_counters(job);
                let mut js = JobStats {
                    av_key: r.job_keys.get(j).copied().unwrap_or(u32::MAX),
                    traffic: match (r.ep.job_sealed(job), encrypt) {
                        (false, _) => crate::job::Protection::Clear,
                        (true, false) => crate::job::Protection::Tagged,
                        (true, true) => crate::job::Protection::Encrypted,
                    },
                    counters: Vec::new(),
                };
                let (mut peers, mut sent, mut received) = (0u64, [0u64; 2], [0u64; 2]);
                for p in r.ep.peer_stats().filter(|p| p.job == job) {
                    peers += 1;
                    sent[0] += p.sent_eager.messages + p.sent_rendezvous.messages;
                    sent[1] += p.sent_eager.bytes + p.sent_rendezvous.bytes;
                    received[0] +=
                        p.received_eager.messages + p.received_pulled.messages + p.received_windowed.messages;
                    received[1] += p.received_eager.bytes + p.received_pulled.bytes + p.received_windowed.bytes;
                }
                js.counters = vec![
                    ("peers", peers),
                    ("messages_sent", sent[0]),
                    ("bytes_sent", sent[1]),
                    ("messages_received", received[0]),
                    ("bytes_received", received[1]),
                    ("packets_received", c.received),
                    ("dropped_auth", c.dropped_auth),
                ];
                js
            })
            .collect()
    }

    /// Appends the endpoint's JSON document to `FI_RDMX_STATS`'s path.
    pub(crate) fn write_json_stats(&mut self, reason: DumpReason) {
        if self.running.is_none() || params().stats_path.is_none() {
            return;
        }
        let counters = self.counters();
        let jobs = self.job_stats();
        let (Some(r), Some(path)) = (self.running.as_mut(), params().stats_path.as_deref()) else { return };
        let s = r.ep.stats();
        let mut j = Json::object();
        j.field_u64("rdmx_stats", crate::stats_json::SCHEMA_VERSION);
        j.field_str("reason", reason.as_str());
        j.field_u64("pid", std::process::id() as u64);
        j.field_u64("time_ms", crate::stats_json::unix_ms());
        j.field_str("endpoint", &r.local.to_uri());
        j.field_str("job_traffic", self.job_traffic.name());
        j.begin_object("counters");
        for (k, v) in counters {
            j.field_u64(k, v);
        }
        j.end();
        // Not among the text lines (those stay as they were).
        j.field_u64("unexpected_bytes_max", s.msg.unexpected_bytes_max);
        j.field_u64("dropped_window", s.rdm.dropped_window);
        j.field_u64("dropped_unmatched", s.msg.dropped_unmatched);
        j.field_bool("refusing_messages", r.ep.refusing_messages());
        j.begin_array("peers");
        for p in r.ep.peer_stats() {
            j.begin_object_elem();
            j.field_str("address", &crate::addr::dev_addr_text(&p.addr));
            j.begin_object("sent");
            j.msg_bytes("eager", p.sent_eager.messages, p.sent_eager.bytes);
            j.msg_bytes("rendezvous", p.sent_rendezvous.messages, p.sent_rendezvous.bytes);
            j.end();
            j.begin_object("received");
            j.msg_bytes("eager", p.received_eager.messages, p.received_eager.bytes);
            j.msg_bytes("rendezvous_pulled", p.received_pulled.messages, p.received_pulled.bytes);
            j.msg_bytes("rendezvous_windowed", p.received_windowed.messages, p.received_windowed.bytes);
            j.end();
            j.field_u64("retransmits", p.retransmits);
            j.field_u64("duplicates", p.duplicates);
            j.field_u64("dropped_stale", p.dropped_stale);
            j.field_u64("dropped_window", p.dropped_window);
            j.field_opt_f64("srtt_us", p.srtt.map(|d| d.as_nanos() as f64 / 1000.0));
            j.field_f64("cwnd", p.cwnd);
            j.field_bool("failed", p.failed);
            j.end();
        }
        j.end();
        // FI_AV_AUTH_KEY: each job's counters (empty for one job).
        j.begin_array("jobs");
        for js in &jobs {
            j.begin_object_elem();
            j.field_u64("av_key", js.av_key as u64);
            j.field_str("traffic", js.traffic.name());
            for (k, v) in &js.counters {
                j.field_u64(k, *v);
            }
            j.end();
        }
        j.end();
        crate::stats_json::append_line(path, j.finish());
    }
}

/// One job's counters ([`EpState::job_stats`]).
pub(crate) struct JobStats {
    /// The index of its key in the AV (the low bits of the key's `fi_addr_t`).
    pub av_key: u32,
    pub traffic: crate::job::Protection,
    pub counters: Vec<(&'static str, u64)>,
}

/// `FI_RDMX_STATS=1`, an endpoint of several jobs: one line per job
/// (`rdmx job <n>: av_key <i> traffic <mode> <name> <value> ...`).
fn print_job_stats(jobs: &[JobStats]) {
    let mut out = String::new();
    for (n, js) in jobs.iter().enumerate() {
        out.push_str(&format!("rdmx job {n}: av_key {} traffic {}", js.av_key, js.traffic.name()));
        for (k, v) in &js.counters {
            out.push_str(&format!(" {k} {v}"));
        }
        out.push('\n');
    }
    eprint!("{out}");
}

/// `FI_RDMX_STATS=1`: the endpoint's counters at close, one line each
/// (`rdmx: <name> <value>`), to stderr: the documented way for scripts and tests
/// to read them.
fn print_stats(local: &RdmxAddr, counters: &[(&'static str, u64)]) {
    let mut out = format!("rdmx: endpoint {}\n", local.to_uri());
    for (k, v) in counters {
        out.push_str(&format!("rdmx: {k} {v}\n"));
    }
    eprint!("{out}");
}
