//! A lease's volumes on its host (docs/agent.md "Volumes"): each restored
//! from the exchange's store into `<volumes>/<lease>/<volume>` before the
//! workload starts, mounted at the renter's path (the process backend gets
//! the folder's path in `GPUX_VOLUME_<NAME>`), and, unless read-only,
//! mirrored back while it runs (every `SYNC_INTERVAL_MS`), at its exit,
//! and once the lease ended and the workload is gone. The mirror is exact:
//! files deleted here are deleted there.
//!
//! Only the store's HTTP API is spoken (the token that came with
//! `volumes_attached`); the store's own credentials stay with the exchange.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use gpux_engine::LeaseId;
use gpux_protocol::jobs::StoreGrant;
use gpux_protocol::{FailureCode, VolumeAttachment};

use super::jobs::{list_files_within, safe_join};
use super::Failure;
use crate::limits::TRANSFER_TIMEOUT;

/// Free space a restore leaves on the host's state disk at least.
pub const DISK_RESERVE_BYTES: u64 = 1 << 30;

/// Whether `needed` bytes of volumes fit in `free` bytes with the reserve kept.
pub fn fits(needed: u64, free: u64) -> bool {
    needed.saturating_add(DISK_RESERVE_BYTES) <= free
}

/// Free bytes (for an unprivileged writer) on the file system of `dir`.
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let stats = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(stats.blocks_available() as u64 * stats.fragment_size() as u64)
}

/// A lease's volumes on this host and how to reach their store.
#[derive(Clone, Debug)]
pub struct VolumeFiles {
    pub lease: LeaseId,
    /// The renter (its store prefix).
    pub owner: gpux_engine::AccountId,
    pub volumes: Vec<VolumeAttachment>,
    /// `<volumes>/<lease>`: one folder per volume.
    pub dir: PathBuf,
    pub store: StoreGrant,
    /// Whether the files were restored (a restart does not restore again).
    restored: Arc<AtomicBool>,
    /// What each file was when last put or restored, by `<volume>/<path>`.
    seen: Arc<Mutex<BTreeMap<String, (u64, SystemTime)>>>,
}

#[derive(serde::Deserialize)]
struct Listed {
    key: String,
    bytes: u64,
}

impl VolumeFiles {
    pub fn new(
        lease: LeaseId,
        owner: gpux_engine::AccountId,
        volumes: Vec<VolumeAttachment>,
        dir: PathBuf,
        store: StoreGrant,
    ) -> VolumeFiles {
        VolumeFiles { lease, owner, volumes, dir, store, restored: Arc::default(), seen: Arc::default() }
    }

    /// Volumes whose files are on this host already (a re-adopted
    /// workload's, after the agent restarted): synced, never restored
    /// over what the workload wrote since.
    pub fn already_restored(self) -> VolumeFiles {
        self.restored.store(true, Ordering::SeqCst);
        self
    }

    /// Where `volume`'s files are on this host.
    pub fn folder(&self, volume: &VolumeAttachment) -> PathBuf {
        self.dir.join(volume.volume.0.to_string())
    }

    /// Whether any volume is written back.
    pub fn writes(&self) -> bool {
        self.volumes.iter().any(|v| !v.read_only)
    }

    /// `GPUX_VOLUME_<NAME>` for each volume: its mount in a container, its
    /// folder for the process backend.
    pub fn env(&self, in_container: bool) -> Vec<(String, String)> {
        self.volumes
            .iter()
            .map(|v| {
                let name: String = v.name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
                let path = if in_container { v.mount.clone() } else { self.folder(v).display().to_string() };
                (format!("GPUX_VOLUME_{name}"), path)
            })
            .collect()
    }

    /// The container's binds: each folder at its mount (`:ro` when read-only).
    pub fn binds(&self) -> Vec<String> {
        self.volumes
            .iter()
            .map(|v| match v.read_only {
                true => format!("{}:{}:ro", self.folder(v).display(), v.mount),
                false => format!("{}:{}", self.folder(v).display(), v.mount),
            })
            .collect()
    }

    fn prefix(&self, volume: &VolumeAttachment) -> String {
        format!("{}/volumes/{}", self.owner.0, volume.volume.0)
    }

    fn client() -> Result<reqwest::Client, String> {
        reqwest::Client::builder().timeout(TRANSFER_TIMEOUT).build().map_err(|e| format!("HTTP client: {e}"))
    }

