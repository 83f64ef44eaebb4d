// gpux web console, a trading screen (a grid from a phone to 1920 px, its
// layout checked in headless Chromium at three sizes): instruments, live
// books (ladder, depth chart with price and quantity axes, and each offer
// with its seller's reliability score), the book's figures beside the
// ticket, any supplier's reliability score and any renter's dispute record,
// trades (history on load, then live) with a price chart of candles (uPlot,
// vendored; ISO times in UTC), the reserved-window calendar with each
// window's prices and, once logged in with a key, an order ticket (every
// order type, labelled fields checked as typed, and each order's true
// outcome from the events before its acknowledgement), the account's orders
// (each with a cancel button), leases (an end button on active ones; each lease's delivery
// status and endpoints, and its supplier's reliability score), notices,
// statement, sub-accounts (open, fund, take back, their balances and
// limits) and signed invoices (checked against the exchange's key, printable).
// Plain browser JavaScript over the documented WebSocket protocol
// (docs/protocol.md): no framework, no build step, nothing fetched from
// elsewhere at run time. The key never leaves the page: it signs the login
// challenge with WebCrypto's Ed25519.
"use strict";

const state = {
  ws: null, nextId: 1, pending: new Map(), nonce: null,
  instruments: [], selected: null,
  book: { seq: 0, synced: false, bids: new Map(), asks: new Map() },
  trades: [], account: null, secret: null, refreshTimer: null,
  // The account's latest private events, for an order's outcome.
  events: [],
  leases: [], jobs: new Map(), deliveries: new Map(), scores: new Map(), offersTimer: null,
  // The exchange's currency, from its listing (docs/protocol.md "listing").
  currency: { code: "USD", decimals: 6 }, regions: [],
  // The price chart: its interval, its uPlot, and a pending redraw.
  interval: "1m", chart: null, candlesTimer: null,
};

const $ = (id) => document.getElementById(id);
// Minor units in the exchange's currency to the last minor unit, never
// rounded: cents always, more digits only when there are more ($0.000417,
// 15.05 CNY).
const money = (minor) => {
  const { code, decimals } = state.currency;
  const scale = 10 ** decimals;
  let text = String(Math.floor(minor / scale));
  if (decimals > 0) {
    const digits = String(minor % scale).padStart(decimals, "0");
    text += "." + (decimals < 2 ? digits : digits.replace(/0+$/, "").padEnd(2, "0"));
  }
  return code === "USD" ? `$${text}` : `${text} ${code}`;
};
const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
const fromHex = (text) => Uint8Array.from(text.match(/../g).map((h) => parseInt(h, 16)));
// Escapes text for innerHTML: hosts write failure reasons, so never trust them.
const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const utcHour = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");
// An instrument's symbol by id ("H100-SXM-80G/SPOT"), its id when unknown.
const symbolOf = (instrument) => state.instruments.find((i) => i.instrument === instrument)?.symbol ?? String(instrument);

function request(type, fields = {}) {
  const id = ++state.nextId;
  state.ws.send(JSON.stringify({ [type]: { id, ...fields } }));
  return new Promise((resolve, reject) => {
    state.pending.set(id, { resolve, reject });
  });
}

// The charts follow their panels' width (the grid changes with the window).
let resizeTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    renderBook();
    if (state.chart) state.chart.setSize({ width: chartWidth($("prices")), height: 200 });
  }, 100);
});
const chartWidth = (holder) => Math.max(200, Math.floor(holder.clientWidth || 420));

function connect() {
  state.ws = new WebSocket(window.GPUX_WS);
  state.ws.onopen = () => ($("connection").textContent = "connected to " + window.GPUX_WS);
  state.ws.onclose = () => {
    $("connection").textContent = "disconnected; reconnecting…";
    // Requests in flight get no answer on this socket.
    for (const waiting of state.pending.values()) waiting.reject(new Error("disconnected"));
    state.pending.clear();
    state.book.synced = false;
    setTimeout(connect, 1000);
  };
  state.ws.onmessage = (frame) => {
    const message = JSON.parse(frame.data);
    const [type, body] = Object.entries(message)[0];
    if (type === "challenge") {
      state.nonce = body.nonce;
      loadInstruments();
      // After a reconnect, log in again with the key already in the page.
      if (state.secret !== null) {
        login(state.secret).catch((error) => ($("account").textContent = "login failed: " + error.message));
      }
      return;
    }
    const waiting = body && body.id !== undefined && state.pending.get(body.id);
    if (waiting) {
      state.pending.delete(body.id);
      if (type === "reject" || type === "error") waiting.reject(new Error(body.code + ": " + body.message));
      else waiting.resolve({ type, body });
      return;
    }
    if (type === "market_data") {
      // Market-data version 2 (asked at login): several feed messages, in order.
      for (const inner of body.messages) onFeed(...Object.entries(inner)[0]);
    } else if (onFeed(type, body)) return;
    else if (type === "private") onPrivate(body.event, body.reason);
    else if (type === "delivery") {
      state.deliveries.set(body.lease, body.state);
      renderLeases();
    } else if (type === "job_update") {
      state.jobs.set(body.job.job, body.job);
      renderJobs();
    }
  };
}

