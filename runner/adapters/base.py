"""Adapter interface: one neutral policy -> one sandbox's command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..policy import GRANTED_SYSTEM_DIRS, Policy

REPO_ROOT = Path(__file__).resolve().parents[2]
PEER_CACHE = Path(os.environ.get("TARTAROS_PEERS", str(Path.home() / ".cache" / "tartaros" / "peers")))


@dataclass(frozen=True)
class Unsupported:
    """A policy field this sandbox cannot express with its own settings."""

    field: str
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}" if self.reason else self.field


@dataclass
class Context:
    """Per-run facts an adapter may need besides the policy."""

    scratch: str  # a private directory for config files the adapter writes
    log: str | None = None  # effect log path, when the contract checks one
    launch_env: dict[str, str] = field(default_factory=dict)  # the launcher's environment
    # The write end of the harness's status pipe (when status_channel() is
    # true): the sandbox's supervisor writes JSON lines there, the agent
    # cannot reach it.
    status_fd: int | None = None
    # A host path inside a writable root that the command creates first
    # (when start_marker() is true): its presence proves the agent started.
    start_marker: str | None = None
    # Run in the sandbox's best-effort mode, where it has one (contract key
    # `best_effort`), instead of the strictest settings.
    best_effort: bool = False


@dataclass
class RunResult:
    returncode: int | None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    # JSON objects read from the status channel; None when there was none.
    status_events: list[dict] | None = None
    # Whether the start marker appeared; None when no marker was used.
    agent_started: bool | None = None


class Adapter:
    name = "base"
    adapter_version = "1"
    conflict_of_interest = False
    has_effect_log = False
    # The sandbox manages its own cgroup; the runner must not put it in one.
    own_cgroup = False
    # The uid the agent runs as when the runner (root) launches the sandbox:
    # setup files with `uid = "agent"` belong to it ("a file the agent's
    # user owns"). Peers keep the launcher's uid.
    agent_uid = 0

    # --- discovery -------------------------------------------------------
    def binary(self) -> str | None:
        raise NotImplementedError

    def available(self) -> bool:
        b = self.binary()
        return bool(b) and os.access(b, os.X_OK)

    def version(self) -> str:
        b = self.binary()
        if not b:
            return "not installed"
        try:
            out = subprocess.run(
                [b, *self.version_args()], capture_output=True, text=True, timeout=20,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"unknown ({e})"
        text = (out.stdout.strip() or out.stderr.strip()).splitlines()
        return self.parse_version(text)

    def version_args(self) -> list[str]:
        return ["--version"]

    def parse_version(self, lines: list[str]) -> str:
        return lines[0].strip() if lines else "unknown"

    # --- mapping -----------------------------------------------------------
    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None) -> list[str] | Unsupported:
        raise NotImplementedError

    def env(self, policy: Policy, ctx: Context) -> dict[str, str]:
        """Extra variables for the launcher's environment (not the agent's)."""
        return {}

    def refusal(self, result: RunResult) -> bool:
        """Whether the sandbox itself refused the run. Read it only from what
        the agent cannot forge (a status channel, the absence of any agent
        start), never from the agent's exit code or output alone."""
        return False

    def status_channel(self) -> bool:
        """True when argv() passes ctx.status_fd to the sandbox."""
        return False

    def wants_start_marker(self) -> bool:
        """True when argv() makes the command create ctx.start_marker first."""
        return False

    def cleanup(self, ctx: Context) -> None:
        """Undo host-side preparation done in argv() (after the run)."""

    # --- helpers -------------------------------------------------------------
    @staticmethod
    def scratch_of(ctx: Context | None) -> str:
        if ctx is not None:
            return ctx.scratch
        return tempfile.mkdtemp(prefix="lab-adapter-")


def which(name: str) -> str | None:
    return shutil.which(name, path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:"
                        + os.environ.get("PATH", ""))


def first_unsupported(policy: Policy, supported: set[str], reasons: dict[str, str] | None = None) -> Unsupported | None:
    """The first field the policy sets that is not in `supported`."""
    reasons = reasons or {}
    for name in policy.set_fields():
        if name not in supported:
            return Unsupported(name, reasons.get(name, "no setting of this sandbox expresses it"))
    # read_scope = "none" is a value an adapter must map on purpose: one that
    # knows only all/granted would widen it silently.
    if policy.read_scope == "none" and "read_scope=none" not in supported:
        return Unsupported("read_scope", reasons.get("read_scope=none", 'no setting expresses read_scope = "none"'))
    return None


def granted_read_paths(policy: Policy) -> list[str]:
    """What read_scope = granted leaves readable."""
    out = [p for p in GRANTED_SYSTEM_DIRS if os.path.lexists(p)]
    return out + list(policy.writable_roots) + list(policy.read_allows)


def path_kind(path: str) -> str:
    """'dir', 'file', 'symlink' or 'absent' (without following the last symlink)."""
    if os.path.islink(path):
        return "symlink"
    if os.path.isdir(path):
        return "dir"
    if os.path.exists(path):
        return "file"
    return "absent"
