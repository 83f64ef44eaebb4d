//! Sub-accounts and scoped API keys against the real binary over real
//! sockets (docs/protocol.md "Sub-accounts", "Keys and scopes"): what one
//! sub-account does is invisible to another, each scope refuses what it does
//! not grant, and revocation and expiry end open sessions at once.

mod common;

use std::time::Duration;

use common::*;
use ed25519_dalek::SigningKey;
use gpux_engine::*;
use gpux_protocol::*;

const USD_2: u64 = 2_000_000;

struct Fixture {
    exchange: Exchange,
    _dir: tempfile::TempDir,
    parent: Client,
    parent_account: AccountId,
}

/// A renter with $1,000 deposited by the operator.
async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("temp dir");
    let exchange = Exchange::start(dir.path(), Some(&key(1)));
    let (mut operator, _) = Client::login(&exchange.addr, &key(1), Role::Operator).await;
    let (parent, parent_account) = Client::login(&exchange.addr, &key(3), Role::Renter).await;
    let id = operator.id();
    let deposit = operator.request(ClientMessage::Deposit { id, account: parent_account, amount_minor: 1_000_000_000 }).await;
    assert!(matches!(deposit, ServerMessage::Ack { .. }), "{deposit:?}");
    Fixture { exchange, _dir: dir, parent, parent_account }
}

fn public(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().to_bytes())
}

impl Fixture {
    async fn open_sub(&mut self) -> AccountId {
        let id = self.parent.id();
        match self.parent.request(ClientMessage::OpenSubAccount { id }).await {
            ServerMessage::SubAccountOpened { account, .. } => account,
            other => panic!("{other:?}"),
        }
    }

    async fn move_funds(&mut self, sub_account: AccountId, amount_minor: u64, to_sub_account: bool) -> ServerMessage {
        let id = self.parent.id();
        self.parent.request(ClientMessage::MoveFunds { id, sub_account, amount_minor, to_sub_account }).await
    }

    async fn add_key(
        &mut self,
        account: Option<AccountId>,
        key: &SigningKey,
        scopes: &[Scope],
        expires_at_ms: Option<u64>,
    ) -> ServerMessage {
        let id = self.parent.id();
        let message =
            ClientMessage::AddKey { id, account, public_key: public(key), scopes: Scopes::of(scopes), expires_at_ms, label: "test".into() };
        self.parent.request(message).await
    }
}

/// Logs in with an existing key (no role: it opens no account).
async fn login_existing(addr: &str, key: &SigningKey) -> Result<(Client, AccountId), ErrorCode> {
    let mut client = Client::connect(addr).await;
    let auth = client.auth_message(key, None);
    client.send(&auth).await;
    let outcome = client
        .recv_until(|m| match m {
            ServerMessage::Authenticated { account, .. } => Some(Ok(*account)),
            ServerMessage::Error { code, .. } => Some(Err(*code)),
            _ => None,
        })
        .await;
    outcome.map(|account| (client, account))
}

async fn exchange_time(client: &mut Client) -> u64 {
    let id = client.id();
    match client.request(ClientMessage::Ping { id }).await {
        ServerMessage::Pong { server_time_ms, .. } => server_time_ms,
        other => panic!("{other:?}"),
    }
}

