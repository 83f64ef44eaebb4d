//! `gpux run` and `gpux lease ...`: a renter's way onto the GPUs it buys.
//!
//! `run` places an immediate-or-cancel bid carrying the workload's public
//! part (with `buy`'s filters and re-match); for each lease it fills, it
//! fetches the host's encryption key, checks the host's signature over it,
//! seals the secret part (command, environment, SSH keys) to it and sends
//! it, then follows the delivery until the workload runs and prints how to
//! reach it. When delivery cannot begin it ends the leases it started (and
//! says so); when the workload fails or exits it prints the code, the last
//! log lines and whether the lease is still billed, and exits non-zero.

use std::time::{Duration, Instant};

use gpux_client::now_ms;
use gpux_engine::{EventKind, LeaseDuration, LeaseId, OrderId, OrderType, Side, TimeInForce};
use gpux_protocol::delivery::encryption_key_certified;
use gpux_protocol::{
    ClientMessage, DeliveryState, LivenessBody, LivenessReport, OrderTicket, RestartPolicy, Secrets, ServerMessage, Workload,
};

use crate::money::{parse_amount, parse_hours};
use crate::session::Session;
use crate::{Failure, LeaseAction, RestartArg, RunArgs};

pub async fn run(s: &mut Session, args: RunArgs, json: bool) -> Result<(), Failure> {
    let instrument = s.resolve(&args.instrument).await?;
    let price = parse_amount(&args.max_price).map_err(Failure::Usage)?;
    let secrets = secrets_of(&args)?;
    let has_secrets = secrets != Secrets::default();
    let workload = workload_of(&args, has_secrets)?;

    let mut order = OrderTicket::limit(now_ms(), instrument, Side::Buy, price, args.gpus);
    order.order_type = OrderType::Limit;
    order.time_in_force = TimeInForce::Ioc;
    order.duration = match &args.hours {
        Some(hours) => parse_hours(hours).map_err(Failure::Usage)?,
        None => LeaseDuration::UntilCancelled,
    };
    order.one_host = args.gpus > 1;
    order.volumes = args
        .volume
        .iter()
        .map(|text| {
            gpux_protocol::VolumeMount::parse(text)
                .ok_or_else(|| Failure::Usage(format!("--volume takes NAME:/PATH or NAME:/PATH:ro (not a system path), not {text:?}")))
        })
        .collect::<Result<_, _>>()?;
    args.filters.apply(&mut order)?;
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::NewOrder { id, order, workload: Some(Box::new(workload.clone())) }, json).await?;
    let Some(order_id) = (match answer {
        ServerMessage::Ack { order, .. } => order,
        _ => None,
    }) else {
        return Err(Failure::Refused("the bid was not accepted".into()));
    };

    let leases = leases_of(s, order_id).await;
    if leases.is_empty() {
        return Err(Failure::Refused(format!(
            "no {} GPU(s) on sale at or below {}/GPU-h now from hosts that run workloads (with the filters given); \
             `gpux book {}` shows the asks, and `gpux asks` which hosts they are (a host without a docker or process \
             backend takes no workload)",
            args.gpus, args.max_price, args.instrument
        )));
    }
    if !json {
        out!("leased: {}", leases.iter().map(|l| format!("lease {}", l.0)).collect::<Vec<_>>().join(", "));
    }
    if has_secrets {
        for &lease in &leases {
            if let Err(failure) = send_secrets(s, lease, &workload, &secrets, json).await {
                // Delivery cannot begin: the leases this run started are ended, not left billed.
                let ended = end_leases(s, &leases).await;
                return Err(Failure::Refused(format!("{}; {ended}", failure_text(&failure))));
            }
        }
    }
    follow(s, &leases, Duration::from_secs(args.wait_s), end_on_exit(&args), json).await
}

