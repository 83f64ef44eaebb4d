//! Cambricon MLUs (MLU370, MLU590) through `cnmon`, the tool the Cambricon
//! driver installs. `cnmon info` prints, per card, a `Card N` line and
//! `Key : Value` lines grouped under unindented section headings (`PCIe
//! Info`, `Power Info`, `Temperature Info`, `Physical Memory Usage`, `ECC
//! Info`, `Utilization`); the keys are read by section and name. (The
//! versions whose documentation this was written from print no JSON.)
//! `cnmon info -p` would list processes; `Utilization`'s `MLU Average`
//! and the `Process Info` section of `cnmon info` are what is read.

use std::collections::BTreeMap;

use gpux_engine::{GpuSpec, Interconnect, Vendor};

use super::{leading_number, unreadable, SystemTool, Tool};
use crate::backend::{BackendError, GpuBackend, GpuInventory, GpuSample, TEMPERATURE_MAX_C};

pub struct CambriconBackend {
    tool: Box<dyn Tool>,
}

/// One card of `cnmon info`: `section/key` (or `key` before any section) -> value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Card {
    pub index: u32,
    pub fields: BTreeMap<String, String>,
    /// Rows under `Process Info` that name a process (`PID : ...`).
    pub processes: u32,
}

impl Card {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields.get(key).map(String::as_str).filter(|v| !v.is_empty() && *v != "N/A")
    }

    fn number(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(leading_number)
    }
}

/// Parses `cnmon info` into its cards.
pub fn parse_info(text: &str) -> Result<Vec<Card>, String> {
    let mut cards: Vec<Card> = Vec::new();
    let mut section = String::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(index) = line.trim().strip_prefix("Card").and_then(|rest| rest.trim().trim_end_matches(':').parse::<u32>().ok()) {
            cards.push(Card { index, ..Card::default() });
            section.clear();
            continue;
        }
        let Some(card) = cards.last_mut() else { continue };
        let indented = line.starts_with(' ') || line.starts_with('\t');
        match line.split_once(':') {
            Some((key, value)) => {
                let key = key.trim();
                let value = value.trim();
                if !indented && value.is_empty() {
                    section = key.to_string();
                    continue;
                }
                if !indented {
                    section.clear();
                }
                if section == "Process Info" && key == "PID" {
                    card.processes += 1;
                }
                let name = if section.is_empty() { key.to_string() } else { format!("{section}/{key}") };
                card.fields.entry(name).or_insert_with(|| value.to_string());
            }
            None if !indented => section = line.trim().to_string(),
            None => {}
        }
    }
    if cards.is_empty() {
        return Err("no `Card N` block".into());
    }
    Ok(cards)
}

impl CambriconBackend {
    pub fn open() -> Result<Self, BackendError> {
        Self::with_tool(Box::new(SystemTool::default()))
    }

    pub fn with_tool(mut tool: Box<dyn Tool>) -> Result<Self, BackendError> {
        match tool.run("cnmon", &["info"]) {
            Ok(_) => Ok(CambriconBackend { tool }),
            Err(BackendError::Unavailable(_)) => Err(BackendError::Unavailable(
                "cnmon is not installed: install the Cambricon MLU driver (it ships cnmon), or pick another --backend".into(),
            )),
            Err(error) => Err(error),
        }
    }

    fn cards(&mut self) -> Result<Vec<Card>, BackendError> {
        let text = self.tool.run("cnmon", &["info"])?;
        parse_info(&text).map_err(|e| unreadable("cnmon info", e))
    }
}

fn uuid_of(card: &Card) -> String {
    card.get("UUID").map_or_else(|| format!("MLU-card{}", card.index), |uuid| format!("MLU-{uuid}"))
}

/// Uncorrected memory errors: the ECC section's multiple-bit (uncorrectable) counters.
fn ecc_uncorrected(card: &Card) -> Option<u64> {
    let counters: Vec<u64> = card
        .fields
        .iter()
        .filter(|(key, _)| key.starts_with("ECC Info/") && (key.contains("Multiple Bit") || key.contains("Uncorrect")))
        .filter_map(|(_, value)| leading_number(value).map(|v| v as u64))
        .collect();
    (!counters.is_empty()).then(|| counters.iter().sum())
}

impl GpuBackend for CambriconBackend {
    fn inventory(&mut self) -> Result<Vec<GpuInventory>, BackendError> {
        let mut inventory = Vec::new();
        for card in self.cards()? {
            let model =
                card.get("Product Name").ok_or_else(|| unreadable("cnmon info", format!("card {} has no Product Name", card.index)))?;
            let memory = card
                .number("Physical Memory Usage/Total")
                .ok_or_else(|| unreadable("cnmon info", format!("card {} has no Physical Memory Usage/Total", card.index)))?;
            let bus = match (
                card.get("PCIe Info/Domain ID"),
                card.get("PCIe Info/Bus num"),
                card.get("PCIe Info/Device"),
                card.get("PCIe Info/Function"),
            ) {
                (Some(domain), Some(bus), Some(device), Some(function)) => Some(format!("{domain}:{bus}:{device}.{function}")),
                _ => None,
            };
            // MLU-Link shows as a section with at least one active port.
            let linked = card.fields.iter().any(|(key, value)| key.starts_with("MLU-Link") && value.eq_ignore_ascii_case("Enable"));
            inventory.push(GpuInventory {
                uuid: uuid_of(&card),
                spec: GpuSpec {
                    vendor: Vendor::Cambricon,
                    model: format!("Cambricon {model}"),
                    memory_mib: memory as u32,
                    interconnect: if linked { Interconnect::MluLink } else { Interconnect::Pcie },
                    mig_profile: None,
                },
                parent_uuid: None,
                pci_bus_id: bus,
                driver_version: card.get("Driver").map(str::to_string),
                cuda_version: None,
                mig_enabled: false,
            });
        }
        Ok(inventory)
    }

    fn sample(&mut self, _at_ms: u64) -> Result<Vec<GpuSample>, BackendError> {
        let mut samples = Vec::new();
        for card in self.cards()? {
            let used = card.number("Physical Memory Usage/Used");
            let temperature = card.number("Temperature Info/Board").or_else(|| card.number("Temperature Info/Chip")).map(|t| t as u32);
            let ecc = ecc_uncorrected(&card);
            samples.push(GpuSample {
                uuid: uuid_of(&card),
                healthy: used.is_some() && temperature.is_none_or(|t| t <= TEMPERATURE_MAX_C) && ecc.is_none_or(|e| e == 0),
                utilisation_percent: card.number("Utilization/MLU Average").map_or(0, |u| u as u32),
                memory_used_mib: used.map_or(0, |u| u as u32),
                temperature_c: temperature,
                power_mw: card.number("Power Info/Usage").map(|w| (w * 1000.0) as u32),
                ecc_uncorrected: ecc,
                processes: card.processes,
            });
        }
        Ok(samples)
    }
}
