// Collection helpers over lodash's per-method modules.
import groupBy from 'lodash/groupBy';
import chunk from 'lodash/chunk';
import uniqBy from 'lodash/uniqBy';
import sortBy from 'lodash/sortBy';

export function byKey(items, key) {
  return groupBy(items, key);
}

export function batches(items, size) {
  return chunk(items, size);
}

export function distinct(items, key) {
  return uniqBy(items, key);
}

export function ranked(items, key) {
  return sortBy(items, [key]).reverse();
}
