//! The job file (docs/jobs.md "The job file"): TOML a renter writes once
//! and submits, or the same fields as `gpux job submit` flags. Parsed
//! strictly (unknown keys are errors, so a typo never silently drops a
//! limit) and checked whole before anything is planned; each mistake is a
//! typed [`SpecError`] naming the field.

use std::path::PathBuf;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::Deserialize;

/// GPUs one node of a job may ask for (a host holds at most 64).
pub const GPUS_PER_NODE_MAX: u32 = 64;
/// Nodes one job may span.
pub const NODES_MAX: u32 = 64;
/// The longest a job may run, in hours (90 days, as a lease).
pub const DURATION_HOURS_MAX: u64 = 24 * 90;
/// Retries after a failure (each one a new lease and a resume).
pub const RETRIES_MAX: u32 = 100;
/// Restarts after the program's own errors (a non-zero exit).
pub const RESTARTS_ON_ERROR_MAX: u32 = gpux_protocol::jobs::limits::RESTARTS_ON_ERROR_MAX;
/// Regions a job accepts, and classes it names.
pub const REGIONS_MAX: usize = gpux_protocol::jobs::limits::REGIONS_MAX;
pub const CLASSES_MAX: usize = 16;
/// Arguments of the command, inputs, and bytes of any one text field.
pub const COMMAND_ARGS_MAX: usize = 256;
pub const INPUTS_MAX: usize = 32;
pub const TEXT_BYTES_MAX: usize = 4096;

/// Why a job file is refused. Each names the field a renter fixes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("the job file does not parse: {0}")]
    Toml(String),
    #[error("name: 1 to 64 characters of letters, digits, '-', '_' or '.'")]
    Name,
    #[error("code: give `dir` (your code, packed and sent), `image` (a ready image), or both (your code run in that image)")]
    CodeSource,
    #[error("code.command: the command to run, a non-empty list of at most {COMMAND_ARGS_MAX} arguments")]
    Command,
    #[error("resources.gpus_per_node: 1 to {GPUS_PER_NODE_MAX}")]
    GpusPerNode,
    #[error("resources.min_fabric_gbps: 1 to 100000, with nodes above 1")]
    FabricGbps,
    #[error("resources.nodes: 1 to {NODES_MAX}")]
    Nodes,
    #[error("resources: give `gpu_memory_gib` or `model_params`, not both")]
    MemoryTwice,
    #[error("resources.model_params: a count such as 350M, 7B or 1.5T")]
    ModelParams,
    #[error("resources.gpu_memory_gib: 1 to 4096")]
    GpuMemory,
    #[error("limits.{0}: a positive amount such as 2.50")]
    Amount(&'static str),
    /// A comma in an amount, refused whatever it was meant as
    /// (docs/first-hour.md "Amounts"): both readings named.
    #[error("limits.{field}: `{text}`: `.` is the only decimal separator and amounts take no thousands separators: write {readings}")]
    AmountComma { field: &'static str, text: String, readings: String },
    #[error("limits.max_duration: a duration such as 90m, 6h or 2d, at most {DURATION_HOURS_MAX} h")]
    Duration,
    #[error("data.checkpoint_interval: a duration such as 10m, at least 10 s")]
    CheckpointInterval,
    #[error("data.{0}: an absolute path inside the container, such as /outputs")]
    ContainerPath(&'static str),
    #[error("data.inputs: at most {INPUTS_MAX}, each with a name, a url (s3://, gs://, az://, file:// or https://) and an absolute mount")]
    Input,
    #[error("limits.retries: at most {RETRIES_MAX}")]
    Retries,
    #[error("limits.restarts_on_error: at most {RESTARTS_ON_ERROR_MAX}")]
    Restarts,
    #[error("limits.region: a region's name, or a list of 1 to {REGIONS_MAX} distinct names")]
    Regions,
    #[error("resources.classes: a list of 1 to {CLASSES_MAX} distinct class names")]
    Classes,
    #[error("limits.min_score: a share from 0 to 1, such as 0.95")]
    MinScore,
    #[error("{0}: at most {TEXT_BYTES_MAX} bytes")]
    TooLong(&'static str),
}

/// What the job runs on: the framework it was written for (detected from
/// the code when `auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FrameworkChoice {
    #[default]
    Auto,
    Pytorch,
    Tensorflow,
    Paddlepaddle,
    Jax,
    /// Plain Python or a ready image: no framework image, no detection.
    None,
}

/// Whether the model trains (weights, gradients and optimizer state on the
/// GPU) or only runs (weights alone): what sizes its memory need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Training,
    Inference,
}

/// Which contracts the job may run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ContractChoice {
    /// Spot or preemptible, whichever is expected to cost less.
    #[default]
    Any,
    Spot,
    Preemptible,
}

