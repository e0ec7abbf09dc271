//! Reading a policy file: TOML or JSON (same fields, same validation), from
//! a path, `/dev/fd/N` or standard input (`--config -`), with size strings
//! (`max_memory = "512M"`) and `~` in paths.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer};

use crate::policy::{ConfigFile, PolicyError};

/// Policy files are small; a bigger one is a mistake (or /dev/zero).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// How a policy file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Toml,
    Json,
}

/// The format of `text` read from `path`: by extension, else by its first
/// character (a JSON policy is an object; TOML never starts with `{`).
pub fn detect(path: &Path, text: &str) -> Format {
    match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        Some("toml") => Format::Toml,
        _ if text.trim_start().starts_with('{') => Format::Json,
        _ => Format::Toml,
    }
}

/// Reads and parses the policy file named by `--config ARG`; `-` reads
/// `stdin`. `home` expands a leading `~` in the file's paths.
pub fn load(arg: &Path, stdin: impl Read, home: Option<&Path>) -> Result<ConfigFile, PolicyError> {
    let read_error = |source| PolicyError::ReadConfig {
        path: arg.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    if arg == Path::new("-") {
        stdin
            .take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
    } else {
        std::fs::File::open(arg)
            .and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut bytes))
            .map_err(read_error)?;
    }
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(PolicyError::ParseConfig {
            path: arg.to_path_buf(),
            message: "larger than 1 MiB; a policy file is a few lines".into(),
        });
    }
    let text = String::from_utf8(bytes).map_err(|_| PolicyError::ParseConfig {
        path: arg.to_path_buf(),
        message: "not UTF-8 text".into(),
    })?;
    let mut file = parse(arg, &text)?;
    expand_home(&mut file, home)?;
    Ok(file)
}

/// Parses `text` as TOML or JSON (see [`detect`]).
pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, PolicyError> {
    match detect(path, text) {
        Format::Toml => ConfigFile::parse(path, text),
        Format::Json => serde_json::from_str(text).map_err(|e| PolicyError::ParseConfig {
            path: path.to_path_buf(),
            message: format!(
                "line {}, column {}: {}",
                e.line(),
                e.column(),
                strip_position(&e.to_string())
            ),
        }),
    }
}

/// serde_json appends " at line L column C"; we put the position first,
/// like the TOML errors.
fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(at) => &message[..at],
        None => message,
    }
}

/// Expands `~` and `~/...` to `home` in every path list of the file;
/// `~user` is refused (we do not look up other users' homes).
fn expand_home(file: &mut ConfigFile, home: Option<&Path>) -> Result<(), PolicyError> {
    let fields = &mut file.policy;
    for (name, list) in [
        ("writable_roots", &mut fields.writable_roots),
        ("read_denies", &mut fields.read_denies),
        ("read_allows", &mut fields.read_allows),
        ("write_denies", &mut fields.write_denies),
    ] {
        for entry in list.iter_mut() {
            if let Some(expanded) = expand_tilde(name, entry, home)? {
                *entry = expanded.to_string_lossy().into_owned();
            }
        }
    }
    Ok(())
}

/// `Some(path)` when `raw` starts with `~` and was expanded, `None` when it
/// has no `~` to expand.
pub fn expand_tilde(
    field: &str,
    raw: &str,
    home: Option<&Path>,
) -> Result<Option<PathBuf>, PolicyError> {
    let Some(rest) = raw.strip_prefix('~') else {
        return Ok(None);
    };
    if !(rest.is_empty() || rest.starts_with('/')) {
        return Err(PolicyError::Invalid(format!(
            "{field} entry {raw:?}: ~user is not expanded; write the absolute path"
        )));
    }
    let Some(home) = home.filter(|h| h.is_absolute()) else {
        return Err(PolicyError::Invalid(format!(
            "{field} entry {raw:?} starts with ~ but the agent's user has no absolute home (HOME, or under sudo or --user that user's passwd entry); write the absolute path"
        )));
    };
    Ok(Some(home.join(rest.trim_start_matches('/'))))
}

/// Parses a size: bytes, or a number with K, M or G (binary multiples).
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let raw = raw.trim();
    let (digits, unit) = raw.split_at(raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{raw:?} is not a size; write e.g. 512M"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        _ => return Err(format!("unknown unit in {raw:?}; use K, M or G")),
    };
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("{raw:?} is too large"))
}

/// serde helper: a size written as an integer or as a size string.
pub fn size<'de, D: Deserializer<'de>>(de: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Bytes(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(de)? {
        None => Ok(None),
        Some(Raw::Bytes(n)) => Ok(Some(n)),
        Some(Raw::Text(text)) => parse_size(&text)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("99999999999G").is_err());
    }

    #[test]
    fn toml_and_json_give_the_same_policy_with_size_strings() {
        let toml = "[policy]\nwritable_roots = [\"/tmp\"]\nmax_memory = \"512M\"\n";
        let json = r#"{"policy": {"writable_roots": ["/tmp"], "max_memory": "512M"}}"#;
        let a = parse(Path::new("-"), toml).unwrap();
        let b = parse(Path::new("-"), json).unwrap();
        assert_eq!(a.policy.max_memory, Some(512 << 20));
        assert_eq!(b.policy.max_memory, Some(512 << 20));
        assert_eq!(a.policy.writable_roots, b.policy.writable_roots);
        let bytes = parse(Path::new("p.json"), r#"{"policy":{"max_memory":1024}}"#).unwrap();
        assert_eq!(bytes.policy.max_memory, Some(1024));
    }

    #[test]
    fn json_errors_name_the_field_and_position() {
        let err = parse(Path::new("-"), "{\"policy\": {\"writable_rootz\": []}}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("writable_rootz"), "{err}");
        assert!(err.contains("line 1, column"), "{err}");
        let err = parse(Path::new("-"), "{\"policy\": {\"max_memory\": \"lots\"}}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a size"), "{err}");
    }

    #[test]
    fn tilde_expands_or_is_refused() {
        let home = Path::new("/home/u");
        assert_eq!(
            expand_tilde("f", "~/src", Some(home)).unwrap(),
            Some(PathBuf::from("/home/u/src"))
        );
        assert_eq!(
            expand_tilde("f", "~", Some(home)).unwrap(),
            Some(PathBuf::from("/home/u"))
        );
        assert_eq!(expand_tilde("f", "/abs", Some(home)).unwrap(), None);
        assert!(expand_tilde("f", "~bob/x", Some(home)).is_err());
        assert!(expand_tilde("f", "~/x", None).is_err());
        let mut file = parse(Path::new("-"), "[policy]\nread_denies = [\"~/.ssh\"]\n").unwrap();
        expand_home(&mut file, Some(home)).unwrap();
        assert_eq!(file.policy.read_denies, vec!["/home/u/.ssh".to_string()]);
    }

    #[test]
    fn stdin_is_read_for_dash() {
        let file = load(
            Path::new("-"),
            &b"{\"policy\":{\"isolate_pids\":true}}"[..],
            None,
        )
        .unwrap();
        assert_eq!(file.policy.isolate_pids, Some(true));
    }
}
