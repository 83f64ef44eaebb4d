//! The REST read API against the real binary (docs/rest.md): every path of
//! docs/openapi.json is asked, and every answer, success or refusal, is
//! validated against the document's schema for its status; the document
//! names no path this test does not ask. Then the rules of signed requests
//! (a stale or forged signature, a key without the `read` scope, a path
//! that needs a signature asked without one), and that REST sessions are
//! not the account's presence: a supplier's requests while its agent is
//! away record no disconnects.

mod common;

use std::collections::BTreeSet;

use common::*;
use ed25519_dalek::{Signer, SigningKey};
use gpux_engine::*;
use gpux_protocol::*;
use serde_json::Value;

const SPEC: &str = include_str!("../../docs/openapi.json");

struct Api {
    addr: String,
    spec: Value,
    /// The operations asked: (method, path template).
    asked: BTreeSet<(String, String)>,
}

impl Api {
    /// `method path` with these headers and body, validated against the
    /// document: the path's template and method, its status among the
    /// documented ones, the body against that status's schema. Returns
    /// status, head and body.
    async fn call(&mut self, method: &str, template: &str, path: &str, headers: &[(&str, String)], body: &str) -> (u16, String, String) {
        let (status, head, body) = http_request(&self.addr, method, path, headers, body).await;
        let operation = &self.spec["paths"][template][method.to_ascii_lowercase()];
        assert!(operation.is_object(), "{method} {template} is in docs/openapi.json");
        let response = &operation["responses"][status.to_string()];
        assert!(response.is_object(), "{method} {path}: status {status} is documented for {template} ({body})");
        let schema = &response["content"]["application/json"]["schema"];
        let value: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: JSON body: {e}: {body}"));
        let mut root = self.spec.clone();
        root.as_object_mut().expect("an object").extend(schema.as_object().expect("a schema").clone());
        let validator = jsonschema::validator_for(&root).expect("the document's schemas compile");
        let errors: Vec<String> = validator.iter_errors(&value).map(|e| format!("{} at {}", e, e.instance_path())).collect();
        assert!(errors.is_empty(), "{method} {path} ({status}) does not match docs/openapi.json: {errors:?}\n{body}");
        self.asked.insert((method.to_string(), template.to_string()));
        (status, head, body)
    }

    async fn get_with(&mut self, template: &str, path: &str, headers: &[(&str, String)]) -> (u16, String) {
        let (status, _, body) = self.call("GET", template, path, headers, "").await;
        (status, body)
    }

    /// `GET path` (signed with `key` when given), validated; the body parsed.
    async fn json(&mut self, template: &str, path: &str, key: Option<&SigningKey>) -> (u16, Value) {
        let headers = match key {
            Some(key) => signed_headers(key, path, now_ms()),
            None => Vec::new(),
        };
        let (status, body) = self.get_with(template, path, &headers).await;
        (status, serde_json::from_str(&body).expect("JSON"))
    }

    /// A write signed by `key` under `idempotency_key`, validated: status,
    /// whether the answer was replayed, the body parsed.
    async fn write(
        &mut self,
        key: &SigningKey,
        idempotency_key: &str,
        (method, template, path): (&str, &str, &str),
        body: &str,
    ) -> (u16, bool, Value) {
        let headers = signed_write_headers(key, method, path, idempotency_key, body, now_ms());
        let (status, head, body) = self.call(method, template, path, &headers, body).await;
        (status, head.to_ascii_lowercase().contains("idempotent-replayed: true"), serde_json::from_str(&body).expect("JSON"))
    }

    /// The operations docs/openapi.json documents with `GET` (`reads`) or
    /// with any other method.
    fn documented(&self, reads: bool) -> BTreeSet<(String, String)> {
        let mut operations = BTreeSet::new();
        for (template, methods) in self.spec["paths"].as_object().expect("paths") {
            for method in methods.as_object().expect("methods").keys() {
                if (method == "get") == reads {
                    operations.insert((method.to_ascii_uppercase(), template.clone()));
                }
            }
        }
        operations
    }
}

/// One HTTP/1.1 request: status, head and body of the answer.
async fn http_request(addr: &str, method: &str, path: &str, headers: &[(&str, String)], body: &str) -> (u16, String, String) {
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method != "GET" {
        request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    let response = http_raw(addr, &request).await;
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok()).unwrap_or_else(|| panic!("a status line: {response}"));
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (status, head.to_string(), body.to_string())
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as u64
}

fn signed_headers(key: &SigningKey, path: &str, timestamp_ms: u64) -> Vec<(&'static str, String)> {
    let signature = key.sign(&gpux_gateway::rest::signed_bytes("GET", path, timestamp_ms));
    vec![
        ("X-Gpux-Key", hex::encode(key.verifying_key().to_bytes())),
        ("X-Gpux-Timestamp", timestamp_ms.to_string()),
        ("X-Gpux-Signature", hex::encode(signature.to_bytes())),
    ]
}

