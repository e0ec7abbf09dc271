"""python3 -m runner list | run --sandbox a,b [--contract GLOB] [--out DIR]"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

from . import adapters, report
from .contract import ContractError, load_all, select
from .harness import LAB_TMP, run_contract

DEFAULT_OUT = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m runner", description="TartarOS lab contract runner")
    sub = ap.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("list", help="list the contracts")
    ls.add_argument("--contract", help="comma-separated id globs")
    sub.add_parser("sandboxes", help="list the adapters and whether each is installed")
    run = sub.add_parser("run", help="run contracts against sandboxes")
    run.add_argument("--sandbox", default="tartaros", help="comma-separated: " + ",".join(adapters.ADAPTERS))
    run.add_argument("--contract", help="comma-separated id globs (default: all)")
    run.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for results (default runner/results)")
    run.add_argument("--keep", action="store_true", help="keep each run's temporary directory")
    run.add_argument("-q", "--quiet", action="store_true")
    run.add_argument("--fail-on", default="", metavar="SANDBOXES",
                     help="exit 1 if any of these sandboxes has a not-mitigated, control-failed or error result (for CI)")
    run.add_argument("--not-asserted", default="", metavar="CLASSES",
                     help="comma-separated issue classes (a contract's covers, e.g. 12.1,13; * = any) whose "
                          "contracts are run and printed but left out of --fail-on")
    args = ap.parse_args(argv)

    try:
        contracts = load_all()
    except ContractError as e:
        print(f"runner: bad contract: {e}", file=sys.stderr)
        return 2
    if args.command == "list":
        for c in select(contracts, args.contract):
            pair = f" (control: {c.control})" if c.control else ""
            log = " {effect_log}" if c.effect_log is not None else ""
            covers = f" [covers {', '.join(c.covers)}]" if c.covers else ""
            print(f"{c.id:34} {c.kind:8} {c.title}{log}{pair}{covers}")
        print(f"{len(select(contracts, args.contract))} contracts")
        return 0
    if args.command == "sandboxes":
        for name, cls in adapters.ADAPTERS.items():
            a = cls()
            print(f"{name:10} {'installed ' + a.version() if a.available() else 'not installed'}")
        return 0

    chosen = select(contracts, args.contract)
    if not chosen:
        print("runner: no contract matches", file=sys.stderr)
        return 2
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    docs = []
    for name in [s.strip() for s in args.sandbox.split(",") if s.strip()]:
        adapter = adapters.get(name)
        outcomes = []
        if not adapter.available():
            from .harness import Outcome

            print(f"== {name}: not installed; every contract is `error`", file=sys.stderr)
            outcomes = [Outcome(c.id, c.kind, "error", f"{name} is not installed") for c in chosen]
        else:
            print(f"== {name} {adapter.version()}", file=sys.stderr)
            for c in chosen:
                o = run_contract(c, adapter, keep=args.keep)
                outcomes.append(o)
                if not args.quiet:
                    extra = f"  ({o.detail})" if o.detail and o.result not in ("mitigated", "passed") else ""
                    print(f"  {c.id:34} {o.result:14} {o.seconds:6.2f}s{extra}", file=sys.stderr)
        doc = report.result_doc(adapter, outcomes, started)
        report.write_json(doc, args.out)
        docs.append(doc)
    try:
        os.rmdir(LAB_TMP)  # leave the host as it was found (only if empty)
    except OSError:
        pass
    table = report.markdown(docs, chosen)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(table)
    print(table)
    bad, waived = gate_failures(docs, chosen, args.fail_on, args.not_asserted)
    if waived:
        print("runner: not asserted (--not-asserted):\n  " + "\n  ".join(waived), file=sys.stderr)
    if bad:
        print("runner: failing results:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    return 0


def gate_failures(docs: list[dict], contracts, fail_on: str, not_asserted: str) -> tuple[list[str], list[str]]:
    """The failing results of the --fail-on sandboxes: (asserted, waived by
    --not-asserted because the contract covers one of those classes)."""
    bad: list[str] = []
    waived: list[str] = []
    gate = {s.strip() for s in fail_on.split(",") if s.strip()}
    loose = {s.strip() for s in not_asserted.split(",") if s.strip()}
    covers = {c.id: set(c.covers) for c in contracts}
    for doc in docs:
        if doc["sandbox"] not in gate:
            continue
        for r in doc["results"]:
            if r["result"] not in ("not-mitigated", "control-failed", "error"):
                continue
            line = f"{doc['sandbox']}/{r['contract']}: {r['result']}"
            cv = covers.get(r["contract"], set())
            (waived if cv and ("*" in loose or cv & loose) else bad).append(line)
    return bad, waived


if __name__ == "__main__":
    sys.exit(main())
