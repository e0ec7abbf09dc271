//! The agent's environment: minimal and clean by default, so that tokens in
//! the launcher's environment do not leak into the sandbox.

use crate::policy::Policy;

/// Variables a program needs to behave normally and that carry no secret.
pub const MINIMAL: &[&str] = &["PATH", "HOME", "TERM", "LANG"];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Decides the agent's environment from the launcher's. The broker's secret
/// variables are removed in every mode, `--inherit-env` included.
pub fn agent_env(policy: &Policy, launcher: &[(String, String)]) -> Vec<(String, String)> {
    let secrets: Vec<&str> = policy
        .broker
        .iter()
        .flat_map(|b| {
            std::iter::once(b.token_env.as_str())
                .chain(b.capabilities.iter().map(|c| c.value_env.as_str()))
        })
        .collect();
    let wanted = |name: &str| {
        policy.inherit_env
            || MINIMAL.contains(&name)
            || policy.env_passthrough.iter().any(|n| n == name)
    };
    let mut env: Vec<(String, String)> = launcher
        .iter()
        .filter(|(name, _)| wanted(name) && !secrets.contains(&name.as_str()))
        .cloned()
        .collect();
    if !env.iter().any(|(name, _)| name == "PATH") {
        env.push(("PATH".into(), DEFAULT_PATH.into()));
    }
    // The proxy variables win over anything inherited.
    let proxy = crate::egress::proxy_env(policy);
    env.retain(|(name, _)| !proxy.iter().any(|(p, _)| p == name));
    env.extend(proxy);
    env.sort();
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::BrokerConfig;

    fn launcher() -> Vec<(String, String)> {
        [
            ("PATH", "/bin"),
            ("HOME", "/h"),
            ("AWS_SECRET", "s3cr3t"),
            ("TOK", "t0k"),
            ("EDITOR", "vi"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    #[test]
    fn minimal_by_default_with_passthrough() {
        let policy = Policy {
            env_passthrough: vec!["EDITOR".into()],
            ..Default::default()
        };
        let env = agent_env(&policy, &launcher());
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["EDITOR", "HOME", "PATH"]);
    }

    #[test]
    fn inherit_keeps_all_but_broker_secrets() {
        let policy = Policy {
            inherit_env: true,
            broker: Some(BrokerConfig {
                port: 1,
                auth_header: "X".into(),
                allowed_hosts: vec![],
                allow_internal: false,
                token_env: "TOK".into(),
                ca_file: None,
                capabilities: vec![],
            }),
            ..Default::default()
        };
        let env = agent_env(&policy, &launcher());
        assert!(env.iter().any(|(k, _)| k == "AWS_SECRET"));
        assert!(!env.iter().any(|(k, v)| k == "TOK" || v == "t0k"));
    }
}
