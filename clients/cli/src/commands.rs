//! One function per command: connect, send the documented request, print
//! the answer for people (or as JSON), map refusals to exit code 1.

use std::time::Duration;

use gpux_client::now_ms;
use gpux_engine::{
    AccountId, ContractKind, EventKind, GpuSet, InstrumentId, LeaseDuration, LeaseId, OrderCloseReason, OrderId, OrderType, Role, Side,
    TimeInForce,
};
use gpux_protocol::{ClientMessage, OrderTicket, ServerMessage};

use crate::session::{acknowledged, role_of, written, Session};

use crate::money::{amount, parse_amount};
use crate::{keys, Cli, Command, Failure, KeysAction, OrderArgs, TifArg};

/// "99.5" (percent, up to two decimals) as basis points (9950), 0.01 to 100.
pub(crate) fn parse_percent_bps(text: &str) -> Result<u32, String> {
    let refuse = || format!("--min-score takes a percent from 0.01 to 100 with at most two decimals, e.g. 99.5, not {text:?}");
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty()
        || text.ends_with('.')
        || fraction.len() > 2
        || !whole.bytes().chain(fraction.bytes()).all(|b| b.is_ascii_digit())
        || whole.len() > 3
    {
        return Err(refuse());
    }
    let whole: u32 = whole.parse().map_err(|_| refuse())?;
    let fraction: u32 = format!("{fraction:0<2}").parse().map_err(|_| refuse())?;
    let bps = whole * 100 + fraction;
    if bps == 0 || bps > 10_000 {
        return Err(refuse());
    }
    Ok(bps)
}

/// `gpux asks SYMBOL`: the book's asks one by one, best first, each with
/// its seller and the seller's score, pages followed up to `limit`.
async fn asks(s: &mut Session, instrument: gpux_engine::InstrumentId, limit: usize, json: bool) -> Result<(), Failure> {
    let mut shown = 0;
    let mut after = None;
    loop {
        let id = s.connection.new_id();
        let answer = s.ask(ClientMessage::BookOffers { id, instrument, offset: 0, after }, json).await?;
        let ServerMessage::BookOffers { offers, next_after, .. } = answer else {
            return Err(Failure::Unreachable(format!("expected book_offers, got {answer:?}")));
        };
        for offer in &offers {
            if shown == limit {
                return Ok(());
            }
            shown += 1;
            if json {
                continue;
            }
            let score = score_text(offer.supplier_score_bps);
            let region = offer.region.as_deref().unwrap_or("no region");
            let supply = match offer.host {
                Some(host) => format!("host {host} in {region}, {} of {} GPU(s) verified", offer.gpus_verified, offer.quantity),
                None => "reserved contracts offered again".into(),
            };
            let fabric = offer.fabric.as_ref().map_or(String::new(), fabric_text);
            out!(
                "{}/GPU-h x {}  supplier {} ({score}; {supply}{fabric})",
                amount(offer.price_minor_per_gpu_hour),
                offer.quantity,
                offer.supplier
            );
        }
        if shown == 0 && !json {
            out!("no asks");
        }
        match next_after {
            Some(next) if shown < limit => after = Some(next),
            _ => break,
        }
    }
    if !json && shown > 0 {
        // What the "verified" above means in this class, from the listing.
        let class = s.instrument_list().await?.iter().find(|i| i.instrument == instrument).map(|i| i.class.clone());
        let id = s.connection.new_id();
        if let (Some(class), ServerMessage::Listing { listing, .. }) = (class, s.ask(ClientMessage::Listing { id }, false).await?) {
            if let Some(spec) = listing.classes.iter().find(|c| c.name == class) {
                out!("{}", verified_meaning(spec));
            }
        }
    }
    Ok(())
}

/// What "verified" means in a class (docs/market-rules.md "Verified
/// hardware"): which challenges its GPUs passed, at what rates, and when
/// they are asked again; and, when the rates are ones a CPU reaches, that
/// they prove an honest answer, not a model.
pub(crate) fn verified_meaning(class: &gpux_protocol::views::Class) -> String {
    let Some(compute) = class.challenge else {
        return format!("class {} takes no hardware challenge: none of its GPUs is verified", class.name);
    };
    let mut text = format!(
        "verified = the GPU's last challenges in {} passed: a {n} x {n} matrix product at >= {} MFLOP/s",
        class.name,
        compute.min_mflops,
        n = compute.n
    );
    if let Some(memory) = class.memory_challenge {
        text.push_str(&format!(
            " and {} passes over 2^{} words of memory at >= {} MB/s",
            memory.passes, memory.words_log2, memory.min_mbps
        ));
    }
    text.push_str("; asked again at random idle times, every 6 h on average");
    // 1 TFLOP/s: below every data-centre accelerator, within a CPU's reach.
    if compute.min_mflops < 1_000_000 {
        text.push_str(" (rates a CPU reaches: this proves the host computes honestly, not which accelerator it is)");
    }
    text
}

/// A seller's score as `gpux asks` and `gpux search` show it.
fn score_text(score_bps: Option<u32>) -> String {
    match score_bps {
        Some(bps) => format!("score {}.{:02}%", bps / 100, bps % 100),
        None => "unrated".into(),
    }
}

/// A host's fabric as `gpux asks` shows it: the group, its claim and what
/// its last interconnect probe measured (docs/market-rules.md
/// "Interconnect probe").
fn fabric_text(fabric: &gpux_protocol::views::Fabric) -> String {
    let probe = match &fabric.probe {
        None => "not probed yet".to_string(),
        Some(p) if p.borne_out => format!("probed {}.{} Gb/s over {} hosts", p.mbps / 1_000, p.mbps % 1_000 / 100, p.ranks),
        Some(p) => format!("probe measured only {}.{} Gb/s: claim NOT borne out", p.mbps / 1_000, p.mbps % 1_000 / 100),
    };
    format!("; fabric {} in {} ({} hosts), {} Gb/s claimed, {probe}", fabric.name, fabric.zone, fabric.hosts, fabric.gbps)
}

