//! The data directory (issue "Fair shares", docs/operations.md "Files"):
//! created owner-only (0700), its data files made owner-only (0600) at
//! every start, and refused when others may write to it (they could
//! replace the journal or the exchange's key).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

/// Creates `dir` (and missing parents) owner-only, or checks an existing
/// one: refused when its group or others may write to it.
pub fn prepare(dir: &Path) -> Result<()> {
    if !dir.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mode = std::fs::metadata(dir).with_context(|| format!("reading {}", dir.display()))?.permissions().mode();
    if mode & 0o022 != 0 {
        bail!(
            "the data directory {} may be written by others (mode {:03o}): they could replace the journal; `chmod go-w {}` (0700 is what the exchange creates)",
            dir.display(),
            mode & 0o777,
            dir.display()
        );
    }
    Ok(())
}

/// Makes a data file owner-only (0600), if it exists.
pub fn owner_only(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} owner-only", path.display())),
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("reading {}", path.display())),
    }
}

/// The redb files a node keeps in its data directory.
pub const DATA_FILES: [&str; 4] = ["journal.redb", "snapshots.redb", "raft-log.redb", "raft-machine.redb"];

/// Makes every data file of `dir` owner-only (after they were opened: redb
/// creates them with the process's umask).
pub fn seal_files(dir: &Path) -> Result<()> {
    DATA_FILES.iter().try_for_each(|name| owner_only(&dir.join(name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_others_may_write_is_refused_and_files_become_owner_only() {
        let root = tempfile::tempdir().expect("temp dir");
        let fresh = root.path().join("a/b");
        prepare(&fresh).expect("created");
        assert_eq!(std::fs::metadata(&fresh).expect("meta").permissions().mode() & 0o777, 0o700);
        let open = root.path().join("open");
        std::fs::create_dir(&open).expect("dir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let refused = prepare(&open).expect_err("refused");
        assert!(refused.to_string().contains("may be written by others (mode 777)"), "{refused}");
        let file = fresh.join("journal.redb");
        std::fs::write(&file, b"x").expect("file");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        seal_files(&fresh).expect("sealed");
        assert_eq!(std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777, 0o600);
    }
}
