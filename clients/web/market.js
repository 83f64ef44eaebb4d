// Market data: instruments, the reserved-window calendar, the chosen
// book (ladder, depth chart, offers with their sellers' scores), its
// figures, trades and the price chart.

import { state } from "./state.js";
import { $, chartWidth, esc, money, symbolOf, utcHour } from "./util.js";
import { request } from "./connection.js";

// The charts follow their panels' width (the grid changes with the window).
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    renderBook();
    if (state.chart) state.chart.setSize({ width: chartWidth($("prices")), height: 200 });
  }, 100);
});

export async function loadInstruments() {
  const { body: listed } = await request("listing");
  state.currency = listed.listing.currency;
  state.regions = listed.listing.regions;
  state.classes = listed.listing.classes;
  $("t-regions").replaceChildren(...state.regions.map((name) => new Option(name, name)));
  $("s-region").replaceChildren(new Option("any", ""), ...state.regions.map((name) => new Option(name, name)));
  for (const unit of document.querySelectorAll(".currency")) unit.textContent = state.currency.code;
  $("t-price").placeholder = `${state.currency.code}/GPU-h`;
  $("t-budget").placeholder = `budget ${state.currency.code}`;
  $("t-stop").placeholder = `stop ${state.currency.code}/GPU-h`;
  const { body } = await request("instruments");
  state.instruments = body.instruments;
  const list = $("instruments");
  list.replaceChildren();
  for (const info of state.instruments.filter((i) => typeof i.contract === "string")) {
    const item = document.createElement("li");
    item.dataset.instrument = info.instrument;
    item.innerHTML = `${info.symbol}<span class="state">${info.state}</span><div class="bbo"></div><div class="quote"></div>`;
    item.onclick = () => select(info.instrument);
    list.append(item);
  }
  renderCalendar();
  select(state.selected ?? state.instruments[0].instrument);
  refreshQuotes();
}

// Each standing book's best bid and ask (public `book`), last price,
// 24-hour change and volume (public `stats`), under its name in the list;
// refreshed every 15 s. The shown book's own entry follows its live feed
// (`listBestPrices`), so the list and the book never disagree.
async function refreshQuotes() {
  clearTimeout(state.quotesTimer);
  for (const item of $("instruments").children) {
    try {
      const { body: b } = await request("book", { instrument: Number(item.dataset.instrument) });
      const best = (levels) => (levels.length ? money(levels[0][0]) : "none");
      // The shown book's entry is the live feed's (listBestPrices).
      if (Number(item.dataset.instrument) !== state.selected) item.querySelector(".bbo").textContent = `bid ${best(b.bids)} · ask ${best(b.asks)}`;
      const { body: s } = await request("stats", { instrument: Number(item.dataset.instrument) });
      const change = s.open === null || s.open === 0 ? "" : ` ${s.last >= s.open ? "+" : ""}${(((s.last - s.open) / s.open) * 100).toFixed(1)}%`;
      item.querySelector(".quote").textContent = s.last === null ? "no trades in 24 h" : `last ${money(s.last)}${change} · ${s.volume} GPUs`;
    } catch (error) {
      return; // disconnected: the reconnect reloads the list
    }
  }
  // The calendar's windows too: their quotes move as the list's do.
  const chosen = $("calendar-class").value;
  const shown = state.instruments.filter((i) => i.contract.reserved && i.state !== "expired" && i.class === chosen);
  await calendarPrices(chosen, shown).catch(() => {});
  state.quotesTimer = setTimeout(refreshQuotes, 15000);
}

