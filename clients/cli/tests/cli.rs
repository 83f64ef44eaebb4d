//! The `gpux` binary against a real exchange (in-process, real socket, real
//! redb files): a renter and a GPU owner go through the whole tour with the
//! CLI alone (keys, login, funding, an offer, a bid that fills, the lease,
//! the statement), and every kind of failure exits with its documented code
//! and a message saying what to do.

use std::path::{Path, PathBuf};
use std::process::Output;

use ed25519_dalek::SigningKey;
use gpux_engine::{GpuSpec, Role};
use gpux_protocol::{ClientMessage, ServerMessage};

/// The exchange in this process (the workspace's one harness,
/// `gpux-test-exchange`).
struct Exchange {
    url: String,
    running: gpux_test_exchange::InProcess,
}

impl Exchange {
    /// Stops it and waits until its files are closed.
    fn stop(mut self) {
        self.running.stop().expect("a clean stop");
    }
}

fn start_exchange(data_dir: &Path, operator_public_key: [u8; 32]) -> Exchange {
    start_exchange_at(data_dir, operator_public_key, 0)
}

/// With the exchange's clock `clock_offset_ms` ahead of the wall clock.
fn start_exchange_at(data_dir: &Path, operator_public_key: [u8; 32], clock_offset_ms: i64) -> Exchange {
    start_exchange_with(data_dir, operator_public_key, clock_offset_ms, Default::default())
}

fn start_exchange_with(
    data_dir: &Path,
    operator_public_key: [u8; 32],
    clock_offset_ms: i64,
    accounts: gpux_exchange::sequencer::AccountOpening,
) -> Exchange {
    let billing = gpux_exchange::sequencer::BillingPolicy {
        fee_bps: 250,
        grace_ms: 600_000,
        late_window_ms: gpux_exchange::LATE_REPORT_WINDOW_MS_DEFAULT,
        storage_minor_per_gib_month: gpux_exchange::STORAGE_PRICE_DEFAULT,
    };
    start_exchange_billing(data_dir, operator_public_key, clock_offset_ms, accounts, billing)
}

fn start_exchange_billing(
    data_dir: &Path,
    operator_public_key: [u8; 32],
    clock_offset_ms: i64,
    accounts: gpux_exchange::sequencer::AccountOpening,
    billing: gpux_exchange::sequencer::BillingPolicy,
) -> Exchange {
    let mut config = gpux_test_exchange::config(data_dir, operator_public_key);
    config.clock_offset_ms = clock_offset_ms;
    config.accounts = accounts;
    config.billing = billing;
    let running = gpux_test_exchange::InProcess::start(config);
    Exchange { url: running.url.clone(), running }
}

fn gpux(url: &str, key: &Path, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_gpux"))
        .args(["--url", url, "--key"])
        .arg(key)
        .args(args)
        .output()
        .expect("the gpux binary runs")
}

fn ok(output: Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(output.status.success(), "gpux failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    stdout
}

fn key_of(path: &Path) -> SigningKey {
    let text = std::fs::read_to_string(path).expect("key file");
    SigningKey::from_bytes(&hex::decode(text.trim()).expect("hex").try_into().expect("32 bytes"))
}

/// Registers one H100 for the supplier, as its agent would.
fn register_gpu(url: &str, supplier: &SigningKey) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let mut connection = gpux_client::Connection::open(url, supplier, Some(Role::Supplier)).await.expect("supplier login");
        let id = connection.new_id();
        let message = ClientMessage::RegisterGpu {
            id,
            host: "cli-host".into(),
            gpu_uuid: "GPU-cli-0".into(),
            spec: GpuSpec::h100_sxm(),
            region: None,
            zone: None,
            fabric: None,
        };
        assert!(matches!(connection.request(message).await.expect("answer"), ServerMessage::Ack { .. }));
    });
}

