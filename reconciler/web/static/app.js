// Progressive enhancement only: every page is complete without this script.
// 1. Auto-refresh: re-fetch the page and swap the #live region (no flicker, keeps scroll).
// 2. Live log: stream the log API into #live-log as text (never as HTML).
"use strict";
(function () {
  var refreshMs = parseInt(document.body.getAttribute("data-refresh-ms") || "0", 10);
  var note = document.getElementById("refresh-note");

  function refresh() {
    // Do not replace what someone is selecting or has opened.
    var sel = window.getSelection ? String(window.getSelection()) : "";
    var open = document.querySelector("#live details[open]");
    if (sel || open) { return schedule(); }
    fetch(window.location.href, { headers: { "Accept": "text/html" }, cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        var live = document.getElementById("live");
        if (fresh && live) { live.replaceWith(document.adoptNode(fresh)); }
        if (note) { note.textContent = "refreshed " + new Date().toLocaleTimeString(); }
      })
      .catch(function () { if (note) { note.textContent = "refresh failed; retrying"; } })
      .then(schedule);
  }
  function schedule() { if (refreshMs > 0) { window.setTimeout(refresh, refreshMs); } }
  schedule();

  var spec = document.getElementById("deployed-spec");
  if (spec) {
    fetch(spec.getAttribute("data-url"), { cache: "no-store" })
      .then(function (r) { return r.json().then(function (body) { return [r.ok, body]; }); })
      .then(function (res) {
        spec.textContent = res[0] ? JSON.stringify(res[1], null, 2) : "(" + (res[1].error || "not deployed") + ")";
      })
      .catch(function (e) { spec.textContent = "(could not load: " + e + ")"; });
  }

  var log = document.getElementById("live-log");
  if (!log) { return; }
  var url = log.getAttribute("data-url");
  var run = log.getAttribute("data-run");
  var follow = log.getAttribute("data-follow") === "1";
  var query = [];
  if (run) { query.push("run=" + encodeURIComponent(run)); }
  if (follow) { query.push("follow=1"); }
  if (query.length) { url += "?" + query.join("&"); }

  function load() {
    fetch(url, { cache: "no-store" }).then(function (r) {
      if (!r.ok) {
        return r.text().then(function (t) { log.textContent = "(no log: " + t.trim() + ")"; });
      }
      log.textContent = "";
      if (!r.body || !r.body.getReader) {
        return r.text().then(function (t) { log.textContent = t; });
      }
      var reader = r.body.getReader();
      var decoder = new TextDecoder();
      function pump() {
        return reader.read().then(function (part) {
          if (part.done) { return; }
          var stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
          log.appendChild(document.createTextNode(decoder.decode(part.value, { stream: true })));
          if (stick) { log.scrollTop = log.scrollHeight; }
          return pump();
        });
      }
      return pump();
    }).catch(function (e) { log.appendChild(document.createTextNode("\n(log stream ended: " + e + ")")); });
  }
  load();
  if (!follow && log.getAttribute("data-kind") === "model" && refreshMs > 0) {
    window.setInterval(load, Math.max(refreshMs, 5000));
  }
})();
