//! An append-only vector stored in fixed-size chunks. Leases and contracts
//! are kept for the life of the engine and only ever appended; a plain `Vec`
//! would double and copy everything it holds now and then, a pause of
//! milliseconds once it holds millions. Chunks never move, so an append costs
//! at most one chunk allocation.

use std::ops::{Index, IndexMut};

const CHUNK_LEN: usize = 4096;

#[derive(Clone)]
pub(crate) struct ChunkedVec<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for ChunkedVec<T> {
    fn default() -> Self {
        ChunkedVec { chunks: Vec::new(), len: 0 }
    }
}

impl<T> ChunkedVec<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn push(&mut self, value: T) {
        if self.len.is_multiple_of(CHUNK_LEN) {
            self.chunks.push(Vec::with_capacity(CHUNK_LEN));
        }
        self.chunks.last_mut().expect("a chunk was just ensured").push(value);
        self.len += 1;
    }

    pub fn get(&self, index: usize) -> Option<&T> {
        self.chunks.get(index / CHUNK_LEN)?.get(index % CHUNK_LEN)
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }
}

impl<T: serde::Serialize> serde::Serialize for ChunkedVec<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        // The length up front: compact formats (bincode) need it.
        let mut sequence = serializer.serialize_seq(Some(self.len))?;
        for value in self.iter() {
            sequence.serialize_element(value)?;
        }
        sequence.end()
    }
}

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for ChunkedVec<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut values = ChunkedVec::default();
        for value in Vec::<T>::deserialize(deserializer)? {
            values.push(value);
        }
        Ok(values)
    }
}

impl<T> Index<usize> for ChunkedVec<T> {
    type Output = T;
    fn index(&self, index: usize) -> &T {
        &self.chunks[index / CHUNK_LEN][index % CHUNK_LEN]
    }
}

impl<T> IndexMut<usize> for ChunkedVec<T> {
    fn index_mut(&mut self, index: usize) -> &mut T {
        &mut self.chunks[index / CHUNK_LEN][index % CHUNK_LEN]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_index_across_chunks() {
        let mut values = ChunkedVec::default();
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
}
