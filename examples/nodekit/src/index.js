// nodekit: the public API.
export * from './strings';
export * from './versions';
export * from './dates';
export * from './collections';
export { loadConfig } from './config';
