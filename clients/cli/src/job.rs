//! `gpux job plan`: what a job would run on, decided on this machine from
//! its job file, its code and the exchange's books now (docs/jobs.md "The
//! plan"). Public market data only: no login, no order.

use std::path::{Path, PathBuf};

use gpux_engine::{ContractKind, InstrumentId, InstrumentState};
use gpux_jobs::catalogue::Catalogue;
use gpux_jobs::spec::{CodeSource, FrameworkChoice};
use gpux_jobs::{detect, plan, Framework, JobSpec, Requirement};
use gpux_protocol::{
    BundleRef, ClientMessage, InputSource, JobFailure, JobId, JobInfo, JobInput, JobRun, JobState, JobSubmission, ServerMessage,
};

use crate::money::amount;
use crate::session::Session;
use crate::Failure;

/// Pages of `book_offers` read per book at most (the plan needs the best asks).
const OFFER_PAGES_MAX: usize = 8;

fn framework_of(choice: FrameworkChoice) -> Option<Framework> {
    match choice {
        FrameworkChoice::Pytorch => Some(Framework::Pytorch),
        FrameworkChoice::Tensorflow => Some(Framework::Tensorflow),
        FrameworkChoice::Paddlepaddle => Some(Framework::Paddlepaddle),
        FrameworkChoice::Jax => Some(Framework::Jax),
        FrameworkChoice::Auto | FrameworkChoice::None => None,
    }
}

/// What a plan chose, for `gpux job submit`.
pub struct Planned {
    pub spec: JobSpec,
    pub bundle: Option<gpux_jobs::bundle::Bundle>,
    pub instrument: gpux_engine::InstrumentId,
    pub limit_minor_per_gpu_hour: u64,
    pub hours: u32,
    pub budget_minor: u64,
    pub image: Option<String>,
    pub install: Vec<String>,
    /// Other books its new attempts may bid on, each at its limit.
    pub alternatives: Vec<(gpux_engine::InstrumentId, u64)>,
}

/// `gpux job plan` (and `gpux job submit --dry-run`): prints the plan.
pub async fn plan_job(
    s: &mut Session,
    file: &Path,
    catalogue: Option<PathBuf>,
    set: &[(&str, toml::Value)],
    json: bool,
) -> Result<(), Failure> {
    plan_and_print(s, file, catalogue, set, json).await.map(|_| ())
}

