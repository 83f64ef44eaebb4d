//! Older journals' place-order and register-GPU commands (the deprecated
//! variants of `stored::StoredCommand`, kept so those journals decode) read
//! as their current form: the same events, the same state, and the same
//! refusal where the old form refused before anything else.

mod common;

use common::*;
use gpux_engine::stored::StoredCommand;
use gpux_engine::*;
use proptest::prelude::*;

/// A stored command as a journal's decoder reads it (through its JSON: the
/// same `serde(from)` path bincode takes).
fn decoded(stored: &StoredCommand) -> Command {
    serde_json::from_value(serde_json::to_value(stored).expect("encodes")).expect("decodes")
}

/// One older journal's command, drawn.
#[derive(Clone, Debug)]
enum Old {
    Register { host: u8, region: Option<u8>, zone: bool, fabric: bool },
    Plain { buy: bool, price: u8, quantity: u8 },
    Filtered { price: u8, quantity: u8, score: u16 },
    Verified { price: u8, quantity: u8, score: u16 },
    With { price: u8, quantity: u8, all_or_none: bool, budget: u8 },
    InRegions { buy: bool, price: u8, quantity: u8, regions: Vec<u8> },
    Cluster { price: u8, nodes: u8, per_node: u8, gbps: u16, region: Option<u8> },
}

fn old() -> impl Strategy<Value = Old> {
    prop_oneof![
        (0..4u8, proptest::option::of(0..6u8), any::<bool>(), any::<bool>()).prop_map(|(host, region, zone, fabric)| Old::Register {
            host,
            region,
            zone,
            fabric
        }),
        (any::<bool>(), 1..6u8, 1..4u8).prop_map(|(buy, price, quantity)| Old::Plain { buy, price, quantity }),
        (1..6u8, 1..4u8, prop_oneof![Just(0u16), 1..10_001u16]).prop_map(|(price, quantity, score)| Old::Filtered {
            price,
            quantity,
            score
        }),
        (1..6u8, 1..4u8, 0..10_001u16).prop_map(|(price, quantity, score)| Old::Verified { price, quantity, score }),
        (1..6u8, 1..4u8, any::<bool>(), 0..8u8).prop_map(|(price, quantity, all_or_none, budget)| Old::With {
            price,
            quantity,
            all_or_none,
            budget
        }),
        (any::<bool>(), 1..6u8, 1..4u8, proptest::collection::vec(0..6u8, 0..3))
            .prop_map(|(buy, price, quantity, regions)| Old::InRegions { buy, price, quantity, regions }),
        (1..6u8, 0..4u8, 1..3u8, prop_oneof![Just(0u16), Just(100u16), Just(800u16)], proptest::option::of(0..2u8))
            .prop_map(|(price, nodes, per_node, gbps, region)| Old::Cluster { price, nodes, per_node, gbps, region }),
    ]
}

/// The listing's regions and one it does not name (index 5).
fn region(index: u8) -> String {
    ["us-east", "us-west", "eu-central", "cn-east", "cn-west", "atlantis"][index as usize % 6].to_string()
}

