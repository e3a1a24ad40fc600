// forkbox console. Draws the daemon's state from the JSON the page carries, then keeps it live
// from the daemon's event stream (/ui/events). Every action is a call of the API under /ui/api/
// with the session's CSRF token. Data is only ever put into the page as text, never as markup.
'use strict';

const CSRF = document.querySelector('meta[name="forkbox-csrf"]').content;
const first = JSON.parse(document.getElementById('initial').textContent);
let S = first.state;
let U = first.usage || { now_unix: Date.now() / 1000, usage: {} };
let SERIES = first.series || [];
let selected = null;
let filterText = '';
let page = null;

function h(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    e.append(kid instanceof Node ? kid : String(kid));
  }
  return e;
}

function swap(id, node) {
  const old = document.getElementById(id);
  if (old) { node.id = id; old.replaceWith(node); }
}

function mib(n) { return n >= 1024 ? (n / 1024).toFixed(1) + ' GiB' : Math.round(n) + ' MiB'; }
function bytes(n) { return n == null ? '–' : mib(n / 1048576); }
function ago(secs) {
  secs = Math.max(0, Math.round(secs));
  if (secs < 60) return secs + ' s';
  if (secs < 3600) return Math.floor(secs / 60) + ' min';
  if (secs < 86400) return (secs / 3600).toFixed(1) + ' h';
  return (secs / 86400).toFixed(1) + ' d';
}
function now() { return U.now_unix || Date.now() / 1000; }

async function api(method, path, body) {
  const r = await fetch('/ui/api' + path, {
    method,
    headers: { 'content-type': 'application/json', 'x-forkbox-csrf': CSRF },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: 'same-origin',
  });
  const text = await r.text();
  let v = null;
  try { v = text ? JSON.parse(text) : null; } catch (_) { v = text; }
  if (!r.ok) throw new Error((v && v.error && v.error.message) || (v && v.message) || text || r.statusText);
  return v;
}

// ---- sandboxes -----------------------------------------------------------------------------

function matches(sb) {
  const f = filterText.trim();
  if (!f) return true;
  const eq = f.indexOf('=');
  if (eq > 0) {
    const k = f.slice(0, eq).trim(), v = f.slice(eq + 1).trim();
    return sb.labels && sb.labels[k] === v;
  }
  const hay = [sb.id, sb.image, sb.state, sb.node || '', ...Object.entries(sb.labels || {}).map(([k, v]) => k + '=' + v)].join(' ');
  return hay.toLowerCase().includes(f.toLowerCase());
}

function network(sb) {
  const n = sb.network || {};
  if (n.internet) return 'internet';
  if (n.allow && n.allow.length) return n.allow.join(', ');
  return 'none';
}

function cell(label, ...kids) { return h('td', { 'data-label': label }, ...kids); }

function usageOf(id) { return (U.usage || {})[id]; }

function row(sb) {
  const u = usageOf(sb.id);
  const ttl = sb.expires_unix ? ago(sb.expires_unix - now()) + (sb.ttl_action === 'hibernate' ? ' → sleep' : '') : '–';
  const open = () => select(sb.id);
  return h('tr', {
    'data-id': sb.id, tabindex: 0, 'aria-selected': String(selected === sb.id),
    onclick: open, onkeydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); open(); } },
  },
    cell('ID', h('span', { class: 'mono' }, sb.id)),
    cell('State', h('span', { class: 'state-' + sb.state }, sb.state)),
    cell('Image', sb.image),
    cell('Labels', Object.entries(sb.labels || {}).map(([k, v]) => h('span', { class: 'tag' }, k + '=' + v))),
    cell('Age', ago(now() - sb.created_unix)),
    cell('TTL left', ttl),
    cell('CPU', h('span', { class: 'cpu' }, u ? u.cpu_percent.toFixed(0) + ' %' : '–')),
    cell('Memory', h('span', { class: 'mem' }, u ? mib(u.rss_mib) : '–'), h('span', { class: 'muted' }, ' of ' + mib(sb.memory_mib))),
    cell('Network', network(sb)),
    cell('Node', sb.node || 'this host'),
  );
}

