// Configuration: the defaults, overridden by what the caller gives.
import defaults from './defaults';

export function loadConfig(overrides = {}) {
  const out = { ...defaults, ...overrides };
  if (!Number.isInteger(out.retries) || out.retries < 0) {
    throw new Error('retries must be a whole number');
  }
  return out;
}
