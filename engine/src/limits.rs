//! Every bound the engine enforces, in one place. Hitting one is a typed
//! rejection, never unbounded growth.

use crate::time::MS_PER_DAY;

/// Accounts the engine will open.
pub const ACCOUNTS_MAX: u32 = 1 << 22;
/// GPUs in one order (bids) or on one host (asks are a bit mask over a host).
pub const QUANTITY_MAX: u32 = 4096;
/// GPUs (or MIG slices) one host may register; asks address them as a `u64` mask.
pub const GPUS_PER_HOST_MAX: u32 = 64;
/// GPUs the whole exchange may register.
pub const GPUS_MAX: u32 = 1 << 22;
/// GPUs one account may register (its share of `GPUS_MAX`).
pub const GPUS_PER_ACCOUNT_MAX: u32 = 1 << 16;
/// GPUs one account may hold that never answered a hardware challenge
/// correctly (in a listing that challenges their classes): one full host.
/// More register as earlier ones pass, so fake GPUs cost a real one each
/// past this.
pub const GPUS_UNPROVEN_PER_ACCOUNT_MAX: u32 = GPUS_PER_HOST_MAX;
const _: () = assert!(GPUS_UNPROVEN_PER_ACCOUNT_MAX <= GPUS_PER_ACCOUNT_MAX && GPUS_PER_ACCOUNT_MAX * 64 <= GPUS_MAX);
/// Live orders across all books (the order slab's capacity bound).
pub const ORDERS_LIVE_MAX: u32 = 1 << 24;
/// How long a closed order's client id stays taken (docs/market-rules.md
/// "Client order ids"): a day of the exchange's clock.
pub const CLOSED_CLIENT_ORDER_ID_MS: u64 = MS_PER_DAY;
/// Closed orders' client ids remembered at most, exchange-wide. When it is
/// full, the account that remembers the most forgets its oldest: an account
/// loses ids inside the window only once every account with ids remembers
/// at least as many as it does.
pub const CLOSED_CLIENT_ORDER_IDS_MAX: usize = 1 << 20;
/// Closed orders' client ids one account keeps at most (its own oldest is
/// forgotten first, inside the window too).
pub const CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX: usize = 1 << 17;
const _: () = assert!(CLOSED_CLIENT_ORDER_IDS_PER_ACCOUNT_MAX * 8 <= CLOSED_CLIENT_ORDER_IDS_MAX, "no one account fills the table");
/// Default bound on one account's open orders (configurable per engine).
pub const ORDERS_PER_ACCOUNT_MAX_DEFAULT: u32 = 10_000;
/// The most a listing may set `orders_per_account_max` to: 1/256 of the
/// live orders every account shares, so filling the table takes 256
/// accounts with funds or GPUs behind every order.
pub const ORDERS_PER_ACCOUNT_LISTED_MAX: u32 = ORDERS_LIVE_MAX / 256;
const _: () = assert!(ORDERS_PER_ACCOUNT_MAX_DEFAULT <= ORDERS_PER_ACCOUNT_LISTED_MAX);
/// Longest spot/preemptible minimum duration a bid may ask for.
pub const DURATION_HOURS_MAX: u32 = 24 * 90;
/// Future reserved-window commitments (offered or sold) one GPU may carry.
pub const COMMITMENTS_PER_GPU_MAX: usize = 64;
/// Bytes in a host name, GPU UUID, model name or MIG profile.
pub const NAME_BYTES_MAX: usize = 128;
/// Classes in one engine (a GPU's qualifying classes are a `u64` mask).
pub const CLASSES_MAX: usize = 64;
/// Steps of a class's SLA credit schedule.
pub const SLA_TIERS_MAX: usize = 8;
/// The largest single deposit, so that balances stay far from `u64::MAX`.
pub const DEPOSIT_MINOR_MAX: u64 = 1 << 52;
/// The highest usage fee the exchange may charge (20%).
pub const FEE_BPS_MAX: u32 = 2_000;
/// The longest billing grace after a lease's end (one day).
pub const BILLING_GRACE_MS_MAX: u64 = MS_PER_DAY;
/// The longest late-report window after a lease's billing grace (a week):
/// how long a provisional bill waits for reports before it is final.
pub const LATE_REPORT_WINDOW_MS_MAX: u64 = 7 * MS_PER_DAY;
/// The exchange's and the simulator's late-report window unless told
/// otherwise (a day).
pub const LATE_REPORT_WINDOW_MS_DEFAULT: u64 = MS_PER_DAY;
/// Unreported time per GPU a lease may end with and still be billed final at
/// its grace (an agent reports an ended lease up to its end, so this only
/// absorbs rounding): beyond it the bill is provisional, and final once the
/// late reports leave no more than this (docs/market-rules.md "Late
/// reports").
pub const UNREPORTED_ALLOWANCE_MS_PER_GPU: u64 = 1_000;

