//! Files that hold secrets (ed25519 keys, the cluster's and the links'
//! shared secrets): one loader for every binary. A secret file is written
//! readable by its owner only (mode 0600, created new, synced) and refused
//! when anyone else may read it (a leaked key signs for its owner; a
//! leaked shared secret admits anyone to the cluster or the link).

use std::io::Write;
use std::path::{Path, PathBuf};

/// Why a secret file could not be used. Callers name the file's role
/// ("host key", "cluster secret") around it.
#[derive(Debug, thiserror::Error)]
pub enum SecretFileError {
    #[error("{} does not exist", .0.display())]
    Missing(PathBuf),
    #[error("{} has mode {mode:o}; it must be readable by its owner only: chmod 600 {}", .path.display(), .path.display())]
    Exposed { path: PathBuf, mode: u32 },
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
    #[error("{} is not {expected}", .path.display())]
    Malformed { path: PathBuf, expected: &'static str },
    #[error("{} exists: keep it, or move it away to make a new one", .0.display())]
    Exists(PathBuf),
    #[error("{}: {source}", .path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SecretFileError + '_ {
    move |source| SecretFileError::Io { path: path.to_path_buf(), source }
}

/// The secret in the file at `path`, surrounding whitespace left out;
/// refused when others may read the file, or when it is empty.
pub fn read(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Err(SecretFileError::Missing(path.to_path_buf())),
        Err(error) => return Err(io(path)(error)),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(SecretFileError::Exposed { path: path.to_path_buf(), mode });
        }
    }
    #[cfg(not(unix))]
    let _ = metadata;
    let bytes = std::fs::read(path).map_err(io(path))?;
    let secret = bytes.trim_ascii().to_vec();
    if secret.is_empty() {
        return Err(SecretFileError::Empty(path.to_path_buf()));
    }
    Ok(secret)
}

/// A 32-byte secret written as 64 hex digits (an ed25519 secret key).
pub fn read_key(path: &Path) -> Result<[u8; 32], SecretFileError> {
    let text = read(path)?;
    std::str::from_utf8(&text)
        .ok()
        .and_then(|text| hex::decode(text).ok())
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(SecretFileError::Malformed { path: path.to_path_buf(), expected: "64 hex digits (a 32-byte key)" })
}

/// Writes `secret` to a new file at `path` (its folder made if missing),
/// readable by its owner only, and syncs it; refused when the file exists.
pub fn create(path: &Path, secret: &[u8]) -> Result<(), SecretFileError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => return Err(SecretFileError::Exists(path.to_path_buf())),
        Err(error) => return Err(io(path)(error)),
    };
    file.write_all(secret).and_then(|()| file.write_all(b"\n")).and_then(|()| file.sync_all()).map_err(io(path))
}

/// Writes a 32-byte key as 64 hex digits to a new owner-only file.
pub fn create_key(path: &Path, key: &[u8; 32]) -> Result<(), SecretFileError> {
    create(path, hex::encode(key).as_bytes())
}

/// 32 bytes from the operating system's random source.
pub fn random_key() -> [u8; 32] {
    use rand_core::RngCore;
    let mut key = [0u8; 32];
    rand_core::OsRng.fill_bytes(&mut key);
    key
}

/// The key at `path`, made (random, owner-only) on first use.
pub fn load_or_create_key(path: &Path) -> Result<[u8; 32], SecretFileError> {
    match read_key(path) {
        Err(SecretFileError::Missing(_)) => {
            let key = random_key();
            create_key(path, &key)?;
            Ok(key)
        }
        read => read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_key_is_written_owner_only_and_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("keys/host.key");
        create_key(&path, &[7; 32]).expect("created");
        assert_eq!(std::fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        assert_eq!(read_key(&path).expect("read"), [7; 32]);
        assert!(matches!(create_key(&path, &[8; 32]), Err(SecretFileError::Exists(_))), "never overwritten");
        assert_eq!(read_key(&path).expect("read"), [7; 32]);
    }

    #[test]
    fn a_secret_others_can_read_or_that_is_no_secret_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cluster.secret");
        assert!(matches!(read(&path), Err(SecretFileError::Missing(_))));
        std::fs::write(&path, "  a shared secret\n").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let exposed = read(&path).expect_err("others may read it");
        assert!(matches!(exposed, SecretFileError::Exposed { mode: 0o644, .. }), "{exposed}");
        assert!(exposed.to_string().contains("chmod 600"), "{exposed}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read(&path).expect("read"), b"a shared secret");
        assert!(matches!(read_key(&path), Err(SecretFileError::Malformed { .. })), "not a key");
        std::fs::write(&path, " \n").expect("write");
        assert!(matches!(read(&path), Err(SecretFileError::Empty(_))));
    }
}
