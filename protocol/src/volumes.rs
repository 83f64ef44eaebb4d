//! Volumes on the wire (docs/storage.md, docs/protocol.md "Volumes"): a
//! renter's named, sized folder kept in the exchange's store, attached to
//! leases at paths of their choosing, restored on the host when the
//! workload starts and synced back while it runs and when it ends.
//!
//! The rule for a volume on two leases at once: at most one holder writes
//! (a lease, or a bid that would become one); any number read a copy of
//! what the store holds. A read-write mount while another holder writes is
//! refused `volume_in_use` when the bid is placed, never discovered later.

use gpux_engine::{AccountId, LeaseId};
use serde::{Deserialize, Serialize};

/// Bounds of volumes; a breach is `volume_invalid` with the field named.
pub mod limits {
    /// Bytes of a volume's name (letters, digits, `-`, `_`, `.`, not first).
    pub const NAME_BYTES_MAX: usize = 63;
    /// The largest volume, GiB.
    pub const SIZE_GIB_MAX: u32 = 1024;
    /// Volumes not deleted one account may hold.
    pub const VOLUMES_PER_ACCOUNT_MAX: usize = 16;
    /// GiB one account's volumes may hold together.
    pub const ACCOUNT_GIB_MAX: u64 = 4096;
    /// Volumes not deleted, all accounts together.
    pub const VOLUMES_LIVE_MAX: usize = 1 << 16;
    /// Volumes one bid mounts.
    pub const MOUNTS_PER_BID_MAX: usize = 4;
    /// Bytes of a mount path.
    pub const MOUNT_BYTES_MAX: usize = 256;
    /// Objects (files) one volume holds.
    pub const FILES_PER_VOLUME_MAX: usize = 10_000;
    /// How often a host syncs a read-write volume while its workload runs.
    pub const SYNC_INTERVAL_MS: u64 = 30_000;
    /// How often storage is charged.
    pub const STORAGE_CHARGE_EVERY_MS: u64 = 3_600_000;
    /// How long an account's storage may stay unpaid before its volumes
    /// become read-only (3 days), and how long after that they are deleted
    /// (7 more days).
    pub const STORAGE_GRACE_MS: u64 = 3 * 24 * 3_600_000;
    pub const STORAGE_NOTICE_MS: u64 = 7 * 24 * 3_600_000;
    /// The storage price by default, minor units per GiB-month (US$0.07
    /// where a unit is a millionth of a dollar).
    pub const STORAGE_PRICE_DEFAULT: u64 = 70_000;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct VolumeId(pub u64);

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// A volume's name: 1 to 63 bytes of letters, digits, `-`, `_` and `.`,
/// starting with a letter or digit.
pub fn name_valid(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= limits::NAME_BYTES_MAX
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Paths a volume may not be mounted at or below: the system's, and those
/// the host mounts itself.
const MOUNTS_REFUSED: [&str; 9] = ["/proc", "/sys", "/dev", "/etc", "/bin", "/usr", "/run/gpux", "/job", "/var/cache/gpux-pip"];

/// A mount path: absolute, normalised (no `.`, `..` or empty component),
/// printable without spaces or `:` or `,`, not `/` and not at or below a
/// system path.
pub fn mount_valid(mount: &str) -> bool {
    let components: Vec<&str> = mount.split('/').skip(1).collect();
    mount.starts_with('/')
        && mount.len() <= limits::MOUNT_BYTES_MAX
        && !components.is_empty()
        && components.iter().all(|c| !c.is_empty() && *c != "." && *c != "..")
        && mount.bytes().all(|b| b.is_ascii_graphic() && b != b':' && b != b',')
        && !MOUNTS_REFUSED.iter().any(|refused| mount == *refused || mount.starts_with(&format!("{refused}/")))
}

/// A volume a bid mounts into each lease it fills.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMount {
    /// The volume's name (among the bidder's).
    pub volume: String,
    /// Where it appears in the workload (absolute).
    pub mount: String,
    /// A copy to read: nothing the workload writes is kept.
    #[serde(default)]
    pub read_only: bool,
}

impl VolumeMount {
    /// `NAME:/PATH` or `NAME:/PATH:ro` (the CLI's `--volume`).
    pub fn parse(text: &str) -> Option<VolumeMount> {
        let (volume, rest) = text.split_once(':')?;
        let (mount, read_only) = match rest.rsplit_once(':') {
            Some((mount, "ro")) => (mount, true),
            Some((mount, "rw")) => (mount, false),
            _ => (rest, false),
        };
        (name_valid(volume) && mount_valid(mount)).then(|| VolumeMount { volume: volume.into(), mount: mount.into(), read_only })
    }

