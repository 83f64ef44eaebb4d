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
//
// The modules, each a part of the screen: state.js (the one state object),
// util.js (money, hex, escaping), connection.js (requests and pushes),
// market.js (books, trades, charts, calendar), account.js (the logged-in
// account's tables), ticket.js (the order ticket), documents.js (telemetry,
// invoices), search.js (offers across every book). ES modules served as
// they are: no bundler, no build step.

import { connect } from "./connection.js";
import { select } from "./market.js";
import { state } from "./state.js";
import { alignHeaders, money } from "./util.js";
import "./account.js";
import "./ticket.js";
import "./documents.js";
import "./search.js";

// A handle for scripts and the browser tests: choose a book, format money,
// read the state.
window.gpuxConsole = { select, money, state };

// Headings follow their columns' alignment each time a table is drawn.
for (const table of document.querySelectorAll("table")) {
  if (table.tBodies[0]) new MutationObserver(() => alignHeaders(table)).observe(table.tBodies[0], { childList: true });
}

connect();
