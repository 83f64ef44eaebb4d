//! `gpux job plan`: what a job would run on, decided on this machine from
//! its job file, its code and the exchange's books now (docs/jobs.md "The
//! plan"). Public market data only: no login, no order.

use std::path::{Path, PathBuf};

use gpux_engine::{ContractKind, InstrumentState};
use gpux_jobs::catalogue::Catalogue;
use gpux_jobs::spec::{CodeSource, FrameworkChoice};
use gpux_jobs::{detect, plan, Framework, JobSpec};
use gpux_protocol::{ClientMessage, ServerMessage};

use crate::commands::Session;
use crate::money::amount;
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

pub async fn plan_job(s: &mut Session, file: &Path, catalogue: Option<PathBuf>, json: bool) -> Result<(), Failure> {
    let text = std::fs::read_to_string(file).map_err(|e| Failure::Usage(format!("reading {}: {e}", file.display())))?;
    let spec = JobSpec::parse(&text).map_err(|e| Failure::Usage(format!("{}: {e}", file.display())))?;
    let base = file.parent().unwrap_or(Path::new("."));
    // The framework: said, or found in the code.
    let (framework, requirement, requirements, evidence) = match (&spec.code, spec.framework) {
        (_, FrameworkChoice::None) | (CodeSource::Image(_), FrameworkChoice::Auto) => {
            (None, None, Vec::new(), "none (a ready image or plain code)".to_string())
        }
        (CodeSource::Dir(dir), FrameworkChoice::Auto) => {
            let found = detect(&base.join(dir)).map_err(|e| Failure::Usage(e.to_string()))?;
            (found.framework, found.framework_requirement, found.requirements, found.evidence)
        }
        (code, choice) => {
            let found = match code {
                CodeSource::Dir(dir) => detect(&base.join(dir)).ok(),
                CodeSource::Image(_) => None,
            };
            let requirements = found.as_ref().map(|f| f.requirements.clone()).unwrap_or_default();
            let requirement = found.and_then(|f| f.framework_requirement);
            (framework_of(choice), requirement, requirements, "said in the job file".to_string())
        }
    };
    // The code bundle, packed as it would be sent (its hash is what the
    // exchange will hold).
    let bundle = match &spec.code {
        CodeSource::Dir(dir) => Some(gpux_jobs::bundle::pack(&base.join(dir)).map_err(|e| Failure::Usage(e.to_string()))?),
        CodeSource::Image(_) => None,
    };
    let catalogue_path = catalogue.or_else(|| std::env::var_os("GPUX_CATALOGUE").map(PathBuf::from));
    let catalogue = match &catalogue_path {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("reading {}: {e}", path.display())))?;
            Some(Catalogue::parse(&text).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?)
        }
        None => None,
    };
    let vendors = match (framework, &catalogue) {
        (Some(framework), Some(catalogue)) => Some(catalogue.vendors_for(framework, spec.vendor)),
        _ => None,
    };

    // The market now.
    let id = s.connection.new_id();
    let ServerMessage::Listing { listing, .. } = s.ask(ClientMessage::Listing { id }, false).await? else {
        return Err(Failure::Unreachable("expected the listing".into()));
    };
    let id = s.connection.new_id();
    let ServerMessage::Instruments { instruments, .. } = s.ask(ClientMessage::Instruments { id }, false).await? else {
        return Err(Failure::Unreachable("expected the instruments".into()));
    };
    let mut asks = std::collections::BTreeMap::new();
    for instrument in instruments.iter().filter(|i| i.state == InstrumentState::Trading) {
        if !matches!(instrument.contract, ContractKind::Spot | ContractKind::Preemptible) {
            continue;
        }
        let mut offers = Vec::new();
        let mut offset = 0;
        for _ in 0..OFFER_PAGES_MAX {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::BookOffers { id, instrument: instrument.instrument, offset }, false).await?;
            let ServerMessage::BookOffers { offers: page, next_offset, .. } = answer else {
                return Err(Failure::Unreachable("expected book_offers".into()));
            };
            offers.extend(page);
            match next_offset {
                Some(next) => offset = next,
                None => break,
            }
        }
        asks.insert(instrument.instrument, plan::usable_asks(&spec, &offers));
    }
    let market = plan::Market { listing: &listing, instruments: &instruments, asks: &asks };
    let planned = plan(&spec, &market, vendors.as_ref());
    let chosen = planned.chosen();
    let image = match (framework, &catalogue, chosen) {
        (Some(framework), Some(catalogue), Some(chosen)) => catalogue.choose(framework, requirement.as_ref(), chosen.vendor, &requirements),
        _ => None,
    };
    let currency = &listing.currency;
    if json {
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
        let plan = serde_json::json!({
            "job": spec.name,
            "framework": framework.map(Framework::name),
            "framework_evidence": evidence,
            "image": image.as_ref().map(|i| i.image.reference.clone()),
            "image_reason": image.as_ref().map(|i| i.reason.clone()),
            "install": image.as_ref().map(|i| i.install.clone()).unwrap_or_default(),
            "bundle_sha256": bundle.as_ref().map(|b| b.sha256_hex()),
            "bundle_bytes": bundle.as_ref().map(|b| b.bytes.len()),
            "memory_mib_per_gpu": planned.memory_mib_per_gpu,
            "gpus": spec.gpus(),
            "hours_priced": planned.hours_priced,
            "currency": currency.code,
            "candidates": candidates,
        });
        out!("{plan}");
        return if chosen.is_some() { Ok(()) } else { Err(Failure::Refused("no book meets the job now".into())) };
    }
    out!("job {}: {} GPU(s) ({} node(s) x {})", spec.name, spec.gpus(), spec.nodes, spec.gpus_per_node);
    if let Some(bundle) = &bundle {
        out!(
            "code: {} file(s), {} KiB packed ({} KiB of files), sha256 {}",
            bundle.files,
            (bundle.bytes.len() as u64).div_ceil(1024),
            bundle.unpacked_bytes.div_ceil(1024),
            bundle.sha256_hex()
        );
    }
    out!("framework: {} ({evidence})", framework.map_or("none", Framework::name));
    match (&spec.code, &image, framework, &catalogue_path) {
        (CodeSource::Image(reference), _, _, _) => out!("image: {reference} (the job's own)"),
        (_, Some(choice), _, _) => {
            out!("image: {} {} on {} ({})", choice.image.framework.name(), choice.image.version, choice.image.stack, choice.reason);
            out!("       {}", choice.image.reference);
            if !choice.install.is_empty() {
                out!("installed at start: {}", choice.install.join(" "));
            }
        }
        (_, None, Some(_), None) => {
            out!("image: none chosen (give --catalogue FILE, or GPUX_CATALOGUE, with the operator's preset images)")
        }
        (_, None, Some(_), Some(path)) => out!("image: none in {} for this framework and version on the chosen vendor", path.display()),
        (_, None, None, _) => out!("image: none (no framework: set code.image)"),
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
    match chosen {
        Some(c) => {
            out!("plan: {} for {} expected (bids at up to {}/GPU-h)", c.symbol, amount(c.expected_cost), amount(c.worst_price));
            Ok(())
        }
        None => Err(Failure::Refused("no book meets the job now: see why above (raise the limits, or wait for asks)".into())),
    }
}
