// kedge dashboard: one page, no build step, no third-party code.
//
// The server pushes a `snapshot` and then `delta`s over server-sent events; this script
// keeps them in `S` and renders the page for the route in the URL's hash. Every string from
// the API reaches the DOM as a text node (`h` below never parses HTML), and the server's
// Content-Security-Policy allows no inline script besides.
'use strict';

(() => {
  const ROW = 30; // fleet table row height, px (matches app.css)
  const OVERSCAN = 8;
  const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed', '#0891b2', '#db2777', '#65a30d'];

  const S = {
    member: new Map(), dso: new Map(), dsj: new Map(), event: new Map(),
    history: new Map(), errors: {}, namespace: null, synced: false, skew: 0,
  };
  // What the browser tests and the bench read.
  const probe = { state: S, renders: 0, deltas: 0, snapshots: 0, lastRenderMs: 0, lastApplyMs: 0, snapshotApplyMs: 0, renderTimes: [], synced: false };
  window.kedge = probe;

  const now = () => Date.now() + S.skew;

  // ---- DOM helpers: text only, never HTML ----
  function h(tag, props, ...children) {
    const el = document.createElement(tag);
    setProps(el, props);
    append(el, children);
    return el;
  }
  function s(tag, attrs, ...children) {
    const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
    append(el, children);
    return el;
  }
  function setProps(el, props) {
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'data') for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'style') Object.assign(el.style, v);
      else el.setAttribute(k, String(v));
    }
  }
  function append(el, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
  }
  const text = (v) => (v === undefined || v === null || v === '' ? '—' : String(v));
  const link = (href, label) => h('a', { href }, label);
  const routeOf = (kind, key) => `#/${kind}/${key.split('/').map(encodeURIComponent).join('/')}`;

  // ---- time ----
  function parseDuration(v, fallbackMs) {
    if (typeof v !== 'string') return fallbackMs;
    let ms = 0, matched = false;
    for (const m of v.matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h|d)/g)) {
      matched = true;
      ms += Number(m[1]) * { ms: 1, s: 1e3, m: 6e4, h: 36e5, d: 864e5 }[m[2]];
    }
    return matched ? ms : fallbackMs;
  }
  function span(ms) {
    const neg = ms < 0; let t = Math.abs(Math.round(ms / 1000));
    const d = Math.floor(t / 86400), hh = Math.floor((t % 86400) / 3600), m = Math.floor((t % 3600) / 60), sec = t % 60;
    const out = d ? `${d}d${hh}h` : hh ? `${hh}h${m}m` : m ? `${m}m${sec}s` : `${sec}s`;
    return neg ? `-${out}` : out;
  }
  const ago = (iso) => (iso ? `${span(now() - Date.parse(iso))} ago` : '—');
  const until = (ms) => (ms > 0 ? `in ${span(ms)}` : `${span(-ms)} ago`);

  // ---- derived: who places work where, which taints are live ----
  let index = null; // rebuilt when a DSO or DSJ changes
  function buildIndex() {
    const work = new Map(), taints = new Map();
    const add = (m, k, v) => { if (!m.has(k)) m.set(k, []); m.get(k).push(v); };
    for (const o of S.dso.values()) {
      for (const [m, st] of Object.entries(o.status?.memberClusterStatuses || {})) {
        const n = st.desiredReplicas || 0;
        if (n || st.currentReplicas) add(work, m, { kind: 'dso', key: o.key, n });
      }
    }
    for (const o of S.dsj.values()) {
      for (const [m, st] of Object.entries(o.status?.memberClusterStatuses || {})) {
        const n = st.runningJobs || 0;
        if (n || st.pendingJobs) add(work, m, { kind: 'dsj', key: o.key, n });
      }
      for (const t of o.status?.scheduling?.taints || []) add(taints, t.member, { dsj: o.key, ...t });
    }
    index = { work, taints };
    return index;
  }
  const idx = () => index || buildIndex();
  // The live taints of a member: [{hard, left, dsj, class}].
  function liveTaints(member, t = now()) {
    const out = [];
    for (const r of idx().taints.get(member) || []) {
      const hard = r.hardUntil ? Date.parse(r.hardUntil) - t : -1;
      const soft = r.softUntil ? Date.parse(r.softUntil) - t : -1;
      if (hard > 0) out.push({ hard: true, left: hard, dsj: r.dsj, class: r.class });
      else if (soft > 0) out.push({ hard: false, left: soft, dsj: r.dsj, class: r.class });
    }
    return out;
  }
  const taintLabel = (x) => `${x.hard ? 'hard' : 'soft'} ${span(x.left)}${x.class ? ` (${x.class})` : ''}`;

  // ---- the stream ----
  function setConnection(state, label) {
    const el = document.getElementById('connection');
    el.dataset.state = state;
    el.textContent = label;
  }
  function applySnapshot(snap) {
    const t0 = performance.now();
    for (const kind of ['member', 'dso', 'dsj', 'event']) {
      S[kind] = new Map((snap.kinds?.[kind] || []).map((v) => [v.key, v]));
    }
    S.history = new Map(Object.entries(snap.history || {}));
    S.errors = snap.errors || {};
    S.namespace = snap.namespace || null;
    S.synced = !!snap.synced;
    S.skew = (snap.now || Date.now()) - Date.now();
    probe.snapshots += 1;
    changed(true);
    probe.lastApplyMs = performance.now() - t0;
  }
  function applyDelta(d) {
    const t0 = performance.now();
    let workloads = false, members = false;
    for (const [kind, ch] of Object.entries(d.kinds || {})) {
      const map = S[kind];
      if (!map) continue;
      for (const v of ch.upsert || []) map.set(v.key, v);
      for (const k of ch.delete || []) { map.delete(k); if (kind === 'dso' || kind === 'dsj') S.history.delete(k); }
      if (kind === 'dso' || kind === 'dsj') workloads = true;
      if (kind === 'member') members = true;
    }
    for (const [key, sample] of d.samples || []) {
      if (!S.history.has(key)) S.history.set(key, []);
      const h = S.history.get(key);
      h.push(sample);
      if (h.length > 2000) h.shift();
    }
    for (const [kind, msg] of Object.entries(d.errors || {})) {
      if (msg) S.errors[kind] = msg; else delete S.errors[kind];
    }
    // Every kind lists once before the first delta can name it.
    S.synced = S.synced || Object.keys(d.kinds || {}).length > 0;
    if (d.now) S.skew = d.now - Date.now();
    probe.deltas += 1;
    changed(workloads || members);
    probe.lastApplyMs = performance.now() - t0;
  }
  function connect() {
    const es = new EventSource('/api/stream');
    es.addEventListener('snapshot', (e) => {
      const t0 = performance.now();
      applySnapshot(JSON.parse(e.data));
      probe.snapshotApplyMs = performance.now() - t0;
      setConnection('live', 'live');
    });
    es.addEventListener('delta', (e) => applyDelta(JSON.parse(e.data)));
    es.addEventListener('open', () => setConnection('live', 'live'));
    // EventSource reconnects by itself; the server sends a fresh snapshot then.
    es.addEventListener('error', () => setConnection('lost', 'reconnecting…'));
  }

  // ---- rendering ----
  let dirtyRows = true; // the fleet's filtered and sorted rows need recomputing
  let scheduled = false;
  function changed(structural) {
    index = null;
    if (structural) dirtyRows = true;
    schedule();
  }
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => { scheduled = false; render(); });
  }

  let page = null; // {route, update()}
  function route() {
    let parts;
    try {
      parts = (location.hash.replace(/^#\/?/, '') || '').split('/').map(decodeURIComponent);
    } catch (e) {
      return { name: 'fleet' }; // a malformed hash (a stray %) is the fleet page
    }
    if (parts[0] === 'dso' || parts[0] === 'dsj') return { name: parts[0], key: `${parts[1]}/${parts[2]}` };
    if (parts[0] === 'workloads') return { name: 'workloads' };
    return { name: 'fleet' };
  }
  function render() {
    const t0 = performance.now();
    const r = route();
    const id = `${r.name}:${r.key || ''}`;
    if (!page || page.id !== id) {
      const main = document.getElementById('main');
      main.replaceChildren();
      page = { id, ...PAGES[r.name](main, r) };
      for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.id === `nav-${r.name}`);
    }
    renderErrors();
    page.update();
    probe.renders += 1;
    probe.synced = S.synced;
    probe.lastRenderMs = performance.now() - t0;
    probe.renderTimes.push(probe.lastRenderMs);
    if (probe.renderTimes.length > 200) probe.renderTimes.shift();
  }
  function renderErrors() {
    const el = document.getElementById('errors');
    const msgs = Object.values(S.errors);
    el.hidden = msgs.length === 0;
    el.replaceChildren(...msgs.map((m) => h('div', { class: 'error' }, m)));
  }

  // ---- fleet ----
  const MEMBER_COLUMNS = [
    { id: 'name', label: 'Member', get: (m) => m.name },
    { id: 'state', label: 'State', get: (m) => m.state },
    { id: 'heartbeat', label: 'Heartbeat', get: (m) => (m.hb ? now() - m.hb : Infinity), show: (m) => (m.hb ? `${span(now() - m.hb)} ago` : '—') },
    { id: 'agent', label: 'Agent', get: (m) => m.agent },
    { id: 'kubernetes', label: 'Kubernetes', get: (m) => m.k8s },
    { id: 'cert', label: 'Cert expires', get: (m) => m.cert || Infinity, show: (m) => (m.cert ? until(m.cert - now()) : '—'), warn: (m) => m.cert && m.cert - now() < 7 * 864e5 },
    { id: 'namespaces', label: 'Namespaces', get: (m) => m.namespaces },
    { id: 'taints', label: 'Taints', get: (m) => liveTaints(m.name).length, show: (m) => liveTaints(m.name).map(taintLabel).join(', ') || '—' },
    { id: 'capacity', label: 'CPU used/alloc.', get: (m) => m.cpu },
    { id: 'rtt', label: 'RTT', get: (m) => m.rtt ?? Infinity, show: (m) => (m.rtt === null ? '—' : `${m.rtt} ms`) },
    { id: 'work', label: 'Workloads', get: (m) => (idx().work.get(m.name) || []).length, show: (m) => workLabel(m.name) },
  ];
  function workLabel(member) {
    const w = idx().work.get(member) || [];
    if (!w.length) return '—';
    const first = w.slice(0, 2).map((x) => `${x.key} ${x.n}`).join(', ');
    return w.length > 2 ? `${first} +${w.length - 2}` : first;
  }
  // A CPU quantity ("24000m", "1.5", "2") in cores, to two decimals.
  function cores(q) {
    if (typeof q !== 'string' || !q) return '0';
    const n = q.endsWith('m') ? Number(q.slice(0, -1)) / 1000 : Number(q);
    return Number.isFinite(n) ? String(Math.round(n * 100) / 100) : q;
  }
  function memberRow(v) {
    const st = v.status || {};
    const cap = st.capacity || {};
    const cpu = cap.allocatable?.cpu ? `${cores(cap.allocated?.cpu)}/${cores(cap.allocatable.cpu)}` : '';
    return {
      name: v.name,
      state: st.state || 'Pending',
      hb: st.lastHeartbeatTime ? Date.parse(st.lastHeartbeatTime) : null,
      agent: st.agentVersion || '',
      k8s: st.kubernetesVersion || '',
      cert: st.certificateExpiry ? Date.parse(st.certificateExpiry) : null,
      namespaces: (v.spec?.namespaces || []).join(','),
      cpu,
      rtt: st.link ? st.link.rttMilliseconds : null,
    };
  }

  function fleetPage(main) {
    const view = { sort: 'name', desc: false, filter: '', state: '', rows: [] };
    const summary = h('div', { id: 'summary', class: 'summary' });
    const filter = h('input', { id: 'filter', type: 'search', placeholder: 'Filter: name, version, namespace, workload…', oninput: (e) => { view.filter = e.target.value.toLowerCase(); dirtyRows = true; schedule(); } });
    const stateSel = h('select', { id: 'state-filter', onchange: (e) => { view.state = e.target.value; dirtyRows = true; schedule(); } },
      ...['', 'Ready', 'Unreachable', 'Pending', 'Tainted'].map((v) => h('option', { value: v }, v || 'All states')));
    const shown = h('span', { id: 'shown', class: 'muted' });
    const head = h('div', { class: 'row head' }, MEMBER_COLUMNS.map((c) => h('div', {
      class: 'cell', data: { col: c.id }, title: 'Sort',
      onclick: () => { view.desc = view.sort === c.id ? !view.desc : false; view.sort = c.id; dirtyRows = true; schedule(); },
    }, c.label)));
    const spacer = h('div', { class: 'spacer' });
    const rowsEl = h('div', { class: 'rows' });
    const viewport = h('div', { id: 'members', class: 'viewport', onscroll: schedule }, spacer, rowsEl);
    main.append(h('h1', {}, 'Fleet'), summary, h('div', { class: 'toolbar' }, filter, stateSel, shown), h('div', { class: 'vtable' }, head, viewport));

    function recompute() {
      const t = now();
      let rows = [...S.member.values()].map(memberRow);
      if (view.state === 'Tainted') rows = rows.filter((m) => liveTaints(m.name, t).length);
      else if (view.state) rows = rows.filter((m) => m.state === view.state);
      if (view.filter) {
        rows = rows.filter((m) => `${m.name} ${m.state} ${m.agent} ${m.k8s} ${m.namespaces} ${workLabel(m.name)}`.toLowerCase().includes(view.filter));
      }
      const col = MEMBER_COLUMNS.find((c) => c.id === view.sort) || MEMBER_COLUMNS[0];
      const keyed = rows.map((m) => [col.get(m), m]);
      keyed.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1].name < b[1].name ? -1 : 1));
      if (view.desc) keyed.reverse();
      view.rows = keyed.map((x) => x[1]);
      for (const c of head.children) c.dataset.sorted = c.dataset.col === view.sort ? (view.desc ? 'desc' : 'asc') : '';
      dirtyRows = false;
    }
    function update() {
      if (dirtyRows) recompute();
      let ready = 0, unreachable = 0, pending = 0, tainted = 0;
      const t = now();
      for (const v of S.member.values()) {
        const state = v.status?.state || 'Pending';
        if (state === 'Ready') ready += 1; else if (state === 'Unreachable') unreachable += 1; else pending += 1;
        if (idx().taints.has(v.name) && liveTaints(v.name, t).length) tainted += 1;
      }
      summary.replaceChildren(
        h('span', { data: { count: 'members' } }, `${S.member.size} members`), ' · ',
        h('span', { class: 'ok', data: { count: 'ready' } }, `${ready} ready`), ' · ',
        h('span', { class: unreachable ? 'bad' : '', data: { count: 'unreachable' } }, `${unreachable} unreachable`), ' · ',
        h('span', { data: { count: 'pending' } }, `${pending} pending`), ' · ',
        h('span', { class: tainted ? 'warn' : '', data: { count: 'tainted' } }, `${tainted} tainted`), ' · ',
        link('#/workloads', `${S.dso.size} DSOs · ${S.dsj.size} DSJs`),
        S.namespace ? ` (namespace ${S.namespace})` : '',
      );
      shown.textContent = `${view.rows.length} shown`;
      spacer.style.height = `${view.rows.length * ROW}px`;
      // As tall as the rows, up to 20 of them; the rest scrolls.
      viewport.style.height = `${Math.max(3, Math.min(20, view.rows.length)) * ROW + 2}px`;
      const first = Math.max(0, Math.floor(viewport.scrollTop / ROW) - OVERSCAN);
      const last = Math.min(view.rows.length, Math.ceil((viewport.scrollTop + viewport.clientHeight) / ROW) + OVERSCAN);
      rowsEl.style.transform = `translateY(${first * ROW}px)`;
      const out = [];
      for (let i = first; i < last; i += 1) {
        const m = view.rows[i];
        out.push(h('div', { class: 'row', data: { member: m.name, state: m.state } }, MEMBER_COLUMNS.map((c) => {
          const value = c.show ? c.show(m) : text(c.get(m));
          const cls = ['cell', c.id === 'state' ? `state-${m.state}` : '', c.warn && c.warn(m) ? 'warn' : '', c.id === 'taints' && value !== '—' ? 'warn' : ''].join(' ');
          return h('div', { class: cls, data: { col: c.id }, title: value }, value);
        })));
      }
      rowsEl.replaceChildren(...out);
    }
    return { update };
  }

  // ---- workloads ----
  function cond(o, type) { return (o.status?.conditions || []).find((c) => c.type === type); }
  function workloadsPage(main) {
    const body = h('div');
    main.append(h('h1', {}, 'Workloads'), body);
    function update() {
      const dsos = [...S.dso.values()].sort((a, b) => (a.key < b.key ? -1 : 1));
      const dsjs = [...S.dsj.values()].sort((a, b) => (a.key < b.key ? -1 : 1));
      body.replaceChildren(
        h('h2', {}, `DistributedScaledObjects (${dsos.length})`),
        table(['Name', 'Total', 'Current', 'Members ready', 'Ready', 'Paused'], dsos.map((o) => [
          link(routeOf('dso', o.key), o.key), text(o.spec?.totalTargetReplicas), text(o.status?.totalCurrentReplicas),
          `${o.status?.membersHealthyCount ?? 0}/${o.status?.membersTotalCount ?? 0}`, condLabel(cond(o, 'Ready')), o.paused ? `paused (${o.paused})` : '',
        ]), { id: 'dso-list' }),
        h('h2', {}, `DistributedScaledJobs (${dsjs.length})`),
        table(['Name', 'Desired', 'Running', 'Pending', 'Strategy', 'Taints', 'Ready'], dsjs.map((o) => [
          link(routeOf('dsj', o.key), o.key), text(o.status?.desiredJobs), text(o.status?.runningJobs), text(o.status?.pendingJobs),
          text(o.status?.clusterStrategy), String((o.status?.scheduling?.taints || []).length), condLabel(cond(o, 'Ready')),
        ]), { id: 'dsj-list' }),
      );
    }
    return { update };
  }
  const condLabel = (c) => (c ? `${c.status}${c.reason ? ` (${c.reason})` : ''}` : '—');
  function table(headers, rows, props = {}) {
    return h('table', props, h('thead', {}, h('tr', {}, headers.map((x) => h('th', {}, x)))),
      h('tbody', {}, rows.length ? rows.map((r) => h('tr', r.attrs || {}, (r.cells || r).map((c) => h('td', {}, c)))) : h('tr', {}, h('td', { colspan: headers.length, class: 'muted' }, 'none'))));
  }

  // ---- a DSO or DSJ ----
  function missing(body, kind, key) {
    body.replaceChildren(h('p', { class: 'muted' }, S.synced ? `No ${kind.toUpperCase()} ${key} (deleted, or not readable with your kubeconfig).` : 'Loading…'));
  }
  function eventsOf(about) {
    return [...S.event.values()].filter((e) => e.about === about).sort((a, b) => (a.time < b.time ? 1 : -1));
  }
  function timeline(about) {
    const evs = eventsOf(about);
    return h('ol', { class: 'timeline', id: 'events' }, evs.length ? evs.map((e) => h('li', { class: e.type === 'Warning' ? 'warning' : '', data: { reason: e.reason || '' } },
      h('time', { title: text(e.time) }, ago(e.time)), h('span', { class: 'reason' }, text(e.reason)), h('span', { class: 'note' }, text(e.note)))) : h('li', { class: 'muted' }, 'No events.'));
  }
  function conditions(o) {
    return table(['Condition', 'Status', 'Reason', 'Message', 'Since'], (o.status?.conditions || []).map((c) => [c.type, c.status, text(c.reason), text(c.message), ago(c.lastTransitionTime)]), { class: 'conditions' });
  }

  function dsoPage(main, r) {
    const body = h('div');
    main.append(h('h1', {}, 'DistributedScaledObject ', h('span', { class: 'key' }, r.key)), body);
    function update() {
      const o = S.dso.get(r.key);
      if (!o) return missing(body, 'dso', r.key);
      const spec = o.spec || {}, st = o.status || {};
      const statuses = st.memberClusterStatuses || {};
      const listed = new Map((spec.memberClusters || []).map((m) => [m.name, m]));
      const names = [...new Set([...listed.keys(), ...Object.keys(statuses)])].sort();
      const eligible = names.filter((n) => !statuses[n]?.excluded);
      const weightSum = eligible.reduce((a, n) => a + (listed.get(n)?.weight ?? 1), 0);
      const rows = names.map((n) => {
        const m = listed.get(n) || {}, ms = statuses[n] || {};
        return { attrs: { data: { member: n } }, cells: [n, spec.placement?.dynamicWeights ? 'capacity' : String(m.weight ?? 1), String(m.tier ?? 0),
          `${m.minReplicas ?? '—'}/${m.maxReplicas ?? '—'}`, text(ms.desiredReplicas), text(ms.currentReplicas), h('span', { class: `state-${ms.state || 'Pending'}` }, text(ms.state)),
          h('ul', { class: 'why' }, memberReasons(o, n, m, ms, weightSum).map((x) => h('li', {}, x)))] };
      });
      body.replaceChildren(
        h('div', { class: 'stats' },
          stat('Total target', spec.totalTargetReplicas ?? 'not set', 'total'),
          stat('Current replicas', st.totalCurrentReplicas ?? 0, 'current'),
          stat('Members ready', `${st.membersHealthyCount ?? 0}/${st.membersTotalCount ?? 0}`, 'ready'),
          stat('Workload', spec.scaledObjectSpec?.scaleTargetRef?.name || '—', 'target')),
        h('h2', {}, 'Why this split'), h('ul', { class: 'why', id: 'why' }, dsoReasons(o).map((x) => h('li', {}, x))),
        h('h2', {}, 'Split over time'), chart(r.key, 'replicas', names),
        h('h2', {}, 'Per member'), table(['Member', 'Weight', 'Tier', 'Min/Max', 'Desired', 'Current', 'State', 'Why'], rows, { id: 'split' }),
        ...podMetrics(st.podMetrics || []),
        h('h2', {}, 'Conditions'), conditions(o),
        h('h2', {}, 'Events'), timeline(`dso/${r.key}`),
      );
    }
    return { update };
  }
  // The kedge-pod-metrics triggers: the fleet-wide average KEDA gets, and where it comes from.
  function podMetrics(triggers) {
    if (!triggers.length) return [];
    return [h('h2', {}, 'Pod metrics'), ...triggers.map((p) => h('div', { class: 'podmetrics', data: { trigger: p.trigger } },
      h('p', {}, `${p.trigger}: ${p.metricName} averages ${p.average ?? 'no value yet'} per pod (target ${p.threshold}); ${p.podsCounted} pods counted, ${p.podsMissing} missing${p.podsMissing ? ` (each counted as ${p.missingCountedAs ?? '?'})` : ''}`),
      table(['Member', 'Sum', 'Counted', 'Missing', 'Scraped', 'Why missing'], Object.entries(p.members || {}).map(([m, v]) => [m, v.sum, String(v.podsCounted ?? 0),
        String(v.podsMissing ?? 0), v.stale ? 'stale' : ago(v.lastScrapeTime), text(v.message)]))))];
  }
  const stat = (label, value, id) => h('div', { class: 'stat', data: { stat: id } }, h('div', { class: 'value' }, String(value)), h('div', { class: 'label' }, label));

  function dsoReasons(o) {
    const out = [], spec = o.spec || {};
    if (o.paused) out.push(`Paused by annotation (${o.paused}): kedge sends no new replica counts.`);
    const total = cond(o, 'TotalSet');
    if (spec.totalTargetReplicas === undefined || spec.totalTargetReplicas === null || (total && total.status === 'False')) {
      out.push(`Held before the first total: members keep what they run until KEDA or kubectl scale sets one.${total?.message ? ` ${total.message}` : ''}`);
    }
    const conflict = cond(o, 'Conflict');
    if (conflict && conflict.status === 'True') out.push(`Conflict: ${conflict.message || conflict.reason}`);
    for (const type of ['Ready', 'Degraded']) {
      const c = cond(o, type);
      if (c && ((type === 'Ready' && c.status === 'False') || (type === 'Degraded' && c.status === 'True'))) out.push(`${type}: ${c.message || c.reason}`);
    }
    const rp = spec.rebalancingPolicy || {};
    out.push(spec.placement?.dynamicWeights ? 'Weights follow each member\'s live capacity for this workload.' : 'Replicas split by weight among the members in use.');
    if ((spec.memberClusters || []).some((m) => (m.tier || 0) > 0)) out.push('Tiers: tier 0 fills first, higher tiers take the spill-over; scale-in drains the highest tier first.');
    if (rp.avoidDisruption !== false) out.push('Rescaling distributes the change, so no member shrinks on scale-out nor grows on scale-in.');
    out.push(`An unreachable member keeps its share for ${rp.gracePeriod || '1m'} (grace period); at most ${rp.maxRebalancePercentage ?? 100}% of the total moves per step.`);
    return out;
  }
  function memberReasons(o, name, m, ms, weightSum) {
    const out = [], spec = o.spec || {};
    const desired = ms.desiredReplicas;
    if (ms.excluded) out.push(`excluded: ${ms.description || ms.state || 'no share'}`);
    else if (ms.state === 'Unreachable') {
      const grace = parseDuration(spec.rebalancingPolicy?.gracePeriod, 60e3);
      const left = Date.parse(ms.lastStatusChangeTime || '') + grace - now();
      out.push(Number.isFinite(left) && left > 0 ? `unreachable: keeps its share for ${span(left)} more (grace period), then it moves` : 'unreachable: grace period over, its share moves');
    } else if (!spec.placement?.dynamicWeights && weightSum > 0) out.push(`weight ${m.weight ?? 1} of ${weightSum}`);
    if ((m.tier || 0) > 0) out.push(`tier ${m.tier}: used once lower tiers are full`);
    if (m.maxReplicas !== undefined && desired !== undefined && desired >= m.maxReplicas) out.push(`capped at maxReplicas ${m.maxReplicas}`);
    if (m.minReplicas && desired !== undefined && desired <= m.minReplicas) out.push(`held at minReplicas ${m.minReplicas}`);
    if (['Conflict', 'Refused', 'WorkloadMissing', 'NotReported'].includes(ms.state) && ms.description) out.push(ms.description);
    if (desired !== undefined && ms.currentReplicas !== undefined && desired !== ms.currentReplicas && !ms.excluded) out.push(`scaling ${ms.currentReplicas} → ${desired}`);
    return out;
  }

  function dsjPage(main, r) {
    const body = h('div');
    main.append(h('h1', {}, 'DistributedScaledJob ', h('span', { class: 'key' }, r.key)), body);
    function update() {
      const o = S.dsj.get(r.key);
      if (!o) return missing(body, 'dsj', r.key);
      const st = o.status || {}, spec = o.spec || {};
      const statuses = st.memberClusterStatuses || {};
      const names = [...new Set([...(spec.memberClusters || []).map((m) => m.name), ...Object.keys(statuses)])].sort();
      const t = now();
      const taints = st.scheduling?.taints || [];
      const rows = names.map((n) => {
        const ms = statuses[n] || {};
        const live = taints.filter((x) => x.member === n).map((x) => ({ hard: x.hardUntil && Date.parse(x.hardUntil) > t, ...x }));
        return { attrs: { data: { member: n } }, cells: [n, h('span', { class: `state-${ms.state || 'Pending'}` }, text(ms.state)), String(ms.runningJobs ?? 0), String(ms.pendingJobs ?? 0), String(ms.stuckJobs ?? 0),
          taintCell(live, t), text(ms.description)] };
      });
      body.replaceChildren(
        h('div', { class: 'stats' },
          stat('Desired Jobs', st.desiredJobs ?? 0, 'desired'), stat('Running', st.runningJobs ?? 0, 'running'), stat('Pending', st.pendingJobs ?? 0, 'pending'),
          stat('Strategy', st.clusterStrategy || spec.clusterScheduling?.strategy || 'weightedRoundRobin', 'strategy'),
          o.paused ? stat('Paused', o.paused, 'paused') : null),
        h('h2', {}, 'Jobs per member'), table(['Member', 'State', 'Running', 'Pending', 'Stuck', 'Taint', 'Description'], rows, { id: 'jobs' }),
        h('h2', {}, 'Taints'), table(['Member', 'Class', 'Soft until', 'Hard until'], taints.map((x) => [x.member, text(x.class),
          x.softUntil ? until(Date.parse(x.softUntil) - t) : '—', x.hardUntil ? until(Date.parse(x.hardUntil) - t) : '—']), { id: 'taints' }),
        h('h2', {}, 'Running Jobs over time'), chart(r.key, 'jobs', names),
        h('h2', {}, 'Triggers'), table(['Trigger', 'State', 'Info', 'Since'], (st.triggerMetricsStatus || []).map((x) => [x.name, x.state, text(x.info), ago(x.lastChangeTime)])),
        h('h2', {}, 'Conditions'), conditions(o),
        h('h2', {}, 'Events'), timeline(`dsj/${r.key}`),
      );
    }
    return { update };
  }
  function taintCell(records, t) {
    const live = records.map((x) => {
      const hard = x.hardUntil ? Date.parse(x.hardUntil) - t : -1, soft = x.softUntil ? Date.parse(x.softUntil) - t : -1;
      return hard > 0 ? `hard, ${span(hard)} left` : soft > 0 ? `soft, ${span(soft)} left` : null;
    }).filter(Boolean);
    return live.length ? h('span', { class: 'warn' }, live.join('; ')) : '—';
  }

  // ---- the split chart: total (black), per member desired (solid) and current (dashed) ----
  function chart(key, unit, names) {
    const W = 900, H = 220, L = 40, R = 10, T = 10, B = 24;
    const samples = S.history.get(key) || [];
    const t1 = now();
    const t0 = Math.min(samples.length ? samples[0].t : t1, t1 - 60e3);
    const x = (t) => L + ((t - t0) / (t1 - t0 || 1)) * (W - L - R);
    let max = 1;
    for (const smp of samples) {
      max = Math.max(max, smp.total || 0);
      for (const v of Object.values(smp.members)) max = Math.max(max, v[0], v[1]);
    }
    max = Math.ceil(max * 1.1);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    const step = (pick) => {
      let d = '', last = null;
      for (const smp of samples) {
        const v = pick(smp);
        if (v === null || v === undefined) { last = null; continue; }
        d += last === null ? `M${x(smp.t).toFixed(1)},${y(v).toFixed(1)}` : `H${x(smp.t).toFixed(1)}V${y(v).toFixed(1)}`;
        last = v;
      }
      return last === null ? d : `${d}H${x(t1).toFixed(1)}`;
    };
    const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, class: 'chart', role: 'img', 'aria-label': `${unit} over time` });
    for (const v of [0, Math.round(max / 2), max]) {
      svg.append(s('line', { x1: L, x2: W - R, y1: y(v), y2: y(v), class: 'grid' }), s('text', { x: L - 6, y: y(v) + 4, 'text-anchor': 'end', class: 'axis' }, String(v)));
    }
    svg.append(s('text', { x: L, y: H - 6, class: 'axis' }, `${span(t1 - t0)} ago`), s('text', { x: W - R, y: H - 6, 'text-anchor': 'end', class: 'axis' }, 'now'));
    const legend = h('div', { class: 'legend' });
    if (samples.some((smp) => smp.total !== null && smp.total !== undefined)) {
      svg.append(s('path', { d: step((smp) => smp.total), class: 'total' }));
      legend.append(h('span', { class: 'swatch total' }), unit === 'jobs' ? 'desired Jobs ' : 'total ');
    }
    names.forEach((n, i) => {
      const color = COLORS[i % COLORS.length];
      svg.append(s('path', { d: step((smp) => smp.members[n]?.[0]), stroke: color, class: 'series', 'data-member': n }));
      if (unit === 'replicas') svg.append(s('path', { d: step((smp) => smp.members[n]?.[1]), stroke: color, class: 'series current' }));
      legend.append(h('span', { class: 'swatch', style: { background: color } }), `${n} `);
    });
    if (unit === 'replicas') legend.append(h('span', { class: 'muted' }, '(solid: desired, dashed: current)'));
    if (!samples.length) legend.append(h('span', { class: 'muted' }, ' no samples yet: the chart starts when the dashboard does'));
    return h('div', { class: 'chart-box', id: 'chart' }, svg, legend);
  }

  const PAGES = { fleet: fleetPage, workloads: workloadsPage, dso: dsoPage, dsj: dsjPage };

  window.addEventListener('hashchange', schedule);
  // Ages, countdowns and the chart's right edge move with the clock.
  setInterval(schedule, 1000);
  connect();
  schedule();
})();
