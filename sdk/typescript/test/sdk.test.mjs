// The TypeScript SDK against a real daemon and real VMs (started by crates/cli/tests/sdk.rs,
// which sets FORKBOX_API, FORKBOX_TEST_TCP and FORKBOX_TEST_TOKEN).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

import {
  AuthError,
  BadRequestError,
  BuildError,
  ConflictError,
  DaemonNotRunningError,
  ExecTimeoutError,
  ForkboxError,
  NotFoundError,
  Runtime,
} from "../dist/index.js";

const TTL = 900;
const rt = new Runtime();
let sbx;

before(async () => {
  sbx = await rt.sandboxes.create({ ttlSeconds: TTL, labels: { suite: "ts-sdk" } });
});

after(async () => {
  await sbx?.stop();
  rt.close();
});

test("exec returns the code and both streams", async () => {
  const r = await sbx.exec("echo out; echo err >&2; exit 3");
  assert.deepEqual([r.exitCode, r.stdout, r.stderr], [3, "out\n", "err\n"]);
  assert.equal((await sbx.exec(["python3", "-c", "print(6*7)"], { cwd: "/tmp" })).stdout, "42\n");
  assert.equal((await sbx.exec("echo $A", { env: { A: "b c" } })).stdout, "b c\n");
});

test("a program that is not there exits 127, plain or streamed", async () => {
  for (const o of [{}, { onStdout: () => {} }]) {
    const r = await sbx.exec(["no-such-program"], o);
    assert.equal(r.exitCode, 127, JSON.stringify(r));
    assert.ok(r.stderr.includes("no-such-program"), r.stderr);
  }
});

test("plain output is capped at 64 KiB and flagged; streamed output is whole", async () => {
  const big = "head -c 100000 /dev/zero | tr '\\0' x";
  const r = await sbx.exec(big);
  assert.equal(r.stdout.length, 64 * 1024);
  assert.ok(r.stdoutTruncated);
  const seen = [];
  const s = await sbx.exec(big, { onStdout: (t) => seen.push(t) });
  assert.equal(s.stdout.length, 100000);
  assert.equal(seen.join(""), s.stdout);
});

test("a timeout throws with the partial result; a bad one is refused", async () => {
  await assert.rejects(sbx.exec("echo started; sleep 30", { timeoutMs: 1500 }), (e) => {
    assert.ok(e instanceof ExecTimeoutError);
    assert.equal(e.result.stdout, "started\n");
    return true;
  });
  await assert.rejects(sbx.exec("true", { timeoutMs: 25 * 3600 * 1000 }), BadRequestError);
});

test("detached commands wait and take signals", async () => {
  const cmd = await sbx.start("sleep 1; echo finished");
  assert.equal(await cmd.done(), false);
  assert.equal((await cmd.wait()).stdout, "finished\n");
  const long = await sbx.start(["sleep", "600"]);
  await long.kill(9);
  const r = await long.wait();
  assert.ok(r.signal === 9 || r.exitCode === 137, JSON.stringify(r));
});

test("files: upload a tree, read, write, list", async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "fbx-ts-"));
  const deep = path.join(dir, "pkg", "d".repeat(110));
  fs.mkdirSync(deep, { recursive: true });
  fs.writeFileSync(path.join(deep, "m.py"), "X = 1\n");
  fs.writeFileSync(path.join(dir, "README"), "hello\n");
  fs.symlinkSync("README", path.join(dir, "link"));
  assert.ok((await sbx.files.upload(dir, "/work/app")) > 0);
  const names = (await sbx.files.list("/work/app")).map((e) => `${e.name}:${e.kind}`);
  assert.deepEqual(names, ["README:file", "link:symlink", "pkg:dir"]);
  assert.equal(await sbx.files.readText(`/work/app/pkg/${"d".repeat(110)}/m.py`), "X = 1\n");
  await sbx.files.writeText("notes/é.txt", "héllo", 0o600);
  assert.equal((await sbx.exec("stat -c %a /root/notes/é.txt; cat /root/notes/é.txt")).stdout, "600\nhéllo");
  const bytes = Buffer.from(Array.from({ length: 256 }, (_, i) => i));
  await sbx.files.writeBytes("/tmp/bin", bytes);
  assert.deepEqual(await sbx.files.readBytes("/tmp/bin"), bytes);
  await assert.rejects(sbx.files.readText("/nope"), NotFoundError);
  await assert.rejects(sbx.files.upload(path.join(dir, "missing"), "/x"), /not a directory on this host/);
  fs.rmSync(dir, { recursive: true });
});

