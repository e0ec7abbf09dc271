"""The neutral policy of a contract (DESIGN.md section 2)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

LIST_FIELDS = (
    "writable_roots",
    "read_denies",
    "read_allows",
    "write_denies",
    "local_ports",
    "allow_domains",
    "env_passthrough",
    "glob_read_denies",
    "glob_denies",
    "allow_unix_socket_paths",
    "exec_allows",
    "tmpfs",
    "binds",
)
BOOL_FIELDS = (
    "isolate_pids",
    "isolate_process_info",
    "harden_syscalls",
    "materialize_absent_handoff",
    "inherit_env",
    "private_tmp",
    "deny_unix",
)
# Fields a policy may carry; anything else in [policy] is a contract error.
INT_FIELDS = ("max_processes", "max_memory")
ALL_FIELDS = LIST_FIELDS + BOOL_FIELDS + INT_FIELDS + ("read_scope", "broker")

# The directories "read_scope = granted" keeps readable (DESIGN.md section 2),
# besides the writable roots and the read_allows.
GRANTED_SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/dev", "/proc")


READ_SCOPES = ("all", "granted", "none")


class PolicyError(ValueError):
    pass


@dataclass
class Policy:
    writable_roots: list[str] = field(default_factory=list)
    read_denies: list[str] = field(default_factory=list)
    read_allows: list[str] = field(default_factory=list)
    read_scope: str = "all"
    write_denies: list[str] = field(default_factory=list)
    local_ports: list[int] = field(default_factory=list)
    allow_domains: list[str] = field(default_factory=list)
    isolate_pids: bool = False
    isolate_process_info: bool = False
    harden_syscalls: bool = False
    materialize_absent_handoff: bool = False
    max_processes: int | None = None
    max_memory: int | None = None  # bytes
    inherit_env: bool = False
    env_passthrough: list[str] = field(default_factory=list)
    private_tmp: bool = False
    deny_unix: bool = False
    # Shell globs (`*`, `?`, `[...]`, `**`): reads denied / writes denied for
    # every match. DESIGN.md section 2: TartarOS refuses them until enforced.
    glob_read_denies: list[str] = field(default_factory=list)
    glob_denies: list[str] = field(default_factory=list)
    # Unix socket paths outside the roots the agent may still connect to.
    allow_unix_socket_paths: list[str] = field(default_factory=list)
    # Readable and executable under any read scope (read_scope = "none"
    # grants nothing else but the roots, tmpfs, binds and read_allows).
    exec_allows: list[str] = field(default_factory=list)
    # Fresh empty tmpfs mounts at these paths.
    tmpfs: list[str] = field(default_factory=list)
    # Read-only binds: [{ source = "/host/path", target = "/in/sandbox" }].
    binds: list[dict[str, str]] = field(default_factory=list)
    broker: dict[str, Any] | None = None
    # Fields the contract set explicitly. A field left at its default that a
    # sandbox cannot express does not make the contract unsupported, except
    # where the default itself is the guarantee under test (inherit_env).
    explicit: frozenset[str] = frozenset()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "Policy":
        unknown = set(raw) - set(ALL_FIELDS)
        if unknown:
            raise PolicyError(f"unknown policy field(s): {', '.join(sorted(unknown))}")
        kwargs: dict[str, Any] = {}
        for name in LIST_FIELDS:
            if name in raw:
                value = raw[name]
                if not isinstance(value, list):
                    raise PolicyError(f"{name} must be a list")
                kwargs[name] = list(value)
        for name in BOOL_FIELDS:
            if name in raw:
                if not isinstance(raw[name], bool):
                    raise PolicyError(f"{name} must be true or false")
                kwargs[name] = raw[name]
        if "read_scope" in raw:
            if raw["read_scope"] not in READ_SCOPES:
                raise PolicyError('read_scope must be "all", "granted" or "none"')
            kwargs["read_scope"] = raw["read_scope"]
        for name in INT_FIELDS:
            if name in raw:
                n = raw[name]
                if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                    raise PolicyError(f"{name} must be a positive integer")
                kwargs[name] = n
        for b in kwargs.get("binds", []):
            if not isinstance(b, dict) or set(b) != {"source", "target"}:
                raise PolicyError("each binds entry is a table with source and target")
        if "broker" in raw:
            if not isinstance(raw["broker"], dict):
                raise PolicyError("broker must be a table")
            kwargs["broker"] = raw["broker"]
        return cls(explicit=frozenset(raw), **kwargs)

    def is_set(self, name: str) -> bool:
        """True when the field asks for something beyond the neutral default."""
        value = getattr(self, name)
        default = {f.name: f for f in dataclasses.fields(self)}[name]
        if default.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            base = default.default_factory()  # type: ignore[misc]
        else:
            base = default.default
        return value != base or name in self.explicit and name == "inherit_env"

    def set_fields(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if f.name != "explicit" and self.is_set(f.name)]

    def expanded(self, expand) -> "Policy":
        """A copy with every string (and string-valued port) expanded."""

        def ex(v):
            if isinstance(v, str):
                return expand(v)
            if isinstance(v, list):
                return [ex(x) for x in v]
            if isinstance(v, dict):
                return {k: ex(x) for k, x in v.items()}
            return v

        out = dataclasses.replace(self)
        for f in dataclasses.fields(self):
            if f.name == "explicit":
                continue
            setattr(out, f.name, ex(getattr(self, f.name)))
        out.local_ports = [int(p) for p in out.local_ports]
        if out.broker is not None and "port" in out.broker:
            out.broker["port"] = int(out.broker["port"])
        return out