#[test]
fn a_renter_and_a_gpu_owner_trade_with_the_cli_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter", "supplier"] {
        assert!(ok(gpux(offline, &key(name), &["keys", "create"])).contains("public key"));
    }
    let again = gpux(offline, &key("renter"), &["keys", "create"]);
    assert_eq!(again.status.code(), Some(2), "a key is never overwritten");
    let operator_public = ok(gpux(offline, &key("operator"), &["keys", "show"]));
    let operator_public: [u8; 32] = hex::decode(operator_public.trim()).expect("hex").try_into().expect("32 bytes");
    let exchange = start_exchange(&dir.path().join("data"), operator_public);
    let url = exchange.url.as_str();

    let login = ok(gpux(url, &key("renter"), &["login", "--role", "renter"]));
    let renter_account: u32 = login.split_whitespace().nth(4).and_then(|a| a.parse().ok()).expect("an account id");
    ok(gpux(url, &key("supplier"), &["login", "--role", "supplier"]));
    assert!(ok(gpux(url, &key("operator"), &["login"])).contains("(operator)"), "the role as the exchange has it");
    // The operator's key cannot become a renter: said, not reported as a login.
    let as_renter = gpux(url, &key("operator"), &["login", "--role", "renter"]);
    assert_eq!(as_renter.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&as_renter.stderr).contains("as operator, not renter"), "{as_renter:?}");
    assert_eq!(ok(gpux(url, &key("renter"), &["--json", "login"])).trim(), format!("{{\"account\":{renter_account},\"role\":\"renter\"}}"));
    assert!(ok(gpux(url, &key("renter"), &["balance"])).contains("available $0.00"));
    ok(gpux(url, &key("operator"), &["deposit", &renter_account.to_string(), "100"]));
    assert!(ok(gpux(url, &key("renter"), &["balance"])).contains("available $100.00"));

    register_gpu(url, &key_of(&key("supplier")));
    assert!(ok(gpux(url, &key("supplier"), &["gpus"])).contains("NVIDIA H100 80GB HBM3"));
    assert!(ok(gpux(url, &key("supplier"), &["offer", "H100-SXM-80G/SPOT", "--price", "2", "--host", "0", "--gpus", "0"]))
        .contains("offer placed"));
    assert!(ok(gpux(url, &key("supplier"), &["offers"])).contains("$2.00"));
    let book = ok(gpux(url, &key("renter"), &["book", "H100-SXM-80G/SPOT", "--once"]));
    assert!(book.contains("$2.00") && book.contains("ask"), "{book}");
    let asks = ok(gpux(url, &key("renter"), &["asks", "H100-SXM-80G/SPOT"]));
    assert!(asks.contains("$2.00/GPU-h x 1") && asks.contains("unrated") && asks.contains("host 0"), "{asks}");
    assert!(asks.contains("in no region"), "{asks}");
    assert!(
        asks.contains("verified = the GPU's last challenges in H100-SXM-80G passed: a 256 x 256 matrix product at >= 10 MFLOP/s")
            && asks.contains("not which accelerator it is"),
        "what verified means, with the demo listing's honest caveat: {asks}"
    );
    // Every book at once: the ask found by memory and price, sorted per GiB.
    let found = ok(gpux(url, &key("renter"), &["search", "--min-memory-gb", "80", "--max-price", "2.50", "--sort", "gb"]));
    assert!(
        found.contains("H100-SXM-80G/SPOT  $2.00/GPU-h x 1  NVIDIA H100 80GB HBM3 85.5 GB, $0.023386/GB-h")
            && found.contains("0 of 1 verified"),
        "{found}"
    );
    assert!(ok(gpux(url, &key("renter"), &["search", "--max-price", "1.50"])).contains("no offers fit"));
    // The instrument list quotes each everyday book: no bid, the ask at $2.00, no trade yet (issue 64).
    let instruments = ok(gpux(url, &key("renter"), &["instruments"]));
    let spot = instruments.lines().find(|l| l.contains("H100-SXM-80G/SPOT ")).expect("the spot book listed");
    assert!(instruments.lines().next().is_some_and(|h| h.contains("best bid") && h.contains("best ask") && h.contains("last")));
    let columns: Vec<&str> = spot.split_whitespace().collect();
    assert_eq!(columns[4..7], ["-", "$2.00", "-"], "{spot}");
    assert!(ok(gpux(url, &key("renter"), &["search", "--contract", "preemptible"])).contains("no offers fit"));
    let json = ok(gpux(url, &key("renter"), &["--json", "search", "--verified"]));
    assert!(json.contains("\"offers_found\"") && json.contains("\"offers\":[]"), "unverified GPUs left out: {json}");
    let listing = ok(gpux(url, &key("renter"), &["listing"]));
    assert!(listing.contains("currency USD (6 decimals") && listing.contains("cn-east") && listing.contains("H100-SXM-80G"), "{listing}");
    // The only ask is on a host in no region: a bid for two regions passes it by.
    let elsewhere =
        gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--tif", "ioc", "--region", "cn-east,cn-west"]);
    assert_eq!(elsewhere.status.code(), Some(1), "{elsewhere:?}");
    assert!(String::from_utf8_lossy(&elsewhere.stderr).contains("or better in cn-east, cn-west could serve it"), "{elsewhere:?}");
    let json_book = ok(gpux(url, &key("renter"), &["--json", "book", "0", "--once"]));
    assert!(json_book.lines().any(|l| l.starts_with("{\"book_snapshot\"")), "{json_book}");

    // Nothing to sell at $1: an IOC bid that fills nothing says so and fails.
    let unfilled = gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "1", "--tif", "ioc", "--stp", "cancel-both"]);
    assert_eq!(unfilled.status.code(), Some(1), "{unfilled:?}");
    assert!(String::from_utf8_lossy(&unfilled.stderr).contains("nothing filled (killed): no ask at $1.00/GPU-h or better"), "{unfilled:?}");
    // --json: the exchange's lines, then the outcome; a killed IOC exits 1 as without --json.
    let killed = gpux(url, &key("renter"), &["--json", "buy", "H100-SXM-80G/SPOT", "1", "--price", "1", "--tif", "ioc"]);
    let stdout = String::from_utf8_lossy(&killed.stdout).into_owned();
    assert!(stdout.lines().any(|l| l.starts_with(r#"{"outcome""#) && l.contains(r#""state":"closed_unfilled""#)), "{stdout}");
    // Then, last, the failure as every --json failure is told (issue 64).
    assert!(stdout.lines().last().is_some_and(|l| l.starts_with(r#"{"failed":{"exit_code":1,"kind":"refused""#)), "{stdout}");
    assert!(stdout.contains(r#""order_closed""#), "the close event as the exchange sent it: {stdout}");
    assert_eq!(killed.status.code(), Some(1), "nothing filled: {stdout}");
    // Every write's --json ends with its outcome: a resting bid, then its cancel.
    let resting = ok(gpux(url, &key("renter"), &["--json", "buy", "H100-SXM-80G/SPOT", "1", "--price", "1"]));
    let outcome: serde_json::Value = serde_json::from_str(resting.lines().last().expect("lines")).expect("JSON");
    assert_eq!(outcome["outcome"]["state"], "resting", "{resting}");
    let order = outcome["outcome"]["order"].as_u64().expect("the order id").to_string();
    let cancelled = ok(gpux(url, &key("renter"), &["--json", "cancel", &order]));
    let last: serde_json::Value = serde_json::from_str(cancelled.lines().last().expect("lines")).expect("JSON");
    assert_eq!(last["outcome"]["done"], "cancel", "{cancelled}");
    assert!(last["outcome"]["events"].as_array().is_some_and(|e| e.iter().any(|k| k == "order_closed")), "{cancelled}");
    assert!(cancelled.lines().next().is_some_and(|l| l.starts_with(r#"{"ack""#)), "the ack first, as sent: {cancelled}");
    let bought = ok(gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--hours", "2"]));
    assert!(bought.contains("accepted") && bought.contains("filled 1 GPU(s) of H100-SXM-80G/SPOT") && bought.contains("lease"), "{bought}");
    assert!(bought.contains("lease 0 (spot): 1 GPU(s) from 20") && bought.contains(" UTC to 20"), "times for people: {bought}");
    // History: the trade, its candle and each side's fill (docs/protocol.md "History").
    let trades = ok(gpux(url, &key("renter"), &["trades", "H100-SXM-80G/SPOT"]));
    assert!(trades.contains("1 GPU(s) at $2.00/GPU-h (buyer took)") && trades.contains(" UTC"), "{trades}");
    let candles = ok(gpux(url, &key("renter"), &["candles", "H100-SXM-80G/SPOT", "--interval", "1m"]));
    assert!(candles.lines().nth(1).is_some_and(|l| l.matches("$2.00").count() == 4), "{candles}");
    let bad_interval = gpux(url, &key("renter"), &["candles", "H100-SXM-80G/SPOT", "--interval", "5m"]);
    assert_eq!(bad_interval.status.code(), Some(2), "{bad_interval:?}");
    let bought_fills = ok(gpux(url, &key("renter"), &["fills", "--past"]));
    assert!(
        bought_fills.contains("bought 1 GPU(s) of H100-SXM-80G/SPOT at $2.00/GPU-h") && bought_fills.contains("(taker)"),
        "{bought_fills}"
    );
    let sold_fills = ok(gpux(url, &key("supplier"), &["fills", "--past"]));
    assert!(sold_fills.contains("sold 1 GPU(s)") && sold_fills.contains("(maker)"), "{sold_fills}");
    let json_trades = ok(gpux(url, &key("renter"), &["--json", "trades", "0"]));
    assert!(json_trades.trim().starts_with("{\"trades\":"), "{json_trades}");
    let piped = ok(gpux(url, &key("renter"), &["book", "H100-SXM-80G/SPOT", "--seconds", "1"]));
    assert!(piped.contains("bid GPUs") && !piped.contains('\x1b'), "snapshots without terminal escapes into a pipe: {piped:?}");
    assert_eq!(piped.matches("bid GPUs").count(), 1, "a pipe gets the view when it changes, not every 250 ms: {piped}");
    let once = ok(gpux(url, &key("renter"), &["book", "H100-SXM-80G/SPOT", "--once"]));
    assert!(once.contains("1 GPU(s) at $2.00  (buyer took)"), "--once shows the last trades: {once}");
    let leases = ok(gpux(url, &key("renter"), &["leases"]));
    let lease_id = leases.lines().nth(1).and_then(|l| l.split_whitespace().next()).expect("a lease line").to_string();
    assert!(leases.contains("spot") && leases.contains("$2.00"), "{leases}");
    // The rest of the 2-hour lease goes on sale on the resale book; ending the lease takes the offer with it.
    let telemetry = ok(gpux(url, &key("renter"), &["lease", "telemetry", &lease_id]));
    assert!(telemetry.contains("no usage report yet"), "{telemetry}");
    let foreign = gpux(url, &key("operator"), &["lease", "telemetry", &lease_id]);
    assert!(String::from_utf8_lossy(&foreign.stderr).contains("unknown_lease"), "{foreign:?}");
    let offered = ok(gpux(url, &key("renter"), &["lease", "resell", &lease_id, "--price", "3"]));
    assert!(offered.contains(&format!("lease {lease_id} offered at $3.00/GPU-h: order")), "{offered}");
    let again = gpux(url, &key("renter"), &["lease", "resell", &lease_id, "--price", "3"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("lease_already_offered"), "{again:?}");
    assert!(ok(gpux(url, &key("renter"), &["asks", "H100-SXM-80G/RESALE"])).contains("$3.00/GPU-h x 1"), "the offer on the resale book");
    assert!(ok(gpux(url, &key("renter"), &["end-lease", &lease_id])).contains("lease ended"));
    let statement = ok(gpux(url, &key("renter"), &["statement"]));
    assert!(
        statement.contains("external") && statement.contains("  deposit") && statement.contains(&format!("available:{renter_account}")),
        "{statement}"
    );
    // Times in the machine's zone (a POSIX TZ: no tz database needed), its offset named; --utc for UTC.
    let in_zone = |zone: &str, extra: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpux"))
            .env("TZ", zone)
            .args(["--url", url, "--key"])
            .arg(key("renter"))
            .args(extra)
            .arg("statement")
            .output()
            .expect("gpux runs");
        ok(output)
    };
    assert!(in_zone("JST-9", &[]).contains(" +09:00 "), "Tokyo's offset");
    let utc = in_zone("JST-9", &["--utc"]);
    assert!(utc.contains(" UTC ") && !utc.contains("+09:00"), "{utc}");
    let json = ok(gpux(url, &key("renter"), &["--json", "balance"]));
    assert!(json.trim().starts_with("{\"balance\":"), "{json}");
    // The order types beyond plain ones (docs/market-rules.md "Order types and options").
    let armed = ok(gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--stop", "2.40"]));
    assert!(armed.contains("armed: off the book until a trade prints at $2.40/GPU-h or above"), "{armed}");
    let reached = gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--stop", "1.50"]);
    assert_eq!(reached.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&reached.stderr).contains("stop_would_trigger"), "{reached:?}");
    let small = gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "3", "--price", "2.50", "--budget", "1", "--tif", "ioc"]);
    assert_eq!(small.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&small.stderr).contains("budget_too_small"), "{small:?}");
    let bad_budget = gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "3", "--price", "2.50", "--budget", "ten"]);
    assert_eq!(bad_budget.status.code(), Some(2), "{bad_budget:?}");
    let gang = ok(gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "2", "--price", "2.50", "--all-or-none"]));
    assert!(gang.contains("resting"), "all-or-none waits whole on the book: {gang}");
    // Spend control: a $1 cap on what is held refuses a bid that holds more.
    assert!(ok(gpux(url, &key("renter"), &["spend"])).contains("no spend limits"));
    let set = ok(gpux(url, &key("renter"), &["spend", "--max-held", "1", "--daily", "50"]));
    assert!(set.contains("spend limits set") && set.contains("limits: daily $50.00, total none, held $1.00"), "{set}");
    let capped = gpux(url, &key("renter"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "1.50"]);
    assert_eq!(capped.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&capped.stderr).contains("spend_limit"), "{capped:?}");
    assert!(ok(gpux(url, &key("renter"), &["spend", "--clear"])).contains("no spend limits"));
    let calendar = ok(gpux(url, &key("renter"), &["instruments", "--calendar"]));
    assert!(calendar.lines().skip(1).all(|l| l.contains(" to ")), "only reserved windows: {calendar}");
}

/// An aggregator keeps a customer in a sub-account with the CLI alone:
/// opens it, funds it, limits it, hands the customer a scoped key, sees
/// its activity, revokes the key, and takes the money back.
#[test]
fn an_aggregator_runs_a_customer_sub_account_with_the_cli() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "aggregator", "customer"] {
        ok(gpux(offline, &key(name), &["keys", "create"]));
    }
    let operator_public = ok(gpux(offline, &key("operator"), &["keys", "show"]));
    let operator_public: [u8; 32] = hex::decode(operator_public.trim()).expect("hex").try_into().expect("32 bytes");
    let exchange = start_exchange(&dir.path().join("data"), operator_public);
    let url = exchange.url.as_str();
    let login = ok(gpux(url, &key("aggregator"), &["login", "--role", "aggregator"]));
    let parent: u32 = login.split_whitespace().nth(4).and_then(|a| a.parse().ok()).expect("an account id");
    ok(gpux(url, &key("operator"), &["login"]));
    ok(gpux(url, &key("operator"), &["deposit", &parent.to_string(), "500"]));

    let created = ok(gpux(url, &key("aggregator"), &["sub-account", "create"]));
    let sub: u32 = created.split_whitespace().nth(2).and_then(|a| a.trim_end_matches(':').parse().ok()).expect("a sub-account id");
    assert!(ok(gpux(url, &key("aggregator"), &["sub-account", "fund", &sub.to_string(), "120"])).contains("moved $120.00 to sub-account"));
    ok(gpux(url, &key("aggregator"), &["sub-account", "limits", &sub.to_string(), "--max-open-orders", "2", "--max-held", "10"]));
    let customer_public = ok(gpux(offline, &key("customer"), &["keys", "show"])).trim().to_string();
    let granted = ok(gpux(
        url,
        &key("aggregator"),
        &["keys", "grant", &customer_public, "--sub-account", &sub.to_string(), "--scopes", "read,trade", "--label", "customer 1"],
    ));
    assert!(granted.contains(&format!("acts as account {sub} with scopes read,trade")), "{granted}");
    let listed = ok(gpux(url, &key("aggregator"), &["keys", "list", "--sub-account", &sub.to_string()]));
    assert!(listed.contains(&customer_public) && listed.contains("\"customer 1\": read,trade"), "{listed}");

    // The customer logs in to the sub-account with its own key.
    assert!(ok(gpux(url, &key("customer"), &["login"])).contains(&format!("account {sub}")));
    assert!(ok(gpux(url, &key("customer"), &["balance"])).contains("available $120.00"));
    ok(gpux(url, &key("customer"), &["buy", "H100-SXM-80G/SPOT", "2", "--price", "2.50", "--hours", "2"]));
    let over = gpux(url, &key("customer"), &["buy", "H100-SXM-80G/SPOT", "1", "--price", "2.50", "--hours", "2"]);
    assert_eq!(over.status.code(), Some(1), "$10 held + $5 is over the $10 ceiling");
    assert!(String::from_utf8_lossy(&over.stderr).contains("sub_account_limit"), "{over:?}");
    let withdraw = gpux(url, &key("customer"), &["withdraw", "1"]);
    assert_eq!(withdraw.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&withdraw.stderr).contains("scope_denied"), "a read,trade key withdraws nothing: {withdraw:?}");
    let list = ok(gpux(url, &key("aggregator"), &["sub-account", "list"]));
    assert!(list.contains(&format!("sub-account {sub}: available $110.00, held $10.00")) && list.contains("1 open orders"), "{list}");
    assert!(list.contains("limits: open orders 2, one bid none, held in all $10.00"), "{list}");

    assert!(ok(gpux(url, &key("aggregator"), &["keys", "revoke", &customer_public])).contains("sessions are closed"));
    let refused = gpux(url, &key("customer"), &["balance"]);
    assert_eq!(refused.status.code(), Some(1));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("key_revoked") && said.contains("ask the account's owner for a new key"), "{refused:?}");
    ok(gpux(url, &key("aggregator"), &["cancel-all"]));
    assert!(ok(gpux(url, &key("aggregator"), &["sub-account", "defund", &sub.to_string(), "110"])).contains("moved $110.00 back"));
    let statement = ok(gpux(url, &key("aggregator"), &["statement"]));
    assert!(statement.contains(&format!("available:{sub}")), "the moves are on the parent's statement: {statement}");
}