test("errors carry the daemon's message", async () => {
  await assert.rejects(rt.sandboxes.create({ image: "no-such-image" }), (e) => {
    assert.ok(e instanceof NotFoundError);
    assert.match(e.message, /no image no-such-image/);
    return true;
  });
  const s = await rt.sandboxes.create({ ttlSeconds: TTL });
  await s.stop();
  await assert.rejects(s.exec("true"), new RegExp(`no sandbox ${s.id}`));
  await s.stop();
  await assert.rejects(s.fork({ count: 21 }), (e) => e instanceof BadRequestError && e.code === "bad_request");
  // A pin to a node that is not there: one daemon is in no cluster, a cluster has no such node.
  await assert.rejects(rt.sandboxes.create({ node: "no-such-node", ttlSeconds: TTL }), (e) => {
    assert.ok(e instanceof BadRequestError);
    assert.match(e.message, /no-such-node/);
    return true;
  });
  assert.equal((await rt.sandboxes.list({ node: "no-such-node" })).length, 0);
  await assert.rejects(new Runtime({ api: "unix:/nonexistent/forkbox.sock" }).info(), (e) => {
    assert.ok(e instanceof DaemonNotRunningError);
    assert.match(e.message, /no forkbox daemon answers on \/nonexistent/);
    return true;
  });
  assert.throws(() => new Runtime({ api: "localhost:1" }), ForkboxError);
});

test("a secret stays outside the guest", async () => {
  const value = `sdk-secret-${Math.random().toString(16).slice(2)}`;
  await assert.rejects(
    rt.sandboxes.create({ secrets: [{ name: "T", hosts: ["*"], value }], ttlSeconds: TTL }),
    (e) => e instanceof BadRequestError && /"\*"/.test(e.message),
  );
  const s = await rt.sandboxes.create({
    secrets: [{ name: "T", hosts: ["api.example.com"], value }],
    ttlSeconds: TTL,
  });
  try {
    assert.deepEqual(s.info.secrets, [{ name: "T", hosts: ["api.example.com"] }]);
    assert.ok(!JSON.stringify(s.info).includes(value));
    const seen = (await s.exec(["sh", "-c", "echo $T"])).stdout.trim();
    assert.ok(seen.startsWith("fbxs_") && !seen.includes(value), seen);
  } finally {
    await s.stop();
  }
});

test("a guest port is reached through a forward", async () => {
  const s = await rt.sandboxes.create({ ttlSeconds: TTL });
  try {
    await s.exec(["sh", "-c", "mkdir -p /tmp/w && echo served-by-the-guest > /tmp/w/i.txt"]);
    await s.start(["python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", "--directory", "/tmp/w"]);
    const url = await s.ports.forward(8000);
    assert.deepEqual((await s.ports.list()).map((p) => p.url), [url]);
    assert.throws(() => s.ports.open(70000), ForkboxError);
    if (process.env.FORKBOX_TEST_NODES) return; // in a cluster the forward listens on the sandbox's node
    let body = "";
    for (let i = 0; i < 240 && !body; i++) {
      try {
        body = await (await fetch(`${url}i.txt`)).text();
      } catch {
        await new Promise((r) => setTimeout(r, 500));
      }
    }
    assert.equal(body.trim(), "served-by-the-guest");
  } finally {
    await s.stop();
  }
});

test("a fork goes to the node it is pinned to", async () => {
  // In a cluster (the test names its nodes): a copy pinned to another node than its source's
  // runs there, its snapshot brought by chunks. One daemon: a pin is refused, naming the node.
  const nodes = (process.env.FORKBOX_TEST_NODES ?? "").split(",").filter((n) => n);
  const s = await rt.sandboxes.create({ ttlSeconds: TTL });
  try {
    await s.files.writeText("/root/moved", "with the copy");
    if (nodes.length === 0) {
      await assert.rejects(s.fork({ node: "no-such-node" }), /no-such-node/);
      return;
    }
    const other = nodes.find((n) => n !== s.info.node);
    const [copy] = await s.fork({ node: other });
    try {
      assert.equal(copy.info.node, other);
      assert.ok(copy.info.transfer.bytes_moved > 0);
      assert.equal(await copy.files.readText("/root/moved"), "with the copy");
    } finally {
      await copy.stop();
    }
  } finally {
    await s.stop();
  }
});