/// Plans the job file and prints the plan; what it chose.
async fn plan_and_print(
    s: &mut Session,
    file: &Path,
    catalogue: Option<PathBuf>,
    set: &[(&str, toml::Value)],
    json: bool,
) -> Result<Planned, Failure> {
    let text = std::fs::read_to_string(file).map_err(|e| Failure::Usage(format!("reading {}: {e}", file.display())))?;
    let spec = JobSpec::parse_with(&text, set).map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
    let base = file.parent().unwrap_or(Path::new("."));
    let (framework, requirement, requirements, evidence) = framework_of_job(&spec, base)?;
    // The code bundle, packed as it would be sent (its hash is what the
    // exchange will hold).
    let bundle = pack_code(&spec, base)?;
    let (catalogue_path, catalogue) = load_catalogue(catalogue)?;
    // Only vendors the catalogue has an image for (the framework's, or a
    // framework-free one), unless the job names its own image.
    let vendors = match (spec.code.image(), framework, &catalogue) {
        (None, Some(framework), Some(catalogue)) => Some(catalogue.vendors_for(framework, spec.vendor)),
        (None, None, Some(catalogue)) if spec.code.dir().is_some() => Some(catalogue.plain_vendors(spec.vendor)),
        _ => None,
    };

    // The market now.
    let id = s.connection.new_id();
    let ServerMessage::Listing { listing, cluster_rules, .. } = s.ask(ClientMessage::Listing { id }, false).await? else {
        return Err(Failure::Unreachable("expected the listing".into()));
    };
    let id = s.connection.new_id();
    let ServerMessage::Instruments { instruments, .. } = s.ask(ClientMessage::Instruments { id }, false).await? else {
        return Err(Failure::Unreachable("expected the instruments".into()));
    };
    // The job file's amounts, held to the currency's decimals (never rounded).
    for (field, value) in [("limits.max_price_per_gpu_hour", spec.max_price_per_gpu_hour), ("limits.budget", spec.budget)] {
        if let Some(value) = value {
            plan::to_minor_exact(value, &listing.currency).map_err(|e| Failure::Usage(format!("{}: {field}: {e}", file.display())))?;
        }
    }
    let asks = usable_asks(s, &spec, &instruments, &cluster_rules).await?;
    let market = plan::Market { listing: &listing, instruments: &instruments, asks: &asks };
    let planned = plan(&spec, &market, vendors.as_ref());
    let chosen = planned.chosen();
    let image = match (spec.code.image(), framework, &catalogue, chosen) {
        (None, Some(framework), Some(catalogue), Some(chosen)) => {
            catalogue.choose(framework, requirement.as_ref(), chosen.vendor, &requirements)
        }
        (None, None, Some(catalogue), Some(chosen)) => catalogue.choose_plain(chosen.vendor, &requirements),
        _ => None,
    };
    if json {
        let chosen_image = image.as_ref();
        out!("{}", plan_json(&spec, &planned, (framework, &evidence), chosen_image, bundle.as_ref(), &listing.currency));
    }
    let Some(chosen) = chosen else {
        return Err(Failure::Refused("no book meets the job now: see why above (raise the limits, or wait for asks)".into()));
    };
    let (limit, hours, budget) = bid_terms(&spec, chosen, &instruments, planned.hours_priced, &listing.currency);
    let alternatives = gpux_jobs::alternatives(&planned, &spec, &market);
    // The job's own image runs as it is; a preset one gets what it lacks.
    let install = image.as_ref().map(|i| i.install.clone()).unwrap_or_default();
    let run_image = spec.code.image().map(str::to_string).or_else(|| image.as_ref().map(|i| i.image.reference.clone()));
    let (symbol, expected_cost) = (chosen.symbol.clone(), chosen.expected_cost);
    let planned_job = Planned {
        spec,
        bundle,
        instrument: chosen.instrument,
        limit_minor_per_gpu_hour: limit,
        hours,
        budget_minor: budget,
        image: run_image,
        install,
        alternatives,
    };
    if json {
        return Ok(planned_job);
    }
    print_plan(&planned_job, &planned, (framework, &evidence), image.as_ref(), catalogue_path.as_deref());
    out!("plan: {symbol} for {} expected (bids at up to {}/GPU-h)", amount(expected_cost), amount(limit));
    if !planned_job.alternatives.is_empty() {
        let symbol_of =
            |id: gpux_engine::InstrumentId| instruments.iter().find(|i| i.instrument == id).map_or(id.0.to_string(), |i| i.symbol.clone());
        let books: Vec<String> =
            planned_job.alternatives.iter().map(|&(id, limit)| format!("{} (up to {})", symbol_of(id), amount(limit))).collect();
        out!("failover: a new attempt bids the cheapest of this book and {}", books.join(", "));
    }
    Ok(planned_job)
}

/// The job's bid: its limit price on the chosen book's tick, the hours it
/// buys, and its budget (every attempt's worth unless the job file says).
fn bid_terms(
    spec: &JobSpec,
    chosen: &gpux_jobs::Candidate,
    instruments: &[gpux_protocol::views::Instrument],
    hours_priced: u64,
    currency: &gpux_engine::Currency,
) -> (u64, u32, u64) {
    let tick = instruments.iter().find(|i| i.instrument == chosen.instrument).map_or(1, |i| i.tick_minor.max(1));
    let limit = spec.max_price_per_gpu_hour.map_or(chosen.worst_price, |p| plan::to_minor(p, currency));
    let limit = (limit / tick * tick).max(tick);
    let hours = hours_priced.clamp(1, u32::MAX as u64) as u32;
    let attempt = limit.saturating_mul(spec.gpus() as u64).saturating_mul(hours as u64);
    let budget = spec.budget.map_or(attempt.saturating_mul(spec.retries as u64 + 1), |b| plan::to_minor(b, currency));
    (limit, hours, budget)
}

/// The job's framework, the version its requirements ask, its other
/// requirements, and how it was found.
type FrameworkFound = (Option<Framework>, Option<Requirement>, Vec<Requirement>, String);

/// The job's framework: said in the job file, or found in its code; with
/// the version its requirements ask, its other requirements and how it
/// was found.
fn framework_of_job(spec: &JobSpec, base: &Path) -> Result<FrameworkFound, Failure> {
    let found = || spec.code.dir().and_then(|dir| detect(&base.join(dir)).ok());
    Ok(match (&spec.code, spec.framework) {
        (CodeSource::Image(_), FrameworkChoice::Auto | FrameworkChoice::None) => {
            (None, None, Vec::new(), "none (a ready image)".to_string())
        }
        (_, FrameworkChoice::None) => {
            let requirements = found().map(|f| f.requirements).unwrap_or_default();
            (None, None, requirements, "none (said in the job file: plain code)".to_string())
        }
        (CodeSource::Dir(dir) | CodeSource::DirOnImage(dir, _), FrameworkChoice::Auto) => {
            let found = detect(&base.join(dir)).map_err(|e| Failure::Usage(e.to_string()))?;
            (found.framework, found.framework_requirement, found.requirements, found.evidence)
        }
        (_, choice) => {
            let found = found();
            let requirements = found.as_ref().map(|f| f.requirements.clone()).unwrap_or_default();
            let requirement = found.and_then(|f| f.framework_requirement);
            (framework_of(choice), requirement, requirements, "said in the job file".to_string())
        }
    })
}

