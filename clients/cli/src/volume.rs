//! `gpux volume`: a renter's named, sized folders in the exchange's store,
//! mounted into leases with `gpux run --volume NAME:/PATH[:ro]`
//! (docs/storage.md).

use std::path::{Path, PathBuf};

use gpux_protocol::{ClientMessage, ServerMessage, VolumeInfo};

use crate::session::Session;
use crate::{Failure, VolumeAction};

pub async fn volume_action(s: &mut Session, action: VolumeAction, json: bool) -> Result<(), Failure> {
    match action {
        VolumeAction::Create { name, size_gib } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Volume { volume, .. }) =
                (json, s.ask(ClientMessage::CreateVolume { id, name, size_gib }, json).await?)
            {
                out!(
                    "volume {} ({} GiB) created; mount it with `gpux run --volume {}:/data ...`",
                    volume.name,
                    volume.size_gib,
                    volume.name
                );
            }
            Ok(())
        }
        VolumeAction::List => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Volumes { volumes, .. }) = (json, s.ask(ClientMessage::Volumes { id }, json).await?) {
                if volumes.is_empty() {
                    out!("no volumes: `gpux volume create NAME --size-gib N` makes one");
                }
                for volume in &volumes {
                    out!("{}", describe(volume));
                }
            }
            Ok(())
        }
        VolumeAction::Delete { name } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Volume { volume, .. }) = (json, s.ask(ClientMessage::DeleteVolume { id, name }, json).await?) {
                out!("volume {} deleted: its files leave the store", volume.name);
            }
            Ok(())
        }
        VolumeAction::Ls { name } => ls(s, &name, json).await,
        VolumeAction::Cp { from, to } => cp(s, &from, &to, json).await,
    }
}

/// One line about a volume: name, size, who holds it.
fn describe(volume: &VolumeInfo) -> String {
    let mut held = Vec::new();
    if let Some(lease) = volume.writer {
        held.push(format!("written by lease {}", lease.0));
    }
    if let Some(order) = volume.writer_bid {
        held.push(format!("claimed by bid {order}"));
    }
    if !volume.readers.is_empty() {
        let readers: Vec<String> = volume.readers.iter().map(|l| l.0.to_string()).collect();
        held.push(format!("read by lease(s) {}", readers.join(", ")));
    }
    let held = if held.is_empty() { "free".to_string() } else { held.join("; ") };
    let mut line = format!("{}  {} GiB  {held}  charged {}", volume.name, volume.size_gib, crate::money::amount(volume.charged_minor));
    if let (Some(read_only), Some(delete)) = (volume.read_only_from_ms, volume.delete_from_ms) {
        line.push_str(&format!(
            "  UNPAID: read-only from {}, deleted from {} (deposit to repay the debt)",
            crate::clock::when(read_only),
            crate::clock::when(delete)
        ));
    }
    line
}

/// The account's token for volume `name`, the store's URL and the
/// volume's prefix in it.
async fn token(s: &mut Session, name: &str) -> Result<(String, String, String), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::Volumes { volumes, .. } = s.ask(ClientMessage::Volumes { id }, false).await? else {
        return Err(Failure::Unreachable("expected volumes".into()));
    };
    let volume = volumes.into_iter().find(|v| v.name == name).ok_or_else(|| Failure::Refused(format!("no volume called {name}")))?;
    let id = s.connection.new_id();
    let message = ClientMessage::JobStoreToken { id, job: None, lease: None, volume: Some(name.to_string()) };
    match s.ask(message, false).await? {
        ServerMessage::JobStoreToken { url, token, .. } => Ok((url, token, format!("{}/volumes/{}", volume.owner.0, volume.volume.0))),
        other => Err(Failure::Unreachable(format!("expected job_store_token, got {other:?}"))),
    }
}

#[derive(serde::Deserialize, serde::Serialize)]
struct Listed {
    key: String,
    bytes: u64,
}

fn http() -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .map_err(|e| Failure::Unreachable(format!("HTTP client: {e}")))
}

async fn list(client: &reqwest::Client, url: &str, token: &str, prefix: &str) -> Result<Vec<Listed>, Failure> {
    let answer = gpux_client::store::send(url, &format!("/v1/list/{prefix}"), |to| client.get(to).bearer_auth(token))
        .await
        .map_err(|e| Failure::Unreachable(format!("the store at {url}: {e}")))?;
    if !answer.status().is_success() {
        let status = answer.status();
        return Err(Failure::Refused(format!("the store refused the listing ({status}): {}", answer.text().await.unwrap_or_default())));
    }
    let body = answer.bytes().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| Failure::Unreachable(format!("the store's listing: {e}")))
}