/// The matrix sides a class's hardware challenge may ask for: a power of
/// two from 16 (the product fills one 256-word Merkle leaf) to 16 384 (a
/// GPU holds the two matrices, the f32 product and its words: 4 GiB; the
/// exchange's check is 128 dot products of length `n`, drawn from the seed).
pub const CHALLENGE_N_MIN: u32 = 16;
pub const CHALLENGE_N_MAX: u32 = 16_384;

/// A memory challenge's buffer is `2^words_log2` 32-bit words: at least one
/// leaf (256 words), at most 2^32 words (16 GiB, twice that on the GPU for
/// the passes' two buffers).
pub const MEMORY_WORDS_LOG2_MIN: u32 = 8;
pub const MEMORY_WORDS_LOG2_MAX: u32 = 32;
/// The most passes a memory challenge may ask for: the exchange recomputes
/// each checked word from the `2^passes` initial words it depends on.
pub const MEMORY_PASSES_MAX: u32 = 12;

/// Resting all-or-none bids one sweep re-checks, best first, after an ask
/// rests in their book (and at every tick): each check walks the crossing
/// asks, so the sweep's cost is bounded whatever the book holds.
pub const ALL_OR_NONE_SWEEP_MAX: usize = 32;
/// Armed stop orders across all books (each account is also bound by its
/// open-order limit, which counts them).
pub const STOPS_ARMED_MAX: usize = 1 << 20;
/// Armed stop orders one account may hold (its share of `STOPS_ARMED_MAX`;
/// each also holds the funds or GPUs of the order it would become).
pub const STOPS_ARMED_PER_ACCOUNT_MAX: u32 = 4_096;
const _: () = assert!(STOPS_ARMED_PER_ACCOUNT_MAX as usize * 256 <= STOPS_ARMED_MAX, "filling the stops table takes 256 funded accounts");

/// The share rules this build applies (`Command::SetShareRules`).
pub const SHARE_RULES: u32 = 1;
/// Open orders one participant (an account and its sub-accounts) may hold
/// together, from share rules 1: 1/256 of the live orders every account
/// shares. Each account of it is also within the listing's
/// `orders_per_account_max`.
pub const ORDERS_PER_PARTICIPANT_MAX: u32 = ORDERS_LIVE_MAX / 256;
/// Armed stops one participant may hold together (from share rules 1):
/// what one account may.
pub const STOPS_ARMED_PER_PARTICIPANT_MAX: u32 = STOPS_ARMED_PER_ACCOUNT_MAX;
/// GPUs one participant may register together (from share rules 1): what
/// one account may, so filling the GPU table takes 64 participants.
pub const GPUS_PER_PARTICIPANT_MAX: u32 = GPUS_PER_ACCOUNT_MAX;
/// Unproven GPUs one participant may hold together (from share rules 1):
/// one full host, what one account may.
pub const GPUS_UNPROVEN_PER_PARTICIPANT_MAX: u32 = GPUS_UNPROVEN_PER_ACCOUNT_MAX;
const _: () = assert!(ORDERS_PER_ACCOUNT_LISTED_MAX <= ORDERS_PER_PARTICIPANT_MAX);

/// Sub-accounts one account may open.
pub const SUB_ACCOUNTS_PER_ACCOUNT_MAX: usize = 1_000;

/// Regions a listing may name (a bid's region set is a 32-bit mask).
pub const REGIONS_MAX: usize = 32;

// Each mask has a bit for every item its bound allows: a host's GPUs
// (`GpuSet::gpu_mask`, a `u64`), a GPU's classes (`classes_mask`, a `u64`),
// a bid's regions (`Order::regions`, a `u32`). Raising a bound past its
// mask's width fails to compile instead of aliasing bits.
const _: () = assert!(GPUS_PER_HOST_MAX <= u64::BITS);
const _: () = assert!(CLASSES_MAX <= u64::BITS as usize);
const _: () = assert!(REGIONS_MAX <= u32::BITS as usize);
/// Bytes of a region or zone name.
pub const REGION_NAME_BYTES_MAX: usize = 32;

/// Weekly reserved windows a class may list ahead (half a year).
pub const WEEKLY_WINDOWS_AHEAD_MAX: u32 = 26;
/// Monthly reserved windows a class may list ahead (half a year).
pub const MONTHLY_WINDOWS_AHEAD_MAX: u32 = 6;

/// Hosts in one cluster bid.
pub const CLUSTER_NODES_MAX: u32 = 64;

/// The most bandwidth a host may declare on its fabric, Gb/s.
pub const FABRIC_GBPS_MAX: u32 = 100_000;
/// An interconnect probe bears a fabric claim out when it measures at
/// least this share of the claimed bandwidth: the agents' probe is TCP over
/// the fabric's IP addresses, a lower bound of what RDMA collectives reach
/// (docs/market-rules.md "Interconnect probe").
pub const FABRIC_PROBE_MIN_PERCENT: u64 = 25;
