//! Client order ids, per account: the open orders by client id and the ids
//! of orders that closed lately (docs/market-rules.md "Client order ids").
//!
//! One table per account, indexed by account id, each one hash map from a
//! client id to what holds it: placing an order asks one small map of its
//! own account instead of a B-tree of every open order of the exchange, and
//! a close updates one entry in place (the engine's profile spent about a
//! third of the mixed flow on the two ordered maps this replaces). A hash
//! map is never iterated where its order could reach the state: the orders
//! of a mass cancel are sorted by slot, the encoding and the state hash sort.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::ids::{AccountId, OrderId};
use crate::limits;
use crate::state_hash::StateHasher;

/// What holds one of an account's client ids: an open order, a close within
/// the window, or both (an id reused after its window, before its old close
/// was forgotten).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Holder {
    open: Option<OrderId>,
    /// When the id's last remembered close happened.
    closed_at_ms: Option<u64>,
}

#[derive(Clone, Default)]
struct AccountIds {
    ids: FxHashMap<u64, Holder>,
    /// `(closed at ms, client id)`, oldest first.
    closed: VecDeque<(u64, u64)>,
}

/// The bounds of the closed ids' memory (`limits` in the engine; small ones
/// in tests).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    /// How long a closed order's id stays taken.
    pub window_ms: u64,
    /// Closed ids one account remembers at most.
    pub per_account: usize,
    /// Closed ids remembered in all: when full, the account that remembers
    /// the most forgets its oldest, so nobody's closes shorten the memory of
    /// an account that closes fewer.
    pub total: usize,
}

impl Bounds {
    pub(crate) const ENGINE: Bounds = Bounds {
        window_ms: limits::CLOSED_CLIENT_ORDER_ID_MS,
        per_account: limits::CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX,
        total: limits::CLOSED_CLIENT_ORDER_IDS_MAX,
    };
}

/// Every account's client order ids.
///
/// Encoded as the two maps the engine carried before 2026-12-06, one after
/// the other: open orders by `(account, client id)`, then the closed ids by
/// account, oldest first (in bincode a pair is its two parts in a row, so
/// snapshot format 2 reads and writes unchanged). The rest is rebuilt.
#[derive(Clone)]
pub(crate) struct ClientIds {
    /// By account id; accounts that never placed an order may be missing.
    accounts: Vec<AccountIds>,
    /// Closed ids remembered in all.
    closed_len: usize,
    /// `(closed ids remembered, account)`, kept only while the memory is
    /// more than half full (built when it gets there, dropped under a
    /// quarter): what finds the account that remembers the most once it is
    /// full, without two B-tree writes on every close before that.
    by_size: Option<BTreeSet<(usize, AccountId)>>,
    bounds: Bounds,
}

impl ClientIds {
    pub(crate) fn new(bounds: Bounds) -> ClientIds {
        ClientIds { accounts: Vec::new(), closed_len: 0, by_size: None, bounds }
    }

    fn account(&self, account: AccountId) -> Option<&AccountIds> {
        self.accounts.get(account.0 as usize)
    }

    fn account_mut(&mut self, account: AccountId) -> &mut AccountIds {
        let index = account.0 as usize;
        if index >= self.accounts.len() {
            self.accounts.resize_with(index + 1, AccountIds::default);
        }
        &mut self.accounts[index]
    }

    /// Whether the id is taken at `now_ms`: by an open order, or by one that
    /// closed within the window.
    pub(crate) fn taken(&self, now_ms: u64, account: AccountId, client_order_id: u64) -> bool {
        let Some(holder) = self.account(account).and_then(|ids| ids.ids.get(&client_order_id)) else { return false };
        holder.open.is_some() || holder.closed_at_ms.is_some_and(|at_ms| at_ms + self.bounds.window_ms > now_ms)
    }

    /// The open order that holds the id.
    #[cfg(test)]
    fn open_order(&self, account: AccountId, client_order_id: u64) -> Option<OrderId> {
        self.account(account)?.ids.get(&client_order_id)?.open
    }

    /// An order opened with the id.
    pub(crate) fn open(&mut self, account: AccountId, client_order_id: u64, order: OrderId) {
        self.account_mut(account).ids.entry(client_order_id).or_default().open = Some(order);
    }

