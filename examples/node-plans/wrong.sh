#!/bin/sh
# A plausible port that is wrong: it drops the removed flag and gives relative imports their
# `.js` with a regular expression, but misses the deep imports into packages
# (dayjs/plugin/utc, lodash/groupBy), which Node 20 cannot resolve either. forkbox must
# reject it: the tests that load those modules no longer run.
set -eu
npm pkg set scripts.test=mocha
for f in src/*.js test/*.js scripts/*.js; do
  sed -i -E "s#(from '\.{1,2}/[^'.]+)'#\1.js'#" "$f"
done
