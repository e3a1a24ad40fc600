// A jscodeshift transform: gives every ES module specifier that names a file without its
// extension (`./strings`, `../src/index`, `dayjs/plugin/utc`, `lodash/groupBy`) the `.js` Node
// 20 requires. Node 18 guessed it under --experimental-specifier-resolution=node, a flag Node
// 19 removed. Bare package names (`semver`) and specifiers with an extension stay as they are.
// Run: npx jscodeshift --parser=babel -t add-js-extensions.cjs src test scripts
const path = require('node:path');

function needsExtension(spec) {
  if (typeof spec !== 'string' || spec.startsWith('node:')) return false;
  if (path.posix.extname(spec) !== '') return false;
  if (spec.startsWith('./') || spec.startsWith('../')) return true;
  // A deep import into a package (`pkg/sub` or `@scope/pkg/sub`).
  const parts = spec.split('/');
  return spec.startsWith('@') ? parts.length > 2 : parts.length > 1;
}

module.exports = function transform(file, api) {
  const j = api.jscodeshift;
  const root = j(file.source);
  let changed = false;
  const fix = (p) => {
    const source = p.node.source;
    if (source && needsExtension(source.value)) {
      source.value = `${source.value}.js`;
      changed = true;
    }
  };
  root.find(j.ImportDeclaration).forEach(fix);
  root.find(j.ExportNamedDeclaration).forEach(fix);
  root.find(j.ExportAllDeclaration).forEach(fix);
  return changed ? root.toSource({ quote: 'single' }) : null;
};
