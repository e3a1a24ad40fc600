#!/usr/bin/env python3
"""Would QEMU's `mapped-ram` (9.0+: RAM at fixed offsets in a file, with multifd) save or
restore forkbox's snapshots faster? Measured on a paused microvm guest whose 1 GiB of RAM is
random data (every page is written out, as in a 1 GB dirty save), with the QEMU given as argv[1]:

  stream      `migrate file:` / `exec:cat` as QEMU 7.2 can (RAM inline in the stream)
  mapped-ram  `migrate file:` with the mapped-ram capability, multifd with 2 channels

Each is timed from the command to `completed`, save and restore. forkbox's own formats put
no RAM in QEMU's stream at all (RAM is a file copies map; the save copies only written pages
while the guest runs), so the figures to hold these against are the fork bench's.
Usage: bench/mapped_ram.py QEMU [MIB]"""
import json, os, socket, subprocess, sys, tempfile, time

qemu = sys.argv[1]
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
env = dict(os.environ)
prefix = os.path.dirname(os.path.dirname(os.path.realpath(qemu)))
args_fw = []
if not prefix.startswith("/usr"):
    args_fw = ["-L", os.path.join(prefix, "share/qemu")]
    env["QEMU_MODULE_DIR"] = os.path.join(prefix, "lib/x86_64-linux-gnu/qemu")
version = subprocess.run([qemu, "--version"], capture_output=True, text=True, env=env).stdout.splitlines()[0]


class Qmp:
    def __init__(self, path):
        for _ in range(500):
            try:
                self.s = socket.socket(socket.AF_UNIX)
                self.s.connect(path)
                break
            except OSError:
                time.sleep(0.01)
        self.f = self.s.makefile("rw")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name, **a):
        self.f.write(json.dumps({"execute": name, "arguments": a}) + "\n")
        self.f.flush()
        while True:
            r = json.loads(self.f.readline())
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise RuntimeError(f"{name}: {r['error']['desc']}")

    def wait(self):
        while True:
            st = self.cmd("query-migrate")
            if st.get("status") == "completed":
                return
            if st.get("status") in ("failed", "cancelled"):
                raise RuntimeError(st.get("error-desc", "migration failed"))
            time.sleep(0.002)


def start(d, name, ram, incoming):
    sock = os.path.join(d, name + ".qmp")
    a = [qemu, *args_fw, "-M", "microvm,memory-backend=ram", "-accel", "tcg", "-m", f"{mib}M",
         "-object", f"memory-backend-file,id=ram,size={mib}M,mem-path={ram},share=off",
         "-nodefaults", "-no-user-config", "-display", "none", "-S",
         "-qmp", f"unix:{sock},server=on,wait=off"]
    if incoming:
        a += ["-incoming", "defer"]
    p = subprocess.Popen(a, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return p, Qmp(sock)
    except Exception:
        p.kill()
        raise


def caps(q, mapped):
    if mapped and not FILE_URI:
        raise RuntimeError("mapped-ram is QEMU 9.0's")
    c = [{"capability": "mapped-ram", "state": True}, {"capability": "multifd", "state": True}] if mapped else []
    if c:
        q.cmd("migrate-set-capabilities", capabilities=c)
        q.cmd("migrate-set-parameters", **{"multifd-channels": 2})


FILE_URI = not version.startswith("QEMU emulator version 7.")  # file: from 8.2


def timed(p, q, command, uri):
    try:
        t = time.monotonic()
        q.cmd(command, uri=uri)
        q.wait()
        return (time.monotonic() - t) * 1000
    finally:
        p.kill()
        p.wait()


def run(d, mapped):
    src_ram = os.path.join(d, "src.ram")
    out = os.path.join(d, "state")
    if os.path.exists(out):
        os.remove(out)
    p, q = start(d, "src", src_ram, False)
    caps(q, mapped)
    save = timed(p, q, "migrate", f"file:{out}" if FILE_URI else f"exec:cat > {out}")
    size = os.path.getsize(out) >> 20
    dst_ram = os.path.join(d, "dst.ram")
    with open(dst_ram, "wb") as f:
        f.truncate(mib << 20)
    p, q = start(d, "dst", dst_ram, True)
    caps(q, mapped)
    load = timed(p, q, "migrate-incoming", f"file:{out}" if FILE_URI else f"exec:cat {out}")
    return save, load, size


with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
    with open(os.path.join(d, "src.ram"), "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(1 << 20))
    print(f"# {version}: a paused guest, {mib} MiB of random RAM")
    for mapped in (False, True):
        name = "mapped-ram, multifd x2" if mapped else "stream"
        try:
            rows = [run(d, mapped) for _ in range(3)]
        except RuntimeError as e:
            print(f"{name:<24} not available: {e}")
            continue
        rows.sort()
        save, load, size = rows[1]
        print(f"{name:<24} save {save:8.0f} ms   restore {load:8.0f} ms   file {size} MiB  (median of 3)")
