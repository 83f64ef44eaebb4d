//! A min-heap in fixed-size chunks: the engine's pending timers.
//!
//! The timers were a B-tree (a binary heap in one `Vec` doubles and copies
//! everything it holds now and then, a pause of milliseconds once it holds
//! millions); a B-tree grows a node at a time but allocates and frees nodes
//! as it goes, and its inserts were about 9% of the engine's mixed flow.
//! Here the heap's slots live in chunks that never move: a push costs at
//! most one chunk allocation, a pop frees one only when a whole spare chunk
//! lies beyond the end, and most pushes (timers due later than most others)
//! stop after a comparison or two.
//!
//! The order is the values' own (`Ord`), total for timers (each carries a
//! unique sequence number), so the heap pops exactly what the B-tree's
//! `pop_first` did. Encoded and printed as the B-tree was, in order, so
//! snapshots and state hashes did not change with it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Slots per chunk.
const CHUNK_LEN: usize = 4096;

/// `N` slots per chunk.
#[derive(Clone)]
pub(crate) struct TimerHeap<T, const N: usize = CHUNK_LEN> {
    /// Each of capacity `N`; all full but the last two (the last
    /// may be a spare, empty chunk).
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T, const N: usize> Default for TimerHeap<T, N> {
    fn default() -> Self {
        TimerHeap { chunks: Vec::new(), len: 0 }
    }
}

impl<T: Ord + Copy, const N: usize> TimerHeap<T, N> {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }

    fn at(&self, index: usize) -> T {
        self.chunks[index / N][index % N]
    }

    fn set(&mut self, index: usize, value: T) {
        self.chunks[index / N][index % N] = value;
    }

    /// The least value.
    pub(crate) fn first(&self) -> Option<T> {
        (self.len > 0).then(|| self.at(0))
    }

    pub(crate) fn push(&mut self, value: T) {
        let chunk = self.len / N;
        if chunk == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(N));
        }
        self.chunks[chunk].push(value);
        self.len += 1;
        // Sift up: move parents greater than the value down into the hole.
        let mut hole = self.len - 1;
        while hole > 0 {
            let parent = (hole - 1) / 2;
            let above = self.at(parent);
            if above <= value {
                break;
            }
            self.set(hole, above);
            hole = parent;
        }
        self.set(hole, value);
    }

    /// Takes the least value out.
    pub(crate) fn pop_first(&mut self) -> Option<T> {
        let first = self.first()?;
        let last_chunk = (self.len - 1) / N;
        let last = self.chunks[last_chunk].pop().expect("the last slot is in the last used chunk");
        self.len -= 1;
        // Keep one empty chunk as a spare, free a second: a heap that
        // hovers at a chunk's edge does not allocate on every push.
        if self.chunks.len() > last_chunk + 2 {
            self.chunks.pop();
        }
        if self.len > 0 {
            // Sift down from the root with the last value.
            let mut hole = 0;
            loop {
                let left = 2 * hole + 1;
                if left >= self.len {
                    break;
                }
                let right = left + 1;
                let child = if right < self.len && self.at(right) < self.at(left) { right } else { left };
                let below = self.at(child);
                if last <= below {
                    break;
                }
                self.set(hole, below);
                hole = child;
            }
            self.set(hole, last);
        }
        Some(first)
    }

    /// Every value, least first (snapshots and the state hash: O(n log n)).
    pub(crate) fn sorted(&self) -> Vec<T> {
        let mut all: Vec<T> = self.chunks.iter().flatten().copied().collect();
        all.sort_unstable();
        all
    }
}

impl<T: Ord + Copy + fmt::Debug, const N: usize> fmt::Debug for TimerHeap<T, N> {
    /// As the `BTreeSet` it replaced printed (the state hash hashes this).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.sorted()).finish()
    }
}

impl<T: Ord + Copy + Serialize, const N: usize> Serialize for TimerHeap<T, N> {
    /// As the `BTreeSet` it replaced: a sequence, least first.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.sorted())
    }
}

impl<'de, T: Ord + Copy + Deserialize<'de>, const N: usize> Deserialize<'de> for TimerHeap<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut heap = TimerHeap::default();
        for value in Vec::<T>::deserialize(deserializer)? {
            heap.push(value);
        }
        Ok(heap)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Against a B-tree (what the engine used before): the same least
        /// value after every push and pop, across chunk edges, and the same
        /// printing and encoding.
        #[test]
        fn the_heap_pops_what_a_btree_would(ops in proptest::collection::vec(prop_oneof![3 => (0..500u64).prop_map(Some), 2 => Just(None)], 1..2_000)) {
            let mut heap = TimerHeap::<_, 8>::default();
            let mut reference = BTreeSet::new();
            for (seq, op) in ops.into_iter().enumerate() {
                match op {
                    // Unique values, as timers are (their sequence numbers).
                    Some(at) => {
                        heap.push((at, seq));
                        reference.insert((at, seq));
                    }
                    None => prop_assert_eq!(heap.pop_first(), reference.pop_first()),
                }
                prop_assert_eq!(heap.first(), reference.first().copied());
                prop_assert_eq!(heap.len(), reference.len());
                prop_assert!(heap.chunks.len() <= heap.len / 8 + 2);
            }
            prop_assert_eq!(format!("{heap:?}"), format!("{reference:?}"));
            prop_assert_eq!(serde_json::to_string(&heap).expect("encodes"), serde_json::to_string(&reference).expect("encodes"));
            let decoded: TimerHeap<(u64, usize)> = serde_json::from_str(&serde_json::to_string(&heap).expect("encodes")).expect("decodes");
            prop_assert_eq!(decoded.sorted(), heap.sorted());
        }
    }

    #[test]
    fn a_heap_drained_across_many_chunks_keeps_one_spare() {
        let mut heap = TimerHeap::<u64>::default();
        for at in (0..3 * CHUNK_LEN as u64 + 5).rev() {
            heap.push(at);
        }
        assert_eq!(heap.chunks.len(), 4);
        for at in 0..3 * CHUNK_LEN as u64 + 5 {
            assert_eq!(heap.pop_first(), Some(at));
            assert!(heap.chunks.len() <= heap.len / CHUNK_LEN + 2);
        }
        assert_eq!(heap.pop_first(), None);
        assert!(heap.chunks.len() <= 2, "the emptied chunk and one spare");
    }
}
