// gpud dashboard: live updates and small conveniences. No inline code (the page's CSP forbids it).
(function () {
  "use strict";
  var body = document.body;

  // Expanded array rows stay expanded when the live part is replaced.
  var open = [];
  function remember() {
    open = Array.prototype.map.call(document.querySelectorAll("details[open][id]"), function (d) { return d.id; });
  }
  function restore() {
    open.forEach(function (id) { var d = document.getElementById(id); if (d) { d.open = true; } });
  }
  body.addEventListener("htmx:beforeSwap", remember);
  body.addEventListener("htmx:afterSwap", restore);

  // One event stream per page, naming the page: each "section" carries the
  // page's live part (made by the same view as a reload) and replaces the
  // region marked data-live; a "change" makes the regions marked
  // hx-trigger="gpud:change from:body" fetch it themselves.
  var events = null;
  function listen(view) {
    if (events) { events.close(); }
    var url = body.dataset.events.split("?")[0] + "?view=" + encodeURIComponent(view);
    var source = events = new EventSource(url);
    events.addEventListener("change", function () {
      body.dispatchEvent(new CustomEvent("gpud:change"));
    });
    events.addEventListener("section", function (e) {
      var region = document.querySelector("[data-live]");
      if (!region || source !== events) { return; }  // a stream for the page before a filter changed
      remember();
      region.innerHTML = e.data;
      if (window.htmx) { window.htmx.process(region); }
      restore();
    });
  }
  if (body.dataset.events && window.EventSource) {
    listen(location.pathname + location.search);
    // A filter or page shown through htmx changes the address: the stream follows it.
    var follow = function () { listen(location.pathname + location.search); };
    body.addEventListener("htmx:pushedIntoHistory", follow);
    body.addEventListener("htmx:replacedInHistory", follow);
    body.addEventListener("htmx:historyRestore", follow);
    window.addEventListener("pagehide", function () { events.close(); });
  }

  // htmx requests carry the page's CSRF token too.
  body.addEventListener("htmx:configRequest", function (e) {
    if (body.dataset.csrf) { e.detail.headers["X-CSRF-Token"] = body.dataset.csrf; }
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
