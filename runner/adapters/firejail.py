"""firejail (PEERS.md strict line: no profile, no network, read-only root)."""

from __future__ import annotations

from ..policy import Policy
from .base import Adapter, Context, first_unsupported, which

SUPPORTED = {
    "writable_roots", "read_denies", "write_denies", "isolate_pids", "isolate_process_info",
    "harden_syscalls", "max_processes", "private_tmp", "deny_unix", "inherit_env",
}
REASONS = {
    "read_allows": "--noblacklist only cancels other blacklist commands; no re-allow inside a denied tree",
    "read_scope": "--whitelist is limited to home and a few top-level directories",
    "local_ports": "--net=none gives no loopback route to the host; sharing the network grants every port",
    "allow_domains": "no egress proxy",
    "materialize_absent_handoff": "--blacklist/--read-only of an absent path is skipped",
    "broker": "no credential broker",
    "env_passthrough": "no clean environment to pass selected variables into",
}


class Firejail(Adapter):
    name = "firejail"

    def binary(self) -> str | None:
        return which("firejail")

    def parse_version(self, lines: list[str]) -> str:
        return lines[0].replace("firejail version", "").strip() if lines else "unknown"

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        if "inherit_env" in policy.explicit and not policy.inherit_env:
            from .base import Unsupported

            return Unsupported("inherit_env", "firejail passes the launcher's environment through")
        a = [self.binary() or "firejail", "--quiet", "--noprofile", "--net=none", "--read-only=/"]
        for root in policy.writable_roots:
            a.append(f"--read-write={root}")
        for p in policy.write_denies:
            a.append(f"--read-only={p}")
        for p in policy.read_denies:
            a.append(f"--blacklist={p}")
        a += ["--caps.drop=all", "--seccomp", "--nonewprivs"]
        if policy.harden_syscalls:
            a += ["--seccomp.block-secondary", "--memory-deny-write-execute"]
        if policy.deny_unix:
            a.append("--protocol=inet,inet6")
        if policy.private_tmp:
            a.append("--private-tmp")
        if policy.max_processes is not None:
            a.append(f"--rlimit-nproc={policy.max_processes}")
        a += [f"--private-cwd={workdir}", "--", "/bin/sh", "-c", cmd]
        return a