/// The secrets `gpux run` seals to the host: command, arguments,
/// environment, SSH keys, readiness and registry credentials.
fn secrets_of(args: &RunArgs) -> Result<Secrets, Failure> {
    let mut env = Vec::new();
    for pair in &args.env {
        let (name, value) = pair.split_once('=').ok_or_else(|| Failure::Usage(format!("--env takes NAME=VALUE, not {pair:?}")))?;
        env.push((name.to_string(), value.to_string()));
    }
    let mut ssh_keys = Vec::new();
    for path in &args.ssh_key {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::Usage(format!(
                "reading SSH key {}: {e}: make one with `ssh-keygen -t ed25519`, or leave --ssh-key out (the workload is then reached through its published ports and `gpux lease logs`, not SSH)",
                path.display()
            ))
        })?;
        ssh_keys.extend(text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.trim().to_string()));
    }
    let (command, arguments) = match args.command.split_first() {
        Some((first, rest)) if args.entrypoint => (vec![first.clone()], rest.to_vec()),
        _ => (Vec::new(), args.command.clone()),
    };
    let readiness = args.ready_port.map(|port| gpux_protocol::delivery::Readiness { port, http_path: args.ready_path.clone() });
    if readiness.as_ref().is_some_and(|r| !args.port.contains(&r.port)) {
        return Err(Failure::Usage("--ready-port must be one of the published ports (-p)".into()));
    }
    let registry_auth = match (&args.registry_user, &args.registry_password_file) {
        (Some(username), Some(path)) => {
            let password = std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("reading {}: {e}", path.display())))?;
            Some(gpux_protocol::delivery::RegistryAuth {
                username: username.clone(),
                password: password.trim_end().to_string(),
                server: None,
            })
        }
        _ => None,
    };
    let secrets = Secrets { command, args: arguments, env, ssh_keys, readiness, registry_auth };
    secrets.validate().map_err(|e| Failure::Usage(e.to_string()))?;
    Ok(secrets)
}

/// The workload `gpux run` asks for, in clear on the bid.
fn workload_of(args: &RunArgs, has_secrets: bool) -> Result<Workload, Failure> {
    let workload = Workload {
        ports: args.port.clone(),
        shm_mib: args.shm_mib,
        restart: match args.restart {
            RestartArg::Never => RestartPolicy::Never,
            RestartArg::OnFailure => RestartPolicy::OnFailure { max_restarts: 5 },
            RestartArg::Always => RestartPolicy::Always,
        },
        secrets_follow: has_secrets,
        end_lease_on_exit: end_on_exit(args),
        ..Workload::image(args.image.clone())
    };
    workload.validate().map_err(|e| Failure::Usage(e.to_string()))?;
    Ok(workload)
}

/// Whether the lease ends when its workload exits: asked for, or by
/// default for a command that runs once (given after --, never restarted).
fn end_on_exit(args: &RunArgs) -> bool {
    args.end_on_exit || (!args.keep_lease && !args.command.is_empty() && matches!(args.restart, RestartArg::Never))
}

/// The leases a bid filled: they come as private events right after the ack.
async fn leases_of(s: &mut Session, order_id: OrderId) -> Vec<LeaseId> {
    let mut leases: Vec<LeaseId> = Vec::new();
    let mut ours = false;
    while let Ok(Some(message)) = s.connection.next_within(Duration::from_millis(500)).await {
        if let ServerMessage::Private { event, .. } = message {
            match event.kind {
                EventKind::Trade { buy_order, .. } => ours = buy_order == order_id,
                EventKind::LeaseCreated { lease, .. } if ours => leases.push(lease),
                _ => {}
            }
        }
    }
    leases
}

/// `gpux lease status`: the lease's workload and its delivery.
async fn status(s: &mut Session, lease: LeaseId, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::LeaseDelivery { id, lease }, json).await?;
    if let (false, ServerMessage::LeaseDelivery { workload, state, .. }) = (json, answer) {
        match workload {
            Some(workload) => out!("image {}", workload.image),
            None => out!("no workload set"),
        }
        // A lease ended (`lease stop`, its end, a preemption) whose host
        // has not yet told the workload stopped: say so, not `running`.
        let id = s.connection.new_id();
        let ended_at_ms = match s.ask(ClientMessage::Leases { id, after: Some(lease.0 + 1) }, false).await? {
            ServerMessage::Leases { leases, .. } => leases.into_iter().find(|l| l.lease == lease && !l.active).and_then(|l| l.ended_at_ms),
            _ => None,
        };
        let stopping = ended_at_ms.filter(|_| !matches!(state, Some(DeliveryState::Stopped | DeliveryState::Failed { .. }) | None));
        match (state, stopping) {
            (Some(state), Some(ended_at_ms)) => out!(
                "stopping: the lease ended at {}; the host is stopping and removing its workload (it last reported: {})",
                gpux_engine::time::format_utc(ended_at_ms),
                describe(&state)
            ),
            (Some(state), None) => {
                out!("{}", describe(&state));
                print_endpoints(lease, &state);
            }
            (None, _) => out!("no delivery status yet"),
        }
    }
    Ok(())
}

