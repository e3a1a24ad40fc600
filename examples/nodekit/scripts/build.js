// Bundles nodekit into one CommonJS file with esbuild.
import { buildSync } from 'esbuild';

export function bundle(outfile = 'dist/nodekit.cjs') {
  return buildSync({
    entryPoints: ['src/index.js'],
    bundle: true,
    platform: 'node',
    format: 'cjs',
    outfile,
    resolveExtensions: ['.js', '.json'],
    logLevel: 'silent',
  });
}

if (process.argv[1] && process.argv[1].endsWith('build.js')) bundle();
