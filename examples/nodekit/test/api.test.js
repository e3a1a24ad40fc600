import assert from 'node:assert/strict';
import * as nodekit from '../src/index';
import { bundle } from '../scripts/build';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createRequire } from 'node:module';

describe('public API', () => {
  it('exports every helper', () => {
    for (const name of ['slugify', 'bump', 'isoDay', 'byKey', 'loadConfig']) {
      assert.equal(typeof nodekit[name], 'function', name);
    }
  });
  it('bundles into one CommonJS file with esbuild', () => {
    const out = join(mkdtempSync(join(tmpdir(), 'nodekit-')), 'nodekit.cjs');
    const result = bundle(out);
    assert.deepEqual(result.errors, []);
    const require = createRequire(import.meta.url);
    assert.equal(require(out).slugify('Bundled Too'), 'bundled-too');
    assert.ok(readFileSync(out, 'utf8').length > 1000);
  });
});