// The calendar of one class at a time (every window it lists, none cut
// off): each window's times, length, state, best bid and ask and last
// price (asked when shown, then with the list's quotes every 15 s); a row
// opens that window's book.
function renderCalendar() {
  const windows = state.instruments.filter((i) => i.contract.reserved && i.state !== "expired");
  const classes = [...new Set(windows.map((i) => i.class))];
  const picker = $("calendar-class");
  const chosen = classes.includes(picker.value) ? picker.value : classes[0];
  picker.innerHTML = classes.map((c) => `<option${c === chosen ? " selected" : ""}>${esc(c)}</option>`).join("");
  const shown = windows.filter((i) => i.class === chosen);
  const span = (r) => {
    const start = utcHour(r.window_start_ms);
    const end = utcHour(r.window_end_ms);
    if (start.slice(0, 10) === end.slice(0, 10)) return `${start} to ${end.slice(11)}`;
    // Whole days: the dates alone.
    if (start.endsWith("00:00") && end.endsWith("00:00")) return `${start.slice(0, 10)} to ${end.slice(0, 10)}`;
    return `${start} to ${end}`;
  };
  const rows = shown.map((i) => {
    const r = i.contract.reserved;
    const hours = Math.round((r.window_end_ms - r.window_start_ms) / 3.6e6);
    return `<tr data-instrument="${i.instrument}"><td class="text">${span(r)}</td><td>${hours}</td><td class="text">${i.state}</td><td class="bid">…</td><td class="ask">…</td><td class="last">…</td><td class="text symbol">${esc(i.symbol)}</td></tr>`;
  });
  $("calendar").tBodies[0].innerHTML = rows.join("");
  calendarPrices(chosen, shown).catch(() => {});
}

// Each shown window's best bid and ask (`book`) and last price (`stats`).
async function calendarPrices(chosen, shown) {
  for (const info of shown) {
    if ($("calendar-class").value !== chosen) return;
    const row = $("calendar").querySelector(`tr[data-instrument="${info.instrument}"]`);
    if (!row) return;
    const { body: b } = await request("book", { instrument: info.instrument });
    const { body: s } = await request("stats", { instrument: info.instrument });
    row.querySelector(".bid").textContent = b.bids.length ? money(b.bids[0][0]) : "none";
    row.querySelector(".ask").textContent = b.asks.length ? money(b.asks[0][0]) : "none";
    row.querySelector(".last").textContent = s.last === null ? "none" : money(s.last);
  }
}
$("calendar-class").onchange = () => renderCalendar();
$("calendar").onclick = (event) => {
  const row = event.target.closest("tr[data-instrument]");
  if (row) select(Number(row.dataset.instrument));
};

export async function select(instrument) {
  if (state.selected !== null && state.selected !== instrument) {
    await request("unsubscribe", { channel: "book", instrument: state.selected });
    await request("unsubscribe", { channel: "trades", instrument: state.selected });
  }
  state.selected = instrument;
  state.book = { seq: 0, synced: false, bids: new Map(), asks: new Map() };
  state.trades = [];
  for (const item of $("instruments").children) item.classList.toggle("selected", Number(item.dataset.instrument) === instrument);
  const info = state.instruments.find((i) => i.instrument === instrument);
  $("symbol").textContent = info ? info.symbol : String(instrument);
  await request("subscribe", { channel: "book", instrument });
  await request("subscribe", { channel: "trades", instrument });
  // The history before the subscription (docs/protocol.md "History"),
  // merged with what the live feed brought meanwhile.
  const { body: history } = await request("trades", { instrument, before_seq: null });
  if (instrument !== state.selected) return;
  const seen = new Set(state.trades.map((t) => t.seq));
  state.trades.push(...history.trades.filter((t) => !seen.has(t.seq)).map((t) => ({ instrument, ...t })));
  state.trades.sort((a, b) => b.seq - a.seq);
  state.trades.length = Math.min(state.trades.length, 100);
  renderTrades();
  refreshCandles();
  refreshOffers();
  refreshStats();
}

