//! What `log show` selects: kinds and kind groups, refusals or failures, a
//! process, a path glob and a time window. Pure functions over a record.

use serde_json::{Map, Value};

use super::names::{FILE_KINDS, NET_KINDS, Outcome, PROC_KINDS, outcome};
use crate::effectlog::EFFECT_KINDS;

/// A bound of `--since` / `--until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeBound {
    /// Nanoseconds after the genesis record (monotonic clock).
    Relative(u64),
    /// Wall time, ns since the Unix epoch.
    Wall(i128),
}

/// Errors in filter arguments (refusals of the command line: exit 78).
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("failed to read --kind {0:?}: not a record kind; use file, net, proc, gap or one of {kinds}", kinds = EFFECT_KINDS.join(", "))]
    Kind(String),
    #[error(
        "failed to read {flag} {value:?}: use seconds after the start (90, 1.5, 250ms) or an RFC 3339 time (2026-12-01T09:30:00Z)"
    )]
    Time { flag: &'static str, value: String },
}

/// Expands `--kind` values (several flags, or comma lists; groups `file`,
/// `net`, `proc`) into record kinds.
pub fn expand_kinds(values: &[String]) -> Result<Vec<String>, FilterError> {
    let mut kinds: Vec<String> = Vec::new();
    for value in values.iter().flat_map(|v| v.split(',')) {
        let value = value.trim();
        let group: &[&str] = match value {
            "file" => FILE_KINDS,
            "net" => NET_KINDS,
            "proc" => PROC_KINDS,
            k if EFFECT_KINDS.contains(&k) || matches!(k, "gap" | "genesis" | "seal") => &[][..],
            other => return Err(FilterError::Kind(other.to_string())),
        };
        if group.is_empty() {
            kinds.push(value.to_string());
        } else {
            kinds.extend(group.iter().map(|k| k.to_string()));
        }
    }
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// Parses `--since` / `--until`: seconds after genesis (`90`, `1.5`, `+2s`,
/// `250ms`) or an RFC 3339 time (`2026-12-01T09:30:00Z`, `...+01:00`).
pub fn parse_time(flag: &'static str, value: &str) -> Result<TimeBound, FilterError> {
    let err = || FilterError::Time {
        flag,
        value: value.to_string(),
    };
    let v = value.trim();
    if v.contains('T') || v.contains('t') {
        return rfc3339_ns(v).map(TimeBound::Wall).ok_or_else(err);
    }
    let v = v.strip_prefix('+').unwrap_or(v);
    let (number, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 1_000_000u64)
    } else {
        (v.strip_suffix('s').unwrap_or(v), 1_000_000_000u64)
    };
    decimal_ns(number, scale)
        .map(TimeBound::Relative)
        .ok_or_else(err)
}

/// `1.5` with `scale` ns per unit -> ns, without floats.
fn decimal_ns(number: &str, scale: u64) -> Option<u64> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !digits(int) || !digits(frac) || frac.len() > 9 {
        return None;
    }
    let whole: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut ns = whole.checked_mul(scale)?;
    let mut unit = scale;
    for d in frac.bytes() {
        unit /= 10;
        ns = ns.checked_add(u64::from(d - b'0') * unit)?;
    }
    Some(ns)
}

