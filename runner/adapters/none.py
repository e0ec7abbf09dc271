"""No sandbox at all: the baseline that shows each attack's effect is real
(every attack should come out not-mitigated, every control passed). Not a
sandbox under evaluation; `python3 -m runner run --sandbox none`."""

from __future__ import annotations

from ..policy import Policy
from .base import Adapter, Context, Unsupported


class NoSandbox(Adapter):
    name = "none"

    def binary(self) -> str | None:
        return "/bin/sh"

    def version(self) -> str:
        return "baseline"

    def argv(self, policy: Policy, workdir: str, cmd: str, ctx: Context | None = None):
        if policy.broker is not None:
            return Unsupported("broker", "no broker without a sandbox")
        return ["/bin/sh", "-c", cmd]