// The shown book's figures beside the ticket: last price, 24-hour change,
// volume, best bid and ask and the spread (public `stats`, and the book).
async function refreshStats() {
  const instrument = state.selected;
  const { body: s } = await request("stats", { instrument });
  if (instrument !== state.selected) return;
  const bid = Math.max(...state.book.bids.keys(), -1);
  const ask = Math.min(...state.book.asks.keys(), Infinity);
  const change = s.open === null || s.open === 0 || s.last === null ? "none" : `${s.last >= s.open ? "+" : ""}${(((s.last - s.open) / s.open) * 100).toFixed(1)}%`;
  const rows = [
    ["last", s.last === null ? "none in 24 h" : money(s.last)],
    ["24 h change", change],
    ["24 h volume", `${s.volume} GPU(s)`],
    ["best bid", bid < 0 ? "none" : money(bid)],
    ["best ask", ask === Infinity ? "none" : money(ask)],
    ["spread", bid < 0 || ask === Infinity ? "none" : money(ask - bid)],
  ];
  $("stats-symbol").textContent = symbolOf(instrument);
  $("stats").innerHTML = rows.map(([name, value]) => `<dt>${name}</dt><dd>${esc(value)}</dd>`).join("");
}

function statsChanged() {
  if (state.statsTimer) return;
  state.statsTimer = setTimeout(() => {
    state.statsTimer = null;
    refreshStats().catch(() => {});
  }, 1000);
}

// The price chart: the selected interval's candles (`candles`), drawn by
// uPlot with a time axis (UTC) and a price axis in the exchange's currency;
// redrawn at most every 2 s while trades come in.
async function refreshCandles() {
  const instrument = state.selected;
  const { body } = await request("candles", { instrument, interval: state.interval, before_ms: null });
  if (instrument !== state.selected) return;
  const candles = body.candles;
  // Three empty candles' room either side, so one candle is drawn in the
  // middle of a time axis rather than alone at its edge.
  const step = { "1m": 60, "1h": 3600, "1d": 86400 }[state.interval];
  const at = candles.map((c) => c.start_ms / 1000);
  const padded = (values) => [null, ...values, null];
  const data = [
    at.length ? [at[0] - 3 * step, ...at, at[at.length - 1] + 3 * step] : [],
    padded(candles.map((c) => c.close)),
    padded(candles.map((c) => c.high)),
    padded(candles.map((c) => c.low)),
  ];
  const holder = $("prices");
  holder.dataset.candles = String(candles.length);
  if (state.chart) state.chart.destroy();
  state.chart = null;
  if (candles.length === 0) {
    holder.innerHTML = `<p class="empty">no trades yet on this book: no candles to draw</p>`;
    return;
  }
  holder.replaceChildren();
  const price = (u, ticks) => ticks.map((minor) => money(Math.round(minor)));
  // ISO dates and 24-hour times in UTC, never US-style: a day's candles by
  // date, shorter ones by date and time, one-minute ones by time.
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 360, 720, 1440, 2880, 10080, 43200].map((n) => n * 60).filter((s) => s >= step);
  const times = (u, ticks) =>
    ticks.map((ts) => {
      const iso = new Date(ts * 1000).toISOString();
      if (state.interval === "1d") return iso.slice(0, 10);
      if (state.interval === "1h") return `${iso.slice(5, 10)} ${iso.slice(11, 16)}`;
      return iso.slice(11, 16);
    });
  state.chart = new uPlot(
    {
      width: chartWidth(holder), height: 200, tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      legend: { show: false }, cursor: { show: true },
      // A few candles' room either side, and ticks on whole candles.
      scales: { x: { time: true } },
      axes: [{ stroke: "#444", grid: { stroke: "#eee" }, values: times, space: 70, incrs: steps }, { stroke: "#444", grid: { stroke: "#eee" }, size: 80, values: price }],
      series: [
        {},
        { label: "close", stroke: "#14213d", width: 2, points: { show: candles.length < 3 } },
        { label: "high", stroke: "#9aa6c0", width: 1 },
        { label: "low", stroke: "#9aa6c0", width: 1 },
      ],
      bands: [{ series: [2, 3], fill: "rgba(20, 33, 61, 0.08)" }],
    },
    data,
    holder,
  );
}

