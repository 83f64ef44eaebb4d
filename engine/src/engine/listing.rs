//! Listing changes: the operator's listing file, journaled as
//! `Command::ChangeListing` (docs/market-rules.md "The listing"). The
//! genesis listing is the engine's own config; a change may amend what each
//! class trades under and append classes, never remove, rename, reorder or
//! re-specify one (a GPU's classes, its asks and every instrument id hang
//! on a class's index and requirement), and never change the currency.

use super::{ContractKind, Engine};
use crate::config::{ConfigError, EngineConfig};
use crate::event::{EventKind, RejectCode};

/// Why a listing cannot replace the engine's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingChangeError {
    #[error("{0}")]
    Invalid(ConfigError),
    #[error("the currency is fixed when the journal starts ({old}); a listing in {new} needs a new exchange")]
    Currency { old: String, new: String },
    #[error("class {0} is in the journal's listing and must stay, under its name, in its place (classes are only appended)")]
    ClassRemoved(String),
    #[error("class {0}: its requirement (vendor, models, memory, fabric, profile) is fixed once listed; list a new class instead")]
    RequirementChanged(String),
    #[error("region {0} is in the journal's listing and must stay in its place (regions are only appended)")]
    RegionRemoved(String),
}

impl Engine {
    /// Whether `listing` may replace the current one (what `ChangeListing`
    /// will do with it: nothing if this fails).
    pub fn check_listing_change(&self, listing: &EngineConfig) -> Result<(), ListingChangeError> {
        listing.validate().map_err(ListingChangeError::Invalid)?;
        if listing.currency != self.config.currency {
            return Err(ListingChangeError::Currency { old: self.config.currency.code.clone(), new: listing.currency.code.clone() });
        }
        for (index, old) in self.config.regions.iter().enumerate() {
            if listing.regions.get(index) != Some(old) {
                return Err(ListingChangeError::RegionRemoved(old.clone()));
            }
        }
        for (index, old) in self.config.classes.iter().enumerate() {
            let Some(new) = listing.classes.get(index).filter(|new| new.name == old.name) else {
                return Err(ListingChangeError::ClassRemoved(old.name.clone()));
            };
            if new.requirement != old.requirement {
                return Err(ListingChangeError::RequirementChanged(old.name.clone()));
            }
        }
        Ok(())
    }

    pub(super) fn change_listing(&mut self, listing: &EngineConfig) -> Result<(), RejectCode> {
        self.check_listing_change(listing).map_err(|_| RejectCode::ListingIncompatible)?;
        let classes_before = self.config.classes.len();
        self.config = listing.clone();
        for class in classes_before..self.config.classes.len() {
            let name = self.config.classes[class].name.clone();
            for (symbol, kind) in [(format!("{name}/SPOT"), ContractKind::Spot), (format!("{name}/PREEMPT"), ContractKind::Preemptible)] {
                let instrument = self.add_instrument(symbol, class as u16, kind);
                self.emit(EventKind::InstrumentListed { instrument });
            }
            self.calendar.push(Default::default());
        }
        // Registered GPUs join the new classes whose spec they meet, unless
        // a wrong answer rejected them or their last answer was too slow
        // for the class; their agents offer there after their next login.
        let new_mask = |engine: &Engine, gpu: usize| {
            let details = &engine.gpu_details[gpu];
            if details.rejected() {
                return 0;
            }
            (classes_before..engine.config.classes.len())
                .filter(|&class| {
                    let spec = &engine.config.classes[class];
                    spec.requirement.is_met_by(&details.spec) && details.fast_enough_for(spec)
                })
                .fold(0u64, |mask, class| mask | (1u64 << class))
        };
        for gpu in 0..self.gpus.len() {
            let mask = new_mask(self, gpu);
            self.gpus[gpu].classes_mask |= mask;
        }
        // Windows of new classes, or a longer horizon, list now.
        self.calendar_due_ms = 0;
        self.list_calendar();
        self.emit(EventKind::ListingChanged { classes: self.config.classes.len() as u16, fee_bps: self.config.fee_bps });
        Ok(())
    }
}