fn bid(client_order_id: u64, quantity: u32) -> OrderTicket {
    ticket(client_order_id, Side::Buy, USD_2, quantity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sub_account_sees_and_touches_nothing_of_another() {
    let mut f = fixture().await;
    let (a, b) = (f.open_sub().await, f.open_sub().await);
    assert!(matches!(f.move_funds(a, 100_000_000, true).await, ServerMessage::Ack { .. }));
    assert!(matches!(f.move_funds(b, 50_000_000, true).await, ServerMessage::Ack { .. }));
    let all = Scope::ALL;
    for (account, seed) in [(a, 40), (b, 41)] {
        let added = f.add_key(Some(account), &key(seed), &all, None).await;
        assert!(matches!(added, ServerMessage::KeyAdded { account: acted, .. } if acted == account), "{added:?}");
    }
    let (mut alice, alice_account) = login_existing(&f.exchange.addr, &key(40)).await.expect("alice logs in");
    let (mut bob, bob_account) = login_existing(&f.exchange.addr, &key(41)).await.expect("bob logs in");
    assert_eq!((alice_account, bob_account), (a, b), "each key acts as its sub-account");

    let ServerMessage::Ack { order: Some(alice_order), .. } = alice.place(bid(1, 2)).await else { panic!("alice's bid is taken") };
    // Bob's view: his own money, no orders, and nothing of Alice's in his feed.
    let id = bob.id();
    let ServerMessage::Balance { available_minor, held_minor, .. } = bob.request(ClientMessage::Balance { id }).await else {
        panic!("a balance")
    };
    assert_eq!((available_minor, held_minor), (50_000_000, 0));
    assert!(bob.open_orders().await.is_empty(), "Bob sees none of Alice's orders");
    let id = bob.id();
    let refused = bob.request(ClientMessage::CancelOrder { id, order: alice_order }).await;
    assert!(matches!(refused, ServerMessage::Reject { code: RejectCode::NotYourOrder, .. }), "{refused:?}");
    let id = bob.id();
    let refused = bob.request(ClientMessage::Keys { id, account: Some(a) }).await;
    assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::NotYourSubAccount, .. }), "{refused:?}");
    let id = bob.id();
    let refused = bob.request(ClientMessage::MoveFunds { id, sub_account: a, amount_minor: 1, to_sub_account: false }).await;
    assert!(matches!(refused, ServerMessage::Reject { code: RejectCode::NotYourSubAccount, .. }), "{refused:?}");
    let id = bob.id();
    let refused = bob.request(ClientMessage::Withdraw { id, account: None, amount_minor: 1 }).await;
    assert!(matches!(refused, ServerMessage::Reject { code: RejectCode::SubAccountFundsStay, .. }), "{refused:?}");
    // Everything Bob was sent: answers and his own events only.
    let id = bob.id();
    bob.send(&ClientMessage::Ping { id }).await;
    let mut seen = Vec::new();
    loop {
        match bob.recv().await {
            ServerMessage::Pong { id: i, .. } if i == id => break,
            other => seen.push(other),
        }
    }
    for message in &seen {
        if let ServerMessage::Private { event, .. } = message {
            let concerns = format!("{:?}", event.kind);
            assert!(!concerns.contains(&format!("AccountId({})", a.0)), "Bob was told of Alice's account: {concerns}");
        }
    }

    // The parent sees both, with their balances.
    let id = f.parent.id();
    let ServerMessage::SubAccounts { sub_accounts, next_offset, .. } = f.parent.request(ClientMessage::SubAccounts { id, offset: 0 }).await
    else {
        panic!("sub-accounts")
    };
    assert_eq!(next_offset, None);
    let seen: Vec<(AccountId, u64, u64, u32)> =
        sub_accounts.iter().map(|s| (s.account, s.balances.available_minor, s.balances.held_minor, s.open_orders)).collect();
    assert_eq!(seen, vec![(a, 100_000_000 - 2 * USD_2, 2 * USD_2, 1), (b, 50_000_000, 0, 0)]);
    // The moves are ledger transfers on the parent's statement.
    let id = f.parent.id();
    let ServerMessage::Statement { lines, .. } = f.parent.request(ClientMessage::Statement { id, after: None }).await else {
        panic!("a statement")
    };
    let moves: Vec<(String, String, u64)> = lines
        .iter()
        .filter(|l| l.to.starts_with("available:") && l.from != "external")
        .map(|l| (l.from.clone(), l.to.clone(), l.amount_minor))
        .collect();
    let parent = f.parent_account.0;
    assert_eq!(
        moves,
        vec![
            (format!("available:{parent}"), format!("available:{}", a.0), 100_000_000),
            (format!("available:{parent}"), format!("available:{}", b.0), 50_000_000)
        ]
    );
    let id = bob.id();
    let nested = bob.request(ClientMessage::OpenSubAccount { id }).await;
    assert!(matches!(nested, ServerMessage::Reject { code: RejectCode::SubAccountNested, .. }), "{nested:?}");
    // Money back to the parent.
    assert!(matches!(f.move_funds(b, 50_000_000, false).await, ServerMessage::Ack { .. }));
    let id = f.parent.id();
    let ServerMessage::Balance { available_minor, .. } = f.parent.request(ClientMessage::Balance { id }).await else { panic!("a balance") };
    assert_eq!(available_minor, 1_000_000_000 - 100_000_000);
}