    /// Why a bid's mounts are refused (`volume_invalid`): too many, a
    /// name or path malformed, a volume or a path named twice.
    pub fn check_all(mounts: &[VolumeMount]) -> Result<(), &'static str> {
        if mounts.len() > limits::MOUNTS_PER_BID_MAX {
            return Err("volumes: at most 4 per bid");
        }
        for (i, mount) in mounts.iter().enumerate() {
            if !name_valid(&mount.volume) {
                return Err("volumes.volume: 1 to 63 letters, digits, '-', '_' or '.'");
            }
            if !mount_valid(&mount.mount) {
                return Err("volumes.mount: an absolute path, not / nor a system path");
            }
            let earlier = &mounts[..i];
            if earlier.iter().any(|m| m.volume == mount.volume) {
                return Err("volumes: a volume mounted twice");
            }
            if earlier.iter().any(|m| {
                let (a, b) = (m.mount.as_str(), mount.mount.as_str());
                a == b || b.starts_with(&format!("{a}/")) || a.starts_with(&format!("{b}/"))
            }) {
                return Err("volumes.mount: two mounts at or inside each other");
            }
        }
        Ok(())
    }
}

/// Where a volume stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VolumeState {
    /// Attached or attachable.
    Ready,
    /// Deleted: its files are being removed from the store; the name is free.
    Deleted,
}

/// What the exchange says about a volume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub volume: VolumeId,
    pub owner: AccountId,
    pub name: String,
    pub size_gib: u32,
    pub state: VolumeState,
    pub created_at_ms: u64,
    /// The lease writing it now, if any.
    pub writer: Option<LeaseId>,
    /// A resting bid that would write it when it fills.
    #[serde(default)]
    pub writer_bid: Option<u64>,
    /// Leases reading a copy of it now.
    #[serde(default)]
    pub readers: Vec<LeaseId>,
    /// Since when its account's storage is unpaid, and what follows
    /// (docs/storage.md "Prices"): read-only from, deleted from.
    #[serde(default)]
    pub unpaid_since_ms: Option<u64>,
    #[serde(default)]
    pub read_only_from_ms: Option<u64>,
    #[serde(default)]
    pub delete_from_ms: Option<u64>,
    /// Its storage charged since the price in force (minor units).
    #[serde(default)]
    pub charged_minor: u64,
}

/// Pushed to a lease's host before its workload: the volumes to restore
/// into it, and the store's URL and token to reach them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeAttachment {
    pub volume: VolumeId,
    pub name: String,
    pub mount: String,
    pub read_only: bool,
    /// The most its files may hold together (its size).
    pub bytes_max: u64,
}

/// A lease's volumes as its host learns them again (`lease_delivery`,
/// after an agent's restart): what `volumes_attached` said, with a fresh
/// store token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseVolumes {
    pub renter: AccountId,
    pub volumes: Vec<VolumeAttachment>,
    pub store: Option<crate::jobs::StoreGrant>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_mounts_are_checked() {
        for good in ["data", "a", "ckpt-2026.v1", "X_9"] {
            assert!(name_valid(good), "{good}");
        }
        for bad in ["", "-x", ".hidden", "a/b", "a b", &"n".repeat(64)] {
            assert!(!name_valid(bad), "{bad}");
        }
        for good in ["/data", "/workspace/cache", "/mnt/v-1"] {
            assert!(mount_valid(good), "{good}");
        }
        for bad in ["", "/", "data", "/a/../b", "/a//b", "/a/", "/proc", "/etc/x", "/run/gpux", "/dev/shm", "/a b", "/a:b", "/job/x"] {
            assert!(!mount_valid(bad), "{bad}");
        }
    }

    #[test]
    fn the_cli_form_parses() {
        let rw = VolumeMount::parse("data:/data").expect("parses");
        assert_eq!((rw.volume.as_str(), rw.mount.as_str(), rw.read_only), ("data", "/data", false));
        let ro = VolumeMount::parse("weights:/models:ro").expect("parses");
        assert_eq!((ro.volume.as_str(), ro.mount.as_str(), ro.read_only), ("weights", "/models", true));
        assert!(VolumeMount::parse("data").is_none());
        assert!(VolumeMount::parse("data:/").is_none());
        assert!(VolumeMount::parse("data:/x:rx").is_none());
    }

    #[test]
    fn a_bid_s_mounts_are_refused_when_they_collide() {
        let mount = |v: &str, m: &str| VolumeMount { volume: v.into(), mount: m.into(), read_only: false };
        assert!(VolumeMount::check_all(&[mount("a", "/a"), mount("b", "/b")]).is_ok());
        assert!(VolumeMount::check_all(&[mount("a", "/a"), mount("a", "/b")]).is_err());
        assert!(VolumeMount::check_all(&[mount("a", "/a"), mount("b", "/a/b")]).is_err());
        assert!(VolumeMount::check_all(&[mount("a", "/ab"), mount("b", "/a")]).is_ok());
        let five: Vec<VolumeMount> = (0..5).map(|i| mount(&format!("v{i}"), &format!("/v{i}"))).collect();
        assert!(VolumeMount::check_all(&five).is_err());
    }
}
