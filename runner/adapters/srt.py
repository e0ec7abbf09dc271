"""Anthropic sandbox-runtime (`srt -s settings.json`, npm)."""

from __future__ import annotations

import json
import os
import shlex

from ..policy import GRANTED_SYSTEM_DIRS, Policy
from .base import PEER_CACHE, Adapter, Context, Unsupported, first_unsupported

SUPPORTED = {
    "writable_roots", "read_denies", "read_allows", "read_scope", "write_denies",
    "allow_domains", "isolate_pids", "isolate_process_info", "deny_unix",
    # its denyRead/denyWrite take glob patterns (expanded before the sandbox
    # starts on Linux: test/sandbox/read-deny-glob.test.ts, glob-expand.test.ts)
    "glob_read_denies", "glob_denies",
}
REASONS = {
    "local_ports": "network goes through its proxies only; no per-port grant",
    "harden_syscalls": "its seccomp filter only covers unix sockets; no stricter preset",
    "max_processes": "no process limit",
    "materialize_absent_handoff": "no placeholder for absent denied paths",
    "private_tmp": "no private /tmp setting",
    "inherit_env": "passes the launcher's environment through",
    "env_passthrough": "passes the launcher's environment through",
    "broker": "credential masking works by sentinel substitution, not a token-gated broker",
}


class Srt(Adapter):
    name = "srt"

    def binary(self) -> str | None:
        env = os.environ.get("SRT_BIN")
        if env:
            return env
        p = PEER_CACHE / "npm/node_modules/.bin/srt"
        return str(p) if p.exists() else None

    def settings(self, policy: Policy) -> dict:
        deny_read = list(policy.read_denies) + list(policy.glob_read_denies)
        allow_read = list(policy.read_allows)
        if policy.read_scope == "granted":
            deny_read = ["/"] + deny_read
            allow_read = [p for p in GRANTED_SYSTEM_DIRS if os.path.lexists(p)] + list(policy.writable_roots) + allow_read
            # srt runs its own helpers (apply-seccomp) from its package directory
            b = self.binary()
            if b:
                allow_read.append(os.path.realpath(os.path.join(os.path.dirname(os.path.realpath(b)), "..")))
        s = {
            "network": {"allowedDomains": list(policy.allow_domains), "deniedDomains": []},
            "filesystem": {
                "denyRead": deny_read,
                "allowWrite": list(policy.writable_roots),
                "denyWrite": list(policy.write_denies) + list(policy.glob_denies),
            },
        }
        if allow_read:
            s["filesystem"]["allowRead"] = allow_read
        if policy.allow_domains:
            s["network"]["strictAllowlist"] = True
        return s

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        if "inherit_env" in policy.explicit and not policy.inherit_env:
            return Unsupported("inherit_env", REASONS["inherit_env"])
        scratch = self.scratch_of(ctx)
        path = os.path.join(scratch, "srt-settings.json")
        with open(path, "w") as f:
            json.dump(self.settings(policy), f)
        # srt runs the command string through a shell; cd first so the
        # agent starts in its work directory like in the other sandboxes.
        return [self.binary() or "srt", "-s", path, "-c", f"cd {shlex.quote(workdir)} && /bin/sh -c {shlex.quote(cmd)}"]