/// The job's code directory packed (`None` for a ready image).
fn pack_code(spec: &JobSpec, base: &Path) -> Result<Option<gpux_jobs::bundle::Bundle>, Failure> {
    match spec.code.dir() {
        Some(dir) => Ok(Some(gpux_jobs::bundle::pack(&base.join(dir)).map_err(|e| Failure::Usage(e.to_string()))?)),
        None => Ok(None),
    }
}

/// The operator's image catalogue, from `--catalogue` or `GPUX_CATALOGUE`.
fn load_catalogue(catalogue: Option<PathBuf>) -> Result<(Option<PathBuf>, Option<Catalogue>), Failure> {
    let path = catalogue.or_else(|| std::env::var_os("GPUX_CATALOGUE").map(PathBuf::from));
    let catalogue = match &path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("reading {}: {e}", path.display())))?;
            Some(Catalogue::parse(&text).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?)
        }
        None => None,
    };
    Ok((path, catalogue))
}

/// Each trading spot or preemptible book's asks the job could use, read
/// page by page.
async fn usable_asks(
    s: &mut Session,
    spec: &JobSpec,
    instruments: &[gpux_protocol::views::Instrument],
    cluster_rules: &[gpux_engine::ClusterRule],
) -> Result<std::collections::BTreeMap<InstrumentId, plan::Asks>, Failure> {
    let mut asks = std::collections::BTreeMap::new();
    for instrument in instruments.iter().filter(|i| i.state == InstrumentState::Trading) {
        if !matches!(instrument.contract, ContractKind::Spot | ContractKind::Preemptible) {
            continue;
        }
        let mut offers = Vec::new();
        let mut after = None;
        for _ in 0..OFFER_PAGES_MAX {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::BookOffers { id, instrument: instrument.instrument, offset: 0, after }, false).await?;
            let ServerMessage::BookOffers { offers: page, next_after, .. } = answer else {
                return Err(Failure::Unreachable("expected book_offers".into()));
            };
            offers.extend(page);
            match next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let class_min_gbps = cluster_rules.iter().find(|r| r.class == instrument.class).map_or(0, |r| r.min_fabric_gbps);
        asks.insert(instrument.instrument, plan::usable_asks(spec, &offers, class_min_gbps));
    }
    Ok(asks)
}

/// The plan as one JSON object (`--json`).
fn plan_json(
    spec: &JobSpec,
    planned: &gpux_jobs::Plan,
    (framework, evidence): (Option<Framework>, &str),
    image: Option<&gpux_jobs::ImageChoice>,
    bundle: Option<&gpux_jobs::bundle::Bundle>,
    currency: &gpux_engine::Currency,
) -> serde_json::Value {
    let candidates: Vec<serde_json::Value> = planned
        .candidates
        .iter()
        .map(|c| {
            serde_json::json!({
                "instrument": c.instrument.0, "symbol": c.symbol, "class": c.class, "preemptible": c.preemptible,
                "worst_price_minor_per_gpu_hour": c.worst_price, "expected_cost_minor": c.expected_cost,
                "verdict": c.verdict.describe(&amount), "chosen": c.verdict == gpux_jobs::Verdict::Chosen,
            })
        })
        .collect();
    serde_json::json!({
        "job": spec.name,
        "framework": framework.map(Framework::name),
        "framework_evidence": evidence,
        "image": spec.code.image().map(str::to_string).or_else(|| image.map(|i| i.image.reference.clone())),
        "image_reason": match spec.code.image() {
            Some(_) => Some("the job's own (code.image)".to_string()),
            None => image.map(|i| i.reason.clone()),
        },
        "install": image.map(|i| i.install.clone()).unwrap_or_default(),
        "bundle_sha256": bundle.map(|b| b.sha256_hex()),
        "bundle_bytes": bundle.map(|b| b.bytes.len()),
        "memory_mib_per_gpu": planned.memory_mib_per_gpu,
        "gpus": spec.gpus(),
        "hours_priced": planned.hours_priced,
        "currency": currency.code,
        "candidates": candidates,
    })
}

