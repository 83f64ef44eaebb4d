//! `gpux service`: a service keeps replicas of one workload running and
//! scaled, behind `gpux-router` (docs/services.md).

use gpux_engine::LeaseId;
use gpux_protocol::{
    ClientMessage, ReplicaState, ScalingTarget, ServerMessage, ServiceId, ServiceInfo, ServiceScaling, ServiceSpec, ServiceState,
};

use crate::money::{amount, parse_amount};
use crate::session::Session;
use crate::{Failure, ServiceAction};

pub async fn service_action(s: &mut Session, url: &str, action: ServiceAction, json: bool) -> Result<(), Failure> {
    match action {
        ServiceAction::Create(args) => create(s, url, *args, json).await,
        ServiceAction::Status { service } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Service { service, .. }) =
                (json, s.ask(ClientMessage::ServiceStatus { id, service: ServiceId(service) }, json).await?)
            {
                print_service(&service);
            }
            Ok(())
        }
        ServiceAction::List => list(s, json).await,
        ServiceAction::Scale { service, replicas } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Service { service, .. }) =
                (json, s.ask(ClientMessage::ScaleService { id, service: ServiceId(service), replicas }, json).await?)
            {
                out!("service {}: keeps {replicas} replica(s) now", service.service);
                print_service(&service);
            }
            Ok(())
        }
        ServiceAction::Delete { service } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Service { service, .. }) =
                (json, s.ask(ClientMessage::DeleteService { id, service: ServiceId(service) }, json).await?)
            {
                out!("service {} deleted: its bids cancelled, its replicas' leases ended", service.service);
            }
            Ok(())
        }
        ServiceAction::Update { service, image, port, readiness, command } => {
            let id = s.connection.new_id();
            let ServerMessage::Service { service: info, .. } =
                s.ask(ClientMessage::ServiceStatus { id, service: ServiceId(service) }, json).await?
            else {
                return Err(Failure::Unreachable("expected the service".into()));
            };
            let mut run = info.spec.run();
            if let Some(image) = image {
                run.image = image;
            }
            if let Some(port) = port {
                run.port = port;
            }
            if let Some(readiness) = readiness {
                run.readiness_path = Some(readiness);
            }
            if !command.is_empty() {
                run.command = command;
            }
            let id = s.connection.new_id();
            if let (false, ServerMessage::Service { service, .. }) =
                (json, s.ask(ClientMessage::UpdateService { id, service: ServiceId(service), run }, json).await?)
            {
                match service.rollout {
                    Some(gpux_protocol::RolloutState::Rolling) => {
                        out!("service {}: rolling out run {} one replica at a time", service.service, service.generation)
                    }
                    _ => out!("service {}: run {} in place (no replica ran the old one)", service.service, service.generation),
                }
                print_service(&service);
            }
            Ok(())
        }
        ServiceAction::Bill { service, html } => {
            crate::invoice::document(s, crate::invoice::Document::Service(service), html, None, json).await
        }
        ServiceAction::Logs { service, replica, bytes } => logs(s, ServiceId(service), replica, bytes, json).await,
    }
}

/// The key a router will ask for: 32 random bytes in hex. Only its hash
/// goes to the exchange.
fn new_key() -> String {
    hex::encode(gpux_protocol::secret_file::random_key())
}

