//! The user's key file: an ed25519 secret key as 64 hex digits, created with
//! owner-only permissions, at `--key`, `$GPUX_KEY` or `~/.gpux/key`.

use std::path::{Path, PathBuf};

use ed25519_dalek::SigningKey;

use crate::Failure;

pub fn default_path(explicit: Option<&Path>) -> PathBuf {
    match explicit {
        Some(path) => path.to_path_buf(),
        None => std::env::var_os("HOME").map_or_else(|| PathBuf::from(".gpux/key"), |home| PathBuf::from(home).join(".gpux/key")),
    }
}

pub fn load(path: &Path) -> Result<SigningKey, Failure> {
    use gpux_protocol::secret_file::{self, SecretFileError};
    match secret_file::read_key(path) {
        Ok(bytes) => Ok(SigningKey::from_bytes(&bytes)),
        Err(SecretFileError::Missing(_)) => {
            Err(Failure::Usage(format!("no key at {}: create one with `gpux keys create` (or pass --key)", path.display())))
        }
        Err(error) => Err(Failure::Usage(format!("the key: {error}"))),
    }
}

pub fn create(path: &Path) -> Result<SigningKey, Failure> {
    let secret = gpux_protocol::secret_file::random_key();
    gpux_protocol::secret_file::create_key(path, &secret).map_err(|e| Failure::Usage(format!("the key: {e}")))?;
    Ok(SigningKey::from_bytes(&secret))
}
