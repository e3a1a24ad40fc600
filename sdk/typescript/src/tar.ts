// A directory tree as one tar.gz (POSIX ustar, with PAX records for long names and links),
// made with Node's own zlib: what `files.upload` sends.

import { promises as fs } from "node:fs";
import * as path from "node:path";
import { gzipSync } from "node:zlib";

const BLOCK = 512;

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, "0") + "\0";
}

function header(name: string, mode: number, size: number, mtime: number, type: string, link = ""): Buffer {
  const h = Buffer.alloc(BLOCK);
  h.write(name, 0, 100, "utf8");
  h.write(octal(mode & 0o7777, 8), 100, "ascii");
  h.write(octal(0, 8), 108, "ascii");
  h.write(octal(0, 8), 116, "ascii");
  h.write(octal(size, 12), 124, "ascii");
  h.write(octal(Math.floor(mtime), 12), 136, "ascii");
  h.write("        ", 148, "ascii");
  h.write(type, 156, "ascii");
  h.write(link, 157, 100, "utf8");
  h.write("ustar\0", 257, "ascii");
  h.write("00", 263, "ascii");
  h.write("root", 265, "ascii");
  h.write("root", 297, "ascii");
  let sum = 0;
  for (const b of h) sum += b;
  h.write(octal(sum, 7) + " ", 148, "ascii");
  return h;
}

function pad(size: number): Buffer {
  return Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);
}

/** A PAX record set for names or link targets ustar cannot hold. */
function pax(fields: Record<string, string>): Buffer[] {
  let body = "";
  for (const [k, v] of Object.entries(fields)) {
    const rest = ` ${k}=${v}\n`;
    let len = Buffer.byteLength(rest) + 1;
    while (String(len).length + Buffer.byteLength(rest) !== len) len += 1;
    body += `${len}${rest}`;
  }
  const data = Buffer.from(body, "utf8");
  return [header("PaxHeader", 0o644, data.length, 0, "x"), data, pad(data.length)];
}

function entry(name: string, mode: number, size: number, mtime: number, type: string, link = ""): Buffer[] {
  const out: Buffer[] = [];
  const long: Record<string, string> = {};
  if (Buffer.byteLength(name) > 100) long.path = name;
  if (Buffer.byteLength(link) > 100) long.linkpath = link;
  if (Object.keys(long).length) out.push(...pax(long));
  out.push(header(name.slice(0, 100), mode, size, mtime, type, link.slice(0, 100)));
  return out;
}

/** `dir`'s tree as tar.gz; symlinks stay links, other special files are left out. */
export async function packDir(dir: string): Promise<Buffer> {
  const st = await fs.stat(dir).catch(() => undefined);
  if (!st?.isDirectory()) throw new Error(`${dir} is not a directory on this host`);
  const parts: Buffer[] = [];
  const walk = async (rel: string): Promise<void> => {
    const names = (await fs.readdir(path.join(dir, rel))).sort();
    for (const n of names) {
      const r = rel ? `${rel}/${n}` : n;
      const full = path.join(dir, r);
      const s = await fs.lstat(full);
      const mtime = s.mtimeMs / 1000;
      if (s.isDirectory()) {
        parts.push(...entry(`${r}/`, s.mode, 0, mtime, "5"));
        await walk(r);
      } else if (s.isSymbolicLink()) {
        parts.push(...entry(r, s.mode, 0, mtime, "2", await fs.readlink(full)));
      } else if (s.isFile()) {
        const data = await fs.readFile(full);
        parts.push(...entry(r, s.mode, data.length, mtime, "0"), data, pad(data.length));
      }
    }
  };
  await walk("");
  parts.push(Buffer.alloc(BLOCK * 2));
  return gzipSync(Buffer.concat(parts), { level: 1 });
}
