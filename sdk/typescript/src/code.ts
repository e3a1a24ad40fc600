// Code cells (`Sandbox.runCode`): what a cell gave back, and the reading of its events.

import { ForkboxError } from "./errors.js";
import type { Transport } from "./http.js";

/** A value a cell displayed, or its last expression's (`isMainResult`), in every format the
 * kernel gave (a plot: `png`, base64). */
export interface CodeResult {
  isMainResult: boolean;
  text?: string;
  html?: string;
  markdown?: string;
  svg?: string;
  png?: string;
  jpeg?: string;
  pdf?: string;
  latex?: string;
  json?: unknown;
  javascript?: string;
}

/** An exception a cell raised, or `TimeoutError`, `KernelDied`, `OutputLimitError`, `ForkboxRelayError`,
 * `CommandExitError` (a bash cell's exit). */
export interface CodeError {
  name: string;
  value: string;
  traceback: string;
}

/** What a cell gave back. `text` is its own value's (its last expression's). */
export interface Execution {
  results: CodeResult[];
  stdout: string[];
  stderr: string[];
  error?: CodeError;
  executionCount?: number;
  text?: string;
}

/** A context: a language and a working directory with state of their own. */
export interface CodeContext {
  id: string;
  language: string;
  cwd: string;
}

export interface RunCodeOptions {
  /** `python` (the default), `javascript` or `bash`: that language's default context. */
  language?: "python" | "javascript" | "bash";
  /** A context of `createCodeContext` instead. */
  context?: CodeContext | string;
  /** Environment variables for this cell alone. */
  env?: Record<string, string>;
  /** Interrupt the cell after this many seconds (default and at most 300). */
  timeoutSeconds?: number;
  onStdout?: (text: string) => void;
  onStderr?: (text: string) => void;
  onResult?: (r: CodeResult) => void;
}

type WireCodeEvent =
  | { type: "stdout" | "stderr"; text: string }
  | ({ type: "result"; is_main_result: boolean } & Omit<CodeResult, "isMainResult">)
  | ({ type: "error" } & CodeError)
  | { type: "end"; execution_count?: number };

const FORMATS = ["text", "html", "markdown", "svg", "png", "jpeg", "pdf", "latex", "json", "javascript"] as const;

export function contextId(c: CodeContext | string): string {
  return typeof c === "string" ? c : c.id;
}

/** Runs one cell through the daemon and reads its events to the end. */
export async function runCode(t: Transport, sandbox: string, code: string, o: RunCodeOptions): Promise<Execution> {
  const body: Record<string, unknown> = { code };
  if (o.language !== undefined) body.language = o.language;
  if (o.context !== undefined) body.context_id = contextId(o.context);
  if (o.env) body.env = o.env;
  if (o.timeoutSeconds !== undefined) body.timeout_secs = Math.max(1, Math.round(o.timeoutSeconds));
  const ex: Execution = { results: [], stdout: [], stderr: [] };
  for await (const ev of t.events<WireCodeEvent>("POST", `/sandboxes/${sandbox}/code`, { json: body })) {
    switch (ev.type) {
      case "stdout":
        ex.stdout.push(ev.text);
        o.onStdout?.(ev.text);
        break;
      case "stderr":
        ex.stderr.push(ev.text);
        o.onStderr?.(ev.text);
        break;
      case "result": {
        const r: CodeResult = { isMainResult: !!ev.is_main_result };
        for (const f of FORMATS) if (ev[f] !== undefined) (r as unknown as Record<string, unknown>)[f] = ev[f];
        ex.results.push(r);
        if (r.isMainResult) ex.text = r.text;
        o.onResult?.(r);
        break;
      }
      case "error":
        ex.error = { name: ev.name, value: ev.value, traceback: ev.traceback };
        break;
      case "end":
        ex.executionCount = ev.execution_count;
        return ex;
    }
  }
  throw new ForkboxError("the cell's stream ended before the cell did");
}