/// `gpux search`: what every book offers that fits, in the order asked,
/// pages followed up to `limit`.
async fn search_offers(s: &mut Session, mut search: gpux_protocol::search::OfferSearch, limit: usize, json: bool) -> Result<(), Failure> {
    let mut shown = 0;
    loop {
        search.limit = Some((limit - shown).clamp(1, gpux_protocol::search::SEARCH_PAGE_MAX as usize) as u32);
        let id = s.connection.new_id();
        let answer = s.ask(ClientMessage::SearchOffers { id, search: Box::new(search.clone()) }, json).await?;
        let ServerMessage::OffersFound { offers, next_after, .. } = answer else {
            return Err(Failure::Unreachable(format!("expected offers_found, got {answer:?}")));
        };
        for offer in offers.iter().take(limit - shown) {
            shown += 1;
            if json {
                continue;
            }
            let score = score_text(offer.supplier_score_bps);
            let region = offer.region.as_deref().unwrap_or("no region");
            let measured = match (offer.measured_gflops, offer.price_minor_per_tflops_hour) {
                (Some(gflops), Some(per)) => {
                    format!(", {}.{} TFLOPS measured, {}/TFLOPS-h", gflops / 1_000, gflops % 1_000 / 100, amount(per))
                }
                _ => String::new(),
            };
            let fabric = offer.fabric.as_ref().map_or(String::new(), fabric_text);
            out!(
                "{}  {}/GPU-h x {}  {} {}.{} GB, {}/GB-h{measured}  supplier {} ({score}; {region}; {} of {} verified{fabric})",
                offer.symbol,
                amount(offer.price_minor_per_gpu_hour),
                offer.quantity,
                offer.model,
                u64::from(offer.gpu_memory_mib) * 1_048_576 / 1_000_000_000,
                u64::from(offer.gpu_memory_mib) * 1_048_576 / 100_000_000 % 10,
                amount(offer.price_minor_per_gb_hour),
                offer.supplier,
                offer.gpus_verified,
                offer.quantity
            );
        }
        if shown == 0 && !json {
            out!("no offers fit");
        }
        match next_after {
            Some(next) if shown < limit => search.after = Some(next),
            _ => return Ok(()),
        }
    }
}

/// `gpux trades`: an instrument's past trades, newest first, a page at a time.
async fn trades(s: &mut Session, instrument: InstrumentId, limit: usize, json: bool) -> Result<(), Failure> {
    let (mut shown, mut before_seq) = (0, None);
    loop {
        let id = s.connection.new_id();
        let answer = s.ask(ClientMessage::Trades { id, instrument, before_seq }, json).await?;
        let ServerMessage::Trades { trades, next_before_seq, .. } = answer else {
            return Err(Failure::Unreachable(format!("expected trades, got {answer:?}")));
        };
        for trade in trades.iter().take(limit - shown) {
            if !json {
                let side = if trade.aggressor == Side::Buy { "buyer took" } else { "seller took" };
                out!(
                    "{}  {} GPU(s) at {}/GPU-h ({side})",
                    crate::clock::when(trade.at_ms),
                    trade.quantity,
                    amount(trade.price_minor_per_gpu_hour)
                );
            }
            shown += 1;
        }
        if shown == 0 && !json {
            out!("no trades");
        }
        match next_before_seq {
            Some(next) if shown < limit => before_seq = Some(next),
            _ => return Ok(()),
        }
    }
}

/// `gpux candles`: the newest candles of an interval, oldest first.
async fn candles(
    s: &mut Session,
    instrument: InstrumentId,
    interval: gpux_protocol::CandleInterval,
    limit: usize,
    json: bool,
) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::Candles { id, instrument, interval, before_ms: None }, json).await?;
    if json {
        return Ok(());
    }
    let ServerMessage::Candles { candles, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected candles, got {answer:?}")));
    };
    if candles.is_empty() {
        out!("no trades");
        return Ok(());
    }
    out!("{:<27} {:>12} {:>12} {:>12} {:>12} {:>6} {:>6}", "start", "open", "high", "low", "close", "GPUs", "trades");
    for candle in &candles[candles.len().saturating_sub(limit)..] {
        out!(
            "{:<27} {:>12} {:>12} {:>12} {:>12} {:>6} {:>6}",
            crate::clock::when(candle.start_ms),
            amount(candle.open),
            amount(candle.high),
            amount(candle.low),
            amount(candle.close),
            candle.volume,
            candle.trades
        );
    }
    Ok(())
}

/// `gpux fills --past`: the account's fills, newest first, a page at a time.
async fn past_fills(s: &mut Session, limit: usize, json: bool) -> Result<(), Failure> {
    let symbols = s.symbols().await?;
    let (mut shown, mut before) = (0, None);
    loop {
        let id = s.connection.new_id();
        let answer = s.ask(ClientMessage::Fills { id, before }, json).await?;
        let ServerMessage::Fills { fills, next_before, .. } = answer else {
            return Err(Failure::Unreachable(format!("expected fills, got {answer:?}")));
        };
        for fill in fills.iter().take(limit - shown) {
            if !json {
                let symbol = symbols.get(&fill.instrument).cloned().unwrap_or_else(|| fill.instrument.0.to_string());
                let side = if fill.side == Side::Buy { "bought" } else { "sold" };
                let liquidity = if fill.liquidity == gpux_protocol::Liquidity::Taker { "taker" } else { "maker" };
                out!(
                    "{}  {side} {} GPU(s) of {symbol} at {}/GPU-h, order {} ({liquidity})",
                    crate::clock::when(fill.at_ms),
                    fill.quantity,
                    amount(fill.price_minor_per_gpu_hour),
                    fill.order.0
                );
            }
            shown += 1;
        }
        if shown == 0 && !json {
            out!("no fills");
        }
        match next_before {
            Some(next) if shown < limit => before = Some(next),
            _ => return Ok(()),
        }
    }
}