async fn create(s: &mut Session, url: &str, args: crate::ServiceCreate, json: bool) -> Result<(), Failure> {
    let instrument = s.resolve(&args.instrument).await?;
    let limit = parse_amount(&args.max_price).map_err(Failure::Usage)?;
    let floor = match (args.floor, &args.floor_instrument, &args.floor_max_price) {
        (Some(replicas), Some(book), Some(price)) => Some(gpux_protocol::ServiceFloor {
            instrument: s.resolve(book).await?,
            replicas,
            limit_minor_per_gpu_hour: parse_amount(price).map_err(Failure::Usage)?,
        }),
        _ => None,
    };
    let budget = match &args.budget_per_hour {
        Some(budget) => parse_amount(budget).map_err(Failure::Usage)?,
        None => {
            let on_floor = floor.map_or(0, |f| f.replicas.min(args.max));
            let floor_cost = floor.map_or(0, |f| f.limit_minor_per_gpu_hour.saturating_mul(u64::from(on_floor)));
            let rest = limit.saturating_mul(u64::from(args.max - on_floor));
            floor_cost.saturating_add(rest).saturating_mul(u64::from(args.gpus))
        }
    };
    let target = match (args.scale_rps.as_deref(), args.scale_in_flight) {
        (Some(_), Some(_)) => return Err(Failure::Usage("--scale-rps or --scale-in-flight, not both".into())),
        (Some(rps), None) => Some(ScalingTarget::RequestsPerSecondMilli(parse_milli(rps)?)),
        (None, Some(in_flight)) => Some(ScalingTarget::InFlight(in_flight)),
        (None, None) => None,
    };
    let scaling = target.map(|target| ServiceScaling {
        target,
        up_window_ms: args.up_window_s.saturating_mul(1_000),
        down_window_ms: args.down_window_s.saturating_mul(1_000),
    });
    let key = (!args.public).then(new_key);
    let spec = ServiceSpec {
        name: args.name,
        instrument,
        gpus: args.gpus,
        limit_minor_per_gpu_hour: limit,
        budget_minor_per_hour: budget,
        replicas: args.replicas.unwrap_or(args.min.max(1).min(args.max)),
        min_replicas: args.min,
        max_replicas: args.max,
        image: args.image,
        command: args.command,
        port: args.port,
        readiness_path: args.readiness,
        regions: args.regions,
        min_supplier_score_bps: 0,
        scaling,
        key_hashes: key.iter().map(|k| gpux_protocol::services::key_hash(k)).collect(),
    };
    if let Err(invalid) = spec.check() {
        return Err(Failure::Usage(format!("the service: {invalid}")));
    }
    if let Some(Err(invalid)) = floor.map(|f| f.check(&spec)) {
        return Err(Failure::Usage(format!("the service: {invalid}")));
    }
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::CreateService { id, service: Box::new(spec), floor }, json).await?;
    if let ServerMessage::Service { service, .. } = &answer {
        match (json, &key) {
            (true, Some(key)) => out!("{}", serde_json::json!({"service": service.service.0, "key": key})),
            (true, None) => {}
            (false, key) => {
                out!("service {} created: bidding for {} replica(s)", service.service, service.spec.replicas);
                if let Some(key) = key {
                    out!("its key (shown once; the exchange keeps only its hash): {key}");
                    out!("  curl -H 'Authorization: Bearer {key}' http://ROUTER/");
                }
                out!("serve it: gpux-router --exchange {} --key KEY_FILE --service {} --listen 0.0.0.0:8000", url, service.service);
            }
        }
    }
    Ok(())
}

/// `"2.5"` requests a second as thousandths.
fn parse_milli(text: &str) -> Result<u64, Failure> {
    let bad = || Failure::Usage(format!("`{text}`: a number of requests a second, at most 3 decimals"));
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if fraction.len() > 3 || whole.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let whole: u64 = whole.parse().map_err(|_| bad())?;
    let fraction: u64 = format!("{fraction:0<3}").parse().map_err(|_| bad())?;
    whole.checked_mul(1_000).and_then(|w| w.checked_add(fraction)).ok_or_else(bad)
}

async fn list(s: &mut Session, json: bool) -> Result<(), Failure> {
    let mut offset = 0;
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Services { services, next_offset, .. } = s.ask(ClientMessage::Services { id, offset }, json).await? else {
            return Err(Failure::Unreachable("expected services".into()));
        };
        if !json {
            for service in &services {
                let ready = service.replicas.iter().filter(|r| r.state == ReplicaState::Ready).count();
                out!(
                    "{:>6}  {:<24} {:<8} {ready}/{} ready",
                    service.service.0,
                    service.spec.name,
                    service.state.name(),
                    service.replicas.len()
                );
            }
        }
        match next_offset {
            Some(next) => offset = next,
            None => return Ok(()),
        }
    }
}

