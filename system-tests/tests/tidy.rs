//! Tidy: what docs/ARCHITECTURE.md says of the crates ("Crate boundaries",
//! "Invariants"), checked against the manifests and the source, as
//! rust-analyzer's tidy tests do. It fails when a dependency points up a
//! layer, when a crate starts to know redb, bincode or WebSocket that the
//! map says does not, when a pure crate gains I/O, when a manifest names a
//! dependency its code never uses, or when the map leaves out a crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The layers of docs/ARCHITECTURE.md "Crate boundaries", bottom first: a
/// crate depends only on crates of lower layers.
const LAYERS: &[&[&str]] = &[
    &["gpux-engine"],
    &["gpux-protocol"],
    &["gpux-settlement", "gpux-client", "gpux-gateway", "gpux-jobs"],
    &["gpux-market", "gpux-supplier-agent", "gpux-cli", "gpux-router"],
    &["gpux-journal", "gpux-sim"],
    &["gpux-replica", "gpux-audit"],
    &["gpux-exchange"],
    &["gpux-test-exchange"],
    &["gpux-benches", "gpux-system-tests"],
];

/// A crate allowed to know a dependency, and the only files of its code
/// that use it (`None`: any file of the crate).
type Knower = (&'static str, Option<&'static [&'static str]>);

/// Who may know what (docs/ARCHITECTURE.md "Invariants"): the dependency,
/// the path its code is used by, and the crates whose manifests name it.
const KNOWS: &[(&str, &str, &[Knower])] = &[
    (
        "redb",
        "redb::",
        &[
            ("gpux-journal", None),
            ("gpux-replica", Some(&["replica/src/log_store.rs", "replica/src/state_machine.rs"])),
            (
                "gpux-exchange",
                Some(&["exchange/src/snapshots/mod.rs", "exchange/src/snapshots/tests.rs", "exchange/src/sequencer/tests.rs"]),
            ),
            ("gpux-benches", None),
        ],
    ),
    (
        "bincode",
        "bincode::",
        &[
            ("gpux-protocol", Some(&["protocol/src/record.rs", "protocol/src/usage.rs"])),
            ("gpux-gateway", Some(&["gateway/src/wire.rs"])),
            ("gpux-replica", Some(&["replica/src/lib.rs"])),
        ],
    ),
    ("tokio-tungstenite", "tokio_tungstenite::", &[("gpux-gateway", None), ("gpux-client", None), ("gpux-benches", None)]),
];

/// The engine's only dependencies.
const ENGINE_DEPENDENCIES: &[&str] = &["rustc-hash", "serde", "thiserror"];

/// What the pure crates (no I/O, no clock, no thread) must never write.
const PURE: &[&str] = &["gpux-engine", "gpux-settlement", "gpux-market"];
/// (`std::net`'s address types are pure values: its sockets are not.)
const IMPURE: &[&str] =
    &["std::fs", "TcpStream", "TcpListener", "UdpSocket", "std::thread", "std::process", "SystemTime", "Instant::now", "tokio::"];

struct Crate {
    name: String,
    dir: PathBuf,
    /// `[dependencies]` (not dev or build), as the manifest names them.
    dependencies: BTreeSet<String>,
    /// Those marked optional (used behind a feature).
    optional: BTreeSet<String>,
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn crates() -> Vec<Crate> {
    let root: toml::Table = read(&Path::new(ROOT).join("Cargo.toml")).parse().expect("the workspace manifest");
    let members = root["workspace"]["members"].as_array().expect("members");
    members
        .iter()
        .map(|member| {
            let dir = Path::new(ROOT).join(member.as_str().expect("a path"));
            let manifest: toml::Table = read(&dir.join("Cargo.toml")).parse().expect("a manifest");
            let name = manifest["package"]["name"].as_str().expect("a name").to_string();
            let table = manifest.get("dependencies").and_then(|d| d.as_table()).cloned().unwrap_or_default();
            let optional = table
                .iter()
                .filter(|(_, spec)| spec.get("optional").and_then(|o| o.as_bool()) == Some(true))
                .map(|(dep, _)| dep.clone())
                .collect();
            Crate { name, dir, dependencies: table.keys().cloned().collect(), optional }
        })
        .collect()
}

/// Every `.rs` file under `dir`'s `src`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() && path.file_name().is_some_and(|n| n != "target" && n != "fixtures") {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dir.join("src"), &mut out);
    out.sort();
    out
}

fn relative(path: &Path) -> String {
    path.strip_prefix(Path::new(ROOT)).unwrap_or(path).to_string_lossy().replace("/../", "/").trim_start_matches('/').to_string()
}

#[test]
fn dependencies_point_down_the_layers() {
    let layer: BTreeMap<&str, usize> = LAYERS.iter().enumerate().flat_map(|(i, names)| names.iter().map(move |n| (*n, i))).collect();
    let crates = crates();
    let mut wrong = Vec::new();
    for krate in &crates {
        let Some(&mine) = layer.get(krate.name.as_str()) else {
            wrong.push(format!("{} is in no layer of docs/ARCHITECTURE.md \"Crate boundaries\"", krate.name));
            continue;
        };
        for dependency in krate.dependencies.iter().filter(|d| d.starts_with("gpux-")) {
            match layer.get(dependency.as_str()) {
                Some(&theirs) if theirs < mine => {}
                _ => wrong.push(format!("{} -> {dependency} does not point down", krate.name)),
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    assert_eq!(crates.len(), layer.len(), "every layered crate is a workspace member");
}

#[test]
fn only_the_named_crates_and_files_know_redb_bincode_and_websocket() {
    let crates = crates();
    let mut wrong = Vec::new();
    for (dependency, path, allowed) in KNOWS {
        let allowed: BTreeMap<&str, Option<&[&str]>> = allowed.iter().copied().collect();
        for krate in &crates {
            let named = krate.dependencies.contains(*dependency);
            match allowed.get(krate.name.as_str()) {
                None if named => wrong.push(format!("{} depends on {dependency}", krate.name)),
                None => {}
                Some(files) => {
                    for file in sources(&krate.dir) {
                        let relative = relative(&file);
                        if read(&file).contains(path) && files.is_some_and(|files| !files.contains(&relative.as_str())) {
                            wrong.push(format!("{relative} uses {dependency}"));
                        }
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn the_pure_crates_do_no_io_and_the_engine_depends_on_little() {
    let crates = crates();
    let engine = crates.iter().find(|c| c.name == "gpux-engine").expect("the engine");
    let expected: BTreeSet<String> = ENGINE_DEPENDENCIES.iter().map(|d| d.to_string()).collect();
    assert_eq!(engine.dependencies, expected, "the engine's dependencies (docs/ARCHITECTURE.md)");
    let mut wrong = Vec::new();
    for krate in crates.iter().filter(|c| PURE.contains(&c.name.as_str())) {
        for file in sources(&krate.dir) {
            let text = read(&file);
            for impure in IMPURE.iter().filter(|i| text.contains(**i)) {
                wrong.push(format!("{} writes {impure}", relative(&file)));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// A dependency its crate's code (src, and build.rs) never names is dead
/// weight in every build; tests and examples take theirs from
/// `[dev-dependencies]`.
#[test]
fn every_dependency_is_used() {
    let mut unused = Vec::new();
    for krate in crates() {
        let mut text: String = sources(&krate.dir).iter().map(|f| read(f)).collect();
        if let Ok(build) = std::fs::read_to_string(krate.dir.join("build.rs")) {
            text.push_str(&build);
        }
        for dependency in krate.dependencies.iter().filter(|d| !krate.optional.contains(*d)) {
            let ident = dependency.replace('-', "_");
            let used = [format!("{ident}::"), format!("use {ident}"), format!("{ident}!"), format!("extern crate {ident}")]
                .iter()
                .any(|pattern| text.contains(pattern.as_str()));
            if !used {
                unused.push(format!("{}: {dependency}", krate.name));
            }
        }
    }
    assert!(unused.is_empty(), "named in [dependencies] but never used: {unused:#?}");
}

/// docs/ARCHITECTURE.md's code map has one row per crate, in one table, and
/// its invariants name every crate allowed to know redb, bincode and
/// WebSocket.
#[test]
fn the_architecture_map_names_every_crate_and_who_knows_what() {
    let doc = read(&Path::new(ROOT).join("docs/ARCHITECTURE.md"));
    let map_start = doc.find("## Code map").expect("a code map");
    let table: Vec<&str> = doc[map_start..].lines().skip_while(|l| !l.starts_with('|')).take_while(|l| l.starts_with('|')).collect();
    for krate in crates() {
        let dir = relative(&krate.dir);
        let row = format!("| `{}` (`{dir}/`)", krate.name);
        assert!(table.iter().any(|line| line.starts_with(&row)), "no row {row} in the code map's table");
    }
    for (dependency, _, allowed) in KNOWS {
        let line = doc
            .lines()
            .find(|l| l.starts_with("- Only") && l.contains(&format!("know {dependency}")))
            .unwrap_or_else(|| panic!("an invariant line \"- Only ... know {dependency}\""));
        for (krate, _) in allowed.iter() {
            assert!(line.contains(&format!("`{krate}`")), "\"{line}\" leaves out `{krate}`");
        }
    }
}

/// Every source file under every crate's `src/`, its binaries' included.
fn all_sources() -> Vec<PathBuf> {
    crates().iter().flat_map(|krate| sources(&krate.dir)).collect()
}

/// Nothing below `main` exits the process (docs/ARCHITECTURE.md
/// "Invariants"): `process::exit` only in a binary's root.
#[test]
fn only_a_binarys_root_exits_the_process() {
    let exits: Vec<String> = all_sources()
        .into_iter()
        .filter(|path| read(path).contains("process::exit"))
        .filter(|path| {
            let root = path.file_name().is_some_and(|n| n == "main.rs");
            let bin = path.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "bin");
            !(root || bin)
        })
        .map(|path| relative(&path))
        .collect();
    assert!(exits.is_empty(), "process::exit below main: {exits:?}");
}

/// The only `&mut self` methods of `MarketState`: `apply`, and the two
/// exceptions docs/ARCHITECTURE.md names ("Invariants").
const MARKET_STATE_MUTATORS: &[&str] = &["advance_clock", "apply", "mark_report_checked"];

#[test]
fn the_market_changes_only_through_apply_and_its_named_exceptions() {
    let text = read(&Path::new(ROOT).join("market/src/lib.rs"));
    let start = text.find("impl MarketState {").expect("impl MarketState");
    let body = &text[start..];
    // The impl block: up to the first line that closes it at column 0.
    let body = &body[..body.find("\n}\n").expect("the impl's end")];
    let mut public: Vec<&str> = body
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("pub fn "))
        .filter(|rest| rest.contains("(&mut self"))
        .map(|rest| rest.split(['(', '<']).next().expect("a name"))
        .collect();
    public.sort_unstable();
    assert_eq!(public, MARKET_STATE_MUTATORS, "MarketState's public &mut self methods (docs/ARCHITECTURE.md Invariants)");
    let market = Path::new(ROOT).join("market");
    let impls: usize = sources(&market).iter().map(|path| read(path).matches("impl MarketState").count()).sum();
    assert_eq!(impls, 1, "one impl block of MarketState in the market crate, so this check sees every method");
}

/// docs/ARCHITECTURE.md names every source file (by its path under its
/// crate's `src/` or its file name), so a newcomer finds each in the map.
#[test]
fn the_architecture_map_names_every_source_file() {
    let doc = read(&Path::new(ROOT).join("docs/ARCHITECTURE.md"));
    let mut unnamed = Vec::new();
    for krate in crates() {
        let src = krate.dir.join("src");
        for path in sources(&krate.dir) {
            let inside = path.strip_prefix(&src).expect("under src").to_string_lossy().to_string();
            let name = path.file_name().expect("a name").to_string_lossy().to_string();
            if !doc.contains(&inside) && !doc.contains(&format!("`{name}`")) {
                unnamed.push(relative(&path));
            }
        }
    }
    assert!(unnamed.is_empty(), "source files docs/ARCHITECTURE.md does not name: {unnamed:?}");
}