function candlesChanged() {
  if (state.candlesTimer !== null) return;
  state.candlesTimer = setTimeout(() => {
    state.candlesTimer = null;
    refreshCandles().catch(() => {});
  }, 2000);
}

$("interval").onchange = () => {
  state.interval = $("interval").value;
  refreshCandles().catch(() => {});
};

// A host's fabric in the offers table: its group and host count, the Gb/s
// claimed and what its last interconnect probe measured
// (docs/market-rules.md "Interconnect probe").
function fabric(f) {
  if (!f) return "none";
  const group = `${esc(f.name)} (${f.hosts} hosts), ${f.gbps} Gb/s`;
  if (!f.probe) return `${group}, not probed`;
  const measured = (f.probe.mbps / 1000).toFixed(1);
  return f.probe.borne_out ? `${group}, probed ${measured}` : `${group}, probe only ${measured}: not borne out`;
}

// The book's asks one by one with their sellers' scores (public
// `book_offers`, docs/protocol.md), the best 15; asked again at most once a
// second while the book moves.
async function refreshOffers() {
  const instrument = state.selected;
  const { body } = await request("book_offers", { instrument, offset: 0 });
  if (instrument !== state.selected) return;
  const score = (bps) => (bps === null ? "unrated" : (bps / 100).toFixed(2) + "%");
  $("offers").tBodies[0].innerHTML = body.offers
    .slice(0, 15)
    .map((o) => {
      const verified = o.host === null ? "resold window" : `${o.gpus_verified} of ${o.quantity}`;
      return `<tr><td>${money(o.price_minor_per_gpu_hour)}</td><td>${o.quantity}</td><td>${o.supplier}</td><td>${score(o.supplier_score_bps)}</td><td>${verified}</td><td>${esc(o.region ?? "none")}</td><td>${fabric(o.fabric)}</td></tr>`;
    })
    .join("");
  const listed = (state.instruments ?? []).find((i) => i.instrument === instrument);
  const spec = (state.classes ?? []).find((c) => c.name === listed?.class);
  $("offers-verified").textContent = spec ? verifiedMeaning(spec) : "";
}

// What "verified" means in a class (docs/market-rules.md "Verified
// hardware"), as `gpux asks` says it.
function verifiedMeaning(spec) {
  const compute = spec.challenge;
  if (!compute) return `class ${spec.name} takes no hardware challenge: none of its GPUs is verified`;
  let text = `verified = the GPU's last challenges in ${spec.name} passed: a ${compute.n} x ${compute.n} matrix product at >= ${compute.min_mflops} MFLOP/s`;
  const memory = spec.memory_challenge;
  if (memory) text += ` and ${memory.passes} passes over 2^${memory.words_log2} words of memory at >= ${memory.min_mbps} MB/s`;
  text += "; asked again at random idle times, every 6 h on average";
  if (compute.min_mflops < 1000000) text += " (rates a CPU reaches: this proves the host computes honestly, not which accelerator it is)";
  return text;
}

function offersChanged() {
  if (state.offersTimer !== null) return;
  state.offersTimer = setTimeout(() => {
    state.offersTimer = null;
    refreshOffers().catch(() => {});
  }, 1000);
}

// A market-data message (alone, or one of a `market_data` frame's); false
// for any other.
export function onFeed(type, body) {
  if (type === "book_snapshot" || type === "book_update" || type === "book_conflated") onBook(type, body);
  else if (type === "trade") onTrade(body);
  else return false;
  return true;
}

