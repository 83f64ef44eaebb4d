//! Which framework a code directory was written for, and its declared
//! dependencies (docs/jobs.md "Framework detection"). Declarations win:
//! requirements.txt (with `-r` includes), pyproject.toml (PEP 621
//! `project.dependencies` and Poetry's table), environment.yml (conda and
//! its `pip:` list) and setup.py's `install_requires`; when none declares a
//! framework, the imports of the directory's Python files decide. Two
//! frameworks declared are told apart by which the code imports more; a tie
//! is an error that asks the renter to say (`code.framework`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Python files read for imports at most, and bytes of any one file read.
pub const FILES_SCANNED_MAX: usize = 2_000;
pub const FILE_BYTES_MAX: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    Pytorch,
    Tensorflow,
    Paddlepaddle,
    Jax,
}

impl Framework {
    pub const ALL: [Framework; 4] = [Framework::Pytorch, Framework::Tensorflow, Framework::Paddlepaddle, Framework::Jax];

    pub fn name(self) -> &'static str {
        match self {
            Framework::Pytorch => "pytorch",
            Framework::Tensorflow => "tensorflow",
            Framework::Paddlepaddle => "paddlepaddle",
            Framework::Jax => "jax",
        }
    }

    /// The framework a distribution name installs, if any (`torch`,
    /// `tensorflow-gpu`, `paddlepaddle-gpu`, `jax[cuda12]` ...).
    pub fn of_package(name: &str) -> Option<Framework> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        let base = name.split('[').next().unwrap_or("");
        match base {
            "torch" | "pytorch" => Some(Framework::Pytorch),
            "tensorflow" | "tensorflow-gpu" | "tensorflow-cpu" | "tf-nightly" | "tensorflow-rocm" => Some(Framework::Tensorflow),
            "paddlepaddle" | "paddlepaddle-gpu" => Some(Framework::Paddlepaddle),
            "jax" | "jaxlib" => Some(Framework::Jax),
            _ => None,
        }
    }

    /// The module its code imports.
    fn module(self) -> &'static str {
        match self {
            Framework::Pytorch => "torch",
            Framework::Tensorflow => "tensorflow",
            Framework::Paddlepaddle => "paddle",
            Framework::Jax => "jax",
        }
    }
}

/// One declared dependency: a distribution name and what it asks of the
/// version (`==2.1.0`, `>=2.0`, `^2.1`, `=2.1` for conda; empty: any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub name: String,
    pub version: String,
    /// Where it was declared (`requirements.txt:3`).
    pub source: String,
}

impl Requirement {
    /// The first version number the constraint names (`2.1.0` of `>=2.1.0,<3`).
    pub fn version_number(&self) -> Option<&str> {
        let start = self.version.find(|c: char| c.is_ascii_digit())?;
        let rest = &self.version[start..];
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        Some(rest[..end].trim_end_matches('.'))
    }

    /// Whether the constraint pins a version (==, ~=, ^, conda's =) rather
    /// than a floor (>=) or nothing.
    pub fn pins(&self) -> bool {
        let v = self.version.trim_start();
        (v.starts_with("==")
            || v.starts_with("~=")
            || v.starts_with('^')
            || v.starts_with('~')
            || (v.starts_with('=') && !v.starts_with("=>")))
            || v.chars().next().is_some_and(|c| c.is_ascii_digit())
    }
}