/// `gpux listing`: the exchange's currency, regions, fees and classes.
async fn listing(s: &mut Session, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::Listing { id }, json).await?;
    if json {
        return Ok(());
    }
    let ServerMessage::Listing { listing, cluster_rules, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected listing, got {answer:?}")));
    };
    let currency = &listing.currency;
    out!(
        "currency {} ({} decimals: amounts are in 1/{} {})",
        currency.code,
        currency.decimals,
        10u64.pow(currency.decimals as u32),
        currency.code
    );
    out!("fee {}.{:02}% of usage charges", listing.fee_bps / 100, listing.fee_bps % 100);
    out!("regions {}", if listing.regions.is_empty() { "none listed".to_string() } else { listing.regions.join(", ") });
    out!("{:<20} {:<10} {:>9} {:>16} {:>16}  reserved windows", "class", "vendor", "SLA", "tick", "price band/GPU-h");
    for class in &listing.classes {
        let windows = match &class.calendar {
            Some(c) => format!(
                "{}h {}d {}w {}m ahead",
                c.hourly_windows_ahead, c.daily_windows_ahead, c.weekly_windows_ahead, c.monthly_windows_ahead
            ),
            None => "none".to_string(),
        };
        out!(
            "{:<20} {:<10} {:>8}% {:>16} {:>16}  {windows}",
            class.name,
            class.requirement.vendor.name(),
            format!("{}.{:02}", class.sla_availability_bps / 100, class.sla_availability_bps % 100),
            amount(class.tick_minor),
            format!("{}-{}", amount(class.price_min_minor_per_gpu_hour), amount(class.price_max_minor_per_gpu_hour)),
        );
    }
    for rule in &cluster_rules {
        out!("cluster bids in {} need every host's fabric at {} Gb/s or more", rule.class, rule.min_fabric_gbps);
    }
    Ok(())
}

/// `gpux renter N`: an account's liveness evidence and the disputes it raised.
async fn renter_stats(s: &mut Session, renter: AccountId, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::RenterStats { id, renter }, json).await?;
    if json {
        return Ok(());
    }
    let ServerMessage::RenterStats { record, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected renter_stats, got {answer:?}")));
    };
    out!(
        "renter {renter}: {} signed liveness observations, {:.2} hours signed unreachable, {} disputes ({:.2} GPU-hours of reported time)",
        record.observations,
        record.unreachable_ms as f64 / 3_600_000.0,
        record.disputes,
        record.disputed_gpu_ms as f64 / 3_600_000.0,
    );
    Ok(())
}

/// `gpux supplier N`: the score and what it is made of, then one line per host.
async fn supplier_stats(s: &mut Session, supplier: AccountId, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::SupplierStats { id, supplier }, json).await?;
    if json {
        return Ok(());
    }
    let ServerMessage::SupplierStats { window_days, record, hosts, hosts_more, .. } = answer else {
        return Err(Failure::Unreachable(format!("expected supplier_stats, got {answer:?}")));
    };
    let describe = |record: &gpux_protocol::ReliabilityRecord| {
        let score = match record.score_bps {
            Some(bps) => format!("{}.{:02}%", bps / 100, bps % 100),
            None => "unrated (under 10 GPU-hours)".into(),
        };
        let refused: Vec<String> = record.refused_reports.iter().map(|(code, n)| format!("{n} {}", code.name())).collect();
        format!(
            "score {score}: {:.1} of {:.1} GPU-hours verified in {} leases, {} failed deliveries ({} in a row now), refused reports: {}; hardware challenges: {} passed, {} too slow, {} wrong, {} unanswered; {} disputes proven by renters' GPU probes ({:.2} GPU-hours); {} disconnects during leases, {} preemptions honoured late",
            record.verified_gpu_ms as f64 / 3_600_000.0,
            record.leased_gpu_ms as f64 / 3_600_000.0,
            record.leases_closed,
            record.failed_deliveries,
            record.failed_deliveries_in_row,
            if refused.is_empty() { "none".into() } else { refused.join(", ") },
            record.challenges_passed,
            record.challenges_too_slow,
            record.challenges_failed,
            record.challenges_unanswered,
            record.disputes,
            record.disputed_gpu_ms as f64 / 3_600_000.0,
            record.disconnects_during_leases,
            record.preemptions_late,
        )
    };
    out!("supplier {supplier}, last {window_days} days: {}", describe(&record));
    for host in &hosts {
        out!("  host {} {}: {}", host.host, host.host_name, describe(&host.record));
    }
    if hosts_more {
        out!("  (more hosts not shown)");
    }
    Ok(())
}

/// The commands that need no login (key files, completions, invites, what
/// anyone may read): `Ok(true)` once one ran, `Ok(false)` for the rest.
async fn without_login(cli: &Cli, key_path: &std::path::Path) -> Result<bool, Failure> {
    let json = cli.json;
    match &cli.command {
        Command::Keys { action: KeysAction::Create } => {
            let key = keys::create(key_path)?;
            out!("created {} (public key {})", key_path.display(), hex::encode(key.verifying_key().to_bytes()));
            return Ok(true);
        }
        Command::Completions { shell } => {
            completions(*shell);
            return Ok(true);
        }
        Command::Invite { public_key, role, expires_in_s } => {
            invite(key_path, public_key, *role, *expires_in_s, json)?;
            return Ok(true);
        }
        Command::Keys { action: KeysAction::Show } => {
            let key = keys::load(key_path)?;
            out!("{}", hex::encode(key.verifying_key().to_bytes()));
            return Ok(true);
        }
        Command::Book { instrument, depth, once, seconds } => {
            let mut session = Session::anonymous(&cli.url).await?;
            let instrument = session.resolve(instrument).await?;
            return crate::book::watch(&mut session.connection, instrument, *depth, *once, *seconds, json).await.map(|()| true);
        }
        Command::Instruments { calendar } => {
            let mut session = Session::anonymous(&cli.url).await?;
            return instruments(&mut session, *calendar, json).await.map(|()| true);
        }
        Command::Supplier { supplier } => {
            let mut session = Session::anonymous(&cli.url).await?;
            return supplier_stats(&mut session, AccountId(*supplier), json).await.map(|()| true);
        }
        Command::Renter { renter } => {
            let mut session = Session::anonymous(&cli.url).await?;
            return renter_stats(&mut session, AccountId(*renter), json).await.map(|()| true);
        }
        Command::Listing => {
            let mut session = Session::anonymous(&cli.url).await?;
            return listing(&mut session, json).await.map(|()| true);
        }
        Command::Job {
            action: crate::JobAction::Plan { file, catalogue, set } | crate::JobAction::Submit { file, catalogue, set, dry_run: true },
        } => {
            let mut session = Session::anonymous(&cli.url).await?;
            return crate::job::plan_job(&mut session, file, catalogue.clone(), &set.overrides()?, json).await.map(|()| true);
        }
        Command::Search { min_memory_gb, gpus, vendor, max_price, regions, min_score, verified, contracts, fabric, sort, limit } => {
            let mut session = Session::anonymous(&cli.url).await?;
            let named = |text: &str| serde_json::Value::String(text.to_string());
            let mut search = gpux_protocol::search::OfferSearch {
                min_gpu_memory_gb: *min_memory_gb,
                min_gpus: *gpus,
                vendor: vendor
                    .as_deref()
                    .map(|v| serde_json::from_value(named(v)))
                    .transpose()
                    .map_err(|e| Failure::Usage(e.to_string()))?,
                max_price_minor_per_gpu_hour: max_price.as_deref().map(parse_amount).transpose().map_err(Failure::Usage)?,
                regions: regions.clone(),
                min_score_bps: min_score.as_deref().map(parse_percent_bps).transpose().map_err(Failure::Usage)?.unwrap_or(0),
                verified_only: *verified,
                contracts: contracts
                    .iter()
                    .map(|c| serde_json::from_value(named(c)))
                    .collect::<Result<_, _>>()
                    .map_err(|e| Failure::Usage(e.to_string()))?,
                fabric_only: *fabric,
                ..Default::default()
            };
            search.sort = match sort.as_str() {
                "gb" => gpux_protocol::search::OfferSort::PricePerGb,
                "tflops" => gpux_protocol::search::OfferSort::PricePerTflops,
                _ => gpux_protocol::search::OfferSort::Price,
            };
            return search_offers(&mut session, search, *limit, json).await.map(|()| true);
        }
        Command::Asks { instrument, limit } => {
            let mut session = Session::anonymous(&cli.url).await?;
            let instrument = session.resolve(instrument).await?;
            return asks(&mut session, instrument, *limit, json).await.map(|()| true);
        }
        Command::Trades { instrument, limit } => {
            let mut session = Session::anonymous(&cli.url).await?;
            let instrument = session.resolve(instrument).await?;
            return trades(&mut session, instrument, *limit, json).await.map(|()| true);
        }
        Command::Candles { instrument, interval, limit } => {
            let mut session = Session::anonymous(&cli.url).await?;
            let instrument = session.resolve(instrument).await?;
            let interval = gpux_protocol::CandleInterval::from_name(interval).expect("clap checked the interval");
            return candles(&mut session, instrument, interval, *limit, json).await.map(|()| true);
        }
        _ => {}
    }
    Ok(false)
}

