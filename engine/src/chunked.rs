//! A vector stored in fixed-size chunks whose values can be retired. Leases
//! and contracts are appended for the life of the engine and looked up by
//! index; a plain `Vec` would double and copy everything it holds now and
//! then, a pause of milliseconds once it holds millions. Chunks never move,
//! so an append costs at most one chunk allocation.
//!
//! Retiring a value (a lease archived after its bill is final) frees its
//! slot; a chunk behind the newest whose values are nearly all retired is
//! freed and its few live values kept in a side map, so memory follows the
//! live values, not the history (a freed chunk leaves one empty entry).
//! Indices never change: `get` of a retired index is `None`.

use std::collections::BTreeMap;
use std::ops::{Index, IndexMut};

/// Values per chunk unless the type says otherwise (leases, contracts).
const CHUNK_LEN: usize = 4096;

#[derive(Clone)]
struct Chunk<T> {
    slots: Vec<Option<T>>,
    live: usize,
}

/// `N` values per chunk; a chunk with `N / 64` live values left (and not the
/// newest) is freed and its live values move to the side map.
#[derive(Clone)]
pub(crate) struct ChunkedVec<T, const N: usize = CHUNK_LEN> {
    /// `None`: a freed chunk (its live values, if any, are in `stragglers`).
    chunks: Vec<Option<Chunk<T>>>,
    /// Live values of freed chunks, by index.
    stragglers: BTreeMap<usize, T>,
    len: usize,
}

impl<T, const N: usize> Default for ChunkedVec<T, N> {
    fn default() -> Self {
        ChunkedVec { chunks: Vec::new(), stragglers: BTreeMap::new(), len: 0 }
    }
}

impl<T, const N: usize> ChunkedVec<T, N> {
    const LIVE_MIN: usize = N / 64;

    /// Values ever pushed (the next index), retired ones included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, value: T) {
        if self.len.is_multiple_of(N) {
            self.chunks.push(Some(Chunk { slots: Vec::with_capacity(N), live: 0 }));
        }
        let chunk = self.chunks.last_mut().and_then(Option::as_mut).expect("the newest chunk is never freed");
        chunk.slots.push(Some(value));
        chunk.live += 1;
        self.len += 1;
    }

    pub fn get(&self, index: usize) -> Option<&T> {
        match self.chunks.get(index / N)? {
            Some(chunk) => chunk.slots.get(index % N)?.as_ref(),
            None => self.stragglers.get(&index),
        }
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        match self.chunks.get_mut(index / N)? {
            Some(chunk) => chunk.slots.get_mut(index % N)?.as_mut(),
            None => self.stragglers.get_mut(&index),
        }
    }

    /// Takes a value out for good; `None` if it was retired already.
    pub fn retire(&mut self, index: usize) -> Option<T> {
        let chunk_index = index / N;
        let newest = chunk_index + 1 == self.chunks.len();
        let slot = self.chunks.get_mut(chunk_index)?;
        let Some(chunk) = slot else { return self.stragglers.remove(&index) };
        let value = chunk.slots.get_mut(index % N)?.take()?;
        chunk.live -= 1;
        if !newest && chunk.live <= Self::LIVE_MIN {
            let freed = slot.take().expect("checked above");
            let first = chunk_index * N;
            for (offset, live) in freed.slots.into_iter().enumerate() {
                if let Some(live) = live {
                    self.stragglers.insert(first + offset, live);
                }
            }
        }
        Some(value)
    }

    /// The live values with their indices, in index order.
    pub fn iter_indexed(&self) -> impl Iterator<Item = (usize, &T)> {
        let mut in_chunks = self.chunks.iter().enumerate().flat_map(|(chunk_index, chunk)| {
            chunk.iter().flat_map(move |chunk| {
                chunk.slots.iter().enumerate().filter_map(move |(offset, slot)| slot.as_ref().map(|v| (chunk_index * N + offset, v)))
            })
        });
        let mut stragglers = self.stragglers.iter().map(|(index, value)| (*index, value));
        let (mut next_chunk, mut next_straggler) = (in_chunks.next(), stragglers.next());
        std::iter::from_fn(move || match (next_chunk, next_straggler) {
            (Some(a), Some(b)) if b.0 < a.0 => {
                next_straggler = stragglers.next();
                Some(b)
            }
            (Some(a), _) => {
                next_chunk = in_chunks.next();
                Some(a)
            }
            (None, Some(b)) => {
                next_straggler = stragglers.next();
                Some(b)
            }
            (None, None) => None,
        })
    }

    /// The live values, in index order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.iter_indexed().map(|(_, value)| value)
    }

    /// Live values.
    pub fn live(&self) -> usize {
        self.chunks.iter().flatten().map(|chunk| chunk.live).sum::<usize>() + self.stragglers.len()
    }
}

