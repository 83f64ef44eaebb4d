// Finding a GPU across every book (public `search_offers`,
// docs/protocol.md "Search"): the renter's filters, each ask that fits,
// paged by the exchange's cursor; a row opens its book.

import { $, esc, money, parseAmount } from "./util.js";
import { request } from "./connection.js";
import { select } from "./market.js";

let nextPlace = null;

// The search as the form says it; a typed price that is no amount is said
// under the form and nothing is asked.
function searchOf() {
  const number = (id) => {
    const value = $(id).value.trim();
    return value === "" ? 0 : Number(value);
  };
  const price = $("s-price").value.trim();
  return {
    min_gpu_memory_gb: number("s-memory"),
    min_gpus: number("s-gpus"),
    max_price_minor_per_gpu_hour: price === "" ? null : parseAmount(price),
    regions: $("s-region").value ? [$("s-region").value] : [],
    contracts: $("s-contract").value ? [$("s-contract").value] : [],
    verified_only: $("s-verified").checked,
    sort: $("s-sort").value,
    limit: 25,
  };
}

async function findOffers(more) {
  const out = $("search-result");
  let wanted;
  try {
    wanted = searchOf();
  } catch (error) {
    out.textContent = "refused: " + error.message;
    return;
  }
  if (!more) nextPlace = null;
  try {
    const { body } = await request("search_offers", { search: { ...wanted, after: nextPlace } });
    const score = (bps) => (bps === null ? "unrated" : (bps / 100).toFixed(2) + "%");
    const rows = body.offers.map((o) => {
      const gb = ((o.gpu_memory_mib * 1048576) / 1e9).toFixed(1);
      return `<tr data-instrument="${o.instrument}"><td class="text">${esc(o.symbol)}</td><td>${money(o.price_minor_per_gpu_hour)}</td><td>${o.quantity}</td><td class="text">${esc(o.model)}</td><td>${gb}</td><td>${money(o.price_minor_per_gb_hour)}</td><td class="text">${o.supplier} · ${score(o.supplier_score_bps)}</td><td class="text">${esc(o.region ?? "none")}</td><td>${o.gpus_verified} of ${o.quantity}</td></tr>`;
    });
    const body_ = $("found").tBodies[0];
    if (more) body_.insertAdjacentHTML("beforeend", rows.join(""));
    else body_.innerHTML = rows.join("") || `<tr><td colspan="9" class="empty">no offer fits</td></tr>`;
    nextPlace = body.next_after;
    $("search-more").hidden = nextPlace === null;
    const shown = body_.querySelectorAll("tr[data-instrument]").length;
    out.textContent = `${shown} offer(s) shown${nextPlace === null ? "" : "; more follow"}`;
  } catch (error) {
    out.textContent = "refused: " + error.message;
  }
}

$("search").onsubmit = (event) => {
  event.preventDefault();
  findOffers(false);
};
$("search-more").onclick = () => findOffers(true);
$("found").onclick = (event) => {
  const row = event.target.closest("tr[data-instrument]");
  if (row) select(Number(row.dataset.instrument));
};
