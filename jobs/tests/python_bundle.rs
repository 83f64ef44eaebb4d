//! One bundle format (docs/jobs.md "The code bundle"): the Python client's
//! packer (clients/python/gpux/bundle.py, standard library only, loaded
//! from its file) packs the same fixture to the same bytes as
//! `gpux_jobs::bundle::pack`, and refuses what it refuses. The fixture
//! holds what the rules touch: nested directories in an order the file
//! system does not give, an executable, files every packer must leave out
//! (`.git`, `__pycache__`, `*.pyc`, `.venv`, `.gpuxignore` patterns), an
//! empty file, a path over 100 bytes that ustar splits, a name over 100
//! bytes that needs GNU's long name, UTF-8 names and a large compressible
//! file.
//!
//! Needs `python3` (the CI machine's); skipped without it unless
//! `GPUX_REQUIRE_PYTHON=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn packer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python/gpux/bundle.py")
}

/// The Python packer's bundle of `dir`, or its refusal (`Err(message)`);
/// `None` without python3.
fn python_pack(dir: &Path) -> Option<Result<Vec<u8>, String>> {
    let out = dir.with_extension("py.tar.gz");
    let script = r#"
import importlib.util, sys
spec = importlib.util.spec_from_file_location("bundle", sys.argv[1])
bundle = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bundle)
try:
    data = bundle.pack(sys.argv[2])
except bundle.BundleError as error:
    print(error, file=sys.stderr)
    sys.exit(3)
open(sys.argv[3], "wb").write(data)
"#;
    let run = Command::new("python3").arg("-c").arg(script).arg(packer()).arg(dir).arg(&out).output();
    let Ok(run) = run else {
        assert!(std::env::var("GPUX_REQUIRE_PYTHON").as_deref() != Ok("1"), "GPUX_REQUIRE_PYTHON=1 but no python3");
        eprintln!("SKIPPED: no python3");
        return None;
    };
    match run.status.code() {
        Some(0) => Some(Ok(std::fs::read(&out).expect("the Python bundle"))),
        Some(3) => Some(Err(String::from_utf8_lossy(&run.stderr).into_owned())),
        _ => panic!("python3 failed: {run:?}"),
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("dirs");
    std::fs::write(path, bytes).expect("write");
}

fn fixture(root: &Path) {
    write(&root.join("train.py"), b"import torch\nprint('hello')\n");
    write(&root.join("run.sh"), b"#!/bin/sh\nexec python3 train.py\n");
    let mut executable = std::fs::metadata(root.join("run.sh")).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut executable, 0o755);
    std::fs::set_permissions(root.join("run.sh"), executable).expect("chmod");
    write(&root.join("zeta/alpha.txt"), b"z");
    write(&root.join("alpha/zeta.txt"), b"a");
    write(&root.join("alpha-b/x.txt"), b"b");
    write(&root.join("alpha.txt"), b"");
    write(&root.join("données/été.csv"), "température\n21\n".as_bytes());
    write(&root.join(".git/HEAD"), b"ref: refs/heads/main\n");
    write(&root.join("__pycache__/train.cpython-311.pyc"), b"\0\0");
    write(&root.join("lib/util.pyc"), b"\0");
    write(&root.join(".venv/bin/python"), b"x");
    write(&root.join("data/big.bin"), b"x");
    write(&root.join("notes.log"), b"x");
    write(&root.join("keep/notes.log.txt"), b"kept");
    write(&root.join(".gpuxignore"), b"# local data\ndata/\n*.log\n");
    // Over 100 bytes, split by ustar into a prefix and a name.
    let deep = format!("{}/{}/model.py", "a".repeat(60), "b".repeat(60));
    write(&root.join(deep), b"deep");
    // A name over 100 bytes: GNU's long name.
    write(&root.join(format!("long/{}.py", "n".repeat(120))), b"long");
    // Large and compressible: several deflate blocks.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 ^ (i / 997) as u8).collect();
    write(&root.join("weights/table.bin"), &big);
}

#[test]
fn the_python_client_packs_the_same_bytes_as_the_cli() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("code");
    fixture(&root);
    let rust = gpux_jobs::bundle::pack(&root).expect("packs");
    let Some(python) = python_pack(&root) else { return };
    let python = python.expect("the Python packer packs it");
    if python != rust.bytes {
        // What differs, for whoever reads the failure: both bundles beside the fixture.
        std::fs::write(dir.path().join("rust.tar.gz"), &rust.bytes).expect("write");
        std::fs::write(dir.path().join("python.tar.gz"), &python).expect("write");
        if let Ok(keep) = std::env::var("GPUX_KEEP_BUNDLES") {
            std::fs::write(format!("{keep}/rust.tar.gz"), &rust.bytes).expect("write");
            std::fs::write(format!("{keep}/python.tar.gz"), &python).expect("write");
        }
    }
    assert_eq!(rust.files, 12, "what the rules leave out is out");
    assert_eq!(python.len(), rust.bytes.len(), "the same length");
    assert!(python == rust.bytes, "the same bytes, so the same name {}", rust.sha256_hex());
}

#[test]
fn the_python_client_refuses_a_symbolic_link_as_the_cli_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path().join("code");
    write(&root.join("train.py"), b"print(1)\n");
    std::os::unix::fs::symlink("/etc/passwd", root.join("passwd")).expect("symlink");
    assert!(matches!(gpux_jobs::bundle::pack(&root), Err(gpux_jobs::bundle::BundleError::Link(_))));
    let Some(python) = python_pack(&root) else { return };
    let refused = python.expect_err("refused");
    assert!(refused.contains("is a symbolic link"), "{refused}");
    // Listed in .gpuxignore, it is left out by both.
    write(&root.join(".gpuxignore"), b"passwd\n");
    let rust = gpux_jobs::bundle::pack(&root).expect("packs");
    let python = python_pack(&root).expect("python3").expect("packs");
    assert!(python == rust.bytes);
}
