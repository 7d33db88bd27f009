//! Sealing datagrams with the job's secret (`rdm/PROTOCOL.md` §2.5): who may
//! send a job's packets, and that none is accepted twice.
//!
//! A job that configures a secret ([`JobAuth`]) seals every datagram that
//! crosses a wire (not those through a shared-memory ring, which the kernel
//! guards): an AES-128-GCM tag over the header and payload, the payload
//! optionally enciphered, and a trailer of the sender's packet counter and the
//! tag. The secret never travels. From it, HKDF-SHA256 derives:
//!
//! - the job id carried in clear in the header's job-key field (public: it
//!   names the job, it proves nothing);
//! - one key per sending endpoint incarnation (`info` = job id, incarnation).
//!   A restarted endpoint has a new incarnation, hence a new key, so its
//!   counter starting again at 0 never repeats a nonce under one key.
//!
//! The nonce is the counter (one per sender, over all its peers, never
//! reused); the receiver derives the sender's key from the header's source
//! incarnation (cached once a datagram verified with it) and checks the tag
//! before anything else looks at the datagram: a forged one makes no peer
//! state. Replays are refused by [`ReplayWindow`] per peer incarnation (and,
//! for data beyond it, by the sequence numbers), and across incarnations by
//! the engine's rules on fresh packets (`receive`).
//!
//! The cryptography is AWS-LC's (`aws-lc-rs`: AES-GCM with AES-NI, VAES and
//! carry-less multiply where the CPU has them; HKDF-SHA256); nothing here is
//! hand-written beyond laying out the nonce and the trailer.
use super::wire::{Sealed, HEADER_LEN, TRAILER_LEN};
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM};
use aws_lc_rs::hkdf;
use rustc_hash::FxHashMap;

/// Fewest bytes a job secret has (128 bits).
pub const SECRET_MIN_LEN: usize = 16;
/// Most bytes a job secret has (`fi_domain_attr.auth_key_size` and the
/// environment carry it; longer adds nothing).
pub const SECRET_MAX_LEN: usize = 1024;

/// A job's secret, as the keys derived from it (the bytes themselves are not
/// kept). Its `Debug` shows the job id only.
pub struct JobSecret {
    prk: hkdf::Prk,
    job_id: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("a job secret has {SECRET_MIN_LEN} to {SECRET_MAX_LEN} bytes, not {0}")]
pub struct SecretLength(pub usize);

/// The HKDF salt: fixed, naming the protocol, so that the same secret used
/// elsewhere gives unrelated keys.
const SALT: &[u8] = b"rdmx job traffic, protocol 2";

/// An HKDF output length for `aws-lc-rs`'s expand.
struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

impl JobSecret {
    pub fn new(secret: &[u8]) -> Result<JobSecret, SecretLength> {
        if !(SECRET_MIN_LEN..=SECRET_MAX_LEN).contains(&secret.len()) {
            return Err(SecretLength(secret.len()));
        }
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(secret);
        let mut id = [0u8; 8];
        prk.expand(&[b"job id"], Len(8)).and_then(|okm| okm.fill(&mut id)).expect("8 bytes are within HKDF's limit");
        // 0 is the job key of a job without a secret: never the same job.
        let job_id = u64::from_le_bytes(id).max(1);
        Ok(JobSecret { prk, job_id })
    }

    /// The job id the header carries (`PROTOCOL.md` §2, the job-key field).
    pub fn job_id(&self) -> u64 {
        self.job_id
    }

    /// The key that endpoint incarnation `inc` seals with.
    fn sender_key(&self, inc: u64) -> LessSafeKey {
        let (job, inc) = (self.job_id.to_le_bytes(), inc.to_le_bytes());
        let info: [&[u8]; 3] = [b"sender key", &job, &inc];
        let okm = self.prk.expand(&info, &AES_128_GCM).expect("a 16-byte key is within HKDF's limit");
        LessSafeKey::new(UnboundKey::from(okm))
    }
}

impl core::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("JobSecret").field("job_id", &self.job_id).finish_non_exhaustive()
    }
}

/// What an engine of a job with a secret does with it.
#[derive(Debug)]
pub struct JobAuth {
    pub secret: JobSecret,
    /// Encipher payloads too (not only tag them).
    pub encrypt: bool,
}

impl JobAuth {
    /// How datagrams over a wire are sealed.
    pub fn sealing(&self) -> Sealed {
        if self.encrypt {
            Sealed::Encrypted
        } else {
            Sealed::Tagged
        }
    }
}

/// Keys of senders verified, at most this many; then forgotten at once (a
/// job of more endpoint incarnations pays a derivation per datagram of the
/// ones beyond, which is slower, never wrong).
const RX_KEYS_MAX: usize = 1 << 16;

