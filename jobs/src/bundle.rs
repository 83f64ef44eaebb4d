//! The code bundle (docs/jobs.md "The code bundle"): a job's code
//! directory packed as a gzip-compressed tar, the same bytes for the same
//! files wherever it is packed (sorted entries, no times, owners or
//! umask in it), named by its SHA-256, bounded in size. It travels to the
//! host directly or through object storage, never through the journal: the
//! exchange keeps only its hash. Unpacking refuses any entry that would
//! land outside its directory.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Bytes of files a bundle holds at most, unpacked (256 MiB: code, not data;
/// data comes in as inputs).
pub const UNPACKED_BYTES_MAX: u64 = 256 << 20;
/// Files a bundle holds at most.
pub const FILES_MAX: usize = 50_000;

/// How much a packed directory may hold: a code bundle's bounds, or an
/// input's (data: larger, `INPUT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub unpacked_bytes: u64,
    pub files: usize,
}

impl Limits {
    pub const CODE: Limits = Limits { unpacked_bytes: UNPACKED_BYTES_MAX, files: FILES_MAX };
    /// An input put in the job store: 1 GiB of files (the store takes an
    /// object of 1 GiB at most; larger data comes from an https:// URL).
    pub const INPUT: Limits = Limits { unpacked_bytes: 1 << 30, files: FILES_MAX };
}
/// What is never packed: version control, caches, virtual environments.
pub const EXCLUDED_ALWAYS: [&str; 8] =
    [".git", "__pycache__", ".venv", "venv", ".ipynb_checkpoints", "node_modules", ".mypy_cache", ".pytest_cache"];
/// The file in the code directory naming more to leave out, one pattern a
/// line: a name (file or directory, at any depth), `*.ext` (a suffix), or
/// `dir/` (a directory); `#` starts a comment.
pub const IGNORE_FILE: &str = ".gpuxignore";

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{0} is a symbolic link: bundles hold files and directories only (copy what it points to, or list it in .gpuxignore)")]
    Link(PathBuf),
    #[error("over {} MiB of files: pass data as inputs, or list large files in .gpuxignore", .0 >> 20)]
    TooLarge(u64),
    #[error("over {0} files")]
    TooManyFiles(usize),
    #[error("the bundle is damaged or not a bundle: {0}")]
    Damaged(String),
    #[error("the bundle's entry {0:?} would land outside its directory")]
    Escapes(String),
}

/// A packed code directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The gzip-compressed tar.
    pub bytes: Vec<u8>,
    /// SHA-256 of `bytes`: the bundle's name.
    pub sha256: [u8; 32],
    pub files: usize,
    pub unpacked_bytes: u64,
}

impl Bundle {
    pub fn sha256_hex(&self) -> String {
        self.sha256.iter().map(|b| format!("{b:02x}")).collect()
    }
}

struct Ignore {
    names: Vec<String>,
    suffixes: Vec<String>,
    directories: Vec<String>,
}

impl Ignore {
    fn load(dir: &Path) -> Result<Ignore, BundleError> {
        let mut ignore = Ignore {
            names: EXCLUDED_ALWAYS.iter().map(|s| s.to_string()).collect(),
            suffixes: vec![".pyc".into()],
            directories: Vec::new(),
        };
        let path = dir.join(IGNORE_FILE);
        if path.is_file() {
            let text = std::fs::read_to_string(&path).map_err(|e| BundleError::Read { path: path.clone(), reason: e.to_string() })?;
            for line in text.lines().map(|l| l.split('#').next().unwrap_or("").trim()).filter(|l| !l.is_empty()) {
                if let Some(suffix) = line.strip_prefix('*') {
                    ignore.suffixes.push(suffix.to_string());
                } else if let Some(directory) = line.strip_suffix('/') {
                    ignore.directories.push(directory.to_string());
                } else {
                    ignore.names.push(line.to_string());
                }
            }
        }
        Ok(ignore)
    }

    fn skips(&self, name: &str, is_dir: bool) -> bool {
        self.names.iter().any(|n| n == name)
            || (is_dir && self.directories.iter().any(|d| d == name))
            || (!is_dir && self.suffixes.iter().any(|s| name.ends_with(s.as_str())))
    }
}