function drawRows() {
  const list = S.sandboxes.filter(matches);
  const body = h('tbody', {}, list.map(row));
  if (!list.length) body.append(h('tr', {}, h('td', { colspan: 10, class: 'muted' }, S.sandboxes.length ? 'No sandbox matches.' : 'No sandboxes yet: `forkbox sandbox create` makes one.')));
  swap('rows', body);
  const count = document.getElementById('count');
  if (count) count.textContent = '(' + list.length + (list.length === S.sandboxes.length ? '' : ' of ' + S.sandboxes.length) + ')';
  drawPanelHead();
}

function sandboxesPage() {
  const filter = h('input', {
    id: 'filter', type: 'search', placeholder: 'label=value, or any text', 'aria-label': 'Filter sandboxes', value: filterText,
    oninput: (e) => { filterText = e.target.value; drawRows(); },
  });
  const heads = ['ID', 'State', 'Image', 'Labels', 'Age', 'TTL left', 'CPU', 'Memory', 'Network', 'Node'];
  return [
    h('h1', {}, 'Sandboxes ', h('span', { id: 'count', class: 'muted' })),
    h('div', { class: 'bar' }, filter),
    h('table', { id: 'sandboxes' }, h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col' }, t)))), h('tbody', { id: 'rows' })),
    h('section', { id: 'panel', class: 'panel', hidden: true, 'aria-live': 'polite' }),
  ];
}

function select(id) {
  selected = id;
  drawPanel();
  drawRows();
}

function say(text, bad) {
  const m = document.getElementById('message');
  if (m) { m.textContent = text; m.className = bad ? 'error' : 'muted'; }
}

async function act(what, fn) {
  say(what + '…');
  try { say(await fn()); } catch (e) { say(what + ' failed: ' + e.message, true); }
}

function drawPanelHead() {
  const head = document.getElementById('panel-head');
  if (!head || !selected) return;
  const sb = S.sandboxes.find((s) => s.id === selected);
  head.textContent = sb ? selected + ' · ' + sb.state + ' · ' + sb.image : selected + ' · gone';
  const sleeping = sb && (sb.state === 'hibernated' || sb.state === 'sleeping');
  const hib = document.getElementById('hibernate');
  if (hib) hib.textContent = sleeping ? 'Resume' : 'Hibernate';
}

async function exec(id, command, out) {
  out.textContent = '';
  const dec = new TextDecoder();
  const bin = (b64) => Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const r = await fetch('/ui/api/v1/sandboxes/' + encodeURIComponent(id) + '/exec?stream=true', {
    method: 'POST', credentials: 'same-origin',
    headers: { 'content-type': 'application/json', 'x-forkbox-csrf': CSRF },
    body: JSON.stringify({ shell: command }),
  });
  if (!r.ok) {
    let msg = await r.text();
    try { msg = JSON.parse(msg).error.message; } catch (_) { /* as sent */ }
    throw new Error(msg);
  }
  const reader = r.body.getReader();
  let rest = '';
  let result = 'ended';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    rest += dec.decode(value, { stream: true });
    let nl;
    while ((nl = rest.indexOf('\n')) >= 0) {
      const line = rest.slice(0, nl);
      rest = rest.slice(nl + 1);
      if (!line.trim()) continue;
      const ev = JSON.parse(line);
      if (ev.type === 'stdout' || ev.type === 'stderr') out.append(dec.decode(bin(ev.data_b64)));
      else if (ev.type === 'exit') result = 'exit ' + ev.exit_code + (ev.timed_out ? ' (timed out)' : '') + ' in ' + ev.duration_ms + ' ms';
      else if (ev.type === 'error') result = 'error: ' + ev.message;
      out.scrollTop = out.scrollHeight;
    }
  }
  return result;
}

