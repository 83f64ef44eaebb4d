//! Opening accounts has a cost the operator chooses (issue 41, "Fair
//! shares"; docs/operations.md "Opening accounts"): against the real binary
//! over real sockets, a flood of keys without invitations opens nothing on
//! an exchange that opens by invitation, an invited key opens its account,
//! and a full account table answers `too_many_accounts` at login while the
//! accounts it holds keep logging in.

mod common;

use std::time::Duration;

use common::*;
use gpux_engine::*;
use gpux_protocol::invite::Invite;
use gpux_protocol::*;

/// Sends a first login for `key` with `role` and `invite`; the error code
/// it gets, or `None` when it is authenticated.
async fn first_login(addr: &str, seed: u8, role: Role, invite: Option<String>) -> Option<ErrorCode> {
    login_outcome(Client::connect(addr).await, seed, role, invite).await
}

/// Sends `client` a first login; the error code it gets, or `None`.
async fn login_outcome(mut client: Client, seed: u8, role: Role, invite: Option<String>) -> Option<ErrorCode> {
    let mut auth = client.auth_message(&key(seed), Some(role));
    if let ClientMessage::Auth { invite: sent, .. } = &mut auth {
        *sent = invite;
    }
    client.send(&auth).await;
    client
        .recv_until(|m| match m {
            ServerMessage::Authenticated { .. } => Some(None),
            ServerMessage::Error { code, .. } => Some(Some(*code)),
            _ => None,
        })
        .await
}

fn invite(operator: u8, user: u8, role: Role, expires_at_ms: u64) -> String {
    Invite::sign(&key(operator), &key(user).verifying_key().to_bytes(), role, expires_at_ms).encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_invitation_no_key_opens_an_account_and_a_full_table_says_too_many_accounts() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The operator (key 1) logs in first: one account. Room for three more.
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--account-opening", "invite", "--accounts-max", "4"]);
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let far = u64::MAX / 2;

    // The flood: 200 new keys, no invitation, a forged one, another key's,
    // an expired one, one for another role: every one refused with its cause.
    for seed in 100..=255u8 {
        assert_eq!(first_login(&exchange.addr, seed, Role::Supplier, None).await, Some(ErrorCode::InviteRequired));
    }
    let forged = invite(9, 20, Role::Renter, far);
    assert_eq!(first_login(&exchange.addr, 20, Role::Renter, Some(forged)).await, Some(ErrorCode::InviteInvalid));
    let someone_elses = invite(1, 21, Role::Renter, far);
    assert_eq!(first_login(&exchange.addr, 20, Role::Renter, Some(someone_elses)).await, Some(ErrorCode::InviteInvalid));
    let expired = invite(1, 20, Role::Renter, 1);
    assert_eq!(first_login(&exchange.addr, 20, Role::Renter, Some(expired)).await, Some(ErrorCode::InviteInvalid));
    let wrong_role = invite(1, 20, Role::Renter, far);
    assert_eq!(first_login(&exchange.addr, 20, Role::Supplier, Some(wrong_role)).await, Some(ErrorCode::InviteInvalid));
    assert_eq!(first_login(&exchange.addr, 20, Role::Renter, Some("gpux-invite-v1.x".into())).await, Some(ErrorCode::InviteInvalid));

    // None of that opened an account: the invited victim's is the next one.
    let (mut victim, victim_account) = {
        let code = first_login(&exchange.addr, 20, Role::Renter, Some(invite(1, 20, Role::Renter, far))).await;
        assert_eq!(code, None, "the invited key opens its account");
        Client::login(&exchange.addr, &key(20), Role::Renter).await
    };
    assert_eq!(victim_account, AccountId(1), "refused logins opened nothing");
    let stats = victim.request(ClientMessage::Balance { id: 2 }).await;
    assert!(matches!(stats, ServerMessage::Balance { .. }), "{stats:?}");

    // Two more invited accounts fill the table; the next invited key is
    // refused `too_many_accounts`, not `auth_failed`.
    for seed in [21u8, 22] {
        assert_eq!(first_login(&exchange.addr, seed, Role::Supplier, Some(invite(1, seed, Role::Supplier, far))).await, None);
    }
    let code = first_login(&exchange.addr, 23, Role::Supplier, Some(invite(1, 23, Role::Supplier, far))).await;
    assert_eq!(code, Some(ErrorCode::TooManyAccounts));
    // The accounts it holds are served as before.
    let (mut again, account) = Client::login(&exchange.addr, &key(20), Role::Renter).await;
    assert_eq!(account, victim_account);
    assert!(matches!(again.request(ClientMessage::Ping { id: 3 }).await, ServerMessage::Pong { .. }));
    assert!(matches!(operator.request(ClientMessage::Ping { id: 4 }).await, ServerMessage::Pong { .. }));
    // Refusals are counted by cause.
    let metrics = reqwest_metrics(&exchange.metrics_addr).await;
    for reason in ["invite_required", "invite_invalid", "too_many_accounts"] {
        assert!(metrics.contains(&format!("reason=\"{reason}\"")), "gpux_auth_failures_total{{reason=\"{reason}\"}} in\n{metrics}");
    }
}

