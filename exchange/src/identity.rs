//! The exchange's own ed25519 key (`exchange.key` in the data directory):
//! created on first start with mode 0600, it signs invoices, and its public
//! half is published (`exchange_key`) so anyone can verify them. A key file
//! others can read, or one that is not a key, stops the start-up.

use std::path::Path;

use anyhow::Result;
use ed25519_dalek::SigningKey;

/// Loads the key at `path`, creating it (0600) if there is none
/// (`gpux_protocol::secret_file`: refused when others may read it).
pub fn load_or_create(path: &Path) -> Result<SigningKey> {
    let secret = gpux_protocol::secret_file::load_or_create_key(path).map_err(|e| anyhow::anyhow!("the exchange key: {e}"))?;
    Ok(SigningKey::from_bytes(&secret))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