function onBook(type, body) {
  if (body.instrument !== state.selected) return;
  const book = state.book;
  if (type === "book_snapshot") {
    book.seq = body.seq;
    book.bids = new Map(body.bids);
    book.asks = new Map(body.asks);
    book.synced = true;
  } else if (book.synced) {
    // An update carries seq; a conflated book (version 2) stands for the
    // updates from_seq to seq.
    const first = type === "book_conflated" ? body.from_seq : body.seq;
    if (body.seq <= book.seq) return; // older than the snapshot: already in it
    if (first !== book.seq + 1) {
      // A lost update: start again from a fresh snapshot.
      book.synced = false;
      request("unsubscribe", { channel: "book", instrument: body.instrument })
        .then(() => request("subscribe", { channel: "book", instrument: body.instrument }));
      return;
    }
    book.seq = body.seq;
    const changes =
      type === "book_conflated"
        ? [...body.bids.map(([price, quantity]) => ["buy", price, quantity]), ...body.asks.map(([price, quantity]) => ["sell", price, quantity])]
        : [[body.side, body.price_minor_per_gpu_hour, body.quantity]];
    for (const [side, price, quantity] of changes) {
      const levels = side === "buy" ? book.bids : book.asks;
      if (quantity === 0) levels.delete(price);
      else levels.set(price, quantity);
    }
    if (changes.some(([side]) => side === "sell")) offersChanged();
  }
  renderBook();
  statsChanged();
}

function renderBook() {
  const bids = [...state.book.bids].sort((a, b) => b[0] - a[0]).slice(0, 15);
  const asks = [...state.book.asks].sort((a, b) => a[0] - b[0]).slice(0, 15);
  const rows = [];
  for (let i = 0; i < Math.max(bids.length, asks.length, 1); i++) {
    const [bp, bq] = bids[i] || [];
    const [ap, aq] = asks[i] || [];
    rows.push(`<tr><td class="bid">${bq ?? ""}</td><td class="bid">${bp ? money(bp) : ""}</td><td class="ask">${ap ? money(ap) : ""}</td><td class="ask">${aq ?? ""}</td></tr>`);
  }
  $("ladder").tBodies[0].innerHTML = rows.join("");
  drawDepth(bids, asks);
  listBestPrices(bids, asks);
}

// The shown book's best bid and ask in the instrument list, from the same
// feed as the ladder.
function listBestPrices(bids, asks) {
  if (!state.book.synced) return;
  const item = $("instruments").querySelector(`li[data-instrument="${state.selected}"] .bbo`);
  const best = (levels) => (levels.length ? money(levels[0][0]) : "none");
  if (item) item.textContent = `bid ${best(bids)} · ask ${best(asks)}`;
}

// The price axis of the depth chart: the best prices and the levels
// within half the mid price either side; levels further off (a far bid
// that would squash the rest into a line) are counted, not drawn.
export function depthWindow(bids, asks) {
  const bestBid = bids.length ? bids[0][0] : null;
  const bestAsk = asks.length ? asks[0][0] : null;
  const mid = bestBid !== null && bestAsk !== null ? (bestBid + bestAsk) / 2 : bestBid ?? bestAsk;
  const near = (p) => p >= mid * 0.5 && p <= mid * 1.5;
  const keptBids = bids.filter(([p], i) => i === 0 || near(p));
  const keptAsks = asks.filter(([p], i) => i === 0 || near(p));
  return { bids: keptBids, asks: keptAsks, beyond: bids.length - keptBids.length + asks.length - keptAsks.length };
}