/// Sub-accounts are rows of the accounts table too: `--accounts-max`
/// bounds them with every other account (an aggregator cannot grow the
/// table past the operator's bound through its sub-accounts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accounts_max_counts_sub_accounts() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), Some(&key(1)), &["--accounts-max", "3"]);
    let (_operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (mut renter, _) = Client::login(&exchange.addr, &key(30), Role::Renter).await;
    let opened = renter.request(ClientMessage::OpenSubAccount { id: 2 }).await;
    assert!(matches!(opened, ServerMessage::SubAccountOpened { .. }), "the third account: {opened:?}");
    match renter.request(ClientMessage::OpenSubAccount { id: 3 }).await {
        ServerMessage::Error { code: ErrorCode::TooManyAccounts, .. } => {}
        other => panic!("a fourth account past --accounts-max 3: {other:?}"),
    }
    assert_eq!(first_login(&exchange.addr, 31, Role::Renter, None).await, Some(ErrorCode::TooManyAccounts));
}

/// `GET /metrics` over a plain socket.
async fn reqwest_metrics(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("metrics listens");
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.expect("request");
    let mut body = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut body)).await.expect("answered").expect("read");
    body
}

/// Test addresses on `lo` (root only): a public-looking source for
/// connections to the loopback listener; removed when dropped.
struct TestAddresses(Vec<String>);

impl TestAddresses {
    fn add(addresses: &[&str]) -> Option<TestAddresses> {
        let mut added = TestAddresses(Vec::new());
        for address in addresses {
            let prefix = if address.contains(':') { "/128" } else { "/32" };
            let cidr = format!("{address}{prefix}");
            let ok = std::process::Command::new("ip").args(["addr", "add", &cidr, "dev", "lo"]).status().is_ok_and(|s| s.success());
            if !ok {
                assert!(
                    std::env::var_os("GPUX_REQUIRE_ADDRESSES").is_none(),
                    "GPUX_REQUIRE_ADDRESSES=1 but {cidr} could not be added to lo"
                );
                eprintln!("SKIPPED: adding test addresses to lo needs root");
                return None;
            }
            added.0.push(cidr);
        }
        Some(added)
    }
}

impl Drop for TestAddresses {
    fn drop(&mut self) {
        for cidr in &self.0 {
            let _ = std::process::Command::new("ip").args(["addr", "del", cidr, "dev", "lo"]).status();
        }
    }
}

/// A first login from `source`: the error code, or `None` when it opened.
async fn first_login_from(addr: &str, source: &str, seed: u8) -> Option<ErrorCode> {
    let client = Client::connect_from(addr, source.parse().expect("an address")).await;
    login_outcome(client, seed, Role::Renter, None).await
}

/// Issue 61, as a public deployment meets it: clients on addresses that
/// are not loopback (test addresses on `lo`). One IPv4 address opens its
/// share an hour and another is not held up; one IPv6 site opens its /48's
/// share (eight addresses') however many /64s it uses, and another site
/// opens its accounts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_addresses_open_their_share_and_one_site_cannot_lock_others_out() {
    let sites: Vec<String> = (1..=9).map(|n| format!("2001:db8:77:{n}::1")).collect();
    let mut addresses = vec!["10.77.0.1", "10.77.0.2", "2001:db8:78::1"];
    addresses.extend(sites.iter().map(String::as_str));
    let Some(_added) = TestAddresses::add(&addresses) else { return };
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start_with(dir.path(), None, &["--accounts-per-address-hour", "2"]);
    let mut seed = 100u8;
    let mut next = || {
        seed += 1;
        seed
    };
    for _ in 0..2 {
        assert_eq!(first_login_from(&exchange.addr, "10.77.0.1", next()).await, None);
    }
    assert_eq!(first_login_from(&exchange.addr, "10.77.0.1", next()).await, Some(ErrorCode::RateLimited), "past its share");
    assert_eq!(first_login_from(&exchange.addr, "10.77.0.2", next()).await, None, "another address is not held up");

    // IPv6: each /64 its share, one /48 eight shares (16 here) in all.
    let dir6 = tempfile::tempdir().expect("temp dir");
    let exchange6 = Exchange::start_on(dir6.path(), None, "[::1]:0", &["--accounts-per-address-hour", "2"]);
    let mut opened = 0;
    for site in &sites[..8] {
        for _ in 0..2 {
            if first_login_from(&exchange6.addr, site, next()).await.is_none() {
                opened += 1;
            }
        }
        assert_eq!(first_login_from(&exchange6.addr, site, next()).await, Some(ErrorCode::RateLimited), "{site}: its /64's share");
    }
    assert_eq!(opened, 16, "eight /64s of one /48, two each");
    assert_eq!(first_login_from(&exchange6.addr, &sites[8], next()).await, Some(ErrorCode::RateLimited), "a ninth /64: the /48's share");
    assert_eq!(first_login_from(&exchange6.addr, "2001:db8:78::1", next()).await, None, "another site opens");
}
