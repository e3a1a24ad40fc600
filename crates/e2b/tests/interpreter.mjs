// E2B's published JavaScript code interpreter SDK (`@e2b/code-interpreter` from npm),
// unchanged, against a forkbox daemon: run by crates/cli/tests/e2b.rs from a directory whose
// node_modules holds it, with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set.
import { Sandbox } from '@e2b/code-interpreter'
import assert from 'node:assert/strict'

const ok = (step, since) => console.log(`ok: ${step} (${((Date.now() - since) / 1000).toFixed(1)} s)`)
let t = Date.now()
const sbx = await Sandbox.create({ timeoutMs: 600_000 })
ok(`Sandbox.create ${sbx.sandboxId} (code-interpreter-v1)`, t)
try {
  t = Date.now()
  const seen = []
  let ex = await sbx.runCode('x = 20\nprint("hello")', { onStdout: (m) => seen.push(m.line) })
  assert.equal(ex.error, undefined)
  assert.deepEqual(ex.logs.stdout, ['hello\n'])
  assert.deepEqual(seen, ['hello\n'])
  ex = await sbx.runCode('x + 22')
  assert.equal(ex.text, '42')
  ok('state kept across cells, stdout streamed, a value as text', t)

  t = Date.now()
  ex = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()')
  assert.equal(ex.results.filter((r) => r.png).length, 1)
  ex = await sbx.runCode('raise KeyError("k")')
  assert.equal(ex.error.name, 'KeyError')
  ok('a plot as PNG, an error by name', t)

  t = Date.now()
  const ctx = await sbx.createCodeContext({ cwd: '/tmp' })
  ex = await sbx.runCode('import os; os.getcwd()', { context: ctx })
  assert.equal(ex.text, "/tmp")
  assert.ok((await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  await sbx.restartCodeContext(ctx)
  await sbx.removeCodeContext(ctx)
  assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  ex = await sbx.runCode('echo from bash', { language: 'bash' })
  assert.deepEqual(ex.logs.stdout, ['from bash\n'])
  ok('contexts created, listed, restarted, removed; a bash cell', t)
} finally {
  await sbx.kill()
}
console.log('js code interpreter passed')