pub async fn run(cli: Cli) -> Result<(), Failure> {
    let key_path = keys::default_path(cli.key.as_deref());
    let json = cli.json;
    if without_login(&cli, &key_path).await? {
        return Ok(());
    }
    let (role, invite) = match &cli.command {
        Command::Login { role, invite } => (role.map(role_of), invite.clone()),
        _ => (None, None),
    };
    let key = keys::load(&key_path)?;
    let mut session = Session::login(&cli.url, &key, role, invite).await?;
    let s = &mut session;
    match cli.command {
        Command::Login { .. } => logged_in(s, json),
        Command::Account => account_id(s, json),
        Command::Balance => balance(s, json).await,
        Command::Statement { after } => statement(s, after, json).await,
        Command::Run(args) => crate::run::run(s, args, json).await,
        Command::Job { action } => crate::job::job_action(s, &action, json).await,
        Command::Service { action } => crate::service::service_action(s, &cli.url, action, json).await,
        Command::Volume { action } => crate::volume::volume_action(s, action, json).await,
        Command::Lease { action } => crate::run::lease(s, action, &key, json).await,
        Command::Buy(args) => place(s, Side::Buy, args, json).await,
        Command::Sell(args) => place(s, Side::Sell, args, json).await,
        Command::Offer { instrument, price, host, gpus } => offer(s, &instrument, &price, host, &gpus, json).await,
        Command::Cancel { order } => {
            let order = OrderId(order);
            write(s, |id| ClientMessage::CancelOrder { id, order }, ("cancelled", "cancel"), json).await
        }
        Command::Replace { order, price, quantity } => {
            let price_minor_per_gpu_hour = parse_amount(&price).map_err(Failure::Usage)?;
            let message = |id| ClientMessage::ReplaceOrder { id, order: OrderId(order), price_minor_per_gpu_hour, quantity };
            write(s, message, ("replaced", "replace"), json).await
        }
        Command::CancelAll { instrument } => {
            let instrument = match instrument {
                Some(symbol) => Some(s.resolve(&symbol).await?),
                None => None,
            };
            write(s, |id| ClientMessage::MassCancel { id, instrument }, ("all cancelled", "cancel_all"), json).await
        }
        Command::Orders => orders(s, None, json).await,
        Command::Offers => orders(s, Some(Side::Sell), json).await,
        Command::Leases => leases(s, json).await,
        Command::EndLease { lease } => {
            write(s, |id| ClientMessage::EndLease { id, lease: LeaseId(lease) }, ("lease ended", "end_lease"), json).await
        }
        Command::Fills { past: true, limit, .. } => past_fills(s, limit, json).await,
        Command::Fills { seconds, .. } => fills(s, seconds, json).await,
        Command::Gpus => gpus(s, json).await,
        Command::Deposit { account, amount } => move_money(s, Move::Deposit(AccountId(account)), &amount, json).await,
        Command::Withdraw { amount } => move_money(s, Move::Withdraw, &amount, json).await,
        Command::Payout { amount } => move_money(s, Move::Payout, &amount, json).await,
        Command::SubAccount { action } => crate::access::sub_account(s, action, json).await,
        Command::Completions { .. } => Ok(()),
        Command::Spend { daily, total, max_held, clear } => spend(s, daily, total, max_held, clear, json).await,
        Command::Invoice { period, sub_account, html, pdf } => crate::invoice::invoice(s, period, sub_account, html, pdf, json).await,
        Command::Keys { action } => crate::access::keys(s, action, json).await,
        Command::Book { .. }
        | Command::Instruments { .. }
        | Command::Supplier { .. }
        | Command::Renter { .. }
        | Command::Asks { .. }
        | Command::Search { .. }
        | Command::Trades { .. }
        | Command::Candles { .. }
        | Command::Invite { .. }
        | Command::Listing => {
            unreachable!("handled before login")
        }
    }
}

