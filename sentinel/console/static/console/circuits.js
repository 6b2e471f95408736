// The live circuit view: each breaker transition the websocket brings updates its deployment's row
// and heads the list of transitions, without reloading the page.
(function () {
  "use strict";
  const table = document.getElementById("transitions-table").querySelector("tbody");
  const filtered = Boolean(new URLSearchParams(window.location.search).get("q"));
  // As gateway.models.breaker_state_label writes them.
  const LABELS = { half_open: "half-open", forced_open: "forced open", forced_closed: "forced closed" };
  const label = (state) => LABELS[state] || state;
  window.SentinelLive.connect(function (event) {
    if (event.type === "circuit.load") {
      // Self-hosted deployments' load, as the sampler read it.
      for (const sample of event.samples) {
        const cell = document.querySelector('tr[data-deployment="' + CSS.escape(sample.deployment) + '"] td.load');
        if (cell) cell.textContent = sample.load;
      }
      return;
    }
    if (event.type === "circuit.latency") {
      // Each deployment's answered calls over the last five minutes, with the live figures.
      for (const row of document.querySelectorAll("#circuits-table tr[data-deployment]")) {
        row.querySelector("td.latency").textContent = event.latencies[row.dataset.deployment] || "-";
      }
      return;
    }
    if (event.type !== "circuit.transition") return;
    const row = document.querySelector('tr[data-deployment="' + CSS.escape(event.deployment) + '"]');
    if (!row && filtered) return; // a deployment this view does not show
    if (row) {
      const cell = row.querySelector(".state");
      cell.textContent = label(event.to);
      cell.className = "state state-" + event.to;
      row.querySelector(".changed").textContent = new Date(event.at).toISOString().slice(0, 19).replace("T", " ");
    }
    const line = document.createElement("tr");
    for (const text of [
      new Date(event.at).toISOString().slice(0, 19).replace("T", " "),
      event.deployment,
      event.provider,
      label(event.from) + " → " + label(event.to),
      event.reason,
      event.actor || "",
    ]) {
      const cell = document.createElement("td");
      cell.textContent = text;
      line.appendChild(cell);
    }
    table.insertBefore(line, table.firstChild);
    document.body.dataset.liveEvents = String(Number(document.body.dataset.liveEvents || 0) + 1);
  });
})();
