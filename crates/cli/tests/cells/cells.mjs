// forkbox's own TypeScript SDK running code cells (`sandbox.runCode`) against a daemon: run by
// crates/cli/tests/e2b.rs with FORKBOX_API, FORKBOX_TOKEN and FORKBOX_TS_SDK (the SDK's
// built entry point) set. Every step prints `ok: STEP`; the first failure throws.

import assert from "node:assert/strict";

const { Runtime, BadRequestError } = await import(process.env.FORKBOX_TS_SDK);

const rt = new Runtime();
const sbx = await rt.sandboxes.create({ image: "code-interpreter", ttlSeconds: 900 });
try {
  const seen = [];
  let ex = await sbx.runCode("x = 20\nprint('hi', flush=True)\nx + 1", { onStdout: (t) => seen.push(t) });
  assert.equal(ex.error, undefined);
  assert.deepEqual([ex.text, ex.stdout, seen], ["21", ["hi\n"], ["hi\n"]]);
  assert.equal((await sbx.runCode("x * 2")).text, "40");
  console.log("ok: the first cell (the server started), state kept, stdout as it comes");

  ex = await sbx.runCode("import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()");
  const pngs = ex.results.filter((r) => r.png).map((r) => r.png);
  assert.equal(pngs.length, 1);
  assert.ok(pngs[0].length > 1000);
  ex = await sbx.runCode("1 / 0");
  assert.equal(ex.error?.name, "ZeroDivisionError");
  ex = await sbx.runCode("import time\ntime.sleep(30)", { timeoutSeconds: 2 });
  assert.equal(ex.error?.name, "TimeoutError");
  console.log("ok: a plot as PNG, an exception, a timeout");

  const ctx = await sbx.createCodeContext({ language: "javascript", cwd: "/tmp" });
  assert.equal((await sbx.runCode("let a = 'é'.repeat(3); a", { context: ctx })).text, "ééé");
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  await sbx.restartCodeContext(ctx);
  assert.equal((await sbx.runCode("typeof a", { context: ctx })).text, "undefined");
  await sbx.removeCodeContext(ctx);
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id));
  ex = await sbx.runCode("echo $((6 * 7))", { language: "bash" });
  assert.deepEqual(ex.stdout, ["42\n"]);
  await assert.rejects(sbx.runCode("1", { language: "ruby" }), (e) => e instanceof BadRequestError);
  console.log("ok: contexts, a bash cell, a language refused");

  const [copy] = await sbx.fork({ count: 1 });
  try {
    await copy.runCode("x = x + 1");
    assert.deepEqual([(await copy.runCode("x")).text, (await sbx.runCode("x")).text], ["21", "20"]);
  } finally {
    await copy.stop();
  }
  console.log("ok: a fork between cells");
} finally {
  await sbx.stop();
  rt.close();
}
console.log("forkbox typescript cells passed");
