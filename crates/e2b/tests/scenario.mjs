// E2B's published JavaScript SDK (`e2b` from npm), unchanged, against a forkbox daemon.
//
// Run by crates/cli/tests/e2b.rs with E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set, from a
// directory whose node_modules holds the SDK. Every step prints `ok: STEP (S s)`; the first
// failure throws. Nothing here knows forkbox: it is what an agent written for E2B does.
import { Sandbox, CommandExitError, NotFoundError, AuthenticationError } from 'e2b'
import * as E2B from 'e2b'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'

const TEMPLATE = process.env.E2B_TEMPLATE || 'base'
const RUN = randomBytes(5).toString('hex')
const T0 = Date.now()
const ok = (step, since) => console.log(`ok: ${step} (${((Date.now() - since) / 1000).toFixed(1)} s)`)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

async function waitFor(pred, limitMs = 30000, everyMs = 300) {
  const end = Date.now() + limitMs
  while (Date.now() < end) {
    const v = await pred()
    if (v) return v
    await sleep(everyMs)
  }
  return pred()
}

let t = Date.now()
await assert.rejects(
  Sandbox.create(TEMPLATE, { apiKey: 'fbx_not_a_token_' + '0'.repeat(40) }),
  AuthenticationError,
)
ok('a wrong key is refused (AuthenticationError)', t)

t = Date.now()
const sbx = await Sandbox.create(TEMPLATE, {
  timeoutMs: 600_000,
  metadata: { suite: 'js', run: RUN },
  envs: { GREETING: 'hello from envs' },
})
ok(`create ${sbx.sandboxId} from ${TEMPLATE}`, t)