// The depth chart: cumulative GPUs bid (green) and offered (red) from the
// best prices outwards, with a price axis (the currency per GPU-hour) and a
// quantity axis (GPUs), sized to its panel.
function drawDepth(bids, asks) {
  const canvas = $("depth");
  const width = chartWidth($("depth-holder"));
  if (canvas.width !== width) canvas.width = width;
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, canvas.width, canvas.height);
  const left = 46, right = 12, top = 12, bottom = 34;
  const plotW = canvas.width - left - right, plotH = canvas.height - top - bottom;
  g.font = "11px system-ui, sans-serif";
  g.fillStyle = "#444";
  g.strokeStyle = "#999";
  g.lineWidth = 1;
  g.beginPath();
  g.moveTo(left, top);
  g.lineTo(left, top + plotH);
  g.lineTo(left + plotW, top + plotH);
  g.stroke();
  g.textAlign = "center";
  g.fillText(`${state.currency.code}/GPU-h`, left + plotW / 2, canvas.height - 2);
  g.save();
  g.translate(11, top + plotH / 2);
  g.rotate(-Math.PI / 2);
  g.fillText("GPUs", 0, 0);
  g.restore();
  if (bids.length + asks.length === 0) {
    state.depthRange = null;
    g.fillText("no orders on this book", left + plotW / 2, top + plotH / 2);
    return;
  }
  const shown = depthWindow(bids, asks);
  const beyond = shown.beyond;
  bids = shown.bids;
  asks = shown.asks;
  const prices = [...bids, ...asks].map(([p]) => p);
  let low = Math.min(...prices), high = Math.max(...prices);
  if (low === high) {
    low = Math.max(0, low - Math.max(1, Math.round(low / 10)));
    high = high + Math.max(1, Math.round(high / 10));
  }
  const cumulative = (levels) => levels.reduce((acc, [p, q]) => (acc.push([p, (acc.length ? acc[acc.length - 1][1] : 0) + q]), acc), []);
  const bidSteps = cumulative(bids), askSteps = cumulative(asks);
  const most = Math.max(1, ...bidSteps.map((s) => s[1]), ...askSteps.map((s) => s[1]));
  state.depthRange = { low, high, beyond };
  if (beyond > 0) {
    g.textAlign = "right";
    g.fillText(`${beyond} level(s) off the axis`, left + plotW, top + 10);
  }
  const x = (p) => left + ((p - low) / (high - low)) * plotW;
  const y = (q) => top + plotH - (q / most) * plotH;
  // Price ticks: three, at the ends and the middle; quantity ticks: 0, half, all.
  g.textAlign = "center";
  for (const p of [low, (low + high) / 2, high]) {
    g.fillText(money(Math.round(p)), Math.min(Math.max(x(p), left + 24), left + plotW - 24), top + plotH + 14);
  }
  g.textAlign = "right";
  for (const q of [0, Math.round(most / 2), most]) g.fillText(String(q), left - 4, y(q) + 4);
  for (const [steps, color] of [[bidSteps, "#0a7d32"], [askSteps, "#b42318"]]) {
    g.beginPath();
    g.strokeStyle = color;
    g.lineWidth = 2;
    // A staircase from the best price outwards: each level adds its GPUs.
    steps.forEach(([p, q], i) => {
      if (i === 0) g.moveTo(x(p), y(0));
      else g.lineTo(x(p), y(steps[i - 1][1]));
      g.lineTo(x(p), y(q));
    });
    g.stroke();
  }
}

function onTrade(body) {
  if (body.instrument !== state.selected) return;
  if (state.trades.some((t) => t.seq === body.seq)) return;
  state.trades.unshift(body);
  state.trades.length = Math.min(state.trades.length, 100);
  renderTrades();
  candlesChanged();
  statsChanged();
}

function renderTrades() {
  if (state.trades.length === 0) {
    $("trades").tBodies[0].innerHTML = `<tr><td colspan="4" class="empty">no trades yet</td></tr>`;
    return;
  }
  $("trades").tBodies[0].innerHTML = state.trades
    .slice(0, 12)
    .map((t) => `<tr><td>${new Date(t.at_ms).toISOString().slice(11, 19)}</td><td>${t.quantity}</td><td class="${t.aggressor}">${money(t.price_minor_per_gpu_hour)}</td><td class="${t.aggressor}">${t.aggressor}</td></tr>`)
    .join("");
}