/// Last month's invoice from the CLI: fetched, verified with the
/// exchange's key, printed, written as HTML and (with a Chromium on this
/// machine) printed to PDF.
#[test]
fn gpux_invoice_prints_verifies_and_renders_last_months_invoice() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter"] {
        ok(gpux(offline, &key(name), &["keys", "create"]));
    }
    let operator_public = ok(gpux(offline, &key("operator"), &["keys", "show"]));
    let operator_public: [u8; 32] = hex::decode(operator_public.trim()).expect("hex").try_into().expect("32 bytes");
    let data = dir.path().join("data");
    let exchange = start_exchange(&data, operator_public);
    let login = ok(gpux(&exchange.url, &key("renter"), &["login", "--role", "renter"]));
    let renter: u32 = login.split_whitespace().nth(4).and_then(|a| a.parse().ok()).expect("an account id");
    ok(gpux(&exchange.url, &key("operator"), &["deposit", &renter.to_string(), "100"]));
    ok(gpux(&exchange.url, &key("renter"), &["withdraw", "10"]));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis() as u64;
    let month = gpux_engine::time::format_month(now);
    let open = gpux(&exchange.url, &key("renter"), &["invoice", "--period", &month]);
    assert_eq!(open.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&open.stderr).contains("period_invalid"), "this month has not ended: {open:?}");
    exchange.stop();

    // The next month: an hour after this one ended.
    let (_, end) = gpux_engine::time::month_bounds_ms(&month).expect("a month");
    let exchange = start_exchange_at(&data, operator_public, (end + 3_600_000 - now) as i64);
    let html = dir.path().join("invoice.html");
    let printed = ok(gpux(&exchange.url, &key("renter"), &["invoice", "--period", &month, "--html", html.to_str().expect("utf-8")]));
    let number = format!("GPUX-{renter}-{}", month.replace('-', ""));
    assert!(printed.contains(&format!("invoice {number} for account {renter}")), "{printed}");
    assert!(printed.contains("amount due $0.00") && printed.contains("deposits $100.00, withdrawals $10.00"), "{printed}");
    assert!(printed.contains("signature verified with the exchange's key"), "{printed}");
    let page = std::fs::read_to_string(&html).expect("the HTML page");
    assert!(page.contains(&format!("<h1>Invoice {number}</h1>")) && page.contains("signature "), "{page}");
    let chromium = ["chromium", "chromium-browser"].iter().any(|name| {
        std::process::Command::new("sh").arg("-c").arg(format!("command -v {name}")).output().is_ok_and(|o| o.status.success())
    });
    if chromium || std::env::var_os("GPUX_REQUIRE_BROWSER").is_some() {
        let pdf = dir.path().join("invoice.pdf");
        ok(gpux(&exchange.url, &key("renter"), &["invoice", "--period", &month, "--pdf", pdf.to_str().expect("utf-8")]));
        let bytes = std::fs::read(&pdf).expect("the PDF");
        assert!(bytes.starts_with(b"%PDF-") && bytes.len() > 1_000, "a PDF document ({} bytes)", bytes.len());
    }
    exchange.stop();
}