/// An engine's sealing state: its own key and counter, the keys of the
/// senders it verified, and a buffer for deciphered payloads.
pub(super) struct Sealer {
    auth: std::sync::Arc<JobAuth>,
    tx_key: LessSafeKey,
    next_counter: u64,
    rx_keys: FxHashMap<u64, LessSafeKey>,
    /// The payload of the last enciphered datagram opened.
    pub(super) opened: Vec<u8>,
}

fn nonce(counter: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

impl Sealer {
    pub(super) fn new(auth: std::sync::Arc<JobAuth>, incarnation: u64) -> Sealer {
        let tx_key = auth.secret.sender_key(incarnation);
        Sealer { auth, tx_key, next_counter: 0, rx_keys: FxHashMap::default(), opened: Vec::new() }
    }

    pub(super) fn sealing(&self) -> Sealed {
        self.auth.sealing()
    }

    /// Seals the datagram `dgram[..len]` (a header encoded with `sealed` set,
    /// then its payload) by writing the trailer after it; returns the sealed
    /// length. `dgram` has room for [`TRAILER_LEN`] more bytes.
    pub(super) fn seal(&mut self, dgram: &mut [u8], len: usize, sealed: Sealed) -> usize {
        debug_assert!(sealed != Sealed::No && len >= HEADER_LEN);
        let counter = self.next_counter;
        self.next_counter += 1;
        let (head, trailer) = dgram[..len + TRAILER_LEN].split_at_mut(len);
        let tag = if sealed == Sealed::Encrypted {
            let (header, payload) = head.split_at_mut(HEADER_LEN);
            self.tx_key.seal_in_place_separate_tag(nonce(counter), Aad::from(&header[..]), payload)
        } else {
            self.tx_key.seal_in_place_separate_tag(nonce(counter), Aad::from(&head[..]), &mut [])
        }
        .expect("a datagram is far within AES-GCM's message limit");
        trailer[..8].copy_from_slice(&counter.to_le_bytes());
        trailer[8..].copy_from_slice(tag.as_ref());
        len + TRAILER_LEN
    }

    /// Verifies the sealed datagram `bytes` (decoded: at least a header and a
    /// trailer) as sent by incarnation `src_inc`; returns its counter, or
    /// `None` when the tag is wrong. An enciphered payload is deciphered
    /// into [`Sealer::opened`].
    pub(super) fn open(&mut self, bytes: &[u8], src_inc: u64, sealed: Sealed) -> Option<u64> {
        let end = bytes.len() - TRAILER_LEN;
        let trailer = &bytes[end..];
        let counter = u64::from_le_bytes(trailer[..8].try_into().ok()?);
        let tag = &trailer[8..];
        let mut derived = None;
        let key = match self.rx_keys.get(&src_inc) {
            Some(k) => k,
            None => derived.insert(self.auth.secret.sender_key(src_inc)),
        };
        let ok = if sealed == Sealed::Encrypted {
            self.opened.clear();
            self.opened.extend_from_slice(&bytes[HEADER_LEN..end]);
            key.open_in_place_separate_tag(nonce(counter), Aad::from(&bytes[..HEADER_LEN]), tag, &mut self.opened)
                .is_ok()
        } else {
            key.open_in_place_separate_tag(nonce(counter), Aad::from(&bytes[..end]), tag, &mut []).is_ok()
        };
        if !ok {
            return None;
        }
        if let Some(k) = derived {
            if self.rx_keys.len() >= RX_KEYS_MAX {
                self.rx_keys.clear();
            }
            self.rx_keys.insert(src_inc, k);
        }
        Some(counter)
    }
}

/// Counters below the newest one seen that are still told apart.
pub const REPLAY_WINDOW: u64 = 1024;
const WORDS: usize = (REPLAY_WINDOW / 64) as usize;

/// The packet counters one peer incarnation's sealed datagrams carried: the
/// newest and which of the [`REPLAY_WINDOW`] below it were seen (as IPsec's
/// anti-replay window, RFC 4303 §3.4.3). One counter serves all of a
/// sender's peers, so the ones a receiver sees have gaps; reordering beyond
/// the window makes an older datagram [`Replay::TooOld`], which the engine
/// refuses unless its sequence number says it was never received.
#[derive(Clone, Debug, Default)]
pub struct ReplayWindow {
    /// One more than the newest counter seen (0: none yet).
    top: u64,
    seen: [u64; WORDS],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Never seen: now marked.
    Fresh,
    /// Seen before.
    Seen,
    /// Below the window: whether it was seen is not known.
    TooOld,
}

impl ReplayWindow {
    /// Checks `counter` and marks it seen.
    pub fn check(&mut self, counter: u64) -> Replay {
        let bit = |c: u64| ((c % REPLAY_WINDOW) / 64) as usize;
        let mask = |c: u64| 1u64 << (c % 64);
        if counter >= self.top {
            if counter - self.top >= REPLAY_WINDOW {
                self.seen = [0; WORDS];
            } else {
                for c in self.top..counter {
                    self.seen[bit(c)] &= !mask(c);
                }
            }
            self.seen[bit(counter)] |= mask(counter);
            self.top = counter + 1;
            return Replay::Fresh;
        }
        if self.top - counter > REPLAY_WINDOW {
            return Replay::TooOld;
        }
        let word = &mut self.seen[bit(counter)];
        if *word & mask(counter) != 0 {
            Replay::Seen
        } else {
            *word |= mask(counter);
            Replay::Fresh
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    proptest! {
        /// Against a model that remembers every counter: a counter is fresh
        /// exactly when never seen, unless it is below the window (then too
        /// old, whether seen or not), and the window is the newest's.
        #[test]
        fn replay_window_matches_a_set_of_everything_seen(ops in proptest::collection::vec((0u64..3, 0u64..3000), 1..400)) {
            let mut w = ReplayWindow::default();
            let mut seen = BTreeSet::new();
            let mut top = 0u64;
            let mut base = 0u64;
            for (kind, x) in ops {
                // Mostly near the newest (reordering), sometimes far ahead.
                let c = match kind {
                    0 => base + x,
                    1 => top.saturating_sub(x % 1100),
                    _ => top + x % 5,
                };
                base += x % 7;
                let want = if top > c && top - c > REPLAY_WINDOW {
                    Replay::TooOld
                } else if seen.contains(&c) {
                    Replay::Seen
                } else {
                    Replay::Fresh
                };
                prop_assert_eq!(w.check(c), want, "counter {}", c);
                if want != Replay::TooOld {
                    seen.insert(c);
                    top = top.max(c + 1);
                }
            }
        }
    }

    fn datagram(payload: &[u8], sealed: Sealed) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN + payload.len() + TRAILER_LEN];
        b[0] = 0xD7;
        b[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        let _ = sealed;
        b
    }

    #[test]
    fn a_sealed_datagram_opens_only_unchanged_and_under_its_senders_key() {
        let auth = std::sync::Arc::new(JobAuth { secret: JobSecret::new(&[7; 16]).unwrap(), encrypt: false });
        for sealed in [Sealed::Tagged, Sealed::Encrypted] {
            let mut tx = Sealer::new(auth.clone(), 11);
            let mut rx = Sealer::new(auth.clone(), 22);
            let mut b = datagram(b"payload", sealed);
            let n = tx.seal(&mut b, HEADER_LEN + 7, sealed);
            assert_eq!(n, b.len());
            assert_eq!(&b[HEADER_LEN..HEADER_LEN + 7] == b"payload", sealed == Sealed::Tagged);
            assert_eq!(rx.open(&b, 11, sealed), Some(0));
            if sealed == Sealed::Encrypted {
                assert_eq!(rx.opened, b"payload");
            }
            // Another incarnation's key, and every single bit flipped.
            assert_eq!(rx.open(&b, 12, sealed), None);
            for i in 0..b.len() * 8 {
                let mut f = b.clone();
                f[i / 8] ^= 1 << (i % 8);
                assert_eq!(rx.open(&f, 11, sealed), None, "bit {i}");
            }
            // The next datagram has the next counter.
            let mut b2 = datagram(b"payload", sealed);
            tx.seal(&mut b2, HEADER_LEN + 7, sealed);
            assert_eq!(rx.open(&b2, 11, sealed), Some(1));
        }
        // Another job's secret opens nothing.
        let other = std::sync::Arc::new(JobAuth { secret: JobSecret::new(&[8; 16]).unwrap(), encrypt: false });
        let mut b = datagram(b"x", Sealed::Tagged);
        Sealer::new(auth, 1).seal(&mut b, HEADER_LEN + 1, Sealed::Tagged);
        assert_eq!(Sealer::new(other, 2).open(&b, 1, Sealed::Tagged), None);
    }

    #[test]
    fn secrets_of_the_wrong_length_are_refused_and_ids_differ_per_secret() {
        assert_eq!(JobSecret::new(&[1; 15]).unwrap_err(), SecretLength(15));
        assert!(JobSecret::new(&[1; SECRET_MAX_LEN + 1]).is_err());
        let (a, b) = (JobSecret::new(&[1; 16]).unwrap(), JobSecret::new(&[2; 16]).unwrap());
        assert_ne!(a.job_id(), b.job_id());
        assert_eq!(a.job_id(), JobSecret::new(&[1; 16]).unwrap().job_id());
        assert!(!format!("{a:?}").contains("prk"));
    }
}
