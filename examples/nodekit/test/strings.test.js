import assert from 'node:assert/strict';
import { slugify, titleCase, truncate, padTable, countWords } from '../src/strings';

describe('strings', () => {
  it('slugifies plain words', () => assert.equal(slugify('Hello World'), 'hello-world'));
  it('slugifies accents away', () => assert.equal(slugify('Crème Brûlée'), 'creme-brulee'));
  it('slugifies punctuation runs', () => assert.equal(slugify('a -- b!!c'), 'a-b-c'));
  it('slugifies edges', () => assert.equal(slugify('  --x--  '), 'x'));
  it('title-cases words', () => assert.equal(titleCase('the quick BROWN fox'), 'The Quick Brown Fox'));
  it('title-cases extra spaces', () => assert.equal(titleCase('  a   b '), 'A B'));
  it('keeps short text', () => assert.equal(truncate('short', 10), 'short'));
  it('truncates long text', () => assert.equal(truncate('abcdefghij', 5), 'abcd…'));
  it('truncates with a given ellipsis', () => assert.equal(truncate('abcdefghij', 6, '...'), 'abc...'));
  it('pads a table', () => assert.deepEqual(padTable([['a', 'bb'], ['ccc', 'd']]), ['a    bb', 'ccc  d']));
  it('counts words', () => assert.equal(countWords(' one two  three '), 3));
  it('counts no words', () => assert.equal(countWords('   '), 0));
});
