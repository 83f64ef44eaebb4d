//! gpux-probe: the renter's GPU probe (docs/agent.md "The renter's GPU
//! probe"). It runs inside the lease's own container, looks for the GPUs
//! the host says it delivered (`GPUX_GPUS`) every few seconds, and at the
//! end of each interval prints one observation, signed with the key the
//! renter gave it (`GPUX_PROBE_KEY`, in the workload's sealed environment),
//! as a line `gpux-gpu-probe-v1 {json}` on standard output. The renter's
//! client reads those lines from the lease's output and sends them
//! (docs/protocol.md "GPU probe"); a GPU no look found in an interval is
//! the probe's signed word that it was absent.
//!
//! Where it looks: `nvidia-smi` (NVIDIA: UUID, utilisation, memory in use)
//! when it is on the PATH; the fake backend's device nodes
//! (`GPUX_FAKE_DEVICES`, `uuid=path` pairs the agent sets for machines
//! without GPUs) otherwise. A GPU neither shows is not there.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use ed25519_dalek::SigningKey;
use gpux_engine::LeaseId;
use gpux_protocol::{GpuProbeBody, GpuProbeReport, ProbeGpu};

/// The prefix of each observation line.
const LINE_PREFIX: &str = "gpux-gpu-probe-v1 ";

#[derive(Parser, Debug)]
#[command(name = "gpux-probe", version, about = "Sign what this container sees of its leased GPUs, one line per interval")]
struct Args {
    /// Seconds each observation covers (at most 3600).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    interval_s: u64,
    /// Looks per interval (at least 1).
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=3600))]
    samples: u32,
    /// Print one observation, then exit.
    #[arg(long)]
    once: bool,
}

/// What the environment must name; each a clear reason when it does not.
#[derive(Debug, thiserror::Error)]
enum SetupError {
    #[error("GPUX_LEASE is not set or not a lease id (the agent sets it in every leased container)")]
    Lease,
    #[error("GPUX_GPUS is not set or empty (the agent sets it to the leased GPUs' UUIDs)")]
    Gpus,
    #[error("GPUX_PROBE_KEY is not set or not 32 hex-encoded bytes (put the probe's secret key in the workload's environment)")]
    Key,
}

struct Setup {
    lease: LeaseId,
    gpus: Vec<String>,
    key: SigningKey,
    fake_devices: Vec<(String, String)>,
}

fn setup() -> Result<Setup, SetupError> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let lease = var("GPUX_LEASE").and_then(|v| v.trim().parse().ok()).map(LeaseId).ok_or(SetupError::Lease)?;
    let gpus: Vec<String> =
        var("GPUX_GPUS").ok_or(SetupError::Gpus)?.split(',').map(|g| g.trim().to_string()).filter(|g| !g.is_empty()).collect();
    if gpus.is_empty() {
        return Err(SetupError::Gpus);
    }
    let secret: [u8; 32] =
        var("GPUX_PROBE_KEY").and_then(|k| hex::decode(k.trim()).ok()).and_then(|b| b.try_into().ok()).ok_or(SetupError::Key)?;
    let fake_devices = var("GPUX_FAKE_DEVICES")
        .map(|v| v.split(',').filter_map(|pair| pair.split_once('=').map(|(u, p)| (u.to_string(), p.to_string()))).collect())
        .unwrap_or_default();
    Ok(Setup { lease, gpus, key: SigningKey::from_bytes(&secret), fake_devices })
}

/// One GPU as one look found it.
struct Seen {
    uuid: String,
    utilisation_percent: u32,
    memory_used_mib: u32,
}

/// One look: every GPU the container shows.
fn look(setup: &Setup) -> Vec<Seen> {
    let nvidia = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=uuid,utilization.gpu,memory.used", "--format=csv,noheader,nounits"])
        .output();
    if let Some(output) = nvidia.ok().filter(|o| o.status.success()) {
        return String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let mut fields = line.split(',').map(str::trim);
                let uuid = fields.next().filter(|u| !u.is_empty())?.to_string();
                let utilisation_percent = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                let memory_used_mib = fields.next().and_then(|f| f.parse().ok()).unwrap_or(0);
                Some(Seen { uuid, utilisation_percent, memory_used_mib })
            })
            .collect();
    }
    setup
        .fake_devices
        .iter()
        .filter(|(_, path)| std::path::Path::new(path).exists())
        .map(|(uuid, _)| Seen { uuid: uuid.clone(), utilisation_percent: 0, memory_used_mib: 0 })
        .collect()
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Looks `samples` times over `interval`, then signs what it saw.
fn observe(setup: &Setup, interval: Duration, samples: u32) -> GpuProbeReport {
    let start_ms = now_ms();
    let mut gpus: Vec<ProbeGpu> = setup
        .gpus
        .iter()
        .map(|uuid| ProbeGpu { uuid: uuid.clone(), present_samples: 0, utilisation_percent_mean: 0, memory_used_mib_max: 0 })
        .collect();
    let mut utilisation_sums = vec![0u64; gpus.len()];
    let pause = interval / samples;
    for sample in 0..samples {
        for seen in look(setup) {
            if let Some(i) = gpus.iter().position(|g| g.uuid == seen.uuid) {
                gpus[i].present_samples += 1;
                utilisation_sums[i] += u64::from(seen.utilisation_percent.min(100));
                gpus[i].memory_used_mib_max = gpus[i].memory_used_mib_max.max(seen.memory_used_mib);
            }
        }
        if sample + 1 < samples {
            std::thread::sleep(pause);
        }
    }
    let end = start_ms + interval.as_millis() as u64;
    if let Some(wait) = end.checked_sub(now_ms()) {
        std::thread::sleep(Duration::from_millis(wait));
    }
    for (gpu, sum) in gpus.iter_mut().zip(utilisation_sums) {
        gpu.utilisation_percent_mean = sum.checked_div(u64::from(gpu.present_samples)).unwrap_or(0) as u32;
    }
    let body = GpuProbeBody { lease: setup.lease, start_ms, end_ms: now_ms().max(start_ms + 1), samples, gpus };
    GpuProbeReport::sign(body, &setup.key)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let setup = match setup() {
        Ok(setup) => setup,
        Err(error) => {
            eprintln!("gpux-probe: {error}");
            return ExitCode::from(2);
        }
    };
    let interval = Duration::from_secs(args.interval_s);
    loop {
        let report = observe(&setup, interval, args.samples);
        let line = serde_json::to_string(&report).expect("a report serialises");
        let mut stdout = std::io::stdout().lock();
        if writeln!(stdout, "{LINE_PREFIX}{line}").and_then(|()| stdout.flush()).is_err() {
            return ExitCode::from(1);
        }
        if args.once {
            return ExitCode::SUCCESS;
        }
    }
}
