// leaseq dashboard: auto-refresh, queue filter and column sort, and the
// confirmations of the dead-letter actions. Every page works without it;
// this only makes it nicer. No dependencies, no inline script (the CSP
// forbids it).
(function () {
  "use strict";

  var body = document.body;
  var period = parseInt(body.getAttribute("data-refresh"), 10) || 0;
  var storeKey = "leaseq.refresh";

  function refreshOn() {
    try { return localStorage.getItem(storeKey) !== "off"; } catch (e) { return true; }
  }

  // busy reports whether refreshing now would disturb the user: items
  // ticked for an action, focus in a live region, or text being selected
  // (copying an id).
  function busy() {
    if (document.querySelector("#dead-form input[name=id]:checked")) return true;
    var a = document.activeElement;
    if (a && a !== body && a.closest && a.closest("[data-live]")) return true;
    var sel = window.getSelection && window.getSelection();
    return !!(sel && String(sel).length > 0);
  }

  var inFlight = false;
  function refresh() {
    if (inFlight || document.hidden || !refreshOn() || busy()) return;
    inFlight = true;
    fetch(location.href, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok || r.redirected) throw new Error("status " + r.status);
        return r.text();
      })
      .then(function (html) {
        if (busy()) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        doc.querySelectorAll("[data-live][id]").forEach(function (fresh) {
          var old = document.getElementById(fresh.id);
          if (old) old.replaceWith(document.importNode(fresh, true));
        });
        afterUpdate();
      })
      .catch(function () { /* keep the figures shown; the next tick tries again */ })
      .then(function () { inFlight = false; });
  }

  function setupRefresh() {
    if (period <= 0) return;
    var btn = document.getElementById("refresh-toggle");
    var live = document.querySelector(".live");
    function show() {
      var on = refreshOn();
      if (btn) btn.textContent = on ? "Pause" : "Resume";
      if (live) live.classList.toggle("paused", !on);
    }
    if (btn) {
      btn.hidden = false;
      btn.addEventListener("click", function () {
        try { localStorage.setItem(storeKey, refreshOn() ? "off" : "on"); } catch (e) { /* private mode */ }
        show();
        refresh();
      });
    }
    show();
    setInterval(refresh, period * 1000);
    document.addEventListener("visibilitychange", function () { if (!document.hidden) refresh(); });
  }

  // Queue list: filter rows by name as you type.
  function applyFilter() {
    var input = document.getElementById("filter");
    var table = document.querySelector("#queue-table table");
    if (!input || !table) return;
    var q = input.value.trim().toLowerCase();
    var shown = 0, total = 0;
    table.querySelectorAll("tbody tr").forEach(function (tr) {
      var name = tr.cells[0].textContent.toLowerCase();
      var hit = !q || name.indexOf(q) >= 0;
      tr.hidden = !hit;
      total++;
      if (hit) shown++;
    });
    var out = document.getElementById("shown");
    if (out) {
      if (out.getAttribute("data-server") === null) out.setAttribute("data-server", out.textContent);
      out.textContent = q ? shown + " of " + total + " queues shown" : out.getAttribute("data-server");
    }
  }

  function setupFilter() {
    var input = document.getElementById("filter");
    if (!input) return;
    input.addEventListener("input", function () {
      applyFilter();
      var u = new URL(location.href);
      if (input.value.trim()) u.searchParams.set("q", input.value.trim()); else u.searchParams.delete("q");
      u.searchParams.delete("after");
      history.replaceState(null, "", u);
    });
  }

  // Column sort on tables marked data-sortable; the choice survives
  // refreshes.
  var sortKey = "leaseq.sort";
  function applySort() {
    var table = document.querySelector("table[data-sortable]");
    if (!table) return;
    var s;
    try { s = JSON.parse(sessionStorage.getItem(sortKey) || "null"); } catch (e) { s = null; }
    var ths = table.tHead.rows[0].cells;
    for (var i = 0; i < ths.length; i++) ths[i].removeAttribute("aria-sort");
    if (!s || s.col >= ths.length) return;
    var th = ths[s.col];
    th.setAttribute("aria-sort", s.dir > 0 ? "ascending" : "descending");
    var num = th.getAttribute("data-sort") === "num";
    var tbody = table.tBodies[0];
    var rows = Array.prototype.slice.call(tbody.rows);
    rows.sort(function (a, b) {
      var x = a.cells[s.col], y = b.cells[s.col];
      var c = num ? parseFloat(x.getAttribute("data-v")) - parseFloat(y.getAttribute("data-v"))
        : x.textContent.localeCompare(y.textContent);
      return c * s.dir || a.cells[0].textContent.localeCompare(b.cells[0].textContent);
    });
    rows.forEach(function (r) { tbody.appendChild(r); });
  }

  function setupSort() {
    document.addEventListener("click", function (e) {
      var th = e.target.closest && e.target.closest("table[data-sortable] th[data-sort]");
      if (!th) return;
      var col = th.cellIndex, s;
      try { s = JSON.parse(sessionStorage.getItem(sortKey) || "null"); } catch (err) { s = null; }
      // Numbers sort largest first on the first click: that is what one
      // looks for (the deepest queue, the most dead items).
      var first = th.getAttribute("data-sort") === "num" ? -1 : 1;
      s = s && s.col === col ? { col: col, dir: -s.dir } : { col: col, dir: first };
      try { sessionStorage.setItem(sortKey, JSON.stringify(s)); } catch (err) { /* private mode */ }
      applySort();
    });
  }

  // Dead-letter page: "selected" buttons need a selection; the destructive
  // and bulk buttons ask first; a sent form cannot be sent twice.
  function updateSelection() {
    var form = document.getElementById("dead-form");
    if (!form) return;
    var boxes = form.querySelectorAll("input[name=id]");
    var n = form.querySelectorAll("input[name=id]:checked").length;
    form.querySelectorAll("[data-needs-selection]").forEach(function (b) { b.disabled = n === 0; });
    var all = document.getElementById("check-all");
    if (all) {
      all.hidden = boxes.length === 0;
      all.checked = n > 0 && n === boxes.length;
      all.indeterminate = n > 0 && n < boxes.length;
    }
  }

  function setupDeadForm() {
    document.addEventListener("change", function (e) {
      var t = e.target;
      if (t.id === "check-all") {
        document.querySelectorAll("#dead-form input[name=id]").forEach(function (b) { b.checked = t.checked; });
      }
      if (t.closest && t.closest("#dead-form")) updateSelection();
    });
    document.addEventListener("submit", function (e) {
      var b = e.submitter;
      if (b && b.getAttribute("data-confirm") && !window.confirm(b.getAttribute("data-confirm"))) {
        e.preventDefault();
        return;
      }
      var form = e.target;
      // Disable after the browser has collected the form data (a
      // disabled submitter would not be sent).
      setTimeout(function () {
        form.querySelectorAll("button").forEach(function (x) { x.disabled = true; });
      }, 0);
    });
  }

  function afterUpdate() {
    applySort();
    applyFilter();
    updateSelection();
  }

  setupRefresh();
  setupFilter();
  setupSort();
  setupDeadForm();
  afterUpdate();
})();