/// RFC 3339 (`YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`) to ns since the epoch.
pub(crate) fn rfc3339_ns(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut frac_ns: i128 = 0;
    if let Some(f) = rest.strip_prefix('.') {
        let end = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
        if end == 0 {
            return None;
        }
        let digits = &f[..end.min(9)];
        frac_ns = digits.parse::<i128>().ok()? * 10i128.pow(9 - digits.len() as u32);
        rest = &f[end..];
    }
    let offset_s: i64 = match rest {
        "Z" | "z" => 0,
        o => {
            // `get` never splits a character: any non-ASCII offset fails.
            let sign = o.get(..1)?;
            let (hh, colon, mm) = (o.get(1..3)?, o.get(3..4)?, o.get(4..)?);
            let two = |t: &str| t.len() == 2 && t.bytes().all(|c| c.is_ascii_digit());
            if !matches!(sign, "+" | "-") || colon != ":" || !two(hh) || !two(mm) {
                return None;
            }
            let off = hh.parse::<i64>().ok()? * 3600 + mm.parse::<i64>().ok()? * 60;
            if sign == "-" { -off } else { off }
        }
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    Some(i128::from(secs) * 1_000_000_000 + frac_ns)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Glob over a whole path: `*` matches within one `/`-separated segment,
/// `**` across segments, `?` one character (not `/`). Linear memory,
/// O(path × pattern) time, no backtracking blow-up.
pub fn glob_match(pattern: &str, path: &str) -> bool {
    #[derive(Clone, Copy)]
    enum Tok {
        Char(char),
        Any,
        Star,
        DoubleStar,
    }
    let mut toks = Vec::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        toks.push(match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                Tok::DoubleStar
            }
            '*' => Tok::Star,
            '?' => Tok::Any,
            c => Tok::Char(c),
        });
    }
    // reach[j]: the pattern prefix of length j matches the text so far.
    let mut reach = vec![false; toks.len() + 1];
    reach[0] = true;
    let close = |reach: &mut Vec<bool>| {
        for j in 0..toks.len() {
            if reach[j] && matches!(toks[j], Tok::Star | Tok::DoubleStar) {
                reach[j + 1] = true;
            }
        }
    };
    close(&mut reach);
    for c in path.chars() {
        let mut next = vec![false; toks.len() + 1];
        for j in 0..toks.len() {
            if !reach[j] {
                continue;
            }
            match toks[j] {
                Tok::Char(p) if p == c => next[j + 1] = true,
                Tok::Any if c != '/' => next[j + 1] = true,
                Tok::Star if c != '/' => next[j] = true,
                Tok::DoubleStar => next[j] = true,
                _ => {}
            }
        }
        close(&mut next);
        if !next.iter().any(|&r| r) {
            return false;
        }
        reach = next;
    }
    reach[toks.len()]
}

/// The paths a record names (for `--path`).
pub(crate) fn record_paths(rec: &Map<String, Value>) -> impl Iterator<Item = &str> {
    let target = rec.get("target").and_then(Value::as_object);
    ["path", "from", "to", "claimed_path", "target"]
        .into_iter()
        .filter_map(move |k| target.and_then(|t| t.get(k)).and_then(Value::as_str))
}

/// The selection of `log show`; empty fields select everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Record kinds (already expanded from groups).
    pub kinds: Vec<String>,
    /// Only refusals by the sandbox.
    pub denied: bool,
    /// Only ordinary failures (with `denied`: both).
    pub failed: bool,
    pub pid: Option<u32>,
    pub path: Option<String>,
    pub since: Option<TimeBound>,
    pub until: Option<TimeBound>,
}

impl Filter {
    /// Whether any filter is set (so a tree must be pruned).
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether `rec` is selected; `rel_ns` is its time after genesis.
    pub fn matches(&self, rec: &Map<String, Value>, rel_ns: Option<i128>) -> bool {
        let kind = rec.get("kind").and_then(Value::as_str).unwrap_or("");
        if !self.kinds.is_empty() && !self.kinds.iter().any(|k| k == kind) {
            return false;
        }
        if self.denied || self.failed {
            let o = outcome(rec);
            let refused = matches!(o, Outcome::Refused(_));
            let failed = o == Outcome::Failed;
            if !((self.denied && refused) || (self.failed && failed)) {
                return false;
            }
        }
        if let Some(p) = self.pid
            && rec.get("pid").and_then(Value::as_u64) != Some(u64::from(p))
        {
            return false;
        }
        if let Some(glob) = &self.path
            && !record_paths(rec).any(|p| glob_match(glob, p))
        {
            return false;
        }
        let wall = rec.get("wall_ns").and_then(Value::as_u64).map(i128::from);
        let inside = |bound: &TimeBound, after: bool| -> bool {
            let (t, b) = match bound {
                TimeBound::Relative(ns) => (rel_ns, i128::from(*ns)),
                TimeBound::Wall(ns) => (wall, *ns),
            };
            match t {
                Some(t) => {
                    if after {
                        t >= b
                    } else {
                        t <= b
                    }
                }
                None => false,
            }
        };
        if let Some(s) = &self.since
            && !inside(s, true)
        {
            return false;
        }
        if let Some(u) = &self.until
            && !inside(u, false)
        {
            return false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("/work/*.rs", "/work/a.rs"));
        assert!(!glob_match("/work/*.rs", "/work/src/a.rs"));
        assert!(glob_match("/work/**.rs", "/work/src/a.rs"));
        assert!(glob_match(
            "/work/**/hooks/*",
            "/work/.git/hooks/pre-commit"
        ));
        assert!(glob_match("**", "/anything/at/all"));
        assert!(glob_match("/etc/?asswd", "/etc/passwd"));
        assert!(!glob_match("/etc/?asswd", "/etc/passwd2"));
        let long = "a".repeat(100_000);
        assert!(!glob_match("*b*b*b*b*b", &long));
    }

