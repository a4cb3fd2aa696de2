// callgate on narrow screens (phones): the header's Menu button and the labels of list cells.
// No framework; the layout itself is CSS (callgate.css, "narrow screens").
//
// Menu: <button class="navtoggle" aria-expanded aria-controls="mainnav"> shows and hides the
// navigation below 900 px (the CSS keys on aria-expanded, so the attribute is the one state).
// Escape or a click outside closes it and, for Escape, gives the focus back to the button.
//
// Cell labels: below 640 px a table.dense is a stack of cards, one per row, each cell shown
// with its column's header before it (CSS: td::before { content: attr(data-label) }). The
// header row stays the one source of the words: every body and footer cell gets its
// column's header text as data-label, on load and on every htmx swap. A header that is only
// for screen readers (Select, Actions) gives an empty label.
(function () {
  "use strict";

  function toggles() { return Array.from(document.querySelectorAll(".navtoggle[aria-controls]")); }

  function setOpen(button, open) {
    button.setAttribute("aria-expanded", open ? "true" : "false");
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest(".navtoggle[aria-controls]");
    toggles().forEach((b) => {
      if (b === button) setOpen(b, b.getAttribute("aria-expanded") !== "true");
      else if (!event.target.closest(`#${b.getAttribute("aria-controls")}`)) setOpen(b, false);
    });
  });

  document.addEventListener("keydown", (event) => {
    if (event.key !== "Escape") return;
    toggles().forEach((b) => {
      if (b.getAttribute("aria-expanded") !== "true") return;
      setOpen(b, false);
      b.focus();
      event.preventDefault();
    });
  });

  function headerText(th) {
    const copy = th.cloneNode(true);
    copy.querySelectorAll(".visually-hidden, .sr-only").forEach((el) => el.remove());
    return copy.textContent.replace(/\s+/g, " ").trim();
  }

  function labelTable(table) {
    const head = table.tHead && table.tHead.rows[0];
    if (!head) return;
    const labels = [];
    Array.from(head.cells).forEach((th) => {
      for (let i = 0; i < th.colSpan; i++) labels.push(headerText(th));
    });
    const bodies = [...Array.from(table.tBodies), ...(table.tFoot ? [table.tFoot] : [])];
    bodies.forEach((body) => Array.from(body.rows).forEach((row) => {
      let column = 0;
      Array.from(row.cells).forEach((cell) => {
        if (cell.colSpan >= labels.length) cell.classList.add("whole");
        else if (!cell.hasAttribute("data-label")) cell.dataset.label = labels[column] || "";
        column += cell.colSpan;
      });
    }));
  }

  function labelTables(root) {
    const tables = new Set(root.querySelectorAll ? root.querySelectorAll("table.dense") : []);
    const around = root.closest && root.closest("table.dense");
    if (around) tables.add(around);
    tables.forEach(labelTable);
  }

  document.addEventListener("DOMContentLoaded", () => labelTables(document));
  document.addEventListener("htmx:load", (event) => labelTables(event.target));
})();
