//! Listing changes (`Command::ChangeListing`, docs/market-rules.md "The
//! listing"): a class appended is traded at once by the GPUs that meet it,
//! terms amended hold from the change on, and what the listing cannot take
//! is rejected without changing anything. Replays reach the same state.

mod common;

use common::*;
use gpux_engine::*;

fn with_h100_any() -> EngineConfig {
    let mut listing = EngineConfig::demo();
    let mut class = listing.classes[0].clone();
    class.name = "H100-ANY".into();
    class.requirement.models = vec!["NVIDIA H100*".into()];
    class.requirement.fabric_required = false;
    class.calendar = None;
    listing.classes.push(class);
    listing.fee_bps = 300;
    listing.classes[0].sla_availability_bps = 9_990;
    listing.classes[0].sla_credit_tiers = default_credit_tiers(9_990);
    listing
}

#[test]
fn an_appended_class_lists_its_books_and_registered_gpus_trade_in_it_at_once() {
    let mut m = Market::new();
    let supplier = m.supplier();
    let renter = m.renter(100_000_000);
    let host = m.h100_host(supplier, "h", 2);
    let listed_before = m.engine.instruments_listed_total();

    let events = m.apply(Command::ChangeListing { listing: Box::new(with_h100_any()) });
    assert_eq!(rejection(&events), None);
    let listed: Vec<InstrumentId> = events
        .iter()
        .filter_map(|e| if let EventKind::InstrumentListed { instrument } = e.kind { Some(instrument) } else { None })
        .collect();
    assert_eq!(listed, [InstrumentId(listed_before as u32), InstrumentId(listed_before as u32 + 1)]);
    assert!(matches!(events.last().map(|e| e.kind), Some(EventKind::ListingChanged { classes: 6, fee_bps: 300 })));
    let spot = m.engine.instrument_by_symbol("H100-ANY/SPOT").expect("listed");
    assert_eq!(m.engine.config().fee_bps, 300);
    assert_eq!(m.engine.config().classes[0].sla_availability_bps, 9_990);

    // The GPUs registered before the change are sold in the new class.
    m.ask(supplier, host, 0b11, spot, 2_000_000);
    let events = m.buy(renter, spot, 2_000_000, 2);
    assert_eq!(trades(&events), [(2_000_000, 2)]);

    // The same inputs replayed reach the same state.
    let mut replay = Engine::new(EngineConfig::demo()).expect("demo");
    for input in &m.inputs {
        replay.apply(input);
    }
    assert_eq!(replay.state_hash(), m.engine.state_hash());
}

#[test]
fn a_listing_that_drops_renames_or_respecifies_a_class_or_changes_currency_changes_nothing() {
    let mut m = Market::new();
    m.advance(0);
    let before = m.engine.state_hash();
    let mut dropped = EngineConfig::demo();
    dropped.classes.pop();
    let mut renamed = EngineConfig::demo();
    renamed.classes[2].name = "RTX4090".into();
    let mut respecified = EngineConfig::demo();
    respecified.classes[1].requirement.memory_mib_min = 40_000;
    let mut cny = EngineConfig::demo();
    cny.currency = Currency { code: "CNY".into(), decimals: 2 };
    let mut invalid = EngineConfig::demo();
    invalid.classes[0].tick_minor = 0;
    for listing in [dropped, renamed, respecified, cny, invalid] {
        assert!(m.engine.check_listing_change(&listing).is_err());
        let events = m.apply(Command::ChangeListing { listing: Box::new(listing) });
        assert_eq!(rejection(&events), Some(RejectCode::ListingIncompatible));
    }
    assert_eq!(m.engine.state_hash(), before, "a rejected change changes nothing");
    assert_eq!(m.engine.config(), &EngineConfig::demo());
}
