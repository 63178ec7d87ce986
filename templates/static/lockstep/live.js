// Live updates for console pages. Plain JS, no dependencies.
//
// A websocket subscribes to this page's groups (#live-groups). While it is down, the page polls
// instead: a cluster page fetches its status JSON, a list page re-fetches itself and swaps its
// [data-refresh-region] elements. The indicator in the corner says which of the two is running.
//
// Cluster page: node events recolor the node directly; other events refetch the status JSON
// (debounced); a topology event asks for a reload, since the drawing itself changed. Clicking or
// pressing Enter on a map element shows its details.
(function () {
  "use strict";
  var POLL_MS = 5000;
  var SUBSCRIBE_TIMEOUT_MS = 5000;
  var DEBOUNCE_MS = 300;
  var HEALTH = ["health-ok", "health-degraded", "health-down", "health-unknown"];
  var KIND_LABEL = { node: "host", switch: "switch", nic: "NIC", link: "cable", bundle: "cable bundle", group: "group" };
  var STATUS_KEYS = { nodes: "node", switches: "switch", nics: "nic", links: "link", bundles: "bundle" };

  var groupsEl = document.getElementById("live-groups");
  if (!groupsEl) return;
  var groups = JSON.parse(groupsEl.textContent);
  var meta = document.getElementById("cluster-meta");
  var statusUrl = meta ? meta.dataset.statusUrl : null;
  var indicator = document.getElementById("live-status");
  var socket = null, backoff = 1000, pollTimer = null, refreshTimer = null, reconnectTimer = null;
  var known = {};  // kind -> name -> the latest status row
  var index = null;  // kind + "\n" + name -> map elements
  var rows = null;  // node name -> row of the nodes table

  // --- drawing ------------------------------------------------------------------------------

  function elementsOf(kind, name) {
    if (index === null) {
      index = {};
      document.querySelectorAll("#fabric-map [data-kind]").forEach(function (el) {
        var key = el.dataset.kind + "\n" + el.dataset.name;
        (index[key] = index[key] || []).push(el);
      });
    }
    return index[kind + "\n" + name] || [];
  }

  function setHealth(kind, name, health) {
    var cls = "health-" + (health || "unknown");
    elementsOf(kind, name).forEach(function (el) {
      if (el.classList.contains(cls)) return;
      HEALTH.forEach(function (c) { el.classList.remove(c); });
      el.classList.add(cls);
    });
  }

  function remember(kind, row) {
    (known[kind] = known[kind] || {})[row.name] = row;
  }

  function applyNode(node) {
    remember("node", node);
    setHealth("node", node.name, node.health);
    if (rows === null) {
      rows = {};
      document.querySelectorAll("#nodes tr[data-name]").forEach(function (tr) { rows[tr.dataset.name] = tr; });
    }
    var row = rows[node.name];
    if (!row) return;
    var state = row.querySelector('[data-field="state"]');
    if (state && state.textContent !== node.state) {
      state.textContent = node.state;
      state.className = "state state-" + node.state;
    }
    var seen = row.querySelector('[data-field="last_seen"]');
    if (seen && node.last_seen) {
      seen.innerHTML = "";
      var time = document.createElement("time");
      time.dateTime = node.last_seen;
      time.textContent = node.last_seen.replace("T", " ").slice(0, 19);
      seen.appendChild(time);
    }
  }

  function applyStatus(status) {
    Object.keys(STATUS_KEYS).forEach(function (key) {
      var kind = STATUS_KEYS[key];
      (status[key] || []).forEach(function (row) {
        if (kind === "node") applyNode(row);
        else { remember(kind, row); setHealth(kind, row.name, row.health); }
      });
    });
    if (status.incidents) applyIncidents(status.incidents);
    document.body.dataset.statusAt = status.generated_at || "";
    refreshDetails();
  }

  // The cluster's open incidents, newest first, each a link to its page.
  function applyIncidents(incidents) {
    var list = document.getElementById("incidents");
    if (!list) return;
    var items = incidents.map(function (incident) {
      var li = document.createElement("li");
      li.dataset.incident = String(incident.id);
      var a = document.createElement("a");
      a.href = list.dataset.base + incident.id + "/";
      a.textContent = incident.kind + " " + incident.culprit;
      var state = document.createElement("span");
      state.className = "state incident-" + incident.state;
      state.textContent = incident.state;
      li.append(a, " ", state, incident.network_ok ? " · not the network" : "");
      return li;
    });
    if (!items.length) {
      var none = document.createElement("li");
      none.className = "muted";
      none.textContent = "No open incidents.";
      items.push(none);
    }
    list.replaceChildren.apply(list, items);
  }

  // --- fetching -----------------------------------------------------------------------------

  function fetchStatus() {
    return fetch(statusUrl, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) { if (s) { applyStatus(s); noteUpdate(); } })
      .catch(function () {});
  }

  function refreshRegions() {
    return fetch(location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-refresh-region][id]").forEach(function (el) {
          var replacement = fresh.getElementById(el.id);
          // Only what changed is replaced: a row the user is about to click stays put.
          if (replacement && replacement.innerHTML !== el.innerHTML) el.replaceWith(replacement);
        });
        noteUpdate();
      })
      .catch(function () {});
  }

  var refresh = statusUrl ? fetchStatus : refreshRegions;

  function scheduleRefresh() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(refresh, DEBOUNCE_MS);
  }

  function topologyChanged() {
    if (document.getElementById("topology-changed")) return;
    var note = document.createElement("p");
    note.id = "topology-changed";
    note.className = "message";
    note.setAttribute("role", "status");
    var link = document.createElement("a");
    link.href = location.pathname;
    link.textContent = "Reload";
    note.append("The topology of this cluster changed. ", link, " to redraw the map.");
    document.querySelector("main").prepend(note);
    scheduleRefresh();
  }

  // Clock sync (console/clocks): a node's row and the cluster's summary, from the event itself.
  function fmt(value, digits) {
    return value === null || value === undefined ? "\u2014" : Number(value).toFixed(digits);
  }

  function applyClock(kind, data) {
    var row = kind === "clock.node" ? document.querySelector('#node-clocks tr[data-node="' + data.node + '"]')
                                    : document.getElementById("clock-summary");
    if (!row) { scheduleRefresh(); return; }
    var shown = kind === "clock.node"
      ? { state: data.state, offset_ns: fmt(data.offset_ns, 0), drift_ppm: fmt(data.drift_ppm, 3),
          bound_ns: fmt(data.bound_ns, 0), steps: String(data.steps) }
      : { nodes_synced: String(data.nodes_synced), nodes_total: String(data.nodes_total),
          worst_bound_ns: data.worst_bound_ns === null ? "\u2014" : fmt(data.worst_bound_ns, 0) + " ns",
          flagged: String(data.flagged), disconnected: String(data.disconnected) };
    Object.keys(shown).forEach(function (field) {
      var el = row.querySelector('[data-field="' + field + '"]');
      if (!el) return;
      el.textContent = shown[field];
      if (field === "state") el.className = "state state-" + shown[field];
    });
  }

  function onEvents(message) {
    message.events.forEach(function (event) {
      // commands and probe windows (every second) do not change what these pages show
      if (event.kind === "command" || event.kind === "probe_window") return;
      if (event.kind === "clock.node" || event.kind === "clock.sync") applyClock(event.kind, event.data);
      else if (statusUrl && event.kind === "node") applyNode(event.data);
      else if (statusUrl && event.kind === "topology") topologyChanged();
      else scheduleRefresh();
    });
    document.body.dataset.liveEvents = String(Number(document.body.dataset.liveEvents || 0) + message.events.length);
  }

  // --- connection ---------------------------------------------------------------------------

  function setIndicator(state, text) {
    if (!indicator) return;
    indicator.dataset.state = state;
    indicator.textContent = text;
  }

  function noteUpdate() {
    if (indicator && indicator.dataset.state === "polling") {
      setIndicator("polling", "polling every " + POLL_MS / 1000 + " s · updated " + new Date().toLocaleTimeString());
    }
  }

  function startPolling() {
    if (pollTimer) return;
    setIndicator("polling", "polling every " + POLL_MS / 1000 + " s (live updates reconnecting)");
    pollTimer = setInterval(refresh, POLL_MS);
    refresh();
  }

  function stopPolling() {
    clearInterval(pollTimer);
    pollTimer = null;
  }

  function reconnectLater() {
    startPolling();
    clearTimeout(reconnectTimer);
    reconnectTimer = setTimeout(connect, backoff);
    backoff = Math.min(backoff * 2, 30000);
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    try {
      socket = new WebSocket(scheme + location.host + "/ws/live/");
    } catch (e) {
      reconnectLater();
      return;
    }
    var ws = socket;
    // A socket that a proxy or a policy swallows may never open nor close: give it a few
    // seconds to subscribe, then poll and try again later.
    var stalled = setTimeout(function () {
      if (ws !== socket) return;
      socket = null;
      ws.onclose = null;
      try { ws.close(); } catch (e) { /* already failed */ }
      reconnectLater();
    }, SUBSCRIBE_TIMEOUT_MS);
    ws.onopen = function () { ws.send(JSON.stringify({ subscribe: groups })); };
    ws.onmessage = function (e) {
      var message = JSON.parse(e.data);
      if (message.type === "subscribed") {
        clearTimeout(stalled);
        backoff = 1000;
        stopPolling();
        setIndicator("live", "live");
        refresh();  // catch up on whatever happened while we were not subscribed
      } else if (message.type === "events") {
        onEvents(message);
      }
    };
    ws.onclose = function () {
      clearTimeout(stalled);
      if (ws !== socket) return;
      socket = null;
      reconnectLater();
    };
  }

  // --- details ------------------------------------------------------------------------------

  var details = document.getElementById("map-details");
  var selected = null;

  function healthOf(el) {
    for (var i = 0; i < HEALTH.length; i++) if (el.classList.contains(HEALTH[i])) return HEALTH[i].slice(7);
    return "unknown";
  }

  function showDetails(el) {
    if (!details) return;
    if (selected) selected.classList.remove("selected");
    selected = el;
    el.classList.add("selected");
    var kind = el.dataset.kind, name = el.dataset.name, row = (known[kind] || {})[name] || {};
    var fields = [["Kind", KIND_LABEL[kind] || kind], ["Health", healthOf(el)]];
    if (kind === "node") {
      fields.push(["State", row.state || "—"], ["Last seen", row.last_seen ? row.last_seen.replace("T", " ").slice(0, 19) : "never"]);
    } else if (kind === "switch") {
      fields.push(["Tier", el.dataset.tier || "—"]);
    } else if (kind === "link") {
      fields.push(["Ends", el.dataset.a + " ↔ " + el.dataset.b]);
    } else if (kind === "nic") {
      fields.push(["Host", el.dataset.host]);
    } else if (kind === "bundle") {
      var byHealth = function (counts) {
        return Object.keys(counts).sort().map(function (h) { return counts[h] + " " + h; }).join(", ");
      };
      fields.push(["Cables", el.dataset.count]);
      if (row.counts) fields.push(["Cables by health", byHealth(row.counts)]);
      if (row.nic_counts && Object.keys(row.nic_counts).length) fields.push(["NICs by health", byHealth(row.nic_counts)]);
      if (row.bad && row.bad.length) {
        var more = row.bad_total > row.bad.length ? " and " + (row.bad_total - row.bad.length) + " more" : "";
        fields.push(["Unhealthy", row.bad.join(", ") + more]);
      }
    } else if (kind === "group") {
      var counts = {};
      document.querySelectorAll('#fabric-map .cell[data-group="' + CSS.escape(name) + '"]').forEach(function (c) {
        var h = healthOf(c);
        counts[h] = (counts[h] || 0) + 1;
      });
      fields.push(["Members", el.dataset.count], ["By health", Object.keys(counts).sort().map(function (h) { return counts[h] + " " + h; }).join(", ")]);
    }
    document.getElementById("details-title").textContent = el.dataset.label || name;
    var dl = document.getElementById("details-fields");
    dl.innerHTML = "";
    fields.forEach(function (f) {
      var dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = f[0];
      dd.textContent = f[1];
      dd.dataset.field = f[0].toLowerCase().replace(/ /g, "-");
      dl.appendChild(dt);
      dl.appendChild(dd);
    });
    details.hidden = false;
  }

  function refreshDetails() {
    if (selected && details && !details.hidden) showDetails(selected);
  }

  var map = document.getElementById("fabric-map");
  if (map) {  // sizes from the drawing (data attributes: the page's CSP allows no style attributes)
    map.style.minWidth = map.dataset.minWidth + "px";
    map.style.maxWidth = map.dataset.maxWidth + "px";
  }
  if (map && details) {
    map.addEventListener("click", function (e) {
      var el = e.target.closest("[data-kind]");
      if (el) showDetails(el);
    });
    map.addEventListener("keydown", function (e) {
      if (e.key !== "Enter" && e.key !== " ") return;
      var el = e.target.closest("[data-kind]");
      if (el) { e.preventDefault(); showDetails(el); }
    });
    document.getElementById("details-close").addEventListener("click", function () {
      details.hidden = true;
      if (selected) { selected.classList.remove("selected"); selected.focus(); }
      selected = null;
    });
  }

  var initial = document.getElementById("initial-status");
  if (initial) applyStatus(JSON.parse(initial.textContent));
  connect();
})();