try {
  t = Date.now()
  const seen = []
  const r = await sbx.commands.run(
    'echo $GREETING; for i in 1 2 3; do echo line $i; sleep 0.2; done; echo oops >&2',
    { onStdout: (s) => seen.push([Date.now(), s]) },
  )
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello from envs\nline 1\nline 2\nline 3\n')
  assert.equal(r.stderr, 'oops\n')
  assert.ok(seen.length >= 3 && seen.at(-1)[0] - seen[0][0] > 300, `not streamed: ${JSON.stringify(seen)}`)
  ok('commands.run streams stdout as it comes, stderr apart, envs of the create', t)

  t = Date.now()
  await assert.rejects(sbx.commands.run('echo out; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
  assert.equal((await sbx.commands.run('whoami')).stdout.trim(), 'user')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout.trim(), 'root')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout.trim(), '/tmp')
  ok('exit codes (CommandExitError), users, cwd', t)

  t = Date.now()
  const bg = await sbx.commands.run('sleep 300', { background: true })
  assert.ok((await sbx.commands.list()).some((p) => p.pid === bg.pid))
  assert.equal(await sbx.commands.kill(bg.pid), true)
  await assert.rejects(bg.wait())
  assert.equal(await sbx.commands.kill(bg.pid), false)
  ok('background command listed and killed; a dead pid kills false', t)

  t = Date.now()
  const cat = await sbx.commands.run('cat; echo done', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'first\n')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'first\ndone\n')
  ok('stdin: sendStdin and closeStdin', t)

  t = Date.now()
  const ticks = await sbx.commands.run('for i in $(seq 1 20); do echo tick $i; sleep 0.2; done', { background: true })
  await ticks.disconnect()
  await sleep(1000)
  const again = await sbx.commands.connect(ticks.pid)
  assert.match((await again.wait()).stdout, /tick 20/)
  ok('a background command outlives its client and is reconnected by pid', t)

  t = Date.now()
  let text = ''
  let resized = false
  const pty = await sbx.pty.create({
    cols: 80,
    rows: 24,
    onData: async (d) => {
      text += new TextDecoder().decode(d)
      if (!resized && text.includes('pty-42')) {
        resized = true
        await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
        await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'))
      }
    },
  })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'))
  await pty.wait()
  assert.ok(text.includes('24 80') && text.includes('30 100'), text)
  ok('PTY: create, sendInput, resize, exit', t)

  t = Date.now()
  await sbx.files.write('/home/user/notes/a.txt', 'hello file')
  assert.equal(await sbx.files.read('/home/user/notes/a.txt'), 'hello file')
  const blob = new Uint8Array(1 << 20).map((_, i) => i % 251)
  await sbx.files.write('/tmp/blob.bin', blob.buffer)
  const back = await sbx.files.read('/tmp/blob.bin', { format: 'bytes' })
  assert.deepEqual(Buffer.from(back), Buffer.from(blob))
  const names = (await sbx.files.list('/home/user/notes')).map((e) => e.name)
  assert.deepEqual(names, ['a.txt'])
  assert.equal(await sbx.files.exists('/home/user/notes/a.txt'), true)
  assert.equal(await sbx.files.exists('/home/user/nope'), false)
  assert.equal(await sbx.files.makeDir('/home/user/d'), true)
  assert.equal(await sbx.files.makeDir('/home/user/d'), false)
  const moved = await sbx.files.rename('/home/user/notes/a.txt', '/home/user/d/b.txt')
  assert.equal(moved.path, '/home/user/d/b.txt')
  await sbx.files.remove('/home/user/d')
  await assert.rejects(sbx.files.read('/home/user/d/b.txt'), NotFoundError)
  ok('files: write/read text and 1 MiB of bytes, list, exists, makeDir, rename, remove, not found', t)

  t = Date.now()
  await sbx.files.makeDir('/home/user/w')
  const events = []
  const watch = await sbx.files.watchDir('/home/user/w', (e) => events.push(`${e.type} ${e.name}`))
  await sbx.files.write('/home/user/w/new.txt', '1')
  assert.ok(await waitFor(() => events.includes('create new.txt'), 20000), events.join(', '))
  await sbx.commands.run('rm /home/user/w/new.txt')
  assert.ok(await waitFor(() => events.includes('remove new.txt'), 20000), events.join(', '))
  await watch.stop()
  assert.ok(events.includes('create new.txt') && events.includes('remove new.txt'), events.join(', '))
  ok(`files.watchDir streams create and remove (${events.length} events)`, t)

  t = Date.now()
  await sbx.setTimeout(900_000)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.run, RUN)
  assert.equal(info.state, 'running')
  const m = await sbx.getMetrics()
  assert.ok(m.length && m.at(-1).memTotal > 0)
  const pager = Sandbox.list({ query: { metadata: { run: RUN } } })
  const listed = await pager.nextItems()
  assert.deepEqual(listed.map((s) => s.sandboxId), [sbx.sandboxId])
  ok('setTimeout, getInfo, getMetrics, Sandbox.list by metadata', t)

  if (E2B.Volume) {
    t = Date.now()
    const name = `vol-js-${RUN}`
    const vol = await E2B.Volume.create(name)
    try {
      assert.equal(vol.name, name)
      assert.ok((await E2B.Volume.list()).some((v) => v.name === name))
      const a = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, volumeMounts: { '/mnt/shared': vol } })
      try {
        await a.commands.run('echo from-js > /mnt/shared/note && sync')
        assert.deepEqual((await Sandbox.getInfo(a.sandboxId)).volumeMounts, [{ name, path: '/mnt/shared' }])
        await assert.rejects(
          Sandbox.create(TEMPLATE, { timeoutMs: 300_000, volumeMounts: { '/data': name } }),
          (e) => String(e).includes('in use') && String(e).includes(a.sandboxId),
        )
      } finally {
        await a.kill()
      }
      const b = await Sandbox.create(TEMPLATE, { timeoutMs: 300_000, volumeMounts: { '/data': name } })
      try {
        assert.equal(await b.files.read('/data/note'), 'from-js\n')
      } finally {
        await b.kill()
      }
    } finally {
      assert.equal(await E2B.Volume.destroy(vol.volumeId), true)
    }
    assert.equal(await E2B.Volume.destroy(vol.volumeId), false)
    ok('Volume.create, volumeMounts: written by one sandbox, read by the next; a second writer refused; destroy', t)
  }

  t = Date.now()
  await sbx.commands.run("nohup sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &")
  await sleep(1000)
  assert.equal(await sbx.pause(), true)
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const resumed = await Sandbox.connect(sbx.sandboxId)
  const before = Number(await resumed.files.read('/tmp/count'))
  // Its counter goes on (within 15 s: a resumed guest on a busy TCG host may take a while).
  let after = before
  for (const end = Date.now() + 15000; after <= before && Date.now() < end; ) {
    await sleep(500)
    after = Number(await resumed.files.read('/tmp/count'))
  }
  assert.ok(after > before && before > 0, `${before} -> ${after}`)
  ok(`pause, then connect resumes it with its processes (counter ${before} -> ${after})`, t)

  t = Date.now()
  const copies = await sbx.fork({ count: 3, timeoutMs: 300_000 })
  try {
    assert.equal(copies.length, 3)
    for (const [i, c] of copies.entries()) {
      assert.ok(!(c instanceof Error), String(c))
      await c.commands.run(`echo copy${i} > /tmp/who`)
    }
    const who = await Promise.all(copies.map((c) => c.files.read('/tmp/who')))
    assert.deepEqual(who, ['copy0\n', 'copy1\n', 'copy2\n'])
  } finally {
    await Promise.all(copies.filter((c) => !(c instanceof Error)).map((c) => c.kill()))
  }
  ok('fork({count: 3}): copies of their own', t)

  t = Date.now()
  const snap = await sbx.createSnapshot()
  const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 300_000 })
  assert.ok(Number(await fromSnap.files.read('/tmp/count')) > 0)
  await fromSnap.kill()
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  ok('createSnapshot, a create from it, deleteSnapshot', t)
} finally {
  t = Date.now()
  assert.equal(await sbx.kill(), true)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), NotFoundError)
  ok('kill (then false; getInfo NotFoundError)', t)
}
console.log(`all js steps passed in ${((Date.now() - T0) / 1000).toFixed(1)} s`)
