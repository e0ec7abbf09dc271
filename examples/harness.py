#!/usr/bin/env python3
"""A small Tartarus-style agent harness on top of `tartaros run`.

Each tool call gets its own grants and its own effect log:

  search  read-only: --read-scope granted, reads the work tree, writes nothing
  edit    a scoped file edit: writes only src/ of the work tree
  fetch   a networked fetch: reaches one host through the egress proxy
          (--allow-domain), here a local test upstream

For every call the harness reads the status channel (--status-fd), which
the agent cannot write, so an agent printing `tartaros: ...` and exiting 78
is never taken for a refusal; then it checks the call's effect in the work
tree from outside and verifies the call's log with `tartaros log verify`.

Standard library only. Run as root (the agent then runs as nobody) or as an
ordinary user:

    python3 examples/harness.py [--tartaros PATH]
"""

import argparse
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

NOBODY = 65534


class ToolCall:
    def __init__(self, name, grants, command, stdin=None):
        self.name = name
        self.grants = grants
        self.command = command
        self.stdin = stdin


def run_call(tartaros, call, logdir, cwd):
    """Runs one tool call; returns (status events, stdout, log path)."""
    log = os.path.join(logdir, call.name + ".jsonl")
    read_end, write_end = os.pipe()
    argv = [tartaros, "run", "--quiet", "--status-fd", str(write_end),
            "--label", "tool:" + call.name, "--log", log]
    argv += call.grants + ["--"] + call.command
    proc = subprocess.Popen(argv, cwd=cwd, pass_fds=(write_end,),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    os.close(write_end)
    out, err = proc.communicate(call.stdin.encode() if call.stdin else None,
                                timeout=120)
    with os.fdopen(read_end) as status:
        events = [json.loads(line) for line in status if line.strip()]
    return events, out.decode(), err.decode(), proc.returncode, log


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def start_upstream():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"hello from the upstream\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def make_tree(root):
    os.makedirs(os.path.join(root, "src"))
    with open(os.path.join(root, "README"), "w") as f:
        f.write("a project\n")
    with open(os.path.join(root, "src", "main.txt"), "w") as f:
        f.write("greeting = old\n# TODO: say more\n")
    if os.geteuid() == 0:
        # The agent runs as nobody: let it read the tree and write src/.
        for dirpath, dirnames, filenames in os.walk(root):
            os.chmod(dirpath, 0o755)
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o644)
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, "src")):
            os.chown(dirpath, NOBODY, NOBODY)
            for name in filenames:
                os.chown(os.path.join(dirpath, name), NOBODY, NOBODY)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tartaros", default=shutil.which("tartaros") or "tartaros")
    args = parser.parse_args()
    args.tartaros = os.path.abspath(args.tartaros) if os.sep in args.tartaros else args.tartaros

    base = tempfile.mkdtemp(prefix="harness-")
    os.chmod(base, 0o755)
    server = start_upstream()
    try:
        work = os.path.join(base, "work")
        logs = os.path.join(base, "logs")
        os.makedirs(logs)
        make_tree(work)
        # The test upstream listens on the host's loopback as `localhost`.
        host = "localhost"
        port = server.server_address[1]
        # Policy on stdin: the test upstream is on loopback, which the
        # proxy refuses unless told (DNS rebinding guard).
        proxy_policy = json.dumps({"proxy": {"allow_internal": True,
                                             "http_ports": [port]}})
        # Inside the sandbox NO_PROXY sends localhost to the sandbox's own
        # loopback; this tool wants the host's, so it goes through the proxy.
        fetch_code = ("import os, urllib.request, sys\n"
                      "for k in ('NO_PROXY', 'no_proxy'): os.environ.pop(k, None)\n"
                      f"sys.stdout.write(urllib.request.urlopen('http://{host}:{port}/').read().decode())")
        calls = [
            ToolCall("search", ["--read-scope", "granted", "--read-allow", work],
                     ["grep", "-rn", "TODO", "."]),
            ToolCall("edit", ["--write", os.path.join(work, "src")],
                     ["sh", "-c", "sed -i 's/old/new/' src/main.txt; echo x >> README"]),
            ToolCall("fetch", ["--config", "-", "--allow-domain", host],
                     ["python3", "-c", fetch_code], stdin=proxy_policy),
        ]
        for call in calls:
            events, out, err, code, log = run_call(args.tartaros, call, logs, work)
            kinds = [e["event"] for e in events]
            check(kinds == ["started", "exited"],
                  f"{call.name}: status {events}, stderr {err}")
            check(events[0]["label"] == "tool:" + call.name, f"{call.name}: label")
            exited = events[1]
            if call.name == "search":
                check(code == 0 and "TODO" in out, f"search: {code} {out} {err}")
            elif call.name == "edit":
                # sed worked in src/, the README append was refused.
                with open(os.path.join(work, "src", "main.txt")) as f:
                    check("greeting = new" in f.read(), "edit: src/main.txt unchanged")
                with open(os.path.join(work, "README")) as f:
                    check(f.read() == "a project\n", "edit: README was changed")
                check(code != 0, "edit: the README write should have failed")
            elif call.name == "fetch":
                check(code == 0 and "hello from the upstream" in out,
                      f"fetch: {code} {out} {err}")
            verify = subprocess.run([args.tartaros, "log", "verify", log],
                                    capture_output=True, text=True)
            # 0: complete; 3: complete chain but capture degraded (no root).
            ok = verify.returncode == 0 or (os.geteuid() != 0 and verify.returncode == 3)
            check(ok, f"{call.name}: log verify {verify.returncode} {verify.stdout}")
            check(exited["log_complete"] == (verify.returncode == 0),
                  f"{call.name}: log_complete disagrees with verify")
            with open(log) as f:
                records = [json.loads(line) for line in f]
            genesis = records[0]
            if os.geteuid() == 0:
                # Audit: what each call did is in its log, with the verdict.
                if call.name == "fetch":
                    check(any(r["kind"] == "proxy" and r.get("decision") == "allowed"
                              for r in records), "fetch: no allowed proxy record")
                if call.name == "edit":
                    check(any(r.get("decision") == "denied" for r in records),
                          "edit: the refused README write is not in the log")
            check(genesis.get("run", {}).get("label") == "tool:" + call.name,
                  f"{call.name}: the genesis does not carry the label")
            check(genesis["run"]["id"] == events[0]["run_id"],
                  f"{call.name}: the genesis run id is not the started one")
            print(f"{call.name}: ok (exit {exited['status']}, {exited['duration_ms']} ms, "
                  f"log head {exited['log_head'][:12]})")
    except AssertionError as failure:
        print(f"harness: {failure}", file=sys.stderr)
        return 1
    finally:
        server.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
