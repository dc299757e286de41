// The console's only script (no inline script: the page's Content-Security-Policy forbids it).
// Without it every page still reads and works; with it, marked regions refresh themselves and the live calls
// page follows the gateway's calls as they end.
"use strict";

(function () {
  // A region with data-refresh="SECONDS" and an id is read again from the page's URL every so often.
  function follow(id, seconds) {
    function again() { window.setTimeout(tick, seconds * 1000); }
    function tick() {
      if (document.hidden) { again(); return; }
      fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
        .then(function (response) {
          if (response.redirected || response.status === 401) { window.location.reload(); return null; }
          return response.ok ? response.text() : null;
        })
        .then(function (text) {
          if (text) {
            var fresh = new DOMParser().parseFromString(text, "text/html").getElementById(id);
            var current = document.getElementById(id);
            // not while the keyboard's focus is inside it: a refresh must not take the focus away
            if (fresh && current && !current.contains(document.activeElement)) {
              current.replaceWith(document.importNode(fresh, true));
            }
          }
          again();
        })
        .catch(again);
    }
    again();
  }

  function cell(row, text) {
    var td = document.createElement("td");
    td.textContent = text;
    row.appendChild(td);
  }

  function clock(seconds) {
    return new Date(seconds * 1000).toISOString().slice(11, 19) + "Z";
  }

  // The live calls: server-sent events, newest first, at most 200 rows.
  function tail(body) {
    var state = document.getElementById("stream-state");
    var source = new EventSource(body.getAttribute("data-stream"));
    source.addEventListener("ready", function () {
      if (state) { state.textContent = "Following calls as they end."; }
    });
    source.onerror = function () { if (state) { state.textContent = "Connection lost; trying again."; } };
    source.addEventListener("call", function (message) {
      var call = JSON.parse(message.data);
      var row = document.createElement("tr");
      row.className = call.outcome === "ok" ? "ok" : "failed";
      cell(row, clock(call.at));
      cell(row, call.caller);
      cell(row, call.tool);
      cell(row, call.outcome);
      cell(row, call.duration_ms === null ? "" : call.duration_ms + " ms");
      body.insertBefore(row, body.firstChild);
      while (body.rows.length > 200) { body.deleteRow(body.rows.length - 1); }
    });
    source.addEventListener("dropped", function (message) {
      if (state) { state.textContent = message.data + " calls were not shown (the page fell behind)."; }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-refresh][id]").forEach(function (region) {
      follow(region.id, Number(region.getAttribute("data-refresh")) || 5);
    });
    var calls = document.getElementById("calls");
    if (calls && calls.hasAttribute("data-stream")) { tail(calls); }
  });
})();