/// `gpux lease ssh`: the workload's SSH endpoint (published port 22 with
/// the renter's keys) as an `ssh` command, run in place of this process
/// (or printed).
async fn ssh(s: &mut Session, lease: LeaseId, print: bool, command: &[String], json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::LeaseDelivery { id, lease }, false).await?;
    let ServerMessage::LeaseDelivery { state, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected lease_delivery, got {answer:?}")));
    };
    let endpoint = match &state {
        Some(DeliveryState::Running { endpoints, .. }) => endpoints.iter().find(|e| e.container_port == 22).cloned(),
        Some(other) => {
            return Err(Failure::Usage(format!("lease {lease} is not running ({}): `gpux lease status {lease}`", describe(other))));
        }
        None => return Err(Failure::Usage(format!("lease {lease} has no delivery status yet: `gpux lease status {lease}`"))),
    };
    let Some(endpoint) = endpoint else {
        return Err(Failure::Usage(format!(
            "lease {lease}'s workload publishes no port 22: run it with `-p 22 --ssh-key ~/.ssh/id_ed25519.pub` (an image with an SSH server) to reach it by SSH; `gpux lease logs {lease}` shows its output either way"
        )));
    };
    let mut words = vec!["ssh".to_string(), "-p".into(), endpoint.port.to_string(), format!("root@{}", endpoint.host)];
    if !command.is_empty() {
        words.push("--".into());
        words.extend(command.iter().cloned());
    }
    if print || json {
        if json {
            out!("{}", serde_json::json!({ "lease": lease.0, "host": endpoint.host, "port": endpoint.port, "command": words }));
        } else {
            out!("{}", words.join(" "));
        }
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(&words[0]).args(&words[1..]).exec();
    Err(Failure::Usage(format!("running ssh: {error} (is OpenSSH's client installed?); the command: {}", words.join(" "))))
}

/// `gpux lease exec`: a command run in the lease's workload by its host
/// (docs/protocol.md "Lease delivery"); its output printed as it came, and
/// its exit code this process's (1 when the host ran nothing, or it ran
/// past its timeout).
async fn exec(s: &mut Session, lease: LeaseId, timeout_s: u32, command: Vec<String>, json: bool) -> Result<(), Failure> {
    if !(1..=60).contains(&timeout_s) {
        return Err(Failure::Usage(format!("--timeout-s is 1 to 60, not {timeout_s}")));
    }
    let id = s.connection.new_id();
    let timeout_ms = timeout_s * 1_000;
    let answer = s.ask(ClientMessage::LeaseExec { id, lease, command, timeout_ms }, json).await?;
    let ServerMessage::LeaseExec { outcome, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected lease_exec, got {answer:?}")));
    };
    if !json {
        print!("{}", outcome.output);
        if !outcome.output.is_empty() && !outcome.output.ends_with('\n') {
            println!();
        }
    }
    if let Some(reason) = outcome.refused {
        return Err(Failure::Refused(format!("lease {lease}'s host ran nothing: {reason}")));
    }
    if outcome.timed_out {
        return Err(Failure::Refused(format!("still running after {timeout_s} s (its output so far is above); --timeout-s waits longer")));
    }
    if outcome.truncated && !json {
        eprintln!("(only the last {} bytes of its output are shown)", gpux_protocol::delivery::limits::EXEC_OUTPUT_BYTES_MAX);
    }
    match outcome.exit_code {
        Some(0) | None => Ok(()),
        // The command's own code, as ssh would give it.
        Some(code) => Err(Failure::Status(i32::try_from(code).unwrap_or(1).clamp(1, 255))),
    }
}

