import assert from 'node:assert/strict';
import { newest, bump, allowed, majorOf } from '../src/versions';

describe('versions', () => {
  it('finds the newest', () => assert.equal(newest(['1.2.0', '1.10.0', '1.9.9']), '1.10.0'));
  it('ignores invalid versions', () => assert.equal(newest(['x', '0.1.0']), '0.1.0'));
  it('has no newest of nothing', () => assert.equal(newest([]), null));
  it('bumps a patch', () => assert.equal(bump('1.2.3'), '1.2.4'));
  it('bumps a minor', () => assert.equal(bump('1.2.3', 'minor'), '1.3.0'));
  it('refuses to bump garbage', () => assert.throws(() => bump('nope'), /cannot bump/));
  it('checks ranges', () => assert.equal(allowed('1.4.0', '^1.2.0'), true));
  it('keeps prereleases out of ranges', () => assert.equal(allowed('2.0.0-rc.1', '>=1.0.0'), false));
  it('reads a loose major', () => assert.equal(majorOf('v18.19'), 18));
});