function drawPanel() {
  const panel = document.getElementById('panel');
  if (!panel) return;
  if (!selected) { panel.hidden = true; return; }
  const id = selected;
  const path = '/v1/sandboxes/' + encodeURIComponent(id);
  const out = h('pre', { class: 'output', id: 'output', 'aria-label': 'Command output' });
  const cmd = h('input', { name: 'command', id: 'command', placeholder: 'a shell command, e.g. python3 -V', 'aria-label': 'Command', autocomplete: 'off' });
  const count = h('input', { id: 'fork-count', type: 'number', min: 1, max: 20, value: 3, 'aria-label': 'Copies' });
  const fresh = h('section', { id: 'panel', class: 'panel', 'aria-live': 'polite' },
    h('h2', { id: 'panel-head' }, id),
    h('form', {
      class: 'exec',
      onsubmit: (e) => { e.preventDefault(); const c = cmd.value; if (c.trim()) act('Running', () => exec(id, c, out)); },
    }, cmd, h('button', { type: 'submit' }, 'Run')),
    out,
    h('div', { class: 'actions' },
      h('button', { type: 'button', onclick: () => act('Saving a snapshot', async () => 'snapshot ' + (await api('POST', path + '/snapshot', {})).name) }, 'Snapshot'),
      h('span', {}, h('button', {
        type: 'button', id: 'fork',
        onclick: () => act('Forking', async () => {
          const r = await api('POST', path + '/fork', { count: Number(count.value) || 1 });
          return r.sandboxes.length + ' copies of ' + r.snapshot + ' in ' + r.duration_ms + ' ms' + (r.failed.length ? '; failed: ' + r.failed.join('; ') : '');
        }),
      }, 'Fork ×'), ' ', count),
      h('button', {
        type: 'button', id: 'hibernate',
        onclick: () => {
          const sb = S.sandboxes.find((s) => s.id === id);
          const wake = sb && (sb.state === 'hibernated' || sb.state === 'sleeping');
          act(wake ? 'Resuming' : 'Hibernating', async () => (await api('POST', path + (wake ? '/resume' : '/hibernate'))).state);
        },
      }, 'Hibernate'),
      h('button', {
        type: 'button', class: 'danger', id: 'delete',
        onclick: () => { if (confirm('Delete ' + id + '? Its memory and disk are gone for good.')) act('Deleting', async () => { await api('DELETE', path); return 'deleted ' + id; }); },
      }, 'Delete'),
      h('button', { type: 'button', onclick: () => { selected = null; drawPanel(); drawRows(); } }, 'Close'),
    ),
    h('p', { id: 'message', class: 'muted', role: 'status' }),
    h('p', { class: 'hint' }, 'A terminal: ', h('code', {}, 'forkbox sandbox exec -it ' + id + ' -- bash'), ' (the console has no terminal in the browser).'),
  );
  panel.replaceWith(fresh);
  drawPanelHead();
}

// ---- fork tree -----------------------------------------------------------------------------