/// `gpux lease resell`: offers the rest of a lease on its class's resale book.
async fn resell(s: &mut Session, lease: u64, price: &str, tif: crate::TifArg, json: bool) -> Result<(), Failure> {
    let price_minor_per_gpu_hour = crate::money::parse_amount(price).map_err(Failure::Usage)?;
    let time_in_force = match tif {
        crate::TifArg::Gtc => gpux_engine::TimeInForce::Gtc,
        crate::TifArg::Ioc => gpux_engine::TimeInForce::Ioc,
        crate::TifArg::Fok => gpux_engine::TimeInForce::Fok,
    };
    let id = s.connection.new_id();
    let client_order_id = gpux_client::now_ms();
    let message = ClientMessage::OfferLease { id, lease: LeaseId(lease), price_minor_per_gpu_hour, client_order_id, time_in_force };
    let answer = s.ask(message, json).await?;
    if let (false, ServerMessage::Ack { order: Some(order), .. }) = (json, answer) {
        out!(
            "lease {lease} offered at {}/GPU-h: order {} on its class's resale book (good till 15 minutes before the lease ends)",
            crate::money::amount(price_minor_per_gpu_hour),
            order.0
        );
    }
    Ok(())
}

/// `gpux lease telemetry`: each GPU's latest samples.
async fn telemetry(s: &mut Session, lease: u64, last: usize, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::LeaseTelemetry { id, lease: LeaseId(lease) }, json).await?;
    let (false, ServerMessage::LeaseTelemetry { gpus, .. }) = (json, answer) else { return Ok(()) };
    if gpus.is_empty() {
        out!("lease {lease}: no usage report yet (or the lease has left the exchange's recent history)");
    }
    for gpu in gpus {
        out!("{}", gpu.gpu_uuid);
        out!(
            "  {:<31} {:>9} {:>11} {:>12} {:>9} {:>6} {:>7}",
            "interval",
            "available",
            "utilisation",
            "memory MiB",
            "unhealthy",
            "max °C",
            "power W"
        );
        for sample in gpu.samples.iter().skip(gpu.samples.len().saturating_sub(last)) {
            let length = sample.end_ms.saturating_sub(sample.start_ms).max(1);
            let reading = |value: Option<u32>| value.map_or("-".to_string(), |v| v.to_string());
            out!(
                "  {:<31} {:>8}% {:>10}% {:>12} {:>9} {:>6} {:>7}",
                format!("{} +{}s", crate::clock::when(sample.start_ms), length / 1_000),
                sample.available_ms * 100 / length,
                sample.utilisation_percent,
                sample.memory_used_mib_max,
                sample.unhealthy_samples,
                reading(sample.temperature_c_max),
                reading(sample.power_w_mean)
            );
        }
    }
    Ok(())
}

/// Seals the secrets to the lease's host, once its key is shown to be the host's own.
async fn send_secrets(s: &mut Session, lease: LeaseId, workload: &Workload, secrets: &Secrets, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::HostKey { encryption_key, identity_key, signature, .. } = s.ask(ClientMessage::HostKey { id, lease }, false).await?
    else {
        return Err(Failure::Refused(format!("lease {}: the exchange sent no host key", lease.0)));
    };
    let key: [u8; 32] = decode_key(&encryption_key)?;
    if !encryption_key_certified(&key, &decode_key(&identity_key)?, &signature) {
        return Err(Failure::Refused(format!(
            "lease {}: the host's encryption key is not signed by the host; not sending secrets",
            lease.0
        )));
    }
    let sealed = Workload { sealed: Some(secrets.seal(&key)), ..workload.clone() };
    let id = s.connection.new_id();
    s.ask(ClientMessage::SetWorkload { id, lease, workload: Box::new(sealed) }, json).await?;
    Ok(())
}

fn failure_text(failure: &Failure) -> String {
    match failure {
        Failure::Usage(text) | Failure::Refused(text) | Failure::Unreachable(text) => text.clone(),
        Failure::Status(code) => format!("exited with code {code}"),
    }
}

/// Ends the leases a run started; says which ended (and which could not be).
async fn end_leases(s: &mut Session, leases: &[LeaseId]) -> String {
    let mut ended = Vec::new();
    let mut kept = Vec::new();
    for &lease in leases {
        let id = s.connection.new_id();
        match s.connection.request(ClientMessage::EndLease { id, lease }).await {
            Ok(ServerMessage::Ack { .. }) => ended.push(lease.0.to_string()),
            _ => kept.push(lease.0.to_string()),
        }
    }
    let mut text = format!("ended lease(s) {} (billed only for the time they ran)", ended.join(", "));
    if !kept.is_empty() {
        text.push_str(&format!("; could NOT end lease(s) {}: `gpux lease stop <lease>` ends them", kept.join(", ")));
    }
    text
}