async function loadInstruments() {
  const { body: listed } = await request("listing");
  state.currency = listed.listing.currency;
  state.regions = listed.listing.regions;
  state.classes = listed.listing.classes;
  $("t-regions").replaceChildren(...state.regions.map((name) => new Option(name, name)));
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
// refreshed every 15 s.
async function refreshQuotes() {
  clearTimeout(state.quotesTimer);
  for (const item of $("instruments").children) {
    try {
      const { body: b } = await request("book", { instrument: Number(item.dataset.instrument) });
      const best = (levels) => (levels.length ? money(levels[0][0]) : "none");
      item.querySelector(".bbo").textContent = `bid ${best(b.bids)} · ask ${best(b.asks)}`;
      const { body: s } = await request("stats", { instrument: Number(item.dataset.instrument) });
      const change = s.open === null || s.open === 0 ? "" : ` ${s.last >= s.open ? "+" : ""}${(((s.last - s.open) / s.open) * 100).toFixed(1)}%`;
      item.querySelector(".quote").textContent = s.last === null ? "no trades in 24 h" : `last ${money(s.last)}${change} · ${s.volume} GPUs`;
    } catch (error) {
      return; // disconnected: the reconnect reloads the list
    }
  }
  state.quotesTimer = setTimeout(refreshQuotes, 15000);
}

// The calendar of one class at a time (every window it lists, none cut
// off): each window's times, length, state, best bid and ask and last
// price (asked once per showing); a row opens that window's book.
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

async function select(instrument) {
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
function onFeed(type, body) {
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
  const prices = [...bids, ...asks].map(([p]) => p);
  if (prices.length === 0) {
    g.fillText("no orders on this book", left + plotW / 2, top + plotH / 2);
    return;
  }
  let low = Math.min(...prices), high = Math.max(...prices);
  if (low === high) {
    low = Math.max(0, low - Math.max(1, Math.round(low / 10)));
    high = high + Math.max(1, Math.round(high / 10));
  }
  const cumulative = (levels) => levels.reduce((acc, [p, q]) => (acc.push([p, (acc.length ? acc[acc.length - 1][1] : 0) + q]), acc), []);
  const bidSteps = cumulative(bids), askSteps = cumulative(asks);
  const most = Math.max(1, ...bidSteps.map((s) => s[1]), ...askSteps.map((s) => s[1]));
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

// --- the account --------------------------------------------------------

async function login(secretHex) {
  const secret = secretHex.trim();
  if (!/^[0-9a-fA-F]{64}$/.test(secret)) {
    throw new Error(`a key is 64 hex digits (the 32-byte secret in ~/.gpux/key); this has ${secret.length} character(s)${/^[0-9a-fA-F]*$/.test(secret) ? "" : ", not all hex digits"}`);
  }
  if (state.nonce === null) throw new Error("not connected to the exchange yet; try again in a moment");
  const pkcs8 = new Uint8Array([...fromHex("302e020100300506032b657004220420"), ...fromHex(secretHex.trim())]);
  const key = await crypto.subtle.importKey("pkcs8", pkcs8, { name: "Ed25519" }, true, ["sign"]);
  const jwk = await crypto.subtle.exportKey("jwk", key);
  const publicKey = Uint8Array.from(atob(jwk.x.replace(/-/g, "+").replace(/_/g, "/")), (c) => c.charCodeAt(0));
  const payload = new Uint8Array([...new TextEncoder().encode("gpux-auth-v1:"), ...fromHex(state.nonce)]);
  const signature = new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, key, payload));
  const { body } = await request("auth", { public_key: hex(publicKey), signature: hex(signature), role: null, market_data_version: 2 });
  state.secret = secretHex;
  state.account = body.account;
  $("account").textContent = `account ${body.account} (${body.role})`;
  $("login").hidden = true;
  $("logout").hidden = false;
  showAccount(true);
  refreshAccount();
}

// Logged in: the ticket and the account's tables; logged out: what to do.
function showAccount(shown) {
  $("mine").hidden = !shown;
  $("ticket-card").hidden = !shown;
  $("login-card").hidden = shown;
}

function onPrivate(event, reason) {
  state.events.push(event);
  if (state.events.length > 500) state.events.splice(0, state.events.length - 500);
  const [kind, fields] = typeof event.kind === "string" ? [event.kind, {}] : Object.entries(event.kind)[0];
  if (kind === "rejected") notice(`Refused (${fields.code}): ${reason ?? ""}`);
  if (kind === "preemption_notice") notice(`Lease ${fields.lease} is preempted: it ends at ${utcHour(fields.ends_at_ms)}`);
  if (kind === "payment_notice") notice(`Lease ${fields.lease} needs ${money(fields.shortfall_minor)} more by ${utcHour(fields.ends_at_ms)}`);
  if (kind === "spend_alert") notice(`Spent ${money(fields.spent_minor)}: ${fields.threshold_bps / 100}% of your ${fields.daily ? "daily" : "total"} limit of ${money(fields.limit_minor)}`);
  clearTimeout(state.refreshTimer);
  state.refreshTimer = setTimeout(refreshAccount, 300);
}

// One line for a delivery STATE (docs/protocol.md "Delivery status").
function describeDelivery(deliveryState) {
  if (deliveryState === undefined || deliveryState === null) return "—";
  if (typeof deliveryState === "string") return deliveryState.replace("_", " ");
  const [name, f] = Object.entries(deliveryState)[0];
  if (name === "pulling") return `pulling ${f.bytes_done >> 20}/${f.bytes_total >> 20} MiB`;
  if (name === "running") {
    const ports = f.endpoints.map((e) => `${e.host}:${e.port}→${e.container_port}`).join(" ");
    return ["running", ports, f.ssh ?? ""].filter(Boolean).join(" ");
  }
  if (name === "exited") return `exited with code ${f.code}`;
  if (name === "failed") return `failed ${f.code} (${f.fault}'s side): ${f.reason}`;
  return name;
}

// A supplier's score as people read it: "99.14%", or "unrated" under 10 GPU-hours.
function describeScore(supplier) {
  if (!state.scores.has(supplier)) return `supplier ${supplier}`;
  const bps = state.scores.get(supplier);
  return `supplier ${supplier} · ${bps === null ? "unrated" : (bps / 100).toFixed(2) + "%"}`;
}

function renderLeases() {
  $("leases").tBodies[0].innerHTML = state.leases
    .map((l) => {
      const ends = l.active ? (l.end_ms === null ? "open-ended" : utcHour(l.end_ms)) : `ended ${utcHour(l.ended_at_ms ?? l.end_ms)}`;
      return `<tr><td>${l.lease}</td><td class="text">${l.kind}</td><td>${l.gpus.length}</td><td>${money(l.price_minor_per_gpu_hour)}</td><td class="text">${l.active ? "active" : "ended"}</td><td class="text">${ends}</td><td>${Math.floor(l.verified_gpu_ms / 1000)}</td><td>${money(l.usage_charged_minor)}</td><td class="supplier text">${describeScore(l.supplier)}</td><td class="delivery wrap">${esc(describeDelivery(state.deliveries.get(l.lease)))}</td><td class="text"><button data-telemetry="${l.lease}">telemetry</button>${l.active ? ` <button data-end-lease="${l.lease}">end</button>` : ""}</td></tr>`;
    })
    .join("");
}

// A job's state in words: "running (attempt 2)", "failed: retries_exhausted".
function describeJob(stateValue) {
  if (typeof stateValue === "string") return stateValue;
  const [name, detail] = Object.entries(stateValue)[0];
  if (name === "failed") return "failed: " + (typeof detail === "string" ? detail : Object.entries(detail).map(([k, v]) => `${k} ${v}`).join(""));
  return name;
}

function renderJobs() {
  const jobs = [...state.jobs.values()].sort((a, b) => b.job - a.job);
  $("jobs").tBodies[0].innerHTML = jobs
    .map((j) => {
      const live = !["succeeded", "cancelled"].includes(describeJob(j.state)) && !describeJob(j.state).startsWith("failed");
      return `<tr data-job="${j.job}"><td>${j.job}</td><td class="text">${esc(j.name)}</td><td class="job-state text">${esc(describeJob(j.state))}</td><td>${j.attempts} of ${j.retries + 1}</td><td>${j.leases.join(", ")}</td><td>${money(j.escrowed_minor)} / ${money(j.budget_minor)}</td><td><button data-job-bill="${j.job}">bill</button>${live ? ` <button data-cancel-job="${j.job}">cancel</button>` : ""}</td></tr>`;
    })
    .join("");
}

function notice(text) {
  const item = document.createElement("li");
  item.textContent = text;
  $("notices").prepend(item);
}

async function refreshAccount() {
  if (state.account === null) return;
  const { body: b } = await request("balance");
  let spendLine = "";
  try {
    const { body: spend } = await request("spend");
    if (spend.spend !== null) {
      const s = spend.spend;
      const limit = (value) => (value === null ? "no limit" : money(value));
      spendLine = ` · spend: today ${money(s.spent_today_minor)} (daily ${limit(s.limits.daily_minor)}), in all ${money(s.spent_total_minor)} (total ${limit(s.limits.total_minor)}), held limit ${limit(s.limits.max_held_minor)}`;
    }
  } catch (error) {
    spendLine = "";
  }
  $("balance").textContent = `available ${money(b.available_minor)} · held ${money(b.held_minor)} · payable ${money(b.payable_minor)} · owed ${money(b.debt_minor)}` + spendLine;
  const { body: orders } = await request("open_orders", {});
  $("orders").tBodies[0].innerHTML = orders.orders
    .map((o) => `<tr><td>${o.order}</td><td class="text">${esc(symbolOf(o.instrument))}</td><td class="${o.side}">${o.side}</td><td>${money(o.price_minor_per_gpu_hour)}</td><td>${o.quantity}</td><td class="text">${o.resting ? "on the book" : "armed stop"}</td><td class="text"><button data-cancel-order="${o.order}">cancel</button>${o.resting ? ` <button data-replace-order="${o.order}" title="to the ticket's price and quantity">replace</button>` : ""}</td></tr>`)
    .join("");
  const { body: leases } = await request("leases", {});
  state.leases = leases.leases;
  // The last status of each active lease not yet seen on the feed (pushes
  // keep them current afterwards).
  for (const l of state.leases.filter((l) => l.active && !state.deliveries.has(l.lease)).slice(0, 20)) {
    const { body: known } = await request("lease_delivery", { lease: l.lease });
    if (known.state !== null && !state.deliveries.has(l.lease)) state.deliveries.set(l.lease, known.state);
  }
  // Each supplier's reliability score (public; docs/market-rules.md "Reliability score").
  for (const supplier of [...new Set(state.leases.map((l) => l.supplier))].slice(0, 20)) {
    const { body: stats } = await request("supplier_stats", { supplier });
    state.scores.set(supplier, stats.record.score_bps);
  }
  renderLeases();
  const { body: jobs } = await request("jobs", { offset: 0 });
  for (const job of jobs.jobs) state.jobs.set(job.job, job);
  renderJobs();
  try {
    const { body: subs } = await request("sub_accounts", { offset: 0 });
    const limit = (value, show) => (value === null ? "none" : show(value));
    $("subs").tBodies[0].innerHTML = subs.sub_accounts
      .map((sub) => {
        const l = sub.limits;
        const limits = `orders ${limit(l.max_open_orders, String)} · one bid ${limit(l.max_order_minor, money)} · held ${limit(l.max_held_minor, money)}`;
        return `<tr><td>${sub.account}</td><td>${money(sub.balances.available_minor)}</td><td>${money(sub.balances.held_minor)}</td><td>${money(sub.balances.debt_minor)}</td><td>${sub.open_orders}</td><td class="text">${limits}</td></tr>`;
      })
      .join("");
  } catch (error) {
    // A key without the read scope sees none (the rest shows what it may).
    $("subs").tBodies[0].innerHTML = `<tr><td colspan="6">${esc(error.message)}</td></tr>`;
  }
  await showStatement(null);
}

// The statement newest first, a page at a time ("older" pages back).
async function showStatement(before) {
  const { body: statement } = await request("recent_statement", { before });
  state.statementBefore = statement.next_before;
  $("statement-older").hidden = statement.next_before === null;
  $("statement").tBodies[0].innerHTML = statement.lines
    .map((s) => `<tr><td>${s.transfer}</td><td>${utcHour(s.at_ms)}</td><td class="text">${s.from}</td><td class="text">${s.to}</td><td>${money(s.amount_minor)}</td><td>${s.lease ?? ""}</td><td class="wrap">${esc(s.description)}</td></tr>`)
    .join("");
}

$("statement-older").onclick = () => showStatement(state.statementBefore);
$("statement-newest").onclick = () => showStatement(null);

// Any supplier's reliability (public, no login needed): its score and record,
// then each host's.
async function lookUpSupplier(supplier) {
  const out = $("supplier-stats");
  try {
    const { body } = await request("supplier_stats", { supplier });
    state.scores.set(supplier, body.record.score_bps);
    const line = (r) => {
      const score = r.score_bps === null ? "unrated" : (r.score_bps / 100).toFixed(2) + "%";
      const hours = (ms) => (ms / 3.6e6).toFixed(1);
      const challenges = `hardware challenges ${r.challenges_passed} passed, ${r.challenges_too_slow} too slow, ${r.challenges_failed} wrong, ${r.challenges_unanswered} unanswered`;
      const conduct = `${r.disputes} disputes proven by renters' GPU probes (${hours(r.disputed_gpu_ms)} GPU-h), ${r.disconnects_during_leases} disconnects during leases, ${r.preemptions_late} preemptions honoured late`;
      return `${score}: ${hours(r.verified_gpu_ms)} of ${hours(r.leased_gpu_ms)} GPU-h verified, ${r.leases_closed} leases, ${r.failed_deliveries} failed deliveries (${r.failed_deliveries_in_row ?? 0} in a row now), ${challenges}, ${conduct}`;
    };
    const hosts = body.hosts.map((h) => `<li>${esc(h.host_name)}: ${line(h.record)}</li>`).join("");
    out.innerHTML = `<p>supplier ${body.supplier}, last ${body.window_days} days: ${line(body.record)}</p><ul>${hosts}</ul>`;
  } catch (error) {
    out.textContent = error.message;
  }
}

// Any account's record as a renter (public): the liveness observations it
// signed and the disputes they raised (docs/market-rules.md "Disputes").
async function lookUpRenter(renter) {
  const out = $("renter-stats");
  try {
    const { body } = await request("renter_stats", { renter });
    const r = body.record;
    const hours = (ms) => (ms / 3.6e6).toFixed(2);
    out.textContent = `renter ${body.renter}: ${r.observations} signed observations, ${hours(r.unreachable_ms)} h signed unreachable, ${r.disputes} disputes (${hours(r.disputed_gpu_ms)} GPU-h of reported time)`;
  } catch (error) {
    out.textContent = error.message;
  }
}

$("renter-lookup").onsubmit = (event) => {
  event.preventDefault();
  lookUpRenter(Number($("renter-id").value));
};

$("supplier-lookup").onsubmit = (event) => {
  event.preventDefault();
  lookUpSupplier(Number($("supplier-id").value));
};

// An amount as typed ("2.15", "$500" on a dollar exchange, "15.05 CNY") to
// minor units of the exchange's currency, exactly: no floats touch money.
// At most the currency's decimals; throws on anything else.
function parseAmount(text) {
  const { code, decimals } = state.currency;
  if (text.includes(",")) {
    // One rule for every client (docs/first-hour.md "Amounts"): a comma is
    // refused whatever it was meant as, with each reading shown.
    const body = text.trim().replace(/^\$/, "").replace(new RegExp(`\\s*${code}$`), "");
    const whole = body.replaceAll(",", "");
    const single = body.split(",").length === 2 && !body.includes(".");
    const readings = single ? `${body.replace(",", ".")} or ${whole}` : whole;
    throw new Error(`"${text}": "." is the only decimal separator and amounts take no thousands separators: write ${readings}`);
  }
  const fraction = decimals > 0 ? `(?:\\.(\\d{1,${decimals}}))?` : "()";
  const match = new RegExp(`^${code === "USD" ? "\\$?" : ""}(\\d+)${fraction}(?:\\s*${code})?$`).exec(text.trim());
  if (!match) throw new Error(`"${text}" is not an amount in ${code} with at most ${decimals} decimals`);
  const minor = BigInt(match[1]) * 10n ** BigInt(decimals) + BigInt((match[2] ?? "").padEnd(decimals, "0") || "0");
  if (minor > BigInt(Number.MAX_SAFE_INTEGER)) throw new Error(`"${text}" is too large`);
  return Number(minor);
}

// The ticket's fields as an order, and each field's error in words (shown
// under the field as it is typed, and refused on Place).
function ticketOrder() {
  const errors = {};
  const market = $("t-type").value === "market";
  const amount = (id, required) => {
    const text = $(id).value.trim();
    if (!text) {
      if (required) errors[id] = "a limit order needs a price";
      return 0;
    }
    try {
      return parseAmount(text);
    } catch (error) {
      errors[id] = error.message;
      return 0;
    }
  };
  const whole = (id, what) => {
    const value = Number($(id).value);
    if (!Number.isInteger(value) || value < 1) errors[id] = `${what} is a whole number, 1 or more`;
    return value;
  };
  const order = {
    client_order_id: Date.now(),
    instrument: state.selected,
    side: $("t-side").value,
    order_type: $("t-type").value,
    price_minor_per_gpu_hour: market ? 0 : amount("t-price", true),
    quantity: whole("t-quantity", "GPUs"),
    time_in_force: market && $("t-tif").value === "gtc" ? "ioc" : $("t-tif").value,
    duration: { hours: whole("t-hours", "lease hours") },
    all_or_none: $("t-aon").checked,
    budget_minor: amount("t-budget", false),
    stop_price_minor_per_gpu_hour: amount("t-stop", false),
    regions: Array.from($("t-regions").selectedOptions, (option) => option.value),
  };
  return { order, errors };
}

// Inline validation: each field's error under it, and what the order can
// cost at most (price x GPUs x hours, or its budget).
function validateTicket() {
  const { order, errors } = ticketOrder();
  for (const id of ["t-price", "t-quantity", "t-hours", "t-budget", "t-stop"]) {
    $(id).classList.toggle("invalid", id in errors);
    const slot = $(`${id}-error`);
    if (slot) slot.textContent = errors[id] ?? "";
  }
  let estimate = "";
  if (Object.keys(errors).length === 0 && order.side === "buy") {
    if (order.budget_minor) estimate = `spends at most ${money(order.budget_minor)} (its budget)`;
    else if (order.price_minor_per_gpu_hour) {
      const most = order.price_minor_per_gpu_hour * order.quantity * order.duration.hours;
      estimate = Number.isSafeInteger(most) ? `holds at most ${money(most)}: ${order.quantity} GPU(s) x ${order.duration.hours} h at ${money(order.price_minor_per_gpu_hour)}` : "";
    }
  }
  $("t-estimate").textContent = estimate;
  return { order, errors };
}

for (const id of ["t-price", "t-quantity", "t-hours", "t-budget", "t-stop", "t-type", "t-side"]) $(id).addEventListener("input", validateTicket);

// Why an order closed, in words (docs/protocol.md "order_closed").
const CLOSE_REASONS = {
  killed: "not filled at once: the rest of an IOC, or an FOK that could not fill whole",
  no_liquidity: "nothing on the other side to trade with",
  min_quantity_not_met: "its minimum quantity was not available at once",
  self_trade_prevented: "it would have traded with your own order",
  cancelled: "cancelled",
  mass_cancelled: "cancelled with all your orders",
  expired: "expired",
  trading_stopped: "the window stopped trading",
  supply_gone: "its GPUs went offline or were leased in another book",
};

// What became of an order, from the private events that came before its
// acknowledgement (the exchange sends a command's events first): filled,
// partly filled and resting, resting, killed with the reason, or armed.
function outcomeOf(order, placed) {
  const kinds = state.events.map((e) => Object.entries(e.kind)[0]);
  const start = kinds.findIndex(([kind, f]) => kind === "order_accepted" && f.order === order);
  const after = start < 0 ? [] : kinds.slice(start);
  const closedAt = after.findIndex(([kind, f]) => kind === "order_closed" && f.order === order);
  const own = closedAt < 0 ? after : after.slice(0, closedAt + 1);
  const trades = own.filter(([kind, f]) => kind === "trade" && (f.buy_order === order || f.sell_order === order)).map(([, f]) => f);
  const leases = own.filter(([kind]) => kind === "lease_created").map(([, f]) => f.lease);
  const filled = trades.reduce((sum, t) => sum + t.quantity, 0);
  const prices = [...new Set(trades.map((t) => t.price_minor_per_gpu_hour))].sort((a, b) => a - b);
  const at = prices.length === 1 ? `at ${money(prices[0])}` : `at ${money(prices[0])} to ${money(prices[prices.length - 1])}`;
  const leased = leases.length ? ` (lease ${leases.join(", ")})` : "";
  const fills = filled ? `${filled} GPU(s) ${at}${leased}` : "";
  if (closedAt >= 0) {
    const reason = after[closedAt][1].reason;
    if (reason === "filled") return { text: `filled: ${fills}`, done: true };
    const why = CLOSE_REASONS[reason] ?? reason.replaceAll("_", " ");
    return { text: filled ? `partly filled: ${fills}; the rest killed (${why})` : `killed (${why}): nothing filled`, done: filled > 0 };
  }
  const armed = kinds.some(([kind, f]) => kind === "stop_armed" && f.order === order);
  if (armed || (start < 0 && placed.stop_price_minor_per_gpu_hour)) return { text: "armed", done: true };
  const resting = `${placed.quantity - filled} GPU(s) rest on the book at ${money(placed.price_minor_per_gpu_hour)}`;
  return { text: filled ? `partly filled: ${fills}; ${resting}` : `rests on the book: ${resting.replace(" rest on the book", "")}`, done: true };
}

// The order ticket: every order type of docs/market-rules.md, on the
// instrument shown; the exchange's answer (or its code) shows below it.
async function placeFromTicket() {
  const out = $("ticket-result");
  out.className = "";
  const { order, errors } = validateTicket();
  const first = Object.values(errors)[0];
  if (first !== undefined) {
    out.className = "refused";
    out.textContent = "refused: " + first;
    return;
  }
  try {
    const { body } = await request("new_order", { order });
    const outcome = outcomeOf(body.order, order);
    out.className = outcome.done ? "done" : "refused";
    out.textContent = `accepted: order ${body.order}` + (outcome.text === "armed" ? ", armed" : `: ${outcome.text}`);
    refreshAccount();
  } catch (error) {
    out.className = "refused";
    out.textContent = "refused: " + error.message;
  }
}

// Cancel an open order, end an active lease: the answer (or its code)
// shows under the ticket; the tables refresh from the private feed.
async function act(type, fields, what) {
  const out = $("ticket-result");
  try {
    const { body } = await request(type, fields);
    out.textContent = `${what} (journal entry ${body.journal_seq})`;
    refreshAccount();
  } catch (error) {
    out.textContent = "refused: " + error.message;
  }
}

$("orders").onclick = (event) => {
  const order = event.target.dataset && event.target.dataset.cancelOrder;
  if (order) act("cancel_order", { order: Number(order) }, `order ${order} cancelled`);
  // Cancel-replace to the ticket's price and quantity (time priority kept
  // only when the price is unchanged and the quantity does not grow).
  const replace = event.target.dataset && event.target.dataset.replaceOrder;
  if (replace) {
    try {
      const price_minor_per_gpu_hour = parseAmount($("t-price").value);
      const quantity = Number($("t-quantity").value);
      act("replace_order", { order: Number(replace), price_minor_per_gpu_hour, quantity }, `order ${replace} replaced at ${money(price_minor_per_gpu_hour)} x ${quantity}`);
    } catch (error) {
      $("ticket-result").textContent = "refused: " + error.message;
    }
  }
};

$("jobs").onclick = async (event) => {
  const cancel = event.target.dataset && event.target.dataset.cancelJob;
  if (cancel) {
    try {
      const { body } = await request("cancel_job", { job: Number(cancel) });
      state.jobs.set(body.job.job, body.job);
      renderJobs();
    } catch (error) {
      $("job-bill").textContent = "refused: " + error.message;
    }
  }
  const billed = event.target.dataset && event.target.dataset.jobBill;
  if (billed) {
    try {
      const { body } = await request("job_bill", { job: Number(billed), offset: 0 });
      const t = body.invoice.totals;
      $("job-bill").textContent = `${body.invoice.number}: ${body.line_count} line(s), charges ${money(t.charges_minor)}, credits ${money(t.credits_minor)}, due ${money(t.amount_due_minor)} (signed by the exchange: gpux job bill ${billed} checks it)`;
    } catch (error) {
      $("job-bill").textContent = "refused: " + error.message;
    }
  }
};

$("leases").onclick = (event) => {
  const lease = event.target.dataset && event.target.dataset.endLease;
  if (lease) act("end_lease", { lease: Number(lease) }, `lease ${lease} ended`);
  const watched = event.target.dataset && event.target.dataset.telemetry;
  if (watched) showTelemetry(Number(watched)).catch((error) => ($("telemetry-lease").textContent = "refused: " + error.message));
};

// A lease's telemetry (`lease_telemetry`): per GPU, utilisation (%),
// the highest temperature (°C) and mean power (W) of each signed report,
// on a time axis (UTC), one uPlot chart per GPU.
async function showTelemetry(lease) {
  const { body } = await request("lease_telemetry", { lease });
  const holder = $("telemetry-charts");
  holder.replaceChildren();
  $("telemetry-lease").textContent = body.gpus.length ? `lease ${lease}` : `lease ${lease}: no usage report yet`;
  for (const gpu of body.gpus) {
    const box = document.createElement("div");
    box.className = "telemetry-gpu";
    box.dataset.samples = String(gpu.samples.length);
    box.append(Object.assign(document.createElement("div"), { textContent: gpu.gpu_uuid }));
    holder.append(box);
    const at = gpu.samples.map((s) => s.end_ms / 1000);
    const pick = (field) => gpu.samples.map((s) => s[field] ?? null);
    new uPlot(
      {
        width: 640, height: 200, tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
        scales: { x: { time: true }, pct: { range: [0, 100] }, w: {} },
        axes: [
          { stroke: "#444", grid: { stroke: "#eee" } },
          { scale: "pct", stroke: "#444", values: (u, ticks) => ticks.map((t) => `${t}% / ${t}°C`), size: 90 },
          { scale: "w", side: 1, stroke: "#7a4b00", values: (u, ticks) => ticks.map((t) => `${t} W`), grid: { show: false } },
        ],
        series: [
          {},
          { label: "utilisation %", scale: "pct", stroke: "#14213d", width: 2 },
          { label: "max °C", scale: "pct", stroke: "#b42318", width: 1 },
          { label: "power W", scale: "w", stroke: "#7a4b00", width: 1 },
        ],
      },
      [at, pick("utilisation_percent"), pick("temperature_c_max"), pick("power_w_mean")],
      box,
    );
  }
}

$("sub-open").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const { body } = await request("open_sub_account");
    $("sub-result").textContent = `opened sub-account ${body.account} (journal entry ${body.journal_seq})`;
    $("sub-id").value = body.account;
    refreshAccount();
  } catch (error) {
    $("sub-result").textContent = "refused: " + error.message;
  }
};

