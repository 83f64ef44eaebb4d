//! The agent's saved state (docs/agent.md "Saved state"): the usage
//! reports' chains, the reports not yet acknowledged, the firewall's
//! members. Each file records the format it was written in, so that an
//! agent upgraded across a change of layout reads what the old one left
//! (usage reports are money) and an older agent refuses a newer file instead
//! of misreading it.
//!
//! A JSON file is `{"format": N, "state": ...}`; a JSON-lines file starts
//! with the line `{"format": N}`. Format 1 is the layout before formats were
//! recorded (2026-12-06): the state alone, no header line; it is read as
//! such. Every file is replaced whole through a temporary file, fsync and
//! rename, so a crash leaves either the old or the new version.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The format this agent writes; it reads every format up to it.
pub const SAVED_FORMAT: u32 = 2;

/// Why a saved file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    #[error("{path}: written by a newer agent (format {found}; this agent reads formats 1 to {SAVED_FORMAT}): upgrade the agent, or move the file away to start without it")]
    Newer { path: PathBuf, found: u32 },
    #[error("{path} is corrupt: {source}")]
    Corrupt { path: PathBuf, source: serde_json::Error },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

#[derive(Serialize)]
struct Written<'a, T> {
    format: u32,
    state: &'a T,
}

#[derive(Deserialize)]
struct Header {
    format: u32,
}

/// The state kept in `path`; `None` when there is no such file.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, SavedError> {
    let Some(bytes) = read_bytes(path)? else { return Ok(None) };
    let corrupt = |source| SavedError::Corrupt { path: path.to_path_buf(), source };
    let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(corrupt)?;
    let state = match value {
        serde_json::Value::Object(mut object) if object.contains_key("format") && object.contains_key("state") => {
            let format: u32 = serde_json::from_value(object["format"].take()).map_err(corrupt)?;
            check(path, format)?;
            object.remove("state").unwrap_or_default()
        }
        format_1 => format_1,
    };
    serde_json::from_value(state).map(Some).map_err(corrupt)
}

/// Replaces `path` with `state` in this agent's format.
pub fn write<T: Serialize>(path: &Path, state: &T) -> Result<(), SavedError> {
    let bytes = serde_json::to_vec(&Written { format: SAVED_FORMAT, state }).expect("saved state serialises");
    write_atomically(path, &bytes)
}

/// The records kept one per line in `path` (none when there is no such file).
pub fn read_lines<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, SavedError> {
    let Some(bytes) = read_bytes(path)? else { return Ok(Vec::new()) };
    let corrupt = |source| SavedError::Corrupt { path: path.to_path_buf(), source };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines().filter(|line| !line.trim().is_empty()).peekable();
    if let Some(first) = lines.peek() {
        if let Ok(header) = serde_json::from_str::<Header>(first) {
            check(path, header.format)?;
            lines.next();
        }
    }
    lines.map(|line| serde_json::from_str(line).map_err(corrupt)).collect()
}

/// Replaces `path` with the header line and one line per record.
pub fn write_lines<'a, T: Serialize + 'a>(path: &Path, records: impl IntoIterator<Item = &'a T>) -> Result<(), SavedError> {
    let mut bytes = format!("{{\"format\":{SAVED_FORMAT}}}\n").into_bytes();
    for record in records {
        bytes.extend_from_slice(&serde_json::to_vec(record).expect("saved state serialises"));
        bytes.push(b'\n');
    }
    write_atomically(path, &bytes)
}

fn check(path: &Path, format: u32) -> Result<(), SavedError> {
    match format {
        1..=SAVED_FORMAT => Ok(()),
        found => Err(SavedError::Newer { path: path.to_path_buf(), found }),
    }
}

fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>, SavedError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SavedError::Io { path: path.to_path_buf(), source }),
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), SavedError> {
    let temporary = path.with_extension("tmp");
    let io = |source| SavedError::Io { path: temporary.clone(), source };
    let mut file = std::fs::File::create(&temporary).map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)?;
    std::fs::rename(&temporary, path).map_err(|source| SavedError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_read_back_in_this_format_and_in_format_1_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("state.json");
        assert_eq!(read::<Vec<u32>>(&path).expect("absent"), None);
        write(&path, &vec![1u32, 2]).expect("write");
        assert!(std::fs::read_to_string(&path).expect("text").starts_with("{\"format\":2,"));
        assert_eq!(read::<Vec<u32>>(&path).expect("read"), Some(vec![1, 2]));
        std::fs::write(&path, "[3,4]").expect("format 1");
        assert_eq!(read::<Vec<u32>>(&path).expect("format 1 read"), Some(vec![3, 4]));
        std::fs::write(&path, "{\"format\":3,\"state\":{\"x\":1}}").expect("newer");
        assert!(matches!(read::<Vec<u32>>(&path), Err(SavedError::Newer { found: 3, .. })));
        std::fs::write(&path, "[3,").expect("torn");
        assert!(matches!(read::<Vec<u32>>(&path), Err(SavedError::Corrupt { .. })));
    }

    #[test]
    fn lines_are_read_back_with_and_without_their_header() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("records.jsonl");
        assert!(read_lines::<u32>(&path).expect("absent").is_empty());
        write_lines(&path, &[5u32, 6]).expect("write");
        assert_eq!(std::fs::read_to_string(&path).expect("text"), "{\"format\":2}\n5\n6\n");
        assert_eq!(read_lines::<u32>(&path).expect("read"), vec![5, 6]);
        std::fs::write(&path, "7\n8\n").expect("format 1");
        assert_eq!(read_lines::<u32>(&path).expect("format 1 read"), vec![7, 8]);
        std::fs::write(&path, "{\"format\":9}\n7\n").expect("newer");
        assert!(matches!(read_lines::<u32>(&path), Err(SavedError::Newer { found: 9, .. })));
        write_lines::<u32>(&path, &[]).expect("empty");
        assert!(read_lines::<u32>(&path).expect("header only").is_empty());
    }
}
