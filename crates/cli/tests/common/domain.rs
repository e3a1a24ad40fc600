//! E2B's domain mode for a test: a daemon on port 443 of the host's end of a network namespace
//! of the test's own, answering `api.DOMAIN` and `PORT-ID.DOMAIN` over TLS with its own CA's
//! certificate, and inside the namespace a `dnsmasq` resolving `*.DOMAIN` to it. Programs run
//! in the namespace with only `E2B_DOMAIN` and a key, trusting the system's roots and the CA.

use std::path::{Path, PathBuf};
use std::process::Command;

use forkbox_test_infra as infra;

use super::Daemon;

pub struct DomainMode {
    /// The daemon, on `HOST_IP:443` with `--e2b-domain DOMAIN`.
    pub daemon: Daemon,
    pub domain: String,
    /// `dnsmasq`'s log of the queries it answered.
    pub dns_log: PathBuf,
    /// The system's roots and the daemon's CA, for `SSL_CERT_FILE`.
    pub bundle: PathBuf,
    _resolv: Cleanup,
    net: infra::TestNet,
}

impl DomainMode {
    /// A daemon of isolated home `name` answering E2B's domain `domain` in a namespace.
    pub fn start(name: &str, domain: &str) -> DomainMode {
        let mut net = infra::TestNet::new();
        let paths = infra::isolated_home(name);
        let listen = format!("{}:443", net.host_ip);
        let daemon = Daemon::start_on(paths, &listen, &["--e2b-domain", domain]);
        // A resolver of the namespace's own: *.DOMAIN is the daemon.
        let dns = net.peer_ips[0].clone();
        let home = daemon.paths.home().to_path_buf();
        let dns_log = home.join("dnsmasq.log");
        let _ = std::fs::remove_file(home.join("dnsmasq.pid"));
        net.run_server(
            "dnsmasq",
            &[
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                &format!("--listen-address={dns}"),
                &format!("--address=/{domain}/{}", net.host_ip),
                &format!("--pid-file={}", home.join("dnsmasq.pid").display()),
                "--log-queries",
                "--log-facility=-",
            ],
            &dns,
            53,
            &dns_log,
        );
        // `ip netns exec` puts /etc/netns/NAME/resolv.conf in place of /etc/resolv.conf.
        let etc = Path::new("/etc/netns").join(&net.name);
        std::fs::create_dir_all(&etc).unwrap();
        std::fs::write(etc.join("resolv.conf"), format!("nameserver {dns}\n")).unwrap();
        let mut bundle =
            std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
        bundle.push_str(&std::fs::read_to_string(home.join("e2b-tls/ca.pem")).unwrap());
        let bundle_file = home.join("trusted.pem");
        std::fs::write(&bundle_file, bundle).unwrap();
        DomainMode {
            daemon,
            domain: domain.to_string(),
            dns_log,
            bundle: bundle_file,
            _resolv: Cleanup(etc),
            net,
        }
    }

    /// `program` in the namespace with E2B's domain mode aimed at the daemon: `E2B_DOMAIN`,
    /// `key` as `E2B_API_KEY`, the CA trusted; no URL variable, no forkbox API.
    pub fn client(&self, program: &Path, key: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.net.name])
            .arg(program)
            .env("E2B_DOMAIN", &self.domain)
            .env("E2B_API_KEY", key)
            .env("SSL_CERT_FILE", &self.bundle)
            .env("NODE_EXTRA_CA_CERTS", &self.bundle)
            .env("REQUESTS_CA_BUNDLE", &self.bundle)
            .env_remove("E2B_API_URL")
            .env_remove("E2B_SANDBOX_URL")
            .env_remove("E2B_DEBUG")
            .env_remove("FORKBOX_API")
            .stdin(std::process::Stdio::null());
        cmd
    }
}

/// Removes a directory when dropped.
struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
