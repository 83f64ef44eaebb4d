//! Usage report verification and metering, as the rulebook states them: an
//! honest chain is metered to the millisecond; forged, replayed, reordered,
//! overlapping, out-of-lease, future, wrong-GPU and wrong-host reports are
//! refused with their code and change no balance; resending an accepted
//! report is harmless; and however time is split into reports, the charges
//! add up to the exact amount within one minor unit.

use ed25519_dalek::SigningKey;
use gpux_engine::{AccountId, LeaseId};
use gpux_protocol::{genesis_hash, UsageBody, UsageReport};
use gpux_settlement::*;
use proptest::prelude::*;

const SUPPLIER: AccountId = AccountId(1);
const PRICE: u64 = 2_000_000;

fn key() -> SigningKey {
    SigningKey::from_bytes(&[5; 32])
}

fn terms() -> LeaseTerms {
    LeaseTerms {
        lease: LeaseId(7),
        supplier: SUPPLIER,
        gpu_uuids: vec!["GPU-a".into(), "GPU-b".into()],
        start_ms: 1_000_000,
        end_ms: Some(1_000_000 + 3_600_000),
        price_minor_per_gpu_hour: PRICE,
        billing_closed: false,
    }
}

/// Builds the honest chain of one GPU over `[start, end)` cut at `cuts`.
fn chain(gpu: &str, bounds: &[u64]) -> Vec<UsageReport> {
    let mut reports: Vec<UsageReport> = Vec::new();
    for (index, window) in bounds.windows(2).enumerate() {
        let prev_hash = reports.last().map_or_else(genesis_hash, |r| r.hash());
        let body = UsageBody {
            lease: LeaseId(7),
            gpu_uuid: gpu.into(),
            seq: index as u32 + 1,
            start_ms: window[0],
            end_ms: window[1],
            available_ms: window[1] - window[0],
            utilisation_percent: 90,
            memory_used_mib_max: 1_000,
            unhealthy_samples: 0,
            prev_hash,
            readings: None,
        };
        reports.push(UsageReport::sign(body, &key()));
    }
    reports
}

fn submit(settlement: &mut Settlement, report: &UsageReport) -> Result<UsageOutcome, UsageRejectCode> {
    settlement.report(SUPPLIER, &key().verifying_key().to_bytes(), Some(&terms()), report, 10_000_000)
}

#[test]
fn an_honest_chain_is_metered_to_the_millisecond() {
    let mut settlement = Settlement::default();
    let reports = chain("GPU-a", &[1_000_000, 1_010_000, 1_020_001]);
    assert_eq!(submit(&mut settlement, &reports[0]), Ok(UsageOutcome::Accepted { verified_ms: 10_000, charge_minor: 5_555 }));
    // 20 001 ms at 2.00/h is 11 111.6 minor units: 11 111 charged in all.
    assert_eq!(submit(&mut settlement, &reports[1]), Ok(UsageOutcome::Accepted { verified_ms: 10_001, charge_minor: 5_556 }));
    assert_eq!(settlement.metered(LeaseId(7)), Metered { verified_ms: 20_001, charged_minor: 11_111 });
}

#[test]
fn a_resent_report_is_a_harmless_duplicate() {
    let mut settlement = Settlement::default();
    let reports = chain("GPU-a", &[1_000_000, 1_010_000]);
    submit(&mut settlement, &reports[0]).expect("accepted");
    assert_eq!(submit(&mut settlement, &reports[0]), Ok(UsageOutcome::Duplicate));
    assert_eq!(settlement.metered(LeaseId(7)).verified_ms, 10_000);
}