/// The vendor stack the job's framework build needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum VendorChoice {
    /// Any vendor the framework has a preset image for.
    #[default]
    Any,
    Nvidia,
    Amd,
    Huawei,
    Cambricon,
    Intel,
    Iluvatar,
}

impl VendorChoice {
    /// Whether a GPU of `vendor` is one the job may run on.
    pub fn allows(self, vendor: gpux_engine::Vendor) -> bool {
        use gpux_engine::Vendor as V;
        match self {
            VendorChoice::Any => true,
            VendorChoice::Nvidia => vendor == V::Nvidia,
            VendorChoice::Amd => vendor == V::Amd,
            VendorChoice::Huawei => vendor == V::Huawei,
            VendorChoice::Cambricon => vendor == V::Cambricon,
            VendorChoice::Intel => vendor == V::Intel,
            VendorChoice::Iluvatar => vendor == V::Iluvatar,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: String,
    code: CodeFile,
    #[serde(default)]
    resources: ResourcesFile,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    data: DataFile,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeFile {
    dir: Option<PathBuf>,
    image: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    framework: FrameworkChoice,
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResourcesFile {
    gpus_per_node: Option<u32>,
    nodes: Option<u32>,
    min_fabric_gbps: Option<u32>,
    gpu_memory_gib: Option<u32>,
    model_params: Option<String>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    vendor: VendorChoice,
    classes: Option<Vec<String>>,
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    max_price_per_gpu_hour: Option<String>,
    budget: Option<String>,
    max_duration: Option<String>,
    region: Option<OneOrMany>,
    min_score: Option<f64>,
    #[serde(default)]
    verified_only: bool,
    #[serde(default)]
    contract: ContractChoice,
    retries: Option<u32>,
    restarts_on_error: Option<u32>,
    failover: Option<bool>,
}

/// A field that takes one name or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Clone, Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DataFile {
    #[serde(default)]
    inputs: Vec<InputFile>,
    outputs: Option<String>,
    checkpoint_dir: Option<String>,
    checkpoint_interval: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct InputFile {
    name: String,
    url: String,
    mount: String,
}

/// Where the job's code comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodeSource {
    /// A directory on the renter's machine, packed and sent (relative paths
    /// are from the job file's directory).
    Dir(PathBuf),
    /// A ready image (a reference the hosts can pull).
    Image(String),
    /// The directory's code run in an image the renter names (instead of
    /// a preset image: any framework, or none).
    DirOnImage(PathBuf, String),
}

impl CodeSource {
    /// The code directory to pack, if any.
    pub fn dir(&self) -> Option<&std::path::Path> {
        match self {
            CodeSource::Dir(dir) | CodeSource::DirOnImage(dir, _) => Some(dir),
            CodeSource::Image(_) => None,
        }
    }

    /// The image the renter named, if any.
    pub fn image(&self) -> Option<&str> {
        match self {
            CodeSource::Image(image) | CodeSource::DirOnImage(_, image) => Some(image),
            CodeSource::Dir(_) => None,
        }
    }
}

/// How much GPU memory the job needs per GPU: given, or from the model's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryNeed {
    /// Nothing said: any class will do (the smallest by cost).
    Unstated,
    GpuMemoryGib(u32),
    /// Parameters of the model (350M = 350_000_000).
    ModelParams(u64),
}

/// A dataset mounted read-only into the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    pub name: String,
    pub url: String,
    pub mount: String,
}

/// A job, checked whole.
#[derive(Clone, Debug, PartialEq)]
pub struct JobSpec {
    pub name: String,
    pub code: CodeSource,
    pub command: Vec<String>,
    pub framework: FrameworkChoice,
    pub gpus_per_node: u32,
    pub nodes: u32,
    /// Several nodes: the least bandwidth of the fabric that joins them,
    /// Gb/s (0: any fabric).
    pub min_fabric_gbps: u32,
    pub memory: MemoryNeed,
    pub mode: Mode,
    pub vendor: VendorChoice,
    /// In the exchange's currency, major units (2.50), converted with the
    /// listing's decimals when the job is planned.
    pub max_price_per_gpu_hour: Option<Decimal>,
    pub budget: Option<Decimal>,
    pub max_duration_ms: Option<u64>,
    /// The regions whose hosts the job accepts (empty: any).
    pub regions: Vec<String>,
    /// The classes the job accepts (empty: any that meets it).
    pub classes: Vec<String>,
    /// Restarts after the workload's own errors.
    pub restarts_on_error: u32,
    /// Whether new attempts may bid on the other books that meet the job
    /// (docs/jobs.md "Failover"); default on.
    pub failover: bool,
    /// Basis points (0.95 = 9 500).
    pub min_score_bps: u32,
    pub verified_only: bool,
    pub contract: ContractChoice,
    pub retries: u32,
    pub inputs: Vec<Input>,
    pub outputs: String,
    pub checkpoint_dir: String,
    pub checkpoint_interval_ms: u64,
}

/// Retries when the file says nothing.
pub const RETRIES_DEFAULT: u32 = 3;
/// Checkpoint interval when the file says nothing (10 minutes).
pub const CHECKPOINT_INTERVAL_MS_DEFAULT: u64 = 10 * 60_000;

impl JobSpec {
    /// Parses and checks a job file.
    pub fn parse(text: &str) -> Result<JobSpec, SpecError> {
        Self::parse_with(text, &[])
    }