/// The plan for people: the job, its code, framework and image, and each
/// book's verdict.
fn print_plan(
    planned_job: &Planned,
    planned: &gpux_jobs::Plan,
    (framework, evidence): (Option<Framework>, &str),
    image: Option<&gpux_jobs::ImageChoice>,
    catalogue_path: Option<&Path>,
) {
    let spec = &planned_job.spec;
    out!("job {}: {} GPU(s) ({} node(s) x {})", spec.name, spec.gpus(), spec.nodes, spec.gpus_per_node);
    if let Some(bundle) = &planned_job.bundle {
        out!(
            "code: {} file(s), {} KiB packed ({} KiB of files), sha256 {}",
            bundle.files,
            (bundle.bytes.len() as u64).div_ceil(1024),
            bundle.unpacked_bytes.div_ceil(1024),
            bundle.sha256_hex()
        );
    }
    out!("framework: {} ({evidence})", framework.map_or("none", Framework::name));
    match (&spec.code, image, framework, catalogue_path) {
        (CodeSource::Image(reference), ..) => out!("image: {reference} (the job's own)"),
        (CodeSource::DirOnImage(_, reference), ..) => out!("image: {reference} (the job's own: the code directory runs in it)"),
        (_, Some(choice), _, _) => {
            let name = choice.image.framework.map_or("framework-free", Framework::name);
            out!("image: {name} {} on {} ({})", choice.image.version, choice.image.stack, choice.reason);
            out!("       {}", choice.image.reference);
            if !choice.install.is_empty() {
                out!("installed at start: {}", choice.install.join(" "));
            }
        }
        (_, None, _, None) => {
            out!("image: none chosen (set code.image, or give --catalogue FILE, or GPUX_CATALOGUE, with the operator's preset images)")
        }
        (_, None, Some(_), Some(path)) => out!("image: none in {} for this framework and version on the chosen vendor", path.display()),
        (_, None, None, Some(path)) => {
            out!("image: no framework-free image in {} on the chosen vendor (set code.image)", path.display())
        }
    }
    if planned.memory_mib_per_gpu > 0 {
        out!("memory: {} GiB per GPU at least", planned.memory_mib_per_gpu.div_ceil(1024));
    }
    out!("priced for {} hour(s); books now:", planned.hours_priced);
    for c in &planned.candidates {
        let cost = if c.expected_cost > 0 { amount(c.expected_cost) } else { "-".into() };
        let mark = if c.verdict == gpux_jobs::Verdict::Chosen { "*" } else { " " };
        out!("{mark} {:<26} {:>16}  {}", c.symbol, cost, c.verdict.describe(&amount));
    }
}

/// A job store token for the account's own prefix.
async fn store_token(s: &mut Session) -> Result<(String, String), Failure> {
    let id = s.connection.new_id();
    match s.ask(ClientMessage::JobStoreToken { id, job: None, lease: None, volume: None }, false).await? {
        ServerMessage::JobStoreToken { url, token, .. } => Ok((url, token)),
        other => Err(Failure::Unreachable(format!("expected job_store_token, got {other:?}"))),
    }
}

fn http() -> Result<reqwest::Client, Failure> {
    reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(600))
        .build()
        .map_err(|e| Failure::Unreachable(format!("HTTP client: {e}")))
}

/// Puts `bytes` at `key` in the job store (the account's own prefix).
async fn put_object(s: &mut Session, key: &str, bytes: Vec<u8>, what: &str) -> Result<(), Failure> {
    let (url, token) = store_token(s).await?;
    let client = http()?;
    let put = |to: &str| client.put(to).bearer_auth(&token).body(bytes.clone());
    let answer = gpux_client::store::send(&url, &format!("/v1/objects/{key}"), put)
        .await
        .map_err(|e| Failure::Unreachable(format!("putting {what} in the job store at {url}: {e}")))?;
    if !answer.status().is_success() {
        let status = answer.status();
        let body = answer.text().await.unwrap_or_default();
        return Err(Failure::Refused(format!("the job store refused {what} ({status}): {body}")));
    }
    Ok(())
}

