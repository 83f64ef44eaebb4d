//! The binary record encoding (bincode 2, standard configuration) for what
//! is stored on disk (journal entries, snapshots), signed (usage reports)
//! or sent as a binary frame. Bounded decoding: a record allocates at most
//! its limit and trailing bytes are refused. Depends on nothing else in the
//! crate, so the messages can use it and the codec can build on it.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest record stored on disk (a journal entry).
pub const RECORD_BYTES_MAX: usize = 1024 * 1024;

/// The largest snapshot of the market's state read back from disk.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 32;

/// A record that did not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RecordError {
    pub message: String,
}

/// Encodes a record (a journal entry, a snapshot, a signed body).
pub fn encode_record<T: Serialize>(record: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(record, bincode::config::standard()).expect("every record model encodes to bincode")
}

/// Decodes a storage record, bounded by `RECORD_BYTES_MAX`.
pub fn decode_record<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RecordError> {
    decode_limited::<T, RECORD_BYTES_MAX>(bytes, "record")
}

/// Decodes a state snapshot (trusted local data, but still bounded).
pub fn decode_snapshot<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, RecordError> {
    decode_limited::<T, SNAPSHOT_BYTES_MAX>(bytes, "snapshot")
}

/// bincode decoding that allocates at most `LIMIT` bytes and refuses
/// trailing bytes after the value.
pub(crate) fn decode_limited<T: DeserializeOwned, const LIMIT: usize>(bytes: &[u8], what: &str) -> Result<T, RecordError> {
    let config = bincode::config::standard().with_limit::<LIMIT>();
    let (value, read) = bincode::serde::decode_from_slice(bytes, config).map_err(|error| RecordError { message: error.to_string() })?;
    if read != bytes.len() {
        return Err(RecordError { message: format!("{} trailing bytes after the {what}", bytes.len() - read) });
    }
    Ok(value)
}
