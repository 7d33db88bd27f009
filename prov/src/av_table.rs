//! The table of an address vector, shared by the AV object (`av.rs`) and the
//! endpoints bound to it (the runtime, `core.rs`, looks destinations and
//! senders up here).
use crate::addr::{RdmxAddr, ADDR_LEN};
use crate::error::{Error, Result};
use crate::job::AuthKey;
use crate::log::{fi_warn, Subsys};
use parking_lot::RwLock;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

/// The authorization-key `fi_addr_t`s `fi_av_insert_auth_key` hands out:
/// this bit and the key's index. Address `fi_addr_t`s are slot indices,
/// far below it, so `fi_av_lookup_auth_key` (which takes either, with no
/// flag) tells them apart.
pub const AUTH_KEY_ADDR: u64 = 1 << 62;

/// One authorization key of an AV (`FI_AV_AUTH_KEY` domains): a job the
/// endpoints bound to the AV serve.
#[derive(Clone, Debug)]
pub struct AvAuthKey {
    pub key: AuthKey,
    /// Endpoints enabled with this key (it cannot be removed while any is).
    pub users: usize,
}

/// The table itself, shared with the endpoints bound to the AV.
///
/// Entries are kept in their 48-byte wire encoding (an all-zero entry is a free
/// slot), so an AV entry that never carries traffic costs 48 bytes: a million
/// peers in an MPI job cost 48 MB of AV and nothing in the engine.
#[derive(Default)]
pub struct AvTable {
    slots: Vec<[u8; ADDR_LEN]>,
    free: BTreeSet<u64>,
    /// Bumped on every insert and remove, so cached fi_addr lookups (FI_SOURCE)
    /// know when to start over. Shared with the bound endpoints, which read it
    /// without the table's lock ([`AvTable::generation_handle`]): a send or a
    /// receive whose cached lookup is still good takes no lock at all.
    generation: Arc<AtomicU64>,
    /// `FI_AV_AUTH_KEY`: the keys inserted (`None`: removed), by index.
    keys: Vec<Option<AvAuthKey>>,
    /// `FI_AV_AUTH_KEY`: per slot, the index of the key its address was
    /// inserted under, plus one (0: none). Empty in an AV without keys, so
    /// that its entries stay 48 bytes.
    slot_keys: Vec<u32>,
}

const EMPTY: [u8; ADDR_LEN] = [0; ADDR_LEN];

/// A peer on another host that advertises a loopback UDP address cannot be
/// reached: our datagrams to it would go to ourselves. That is the signature of a
/// peer started with an old rdmx, or with `FI_RDMX_IFACE=lo`, on another machine;
/// say so by name instead of letting the job hang until the peer timeout.
fn warn_if_unreachable_loopback(a: &RdmxAddr) {
    let Some(udp) = a.udp else { return };
    let other_host = a.host_id != 0 && a.host_id != ::devices::host::host_id();
    if other_host && udp.ip().is_loopback() {
        fi_warn!(
            Subsys::Av,
            "AV address {} is a loopback address of another host ({:016x}): rdmx cannot reach it; set FI_RDMX_IFACE on that host to an interface this host can reach",
            a.to_uri(),
            a.host_id
        );
    }
}

impl AvTable {
    pub fn get(&self, fi_addr: u64) -> Option<RdmxAddr> {
        let slot = self.slots.get(usize::try_from(fi_addr).ok()?)?;
        RdmxAddr::decode(slot)
    }

    /// Inserts `a` under key `key` (an index of [`AvTable::insert_key`]).
    pub fn insert_keyed(&mut self, a: RdmxAddr, key: u32) -> Result<u64> {
        if !matches!(self.keys.get(key as usize), Some(Some(_))) {
            return Err(Error::Inval("FI_AUTH_KEY: fi_addr is not an authorization key of this AV"));
        }
        let i = self.insert(a);
        if self.slot_keys.len() <= i as usize {
            self.slot_keys.resize(i as usize + 1, 0);
        }
        self.slot_keys[i as usize] = key + 1;
        Ok(i)
    }

    /// The index of the key `fi_addr`'s address was inserted under.
    pub fn key_of(&self, fi_addr: u64) -> Option<u32> {
        let k = *self.slot_keys.get(usize::try_from(fi_addr).ok()?)?;
        k.checked_sub(1)
    }

