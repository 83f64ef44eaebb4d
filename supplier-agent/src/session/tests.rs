use super::host::{Billing, HostGpu, LeaseState, Window};
use super::*;

/// A host 20 s ahead of the exchange, 40 ms round trip: the exchange's
/// stamp is taken as of the trip's middle.
#[test]
fn the_clock_offset_is_read_at_the_round_trips_middle() {
    let sent = 1_800_000_020_000;
    assert_eq!(clock_offset(sent, sent + 40, 1_800_000_000_020), -20_000);
    assert_eq!(clock_offset(sent, sent, sent + 7), 7);
    assert_eq!(clock_offset(sent, sent - 5, sent), 0, "a clock stepped back mid-trip counts no trip");
}

/// A lease that ended is reported to its end even when this host's
/// clock (with the offset it measured) is behind the exchange's, and
/// then forgotten: no second chain for it starts from its beginning.
#[test]
fn an_ended_lease_is_reported_to_its_end_with_a_clock_behind_the_exchanges() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = AgentConfig::parse(&format!(
        "exchange = \"ws://127.0.0.1:9\"\nhost = \"h\"\nkey_file = \"{}\"\n",
        dir.path().join("host.key").display()
    ))
    .expect("config");
    let host: crate::fake::FakeHost = serde_json::from_str(
        r#"{"gpus": [{"uuid": "GPU-a", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}]}"#,
    )
    .expect("host");
    let backend = Box::new(crate::fake::FakeBackend::new(host).expect("backend"));
    let mut agent = Agent::new(config, SigningKey::from_bytes(&[4; 32]), backend).expect("agent");
    agent.host.gpus.push(HostGpu {
        info: gpux_protocol::views::Gpu {
            gpu: gpux_engine::GpuId(0),
            uuid: "GPU-a".into(),
            host: gpux_engine::HostId(0),
            host_name: "h".into(),
            index_on_host: 0,
            owner: gpux_engine::AccountId(0),
            spec: gpux_engine::GpuSpec::h100_sxm(),
            classes: vec!["H100-SXM-80G".into()],
            online: true,
            verified: false,
            challenge: None,
            memory: None,
            region: None,
            zone: String::new(),
            fabric: None,
        },
        healthy: true,
        delivery_failed: false,
        window: Window::default(),
        unhealthy_since: None,
    });
    // The exchange ended the lease at `end`; this host's clock, offset
    // included, reads a minute earlier.
    let end = now_ms();
    agent.reporting.clock_offset_ms = -60_000;
    let lease = gpux_engine::LeaseId(7);
    let state = LeaseState {
        kind: LeaseKind::Spot,
        gpu_mask: 1,
        start_ms: end - 600_000,
        end_ms: Some(end),
        ended: true,
        billing: Billing::AsMeasured,
    };
    agent.host.leases.insert(lease, state);
    agent.reporting.record(&mut agent.host, &agent.key).expect("recorded");
    let report = agent.reporting.book.front().expect("a report").clone();
    assert_eq!((report.body.seq, report.body.start_ms, report.body.end_ms), (1, end - 600_000, end), "up to the end");
    assert!(agent.host.leases.is_empty(), "the lease is done");
    agent.reporting.book.acknowledge_front().expect("acknowledged");
    agent.reporting.book.close_lease(lease).expect("closed");
    agent.reporting.record(&mut agent.host, &agent.key).expect("recorded");
    assert_eq!(agent.reporting.book.pending(), 0, "no new chain from the lease's start");
}
