//! A cache keyed by small dense integers: AV slots (an `fi_addr` is the
//! index of its slot) and engine peer ids (indices into the engine's peer
//! table). Every message looks one of these up (the destination of a send,
//! the source of a receive), so the lookup is an index into a vector, not a
//! hash. Keys at or above the limit are not kept: their callers look them up
//! the slow way each time, as they do after a miss.

pub struct DenseCache<V> {
    slots: Vec<Option<V>>,
    limit: usize,
}

impl<V: Copy> DenseCache<V> {
    /// A cache of keys below `limit` (its memory: `limit` slots at most).
    pub fn new(limit: usize) -> Self {
        DenseCache { slots: Vec::new(), limit }
    }

    pub fn get(&self, key: u64) -> Option<V> {
        *self.slots.get(usize::try_from(key).ok()?)?
    }

    /// Keeps `value` for `key`, unless the key is at or above the limit.
    pub fn insert(&mut self, key: u64, value: V) {
        let Some(i) = usize::try_from(key).ok().filter(|&i| i < self.limit) else { return };
        if i >= self.slots.len() {
            self.slots.resize(i + 1, None);
        }
        self.slots[i] = Some(value);
    }

    pub fn clear(&mut self) {
        self.slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::DenseCache;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Get(u64),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Keys around the limit (16) and a few far above it, where usize
        // conversion or resizing would go wrong.
        let key = prop_oneof![0u64..40, Just(u64::MAX), Just(1 << 40)];
        prop_oneof![
            4 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            4 => key.prop_map(Op::Get),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Against a hash map that drops the keys at or above the limit.
        #[test]
        fn behaves_as_a_map_of_the_keys_below_its_limit(ops in proptest::collection::vec(op(), 0..200)) {
            const LIMIT: u64 = 16;
            let mut cache = DenseCache::new(LIMIT as usize);
            let mut model: HashMap<u64, u32> = HashMap::new();
            for op in ops {
                match op {
                    Op::Insert(k, v) => {
                        cache.insert(k, v);
                        if k < LIMIT {
                            model.insert(k, v);
                        }
                    }
                    Op::Get(k) => prop_assert_eq!(cache.get(k), model.get(&k).copied()),
                    Op::Clear => {
                        cache.clear();
                        model.clear();
                    }
                }
            }
            for k in 0..LIMIT + 4 {
                prop_assert_eq!(cache.get(k), model.get(&k).copied());
            }
        }
    }
}
