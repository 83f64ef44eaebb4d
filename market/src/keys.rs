//! API keys (docs/protocol.md "Keys and scopes"): the key each account was
//! opened with (its owner key: every scope, no expiry, never revoked), the
//! keys added to it since, each with scopes, an optional expiry and a
//! label, and the keys revoked (never bound again). Changed only by
//! journal entries (`BindKey`, `AddKey`, `AddKeyBy`, `RevokeKey`), so replay rebuilds
//! it; in snapshots.

use std::collections::{BTreeMap, BTreeSet};

use gpux_engine::{AccountId, Engine};
use gpux_protocol::access::{label_valid, KEYS_PER_ACCOUNT_MAX};
use gpux_protocol::{ErrorCode, KeyInfo, Scopes};
use serde::{Deserialize, Serialize};

/// A key added to an account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGrant {
    pub account: AccountId,
    pub scopes: Scopes,
    pub expires_at_ms: Option<u64>,
    pub label: String,
    pub added_at_ms: u64,
    /// The key that added it (journaled since keys keep their lineage): it
    /// is revoked with that key.
    #[serde(default)]
    pub added_by: Option<[u8; 32]>,
}

/// What a key may do as it logs in or sends a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyAccess {
    pub account: AccountId,
    pub scopes: Scopes,
    pub expires_at_ms: Option<u64>,
}

/// Why a key may not act.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyRefusal {
    Revoked,
    Expired,
}

#[derive(Clone, Default, Serialize, Deserialize)]
pub struct Keys {
    /// The account each key acts as.
    bound: BTreeMap<[u8; 32], AccountId>,
    /// Each account's first key: what its signatures (usage reports,
    /// encryption keys, liveness observations) verify against.
    identity: BTreeMap<AccountId, [u8; 32]>,
    /// Keys added to accounts (an owner key has no grant).
    grants: BTreeMap<[u8; 32], KeyGrant>,
    /// Each account's added keys.
    added: BTreeMap<AccountId, BTreeSet<[u8; 32]>>,
    revoked: BTreeSet<[u8; 32]>,
}

impl Keys {
    /// An account opened with its owner key (`BindKey`).
    pub(crate) fn bind(&mut self, public_key: [u8; 32], account: AccountId) {
        self.bound.insert(public_key, account);
        self.identity.entry(account).or_insert(public_key);
    }

    pub(crate) fn add(&mut self, public_key: [u8; 32], grant: KeyGrant) {
        let account = grant.account;
        self.bound.insert(public_key, account);
        self.identity.entry(account).or_insert(public_key);
        self.added.entry(account).or_default().insert(public_key);
        self.grants.insert(public_key, grant);
    }

    /// Revokes a key and every key it added, and theirs in turn.
    pub(crate) fn revoke(&mut self, public_key: [u8; 32]) {
        for key in self.lineage(&public_key) {
            if let Some(account) = self.bound.remove(&key) {
                if let Some(added) = self.added.get_mut(&account) {
                    added.remove(&key);
                }
            }
            self.grants.remove(&key);
            self.revoked.insert(key);
        }
    }

    /// A key and the keys it added, transitively (those still granted):
    /// what revoking it revokes.
    pub fn lineage(&self, public_key: &[u8; 32]) -> Vec<[u8; 32]> {
        let mut lineage = vec![*public_key];
        let mut next = 0;
        while next < lineage.len() {
            let parent = lineage[next];
            next += 1;
            let children = self.grants.iter().filter(|(key, grant)| grant.added_by == Some(parent) && !lineage.contains(*key));
            let children: Vec<[u8; 32]> = children.map(|(key, _)| *key).collect();
            lineage.extend(children);
        }
        lineage
    }

    /// An account's first key.
    pub fn identity(&self, account: AccountId) -> Option<[u8; 32]> {
        self.identity.get(&account).copied()
    }

    /// What a key may do at `now_ms`; `Ok(None)` for a key never bound.
    pub fn access(&self, public_key: &[u8; 32], now_ms: u64) -> Result<Option<KeyAccess>, KeyRefusal> {
        if self.revoked.contains(public_key) {
            return Err(KeyRefusal::Revoked);
        }
        let Some(&account) = self.bound.get(public_key) else { return Ok(None) };
        match self.grants.get(public_key) {
            None => Ok(Some(KeyAccess { account, scopes: Scopes::ALL, expires_at_ms: None })),
            Some(grant) if grant.expires_at_ms.is_some_and(|at| at <= now_ms) => Err(KeyRefusal::Expired),
            Some(grant) => Ok(Some(KeyAccess { account, scopes: grant.scopes, expires_at_ms: grant.expires_at_ms })),
        }
    }

    /// The checks of `add_key` that need the market (the gateway checked
    /// the key is an ed25519 point; the sequencer that the adding key holds
    /// the scopes granted).
    pub fn check_add(
        &self,
        engine: &Engine,
        by: AccountId,
        account: AccountId,
        public_key: &[u8; 32],
        grant: (&Scopes, Option<u64>, &str),
        now_ms: u64,
    ) -> Result<(), ErrorCode> {
        let (scopes, expires_at_ms, label) = grant;
        if account != by && engine.parent_of(account) != Some(by) {
            return Err(ErrorCode::NotYourSubAccount);
        }
        if scopes.is_empty() || !label_valid(label) || expires_at_ms.is_some_and(|at| at <= now_ms) {
            return Err(ErrorCode::KeyInvalid);
        }
        if self.bound.contains_key(public_key) || self.revoked.contains(public_key) {
            return Err(ErrorCode::KeyInUse);
        }
        if self.added.get(&account).is_some_and(|keys| keys.len() >= KEYS_PER_ACCOUNT_MAX) {
            return Err(ErrorCode::TooManyKeys);
        }
        Ok(())
    }

    /// The checks of `revoke_key`: a key of `by` or of one of its
    /// sub-accounts, and not an owner key.
    pub fn check_revoke(&self, engine: &Engine, by: AccountId, public_key: &[u8; 32]) -> Result<AccountId, ErrorCode> {
        let account = self.bound.get(public_key).copied().ok_or(ErrorCode::UnknownKey)?;
        if account != by && engine.parent_of(account) != Some(by) {
            return Err(ErrorCode::UnknownKey);
        }
        if !self.grants.contains_key(public_key) {
            return Err(ErrorCode::OwnerKey);
        }
        Ok(account)
    }

    /// An account's keys: its owner key (if it has one) first, then the
    /// added keys by public key.
    pub fn keys_of(&self, account: AccountId) -> Vec<KeyInfo> {
        let mut keys = Vec::new();
        if let Some(owner) = self.identity.get(&account).filter(|key| !self.grants.contains_key(*key) && self.bound.contains_key(*key)) {
            keys.push(KeyInfo {
                public_key: hex::encode(owner),
                account,
                scopes: Scopes::ALL,
                owner: true,
                expires_at_ms: None,
                label: String::new(),
                added_at_ms: None,
            });
        }
        for key in self.added.get(&account).into_iter().flatten() {
            if let Some(grant) = self.grants.get(key) {
                keys.push(KeyInfo {
                    public_key: hex::encode(key),
                    account,
                    scopes: grant.scopes,
                    owner: false,
                    expires_at_ms: grant.expires_at_ms,
                    label: grant.label.clone(),
                    added_at_ms: Some(grant.added_at_ms),
                });
            }
        }
        keys
    }
}