#[test]
fn each_kind_of_bad_report_is_refused_with_its_code_and_moves_no_money() {
    let honest = chain("GPU-a", &[1_000_000, 1_010_000, 1_020_000, 1_030_000]);
    let resign = |mut body: UsageBody| {
        UsageReport::sign(
            {
                body.prev_hash = honest[0].hash();
                body
            },
            &key(),
        )
    };
    let cases: Vec<(&str, UsageReport, UsageRejectCode)> = vec![
        ("signed by another key", UsageReport::sign(honest[1].body.clone(), &SigningKey::from_bytes(&[6; 32])), UsageRejectCode::Forged),
        (
            "inflated after signing",
            {
                let mut report = honest[1].clone();
                report.body.available_ms += 1_000;
                report
            },
            UsageRejectCode::Forged,
        ),
        ("skipping a report", honest[2].clone(), UsageRejectCode::Reordered),
        (
            "a different report at a taken position",
            UsageReport::sign(UsageBody { available_ms: 9_000, ..honest[0].body.clone() }, &key()),
            UsageRejectCode::Replayed,
        ),
        (
            "a wrong previous hash",
            UsageReport::sign(UsageBody { prev_hash: genesis_hash(), ..honest[1].body.clone() }, &key()),
            UsageRejectCode::Replayed,
        ),
        (
            "overlapping the previous interval",
            resign(UsageBody { start_ms: 1_005_000, ..honest[1].body.clone() }),
            UsageRejectCode::Overlapping,
        ),
        (
            "starting at the lease end",
            resign(UsageBody {
                start_ms: 1_000_000 + 3_600_000,
                end_ms: 1_000_000 + 3_610_000,
                available_ms: 10_000,
                ..honest[1].body.clone()
            }),
            UsageRejectCode::OutOfLease,
        ),
        (
            "claiming more than the interval",
            resign(UsageBody { available_ms: 10_001, ..honest[1].body.clone() }),
            UsageRejectCode::Malformed,
        ),
        ("a GPU outside the lease", resign(UsageBody { gpu_uuid: "GPU-z".into(), ..honest[1].body.clone() }), UsageRejectCode::WrongGpu),
    ];
    for (name, report, code) in cases {
        let mut settlement = Settlement::default();
        submit(&mut settlement, &honest[0]).expect("first report accepted");
        let before = settlement.metered(LeaseId(7));
        assert_eq!(submit(&mut settlement, &report), Err(code), "{name}");
        assert_eq!(settlement.metered(LeaseId(7)), before, "{name}: no money moved");
        assert_eq!(settlement.rejections(SUPPLIER), 1, "{name}: the refusal is recorded");
    }
}

/// Once a lease's bill is final every report about it is refused
/// `billing_closed`, resends too, whether its chains are still held or were
/// forgotten (`forget_lease`): forgetting them changes no answer.
#[test]
fn after_the_leases_billing_closed_every_report_is_refused_whether_its_chains_are_kept_or_not() {
    let honest = chain("GPU-a", &[1_000_000, 1_010_000, 1_020_000]);
    let closed = LeaseTerms { billing_closed: true, ..terms() };
    let key = key().verifying_key().to_bytes();
    for forget in [false, true] {
        let mut settlement = Settlement::default();
        submit(&mut settlement, &honest[0]).expect("first report");
        if forget {
            settlement.forget_lease(LeaseId(7));
            assert_eq!(settlement.chains(), 0, "the closed lease's chain is gone");
        }
        for report in [&honest[1], &honest[0]] {
            assert_eq!(settlement.report(SUPPLIER, &key, Some(&closed), report, 10_000_000), Err(UsageRejectCode::BillingClosed));
        }
    }
    let mut settlement = Settlement::default();
    submit(&mut settlement, &honest[0]).expect("first report");
    settlement.forget_lease(LeaseId(8));
    assert_eq!((settlement.chains(), settlement.metered(LeaseId(7)).verified_ms), (1, 10_000), "other leases are kept");
}

/// The agent learns of a lease's end only when told, so its last report may
/// run past it: only the part inside the lease is verified and charged.
#[test]
fn a_report_running_past_the_lease_end_counts_only_up_to_the_end() {
    let mut settlement = Settlement::default();
    let end = 1_000_000 + 3_600_000;
    let reports = chain("GPU-a", &[1_000_000, end - 1_000, end + 1_000]);
    submit(&mut settlement, &reports[0]).expect("first");
    assert_eq!(submit(&mut settlement, &reports[1]), Ok(UsageOutcome::Accepted { verified_ms: 1_000, charge_minor: 556 }));
    assert_eq!(settlement.metered(LeaseId(7)).verified_ms, 3_600_000);
}

#[test]
fn reports_from_the_future_from_another_host_or_for_no_lease_are_refused() {
    let mut settlement = Settlement::default();
    let report = &chain("GPU-a", &[1_000_000, 1_010_000])[0];
    let key_bytes = key().verifying_key().to_bytes();
    assert_eq!(settlement.report(SUPPLIER, &key_bytes, Some(&terms()), report, 1_004_999), Err(UsageRejectCode::FromFuture));
    assert_eq!(settlement.report(AccountId(9), &key_bytes, Some(&terms()), report, 10_000_000), Err(UsageRejectCode::WrongHost));
    assert_eq!(settlement.report(SUPPLIER, &key_bytes, None, report, 10_000_000), Err(UsageRejectCode::UnknownLease));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// However a lease's time is cut into reports, across its GPUs, the
    /// charges add up to the exact amount rounded down: never more, and
    /// less by under one minor unit.
    #[test]
    fn charges_add_up_to_the_exact_amount_however_time_is_split(
        cuts_a in prop::collection::btree_set(1_000_001..1_000_000 + 3_600_000u64, 0..20),
        cuts_b in prop::collection::btree_set(1_000_001..1_000_000 + 3_600_000u64, 0..20),
    ) {
        let mut settlement = Settlement::default();
        let mut charged = 0u64;
        for (gpu, cuts) in [("GPU-a", cuts_a), ("GPU-b", cuts_b)] {
            let mut bounds = vec![1_000_000];
            bounds.extend(cuts);
            bounds.push(1_000_000 + 3_600_000);
            for report in chain(gpu, &bounds) {
                match submit(&mut settlement, &report) {
                    Ok(UsageOutcome::Accepted { charge_minor, .. }) => charged += charge_minor,
                    other => prop_assert!(false, "honest report refused: {other:?}"),
                }
            }
        }
        // Two GPUs for one hour at PRICE per GPU-hour.
        prop_assert_eq!(charged, 2 * PRICE);
        prop_assert_eq!(settlement.metered(LeaseId(7)).verified_ms, 2 * 3_600_000);
    }
}

