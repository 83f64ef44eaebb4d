//! Huawei Ascend NPUs (910B, 910, 310P) through `npu-smi`, the tool the
//! Ascend driver installs. `npu-smi info` prints a text table (it has no
//! JSON mode): two rows per chip (NPU id, name, health, power, temperature;
//! chip id, bus id, AI core use, memory, HBM), then a process table.
//! `npu-smi info -t board -i <npu>` gives the board's serial number (the
//! device identity) and `npu-smi info -t topo` whether the NPUs are joined
//! by HCCS links.

use std::collections::BTreeMap;

use gpux_engine::{GpuSpec, Interconnect, Vendor};

use super::{leading_number, unreadable, SystemTool, Tool};
use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};

/// `npu-smi info` read: its text, its chips, and processes per NPU.
type Info = (String, Vec<ChipRow>, BTreeMap<u32, u32>);

pub struct AscendBackend {
    tool: Box<dyn Tool>,
    /// Each chip's identity, read once per (NPU, chip).
    uuids: BTreeMap<(u32, u32), String>,
}

/// One chip's two rows of `npu-smi info`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChipRow {
    pub npu: u32,
    pub chip: u32,
    /// As printed, e.g. `910B3`.
    pub name: String,
    /// `OK`, `Warning`, `Alarm`, `Critical` (or `NOT_EXIST` for an NPU that dropped off the bus).
    pub health: String,
    pub power_w: Option<f64>,
    pub temperature_c: Option<u32>,
    pub bus_id: String,
    pub aicore_percent: Option<u32>,
    /// (used, total) MB of the chip's DDR memory and of its HBM.
    pub memory_mb: Option<(u32, u32)>,
    pub hbm_mb: Option<(u32, u32)>,
}

impl ChipRow {
    /// HBM where the chip has it (910 parts), else its DDR memory (310P).
    fn memory(&self) -> Option<(u32, u32)> {
        self.hbm_mb.filter(|(_, total)| *total > 0).or(self.memory_mb)
    }
}

/// `3161 / 65536` -> (3161, 65536).
fn used_total(text: &str) -> Option<(u32, u32)> {
    let (used, total) = text.split_once('/')?;
    Some((used.trim().parse().ok()?, total.trim().parse().ok()?))
}

/// The cells of a table row: `| a | b |` -> [a, b].
fn cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// The last cell of a chip row holds several columns separated by runs of
/// spaces; `used / total` pairs are one column each.
fn columns(text: &str) -> Vec<String> {
    let mut joined = text.to_string();
    while joined.contains(" /") || joined.contains("/ ") {
        joined = joined.replace(" /", "/").replace("/ ", "/");
    }
    joined.split_whitespace().map(str::to_string).collect()
}

/// Parses `npu-smi info`: its chips, and the processes counted per NPU.
pub fn parse_info(text: &str) -> Result<(Vec<ChipRow>, BTreeMap<u32, u32>), String> {
    let mut chips = Vec::new();
    let mut processes = BTreeMap::new();
    let mut pending: Option<(u32, String, String, Vec<String>)> = None;
    let mut in_processes = false;
    for line in text.lines() {
        if line.contains("Process id") {
            in_processes = true;
            continue;
        }
        let Some(cells) = cells(line) else { continue };
        if in_processes {
            // `| 0       0   | 12345 | python3 | 3212 |`
            if cells.len() >= 4 {
                let npu = cells[0].split_whitespace().next().and_then(|n| n.parse::<u32>().ok());
                if let (Some(npu), true) = (npu, cells[1].parse::<u64>().is_ok()) {
                    *processes.entry(npu).or_insert(0) += 1;
                }
            }
            continue;
        }
        if cells.len() != 3 {
            continue;
        }
        let first: Vec<&str> = cells[0].split_whitespace().collect();
        let numeric = |word: &&str| word.parse::<u32>().is_ok();
        if pending.is_some() && cells[1].contains(':') && first.first().is_some_and(numeric) {
            // `| Chip [Device] | Bus-Id | AICore Memory HBM |` (310P cards also print the device id).
            let Some((npu, name, health, top)) = pending.take() else { continue };
            let bottom = columns(cells[2]);
            chips.push(ChipRow {
                npu,
                chip: first[0].parse().unwrap_or(0),
                name,
                health,
                power_w: top.first().and_then(|v| leading_number(v)),
                temperature_c: top.get(1).and_then(|v| leading_number(v)).map(|t| t as u32),
                bus_id: cells[1].to_string(),
                aicore_percent: bottom.first().and_then(|v| leading_number(v)).map(|u| u as u32),
                memory_mb: bottom.get(1).and_then(|v| used_total(v)),
                hbm_mb: bottom.get(2).and_then(|v| used_total(v)),
            });
        } else if let [npu, name] = first.as_slice() {
            if numeric(npu) && !numeric(name) {
                pending = Some((npu.parse().unwrap_or(0), name.to_string(), cells[1].to_string(), columns(cells[2])));
            }
        }
    }
    if chips.is_empty() && !text.contains("No NPU") {
        return Err("no NPU rows in the table".into());
    }
    Ok((chips, processes))
}

