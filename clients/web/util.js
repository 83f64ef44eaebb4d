// Pure helpers: the DOM lookup, money in the exchange's currency (read
// and written exactly, never a float), hex, escaping, times, canonical JSON.

import { state } from "./state.js";

export const $ = (id) => document.getElementById(id);
// Minor units in the exchange's currency to the last minor unit, never
// rounded: cents always, more digits only when there are more ($0.000417,
// 15.05 CNY).
export const money = (minor) => {
  const { code, decimals } = state.currency;
  const scale = 10 ** decimals;
  let text = String(Math.floor(minor / scale));
  if (decimals > 0) {
    const digits = String(minor % scale).padStart(decimals, "0");
    text += "." + (decimals < 2 ? digits : digits.replace(/0+$/, "").padEnd(2, "0"));
  }
  return code === "USD" ? `$${text}` : `${text} ${code}`;
};
export const hex = (bytes) => Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
export const fromHex = (text) => Uint8Array.from(text.match(/../g).map((h) => parseInt(h, 16)));
// Escapes text for innerHTML: hosts write failure reasons, so never trust them.
export const esc = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
export const utcHour = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");
// An instrument's symbol by id ("H100-SXM-80G/SPOT"), its id when unknown.
export const symbolOf = (instrument) => state.instruments.find((i) => i.instrument === instrument)?.symbol ?? String(instrument);

// Each header cell set as its column's cells are (numbers right, words
// left), so a heading sits over its values whatever a table holds.
export function alignHeaders(table) {
  const head = table.tHead?.rows[0];
  const row = [...(table.tBodies[0]?.rows ?? [])].find((r) => head && r.cells.length === head.cells.length);
  if (!head || !row) return;
  [...head.cells].forEach((th, i) => {
    th.style.textAlign = getComputedStyle(row.cells[i]).textAlign;
  });
}

export const chartWidth = (holder) => Math.max(200, Math.floor(holder.clientWidth || 420));

// An amount as typed ("2.15", "$500" on a dollar exchange, "15.05 CNY") to
// minor units of the exchange's currency, exactly: no floats touch money.
// At most the currency's decimals; throws on anything else.
export function parseAmount(text) {
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

// JSON with every object's keys sorted and no whitespace: the form the
// exchange signs (docs/protocol.md "Invoices").
export function canonical(value) {
  if (Array.isArray(value)) return "[" + value.map(canonical).join(",") + "]";
  if (value !== null && typeof value === "object") {
    return "{" + Object.keys(value).sort().map((k) => JSON.stringify(k) + ":" + canonical(value[k])).join(",") + "}";
  }
  return JSON.stringify(value);
}

export const signedUsd = (minor) => (minor < 0 ? "-" + money(-minor) : money(minor));
