//! AMD Instinct and Radeon GPUs through `amd-smi` (ROCm 6 and later), with
//! `rocm-smi --json` as the fallback on hosts whose ROCm predates amd-smi.
//!
//! `amd-smi` has printed its JSON in two shapes (a bare list of GPUs, and
//! `{"gpu_data": [...]}` from ROCm 6.4) and values either bare or as
//! `{"value": v, "unit": u}`; both are read. A GPU split into compute
//! partitions (`CPX`, `DPX`, ...) is listed as one device per partition by
//! the tool itself, each sold in the class for its profile
//! (`<compute>.<memory>` in lower case, e.g. `cpx.nps1`), like a MIG slice.

use gpux_engine::{GpuSpec, Interconnect, Vendor};
use serde_json::Value;

use super::{leading_number, unreadable, SystemTool, Tool};
use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};
pub use crate::limits::HOTSPOT_MAX_C;

/// One card of `rocm-smi --json`: its fields by name.
type Card = serde_json::Map<String, Value>;

pub struct AmdBackend {
    tool: Box<dyn Tool>,
    /// Set when `amd-smi` is missing and `rocm-smi` answered instead.
    rocm_smi: bool,
}

const ROCM_SMI_ARGS: &[&str] =
    &["--showproductname", "--showuniqueid", "--showbus", "--showmeminfo", "vram", "--showtemp", "--showpower", "--showuse", "--json"];

impl AmdBackend {
    /// The host's `amd-smi`, else its `rocm-smi`; neither: unavailable,
    /// with what to install.
    pub fn open() -> Result<Self, BackendError> {
        Self::with_tool(Box::new(SystemTool::default()))
    }

    pub fn with_tool(mut tool: Box<dyn Tool>) -> Result<Self, BackendError> {
        match tool.run("amd-smi", &["version", "--json"]) {
            Ok(_) => Ok(AmdBackend { tool, rocm_smi: false }),
            Err(BackendError::Unavailable(_)) => match tool.run("rocm-smi", ROCM_SMI_ARGS) {
                Ok(_) => Ok(AmdBackend { tool, rocm_smi: true }),
                Err(BackendError::Unavailable(_)) => Err(BackendError::Unavailable(
                    "neither amd-smi nor rocm-smi is installed: install ROCm (amd-smi ships with ROCm 6), or pick another --backend".into(),
                )),
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        }
    }

    fn json(&mut self, args: &[&str]) -> Result<Vec<Value>, BackendError> {
        let what = format!("amd-smi {}", args.join(" "));
        let text = self.tool.run("amd-smi", args)?;
        let value: Value = serde_json::from_str(&text).map_err(|e| unreadable(&what, format!("not JSON: {e}")))?;
        match value {
            Value::Array(gpus) => Ok(gpus),
            Value::Object(mut object) => match object.remove("gpu_data") {
                Some(Value::Array(gpus)) => Ok(gpus),
                _ => Err(unreadable(&what, "expected a list of GPUs or {\"gpu_data\": [...]}")),
            },
            _ => Err(unreadable(&what, "expected a list of GPUs")),
        }
    }

    fn rocm_smi(&mut self) -> Result<Vec<(String, Card)>, BackendError> {
        let text = self.tool.run("rocm-smi", ROCM_SMI_ARGS)?;
        let value: Value = serde_json::from_str(&text).map_err(|e| unreadable("rocm-smi --json", format!("not JSON: {e}")))?;
        let Value::Object(cards) = value else { return Err(unreadable("rocm-smi --json", "expected an object of cards")) };
        let mut cards: Vec<(u32, String, Card)> = cards
            .into_iter()
            .filter_map(|(name, card)| {
                let index = name.strip_prefix("card")?.parse().ok()?;
                match card {
                    Value::Object(fields) => Some((index, name, fields)),
                    _ => None,
                }
            })
            .collect();
        cards.sort_by_key(|(index, _, _)| *index);
        Ok(cards.into_iter().map(|(_, name, fields)| (name, fields)).collect())
    }
}

/// The GPU's index in an `amd-smi` record.
fn gpu_index(record: &Value) -> Option<u64> {
    record.get("gpu").and_then(Value::as_u64)
}

/// A reading: `v` or `{"value": v, "unit": u}`; `"N/A"` is none.
fn reading(value: Option<&Value>) -> Option<f64> {
    match value? {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => leading_number(s),
        Value::Object(o) => reading(o.get("value")),
        _ => None,
    }
}

/// A reading in MiB whatever unit the tool printed (`MB` in amd-smi means MiB).
fn mib(value: Option<&Value>) -> Option<u32> {
    let amount = reading(value)?;
    let unit = value.and_then(|v| v.get("unit")).and_then(Value::as_str).unwrap_or("MB");
    let mib = match unit {
        "B" => amount / (1024.0 * 1024.0),
        "KB" => amount / 1024.0,
        "GB" => amount * 1024.0,
        _ => amount,
    };
    Some(mib as u32)
}

fn text<'a>(record: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut value = record;
    for key in path {
        value = value.get(key)?;
    }
    value.as_str().map(str::trim).filter(|s| !s.is_empty() && *s != "N/A")
}