    /// The account's open orders, in no particular order (sort before
    /// anything reaches the state).
    pub(crate) fn open_orders(&self, account: AccountId) -> impl Iterator<Item = OrderId> + '_ {
        self.account(account).into_iter().flat_map(|ids| ids.ids.values().filter_map(|holder| holder.open))
    }

    /// The order holding the id closed at `now_ms`: the id is remembered,
    /// forgetting the account's closes older than the window, its oldest
    /// beyond its own bound and, when the memory is full, the oldest of the
    /// account that remembers the most.
    pub(crate) fn close(&mut self, now_ms: u64, account: AccountId, client_order_id: u64) {
        let bounds = self.bounds;
        while let Some(&(at_ms, _)) = self.account(account).and_then(|ids| ids.closed.front()) {
            let expired = at_ms + bounds.window_ms <= now_ms;
            if !expired && self.remembered(account) < bounds.per_account {
                break;
            }
            self.forget_oldest(account);
        }
        if self.closed_len >= bounds.total {
            let by_size = self.by_size.as_ref().expect("a full memory keeps its sizes");
            let &(_, heaviest) = by_size.last().expect("a full memory has an account");
            self.forget_oldest(heaviest);
        }
        let size = self.remembered(account);
        let ids = self.account_mut(account);
        let holder = ids.ids.entry(client_order_id).or_default();
        holder.open = None;
        // A later close of the same id is the one remembered.
        holder.closed_at_ms = Some(now_ms);
        ids.closed.push_back((now_ms, client_order_id));
        self.closed_len += 1;
        self.resized(account, size, size + 1);
    }

    /// How many of the account's closed ids are remembered.
    fn remembered(&self, account: AccountId) -> usize {
        self.account(account).map_or(0, |ids| ids.closed.len())
    }

    fn forget_oldest(&mut self, account: AccountId) {
        let ids = self.account_mut(account);
        let (at_ms, old_id) = ids.closed.pop_front().expect("an account with remembered ids");
        let size = ids.closed.len();
        if let Some(holder) = ids.ids.get_mut(&old_id) {
            // A later close of the same id (after its window) stays.
            if holder.closed_at_ms == Some(at_ms) {
                holder.closed_at_ms = None;
            }
            if *holder == Holder::default() {
                ids.ids.remove(&old_id);
            }
        }
        self.closed_len -= 1;
        self.resized(account, size + 1, size);
    }

    /// Keeps `by_size` while the memory is more than half full.
    fn resized(&mut self, account: AccountId, from: usize, to: usize) {
        if self.closed_len < self.bounds.total / 4 {
            self.by_size = None;
        }
        match &mut self.by_size {
            Some(by_size) => {
                by_size.remove(&(from, account));
                if to > 0 {
                    by_size.insert((to, account));
                }
            }
            None if self.closed_len > self.bounds.total / 2 => {
                let sizes = self.accounts.iter().enumerate().filter(|(_, ids)| !ids.closed.is_empty());
                self.by_size = Some(sizes.map(|(index, ids)| (ids.closed.len(), AccountId(index as u32))).collect());
            }
            None => {}
        }
    }

    /// Open orders by `(account, client id)`, in that order.
    fn open_by_key(&self) -> Vec<((AccountId, u64), OrderId)> {
        let mut open: Vec<_> = self
            .accounts
            .iter()
            .enumerate()
            .flat_map(|(index, ids)| {
                ids.ids
                    .iter()
                    .filter_map(move |(&client_order_id, holder)| Some(((AccountId(index as u32), client_order_id), holder.open?)))
            })
            .collect();
        open.sort_unstable();
        open
    }

    /// Accounts with closed ids, by account id.
    fn closed_by_account(&self) -> impl Iterator<Item = (AccountId, &VecDeque<(u64, u64)>)> {
        self.accounts
            .iter()
            .enumerate()
            .filter(|(_, ids)| !ids.closed.is_empty())
            .map(|(index, ids)| (AccountId(index as u32), &ids.closed))
    }

    /// Hashes the ids as the engine's state hash did when they were two
    /// ordered maps (the same state gives the same hash across the change).
    pub(crate) fn hash_into(&self, h: &mut StateHasher) {
        h.bytes(format!("{:?}", self.open_by_key()).as_bytes());
        h.u64(self.closed_len as u64);
        for (account, closed) in self.closed_by_account() {
            h.u64(u64::from(account.0));
            h.u64(closed.len() as u64);
            for (at_ms, client_order_id) in closed {
                h.u64(*at_ms);
                h.u64(*client_order_id);
            }
        }
    }

    fn from_parts(open: Vec<((AccountId, u64), OrderId)>, closed: BTreeMap<AccountId, VecDeque<(u64, u64)>>, bounds: Bounds) -> ClientIds {
        let mut ids = ClientIds::new(bounds);
        for ((account, client_order_id), order) in open {
            ids.open(account, client_order_id, order);
        }
        for (account, closed) in closed {
            let table = ids.account_mut(account);
            // In order: a later close of an id is the one remembered.
            for &(at_ms, client_order_id) in &closed {
                table.ids.entry(client_order_id).or_default().closed_at_ms = Some(at_ms);
            }
            ids.closed_len += closed.len();
            ids.account_mut(account).closed = closed;
        }
        if ids.closed_len > bounds.total / 2 {
            let sizes = ids.closed_by_account().map(|(account, closed)| (closed.len(), account));
            ids.by_size = Some(sizes.collect());
        }
        ids
    }
}

