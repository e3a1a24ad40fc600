import assert from 'node:assert/strict';
import { isoDay, addDays, weekday, ago, daysBetween } from '../src/dates';

describe('dates', () => {
  it('formats a day', () => assert.equal(isoDay('2024-02-29T23:30:00Z'), '2024-02-29'));
  it('adds days over a month end', () => assert.equal(addDays('2024-01-30', 3), '2024-02-02'));
  it('adds days over a leap day', () => assert.equal(addDays('2024-02-28', 1), '2024-02-29'));
  it('subtracts days', () => assert.equal(addDays('2024-03-01', -1), '2024-02-29'));
  it('names a weekday', () => assert.equal(weekday('2024-12-25'), 'Wednesday'));
  it('says how long ago', () => assert.equal(ago('2024-01-01', '2024-01-04'), '3 days ago'));
  it('says hours ago', () => assert.equal(ago('2024-01-01T00:00:00Z', '2024-01-01T05:00:00Z'), '5 hours ago'));
  it('counts days between', () => assert.equal(daysBetween('2024-01-01', '2024-12-31'), 365));
});
