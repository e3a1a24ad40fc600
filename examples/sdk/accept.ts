// Accept by comparison, with the TypeScript SDK: record which tests pass on the old
// toolchain, port in three forks on the new one, keep only ports that lost no test, smallest
// diff first.
//
//   npm ci && npm run build && node dist/accept.js      (in examples/sdk)

import * as path from "node:path";
import { fileURLToPath } from "node:url";

import { Runtime, type Sandbox } from "forkbox";

const EXAMPLES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const TOOLS = ["python3", "python3-pytest", "git"];
const PLANS = ["minimal", "modernize", "wrong"]; // deterministic porters: examples/plans/port.py
const PYTEST = "python3 -m pytest -q -rA -p no:cacheprovider > /tmp/report.txt 2>&1; true";

const passed = (report: string): Set<string> =>
  new Set([...report.matchAll(/^PASSED (\S+)/gm)].map((m) => m[1]));

async function main(): Promise<number> {
  const runtime = new Runtime();
  try {
    // Both toolchains pinned as images (rebuilt only when the recipe changes).
    const legacy = await runtime.images.build({ name: "legacy", recipe: { base: "bullseye", apt: TOOLS }, ifChanged: true });
    const target = await runtime.images.build({ name: "target", recipe: { base: "trixie", apt: TOOLS }, ifChanged: true });
    console.log(`old toolchain ${legacy.reference}, new ${target.reference}`);

    let before: Set<string>;
    {
      await using old = await runtime.sandboxes.create({ image: legacy.reference, network: { internet: false }, ttlSeconds: 900 });
      await old.files.upload(path.join(EXAMPLES, "legacykit"), "/work");
      await old.exec(PYTEST, { cwd: "/work" });
      before = passed(await old.files.readText("/tmp/report.txt"));
    }
    console.log(`${before.size} tests pass on ${legacy.reference}`);

    const accepted: Array<[number, string]> = [];
    {
      await using base = await runtime.sandboxes.create({ image: target.reference, network: { internet: false }, ttlSeconds: 900 });
      await base.files.upload(path.join(EXAMPLES, "legacykit"), "/work");
      await base.files.upload(path.join(EXAMPLES, "plans"), "/plan");
      await base.exec(
        "git init -q && git add -A && git -c user.name=forkbox -c user.email=forkbox@localhost commit -qm before",
        { cwd: "/work" },
      );
      const copies: Sandbox[] = await base.fork({ count: 3, ttlSeconds: 900 });
      try {
        await Promise.all(
          copies.map(async (copy, i) => {
            await copy.exec(["python3", "/plan/port.py", PLANS[i]], { cwd: "/work", timeoutMs: 600_000 });
            await copy.exec(PYTEST, { cwd: "/work" });
            const now = passed(await copy.files.readText("/tmp/report.txt"));
            const lost = [...before].filter((t) => !now.has(t));
            const { stdout: diff } = await copy.exec("git diff", { cwd: "/work" });
            const lines = diff.split("\n").length - 1;
            console.log(`${PLANS[i].padEnd(10)} lost ${lost.length} test(s), ${lines} diff lines`);
            if (lost.length === 0) accepted.push([lines, PLANS[i]]);
          }),
        );
      } finally {
        await Promise.all(copies.map((c) => c.stop()));
      }
    }
    accepted.sort((a, b) => a[0] - b[0]);
    const order = accepted.map(([, p]) => p);
    console.log(`accepted, smallest diff first: ${order.join(", ")}`);
    return order.join(",") === "minimal,modernize" ? 0 : 1;
  } finally {
    runtime.close();
  }
}

process.exitCode = await main();