function treePage() {
  const nodes = new Map();
  const node = (key, kind, label, detail) => {
    if (!nodes.has(key)) nodes.set(key, { key, kind, label, detail: detail || [], parent: null, kids: [] });
    return nodes.get(key);
  };
  const templateKey = (origin) => 't:' + origin.replace(/^template:/, '');
  for (const s of S.snapshots) {
    node('s:' + s.name, s.kind === 'template' ? 'template' : 'snapshot', s.name, [
      'memory ' + bytes(s.memory_bytes), 'holds alone ' + bytes(s.held_alone_bytes), s.image,
      s.node ? 'on ' + s.node : null,
    ].filter(Boolean));
  }
  for (const sb of S.sandboxes) {
    const u = usageOf(sb.id);
    node('b:' + sb.id, 'sandbox', sb.id, [sb.state, sb.image, u ? 'RSS ' + mib(u.rss_mib) : null].filter(Boolean));
  }
  const link = (child, parentKey, kind, label) => {
    if (!parentKey || child.parent) return;
    const p = nodes.get(parentKey) || node(parentKey, kind, label);
    if (p === child) return;
    child.parent = p;
    p.kids.push(child);
  };
  for (const sb of S.sandboxes) {
    const o = sb.origin || '';
    const me = nodes.get('b:' + sb.id);
    if (o.startsWith('snapshot:')) link(me, 's:' + o.slice(9), 'snapshot', o.slice(9));
    else if (o.startsWith('template:')) link(me, templateKey(o), 'template', o.slice(9));
  }
  for (const s of S.snapshots) {
    const me = nodes.get('s:' + s.name);
    if (s.from_sandbox && nodes.has('b:' + s.from_sandbox)) link(me, 'b:' + s.from_sandbox);
    else if (s.parent) {
      const p = s.parent;
      if (nodes.has('s:' + p)) link(me, 's:' + p);
      else link(me, templateKey(p), 'template', p.replace(/^template:/, ''));
    }
  }
  const draw = (n) => h('li', { 'data-key': n.key },
    h('span', { class: 'node' }, h('span', { class: 'kind' }, n.kind), h('span', { class: 'mono' }, n.label), n.detail.map((d) => h('span', { class: 'muted' }, d))),
    n.kids.length ? h('ul', {}, n.kids.map(draw)) : null);
  const roots = [...nodes.values()].filter((n) => !n.parent);
  return [
    h('h1', {}, 'Fork tree'),
    h('p', { class: 'hint' }, 'Templates and snapshots, the sandboxes restored from each, and the snapshots saved from those. "Holds alone" is what deleting a snapshot frees.'),
    roots.length ? h('ul', { class: 'tree', id: 'tree' }, roots.map(draw)) : h('p', { class: 'muted', id: 'tree' }, 'Nothing yet.'),
  ];
}

// ---- images, migrations, host ----------------------------------------------------------------

function imagesPage() {
  const heads = ['Image', 'Suite', 'Built on', 'Guest kernel', 'Content', 'Disk', 'Built'];
  return [
    h('h1', {}, 'Images ', h('span', { class: 'muted' }, '(' + S.images.length + ')')),
    h('table', { id: 'images' },
      h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, S.images.map((i) => h('tr', {},
        cell('Image', h('span', { class: 'mono' }, i.reference)),
        cell('Suite', i.suite),
        cell('Built on', i.pulled || i.base || 'Debian ' + i.suite),
        cell('Guest kernel', i.guest_kernel),
        cell('Content', mib(i.content_mib)),
        cell('Disk', mib(i.disk_mib)),
        cell('Built', ago(now() - i.created_unix) + ' ago'))))),
    h('p', { class: 'hint' }, 'Builds show their log where they are started (', h('code', {}, 'forkbox image build'), ').'),
  ];
}