/// The files of `dir` to pack, relative, sorted (directories first walked
/// in name order, so the order never depends on the file system).
fn files(dir: &Path, ignore: &Ignore, limits: Limits) -> Result<Vec<(String, PathBuf, u64, bool)>, BundleError> {
    let mut found = Vec::new();
    let mut total = 0u64;
    let mut pending = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, path)) = pending.pop() {
        let read = |e: std::io::Error| BundleError::Read { path: path.clone(), reason: e.to_string() };
        let mut entries: Vec<_> = std::fs::read_dir(&path).map_err(read)?.collect::<Result<_, _>>().map_err(read)?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries.into_iter().rev() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let full = entry.path();
            let kind = entry.file_type().map_err(|e| BundleError::Read { path: full.clone(), reason: e.to_string() })?;
            if ignore.skips(&name, kind.is_dir()) {
                continue;
            }
            let relative = if prefix.is_empty() { name.clone() } else { format!("{prefix}/{name}") };
            if kind.is_symlink() {
                return Err(BundleError::Link(full));
            }
            if kind.is_dir() {
                pending.push((relative, full));
                continue;
            }
            let metadata = entry.metadata().map_err(|e| BundleError::Read { path: full.clone(), reason: e.to_string() })?;
            total += metadata.len();
            if total > limits.unpacked_bytes {
                return Err(BundleError::TooLarge(limits.unpacked_bytes));
            }
            #[cfg(unix)]
            let executable = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions()) & 0o111 != 0;
            #[cfg(not(unix))]
            let executable = false;
            found.push((relative, full, metadata.len(), executable));
            if found.len() > limits.files {
                return Err(BundleError::TooManyFiles(limits.files));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// Packs `dir` as a code bundle.
pub fn pack(dir: &Path) -> Result<Bundle, BundleError> {
    pack_within(dir, Limits::CODE)
}

/// Packs `dir` within `limits`.
pub fn pack_within(dir: &Path, limits: Limits) -> Result<Bundle, BundleError> {
    use sha2::Digest;
    if !dir.is_dir() {
        return Err(BundleError::NotADirectory(dir.to_path_buf()));
    }
    let ignore = Ignore::load(dir)?;
    let files = files(dir, &ignore, limits)?;
    let encoder = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    let mut archive = tar::Builder::new(encoder);
    let mut unpacked_bytes = 0;
    for (relative, full, _, executable) in &files {
        let mut content = Vec::new();
        std::fs::File::open(full)
            .and_then(|mut f| f.read_to_end(&mut content))
            .map_err(|e| BundleError::Read { path: full.clone(), reason: e.to_string() })?;
        unpacked_bytes += content.len() as u64;
        if unpacked_bytes > limits.unpacked_bytes {
            return Err(BundleError::TooLarge(limits.unpacked_bytes));
        }
        let mut header = tar::Header::new_ustar();
        header.set_size(content.len() as u64);
        header.set_mode(if *executable { 0o755 } else { 0o644 });
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        archive
            .append_data(&mut header, relative, content.as_slice())
            .map_err(|e| BundleError::Read { path: full.clone(), reason: e.to_string() })?;
    }
    let encoder = archive.into_inner().map_err(|e| BundleError::Damaged(e.to_string()))?;
    let bytes = encoder.finish().map_err(|e| BundleError::Damaged(e.to_string()))?;
    let sha256 = sha2::Sha256::digest(&bytes).into();
    Ok(Bundle { bytes, sha256, files: files.len(), unpacked_bytes })
}

/// Unpacks a bundle into `dest` (made if missing), checking it is the one
/// named `sha256` and holds only regular files and directories inside
/// `dest`, within the bounds a packed bundle keeps.
pub fn unpack(bytes: &[u8], sha256: &[u8; 32], dest: &Path) -> Result<usize, BundleError> {
    unpack_within(bytes, sha256, dest, Limits::CODE)
}

/// `unpack` within `limits`.
pub fn unpack_within(bytes: &[u8], sha256: &[u8; 32], dest: &Path, limits: Limits) -> Result<usize, BundleError> {
    use sha2::Digest;
    let actual: [u8; 32] = sha2::Sha256::digest(bytes).into();
    if &actual != sha256 {
        return Err(BundleError::Damaged("its SHA-256 is not the job's".into()));
    }
    std::fs::create_dir_all(dest).map_err(|e| BundleError::Read { path: dest.to_path_buf(), reason: e.to_string() })?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let (mut files, mut total) = (0usize, 0u64);
    for entry in archive.entries().map_err(|e| BundleError::Damaged(e.to_string()))? {
        let mut entry = entry.map_err(|e| BundleError::Damaged(e.to_string()))?;
        let path = entry.path().map_err(|e| BundleError::Damaged(e.to_string()))?.into_owned();
        let shown = path.display().to_string();
        if path.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(BundleError::Escapes(shown));
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(BundleError::Escapes(shown));
        }
        files += 1;
        total += entry.size();
        if files > limits.files {
            return Err(BundleError::TooManyFiles(limits.files));
        }
        if total > limits.unpacked_bytes {
            return Err(BundleError::TooLarge(limits.unpacked_bytes));
        }
        let target = dest.join(&path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| BundleError::Read { path: parent.to_path_buf(), reason: e.to_string() })?;
        }
        let mut content = Vec::new();
        entry.read_to_end(&mut content).map_err(|e| BundleError::Damaged(e.to_string()))?;
        let mut file = std::fs::File::create(&target).map_err(|e| BundleError::Read { path: target.clone(), reason: e.to_string() })?;
        file.write_all(&content).map_err(|e| BundleError::Read { path: target.clone(), reason: e.to_string() })?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = if entry.header().mode().unwrap_or(0o644) & 0o111 != 0 { 0o755 } else { 0o644 };
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
                .map_err(|e| BundleError::Read { path: target.clone(), reason: e.to_string() })?;
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, relative: &str, content: &str) {
        let path = dir.join(relative);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, content).expect("writes");
    }

    #[test]
    fn the_same_files_pack_to_the_same_bytes_and_unpack_whole() {
        let (a, b) = (tempfile::tempdir().expect("temp"), tempfile::tempdir().expect("temp"));
        // Written in different orders, at different times.
        for (relative, content) in [("train.py", "print(1)\n"), ("pkg/model.py", "x = 2\n"), ("requirements.txt", "torch\n")] {
            write(a.path(), relative, content);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        for (relative, content) in [("requirements.txt", "torch\n"), ("pkg/model.py", "x = 2\n"), ("train.py", "print(1)\n")] {
            write(b.path(), relative, content);
        }
        // What is never packed.
        write(b.path(), ".git/HEAD", "ref: main\n");
        write(b.path(), "pkg/__pycache__/model.cpython-311.pyc", "junk");
        let (first, second) = (pack(a.path()).expect("packs"), pack(b.path()).expect("packs"));
        assert_eq!(first.sha256, second.sha256, "the same files, the same bundle");
        assert_eq!((first.files, first.unpacked_bytes), (3, 21));
        let out = tempfile::tempdir().expect("temp");
        assert_eq!(unpack(&first.bytes, &first.sha256, out.path()).expect("unpacks"), 3);
        assert_eq!(std::fs::read_to_string(out.path().join("pkg/model.py")).expect("unpacked"), "x = 2\n");
        // Another file changes the name.
        write(a.path(), "notes.md", "hi\n");
        assert_ne!(pack(a.path()).expect("packs").sha256, first.sha256);
        // A bundle whose bytes are not the named ones is refused.
        assert!(matches!(unpack(&first.bytes, &[0; 32], out.path()), Err(BundleError::Damaged(_))));
    }

    #[test]
    fn ignore_patterns_links_and_escaping_entries_are_handled() {
        let dir = tempfile::tempdir().expect("temp");
        write(dir.path(), "train.py", "print(1)\n");
        write(dir.path(), "outputs/model.bin", "weights");
        write(dir.path(), "data.csv", "1,2\n");
        write(dir.path(), ".gpuxignore", "# big things\noutputs/\n*.csv\n");
        let bundle = pack(dir.path()).expect("packs");
        assert_eq!(bundle.files, 2, ".gpuxignore and train.py");
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink("/etc/passwd", dir.path().join("secret")).expect("symlink");
            assert!(matches!(pack(dir.path()), Err(BundleError::Link(_))));
        }
        // A hand-made archive with a `..` entry is refused on unpacking.
        let mut raw = tar::Builder::new(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default()));
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.as_gnu_mut().expect("gnu").name[..9].copy_from_slice(b"../escape");
        header.set_cksum();
        raw.append(&header, &b"x"[..]).expect("appends");
        let bytes = raw.into_inner().expect("tar").finish().expect("gzip");
        let sha256: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(&bytes).into()
        };
        let out = tempfile::tempdir().expect("temp");
        assert!(matches!(unpack(&bytes, &sha256, out.path()), Err(BundleError::Escapes(_))));
        assert!(!out.path().parent().expect("parent").join("escape").exists());
    }
}
