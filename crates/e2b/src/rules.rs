//! E2B's per-domain network rules (a create's `network.rules`: a domain → `[{"transform":
//! {"headers": {NAME: VALUE}}}]`) as forkbox secrets that set a header: the host sets each
//! header on the sandbox's HTTPS requests to that domain, replacing what the guest sent, its
//! value with the key's secrets put in (`Secret.fill(name)`: `${e2b.secrets.NAME}`). The guest
//! never holds the value, nor a placeholder of it; the sandbox's view names the header alone.
//!
//! As E2B says of its rules, a domain named here is not thereby allowed: a rule for a domain
//! the sandbox's network does not reach is kept out (its requests never leave). forkbox
//! terminates TLS to set headers, so they go on HTTPS requests; a plain-HTTP request goes out
//! as the guest sent it (no secret travels in clear).

use forkbox_api::{entry_matches, NetworkPolicy, SecretSpec, MAX_SECRETS};
use serde_json::Value;

use crate::errors::Failure;
use crate::E2b;

/// Whether `policy` lets the sandbox reach `domain` over HTTPS.
fn reached(policy: &NetworkPolicy, domain: &str) -> bool {
    let listed = |entries: &[String]| entries.iter().any(|e| entry_matches(e, domain, 443));
    listed(&policy.allow) || (policy.internet && !listed(&policy.deny))
}

fn bad(domain: &str, what: &str) -> Failure {
    Failure::new(400, format!("network rule for {domain:?}: {what}"))
}

/// The header secrets of `rules` (a create's `network.rules`) for `owner`'s sandbox whose
/// network is `policy`.
pub(crate) fn header_secrets(
    e: &E2b,
    owner: &str,
    rules: Option<&Value>,
    policy: &NetworkPolicy,
) -> Result<Vec<SecretSpec>, Failure> {
    let Some(rules) = rules.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let rules = rules
        .as_object()
        .ok_or_else(|| Failure::new(400, "network.rules: an object of domains"))?;
    let mut specs = Vec::new();
    for (domain, list) in rules {
        let list = list
            .as_array()
            .ok_or_else(|| bad(domain, "a list of rules"))?;
        for rule in list {
            let headers = headers_of(domain, rule)?;
            if !reached(policy, domain) {
                continue;
            }
            for (name, value) in headers {
                specs.push(SecretSpec {
                    name: format!("E2B_RULE_{}", specs.len() + 1),
                    hosts: vec![domain.clone()],
                    value: crate::secrets::resolve(e, owner, value)?,
                    header: Some(name.clone()),
                });
            }
        }
    }
    if specs.len() > MAX_SECRETS {
        return Err(Failure::new(
            400,
            format!("network.rules: at most {MAX_SECRETS} headers in all"),
        ));
    }
    forkbox_api::validate_secrets(&specs)
        .map_err(|err| Failure::new(400, format!("network.rules: {err}")))?;
    Ok(specs)
}

/// A rule's `transform.headers`, checked: a rule that asks for more is refused, naming it.
fn headers_of<'a>(domain: &str, rule: &'a Value) -> Result<Vec<(&'a String, &'a str)>, Failure> {
    let o = rule
        .as_object()
        .ok_or_else(|| bad(domain, "each rule is an object"))?;
    if let Some(k) = o.keys().find(|k| *k != "transform") {
        return Err(bad(
            domain,
            &format!("`{k}` is not answered (only `transform.headers`)"),
        ));
    }
    let Some(t) = o.get("transform").filter(|t| !t.is_null()) else {
        return Ok(Vec::new());
    };
    let t = t
        .as_object()
        .ok_or_else(|| bad(domain, "`transform` is an object"))?;
    if let Some(k) = t.keys().find(|k| *k != "headers") {
        return Err(bad(
            domain,
            &format!("transform `{k}` is not answered (only `headers`)"),
        ));
    }
    let Some(h) = t.get("headers").and_then(Value::as_object) else {
        return Ok(Vec::new());
    };
    h.iter()
        .map(|(k, v)| {
            let v = v
                .as_str()
                .ok_or_else(|| bad(domain, &format!("header {k}: a string")))?;
            if v.contains("${e2b.identity.") {
                return Err(Failure::unsupported(
                    "workload identity tokens (`${e2b.identity.…}` in a network rule)",
                ));
            }
            Ok((k, v))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_counts_only_where_the_network_reaches() {
        let open = NetworkPolicy {
            internet: true,
            ..NetworkPolicy::default()
        };
        let closed = NetworkPolicy {
            internet: false,
            allow: vec!["api.example.com".into()],
            deny: vec![],
        };
        let denied = NetworkPolicy {
            internet: true,
            allow: vec![],
            deny: vec!["api.example.com".into()],
        };
        assert!(reached(&open, "api.example.com"));
        assert!(reached(&closed, "api.example.com"));
        assert!(!reached(&closed, "other.example.com"));
        assert!(!reached(&denied, "api.example.com"));
    }

    #[test]
    fn rules_asking_for_more_than_headers_are_refused() {
        let rule = serde_json::json!({"transform": {"headers": {"X-A": "1"}}});
        assert_eq!(headers_of("d", &rule).unwrap().len(), 1);
        let more = serde_json::json!({"transform": {"body": "x"}});
        assert!(headers_of("d", &more).unwrap_err().message.contains("body"));
        let iam =
            serde_json::json!({"transform": {"headers": {"A": "${e2b.identity.tokens.aws}"}}});
        assert!(headers_of("d", &iam).is_err());
    }
}
