// forkbox's test-runner hook, preloaded into every Node process of a test run (NODE_OPTIONS
// --require). In the process that is Jest's, Vitest's or Mocha's command line it asks the
// runner for a machine-readable report in $FORKBOX_REPORTS, alongside the output the runner
// prints for people (which it leaves as it is); in every other process it does nothing.
'use strict';
const fs = require('fs');
const path = require('path');

const dir = process.env.FORKBOX_REPORTS;
const main = process.argv[1];

// The package a script belongs to and the script's path inside it:
// /p/node_modules/@scope/name/bin/x.js -> ['@scope/name', 'bin/x.js', '/p/node_modules/@scope/name'].
function packageOf(file) {
  const at = file.lastIndexOf('/node_modules/');
  if (at < 0) return null;
  const parts = file.slice(at + '/node_modules/'.length).split('/');
  const n = parts[0].startsWith('@') ? 2 : 1;
  if (parts.length <= n) return null;
  const name = parts.slice(0, n).join('/');
  return [name, parts.slice(n).join('/'), file.slice(0, at + '/node_modules/'.length) + name];
}

function has(args, ...flags) {
  return args.some((a) => flags.some((f) => a === f || a.startsWith(f + '=')));
}

function report(kind) {
  return path.join(dir, `${kind}-${process.pid}.json`);
}

// Jest: its JSON report into a file (--json --outputFile); its people's report stays on
// standard error. A command line that already asks for --json prints it on standard output,
// where forkbox reads it.
function jest(args) {
  if (has(args, '--json', '--outputFile', '--watch', '--watchAll', '--listTests', '--showConfig')) return;
  process.argv.push('--json', `--outputFile=${report('jest')}`);
}

// Vitest: its JSON reporter into a file, beside the default reporter (or those the command
// line names).
function vitest(args) {
  if (args.some((a) => /^--reporter(=|$)/.test(a) && /json/.test(a))) return;
  if (args.some((a, i) => a === '--reporter' && /json/.test(args[i + 1] || ''))) return;
  if (has(args, '--outputFile', '--watch', '--ui')) return;
  if (!has(args, '--reporter')) process.argv.push('--reporter=default');
  process.argv.push('--reporter=json', `--outputFile.json=${report('vitest')}`);
}

// Mocha: its runner's events recorded as its JSON reporter records them, whatever reporter
// prints; written when the run ends.
function mocha(pkgDir) {
  let Mocha;
  try {
    Mocha = require(path.join(pkgDir, 'lib', 'mocha.js'));
  } catch (e) {
    return;
  }
  const run = Mocha.prototype.run;
  if (typeof run !== 'function' || run.forkbox) return;
  Mocha.prototype.run = function (...a) {
    const runner = run.apply(this, a);
    const seen = { passes: [], pending: [], failures: [] };
    const entry = (t) => ({
      title: t.title,
      fullTitle: typeof t.fullTitle === 'function' ? t.fullTitle() : t.title,
      file: t.file,
    });
    if (runner && typeof runner.on === 'function') {
      runner.on('pass', (t) => seen.passes.push(entry(t)));
      runner.on('pending', (t) => seen.pending.push(entry(t)));
      runner.on('fail', (t) => seen.failures.push(entry(t)));
      runner.once('end', () => {
        try {
          fs.writeFileSync(report('mocha'), JSON.stringify({ stats: {}, ...seen }));
        } catch (e) {
          process.stderr.write(`forkbox: cannot write Mocha's report: ${e.message}\n`);
        }
      });
    }
    return runner;
  };
  Mocha.prototype.run.forkbox = true;
}

if (dir && main) {
  let real = main;
  try {
    real = fs.realpathSync(main);
  } catch (e) {
    // a script that is not a file: not a runner's
  }
  const pkg = packageOf(real);
  const args = process.argv.slice(2);
  if (pkg) {
    const [name, script, pkgDir] = pkg;
    if ((name === 'jest' || name === 'jest-cli') && script === 'bin/jest.js') jest(args);
    else if (name === 'vitest' && script === 'vitest.mjs') vitest(args);
    else if (name === 'mocha' && /^(bin\/(mocha|_mocha)(\.js)?|lib\/cli\/cli\.js)$/.test(script)) mocha(pkgDir);
  }
}
