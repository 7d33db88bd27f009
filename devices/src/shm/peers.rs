//! The peers whose rings this device has mapped, by address and by slot: a
//! send by address finds its ring with one hash probe, a write to a resolved
//! destination ([`rdm::device::Device::resolve`]) with one index and a
//! generation check, so that a [`Dest`] kept past its peer's removal (a
//! closed or dead peer, its slot reused) is refused, never misdirected.
#![forbid(unsafe_code)]

use rdm::device::{Dest, ShmAddr};
use rustc_hash::FxHashMap;

/// The bits of a slot's generation a [`Dest`] carries (a slot would have to be
/// reused 2^31 times under one kept `Dest` to be taken for another peer's).
const GENERATION_MASK: u32 = 0x7fff_ffff;

/// Mapped peers (`P`: the device's per-peer state), each in a slot that a
/// [`Dest`] names with the slot's generation.
pub(super) struct PeerTable<P> {
    index: FxHashMap<ShmAddr, u32>,
    slots: Vec<Slot<P>>,
    free: Vec<u32>,
}

struct Slot<P> {
    /// Bumped at every removal: a `Dest` made before no longer matches.
    generation: u32,
    entry: Option<(ShmAddr, P)>,
}

impl<P> Default for PeerTable<P> {
    fn default() -> Self {
        PeerTable { index: FxHashMap::default(), slots: Vec::new(), free: Vec::new() }
    }
}

impl<P> PeerTable<P> {
    /// The slot of `a`, if mapped.
    #[inline]
    pub(super) fn slot_of(&self, a: &ShmAddr) -> Option<u32> {
        self.index.get(a).copied()
    }

    pub(super) fn get(&self, a: &ShmAddr) -> Option<&P> {
        self.slot_of(a).map(|i| self.at(i))
    }

    pub(super) fn get_mut(&mut self, a: &ShmAddr) -> Option<&mut P> {
        self.slot_of(a).map(|i| self.at_mut(i))
    }

    /// The peer in slot `i`, which holds one (a slot from [`PeerTable::slot_of`],
    /// [`PeerTable::insert`] or [`PeerTable::by_dest`] since the last removal).
    #[inline]
    pub(super) fn at(&self, i: u32) -> &P {
        &self.slots[i as usize].entry.as_ref().expect("a live slot").1
    }

    #[inline]
    pub(super) fn at_mut(&mut self, i: u32) -> &mut P {
        &mut self.slots[i as usize].entry.as_mut().expect("a live slot").1
    }

    /// The address in slot `i`, which holds a peer.
    #[inline]
    pub(super) fn addr_at(&self, i: u32) -> ShmAddr {
        self.slots[i as usize].entry.as_ref().expect("a live slot").0
    }

    /// Maps `a` to `peer` (`a` is not mapped); its slot.
    pub(super) fn insert(&mut self, a: ShmAddr, peer: P) -> u32 {
        debug_assert!(!self.index.contains_key(&a));
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push(Slot { generation: 0, entry: None });
                (self.slots.len() - 1) as u32
            }
        };
        self.slots[i as usize].entry = Some((a, peer));
        self.index.insert(a, i);
        i
    }

    /// Unmaps `a`; its peer, if it was mapped. Every `Dest` of it is stale from now on.
    pub(super) fn remove(&mut self, a: &ShmAddr) -> Option<P> {
        let i = self.index.remove(a)?;
        let slot = &mut self.slots[i as usize];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(i);
        slot.entry.take().map(|(_, p)| p)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&ShmAddr, &P)> {
        self.slots.iter().filter_map(|s| s.entry.as_ref().map(|(a, p)| (a, p)))
    }

    /// The destination naming slot `i` as it is now: the slot, and the
    /// generation's low 31 bits (the top bit of a `Dest` is left free, for a
    /// composite device whose halves both resolve to tell them apart).
    pub(super) fn dest(&self, i: u32) -> Dest {
        Dest(((self.slots[i as usize].generation & GENERATION_MASK) as u64) << 32 | i as u64)
    }

    /// The slot `d` names, if it still holds the peer `d` was made for.
    #[inline]
    pub(super) fn by_dest(&self, d: Dest) -> Option<u32> {
        let (i, generation) = (d.0 as u32, (d.0 >> 32) as u32);
        let slot = self.slots.get(i as usize)?;
        (slot.generation & GENERATION_MASK == generation && slot.entry.is_some()).then_some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn addr(k: u8) -> ShmAddr {
        ShmAddr { host_id: 1, pid: 100 + k as u32, ring_id: k as u64 }
    }

    proptest! {
        /// The table against a map: lookups by address agree, every `Dest`
        /// resolves to its peer while that peer stays mapped and to nothing
        /// once it is removed, even after its slot is reused.
        #[test]
        fn table_matches_a_map_and_stale_dests_resolve_to_nothing(
            ops in proptest::collection::vec((any::<bool>(), 0u8..6), 0..200)
        ) {
            let mut t: PeerTable<u32> = PeerTable::default();
            let mut model: HashMap<ShmAddr, u32> = HashMap::new();
            let mut dests: Vec<(Dest, ShmAddr, u32, bool)> = Vec::new();
            let mut next = 0u32;
            for (insert, k) in ops {
                let a = addr(k);
                if insert && !model.contains_key(&a) {
                    next += 1;
                    let i = t.insert(a, next);
                    model.insert(a, next);
                    dests.push((t.dest(i), a, next, true));
                } else if !insert {
                    prop_assert_eq!(t.remove(&a), model.remove(&a));
                    for d in dests.iter_mut().filter(|d| d.1 == a) {
                        d.3 = false;
                    }
                }
                for (k, v) in &model {
                    prop_assert_eq!(t.get(k), Some(v));
                }
                prop_assert_eq!(t.iter().count(), model.len());
                for &(d, a, v, live) in &dests {
                    match t.by_dest(d) {
                        Some(i) => {
                            prop_assert!(live);
                            prop_assert_eq!(*t.at(i), v);
                            prop_assert_eq!(t.addr_at(i), a);
                        }
                        None => prop_assert!(!live),
                    }
                }
            }
        }
    }
}
