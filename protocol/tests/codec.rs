//! The codec's contract: every message round-trips through both encodings;
//! bad input of every class maps to its error code; and no input, random or
//! mutated from a valid frame, makes either decoder panic.

use gpux_engine::*;
use gpux_protocol::*;
use proptest::prelude::*;

fn sample_client_messages() -> Vec<ClientMessage> {
    let ticket = OrderTicket {
        client_order_id: 7,
        instrument: InstrumentId(0),
        side: Side::Sell,
        order_type: OrderType::Limit,
        price_minor_per_gpu_hour: 2_000_000,
        quantity: 2,
        time_in_force: TimeInForce::Gtt { expire_at_ms: 1_796_227_200_000 },
        post_only: true,
        self_trade_prevention: SelfTradePrevention::Decrement,
        min_quantity: 1,
        one_host: false,
        duration: LeaseDuration::UntilCancelled,
        supply: Some(GpuSet { host: HostId(3), gpu_mask: 0b11 }),
        rematch: false,
        min_supplier_score_bps: 9_900,
        verified_only: true,
        all_or_none: true,
        budget_minor: 5_000_000,
        stop_price_minor_per_gpu_hour: 2_100_000,
        regions: vec!["cn-east".into(), "cn-west".into()],
        nodes: 2,
        min_fabric_gbps: 400,
        volumes: vec![gpux_protocol::VolumeMount { volume: "data".into(), mount: "/data".into(), read_only: false }],
    };
    vec![
        ClientMessage::Auth {
            id: 1,
            public_key: "ab".repeat(32),
            signature: "cd".repeat(64),
            role: Some(Role::Supplier),
            cancel_on_disconnect: true,
            invite: None,
            market_data_version: None,
        },
        ClientMessage::Subscribe { id: 2, channel: Channel::Book, instrument: InstrumentId(0) },
        ClientMessage::Unsubscribe { id: 3, channel: Channel::Trades, instrument: InstrumentId(1) },
        ClientMessage::NewOrder { id: 4, order: ticket, workload: None },
        ClientMessage::CancelOrder { id: 5, order: OrderId(4_294_967_296) },
        ClientMessage::ReplaceOrder { id: 6, order: OrderId(1), price_minor_per_gpu_hour: 1_000, quantity: 1 },
        ClientMessage::MassCancel { id: 7, instrument: None },
        ClientMessage::RegisterGpu {
            id: 8,
            host: "node-1".into(),
            gpu_uuid: "GPU-1".into(),
            spec: GpuSpec {
                vendor: Vendor::Amd,
                model: "AMD Instinct MI300X".into(),
                memory_mib: 196_592,
                interconnect: Interconnect::InfinityFabric,
                mig_profile: None,
            },
            region: Some("cn-west".into()),
            zone: Some("cn-west-1a".into()),
            fabric: Some(FabricClaim { group: "ib-pod-3".into(), gbps: 400, address: "10.8.0.3".into(), port_base: 29_500 }),
        },
        ClientMessage::SetGpuOnline { id: 9, gpu: GpuId(2), online: false },
        ClientMessage::EndLease { id: 10, lease: LeaseId(3) },
        ClientMessage::Deposit { id: 11, account: AccountId(4), amount_minor: 1_000_000 },
        ClientMessage::Withdraw { id: 12, account: None, amount_minor: 5 },
        ClientMessage::Payout { id: 13, account: Some(AccountId(4)), amount_minor: 5 },
        ClientMessage::Instruments { id: 13 },
        ClientMessage::OpenOrders { id: 14, after: None },
        ClientMessage::Stats { id: 15, instrument: InstrumentId(0) },
        ClientMessage::MyGpus { id: 16, offset: 0 },
        ClientMessage::Balance { id: 17 },
        ClientMessage::Statement { id: 18, after: Some(4) },
        ClientMessage::SupplierStats { id: 19, supplier: AccountId(1) },
        ClientMessage::RenterStats { id: 32, renter: AccountId(1) },
        ClientMessage::BookOffers { id: 33, instrument: InstrumentId(0), offset: 0, after: Some(views::OfferCursor { price_minor_per_gpu_hour: 1_900_000, priority: 17 }) },
        ClientMessage::SearchOffers {
            id: 34,
            search: Box::new(gpux_protocol::search::OfferSearch {
                min_gpu_memory_gb: 24,
                vendor: Some(gpux_engine::Vendor::Nvidia),
                regions: vec!["eu-central".into()],
                contracts: vec![gpux_protocol::search::ContractFilter::Spot],
                sort: gpux_protocol::search::OfferSort::PricePerTflops,
                after: Some(gpux_protocol::search::SearchCursor { key: 5, instrument: InstrumentId(1), priority: 9 }),
                limit: Some(10),
                ..Default::default()
            }),
        },
        ClientMessage::Ping { id: 19 },
        ClientMessage::Leases { id: 20, after: Some(100) },
        serde_json::from_str(r#"{"usage_report":{"id":21,"report":{"body":{"lease":17,"gpu_uuid":"GPU-1","seq":1,"start_ms":1796223720000,"end_ms":1796223730000,"available_ms":10000,"utilisation_percent":87,"memory_used_mib_max":61234,"unhealthy_samples":0,"prev_hash":"0000000000000000000000000000000000000000000000000000000000000000"},"signature":"00"}}}"#)
            .expect("a usage report"),
        ClientMessage::SetWorkload {
            id: 22,
            lease: LeaseId(7),
            workload: Box::new(Workload { ports: vec![22, 8888], shm_mib: 1024, secrets_follow: true, ..Workload::image("docker.io/library/python:3.12") }),
        },
        ClientMessage::SetEncryptionKey { id: 23, encryption_key: "ab".repeat(32), signature: "cd".repeat(64) },
        ClientMessage::HostKey { id: 24, lease: LeaseId(7) },
        ClientMessage::DeliveryStatus {
            id: 25,
            lease: LeaseId(7),
            state: DeliveryState::Running { endpoints: vec![Endpoint { container_port: 22, host: "203.0.113.7".into(), port: 40122 }], ssh: Some("ssh -p 40122 root@203.0.113.7".into()), restarts: 1 },
        },
        ClientMessage::LeaseDelivery { id: 26, lease: LeaseId(7) },
        ClientMessage::LeaseLogs { id: 27, lease: LeaseId(7), tail_bytes: 4096 },
        ClientMessage::LeaseExec { id: 28, lease: LeaseId(7), command: vec!["nvidia-smi".into(), "-L".into()], timeout_ms: 30_000 },
        ClientMessage::ExecDone {
            id: 29,
            request: 3,
            outcome: gpux_protocol::delivery::ExecOutcome { exit_code: Some(0), output: "GPU 0: H100\n".into(), ..Default::default() },
        },
        ClientMessage::Logs { id: 28, request: 3, data: "hello\n".into(), truncated: true },
        ClientMessage::ChallengeCommit { id: 29, challenge: 4, commitment: "ab".repeat(32) },
        ClientMessage::ChallengeOpening {
            id: 30,
            challenge: 4,
            leaves: vec![gpux_protocol::memory::LeafOpening { leaf: 1, words: vec![u32::MAX - 2, 0], path: vec!["cd".repeat(32); 2] }],
        },
        ClientMessage::MemoryOpening {
            id: 31,
            challenge: 5,
            leaves: vec![gpux_protocol::memory::LeafOpening { leaf: 3, words: vec![7, 4_000_000_000], path: vec!["ef".repeat(32)] }],
        },
        ClientMessage::FabricProbe {
            id: 46,
            report: Box::new(gpux_protocol::FabricProbeReport::sign(
                gpux_protocol::FabricProbeBody {
                    lease: LeaseId(7),
                    job: gpux_protocol::JobId(3),
                    attempt: 1,
                    ranks: 4,
                    rank: 1,
                    bytes: 64 << 20,
                    elapsed_us: 20_000,
                },
                &ed25519_dalek::SigningKey::from_bytes(&[3; 32]),
            )),
        },
        ClientMessage::GpuProbe {
            id: 47,
            report: Box::new(gpux_protocol::GpuProbeReport::sign(
                gpux_protocol::GpuProbeBody {
                    lease: LeaseId(7),
                    start_ms: 1_000,
                    end_ms: 61_000,
                    samples: 6,
                    gpus: vec![gpux_protocol::ProbeGpu {
                        uuid: "GPU-8f3c".into(),
                        present_samples: 0,
                        utilisation_percent_mean: 0,
                        memory_used_mib_max: 0,
                    }],
                },
                &ed25519_dalek::SigningKey::from_bytes(&[5; 32]),
            )),
        },
        ClientMessage::Liveness {
            id: 31,
            report: gpux_protocol::LivenessReport::sign(
                gpux_protocol::LivenessBody { lease: LeaseId(7), start_ms: 1_000, end_ms: 61_000, reachable: false },
                &ed25519_dalek::SigningKey::from_bytes(&[9; 32]),
            ),
        },
        ClientMessage::MarketDataVersion { id: 48, version: 2 },
        ClientMessage::OpenSubAccount { id: 32 },
        ClientMessage::MoveFunds { id: 33, sub_account: AccountId(12), amount_minor: 5_000_000, to_sub_account: true },
        ClientMessage::SetSubAccountLimits {
            id: 34,
            sub_account: AccountId(12),
            limits: AccountLimits { max_open_orders: Some(3), max_order_minor: None, max_held_minor: Some(9_000_000) },
        },
        ClientMessage::SubAccounts { id: 35, offset: 200 },
        ClientMessage::AddKey {
            id: 36,
            account: Some(AccountId(12)),
            public_key: "ef".repeat(32),
            scopes: Scopes::of(&[Scope::Read, Scope::Manage]),
            expires_at_ms: Some(1_800_000_000_000),
            label: "bot".into(),
        },
        ClientMessage::RevokeKey { id: 37, public_key: "ef".repeat(32) },
        ClientMessage::Keys { id: 38, account: None },
        ClientMessage::Invoice { id: 39, period: "2026-11".into(), account: Some(AccountId(12)), offset: 200 },
        ClientMessage::ExchangeKey { id: 40 },
        ClientMessage::Listing { id: 41 },
        ClientMessage::LeaseTelemetry { id: 42, lease: LeaseId(17) },
        ClientMessage::RecentStatement { id: 42, before: Some(4_000) },
        ClientMessage::SetSpendLimits {
            id: 43,
            limits: SpendLimits { daily_minor: Some(100_000_000), total_minor: None, max_held_minor: Some(50_000_000) },
        },
        ClientMessage::Spend { id: 44 },
        ClientMessage::Trades { id: 45, instrument: InstrumentId(0), before_seq: Some(1_000) },
        ClientMessage::Candles { id: 46, instrument: InstrumentId(0), interval: CandleInterval::Hour, before_ms: None },
        ClientMessage::Fills { id: 47, before: Some(FillCursor { at_ms: 1_796_223_720_000, instrument: InstrumentId(2), seq: 9 }) },
        ClientMessage::Book { id: 48, instrument: InstrumentId(1) },
        ClientMessage::SubmitJob {
            id: 49,
            job: Box::new(JobSubmission {
                name: "train".into(),
                instrument: InstrumentId(0),
                gpus: 8,
                one_host: true,
                limit_minor_per_gpu_hour: 2_000_000,
                hours: 6,
                budget_minor: 400_000_000,
                retries: 3,
                min_supplier_score_bps: 9_500,
                verified_only: true,
                nodes: 0,
                min_fabric_gbps: 0,
                restarts_on_error: 2,
                alternatives: vec![gpux_protocol::JobAlternative { instrument: InstrumentId(3), limit_minor_per_gpu_hour: 1_500_000 }],
                regions: vec!["eu-central".into()],
                run: JobRun {
                    image: "registry.example.com/pytorch@sha256:3ac7".into(),
                    command: vec!["python".into(), "train.py".into()],
                    bundle: Some(BundleRef { sha256: "ab".repeat(32), bytes: 1_043 }),
                    install: vec!["einops>=0.7".into()],
                    checkpoint_dir: "/checkpoints".into(),
                    outputs_dir: "/outputs".into(),
                    checkpoint_interval_s: 600,
                    shm_mib: 8_192,
                    inputs: Vec::new(),
                },
            }),
        },
        ClientMessage::JobStatus { id: 50, job: JobId(3) },
        ClientMessage::Jobs { id: 51, offset: 100 },
        ClientMessage::CancelJob { id: 52, job: JobId(3) },
        ClientMessage::JobStoreToken { id: 53, job: None, lease: Some(LeaseId(9)), volume: None },
        ClientMessage::JobBill { id: 54, job: JobId(3), offset: 0 },
        ClientMessage::ResizeJob { id: 55, job: JobId(3), gpus: 16 },
        ClientMessage::CreateService {
            id: 56,
            service: Box::new(gpux_protocol::ServiceSpec {
                name: "echo".into(),
                instrument: InstrumentId(1),
                gpus: 1,
                limit_minor_per_gpu_hour: 2_000_000,
                budget_minor_per_hour: 8_000_000,
                replicas: 2,
                min_replicas: 0,
                max_replicas: 4,
                image: "localhost/gpux-test:latest".into(),
                command: vec!["python3".into(), "-m".into(), "http.server".into()],
                port: 8000,
                readiness_path: Some("/".into()),
                regions: vec!["us-east".into()],
                min_supplier_score_bps: 9_000,
                scaling: Some(gpux_protocol::ServiceScaling {
                    target: gpux_protocol::ScalingTarget::RequestsPerSecondMilli(5_000),
                    up_window_ms: 10_000,
                    down_window_ms: 60_000,
                }),
                key_hashes: Vec::new(),
            }),
            floor: Some(gpux_protocol::ServiceFloor { instrument: InstrumentId(0), replicas: 1, limit_minor_per_gpu_hour: 2_500_000 }),
        },
        ClientMessage::ServiceStatus { id: 57, service: gpux_protocol::ServiceId(2) },
        ClientMessage::Services { id: 58, offset: 50 },
        ClientMessage::ScaleService { id: 59, service: gpux_protocol::ServiceId(2), replicas: 0 },
        ClientMessage::DeleteService { id: 60, service: gpux_protocol::ServiceId(2) },
        ClientMessage::ServiceBill { id: 66, service: gpux_protocol::ServiceId(2), offset: 0 },
        ClientMessage::UpdateService {
            id: 62,
            service: gpux_protocol::ServiceId(2),
            run: gpux_protocol::ServiceRun {
                image: "localhost/gpux-test:v2".into(),
                command: vec!["python3".into(), "serve.py".into()],
                port: 8000,
                readiness_path: Some("/health".into()),
            },
        },
        ClientMessage::ServiceLoad {
            id: 61,
            service: gpux_protocol::ServiceId(2),
            router: 7,
            load: gpux_protocol::ServiceLoad { requests_per_second_milli: 12_500, in_flight: 3, queued: 0 },
        },
        ClientMessage::CreateVolume { id: 62, name: "data".into(), size_gib: 50 },
        ClientMessage::Volumes { id: 63 },
        ClientMessage::DeleteVolume { id: 64, name: "data".into() },
        ClientMessage::JobStoreToken { id: 65, job: None, lease: None, volume: Some("data".into()) },
        ClientMessage::OfferLease {
            id: 41,
            lease: LeaseId(7),
            price_minor_per_gpu_hour: 2_500_000,
            client_order_id: 12,
            time_in_force: TimeInForce::Gtt { expire_at_ms: 1_800_000_000_000 },
        },
    ]
}

#[test]
fn every_client_message_round_trips_through_both_encodings() {
    for message in sample_client_messages() {
        assert_eq!(decode_client_text(&encode_client_text(&message)), Ok(message.clone()));
        assert_eq!(decode_client_binary(&encode_client_binary(&message)), Ok(message.clone()));
    }
}

#[test]
fn server_messages_round_trip_through_both_encodings() {
    let event = Event {
        seq: 9,
        at_ms: 5,
        kind: EventKind::Trade {
            instrument: InstrumentId(0),
            price_minor_per_gpu_hour: 2_000_000,
            quantity: 1,
            aggressor: Side::Buy,
            buy_order: OrderId(1),
            sell_order: OrderId(2),
            buyer: AccountId(1),
            seller: AccountId(2),
        },
    };
    let messages = vec![
        ServerMessage::Challenge { nonce: "00".repeat(32), server_time_ms: 1 },
        ServerMessage::Reject {
            id: 3,
            journal_seq: 8,
            code: RejectCode::PriceOffTick,
            message: "m".into(),
            bound: Some(views::Bound { tick_minor: Some(1_000), ..Default::default() }),
        },
        ServerMessage::Error { id: None, code: ErrorCode::MalformedJson, message: "m".into() },
        ServerMessage::BookSnapshot { instrument: InstrumentId(0), seq: 4, bids: vec![(1_000, 2)], asks: vec![] },
        ServerMessage::MarketData {
            messages: vec![
                ServerMessage::BookUpdate {
                    instrument: InstrumentId(0),
                    seq: 5,
                    side: Side::Buy,
                    price_minor_per_gpu_hour: 1_000,
                    quantity: 3,
                },
                ServerMessage::Trade {
                    instrument: InstrumentId(0),
                    seq: 2,
                    price_minor_per_gpu_hour: 1_000,
                    quantity: 1,
                    aggressor: Side::Sell,
                    at_ms: 1_796_223_720_000,
                },
                ServerMessage::BookConflated {
                    instrument: InstrumentId(1),
                    from_seq: 6,
                    seq: 90,
                    bids: vec![(1_000, 0)],
                    asks: vec![(1_100, 4)],
                },
            ],
        },
        ServerMessage::Private { event, reason: Some("insufficient funds".into()) },
        ServerMessage::MarketDataVersion { id: 48, version: 2 },
        ServerMessage::Instruments { id: 1, instruments: views::of(&Engine::new(EngineConfig::demo()).expect("valid").instruments()) },
        ServerMessage::GpuChallenge { challenge: 4, gpu: GpuId(2), seed: "ef".repeat(32), n: 256, expires_at_ms: 1_796_223_720_000 },
        ServerMessage::GpuMemoryChallenge {
            challenge: 5,
            gpu: GpuId(2),
            seed: "ef".repeat(32),
            words_log2: 30,
            passes: 10,
            expires_at_ms: 1_796_223_720_000,
        },
        ServerMessage::ChallengeRows { id: 29, journal_seq: 12, challenge: 4, rows: vec![3, 17, 200] },
        ServerMessage::Trades {
            id: 45,
            instrument: InstrumentId(0),
            trades: vec![TradePrint {
                seq: 9,
                at_ms: 1_796_223_720_000,
                price_minor_per_gpu_hour: 2_050_000,
                quantity: 2,
                aggressor: Side::Buy,
            }],
            next_before_seq: Some(9),
        },
        ServerMessage::Candles {
            id: 46,
            instrument: InstrumentId(0),
            interval: CandleInterval::Minute,
            candles: vec![Candle {
                start_ms: 1_796_223_660_000,
                open: 2_000_000,
                high: 2_100_000,
                low: 1_990_000,
                close: 2_050_000,
                volume: 12,
                trades: 5,
            }],
            next_before_ms: None,
        },
        ServerMessage::Fills {
            id: 47,
            fills: vec![Fill {
                instrument: InstrumentId(0),
                seq: 9,
                at_ms: 1_796_223_720_000,
                side: Side::Sell,
                order: OrderId(4_294_967_301),
                price_minor_per_gpu_hour: 2_050_000,
                quantity: 2,
                liquidity: Liquidity::Maker,
            }],
            next_before: None,
        },
        ServerMessage::Book { id: 48, instrument: InstrumentId(1), seq: 77, bids: vec![(2_000_000, 3)], asks: vec![(2_100_000, 1)] },
        ServerMessage::BookOffers {
            id: 49,
            instrument: InstrumentId(0),
            offers: [None, Some(views::FabricProbe { at_ms: 5, lease: LeaseId(3), ranks: 4, mbps: 40_265, borne_out: true })]
                .into_iter()
                .map(|probe| views::Offer {
                    price_minor_per_gpu_hour: 1_900_000,
                    quantity: 8,
                    supplier: AccountId(1),
                    host: Some(HostId(0)),
                    gpus_verified: 8,
                    supplier_score_bps: None,
                    region: Some("us-east".into()),
                    fabric: Some(views::Fabric { name: "ib-pod-3".into(), zone: "z1".into(), gbps: 400, hosts: 4, probe }),
                })
                .collect(),
            next_offset: None,
            next_after: Some(views::OfferCursor { price_minor_per_gpu_hour: 1_900_000, priority: 17 }),
        },
        ServerMessage::OffersFound {
            id: 50,
            offers: vec![gpux_protocol::search::FoundOffer {
                instrument: InstrumentId(0),
                symbol: "H100-SXM-80G/SPOT".into(),
                class: "H100-SXM-80G".into(),
                contract: gpux_engine::ContractKind::Spot,
                price_minor_per_gpu_hour: 1_900_000,
                quantity: 8,
                supplier: AccountId(1),
                host: Some(HostId(0)),
                vendor: gpux_engine::Vendor::Nvidia,
                model: "NVIDIA H100 80GB HBM3".into(),
                gpu_memory_mib: 81_559,
                gpus_verified: 8,
                supplier_score_bps: Some(9_900),
                region: None,
                fabric: None,
                measured_gflops: Some(412_000),
                price_minor_per_gb_hour: 23_855,
                price_minor_per_tflops_hour: Some(4_611),
                place: gpux_protocol::search::SearchCursor { key: 23_855, instrument: InstrumentId(0), priority: 3 },
            }],
            next_after: None,
        },
    ];
    for message in messages {
        assert_eq!(decode_server_text(&encode_server_text(&message)), Ok(message.clone()));
        assert_eq!(decode_server_binary(&encode_server_binary(&message)), Ok(message.clone()));
    }
}

#[test]
fn the_json_shape_is_the_documented_one() {
    let text = r#"{"new_order":{"id":4,"order":{"client_order_id":1,"instrument":0,"side":"buy","price_minor_per_gpu_hour":2000000,"quantity":1}}}"#;
    let ClientMessage::NewOrder { id, order, workload: None } = decode_client_text(text).expect("documented example decodes") else {
        panic!("wrong message")
    };
    assert_eq!(id, 4);
    assert_eq!(order.time_in_force, TimeInForce::Gtc, "defaults apply");
    assert_eq!(order.duration, LeaseDuration::Hours(1));
}

#[test]
fn each_class_of_bad_text_has_its_code() {
    let cases = [
        ("{not json", ErrorCode::MalformedJson),
        ("", ErrorCode::MalformedJson),
        (r#"{"launch_rocket":{"id":1}}"#, ErrorCode::UnknownMessage),
        (r#"{"ping":{"id":"one"}}"#, ErrorCode::WrongType),
        (r#"{"cancel_order":{"id":1}}"#, ErrorCode::WrongType),
        (r#"{"ping":{"id":-1}}"#, ErrorCode::WrongType),
        (r#"{"ping":{}}"#, ErrorCode::WrongType),
        // A value outside a field's documented set is a bad field, not an unknown message.
        (
            r#"{"new_order":{"id":1,"order":{"client_order_id":1,"instrument":0,"side":"up","price_minor_per_gpu_hour":1,"quantity":1}}}"#,
            ErrorCode::WrongType,
        ),
        (
            r#"{"new_order":{"id":1,"order":{"client_order_id":1,"instrument":0,"side":"buy","time_in_force":"forever","price_minor_per_gpu_hour":1,"quantity":1}}}"#,
            ErrorCode::WrongType,
        ),
        (r#"{"auth":{"id":1,"public_key":"00","signature":"00","role":"king"}}"#, ErrorCode::WrongType),
        (r#"{"subscribe":{"id":1,"channel":"gossip","instrument":0}}"#, ErrorCode::WrongType),
        // A challenge opening of the row-hash scheme before the Merkle tree.
        (r#"{"challenge_opening":{"id":1,"challenge":2,"row_hashes":[],"rows":[[0,[1,-2]]]}}"#, ErrorCode::WrongType),
        // JSON that names no message.
        ("{}", ErrorCode::UnknownMessage),
        ("[]", ErrorCode::UnknownMessage),
        (r#""ping""#, ErrorCode::UnknownMessage),
        ("42", ErrorCode::UnknownMessage),
        (r#"{"ping":{"id":1},"balance":{"id":2}}"#, ErrorCode::UnknownMessage),
    ];
    for (text, code) in cases {
        assert_eq!(decode_client_text(text).map_err(|e| e.code), Err(code), "{text}");
    }
    let huge = format!(r#"{{"ping":{{"id":1,"pad":"{}"}}}}"#, "x".repeat(FRAME_BYTES_MAX));
    assert_eq!(decode_client_text(&huge).map_err(|e| e.code), Err(ErrorCode::FrameTooLarge));
}

/// A frame that does not decode but names its request's id is answered with
/// that id, so the client waiting on it hears why; one without an id (or
/// not JSON) with none.
#[test]
fn a_bad_frame_is_answered_with_its_id_when_it_carries_one() {
    let id_of = |text: &str| decode_client_text(text).expect_err("refused").id;
    assert_eq!(id_of(r#"{"cancel_order":{"id":41}}"#), Some(41));
    assert_eq!(id_of(r#"{"launch_rocket":{"id":42}}"#), Some(42));
    assert_eq!(id_of(r#"{"new_order":{"id":43,"order":{"side":"up"}}}"#), Some(43));
    assert_eq!(id_of(r#"{"ping":{"id":"one"}}"#), None, "an id that is not a number names no request");
    assert_eq!(id_of(r#"{"ping":{}}"#), None);
    assert_eq!(id_of("{not json"), None);
    assert_eq!(id_of(r#"{"ping":{"id":1},"balance":{"id":2}}"#), None, "two messages: no one request");
    assert_eq!(decode_client_binary(&[0xff]).expect_err("refused").id, None);
}

/// The names the codec checks unknown messages against are the names serde
/// writes: every sample message's key is among them.
#[test]
fn the_known_message_names_are_the_wire_names() {
    use strum::VariantNames;
    let mut sampled = std::collections::BTreeSet::new();
    for message in sample_client_messages() {
        let text = encode_client_text(&message);
        let name = text.split('"').nth(1).expect("a key").to_string();
        assert!(ClientMessage::VARIANTS.contains(&name.as_str()), "{name} is not among {:?}", ClientMessage::VARIANTS);
        sampled.insert(name);
    }
    let known: std::collections::BTreeSet<String> = ClientMessage::VARIANTS.iter().map(|n| n.to_string()).collect();
    assert_eq!(sampled, known, "every message has a sample here (add one for a new message)");
}

#[test]
fn bad_binary_frames_are_malformed_binary() {
    let valid = encode_client_binary(&ClientMessage::Ping { id: 1 });
    let mut trailing = valid.clone();
    trailing.push(0);
    for bytes in [vec![], vec![0xff; 16], trailing, valid[..valid.len() - 1].to_vec()] {
        assert_eq!(decode_client_binary(&bytes).map_err(|e| e.code), Err(ErrorCode::MalformedBinary), "{bytes:?}");
    }
    // A length prefix claiming a huge string must not allocate it.
    let claims_huge_string = [0u8, 0, 0xfc, 0xff, 0xff, 0xff, 0x7f];
    assert!(decode_client_binary(&claims_huge_string).is_err());
}

proptest! {
    #[test]
    fn random_bytes_never_panic_either_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(error) = decode_client_binary(&bytes) {
            prop_assert!(matches!(error.code, ErrorCode::MalformedBinary));
        }
        if let Ok(text) = std::str::from_utf8(&bytes) {
            if let Err(error) = decode_client_text(text) {
                prop_assert!(matches!(error.code, ErrorCode::MalformedJson | ErrorCode::WrongType | ErrorCode::UnknownMessage));
            }
        }
    }

    #[test]
    // Over every sample message (a fixed range once left most of them out).
    fn mutated_valid_frames_never_panic(pick in any::<prop::sample::Index>(), position in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let samples = sample_client_messages();
        let message = &samples[pick.index(samples.len())];
        let mut binary = encode_client_binary(message);
        let index = position.index(binary.len());
        binary[index] = byte;
        let _ = decode_client_binary(&binary);
        let _ = decode_client_binary(&binary[..cut.index(binary.len())]);
        let mut text = encode_client_text(message).into_bytes();
        let index = position.index(text.len());
        text[index] = byte;
        if let Ok(text) = std::str::from_utf8(&text) {
            let _ = decode_client_text(text);
        }
    }
}

#[test]
fn the_deepest_book_snapshot_fits_a_frame_in_both_encodings() {
    // The largest price a class may have (2^40), and more GPUs at one level
    // than any market holds.
    let level = (1u64 << 40, u64::from(u32::MAX));
    let snapshot = ServerMessage::BookSnapshot {
        instrument: InstrumentId(u32::MAX),
        seq: u64::MAX,
        bids: vec![level; BOOK_SNAPSHOT_LEVELS_MAX],
        asks: vec![level; BOOK_SNAPSHOT_LEVELS_MAX],
    };
    let text = encode_server_text(&snapshot);
    assert!(text.len() <= FRAME_BYTES_MAX, "text: {} bytes", text.len());
    assert!(encode_server_binary(&snapshot).len() <= FRAME_BYTES_MAX);
    assert_eq!(decode_server_text(&text).expect("decodes"), snapshot);
}

/// A full page of the biggest leases (64 GPUs each, every number at its
/// largest) is cut to what fits a frame, keeps at least one, and says
/// where the next page starts; a page of small items is left whole.
#[test]
fn a_page_of_big_items_is_cut_to_fit_a_frame() {
    use gpux_engine::{AccountId, GpuId, LeaseId, LeaseKind};
    let big = views::Lease {
        lease: LeaseId(u64::MAX),
        kind: LeaseKind::Preemptible,
        renter: AccountId(u32::MAX),
        supplier: AccountId(u32::MAX),
        gpus: (0..64).map(|n| GpuId(u32::MAX - n)).collect(),
        price_minor_per_gpu_hour: 1 << 40,
        start_ms: u64::MAX,
        end_ms: Some(u64::MAX),
        active: true,
        ended_at_ms: Some(u64::MAX),
        escrow_minor: u64::MAX,
        billing_closed: false,
        verified_gpu_ms: u64::MAX,
        usage_charged_minor: u64::MAX,
    };
    let mut leases = vec![big; ORDERS_PAGE_MAX];
    assert!(fit_page(&mut leases), "200 leases of 64 GPUs do not fit one frame");
    assert!(!leases.is_empty() && leases.len() < ORDERS_PAGE_MAX);
    let page = ServerMessage::Leases { id: u64::MAX, leases, next_after: Some(u64::MAX) };
    assert!(encode_server_text(&page).len() <= FRAME_BYTES_MAX, "{} bytes", encode_server_text(&page).len());
    assert!(encode_server_binary(&page).len() <= FRAME_BYTES_MAX);

    let mut small = vec![1u8; ORDERS_PAGE_MAX];
    assert!(!fit_page(&mut small));
    assert_eq!(small.len(), ORDERS_PAGE_MAX);
}

/// What the CLI prints by `name()` is the name serde writes: an invoice
/// line's item, a delivery failure's code, a key's scope.
#[test]
fn printed_names_are_the_wire_names() {
    for item in <gpux_protocol::invoice::InvoiceItem as strum::VariantArray>::VARIANTS {
        assert_eq!(serde_json::to_value(item).expect("json"), serde_json::Value::String(item.name().to_string()));
    }
    for code in <gpux_protocol::FailureCode as strum::VariantArray>::VARIANTS {
        assert_eq!(serde_json::to_value(code).expect("json"), serde_json::Value::String(code.name().to_string()));
    }
    for scope in gpux_protocol::access::Scope::ALL {
        assert_eq!(serde_json::to_value(scope).expect("json"), serde_json::Value::String(scope.name().to_string()));
    }
}
