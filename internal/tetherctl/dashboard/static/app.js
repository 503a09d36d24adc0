// Live parts of the dashboard. Pages work without it; with it, fleet
// events arriving over server-sent events refresh the page's live
// fragment, append rows to the event log, and follow the console.
(function () {
  "use strict";
  var body = document.body;
  var live = body.dataset.live, fragURL = body.dataset.fragment;
  var statusEl = document.getElementById("live-status");
  function setStatus(on, text) {
    if (!statusEl) return;
    statusEl.textContent = text;
    statusEl.className = on ? "live-on" : "live-off";
  }
  var pending = null, inflight = false, again = false;
  function refresh() {
    if (!fragURL) return;
    if (inflight) { again = true; return; }
    inflight = true;
    fetch(fragURL, { cache: "no-store" }).then(function (r) {
      if (!r.ok) throw new Error(r.status + " " + r.statusText);
      return r.text();
    }).then(function (html) {
      var el = document.getElementById("live");
      if (el) el.innerHTML = html;
      body.dataset.refreshed = String(Date.now());
    }).catch(function (e) { setStatus(false, "refresh failed: " + e.message); })
      .finally(function () { inflight = false; if (again) { again = false; schedule(); } });
  }
  function schedule() {
    if (pending) return;
    pending = setTimeout(function () { pending = null; refresh(); }, 150);
  }
  function esc(s) { var d = document.createElement("div"); d.textContent = s == null ? "" : s; return d.innerHTML; }

  var table = document.getElementById("event-table");
  if (table && table.dataset.watch) {
    var P = table.dataset.watch.split("/sse/")[0];
    var es = new EventSource(table.dataset.watch);
    es.onopen = function () { setStatus(true, "live"); };
    es.onerror = function () { setStatus(false, "reconnecting"); };
    es.addEventListener("fleet", function (m) {
      var e = JSON.parse(m.data);
      var tr = document.createElement("tr");
      tr.className = "fresh";
      tr.dataset.eventId = e.id;
      tr.innerHTML = '<td class="nowrap">' + esc(e.at) + '</td><td><span class="sev sev-' + esc(e.severity) + '">' + esc(e.severity) +
        '</span></td><td><a href="' + P + '/events?kind=' + encodeURIComponent(e.kind) + '">' + esc(e.kind) + '</a></td><td>' +
        (e.instance ? '<a href="' + P + '/instances/' + encodeURIComponent(e.instance) + '">' + esc(e.instance.slice(0, 19)) + '</a>' : '') +
        '</td><td>' + (e.correlation ? '<a href="' + P + '/events?correlation=' + encodeURIComponent(e.correlation) + '">' + esc(e.correlation.slice(0, 19)) + '</a>' : '') +
        '</td><td class="msg">' + esc(e.message) + '</td>';
      var tb = table.tBodies[0];
      tb.insertBefore(tr, tb.firstChild);
      while (tb.rows.length > 500) tb.deleteRow(tb.rows.length - 1);
    });
  } else if (live === "poll") {
    setStatus(true, "following");
    var timer = setInterval(function () {
      refresh();
      var s = document.getElementById("task-status");
      if (s && /succeeded|failed|cancelled/.test(s.textContent)) { clearInterval(timer); setStatus(true, "done"); }
    }, 500);
  } else if (live) {
    var src = new EventSource(live);
    src.onopen = function () { setStatus(true, "live"); };
    src.onerror = function () { setStatus(false, "reconnecting"); };
    src.addEventListener("fleet", schedule);
  }

  var con = document.getElementById("console");
  if (con && con.dataset.src) {
    var cs = new EventSource(con.dataset.src);
    cs.addEventListener("console", function (m) {
      var atEnd = con.scrollTop + con.clientHeight >= con.scrollHeight - 4;
      con.textContent += JSON.parse(m.data);
      if (con.textContent.length > 200000) con.textContent = con.textContent.slice(-150000);
      if (atEnd) con.scrollTop = con.scrollHeight;
    });
    cs.addEventListener("error", function (m) {
      if (m.data) { con.textContent += "\n[console: " + JSON.parse(m.data) + "]\n"; cs.close(); }
    });
  }
})();
