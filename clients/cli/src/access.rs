//! `gpux sub-account ...` and `gpux keys grant|revoke|list`: sub-accounts
//! and scoped keys (docs/protocol.md "Sub-accounts", "Keys and scopes").

use gpux_engine::{AccountId, AccountLimits};
use gpux_protocol::{ClientMessage, Scope, Scopes, ServerMessage};

use crate::money::{amount, parse_amount};
use crate::session::{written, Session};
use crate::{Failure, KeysAction, ScopeArg, SubAccountAction};

fn limit(limit: Option<u64>, show: impl Fn(u64) -> String) -> String {
    limit.map_or_else(|| "none".into(), show)
}

pub async fn sub_account(s: &mut Session, action: SubAccountAction, json: bool) -> Result<(), Failure> {
    match action {
        SubAccountAction::Create => {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::OpenSubAccount { id }, json).await?;
            if let (ServerMessage::SubAccountOpened { account, .. }, false) = (&answer, json) {
                out!("opened sub-account {account}: fund it with `gpux sub-account fund {account} AMOUNT`, give it a key with `gpux keys grant PUBLIC_KEY --sub-account {account} --scopes read,trade,deliver`");
            }
            Ok(())
        }
        SubAccountAction::Fund { sub_account, amount } => move_funds(s, sub_account, &amount, true, json).await,
        SubAccountAction::Defund { sub_account, amount } => move_funds(s, sub_account, &amount, false, json).await,
        SubAccountAction::Limits { sub_account, max_open_orders, max_order, max_held } => {
            let parse = |text: Option<String>| text.map(|t| parse_amount(&t)).transpose().map_err(Failure::Usage);
            let limits = AccountLimits { max_open_orders, max_order_minor: parse(max_order)?, max_held_minor: parse(max_held)? };
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::SetSubAccountLimits { id, sub_account: AccountId(sub_account), limits }, json).await?;
            written(s, answer, &format!("limits of sub-account {sub_account} set"), "sub_account_limits", json).await
        }
        SubAccountAction::List => {
            let mut offset = 0;
            let mut shown = 0;
            loop {
                let id = s.connection.new_id();
                let answer = s.ask(ClientMessage::SubAccounts { id, offset }, json).await?;
                let ServerMessage::SubAccounts { sub_accounts, next_offset, .. } = answer else {
                    return Err(Failure::Unreachable(format!("expected sub_accounts, got {answer:?}")));
                };
                if !json {
                    for sub in &sub_accounts {
                        let b = sub.balances;
                        out!(
                            "sub-account {}: available {}, held {}, owed {}, {} open orders; limits: open orders {}, one bid {}, held in all {}",
                            sub.account,
                            amount(b.available_minor),
                            amount(b.held_minor),
                            amount(b.debt_minor),
                            sub.open_orders,
                            limit(sub.limits.max_open_orders.map(u64::from), |n| n.to_string()),
                            limit(sub.limits.max_order_minor, amount),
                            limit(sub.limits.max_held_minor, amount),
                        );
                    }
                }
                shown += sub_accounts.len();
                match next_offset {
                    Some(next) => offset = next,
                    None => break,
                }
            }
            if shown == 0 && !json {
                out!("no sub-accounts: `gpux sub-account create` opens one");
            }
            Ok(())
        }
    }
}

async fn move_funds(s: &mut Session, sub_account: u32, text: &str, to_sub_account: bool, json: bool) -> Result<(), Failure> {
    let amount_minor = parse_amount(text).map_err(Failure::Usage)?;
    let id = s.connection.new_id();
    let message = ClientMessage::MoveFunds { id, sub_account: AccountId(sub_account), amount_minor, to_sub_account };
    let answer = s.ask(message, json).await?;
    let what = if to_sub_account {
        format!("moved {} to sub-account {sub_account}", amount(amount_minor))
    } else {
        format!("moved {} back from sub-account {sub_account}", amount(amount_minor))
    };
    written(s, answer, &what, if to_sub_account { "fund" } else { "defund" }, json).await
}

fn scope(arg: ScopeArg) -> Scope {
    match arg {
        ScopeArg::Read => Scope::Read,
        ScopeArg::Trade => Scope::Trade,
        ScopeArg::Deliver => Scope::Deliver,
        ScopeArg::Withdraw => Scope::Withdraw,
        ScopeArg::Manage => Scope::Manage,
    }
}

pub async fn keys(s: &mut Session, action: KeysAction, json: bool) -> Result<(), Failure> {
    match action {
        KeysAction::Grant { public_key, scopes, sub_account, expires_in_s, label } => {
            let scopes = Scopes::of(&scopes.into_iter().map(scope).collect::<Vec<_>>());
            let expires_at_ms = match expires_in_s {
                // The exchange's clock, as measured at login.
                Some(seconds) => {
                    let now = (gpux_client::now_ms() as i64).saturating_add(s.connection.clock_offset_ms).max(0) as u64;
                    Some(now.saturating_add(seconds.saturating_mul(1_000)))
                }
                None => None,
            };
            let id = s.connection.new_id();
            let message = ClientMessage::AddKey { id, account: sub_account.map(AccountId), public_key, scopes, expires_at_ms, label };
            let answer = s.ask(message, json).await?;
            if let (ServerMessage::KeyAdded { public_key, account, journal_seq, .. }, false) = (&answer, json) {
                let names: Vec<String> = scopes.list().iter().map(|scope| scope.name().to_string()).collect();
                out!("key {public_key} now acts as account {account} with scopes {} (journal entry {journal_seq})", names.join(","));
            }
            Ok(())
        }
        KeysAction::Revoke { public_key } => {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::RevokeKey { id, public_key }, json).await?;
            if let (ServerMessage::KeyRevoked { public_key, journal_seq, .. }, false) = (&answer, json) {
                out!("revoked {public_key}: its sessions are closed (journal entry {journal_seq})");
            }
            Ok(())
        }
        KeysAction::List { sub_account } => {
            let id = s.connection.new_id();
            let answer = s.ask(ClientMessage::Keys { id, account: sub_account.map(AccountId) }, json).await?;
            if json {
                return Ok(());
            }
            let ServerMessage::Keys { account, keys, .. } = answer else {
                return Err(Failure::Unreachable(format!("expected keys, got {answer:?}")));
            };
            out!("keys of account {account}:");
            for key in &keys {
                let names: Vec<String> = key.scopes.list().iter().map(|scope| scope.name().to_string()).collect();
                let expiry = key.expires_at_ms.map_or_else(|| "no expiry".into(), |at| format!("expires {}", crate::clock::when(at)));
                let role = if key.owner { "owner" } else { "granted" };
                let label = if key.label.is_empty() { String::new() } else { format!(" \"{}\"", key.label) };
                out!("  {} {role}{label}: {} ({expiry})", key.public_key, names.join(","));
            }
            Ok(())
        }
        KeysAction::Create | KeysAction::Show => Err(Failure::Usage("create and show need no exchange".into())),
    }
}