test("TCP needs the right token", async () => {
  const bad = new Runtime({ api: process.env.FORKBOX_TEST_TCP, token: "fbx_wrong" });
  await assert.rejects(bad.info(), AuthError);
  bad.close();
  const good = new Runtime({ api: process.env.FORKBOX_TEST_TCP, token: process.env.FORKBOX_TEST_TOKEN });
  assert.ok(["kvm", "tcg"].includes((await good.info()).accel.accel));
  good.close();
});

test("await using deletes the sandbox even when the block throws", async () => {
  let id;
  await assert.rejects(
    (async () => {
      const s = await rt.sandboxes.create({ ttlSeconds: TTL });
      id = s.id;
      try {
        assert.equal((await s.exec("true")).exitCode, 0);
        throw new Error("boom");
      } finally {
        await s[Symbol.asyncDispose]();
      }
    })(),
    /boom/,
  );
  await assert.rejects(rt.sandboxes.get(id), NotFoundError);
});

test("fork copies carry files and processes; hibernate refuses exec until resume", async () => {
  await sbx.exec("echo base > /root/state; sleep 3000 & echo $! > /root/pid");
  const copies = await sbx.fork({ count: 3, ttlSeconds: TTL });
  try {
    assert.equal(new Set(copies.map((c) => c.id)).size, 3);
    for (const c of copies) {
      assert.equal((await c.exec("cat /root/state; kill -0 $(cat /root/pid) && echo alive")).stdout, "base\nalive\n");
    }
    await copies[0].hibernate();
    await assert.rejects(copies[0].exec("true"), ConflictError);
    await copies[0].resume();
    assert.equal((await copies[0].exec("kill -0 $(cat /root/pid) && echo alive")).stdout, "alive\n");
  } finally {
    await Promise.all(copies.map((c) => c.stop()));
  }
});

test("an idle sandbox sleeps and an exec wakes it", async () => {
  const s = await rt.sandboxes.create({ ttlSeconds: TTL, idleSeconds: 2 });
  try {
    assert.deepEqual(s.info.idle, { after_secs: 2, action: "hibernate" });
    assert.equal(s.info.wake_on_use, true);
    await s.exec("sleep 3000 & echo $! > /root/pid");
    const deadline = Date.now() + 90_000;
    while ((await rt.sandboxes.get(s.id)).info.state !== "sleeping" && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 500));
    }
    assert.equal((await rt.sandboxes.get(s.id)).info.state, "sleeping");
    assert.equal((await s.exec("kill -0 $(cat /root/pid) && echo alive")).stdout, "alive\n");
    assert.equal((await rt.sandboxes.get(s.id)).info.state, "running");
    await s.setIdle(null);
    assert.equal(s.info.idle ?? null, null);
    await s.setIdle(60, { wakeOnUse: false });
    assert.equal(s.info.wake_on_use, false);
  } finally {
    await s.stop();
  }
});

test("a volume outlives its writer and is read by the next; a second writer is refused", async () => {
  const name = `ts-sdk-${process.pid}`;
  const v = await rt.volumes.create(name, { size: "32m" });
  assert.equal(v.size_bytes, 32 << 20);
  try {
    const w = await rt.sandboxes.create({ ttlSeconds: TTL, volumes: [`${name}:/data`] });
    try {
      assert.equal((await w.exec("echo kept > /data/f && sync")).exitCode, 0);
      await assert.rejects(
        rt.sandboxes.create({ ttlSeconds: TTL, volumes: [{ name, path: "/data", readOnly: true }] }),
        (e) => e instanceof ConflictError && e.code === "volume_in_use" && e.message.includes(w.id),
      );
      await assert.rejects(rt.volumes.remove(name), ConflictError);
    } finally {
      await w.stop();
    }
    const r = await rt.sandboxes.create({ ttlSeconds: TTL, volumes: [`${name}:/v:ro`] });
    try {
      assert.equal((await r.exec("cat /v/f")).stdout, "kept\n");
      assert.deepEqual((await rt.volumes.get(name)).holders, [{ sandbox: r.id, read_only: true }]);
    } finally {
      await r.stop();
    }
  } finally {
    await rt.volumes.remove(name);
  }
  await assert.rejects(rt.volumes.get(name), NotFoundError);
});

test("images: a bad recipe is refused, a missing base fails the build", async () => {
  await assert.rejects(rt.images.build({ name: "x", recipe: { bsae: "bookworm" } }), /bsae/);
  await assert.rejects(rt.images.build({ name: "x", recipe: { base: "no-such-base" } }), (e) => {
    assert.ok(e instanceof BuildError);
    assert.match(e.message, /no image no-such-base/);
    return true;
  });
  const all = await rt.images.list();
  assert.ok(all.some((i) => i.name === "python-bookworm"));
});
