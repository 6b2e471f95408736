// The dashboard's charts (Chart.js, served locally) from the figures the page was rendered with,
// and the live panel, fed by the websocket's per-tenant summaries.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("dashboard-data").textContent);
  const scope = JSON.parse(document.getElementById("live-scope").textContent);
  const palette = ["#417690", "#79aec8", "#f5dd5d", "#ba2121", "#70bf2b", "#9b59b6", "#e67e22", "#34495e"];
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = true;
  // Unfold's theme (Alpine keeps the choice in localStorage; "auto" follows the system): axis text
  // and grid lines readable on a dark page too. Read here, as Alpine may not have set <html class> yet.
  const dark = (function () {
    let choice = "auto";
    try { choice = JSON.parse(localStorage.getItem("adminTheme")) || "auto"; } catch (e) { /* unset */ }
    return choice === "dark" || (choice === "auto" && window.matchMedia("(prefers-color-scheme: dark)").matches);
  })();
  Chart.defaults.color = dark ? "#cbd5e1" : "#475569";
  Chart.defaults.borderColor = dark ? "rgba(255, 255, 255, 0.1)" : "rgba(0, 0, 0, 0.1)";

  function time(iso) {
    const d = new Date(iso);
    const pad = (n) => String(n).padStart(2, "0");
    return pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes());
  }
  function chart(id, config) {
    const canvas = document.getElementById(id);
    return canvas ? new Chart(canvas, config) : null;
  }

  // Day buckets (7 and 30 days) are labelled by date, minute and hour buckets by time.
  const buckets = data.series.map((p) => (["7d", "30d"].includes(data.window) ? p.at.slice(5, 10) : time(p.at)));
  chart("chart-traffic", {
    type: "line",
    data: {
      labels: buckets,
      datasets: [
        { label: "requests", data: data.series.map((p) => p.requests), borderColor: palette[0], backgroundColor: palette[0], tension: 0.2 },
        { label: "failed", data: data.series.map((p) => p.errors), borderColor: palette[3], backgroundColor: palette[3], tension: 0.2 },
      ],
    },
    options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
  });
  if (data.series.length && data.series[0].cost_usd !== undefined) {
    chart("chart-spend-time", {
      type: "bar",
      data: { labels: buckets, datasets: [{ label: "spent (USD)", data: data.series.map((p) => Number(p.cost_usd)), backgroundColor: palette[0] }] },
      options: { scales: { y: { beginAtZero: true } } },
    });
  }
  // The busiest keys and models, one line each, showing requests or (who may see it) spend.
  function breakdown(id, lines, metric) {
    return chart(id, {
      type: "line",
      data: {
        labels: buckets,
        datasets: lines.map((line, i) => ({
          label: line.name,
          data: line[metric].map(Number),
          borderColor: palette[i % palette.length],
          backgroundColor: palette[i % palette.length],
          tension: 0.2,
        })),
      },
      options: { scales: { y: { beginAtZero: true } } },
    });
  }
  const byKey = breakdown("chart-keys", data.keys, "requests");
  const byModel = breakdown("chart-models", data.models, "requests");
  const metric = document.getElementById("breakdown-metric");
  if (metric) {
    metric.addEventListener("change", function () {
      [[byKey, data.keys], [byModel, data.models]].forEach(function ([drawn, lines]) {
        drawn.data.datasets.forEach((dataset, i) => { dataset.data = lines[i][metric.value].map(Number); });
        drawn.update();
      });
    });
  }
  chart("chart-latency", {
    type: "bar",
    data: {
      labels: ["p50", "p95", "p99"],
      datasets: [{ label: "ms", data: [data.latency.p50, data.latency.p95, data.latency.p99], backgroundColor: palette.slice(0, 3) }],
    },
    options: { plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true } } },
  });
  chart("chart-cache", {
    type: "doughnut",
    data: {
      labels: ["exact hits", "semantic hits", "misses"],
      datasets: [{ data: [data.cache.exact, data.cache.semantic, data.cache.miss], backgroundColor: [palette[4], palette[1], "#cccccc"] }],
    },
  });
  chart("chart-providers", {
    type: "doughnut",
    data: {
      labels: data.providers.map((p) => p.provider),
      datasets: [{ data: data.providers.map((p) => p.requests), backgroundColor: palette }],
    },
  });
  chart("chart-provider-errors", {
    type: "bar",
    data: {
      labels: data.providers.map((p) => p.provider),
      datasets: [{ label: "% of requests", data: data.providers.map((p) => +(p.error_rate * 100).toFixed(2)), backgroundColor: palette[3] }],
    },
    options: { plugins: { legend: { display: false } }, scales: { y: { beginAtZero: true, suggestedMax: 5 } } },
  });
  if (data.spend) {
    chart("chart-spend", {
      type: "bar",
      data: {
        labels: data.spend.map((s) => s.tenant),
        datasets: [
          { label: "spent this month", data: data.spend.map((s) => Number(s.month)), backgroundColor: palette[0] },
          { label: "monthly budget", data: data.spend.map((s) => (s.monthly_budget === null ? null : Number(s.monthly_budget))), backgroundColor: "#dddddd" },
        ],
      },
      options: { indexAxis: "y", scales: { x: { beginAtZero: true } } },
    });
  }

  // Live: the latest summary of each tenant in view, summed per publication.
  const live = chart("chart-live", {
    type: "line",
    data: { labels: [], datasets: [{ label: "requests in the last minute", data: [], borderColor: palette[0], backgroundColor: palette[0] }] },
    options: { scales: { y: { beginAtZero: true, ticks: { precision: 0 } } } },
  });
  const latest = {};
  function inScope(summary) {
    return scope.tenant_ids === null || scope.tenant_ids.indexOf(summary.tenant_id) !== -1;
  }
  window.SentinelLive.connect(function (event) {
    if (event.type !== "tenant.summary" || !inScope(event)) return;
    latest[event.tenant_id] = event;
    const current = Object.values(latest).filter((s) => s.at === event.at);
    const requests = current.reduce((sum, s) => sum + s.requests, 0);
    const errors = current.reduce((sum, s) => sum + s.errors, 0);
    document.getElementById("live-requests").textContent = String(requests);
    let detail = errors + " failed";
    if (current.length === 1 && current[0].p50_ms !== null) detail += " · p50 " + current[0].p50_ms + " ms";
    if (scope.show_money && current.every((s) => s.spend_today_usd !== undefined)) {
      const spend = current.reduce((sum, s) => sum + Number(s.spend_today_usd), 0);
      detail += " · spend today $" + spend.toFixed(4);
    }
    document.getElementById("live-detail").textContent = detail;
    const label = time(event.at) + ":" + String(new Date(event.at).getUTCSeconds()).padStart(2, "0");
    const labels = live.data.labels;
    if (labels.length && labels[labels.length - 1] === label) {
      live.data.datasets[0].data[labels.length - 1] = requests;
    } else {
      labels.push(label);
      live.data.datasets[0].data.push(requests);
      if (labels.length > 150) {
        labels.shift();
        live.data.datasets[0].data.shift();
      }
    }
    live.update();
    document.body.dataset.liveEvents = String(Number(document.body.dataset.liveEvents || 0) + 1);
  });
  document.body.dataset.chartsReady = "1";
})();
