//! Invitations: how an exchange that does not let any key open an account
//! (`--account-opening invite`) lets a new user in. An operator signs, with
//! an operator key the exchange knows, the new user's public key, the role
//! its account gets and when the invitation expires; the user sends it with
//! its first login (`auth.invite`). It is bound to that one key, so it opens
//! one account at most and is worthless to anyone else; it needs no state in
//! the exchange (docs/operations.md "Opening accounts").
//!
//! On the wire: `gpux-invite-v1.<role>.<expires_at_ms>.<operator key hex>.<signature hex>`,
//! the signature over `gpux-invite-v1:` | the user's key (32 bytes) |
//! the role's name | `:` | expires_at_ms (8 bytes little-endian).

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use gpux_engine::Role;

const PREFIX: &str = "gpux-invite-v1";

/// Why an invitation does not open an account.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InviteError {
    #[error("not an invitation: expected gpux-invite-v1.<role>.<expires_at_ms>.<operator key>.<signature>")]
    Malformed,
    #[error("the invitation is not signed by one of this exchange's operator keys")]
    UnknownOperator,
    #[error("the invitation's signature does not verify for this key and role")]
    BadSignature,
    #[error("the invitation has expired")]
    Expired,
    #[error("the invitation is for another role")]
    WrongRole,
}

/// A parsed invitation (not yet verified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invite {
    pub role: Role,
    pub expires_at_ms: u64,
    pub operator_key: [u8; 32],
    pub signature: [u8; 64],
}

fn signed_bytes(user_key: &[u8; 32], role: Role, expires_at_ms: u64) -> Vec<u8> {
    let mut bytes = format!("{PREFIX}:").into_bytes();
    bytes.extend_from_slice(user_key);
    bytes.extend_from_slice(role.name().as_bytes());
    bytes.push(b':');
    bytes.extend_from_slice(&expires_at_ms.to_le_bytes());
    bytes
}

impl Invite {
    /// An operator's invitation of `user_key` to open a `role` account
    /// until `expires_at_ms`.
    pub fn sign(operator: &SigningKey, user_key: &[u8; 32], role: Role, expires_at_ms: u64) -> Invite {
        let signature = operator.sign(&signed_bytes(user_key, role, expires_at_ms)).to_bytes();
        Invite { role, expires_at_ms, operator_key: operator.verifying_key().to_bytes(), signature }
    }

    pub fn encode(&self) -> String {
        format!("{PREFIX}.{}.{}.{}.{}", self.role.name(), self.expires_at_ms, hex::encode(self.operator_key), hex::encode(self.signature))
    }

    pub fn parse(text: &str) -> Result<Invite, InviteError> {
        let mut parts = text.trim().split('.');
        let mut next = || parts.next().ok_or(InviteError::Malformed);
        if next()? != PREFIX {
            return Err(InviteError::Malformed);
        }
        let role = match next()? {
            "renter" => Role::Renter,
            "supplier" => Role::Supplier,
            "aggregator" => Role::Aggregator,
            // Operator accounts open from `--operator-key` only.
            _ => return Err(InviteError::Malformed),
        };
        let expires_at_ms = next()?.parse().map_err(|_| InviteError::Malformed)?;
        let mut operator_key = [0u8; 32];
        hex::decode_to_slice(next()?, &mut operator_key).map_err(|_| InviteError::Malformed)?;
        let mut signature = [0u8; 64];
        hex::decode_to_slice(next()?, &mut signature).map_err(|_| InviteError::Malformed)?;
        if parts.next().is_some() {
            return Err(InviteError::Malformed);
        }
        Ok(Invite { role, expires_at_ms, operator_key, signature })
    }

    /// Whether it lets `user_key` open a `role` account at `now_ms`,
    /// signed by one of `operator_keys`.
    pub fn admits(&self, user_key: &[u8; 32], role: Role, now_ms: u64, operator_keys: &[[u8; 32]]) -> Result<(), InviteError> {
        if !operator_keys.contains(&self.operator_key) {
            return Err(InviteError::UnknownOperator);
        }
        let key = VerifyingKey::from_bytes(&self.operator_key).map_err(|_| InviteError::UnknownOperator)?;
        key.verify(&signed_bytes(user_key, self.role, self.expires_at_ms), &Signature::from_bytes(&self.signature))
            .map_err(|_| InviteError::BadSignature)?;
        if self.role != role {
            return Err(InviteError::WrongRole);
        }
        if now_ms >= self.expires_at_ms {
            return Err(InviteError::Expired);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_invitation_admits_only_its_key_its_role_before_it_expires_and_from_a_known_operator() {
        let operator = SigningKey::from_bytes(&[7; 32]);
        let operators = [operator.verifying_key().to_bytes()];
        let user = [1u8; 32];
        let invite = Invite::sign(&operator, &user, Role::Supplier, 1_000);
        let parsed = Invite::parse(&invite.encode()).expect("parses");
        assert_eq!(parsed, invite);
        assert_eq!(parsed.admits(&user, Role::Supplier, 999, &operators), Ok(()));
        assert_eq!(parsed.admits(&user, Role::Supplier, 1_000, &operators), Err(InviteError::Expired));
        assert_eq!(parsed.admits(&[2; 32], Role::Supplier, 0, &operators), Err(InviteError::BadSignature));
        assert_eq!(parsed.admits(&user, Role::Renter, 0, &operators), Err(InviteError::WrongRole));
        assert_eq!(parsed.admits(&user, Role::Supplier, 0, &[[9; 32]]), Err(InviteError::UnknownOperator));
        let mut forged = parsed.clone();
        forged.expires_at_ms = u64::MAX;
        assert_eq!(forged.admits(&user, Role::Supplier, 0, &operators), Err(InviteError::BadSignature));
        for text in ["", "gpux-invite-v1", "gpux-invite-v1.operator.1.aa.bb", &format!("{}.x", invite.encode()), "x.renter.1.00.00"] {
            assert_eq!(Invite::parse(text), Err(InviteError::Malformed), "{text:?}");
        }
    }
}
