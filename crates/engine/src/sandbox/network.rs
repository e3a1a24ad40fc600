//! A sandbox's network as the guest sees it: the policy in force, the CAs it trusts (the
//! host's bundle, the package cache's, its secrets'), and its secrets.

use super::*;

impl Sandbox {
    /// Applies a network policy (see [`crate::net`]): from now on the host opens the guest
    /// proxy's tunnels by it, and commands get the proxy in their environment.
    pub async fn set_network(&self, policy: crate::net::NetworkPolicy) -> Result<(), SandboxError> {
        policy.validate()?;
        let on = !policy.is_off();
        if let Err(e) = self.client.set_network(policy).await {
            return Err(died(e, &self.console, self.client.failure()).await);
        }
        // With a network, the guest trusts what the host trusts (a host behind a
        // TLS-inspecting proxy reaches registries through it; the bundle is public), and the
        // package cache's CA when registries go through it.
        if on {
            let secrets = self.client.net.secrets();
            self.trust(&self.cas(secrets.as_deref())).await?;
        }
        Ok(())
    }

    /// The CAs of the host's own ends the guest trusts: the package cache's, and `secrets`'.
    fn cas(&self, secrets: Option<&crate::secrets::Secrets>) -> Vec<String> {
        let packages = self.client.net.packages();
        packages
            .iter()
            .map(|c| c.ca_pem())
            .chain(secrets.map(|s| s.ca_pem()))
            .map(str::to_string)
            .collect()
    }

    /// Writes the guest's bundle ([`crate::net::GUEST_CA`]): the host's CA bundle and `cas`,
    /// which also go into the guest's own store, for programs that read none of the variables
    /// (public certificates; an image without the store keeps the variables alone).
    async fn trust(&self, cas: &[String]) -> Result<(), SandboxError> {
        let mut bundle = crate::net::host_ca_bundle()
            .and_then(|p| std::fs::read(p).ok())
            .unwrap_or_default();
        for pem in cas {
            if !bundle.is_empty() && !bundle.ends_with(b"\n") {
                bundle.push(b'\n');
            }
            bundle.extend_from_slice(pem.as_bytes());
        }
        if bundle.is_empty() {
            return Ok(());
        }
        if let Err(e) = self
            .client
            .write_file(crate::net::GUEST_CA, &bundle, 0o644)
            .await
        {
            return Err(died(e, &self.console, self.client.failure()).await);
        }
        let Ok(mut store) = self.client.read_file(GUEST_STORE).await else {
            return Ok(());
        };
        let before = store.len();
        for pem in cas.iter().map(|p| p.as_bytes()) {
            if !store.windows(pem.len()).any(|w| w == pem) {
                if !store.is_empty() && !store.ends_with(b"\n") {
                    store.push(b'\n');
                }
                store.extend_from_slice(pem);
            }
        }
        if store.len() != before {
            if let Err(e) = self.client.write_file(GUEST_STORE, &store, 0o644).await {
                tracing::info!("{}: a CA is not in the guest's store: {e}", self.info.id);
            }
        }
        Ok(())
    }

    /// Gives the sandbox `secrets` (see [`crate::secrets`]): its connections to their hosts
    /// end at a listener of its own, and the guest trusts the sandbox's CA (with the host's
    /// bundle) from now on. Call after [`Sandbox::set_network`] with a policy that allows the
    /// hosts.
    pub async fn set_secrets(
        &self,
        secrets: std::sync::Arc<crate::secrets::Secrets>,
    ) -> Result<(), SandboxError> {
        let proxy = crate::secrets::SecretProxy::start(secrets.clone())
            .await
            .map_err(|e| SandboxError::io("listen for the secrets' connections", e))?;
        self.trust(&self.cas(Some(&secrets))).await?;
        self.client
            .net
            .set_secrets(Some(std::sync::Arc::new(proxy)));
        Ok(())
    }

    /// The secrets in force.
    pub fn secrets(&self) -> Option<std::sync::Arc<crate::secrets::Secrets>> {
        self.client.net.secrets()
    }

    /// The network policy in force.
    pub fn network(&self) -> crate::net::NetworkPolicy {
        self.client.net.policy()
    }
}