/// `gpux job submit FILE`: the plan, the code bundle put in the job store,
/// the job submitted on the chosen book.
pub async fn submit_job(
    s: &mut Session,
    file: &Path,
    catalogue: Option<PathBuf>,
    set: &[(&str, toml::Value)],
    json: bool,
) -> Result<(), Failure> {
    let planned = plan_and_print(s, file, catalogue, set, json).await?;
    let image = planned.image.clone().ok_or_else(|| {
        Failure::Usage(
            "no image to run: set code.image (your code runs in it), or give --catalogue with a preset image for the job's framework or a framework-free one".into(),
        )
    })?;
    let bundle = match &planned.bundle {
        None => None,
        Some(bundle) => {
            let key = format!("{}/bundles/{}.tar.gz", s.connection.account.0, bundle.sha256_hex());
            put_object(s, &key, bundle.bytes.clone(), "the code bundle").await?;
            Some(BundleRef { sha256: bundle.sha256_hex(), bytes: bundle.bytes.len() as u64 })
        }
    };
    let spec = &planned.spec;
    let inputs = job_inputs(s, spec, file.parent().unwrap_or(Path::new("."))).await?;
    let submission = JobSubmission {
        name: spec.name.clone(),
        instrument: planned.instrument,
        gpus: spec.gpus(),
        one_host: spec.nodes == 1,
        nodes: if spec.nodes > 1 { spec.nodes } else { 0 },
        min_fabric_gbps: spec.min_fabric_gbps,
        limit_minor_per_gpu_hour: planned.limit_minor_per_gpu_hour,
        hours: planned.hours,
        budget_minor: planned.budget_minor,
        retries: spec.retries,
        min_supplier_score_bps: spec.min_score_bps,
        verified_only: spec.verified_only,
        restarts_on_error: spec.restarts_on_error,
        alternatives: planned
            .alternatives
            .iter()
            .map(|&(instrument, limit_minor_per_gpu_hour)| gpux_protocol::JobAlternative { instrument, limit_minor_per_gpu_hour })
            .collect(),
        regions: spec.regions.clone(),
        run: JobRun {
            image,
            command: spec.command.clone(),
            bundle,
            install: planned.install.clone(),
            checkpoint_dir: spec.checkpoint_dir.clone(),
            outputs_dir: spec.outputs.clone(),
            checkpoint_interval_s: (spec.checkpoint_interval_ms / 1_000).clamp(10, 86_400) as u32,
            shm_mib: 0,
            inputs,
        },
    };
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::SubmitJob { id, job: Box::new(submission) }, json).await?;
    if let (false, ServerMessage::Job { job, .. }) = (json, answer) {
        out!("job {} submitted: {}", job.job, describe(&job.state));
        out!("follow it with `gpux job status {}`; its results with `gpux job results {}`", job.job, job.job);
    }
    Ok(())
}

/// The job's inputs: a local directory (file://) is packed and put in the
/// job store; an https:// URL is fetched by the host.
async fn job_inputs(s: &mut Session, spec: &JobSpec, base: &Path) -> Result<Vec<JobInput>, Failure> {
    let mut inputs = Vec::new();
    for input in &spec.inputs {
        let source = if let Some(path) = input.url.strip_prefix("file://") {
            let packed = gpux_jobs::bundle::pack_within(&base.join(path), gpux_jobs::bundle::Limits::INPUT)
                .map_err(|e| Failure::Usage(format!("input {}: {e}", input.name)))?;
            let key = format!("{}/inputs/{}.tar.gz", s.connection.account.0, packed.sha256_hex());
            put_object(s, &key, packed.bytes.clone(), &format!("input {}", input.name)).await?;
            InputSource::Store { sha256: packed.sha256_hex(), bytes: packed.bytes.len() as u64 }
        } else if input.url.starts_with("https://") {
            InputSource::Https { url: input.url.clone() }
        } else {
            return Err(Failure::Usage(format!(
                "input {}: {} is not fetched by hosts (they would need your store's keys): copy it here and name it file://DIR, or give a public https:// URL",
                input.name, input.url
            )));
        };
        inputs.push(JobInput { name: input.name.clone(), mount: input.mount.clone(), source });
    }
    Ok(inputs)
}

/// A job's state in words.
pub fn describe(state: &JobState) -> String {
    match state {
        JobState::Bidding { attempt, order: None } => format!("bidding (attempt {attempt})"),
        JobState::Bidding { attempt, order: Some(order) } => format!("bidding (attempt {attempt}, order {})", order.0),
        JobState::Running { attempt, leases } => {
            let leases: Vec<String> = leases.iter().map(|l| l.0.to_string()).collect();
            format!("running (attempt {attempt}, lease {})", leases.join(", "))
        }
        JobState::Starting { attempt, leases } => {
            let leases: Vec<String> = leases.iter().map(|l| l.0.to_string()).collect();
            format!("starting (attempt {attempt}, lease {}: its hosts are starting it)", leases.join(", "))
        }
        JobState::Succeeded => "succeeded".into(),
        JobState::Cancelled => "cancelled".into(),
        JobState::Failed(failure) => format!("failed: {}", failure_text(failure)),
    }
}

fn failure_text(failure: &JobFailure) -> String {
    match failure {
        JobFailure::RetriesExhausted => "its hosts failed more often than it may retry".into(),
        JobFailure::BudgetSpent => "its budget pays for no further attempt".into(),
        JobFailure::BidRefused(code) => format!("its bid was refused: {}", code.message()),
        JobFailure::BidClosed(reason) => format!("its bid closed unfilled ({reason:?})"),
        JobFailure::OutOfTime => "its leases ran their hours before it finished".into(),
        JobFailure::WorkloadFailed(code) => format!("the workload exited with {code}"),
        JobFailure::Undeliverable(code) => format!("no host could start it: {}", code.describe()),
    }
}

