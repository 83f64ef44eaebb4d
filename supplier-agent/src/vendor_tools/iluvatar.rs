//! Iluvatar CoreX GPUs (BI-V100, BI-V150, MR-V100) through `ixsmi`, which
//! follows nvidia-smi's command line: `--query-gpu=<fields>
//! --format=csv,noheader,nounits` prints one CSV row per GPU, `[N/A]` or
//! `[Not Supported]` where a reading is missing, and
//! `--query-compute-apps=gpu_uuid,pid` one row per running process.

use gpux_engine::{GpuSpec, Interconnect, Vendor};

use super::{leading_number, unreadable, SystemTool, Tool};
use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};

const QUERY: &str = "--query-gpu=index,uuid,name,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,pci.bus_id,driver_version,ecc.errors.uncorrected.volatile.total";
const FORMAT: &str = "--format=csv,noheader,nounits";
const APPS: &str = "--query-compute-apps=gpu_uuid,pid";

pub struct IluvatarBackend {
    tool: Box<dyn Tool>,
}

/// One row of the GPU query.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_mib: u32,
    pub memory_used_mib: Option<u32>,
    pub utilisation_percent: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    pub bus_id: Option<String>,
    pub driver_version: Option<String>,
    pub ecc_uncorrected: Option<u64>,
}

fn present(value: &str) -> Option<&str> {
    let value = value.trim();
    (!value.is_empty() && !value.starts_with('[') && value != "N/A").then_some(value)
}

/// Parses the GPU query's CSV rows.
pub fn parse_query(text: &str) -> Result<Vec<Row>, String> {
    let mut rows = Vec::new();
    for (number, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 11 {
            return Err(format!("row {}: {} fields, expected 11", number + 1, fields.len()));
        }
        let number_of = |i: usize| present(fields[i]).and_then(leading_number);
        rows.push(Row {
            index: fields[0].parse().map_err(|_| format!("row {}: index {:?} is not a number", number + 1, fields[0]))?,
            uuid: present(fields[1]).ok_or_else(|| format!("row {}: no uuid", number + 1))?.to_string(),
            name: present(fields[2]).ok_or_else(|| format!("row {}: no name", number + 1))?.to_string(),
            memory_total_mib: number_of(3).ok_or_else(|| format!("row {}: no memory.total", number + 1))? as u32,
            memory_used_mib: number_of(4).map(|v| v as u32),
            utilisation_percent: number_of(5).map(|v| v as u32),
            temperature_c: number_of(6).map(|v| v as u32),
            power_w: number_of(7),
            bus_id: present(fields[8]).map(str::to_string),
            driver_version: present(fields[9]).map(str::to_string),
            ecc_uncorrected: number_of(10).map(|v| v as u64),
        });
    }
    Ok(rows)
}

impl IluvatarBackend {
    pub fn open() -> Result<Self, BackendError> {
        Self::with_tool(Box::new(SystemTool::default()))
    }

    pub fn with_tool(mut tool: Box<dyn Tool>) -> Result<Self, BackendError> {
        match tool.run("ixsmi", &[QUERY, FORMAT]) {
            Ok(_) => Ok(IluvatarBackend { tool }),
            Err(BackendError::Unavailable(_)) => Err(BackendError::Unavailable(
                "ixsmi is not installed: install the Iluvatar CoreX driver (it ships ixsmi), or pick another --backend".into(),
            )),
            Err(error) => Err(error),
        }
    }

    fn rows(&mut self) -> Result<Vec<Row>, BackendError> {
        let text = self.tool.run("ixsmi", &[QUERY, FORMAT])?;
        parse_query(&text).map_err(|e| unreadable("ixsmi --query-gpu", e))
    }
}

impl GpuBackend for IluvatarBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        Ok(self
            .rows()?
            .into_iter()
            .map(|row| GpuInventory {
                uuid: row.uuid,
                spec: GpuSpec {
                    vendor: Vendor::Iluvatar,
                    model: row.name,
                    memory_mib: row.memory_total_mib,
                    interconnect: Interconnect::Pcie,
                    mig_profile: None,
                },
                parent_uuid: None,
                pci_bus_id: row.bus_id,
                driver_version: row.driver_version,
                cuda_version: None,
                mig_enabled: false,
            })
            .collect())
    }

    fn sample(&mut self, _at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        let rows = self.rows()?;
        // A tool too old for the process query counts none.
        let apps = self.tool.run("ixsmi", &[APPS, FORMAT]).unwrap_or_default();
        Ok(rows
            .into_iter()
            .map(|row| {
                let processes = apps.lines().filter(|line| line.split(',').next().map(str::trim) == Some(row.uuid.as_str())).count() as u32;
                GpuSample {
                    healthy: row.memory_used_mib.is_some()
                        && row.temperature_c.is_none_or(|t| t <= TEMPERATURE_MAX_C)
                        && row.ecc_uncorrected.is_none_or(|e| e == 0),
                    utilisation_percent: row.utilisation_percent.unwrap_or(0),
                    memory_used_mib: row.memory_used_mib.unwrap_or(0),
                    temperature_c: row.temperature_c,
                    power_mw: row.power_w.map(|w| (w * 1000.0) as u32),
                    ecc_uncorrected: row.ecc_uncorrected,
                    processes,
                    uuid: row.uuid,
                }
            })
            .collect())
    }
}