/// `gpux volume ls NAME`: its files, with their sizes.
async fn ls(s: &mut Session, name: &str, json: bool) -> Result<(), Failure> {
    let (url, token, prefix) = token(s, name).await?;
    let files = list(&http()?, &url, &token, &prefix).await?;
    let files: Vec<Listed> = files
        .into_iter()
        .filter_map(|f| f.key.strip_prefix(&format!("{prefix}/")).map(|k| Listed { key: k.to_string(), bytes: f.bytes }))
        .collect();
    if json {
        out!("{}", serde_json::to_string(&files).unwrap_or_default());
        return Ok(());
    }
    for file in &files {
        out!("{:>12}  {}", file.bytes, file.key);
    }
    out!("{} file(s), {} bytes", files.len(), files.iter().map(|f| f.bytes).sum::<u64>());
    Ok(())
}

/// `NAME:PATH` names a path in a volume; anything else is a local path.
fn in_volume(side: &str) -> Option<(&str, &str)> {
    let (name, path) = side.split_once(':')?;
    gpux_protocol::volumes::name_valid(name).then_some((name, path.trim_matches('/')))
}

/// `gpux volume cp FROM TO`: a local file or folder into a volume
/// (`NAME:PATH`), or a volume's file or folder out of it.
async fn cp(s: &mut Session, from: &str, to: &str, json: bool) -> Result<(), Failure> {
    let client = http()?;
    match (in_volume(from), in_volume(to)) {
        (None, Some((name, at))) => {
            let (url, token, prefix) = token(s, name).await?;
            let local = PathBuf::from(from);
            let files = local_files(&local)?;
            let mut bytes = 0u64;
            for (relative, path) in &files {
                let key = [prefix.as_str(), at, relative.as_str()].iter().filter(|p| !p.is_empty()).copied().collect::<Vec<_>>().join("/");
                let body = std::fs::read(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
                bytes += body.len() as u64;
                let put = |to: &str| client.put(to).bearer_auth(&token).body(body.clone());
                let answer = gpux_client::store::send(&url, &format!("/v1/objects/{key}"), put)
                    .await
                    .map_err(|e| Failure::Unreachable(format!("the store at {url}: {e}")))?;
                if !answer.status().is_success() {
                    let status = answer.status();
                    return Err(Failure::Refused(format!(
                        "the store refused {relative} ({status}): {}",
                        answer.text().await.unwrap_or_default()
                    )));
                }
            }
            if !json {
                out!("{} file(s), {bytes} bytes into volume {name}", files.len());
            }
            Ok(())
        }
        (Some((name, at)), None) => {
            let (url, token, prefix) = token(s, name).await?;
            let base = if at.is_empty() { prefix.clone() } else { format!("{prefix}/{at}") };
            let files: Vec<Listed> = list(&client, &url, &token, &prefix)
                .await?
                .into_iter()
                .filter(|f| f.key == base || f.key.starts_with(&format!("{base}/")))
                .collect();
            if files.is_empty() {
                return Err(Failure::Refused(format!("nothing at {from}")));
            }
            let single = files.len() == 1 && files[0].key == base;
            let mut bytes = 0u64;
            for file in &files {
                let target = match single {
                    true => PathBuf::from(to),
                    false => Path::new(to).join(file.key.strip_prefix(&format!("{base}/")).unwrap_or(&file.key)),
                };
                let answer = gpux_client::store::send(&url, &format!("/v1/objects/{}", file.key), |to| client.get(to).bearer_auth(&token))
                    .await
                    .map_err(|e| Failure::Unreachable(format!("the store at {url}: {e}")))?;
                if !answer.status().is_success() {
                    return Err(Failure::Refused(format!("the store refused {} ({})", file.key, answer.status())));
                }
                let body = answer.bytes().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
                if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent).map_err(|e| Failure::Usage(format!("{}: {e}", parent.display())))?;
                }
                std::fs::write(&target, &body).map_err(|e| Failure::Usage(format!("{}: {e}", target.display())))?;
                bytes += body.len() as u64;
            }
            if !json {
                out!("{} file(s), {bytes} bytes from volume {name}", files.len());
            }
            Ok(())
        }
        _ => Err(Failure::Usage("one side of `gpux volume cp` is a volume path NAME:PATH, the other a local path".into())),
    }
}

/// A local file (its own name) or a folder's files (by their path in it).
fn local_files(path: &Path) -> Result<Vec<(String, PathBuf)>, Failure> {
    let meta = std::fs::metadata(path).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    if meta.is_file() {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        return Ok(vec![(name, path.to_path_buf())]);
    }
    let mut found = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).map_err(|e| Failure::Usage(format!("{}: {e}", dir.display())))? {
            let entry = entry.map_err(|e| Failure::Usage(e.to_string()))?;
            let kind = entry.file_type().map_err(|e| Failure::Usage(e.to_string()))?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                let relative =
                    entry.path().strip_prefix(path).map_err(|e| Failure::Usage(e.to_string()))?.to_string_lossy().replace('\\', "/");
                found.push((relative, entry.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}