fn signed_write_headers(
    key: &SigningKey,
    method: &str,
    path: &str,
    idempotency_key: &str,
    body: &str,
    timestamp_ms: u64,
) -> Vec<(&'static str, String)> {
    let bytes = gpux_gateway::rest::signed_write_bytes(method, path, timestamp_ms, idempotency_key, body.as_bytes());
    vec![
        ("X-Gpux-Key", hex::encode(key.verifying_key().to_bytes())),
        ("X-Gpux-Timestamp", timestamp_ms.to_string()),
        ("X-Gpux-Signature", hex::encode(key.sign(&bytes).to_bytes())),
        ("Idempotency-Key", idempotency_key.to_string()),
    ]
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("an error body: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_path_answers_as_the_openapi_document_says() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--console-listen", "127.0.0.1:0"]);
    assert!(!exchange.console_addr.is_empty(), "the exchange says where it serves HTTP");
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut supplier, supplier_account) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let (mut renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: renter_account, amount_minor: 100_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    supplier.register_h100("rest-host", "GPU-rest-0").await;
    let spot = InstrumentId(0);
    let mut ask = ticket(1, Side::Sell, 2_000_000, 1);
    ask.instrument = spot;
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    let placed = supplier.place(ask).await;
    assert!(matches!(placed, ServerMessage::Ack { .. }), "{placed:?}");
    let mut bid = ticket(2, Side::Buy, 2_500_000, 1);
    bid.instrument = spot;
    assert!(matches!(renter.place(bid).await, ServerMessage::Ack { .. }));
    // A resting bid, so the book has a side.
    let mut resting = ticket(3, Side::Buy, 1_000_000, 2);
    resting.instrument = spot;
    assert!(matches!(renter.place(resting).await, ServerMessage::Ack { .. }));

    let spec: Value = serde_json::from_str(SPEC).expect("docs/openapi.json is JSON");
    let mut api = Api { addr: exchange.console_addr.clone(), spec, asked: BTreeSet::new() };
    let (renter_key, supplier_key) = (key(3), key(2));

    // Public paths.
    let (status, document) = api.json("/api/v1/openapi.json", "/api/v1/openapi.json", None).await;
    assert_eq!((status, document["openapi"].as_str()), (200, Some("3.1.0")));
    let (status, listing) = api.json("/api/v1/listing", "/api/v1/listing", None).await;
    assert_eq!((status, listing["listing"]["currency"]["code"].as_str()), (200, Some("USD")));
    let (status, instruments) = api.json("/api/v1/instruments", "/api/v1/instruments", None).await;
    assert_eq!((status, instruments["instruments"][0]["symbol"].as_str()), (200, Some("H100-SXM-80G/SPOT")));
    let (status, stats) = api.json("/api/v1/instruments/{instrument}/stats", "/api/v1/instruments/0/stats", None).await;
    assert_eq!((status, stats["last"].as_u64(), stats["volume"].as_u64()), (200, Some(2_000_000), Some(1)));
    let (status, book) = api.json("/api/v1/instruments/{instrument}/book", "/api/v1/instruments/0/book", None).await;
    assert_eq!((status, &book["bids"]), (200, &serde_json::json!([[1_000_000, 2]])));
    // Search across books: a second GPU of the host rests on the preemptible book.
    supplier.register_h100("rest-host", "GPU-rest-1").await;
    let mut preemptible = ticket(4, Side::Sell, 3_000_000, 1);
    preemptible.instrument = InstrumentId(1);
    preemptible.supply = Some(GpuSet { host: HostId(0), gpu_mask: 0b10 });
    assert!(matches!(supplier.place(preemptible).await, ServerMessage::Ack { .. }));
    let path = "/api/v1/offers?min_gpu_memory_gb=80&contracts=spot,preemptible&sort=price_per_gb&limit=10";
    let (status, found) = api.json("/api/v1/offers", path, None).await;
    assert_eq!((status, found["offers"].as_array().map(Vec::len)), (200, Some(1)), "{found}");
    let offer = &found["offers"][0];
    assert_eq!((offer["instrument"].as_u64(), offer["gpu_memory_mib"].as_u64()), (Some(1), Some(81_559)), "{offer}");
    assert_eq!(offer["price_minor_per_gb_hour"].as_u64(), Some(3_000_000 * 1_000_000_000 / (81_559 * 1_048_576)));
    let (status, none) = api.json("/api/v1/offers", "/api/v1/offers?min_gpu_memory_gb=86", None).await;
    assert_eq!((status, none["offers"].as_array().map(Vec::len)), (200, Some(0)), "no 86 GB GPU: {none}");
    let (status, refused) = api.json("/api/v1/offers", "/api/v1/offers?sort=cheapest", None).await;
    assert_eq!((status, code(&refused)), (400, "wrong_type"), "{refused}");
    let (status, offers) = api.json("/api/v1/instruments/{instrument}/offers", "/api/v1/instruments/0/offers?offset=0", None).await;
    assert_eq!((status, offers["offers"].as_array().map(Vec::len)), (200, Some(0)), "the only ask was taken");
    let path = "/api/v1/instruments/0/offers?after_price=2000000&after_priority=1";
    let (status, offers) = api.json("/api/v1/instruments/{instrument}/offers", path, None).await;
    assert_eq!((status, &offers["next_after"]), (200, &Value::Null), "by cursor: {offers}");
    let (status, body) = api.json("/api/v1/instruments/{instrument}/offers", "/api/v1/instruments/0/offers?after_price=1", None).await;
    assert_eq!((status, code(&body)), (400, "wrong_type"), "half a cursor");
    let (status, trades) = api.json("/api/v1/instruments/{instrument}/trades", "/api/v1/instruments/0/trades", None).await;
    assert_eq!(status, 200);
    assert_eq!(trades["trades"][0]["price_minor_per_gpu_hour"].as_u64(), Some(2_000_000));
    assert_eq!(trades["trades"][0]["aggressor"].as_str(), Some("buy"));
    let (status, candles) = api.json("/api/v1/instruments/{instrument}/candles", "/api/v1/instruments/0/candles?interval=1h", None).await;
    assert_eq!((status, candles["candles"][0]["volume"].as_u64()), (200, Some(1)));
    let path = format!("/api/v1/suppliers/{}/stats", supplier_account.0);
    let (status, stats) = api.json("/api/v1/suppliers/{supplier}/stats", &path, None).await;
    assert_eq!((status, stats["hosts"][0]["host_name"].as_str()), (200, Some("rest-host")));
    let path = format!("/api/v1/renters/{}/stats", renter_account.0);
    let (status, _) = api.json("/api/v1/renters/{renter}/stats", &path, None).await;
    assert_eq!(status, 200);

    // The account's paths, signed.
    let (status, balance) = api.json("/api/v1/account/balance", "/api/v1/account/balance", Some(&renter_key)).await;
    assert_eq!((status, balance["held_minor"].as_u64().map(|h| h > 0)), (200, Some(true)));
    // docs/rest.md's curl and OpenSSL recipe, run as written there, signs the same request.
    let by_shell = shell_recipe(&exchange.console_addr, &renter_key, &["/api/v1/account/balance"]);
    assert_eq!(serde_json::from_str::<Value>(&by_shell).unwrap_or_else(|e| panic!("{e}: {by_shell}")), balance);
    let (status, orders) = api.json("/api/v1/account/orders", "/api/v1/account/orders", Some(&renter_key)).await;
    assert_eq!((status, orders["orders"].as_array().map(Vec::len)), (200, Some(1)), "the resting bid");
    let (status, leases) = api.json("/api/v1/account/leases", "/api/v1/account/leases", Some(&renter_key)).await;
    assert_eq!((status, leases["leases"][0]["price_minor_per_gpu_hour"].as_u64()), (200, Some(2_000_000)));
    let (status, gpus) = api.json("/api/v1/account/gpus", "/api/v1/account/gpus", Some(&supplier_key)).await;
    assert_eq!((status, gpus["gpus"][0]["uuid"].as_str()), (200, Some("GPU-rest-0")));
    let (status, statement) = api.json("/api/v1/account/statement", "/api/v1/account/statement", Some(&renter_key)).await;
    assert_eq!(status, 200);
    assert!(statement["lines"].as_array().is_some_and(|lines| !lines.is_empty()));
    let (status, volumes) = api.json("/api/v1/account/volumes", "/api/v1/account/volumes", Some(&renter_key)).await;
    assert_eq!((status, volumes["volumes"].as_array().map(Vec::len)), (200, Some(0)), "{volumes}");
    let (status, services) = api.json("/api/v1/account/services", "/api/v1/account/services?offset=0", Some(&renter_key)).await;
    assert_eq!((status, services["services"].as_array().map(Vec::len)), (200, Some(0)), "{services}");
    let (status, body) = api.json("/api/v1/account/services/{service}", "/api/v1/account/services/999", Some(&renter_key)).await;
    assert_eq!((status, code(&body)), (404, "unknown_service"), "{body}");
    let (status, fills) = api.json("/api/v1/account/fills", "/api/v1/account/fills", Some(&renter_key)).await;
    assert_eq!((status, fills["fills"][0]["side"].as_str(), fills["fills"][0]["liquidity"].as_str()), (200, Some("buy"), Some("taker")));
    let (status, sold) = api.json("/api/v1/account/fills", "/api/v1/account/fills", Some(&supplier_key)).await;
    assert_eq!((status, sold["fills"][0]["liquidity"].as_str()), (200, Some("maker")));
    let cursor = &fills["fills"][0];
    let older = format!(
        "/api/v1/account/fills?before_at_ms={}&before_instrument={}&before_seq={}",
        cursor["at_ms"], cursor["instrument"], cursor["seq"]
    );
    let (status, none) = api.json("/api/v1/account/fills", &older, Some(&renter_key)).await;
    assert_eq!((status, none["fills"].as_array().map(Vec::len)), (200, Some(0)), "nothing before the first fill");

    // The same answers as the WebSocket's.
    let id = renter.id();
    let ServerMessage::Fills { fills: over_ws, .. } = renter.request(ClientMessage::Fills { id, before: None }).await else {
        panic!("fills")
    };
    assert_eq!(serde_json::to_value(&over_ws).expect("JSON"), fills["fills"]);

    // Refusals, each with its code and documented status.
    let (status, body) = api.json("/api/v1/account/fills", "/api/v1/account/fills", None).await;
    assert_eq!((status, code(&body)), (401, "not_authenticated"));
    let stale = signed_headers(&renter_key, "/api/v1/account/balance", now_ms() - 120_000);
    let (status, body) = api.get_with("/api/v1/account/balance", "/api/v1/account/balance", &stale).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (401, "auth_failed"), "a stale timestamp");
    assert!(body.contains("more than 30 s from the exchange's clock"), "{body}");
    let in_seconds = signed_headers(&renter_key, "/api/v1/account/balance", now_ms() / 1_000);
    let (status, body) = api.get_with("/api/v1/account/balance", "/api/v1/account/balance", &in_seconds).await;
    assert_eq!(status, 401);
    assert!(body.contains("must be milliseconds since the Unix epoch, not seconds"), "a timestamp in seconds says so: {body}");
    let forged = signed_headers(&renter_key, "/api/v1/account/orders", now_ms());
    let (status, body) = api.get_with("/api/v1/account/balance", "/api/v1/account/balance", &forged).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (401, "auth_failed"), "signed for another path");
    let (status, body) = api.json("/api/v1/account/balance", "/api/v1/account/balance", Some(&key(99))).await;
    assert_eq!((status, code(&body)), (401, "auth_failed"), "a key without an account");
    let (status, body) = api.json("/api/v1/instruments/{instrument}/candles", "/api/v1/instruments/0/candles?interval=5m", None).await;
    assert_eq!((status, code(&body)), (400, "wrong_type"));
    let (status, body) = api.json("/api/v1/instruments/{instrument}/trades", "/api/v1/instruments/0/trades?before=3", None).await;
    assert_eq!((status, code(&body)), (400, "wrong_type"), "an unknown parameter");
    let (status, body) = api.json("/api/v1/instruments/{instrument}/trades", "/api/v1/instruments/4000/trades", None).await;
    assert_eq!((status, code(&body)), (404, "unknown_instrument"));
    // By symbol, its '/' written %2F: the same answer as by id.
    let (status, by_id) = api.json("/api/v1/instruments/{instrument}/trades", "/api/v1/instruments/0/trades", None).await;
    assert_eq!(status, 200);
    let (status, by_symbol) =
        api.json("/api/v1/instruments/{instrument}/trades", "/api/v1/instruments/H100-SXM-80G%2FSPOT/trades", None).await;
    assert_eq!((status, &by_symbol), (200, &by_id));
    let (status, body) = api.json("/api/v1/instruments/{instrument}/stats", "/api/v1/instruments/H100-SXM-80G%2FNOPE/stats", None).await;
    assert_eq!((status, code(&body)), (404, "unknown_instrument"));
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("H100-SXM-80G/NOPE")), "{body}");
    let (status, body) = api.json("/api/v1/instruments/{instrument}/stats", "/api/v1/instruments/H100%2/stats", None).await;
    assert_eq!((status, code(&body)), (400, "wrong_type"), "a broken escape");
    let (status, body) = api.json("/api/v1/suppliers/{supplier}/stats", "/api/v1/suppliers/4000/stats", None).await;
    assert_eq!((status, code(&body)), (404, "unknown_supplier"));
    let (status, body) = http_get(&exchange.console_addr, "/api/v1/launch", &[]).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (404, "unknown_message"));

    // A key without the read scope.
    let trader = key(40);
    let id = renter.id();
    let added = renter
        .request(ClientMessage::AddKey {
            id,
            account: None,
            public_key: hex::encode(trader.verifying_key().to_bytes()),
            scopes: Scopes::of(&[Scope::Trade]),
            expires_at_ms: None,
            label: "bot".into(),
        })
        .await;
    assert!(matches!(added, ServerMessage::KeyAdded { .. }), "{added:?}");
    let (status, body) = api.json("/api/v1/account/fills", "/api/v1/account/fills", Some(&trader)).await;
    assert_eq!((status, code(&body)), (403, "scope_denied"));

    // Every documented read was asked.
    assert_eq!(api.asked, api.documented(true), "the test asks every read docs/openapi.json documents");

    // REST sessions are not presence: the supplier's agent leaves (one
    // disconnect during a lease), and its REST reads add none.
    drop(supplier);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let path = format!("/api/v1/suppliers/{}/stats", supplier_account.0);
    let (_, before) = api.json("/api/v1/suppliers/{supplier}/stats", &path, None).await;
    assert_eq!(before["record"]["disconnects_during_leases"].as_u64(), Some(1), "{before}");
    for _ in 0..3 {
        let (status, _) = api.json("/api/v1/account/gpus", "/api/v1/account/gpus", Some(&supplier_key)).await;
        assert_eq!(status, 200);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (_, after) = api.json("/api/v1/suppliers/{supplier}/stats", &path, None).await;
    assert_eq!(after["record"]["disconnects_during_leases"].as_u64(), Some(1), "{after}");
}