/// What a renter needs when its workload stopped short of running (or ran
/// and exited): the last lines it printed and whether its lease is still
/// billed.
async fn after_failure(s: &mut Session, lease: LeaseId, state: &DeliveryState, end_on_exit: bool) -> String {
    let mut text = format!("lease {}: {}", lease.0, describe(state));
    if let DeliveryState::Failed { fault: gpux_protocol::Fault::Host, .. } = state {
        text.push_str(
            "\nthe host's failure: the exchange ends the lease and charges nothing for it (with --rematch a replacement is sought: `gpux leases`)",
        );
        return text;
    }
    let id = s.connection.new_id();
    if let Ok(ServerMessage::LeaseLogs { data, .. }) = s.connection.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: 4096 }).await
    {
        let lines: Vec<&str> = data.lines().collect();
        if !lines.is_empty() {
            text.push_str("\nlast output:");
            for line in &lines[lines.len().saturating_sub(20)..] {
                text.push_str("\n  ");
                text.push_str(line);
            }
        }
    }
    let id = s.connection.new_id();
    let active = match s.connection.request(ClientMessage::Leases { id, after: None }).await {
        Ok(ServerMessage::Leases { leases, .. }) => leases.iter().find(|l| l.lease == lease).map(|l| l.active),
        _ => None,
    };
    text.push_str(&match active {
        Some(true) => {
            format!("\nlease {} is still active and BILLED: set another workload, or `gpux lease stop {}` to end it", lease.0, lease.0)
        }
        Some(false) if end_on_exit => format!("\nlease {} ended with its workload (billed to the exit)", lease.0),
        Some(false) => format!("\nlease {} has ended", lease.0),
        None => format!("\n`gpux lease status {}` shows whether lease {} is still billed", lease.0, lease.0),
    });
    text
}

fn decode_key(text: &str) -> Result<[u8; 32], Failure> {
    hex::decode(text).ok().and_then(|b| b.try_into().ok()).ok_or_else(|| Failure::Refused(format!("not a 32-byte key: {text}")))
}

