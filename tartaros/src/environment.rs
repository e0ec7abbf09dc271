//! The agent's environment: minimal and clean by default, so that tokens in
//! the launcher's environment do not leak into the sandbox.

use std::path::{Path, PathBuf};

use crate::policy::Policy;

/// Variables a program needs to behave normally and that carry no secret.
pub const MINIMAL: &[&str] = &["PATH", "HOME", "TERM", "LANG"];
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Decides the agent's environment from the launcher's. The broker's secret
/// variables are removed in every mode, `--inherit-env` included.
pub fn agent_env(policy: &Policy, launcher: &[(String, String)]) -> Vec<(String, String)> {
    agent_env_with(policy, launcher, &[])
}

/// [`agent_env`] plus `--setenv` values, which win over inherited ones (the
/// proxy variables still win over both).
pub fn agent_env_with(
    policy: &Policy,
    launcher: &[(String, String)],
    setenv: &[(String, String)],
) -> Vec<(String, String)> {
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
    env.retain(|(name, _)| !setenv.iter().any(|(s, _)| s == name));
    env.extend(setenv.iter().cloned());
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

/// Where a shell would look for `program`: itself when it holds a `/`,
/// else each directory of `path` in order (an empty entry is the working
/// directory, as in POSIX), or the default PATH when there is none.
pub fn exec_candidates(program: &str, path: Option<&str>) -> Vec<PathBuf> {
    if program.contains('/') {
        return vec![PathBuf::from(program)];
    }
    if program.is_empty() {
        return Vec::new();
    }
    path.unwrap_or(DEFAULT_PATH)
        .split(':')
        .map(|dir| {
            if dir.is_empty() {
                PathBuf::from(program)
            } else {
                Path::new(dir).join(program)
            }
        })
        .collect()
}

/// Directories on the agent's PATH that exist on the host but that
/// `can_search` says the agent's user cannot reach (e.g. under a `0700`
/// /root), for the warning a root launcher gets.
pub fn unreachable_path_dirs(
    env: &[(String, String)],
    exists: &dyn Fn(&Path) -> bool,
    can_search: &dyn Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let Some((_, path)) = env.iter().find(|(k, _)| k == "PATH") else {
        return Vec::new();
    };
    path.split(':')
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .filter(|d| exists(d) && !can_search(d))
        .collect()
}

/// Whether `uid`/`gid` may search (execute) `dir` and every ancestor, by
/// the permission bits (no ACLs).
pub fn searchable_by(dir: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if uid == 0 {
        return true;
    }
    dir.ancestors().all(|a| {
        std::fs::metadata(a).is_ok_and(|m| {
            let mode = m.mode();
            if m.uid() == uid {
                mode & 0o100 != 0
            } else if m.gid() == gid {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            }
        })
    })
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

    #[test]
    fn setenv_wins_over_inherited_values() {
        let policy = Policy::default();
        let env = agent_env_with(
            &policy,
            &launcher(),
            &[("HOME".into(), "/w".into()), ("X".into(), "1".into())],
        );
        assert!(env.contains(&("HOME".into(), "/w".into())));
        assert!(env.contains(&("X".into(), "1".into())));
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
    }

    #[test]
    fn commands_are_looked_up_on_the_agents_path() {
        assert_eq!(
            exec_candidates("cargo", Some("/root/.cargo/bin:/usr/bin")),
            vec![
                PathBuf::from("/root/.cargo/bin/cargo"),
                PathBuf::from("/usr/bin/cargo")
            ]
        );
        assert_eq!(
            exec_candidates("./x", Some("/bin")),
            vec![PathBuf::from("./x")]
        );
        assert_eq!(exec_candidates("sh", None).len(), 6);
    }

    #[test]
    fn unreachable_path_entries_are_found() {
        let env = vec![(
            "PATH".to_string(),
            "/root/.cargo/bin:/usr/bin:rel".to_string(),
        )];
        let dirs = unreachable_path_dirs(&env, &|_| true, &|d| !d.starts_with("/root"));
        assert_eq!(dirs, vec![PathBuf::from("/root/.cargo/bin")]);
        assert!(searchable_by(Path::new("/usr/bin"), 65534, 65534));
    }
}