function runCard(m) {
  const end = m.ended_unix || now();
  const verdict = (plan) => (m.verdicts || []).find((v) => v.plan === plan);
  const heads = ['Plan', 'Phase', 'Tests', 'In phase', 'Verdict', 'Why', 'Lost tests', 'Diff'];
  return h('section', { class: 'panel', 'data-run': m.id },
    h('h2', {}, m.code.split('/').pop() + ': ' + m.from + ' → ' + m.to + ' ',
      h('span', { class: 'state-' + ({ running: 'running', done: 'running', failed: 'failed', gone: 'lost' }[m.state] || '') + ' run-state' }, m.state),
      m.node ? h('span', { class: 'muted run-node' }, ' on ' + m.node) : null),
    h('p', { class: 'muted' }, m.id + ' · ' + m.code + ' · started ' + ago(now() - m.started_unix) + ' ago · ' + ago(end - m.started_unix) + (m.ended_unix ? ' in all' : ' so far') +
      (m.baseline ? ' · baseline: ' + m.baseline[0] + ' of ' + m.baseline[1] + ' pass on ' + m.from : '')),
    m.error ? h('p', { class: 'error' }, m.error) : null,
    m.state === 'done' ? h('p', { class: 'winner' }, m.winner ? 'Winner: ' + m.winner : 'No plan was accepted.') : null,
    h('table', {},
      h('thead', {}, h('tr', {}, heads.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, m.progress.filter((p) => m.plans.includes(p.plan)).map((p) => {
        const v = verdict(p.plan);
        return h('tr', { 'data-plan': p.plan },
          cell('Plan', h('span', { class: 'mono' }, p.plan)),
          cell('Phase', p.phase),
          cell('Tests', String(p.tests)),
          cell('In phase', m.ended_unix ? '–' : ago(now() - p.since_unix)),
          cell('Verdict', v ? h('span', { class: v.accepted ? 'state-running verdict' : 'state-failed verdict' }, v.accepted ? 'accepted' : 'rejected') : '–'),
          cell('Why', v ? v.reason : ''),
          cell('Lost tests', v && v.lost.length ? h('span', { class: 'mono' }, v.lost.join(', ')) : '–'),
          cell('Diff', v ? h('span', { class: 'mono', title: v.diff_stat }, v.diff_lines + ' lines') : '–'));
      }))),
    (() => {
      // The run's own steps (the baseline runs, preparing the new image) beside the plans.
      const steps = m.progress.filter((p) => !m.plans.includes(p.plan));
      return steps.length ? h('p', { class: 'muted steps' }, steps.map((p) => p.plan + ': ' + p.phase + (p.tests ? ' (' + p.tests + ' tests)' : '')).join(' · ')) : null;
    })(),
    m.notes.length ? h('p', { class: 'muted' }, 'Last step: ' + m.notes[m.notes.length - 1]) : null,
    // A run's report is read from its own node's disk: linked on that node's console.
    m.has_report && (!m.node || m.node === (S.info && S.info.node)) ? h('p', {}, h('a', { href: '/ui/migrations/' + encodeURIComponent(m.id) + '/report', target: '_blank', rel: 'noopener' }, 'report.html'),
      h('span', { class: 'muted' }, ' (plans, verdicts, lost tests and each plan\'s diff)' + (m.out_dir ? '; also in ' + m.out_dir : ''))) : null);
}

function migrationsPage() {
  const runs = S.migrations || [];
  return [
    h('h1', {}, 'Migrations ', h('span', { class: 'muted' }, '(' + runs.length + ')')),
    runs.length ? runs.map(runCard) : h('p', { class: 'muted' }, 'No run yet. A ', h('code', {}, 'forkbox migrate'), ' started while this daemon runs shows here live, and stays after it ends.'),
  ];
}

function spark(points, key, label, fmt) {
  const c = h('canvas', { width: 300, height: 60, role: 'img', 'aria-label': label + ' over the last hour' });
  const vals = points.map((p) => p[key]);
  const last = vals.length ? fmt(vals[vals.length - 1]) : '–';
  requestAnimationFrame(() => {
    const ctx = c.getContext('2d');
    if (!ctx || vals.length < 2) return;
    const max = Math.max(...vals, 1e-9), min = Math.min(...vals, 0);
    ctx.strokeStyle = getComputedStyle(document.documentElement).getPropertyValue('--accent') || '#1f5fbf';
    ctx.lineWidth = 2;
    ctx.beginPath();
    vals.forEach((v, i) => {
      const x = (i / (vals.length - 1)) * (c.width - 4) + 2;
      const y = c.height - 4 - ((v - min) / (max - min || 1)) * (c.height - 8);
      if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    });
    ctx.stroke();
  });
  return h('div', { class: 'card' }, h('div', { class: 'muted' }, label), h('div', { class: 'figure' }, last), c);
}

function hostPage() {
  const i = S.info || {};
  const a = i.accel || null;
  const pool = i.pool || { slots: [] };
  const latest = SERIES[SERIES.length - 1] || {};
  return [
    h('h1', {}, 'Host'),
    h('div', { class: 'cards' },
      h('div', { class: 'card', id: 'accel' }, h('div', { class: 'muted' }, 'Accelerator'),
        h('div', { class: 'figure' }, a ? (a.accel === 'kvm' ? 'KVM (hardware)' : 'TCG (software emulation)') : 'not set up'),
        a ? h('div', { class: 'muted' }, a.reason) : null),
      h('div', { class: 'card' }, h('div', { class: 'muted' }, 'Warm pool'),
        h('div', { class: 'figure' }, pool.slots.reduce((n, s) => n + s.ready, 0) + ' ready'),
        h('div', { class: 'muted' }, 'size ' + pool.size + ', up to ' + pool.max + ' after bursts; ' + mib(pool.memory_mib || 0) + ' of ' + mib(pool.memory_cap_mib || 0))),
      h('div', { class: 'card' }, h('div', { class: 'muted' }, 'Disk free (home)'),
        h('div', { class: 'figure' }, latest.disk_free_gib != null ? latest.disk_free_gib.toFixed(1) + ' GiB' : '–'),
        h('div', { class: 'muted' }, i.home || '')),
      h('div', { class: 'card' }, h('dl', {},
        h('dt', {}, 'forkbox'), h('dd', {}, i.version || ''),
        h('dt', {}, 'Sandboxes'), h('dd', {}, String(S.sandboxes.length)),
        h('dt', {}, 'Snapshots'), h('dd', {}, String(S.snapshots.length)),
        h('dt', {}, 'Guest kernels'), h('dd', {}, (i.kernels || []).join(', '))))),
    h('h2', {}, 'The last hour'),
    SERIES.length < 2 ? h('p', { class: 'muted' }, 'A point every 30 s since the daemon started; the plots fill in as it runs.') : null,
    h('div', { class: 'cards' },
      spark(SERIES, 'sandboxes', 'Sandboxes', (v) => String(v)),
      spark(SERIES, 'cpu_percent', 'CPU of all VMs', (v) => v.toFixed(0) + ' %'),
      spark(SERIES, 'rss_mib', 'Memory of all VMs', mib),
      spark(SERIES, 'disk_free_gib', 'Disk free', (v) => v.toFixed(1) + ' GiB'),
      spark(SERIES, 'pool_ready', 'Pool ready', (v) => String(v))),
    h('p', { class: 'hint' }, 'Every figure of the daemon: ', h('code', {}, 'GET /metrics'), '.'),
  ];
}

// ---- pages and the live stream ------------------------------------------------------------

const PAGES = { sandboxes: sandboxesPage, tree: treePage, images: imagesPage, migrations: migrationsPage, host: hostPage };

function route() {
  const name = (location.hash.replace(/^#\//, '') || 'sandboxes').split('/')[0];
  return PAGES[name] ? name : 'sandboxes';
}

function draw(full) {
  const name = route();
  if (name === 'sandboxes' && page === name && !full) { drawRows(); return; }
  const main = document.getElementById('main');
  main.replaceChildren(...PAGES[name]().flat().filter(Boolean));
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.page === name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  document.title = 'forkbox · ' + document.querySelector('nav a[data-page="' + name + '"]').textContent;
  if (name === 'sandboxes') { drawRows(); if (selected) drawPanel(); }
  page = name;
}

function live() {
  const label = document.getElementById('live');
  const es = new EventSource('/ui/events');
  es.onopen = () => { label.textContent = 'live'; label.className = 'live on'; };
  es.onerror = () => { label.textContent = 'reconnecting…'; label.className = 'live off'; };
  es.addEventListener('state', (e) => {
    S = JSON.parse(e.data);
    if (selected && !S.sandboxes.some((s) => s.id === selected) && route() === 'sandboxes') drawPanelHead();
    draw(route() !== 'sandboxes');
  });
  es.addEventListener('usage', (e) => {
    U = JSON.parse(e.data);
    if (route() === 'sandboxes') drawRows();
  });
  es.addEventListener('series', (e) => {
    SERIES = JSON.parse(e.data);
    if (route() === 'host') draw(true);
  });
}

document.getElementById('logout').addEventListener('click', async () => {
  await fetch('/ui/logout', { method: 'POST', headers: { 'x-forkbox-csrf': CSRF }, credentials: 'same-origin' });
  location.href = '/ui/login';
});
window.addEventListener('hashchange', () => draw(true));
draw(true);
// When the first state is on the page (the console bench reads it).
performance.mark('forkbox-drawn');
live();
