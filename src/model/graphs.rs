//! The recorded step graphs a stage keeps, at most `capacity`, the least recently used dropped
//! first: a serving step's shape (its token count and the KV cache it runs with) comes back
//! every step, while prefill of odd lengths, speculation's draft lengths and the caches of
//! finished requests come once. Dropping them all at the limit, as before, made the hot
//! graphs record their bind groups again whenever a new shape arrived past it.

use std::collections::HashMap;
use std::hash::Hash;

pub(super) struct RecentGraphs<K, V> {
    capacity: usize,
    entries: HashMap<K, (V, u64)>,
    clock: u64,
}

impl<K: Hash + Eq + Copy, V: Default> RecentGraphs<K, V> {
    pub fn new(capacity: usize) -> Self {
        RecentGraphs {
            capacity: capacity.max(1),
            entries: HashMap::new(),
            clock: 0,
        }
    }

    /// The graph under `key`, a new one if there is none (dropping the least recently used
    /// when full), marked as just used.
    pub fn get(&mut self, key: K) -> &mut V {
        self.clock += 1;
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            let oldest = self.entries.iter().min_by_key(|(_, (_, used))| *used);
            if let Some((&oldest, _)) = oldest {
                self.entries.remove(&oldest);
            }
        }
        let entry = self.entries.entry(key).or_insert_with(|| (V::default(), 0));
        entry.1 = self.clock;
        &mut entry.0
    }

    #[cfg(test)]
    fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_graph_goes_first() {
        let mut graphs: RecentGraphs<u32, Vec<u32>> = RecentGraphs::new(3);
        graphs.get(1).push(10);
        graphs.get(2);
        graphs.get(3);
        // 1 is used again, so 2 is now the oldest and makes room for 4.
        assert_eq!(graphs.get(1), &vec![10]);
        graphs.get(4);
        assert!(graphs.contains(&1) && graphs.contains(&3) && graphs.contains(&4));
        assert!(!graphs.contains(&2));
        // A graph that comes back after being dropped starts empty.
        assert!(graphs.get(2).is_empty());
        assert!(!graphs.contains(&3));
    }
}
