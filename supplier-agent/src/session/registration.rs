//! Registering the host's GPUs: every GPU the exchange does not know yet,
//! then the host's GPUs as the exchange sees them (their classes, health
//! and region).

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use gpux_client::Connection;
use gpux_engine::RejectCode;
use gpux_protocol::{ClientMessage, ServerMessage};

use super::host::{Host, HostGpu, Window};
use super::Fatal;
use crate::backend::{GpuBackend, GpuInventory};
use crate::config::AgentConfig;
use crate::limits::REGISTER_AGAIN_AFTER;

/// Registers every GPU the exchange does not know yet, then loads the
/// host's GPUs as the exchange sees them. When to try again (GPUs the
/// exchange would not register yet: `gpus_awaiting_challenge`), if ever.
pub(super) async fn register(
    config: &AgentConfig,
    backend: &mut dyn GpuBackend,
    host: &mut Host,
    connection: &mut Connection,
) -> Result<Option<tokio::time::Instant>> {
    let inventory = backend.inventory()?;
    let known = my_gpus(connection).await?;
    let mut again_at = None;
    for gpu in &inventory {
        if known.iter().any(|k| k.uuid == gpu.uuid) {
            continue;
        }
        let id = connection.new_id();
        let request = ClientMessage::RegisterGpu {
            id,
            host: config.host.clone(),
            gpu_uuid: gpu.uuid.clone(),
            spec: gpu.spec.clone(),
            region: config.region.clone(),
            zone: config.zone.clone(),
            fabric: config.fabric.as_ref().map(|f| f.claim()),
        };
        let answer = connection.request(request).await?;
        if registered(config, gpu, answer)? {
            again_at = Some(tokio::time::Instant::now() + REGISTER_AGAIN_AFTER);
        }
    }
    let on_host: BTreeSet<&str> = inventory.iter().map(|g| g.uuid.as_str()).collect();
    let registered: Vec<gpux_protocol::views::Gpu> = my_gpus(connection)
        .await?
        .into_iter()
        .filter(|info| info.host_name == config.host && on_host.contains(info.uuid.as_str()))
        .collect();
    check_region(config, registered.first())?;
    for info in registered {
        match host.gpus.iter_mut().find(|g| g.info.uuid == info.uuid) {
            Some(gpu) => gpu.info = info,
            None => host.gpus.push(HostGpu {
                healthy: info.online,
                delivery_failed: false,
                info,
                window: Window::default(),
                unhealthy_since: None,
            }),
        }
    }
    Ok(again_at)
}

/// What the exchange answered to registering `gpu`: a GPU it refuses is
/// logged and left unoffered; a region it refuses stops the agent. Whether
/// to try again later.
fn registered(config: &AgentConfig, gpu: &GpuInventory, answer: ServerMessage) -> Result<bool> {
    match answer {
        ServerMessage::Ack { .. } => tracing::info!(uuid = %gpu.uuid, model = %gpu.spec.model, "registered"),
        ServerMessage::Reject { code: RejectCode::GpuNotQualified, .. } => {
            tracing::warn!(uuid = %gpu.uuid, model = %gpu.spec.model, "meets no listed class; not offered")
        }
        ServerMessage::Reject { code: RejectCode::GpusAwaitingChallenge, .. } => {
            tracing::warn!(
                uuid = %gpu.uuid,
                "not registered yet: this account's GPUs that have not passed a hardware challenge are at their limit; trying again in a minute"
            );
            return Ok(true);
        }
        ServerMessage::Reject { code: RejectCode::TooManyGpus, .. } => {
            tracing::warn!(uuid = %gpu.uuid, "not registered: this account holds its share of the exchange's GPUs; not offered")
        }
        ServerMessage::Reject { code: RejectCode::UnknownRegion, .. } => {
            let region = config.region.as_deref().unwrap_or_default();
            return Err(Fatal(format!("region {region:?} is not one the exchange lists (gpux listing shows its regions)")).into());
        }
        ServerMessage::Reject { code: RejectCode::RegionMismatch, .. } => {
            let host = &config.host;
            return Err(Fatal(format!(
                "host {host:?} is registered in another region; a host keeps its region (set region back, or register the moved machine under a new host name)"
            ))
            .into());
        }
        other => return Err(Fatal(format!("registering {}: {other:?}", gpu.uuid)).into()),
    }
    Ok(false)
}

/// A host keeps the region its GPUs were registered in.
fn check_region(config: &AgentConfig, first: Option<&gpux_protocol::views::Gpu>) -> Result<()> {
    if let (Some(wanted), Some(info)) = (&config.region, first) {
        match &info.region {
            Some(region) if region != wanted => {
                let host = &config.host;
                return Err(Fatal(format!(
                    "host {host:?} is registered in region {region:?}, not {wanted:?}; a host keeps its region (set region back, or register the moved machine under a new host name)"
                ))
                .into());
            }
            Some(_) => {}
            None => tracing::warn!(
                region = %wanted,
                "this host registered its GPUs before it declared a region and stays in none (bids that require a region pass it by); register it under a new host name to declare one"
            ),
        }
    }
    Ok(())
}

/// Every GPU the account registered, page after page.
pub(super) async fn my_gpus(connection: &mut Connection) -> Result<Vec<gpux_protocol::views::Gpu>> {
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let id = connection.new_id();
        match connection.request(ClientMessage::MyGpus { id, offset }).await? {
            ServerMessage::Gpus { gpus, next_offset, .. } => {
                all.extend(gpus);
                match next_offset {
                    Some(next) => offset = next,
                    None => return Ok(all),
                }
            }
            other => bail!("listing registered GPUs: {other:?}"),
        }
    }
}

/// The classes of the host's GPUs as the exchange has them now; whether
/// they changed (a hardware challenge decided), so the asks are offered
/// again.
pub(super) async fn refresh_classes(host: &mut Host, connection: &mut Connection) -> Result<bool> {
    let before: Vec<Vec<String>> = host.gpus.iter().map(|g| g.info.classes.clone()).collect();
    for info in my_gpus(connection).await? {
        if let Some(known) = host.gpus.iter_mut().find(|g| g.info.uuid == info.uuid) {
            known.info = info;
        }
    }
    Ok(before != host.gpus.iter().map(|g| g.info.classes.clone()).collect::<Vec<_>>())
}