/// What each request needs; `scope_denied` exactly when the key lacks it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_scope_grants_its_requests_and_refuses_the_rest() {
    let mut f = fixture().await;
    let scopes = [Scope::Read, Scope::Trade, Scope::Deliver, Scope::Withdraw, Scope::Manage];
    let mut sessions = Vec::new();
    for (n, scope) in scopes.iter().enumerate() {
        let seed = 50 + n as u8;
        assert!(matches!(f.add_key(None, &key(seed), &[*scope], None).await, ServerMessage::KeyAdded { .. }));
        let (client, account) = login_existing(&f.exchange.addr, &key(seed)).await.expect("logs in");
        assert_eq!(account, f.parent_account, "an added key acts as the account itself");
        sessions.push((*scope, client));
    }
    type Request = fn(u64) -> ClientMessage;
    let requests: [(Scope, Request); 11] = [
        (Scope::Read, |id| ClientMessage::Balance { id }),
        (Scope::Read, |id| ClientMessage::OpenOrders { id, after: None }),
        (Scope::Read, |id| ClientMessage::Keys { id, account: None }),
        (Scope::Trade, |id| ClientMessage::NewOrder { id, order: bid(id, 1), workload: None }),
        (Scope::Trade, |id| ClientMessage::MassCancel { id, instrument: None }),
        (Scope::Deliver, |id| ClientMessage::EndLease { id, lease: LeaseId(999) }),
        (Scope::Deliver, |id| ClientMessage::LeaseLogs { id, lease: LeaseId(999), tail_bytes: 10 }),
        (Scope::Deliver, |id| ClientMessage::LeaseExec { id, lease: LeaseId(999), command: vec!["true".into()], timeout_ms: 1_000 }),
        (Scope::Withdraw, |id| ClientMessage::Withdraw { id, account: None, amount_minor: 1 }),
        (Scope::Manage, |id| ClientMessage::OpenSubAccount { id }),
        (Scope::Manage, |id| ClientMessage::RevokeKey { id, public_key: "ab".repeat(32) }),
    ];
    for (held, client) in &mut sessions {
        for (needed, request) in &requests {
            let id = client.id();
            let answer = client.request(request(id)).await;
            let denied = matches!(answer, ServerMessage::Error { code: ErrorCode::ScopeDenied, .. });
            assert_eq!(denied, held != needed, "a {held:?} key sending a {needed:?} request: {answer:?}");
        }
    }
    // Public requests need no scope at all.
    let (_, client) = &mut sessions[1];
    let id = client.id();
    assert!(matches!(client.request(ClientMessage::Instruments { id }).await, ServerMessage::Instruments { .. }));
    // A manage key grants only scopes it holds: no way up to withdraw.
    let (_, manager) = &mut sessions[4];
    let id = manager.id();
    let add = ClientMessage::AddKey {
        id,
        account: None,
        public_key: public(&key(70)),
        scopes: Scopes::of(&[Scope::Withdraw]),
        expires_at_ms: None,
        label: String::new(),
    };
    assert!(matches!(manager.request(add).await, ServerMessage::Error { code: ErrorCode::ScopeDenied, .. }));
    let id = manager.id();
    let add = ClientMessage::AddKey {
        id,
        account: None,
        public_key: public(&key(71)),
        scopes: Scopes::of(&[Scope::Manage]),
        expires_at_ms: None,
        label: String::new(),
    };
    assert!(matches!(manager.request(add).await, ServerMessage::KeyAdded { .. }), "its own scope it may grant");
    // The owner lists every key with its scopes.
    let id = f.parent.id();
    let ServerMessage::Keys { keys, .. } = f.parent.request(ClientMessage::Keys { id, account: None }).await else { panic!("keys") };
    assert_eq!(keys.len(), 1 + 5 + 1);
    assert!(keys[0].owner && keys[0].scopes == Scopes::ALL && keys[0].public_key == public(&key(3)));
    assert!(keys[1..].iter().all(|k| !k.owner && k.scopes.list().len() == 1 && k.label == "test" || k.label.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_key_loses_its_open_sessions_at_once_and_never_logs_in_again() {
    let mut f = fixture().await;
    let sub = f.open_sub().await;
    assert!(matches!(f.add_key(Some(sub), &key(60), &[Scope::Read, Scope::Trade], None).await, ServerMessage::KeyAdded { .. }));
    let (mut first, _) = login_existing(&f.exchange.addr, &key(60)).await.expect("logs in");
    let (mut second, _) = login_existing(&f.exchange.addr, &key(60)).await.expect("logs in twice");
    let id = f.parent.id();
    let revoked = f.parent.request(ClientMessage::RevokeKey { id, public_key: public(&key(60)) }).await;
    assert!(matches!(revoked, ServerMessage::KeyRevoked { .. }), "{revoked:?}");
    for session in [&mut first, &mut second] {
        let (read, reason) = tokio::time::timeout(Duration::from_secs(5), session.read_to_close()).await.expect("closed");
        assert_eq!(reason, "key_revoked");
        assert!(read.iter().any(|m| matches!(m, ServerMessage::Error { code: ErrorCode::KeyRevoked, .. })), "{read:?}");
    }
    // Never again, not even with a role (which would open a fresh account).
    assert_eq!(login_existing(&f.exchange.addr, &key(60)).await.err(), Some(ErrorCode::KeyRevoked));
    let mut client = Client::connect(&f.exchange.addr).await;
    let auth = client.auth_message(&key(60), Some(Role::Renter));
    client.send(&auth).await;
    let refused = client.recv_until(|m| matches!(m, ServerMessage::Error { .. }).then(|| m.clone())).await;
    assert!(matches!(refused, ServerMessage::Error { code: ErrorCode::KeyRevoked, .. }), "{refused:?}");
    let id = f.parent.id();
    let again = f.parent.request(ClientMessage::AddKey {
        id,
        account: None,
        public_key: public(&key(60)),
        scopes: Scopes::of(&[Scope::Read]),
        expires_at_ms: None,
        label: String::new(),
    });
    assert!(matches!(again.await, ServerMessage::Error { code: ErrorCode::KeyInUse, .. }), "a revoked key is never bound again");
    let id = f.parent.id();
    let owner = f.parent.request(ClientMessage::RevokeKey { id, public_key: public(&key(3)) }).await;
    assert!(matches!(owner, ServerMessage::Error { code: ErrorCode::OwnerKey, .. }), "{owner:?}");
    // It survives a restart: the journal holds the revocation.
    let addr = f.exchange.addr.clone();
    f.exchange.terminate();
    let restarted = Exchange::start_on(f._dir.path(), Some(&key(1)), &addr, &[]);
    assert_eq!(login_existing(&restarted.addr, &key(60)).await.err(), Some(ErrorCode::KeyRevoked));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_closed_out_and_refused() {
    let mut f = fixture().await;
    let now = exchange_time(&mut f.parent).await;
    let past = f.add_key(None, &key(61), &[Scope::Read], Some(now.saturating_sub(1))).await;
    assert!(matches!(past, ServerMessage::Error { code: ErrorCode::KeyInvalid, .. }), "{past:?}");
    let added = f.add_key(None, &key(61), &[Scope::Read], Some(now + 1_500)).await;
    assert!(matches!(added, ServerMessage::KeyAdded { .. }), "{added:?}");
    let (mut session, _) = login_existing(&f.exchange.addr, &key(61)).await.expect("logs in before it expires");
    let (read, reason) = tokio::time::timeout(Duration::from_secs(6), session.read_to_close()).await.expect("closed");
    assert_eq!(reason, "key_expired", "{read:?}");
    assert_eq!(login_existing(&f.exchange.addr, &key(61)).await.err(), Some(ErrorCode::KeyExpired));
}

/// Keys cannot escalate (issue "Fair shares"): a key added by an expiring
/// key never outlives it; a key may revoke only keys whose scopes are
/// within its own; and revoking a key revokes the keys it added, whose
/// sessions end at once and which never log in again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_outlives_nor_outranks_the_key_that_added_it() {
    let mut f = fixture().await;
    let now = exchange_time(&mut f.parent).await;
    let until = now + 120_000;
    let added = f.add_key(None, &key(70), &[Scope::Read, Scope::Trade, Scope::Manage], Some(until)).await;
    assert!(matches!(added, ServerMessage::KeyAdded { .. }), "{added:?}");
    let (mut manager, _) = login_existing(&f.exchange.addr, &key(70)).await.expect("logs in");
    let add = |id, public_key: &SigningKey, scopes: &[Scope], expires_at_ms: Option<u64>| ClientMessage::AddKey {
        id,
        account: None,
        public_key: public(public_key),
        scopes: Scopes::of(scopes),
        expires_at_ms,
        label: String::new(),
    };
    for expires_at_ms in [None, Some(until + 1)] {
        let id = manager.id();
        let answer = manager.request(add(id, &key(71), &[Scope::Read], expires_at_ms)).await;
        assert!(
            matches!(answer, ServerMessage::Error { code: ErrorCode::ScopeDenied, .. }),
            "outlives its adder ({expires_at_ms:?}): {answer:?}"
        );
    }
    let id = manager.id();
    assert!(matches!(manager.request(add(id, &key(71), &[Scope::Read, Scope::Trade], Some(until))).await, ServerMessage::KeyAdded { .. }));
    let (mut child, _) = login_existing(&f.exchange.addr, &key(71)).await.expect("the added key logs in");

    // A manage key that cannot trade cannot revoke one that can.
    assert!(matches!(f.add_key(None, &key(72), &[Scope::Read, Scope::Manage], None).await, ServerMessage::KeyAdded { .. }));
    let (mut weak, _) = login_existing(&f.exchange.addr, &key(72)).await.expect("logs in");
    let id = weak.id();
    let answer = weak.request(ClientMessage::RevokeKey { id, public_key: public(&key(71)) }).await;
    assert!(matches!(answer, ServerMessage::Error { code: ErrorCode::ScopeDenied, .. }), "{answer:?}");

    // The owner revokes the manager: the key it added goes with it.
    let id = f.parent.id();
    let revoked = f.parent.request(ClientMessage::RevokeKey { id, public_key: public(&key(70)) }).await;
    assert!(matches!(revoked, ServerMessage::KeyRevoked { .. }), "{revoked:?}");
    for session in [&mut manager, &mut child] {
        let (_, reason) = tokio::time::timeout(Duration::from_secs(5), session.read_to_close()).await.expect("closed");
        assert_eq!(reason, "key_revoked");
    }
    assert_eq!(login_existing(&f.exchange.addr, &key(71)).await.err(), Some(ErrorCode::KeyRevoked), "revoked with its adder");
    // It holds through a restart: the lineage is journaled.
    let addr = f.exchange.addr.clone();
    f.exchange.terminate();
    let restarted = Exchange::start_on(f._dir.path(), Some(&key(1)), &addr, &[]);
    assert_eq!(login_existing(&restarted.addr, &key(71)).await.err(), Some(ErrorCode::KeyRevoked));
    assert!(login_existing(&restarted.addr, &key(72)).await.is_ok(), "keys the revoked key did not add stay");
}
