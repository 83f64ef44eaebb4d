//! The host key: an ed25519 key created on first start and stored with
//! mode 0600. A key file that others can read is refused (a leaked host key
//! lets anyone sign usage reports for this host), as is a file that is not a
//! key. The secret is never logged or printed; only the public key is.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;

/// Loads the key at `path`, creating it (0600) if the file does not exist.
pub fn load_or_create(path: &Path) -> Result<SigningKey> {
    match std::fs::metadata(path) {
        Ok(metadata) => {
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                bail!("host key {} has mode {mode:o}; it must be readable by its owner only: chmod 600 {}", path.display(), path.display());
            }
            let text = std::fs::read_to_string(path).with_context(|| format!("reading host key {}", path.display()))?;
            let bytes: [u8; 32] = hex::decode(text.trim())
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .with_context(|| format!("host key {} is not 64 hex digits (an ed25519 secret key)", path.display()))?;
            Ok(SigningKey::from_bytes(&bytes))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => create(path),
        Err(error) => Err(error).with_context(|| format!("reading host key {}", path.display())),
    }
}

fn create(path: &Path) -> Result<SigningKey> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("the OS random source failed: {e}"))?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating host key {}", path.display()))?;
    writeln!(file, "{}", hex::encode(secret))?;
    file.sync_all()?;
    Ok(SigningKey::from_bytes(&secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_created_once_with_owner_only_permissions_and_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("keys/host.key");
        let created = load_or_create(&path).expect("created");
        assert_eq!(std::fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        let loaded = load_or_create(&path).expect("loaded");
        assert_eq!(created.verifying_key(), loaded.verifying_key());
    }

    #[test]
    fn a_key_others_can_read_or_that_is_not_a_key_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("host.key");
        load_or_create(&path).expect("created");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let error = load_or_create(&path).expect_err("world-readable key refused").to_string();
        assert!(error.contains("chmod 600"), "{error}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&path, "not a key").expect("write");
        assert!(load_or_create(&path).expect_err("garbage refused").to_string().contains("64 hex digits"));
    }
}
