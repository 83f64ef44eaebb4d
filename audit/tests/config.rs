//! `gpux-audit --config` reads engine configurations written by older
//! builds: the fixture is `EngineConfig::demo()` as the build before the
//! listing file (d895c8c^, 2026-12-03) wrote it, without the currency and
//! the credit tiers added since.

#[test]
fn a_config_written_before_currencies_and_credit_tiers_loads_as_the_engine_then_behaved() {
    let text = include_str!("fixtures/engine-config-2026-12-03.json");
    assert!(!text.contains("currency") && !text.contains("sla_credit_tiers"), "the fixture is the older format");
    assert!(serde_json::from_str::<gpux_engine::EngineConfig>(text).is_err(), "this build's format alone would refuse it");
    let config = gpux_audit::parse_config(text).expect("loads");
    assert_eq!(config.currency, gpux_engine::config::Currency::usd_micro());
    for class in &config.classes {
        assert_eq!(class.sla_credit_tiers, gpux_engine::config::default_credit_tiers(class.sla_availability_bps), "{}", class.name);
    }
    // What it configured then is today's demo listing's, class for class.
    let today = gpux_engine::EngineConfig::demo();
    let names = |c: &gpux_engine::EngineConfig| c.classes.iter().map(|class| class.name.clone()).collect::<Vec<_>>();
    assert!(names(&today).starts_with(&names(&config)), "{:?} {:?}", names(&config), names(&today));
    gpux_market::MarketState::new(config).expect("a market starts on it");
}

#[test]
fn a_config_that_is_not_one_is_refused_with_the_reason() {
    for (text, reason) in [("[1]", "JSON object"), ("{", "not JSON"), (r#"{"classes":[{"name":"x"}]}"#, "sla_availability_bps")] {
        let error = format!("{:#}", gpux_audit::parse_config(text).expect_err(text));
        assert!(error.contains(reason), "{text}: {error}");
    }
}