/// Follows delivery statuses until every lease runs (or one fails). A
/// workload that exits with code 0 before it is seen running (a short
/// command) did what it was asked: its output is printed, not refused.
async fn follow(s: &mut Session, leases: &[LeaseId], wait: Duration, end_on_exit: bool, json: bool) -> Result<(), Failure> {
    let bar = (!json).then(|| crate::session::spinner("waiting for the host to start the workload"));
    let deadline = Instant::now() + wait;
    let mut running = std::collections::BTreeMap::new();
    while running.len() < leases.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = match s.connection.next_within(left).await {
            Ok(Some(message)) => message,
            Ok(None) => {
                return Err(Failure::Refused(format!(
                    "not running after {} s; `gpux lease status <lease>` shows where it stands",
                    wait.as_secs()
                )))
            }
            Err(error) => return Err(Failure::Unreachable(format!("{error:#}"))),
        };
        let ServerMessage::Delivery { lease, state, .. } = &message else { continue };
        if !leases.contains(lease) {
            continue;
        }
        if json {
            out!("{}", gpux_protocol::encode_server_text(&message));
        }
        if let Some(bar) = &bar {
            bar.set_message(format!("lease {}: {}", lease.0, describe(state)));
        }
        match state {
            DeliveryState::Running { .. } => {
                running.insert(*lease, state.clone());
            }
            DeliveryState::Exited { code: 0 } => {
                let (lease, state) = (*lease, state.clone());
                let said = after_failure(s, lease, &state, end_on_exit).await;
                if !json {
                    match &bar {
                        Some(bar) => bar.suspend(|| out!("{said}")),
                        None => out!("{said}"),
                    }
                }
                running.insert(lease, state);
            }
            DeliveryState::Failed { .. } | DeliveryState::Exited { .. } | DeliveryState::Stopped => {
                if let Some(bar) = &bar {
                    bar.finish_and_clear();
                }
                let (lease, state) = (*lease, state.clone());
                return Err(Failure::Refused(after_failure(s, lease, &state, end_on_exit).await));
            }
            _ => {}
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if !json {
        for (lease, state) in running.iter().filter(|(_, state)| matches!(state, DeliveryState::Running { .. })) {
            out!("lease {}: {}", lease.0, describe(state));
            print_endpoints(*lease, state);
        }
        if running.values().any(|state| matches!(state, DeliveryState::Running { .. })) {
            out!("logs: gpux lease logs <lease>; stop: gpux lease stop <lease>");
            if end_on_exit {
                out!("the lease ends when the workload exits (--keep-lease keeps it)");
            }
        }
    }
    Ok(())
}

/// A running workload's published ports and how to connect: the lease's
/// `gpux lease ssh` command and the plain ssh one where port 22 is
/// published, or why there is none.
fn print_endpoints(lease: LeaseId, state: &DeliveryState) {
    if let DeliveryState::Running { endpoints, .. } = state {
        for endpoint in endpoints {
            out!("  port {} -> {}:{}", endpoint.container_port, endpoint.host, endpoint.port);
        }
        match endpoints.iter().find(|e| e.container_port == 22) {
            Some(ssh) => out!("  connect: gpux lease ssh {}   (ssh -p {} root@{})", lease.0, ssh.port, ssh.host),
            None => out!("  connect: no SSH (port 22 not published; `gpux run -p 22 --ssh-key FILE` with an image that runs sshd)"),
        }
    }
}

/// A status in words.
pub fn describe(state: &DeliveryState) -> String {
    match state {
        DeliveryState::AwaitingSecrets => "waiting for the sealed secrets".into(),
        DeliveryState::Pulling { bytes_done, bytes_total } if *bytes_total > 0 => {
            format!("pulling the image ({} of {} MB)", bytes_done / 1_000_000, bytes_total / 1_000_000)
        }
        DeliveryState::Pulling { .. } => "pulling the image".into(),
        DeliveryState::Starting => "starting".into(),
        DeliveryState::Running { restarts: 0, .. } => "running".into(),
        DeliveryState::Running { restarts, .. } => format!("running (restarted {restarts} times)"),
        DeliveryState::Exited { code } => format!("exited with code {code}"),
        DeliveryState::Failed { code, fault, reason } => {
            let fault = if *fault == gpux_protocol::Fault::Host { "the host's side" } else { "your side" };
            format!("failed ({}, {fault}): {reason}", code.name())
        }
        DeliveryState::Stopped => "stopped and removed".into(),
    }
}

pub async fn lease(s: &mut Session, action: LeaseAction, key: &ed25519_dalek::SigningKey, json: bool) -> Result<(), Failure> {
    match action {
        LeaseAction::Watch { lease, probe_every, sign_every, seconds, port } => {
            let every = (Duration::from_secs(probe_every), sign_every * 1_000);
            watch(s, LeaseId(lease), key, every, seconds, port, json).await
        }
        LeaseAction::Status { lease } => status(s, LeaseId(lease), json).await,
        LeaseAction::Ssh { lease, print, command } => ssh(s, LeaseId(lease), print, &command, json).await,
        LeaseAction::Exec { lease, timeout_s, command } => exec(s, LeaseId(lease), timeout_s, command, json).await,
        LeaseAction::Resell { lease, price, tif } => resell(s, lease, &price, tif, json).await,
        LeaseAction::Stop { lease } => {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::EndLease { id, lease: LeaseId(lease) }, json).await?;
            if !json && matches!(answer, ServerMessage::Ack { .. }) {
                out!("lease {lease} ended; the host stops and removes its workload");
            }
            Ok(())
        }
        LeaseAction::Telemetry { lease, last } => telemetry(s, lease, last, json).await,
        LeaseAction::Logs { lease, bytes } => {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::LeaseLogs { id, lease: LeaseId(lease), tail_bytes: bytes }, json).await?;
            if let (false, ServerMessage::LeaseLogs { data, truncated, .. }) = (json, answer) {
                if truncated {
                    out!("[... earlier output cut]");
                }
                print!("{data}");
            }
            Ok(())
        }
    }
}

/// Reads the private events that came meanwhile: prints the lease's
/// disputes; the time it ended, if it did.
async fn lease_events(s: &mut Session, lease: LeaseId, json: bool) -> Result<Option<u64>, Failure> {
    let mut ended_at_ms = None;
    while let Some(message) = s.connection.next_within(Duration::ZERO).await.map_err(|e| Failure::Unreachable(format!("{e:#}")))? {
        if let ServerMessage::Private { event, .. } = &message {
            if let gpux_engine::EventKind::LeaseEnded { lease: ended, .. } = event.kind {
                if ended == lease {
                    ended_at_ms = Some(event.at_ms);
                }
            }
            if !json {
                if let Some(line) = dispute_line(lease, &event.kind) {
                    out!("{line}");
                }
            }
        }
    }
    Ok(ended_at_ms)
}

