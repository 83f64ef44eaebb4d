// Documents: a lease's telemetry charts and signed invoices, checked
// against the exchange's key.

import { $, canonical, esc, fromHex, money, signedUsd } from "./util.js";
import { request } from "./connection.js";

// A lease's telemetry (`lease_telemetry`): per GPU, utilisation (%),
// the highest temperature (°C) and mean power (W) of each signed report,
// on a time axis (UTC), one uPlot chart per GPU.
export async function showTelemetry(lease) {
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
