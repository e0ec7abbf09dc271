"""One adapter per sandbox."""

from __future__ import annotations

from .base import Adapter, Context, RunResult, Unsupported
from .bwrap import Bwrap
from .codex import Codex
from .firejail import Firejail
from .none import NoSandbox
from .nsjail import Nsjail
from .sandlock import Sandlock
from .srt import Srt
from .tartaros import Tartaros

ADAPTERS: dict[str, type[Adapter]] = {
    a.name: a for a in (Tartaros, Bwrap, Firejail, Nsjail, Sandlock, Codex, Srt)
}

# The no-sandbox baseline, for checking that each attack's effect is observable.
BASELINE: dict[str, type[Adapter]] = {"none": NoSandbox}

__all__ = ["ADAPTERS", "BASELINE", "Adapter", "Context", "RunResult", "Unsupported"]


def get(name: str) -> Adapter:
    try:
        return {**ADAPTERS, **BASELINE}[name]()
    except KeyError:
        raise SystemExit(f"unknown sandbox {name!r}; one of {', '.join(ADAPTERS)}") from None
