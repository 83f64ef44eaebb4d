// The order ticket: every order type, each field checked as typed, and
// each order's true outcome from the events before its acknowledgement;
// cancel, replace and end from the tables.

import { state } from "./state.js";
import { $, money, parseAmount } from "./util.js";
import { request } from "./connection.js";
import { refreshAccount } from "./account.js";

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
  // A lease's length: empty is open-ended (until ended, billed as used);
  // else hours to the minute (1, 1.5, 0.25), as `gpux run --hours` reads them.
  const duration = (() => {
    const text = $("t-hours").value.trim();
    if (text === "") return "until_cancelled";
    const refused = "hours to the minute (1, 1.5, 0.25), more than 0; empty: until you end it";
    if (!/^\d+(\.\d+)?$/.test(text)) {
      errors["t-hours"] = refused;
      return "until_cancelled";
    }
    const [whole, fraction = ""] = text.split(".");
    // Minutes exactly, from the digits (no float): 1.5 h = 90, 1.33 h is not whole minutes.
    const scaled = BigInt(whole + fraction) * 60n;
    const scale = 10n ** BigInt(fraction.length);
    if (scaled === 0n || scaled % scale !== 0n || scaled / scale > 129600n) {
      errors["t-hours"] = refused;
      return "until_cancelled";
    }
    const minutes = Number(scaled / scale);
    return minutes % 60 === 0 ? { hours: minutes / 60 } : { minutes };
  })();
  const order = {
    client_order_id: Date.now(),
    instrument: state.selected,
    side: $("t-side").value,
    order_type: $("t-type").value,
    price_minor_per_gpu_hour: market ? 0 : amount("t-price", true),
    quantity: whole("t-quantity", "GPUs"),
    time_in_force: market && $("t-tif").value === "gtc" ? "ioc" : $("t-tif").value,
    duration,
    all_or_none: $("t-aon").checked,
    budget_minor: amount("t-budget", false),
    stop_price_minor_per_gpu_hour: amount("t-stop", false),
    regions: Array.from($("t-regions").selectedOptions, (option) => option.value),
  };
  if (order.budget_minor && duration === "until_cancelled" && order.side === "buy" && !errors["t-hours"]) {
    errors["t-hours"] = 'a budget goes on a fixed length: give the hours (docs/market-rules.md "Budget orders")';
  }
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
    else if (order.price_minor_per_gpu_hour && order.duration === "until_cancelled") {
      const hour = order.price_minor_per_gpu_hour * order.quantity;
      estimate = Number.isSafeInteger(hour) ? `holds ${money(hour)} (an hour of ${order.quantity} GPU(s) at ${money(order.price_minor_per_gpu_hour)}) until you end the lease; billed as used` : "";
    } else if (order.price_minor_per_gpu_hour) {
      const minutes = order.duration.minutes ?? order.duration.hours * 60;
      // Rounded up to the minor unit, as the exchange holds it.
      const most = Math.ceil((order.price_minor_per_gpu_hour * minutes) / 60) * order.quantity;
      estimate = Number.isSafeInteger(most) ? `holds at most ${money(most)}: ${order.quantity} GPU(s) x ${minutes / 60} h at ${money(order.price_minor_per_gpu_hour)}` : "";
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
export async function act(type, fields, what) {
  const out = $("ticket-result");
  try {
    const { body } = await request(type, fields);
    out.textContent = `${what} (journal entry ${body.journal_seq})`;
    refreshAccount();
  } catch (error) {
    out.textContent = "refused: " + error.message;
  }
}

$("ticket").onsubmit = (event) => {
  event.preventDefault();
  placeFromTicket();
};