impl Serialize for ClientIds {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let open: BTreeMap<(AccountId, u64), OrderId> = self.open_by_key().into_iter().collect();
        let closed: BTreeMap<AccountId, &VecDeque<(u64, u64)>> = self.closed_by_account().collect();
        (open, closed).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ClientIds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        type Parts = (BTreeMap<(AccountId, u64), OrderId>, BTreeMap<AccountId, VecDeque<(u64, u64)>>);
        let (open, closed) = Parts::deserialize(deserializer)?;
        Ok(ClientIds::from_parts(open.into_iter().collect(), closed, Bounds::ENGINE))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The rule as the engine wrote it before: an ordered map of open ids, a
    /// list of closes per account and a scan for the heaviest account.
    #[derive(Default)]
    struct Reference {
        open: BTreeMap<(AccountId, u64), OrderId>,
        closed: BTreeMap<AccountId, VecDeque<(u64, u64)>>,
    }

    impl Reference {
        fn taken(&self, bounds: Bounds, now_ms: u64, account: AccountId, id: u64) -> bool {
            let last_close = self.closed.get(&account).and_then(|closed| closed.iter().rev().find(|(_, i)| *i == id));
            self.open.contains_key(&(account, id)) || last_close.is_some_and(|(at_ms, _)| at_ms + bounds.window_ms > now_ms)
        }

        fn close(&mut self, bounds: Bounds, now_ms: u64, account: AccountId, id: u64) {
            self.open.remove(&(account, id));
            while let Some(&(at_ms, _)) = self.closed.get(&account).and_then(VecDeque::front) {
                if at_ms + bounds.window_ms > now_ms && self.closed[&account].len() < bounds.per_account {
                    break;
                }
                self.forget_oldest(account);
            }
            if self.closed.values().map(VecDeque::len).sum::<usize>() >= bounds.total {
                let heaviest = self.closed.iter().map(|(account, closed)| (closed.len(), *account)).max().expect("full");
                self.forget_oldest(heaviest.1);
            }
            self.closed.entry(account).or_default().push_back((now_ms, id));
        }

        fn forget_oldest(&mut self, account: AccountId) {
            let closed = self.closed.get_mut(&account).expect("remembers");
            closed.pop_front();
            if closed.is_empty() {
                self.closed.remove(&account);
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Open(u32, u64),
        Close(u32, u64),
        Wait(u64),
        Reload,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..5u32, 0..12u64).prop_map(|(a, i)| Op::Open(a, i)),
            4 => (0..5u32, 0..12u64).prop_map(|(a, i)| Op::Close(a, i)),
            2 => (0..40u64).prop_map(Op::Wait),
            1 => Just(Op::Reload),
        ]
    }

