// Errors the SDK throws. Each carries the daemon's own message.

/** Something forkbox refused or could not do; `status` is the HTTP status, if any. */
export class ForkboxError extends Error {
  readonly status?: number;
  constructor(message: string, status?: number) {
    super(message);
    this.name = new.target.name;
    this.status = status;
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

const BY_STATUS: Record<number, new (m: string, s?: number) => ForkboxError> = {
  400: BadRequestError,
  401: AuthError,
  403: AuthError,
  404: NotFoundError,
  409: ConflictError,
  422: BadRequestError,
  507: InsufficientStorageError,
};

export function errorOf(status: number, body: Buffer): ForkboxError {
  let message: string;
  try {
    message = (JSON.parse(body.toString("utf8")) as { error: string }).error;
    if (typeof message !== "string") throw new Error();
  } catch {
    message = body.toString("utf8").trim() || `HTTP ${status}`;
  }
  const E = BY_STATUS[status] ?? ForkboxError;
  return new E(message, status);
}
