//! Secrets end to end: HTTPS servers the test runs in a network namespace of its own (its own
//! CA, made here, which the engine's process trusts through `SSL_CERT_FILE`), one requiring the
//! secret as a bearer token and, for git, as Basic credentials; a second one, not among the
//! secret's hosts, that echoes what it was sent. The guest holds only placeholders; the value
//! must reach the first server and appear in no file the run wrote (the snapshot's RAM file
//! included). Needs root, `ip`, `git` and `python3` on the host. Costs: a restore, a snapshot
//! and two forks (~10 s), the guest's Python and git under TCG (~20 s).

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::path::Path;

use forkbox_engine::api::{ops, CreateRequest, Engine, ForkRequest, SecretSpec};
use forkbox_engine::net::NetworkPolicy;
use forkbox_engine::sandbox::Sandbox;
use forkbox_test_infra as infra;

/// An HTTPS server: `/bearer` wants `Authorization: Bearer VALUE`, `/echo` says what
/// Authorization it got, `/git/...` is `git http-backend` behind Basic credentials whose
/// password is VALUE. Prints a line per request.
const SERVER: &str = r#"
import base64, http.server, os, ssl, subprocess, sys
addr, port, cert, key, value, repos = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
WHEEL_NAME = 'tinypkg-1.0-py3-none-any.whl'
def wheel():
    import io, zipfile
    b = io.BytesIO()
    files = {
        'tinypkg/__init__.py': 'VALUE = "installed through a secret"\n',
        'tinypkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n',
        'tinypkg-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
    }
    files['tinypkg-1.0.dist-info/RECORD'] = ''.join('%s,,\n' % f for f in list(files) + ['tinypkg-1.0.dist-info/RECORD'])
    with zipfile.ZipFile(b, 'w') as z:
        for name, text in files.items():
            z.writestr(name, text)
    return b.getvalue()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def reply(self, code, body, headers=()):
        body = body if isinstance(body, bytes) else body.encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.any()
    def do_POST(self):
        self.any()
    def any(self):
        auth = self.headers.get('Authorization', '')
        print(self.command, self.path, 'carried the value' if value in auth or value in base64.b64decode(auth[6:] or b'').decode(errors='replace') else 'no value', flush=True)
        if self.path == '/echo':
            return self.reply(200, 'got: ' + auth)
        if self.path == '/bearer':
            if auth == 'Bearer ' + value:
                return self.reply(200, 'bearer ok')
            return self.reply(401, 'bad bearer: ' + auth)
        ok = False
        if auth.startswith('Basic '):
            ok = base64.b64decode(auth[6:]).decode().partition(':')[2] == value
        if not ok:
            return self.reply(401, 'credentials needed', [('WWW-Authenticate', 'Basic realm="t"')])
        if self.path.startswith('/simple/'):
            page = '<a href="/files/%s">%s</a>' % (WHEEL_NAME, WHEEL_NAME)
            return self.reply(200, page, [('Content-Type', 'text/html')])
        if self.path == '/files/' + WHEEL_NAME:
            return self.reply(200, wheel(), [('Content-Type', 'application/octet-stream')])
        path, _, query = self.path[len('/git'):].partition('?')
        n = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(n) if n else b''
        env = dict(os.environ, GIT_PROJECT_ROOT=repos, GIT_HTTP_EXPORT_ALL='1', PATH_INFO=path,
                   QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER='x',
                   CONTENT_TYPE=self.headers.get('Content-Type', ''), CONTENT_LENGTH=str(len(body)))
        out = subprocess.run(['git', 'http-backend'], input=body, env=env, capture_output=True).stdout
        sep = b'\r\n\r\n' if b'\r\n\r\n' in out else b'\n\n'
        head, _, rest = out.partition(sep)
        code, headers = 200, []
        for line in head.decode().splitlines():
            k, _, v = line.partition(': ')
            if k.lower() == 'status':
                code = int(v.split()[0])
            elif k:
                headers.append((k, v))
        self.reply(code, rest, headers)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv = http.server.ThreadingHTTPServer((addr, port), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
srv.serve_forever()
"#;

/// In the guest: the bearer request to the secret's host and the echo from the other one, with
/// `$TOKEN` as the guest has it.
const CLIENT: &str = r#"
import os, sys, urllib.request
t = os.environ['TOKEN']
for url in sys.argv[1:]:
    req = urllib.request.Request(url, headers={'Authorization': 'Bearer ' + t})
    try:
        print(url, urllib.request.urlopen(req, timeout=120).read().decode())
    except urllib.error.HTTPError as e:
        print(url, e.code, e.read().decode())
print('placeholder', t)
"#;

async fn run(sb: &Sandbox, argv: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = sb.run(infra::argv(argv, env, 300_000)).await.unwrap();
    let text = format!(
        "{}{}",
        out.stdout_text(),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.code(), text)
}

/// The bearer and echo requests from `sb`; `TOKEN` overridden when given.
async fn requests(sb: &Sandbox, a: &str, b: &str, token: Option<&str>) -> String {
    let env: Vec<(&str, &str)> = token.map(|t| ("TOKEN", t)).into_iter().collect();
    let (code, out) = run(
        sb,
        &[
            "python3",
            "-c",
            CLIENT,
            &format!("https://{a}/bearer"),
            &format!("https://{b}/echo"),
        ],
        &env,
    )
    .await;
    assert_eq!(code, 0, "{out}");
    out
}

fn placeholder_in(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("placeholder "))
        .unwrap()
        .trim()
        .to_string()
}

