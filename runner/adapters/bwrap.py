"""bubblewrap: mount namespaces with bind mounts (PEERS.md strict line)."""

from __future__ import annotations

import os

from ..policy import Policy
from .base import Adapter, Context, Unsupported, first_unsupported, path_kind, which

SUPPORTED = {
    "writable_roots", "read_denies", "read_allows", "read_scope", "write_denies",
    "isolate_pids", "isolate_process_info", "inherit_env", "env_passthrough", "private_tmp",
}
REASONS = {
    "local_ports": "--unshare-all gives an empty network namespace; --share-net would grant every port",
    "allow_domains": "no egress proxy",
    "harden_syscalls": "--seccomp takes a compiled BPF program, not a documented strict preset",
    "max_processes": "no process limit",
    "materialize_absent_handoff": "cannot place a deny on a path that does not exist",
    "deny_unix": "path unix sockets stay reachable through bind mounts",
    "broker": "no credential broker",
}


class Bwrap(Adapter):
    name = "bwrap"

    def binary(self) -> str | None:
        return which("bwrap")

    def parse_version(self, lines: list[str]) -> str:
        return lines[0].replace("bubblewrap", "").strip() if lines else "unknown"

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        a = [self.binary() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        if policy.read_scope == "granted":
            a += ["--tmpfs", "/"]
            for p in ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64"):
                kind = path_kind(p)
                if kind == "symlink":
                    a += ["--symlink", os.readlink(p), p]
                elif kind == "dir":
                    a += ["--ro-bind", p, p]
        else:
            a += ["--ro-bind", "/", "/"]
        a += ["--proc", "/proc", "--dev", "/dev"]
        if policy.private_tmp:
            a += ["--tmpfs", "/tmp"]
        for root in policy.writable_roots:
            a += ["--bind", root, root]
        for p in policy.read_denies:
            kind = path_kind(p)
            if kind == "dir":
                a += ["--tmpfs", p]
            elif kind in ("file", "symlink"):
                a += ["--ro-bind", "/dev/null", p]
            # an absent path has nothing to hide
        for p in policy.read_allows:
            if os.path.lexists(p):
                a += ["--ro-bind", p, p]
        for p in policy.write_denies:
            if os.path.lexists(p):
                a += ["--ro-bind", p, p]
        if not policy.inherit_env:
            a += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
            if ctx is not None:
                for name in policy.env_passthrough:
                    if name in ctx.launch_env:
                        a += ["--setenv", name, ctx.launch_env[name]]
        a += ["--chdir", workdir, "--", "/bin/sh", "-c", cmd]
        return a