fn print_job(job: &JobInfo) {
    out!("job {} {}: {}", job.job, job.name, describe(&job.state));
    out!(
        "  {} GPU(s) on instrument {}, attempt {} (retries {}, restarts on error {} of {})",
        job.gpus,
        job.instrument.0,
        job.attempts,
        job.retries,
        job.restarts,
        job.restarts_on_error
    );
    if let Some(moved) = &job.last_move {
        let cause = match moved.cause {
            gpux_protocol::AttemptCause::HostFailed => "its host failed".to_string(),
            gpux_protocol::AttemptCause::Preempted => "it was preempted".to_string(),
            gpux_protocol::AttemptCause::ExitedWithError(code) => format!("the workload exited with {code}"),
        };
        let choice = match moved.choice {
            gpux_protocol::BookChoice::Cheapest { expected_minor, offering } => {
                format!("the cheapest of {offering} book(s) offering it, {} expected", amount(expected_minor))
            }
            gpux_protocol::BookChoice::NoneOffered => "no book offered it: waits on its book".to_string(),
        };
        out!("  attempt {} because {cause}; bids instrument {}: {choice}", moved.attempt, moved.instrument.0);
    }
    if let Some(ahead) = &job.preemption_ahead {
        out!(
            "  preemption ahead: lease {} gets its notice at {} ms and ends at {} ms (a reserved window sold on its GPUs)",
            ahead.lease.0,
            ahead.notice_at_ms,
            ahead.ends_at_ms
        );
    }
    out!("  escrowed {} of a budget of {}", amount(job.escrowed_minor), amount(job.budget_minor));
    let leases: Vec<String> = job.leases.iter().map(|l| l.0.to_string()).collect();
    out!("  leases: {}", if leases.is_empty() { "none yet".into() } else { leases.join(", ") });
    out!("  runs {} in {}", job.run.command.join(" "), job.run.image);
    for input in &job.run.inputs {
        let from = match &input.source {
            InputSource::Store { bytes, .. } => format!("the job store, {} KiB packed", bytes.div_ceil(1024)),
            InputSource::Https { url } => url.clone(),
        };
        out!("  input {} at {} (read-only), from {from}", input.name, input.mount);
    }
}

pub async fn job_action(s: &mut Session, action: &crate::JobAction, json: bool) -> Result<(), Failure> {
    use crate::JobAction as A;
    match action {
        A::Plan { .. } => unreachable!("planned without a login"),
        A::Submit { file, catalogue, set, .. } => submit_job(s, file, catalogue.clone(), &set.overrides()?, json).await,
        A::Status { job } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Job { job, .. }) = (json, s.ask(ClientMessage::JobStatus { id, job: JobId(*job) }, json).await?) {
                print_job(&job);
            }
            Ok(())
        }
        A::List => list_jobs(s, json).await,
        A::Cancel { job } => {
            let id = s.connection.new_id();
            if let (false, ServerMessage::Job { job, .. }) = (json, s.ask(ClientMessage::CancelJob { id, job: JobId(*job) }, json).await?) {
                out!(
                    "job {}: {}",
                    job.job,
                    if job.state.is_over() { describe(&job.state) } else { "cancelling (its bid or leases end)".into() }
                );
            }
            Ok(())
        }
        A::Logs { job, bytes, follow, attempt } => job_logs(s, JobId(*job), *bytes, (*follow, *attempt), json).await,
        A::Resize { job, gpus } => {
            let id = s.connection.new_id();
            let request = ClientMessage::ResizeJob { id, job: JobId(*job), gpus: *gpus };
            if let (false, ServerMessage::Job { job, .. }) = (json, s.ask(request, json).await?) {
                out!("job {}: bidding for {gpus} GPU(s) while it runs on; it restarts there once the bid fills", job.job);
            }
            Ok(())
        }
        A::Bill { job, html } => crate::invoice::document(s, crate::invoice::Document::Job(*job), html.clone(), None, json).await,
        A::Results { job, to, checkpoints } => results(s, JobId(*job), to.clone(), *checkpoints, json).await,
    }
}

/// `gpux job list`: the account's jobs, page by page.
async fn list_jobs(s: &mut Session, json: bool) -> Result<(), Failure> {
    let mut offset = 0;
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Jobs { jobs, next_offset, .. } = s.ask(ClientMessage::Jobs { id, offset }, json).await? else {
            return Err(Failure::Unreachable("expected jobs".into()));
        };
        if !json {
            for job in &jobs {
                out!("{:>6}  {:<24} {}", job.job.0, job.name, describe(&job.state));
            }
        }
        match next_offset {
            Some(next) => offset = next,
            None => return Ok(()),
        }
    }
}

