// gpud dashboard: live updates and small conveniences. No inline code (the page's CSP forbids it).
(function () {
  "use strict";
  var body = document.body;

  // One event stream per page: each "change" re-fetches the regions marked
  // hx-trigger="gpud:change from:body", through the same views as a reload.
  if (body.dataset.events && window.EventSource) {
    var events = new EventSource(body.dataset.events);
    events.addEventListener("change", function () {
      body.dispatchEvent(new CustomEvent("gpud:change"));
    });
    window.addEventListener("pagehide", function () { events.close(); });
  }

  // htmx requests carry the page's CSRF token too.
  body.addEventListener("htmx:configRequest", function (e) {
    if (body.dataset.csrf) { e.detail.headers["X-CSRF-Token"] = body.dataset.csrf; }
  });

  // Expanded array rows stay expanded when the queue refreshes.
  var open = [];
  body.addEventListener("htmx:beforeSwap", function () {
    open = Array.prototype.map.call(document.querySelectorAll("details[open][id]"), function (d) { return d.id; });
  });
  body.addEventListener("htmx:afterSwap", function () {
    open.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = true; } });
  });

  // A job's log, as it grows.
  var log = document.querySelector("pre[data-log]");
  if (log && window.EventSource) {
    var tail = new EventSource(log.dataset.log);
    var KEEP = 200000;
    tail.addEventListener("log", function (e) {
      var text = log.textContent + e.data;
      log.textContent = text.length > KEEP ? text.slice(text.length - KEEP) : text;
      log.scrollTop = log.scrollHeight;
    });
    tail.addEventListener("end", function (e) {
      if (e.data) { log.textContent += e.data + "\n"; }
      log.dataset.ended = "1";
      tail.close();
    });
    window.addEventListener("pagehide", function () { tail.close(); });
  }

  // Copy buttons (the attach command).
  body.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("button[data-copy]");
    if (!button) { return; }
    var field = document.getElementById(button.dataset.copy);
    field.select();
    if (navigator.clipboard) { navigator.clipboard.writeText(field.value); } else { document.execCommand("copy"); }
    button.textContent = "Copied";
  });
})();
