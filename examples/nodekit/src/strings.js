// String helpers.

export function slugify(text) {
  return String(text)
    .normalize('NFKD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '-')
    .replace(/^-+|-+$/g, '');
}

export function titleCase(text) {
  return String(text)
    .split(/\s+/)
    .filter(Boolean)
    .map((w) => w[0].toUpperCase() + w.slice(1).toLowerCase())
    .join(' ');
}

export function truncate(text, max, ellipsis = '…') {
  const s = String(text);
  if (s.length <= max) return s;
  return s.slice(0, Math.max(0, max - ellipsis.length)) + ellipsis;
}

export function padTable(rows) {
  const widths = [];
  for (const row of rows) {
    row.forEach((cell, i) => {
      widths[i] = Math.max(widths[i] || 0, String(cell).length);
    });
  }
  return rows.map((row) => row.map((c, i) => String(c).padEnd(widths[i])).join('  ').trimEnd());
}

export function countWords(text) {
  return String(text).split(/\s+/).filter(Boolean).length;
}