fn partition_profile(record: &Value) -> Option<String> {
    let compute = text(record, &["partition", "compute_partition"])?;
    if compute.eq_ignore_ascii_case("SPX") {
        return None;
    }
    let memory = text(record, &["partition", "memory_partition"]).unwrap_or("NPS1");
    Some(format!("{}.{}", compute.to_ascii_lowercase(), memory.to_ascii_lowercase()))
}

impl GpuBackend for AmdBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        if self.rocm_smi {
            return self.rocm_smi().map(|cards| cards.iter().map(|(name, card)| rocm_smi_inventory(name, card)).collect());
        }
        let list = self.json(&["list", "--json"])?;
        let statics = self.json(&["static", "--json"])?;
        let mut inventory = Vec::new();
        for entry in &list {
            let index = gpu_index(entry).ok_or_else(|| unreadable("amd-smi list --json", "a GPU without its index"))?;
            let uuid = text(entry, &["uuid"]).ok_or_else(|| unreadable("amd-smi list --json", format!("GPU {index} has no uuid")))?;
            let record = statics
                .iter()
                .find(|s| gpu_index(s) == Some(index))
                .ok_or_else(|| unreadable("amd-smi static --json", format!("no record for GPU {index}")))?;
            let model = text(record, &["asic", "market_name"])
                .ok_or_else(|| unreadable("amd-smi static --json", format!("GPU {index} has no asic.market_name")))?;
            let memory_mib = mib(record.get("vram").and_then(|v| v.get("size")))
                .ok_or_else(|| unreadable("amd-smi static --json", format!("GPU {index} has no vram.size")))?;
            let profile = partition_profile(record);
            // OAM modules (the Instinct platforms) are joined by xGMI links.
            let oam = record.get("asic").and_then(|a| a.get("oam_id")).and_then(Value::as_u64).is_some();
            inventory.push(GpuInventory {
                uuid: uuid.to_string(),
                spec: GpuSpec {
                    vendor: Vendor::Amd,
                    model: model.to_string(),
                    memory_mib,
                    interconnect: if oam { Interconnect::InfinityFabric } else { Interconnect::Pcie },
                    mig_profile: profile.clone(),
                },
                parent_uuid: None,
                pci_bus_id: text(entry, &["bdf"]).or_else(|| text(record, &["bus", "bdf"])).map(str::to_string),
                driver_version: text(record, &["driver", "version"]).map(str::to_string),
                cuda_version: None,
                mig_enabled: profile.is_some(),
            });
        }
        Ok(inventory)
    }

    fn sample(&mut self, _at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        if self.rocm_smi {
            return self.rocm_smi().map(|cards| cards.iter().map(|(name, card)| rocm_smi_sample(name, card)).collect());
        }
        let list = self.json(&["list", "--json"])?;
        let metrics = self.json(&["metric", "--json"])?;
        // Processes are a separate query; a tool too old for it counts none.
        let processes = self.json(&["process", "--json"]).unwrap_or_default();
        let mut samples = Vec::new();
        for entry in &list {
            let (Some(index), Some(uuid)) = (gpu_index(entry), text(entry, &["uuid"])) else { continue };
            let Some(metric) = metrics.iter().find(|m| gpu_index(m) == Some(index)) else {
                // Listed but not answering: unhealthy, not an error of the whole host.
                samples.push(GpuSample {
                    uuid: uuid.to_string(),
                    healthy: false,
                    utilisation_percent: 0,
                    memory_used_mib: 0,
                    temperature_c: None,
                    power_mw: None,
                    ecc_uncorrected: None,
                    processes: 0,
                });
                continue;
            };
            let edge = reading(metric.pointer("/temperature/edge")).map(|t| t as u32);
            let hotspot = reading(metric.pointer("/temperature/hotspot")).map(|t| t as u32);
            let ecc_uncorrected = reading(metric.pointer("/ecc/total_uncorrectable_count")).map(|e| e as u64);
            let used = mib(metric.pointer("/mem_usage/used_vram"));
            let too_hot = edge.is_some_and(|t| t > TEMPERATURE_MAX_C) || hotspot.is_some_and(|t| t > HOTSPOT_MAX_C);
            let process_count = processes
                .iter()
                .find(|p| gpu_index(p) == Some(index))
                .and_then(|p| p.get("process_list"))
                .and_then(Value::as_array)
                .map_or(0, |list| list.iter().filter(|p| p.pointer("/process_info/pid").is_some()).count() as u32);
            samples.push(GpuSample {
                uuid: uuid.to_string(),
                healthy: used.is_some() && !too_hot && ecc_uncorrected.is_none_or(|e| e == 0),
                utilisation_percent: reading(metric.pointer("/usage/gfx_activity")).map_or(0, |u| u as u32),
                memory_used_mib: used.unwrap_or(0),
                temperature_c: edge.or(hotspot),
                power_mw: reading(metric.pointer("/power/socket_power")).map(|w| (w * 1000.0) as u32),
                ecc_uncorrected,
                processes: process_count,
            });
        }
        Ok(samples)
    }
}