    /// Adds an authorization key; the same key again gets its first index.
    /// A different key whose packets would carry the same job key (a key in
    /// clear equal to a secret's job id, or `[1]` beside `[1, 0]`) is
    /// refused: two jobs must never be told apart by nothing.
    pub fn insert_key(&mut self, key: AuthKey) -> Result<u32> {
        if let Some(i) = self.keys.iter().position(|k| k.as_ref().is_some_and(|k| k.key == key)) {
            return Ok(i as u32);
        }
        let job = crate::job::job_key_of(&key)?;
        for k in self.keys.iter().flatten() {
            if crate::job::job_key_of(&k.key)? == job {
                return Err(Error::Inval("an authorization key whose job key another key of the AV has"));
            }
        }
        self.generation.fetch_add(1, Ordering::Release);
        self.keys.push(Some(AvAuthKey { key, users: 0 }));
        Ok((self.keys.len() - 1) as u32)
    }

    pub fn auth_key(&self, i: u32) -> Option<&AvAuthKey> {
        self.keys.get(i as usize)?.as_ref()
    }

    /// The keys present, by index.
    pub fn auth_keys(&self) -> impl Iterator<Item = (u32, &AvAuthKey)> + '_ {
        self.keys.iter().enumerate().filter_map(|(i, k)| Some((i as u32, k.as_ref()?)))
    }

    /// An endpoint enabled with (`true`) or closed after (`false`) key `i`.
    pub fn use_key(&mut self, i: u32, used: bool) {
        if let Some(Some(k)) = self.keys.get_mut(i as usize) {
            k.users = if used { k.users + 1 } else { k.users.saturating_sub(1) };
        }
    }

    /// Removes key `i`: `Busy` while an endpoint enabled with it is open.
    /// Addresses inserted under it stay, and reach nothing new.
    pub fn remove_key(&mut self, i: u32) -> Result<()> {
        match self.keys.get_mut(i as usize) {
            Some(Some(k)) if k.users > 0 => Err(Error::Busy),
            Some(k @ Some(_)) => {
                *k = None;
                self.generation.fetch_add(1, Ordering::Release);
                Ok(())
            }
            _ => Err(Error::Inval("FI_AUTH_KEY: fi_addr is not an authorization key of this AV")),
        }
    }

    pub fn insert(&mut self, a: RdmxAddr) -> u64 {
        warn_if_unreachable_loopback(&a);
        self.generation.fetch_add(1, Ordering::Release);
        let bytes = a.encode();
        match self.free.pop_first() {
            Some(i) => {
                self.slots[i as usize] = bytes;
                i
            }
            None => {
                self.slots.push(bytes);
                (self.slots.len() - 1) as u64
            }
        }
    }

    pub fn remove(&mut self, fi_addr: u64) -> Result<()> {
        let slot = usize::try_from(fi_addr)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
            .filter(|s| **s != EMPTY)
            .ok_or(Error::Inval("fi_addr not in AV"))?;
        *slot = EMPTY;
        if let Some(k) = self.slot_keys.get_mut(fi_addr as usize) {
            *k = 0;
        }
        self.free.insert(fi_addr);
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The generation counter itself, for an endpoint to check its caches
    /// against without taking the table's lock. It is bumped under the write
    /// lock after the change, so a reader that sees the old value acts as if
    /// it ran before the change.
    pub fn generation_handle(&self) -> Arc<AtomicU64> {
        self.generation.clone()
    }

    /// Finds an entry by predicate (maps a sender back to its fi_addr; callers
    /// cache the answer per peer).
    pub fn find(&self, pred: impl Fn(&RdmxAddr) -> bool) -> Option<u64> {
        self.slots.iter().position(|s| *s != EMPTY && RdmxAddr::decode(s).is_some_and(|a| pred(&a))).map(|i| i as u64)
    }

    /// [`AvTable::find`] among the addresses inserted under key `key`.
    pub fn find_keyed(&self, key: u32, pred: impl Fn(&RdmxAddr) -> bool) -> Option<u64> {
        (0..self.slots.len())
            .find(|&i| {
                self.slot_keys.get(i) == Some(&(key + 1))
                    && self.slots[i] != EMPTY
                    && RdmxAddr::decode(&self.slots[i]).is_some_and(|a| pred(&a))
            })
            .map(|i| i as u64)
    }

    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the table (for the memory-per-entry test).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * ADDR_LEN + self.free.len() * 16 + self.slot_keys.capacity() * 4
    }
}

pub type SharedAv = Arc<RwLock<AvTable>>;
