//! Access: what an API key may do (its scopes), and a key as the `keys`
//! request lists it (docs/protocol.md "Keys and scopes").

use gpux_engine::AccountId;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One thing a key may do. Every request needs at most one scope; public
/// requests (instruments, stats, book data) need none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, strum::VariantNames, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Scope {
    /// Balances, statements, orders, leases, GPUs, sub-accounts, keys.
    Read,
    /// Place, replace and cancel orders.
    Trade,
    /// Use and supply leases: workloads, delivery, logs, ending a lease,
    /// GPUs, usage reports, challenges, liveness.
    Deliver,
    /// Move money out: withdrawals, payouts (and an operator's deposits).
    Withdraw,
    /// Sub-accounts (open, fund, limit) and keys (add, revoke).
    Manage,
}

impl Scope {
    pub const ALL: [Scope; 5] = [Scope::Read, Scope::Trade, Scope::Deliver, Scope::Withdraw, Scope::Manage];

    fn bit(self) -> u8 {
        1 << self as u8
    }

    /// The scope's name as the wire writes it (`trade`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// A set of scopes. On the wire (JSON and bincode alike) a list of scope
/// names in a fixed order, e.g. `["read","trade"]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    pub const NONE: Scopes = Scopes(0);
    /// What an account's owner key holds.
    pub const ALL: Scopes = Scopes(0b1_1111);

    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, scope| bits | scope.bit()))
    }
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }
    /// Every scope of `other` is in `self`.
    pub fn covers(self, other: Scopes) -> bool {
        other.0 & !self.0 == 0
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn list(self) -> Vec<Scope> {
        Scope::ALL.into_iter().filter(|scope| self.contains(*scope)).collect()
    }
}

impl Serialize for Scopes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.list().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Scopes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let scopes = Vec::<Scope>::deserialize(deserializer)?;
        if scopes.len() > Scope::ALL.len() * 2 {
            return Err(serde::de::Error::invalid_length(scopes.len(), &"at most ten scope names"));
        }
        Ok(Scopes::of(&scopes))
    }
}

/// Keys one account may hold besides its owner key.
pub const KEYS_PER_ACCOUNT_MAX: usize = 32;
/// A key's label, in bytes of printable ASCII.
pub const KEY_LABEL_BYTES_MAX: usize = 64;

/// One key of an account, as `keys` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyInfo {
    /// The ed25519 public key, 64 hex digits.
    pub public_key: String,
    /// The account it acts as (the parent's own, or one sub-account's).
    pub account: AccountId,
    pub scopes: Scopes,
    /// The account's first key: every scope, no expiry, never revoked.
    pub owner: bool,
    pub expires_at_ms: Option<u64>,
    pub label: String,
    /// When it was added (exchange time); `None` for an owner key.
    pub added_at_ms: Option<u64>,
}

/// Whether a label is one a key may carry: at most 64 bytes of printable
/// ASCII (spaces allowed), possibly empty.
pub fn label_valid(label: &str) -> bool {
    label.len() <= KEY_LABEL_BYTES_MAX && label.bytes().all(|b| (0x20..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_travel_as_names_in_json_and_in_records() {
        let scopes = Scopes::of(&[Scope::Trade, Scope::Read]);
        assert_eq!(serde_json::to_string(&scopes).expect("json"), r#"["read","trade"]"#);
        let back: Scopes = serde_json::from_str(r#"["trade","read","trade"]"#).expect("decodes");
        assert_eq!(back, scopes);
        let bytes = crate::encode_record(&scopes);
        assert_eq!(crate::decode_record::<Scopes>(&bytes).expect("decodes"), scopes);
        assert!(serde_json::from_str::<Scopes>(r#"["root"]"#).is_err(), "unknown scope names are refused");
    }

    #[test]
    fn covers_is_the_subset_relation() {
        let read_trade = Scopes::of(&[Scope::Read, Scope::Trade]);
        assert!(Scopes::ALL.covers(read_trade));
        assert!(read_trade.covers(Scopes::of(&[Scope::Read])));
        assert!(!read_trade.covers(Scopes::of(&[Scope::Withdraw])));
        assert!(read_trade.covers(Scopes::NONE));
        assert_eq!(Scopes::of(&Scope::ALL), Scopes::ALL);
    }
}