/// What detection found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Detection {
    pub framework: Option<Framework>,
    /// The framework's own requirement, when declared.
    pub framework_requirement: Option<Requirement>,
    /// Why: `requirements.txt:3 torch==2.1.0`, or `imports: torch in 4 files`.
    pub evidence: String,
    /// Every dependency declared, in the order found (what the image lacks
    /// is installed at start).
    pub requirements: Vec<Requirement>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DetectError {
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("reading {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("the code declares {0} and {1} and imports both as much: say which with code.framework")]
    Ambiguous(&'static str, &'static str),
}

/// Detects the framework of the code in `dir`.
pub fn detect(dir: &Path) -> Result<Detection, DetectError> {
    if !dir.is_dir() {
        return Err(DetectError::NotADirectory(dir.to_path_buf()));
    }
    let mut requirements = Vec::new();
    let read = |name: &str| -> Result<Option<String>, DetectError> {
        let path = dir.join(name);
        if !path.is_file() {
            return Ok(None);
        }
        read_bounded(&path).map(Some)
    };
    if let Some(text) = read("requirements.txt")? {
        requirements_txt(dir, "requirements.txt", &text, 0, &mut requirements)?;
    }
    if let Some(text) = read("pyproject.toml")? {
        pyproject(&text, &mut requirements);
    }
    for name in ["environment.yml", "environment.yaml"] {
        if let Some(text) = read(name)? {
            environment_yml(name, &text, &mut requirements);
        }
    }
    if let Some(text) = read("setup.py")? {
        setup_py(&text, &mut requirements);
    }
    let imports = imports(dir)?;
    let mut declared: Vec<(Framework, Requirement)> = Vec::new();
    for requirement in &requirements {
        if let Some(framework) = Framework::of_package(&requirement.name) {
            if !declared.iter().any(|(f, _)| *f == framework) {
                declared.push((framework, requirement.clone()));
            }
        }
    }
    let imported = |framework: Framework| imports.get(&framework).copied().unwrap_or(0);
    let (framework, framework_requirement, evidence) = match declared.as_slice() {
        [] => {
            let most = Framework::ALL.into_iter().filter(|f| imported(*f) > 0).max_by_key(|f| imported(*f));
            match most {
                None => (None, None, "no framework declared or imported".to_string()),
                Some(framework) => {
                    let ties: Vec<Framework> = Framework::ALL.into_iter().filter(|f| imported(*f) == imported(framework)).collect();
                    if ties.len() > 1 {
                        return Err(DetectError::Ambiguous(ties[0].name(), ties[1].name()));
                    }
                    (Some(framework), None, format!("imports: {} in {} file(s)", framework.module(), imported(framework)))
                }
            }
        }
        [(framework, requirement)] => (Some(*framework), Some(requirement.clone()), describe(requirement)),
        several => {
            let mut ranked: Vec<&(Framework, Requirement)> = several.iter().collect();
            ranked.sort_by_key(|(f, _)| std::cmp::Reverse(imported(*f)));
            if imported(ranked[0].0) == imported(ranked[1].0) {
                return Err(DetectError::Ambiguous(ranked[0].0.name(), ranked[1].0.name()));
            }
            let (framework, requirement) = ranked[0];
            let evidence = format!(
                "{} (imported in {} file(s), more than the other declared frameworks)",
                describe(requirement),
                imported(*framework)
            );
            (Some(*framework), Some(requirement.clone()), evidence)
        }
    };
    Ok(Detection { framework, framework_requirement, evidence, requirements })
}

fn describe(requirement: &Requirement) -> String {
    format!("{} {}{}", requirement.source, requirement.name, requirement.version)
}

fn read_bounded(path: &Path) -> Result<String, DetectError> {
    use std::io::Read;
    let error = |reason: String| DetectError::Read { path: path.to_path_buf(), reason };
    let file = std::fs::File::open(path).map_err(|e| error(e.to_string()))?;
    let mut text = String::new();
    file.take(FILE_BYTES_MAX).read_to_string(&mut text).map_err(|e| error(e.to_string()))?;
    Ok(text)
}

/// A PEP 508 line: `name[extras] (op version)... ; marker`.
fn requirement_line(line: &str, source: String) -> Option<Requirement> {
    let line = line.split(';').next()?.trim();
    if line.is_empty() || line.starts_with('-') || line.contains("://") {
        return None;
    }
    let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '[' | ']' | ','))).unwrap_or(line.len());
    let name = line[..end].split('[').next()?.trim().to_string();
    if name.is_empty() {
        return None;
    }
    let version = line[end..].trim().trim_start_matches('(').trim_end_matches(')').replace(' ', "");
    Some(Requirement { name, version, source })
}

fn requirements_txt(dir: &Path, name: &str, text: &str, depth: u32, out: &mut Vec<Requirement>) -> Result<(), DetectError> {
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split(" #").next().unwrap_or("").trim();
        if line.starts_with('#') {
            continue;
        }
        if let Some(include) = line.strip_prefix("-r ").or_else(|| line.strip_prefix("--requirement ")) {
            // Includes stay inside the directory, three deep at most.
            let path = dir.join(include.trim());
            if depth < 3 && !include.contains("..") && path.is_file() {
                let text = read_bounded(&path)?;
                requirements_txt(dir, include.trim(), &text, depth + 1, out)?;
            }
            continue;
        }
        if let Some(requirement) = requirement_line(line, format!("{name}:{}", index + 1)) {
            out.push(requirement);
        }
    }
    Ok(())
}

fn pyproject(text: &str, out: &mut Vec<Requirement>) {
    let Ok(document) = text.parse::<toml::Table>() else { return };
    let project_dependencies = document.get("project").and_then(|p| p.get("dependencies")).and_then(|d| d.as_array());
    for item in project_dependencies.into_iter().flatten() {
        if let Some(requirement) = item.as_str().and_then(|line| requirement_line(line, "pyproject.toml [project]".into())) {
            out.push(requirement);
        }
    }
    let poetry = document.get("tool").and_then(|t| t.get("poetry")).and_then(|p| p.get("dependencies")).and_then(|d| d.as_table());
    for (name, value) in poetry.into_iter().flatten() {
        if name == "python" {
            continue;
        }
        let version = match value {
            toml::Value::String(version) => version.clone(),
            toml::Value::Table(table) => table.get("version").and_then(|v| v.as_str()).unwrap_or("").to_string(),
            _ => String::new(),
        };
        let version = if version == "*" { String::new() } else { version };
        out.push(Requirement { name: name.clone(), version, source: "pyproject.toml [tool.poetry]".into() });
    }
}

