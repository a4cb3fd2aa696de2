// Reports: draws every chart of the page with Chart.js from the JSON data island
// <script type="application/json" id="report-charts"> (a list of chart specs made by
// callgate.report_views.chart). Colours come from the CSS variables, so charts follow the
// light/dark theme like the badges do (--chart-<category>); they are redrawn when the system
// theme changes. Each canvas has role="img" and an aria-label; the table beside it is the
// accessible alternative with the same numbers.
(function () {
  "use strict";
  const charts = [];

  function css(name, fallback) {
    const value = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
    return value || fallback;
  }

  // bar fills: --chart-<category> (mid shades made to tell apart in a stack, see
  // callgate.css), falling back to the badge text colour and then to grey
  function colour(slug) {
    if (!slug || slug === "neutral") return css("--chart-neutral", css("--link", "#0b5cad"));
    return css("--chart-" + slug, css("--cat-" + slug, css("--muted", "#59636e")));
  }

  function datasets(spec) {
    return spec.datasets.map((d) => {
      const fill = d.color === "per-row" ? (d.colors || []).map(colour) : colour(d.color);
      return { label: d.label, data: d.data, backgroundColor: fill, borderColor: fill, borderWidth: 0, maxBarThickness: 42 };
    });
  }

  function options(spec) {
    const text = css("--text", "#1b1f24");
    const grid = css("--border", "#d9dde3");
    const horizontal = spec.kind === "hbar" || spec.kind === "hstacked" || spec.kind === "quality";
    const stacked = spec.kind === "stacked" || spec.kind === "hstacked";
    const title = (t) => (t ? { display: true, text: t, color: css("--muted", text) } : { display: false });
    const valueAxis = { stacked: stacked, beginAtZero: true, ticks: { color: text, precision: 0 }, grid: { color: grid },
      title: title(spec.value_title) };
    const labelAxis = { stacked: stacked, ticks: { color: text, autoSkip: !horizontal, maxRotation: 50 }, grid: { display: false },
      title: title(spec.label_title) };
    return {
      responsive: true,
      maintainAspectRatio: false,
      animation: false,
      indexAxis: horizontal ? "y" : "x",
      scales: horizontal ? { x: valueAxis, y: labelAxis } : { x: labelAxis, y: valueAxis },
      plugins: {
        legend: { display: spec.datasets.length > 1, position: "bottom", labels: { color: text, boxWidth: 12 } },
        tooltip: { mode: stacked ? "index" : "nearest", intersect: false },
      },
    };
  }

  function size(canvas, spec) {
    // horizontal bars: one row per label so long tool names stay readable
    const horizontal = spec.kind === "hbar" || spec.kind === "hstacked" || spec.kind === "quality";
    if (!horizontal || spec.short) return;
    const perRow = spec.kind === "quality" ? 3 * 14 + 10 : 26;
    const legend = spec.datasets.length > 1 ? 60 : 20;
    canvas.parentElement.style.height = Math.max(120, spec.labels.length * perRow + legend) + "px";
  }

  function draw() {
    const island = document.getElementById("report-charts");
    if (!island || typeof Chart === "undefined") return;
    charts.splice(0).forEach((c) => c.destroy());
    Chart.defaults.font.family = css("--font", "system-ui, sans-serif");
    JSON.parse(island.textContent).forEach((spec) => {
      const canvas = document.getElementById(spec.id);
      if (!canvas) return;
      size(canvas, spec);
      charts.push(new Chart(canvas, { type: "bar", data: { labels: spec.labels, datasets: datasets(spec) }, options: options(spec) }));
    });
  }

  // wide tables scroll inside their card: mark the ones that do, for the edge shadow and note
  function markOverflow() {
    document.querySelectorAll(".table-scroll").forEach((box) => {
      box.classList.toggle("overflowing", box.scrollWidth > box.clientWidth + 1);
    });
  }

  function start() {
    draw();
    markOverflow();
    window.addEventListener("resize", markOverflow);
    if (window.matchMedia) window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