#[test]
fn failures_exit_with_their_code_and_say_what_to_do() {
    let dir = tempfile::tempdir().expect("temp dir");
    let renter = dir.path().join("renter.key");
    let missing = gpux("ws://127.0.0.1:1", &renter, &["balance"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("gpux keys create"));

    ok(gpux("ws://127.0.0.1:1", &renter, &["keys", "create"]));
    let unreachable = gpux("ws://127.0.0.1:1", &renter, &["balance"]);
    assert_eq!(unreachable.status.code(), Some(3));
    let stderr = String::from_utf8_lossy(&unreachable.stderr).into_owned();
    assert!(stderr.contains("is it running?") && stderr.contains("gpux-exchange") && !stderr.contains("cargo"), "{stderr}");
    // An http:// address is a usage mistake, said as one.
    let http = gpux("http://127.0.0.1:1", &renter, &["balance"]);
    assert_eq!(http.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&http.stderr).contains("write ws://HOST:PORT"), "{}", String::from_utf8_lossy(&http.stderr));

    let exchange = start_exchange(&dir.path().join("data"), [0; 32]);
    let url = exchange.url.as_str();
    let no_account = gpux(url, &renter, &["balance"]);
    assert_eq!(no_account.status.code(), Some(1), "a key without an account is refused");
    assert!(String::from_utf8_lossy(&no_account.stderr).contains("gpux login --role renter"));

    ok(gpux(url, &renter, &["login", "--role", "renter"]));
    // A cluster's addresses, comma-separated: one that refuses is skipped.
    let several = format!("ws://127.0.0.1:1,{url}");
    assert!(ok(gpux(&several, &renter, &["balance"])).contains("available"), "the second address answers");
    let unknown = gpux(url, &renter, &["buy", "NOPE/SPOT", "1", "--price", "1"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("gpux instruments"));
    let too_precise = gpux(url, &renter, &["buy", "0", "1", "--price", "1.0000001"]);
    assert_eq!(too_precise.status.code(), Some(2));
    // A decimal comma was once read as a thousands separator ($50): refused,
    // with both readings, and nothing sent.
    let comma = gpux(url, &renter, &["buy", "0", "1", "--price", "0,50"]);
    assert_eq!(comma.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&comma.stderr).contains("write `0.50` or `050`"), "{}", String::from_utf8_lossy(&comma.stderr));
    let orders = ok(gpux(url, &renter, &["orders"]));
    assert!(!orders.contains("0.50") && !orders.contains("50.00"), "nothing was placed: {orders}");
    let off_tick = gpux(url, &renter, &["buy", "0", "1", "--price", "2.0005"]);
    assert_eq!(off_tick.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&off_tick.stderr).into_owned();
    assert!(stderr.contains("price_off_tick"), "codes as the protocol writes them");
    assert!(stderr.contains("2000500 is not a multiple of the class's tick 1000: 2000000 or 2001000 are"), "the bound named: {stderr}");
    let unfunded = gpux(url, &renter, &["buy", "0", "1", "--price", "2"]);
    assert_eq!(unfunded.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&unfunded.stderr).into_owned();
    assert!(stderr.contains("insufficient_funds") && stderr.contains("it needs 2000000 and the account has 0 available"), "{stderr}");
    // A withdrawal over the available funds says what may leave, not "lower the order".
    let overdrawn = gpux(url, &renter, &["withdraw", "5"]);
    assert_eq!(overdrawn.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&overdrawn.stderr).into_owned();
    assert!(stderr.contains("more than the account's available funds") && stderr.contains("gpux balance"), "{stderr}");
    // sell --help shows no bid-only option, and sell refuses one.
    let sell_help = ok(gpux(url, &renter, &["sell", "--help"]));
    assert!(!sell_help.contains("--budget") && !sell_help.contains("--all-or-none") && sell_help.contains("--stop"), "{sell_help}");
    let bid_only = gpux(url, &renter, &["sell", "0", "1", "--price", "2", "--budget", "5"]);
    assert_eq!(bid_only.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bid_only.stderr).contains("--budget is for bids"), "{bid_only:?}");
    let usage = gpux(url, &renter, &["buy"]);
    assert_eq!(usage.status.code(), Some(2), "clap usage errors exit 2");
    // A missing SSH key file says how to make one or go without (issue 64).
    let no_key = gpux(url, &renter, &["run", "--image", "busybox", "--max-price", "2", "--ssh-key", "/nonexistent/id_ed25519.pub"]);
    assert_eq!(no_key.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&no_key.stderr).into_owned();
    assert!(stderr.contains("ssh-keygen -t ed25519") && stderr.contains("leave --ssh-key out"), "{stderr}");
    // SSH to a lease that is not the account's, or has no status: said, exit 2.
    let no_lease = gpux(url, &renter, &["lease", "ssh", "999", "--print"]);
    assert_ne!(no_lease.status.code(), Some(0), "{no_lease:?}");
    // A fixed length to the minute only (issue 64): said before anything is sent.
    let odd_hours = gpux(url, &renter, &["buy", "0", "1", "--price", "2", "--hours", "1.33"]);
    assert_eq!(odd_hours.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&odd_hours.stderr).contains("to the minute (1, 1.5, 0.25)"), "{odd_hours:?}");
    // With --json every failure is also one JSON line on stdout, last (issue 64).
    for (args, code, kind) in [
        (&["--json", "run", "--image", "busybox", "--max-price", "2"][..], 1, "refused"),
        (&["--json", "buy", "0", "1", "--price", "0,50"][..], 2, "usage"),
    ] {
        let output = gpux(url, &renter, args);
        assert_eq!(output.status.code(), Some(code), "{output:?}");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let last: serde_json::Value = serde_json::from_str(stdout.lines().last().expect("a line")).expect("JSON");
        assert_eq!(last["failed"]["exit_code"], code, "{stdout}");
        assert_eq!(last["failed"]["kind"], kind, "{stdout}");
        assert!(!last["failed"]["message"].as_str().expect("a message").is_empty());
    }
    let unreachable = gpux("ws://127.0.0.1:1", &renter, &["--json", "balance"]);
    assert_eq!(unreachable.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&unreachable.stdout).contains(r#""kind":"unreachable""#), "{unreachable:?}");
}