/// `gpux job logs`: a running job's output from its host (followed with
/// `follow` until the job ends), or, once it ended (or its host does not
/// answer), the tails its hosts kept in the job store.
async fn job_logs(s: &mut Session, job: JobId, bytes: u32, (follow, attempt): (bool, Option<u32>), json: bool) -> Result<(), Failure> {
    let mut info = job_info(s, job).await?;
    if attempt.is_some() || info.state.is_over() {
        return kept_logs(s, &info, attempt, json).await;
    }
    let mut shown = String::new();
    loop {
        let live = match &info.state {
            JobState::Running { leases, .. } | JobState::Starting { leases, .. } => leases.last().copied(),
            _ => None,
        };
        if let Some(lease) = live {
            let id = s.connection.new_id();
            let answer = s.connection.request(ClientMessage::LeaseLogs { id, lease, tail_bytes: bytes }).await;
            match answer.map_err(|e| Failure::Unreachable(format!("{e:#}")))? {
                ServerMessage::LeaseLogs { data, truncated, .. } if !follow => {
                    if json {
                        out!("{}", serde_json::json!({"job": job.0, "lease": lease.0, "data": data, "truncated": truncated}));
                    } else {
                        if truncated {
                            out!("[... earlier output cut]");
                        }
                        print!("{data}");
                    }
                    return Ok(());
                }
                ServerMessage::LeaseLogs { data, .. } => {
                    print!("{}", unseen(&shown, &data));
                    shown = data;
                }
                // Its host is gone: what it kept is in the store.
                _ if !follow => return kept_logs(s, &info, None, json).await,
                _ => {}
            }
        } else if !follow {
            return Err(Failure::Refused(format!("job {} is not running: {}", job, describe(&info.state))));
        }
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        info = job_info(s, job).await?;
        if info.state.is_over() {
            out!("[job {}: {}]", job, describe(&info.state));
            return Ok(());
        }
    }
}

async fn job_info(s: &mut Session, job: JobId) -> Result<JobInfo, Failure> {
    let id = s.connection.new_id();
    match s.ask(ClientMessage::JobStatus { id, job }, false).await? {
        ServerMessage::Job { job, .. } => Ok(*job),
        _ => Err(Failure::Unreachable("expected job".into())),
    }
}

/// What `now` holds beyond what was printed (`before`): the output after
/// the longest end of `before` that `now` starts with (a tail window moves).
fn unseen<'a>(before: &str, now: &'a str) -> &'a str {
    if before.is_empty() {
        return now;
    }
    for (start, _) in before.char_indices() {
        if now.starts_with(&before[start..]) {
            return &now[before.len() - start..];
        }
    }
    now
}

/// The tails the job's hosts kept in the job store
/// (`logs/attempt-<A>-rank-<R>.log`): `attempt`'s, or the newest attempt's.
async fn kept_logs(s: &mut Session, info: &JobInfo, attempt: Option<u32>, json: bool) -> Result<(), Failure> {
    let (url, token) = store_token(s).await?;
    let client = http()?;
    let prefix = format!("{}/jobs/{}/logs", s.connection.account.0, info.job.0);
    let listed = store_list(&client, &url, &token, &prefix).await?;
    let parse = |key: &str| -> Option<(u32, u32)> {
        let name = key.rsplit('/').next()?.strip_prefix("attempt-")?.strip_suffix(".log")?;
        let (a, r) = name.split_once("-rank-")?;
        Some((a.parse().ok()?, r.parse().ok()?))
    };
    let mut kept: Vec<(u32, u32, String)> = listed.iter().filter_map(|l| parse(&l.key).map(|(a, r)| (a, r, l.key.clone()))).collect();
    kept.sort();
    let Some(wanted) = attempt.or_else(|| kept.last().map(|k| k.0)) else {
        return Err(Failure::Refused(format!(
            "job {} kept no output ({}): its hosts put none in the job store",
            info.job,
            describe(&info.state)
        )));
    };
    let ranks: Vec<&(u32, u32, String)> = kept.iter().filter(|k| k.0 == wanted).collect();
    if ranks.is_empty() {
        return Err(Failure::Refused(format!("job {} kept no output of attempt {wanted}", info.job)));
    }
    let mut shown = Vec::new();
    for (_, rank, key) in ranks.iter().copied() {
        let answer = gpux_client::store::send(&url, &format!("/v1/objects/{key}"), |to| client.get(to).bearer_auth(&token)).await;
        let answer = answer.map_err(|e| Failure::Unreachable(e.to_string()))?;
        if !answer.status().is_success() {
            return Err(Failure::Refused(format!("the job store refused {key}: {}", answer.status())));
        }
        let text = String::from_utf8_lossy(&answer.bytes().await.map_err(|e| Failure::Unreachable(e.to_string()))?).into_owned();
        shown.push((*rank, text));
    }
    if json {
        let logs: Vec<serde_json::Value> = shown.iter().map(|(rank, data)| serde_json::json!({"rank": rank, "data": data})).collect();
        out!("{}", serde_json::json!({"job": info.job.0, "state": describe(&info.state), "attempt": wanted, "logs": logs}));
        return Ok(());
    }
    out!("[job {} ({}): attempt {wanted}'s output, kept by its host]", info.job, describe(&info.state));
    for (rank, data) in &shown {
        if shown.len() > 1 {
            out!("== rank {rank} ==");
        }
        print!("{data}");
    }
    Ok(())
}