    /// Parses a job file with some of its fields set by flags (`gpux job
    /// submit --budget 20`): each `(key, value)` sets the dotted key
    /// (`limits.budget`) before the whole is checked, so a flag is held to
    /// the same rules as the file. `code.image` replaces `code.dir` and the
    /// other way round.
    pub fn parse_with(text: &str, overrides: &[(&str, toml::Value)]) -> Result<JobSpec, SpecError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| SpecError::Toml(e.to_string()))?;
        for (key, value) in overrides {
            let (section, field) = key.split_once('.').map_or((None, *key), |(s, f)| (Some(s), f));
            let target = match section {
                None => &mut table,
                Some(section) => {
                    let entry = table.entry(section).or_insert_with(|| toml::Value::Table(toml::Table::new()));
                    let Some(inner) = entry.as_table_mut() else { return Err(SpecError::Toml(format!("{section} is not a table"))) };
                    inner
                }
            };
            match (section, field) {
                (Some("code"), "image") => drop(target.remove("dir")),
                (Some("code"), "dir") => drop(target.remove("image")),
                _ => {}
            }
            target.insert(field.to_string(), value.clone());
        }
        let file: File = table.try_into().map_err(|e: toml::de::Error| SpecError::Toml(e.to_string()))?;
        file.check()
    }

    /// The GPUs the whole job holds at once.
    pub fn gpus(&self) -> u32 {
        self.gpus_per_node * self.nodes
    }
}

impl File {
    fn check(self) -> Result<JobSpec, SpecError> {
        let name_ok =
            (1..=64).contains(&self.name.len()) && self.name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(SpecError::Name);
        }
        let framework = self.code.framework;
        let (code, command) = self.code.check()?;
        let (mode, vendor) = (self.resources.mode, self.resources.vendor);
        let classes = self.resources.classes.clone().unwrap_or_default();
        let distinct: std::collections::BTreeSet<&String> = classes.iter().collect();
        if self.resources.classes.is_some()
            && (classes.is_empty()
                || classes.len() > CLASSES_MAX
                || distinct.len() != classes.len()
                || classes.iter().any(|c| c.is_empty() || c.len() > 64))
        {
            return Err(SpecError::Classes);
        }
        let (gpus_per_node, nodes, min_fabric_gbps, memory) = self.resources.check()?;
        let (verified_only, contract) = (self.limits.verified_only, self.limits.contract);
        let limits = self.limits.check()?;
        let (inputs, outputs, checkpoint_dir, checkpoint_interval_ms) = self.data.check()?;
        Ok(JobSpec {
            name: self.name,
            code,
            command,
            framework,
            gpus_per_node,
            nodes,
            min_fabric_gbps,
            memory,
            mode,
            vendor,
            max_price_per_gpu_hour: limits.max_price_per_gpu_hour,
            budget: limits.budget,
            max_duration_ms: limits.max_duration_ms,
            regions: limits.regions,
            classes,
            restarts_on_error: limits.restarts_on_error,
            failover: limits.failover,
            min_score_bps: limits.min_score_bps,
            verified_only,
            contract,
            retries: limits.retries,
            inputs,
            outputs,
            checkpoint_dir,
            checkpoint_interval_ms,
        })
    }
}

