//! The exchange's own ed25519 key (`exchange.key` in the data directory):
//! created on first start with mode 0600, it signs invoices, and its public
//! half is published (`exchange_key`) so anyone can verify them. A key file
//! others can read, or one that is not a key, stops the start-up.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};
use ed25519_dalek::SigningKey;

/// Loads the key at `path`, creating it (0600) if there is none.
pub fn load_or_create(path: &Path) -> Result<SigningKey> {
    match std::fs::metadata(path) {
        Ok(metadata) => {
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                bail!(
                    "exchange key {} has mode {mode:o}; it must be readable by its owner only: chmod 600 {}",
                    path.display(),
                    path.display()
                );
            }
            let text = std::fs::read_to_string(path).with_context(|| format!("reading exchange key {}", path.display()))?;
            let bytes: [u8; 32] = hex::decode(text.trim())
                .ok()
                .and_then(|bytes| bytes.try_into().ok())
                .with_context(|| format!("exchange key {} is not 64 hex digits (an ed25519 secret key)", path.display()))?;
            Ok(SigningKey::from_bytes(&bytes))
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let mut secret = [0u8; 32];
            getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("the OS random source failed: {e}"))?;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating exchange key {}", path.display()))?;
            writeln!(file, "{}", hex::encode(secret))?;
            file.sync_all()?;
            Ok(SigningKey::from_bytes(&secret))
        }
        Err(error) => Err(error).with_context(|| format!("reading exchange key {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_made_once_owner_only_and_refused_when_others_can_read_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("exchange.key");
        let made = load_or_create(&path).expect("made");
        assert_eq!(std::fs::metadata(&path).expect("file").permissions().mode() & 0o777, 0o600);
        assert_eq!(load_or_create(&path).expect("loaded").to_bytes(), made.to_bytes(), "the same key on the next start");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let refused = load_or_create(&path).expect_err("refused").to_string();
        assert!(refused.contains("chmod 600"), "{refused}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        std::fs::write(&path, "not a key\n").expect("write");
        assert!(load_or_create(&path).is_err());
    }
}
