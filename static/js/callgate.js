// callgate's small keyboard and display module. No framework; htmx does the requests.
//
// Lists: rows carry data-row and (optionally) data-href; j/k move the selection, Enter
// opens, x toggles the row's checkbox (on every page; no page gives x another meaning).
// Pages register extra keys with <button data-key="c"> (the button is clicked when the key
// is pressed; data-key="R" is Shift+R, so a destructive action never shares a plain key). "?" opens
// the shortcuts dialog (entries with data-help-when show only while their key works);
// "g c" / "g r" jump to calls / review. Selection survives htmx swaps because it is
// remembered by the row's id.
(function () {
  "use strict";
  let selectedId = null;
  let pendingG = false;

  function rows() { return Array.from(document.querySelectorAll("[data-row]")); }

  function select(row) {
    rows().forEach((r) => r.setAttribute("aria-selected", r === row ? "true" : "false"));
    if (row) {
      selectedId = row.id;
      row.scrollIntoView({ block: "nearest" });
      const focusable = row.querySelector("a, button, input");
      if (focusable && document.activeElement && document.activeElement.closest("[data-row]")) focusable.focus({ preventScroll: true });
    }
  }

  function move(delta) {
    const all = rows();
    if (!all.length) return;
    const current = all.findIndex((r) => r.id === selectedId);
    const next = current < 0 ? 0 : Math.min(all.length - 1, Math.max(0, current + delta));
    select(all[next]);
  }

  function typing(target) {
    return target.closest("input, textarea, select, [contenteditable]") !== null;
  }

  // The help dialog lists only keys that work right now: a <dt data-help-when="CSS selector">
  // (and the <dd> after it) is hidden while nothing on the page matches the selector,
  // e.g. data-help-when='[data-key="a"]:not([disabled])'.
  function showOnlyWorkingKeys(dialog) {
    dialog.querySelectorAll("dt[data-help-when]").forEach((dt) => {
      let works = false;
      try { works = document.querySelector(dt.dataset.helpWhen) !== null; } catch (e) { works = true; }
      dt.hidden = !works;
      const dd = dt.nextElementSibling;
      if (dd && dd.tagName === "DD") dd.hidden = !works;
    });
  }

  document.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target)) return;
    const key = event.key;
    if (pendingG) {
      pendingG = false;
      const target = document.querySelector(`[data-goto="${key}"]`);
      if (target) { window.location.href = target.getAttribute("href"); event.preventDefault(); }
      return;
    }
    if (key === "g") { pendingG = true; return; }
    if (key === "/") {  // the header's search box (templates/_base.html)
      const box = document.getElementById("search-box");
      if (box) { box.focus(); box.select(); event.preventDefault(); }
      return;
    }
    if (key === "?") {
      const dialog = document.getElementById("shortcuts");
      if (dialog && !dialog.open) { showOnlyWorkingKeys(dialog); dialog.showModal(); }
      event.preventDefault();
      return;
    }
    if (key === "j" || key === "ArrowDown" && rows().length) { move(1); event.preventDefault(); return; }
    if (key === "k" || key === "ArrowUp" && rows().length) { move(-1); event.preventDefault(); return; }
    const row = selectedId ? document.getElementById(selectedId) : null;
    if (key === "Enter" && row && row.dataset.href) { window.location.href = row.dataset.href; return; }
    if (key === "x" && row) {
      const box = row.querySelector("input[type=checkbox]");
      if (box) { box.click(); event.preventDefault(); return; }
    }
    // Page-defined shortcuts: the selected row's button first, then the page's.
    const scoped = row && row.querySelector(`[data-key="${key}"]:not([disabled])`);
    const button = scoped || document.querySelector(`[data-key="${key}"]:not([data-row] [data-key]):not([disabled])`);
    if (button) { button.click(); event.preventDefault(); }
  });

  // Times: <time datetime="…" data-relative> shows "4 min ago", the exact UTC time on hover.
  const units = [["day", 86400], ["h", 3600], ["min", 60], ["s", 1]];
  function relative(date) {
    let seconds = Math.round((Date.now() - date.getTime()) / 1000);
    const future = seconds < 0;
    seconds = Math.abs(seconds);
    for (const [name, size] of units) {
      if (seconds >= size || name === "s") {
        const n = Math.floor(seconds / size);
        const label = name === "day" ? (n === 1 ? "day" : "days") : name;
        return future ? `in ${n} ${label}` : `${n} ${label} ago`;
      }
    }
    return "";
  }
  // <time datetime="…" data-local>: the local clock time today ("07:54:59"; with
  // data-local="minutes", for window bounds, "29 Nov, 07:54" whatever the day), with the date
  // on any other day ("29 Nov, 07:54:59"; the year too when it is not this year), so a
  // timeline spanning midnight reads in order. The exact UTC time is on hover.
  const clock = { hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23" };
  function localTime(date, minutes) {
    const now = new Date();
    const shown = minutes ? { hour: "2-digit", minute: "2-digit", hourCycle: "h23" } : clock;
    // window bounds (minutes) always carry their date: "29 Nov, 21:00 – 30 Nov, 22:00"
    if (!minutes && date.toDateString() === now.toDateString())
      return date.toLocaleTimeString([], shown);
    const day = { month: "short", day: "numeric", ...shown };
    if (date.getFullYear() !== now.getFullYear()) day.year = "numeric";
    return date.toLocaleString([], day);
  }
  function refreshTimes(root) {
    (root || document).querySelectorAll("time[data-relative]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      el.textContent = relative(date);
      el.title = date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    });
    (root || document).querySelectorAll("time[data-local]").forEach((el) => {
      const date = new Date(el.getAttribute("datetime"));
      if (isNaN(date)) return;
      el.textContent = localTime(date, el.dataset.local === "minutes");
      el.title = date.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    });
    // Countdowns: <span data-countdown="ISO time">.
    (root || document).querySelectorAll("[data-countdown]").forEach((el) => {
      const left = Math.round((new Date(el.dataset.countdown).getTime() - Date.now()) / 1000);
      if (isNaN(left)) return;
      if (left <= 0) { el.textContent = "expired"; return; }
      const m = Math.floor(left / 60), s = left % 60;
      el.textContent = `${m}:${String(s).padStart(2, "0")} left`;
    });
  }

  // Copy buttons: <button data-copy="text">.
  document.addEventListener("click", (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    navigator.clipboard && navigator.clipboard.writeText(button.dataset.copy);
    button.setAttribute("aria-label", "Copied");
  });

  // Row clicks select the row (links and buttons inside keep their own behaviour).
  document.addEventListener("click", (event) => {
    const row = event.target.closest("[data-row]");
    if (row) select(row);
  });

  // Filter bars: <form data-autosubmit> submits when one of its selects changes.
  document.addEventListener("change", (event) => {
    const form = event.target.closest("form[data-autosubmit]");
    if (form && event.target.matches("select")) form.requestSubmit();
  });

  // htmx "settles" class/style/width/height of elements kept by id across a swap by copying
  // them with setAttribute; copying a style attribute (e.g. a textarea the user resized) is an
  // inline style the CSP blocks. We never style by attribute, so only settle the others.
  if (window.htmx) htmx.config.attributesToSettle = htmx.config.attributesToSettle.filter((a) => a !== "style");

  document.addEventListener("DOMContentLoaded", () => refreshTimes(document));
  document.addEventListener("htmx:afterSwap", (event) => {
    refreshTimes(event.target);
    if (selectedId) {
      const row = document.getElementById(selectedId);
      if (row) row.setAttribute("aria-selected", "true");
    }
  });
  setInterval(() => refreshTimes(document), 1000);
  window.callgate = { refreshTimes, select, localTime };
})();