/// Stored as the length and the live values with their indices.
impl<T: serde::Serialize, const N: usize> serde::Serialize for ChunkedVec<T, N> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let live: Vec<(u64, &T)> = self.iter_indexed().map(|(index, value)| (index as u64, value)).collect();
        let mut tuple = serializer.serialize_tuple(2)?;
        tuple.serialize_element(&(self.len as u64))?;
        tuple.serialize_element(&live)?;
        tuple.end()
    }
}

impl<'de, T: serde::Deserialize<'de>, const N: usize> serde::Deserialize<'de> for ChunkedVec<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let (len, live): (u64, Vec<(u64, T)>) = serde::Deserialize::deserialize(deserializer)?;
        let len = len as usize;
        let mut values = ChunkedVec::<T, N> { chunks: (0..len.div_ceil(N)).map(|_| None).collect(), ..ChunkedVec::default() };
        let mut previous = None;
        for (index, value) in live {
            let index = index as usize;
            if index >= len || previous.is_some_and(|p| p >= index) {
                return Err(serde::de::Error::custom("live values out of order or beyond the length"));
            }
            previous = Some(index);
            values.stragglers.insert(index, value);
        }
        values.len = len;
        // The newest chunk (where pushes go) is a chunk again, holding its live values.
        if let Some(last) = len.checked_sub(1).map(|last| last / N) {
            let first = last * N;
            let mut chunk = Chunk { slots: Vec::with_capacity(N), live: 0 };
            for index in first..len {
                let value = values.stragglers.remove(&index);
                chunk.live += usize::from(value.is_some());
                chunk.slots.push(value);
            }
            values.chunks[last] = Some(chunk);
        }
        Ok(values)
    }
}

impl<T, const N: usize> Index<usize> for ChunkedVec<T, N> {
    type Output = T;
    fn index(&self, index: usize) -> &T {
        self.get(index).expect("indexed a live value")
    }
}

impl<T, const N: usize> IndexMut<usize> for ChunkedVec<T, N> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        self.get_mut(index).expect("indexed a live value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_index_across_chunks() {
        let mut values: ChunkedVec<u32> = ChunkedVec::default();
        for value in 0..10_000u32 {
            values.push(value);
        }
        assert_eq!(values.len(), 10_000);
        assert_eq!(values[4095], 4095);
        assert_eq!(values[4096], 4096);
        assert_eq!(values.get(9_999), Some(&9_999));
        assert_eq!(values.get(10_000), None);
        values[5_000] = 7;
        assert_eq!(values.iter().filter(|v| **v == 7).count(), 2);
    }

    /// Retired values are gone for good; a nearly empty old chunk is freed
    /// with its few live values kept; order, lookups and a round trip
    /// through serde are unchanged.
    #[test]
    fn retiring_frees_old_chunks_and_keeps_the_live_values() {
        let mut values: ChunkedVec<u32> = ChunkedVec::default();
        for value in 0..3 * CHUNK_LEN as u32 {
            values.push(value);
        }
        // Retire all of the first chunk but index 7 and 100, and half of the second.
        for index in (0..CHUNK_LEN).filter(|i| *i != 7 && *i != 100) {
            assert_eq!(values.retire(index), Some(index as u32));
        }
        for index in (CHUNK_LEN..2 * CHUNK_LEN).step_by(2) {
            values.retire(index);
        }
        assert!(values.chunks[0].is_none(), "the first chunk was freed");
        assert_eq!(values.stragglers.len(), 2);
        assert_eq!((values.get(7), values.get(100), values.get(8)), (Some(&7), Some(&100), None));
        assert_eq!(values.retire(8), None, "retired once");
        assert_eq!(values.len(), 3 * CHUNK_LEN);
        assert_eq!(values.live(), 2 + CHUNK_LEN / 2 + CHUNK_LEN);
        let order: Vec<usize> = values.iter_indexed().map(|(i, _)| i).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]) && order[..3] == [7, 100, CHUNK_LEN + 1]);
        values[100] = 1;
        assert_eq!(values.get(100), Some(&1));

        let bytes = serde_json::to_vec(&values).expect("encodes");
        let mut restored: ChunkedVec<u32> = serde_json::from_slice(&bytes).expect("decodes");
        assert_eq!(restored.iter_indexed().collect::<Vec<_>>(), values.iter_indexed().collect::<Vec<_>>());
        restored.push(1_000_000);
        values.push(1_000_000);
        assert_eq!(restored.get(3 * CHUNK_LEN), Some(&1_000_000));
        assert_eq!(restored.retire(7), Some(7));
        assert_eq!(restored.iter().count(), values.iter().count() - 1);
    }
}
