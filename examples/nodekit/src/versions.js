// Version helpers over semver.
import semver from 'semver';

export function newest(versions) {
  return [...versions].filter((v) => semver.valid(v)).sort(semver.rcompare)[0] ?? null;
}

export function bump(version, part = 'patch') {
  const next = semver.inc(version, part);
  if (!next) throw new Error(`cannot bump ${version}`);
  return next;
}

export function allowed(version, range) {
  return semver.satisfies(version, range, { includePrerelease: false });
}

export function majorOf(version) {
  return semver.major(semver.coerce(version));
}
