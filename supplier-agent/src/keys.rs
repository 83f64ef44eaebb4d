//! The host key: an ed25519 key created on first start and stored with
//! mode 0600. A key file that others can read is refused (a leaked host key
//! lets anyone sign usage reports for this host), as is a file that is not a
//! key. The secret is never logged or printed; only the public key is.

use std::path::Path;

use anyhow::Result;
use ed25519_dalek::SigningKey;

/// Loads the key at `path`, creating it (0600) if there is none
/// (`gpux_protocol::secret_file`: refused when others may read it).
pub fn load_or_create(path: &Path) -> Result<SigningKey> {
    let secret = gpux_protocol::secret_file::load_or_create_key(path).map_err(|e| anyhow::anyhow!("the host key: {e}"))?;
    Ok(SigningKey::from_bytes(&secret))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