impl CodeFile {
    /// Where the code comes from, and the command that runs it.
    fn check(self) -> Result<(CodeSource, Vec<String>), SpecError> {
        let code = match (self.dir, self.image) {
            (Some(_), Some(image)) | (None, Some(image)) if image.trim().is_empty() => return Err(SpecError::CodeSource),
            (Some(dir), None) => CodeSource::Dir(dir),
            (None, Some(image)) => CodeSource::Image(text(image, "code.image")?),
            (Some(dir), Some(image)) => CodeSource::DirOnImage(dir, text(image, "code.image")?),
            (None, None) => return Err(SpecError::CodeSource),
        };
        let command = self.command;
        if command.is_empty() || command.len() > COMMAND_ARGS_MAX || command[0].trim().is_empty() {
            return Err(SpecError::Command);
        }
        if command.iter().any(|argument| argument.len() > TEXT_BYTES_MAX) {
            return Err(SpecError::TooLong("code.command"));
        }
        Ok((code, command))
    }
}

impl ResourcesFile {
    /// GPUs per node, nodes, the fabric's least bandwidth and the memory need.
    fn check(self) -> Result<(u32, u32, u32, MemoryNeed), SpecError> {
        let gpus_per_node = self.gpus_per_node.unwrap_or(1);
        if !(1..=GPUS_PER_NODE_MAX).contains(&gpus_per_node) {
            return Err(SpecError::GpusPerNode);
        }
        let nodes = self.nodes.unwrap_or(1);
        if !(1..=NODES_MAX).contains(&nodes) {
            return Err(SpecError::Nodes);
        }
        let min_fabric_gbps = self.min_fabric_gbps.unwrap_or(0);
        if min_fabric_gbps > 100_000 || (min_fabric_gbps > 0 && nodes == 1) {
            return Err(SpecError::FabricGbps);
        }
        let memory = match (self.gpu_memory_gib, self.model_params) {
            (Some(_), Some(_)) => return Err(SpecError::MemoryTwice),
            (Some(gib), None) if (1..=4096).contains(&gib) => MemoryNeed::GpuMemoryGib(gib),
            (Some(_), None) => return Err(SpecError::GpuMemory),
            (None, Some(params)) => MemoryNeed::ModelParams(parse_count(&params).ok_or(SpecError::ModelParams)?),
            (None, None) => MemoryNeed::Unstated,
        };
        Ok((gpus_per_node, nodes, min_fabric_gbps, memory))
    }
}

/// `[limits]` checked.
struct Limits {
    max_price_per_gpu_hour: Option<Decimal>,
    budget: Option<Decimal>,
    max_duration_ms: Option<u64>,
    regions: Vec<String>,
    min_score_bps: u32,
    retries: u32,
    restarts_on_error: u32,
    failover: bool,
}

