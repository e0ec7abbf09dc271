"""sandlock (`cargo install sandlock-cli`): Landlock + seccomp supervisor."""

from __future__ import annotations

import os

from ..policy import GRANTED_SYSTEM_DIRS, Policy
from .base import Adapter, Context, first_unsupported, which

# isolate_pids / isolate_process_info: sandlock has no PID namespace, but by
# default it hides other processes' /proc entries and scopes signals with
# Landlock; the contracts check the effect (can the agent see or touch an
# outside process), so both are mapped to its defaults.
SUPPORTED = {
    "writable_roots", "read_denies", "read_allows", "read_scope", "local_ports", "allow_domains",
    "isolate_pids", "isolate_process_info", "max_processes", "inherit_env", "env_passthrough",
}
REASONS = {
    "write_denies": "--fs-deny also denies reads; Landlock cannot carve a read-only hole in a writable root",
    "harden_syscalls": "only --extra-deny-syscall groups (sysv_ipc); no strict preset",
    "materialize_absent_handoff": "no placeholder for absent denied paths",
    "private_tmp": "no private /tmp setting",
    "deny_unix": "no unix-socket switch",
    "broker": "credential injection needs its HTTPS MITM proxy, not a token-gated broker",
}


class Sandlock(Adapter):
    name = "sandlock"

    def binary(self) -> str | None:
        return os.environ.get("SANDLOCK_BIN") or which("sandlock") or (
            os.path.expanduser("~/.cargo/bin/sandlock") if os.path.exists(os.path.expanduser("~/.cargo/bin/sandlock")) else None)

    def parse_version(self, lines: list[str]) -> str:
        return lines[0].replace("sandlock", "").strip() if lines else "unknown"

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        a = [self.binary() or "sandlock", "run"]
        if policy.read_scope == "granted":
            for p in GRANTED_SYSTEM_DIRS:
                if os.path.lexists(p):
                    a += ["-r", p]
        else:
            a += ["-r", "/"]
        for p in policy.read_allows:
            a += ["-r", p]
        for root in policy.writable_roots:
            a += ["-w", root]
        for p in policy.read_denies:
            a += ["--fs-deny", p]
        for port in policy.local_ports:
            a += ["--net-allow", f"127.0.0.1:{port}", "--net-allow", f"[::1]:{port}"]
        for host in policy.allow_domains:
            a += ["--net-allow", f"{host}:80,443"]
        if policy.max_processes is not None:
            a += ["-P", str(policy.max_processes)]
        if not policy.inherit_env:
            a.append("--clean-env")
            if ctx is not None:
                for name in policy.env_passthrough:
                    if name in ctx.launch_env:
                        a += ["--env", f"{name}={ctx.launch_env[name]}"]
        a += ["--cwd", workdir, "--", "/bin/sh", "-c", cmd]
        return a
