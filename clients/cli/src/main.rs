//! `gpux`: the command-line client of the gpux exchange, built on the
//! documented protocol alone (docs/protocol.md) through `gpux-client`.
//!
//! Human output by default, `--json` for scripts (one JSON value per line:
//! the exchange's own messages). Exit codes: 0 done, 1 the exchange refused
//! (the code and message are printed), 2 a usage error, 3 the exchange could
//! not be reached or answered out of protocol. Every error says what to do.

/// Prints a line to stdout; a closed pipe (`gpux ... | head`) ends the
/// program quietly instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::write_line(format_args!($($arg)*))
    };
}

pub fn write_line(args: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if stdout.write_fmt(args).and_then(|()| stdout.write_all(b"\n")).and_then(|()| stdout.flush()).is_err() {
        std::process::exit(0);
    }
}

mod access;
mod book;
mod clock;
mod commands;
mod invoice;
mod job;
mod keys;
mod money;
mod run;
mod service;
mod session;
mod volume;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "gpux", version, about = "Trade GPU time on a gpux exchange from the terminal")]
pub struct Cli {
    /// The exchange's WebSocket address; for a cluster, every node's,
    /// comma-separated (the one that leads accepts).
    #[arg(long, global = true, env = "GPUX_URL", default_value = "ws://127.0.0.1:7300")]
    pub url: String,
    /// Your ed25519 key file (64 hex digits; `gpux keys create` makes one); default ~/.gpux/key.
    #[arg(long, global = true, env = "GPUX_KEY")]
    pub key: Option<PathBuf>,
    /// Print the exchange's answers as JSON, one per line.
    #[arg(long, global = true)]
    pub json: bool,
    /// Times in UTC instead of this machine's time zone.
    #[arg(long, global = true)]
    pub utc: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RoleArg {
    Renter,
    Supplier,
    Aggregator,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum TifArg {
    Gtc,
    Ioc,
    Fok,
}

#[derive(clap::Args, Debug)]
pub struct OrderArgs {
    /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id.
    pub instrument: String,
    /// GPUs (or reserved-window contracts).
    pub quantity: u32,
    /// Limit price in the exchange's currency per GPU-hour (e.g. 2.15); leave out for a market order.
    #[arg(long)]
    pub price: Option<String>,
    /// Lease length in hours, to the minute (1, 1.5, 0.25; spot and preemptible).
    #[arg(long, default_value = "1", conflicts_with = "until_cancelled")]
    pub hours: String,
    /// An open-ended lease, billed as used until you end it.
    #[arg(long)]
    pub until_cancelled: bool,
    #[arg(long, value_enum, default_value_t = TifArg::Gtc)]
    /// Time in force: gtc rests until cancelled, ioc trades what it can at once and cancels the rest, fok trades all at once or nothing.
    pub tif: TifArg,
    /// Expire a resting order after this many seconds (good-till-time).
    #[arg(long, conflicts_with = "tif")]
    pub expire_after_s: Option<u64>,
    /// Rest only: refused if it would trade at once.
    #[arg(long)]
    pub post_only: bool,
    /// Gang bid: all GPUs on one host, in one fill.
    #[arg(long)]
    pub one_host: bool,
    #[command(flatten)]
    pub filters: BidFilters,
    /// Your id for the order (default: the current time in ms).
    #[arg(long)]
    pub client_id: Option<u64>,
    /// What happens when the order would trade with one of your own (docs/market-rules.md "Self-trade prevention").
    #[arg(long, value_enum, default_value_t = StpArg::CancelNewest)]
    pub stp: StpArg,
    /// Bids: all GPUs in one fill from any hosts, or none; rests untraded until it can (docs/market-rules.md "All-or-none").
    #[arg(long)]
    pub all_or_none: bool,
    /// Bids: spend at most this much money (e.g. 500; in the exchange's currency, `gpux listing`), buying as many whole GPUs as it pays for within the limit; QUANTITY is then the most GPUs wanted (docs/market-rules.md "Budget orders").
    #[arg(long)]
    pub budget: Option<String>,
    /// A stop order: off the book until a trade prints at this price (money per GPU-hour) or beyond (bids: at or above; asks: at or below), then it enters as this order (docs/market-rules.md "Stop orders").
    #[arg(long)]
    pub stop: Option<String>,
    /// Bids: a cluster bid for this many hosts (2 to 64), QUANTITY / NODES GPUs on each, all on one supplier's fabric in one zone, all or none (docs/market-rules.md "Cluster bids").
    #[arg(long)]
    pub nodes: Option<u32>,
    /// Cluster bids: the least bandwidth each host declared on its fabric, Gb/s (default: any).
    #[arg(long, requires = "nodes")]
    pub min_fabric_gbps: Option<u32>,
}

impl OrderArgs {
    /// The first option given that only a bid takes, as typed.
    pub fn bid_only_flag(&self) -> Option<&'static str> {
        let f = &self.filters;
        [
            (self.one_host, "--one-host"),
            (f.rematch, "--rematch"),
            (f.min_score.is_some(), "--min-score"),
            (f.verified_only, "--verified-only"),
            (!f.regions.is_empty(), "--region"),
            (self.all_or_none, "--all-or-none"),
            (self.budget.is_some(), "--budget"),
            (self.nodes.is_some(), "--nodes"),
            (self.min_fabric_gbps.is_some(), "--min-fabric-gbps"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

/// What a bid asks of its sellers and of a host that fails it (`buy` and `run`).
#[derive(Args, Debug, Clone, Default)]
pub struct BidFilters {
    /// Spot bids: if a host fails a lease this bid fills, rent a replacement at no more than this bid's limit price (docs/market-rules.md "Re-match").
    #[arg(long)]
    pub rematch: bool,
    /// Bids: trade only with suppliers whose reliability score is at least this percent, e.g. 99.5 (see `gpux supplier`).
    #[arg(long)]
    pub min_score: Option<String>,
    /// Bids: trade only with GPUs whose hardware challenge verified them (docs/market-rules.md "Verified hardware").
    #[arg(long)]
    pub verified_only: bool,
    /// Bids: trade only with GPUs of hosts in these regions, e.g. --region cn-east,cn-west (`gpux listing` names them; docs/market-rules.md "Regions").
    #[arg(long = "region", value_delimiter = ',')]
    pub regions: Vec<String>,
}

impl BidFilters {
    /// Sets the filters on a bid.
    pub fn apply(&self, order: &mut gpux_protocol::OrderTicket) -> Result<(), Failure> {
        order.rematch = self.rematch;
        order.verified_only = self.verified_only;
        if let Some(percent) = &self.min_score {
            order.min_supplier_score_bps = commands::parse_percent_bps(percent).map_err(Failure::Usage)?;
        }
        order.regions = self.regions.clone();
        Ok(())
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Create or show your key.
    Keys {
        #[command(subcommand)]
        action: KeysAction,
    },
    /// Log in; with --role, open an account for a new key.
    Login {
        /// Open an account with this role for a key that has none (renters buy, suppliers list GPUs, aggregators do both).
        #[arg(long, value_enum)]
        role: Option<RoleArg>,
        /// An operator's invitation for this key and role (`gpux invite`),
        /// which an exchange that opens accounts by invitation needs.
        #[arg(long, requires = "role")]
        invite: Option<String>,
    },
    /// Operators: invite a new key to open an account (signed with your
    /// key, which must be one of the exchange's operator keys; needs no
    /// exchange). Prints the invitation for `gpux login --invite`.
    Invite {
        /// The new user's public key (64 hex digits: `gpux keys show`).
        public_key: String,
        /// The role the invited key's account opens with.
        #[arg(long, value_enum)]
        role: RoleArg,
        /// The invitation expires this many seconds from now (default a week).
        #[arg(long, default_value_t = 7 * 24 * 3600)]
        expires_in_s: u64,
    },
    /// Your account number alone (for scripts: `gpux deposit $(gpux account) 100`).
    Account,
    /// Available, held, payable and owed funds.
    Balance,
    /// Your ledger transfers, oldest first.
    Statement {
        /// Only transfers after this transfer id.
        #[arg(long)]
        after: Option<u64>,
    },
    /// Instruments and their state; --calendar lists reserved windows only.
    Instruments {
        /// Reserved-window instruments only (the calendar of future windows).
        #[arg(long)]
        calendar: bool,
    },
    /// A supplier's reliability score and record over the last 30 days, and its hosts' (public).
    Supplier {
        /// The supplier's account number.
        supplier: u32,
    },
    /// An account's signed liveness observations and the disputes they raised (public).
    Renter {
        /// The renter's account number.
        renter: u32,
    },
    /// Every ask in an instrument's book, best first, with its seller's score and verified GPUs (public).
    Asks {
        /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id (`gpux instruments`).
        instrument: String,
        /// Asks to show at most.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Every book's cheapest asks at once, filtered and sorted (public): the GPU you want across classes, contracts and regions (docs/protocol.md "Search").
    Search {
        /// Each GPU has at least this much memory, GB (as GPU makers label it: an H100 "80GB" card qualifies for 80).
        #[arg(long, default_value_t = 0)]
        min_memory_gb: u32,
        /// At least this many GPUs on one host.
        #[arg(long, default_value_t = 0)]
        gpus: u32,
        /// Only this vendor's GPUs.
        #[arg(long, value_parser = ["nvidia", "amd", "intel", "huawei", "cambricon", "iluvatar", "other"])]
        vendor: Option<String>,
        /// At most this price per GPU-hour (e.g. 1.50 or $1.50).
        #[arg(long)]
        max_price: Option<String>,
        /// Hosts in this region (repeat for several; `gpux listing` names them).
        #[arg(long = "region")]
        regions: Vec<String>,
        /// Sellers scored at least this percent (e.g. 99.5).
        #[arg(long)]
        min_score: Option<String>,
        /// Every GPU of the ask verified by its last hardware challenge.
        #[arg(long)]
        verified: bool,
        /// These contracts only (repeat for several).
        #[arg(long = "contract", value_parser = ["spot", "preemptible", "reserved", "resale"])]
        contracts: Vec<String>,
        /// Hosts on a declared fabric only (for cluster training).
        #[arg(long)]
        fabric: bool,
        /// Order by price per GPU-hour, per GB of GPU memory, or per TFLOPS its GPUs' challenges measured.
        #[arg(long, default_value = "price", value_parser = ["price", "gb", "tflops"])]
        sort: String,
        /// Offers to show at most.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Bid for GPU time.
    Buy(OrderArgs),
    /// Offer contracts you hold in a reserved window (GPU owners: see `offer`).
    // The bids' options are not shown here (and refused if given).
    #[command(
        mut_arg("one_host", |a| a.hide(true)),
        mut_arg("rematch", |a| a.hide(true)),
        mut_arg("min_score", |a| a.hide(true)),
        mut_arg("verified_only", |a| a.hide(true)),
        mut_arg("regions", |a| a.hide(true)),
        mut_arg("all_or_none", |a| a.hide(true)),
        mut_arg("budget", |a| a.hide(true)),
        mut_arg("nodes", |a| a.hide(true)),
        mut_arg("min_fabric_gbps", |a| a.hide(true))
    )]
    Sell(OrderArgs),
    /// Offer your registered GPUs (by index on the host) on an instrument.
    Offer {
        /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id (`gpux instruments`).
        instrument: String,
        /// Price in the exchange's currency per GPU-hour.
        #[arg(long)]
        price: String,
        /// Host id (see `gpux gpus`).
        #[arg(long)]
        host: u32,
        /// GPU indexes on the host, e.g. 0,1,2.
        #[arg(long, value_delimiter = ',', required = true)]
        gpus: Vec<u32>,
    },
    /// Cancel one order.
    Cancel {
        /// The order's id (`gpux orders`).
        order: u64,
    },
    /// Change an order's price and quantity.
    Replace {
        /// The order's id (`gpux orders`).
        order: u64,
        /// The new limit price per GPU-hour, in the exchange's currency (e.g. 2.15).
        #[arg(long)]
        price: String,
        /// The new quantity: GPUs (or contracts) still wanted.
        #[arg(long)]
        quantity: u32,
    },
    /// Cancel all your orders (or those in one instrument).
    CancelAll {
        /// Only the orders in this instrument (symbol or id).
        #[arg(long)]
        instrument: Option<String>,
    },
    /// Your open orders.
    Orders,
    /// Your leases, newest first.
    Leases,
    /// End one of your leases now.
    EndLease {
        /// The lease's id (`gpux leases`).
        lease: u64,
    },
    /// Follow your fills, leases and preemption notices as they happen;
    /// with --past, list your past fills instead, newest first.
    Fills {
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        seconds: Option<u64>,
        /// List past fills (from the exchange's history) and exit.
        #[arg(long)]
        past: bool,
        /// Past fills to show at most (with --past).
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// An instrument's past trades, newest first (public).
    Trades {
        /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id (`gpux instruments`).
        instrument: String,
        /// Trades to show at most.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// An instrument's price candles, oldest first (public).
    Candles {
        /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id (`gpux instruments`).
        instrument: String,
        /// Candle interval: 1m, 1h or 1d.
        #[arg(long, default_value = "1h", value_parser = ["1m", "1h", "1d"])]
        interval: String,
        /// The newest candles to show at most.
        #[arg(long, default_value_t = 24)]
        limit: usize,
    },
    /// Watch an instrument's book and trades live.
    Book {
        /// Instrument symbol (e.g. H100-SXM-80G/SPOT) or id (`gpux instruments`).
        instrument: String,
        /// Price levels per side.
        #[arg(long, default_value_t = 10)]
        depth: usize,
        /// Print the book once and exit.
        #[arg(long)]
        once: bool,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
    },
    /// Your registered GPUs (suppliers).
    Gpus,
    /// What the exchange lists: its currency, regions, fees and classes (public).
    Listing,
    /// Your open sell orders (suppliers' offers).
    Offers,
    /// Credit an account (operators).
    Deposit {
        /// The account credited.
        account: u32,
        /// The amount in the exchange's currency (e.g. 100 or 99.50; `.` the only decimal separator).
        amount: String,
    },
    /// Withdraw available funds.
    Withdraw {
        /// The amount in the exchange's currency (e.g. 25.50), from your available funds.
        amount: String,
    },
    /// Pay out supplier earnings.
    Payout {
        /// The amount in the exchange's currency (e.g. 25.50), from your payable earnings.
        amount: String,
    },
    /// Rent GPUs and run an image on them: bid at most --max-price, wait until it runs, print how to connect.
    Run(RunArgs),
    /// A lease's delivery: status and endpoints, logs, stop.
    Lease {
        #[command(subcommand)]
        action: LeaseAction,
    },
    /// Your spend limits and what they count; with a limit flag, set them (docs/market-rules.md "Spend control").
    Spend {
        /// Dollars spent this UTC day plus held, at most (every limit is replaced; leave one out for none).
        #[arg(long)]
        daily: Option<String>,
        /// Dollars spent since now plus held, at most.
        #[arg(long)]
        total: Option<String>,
        /// Dollars held at once, at most.
        #[arg(long)]
        max_held: Option<String>,
        /// Remove every limit.
        #[arg(long, conflicts_with_all = ["daily", "total", "max_held"])]
        clear: bool,
    },
    /// Jobs: your code and data run on the GPUs the books offer (docs/jobs.md).
    Job {
        #[command(subcommand)]
        action: JobAction,
    },
    /// Services: replicas of one workload kept running and scaled behind
    /// `gpux-router` (docs/services.md).
    Service {
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// Volumes: named folders kept in the exchange's store, mounted into
    /// leases with `gpux run --volume NAME:/PATH` (docs/storage.md).
    Volume {
        #[command(subcommand)]
        action: VolumeAction,
    },
    /// Print a completion script for your shell: `gpux completions bash > /etc/bash_completion.d/gpux`.
    Completions {
        /// The shell to write completions for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Your signed invoice for a closed month (or a sub-account's), checked against the exchange's key.
    Invoice {
        /// The UTC month, YYYY-MM.
        #[arg(long)]
        period: String,
        /// A sub-account's invoice instead of yours (its parent asks).
        #[arg(long)]
        sub_account: Option<u32>,
        /// Also write it as a printable HTML page.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Also write it as PDF (printed by a headless Chromium on this machine).
        #[arg(long)]
        pdf: Option<PathBuf>,
    },
    /// Sub-accounts for your own customers: open, fund, limit, list (docs/market-rules.md "Sub-accounts").
    SubAccount {
        #[command(subcommand)]
        action: SubAccountAction,
    },
}

#[derive(Subcommand, Debug)]
pub enum SubAccountAction {
    /// Open a sub-account; prints its account number.
    Create,
    /// Your sub-accounts with their balances, open orders and limits.
    List,
    /// Move money from your available funds to a sub-account.
    Fund {
        /// The sub-account's number (`gpux sub-account list`).
        sub_account: u32,
        /// The amount moved from your available funds, in the exchange's currency.
        amount: String,
    },
    /// Move money from a sub-account back to you.
    Defund {
        /// The sub-account's number (`gpux sub-account list`).
        sub_account: u32,
        /// The amount moved back to you, in the exchange's currency.
        amount: String,
    },
    /// Set a sub-account's limits (each one left out is no limit; all are replaced).
    Limits {
        /// The sub-account's number (`gpux sub-account list`).
        sub_account: u32,
        /// Open orders at once.
        #[arg(long)]
        max_open_orders: Option<u32>,
        /// Dollars one bid may hold.
        #[arg(long)]
        max_order: Option<String>,
        /// Dollars it may hold in all (open bids, escrows, contracts): its spending ceiling.
        #[arg(long)]
        max_held: Option<String>,
    },
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Container image, e.g. docker.io/library/python:3.12.
    #[arg(long)]
    pub image: String,
    /// GPUs (on one host when more than one).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Highest price in the exchange's currency per GPU-hour.
    #[arg(long)]
    pub max_price: String,
    /// Instrument symbol or id.
    #[arg(long, default_value = "H100-SXM-80G/SPOT")]
    pub instrument: String,
    /// A fixed lease length in hours, to the minute (1, 1.5, 0.25). Without it the lease is open-ended: billed as used until you stop it.
    #[arg(long, conflicts_with = "until_cancelled")]
    pub hours: Option<String>,
    /// An open-ended lease, billed as used until you stop it (the default; kept for scripts that say it).
    #[arg(long)]
    pub until_cancelled: bool,
    /// End the lease when the workload exits (the default when a command is given after --, with --restart never).
    #[arg(long, conflicts_with = "keep_lease")]
    pub end_on_exit: bool,
    /// Keep the lease (and its bill) after the workload exits, to set another workload or look around.
    #[arg(long)]
    pub keep_lease: bool,
    /// Container port to publish (repeat for more).
    #[arg(short = 'p', long)]
    pub port: Vec<u16>,
    /// OpenSSH public key file to install for root (repeat for more); sealed to the host.
    #[arg(long)]
    pub ssh_key: Vec<PathBuf>,
    /// Environment variable NAME=VALUE (repeat for more); sealed to the host.
    #[arg(short = 'e', long)]
    pub env: Vec<String>,
    /// /dev/shm size in MiB.
    #[arg(long, default_value_t = 0)]
    pub shm_mib: u32,
    /// A volume to mount, NAME:/PATH (read-write: the lease's host syncs
    /// it back) or NAME:/PATH:ro (a copy to read); repeat for more.
    #[arg(long)]
    pub volume: Vec<String>,
    /// When the host restarts the container: never, on a failure (a non-zero exit), or always.
    #[arg(long, value_enum, default_value_t = RestartArg::Never)]
    pub restart: RestartArg,
    /// Treat the first word after -- as the entrypoint (otherwise all words are the image's arguments).
    #[arg(long)]
    pub entrypoint: bool,
    /// Seconds to wait for the workload to run.
    #[arg(long, default_value_t = 600)]
    pub wait_s: u64,
    /// Report `running` only once this container port accepts a connection (a published port; sealed to the host).
    #[arg(long)]
    pub ready_port: Option<u16>,
    /// With --ready-port: only once an HTTP GET of this path answers 2xx or 3xx, e.g. /health.
    #[arg(long, requires = "ready_port")]
    pub ready_path: Option<String>,
    /// User name for a private registry (sealed to the host with the password).
    #[arg(long, requires = "registry_password_file")]
    pub registry_user: Option<String>,
    /// File holding the private registry's password or token (never on the command line).
    #[arg(long, requires = "registry_user")]
    pub registry_password_file: Option<PathBuf>,
    #[command(flatten)]
    pub filters: BidFilters,
    /// Command and arguments (after --); sealed to the host.
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RestartArg {
    Never,
    OnFailure,
    Always,
}

#[derive(Subcommand, Debug)]
pub enum LeaseAction {
    /// The lease's workload, delivery status and endpoints.
    Status {
        /// The lease's id (`gpux leases`).
        lease: u64,
    },
    /// End the lease now (the host stops and removes the workload).
    Stop {
        /// The lease's id (`gpux leases`).
        lease: u64,
    },
    /// SSH into the lease's workload (it publishes port 22 and was given your key: `gpux run -p 22 --ssh-key ~/.ssh/id_ed25519.pub`), or run a command there (`gpux lease ssh LEASE -- nvidia-smi`).
    Ssh {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// Print the ssh command instead of running it.
        #[arg(long)]
        print: bool,
        /// A command to run there instead of a shell.
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Run one command in the lease's running workload through its host, no SSH needed (`gpux lease exec LEASE -- nvidia-smi`); prints its output and exits with its code.
    Exec {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// Seconds the host waits for it (1 to 60); past them it answers with the output so far.
        #[arg(long, default_value_t = 30)]
        timeout_s: u32,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Sell what is left of a fixed-duration spot lease on its class's resale
    /// book, whole (docs/market-rules.md "Lease resale"); buyers bid on CLASS/RESALE.
    Resell {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// Dollars per GPU-hour.
        #[arg(long)]
        price: String,
        /// Time in force of the resale ask: gtc rests until cancelled, ioc and fok trade at once or not at all.
        #[arg(long, value_enum, default_value_t = TifArg::Gtc)]
        tif: TifArg,
    },
    /// How the lease's GPUs are doing: each GPU's latest usage reports
    /// (time, available share, utilisation, most memory used).
    Telemetry {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// Samples per GPU to show, newest last.
        #[arg(long, default_value_t = 10)]
        last: usize,
    },
    /// The last output of the lease's workload.
    Logs {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// The last this many bytes of the workload's output.
        #[arg(long, default_value_t = 16 * 1024)]
        bytes: u32,
    },
    /// Probe the lease's endpoint and sign what you see (reachable or not)
    /// for the exchange, and send what your GPU probe (`gpux-probe`, run in
    /// the container) printed to the lease's output: time the host reports
    /// available while you signed it unreachable is disputed and held; time
    /// your probe saw a GPU absent is proven and refunded at the final bill
    /// (docs/market-rules.md "Disputes").
    Watch {
        /// The lease's id (`gpux leases`).
        lease: u64,
        /// Seconds between two probes (a TCP connect to the endpoint).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
        probe_every: u64,
        /// Seconds each signed observation covers.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
        sign_every: u64,
        /// Stop after this many seconds (default: until the lease ends or Ctrl-C).
        #[arg(long)]
        seconds: Option<u64>,
        /// The published container port to probe (default: the first published).
        #[arg(long)]
        port: Option<u16>,
    },
}

/// Self-trade prevention, as `--stp` names it.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum StpArg {
    CancelNewest,
    CancelOldest,
    Decrement,
    CancelBoth,
}

#[derive(Subcommand)]
pub enum ServiceAction {
    /// Creates a service: it bids for its replicas and keeps them running.
    /// Prints the service's key once (unless --public).
    Create(Box<ServiceCreate>),
    /// A service's state and replicas.
    Status {
        /// The service's id (`gpux service list`).
        service: u64,
    },
    /// Your services, newest first.
    List,
    /// Sets how many replicas the service keeps.
    Scale {
        /// The service's id (`gpux service list`).
        service: u64,
        /// How many replicas it keeps from now.
        replicas: u32,
    },
    /// Rolls out a new run, one replica at a time: each new replica is up
    /// before an old one goes; back to the old run if the new one cannot start.
    Update {
        /// The service's id (`gpux service list`).
        service: u64,
        /// The new image (default the current one).
        #[arg(long)]
        image: Option<String>,
        /// The new serving port.
        #[arg(long)]
        port: Option<u16>,
        /// The new readiness path.
        #[arg(long)]
        readiness: Option<String>,
        /// The new command (after `--`; default the current one).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Deletes a service: its bids cancelled, its replicas' leases ended.
    Delete {
        /// The service's id (`gpux service list`).
        service: u64,
    },
    /// The service's bill so far: every lease its replicas ran on, usage,
    /// fees and credits, signed by the exchange (checked here) like an
    /// invoice.
    Bill {
        /// The service's id (`gpux service list`).
        service: u64,
        /// Also write it as a printable HTML page.
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// A replica's output, from its host.
    Logs {
        /// The service's id (`gpux service list`).
        service: u64,
        /// The replica's slot (`gpux service status`; default the first with a lease).
        #[arg(long)]
        replica: Option<u32>,
        /// Bytes of the output's tail.
        #[arg(long, default_value_t = 4096)]
        bytes: u32,
    },
}

#[derive(clap::Args)]
pub struct ServiceCreate {
    /// The service's name (letters, digits, `._-`).
    #[arg(long)]
    pub name: String,
    /// The book each replica's lease is bought on (`gpux instruments`), spot or preemptible.
    #[arg(long)]
    pub instrument: String,
    /// GPUs of each replica.
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// The most a replica pays per GPU-hour.
    #[arg(long)]
    pub max_price: String,
    /// The most the service pays per hour across its replicas (default:
    /// --max replicas at --max-price, the floor's at --floor-max-price).
    #[arg(long)]
    pub budget_per_hour: Option<String>,
    /// Replicas to start with (default --min, at least one).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Fewest replicas (0: the service may idle at zero).
    #[arg(long, default_value_t = 1)]
    pub min: u32,
    /// Most replicas.
    #[arg(long, default_value_t = 1)]
    pub max: u32,
    /// The container image.
    #[arg(long)]
    pub image: String,
    /// The port that serves requests.
    #[arg(long)]
    pub port: u16,
    /// HTTP path that answers 2xx or 3xx once a replica is ready (default: the port accepts).
    #[arg(long)]
    pub readiness: Option<String>,
    /// Regions a replica's host may be in (repeat; default any).
    #[arg(long = "region")]
    pub regions: Vec<String>,
    /// Autoscale on requests a second per replica (e.g. 20 or 2.5).
    #[arg(long)]
    pub scale_rps: Option<String>,
    /// Autoscale on requests in flight per replica.
    #[arg(long)]
    pub scale_in_flight: Option<u32>,
    /// Seconds the load must want more replicas before they are added.
    #[arg(long, default_value_t = 30)]
    pub up_window_s: u64,
    /// Seconds it must want fewer before they are removed.
    #[arg(long, default_value_t = 300)]
    pub down_window_s: u64,
    /// No key: anyone who reaches a router may call the service.
    #[arg(long)]
    pub public: bool,
    /// Replicas kept on a spot book (--floor-instrument) while the rest run
    /// on --instrument, a preemptible book: 1 to --min.
    #[arg(long, requires_all = ["floor_instrument", "floor_max_price"])]
    pub floor: Option<u32>,
    /// The spot book of the floor's replicas (same GPU class).
    #[arg(long, requires = "floor")]
    pub floor_instrument: Option<String>,
    /// The most a floor replica pays per GPU-hour.
    #[arg(long, requires = "floor")]
    pub floor_max_price: Option<String>,
    /// The command the container runs (after `--`; default the image's).
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(clap::Subcommand)]
pub enum VolumeAction {
    /// Creates a volume: a named folder of at most SIZE_GIB in the store.
    Create {
        /// Its name (letters, digits, `-`, `_`, `.`; 63 at most).
        name: String,
        /// Its size, GiB: what its files may hold together (1 to 1024).
        #[arg(long)]
        size_gib: u32,
    },
    /// Your volumes, with who holds each.
    List,
    /// Deletes a volume no lease or bid holds: its files leave the store.
    Delete {
        /// The volume's name.
        name: String,
    },
    /// A volume's files and their sizes.
    Ls {
        /// The volume's name.
        name: String,
    },
    /// Copies a local file or folder into a volume (`NAME:PATH`) or out of one.
    Cp {
        /// Where from: a local path, or NAME:PATH in a volume.
        from: String,
        /// Where to: a local path, or NAME:PATH in a volume.
        to: String,
    },
}

#[derive(clap::Subcommand)]
pub enum JobAction {
    /// What a job file would run on now: the framework found in its code,
    /// the preset image, the memory it needs, every book with its expected
    /// cost and why it lost, and the one chosen (public data; nothing is bought).
    Plan {
        /// The job file (TOML; docs/jobs.md "The job file").
        file: PathBuf,
        /// The operator's preset images (TOML; default $GPUX_CATALOGUE).
        #[arg(long)]
        catalogue: Option<PathBuf>,
        #[command(flatten)]
        set: JobFlags,
    },
    /// Plans the job, puts its code in the exchange's job store and
    /// submits it: it bids, runs, and resumes elsewhere when a host fails.
    Submit {
        /// The job file (TOML; docs/jobs.md "The job file").
        file: PathBuf,
        /// The operator's preset images (TOML; default $GPUX_CATALOGUE).
        #[arg(long)]
        catalogue: Option<PathBuf>,
        #[command(flatten)]
        set: JobFlags,
        /// Print the plan only (as `gpux job plan`): nothing is sent or bought.
        #[arg(long)]
        dry_run: bool,
    },
    /// A job's state, attempts, leases and escrow.
    Status {
        /// The job's id (`gpux job list`).
        job: u64,
    },
    /// Your jobs, newest first.
    List,
    /// Cancels a job: its bid is cancelled or its leases ended.
    Cancel {
        /// The job's id (`gpux job list`).
        job: u64,
    },
    /// The job's output: live from its running host (`--follow` streams
    /// it until the job ends), or, once the job ended, the tail each of its
    /// attempts' hosts kept in the job store (every rank's).
    Logs {
        /// The job's id (`gpux job list`).
        job: u64,
        /// The last this many bytes of the output.
        #[arg(long, default_value_t = 16 * 1024)]
        bytes: u32,
        /// Print new output as it comes until the job ends.
        #[arg(long)]
        follow: bool,
        /// An earlier attempt's kept output (default: the newest kept).
        #[arg(long)]
        attempt: Option<u32>,
    },
    /// Grows (or shrinks) a running job: the new size is bought first, then
    /// the job restarts there from its checkpoint (docs/jobs.md "Growing a job").
    Resize {
        /// The job's id (`gpux job list`).
        job: u64,
        /// The job's new size in GPUs.
        #[arg(long)]
        gpus: u32,
    },
    /// The job's bill so far: every lease of every attempt, usage, fees and
    /// credits, signed by the exchange (checked here) like an invoice.
    Bill {
        /// The job's id (`gpux job list`).
        job: u64,
        /// Also write it as a printable HTML page.
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Downloads the job's outputs (and checkpoints with --checkpoints)
    /// from the job store, into DIR (default <name>-<job>).
    Results {
        /// The job's id (`gpux job list`).
        job: u64,
        /// The directory to write into (default <name>-<job>).
        #[arg(long)]
        to: Option<PathBuf>,
        /// Also download the job's checkpoints.
        #[arg(long)]
        checkpoints: bool,
    },
}

/// Flags that set a field of the job file (docs/jobs.md "The job file"),
/// checked as the file is.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct JobFlags {
    /// code.image: run this image instead of the code directory.
    #[arg(long)]
    pub image: Option<String>,
    /// code.dir: the code directory.
    #[arg(long)]
    pub dir: Option<String>,
    /// code.framework: auto, pytorch, tensorflow, paddlepaddle, jax or none.
    #[arg(long)]
    pub framework: Option<String>,
    /// resources.gpus_per_node.
    #[arg(long)]
    pub gpus_per_node: Option<u32>,
    /// resources.nodes.
    #[arg(long)]
    pub nodes: Option<u32>,
    /// resources.gpu_memory_gib.
    #[arg(long)]
    pub gpu_memory_gib: Option<u32>,
    /// resources.model_params (350M, 7B).
    #[arg(long)]
    pub model_params: Option<String>,
    /// limits.max_price_per_gpu_hour (2.50).
    #[arg(long)]
    pub max_price: Option<String>,
    /// limits.budget (100).
    #[arg(long)]
    pub budget: Option<String>,
    /// limits.max_duration (90m, 6h, 2d).
    #[arg(long)]
    pub max_duration: Option<String>,
    /// limits.region.
    #[arg(long)]
    pub region: Option<String>,
    /// limits.min_score, as a percent as `buy` and `run` take it: 99.5
    /// (the job file's 0.995).
    #[arg(long)]
    pub min_score: Option<String>,
    /// limits.verified_only.
    #[arg(long)]
    pub verified_only: bool,
    /// limits.contract: any, spot or preemptible.
    #[arg(long)]
    pub contract: Option<String>,
    /// limits.retries.
    #[arg(long)]
    pub retries: Option<u32>,
    /// limits.restarts_on_error: new attempts after the program's own errors.
    #[arg(long)]
    pub restarts_on_error: Option<u32>,
}

impl JobFlags {
    /// The fields the flags set, as dotted keys of the job file; a
    /// `--min-score` that is no percent is refused.
    pub fn overrides(&self) -> Result<Vec<(&'static str, toml::Value)>, Failure> {
        use toml::Value as V;
        let text = |key, value: &Option<String>| value.clone().map(|v| (key, V::String(v)));
        let number = |key, value: Option<u32>| value.map(|v| (key, V::Integer(v as i64)));
        let min_score = self.min_score.as_deref().map(commands::parse_percent_bps).transpose().map_err(Failure::Usage)?;
        Ok([
            text("code.image", &self.image),
            text("code.dir", &self.dir),
            text("code.framework", &self.framework),
            number("resources.gpus_per_node", self.gpus_per_node),
            number("resources.nodes", self.nodes),
            number("resources.gpu_memory_gib", self.gpu_memory_gib),
            text("resources.model_params", &self.model_params),
            text("limits.max_price_per_gpu_hour", &self.max_price),
            text("limits.budget", &self.budget),
            text("limits.max_duration", &self.max_duration),
            text("limits.region", &self.region),
            min_score.map(|bps| ("limits.min_score", V::Float(bps as f64 / 10_000.0))),
            self.verified_only.then_some(("limits.verified_only", V::Boolean(true))),
            text("limits.contract", &self.contract),
            number("limits.retries", self.retries),
            number("limits.restarts_on_error", self.restarts_on_error),
        ]
        .into_iter()
        .flatten()
        .collect())
    }
}

#[derive(Subcommand)]
pub enum KeysAction {
    /// Make a new key (refuses to overwrite one).
    Create,
    /// Print the public key.
    Show,
    /// Let another key act as your account (or one of your sub-accounts) with some scopes.
    Grant {
        /// The other key's public key (64 hex digits; `gpux --key FILE keys show` prints it).
        public_key: String,
        /// What it may do, e.g. read,trade (read, trade, deliver, withdraw, manage).
        #[arg(long, value_delimiter = ',', required = true)]
        scopes: Vec<ScopeArg>,
        /// Act as this sub-account instead of your own account.
        #[arg(long)]
        sub_account: Option<u32>,
        /// The key stops working this many seconds from now.
        #[arg(long)]
        expires_in_s: Option<u64>,
        /// A label to know the key by in `gpux keys list`.
        #[arg(long, default_value = "")]
        label: String,
    },
    /// Revoke a key granted before: its open sessions close at once.
    Revoke {
        /// The key's public key (64 hex digits: `gpux keys list`).
        public_key: String,
    },
    /// Your account's keys (or a sub-account's) with their scopes.
    List {
        /// A sub-account's keys instead of yours.
        #[arg(long)]
        sub_account: Option<u32>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ScopeArg {
    Read,
    Trade,
    Deliver,
    Withdraw,
    Manage,
}

/// A failure with the exit code it maps to.
pub enum Failure {
    Refused(String),
    Usage(String),
    Unreachable(String),
    /// A remote command's own exit code (`gpux lease exec`), passed on
    /// with nothing more said.
    Status(i32),
}

fn main() {
    let cli = Cli::parse();
    clock::use_utc(cli.utc);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let json = cli.json;
    let outcome = runtime.block_on(commands::run(cli));
    // What was printed with print! reaches its reader before the exit.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let Err(failure) = outcome else { std::process::exit(0) };
    if let Failure::Status(code) = failure {
        std::process::exit(code);
    }
    let (code, kind, said, message) = match failure {
        Failure::Status(_) => unreachable!("handled above"),
        Failure::Refused(message) => (1, "refused", "refused", message),
        Failure::Usage(message) => (2, "usage", "error", message),
        Failure::Unreachable(message) => (3, "unreachable", "error", message),
    };
    eprintln!("{said}: {message}");
    if json {
        // Scripts read a failure as they read everything else: one JSON line on stdout.
        out!("{}", serde_json::json!({ "failed": { "exit_code": code, "kind": kind, "message": message } }));
    }
    std::process::exit(code);
}

#[cfg(test)]
#[path = "../../../support/clap_help.rs"]
mod clap_help;

/// What `clap_help`'s test walks.
#[cfg(test)]
type CliRoot = Cli;

#[cfg(test)]
mod job_flag_tests {
    use super::JobFlags;

    /// `--min-score` is a percent in `gpux job` as in `buy` and `run`: 99.5
    /// sets the job file's 0.995; what is no percent is refused.
    #[test]
    fn a_jobs_min_score_is_the_percent_buy_and_run_take() {
        let flags = JobFlags { min_score: Some("99.5".into()), ..JobFlags::default() };
        let Ok(set) = flags.overrides() else { panic!("a percent") };
        let min_score = set.iter().find(|(key, _)| *key == "limits.min_score").map(|(_, v)| v.as_float());
        assert_eq!(min_score, Some(Some(0.995)));
        for bad in ["0.995x", "101", "-1"] {
            let flags = JobFlags { min_score: Some(bad.into()), ..JobFlags::default() };
            assert!(flags.overrides().is_err(), "{bad}");
        }
    }
}