/// A renter runs `gpux run` with an image, an exposed port, an SSH key and a
/// secret environment variable; the owner's agent (in-process, docker
/// backend on podman, fake GPUs) starts the container; an HTTP request
/// reaches it through the endpoint `gpux run` printed; `gpux lease status`
/// and `logs` show it; `gpux lease stop` ends it. Needs the container engine
/// that scripts/test starts (GPUX_DOCKER_SOCKET).
#[test]
fn gpux_run_brings_a_container_up_and_lease_stop_ends_it() {
    let Some(socket) = container_socket() else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter"] {
        ok(gpux(offline, &key(name), &["keys", "create"]));
    }
    let operator_public: [u8; 32] = key_of(&key("operator")).verifying_key().to_bytes();
    let exchange = start_exchange(&dir.path().join("data"), operator_public);
    let url = exchange.url.clone();
    let login = ok(gpux(&url, &key("renter"), &["login", "--role", "renter"]));
    let renter_account = login.split_whitespace().nth(4).expect("an account id").to_string();
    ok(gpux(&url, &key("operator"), &["deposit", &renter_account, "100"]));

    // The owner's agent, in-process.
    start_docker_agent(&url, dir.path(), &socket, "run-host", "GPU-run-0");

    let ssh_key = dir.path().join("id.pub");
    std::fs::write(&ssh_key, "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIclitestkeynotreal renter@cli\n").expect("ssh key");
    let ssh_key = ssh_key.display().to_string();
    let args = [
        "run",
        "--image",
        "localhost/gpux-test:busybox",
        "--max-price",
        "2.5",
        "-p",
        "8080",
        "-p",
        "22",
        "--ssh-key",
        &ssh_key,
        "-e",
        "CLI_SECRET=cli-secret-value-7",
        "--entrypoint",
        "--wait-s",
        "60",
        "--",
        "/bin/busybox",
        "httpd",
        "-f",
        "-v",
        "-p",
        "8080",
        "-h",
        "/www",
    ];
    // The agent's ask reaches the book within a few seconds.
    let (printed, lease) = run_until_leased(&url, &key("renter"), &args);
    let endpoint = printed.lines().find_map(|l| l.trim().strip_prefix("port 8080 -> ")).expect("the endpoint printed").to_string();
    let (address, port) = endpoint.rsplit_once(':').expect("host:port");
    // `running` means the container started; the server in it may take a
    // moment to listen (and podman's port forwarding to follow).
    use std::io::{Read, Write};
    let port = port.parse::<u16>().expect("port");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let page = loop {
        let fetched = std::net::TcpStream::connect((address, port)).and_then(|mut stream| {
            stream.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
            let mut page = String::new();
            stream.read_to_string(&mut page)?;
            Ok(page)
        });
        match fetched {
            Ok(page) if !page.is_empty() => break page,
            other => {
                assert!(std::time::Instant::now() < deadline, "the endpoint never served the page: {other:?}");
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
    };
    assert!(page.contains("gpux delivery test page"), "{page}");
    // SSH: the published port 22 as an ssh command (issue 64).
    let ssh_endpoint = printed.lines().find_map(|l| l.trim().strip_prefix("port 22 -> ")).expect("port 22 printed").to_string();
    let (ssh_host, ssh_port) = ssh_endpoint.rsplit_once(':').expect("host:port");
    let printed_ssh = ok(gpux(&url, &key("renter"), &["lease", "ssh", &lease, "--print", "--", "nvidia-smi", "-L"]));
    assert_eq!(printed_ssh.trim(), format!("ssh -p {ssh_port} root@{ssh_host} -- nvidia-smi -L"));

    let status = ok(gpux(&url, &key("renter"), &["lease", "status", &lease]));
    assert!(status.contains("running") && status.contains("port 8080"), "{status}");
    let connect = format!("connect: gpux lease ssh {lease}   (ssh -p {ssh_port} root@{ssh_host})");
    assert!(status.contains(&connect), "the connect string: {status}");
    let logs = ok(gpux(&url, &key("renter"), &["lease", "logs", &lease]));
    assert!(logs.contains("response:200"), "{logs}");
    // A command in the workload through its host, no SSH (issue 64): its
    // output, and its exit code passed on.
    let listed = ok(gpux(&url, &key("renter"), &["lease", "exec", &lease, "--", "/bin/busybox", "ls", "/www"]));
    assert!(listed.contains("index.html"), "{listed}");
    let failed = gpux(&url, &key("renter"), &["lease", "exec", &lease, "--", "/bin/sh", "-c", "echo to-stderr >&2; exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "{failed:?}");
    assert!(String::from_utf8_lossy(&failed.stdout).contains("to-stderr"), "{failed:?}");
    let slow = gpux(&url, &key("renter"), &["lease", "exec", &lease, "--timeout-s", "1", "--", "/bin/sh", "-c", "echo started; sleep 5"]);
    assert_eq!(slow.status.code(), Some(1), "{slow:?}");
    assert!(String::from_utf8_lossy(&slow.stderr).contains("still running after 1 s"), "{slow:?}");
    let missing = gpux(&url, &key("renter"), &["lease", "exec", &lease, "--", "/no/such/program"]);
    assert_ne!(missing.status.code(), Some(0), "{missing:?}");
    // The renter signs what it sees of the endpoint: reachable, acknowledged,
    // and counted in its public record.
    let watched = ok(gpux(
        &url,
        &key("renter"),
        &["lease", "watch", &lease, "--probe-every", "1", "--sign-every", "1", "--seconds", "3", "--port", "8080"],
    ));
    assert!(watched.contains(" reachable") && !watched.contains("UNREACHABLE"), "{watched}");
    let first_lines: Vec<&str> = watched.lines().take(2).collect();
    assert!(first_lines[1].ends_with(" answers") && first_lines[1].contains(" UTC "), "the first probe is told at once: {watched}");
    let record = ok(gpux(&url, &key("renter"), &["renter", &renter_account]));
    assert!(record.contains("observations") && !record.contains(" 0 signed"), "{record}");
    assert!(record.contains("0 disputes"), "nothing disputed while it was reachable: {record}");
    ok(gpux(&url, &key("renter"), &["lease", "stop", &lease]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = ok(gpux(&url, &key("renter"), &["lease", "status", &lease]));
        if status.contains("stopped and removed") {
            break;
        }
        // Until the host says it stopped: `stopping`, never `running` (issue 64).
        assert!(status.contains("stopping: the lease ended at"), "an ended lease is not shown running: {status}");
        assert!(std::time::Instant::now() < deadline, "the workload was stopped: {status}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    // Nothing to probe on a stopped lease: a usage error, not a hang.
    let watch_stopped = gpux(&url, &key("renter"), &["lease", "watch", &lease, "--seconds", "1"]);
    assert_eq!(watch_stopped.status.code(), Some(2), "{}", String::from_utf8_lossy(&watch_stopped.stderr));

    // A command that fails at once: never `running`; `gpux run` exits 1 with
    // the exit code and the last output. A command given after -- ends its
    // lease when it exits (issue 64); --keep-lease keeps it, billed.
    // With `buy`'s re-match, which `run` now takes too.
    let failing = |keep: bool| {
        let mut args = vec!["run", "--image", "localhost/gpux-test:busybox", "--max-price", "2.5", "--rematch", "--entrypoint"];
        if keep {
            args.push("--keep-lease");
        }
        args.extend(["--wait-s", "60", "--", "/bin/sh", "-c", "echo boom-output; exit 1"]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let output = gpux(&url, &key("renter"), &args);
            assert!(!output.status.success(), "a failing workload never makes `gpux run` succeed");
            let stderr = String::from_utf8_lossy(&output.stderr).to_string();
            if !stderr.contains("on sale") {
                assert_eq!(output.status.code(), Some(1), "{stderr}");
                break stderr;
            }
            assert!(std::time::Instant::now() < deadline, "the GPU came back on sale: {stderr}");
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    };
    let refused = failing(false);
    assert!(refused.contains("exited with code 1"), "{refused}");
    assert!(refused.contains("boom-output"), "the last output is shown: {refused}");
    assert!(refused.contains("ended with its workload (billed to the exit)"), "{refused}");
    let kept = failing(true);
    assert!(kept.contains("exited with code 1") && kept.contains("still active and BILLED"), "{kept}");
    let kept_lease = kept.split("lease ").nth(1).and_then(|rest| rest.split(':').next()).expect("the kept lease");
    ok(gpux(&url, &key("renter"), &["lease", "stop", kept_lease]));

    // A short command that succeeds: `gpux run` prints its output and exits 0;
    // its lease ended with it.
    let short = [
        "run",
        "--image",
        "localhost/gpux-test:busybox",
        "--max-price",
        "2.5",
        "--hours",
        "0.5",
        "--entrypoint",
        "--wait-s",
        "60",
        "--",
        "/bin/sh",
        "-c",
        "echo short-done",
    ];
    let (printed, short_lease) = run_until_leased(&url, &key("renter"), &short);
    assert!(printed.contains("exited with code 0") || printed.contains("running"), "{printed}");
    assert!(printed.contains("short-done") || printed.contains("running"), "a short command's output is printed: {printed}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let status = ok(gpux(&url, &key("renter"), &["lease", "status", &short_lease]));
        if status.contains("the lease ended at") || status.contains("stopped and removed") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the short command's lease ended with it: {status}");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// `gpux run ARGS` until the agent's ask is on the book (20 s at most):
/// what it printed, and the lease it got.
fn run_until_leased(url: &str, key: &Path, args: &[&str]) -> (String, String) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let printed = loop {
        let output = gpux(url, key, args);
        if output.status.success() {
            break String::from_utf8_lossy(&output.stdout).to_string();
        }
        assert_eq!(output.status.code(), Some(1), "only 'nothing on sale yet' may fail: {}", String::from_utf8_lossy(&output.stderr));
        assert!(std::time::Instant::now() < deadline, "gpux run never got a GPU: {}", String::from_utf8_lossy(&output.stderr));
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let lease: String =
        printed.split("lease ").nth(1).and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()).expect("a lease").to_string();
    (printed, lease)
}

/// A supplier agent in-process: one fake H100 (`gpu`) on host `host`,
/// offered spot, delivering through the container engine at `socket` with
/// no GPU device passed into its containers.
fn start_docker_agent(url: &str, dir: &Path, socket: &str, host: &str, gpu: &str) {
    let host_file = dir.join(format!("{host}.json"));
    let gpus = format!(
        r#"{{"gpus": [{{"uuid": "{gpu}", "vendor": "nvidia", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "interconnect": "nv_link"}}]}}"#
    );
    std::fs::write(&host_file, gpus).expect("host file");
    let config = format!(
        "exchange = \"{url}\"\nhost = \"{host}\"\nkey_file = \"{}\"\nsample_interval_ms = 1000\nreport_interval_ms = 1000\n\n\
         [[offer]]\ncontract = \"spot\"\nprice_floor_minor_per_gpu_hour = 2100000\n\n\
         [delivery]\nbackend = \"docker\"\nstop_grace_ms = 1000\n\n[delivery.docker]\nsocket = \"{socket}\"\ngpu_devices = \"none\"\n",
        dir.join(format!("{host}.key")).display()
    );
    let config = gpux_supplier_agent::config::AgentConfig::parse(&config).expect("agent config");
    let backend = gpux_supplier_agent::fake::FakeBackend::from_file(&host_file).expect("fake host");
    let host_key = gpux_supplier_agent::keys::load_or_create(&config.key_file).expect("host key");
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let agent = gpux_supplier_agent::session::Agent::new(config, host_key, Box::new(backend)).expect("agent");
            let _ = agent.run(std::future::pending()).await;
        });
    });
}

/// The container engine's socket, or `None` (the test is skipped) where
/// scripts/test did not start one.
fn container_socket() -> Option<String> {
    match std::env::var("GPUX_DOCKER_SOCKET") {
        Ok(socket) if Path::new(&socket).exists() => Some(socket),
        _ => {
            assert!(std::env::var("GPUX_REQUIRE_CONTAINERS").as_deref() != Ok("1"), "no container engine: run scripts/containers start");
            eprintln!("SKIPPED: no container engine (set GPUX_DOCKER_SOCKET; scripts/test does)");
            None
        }
    }
}

/// Two-sided metering end to end (docs/market-rules.md "Disputes"): a host
/// whose agent reports its GPU available but whose containers get no GPU
/// (`gpu_devices = "none"`) runs a renter's workload that starts the
/// renter's GPU probe (`gpux-probe`, built into an image on the Python
/// image); `gpux lease watch` sends the probe's signed lines from the
/// lease's output; the exchange proves the reported time disputed and holds
/// the host's share; at the final bill the renter gets that time's whole
/// charge back (the held share and the fee), and both sides were told.
#[test]
fn a_renters_gpu_probe_proves_a_gpu_its_host_never_delivered_and_the_final_bill_refunds_it() {
    let Some(socket) = container_socket() else { return };
    // The renter's image: the Python image with the probe in it.
    let context = tempfile::tempdir().expect("temp dir");
    std::fs::copy(env!("CARGO_BIN_EXE_gpux-probe"), context.path().join("gpux-probe")).expect("the probe binary");
    std::fs::write(context.path().join("Containerfile"), "FROM localhost/gpux-py:1\nCOPY gpux-probe /usr/local/bin/gpux-probe\n")
        .expect("containerfile");
    let tar = context.path().join("context.tar");
    let packed = std::process::Command::new("tar")
        .args(["-C", &context.path().display().to_string(), "-cf", &tar.display().to_string(), "Containerfile", "gpux-probe"])
        .status()
        .expect("tar runs");
    assert!(packed.success());
    let built = std::process::Command::new("curl")
        .args(["-sf", "--unix-socket", &socket, "-X", "POST", "-H", "Content-Type: application/x-tar", "--data-binary"])
        .arg(format!("@{}", tar.display()))
        .arg("http://d/v1.41/build?t=localhost/gpux-probe:test&dockerfile=Containerfile")
        .output()
        .expect("curl runs");
    assert!(String::from_utf8_lossy(&built.stdout).contains("Successfully tagged"), "{}", String::from_utf8_lossy(&built.stdout));

    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter"] {
        ok(gpux(offline, &key(name), &["keys", "create"]));
    }
    let operator_public: [u8; 32] = key_of(&key("operator")).verifying_key().to_bytes();
    // Bills final 2 s after each lease ends (no late-report window).
    let billing =
        gpux_exchange::sequencer::BillingPolicy { fee_bps: 250, grace_ms: 2_000, late_window_ms: 0, storage_minor_per_gib_month: 0 };
    let exchange = start_exchange_billing(&dir.path().join("data"), operator_public, 0, Default::default(), billing);
    let url = exchange.url.clone();
    let login = ok(gpux(&url, &key("renter"), &["login", "--role", "renter"]));
    let renter_account = login.split_whitespace().nth(4).expect("an account id").to_string();
    ok(gpux(&url, &key("operator"), &["deposit", &renter_account, "100"]));

    // A host whose containers get no GPU (`gpu_devices = "none"`) while its
    // fake backend reports its GPU available.
    start_docker_agent(&url, dir.path(), &socket, "probe-host", "GPU-probe-0");

    // The probe's key: the renter's own, sealed to the host with the rest
    // of the workload's environment.
    let probe_key = format!("GPUX_PROBE_KEY={}", "5e".repeat(32));
    let args = [
        "run",
        "--image",
        "localhost/gpux-probe:test",
        "--max-price",
        "2.5",
        "-e",
        &probe_key,
        "--entrypoint",
        "--wait-s",
        "60",
        "--",
        "/usr/local/bin/gpux-probe",
        "--interval-s",
        "2",
        "--samples",
        "4",
    ];
    let (_, lease) = run_until_leased(&url, &key("renter"), &args);

    // The watch sends the probe's lines as they appear: the GPU absent,
    // the reported time it covers disputed and proven.
    let watched = ok(gpux(&url, &key("renter"), &["lease", "watch", &lease, "--probe-every", "1", "--sign-every", "2", "--seconds", "9"]));
    assert!(watched.contains("no published port: GPU probe lines only"), "{watched}");
    assert!(watched.contains("GPU probe: ABSENT GPU-probe-0") && !watched.contains("refused"), "{watched}");
    assert!(watched.contains("proven by your GPU probe") && watched.contains("held until the final bill"), "{watched}");
    let record = ok(gpux(&url, &key("renter"), &["renter", &renter_account]));
    assert!(!record.contains(" 0 disputes"), "the renter's record counts the disputes: {record}");

    // The lease ends; 2 s later the bill is final and the disputes decided:
    // the proven time's charge back to the renter, on its statement.
    ok(gpux(&url, &key("renter"), &["lease", "stop", &lease]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let statement = loop {
        let statement = ok(gpux(&url, &key("renter"), &["statement"]));
        if statement.contains("proved undelivered") {
            break statement;
        }
        assert!(std::time::Instant::now() < deadline, "no refund on the renter's statement: {statement}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(statement.contains("dispute_decided") || statement.contains("refunded"), "{statement}");
    assert!(statement.contains("fee on time of lease"), "the fee on undelivered time is refunded too: {statement}");
}

#[test]
fn completions_cover_every_command_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_gpux")).args(["completions", shell]).output().expect("gpux runs");
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8_lossy(&output.stdout);
        for command in ["sub-account", "invoice", "keys", "buy", "lease"] {
            assert!(script.contains(command), "{shell} completes {command}");
        }
    }
    let unknown = std::process::Command::new(env!("CARGO_BIN_EXE_gpux")).args(["completions", "tcsh"]).output().expect("gpux runs");
    assert_eq!(unknown.status.code(), Some(2), "an unknown shell is a usage error");
}

/// docs/operations.md "Opening accounts": on an exchange that opens
/// accounts by invitation, a new user's first login says what to do, the
/// operator's `gpux invite` makes the invitation, and the login with it
/// opens the account.
#[test]
fn an_operator_invites_a_new_user_with_the_cli() {
    let dir = tempfile::tempdir().expect("temp dir");
    let key = |name: &str| -> PathBuf { dir.path().join(format!("{name}.key")) };
    let offline = "ws://127.0.0.1:1";
    for name in ["operator", "renter"] {
        ok(gpux(offline, &key(name), &["keys", "create"]));
    }
    let policy = gpux_exchange::sequencer::AccountOpening { mode: gpux_exchange::sequencer::OpeningMode::Invite, ..Default::default() };
    let exchange = start_exchange_with(&dir.path().join("data"), key_of(&key("operator")).verifying_key().to_bytes(), 0, policy);
    let refused = gpux(&exchange.url, &key("renter"), &["login", "--role", "renter"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("invite_required") && stderr.contains("gpux invite"), "{stderr}");
    let renter_public = ok(gpux(offline, &key("renter"), &["keys", "show"]));
    // Made offline, with the operator's key.
    let invite = ok(gpux(offline, &key("operator"), &["invite", renter_public.trim(), "--role", "renter"]));
    let wrong_role = gpux(&exchange.url, &key("renter"), &["login", "--role", "supplier", "--invite", invite.trim()]);
    assert!(String::from_utf8_lossy(&wrong_role.stderr).contains("invite_invalid"), "{wrong_role:?}");
    let opened = ok(gpux(&exchange.url, &key("renter"), &["login", "--role", "renter", "--invite", invite.trim()]));
    assert!(opened.contains("logged in as account"), "{opened}");
    assert!(ok(gpux(&exchange.url, &key("renter"), &["balance"])).contains("available"));
    exchange.stop();
}

/// `gpux service` from creation to deletion: the key printed once and only
/// its hash on the exchange; bad input exits 2 and sends nothing; the
/// exchange's refusals exit 1 with their codes.
#[test]
fn a_renter_runs_a_service_with_the_cli() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (renter, operator) = (dir.path().join("renter.key"), dir.path().join("operator.key"));
    let offline = "ws://127.0.0.1:1";
    ok(gpux(offline, &renter, &["keys", "create"]));
    ok(gpux(offline, &operator, &["keys", "create"]));
    let operator_public: [u8; 32] =
        hex::decode(ok(gpux(offline, &operator, &["keys", "show"])).trim()).expect("hex").try_into().expect("32 bytes");
    let exchange = start_exchange(&dir.path().join("data"), operator_public);
    let url = exchange.url.as_str();
    let login = ok(gpux(url, &renter, &["login", "--role", "renter"]));
    let account = login.split_whitespace().nth(4).expect("an account id").to_string();
    ok(gpux(url, &operator, &["login"]));
    ok(gpux(url, &operator, &["deposit", &account, "100"]));

    let create = [
        "service",
        "create",
        "--name",
        "echo",
        "--instrument",
        "H100-SXM-80G/SPOT",
        "--max-price",
        "2.5",
        "--min",
        "0",
        "--max",
        "3",
        "--replicas",
        "1",
        "--image",
        "localhost/gpux-py:1",
        "--port",
        "8000",
        "--readiness",
        "/",
        "--scale-rps",
        "20",
    ];
    let with_command = |extra: &[&'static str]| -> Vec<&str> { create.iter().copied().chain(extra.iter().copied()).collect() };
    // Bad input: nothing sent.
    let bad_rps = gpux(url, &renter, &with_command(&["--scale-in-flight", "2"]));
    assert_eq!(bad_rps.status.code(), Some(2), "{}", String::from_utf8_lossy(&bad_rps.stderr));
    let mut bad_port = with_command(&[]);
    let port = bad_port.iter().position(|a| *a == "8000").expect("port");
    bad_port[port] = "0";
    assert_eq!(gpux(url, &renter, &bad_port).status.code(), Some(2));
    assert!(ok(gpux(url, &renter, &["service", "list"])).trim().is_empty(), "nothing was created");

    let json: Vec<&str> = std::iter::once("--json").chain(with_command(&["--", "python3", "-m", "http.server", "8000"])).collect();
    let created = ok(gpux(url, &renter, &json));
    let answer: serde_json::Value = serde_json::from_str(created.lines().last().expect("a line")).expect("json");
    let (service, key) = (answer["service"].as_u64().expect("an id"), answer["key"].as_str().expect("a key").to_string());
    assert_eq!(key.len(), 64);
    let status = ok(gpux(url, &renter, &["service", "status", &service.to_string()]));
    assert!(status.contains("running") && status.contains("replica 0: bidding"), "{status}");
    assert!(status.contains("scales on 20.000 requests/s a replica"), "{status}");
    assert!(!status.contains(&key), "the key is never shown again");
    let journal = std::fs::read_dir(dir.path().join("data"))
        .expect("data dir")
        .flatten()
        .any(|entry| std::fs::read(entry.path()).is_ok_and(|bytes| bytes.windows(key.len()).any(|w| w == key.as_bytes())));
    assert!(!journal, "the key is not in the exchange's files");
    assert!(ok(gpux(url, &renter, &["service", "list"])).contains("echo"));
    assert!(ok(gpux(url, &renter, &["service", "scale", &service.to_string(), "2"])).contains("keeps 2 replica(s)"));
    let over = gpux(url, &renter, &["service", "scale", &service.to_string(), "9"]);
    assert_eq!(over.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&over.stderr).contains("service_scale_invalid"), "{}", String::from_utf8_lossy(&over.stderr));
    // No replica runs yet (no host offers): the bids take the new run at once.
    let updated = ok(gpux(url, &renter, &["service", "update", &service.to_string(), "--image", "localhost/gpux-py:2"]));
    assert!(updated.contains("run 1 in place"), "{updated}");
    let bad = gpux(url, &renter, &["service", "update", &service.to_string(), "--port", "0"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("service_invalid"), "{}", String::from_utf8_lossy(&bad.stderr));
    assert!(ok(gpux(url, &renter, &["service", "delete", &service.to_string()])).contains("deleted"));
    let unknown = gpux(url, &renter, &["service", "status", "999"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown_service"));
}
