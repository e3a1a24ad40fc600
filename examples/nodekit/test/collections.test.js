import assert from 'node:assert/strict';
import { byKey, batches, distinct, ranked } from '../src/collections';

const people = [
  { name: 'ada', team: 'core', score: 9 },
  { name: 'bob', team: 'web', score: 4 },
  { name: 'cy', team: 'core', score: 7 },
];

describe('collections', () => {
  it('groups by a key', () => assert.deepEqual(Object.keys(byKey(people, 'team')), ['core', 'web']));
  it('groups every item', () => assert.equal(byKey(people, 'team').core.length, 2));
  it('batches evenly', () => assert.deepEqual(batches([1, 2, 3, 4], 2), [[1, 2], [3, 4]]));
  it('batches a remainder', () => assert.deepEqual(batches([1, 2, 3], 2), [[1, 2], [3]]));
  it('batches nothing', () => assert.deepEqual(batches([], 3), []));
  it('keeps distinct items', () => assert.equal(distinct(people, 'team').length, 2));
  it('ranks by a key', () => assert.deepEqual(ranked(people, 'score').map((p) => p.name), ['ada', 'cy', 'bob']));
  it('ranks an empty list', () => assert.deepEqual(ranked([], 'score'), []));
});
