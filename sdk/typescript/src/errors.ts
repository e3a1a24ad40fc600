// Errors the SDK throws. Each carries the daemon's own message.

/**
 * Something forkbox refused or could not do. `code` is the daemon's stable name for it
 * (`sandbox_not_found`, `image_in_use`, …: the same from every forkbox front end) and
 * `status` the HTTP status, when the daemon answered.
 */
export class ForkboxError extends Error {
  readonly status?: number;
  readonly code?: string;
  constructor(message: string, status?: number, code?: string) {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
  }
}

/** The request was malformed or named something invalid (400). */
export class BadRequestError extends ForkboxError {}
/** The token is missing or wrong (401), or the request was refused (403). */
export class AuthError extends ForkboxError {}
/** No such sandbox, image, snapshot, command or file (404). */
export class NotFoundError extends ForkboxError {}
/** The thing is in the wrong state for this: hibernated, in use, failed (409). */
export class ConflictError extends ForkboxError {}
/** A disk is full: the sandbox's own (an upload) or the host's (507). */
export class InsufficientStorageError extends ForkboxError {}
/** A bug in forkbox, or its host failing under it: never the request's fault (500). */
export class InternalError extends ForkboxError {}
/** No forkbox daemon answers where the SDK looked. */
export class DaemonNotRunningError extends ForkboxError {}
/** An image build failed; the message holds the step and the last output. */
export class BuildError extends ForkboxError {}

/** A command ran past its timeout and was killed; `result` has what it printed. */
export class ExecTimeoutError extends ForkboxError {
  readonly result: unknown;
  constructor(message: string, result: unknown) {
    super(message);
    this.result = result;
  }
}

type ErrorClass = new (m: string, s?: number, c?: string) => ForkboxError;

/** Every code the API answers with (forkbox_api::Code; a Rust test holds this table to it). */
const BY_CODE: Record<string, ErrorClass> = {
  bad_request: BadRequestError,
  payload_too_large: BadRequestError,
  unauthorized: AuthError,
  permission_denied: AuthError,
  misdirected_request: AuthError,
  sandbox_not_found: NotFoundError,
  command_not_found: NotFoundError,
  snapshot_not_found: NotFoundError,
  image_not_found: NotFoundError,
  volume_not_found: NotFoundError,
  not_found: NotFoundError,
  sandbox_hibernated: ConflictError,
  sandbox_not_hibernated: ConflictError,
  sandbox_failed: ConflictError,
  snapshot_exists: ConflictError,
  snapshot_in_use: ConflictError,
  snapshot_unrestorable: ConflictError,
  image_in_use: ConflictError,
  volume_exists: ConflictError,
  volume_in_use: ConflictError,
  conflict: ConflictError,
  refused_from_guest: ForkboxError,
  disk_full: InsufficientStorageError,
  host_disk_full: InsufficientStorageError,
  setup_needed: ForkboxError,
  build_failed: BuildError,
  sandbox_lost: ConflictError,
  cluster_unavailable: ForkboxError,
  no_capacity: ForkboxError,
  node_unreachable: ForkboxError,
  internal: InternalError,
};

/** For answers without a code: a body that is not forkbox's (a proxy's, a framework's). */
const BY_STATUS: Record<number, ErrorClass> = {
  400: BadRequestError,
  401: AuthError,
  403: AuthError,
  404: NotFoundError,
  409: ConflictError,
  422: BadRequestError,
  500: InternalError,
  507: InsufficientStorageError,
};

/** The error for an answer: by its code, or by its status when it has none (or one newer than this SDK). */
export function errorOf(status: number, body: Buffer): ForkboxError {
  let message: string;
  let code: string | undefined;
  try {
    const answer = JSON.parse(body.toString("utf8")) as { error: unknown; code?: unknown };
    if (typeof answer.error !== "string") throw new Error();
    message = answer.error;
    code = typeof answer.code === "string" ? answer.code : undefined;
  } catch {
    message = body.toString("utf8").trim() || `HTTP ${status}`;
  }
  const E = (code !== undefined && Object.hasOwn(BY_CODE, code) ? BY_CODE[code] : undefined) ?? BY_STATUS[status] ?? ForkboxError;
  return new E(message, status, code);
}
