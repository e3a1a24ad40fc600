import assert from 'node:assert/strict';
import { loadConfig } from '../src/config';

describe('config', () => {
  it('has defaults', () => assert.equal(loadConfig().retries, 3));
  it('takes overrides', () => assert.equal(loadConfig({ timeoutMs: 10 }).timeoutMs, 10));
  it('keeps the other defaults', () => assert.equal(loadConfig({ retries: 1 }).name, 'nodekit'));
  it('refuses bad retries', () => assert.throws(() => loadConfig({ retries: -1 }), /whole number/));
});
