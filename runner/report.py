"""Result files: one JSON per sandbox and a Markdown table."""

from __future__ import annotations

import datetime as dt
import json
import platform
from pathlib import Path

from . import RUNNER_VERSION

SYMBOL = {
    "mitigated": "mitigated",
    "not-mitigated": "**NOT-MITIGATED**",
    "passed": "passed",
    "control-failed": "**control-failed**",
    "unsupported": "unsupported",
    "refused": "refused",
    "needs-feature": "needs-feature",
    "error": "error",
}


def result_doc(adapter, outcomes, started: str) -> dict:
    return {
        "sandbox": adapter.name,
        "sandbox_version": adapter.version() if adapter.available() else "not installed",
        "adapter_version": adapter.adapter_version,
        "runner_version": RUNNER_VERSION,
        "conflict_of_interest": adapter.conflict_of_interest,
        "has_effect_log": adapter.has_effect_log,
        "host_kernel": platform.release(),
        "date": started,
        "results": [o.as_dict() for o in outcomes],
        "summary": summarize(outcomes),
    }


def summarize(outcomes) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o.result] = out.get(o.result, 0) + 1
    return dict(sorted(out.items()))


def write_json(doc: dict, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / f"{doc['sandbox']}.json"
    p.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return p


def markdown(docs: list[dict], contracts) -> str:
    names = [d["sandbox"] for d in docs]
    by = {d["sandbox"]: {r["contract"]: r for r in d["results"]} for d in docs}
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Lab run {now}, host kernel {platform.release()}, runner {RUNNER_VERSION}.",
        "",
        "| sandbox | version | conflict of interest | summary |",
        "|---|---|---|---|",
    ]
    for d in docs:
        summ = ", ".join(f"{k} {v}" for k, v in d["summary"].items())
        lines.append(f"| {d['sandbox']} | {d['sandbox_version']} | {'yes' if d['conflict_of_interest'] else 'no'} | {summ} |")
    lines += ["", "| contract | kind | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for c in contracts:
        cells = []
        for n in names:
            r = by[n].get(c.id)
            cells.append(SYMBOL.get(r["result"], r["result"]) if r else "")
        lines.append(f"| {c.id} | {c.kind} | " + " | ".join(cells) + " |")
    lines += ["", "Details (not-mitigated, control-failed, refused, error, unsupported):", ""]
    for d in docs:
        for r in d["results"]:
            if r["result"] in ("not-mitigated", "control-failed", "error", "refused", "unsupported") and r["detail"]:
                lines.append(f"- {d['sandbox']} / {r['contract']}: {r['result']}: {r['detail']}")
    return "\n".join(lines) + "\n"