fn run_ok(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Files under `dir` written since `since` (and every file when `since` is None).
fn files_since(dir: &Path, since: std::time::SystemTime, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(meta) = e.path().symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            files_since(&e.path(), since, out);
        } else if meta.is_file() && meta.modified().is_ok_and(|m| m >= since) {
            out.push(e.path());
        }
    }
}

/// Files that hold `needle`, of those written since `since` under each of `dirs`.
fn holding(dirs: &[&Path], since: std::time::SystemTime, needle: &[u8]) -> Vec<String> {
    let mut files = Vec::new();
    for d in dirs {
        files_since(d, since, &mut files);
    }
    println!("looked for the value in {} files", files.len());
    let finder = |hay: &[u8]| hay.windows(needle.len()).any(|w| w == needle);
    files
        .into_iter()
        .filter(|f| std::fs::read(f).is_ok_and(|b| finder(&b)))
        .map(|f| f.display().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_its_host_and_nothing_else_holds_it() {
    let started = std::time::SystemTime::now() - std::time::Duration::from_secs(1);
    let dir = tempfile::tempdir().unwrap();
    let mut net = infra::TestNet::new();
    let [a, b] = net.peer_ips.clone();
    let (ca, cert, key) = infra::test_pki(&[a.clone(), b.clone()]);
    let (ca_file, cert_file, key_file) = (
        dir.path().join("ca.pem"),
        dir.path().join("cert.pem"),
        dir.path().join("key.pem"),
    );
    std::fs::write(&ca_file, &ca).unwrap();
    std::fs::write(&cert_file, &cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    // The engine (this process) verifies hosts against this bundle, and guests get it.
    std::env::set_var("SSL_CERT_FILE", &ca_file);

    // A repository to clone, served by git http-backend.
    let repos = dir.path().join("repos");
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("README"), "cloned through a secret\n").unwrap();
    for args in [
        vec!["init", "-q"],
        vec!["add", "README"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "one",
        ],
    ] {
        run_ok(
            std::process::Command::new("git")
                .current_dir(&src)
                .args(&args),
        );
    }
    run_ok(
        std::process::Command::new("git")
            .args(["clone", "-q", "--bare"])
            .arg(&src)
            .arg(repos.join("repo.git")),
    );

    let value = format!("s3cr3t-{}", forkbox_engine::random::hex(16).unwrap());
    let server = dir.path().join("server.py");
    std::fs::write(&server, SERVER).unwrap();
    for ip in [&a, &b] {
        let log = dir.path().join(format!("{ip}.log"));
        net.run_server(
            "python3",
            &[
                server.to_str().unwrap(),
                ip,
                "443",
                cert_file.to_str().unwrap(),
                key_file.to_str().unwrap(),
                &value,
                repos.to_str().unwrap(),
            ],
            ip,
            443,
            &log,
        );
    }

    // A home of its own: what the run wrote is looked through below, and the shared test
    // home holds what every other test beside it writes (their disks, RAM files).
    let paths = infra::isolated_home("secrets");
    let cfg = forkbox_engine::sandbox::SandboxConfig {
        image: infra::image(&paths, "python-bookworm"),
        ..Default::default()
    };
    let engine = Engine::private(paths.clone());
    let secret = SecretSpec {
        name: "TOKEN".into(),
        hosts: vec![a.clone()],
        value: value.clone(),
        header: None,
    };
    // Bad input first: a secret that would go everywhere is refused, nothing made.
    let bad = engine
        .call(ops::Create {
            request: CreateRequest {
                image: Some(cfg.image.to_string()),
                secrets: vec![SecretSpec {
                    hosts: vec!["*".into()],
                    ..secret.clone()
                }],
                ..Default::default()
            },
        })
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(bad.contains("\"*\""), "{bad}");

    let v = engine
        .call(ops::Create {
            request: CreateRequest {
                image: Some(cfg.image.to_string()),
                // The other server is allowed, but no secret goes there.
                network: Some(NetworkPolicy {
                    internet: false,
                    allow: vec![format!("{b}:443")],
                    deny: Vec::new(),
                }),
                secrets: vec![secret.clone()],
                ..Default::default()
            },
        })
        .await
        .unwrap();
    assert_eq!(v.secrets.len(), 1);
    assert_eq!(v.secrets[0].name, "TOKEN");
    assert!(v.network.allow.contains(&a), "{:?}", v.network);
    assert!(!serde_json::to_string(&v).unwrap().contains(&value));
    let sb = engine.sandbox(&v.info.id).await.unwrap();

    let out = requests(&sb, &a, &b, None).await;
    println!("{out}");
    let placeholder = placeholder_in(&out);
    assert!(
        placeholder.starts_with("fbxs_") && !out.contains(&value),
        "{out}"
    );
    assert!(
        out.contains(&format!("https://{a}/bearer bearer ok")),
        "{out}"
    );
    // The other host got the placeholder, not the value.
    assert!(
        out.contains(&format!("https://{b}/echo got: Bearer {placeholder}")),
        "{out}"
    );

    // The secrets' listener is on the host's loopback: a guest that asks its proxy for it
    // (by address or name) is refused like for any host address.
    let listener = sb.client().net.secrets_listener().unwrap();
    let (code, probe) = run(
        &sb,
        &[
            "python3",
            "-c",
            &format!(
                "import http.client\n\
                 for h in ['127.0.0.1', 'localhost']:\n\
                 \x20   c = http.client.HTTPConnection('127.0.0.1', 3128, timeout=60)\n\
                 \x20   c.set_tunnel(h, {})\n\
                 \x20   try:\n\
                 \x20       c.request('GET', '/'); print('REACHED', h)\n\
                 \x20   except OSError as e:\n\
                 \x20       print('refused', h, e)\n",
                listener.port()
            ),
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{probe}");
    assert!(
        !probe.contains("REACHED") && probe.matches("refused").count() == 2,
        "{probe}"
    );

    // git: Basic credentials carrying the placeholder, after the server's 401.
    let (code, git) = run(
        &sb,
        &[
            "sh",
            "-c",
            &format!("git clone -q https://x:$TOKEN@{a}/git/repo.git /tmp/r && cat /tmp/r/README"),
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{git}");
    assert!(git.contains("cloned through a secret"), "{git}");

    // pip: an index URL with Basic credentials carrying the placeholder (pip run from the
    // wheel Debian ships for venvs: the image has no pip of its own).
    let (code, pip) = run(
        &sb,
        &[
            "sh",
            "-c",
            &format!(
                "python3 $(ls /usr/share/python-wheels/pip-*.whl)/pip install -q \
                 --disable-pip-version-check --no-cache-dir --target /tmp/t \
                 --index-url https://u:$TOKEN@{a}/simple tinypkg && \
                 PYTHONPATH=/tmp/t python3 -c 'import tinypkg; print(tinypkg.VALUE)'"
            ),
        ],
        &[],
    )
    .await;
    assert_eq!(code, 0, "{pip}");
    assert!(pip.contains("installed through a secret"), "{pip}");
    // The guest's own store trusts the sandbox's CA too (programs that read no variable).
    let (code, store) = run(
        &sb,
        &[
            "python3",
            "-c",
            "a = open('/run/forkbox-host-ca.crt').read()\n\
             ca = a[a.rindex('-----BEGIN CERTIFICATE-----'):].strip()\n\
             print('in store' if ca in open('/etc/ssl/certs/ca-certificates.crt').read() else 'missing')",
        ],
        &[],
    )
    .await;
    assert!(code == 0 && store.contains("in store"), "{store}");

    // A fork given the secret gets a placeholder of its own; one given none carries nothing
    // (the parent's placeholder goes out as it is).
    let fork = |secrets: Vec<SecretSpec>| {
        let engine = &engine;
        let source = v.info.id.clone();
        async move {
            let f = engine
                .call(ops::Fork {
                    source,
                    request: ForkRequest {
                        count: 1,
                        labels: Default::default(),
                        ttl_seconds: None,
                        max_processes: None,
                        network: None,
                        node: None,
                        secrets,
                        ..Default::default()
                    },
                })
                .await
                .unwrap();
            assert_eq!(f.sandboxes.len(), 1, "{:?}", f.failed);
            engine.sandbox(&f.sandboxes[0].info.id).await.unwrap()
        }
    };
    let with = fork(vec![secret.clone()]).await;
    let out = requests(&with, &a, &b, None).await;
    let own = placeholder_in(&out);
    assert_ne!(own, placeholder, "a copy has its own placeholder");
    assert!(out.contains("bearer ok"), "{out}");
    let without = fork(Vec::new()).await;
    let out = requests(&without, &a, &b, Some(&placeholder)).await;
    assert!(
        out.contains(&format!(
            "https://{a}/bearer 401 bad bearer: Bearer {placeholder}"
        )),
        "{out}"
    );

    // A secret that sets a header (E2B's network rules): the guest sends what it likes and
    // holds no placeholder; the host sets the whole header on the secret's host alone.
    let header = fork(vec![SecretSpec {
        name: "E2B_RULE_1".into(),
        hosts: vec![a.clone()],
        value: format!("Bearer {value}"),
        header: Some("Authorization".into()),
    }])
    .await;
    // (Letters and digits alone: the test's server reads a bearer as base64 too.)
    let out = requests(&header, &a, &b, Some("sentbyguest1")).await;
    assert!(
        out.contains(&format!("https://{a}/bearer bearer ok")),
        "{out}"
    );
    assert!(
        out.contains(&format!("https://{b}/echo got: Bearer sentbyguest1")),
        "{out}"
    );
    let (_, env) = run(&header, &["sh", "-c", "env; cat /proc/1/environ"], &[]).await;
    assert!(!env.contains("E2B_RULE") && !env.contains(&value), "{env}");

    // A snapshot of the sandbox (its RAM file, its disk) and every file the run wrote under
    // its home and its RAM files' place in /dev/shm: the value is in none of them.
    engine
        .call(ops::Snapshot {
            id: v.info.id.clone(),
            request: Default::default(),
        })
        .await
        .unwrap();
    let shm = forkbox_engine::fastram::place(&paths).map(|p| p.root().to_path_buf());
    let mut dirs = vec![paths.home()];
    dirs.extend(shm.as_deref());
    let found = holding(&dirs, started, value.as_bytes());
    assert!(found.is_empty(), "the value is in {found:?}");
    for id in [
        with.info().id.clone(),
        without.info().id.clone(),
        header.info().id.clone(),
        v.info.id,
    ] {
        engine.call(ops::Delete { id }).await.unwrap();
    }
}