fn field<'a>(card: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a str> {
    card.get(name).and_then(Value::as_str).map(str::trim).filter(|s| !s.is_empty() && *s != "N/A")
}

/// The first field whose name starts with `prefix` (rocm-smi names its
/// power and temperature fields after the sensor, which varies by part).
fn field_starting<'a>(card: &'a serde_json::Map<String, Value>, prefixes: &[&str]) -> Option<&'a str> {
    prefixes.iter().find_map(|prefix| card.iter().find(|(k, _)| k.starts_with(prefix)).and_then(|(_, v)| v.as_str()))
}

fn rocm_smi_inventory(name: &str, card: &Card) -> GpuInventory {
    let bytes = field(card, "VRAM Total Memory (B)").and_then(leading_number).unwrap_or(0.0);
    GpuInventory {
        uuid: field(card, "Unique ID").map_or_else(|| format!("AMD-{name}"), |id| format!("AMD-{id}")),
        spec: GpuSpec {
            vendor: Vendor::Amd,
            model: field(card, "Card Series").or_else(|| field(card, "Card series")).unwrap_or("AMD GPU").to_string(),
            memory_mib: (bytes / (1024.0 * 1024.0)) as u32,
            interconnect: Interconnect::Pcie,
            mig_profile: None,
        },
        parent_uuid: None,
        pci_bus_id: field(card, "PCI Bus").map(str::to_string),
        driver_version: None,
        cuda_version: None,
        mig_enabled: false,
    }
}

fn rocm_smi_sample(name: &str, card: &Card) -> GpuSample {
    let inventory = rocm_smi_inventory(name, card);
    let edge = field_starting(card, &["Temperature (Sensor edge)"]).and_then(leading_number).map(|t| t as u32);
    let junction = field_starting(card, &["Temperature (Sensor junction)"]).and_then(leading_number).map(|t| t as u32);
    let used = field(card, "VRAM Total Used Memory (B)").and_then(leading_number).map(|b| (b / (1024.0 * 1024.0)) as u32);
    let power = field_starting(card, &["Current Socket Graphics Package Power", "Average Graphics Package Power"]).and_then(leading_number);
    GpuSample {
        uuid: inventory.uuid,
        healthy: used.is_some() && edge.is_none_or(|t| t <= TEMPERATURE_MAX_C) && junction.is_none_or(|t| t <= HOTSPOT_MAX_C),
        utilisation_percent: field(card, "GPU use (%)").and_then(leading_number).map_or(0, |u| u as u32),
        memory_used_mib: used.unwrap_or(0),
        temperature_c: edge.or(junction),
        power_mw: power.map(|w| (w * 1000.0) as u32),
        // rocm-smi prints ECC counts only with --showrasinfo, per block;
        // the fallback does not read them (docs/agent.md says so).
        ecc_uncorrected: None,
        processes: 0,
    }
}
