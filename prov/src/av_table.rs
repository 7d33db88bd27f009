//! The table of an address vector, shared by the AV object (`av.rs`) and the
//! endpoints bound to it (the runtime, `core.rs`, looks destinations and
//! senders up here).
use crate::addr::{RdmxAddr, ADDR_LEN};
use crate::error::{Error, Result};
use crate::log::{fi_warn, Subsys};
use parking_lot::RwLock;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub const FI_ADDR_UNSPEC: u64 = u64::MAX;
pub const FI_ADDR_NOTAVAIL: u64 = u64::MAX;

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

    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes held by the table (for the memory-per-entry test).
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * ADDR_LEN + self.free.len() * 16
    }
}

pub type SharedAv = Arc<RwLock<AvTable>>;
