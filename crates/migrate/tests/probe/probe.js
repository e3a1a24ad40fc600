// A postinstall probe: what can an install script in a sandbox reach? Prints one line,
// `PROBE {json}`: each direct TCP connection's outcome, each CONNECT through forkbox's proxy
// (127.0.0.1:3128), and what of the host's files it sees.
const net = require('node:net');
const fs = require('node:fs');

const hostIps = (process.env.PROBE_HOST_IPS || '').split(',').filter(Boolean);

function direct(host, port) {
  return new Promise((resolve) => {
    const s = net.connect({ host, port, timeout: 5000 });
    s.on('connect', () => { s.destroy(); resolve('connected'); });
    s.on('timeout', () => { s.destroy(); resolve('timeout'); });
    s.on('error', (e) => resolve(`error ${e.code}`));
  });
}

function viaProxy(target) {
  return new Promise((resolve) => {
    const s = net.connect(3128, '127.0.0.1', () => {
      s.write(`CONNECT ${target} HTTP/1.1\r\nHost: ${target}\r\n\r\n`);
    });
    let buf = '';
    s.setTimeout(60000, () => { s.destroy(); resolve('timeout'); });
    s.on('data', (d) => {
      buf += d;
      if (buf.includes('\r\n\r\n')) {
        s.destroy();
        const [head, body] = buf.split('\r\n\r\n');
        resolve(`${head.split('\r\n')[0].replace('HTTP/1.1 ', '')} ${(body || '').trim()}`);
      }
    });
    s.on('error', (e) => resolve(`error ${e.code}`));
  });
}

(async () => {
  const report = { direct: {}, proxy: {} };
  const directTargets = [...hostIps.map((ip) => [ip, 22]), ['10.0.2.2', 22], ['169.254.169.254', 80], ['8.8.8.8', 53], ['104.16.0.35', 443]];
  for (const [h, p] of directTargets) report.direct[`${h}:${p}`] = await direct(h, p);
  const proxyTargets = ['registry.npmjs.org:443', 'example.com:443', 'localhost:22', '169.254.169.254:80', ...hostIps.map((ip) => `${ip}:22`)];
  for (const t of proxyTargets) report.proxy[t] = await viaProxy(t);
  report.hostname = fs.readFileSync('/etc/hostname', 'utf8').trim();
  report.host_repo_visible = fs.existsSync('/work/main/Cargo.toml') || fs.existsSync('/var/tmp/forkbox-test');
  console.log(`PROBE ${JSON.stringify(report)}`);
})();