#[derive(serde::Deserialize)]
struct Listed {
    key: String,
    bytes: u64,
}

/// The job store's objects under `prefix` (its listing).
async fn store_list(client: &reqwest::Client, url: &str, token: &str, prefix: &str) -> Result<Vec<Listed>, Failure> {
    let answer = gpux_client::store::send(url, &format!("/v1/list/{prefix}"), |to| client.get(to).bearer_auth(token))
        .await
        .map_err(|e| Failure::Unreachable(format!("the job store at {url}: {e}")))?;
    if !answer.status().is_success() {
        return Err(Failure::Refused(format!("the job store refused the listing: {}", answer.status())));
    }
    let body = answer.bytes().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
    serde_json::from_slice(&body).map_err(|e| Failure::Unreachable(format!("the job store's listing: {e}")))
}

/// `gpux job results JOB`: the job's outputs (and its checkpoints with
/// `--checkpoints`) downloaded from the job store into `to`.
async fn results(s: &mut Session, job: JobId, to: Option<PathBuf>, checkpoints: bool, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::Job { job: info, .. } = s.ask(ClientMessage::JobStatus { id, job }, false).await? else {
        return Err(Failure::Unreachable("expected job".into()));
    };
    let to = to.unwrap_or_else(|| PathBuf::from(format!("{}-{}", info.name, job.0)));
    let (url, token) = store_token(s).await?;
    let client = http()?;
    let account = s.connection.account.0;
    let mut areas = vec!["outputs"];
    if checkpoints {
        areas.push("checkpoints");
    }
    let mut fetched = Vec::new();
    for area in areas {
        let prefix = format!("{account}/jobs/{}/{area}", job.0);
        let listed = store_list(&client, &url, &token, &prefix).await?;
        for item in listed {
            let Some(relative) = item.key.strip_prefix(&format!("{}/jobs/{}/", account, job.0)) else { continue };
            if relative.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                continue;
            }
            let answer = gpux_client::store::send(&url, &format!("/v1/objects/{}", item.key), |to| client.get(to).bearer_auth(&token))
                .await
                .map_err(|e| Failure::Unreachable(e.to_string()))?;
            if !answer.status().is_success() {
                return Err(Failure::Refused(format!("the job store refused {relative}: {}", answer.status())));
            }
            let bytes = answer.bytes().await.map_err(|e| Failure::Unreachable(e.to_string()))?;
            let path = to.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Failure::Usage(format!("{}: {e}", parent.display())))?;
            }
            std::fs::write(&path, &bytes).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
            fetched.push((relative.to_string(), item.bytes));
        }
    }
    if json {
        let files: Vec<serde_json::Value> = fetched.iter().map(|(path, bytes)| serde_json::json!({"path": path, "bytes": bytes})).collect();
        out!("{}", serde_json::json!({"job": job.0, "state": describe(&info.state), "dir": to.display().to_string(), "files": files}));
    } else {
        out!("job {} ({}): {} file(s) into {}", job.0, describe(&info.state), fetched.len(), to.display());
        for (path, bytes) in &fetched {
            out!("  {path} ({bytes} bytes)");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn unseen_output_is_what_follows_the_printed_tail() {
        assert_eq!(super::unseen("", "a\nb\n"), "a\nb\n");
        assert_eq!(super::unseen("a\nb\n", "a\nb\nc\n"), "c\n");
        assert_eq!(super::unseen("a\nb\n", "b\nc\n"), "c\n", "the window moved on");
        assert_eq!(super::unseen("x\n", "y\n"), "y\n", "nothing in common: all of it");
        assert_eq!(super::unseen("a\n", "a\n"), "", "nothing new");
    }
}