/// Signs and sends one liveness observation: `false` once the lease is
/// over (its bill final).
async fn send_liveness(s: &mut Session, body: LivenessBody, key: &ed25519_dalek::SigningKey, json: bool) -> Result<bool, Failure> {
    let id = s.connection.new_id();
    let message = ClientMessage::Liveness { id, report: LivenessReport::sign(body.clone(), key) };
    let answer = s.connection.request(message).await.map_err(|e| Failure::Unreachable(format!("{e:#}")))?;
    if json {
        out!("{}", gpux_protocol::encode_server_text(&answer));
    }
    match answer {
        ServerMessage::Ack { .. } => {
            if !json {
                let reachable = if body.reachable { "reachable" } else { "UNREACHABLE" };
                out!("{} s {reachable}", (body.end_ms - body.start_ms) / 1_000);
            }
            Ok(true)
        }
        ServerMessage::Error { code: gpux_protocol::ErrorCode::LeaseNotActive, .. } => {
            if !json {
                out!("lease {} is over: its bill is final", body.lease);
            }
            Ok(false)
        }
        ServerMessage::Error { code, message, .. } => Err(Failure::Refused(format!("{}: {message}", code.name()))),
        other => Err(Failure::Unreachable(format!("expected an ack, got {other:?}"))),
    }
}

/// `gpux lease watch`: probes the lease's first endpoint (if it publishes
/// one) every `probe_every` and signs, every `sign_every_ms`, whether any
/// probe of that interval reached it (unreachable: none did;
/// docs/protocol.md "Liveness observations"); and sends, as often, the
/// observations the renter's GPU probe printed to the lease's output
/// (docs/protocol.md "GPU probe").
async fn watch(
    s: &mut Session,
    lease: LeaseId,
    key: &ed25519_dalek::SigningKey,
    (probe_every, sign_every_ms): (Duration, u64),
    seconds: Option<u64>,
    port: Option<u16>,
    json: bool,
) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::LeaseDelivery { id, lease }, false).await?;
    let endpoints = match answer {
        ServerMessage::LeaseDelivery { state: Some(DeliveryState::Running { endpoints, .. }), .. } => endpoints,
        _ => return Err(Failure::Usage(format!("lease {lease} is not running: nothing to watch (`gpux lease status {lease}`)"))),
    };
    let endpoint = match port {
        None => endpoints.into_iter().next(),
        Some(port) => Some(endpoints.into_iter().find(|e| e.container_port == port).ok_or_else(|| {
            Failure::Usage(format!("lease {lease} publishes no port {port}: `gpux lease status {lease}` lists its ports"))
        })?),
    };
    let address = endpoint.map(|endpoint| format!("{}:{}", endpoint.host, endpoint.port));
    let offset = s.connection.clock_offset_ms;
    let exchange_now = move || gpux_client::now_ms().saturating_add_signed(offset);
    let deadline = seconds.map(|seconds| exchange_now() + seconds * 1_000);
    if !json {
        let what = address.as_ref().map_or("no published port: GPU probe lines only".to_string(), |a| {
            format!("{a}: a probe every {} s, a signed observation every {} s", probe_every.as_secs(), sign_every_ms / 1_000)
        });
        out!("watching lease {lease} at {what}");
    }
    let mut start_ms = exchange_now();
    let mut reachable = false;
    let mut ended_at_ms = None;
    let mut probe = ProbeLines::default();
    // The last probe's outcome, printed at once and at each change, so the
    // watch says something before its first signed observation.
    let mut last_seen: Option<bool> = None;
    loop {
        if let Some(address) = &address {
            let connected = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(address)).await;
            let answered = matches!(connected, Ok(Ok(_)));
            reachable |= answered;
            if !json && last_seen != Some(answered) {
                let at = gpux_engine::time::format_utc(exchange_now());
                out!("{at} {address} {}", if answered { "answers" } else { "does not answer" });
                last_seen = Some(answered);
            }
        }
        ended_at_ms = ended_at_ms.or(lease_events(s, lease, json).await?);
        // Observations end with the lease.
        let now = exchange_now().min(ended_at_ms.unwrap_or(u64::MAX));
        let done = deadline.is_some_and(|deadline| now >= deadline) || ended_at_ms.is_some();
        if now <= start_ms {
            // Nothing to observe yet (the first probe took under a
            // millisecond), or the lease ended before the watch began.
            if done {
                return Ok(());
            }
            tokio::time::sleep(probe_every).await;
            continue;
        }
        if now >= start_ms + sign_every_ms || done {
            let body = LivenessBody { lease, start_ms, end_ms: now, reachable };
            if address.is_some() && !send_liveness(s, body, key, json).await? {
                // The lease's bill is final: nothing more to watch.
                return Ok(());
            }
            probe.forward(s, lease, json).await?;
            start_ms = now;
            reachable = false;
        }
        if done {
            return Ok(());
        }
        tokio::time::sleep(probe_every).await;
    }
}