/// `gpux invite`: an invitation for a public key, signed with this key.
fn invite(key_path: &std::path::Path, public_key: &str, role: crate::RoleArg, expires_in_s: u64, json: bool) -> Result<(), Failure> {
    let key = keys::load(key_path)?;
    let mut user = [0u8; 32];
    hex::decode_to_slice(public_key.trim(), &mut user)
        .map_err(|_| Failure::Usage(format!("{public_key}: a public key is 64 hex digits (`gpux keys show` prints it)")))?;
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let expires_at_ms = now_ms.saturating_add(expires_in_s.saturating_mul(1_000));
    let invite = gpux_protocol::invite::Invite::sign(&key, &user, role_of(role), expires_at_ms);
    if json {
        out!("{{\"invite\":\"{}\",\"expires_at_ms\":{expires_at_ms}}}", invite.encode());
    } else {
        out!("{}", invite.encode());
    }
    Ok(())
}

/// Sends one write request and prints its outcome: `done` for people, or
/// the answer and its events under `label` with `--json`.
async fn write(
    s: &mut Session,
    message: impl FnOnce(u64) -> ClientMessage,
    (done, label): (&str, &str),
    json: bool,
) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(message(id), json).await?;
    written(s, answer, done, label, json).await
}

/// `gpux offer`: a supplier's ask for the named GPUs of one host.
async fn offer(s: &mut Session, instrument: &str, price: &str, host: u32, gpus: &[u32], json: bool) -> Result<(), Failure> {
    let instrument = s.resolve(instrument).await?;
    let price = parse_amount(price).map_err(Failure::Usage)?;
    let gpu_mask = gpus.iter().try_fold(0u64, |mask, &i| (i < 64).then_some(mask | (1 << i)));
    let gpu_mask = gpu_mask.ok_or_else(|| Failure::Usage("GPU indexes are below 64".into()))?;
    let mut order = OrderTicket::limit(now_ms(), instrument, Side::Sell, price, gpu_mask.count_ones());
    order.supply = Some(GpuSet { host: gpux_engine::HostId(host), gpu_mask });
    write(s, |id| ClientMessage::NewOrder { id, order, workload: None }, ("offer placed", "offer"), json).await
}

/// `gpux account`: the account's number.
fn account_id(s: &Session, json: bool) -> Result<(), Failure> {
    let account = s.connection.account.0;
    out!("{}", if json { format!("{{\"account\":{account}}}") } else { account.to_string() });
    Ok(())
}

/// `gpux completions`: the shell's completion script. As every output, a
/// closed pipe ends the program quietly.
fn completions(shell: clap_complete::Shell) {
    use clap::CommandFactory;
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "gpux", &mut script);
    out!("{}", String::from_utf8_lossy(&script).trim_end());
}

/// `gpux login`: the account and role the key logged in as.
fn logged_in(s: &Session, json: bool) -> Result<(), Failure> {
    let account = s.connection.account;
    let actual = s.connection.role.ok_or_else(|| Failure::Unreachable("the exchange sent no role at login".into()))?;
    // --role opens an account for a new key; a key that has one keeps its role.
    if let Some(asked) = s.role.filter(|asked| *asked != actual) {
        return Err(Failure::Refused(format!(
            "this key already has account {account} as {}, not {}: --role only opens an account for a new key (make one with `gpux --key PATH keys create`, then `gpux --key PATH login --role ...`)",
            role_name(actual),
            role_name(asked)
        )));
    }
    if json {
        out!("{{\"account\":{},\"role\":\"{}\"}}", account.0, role_name(actual));
    } else {
        out!("logged in as account {account} ({})", role_name(actual));
    }
    Ok(())
}

/// `gpux balance`: available, held, payable and owed.
async fn balance(s: &mut Session, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::Balance { id }, json).await?;
    if json {
        return Ok(());
    }
    if let ServerMessage::Balance { available_minor, held_minor, payable_minor, debt_minor, .. } = answer {
        out!("available {}", amount(available_minor));
        out!("held      {}  (open bids and lease escrow)", amount(held_minor));
        out!("payable   {}  (earnings not yet paid out)", amount(payable_minor));
        out!("owed      {}", amount(debt_minor));
    }
    Ok(())
}

/// `gpux gpus`: every GPU of the account, page by page, with its last
/// challenges.
async fn gpus(s: &mut Session, json: bool) -> Result<(), Failure> {
    let mut all = Vec::new();
    let mut offset = 0;
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Gpus { gpus, next_offset, .. } = s.ask(ClientMessage::MyGpus { id, offset }, json).await? else {
            break;
        };
        all.extend(gpus);
        match next_offset {
            Some(next) => offset = next,
            None => break,
        }
    }
    if !json {
        out!(
            "{:>6} {:>6} {:>5}  {:<28} {:<8} {:<24} {:<22} {:<20} classes",
            "gpu",
            "host",
            "index",
            "model",
            "online",
            "challenge",
            "memory challenge",
            "region/zone"
        );
        for gpu in all {
            // The last hardware challenge: its outcome and the rate it showed.
            let challenge = match gpu.challenge {
                Some(c) => format!("{} {} MFLOP/s", c.outcome.name(), c.mflops),
                None => "none yet".to_string(),
            };
            // The last memory-bandwidth challenge, likewise.
            let memory = match gpu.memory {
                Some(m) => format!("{} {} MB/s", m.outcome.name(), m.mbps),
                None => "none yet".to_string(),
            };
            let region = match (&gpu.region, gpu.zone.as_str()) {
                (Some(region), "") => region.clone(),
                (Some(region), zone) => format!("{region}/{zone}"),
                (None, _) => "-".to_string(),
            };
            out!(
                "{:>6} {:>6} {:>5}  {:<28} {:<8} {:<24} {:<22} {:<20} {}",
                gpu.gpu.0,
                gpu.host.0,
                gpu.index_on_host,
                gpu.spec.model,
                gpu.online,
                challenge,
                memory,
                region,
                gpu.classes.join(",")
            );
        }
    }
    Ok(())
}

