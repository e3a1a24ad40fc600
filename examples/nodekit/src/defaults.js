// What loadConfig starts from.
export default { retries: 3, timeoutMs: 5000, color: true, name: 'nodekit' };