impl LimitsFile {
    fn check(self) -> Result<Limits, SpecError> {
        let max_price_per_gpu_hour = self.max_price_per_gpu_hour.map(|a| amount(&a, "max_price_per_gpu_hour")).transpose()?;
        let budget = self.budget.map(|a| amount(&a, "budget")).transpose()?;
        let max_duration_ms = match self.max_duration {
            None => None,
            Some(text) => {
                let ms = parse_duration_ms(&text).ok_or(SpecError::Duration)?;
                if ms == 0 || ms > DURATION_HOURS_MAX * gpux_engine::time::MS_PER_HOUR {
                    return Err(SpecError::Duration);
                }
                Some(ms)
            }
        };
        let min_score_bps = match self.min_score {
            None => 0,
            Some(share) if (0.0..=1.0).contains(&share) => (share * 10_000.0).round() as u32,
            Some(_) => return Err(SpecError::MinScore),
        };
        let retries = self.retries.unwrap_or(RETRIES_DEFAULT);
        if retries > RETRIES_MAX {
            return Err(SpecError::Retries);
        }
        let restarts_on_error = self.restarts_on_error.unwrap_or(0);
        if restarts_on_error > RESTARTS_ON_ERROR_MAX {
            return Err(SpecError::Restarts);
        }
        let named = self.region.is_some();
        let regions = match self.region {
            None => Vec::new(),
            Some(OneOrMany::One(region)) => vec![region],
            Some(OneOrMany::Many(regions)) => regions,
        };
        let distinct: std::collections::BTreeSet<&String> = regions.iter().collect();
        if regions.len() > REGIONS_MAX || distinct.len() != regions.len() || regions.iter().any(|r| r.is_empty() || r.len() > 64) {
            return Err(SpecError::Regions);
        }
        if named && regions.is_empty() {
            return Err(SpecError::Regions);
        }
        let failover = self.failover.unwrap_or(true);
        Ok(Limits { max_price_per_gpu_hour, budget, max_duration_ms, regions, min_score_bps, retries, restarts_on_error, failover })
    }
}

impl DataFile {
    /// The inputs, the outputs and checkpoint directories, the checkpoint interval.
    fn check(self) -> Result<(Vec<Input>, String, String, u64), SpecError> {
        if self.inputs.len() > INPUTS_MAX {
            return Err(SpecError::Input);
        }
        let schemes = ["s3://", "gs://", "az://", "file://", "https://"];
        let mut inputs = Vec::new();
        for input in self.inputs {
            let ok = !input.name.is_empty()
                && schemes.iter().any(|scheme| input.url.starts_with(scheme))
                && container_path(&input.mount)
                && input.url.len() <= TEXT_BYTES_MAX;
            if !ok {
                return Err(SpecError::Input);
            }
            inputs.push(Input { name: input.name, url: input.url, mount: input.mount });
        }
        let outputs = self.outputs.unwrap_or_else(|| "/outputs".into());
        if !container_path(&outputs) {
            return Err(SpecError::ContainerPath("outputs"));
        }
        let checkpoint_dir = self.checkpoint_dir.unwrap_or_else(|| "/checkpoints".into());
        if !container_path(&checkpoint_dir) {
            return Err(SpecError::ContainerPath("checkpoint_dir"));
        }
        let checkpoint_interval_ms = match self.checkpoint_interval {
            None => CHECKPOINT_INTERVAL_MS_DEFAULT,
            Some(text) => parse_duration_ms(&text).filter(|ms| *ms >= 10_000).ok_or(SpecError::CheckpointInterval)?,
        };
        Ok((inputs, outputs, checkpoint_dir, checkpoint_interval_ms))
    }
}

fn text(value: String, field: &'static str) -> Result<String, SpecError> {
    if value.len() > TEXT_BYTES_MAX {
        return Err(SpecError::TooLong(field));
    }
    Ok(value)
}

/// An amount read as every gpux client reads one (docs/first-hour.md
/// "Amounts"): digits with at most one `.`, a `$` before it allowed; a
/// comma refused with both readings. Its decimals are checked against the
/// exchange's currency where that is known (`gpux job plan`).
fn amount(text: &str, field: &'static str) -> Result<Decimal, SpecError> {
    let body = text.trim();
    let body = body.strip_prefix('$').unwrap_or(body);
    if body.contains(',') {
        let whole = body.replace(',', "");
        let readings = match body.matches(',').count() == 1 && !body.contains('.') {
            true => format!("`{}` or `{whole}`", body.replace(',', ".")),
            false => format!("`{whole}`"),
        };
        return Err(SpecError::AmountComma { field, text: text.to_string(), readings });
    }
    let (whole, fraction) = body.split_once('.').unwrap_or((body, "0"));
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) {
        return Err(SpecError::Amount(field));
    }
    let value = Decimal::from_str(body).map_err(|_| SpecError::Amount(field))?;
    if value <= Decimal::ZERO {
        return Err(SpecError::Amount(field));
    }
    Ok(value)
}