/// `gpux spend`: sets or clears the spend limits when asked, then shows
/// them with what was spent.
async fn spend(
    s: &mut Session,
    daily: Option<String>,
    total: Option<String>,
    max_held: Option<String>,
    clear: bool,
    json: bool,
) -> Result<(), Failure> {
    let parse = |text: Option<String>| text.map(|t| parse_amount(&t)).transpose().map_err(Failure::Usage);
    let limits = gpux_engine::SpendLimits { daily_minor: parse(daily)?, total_minor: parse(total)?, max_held_minor: parse(max_held)? };
    if clear || limits != gpux_engine::SpendLimits::default() {
        let id = s.connection.new_id();
        let answer = s.ask(ClientMessage::SetSpendLimits { id, limits }, json).await?;
        if !json {
            acknowledged(answer, if clear { "spend limits removed" } else { "spend limits set" })?;
        }
    }
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::Spend { id }, json).await?;
    if let (false, ServerMessage::Spend { spend, .. }) = (json, answer) {
        match spend {
            None => out!("no spend limits"),
            Some(status) => {
                let limit = |l: Option<u64>| l.map_or_else(|| "none".to_string(), amount);
                out!(
                    "spent today {}, in all {}, held {}; limits: daily {}, total {}, held {}",
                    amount(status.spent_today_minor),
                    amount(status.spent_total_minor),
                    amount(status.held_minor),
                    limit(status.limits.daily_minor),
                    limit(status.limits.total_minor),
                    limit(status.limits.max_held_minor)
                );
            }
        }
    }
    Ok(())
}

/// Money in or out of an account.
enum Move {
    Deposit(AccountId),
    Withdraw,
    Payout,
}

/// `gpux deposit`, `withdraw` and `payout`.
async fn move_money(s: &mut Session, kind: Move, amount: &str, json: bool) -> Result<(), Failure> {
    let amount_minor = parse_amount(amount).map_err(Failure::Usage)?;
    let id = s.connection.new_id();
    let (message, done, what) = match kind {
        Move::Deposit(account) => (ClientMessage::Deposit { id, account, amount_minor }, ("deposited", "deposit"), None),
        Move::Withdraw => (ClientMessage::Withdraw { id, account: None, amount_minor }, ("withdrawn", "withdraw"), Some("available funds")),
        Move::Payout => (ClientMessage::Payout { id, account: None, amount_minor }, ("paid out", "payout"), Some("payable earnings")),
    };
    let answer = s.connection.request(message).await.map_err(|e| Failure::Unreachable(format!("{e:#}")))?;
    // More than may leave the account: say what may.
    if let (ServerMessage::Reject { code: gpux_engine::RejectCode::InsufficientFunds, .. }, Some(what)) = (&answer, what) {
        let _ = crate::session::answered(answer, json);
        return Err(Failure::Refused(format!(
            "insufficient_funds: more than the account's {what} (`gpux balance` shows them; funds held by open bids and leases cannot leave)"
        )));
    }
    let answer = crate::session::answered(answer, json)?;
    written(s, answer, done.0, done.1, json).await
}

async fn place(s: &mut Session, side: Side, args: OrderArgs, json: bool) -> Result<(), Failure> {
    if let (Side::Sell, Some(flag)) = (side, args.bid_only_flag()) {
        return Err(Failure::Usage(format!("{flag} is for bids (`gpux buy`), not for selling")));
    }
    let order = ticket(s, side, &args).await?;
    let (price, time_in_force, stop) = (order.price_minor_per_gpu_hour, order.time_in_force, order.stop_price_minor_per_gpu_hour);
    let id = s.connection.new_id();
    let answer = s.ask(ClientMessage::NewOrder { id, order, workload: None }, json).await?;
    let placed = match &answer {
        ServerMessage::Ack { order, .. } => *order,
        _ => None,
    };
    if !json {
        acknowledged(answer, "accepted")?;
    }
    let Placed { filled, closed, armed } = placed_outcome(s, placed, json).await?;
    if json {
        // One last line that scripts read: how the order stands.
        let state = match (armed && closed.is_none(), closed, filled) {
            (true, _, _) => "armed",
            (false, None, 0) => "resting",
            (false, None, _) => "partly_filled_resting",
            (false, Some(OrderCloseReason::Filled), _) => "filled",
            (false, Some(_), 0) => "closed_unfilled",
            (false, Some(_), _) => "partly_filled_closed",
        };
        let outcome = serde_json::json!({"outcome": {
            "order": placed.map(|o| o.0),
            "state": state,
            "filled_gpus": filled,
            "closed": closed.map(|reason| reason.name()),
        }});
        out!("{outcome}");
    }
    if armed && closed.is_none() {
        if !json {
            out!(
                "armed: off the book until a trade prints at {}/GPU-h or {}",
                amount(stop),
                if side == Side::Buy { "above" } else { "below" }
            );
        }
        return Ok(());
    }
    // An order that ends without trading all it could is not a silent
    // success, with --json or without (the exit status says it).
    match (closed, filled) {
        (None, _) => {
            if !json {
                out!("resting: the rest waits in the book ({})", time_in_force.name());
            }
            Ok(())
        }
        (Some(OrderCloseReason::Filled), _) => Ok(()),
        (Some(reason), 0) => Err(Failure::Refused(format!(
            "nothing filled ({}): no {} at {} or better{} could serve it now",
            reason.name(),
            if side == Side::Buy { "ask" } else { "bid" },
            if price == 0 { "any price".to_string() } else { format!("{}/GPU-h", amount(price)) },
            if args.filters.regions.is_empty() { String::new() } else { format!(" in {}", args.filters.regions.join(", ")) }
        ))),
        (Some(reason), filled) => {
            if !json {
                out!("partly filled: {filled} GPU(s); the rest closed ({})", reason.name());
            }
            Ok(())
        }
    }
}

