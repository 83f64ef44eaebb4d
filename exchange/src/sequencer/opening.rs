//! What opening an account costs (docs/operations.md "Opening accounts"):
//! the operator chooses whether any key may open one (at a bounded rate
//! from one address) or only a key an operator invited, and how many
//! accounts the exchange holds at most. A refusal names its cause
//! (`too_many_accounts`, `invite_required`, `invite_invalid`,
//! `rate_limited`), never a bare `auth_failed`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use gpux_engine::Role;
use gpux_protocol::invite::Invite;
use gpux_protocol::ErrorCode;

pub use crate::limits::ACCOUNTS_PER_ADDRESS_HOUR_DEFAULT;
pub use crate::limits::OPENING_ADDRESSES_MAX;
use gpux_engine::time::MS_PER_HOUR as HOUR_MS;

/// Who may open an account with a first login.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OpeningMode {
    /// Any key, at `per_address_hour` accounts per hour from one address
    /// (an IPv4 address, IPv4-mapped read as IPv4, or an IPv6 /64, and an
    /// IPv6 /48 at `PREFIX48_SHARES` times that; loopback is not counted).
    #[default]
    Open,
    /// Only a key with an operator's invitation for it (`gpux invite`).
    Invite,
}

#[derive(Clone, Copy, Debug)]
pub struct AccountOpening {
    pub mode: OpeningMode,
    /// Accounts the exchange holds at most (first logins past it are
    /// refused `too_many_accounts`); at most `limits::ACCOUNTS_MAX`.
    pub accounts_max: u32,
    pub per_address_hour: u32,
}

impl Default for AccountOpening {
    fn default() -> Self {
        AccountOpening {
            mode: OpeningMode::Open,
            accounts_max: gpux_engine::limits::ACCOUNTS_MAX,
            per_address_hour: ACCOUNTS_PER_ADDRESS_HOUR_DEFAULT,
        }
    }
}

/// The counts of accounts opened per address in the current hour.
#[derive(Default)]
pub(super) struct Openings {
    pub policy: AccountOpening,
    /// Address (IPv4, or an IPv6 /64 prefix) -> (hour it began, opened).
    by_address: BTreeMap<u128, (u64, u32)>,
    /// The same, by when each one's hour began (oldest first).
    by_age: std::collections::BTreeSet<(u64, u128)>,
}

/// A /48 of IPv6 (what one site is usually given: 65 536 /64s) opens at
/// most this many times an address's share an hour, so one site cannot
/// fill the table of addresses with its /64s.
pub const PREFIX48_SHARES: u32 = 8;

/// The counters a first login from `address` counts against: its address
/// (an IPv4 address, IPv4-mapped IPv6 read as the IPv4 address it is; an
/// IPv6 /64), and for IPv6 its /48 too.
fn address_keys(address: IpAddr) -> (u128, Option<u128>) {
    match address.to_canonical() {
        IpAddr::V4(v4) => (u32::from(v4) as u128, None),
        // One /64 is what a single host or customer is usually given.
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            ((bits & !((1u128 << 64) - 1)) | 1 << 32, Some((bits & !((1u128 << 80) - 1)) | 2 << 32))
        }
    }
}

/// A first login: a key with no account, the role it asks for, and what
/// it brings.
#[derive(Clone, Copy)]
pub(super) struct FirstLogin<'a> {
    pub public_key: &'a [u8; 32],
    pub role: Role,
    pub invite: Option<&'a str>,
    pub address: Option<IpAddr>,
}

/// Why a first login opens no account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub code: ErrorCode,
    /// The metric label (`gpux_auth_failures_total{reason}`).
    pub reason: &'static str,
}

