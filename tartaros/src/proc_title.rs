//! A forked helper's own name in `/proc`: processes forked (not exec'd)
//! from the supervisor inherit its argument and environment areas, so
//! `/proc/<pid>/cmdline` (world-readable) showed the agent's command line
//! and `environ` the launcher's environment. The template's init and the
//! janitor overwrite both with a title of their own.

/// Overwrites this process's copy of its command line with `title` (a
/// NUL-terminated name) and zeroes its initial environment strings. Must
/// be called in a process that reads neither again (`std::env::args` and
/// `std::env::var` would see the new bytes). False when the areas cannot
/// be found.
pub fn retitle(title: &'static [u8]) -> bool {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    let Some((arg_start, arg_end, env_start, env_end)) = areas(&stat) else {
        return false;
    };
    // SAFETY: the kernel's bounds of this process's own argument and
    // environment strings on its stack, which are writable and which the
    // caller does not read again (documented contract).
    unsafe {
        if arg_end > arg_start {
            let len = arg_end - arg_start;
            std::ptr::write_bytes(arg_start as *mut u8, 0, len);
            let title_len = title.len().min(len);
            std::ptr::copy_nonoverlapping(title.as_ptr(), arg_start as *mut u8, title_len);
        }
        if env_end > env_start {
            std::ptr::write_bytes(env_start as *mut u8, 0, env_end - env_start);
        }
    }
    true
}

/// Fields 48 to 51 of `/proc/self/stat` (`arg_start`, `arg_end`,
/// `env_start`, `env_end`), counted after the command name, which may hold
/// spaces and parentheses.
fn areas(stat: &str) -> Option<(usize, usize, usize, usize)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let field = |n: usize| {
        rest.split_whitespace()
            .nth(n - 3)
            .and_then(|v| v.parse::<usize>().ok())
    };
    Some((field(48)?, field(49)?, field(50)?, field(51)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_areas_are_found_after_a_command_name_with_spaces_and_parentheses() {
        let mut stat = String::from("42 (a) (b c) S");
        for n in 4..=52 {
            stat.push_str(&format!(" {n}"));
        }
        assert_eq!(areas(&stat), Some((48, 49, 50, 51)));
    }

    #[test]
    fn a_short_stat_finds_nothing() {
        assert_eq!(areas("42 (a) S 1 2 3"), None);
    }
}