/// REST writes (docs/rest.md "Writes") against the binary: every write
/// docs/openapi.json names, each answer validated against it; an order's
/// whole outcome (its fill and lease) in its answer; a retry under the same
/// Idempotency-Key answered again and applied once; the key reused for
/// another write refused; writes unsigned, without a key, with a body that
/// is not JSON, too large, or signed over another body refused with their
/// codes; an engine refusal as `rejected` with its journal entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_signed_idempotent_and_answer_their_whole_outcome() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--console-listen", "127.0.0.1:0"]);
    let (_operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut supplier, _) = Client::login(&exchange.addr, &key(2), Role::Supplier).await;
    let (_renter, renter_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    supplier.register_h100("rest-host", "GPU-rest-0").await;
    let mut ask = ticket(1, Side::Sell, 2_000_000, 1);
    ask.supply = Some(GpuSet { host: HostId(0), gpu_mask: 1 });
    assert!(matches!(supplier.place(ask).await, ServerMessage::Ack { .. }));

    let spec: Value = serde_json::from_str(SPEC).expect("docs/openapi.json is JSON");
    let mut api = Api { addr: exchange.console_addr.clone(), spec, asked: BTreeSet::new() };
    let (operator_key, renter_key) = (key(1), key(3));

    // Funds: the operator credits the renter; a renter's key cannot.
    let deposit_path = ("POST", "/api/v1/account/deposit", "/api/v1/account/deposit");
    let deposit = format!(r#"{{"account":{},"amount_minor":100000000}}"#, renter_account.0);
    let (status, _, body) = api.write(&operator_key, "deposit-1", deposit_path, &deposit).await;
    assert_eq!((status, body["order"].clone()), (200, Value::Null), "{body}");
    let (status, _, body) = api.write(&renter_key, "deposit-2", deposit_path, &deposit).await;
    assert_eq!((status, code(&body)), (403, "forbidden"));

    // An IOC bid by symbol takes the ask: its answer is the whole outcome.
    let orders = ("POST", "/api/v1/orders", "/api/v1/orders");
    let bid = r#"{"order":{"client_order_id":7,"instrument":"H100-SXM-80G/SPOT","side":"buy","price_minor_per_gpu_hour":2500000,"quantity":1,"time_in_force":"ioc"}}"#;
    let (status, replayed, first) = api.write(&renter_key, "bid-1", orders, bid).await;
    assert_eq!((status, replayed), (200, false), "{first}");
    let events = first["events"].as_array().expect("events").clone();
    let kinds: Vec<String> = events.iter().filter_map(|e| e["kind"].as_object()?.keys().next().cloned()).collect();
    assert!(kinds.iter().any(|k| k == "order_accepted") && kinds.iter().any(|k| k == "lease_created"), "{kinds:?}");
    let lease = events.iter().find_map(|e| e["kind"]["lease_created"]["lease"].as_u64()).expect("the lease in the answer");
    assert!(events.iter().all(|e| e["kind"].as_object().and_then(|k| k.values().next()).is_some()), "{first}");
    // The same write again (a client that lost the answer): the same answer, applied once.
    let (status, replayed, again) = api.write(&renter_key, "bid-1", orders, bid).await;
    assert_eq!((status, replayed, &again), (200, true, &first));
    let (_, leases) = api.json("/api/v1/account/leases", "/api/v1/account/leases", Some(&renter_key)).await;
    assert_eq!(leases["leases"].as_array().map(Vec::len), Some(1), "the retry placed nothing: {leases}");
    // The key used for another write: refused, nothing applied.
    let other = bid.replace("\"quantity\":1", "\"quantity\":2");
    let (status, _, body) = api.write(&renter_key, "bid-1", orders, &other).await;
    assert_eq!((status, code(&body)), (422, "idempotency_key_reused"), "{body}");

    // A resting bid: replaced, then cancelled; then a mass cancel.
    let resting = r#"{"order":{"client_order_id":8,"instrument":0,"side":"buy","price_minor_per_gpu_hour":1000000,"quantity":2}}"#;
    let (status, _, placed) = api.write(&renter_key, "bid-2", orders, resting).await;
    assert_eq!(status, 200, "{placed}");
    let order = placed["order"].as_u64().expect("an order id");
    let path = format!("/api/v1/orders/{order}");
    let replace = r#"{"price_minor_per_gpu_hour":1100000,"quantity":2}"#;
    let (status, _, body) = api.write(&renter_key, "replace-1", ("PATCH", "/api/v1/orders/{order}", &path), replace).await;
    assert_eq!(status, 200, "{body}");
    let (_, open) = api.json("/api/v1/account/orders", "/api/v1/account/orders", Some(&renter_key)).await;
    assert_eq!(open["orders"][0]["price_minor_per_gpu_hour"].as_u64(), Some(1_100_000), "{open}");
    let (status, _, body) = api.write(&renter_key, "cancel-1", ("DELETE", "/api/v1/orders/{order}", &path), "").await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = api.write(&renter_key, "cancel-2", ("DELETE", "/api/v1/orders/{order}", &path), "").await;
    assert_eq!(status, 422, "a cancelled order is not cancelled twice: {body}");
    assert!(body["rejected"]["journal_seq"].as_u64().is_some(), "{body}");
    let (status, _, body) = api.write(&renter_key, "cancel-all", ("DELETE", "/api/v1/orders", "/api/v1/orders?instrument=0"), "").await;
    assert_eq!(status, 200, "{body}");
    // An engine refusal: more than the account can pay.
    let too_big = r#"{"order":{"client_order_id":9,"instrument":0,"side":"buy","price_minor_per_gpu_hour":900000000,"quantity":64}}"#;
    let (status, _, body) = api.write(&renter_key, "bid-3", orders, too_big).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["rejected"]["code"].as_str().is_some(), "{body}");

    // The lease: a workload, then its end; then funds out.
    let lease_path = format!("/api/v1/leases/{lease}/workload");
    let workload = r#"{"image":"docker.io/library/busybox:1.36"}"#;
    let (status, _, body) = api.write(&renter_key, "workload-1", ("PUT", "/api/v1/leases/{lease}/workload", &lease_path), workload).await;
    assert_eq!(status, 200, "{body}");
    let end_path = format!("/api/v1/leases/{lease}/end");
    let (status, _, body) = api.write(&renter_key, "end-1", ("POST", "/api/v1/leases/{lease}/end", &end_path), "").await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = api.write(&renter_key, "end-2", ("POST", "/api/v1/leases/{lease}/end", "/api/v1/leases/999/end"), "").await;
    assert!(status == 422 || status == 404, "an unknown lease: {status} {body}");
    let withdraw = ("POST", "/api/v1/account/withdraw", "/api/v1/account/withdraw");
    let (status, _, body) = api.write(&renter_key, "withdraw-1", withdraw, r#"{"amount_minor":1000}"#).await;
    assert_eq!(status, 200, "{body}");
    let payout = ("POST", "/api/v1/account/payout", "/api/v1/account/payout");
    let (status, _, body) = api.write(&key(2), "payout-1", payout, r#"{"amount_minor":1}"#).await;
    assert!(status == 200 || status == 422, "{status} {body}");

    // A service: created (its replica bids: no host here delivers
    // workloads), read, scaled, updated, deleted.
    let spec = r#"{"name":"web","instrument":0,"gpus":1,"limit_minor_per_gpu_hour":2000000,"budget_minor_per_hour":4000000,"replicas":1,"min_replicas":0,"max_replicas":2,"image":"localhost/gpux-test:latest","command":["python3","-m","http.server","8000"],"port":8000,"readiness_path":"/","regions":[],"min_supplier_score_bps":0,"scaling":null,"key_hashes":[]}"#;
    let (status, _, created) = api.write(&renter_key, "service-1", ("POST", "/api/v1/services", "/api/v1/services"), spec).await;
    assert_eq!((status, created["service"]["state"].as_str()), (200, Some("running")), "{created}");
    let service = created["service"]["service"].as_u64().expect("the service id");
    let path = format!("/api/v1/account/services/{service}");
    let (status, read) = api.json("/api/v1/account/services/{service}", &path, Some(&renter_key)).await;
    assert_eq!((status, read["service"]["spec"]["name"].as_str()), (200, Some("web")), "{read}");
    let scale = format!("/api/v1/services/{service}/scale");
    let (status, _, body) =
        api.write(&renter_key, "service-2", ("POST", "/api/v1/services/{service}/scale", &scale), r#"{"replicas":2}"#).await;
    assert_eq!((status, body["service"]["replicas"].as_array().map(Vec::len)), (200, Some(2)), "{body}");
    let (status, _, body) =
        api.write(&renter_key, "service-3", ("POST", "/api/v1/services/{service}/scale", &scale), r#"{"replicas":9}"#).await;
    assert_eq!((status, code(&body)), (400, "service_scale_invalid"), "{body}");
    let run = format!("/api/v1/services/{service}/run");
    let new_run = r#"{"image":"localhost/gpux-test:v2","command":[],"port":8000,"readiness_path":"/"}"#;
    let (status, _, body) = api.write(&renter_key, "service-4", ("PUT", "/api/v1/services/{service}/run", &run), new_run).await;
    assert_eq!((status, body["service"]["spec"]["image"].as_str()), (200, Some("localhost/gpux-test:v2")), "{body}");
    let delete = format!("/api/v1/services/{service}");
    let (status, _, body) = api.write(&renter_key, "service-5", ("DELETE", "/api/v1/services/{service}", &delete), "").await;
    assert_eq!((status, body["service"]["state"].as_str()), (200, Some("deleted")), "{body}");
    // With a floor beside the spec's fields: one replica on the spot book,
    // the service on the preemptible one; a floor on a preemptible book is refused.
    let preemptible = spec.replace(r#""instrument":0"#, r#""instrument":1"#).replace(r#""min_replicas":0"#, r#""min_replicas":1"#);
    let with_floor = |book: u32| {
        preemptible.replacen('{', &format!(r#"{{"floor":{{"instrument":{book},"replicas":1,"limit_minor_per_gpu_hour":2000000}},"#), 1)
    };
    let (status, _, body) = api.write(&renter_key, "service-6", ("POST", "/api/v1/services", "/api/v1/services"), &with_floor(1)).await;
    assert_eq!((status, code(&body)), (400, "service_invalid"), "{body}");
    let (status, _, body) = api.write(&renter_key, "service-7", ("POST", "/api/v1/services", "/api/v1/services"), &with_floor(0)).await;
    assert_eq!((status, body["service"]["floor"]["replicas"].as_u64()), (200, Some(1)), "{body}");

    // A volume: created, refused twice under its name, listed, deleted.
    let volumes = ("POST", "/api/v1/volumes", "/api/v1/volumes");
    let (status, _, body) = api.write(&renter_key, "volume-1", volumes, r#"{"name":"data","size_gib":5}"#).await;
    assert_eq!((status, body["volume"]["name"].as_str(), body["volume"]["size_gib"].as_u64()), (200, Some("data"), Some(5)), "{body}");
    let (status, _, body) = api.write(&renter_key, "volume-2", volumes, r#"{"name":"data","size_gib":1}"#).await;
    assert_eq!((status, code(&body)), (400, "volume_exists"), "{body}");
    let (_, listed) = api.json("/api/v1/account/volumes", "/api/v1/account/volumes", Some(&renter_key)).await;
    assert_eq!(listed["volumes"][0]["name"].as_str(), Some("data"), "{listed}");
    let delete = ("DELETE", "/api/v1/volumes/{name}", "/api/v1/volumes/data");
    let (status, _, body) = api.write(&renter_key, "volume-3", delete, "").await;
    assert_eq!((status, body["volume"]["state"].as_str()), (200, Some("deleted")), "{body}");
    let (status, _, body) = api.write(&renter_key, "volume-4", ("DELETE", "/api/v1/volumes/{name}", "/api/v1/volumes/nothing"), "").await;
    assert_eq!((status, code(&body)), (404, "unknown_volume"), "{body}");

    // docs/rest.md's curl and OpenSSL recipe writes too: a bid placed, then cancelled.
    let resting_again = resting.replace("\"client_order_id\":8", "\"client_order_id\":11");
    let placed = shell_recipe(&exchange.console_addr, &renter_key, &["/api/v1/orders", "POST", &resting_again]);
    let placed: Value = serde_json::from_str(&placed).unwrap_or_else(|e| panic!("{e}: {placed}"));
    let order = placed["order"].as_u64().unwrap_or_else(|| panic!("an order: {placed}"));
    let cancelled = shell_recipe(&exchange.console_addr, &renter_key, &[&format!("/api/v1/orders/{order}"), "DELETE"]);
    let cancelled: Value = serde_json::from_str(&cancelled).unwrap_or_else(|e| panic!("{e}: {cancelled}"));
    let kinds: Vec<String> =
        cancelled["events"].as_array().into_iter().flatten().filter_map(|e| e["kind"].as_object()?.keys().next().cloned()).collect();
    assert_eq!(kinds, ["funds_released", "order_closed"], "{cancelled}");
    assert_eq!(cancelled["events"][1]["kind"]["order_closed"]["reason"].as_str(), Some("cancelled"));

    // Refusals before anything is applied.
    let (status, _, body) = api.call("POST", "/api/v1/orders", "/api/v1/orders", &[], resting).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (400, "wrong_type"), "no Idempotency-Key: {body}");
    assert!(body.contains("Idempotency-Key"), "{body}");
    let unsigned = [("Idempotency-Key", "k-unsigned".to_string())];
    let (status, _, body) = api.call("POST", "/api/v1/orders", "/api/v1/orders", &unsigned, resting).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (401, "not_authenticated"), "{body}");
    let mut swapped = signed_write_headers(&renter_key, "POST", "/api/v1/orders", "k-swap", resting, now_ms());
    swapped.retain(|(name, _)| *name != "Idempotency-Key");
    swapped.push(("Idempotency-Key", "k-swapped".into()));
    let (status, _, body) = api.call("POST", "/api/v1/orders", "/api/v1/orders", &swapped, resting).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (401, "auth_failed"), "the key is signed: {body}");
    let signed_other = signed_write_headers(&renter_key, "POST", "/api/v1/orders", "k-body", resting, now_ms());
    let (status, _, body) = api.call("POST", "/api/v1/orders", "/api/v1/orders", &signed_other, too_big).await;
    assert_eq!((status, code(&serde_json::from_str(&body).expect("JSON"))), (401, "auth_failed"), "the body is signed: {body}");
    let (status, _, body) = api.write(&renter_key, "k-json", orders, "{\"order\":").await;
    assert_eq!((status, code(&body)), (400, "malformed_json"));
    let (status, _, body) = api.write(&renter_key, "k-type", orders, r#"{"order":{"side":"buy"}}"#).await;
    assert_eq!((status, code(&body)), (400, "wrong_type"));
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("missing field")), "{body}");
    let huge = format!(r#"{{"order":{{"client_order_id":10,"pad":"{}"}}}}"#, "x".repeat(gpux_gateway::rest::WRITE_BODY_BYTES_MAX));
    let (status, _, body) = api.write(&renter_key, "k-huge", orders, &huge).await;
    assert_eq!((status, code(&body)), (413, "frame_too_large"));
    let (status, _, body) = api.write(&renter_key, "k-path", ("DELETE", "/api/v1/orders/{order}", "/api/v1/orders/x"), "").await;
    assert_eq!((status, code(&body)), (400, "wrong_type"));
    let (status, body) = http_get(&exchange.console_addr, "/api/v1/orders", &[]).await;
    assert_eq!(
        (status, code(&serde_json::from_str(&body).expect("JSON"))),
        (404, "unknown_message"),
        "orders are listed at /account/orders"
    );

    // Every documented write was asked.
    let writes: BTreeSet<_> = api.asked.iter().filter(|(method, _)| method != "GET").cloned().collect();
    assert_eq!(writes, api.documented(false), "the test asks every write docs/openapi.json documents");
}

/// One raw HTTP/1.1 exchange: the whole response, head and body.
async fn http_raw(addr: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("HTTP port");
    stream.write_all(request.as_bytes()).await.expect("request");
    let mut response = String::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_string(&mut response))
        .await
        .expect("in time")
        .expect("response");
    response
}

/// CORS (docs/rest.md "CORS") is the operator's option: without it no
/// answer names another origin; with `--rest-cors-origin` a page on that
/// origin passes the preflight of a signed GET and reads the answers, a
/// page on any other does not; an origin that is not one stops the
/// exchange before it starts (exit 2, the flag named).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_the_operators_option_for_the_origins_it_names() {
    let get = |origin: &str| format!("GET /api/v1/instruments HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\nConnection: close\r\n\r\n");
    let dir = tempfile::tempdir().expect("temp dir");
    let closed = Exchange::start_with(dir.path(), Some(&key(1)), &["--console-listen", "127.0.0.1:0"]);
    let response = http_raw(&closed.console_addr, &get("https://dash.example")).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 200") && !response.contains("access-control-allow-origin"), "{response}");
    drop(closed);

    let dir = tempfile::tempdir().expect("temp dir");
    let flags = ["--console-listen", "127.0.0.1:0", "--rest-cors-origin", "https://dash.example"];
    let open = Exchange::start_with(dir.path(), Some(&key(1)), &flags);
    let preflight = "OPTIONS /api/v1/account/balance HTTP/1.1\r\nHost: x\r\nOrigin: https://dash.example\r\n\
                     Access-Control-Request-Method: GET\r\n\
                     Access-Control-Request-Headers: x-gpux-key, x-gpux-timestamp, x-gpux-signature\r\nConnection: close\r\n\r\n";
    let response = http_raw(&open.console_addr, preflight).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 200"), "{response}");
    assert!(response.contains("access-control-allow-origin: https://dash.example"), "{response}");
    assert!(response.contains("access-control-allow-headers:") && response.contains("x-gpux-signature"), "{response}");
    assert!(response.contains("access-control-allow-methods: get"), "{response}");
    // A write's preflight: its method and the Idempotency-Key header.
    let preflight = "OPTIONS /api/v1/orders HTTP/1.1\r\nHost: x\r\nOrigin: https://dash.example\r\n\
                     Access-Control-Request-Method: POST\r\n\
                     Access-Control-Request-Headers: x-gpux-signature, idempotency-key, content-type\r\nConnection: close\r\n\r\n";
    let response = http_raw(&open.console_addr, preflight).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 200") && response.contains("access-control-allow-origin: https://dash.example"), "{response}");
    let allowed = response.lines().find(|l| l.starts_with("access-control-allow-methods:")).unwrap_or_default();
    assert!(["post", "put", "patch", "delete"].iter().all(|m| allowed.contains(m)), "{response}");
    assert!(response.contains("idempotency-key"), "{response}");
    let response = http_raw(&open.console_addr, &get("https://dash.example")).await.to_ascii_lowercase();
    assert!(response.starts_with("http/1.1 200") && response.contains("access-control-allow-origin: https://dash.example"), "{response}");
    let response = http_raw(&open.console_addr, &get("https://elsewhere.example")).await.to_ascii_lowercase();
    assert!(!response.contains("access-control-allow-origin"), "another origin is not named: {response}");
    drop(open);

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpux-exchange"))
        .args(["--data-dir"])
        .arg(dir.path().join("never"))
        .args(["--rest-cors-origin", "dash.example/app"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--rest-cors-origin") && stderr.contains("is not an origin"), "{stderr}");
    assert!(!dir.path().join("never").exists(), "nothing was written");
}

/// Runs docs/rest.md's signing script (the bash block after "Without
/// Python") with `key`'s secret in a key file, against `addr`, with `args`
/// (a path, then for a write its method and body): its output.
fn shell_recipe(addr: &str, key: &SigningKey, args: &[&str]) -> String {
    let docs = include_str!("../../docs/rest.md");
    let after = docs.split("**Without Python**").nth(1).expect("the recipe in docs/rest.md");
    let script = after.split("```bash\n").nth(1).and_then(|s| s.split("```").next()).expect("its bash block");
    let dir = tempfile::tempdir().expect("temp dir");
    let (script_path, key_path) = (dir.path().join("gpux-rest.sh"), dir.path().join("renter.key"));
    std::fs::write(&script_path, script).expect("script");
    write_secret(&key_path, hex::encode(key.to_bytes()));
    let output = std::process::Command::new("bash")
        .arg(&script_path)
        .arg(&key_path)
        .arg(format!("http://{addr}"))
        .args(args)
        .output()
        .expect("bash runs (the recipe needs bash, curl and OpenSSL 3)");
    assert!(output.status.success(), "the recipe failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// Issue 61: two accounts with 33 keys each filled the 65,536 kept REST
/// answers in about a minute and every account's writes got 429 for up to
/// an hour. The answers are kept per participant: an aggregator writing
/// through its own and its sub-account's keys keeps its latest
/// `PER_PARTICIPANT_MAX` (its oldest forgotten first), and another
/// account's writes are answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_participants_rest_writes_keep_only_its_share_of_answers_and_a_victim_is_answered() {
    use gpux_gateway::idempotency::{PER_PARTICIPANT_MAX, PER_SIGNER_MAX};
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--console-listen", "127.0.0.1:0"]);
    let (mut aggregator, _) = Client::login(&exchange.addr, &key(7), Role::Aggregator).await;
    let (_victim, _) = Client::login(&exchange.addr, &key(8), Role::Renter).await;
    let id = aggregator.id();
    let ServerMessage::SubAccountOpened { account: sub, .. } = aggregator.request(ClientMessage::OpenSubAccount { id }).await else {
        panic!("a sub-account")
    };
    // Keys of the parent and of its sub-account: one participant.
    let signers: Vec<SigningKey> = (0..5).map(|n| key(40 + n)).collect();
    for (n, signer) in signers.iter().enumerate().skip(1) {
        let id = aggregator.id();
        let account = (n % 2 == 0).then_some(sub);
        let public_key = hex::encode(signer.verifying_key().to_bytes());
        let scopes = Scopes::of(&[Scope::Read, Scope::Trade]);
        let add = ClientMessage::AddKey { id, account, public_key, scopes, expires_at_ms: None, label: "rest".into() };
        assert!(matches!(aggregator.request(add).await, ServerMessage::KeyAdded { .. }));
    }
    let signers: Vec<SigningKey> = std::iter::once(key(7)).chain(signers.into_iter().skip(1)).collect();
    let addr = exchange.console_addr.clone();
    // Cancels of an order that does not exist: refused by the engine, and
    // their answers kept like any write's.
    let cancel = |addr: String, signer: SigningKey, idempotency_key: String| async move {
        let path = "/api/v1/orders/999999";
        let headers = signed_write_headers(&signer, "DELETE", path, &idempotency_key, "", now_ms());
        http_request(&addr, "DELETE", path, &headers, "").await
    };
    let per_signer = (PER_PARTICIPANT_MAX + 400) / signers.len();
    assert!(per_signer <= PER_SIGNER_MAX);
    let mut tasks = tokio::task::JoinSet::new();
    for (n, signer) in signers.iter().enumerate() {
        let (addr, signer) = (addr.clone(), signer.clone());
        tasks.spawn(async move {
            for i in 0..per_signer {
                let (status, _, body) = cancel(addr.clone(), signer.clone(), format!("flood-{n}-{i}")).await;
                assert_eq!(status, 422, "write {i} of key {n}: {body}");
            }
        });
    }
    // Meanwhile, and after, the victim's writes are answered.
    let victim = key(8);
    for i in 0..20 {
        let (status, _, body) = cancel(addr.clone(), victim.clone(), format!("victim-{i}")).await;
        assert_eq!(status, 422, "the victim's write {i}: {body}");
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a flood task");
    }
    let (status, head, body) = cancel(addr.clone(), victim.clone(), "victim-0".into()).await;
    assert_eq!(status, 422, "{body}");
    assert!(head.to_ascii_lowercase().contains("idempotent-replayed: true"), "the victim's answer is kept: {head}");
    // The aggregator's oldest answers went for its newest.
    let (_, head, _) = cancel(addr.clone(), signers[0].clone(), "flood-0-0".into()).await;
    assert!(!head.to_ascii_lowercase().contains("idempotent-replayed: true"), "its oldest was forgotten: {head}");
    let last = format!("flood-0-{}", per_signer - 1);
    let (_, head, _) = cancel(addr.clone(), signers[0].clone(), last).await;
    assert!(head.to_ascii_lowercase().contains("idempotent-replayed: true"), "its newest is kept: {head}");
}