/// A chain keeps its counters and newest hashes only: its size stays the
/// same however many reports it accepts (8 640 a day per GPU at the agent's
/// default interval), and resends still get their answers: a recent
/// report resent is a duplicate, a different one with a recent `seq` is
/// replayed, and one older than the kept hashes is a duplicate unchecked.
#[test]
fn a_chain_stays_the_same_size_however_long_it_grows() {
    let mut settlement = Settlement::default();
    let bounds: Vec<u64> = (0..=600).map(|n| 1_000_000 + n * 5_000).collect();
    let reports = chain("GPU-a", &bounds);
    let mut size_after_warm_up = 0;
    for (index, report) in reports.iter().enumerate() {
        assert!(matches!(submit(&mut settlement, report), Ok(UsageOutcome::Accepted { .. })), "report {}", index + 1);
        if index + 1 == 2 * RECENT_HASHES {
            size_after_warm_up = gpux_protocol::encode_record(&settlement).len();
        }
    }
    // Counters take a few more varint bytes as they grow; a hash kept per
    // report would add 65 bytes each, 37 000 here.
    let size = gpux_protocol::encode_record(&settlement).len();
    assert!(size <= size_after_warm_up + 16, "600 reports cost what 16 did: {size} bytes against {size_after_warm_up}");
    assert_eq!(settlement.metered(LeaseId(7)).verified_ms, 3_000_000);

    let newest = &reports[599];
    assert_eq!(submit(&mut settlement, newest), Ok(UsageOutcome::Duplicate));
    let mut different = newest.body.clone();
    different.available_ms -= 1;
    assert_eq!(submit(&mut settlement, &UsageReport::sign(different, &key())), Err(UsageRejectCode::Replayed));
    assert_eq!(submit(&mut settlement, &reports[3]), Ok(UsageOutcome::Duplicate), "older than the kept hashes");
    assert_eq!(settlement.metered(LeaseId(7)).verified_ms, 3_000_000, "no resend charged anything");
}

/// Under ZIP-215 (docs/market-rules.md "Usage reports"), a report the
/// gateway verified is not verified again; the mark only ever spares the
/// exact report (key and hash) it names, so a changed report carrying a
/// verified one's signature is still `forged`, and under the legacy rule
/// the mark is ignored. Both rules give every honest and every forged
/// report the same outcome.
#[test]
fn a_report_marked_checked_skips_only_its_own_verification() {
    let public = key().verifying_key().to_bytes();
    let honest = chain("GPU-a", &[1_000_000, 1_010_000, 1_020_000]);
    let mut inflated = honest[1].clone();
    inflated.body.available_ms += 1;
    for rule in [SignatureRule::Legacy, SignatureRule::Zip215] {
        let mut settlement = Settlement::default();
        settlement.set_signature_rule(rule);
        assert_eq!(settlement.signature_rule(), rule);
        settlement.mark_checked(public, &honest[0]);
        assert!(matches!(submit(&mut settlement, &honest[0]), Ok(UsageOutcome::Accepted { .. })), "{rule:?}");
        // The mark of the honest report does not cover a changed copy.
        settlement.mark_checked(public, &honest[1]);
        assert_eq!(submit(&mut settlement, &inflated), Err(UsageRejectCode::Forged), "{rule:?}");
        // Nor another key's mark; and a mark is spent by the next report.
        settlement.mark_checked([9; 32], &honest[1]);
        assert!(matches!(submit(&mut settlement, &honest[1]), Ok(UsageOutcome::Accepted { .. })), "verified itself: {rule:?}");
    }
    // A mark for a report that never verified does not make it pass under
    // the legacy rule (which ignores marks), and names a hash no forged
    // report of another body can have under ZIP-215.
    let mut settlement = Settlement::default();
    settlement.mark_checked(public, &inflated);
    assert_eq!(submit(&mut settlement, &inflated), Err(UsageRejectCode::Forged), "legacy ignores marks");
}