/// The older journal's command and, written here from what the old variants
/// meant (docs/market-rules.md as it stood), its current form: `Err` where
/// the old variant refused before anything else.
fn commands(
    old: &Old,
    m: &mut Market,
    renter: AccountId,
    supplier: AccountId,
    registered: &mut u32,
) -> (StoredCommand, Result<Command, RejectCode>) {
    let price = |step: u8| 1_500_000 + step as u64 * 250_000;
    let order = |m: &mut Market, buy: bool, step: u8, quantity: u32| {
        let (account, side) = if buy { (renter, Side::Buy) } else { (supplier, Side::Sell) };
        let mut order = m.order(account, H100_SPOT, side, price(step), quantity);
        if !buy {
            // The supplier's first host, as many of its GPUs as asked (some
            // may be leased or offered already: refused the same both ways).
            order.supply = Some(GpuSet { host: HostId(0), gpu_mask: (1u64 << quantity) - 1 });
        }
        order
    };
    match old.clone() {
        Old::Register { host, region: named, zone, fabric } => {
            *registered += 1;
            let (host, gpu_uuid, spec) = (format!("host-{host}"), format!("GPU-old-{registered}"), h100_spec());
            let zone = if zone { "z1".to_string() } else { String::new() };
            let claim = FabricClaim { group: "ib0".into(), gbps: 400, address: "10.0.0.1".into(), port_base: 40_000 };
            let current = |region: Option<String>, zone: String, fabric: Option<Box<FabricClaim>>| Command::Register {
                account: supplier,
                host: host.clone(),
                gpu_uuid: gpu_uuid.clone(),
                spec: spec.clone(),
                region,
                zone,
                fabric,
            };
            match (named, fabric) {
                // The oldest form had no zone either.
                (None, _) => (
                    StoredCommand::RegisterGpu { account: supplier, host: host.clone(), gpu_uuid: gpu_uuid.clone(), spec: spec.clone() },
                    Ok(current(None, String::new(), None)),
                ),
                (Some(r), false) => (
                    StoredCommand::RegisterGpuInRegion {
                        account: supplier,
                        host: host.clone(),
                        gpu_uuid: gpu_uuid.clone(),
                        spec: spec.clone(),
                        region: region(r),
                        zone: zone.clone(),
                    },
                    Ok(current(Some(region(r)), zone, None)),
                ),
                (Some(r), true) => (
                    StoredCommand::RegisterGpuOnFabric {
                        account: supplier,
                        host: host.clone(),
                        gpu_uuid: gpu_uuid.clone(),
                        spec: spec.clone(),
                        region: region(r),
                        zone: zone.clone(),
                        fabric: Box::new(claim.clone()),
                    },
                    Ok(current(Some(region(r)), zone, Some(Box::new(claim)))),
                ),
            }
        }
        Old::Plain { buy, price, quantity } => {
            let order = order(m, buy, price, quantity as u32);
            (StoredCommand::PlaceOrder(order.clone()), Ok(Command::place(order)))
        }
        Old::Filtered { price, quantity, score } => {
            let order = order(m, true, price, quantity as u32);
            let min_supplier_score_bps = score as u32;
            let current = match score {
                0 => Err(RejectCode::ScoreFilterInvalid),
                _ => Ok(Command::place_with(order.clone(), OrderOptions { min_supplier_score_bps, ..OrderOptions::default() })),
            };
            (StoredCommand::PlaceOrderFiltered { order, min_supplier_score_bps }, current)
        }
        Old::Verified { price, quantity, score } => {
            let order = order(m, true, price, quantity as u32);
            let min_supplier_score_bps = score as u32;
            let options = OrderOptions { min_supplier_score_bps, verified_only: true, ..OrderOptions::default() };
            (StoredCommand::PlaceOrderVerified { order: order.clone(), min_supplier_score_bps }, Ok(Command::place_with(order, options)))
        }
        Old::With { price, quantity, all_or_none, budget } => {
            let order = order(m, true, price, quantity as u32);
            let options = OrderOptions { all_or_none, budget_minor: budget as u64 * 1_000_000, ..OrderOptions::default() };
            (StoredCommand::PlaceOrderWith { order: order.clone(), options }, Ok(Command::place_with(order, options)))
        }
        Old::InRegions { buy, price, quantity, regions } => {
            let order = order(m, buy, price, quantity as u32);
            let regions: Vec<String> = regions.into_iter().map(region).collect();
            let options = OrderOptions::default();
            let current = match regions.is_empty() {
                true => Err(RejectCode::RegionFilterInvalid),
                false => Ok(Command::Place { order: order.clone(), options, regions: regions.clone(), cluster: None }),
            };
            (StoredCommand::PlaceOrderInRegions { order, options, regions }, current)
        }
        Old::Cluster { price, nodes, per_node, gbps, region: named } => {
            let order = order(m, true, price, nodes as u32 * per_node as u32);
            let regions: Vec<String> = named.map(region).into_iter().collect();
            let (nodes, min_fabric_gbps) = (nodes as u32, gbps as u32);
            let options = OrderOptions::default();
            let cluster = Some(ClusterTerms { nodes, min_fabric_gbps });
            let current = Command::Place { order: order.clone(), options, regions: regions.clone(), cluster };
            (StoredCommand::PlaceClusterOrder { order, options, regions, nodes, min_fabric_gbps }, Ok(current))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn an_older_journals_command_and_its_upcast_have_the_same_effect(olds in proptest::collection::vec(old(), 1..40)) {
        let (mut old_market, mut current_market) = (Market::new(), Market::new());
        let mut accounts = Vec::new();
        for m in [&mut old_market, &mut current_market] {
            let renter = m.renter(1_000_000_000);
            let supplier = m.supplier();
            m.h100_host_in(supplier, "host-0", 4, Some(("us-east", "z1")));
            accounts.push((renter, supplier));
        }
        let (renter, supplier) = accounts[0];
        prop_assert_eq!(accounts[0], accounts[1]);
        let (mut registered_old, mut registered_current) = (0, 0);
        for (step, drawn) in olds.iter().enumerate() {
            let (deprecated, expected) = commands(drawn, &mut old_market, renter, supplier, &mut registered_old);
            let (again, _) = commands(drawn, &mut current_market, renter, supplier, &mut registered_current);
            let read = decoded(&deprecated);
            if let Ok(current) = &expected {
                prop_assert_eq!(&read, current, "step {}: {:?}", step, drawn);
            }
            let events = old_market.apply(read);
            match expected {
                Ok(current) => {
                    let current_events = current_market.apply(current);
                    prop_assert_eq!(&events, &current_events, "step {}: {:?}", step, drawn);
                }
                Err(code) => {
                    // Refused before anything else, as the old variant was.
                    prop_assert_eq!(events.len(), 1);
                    prop_assert_eq!(rejection(&events), Some(code));
                    // Keep the two event counters together.
                    current_market.apply(decoded(&again));
                }
            }
            prop_assert_eq!(old_market.engine.state_hash(), current_market.engine.state_hash(), "step {}", step);
            if step % 7 == 6 {
                old_market.advance(20 * 60_000);
                current_market.advance(20 * 60_000);
            }
        }
    }
}

#[test]
fn a_current_command_reads_as_itself_and_the_deprecated_refusals_read_as_refused_forms() {
    let order = NewOrder::limit(AccountId(1), 7, H100_SPOT, Side::Buy, USD_2, 1);
    let current = Command::place(order.clone());
    assert_eq!(decoded(&StoredCommand::from(current.clone())), current);
    let filtered = decoded(&StoredCommand::PlaceOrderFiltered { order: order.clone(), min_supplier_score_bps: 0 });
    assert!(matches!(filtered, Command::Place { options, .. } if options.min_supplier_score_bps == stored::REFUSED_SCORE_BPS));
    let in_regions =
        decoded(&StoredCommand::PlaceOrderInRegions { order: order.clone(), options: OrderOptions::default(), regions: Vec::new() });
    assert!(matches!(in_regions, Command::Place { regions, .. } if regions == stored::refused_regions()));
    let cluster = decoded(&StoredCommand::PlaceClusterOrder {
        order,
        options: OrderOptions::default(),
        regions: Vec::new(),
        nodes: 2,
        min_fabric_gbps: 100,
    });
    assert!(matches!(cluster, Command::Place { cluster: Some(ClusterTerms { nodes: 2, min_fabric_gbps: 100 }), .. }));
}

/// The variant names serde's derive passes to `deserialize_enum`, in
/// declaration order: bincode writes a variant's position among them.
struct VariantsOf(Vec<&'static str>);

impl<'de> serde::Deserializer<'de> for &mut VariantsOf {
    type Error = serde::de::value::Error;

    fn deserialize_any<V: serde::de::Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(serde::de::Error::custom("only enums"))
    }

    fn deserialize_enum<V: serde::de::Visitor<'de>>(
        self,
        _: &'static str,
        variants: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = variants.to_vec();
        Err(serde::de::Error::custom("recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit unit_struct
        newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// Bincode writes a variant's index: `Command` is read and written through
/// the stored variants in the order journals hold them, the deprecated
/// forms in their places (the order as it stood when they left `Command`,
/// 2026-12-07); a new variant goes at the end.
#[test]
fn commands_are_stored_in_the_journals_variant_order() {
    const JOURNAL_ORDER: [&str; 39] = [
        "open_account",
        "deposit",
        "withdraw",
        "payout",
        "set_fee",
        "set_billing_grace",
        "register_gpu",
        "set_gpu_online",
        "place_order",
        "cancel_order",
        "replace_order",
        "mass_cancel",
        "end_lease",
        "fail_lease_delivery",
        "settle_usage",
        "tick",
        "place_order_filtered",
        "record_challenge",
        "place_order_verified",
        "withhold_disputed",
        "place_order_with",
        "open_sub_account",
        "move_funds",
        "set_account_limits",
        "offer_lease",
        "set_spend_limits",
        "change_listing",
        "register_gpu_in_region",
        "place_order_in_regions",
        "register_gpu_on_fabric",
        "place_cluster_order",
        "record_fabric_probe",
        "set_cluster_rules",
        "set_late_report_window",
        "hold_disputed",
        "place",
        "register",
        "set_share_rules",
        "charge_storage",
    ];
    let mut variants = VariantsOf(Vec::new());
    let _ = <Command as serde::Deserialize>::deserialize(&mut variants);
    assert_eq!(variants.0, JOURNAL_ORDER, "Command is read through the stored variants, in order");
}

/// docs/market-rules.md's input example (the audit's JSON lines).
fn documented_inputs() -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/market-rules.md")).expect("docs/market-rules.md");
    let section = doc.split("**Input**: JSON lines").nth(1).expect("the input section");
    let block = section.split("```json\n").nth(1).expect("its example").split("```").next().expect("closed");
    block.lines().map(str::to_string).collect()
}

#[test]
fn the_documented_inputs_are_current_and_older_inputs_still_read_as_their_current_form() {
    let documented: Vec<Input> =
        documented_inputs().iter().map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"))).collect();
    assert!(documented.len() >= 10);
    for (line, input) in documented_inputs().iter().zip(&documented) {
        let written = serde_json::to_string(input).expect("encodes");
        let reread: serde_json::Value = serde_json::from_str(&written).expect("json");
        let shown: serde_json::Value = serde_json::from_str(line).expect("json");
        assert_eq!(reread, shown, "the example shows current commands, as written today");
    }
    // The same three commands as an input written before 2026-12-06 named them.
    let older = [
        r#"{"at_ms":1796223660000,"command":{"register_gpu":{"account":0,"host":"dc1-node-01","gpu_uuid":"GPU-dc1-node-01-0","spec":{"vendor":"nvidia","model":"NVIDIA H100 80GB HBM3","memory_mib":81559,"interconnect":"nv_link","mig_profile":null}}}}"#,
        r#"{"at_ms":1796223660000,"command":{"place_order":{"account":0,"client_order_id":1,"instrument":0,"side":"sell","order_type":"limit","price_minor_per_gpu_hour":2100000,"quantity":4,"time_in_force":"gtc","post_only":false,"self_trade_prevention":"cancel_newest","min_quantity":0,"one_host":false,"duration":{"hours":2},"supply":{"host":0,"gpu_mask":15}}}}"#,
        r#"{"at_ms":1796223720000,"command":{"place_order_with":{"order":{"account":3,"client_order_id":3,"instrument":0,"side":"buy","order_type":"limit","price_minor_per_gpu_hour":2300000,"quantity":8,"time_in_force":"gtc","post_only":false,"self_trade_prevention":"cancel_newest","min_quantity":0,"one_host":false,"duration":{"hours":2},"supply":null},"options":{"min_supplier_score_bps":0,"verified_only":false,"all_or_none":false,"budget_minor":20000000,"stop_price_minor_per_gpu_hour":2200000}}}}"#,
    ];
    let current: Vec<&Input> = documented
        .iter()
        .filter(|input| {
            matches!(&input.command, Command::Register { gpu_uuid, .. } if gpu_uuid == "GPU-dc1-node-01-0")
                || matches!(&input.command, Command::Place { order, .. } if [1, 3].contains(&order.client_order_id))
        })
        .collect();
    assert_eq!(current.len(), 3);
    for (line, current) in older.iter().zip(current) {
        let old: Input = serde_json::from_str(line).expect("an older input reads");
        assert_eq!(old.command, current.command, "{line}");
    }
}