    proptest! {
        /// Opening, closing, waiting and a snapshot's round trip keep the
        /// same ids taken, the same closes remembered and the same hash as
        /// the reference, through full memories and expiring windows.
        #[test]
        fn the_tables_follow_the_reference(ops in proptest::collection::vec(op(), 1..300)) {
            let bounds = Bounds { window_ms: 100, per_account: 6, total: 12 };
            let mut ids = ClientIds::new(bounds);
            let mut reference = Reference::default();
            let mut now_ms = 0;
            let mut next_order = 1u64;
            for op in ops {
                match op {
                    Op::Open(account, id) => {
                        let account = AccountId(account);
                        // The engine opens only ids that are not taken.
                        if !reference.taken(bounds, now_ms, account, id) {
                            let order = OrderId(next_order);
                            next_order += 1;
                            ids.open(account, id, order);
                            reference.open.insert((account, id), order);
                        }
                    }
                    Op::Close(account, id) => {
                        let account = AccountId(account);
                        if reference.open.contains_key(&(account, id)) {
                            ids.close(now_ms, account, id);
                            reference.close(bounds, now_ms, account, id);
                        }
                    }
                    Op::Wait(ms) => now_ms += ms,
                    Op::Reload => {
                        let open = ids.open_by_key();
                        let closed = ids.closed_by_account().map(|(a, c)| (a, c.clone())).collect();
                        ids = ClientIds::from_parts(open, closed, bounds);
                    }
                }
                for account in 0..5 {
                    let account = AccountId(account);
                    for id in 0..12 {
                        prop_assert_eq!(ids.taken(now_ms, account, id), reference.taken(bounds, now_ms, account, id));
                        prop_assert_eq!(ids.open_order(account, id), reference.open.get(&(account, id)).copied());
                    }
                    let mut open: Vec<_> = ids.open_orders(account).collect();
                    open.sort();
                    let expected: Vec<_> = reference.open.range((account, 0)..=(account, u64::MAX)).map(|(_, o)| *o).collect();
                    let mut expected_sorted = expected.clone();
                    expected_sorted.sort();
                    prop_assert_eq!(open, expected_sorted);
                }
                let closed: BTreeMap<_, _> = ids.closed_by_account().map(|(a, c)| (a, c.clone())).collect();
                prop_assert_eq!(&closed, &reference.closed);
                prop_assert_eq!(ids.open_by_key(), reference.open.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
                prop_assert_eq!(ids.closed_len, reference.closed.values().map(VecDeque::len).sum::<usize>());
                prop_assert!(ids.closed_len <= bounds.total);
            }
        }
    }

    /// Snapshot format 2 reads and writes unchanged: the tables encode
    /// (with the record codec's bincode) as the two maps the engine's two
    /// fields were, and decode back to the same tables.
    #[test]
    fn the_encoding_is_the_two_maps_the_engine_carried_before() {
        let mut ids = ClientIds::new(Bounds::ENGINE);
        ids.open(AccountId(3), 9, OrderId(7));
        ids.open(AccountId(1), 4, OrderId(8));
        ids.close(50, AccountId(1), 4);
        ids.open(AccountId(1), 5, OrderId(9));
        let open = BTreeMap::from([((AccountId(1), 5u64), OrderId(9)), ((AccountId(3), 9), OrderId(7))]);
        let closed = BTreeMap::from([(AccountId(1), VecDeque::from([(50u64, 4u64)]))]);
        let mut before = encode(&open);
        before.extend(encode(&closed));
        assert_eq!(encode(&ids), before);
        let config = bincode::config::standard();
        let (decoded, _): (ClientIds, usize) = bincode::serde::decode_from_slice(&before, config).expect("decodes");
        assert_eq!(decoded.open_by_key(), ids.open_by_key());
        assert!(decoded.taken(60, AccountId(1), 4) && !decoded.taken(50 + Bounds::ENGINE.window_ms, AccountId(1), 4));
    }

    /// Issue 41: the table was one first-in-first-out list for all accounts,
    /// so one account's cheap closes pushed out a victim's ids and the
    /// victim's resend placed its order twice.
    #[test]
    fn closes_of_other_accounts_never_shorten_an_accounts_memory_of_its_client_ids() {
        let mut table = ClientIds::new(Bounds::ENGINE);
        let closed_at = |table: &ClientIds, account: AccountId, id: u64| table.account(account)?.ids.get(&id)?.closed_at_ms;
        let victim = AccountId(1);
        for id in 0..10 {
            table.close(0, victim, id);
        }
        // One account past its own bound forgets only its own oldest.
        let heavy = AccountId(2);
        let per_account = limits::CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX as u64;
        for id in 0..per_account + 5 {
            table.close(1, heavy, id);
        }
        assert_eq!(table.remembered(heavy), limits::CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX);
        assert_eq!(closed_at(&table, heavy, 4), None);
        assert_eq!(closed_at(&table, heavy, 5), Some(1));
        // Many accounts fill the whole table and go on closing: the fullest
        // forget first, the victim keeps every id.
        let attackers = limits::CLOSED_CLIENT_ORDER_IDS_MAX / limits::CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX + 2;
        for attacker in 3..3 + attackers as u32 {
            for id in 0..per_account {
                table.close(2, AccountId(attacker), id);
            }
        }
        assert_eq!(table.closed_len, limits::CLOSED_CLIENT_ORDER_IDS_MAX);
        let holders = table.accounts.iter().flat_map(|ids| ids.ids.values()).filter(|h| h.closed_at_ms.is_some()).count();
        assert_eq!(holders, table.closed_len);
        for id in 0..10 {
            assert_eq!(closed_at(&table, victim, id), Some(0), "the victim's id {id} is remembered");
        }
        // The window still frees ids, the account's own first.
        table.close(limits::CLOSED_CLIENT_ORDER_ID_MS, victim, 10);
        assert_eq!((closed_at(&table, victim, 0), closed_at(&table, victim, 10)), (None, Some(limits::CLOSED_CLIENT_ORDER_ID_MS)));
        // Encoded as the per-account lists; decoded, the holders and sizes are rebuilt.
        let (decoded, _): (ClientIds, usize) =
            bincode::serde::decode_from_slice(&encode(&table), bincode::config::standard()).expect("decodes");
        assert_eq!(decoded.closed_len, table.closed_len);
        let sizes = |table: &ClientIds| table.by_size.as_ref().expect("a full table keeps its sizes").clone();
        assert_eq!(sizes(&decoded), sizes(&table));
        assert_eq!(sizes(&decoded).last().map(|(_, account)| *account), Some(AccountId(2 + attackers as u32)));
    }

    fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        bincode::serde::encode_to_vec(value, bincode::config::standard()).expect("encodes")
    }
}
