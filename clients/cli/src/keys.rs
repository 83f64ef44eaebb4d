//! The user's key file: an ed25519 secret key as 64 hex digits, created with
//! owner-only permissions, at `--key`, `$GPUX_KEY` or `~/.gpux/key`.

use std::io::Write;
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
    let text = std::fs::read_to_string(path)
        .map_err(|_| Failure::Usage(format!("no key at {}: create one with `gpux keys create` (or pass --key)", path.display())))?;
    let bytes: [u8; 32] = hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Failure::Usage(format!("{} is not a key (64 hex digits expected)", path.display())))?;
    Ok(SigningKey::from_bytes(&bytes))
}

pub fn create(path: &Path) -> Result<SigningKey, Failure> {
    if path.exists() {
        return Err(Failure::Usage(format!("{} exists: keep it, or move it away to make a new key", path.display())));
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| Failure::Usage(format!("creating {}: {e}", parent.display())))?;
    }
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|e| Failure::Usage(format!("no randomness for a key: {e}")))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|e| Failure::Usage(format!("creating {}: {e}", path.display())))?;
    writeln!(file, "{}", hex::encode(secret)).map_err(|e| Failure::Usage(format!("writing {}: {e}", path.display())))?;
    Ok(SigningKey::from_bytes(&secret))
}
