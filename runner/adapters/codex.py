"""Codex's sandbox (`codex sandbox -P <profile>`, @openai/codex from npm)."""

from __future__ import annotations

import glob
import json
import os

from ..policy import GRANTED_SYSTEM_DIRS, Policy
from .base import PEER_CACHE, Adapter, Context, first_unsupported

# Mapped against 0.171's documented permission profiles
# (developers.openai.com/codex/permissions): filesystem entries "read" /
# "write" / "none", glob entries (deny only: "none"), and network domain
# rules, which are enforced only through its managed proxy
# (features.network_proxy = true; without it domain rules do not restrict
# direct access). Verified here: an absolute glob "none" denies the reads,
# a glob with "read" is rejected ("only supports deny"), direct connects
# bypassing the proxy fail, and a domain not listed gets 403.
SUPPORTED = {
    "writable_roots", "read_denies", "read_allows", "read_scope", "write_denies",
    "isolate_pids", "isolate_process_info", "inherit_env", "env_passthrough",
    "glob_read_denies", "allow_domains",
}
REASONS = {
    "local_ports": "network is on or off per profile; no per-port grant",
    "glob_denies": "glob entries of a profile only support \"none\" (deny reads), not read-only",
    "allow_unix_socket_paths": "not mapped: its unix_sockets rules apply through the managed proxy only",
    "harden_syscalls": "its seccomp filter is fixed; no stricter preset",
    "max_processes": "no process limit",
    "materialize_absent_handoff": "no placeholder for absent denied paths",
    "private_tmp": "no private /tmp setting",
    "deny_unix": "no unix-socket switch",
    "broker": "no credential broker",
}
NATIVE = "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"


def toml_str(s: str) -> str:
    return json.dumps(s)


class Codex(Adapter):
    name = "codex"

    def binary(self) -> str | None:
        env = os.environ.get("CODEX_BIN")
        if env:
            return env
        hits = glob.glob(str(PEER_CACHE / "npm/node_modules" / NATIVE))
        return hits[0] if hits else None

    def parse_version(self, lines: list[str]) -> str:
        return lines[0].replace("codex-cli", "").strip() if lines else "unknown"

    def profile(self, policy: Policy) -> str:
        fs: dict[str, str] = {}
        if policy.read_scope == "granted":
            for p in GRANTED_SYSTEM_DIRS:
                if os.path.lexists(p):
                    fs[p] = "read"
            # codex re-executes its own binary inside the sandbox (bwrap helper)
            b = self.binary()
            if b:
                fs[os.path.dirname(os.path.dirname(b))] = "read"
        else:
            fs["/"] = "read"
        for p in policy.read_allows:
            fs[p] = "read"
        for p in policy.read_denies:
            fs[p] = "none"
        for root in policy.writable_roots:
            fs[root] = "write"
        for p in policy.write_denies:
            fs[p] = "read"
        for p in policy.glob_read_denies:
            fs[p] = "none"
        lines = []
        if policy.allow_domains:
            # Domain rules hold only through the managed proxy. Not set:
            # allow_local_binding, which would also open loopback and private
            # addresses through the proxy (wider than the neutral policy).
            lines += ["[features]", "network_proxy = true", ""]
        lines += ["[permissions.strict.filesystem]"]
        lines += [f"{toml_str(k)} = {toml_str(v)}" for k, v in fs.items()]
        lines += ["", "[permissions.strict.network]"]
        if policy.allow_domains:
            domains = ", ".join(f"{toml_str(d)} = \"allow\"" for d in policy.allow_domains)
            lines += ["enabled = true", f"domains = {{ {domains} }}", ""]
        else:
            lines += ["enabled = false", ""]
        return "\n".join(lines)

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        scratch = self.scratch_of(ctx)
        home = os.path.join(scratch, "codex-home")
        os.makedirs(home, exist_ok=True)
        with open(os.path.join(home, "config.toml"), "w") as f:
            f.write(self.profile(policy))
        a = [self.binary() or "codex", "sandbox"]
        if policy.inherit_env:
            a += ["-c", "shell_environment_policy.inherit=all"]
        elif policy.env_passthrough:
            a += ["-c", "shell_environment_policy.inherit=all", "-c",
                  "shell_environment_policy.include_only=" + json.dumps(["PATH", *policy.env_passthrough])]
        else:
            a += ["-c", "shell_environment_policy.inherit=none"]
        a += ["-P", "strict", "-C", workdir, "--", "/bin/sh", "-c", cmd]
        return a

    def env(self, policy: Policy, ctx: Context) -> dict[str, str]:
        tmp = os.path.join(ctx.scratch, "codex-tmp")
        os.makedirs(tmp, exist_ok=True)
        return {"CODEX_HOME": os.path.join(ctx.scratch, "codex-home"), "TMPDIR": tmp}
