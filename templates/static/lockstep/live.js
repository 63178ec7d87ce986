// Live updates for console pages: a websocket subscribed to this page's groups, with JSON
// polling of the status endpoint whenever the socket is down. Plain JS, no dependencies.
(function () {
  "use strict";
  var groupsEl = document.getElementById("live-groups");
  if (!groupsEl) return;
  var groups = JSON.parse(groupsEl.textContent);
  var meta = document.getElementById("cluster-meta");
  var statusUrl = meta ? meta.dataset.statusUrl : null;
  var indicator = document.getElementById("live-status");
  var HEALTH = ["health-ok", "health-degraded", "health-down", "health-unknown"];
  var socket = null, backoff = 1000, pollTimer = null, refreshTimer = null;

  function setIndicator(state, text) {
    if (!indicator) return;
    indicator.dataset.state = state;
    indicator.textContent = text;
  }

  function setHealth(kind, name, health) {
    var sel = '[data-kind="' + kind + '"][data-name="' + CSS.escape(name) + '"]';
    document.querySelectorAll(sel).forEach(function (el) {
      HEALTH.forEach(function (c) { el.classList.remove(c); });
      el.classList.add("health-" + health);
    });
  }

  function applyNode(node) {
    setHealth("node", node.name, node.health);
    var row = document.querySelector('tr[data-name="' + CSS.escape(node.name) + '"]');
    if (!row) return;
    var state = row.querySelector('[data-field="state"]');
    if (state) { state.textContent = node.state; state.className = "state state-" + node.state; }
    var seen = row.querySelector('[data-field="last_seen"]');
    if (seen && node.last_seen) seen.textContent = node.last_seen;
  }

  function applyStatus(status) {
    (status.nodes || []).forEach(applyNode);
    (status.switches || []).forEach(function (s) { setHealth("switch", s.name, s.health); });
    (status.nics || []).forEach(function (n) { setHealth("nic", n.name, n.health); });
    (status.links || []).forEach(function (l) { setHealth("link", l.name, l.health); });
  }

  function fetchStatus() {
    if (!statusUrl) return;
    fetch(statusUrl, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) applyStatus(s); })
      .catch(function () {});
  }

  function scheduleRefresh(reload) {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(reload ? function () { location.reload(); } : fetchStatus, 300);
  }

  function onEvents(message) {
    message.events.forEach(function (event) {
      if (event.kind === "node" && statusUrl) applyNode(event.data);
      else if (event.kind === "topology" || event.kind === "cluster" || (event.kind === "node" && !statusUrl)) scheduleRefresh(true);
      else scheduleRefresh(false);
    });
    document.body.dataset.liveEvents = String(Number(document.body.dataset.liveEvents || 0) + message.events.length);
  }

  function startPolling() {
    if (pollTimer || !statusUrl) return;
    pollTimer = setInterval(fetchStatus, 5000);
  }

  function stopPolling() { clearInterval(pollTimer); pollTimer = null; }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + "/ws/live/");
    socket.onopen = function () { socket.send(JSON.stringify({ subscribe: groups })); };
    socket.onmessage = function (e) {
      var message = JSON.parse(e.data);
      if (message.type === "subscribed") {
        backoff = 1000; stopPolling(); fetchStatus();
        setIndicator("live", "live");
      } else if (message.type === "events") {
        onEvents(message);
      }
    };
    socket.onclose = function () {
      setIndicator("polling", statusUrl ? "live: reconnecting (polling every 5 s)" : "live: reconnecting");
      startPolling();
      setTimeout(connect, backoff);
      backoff = Math.min(backoff * 2, 30000);
    };
  }

  var initial = document.getElementById("initial-status");
  if (initial) applyStatus(JSON.parse(initial.textContent));
  connect();
})();
