"""TartarOS itself (`tartaros run --strict`). Conflict of interest: we build it."""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess

from ..policy import Policy
from .base import REPO_ROOT, Adapter, Context, RunResult

REFUSAL_EXIT = 78
# Neutral fields that have no flag, only a [policy] key of a --config file.
CONFIG_ONLY_FIELDS = ("glob_read_denies", "glob_denies", "allow_unix_socket_paths", "exec_allows", "tmpfs", "binds")


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {v!r} as TOML")


def broker_toml(broker: dict) -> str:
    """The [broker] table of a --config file (DESIGN.md section 2)."""
    lines = ["[broker]"]
    caps = broker.get("capability", [])
    for k, v in broker.items():
        if k != "capability":
            lines.append(f"{k} = {toml_value(v)}")
    for cap in caps:
        lines += ["", "[[broker.capability]]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in cap.items()]
    return "\n".join(lines) + "\n"


class Tartaros(Adapter):
    name = "tartaros"
    conflict_of_interest = True
    has_effect_log = True
    own_cgroup = True
    agent_uid = 65534  # nobody: the launcher env has no SUDO_UID

    def binary(self) -> str | None:
        env = os.environ.get("TARTAROS_BIN")
        if env:
            return env
        # target/release or target/debug, whichever was built last
        found = [p for p in (REPO_ROOT / "target" / sub / "tartaros" for sub in ("release", "debug")) if p.exists()]
        if not found:
            return None
        return str(max(found, key=lambda p: p.stat().st_mtime))

    def parse_version(self, lines: list[str]) -> str:
        for line in lines:
            m = re.search(r"\d+\.\d+\.\d+\S*", line)
            if m:
                return m.group(0)
        return lines[0] if lines else "unknown"

    def status_channel(self) -> bool:
        return supports_status_fd(self.binary())

    def wants_start_marker(self) -> bool:
        # Without a status channel, "the agent never started" is the only
        # refusal evidence the agent cannot fake.
        return not self.status_channel()

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        a = [self.binary() or "tartaros", "run"]
        if not (ctx is not None and ctx.best_effort):
            a.append("--strict")
        if ctx is not None and ctx.status_fd is not None:
            a += ["--status-fd", str(ctx.status_fd)]
        for p in policy.writable_roots:
            a += ["--write", p]
        for p in policy.read_denies:
            a += ["--read-deny", p]
        for p in policy.read_allows:
            a += ["--read-allow", p]
        if policy.read_scope in ("granted", "none"):
            a += ["--read-scope", policy.read_scope]
        for p in policy.write_denies:
            a += ["--write-deny", p]
        for port in policy.local_ports:
            a += ["--port", str(port)]
        for host in policy.allow_domains:
            a += ["--allow-domain", host]
        if policy.isolate_pids:
            a.append("--isolate-pids")
        if policy.isolate_process_info:
            a.append("--isolate-proc")
        if policy.harden_syscalls:
            a.append("--seccomp-strict")
        if policy.materialize_absent_handoff:
            a.append("--materialize")
        if policy.max_processes is not None:
            a += ["--max-procs", str(policy.max_processes)]
        if policy.max_memory is not None:
            a += ["--max-memory", str(policy.max_memory)]
        if policy.inherit_env:
            a.append("--inherit-env")
        for name in policy.env_passthrough:
            a += ["--env", name]
        if policy.private_tmp:
            a.append("--private-tmp")
        if policy.deny_unix:
            a.append("--deny-unix")
        # Fields without a flag go to a --config file, where TartarOS decides
        # (today it refuses the globs and the unix allow-list with 78).
        config_only = {name: getattr(policy, name) for name in CONFIG_ONLY_FIELDS if getattr(policy, name)}
        if policy.broker is not None or config_only:
            path = os.path.join(self.scratch_of(ctx), "tartaros-config.toml")
            with open(path, "w") as f:
                if config_only:
                    f.write("[policy]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in config_only.items()))
                if policy.broker is not None:
                    f.write(broker_toml(policy.broker))
            a += ["--config", path]
        if ctx is not None and ctx.log:
            a += ["--log", ctx.log]
        if ctx is not None and ctx.start_marker:
            # The marker goes into the first writable root (the only place
            # the agent can create it); with no root, there is no marker and
            # the refusal signature alone decides.
            if policy.writable_roots:
                ctx.start_marker = os.path.join(policy.writable_roots[0], os.path.basename(ctx.start_marker))
                # its own line, so that the contract's command stays intact
                cmd = f": 2>/dev/null > {shlex.quote(ctx.start_marker)}\n{cmd}"
            else:
                ctx.start_marker = None
        a += ["--", "/bin/sh", "-c", cmd]
        return a

    def refusal(self, result: RunResult) -> bool:
        """A refusal is read from the status channel (`refused` and no
        `started`); without one, exit 78 with a `tartaros:` line counts only
        when the agent never started (no start marker). The agent can print
        `tartaros: ...` and exit 78 itself."""
        if result.status_events is not None:
            events = [e.get("event") for e in result.status_events]
            return "refused" in events and "started" not in events
        signature = result.returncode == REFUSAL_EXIT and any(
            line.startswith("tartaros:") for line in result.stderr.splitlines()
        )
        return signature and result.agent_started is not True

    def verify_log(self, path: str) -> tuple[int | None, str]:
        """`tartaros log verify FILE`: 0 ok, 1 tampered, 2 unsealed, 3 incomplete."""
        try:
            out = subprocess.run([self.binary() or "tartaros", "log", "verify", path], capture_output=True,
                                 text=True, timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            return None, str(e)
        return out.returncode, (out.stdout + out.stderr).strip()


@functools.lru_cache(maxsize=8)
def supports_status_fd(binary: str | None) -> bool:
    """Whether this build has `--status-fd` (the harness status channel)."""
    forced = os.environ.get("TARTAROS_LAB_STATUS_FD")
    if forced in ("0", "1"):
        return forced == "1"
    if not binary:
        return False
    try:
        out = subprocess.run([binary, "run", "--help"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--status-fd" in out.stdout + out.stderr
