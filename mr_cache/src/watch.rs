//! How many cache entries watch each page: the monitor registers a range with
//! userfaultfd when an entry needs it and unregisters only the pages no entry
//! covers any more (registering the same pages again is harmless; unregistering
//! pages another entry still needs would make that entry silently stale).
//!
//! Represented as boundaries: key `k` maps to the count that holds on
//! `[k, next key)`; the count is 0 before the first key. Counts of adjacent
//! intervals always differ (normalized), so the map stays as small as the
//! number of distinct watched runs.
use std::collections::BTreeMap;

#[derive(Default, Debug)]
pub struct WatchCounts {
    map: BTreeMap<u64, u32>,
}

impl WatchCounts {
    pub fn new() -> Self {
        Self::default()
    }

    /// The count on the interval holding `at`.
    pub fn count_at(&self, at: u64) -> u32 {
        self.map.range(..=at).next_back().map_or(0, |(_, &c)| c)
    }

    /// One more watcher of `[start, end)`.
    pub fn add(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        self.split(start);
        self.split(end);
        for (_, c) in self.map.range_mut(start..end) {
            *c += 1;
        }
        self.normalize(start, end);
    }

    /// One watcher fewer of `[start, end)`: calls `unwatched` with each maximal
    /// run inside it that no one watches any more. Counts never go below zero
    /// (removing what was never added is ignored).
    pub fn remove(&mut self, start: u64, end: u64, mut unwatched: impl FnMut(u64, u64)) {
        if start >= end {
            return;
        }
        self.split(start);
        self.split(end);
        let mut run: Option<u64> = None;
        let mut cursor = start;
        let keys: Vec<u64> = self.map.range(start..end).map(|(&k, _)| k).collect();
        for (i, &k) in keys.iter().enumerate() {
            let next = keys.get(i + 1).copied().unwrap_or(end);
            let c = self.map.get_mut(&k).expect("key just listed");
            let was = *c;
            *c = c.saturating_sub(1);
            if was == 1 {
                run.get_or_insert(k);
            } else if let Some(s) = run.take() {
                unwatched(s, k);
            }
            cursor = next;
        }
        if let Some(s) = run {
            unwatched(s, cursor);
        }
        self.normalize(start, end);
    }

    /// Makes `at` a boundary (same count on both sides for now).
    fn split(&mut self, at: u64) {
        if !self.map.contains_key(&at) {
            let c = self.count_at(at);
            self.map.insert(at, c);
        }
    }

    /// Drops boundaries in `[start, end]` whose count equals the count before
    /// them.
    fn normalize(&mut self, start: u64, end: u64) {
        let mut prev = if start == 0 { 0 } else { self.count_at(start - 1) };
        let keys: Vec<u64> = self.map.range(start..=end).map(|(&k, _)| k).collect();
        for k in keys {
            let c = self.map[&k];
            if c == prev {
                self.map.remove(&k);
            } else {
                prev = c;
            }
        }
    }

    /// Boundaries kept (for tests: the map stays small).
    pub fn boundaries(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nested_and_overlapping_watches() {
        let mut w = WatchCounts::new();
        w.add(10, 20);
        w.add(15, 30);
        assert_eq!((w.count_at(9), w.count_at(10), w.count_at(15), w.count_at(20), w.count_at(30)), (0, 1, 2, 1, 0));
        let mut gone = Vec::new();
        w.remove(10, 20, |s, e| gone.push((s, e)));
        assert_eq!(gone, vec![(10, 15)], "15..20 is still watched by the second range");
        gone.clear();
        w.remove(15, 30, |s, e| gone.push((s, e)));
        assert_eq!(gone, vec![(15, 30)]);
        assert_eq!(w.boundaries(), 0);
    }

    proptest! {
        /// Against a per-page count model: counts agree everywhere, the
        /// unwatched runs reported are exactly the pages that dropped to zero,
        /// and the map is normalized.
        #[test]
        fn agrees_with_a_per_page_model(ops in proptest::collection::vec((any::<bool>(), 0u64..40, 1u64..10), 1..120)) {
            let mut w = WatchCounts::new();
            let mut model = [0u32; 64];
            for (add, s, n) in ops {
                let e = s + n;
                if add {
                    w.add(s, e);
                    for c in &mut model[s as usize..e as usize] { *c += 1; }
                } else {
                    let mut reported = [false; 64];
                    let mut last_end = 0;
                    w.remove(s, e, |a, b| {
                        assert!(a >= last_end && a < b, "runs in order, non-empty, disjoint");
                        last_end = b;
                        for r in &mut reported[a as usize..b as usize] { *r = true; }
                    });
                    for p in s as usize..e as usize {
                        let dropped = model[p] == 1;
                        model[p] = model[p].saturating_sub(1);
                        prop_assert_eq!(reported[p], dropped, "page {}", p);
                    }
                    prop_assert!(reported[..s as usize].iter().chain(&reported[e as usize..]).all(|r| !r));
                }
                for (p, &c) in model.iter().enumerate() {
                    prop_assert_eq!(w.count_at(p as u64), c, "page {}", p);
                }
                let runs = model.windows(2).filter(|p| p[0] != p[1]).count() + usize::from(model[0] != 0);
                prop_assert_eq!(w.boundaries(), runs, "normalized");
            }
        }
    }
}