fn print_service(service: &ServiceInfo) {
    let spec = &service.spec;
    out!("service {} ({}): {}", service.service, spec.name, service.state.name());
    out!(
        "  {} GPU(s) a replica at up to {}/GPU-h, at most {}/h in all; {} to {} replicas",
        spec.gpus,
        amount(spec.limit_minor_per_gpu_hour),
        amount(spec.budget_minor_per_hour),
        spec.min_replicas,
        spec.max_replicas
    );
    out!("  runs {} in {} on port {}", spec.command.join(" "), spec.image, spec.port);
    if let Some(floor) = &service.floor {
        out!(
            "  a floor of {} replica(s) on book {} at up to {}/GPU-h (slots below {}); the rest on book {}",
            floor.replicas,
            floor.instrument.0,
            amount(floor.limit_minor_per_gpu_hour),
            floor.replicas,
            spec.instrument.0
        );
    }
    if let Some(scaling) = &spec.scaling {
        let target = match scaling.target {
            ScalingTarget::RequestsPerSecondMilli(n) => format!("{}.{:03} requests/s", n / 1_000, n % 1_000),
            ScalingTarget::InFlight(n) => format!("{n} in flight"),
        };
        out!(
            "  scales on {target} a replica: up after {} s, down after {} s",
            scaling.up_window_ms / 1_000,
            scaling.down_window_ms / 1_000
        );
    }
    if let Some(rollout) = service.rollout {
        let state = match rollout {
            gpux_protocol::RolloutState::Rolling => "rolling out",
            gpux_protocol::RolloutState::Done => "rolled out",
            gpux_protocol::RolloutState::RolledBack => "rolled back (its new replicas failed to start)",
        };
        out!("  run {}: {state}", service.generation);
    }
    if let Some(decision) = &service.last_scaling {
        out!("  last scaled {} -> {} ({})", decision.from, decision.to, decision.reason);
    }
    for replica in &service.replicas {
        let state = match replica.state {
            ReplicaState::Bidding => "bidding",
            ReplicaState::Starting => "starting",
            ReplicaState::Ready => "ready",
        };
        let lease = replica.lease.map_or("-".into(), |l| format!("lease {}", l.0));
        let endpoint = replica.endpoint.as_deref().unwrap_or("");
        let stalled = replica.stalled.as_deref().map(|why| format!(" ({why}; `gpux service scale` bids again)")).unwrap_or_default();
        let noticed = if replica.noticed { " (preemption notice: a stand-in replaces it)" } else { "" };
        out!("  replica {}: {state} {lease} {endpoint}{stalled}{noticed} (run {})", replica.slot, replica.generation);
    }
    out!("  {} bid(s) placed, {} replica(s) replaced", service.bids, service.replaced);
    if service.state == ServiceState::Failed {
        out!("  failed: 5 replicas in a row exited or failed before any became ready (`gpux service logs` shows why)");
    }
}

/// A replica's output: the replica in `slot` (the first with a lease
/// without it), or the newest lease the service ran on.
async fn logs(s: &mut Session, service: ServiceId, slot: Option<u32>, bytes: u32, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::Service { service: info, .. } = s.ask(ClientMessage::ServiceStatus { id, service }, json).await? else {
        return Err(Failure::Unreachable("expected the service".into()));
    };
    let running = info.replicas.iter().filter(|r| slot.is_none_or(|s| s == r.slot)).find_map(|r| r.lease);
    let Some(lease) = running.or_else(|| slot.is_none().then(|| info.leases.last().copied()).flatten()) else {
        return Err(Failure::Refused(format!("service {service}: no replica with a lease to read")));
    };
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::LeaseLogs { id, lease: LeaseId(lease.0), tail_bytes: bytes }, json).await?;
    if let (false, ServerMessage::LeaseLogs { data, truncated, .. }) = (json, answer) {
        if truncated {
            out!("[... earlier output cut]");
        }
        print!("{data}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn requests_a_second_read_as_thousandths() {
        assert_eq!(super::parse_milli("20").ok(), Some(20_000));
        assert_eq!(super::parse_milli("1.5").ok(), Some(1_500));
        assert_eq!(super::parse_milli("0.001").ok(), Some(1));
        for bad in ["", ".5", "1.2345", "-1", "1e3", "x"] {
            assert!(super::parse_milli(bad).is_err(), "{bad}");
        }
    }
}