    #[test]
    fn kinds_expand_and_unknown_ones_are_refused() {
        let k = expand_kinds(&["exec,net".into(), "open".into()]).unwrap();
        assert!(k.contains(&"proxy".to_string()) && k.contains(&"exec".to_string()));
        assert!(k.contains(&"open".to_string()) && !k.contains(&"fork".to_string()));
        assert!(
            expand_kinds(&["file".into()])
                .unwrap()
                .contains(&"unlink".to_string())
        );
        assert!(matches!(
            expand_kinds(&["files".into()]),
            Err(FilterError::Kind(_))
        ));
    }

    #[test]
    fn times_parse_relative_and_rfc3339() {
        assert_eq!(
            parse_time("--since", "90").unwrap(),
            TimeBound::Relative(90_000_000_000)
        );
        assert_eq!(
            parse_time("--since", "1.5s").unwrap(),
            TimeBound::Relative(1_500_000_000)
        );
        assert_eq!(
            parse_time("--since", "+250ms").unwrap(),
            TimeBound::Relative(250_000_000)
        );
        assert_eq!(
            parse_time("--until", "1970-01-02T00:00:01.5Z").unwrap(),
            TimeBound::Wall(86_401_500_000_000)
        );
        assert_eq!(
            parse_time("--until", "2026-12-01T10:00:00+01:00").unwrap(),
            parse_time("--until", "2026-12-01T09:00:00Z").unwrap()
        );
        assert_eq!(
            rfc3339_ns("2000-03-01T00:00:00Z"),
            Some(951_868_800_000_000_000)
        );
        for bad in [
            "2026-12-01T00:00:00+é:00",
            "2026-12-01T00:00:00+0é0",
            "2026-12-01T00:00:00+01:0",
            "",
            "abc",
            "1.2.3",
            "-5",
            "2026-13-01T00:00:00Z",
            "2026-12-01T00:00:00",
        ] {
            assert!(parse_time("--since", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn no_time_string_panics() {
        let base = "2026-12-01T09:30:00.123+01:00";
        for (i, _) in base.char_indices() {
            for c in ['é', '日', 'Z', ':', '.', '+', '9', ' ', '\u{0}'] {
                let mut s = base.to_string();
                s.replace_range(i..i + 1, &c.to_string());
                let _ = parse_time("--since", &s);
                let _ = parse_time("--since", &s[..i]);
            }
        }
    }

    #[test]
    fn refusals_failures_and_windows_select() {
        let rec = |v: Value| v.as_object().cloned().unwrap();
        let refused = rec(
            json!({"kind": "open", "decision": "denied", "errno": 13, "pid": 5,
            "wall_ns": 2_000, "target": {"path": "/etc/shadow"}}),
        );
        let failed = rec(
            json!({"kind": "mkdir", "decision": "denied", "errno": 17, "pid": 5,
            "target": {"path": "/work/x"}}),
        );
        let denied = Filter {
            denied: true,
            ..Default::default()
        };
        assert!(denied.matches(&refused, None) && !denied.matches(&failed, None));
        let failures = Filter {
            failed: true,
            ..Default::default()
        };
        assert!(!failures.matches(&refused, None) && failures.matches(&failed, None));
        let path = Filter {
            path: Some("/etc/*".into()),
            ..Default::default()
        };
        assert!(path.matches(&refused, None) && !path.matches(&failed, None));
        let window = Filter {
            since: Some(TimeBound::Relative(10)),
            until: Some(TimeBound::Wall(2_000)),
            ..Default::default()
        };
        assert!(window.matches(&refused, Some(10)));
        assert!(!window.matches(&refused, Some(9)));
        assert!(!window.matches(&failed, Some(10)), "no wall time: outside");
    }
}