$("sub-move").onsubmit = async (event) => {
  event.preventDefault();
  try {
    const sub_account = Number($("sub-id").value);
    const amount_minor = parseAmount($("sub-amount").value);
    const to_sub_account = $("sub-direction").value === "in";
    const { body } = await request("move_funds", { sub_account, amount_minor, to_sub_account });
    $("sub-result").textContent = `moved ${money(amount_minor)} ${to_sub_account ? "to" : "back from"} sub-account ${sub_account} (journal entry ${body.journal_seq})`;
    refreshAccount();
  } catch (error) {
    $("sub-result").textContent = "refused: " + error.message;
  }
};

// JSON with every object's keys sorted and no whitespace: the form the
// exchange signs (docs/protocol.md "Invoices").
function canonical(value) {
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  if (value !== null && typeof value === "object") {
    return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + canonical(value[k])).join(",") + "}";
  }
  return JSON.stringify(value);
}

const signedUsd = (minor) => (minor < 0 ? "-" + money(-minor) : money(minor));

async function showInvoice(period, account) {
  const out = $("invoice");
  try {
    const { body: published } = await request("exchange_key");
    let lines = [];
    let offset = 0;
    let page;
    for (;;) {
      ({ body: page } = await request("invoice", { period, account, offset }));
      lines = lines.concat(page.invoice.lines);
      if (page.next_offset === null) break;
      offset = page.next_offset;
    }
    const invoice = { ...page.invoice, lines };
    const key = await crypto.subtle.importKey("raw", fromHex(published.public_key), { name: "Ed25519" }, false, ["verify"]);
    const bytes = new TextEncoder().encode("gpux-invoice-v1:" + canonical(invoice));
    const verified = page.exchange_key === published.public_key && (await crypto.subtle.verify({ name: "Ed25519" }, key, fromHex(page.signature), bytes));
    const t = invoice.totals;
    const rows = invoice.lines
      .map((l) => `<tr><td>${l.lease ?? "—"}</td><td>${esc(l.instrument)}</td><td>${l.item}</td><td>${l.price_minor_per_gpu_hour === null ? "" : money(l.price_minor_per_gpu_hour)}</td><td>${signedUsd(l.amount_minor)}</td></tr>`)
      .join("");
    const tax = invoice.tax ? `<p>includes ${esc(invoice.tax.name)} ${(invoice.tax.rate_bps / 100).toFixed(2)}% (${esc(invoice.tax.registration)}): ${money(invoice.tax.included_minor)}</p>` : "";
    out.innerHTML = `<h4>Invoice ${esc(invoice.number)}</h4><p>${esc(invoice.issuer)} · account ${invoice.account}${invoice.parent === null ? "" : ` (sub-account of ${invoice.parent})`} · ${esc(invoice.period)} (UTC) · ${esc(invoice.currency)}</p>
      <table><thead><tr><th>lease</th><th>instrument</th><th>item</th><th>$/GPU-h</th><th>amount</th></tr></thead><tbody>${rows}</tbody></table>
      <p>charges ${money(t.charges_minor)} · credits ${money(t.credits_minor)} · <strong>amount due <span id="invoice-due">${signedUsd(t.amount_due_minor)}</span></strong></p>
      <p>deposits ${money(t.deposits_minor)} · withdrawals ${money(t.withdrawals_minor)} · payouts ${money(t.payouts_minor)} · moved in ${money(t.moved_in_minor)} · moved out ${money(t.moved_out_minor)}</p>${tax}
      <p class="${verified ? "verified" : "forged"}" id="invoice-check">${verified ? "signature verified" : "signature does NOT verify"} with the exchange's key ${published.public_key}</p>`;
  } catch (error) {
    out.textContent = "refused: " + error.message;
  }
}

$("invoice-form").onsubmit = (event) => {
  event.preventDefault();
  const account = $("invoice-account").value.trim() ? Number($("invoice-account").value) : null;
  showInvoice($("invoice-period").value.trim(), account);
};

$("invoice-print").onclick = () => window.print();

$("ticket").onsubmit = (event) => {
  event.preventDefault();
  placeFromTicket();
};

// Logging out forgets the key and ends the session: the page reconnects
// to market data only.
$("logout").onclick = () => {
  state.secret = null;
  state.account = null;
  $("account").textContent = "";
  showAccount(false);
  $("login").hidden = false;
  $("logout").hidden = true;
  $("secret").value = "";
  state.ws.close();
};

$("login").onsubmit = (event) => {
  event.preventDefault();
  login($("secret").value).catch((error) => ($("account").textContent = "login failed: " + error.message));
};

connect();