/// The `dependencies:` list of a conda environment file, and its `pip:`
/// list (read line by line: detection needs names and versions only).
fn environment_yml(name: &str, text: &str, out: &mut Vec<Requirement>) {
    let mut in_dependencies = false;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        if !line.starts_with(' ') && !line.starts_with('-') && !line.trim().is_empty() {
            in_dependencies = line.trim_end() == "dependencies:";
            continue;
        }
        let Some(item) = line.trim().strip_prefix("- ") else { continue };
        if !in_dependencies || item.trim_end().ends_with(':') {
            continue;
        }
        // conda's `name=version=build`, `channel::name`; pip's PEP 508.
        let item = item.trim().rsplit("::").next().unwrap_or("");
        let conda = !item.contains("==") && !item.contains(">=") && !item.contains("<") && item.contains('=');
        let requirement = if conda {
            let mut parts = item.splitn(3, '=');
            let package = parts.next().unwrap_or("").trim().to_string();
            let version = parts.next().map(|v| format!("={}", v.trim())).unwrap_or_default();
            Some(Requirement { name: package, version, source: format!("{name}:{}", index + 1) })
        } else {
            requirement_line(item, format!("{name}:{}", index + 1))
        };
        out.extend(requirement.filter(|r| r.name != "python" && r.name != "pip"));
    }
}

/// The string literals of setup.py's `install_requires=[...]`.
fn setup_py(text: &str, out: &mut Vec<Requirement>) {
    let Some(start) = text.find("install_requires") else { return };
    let rest = &text[start..];
    let Some(open) = rest.find('[') else { return };
    // The string literals up to the list's closing bracket (brackets inside
    // a literal, as in `jax[cuda12]`, are the literal's).
    let mut quote = None;
    let mut literal = String::new();
    for c in rest[open + 1..].chars() {
        match (quote, c) {
            (None, ']') => break,
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => {
                if let Some(requirement) = requirement_line(&literal, "setup.py install_requires".into()) {
                    out.push(requirement);
                }
                literal.clear();
                quote = None;
            }
            (Some(_), c) => literal.push(c),
            (None, _) => {}
        }
    }
}

/// How many Python files import each framework (hidden directories,
/// virtual environments and site-packages are skipped).
fn imports(dir: &Path) -> Result<BTreeMap<Framework, usize>, DetectError> {
    let mut counts = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    let mut scanned = 0;
    while let Some(next) = pending.pop() {
        let entries = std::fs::read_dir(&next).map_err(|e| DetectError::Read { path: next.clone(), reason: e.to_string() })?;
        let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with('.') || matches!(name, "venv" | "env" | "site-packages" | "node_modules" | "__pycache__") {
                continue;
            }
            if path.is_dir() {
                pending.push(path);
            } else if name.ends_with(".py") && scanned < FILES_SCANNED_MAX {
                scanned += 1;
                let text = read_bounded(&path)?;
                for framework in Framework::ALL {
                    if imports_module(&text, framework.module()) {
                        *counts.entry(framework).or_insert(0) += 1;
                    }
                }
            }
        }
    }
    Ok(counts)
}

fn imports_module(text: &str, module: &str) -> bool {
    text.lines().map(str::trim_start).any(|line| {
        let names = |rest: &str| {
            rest.split(',').any(|part| part.split_whitespace().next().is_some_and(|m| m == module || m.starts_with(&format!("{module}."))))
        };
        match (line.strip_prefix("import "), line.strip_prefix("from ")) {
            (Some(rest), _) => names(rest),
            (_, Some(rest)) => rest.split_whitespace().next().is_some_and(|m| m == module || m.starts_with(&format!("{module}."))),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn import_lines_are_read_as_python_reads_them() {
        assert!(imports_module("import torch\n", "torch"));
        assert!(imports_module("import os, torch.nn as nn\n", "torch"));
        assert!(imports_module("    from jax import numpy as jnp\n", "jax"));
        assert!(!imports_module("import torchvision\n", "torch"));
        assert!(!imports_module("# import torch\nprint('torch')\n", "torch"));
    }

    #[test]
    fn requirement_lines_keep_name_and_constraint() {
        let r = requirement_line("torch==2.1.0 ; python_version >= '3.8'", "x".into()).expect("a requirement");
        assert_eq!((r.name.as_str(), r.version.as_str(), r.version_number(), r.pins()), ("torch", "==2.1.0", Some("2.1.0"), true));
        let r = requirement_line("jax[cuda12]>=0.4.20", "x".into()).expect("a requirement");
        assert_eq!((r.name.as_str(), r.version_number(), r.pins()), ("jax", Some("0.4.20"), false));
        assert_eq!(requirement_line("--index-url https://x", "x".into()), None);
    }
}