/// The order ticket `gpux buy` and `gpux sell` send.
async fn ticket(s: &mut Session, side: Side, args: &OrderArgs) -> Result<OrderTicket, Failure> {
    let instrument = s.resolve(&args.instrument).await?;
    let (order_type, price) = match &args.price {
        Some(price) => (OrderType::Limit, parse_amount(price).map_err(Failure::Usage)?),
        None => (OrderType::Market, 0),
    };
    let mut order = OrderTicket::limit(args.client_id.unwrap_or_else(now_ms), instrument, side, price, args.quantity);
    order.order_type = order_type;
    order.time_in_force = match (args.expire_after_s, args.tif) {
        (Some(seconds), _) => {
            TimeInForce::Gtt { expire_at_ms: now_ms().saturating_add_signed(s.connection.clock_offset_ms) + seconds * 1_000 }
        }
        (None, TifArg::Gtc) if order_type == OrderType::Market => TimeInForce::Ioc,
        (None, TifArg::Gtc) => TimeInForce::Gtc,
        (None, TifArg::Ioc) => TimeInForce::Ioc,
        (None, TifArg::Fok) => TimeInForce::Fok,
    };
    order.post_only = args.post_only;
    order.self_trade_prevention = match args.stp {
        crate::StpArg::CancelNewest => gpux_engine::SelfTradePrevention::CancelNewest,
        crate::StpArg::CancelOldest => gpux_engine::SelfTradePrevention::CancelOldest,
        crate::StpArg::Decrement => gpux_engine::SelfTradePrevention::Decrement,
        crate::StpArg::CancelBoth => gpux_engine::SelfTradePrevention::CancelBoth,
    };
    order.one_host = args.one_host;
    args.filters.apply(&mut order)?;
    order.all_or_none = args.all_or_none;
    order.nodes = args.nodes.unwrap_or(0);
    order.min_fabric_gbps = args.min_fabric_gbps.unwrap_or(0);
    if let Some(budget) = &args.budget {
        order.budget_minor = parse_amount(budget).map_err(|e| Failure::Usage(format!("--budget: {e}")))?;
    }
    if let Some(stop) = &args.stop {
        order.stop_price_minor_per_gpu_hour = parse_amount(stop).map_err(|e| Failure::Usage(format!("--stop: {e}")))?;
    }
    order.duration = if args.until_cancelled {
        LeaseDuration::UntilCancelled
    } else {
        crate::money::parse_hours(&args.hours).map_err(Failure::Usage)?
    };
    Ok(order)
}

/// What became of a placed order at once.
struct Placed {
    /// GPUs traded.
    filled: u32,
    closed: Option<OrderCloseReason>,
    /// A stop order waiting for its trigger.
    armed: bool,
}

/// Reads what happened at once: fills and leases arrive as private events
/// (with --json, each printed as the line the exchange sent).
async fn placed_outcome(s: &mut Session, placed: Option<OrderId>, json: bool) -> Result<Placed, Failure> {
    let symbols = if json { Default::default() } else { s.symbols().await? };
    let (mut filled, mut closed, mut armed) = (0u32, None, false);
    while let Ok(Some(message)) = s.connection.next_within(Duration::from_millis(300)).await {
        if json {
            out!("{}", gpux_protocol::encode_server_text(&message));
        }
        if let ServerMessage::Private { event, .. } = message {
            if !json {
                describe_event(&event.kind, &symbols);
            }
            match event.kind {
                EventKind::Trade { quantity, buy_order, sell_order, .. } if Some(buy_order) == placed || Some(sell_order) == placed => {
                    filled += quantity
                }
                EventKind::OrderClosed { order, reason, .. } if Some(order) == placed => closed = Some(reason),
                EventKind::StopArmed { order, .. } if Some(order) == placed => armed = true,
                EventKind::StopTriggered { order, .. } if Some(order) == placed => armed = false,
                _ => {}
            }
        }
    }
    Ok(Placed { filled, closed, armed })
}

fn describe_event(kind: &EventKind, symbols: &std::collections::HashMap<InstrumentId, String>) {
    let symbol = |instrument: &InstrumentId| symbols.get(instrument).cloned().unwrap_or_else(|| format!("instrument {}", instrument.0));
    let at = |ms: u64| crate::clock::when(ms);
    match kind {
        EventKind::Trade { price_minor_per_gpu_hour, quantity, instrument, .. } => {
            out!("filled {quantity} GPU(s) of {} at {}/GPU-h", symbol(instrument), amount(*price_minor_per_gpu_hour))
        }
        EventKind::LeaseCreated { lease, kind, gpu_mask, start_ms, end_ms, .. } => out!(
            "lease {} ({}): {} GPU(s) from {}{}",
            lease.0,
            kind.name(),
            gpu_mask.count_ones(),
            at(*start_ms),
            end_ms.map_or(" until you end it".into(), |end| format!(" to {}", at(end)))
        ),
        EventKind::PreemptionNotice { lease, ends_at_ms } => out!("PREEMPTION NOTICE: lease {} ends at {}", lease.0, at(*ends_at_ms)),
        EventKind::PaymentNotice { lease, ends_at_ms, shortfall_minor, .. } => {
            out!("PAYMENT NOTICE: lease {} needs {} more by {}", lease.0, amount(*shortfall_minor), at(*ends_at_ms))
        }
        EventKind::LeaseEnded { lease, reason } => out!("lease {} ended: {}", lease.0, reason.name()),
        EventKind::OrderClosed { order, reason, quantity_left, .. } => {
            out!("order {} closed: {} ({quantity_left} left)", order.0, reason.name())
        }
        EventKind::OrderReduced { order, quantity_left, reason: gpux_engine::ReduceReason::BudgetLimit, .. } => {
            out!("order {}: the budget left buys {quantity_left} more GPU(s) at its limit; that rests", order.0)
        }
        EventKind::StopTriggered { order, last_trade_price_minor_per_gpu_hour, .. } => {
            out!("stop order {} triggered by a trade at {}/GPU-h", order.0, amount(*last_trade_price_minor_per_gpu_hour))
        }
        EventKind::StopRefused { order, code, .. } => out!("stop order {} refused at its trigger: {}", order.0, code.message()),
        _ => {}
    }
}

async fn fills(s: &mut Session, seconds: Option<u64>, json: bool) -> Result<(), Failure> {
    let deadline = seconds.map(|s| now_ms() + s * 1_000);
    let symbols = s.symbols().await?;
    if !json {
        out!("following fills, leases and notices of account {} (Ctrl-C to stop)", s.connection.account);
    }
    loop {
        if deadline.is_some_and(|d| now_ms() >= d) {
            return Ok(());
        }
        match s.connection.next_within(Duration::from_millis(250)).await {
            Ok(Some(message)) => {
                if json {
                    out!("{}", gpux_protocol::encode_server_text(&message));
                } else if let ServerMessage::Private { event, .. } = message {
                    describe_event(&event.kind, &symbols);
                }
            }
            Ok(None) => {}
            Err(error) => return Err(Failure::Unreachable(format!("{error:#}"))),
        }
    }
}