/// `npu-smi info -t board -i N`: `Key : Value` lines.
fn key_values(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_string(), value.trim().to_string()))
        .filter(|(key, _)| !key.is_empty())
        .collect()
}

/// NPUs with an HCCS link to another, from `npu-smi info -t topo`.
pub fn hccs_npus(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let npu = words.next()?.strip_prefix("NPU")?.parse::<u32>().ok()?;
            words.any(|w| w == "HCCS").then_some(npu)
        })
        .collect()
}

/// The driver version from the table's header (`Version: 23.0.rc3`).
fn driver_version(text: &str) -> Option<String> {
    let after = text.split("Version:").nth(1)?;
    after.split_whitespace().next().map(|v| v.trim_end_matches('|').to_string()).filter(|v| !v.is_empty())
}

impl AscendBackend {
    pub fn open() -> Result<Self, BackendError> {
        Self::with_tool(Box::new(SystemTool::default()))
    }

    pub fn with_tool(mut tool: Box<dyn Tool>) -> Result<Self, BackendError> {
        match tool.run("npu-smi", &["info"]) {
            Ok(_) => Ok(AscendBackend { tool, uuids: BTreeMap::new() }),
            Err(BackendError::Unavailable(_)) => Err(BackendError::Unavailable(
                "npu-smi is not installed: install the Ascend NPU driver (it ships npu-smi), or pick another --backend".into(),
            )),
            Err(error) => Err(error),
        }
    }

    fn info(&mut self) -> Result<Info, BackendError> {
        let text = self.tool.run("npu-smi", &["info"])?;
        let (chips, processes) = parse_info(&text).map_err(|e| unreadable("npu-smi info", e))?;
        Ok((text, chips, processes))
    }

    /// A chip's identity: the board's serial number and the chip's index
    /// on it (stable across reboots and bus renumbering); the bus id when
    /// the board query fails.
    fn uuid(&mut self, chip: &ChipRow) -> String {
        if let Some(uuid) = self.uuids.get(&(chip.npu, chip.chip)) {
            return uuid.clone();
        }
        let npu = chip.npu.to_string();
        let serial = self
            .tool
            .run("npu-smi", &["info", "-t", "board", "-i", &npu])
            .ok()
            .and_then(|text| key_values(&text).get("Serial Number").cloned())
            .filter(|serial| !serial.is_empty() && serial != "NA");
        let uuid = match serial {
            Some(serial) => format!("NPU-{serial}-{}", chip.chip),
            None => format!("NPU-{}", chip.bus_id),
        };
        self.uuids.insert((chip.npu, chip.chip), uuid.clone());
        uuid
    }
}

impl GpuBackend for AscendBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        let (text, chips, _) = self.info()?;
        // Without a topology answer, no fabric is claimed.
        let fabric = self.tool.run("npu-smi", &["info", "-t", "topo"]).map(|t| hccs_npus(&t)).unwrap_or_default();
        let driver = driver_version(&text);
        let mut inventory = Vec::new();
        for chip in &chips {
            let (_, total) = chip.memory().ok_or_else(|| unreadable("npu-smi info", format!("NPU {} has no memory column", chip.npu)))?;
            inventory.push(GpuInventory {
                uuid: self.uuid(chip),
                spec: GpuSpec {
                    vendor: Vendor::Huawei,
                    model: format!("Ascend {}", chip.name),
                    memory_mib: total,
                    interconnect: if fabric.contains(&chip.npu) { Interconnect::Hccs } else { Interconnect::Pcie },
                    mig_profile: None,
                },
                parent_uuid: None,
                pci_bus_id: Some(chip.bus_id.clone()),
                driver_version: driver.clone(),
                cuda_version: None,
                mig_enabled: false,
            });
        }
        Ok(inventory)
    }

    fn sample(&mut self, _at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        let (_, chips, processes) = self.info()?;
        let mut samples = Vec::new();
        for chip in &chips {
            let memory = chip.memory();
            samples.push(GpuSample {
                uuid: self.uuid(chip),
                // Warning, Alarm and Critical all withdraw the chip: the
                // renter pays for a chip the driver is not worried about.
                healthy: chip.health == "OK" && memory.is_some() && chip.temperature_c.is_none_or(|t| t <= TEMPERATURE_MAX_C),
                utilisation_percent: chip.aicore_percent.unwrap_or(0),
                memory_used_mib: memory.map_or(0, |(used, _)| used),
                temperature_c: chip.temperature_c,
                power_mw: chip.power_w.map(|w| (w * 1000.0) as u32),
                // npu-smi info prints no ECC count; an uncorrected HBM
                // error raises the chip's health to Alarm or Critical.
                ecc_uncorrected: None,
                processes: processes.get(&chip.npu).copied().unwrap_or(0),
            });
        }
        Ok(samples)
    }
}