impl Openings {
    /// Whether `first.public_key` may open a `first.role` account now
    /// (the exchange holds `accounts`); counts the opening against its
    /// address when it may.
    pub fn admit(&mut self, first: FirstLogin<'_>, accounts: u32, operator_keys: &[[u8; 32]], now_ms: u64) -> Result<(), Refused> {
        let FirstLogin { public_key, role, invite, address } = first;
        if accounts >= self.policy.accounts_max.min(gpux_engine::limits::ACCOUNTS_MAX) {
            return Err(Refused { code: ErrorCode::TooManyAccounts, reason: "too_many_accounts" });
        }
        if let Some(text) = invite {
            // An invitation is checked wherever it is sent, so a bad one
            // is never silently ignored.
            let invite = Invite::parse(text).map_err(|_| Refused { code: ErrorCode::InviteInvalid, reason: "invite_invalid" })?;
            invite
                .admits(public_key, role, now_ms, operator_keys)
                .map_err(|_| Refused { code: ErrorCode::InviteInvalid, reason: "invite_invalid" })?;
            return Ok(());
        }
        if self.policy.mode == OpeningMode::Invite {
            return Err(Refused { code: ErrorCode::InviteRequired, reason: "invite_required" });
        }
        // The exchange's own host (its simulated market, load tests, a
        // gateway's own checks) is not counted.
        let Some(address) = address.map(|address| address.to_canonical()).filter(|address| !address.is_loopback()) else {
            return Ok(());
        };
        let limited = Refused { code: ErrorCode::RateLimited, reason: "accounts_per_address" };
        let (key, site) = address_keys(address);
        let share = self.policy.per_address_hour;
        let counters = [Some((key, share)), site.map(|site| (site, share.saturating_mul(PREFIX48_SHARES)))];
        let new = counters.iter().flatten().filter(|(key, _)| !self.by_address.contains_key(key)).count();
        // A full table forgets the addresses counted longest ago first
        // (their hour is the nearest to its end), so a new user is never
        // locked out; one site's /64s are bounded by its /48 meanwhile.
        while new > 0 && self.by_address.len() + new > OPENING_ADDRESSES_MAX {
            let Some((_, oldest)) = self.by_age.pop_first() else { break };
            self.by_address.remove(&oldest);
        }
        // Checked first, counted after: a refused login adds nothing to the table.
        let opened_now = |entry: Option<&(u64, u32)>| entry.filter(|(since_ms, _)| since_ms + HOUR_MS > now_ms).map_or(0, |(_, n)| *n);
        if counters.iter().flatten().any(|&(key, allowed)| opened_now(self.by_address.get(&key)) >= allowed) {
            return Err(limited);
        }
        for &(key, _) in counters.iter().flatten() {
            let (since_ms, opened) = self.by_address.entry(key).or_insert((now_ms, 0));
            if *since_ms + HOUR_MS <= now_ms {
                self.by_age.remove(&(*since_ms, key));
                (*since_ms, *opened) = (now_ms, 0);
            }
            self.by_age.insert((*since_ms, key));
            *opened += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;

    fn openings(mode: OpeningMode, accounts_max: u32, per_address_hour: u32) -> Openings {
        Openings { policy: AccountOpening { mode, accounts_max, per_address_hour }, ..Default::default() }
    }

    #[test]
    fn one_address_opens_its_share_per_hour_and_others_are_not_held_up() {
        let mut o = openings(OpeningMode::Open, 1_000, 3);
        let attacker = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..3 {
            assert_eq!(
                o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: attacker }, 5, &[], 0),
                Ok(())
            );
        }
        assert_eq!(
            o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: attacker }, 5, &[], 1)
                .map_err(|r| r.code),
            Err(ErrorCode::RateLimited)
        );
        // An IPv6 /64 is one address.
        let v6 = |last: u16| Some(IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]));
        for last in 0..3 {
            assert_eq!(
                o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: v6(last) }, 5, &[], 0),
                Ok(())
            );
        }
        assert_eq!(
            o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: v6(9) }, 5, &[], 0).map_err(|r| r.code),
            Err(ErrorCode::RateLimited)
        );
        assert_eq!(
            o.admit(
                FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: Some(IpAddr::from([10, 0, 0, 2])) },
                5,
                &[],
                1
            ),
            Ok(())
        );
        assert_eq!(
            o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: attacker }, 5, &[], HOUR_MS),
            Ok(()),
            "an hour later"
        );
        assert_eq!(
            o.admit(FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: attacker }, 1_000, &[], HOUR_MS)
                .map_err(|r| r.code),
            Err(ErrorCode::TooManyAccounts)
        );
        for _ in 0..10 {
            assert_eq!(
                o.admit(
                    FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: Some(IpAddr::from([127, 0, 0, 1])) },
                    5,
                    &[],
                    0
                ),
                Ok(()),
                "loopback"
            );
        }
    }

    /// An IPv4 client on a `[::]` listener arrives as `::ffff:a.b.c.d`: it
    /// counts as its IPv4 address, not in one /64 with every other IPv4
    /// client; and one IPv6 /48 (65 536 /64s) opens at most
    /// `PREFIX48_SHARES` addresses' shares an hour, so it cannot fill the
    /// table of addresses, while another site goes on opening.
    #[test]
    fn mapped_ipv4_counts_as_ipv4_and_a_48_holds_a_bounded_share() {
        let first = |address: IpAddr| FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: Some(address) };
        let mut o = openings(OpeningMode::Open, u32::MAX, 2);
        let mapped = |last: u8| IpAddr::from(std::net::Ipv4Addr::new(203, 0, 113, last).to_ipv6_mapped());
        for _ in 0..2 {
            assert_eq!(o.admit(first(mapped(1)), 0, &[], 0), Ok(()));
        }
        assert_eq!(o.admit(first(mapped(1)), 0, &[], 0).map_err(|r| r.code), Err(ErrorCode::RateLimited));
        assert_eq!(o.admit(first(mapped(2)), 0, &[], 0), Ok(()), "another IPv4 client has its own share");
        assert_eq!(
            o.admit(first(IpAddr::from([203, 0, 113, 1])), 0, &[], 0).map_err(|r| r.code),
            Err(ErrorCode::RateLimited),
            "the same address, however it arrives"
        );
        let mapped_loopback = IpAddr::from(std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped());
        for _ in 0..5 {
            assert_eq!(o.admit(first(mapped_loopback), 0, &[], 0), Ok(()), "loopback, mapped or not");
        }
        // One /48, a new /64 for every login: 2 x 8 = 16 accounts, then no more.
        let in_site = |n: u16| IpAddr::from([0x2001, 0xdb8, 0x77, n, 0, 0, 0, 1]);
        for n in 0..16 {
            assert_eq!(o.admit(first(in_site(n)), 0, &[], 0), Ok(()));
        }
        assert_eq!(o.admit(first(in_site(16)), 0, &[], 0).map_err(|r| r.code), Err(ErrorCode::RateLimited));
        for n in 17..1_000 {
            assert_eq!(o.admit(first(in_site(n)), 0, &[], 1).map_err(|r| r.code), Err(ErrorCode::RateLimited));
        }
        assert!(o.by_address.len() <= 20, "the site holds 17 entries of the table, refusals none: {}", o.by_address.len());
        assert_eq!(o.admit(first(IpAddr::from([0x2001, 0xdb8, 0x78, 0, 0, 0, 0, 1])), 0, &[], 0), Ok(()), "another site opens");
        assert_eq!(o.admit(first(in_site(16)), 0, &[], HOUR_MS), Ok(()), "an hour later");
    }

    /// Issue 61: a full table of addresses locked every new user out for
    /// the hour. It now forgets the addresses counted longest ago first:
    /// a newcomer always opens its account, and the table stays bounded.
    #[test]
    fn a_full_table_of_addresses_forgets_the_oldest_and_locks_no_newcomer_out() {
        let first = |address: IpAddr| FirstLogin { public_key: &[1; 32], role: Role::Renter, invite: None, address: Some(address) };
        let mut o = openings(OpeningMode::Open, u32::MAX, 1);
        let v4 = |n: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n));
        for n in 0..OPENING_ADDRESSES_MAX as u32 {
            assert_eq!(o.admit(first(v4(n)), 0, &[], n as u64), Ok(()));
        }
        assert_eq!(o.by_address.len(), OPENING_ADDRESSES_MAX);
        let newcomer = IpAddr::from([198, 51, 100, 7]);
        assert_eq!(o.admit(first(newcomer), 0, &[], 70_000), Ok(()), "not locked out");
        assert_eq!(o.by_address.len(), OPENING_ADDRESSES_MAX, "bounded");
        assert_eq!(o.admit(first(v4(0)), 0, &[], 70_001), Ok(()), "the address counted longest ago was forgotten");
        assert_eq!(o.admit(first(v4(5)), 0, &[], 70_002).map_err(|r| r.code), Err(ErrorCode::RateLimited), "a newer one is not");
        assert_eq!(o.by_age.len(), o.by_address.len(), "the index follows the table");
    }

    #[test]
    fn invitation_mode_opens_only_invited_keys() {
        let operator = SigningKey::from_bytes(&[3; 32]);
        let operators = [operator.verifying_key().to_bytes()];
        let mut o = openings(OpeningMode::Invite, 1_000, 0);
        let user = [4u8; 32];
        let invite = Invite::sign(&operator, &user, Role::Supplier, 10).encode();
        let code = |r: Result<(), Refused>| r.map_err(|r| r.code);
        assert_eq!(
            code(o.admit(FirstLogin { public_key: &user, role: Role::Supplier, invite: None, address: None }, 0, &operators, 0)),
            Err(ErrorCode::InviteRequired)
        );
        assert_eq!(
            code(o.admit(FirstLogin { public_key: &user, role: Role::Supplier, invite: Some(&invite), address: None }, 0, &operators, 0)),
            Ok(())
        );
        assert_eq!(
            code(o.admit(
                FirstLogin { public_key: &[5; 32], role: Role::Supplier, invite: Some(&invite), address: None },
                0,
                &operators,
                0
            )),
            Err(ErrorCode::InviteInvalid)
        );
        assert_eq!(
            code(o.admit(FirstLogin { public_key: &user, role: Role::Supplier, invite: Some(&invite), address: None }, 0, &operators, 10)),
            Err(ErrorCode::InviteInvalid)
        );
        assert_eq!(
            code(o.admit(
                FirstLogin { public_key: &user, role: Role::Supplier, invite: Some("nonsense"), address: None },
                0,
                &operators,
                0
            )),
            Err(ErrorCode::InviteInvalid)
        );
    }
}