async fn statement(s: &mut Session, mut after: Option<u64>, json: bool) -> Result<(), Failure> {
    if !json {
        out!("{:>10} {:<23} {:<16} {:<16} {:>16} {:>6}  description", "transfer", "time", "from", "to", "amount", "lease");
    }
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Statement { lines, next_after, .. } = s.ask(ClientMessage::Statement { id, after }, json).await? else {
            return Ok(());
        };
        if !json {
            for line in &lines {
                let lease = line.lease.map_or(String::new(), |l| l.0.to_string());
                out!(
                    "{:>10} {:<23} {:<16} {:<16} {:>16} {lease:>6}  {}",
                    line.transfer,
                    crate::clock::when(line.at_ms),
                    line.from,
                    line.to,
                    amount(line.amount_minor),
                    line.description
                );
            }
        }
        match next_after {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

async fn orders(s: &mut Session, only: Option<Side>, json: bool) -> Result<(), Failure> {
    let symbols = if json { Default::default() } else { s.symbols().await? };
    if !json {
        out!("{:>12} {:>14} {:<30} {:<5} {:>12} {:>5}  regions", "order", "client id", "instrument", "side", "price/GPU-h", "qty");
    }
    let mut after = None;
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Orders { orders, next_after, .. } = s.ask(ClientMessage::OpenOrders { id, after }, json).await? else {
            return Ok(());
        };
        if !json {
            for order in orders.iter().filter(|o| only.is_none_or(|side| o.side == side)) {
                out!(
                    "{:>12} {:>14} {:<30} {:<5} {:>12} {:>5}  {}",
                    order.order.0,
                    order.client_order_id,
                    symbols.get(&order.instrument).map_or_else(|| order.instrument.0.to_string(), String::clone),
                    order.side.name(),
                    amount(order.price_minor_per_gpu_hour),
                    order.quantity,
                    if order.regions.is_empty() { "any".to_string() } else { order.regions.join(",") }
                );
            }
        }
        match next_after {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

async fn leases(s: &mut Session, json: bool) -> Result<(), Failure> {
    if !json {
        out!(
            "{:>7} {:<12} {:>6} {:>8} {:>12} {:>7} {:>12} {:>12}  {:<25} until",
            "lease",
            "kind",
            "renter",
            "supplier",
            "price/GPU-h",
            "active",
            "verified s",
            "charged",
            "from"
        );
    }
    let mut after = None;
    loop {
        let id = s.connection.new_id();
        let ServerMessage::Leases { leases, next_after, .. } = s.ask(ClientMessage::Leases { id, after }, json).await? else {
            return Ok(());
        };
        if !json {
            for lease in &leases {
                // Until it ended, or until its end (none for until-cancelled leases).
                let until = match (lease.ended_at_ms, lease.end_ms) {
                    (Some(ended), _) => crate::clock::when(ended),
                    (None, Some(end)) => crate::clock::when(end),
                    (None, None) => "cancelled".into(),
                };
                out!(
                    "{:>7} {:<12} {:>6} {:>8} {:>12} {:>7} {:>12} {:>12}  {:<25} {until}",
                    lease.lease.0,
                    lease.kind.name(),
                    lease.renter.0,
                    lease.supplier.0,
                    amount(lease.price_minor_per_gpu_hour),
                    lease.active,
                    lease.verified_gpu_ms / 1_000,
                    amount(lease.usage_charged_minor),
                    crate::clock::when(lease.start_ms)
                );
            }
        }
        match next_after {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

async fn instruments(s: &mut Session, calendar: bool, json: bool) -> Result<(), Failure> {
    let id = s.connection.new_id();
    let ServerMessage::Instruments { instruments, .. } = s.ask(ClientMessage::Instruments { id }, json).await? else { return Ok(()) };
    if json {
        return Ok(());
    }
    out!("{:>5}  {:<44} {:<9} {:>9} {:>12} {:>12} {:>12} window (UTC)", "id", "symbol", "state", "tick", "best bid", "best ask", "last");
    for info in instruments.iter().filter(|i| !calendar || matches!(i.contract, ContractKind::Reserved { .. })) {
        let reserved = matches!(info.contract, ContractKind::Reserved { .. });
        let window = match info.contract {
            ContractKind::Reserved { window_start_ms, window_end_ms } => {
                format!("{} to {}", gpux_engine::time::format_utc_hour(window_start_ms), gpux_engine::time::format_utc_hour(window_end_ms))
            }
            _ => String::new(),
        };
        // Quotes for the books a renter trades every day, and for the
        // windows when they are what is listed (`--calendar`).
        let (bid, ask, last) = if calendar || !reserved { quote(s, info.instrument).await? } else { (None, None, None) };
        let shown = |price: Option<u64>| price.map_or_else(|| "-".to_string(), amount);
        out!(
            "{:>5}  {:<44} {:<9} {:>9} {:>12} {:>12} {:>12} {window}",
            info.instrument.0,
            info.symbol,
            info.state.name(),
            amount(info.tick_minor),
            shown(bid),
            shown(ask),
            shown(last)
        );
    }
    Ok(())
}

/// An instrument's best bid and ask now and its last trade price.
async fn quote(s: &mut Session, instrument: InstrumentId) -> Result<(Option<u64>, Option<u64>, Option<u64>), Failure> {
    let id = s.connection.new_id();
    let (bid, ask) = match s.ask(ClientMessage::Book { id, instrument }, false).await? {
        ServerMessage::Book { bids, asks, .. } => (bids.first().map(|level| level.0), asks.first().map(|level| level.0)),
        _ => (None, None),
    };
    let id = s.connection.new_id();
    let last = match s.ask(ClientMessage::Stats { id, instrument }, false).await? {
        ServerMessage::Stats { last, .. } => last,
        _ => None,
    };
    Ok((bid, ask, last))
}

/// A role as the protocol writes it.
fn role_name(role: Role) -> &'static str {
    role.name()
}

#[cfg(test)]
mod tests {
    use super::parse_percent_bps;

    #[test]
    fn a_min_score_is_a_percent_with_two_decimals_at_most() {
        assert_eq!(parse_percent_bps("99.5"), Ok(9_950));
        assert_eq!(parse_percent_bps("99.25"), Ok(9_925));
        assert_eq!(parse_percent_bps("100"), Ok(10_000));
        assert_eq!(parse_percent_bps("0.01"), Ok(1));
        for bad in ["", "0", "100.01", "99.999", "-1", "1e2", ".5", "99.", "1000"] {
            assert!(parse_percent_bps(bad).is_err(), "{bad:?}");
        }
    }
}