/// What a dispute event of `lease` tells the renter, in words.
fn dispute_line(lease: LeaseId, kind: &gpux_engine::EventKind) -> Option<String> {
    use gpux_engine::EventKind::*;
    match *kind {
        UsageDisputed { lease: disputed, disputed_gpu_ms, amount_minor, .. } if disputed == lease => Some(format!(
            "disputed {} s of reported time; {} withheld from the host",
            disputed_gpu_ms / 1_000,
            crate::money::amount(amount_minor)
        )),
        UsageDisputeHeld { lease: disputed, disputed_gpu_ms, proven_gpu_ms, amount_minor, .. } if disputed == lease => Some(format!(
            "disputed {} s of reported time ({} s proven by your GPU probe); {} of the host's pay held until the final bill",
            disputed_gpu_ms / 1_000,
            proven_gpu_ms / 1_000,
            crate::money::amount(amount_minor)
        )),
        DisputeDecided { lease: decided, proven_gpu_ms, refunded_minor, fee_refunded_minor, paid_minor, .. } if decided == lease => {
            Some(format!(
                "disputes decided at the final bill: {} s proven, {} refunded to you, {} paid to the host",
                proven_gpu_ms / 1_000,
                crate::money::amount(refunded_minor + fee_refunded_minor),
                crate::money::amount(paid_minor)
            ))
        }
        _ => None,
    }
}

/// The GPU probe's observations in the lease's output (docs/agent.md "The
/// renter's GPU probe"), sent once each, in order.
#[derive(Default)]
struct ProbeLines {
    /// The end of the last observation sent.
    sent_to_ms: u64,
}

/// How much of the lease's output to read for the probe's lines (one line
/// is under 10 KiB even for 64 GPUs).
const PROBE_OUTPUT_BYTES: u32 = 256 * 1024;

impl ProbeLines {
    async fn forward(&mut self, s: &mut Session, lease: LeaseId, json: bool) -> Result<(), Failure> {
        let id = s.connection.new_id();
        let answer = s.connection.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: PROBE_OUTPUT_BYTES }).await;
        // No output to read (the host did not answer in time): the lines stay for the next round.
        let Ok(ServerMessage::LeaseLogs { data, .. }) = answer else { return Ok(()) };
        let reports: Vec<gpux_protocol::GpuProbeReport> = data
            .lines()
            .filter_map(|line| line.strip_prefix(PROBE_LINE_PREFIX))
            .filter_map(|json| serde_json::from_str(json).ok())
            .filter(|report: &gpux_protocol::GpuProbeReport| report.body.lease == lease && report.body.start_ms >= self.sent_to_ms)
            .collect();
        for report in reports {
            let (end_ms, absent) = (report.body.end_ms, report.body.absent().map(str::to_string).collect::<Vec<_>>());
            let id = s.connection.new_id();
            let answer = s
                .connection
                .request(ClientMessage::GpuProbe { id, report: Box::new(report) })
                .await
                .map_err(|e| Failure::Unreachable(format!("{e:#}")))?;
            self.sent_to_ms = end_ms;
            if json {
                out!("{}", gpux_protocol::encode_server_text(&answer));
                continue;
            }
            match answer {
                ServerMessage::Ack { .. } if absent.is_empty() => out!("GPU probe: every GPU present"),
                ServerMessage::Ack { .. } => out!("GPU probe: ABSENT {}", absent.join(", ")),
                ServerMessage::Error { code, message, .. } => out!("GPU probe observation refused ({}): {message}", code.name()),
                other => return Err(Failure::Unreachable(format!("expected an ack, got {other:?}"))),
            }
        }
        Ok(())
    }
}

/// The prefix of each line `gpux-probe` prints.
const PROBE_LINE_PREFIX: &str = "gpux-gpu-probe-v1 ";
