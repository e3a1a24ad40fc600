"""A template made with E2B's Template SDK, built and used: unchanged from what an E2B user
runs. Against forkbox: E2B_API_URL and E2B_SANDBOX_URL (or E2B_DOMAIN) at the daemon, a
forkbox token in E2B_API_KEY (docs/e2b.md, "Agents written for E2B")."""

import time

from e2b import Sandbox, Template, default_build_logger

site = (
    Template()
    .from_template("base")  # or .from_image("python:3.12"): pulled from Docker Hub or its mirror
    .run_cmd("mkdir -p site && echo 'hello from a template' > site/index.html")
    .set_start_cmd("cd site && python3 -m http.server 8000", "curl -sf localhost:8000")
)
t = time.time()
Template.build(site, "site:v1", on_build_logs=default_build_logger())
print(f"built in {time.time() - t:.1f} s")
t = time.time()
sbx = Sandbox.create("site:v1")  # a copy of the saved sandbox: the server is already up
print(f"created in {time.time() - t:.2f} s")
print(sbx.commands.run("curl -s localhost:8000").stdout)
sbx.kill()