    /// Each volume's files from the store into its folder (once). A store
    /// that does not answer, or a folder that cannot be written, fails the
    /// start as this host's fault.
    pub async fn restore(&self) -> Result<(), Failure> {
        if self.restored.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Whatever reached this host, a volume goes nowhere but a path the
        // rules allow (never over a system path).
        if let Some(bad) = self.volumes.iter().find(|v| !gpux_protocol::volumes::mount_valid(&v.mount)) {
            return Err(Failure::public(FailureCode::WorkloadRefused, format!("volume {}: its mount path is refused", bad.name)));
        }
        let host = |detail: String| Failure::new(FailureCode::HostError, detail);
        let client = Self::client().map_err(host)?;
        let mut listings = Vec::new();
        for volume in &self.volumes {
            let folder = self.folder(volume);
            std::fs::create_dir_all(&folder).map_err(|e| host(format!("{}: {e}", folder.display())))?;
            listings.push(self.list(&client, &self.prefix(volume)).await.map_err(host)?);
        }
        // A host keeps room for the volumes of the leases it sells: files
        // that would leave less than the reserve free fail the start as
        // the host's fault, before anything is written.
        let needed: u64 = listings.iter().flatten().map(|item| item.bytes).sum();
        let free = free_bytes(&self.dir).map_err(|e| host(format!("{}: {e}", self.dir.display())))?;
        if !fits(needed, free) {
            return Err(host(format!(
                "the lease's volumes hold {needed} bytes and the host's state disk has {free} free (a reserve of {DISK_RESERVE_BYTES} is kept)"
            )));
        }
        for (volume, listing) in self.volumes.iter().zip(listings) {
            let folder = self.folder(volume);
            let prefix = self.prefix(volume);
            for item in listing {
                let Some(relative) = item.key.strip_prefix(&format!("{prefix}/")) else { continue };
                let path = safe_join(&folder, relative).ok_or_else(|| host(format!("a stored path: {relative}")))?;
                let body = self.get(&client, &item.key).await.map_err(host)?;
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| host(format!("{}: {e}", parent.display())))?;
                }
                std::fs::write(&path, &body).map_err(|e| host(format!("{}: {e}", path.display())))?;
                if let Ok(modified) = std::fs::metadata(&path).and_then(|m| m.modified()) {
                    self.remember(volume, relative, (body.len() as u64, modified));
                }
            }
        }
        self.restored.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Mirrors each read-write volume's folder to the store: files changed
    /// since they were restored or last put are put, files deleted here are
    /// deleted there. Returns how many files were put.
    pub async fn sync(&self) -> Result<usize, String> {
        if !self.restored.load(Ordering::SeqCst) {
            return Ok(0); // nothing here yet to mirror
        }
        let client = Self::client()?;
        let mut put = 0;
        for volume in self.volumes.iter().filter(|v| !v.read_only) {
            let prefix = self.prefix(volume);
            let local = list_files_within(&self.folder(volume), gpux_protocol::volumes::limits::FILES_PER_VOLUME_MAX)?;
            let remote: BTreeMap<String, u64> = self
                .list(&client, &prefix)
                .await?
                .into_iter()
                .filter_map(|l| l.key.strip_prefix(&format!("{prefix}/")).map(|r| (r.to_string(), l.bytes)))
                .collect();
            for (relative, (path, bytes, modified)) in &local {
                let known = self.seen.lock().unwrap_or_else(|p| p.into_inner()).get(&format!("{}/{relative}", volume.volume.0)).copied();
                if known == Some((*bytes, *modified)) && remote.get(relative) == Some(bytes) {
                    continue;
                }
                let body = bytes::Bytes::from(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?);
                let at = format!("/v1/objects/{prefix}/{relative}");
                let putting = |to: &str| client.put(to).bearer_auth(&self.store.token).body(body.clone());
                let answer = gpux_client::store::send(&self.store.url, &at, putting).await.map_err(|e| e.to_string())?;
                if !answer.status().is_success() {
                    let text = answer.text().await.unwrap_or_default();
                    return Err(format!("putting {relative} into volume {}: {text}", volume.name));
                }
                self.remember(volume, relative, (*bytes, *modified));
                put += 1;
            }
            for relative in remote.keys().filter(|r| !local.contains_key(*r)) {
                let at = format!("/v1/objects/{prefix}/{relative}");
                let answer = gpux_client::store::send(&self.store.url, &at, |to| client.delete(to).bearer_auth(&self.store.token))
                    .await
                    .map_err(|e| e.to_string())?;
                if !answer.status().is_success() {
                    return Err(format!("deleting {relative} from volume {}: {}", volume.name, answer.status()));
                }
            }
        }
        Ok(put)
    }

    /// [`sync`](Self::sync), tried again after `wait` up to `attempts`
    /// times while the store fails (down, slow, or refusing a put for a
    /// reason that may pass): the last error if it never succeeded.
    pub async fn sync_retrying(&self, attempts: u32, wait: std::time::Duration) -> Result<usize, String> {
        let mut last = String::new();
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(wait).await;
            }
            match self.sync().await {
                Ok(put) => return Ok(put),
                Err(error) => {
                    tracing::warn!(lease = %self.lease, %error, attempt, "a volume sync failed");
                    last = error;
                }
            }
        }
        Err(last)
    }

    fn remember(&self, volume: &VolumeAttachment, relative: &str, seen: (u64, SystemTime)) {
        self.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(format!("{}/{relative}", volume.volume.0), seen);
    }

    async fn get(&self, client: &reqwest::Client, key: &str) -> Result<bytes::Bytes, String> {
        let at = format!("/v1/objects/{key}");
        let answer = gpux_client::store::send(&self.store.url, &at, |to| client.get(to).bearer_auth(&self.store.token))
            .await
            .map_err(|e| format!("{key}: {e}"))?;
        match answer.status() {
            status if status.is_success() => answer.bytes().await.map_err(|e| format!("{key}: {e}")),
            status => Err(format!("{key}: {status}")),
        }
    }

    async fn list(&self, client: &reqwest::Client, prefix: &str) -> Result<Vec<Listed>, String> {
        let at = format!("/v1/list/{prefix}");
        let answer = gpux_client::store::send(&self.store.url, &at, |to| client.get(to).bearer_auth(&self.store.token))
            .await
            .map_err(|e| format!("listing {prefix}: {e}"))?;
        if !answer.status().is_success() {
            return Err(format!("listing {prefix}: {}", answer.status()));
        }
        let body = answer.bytes().await.map_err(|e| format!("listing {prefix}: {e}"))?;
        serde_json::from_slice(&body).map_err(|e| format!("listing {prefix}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volumes_fit_only_with_the_reserve_kept() {
        assert!(fits(0, DISK_RESERVE_BYTES));
        assert!(fits(10, DISK_RESERVE_BYTES + 10));
        assert!(!fits(11, DISK_RESERVE_BYTES + 10));
        assert!(!fits(u64::MAX - 5, u64::MAX - 1), "no overflow");
        let here = std::env::temp_dir();
        assert!(free_bytes(&here).expect("statvfs") > 0);
    }
}
