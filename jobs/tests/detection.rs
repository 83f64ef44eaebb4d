//! Framework detection on fixture projects, one per framework and way of
//! declaring it (docs/jobs.md "Framework detection").

use std::path::{Path, PathBuf};

use gpux_jobs::{detect, DetectError, Framework};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

#[test]
fn each_framework_is_found_where_projects_declare_it_with_its_version() {
    // (fixture, framework, the constraint found, where)
    let cases = [
        ("pytorch-requirements", Framework::Pytorch, "==2.1.0", "requirements.txt:2"),
        ("tensorflow-pyproject", Framework::Tensorflow, ">=2.15", "pyproject.toml [project]"),
        ("paddle-environment", Framework::Paddlepaddle, "==2.6.1", "environment.yml:9"),
        ("jax-setup", Framework::Jax, ">=0.4.20", "setup.py install_requires"),
    ];
    for (name, framework, version, source) in cases {
        let found = detect(&fixture(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(found.framework, Some(framework), "{name}");
        let requirement = found.framework_requirement.unwrap_or_else(|| panic!("{name}: a requirement"));
        assert_eq!((requirement.version.as_str(), requirement.source.as_str()), (version, source), "{name}");
    }
    // The other declared packages are kept for installing at start, with
    // `-r` includes followed.
    let pytorch = detect(&fixture("pytorch-requirements")).expect("detects");
    let names: Vec<&str> = pytorch.requirements.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["numpy", "torch", "einops"]);
    let paddle = detect(&fixture("paddle-environment")).expect("detects");
    let names: Vec<&str> = paddle.requirements.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["numpy", "paddlepaddle-gpu", "visualdl"]);
}

#[test]
fn without_declarations_imports_decide_and_ties_are_asked_about() {
    let imports = detect(&fixture("imports-only")).expect("detects");
    assert_eq!(imports.framework, Some(Framework::Paddlepaddle));
    assert!(imports.evidence.contains("2 file(s)"), "{}", imports.evidence);
    // Both declared: the one imported in more files.
    let two = detect(&fixture("two-frameworks")).expect("detects");
    assert_eq!(two.framework, Some(Framework::Pytorch));
    let plain = detect(&fixture("plain")).expect("detects");
    assert_eq!(plain.framework, None);
    assert!(matches!(detect(&fixture("missing")), Err(DetectError::NotADirectory(_))));
    // A tie of imports with nothing declared.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("a.py"), "import torch\n").expect("writes");
    std::fs::write(dir.path().join("b.py"), "import jax\n").expect("writes");
    assert!(matches!(detect(dir.path()), Err(DetectError::Ambiguous(_, _))));
}