fn container_path(path: &str) -> bool {
    path.starts_with('/') && path.len() <= 256 && !path.split('/').any(|part| part == "..") && !path.contains('\0')
}

/// `350M`, `7B`, `1.5T`, `125000000`: a count of parameters.
pub fn parse_count(text: &str) -> Option<u64> {
    let text = text.trim();
    let (number, scale) = match text.chars().last()? {
        'K' | 'k' => (&text[..text.len() - 1], 1_000u64),
        'M' | 'm' => (&text[..text.len() - 1], 1_000_000),
        'B' | 'b' | 'G' | 'g' => (&text[..text.len() - 1], 1_000_000_000),
        'T' | 't' => (&text[..text.len() - 1], 1_000_000_000_000),
        _ => (text, 1),
    };
    let number = Decimal::from_str(number.trim()).ok()?;
    if number <= Decimal::ZERO {
        return None;
    }
    let count = number.checked_mul(Decimal::from(scale))?.trunc();
    u64::try_from(count).ok().filter(|count| *count > 0)
}

/// `90s`, `30m`, `6h`, `2d` (one unit), in milliseconds.
pub fn parse_duration_ms(text: &str) -> Option<u64> {
    let text = text.trim();
    let unit_ms = match text.chars().last()? {
        's' => 1_000u64,
        'm' => 60_000,
        'h' => gpux_engine::time::MS_PER_HOUR,
        'd' => gpux_engine::time::MS_PER_DAY,
        _ => return None,
    };
    let number: u64 = text[..text.len() - 1].trim().parse().ok()?;
    number.checked_mul(unit_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_set_fields_and_are_checked_as_the_file_is() {
        let text = "name = \"a\"\n[code]\ndir = \".\"\ncommand = [\"python\", \"t.py\"]\n[limits]\nbudget = \"10\"\n";
        let flags = [
            ("limits.budget", toml::Value::String("25".into())),
            ("resources.gpus_per_node", toml::Value::Integer(4)),
            ("code.image", toml::Value::String("registry.example.com/x@sha256:ab".into())),
        ];
        let spec = JobSpec::parse_with(text, &flags).expect("valid");
        assert_eq!(spec.budget, Some(Decimal::from(25)));
        assert_eq!(spec.gpus_per_node, 4);
        assert!(matches!(spec.code, CodeSource::Image(_)), "the image replaced the directory");
        let bad = [("limits.max_duration", toml::Value::String("forever".into()))];
        assert_eq!(JobSpec::parse_with(text, &bad).err(), Some(SpecError::Duration));
    }

    const FULL: &str = r#"
name = "resnet-train"

[code]
dir = "."
command = ["python", "train.py", "--epochs", "10"]
framework = "auto"

[resources]
gpus_per_node = 2
model_params = "350M"

[limits]
max_price_per_gpu_hour = "2.50"
budget = "100"
max_duration = "6h"
min_score = 0.9
contract = "preemptible"
retries = 5

[data]
inputs = [{ name = "imagenet", url = "s3://datasets/imagenet", mount = "/data" }]
checkpoint_interval = "5m"
"#;

    #[test]
    fn a_full_job_file_parses_with_its_defaults_filled() {
        let spec = JobSpec::parse(FULL).expect("parses");
        assert_eq!(spec.code, CodeSource::Dir(".".into()));
        assert_eq!((spec.gpus_per_node, spec.nodes, spec.gpus()), (2, 1, 2));
        assert_eq!(spec.memory, MemoryNeed::ModelParams(350_000_000));
        assert_eq!(spec.max_price_per_gpu_hour, Some(Decimal::new(250, 2)));
        assert_eq!(spec.max_duration_ms, Some(6 * 3_600_000));
        assert_eq!((spec.min_score_bps, spec.contract, spec.retries), (9_000, ContractChoice::Preemptible, 5));
        assert_eq!(
            (spec.outputs.as_str(), spec.checkpoint_dir.as_str(), spec.checkpoint_interval_ms),
            ("/outputs", "/checkpoints", 300_000)
        );
        assert_eq!(spec.inputs[0].mount, "/data");
    }

    #[test]
    fn a_code_directory_may_run_in_an_image_the_renter_names() {
        let spec = JobSpec::parse(&FULL.replace("dir = \".\"", "dir = \".\"\nimage = \"python:3.12-slim\"")).expect("valid");
        assert_eq!(spec.code, CodeSource::DirOnImage(".".into(), "python:3.12-slim".into()));
        assert_eq!((spec.code.dir(), spec.code.image()), (Some(std::path::Path::new(".")), Some("python:3.12-slim")));
    }

    #[test]
    fn each_mistake_names_its_field() {
        let with = |from: &str, to: &str| JobSpec::parse(&FULL.replace(from, to));
        let cases: &[(&str, &str, SpecError)] = &[
            ("name = \"resnet-train\"", "name = \"bad name\"", SpecError::Name),
            ("dir = \".\"", "dir = \".\"\nimage = \" \"", SpecError::CodeSource),
            ("dir = \".\"", "", SpecError::CodeSource),
            ("command = [\"python\", \"train.py\", \"--epochs\", \"10\"]", "command = []", SpecError::Command),
            ("gpus_per_node = 2", "gpus_per_node = 65", SpecError::GpusPerNode),
            ("gpus_per_node = 2", "gpus_per_node = 2\nnodes = 0", SpecError::Nodes),
            ("model_params = \"350M\"", "model_params = \"350M\"\ngpu_memory_gib = 8", SpecError::MemoryTwice),
            ("model_params = \"350M\"", "model_params = \"lots\"", SpecError::ModelParams),
            ("\"2.50\"", "\"-1\"", SpecError::Amount("max_price_per_gpu_hour")),
            ("budget = \"100\"", "budget = \"ten\"", SpecError::Amount("budget")),
            ("budget = \"100\"", "budget = \"1e3\"", SpecError::Amount("budget")),
            ("budget = \"100\"", "budget = \"-5\"", SpecError::Amount("budget")),
            (
                "budget = \"100\"",
                "budget = \"0,50\"",
                SpecError::AmountComma { field: "budget", text: "0,50".into(), readings: "`0.50` or `050`".into() },
            ),
            (
                "budget = \"100\"",
                "budget = \"1,000.50\"",
                SpecError::AmountComma { field: "budget", text: "1,000.50".into(), readings: "`1000.50`".into() },
            ),
            ("max_duration = \"6h\"", "max_duration = \"forever\"", SpecError::Duration),
            ("max_duration = \"6h\"", "max_duration = \"91d\"", SpecError::Duration),
            ("min_score = 0.9", "min_score = 1.5", SpecError::MinScore),
            ("retries = 5", "retries = 101", SpecError::Retries),
            ("mount = \"/data\"", "mount = \"data\"", SpecError::Input),
            ("s3://datasets", "ftp://datasets", SpecError::Input),
            ("checkpoint_interval = \"5m\"", "checkpoint_interval = \"1s\"", SpecError::CheckpointInterval),
            ("checkpoint_interval = \"5m\"", "checkpoint_dir = \"/a/../b\"", SpecError::ContainerPath("checkpoint_dir")),
        ];
        for (from, to, expected) in cases {
            assert_eq!(with(from, to).as_ref().err(), Some(expected), "{from} -> {to}");
        }
        // A misspelt key is refused, not ignored.
        assert!(matches!(with("budget = ", "budjet = "), Err(SpecError::Toml(_))));
    }

    #[test]
    fn counts_and_durations_parse_as_people_write_them() {
        assert_eq!(parse_count("7B"), Some(7_000_000_000));
        assert_eq!(parse_count("1.5T"), Some(1_500_000_000_000));
        assert_eq!(parse_count("125000000"), Some(125_000_000));
        assert_eq!(parse_count("0"), None);
        assert_eq!(parse_duration_ms("90s"), Some(90_000));
        assert_eq!(parse_duration_ms("2d"), Some(172_800_000));
        assert_eq!(parse_duration_ms("2"), None);
    }
}
