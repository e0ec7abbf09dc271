"""Policy mapping per adapter: argv for a sample policy, unsupported fields."""

import os
import tempfile
import tomllib
import json
import unittest

from runner.adapters import ADAPTERS, Context, RunResult, Unsupported, get
from runner.adapters.tartaros import broker_toml
from runner.policy import Policy


def sample(**over):
    d = tempfile.mkdtemp(prefix="lab-test-")
    work = os.path.join(d, "work")
    secrets = os.path.join(d, "outside", "secrets")
    os.makedirs(work)
    os.makedirs(secrets)
    raw = {"writable_roots": [work], "read_denies": [secrets]}
    raw.update(over)
    return Policy.from_dict(raw), work, secrets, d


class TartarosMapping(unittest.TestCase):
    def test_every_field_maps_to_its_flag(self):
        p = Policy.from_dict({
            "writable_roots": ["/w"], "read_denies": ["/s"], "read_allows": ["/a"], "read_scope": "granted",
            "write_denies": ["/w/.git"], "local_ports": [8080], "allow_domains": ["example.org"],
            "isolate_pids": True, "isolate_process_info": True, "harden_syscalls": True,
            "materialize_absent_handoff": True, "max_processes": 32, "inherit_env": True,
            "env_passthrough": ["TERM"], "private_tmp": True, "deny_unix": True,
        })
        scratch = tempfile.mkdtemp()
        a = get("tartaros").argv(p, "/w", "echo hi", Context(scratch=scratch, log="/l/effects.jsonl"))
        self.assertIsInstance(a, list)
        self.assertEqual(a[1:3], ["run", "--strict"])
        joined = " ".join(a)
        for frag in ("--write /w", "--read-deny /s", "--read-allow /a", "--read-scope granted",
                     "--write-deny /w/.git", "--port 8080", "--allow-domain example.org", "--isolate-pids",
                     "--isolate-proc", "--seccomp-strict", "--materialize", "--max-procs 32", "--inherit-env",
                     "--env TERM", "--private-tmp", "--deny-unix", "--log /l/effects.jsonl"):
            self.assertIn(frag, joined)
        self.assertEqual(a[-4:], ["--", "/bin/sh", "-c", "echo hi"])
        self.assertNotIn("--config", a)

    def test_config_only_fields_go_to_the_config_file(self):
        p = Policy.from_dict({"writable_roots": ["/w"], "max_memory": 1 << 28,
                              "glob_read_denies": ["/etc/*.conf"], "allow_unix_socket_paths": ["/run/x.sock"]})
        a = get("tartaros").argv(p, "/w", "true", Context(scratch=tempfile.mkdtemp()))
        self.assertEqual(a[a.index("--max-memory") + 1], str(1 << 28))
        with open(a[a.index("--config") + 1]) as f:
            parsed = tomllib.loads(f.read())
        self.assertEqual(parsed["policy"], {"glob_read_denies": ["/etc/*.conf"],
                                            "allow_unix_socket_paths": ["/run/x.sock"]})

    def test_scope_fields(self):
        p = Policy.from_dict({"writable_roots": ["/w"], "read_scope": "none", "exec_allows": ["/usr"],
                              "tmpfs": ["/w/cache"], "binds": [{"source": "/opt/x", "target": "/x"}]})
        a = get("tartaros").argv(p, "/w", "true", Context(scratch=tempfile.mkdtemp()))
        self.assertEqual(a[a.index("--read-scope") + 1], "none")
        with open(a[a.index("--config") + 1]) as f:
            parsed = tomllib.loads(f.read())["policy"]
        self.assertEqual(parsed["binds"], [{"source": "/opt/x", "target": "/x"}])
        self.assertEqual(parsed["exec_allows"], ["/usr"])
        # a peer that knows only all/granted must not widen "none" to "all"
        for name in ("bwrap", "nsjail", "sandlock", "codex", "srt"):
            r = get(name).argv(Policy.from_dict({"writable_roots": ["/w"], "read_scope": "none"}), "/w", "true",
                               Context(scratch=tempfile.mkdtemp()))
            self.assertIsInstance(r, Unsupported, name)
        with self.assertRaises(Exception):
            Policy.from_dict({"binds": [{"source": "/a"}]})

    def test_defaults_add_no_flags(self):
        a = get("tartaros").argv(Policy.from_dict({"writable_roots": ["/w"]}), "/w", "true")
        self.assertEqual(a[1:], ["run", "--strict", "--write", "/w", "--", "/bin/sh", "-c", "true"])

    def test_broker_goes_to_a_config_file_without_secrets(self):
        broker = {"port": 9000, "token_env": "TOK", "allow_internal": False,
                  "capability": [{"name": "gh", "upstream": "api.github.com", "header": "Authorization",
                                  "value_env": "GH", "methods": ["GET"]}]}
        scratch = tempfile.mkdtemp()
        p = Policy.from_dict({"writable_roots": ["/w"], "broker": broker})
        a = get("tartaros").argv(p, "/w", "true", Context(scratch=scratch, launch_env={"TOK": "t0ken", "GH": "s3cret"}))
        cfg = a[a.index("--config") + 1]
        with open(cfg) as f:
            text = f.read()
        parsed = tomllib.loads(text)
        self.assertEqual(parsed["broker"]["port"], 9000)
        self.assertEqual(parsed["broker"]["capability"][0]["upstream"], "api.github.com")
        self.assertNotIn("t0ken", text + " ".join(a))
        self.assertNotIn("s3cret", text + " ".join(a))
        self.assertEqual(tomllib.loads(broker_toml(broker))["broker"]["token_env"], "TOK")

    def test_refusal_signature(self):
        t = get("tartaros")
        self.assertTrue(t.refusal(RunResult(78, "", "tartaros: cannot install landlock\n")))
        self.assertFalse(t.refusal(RunResult(78, "", "some agent output\n")))
        self.assertFalse(t.refusal(RunResult(1, "", "tartaros: cannot install landlock\n")))
        self.assertTrue(t.conflict_of_interest and t.has_effect_log)

    def test_refusal_needs_a_channel_the_agent_cannot_write(self):
        t = get("tartaros")
        line = "tartaros: refused\n"
        # the agent started (its start marker appeared): exit 78 is its own
        self.assertFalse(t.refusal(RunResult(78, "", line, agent_started=True)))
        self.assertTrue(t.refusal(RunResult(78, "", line, agent_started=False)))
        # the status channel decides when there is one, whatever the exit code says
        started = {"event": "started", "pid": 7, "run_id": "r", "label": None}
        refused = {"event": "refused", "code": 78, "reason": "x", "field": None}
        self.assertFalse(t.refusal(RunResult(78, "", line, status_events=[started])))
        self.assertFalse(t.refusal(RunResult(78, "", line, status_events=[])))
        self.assertFalse(t.refusal(RunResult(78, "", line, status_events=[started, refused])))
        self.assertTrue(t.refusal(RunResult(78, "", line, status_events=[refused])))

    def test_status_fd_and_start_marker_in_argv(self):
        t = get("tartaros")
        p = Policy.from_dict({"writable_roots": ["/w"]})
        a = t.argv(p, "/w", "echo hi", Context(scratch=tempfile.mkdtemp(), status_fd=9))
        self.assertEqual(a[a.index("--status-fd") + 1], "9")
        self.assertEqual(a[-1], "echo hi")
        ctx = Context(scratch=tempfile.mkdtemp(), start_marker="/elsewhere/.m")
        a = t.argv(p, "/w", "echo hi", ctx)
        self.assertNotIn("--status-fd", a)
        self.assertEqual(ctx.start_marker, "/w/.m")  # moved into the writable root
        self.assertEqual(a[-1], ": 2>/dev/null > /w/.m\necho hi")
        ctx = Context(scratch=tempfile.mkdtemp(), start_marker="/elsewhere/.m")
        a = t.argv(Policy.from_dict({}), "/w", "echo hi", ctx)
        self.assertIsNone(ctx.start_marker)
        self.assertEqual(a[-1], "echo hi")
        a = t.argv(p, "/w", "true", Context(scratch=tempfile.mkdtemp(), best_effort=True))
        self.assertNotIn("--strict", a)

    def test_status_fd_support_is_detected_from_help(self):
        from runner.adapters import tartaros as T

        d = tempfile.mkdtemp()
        for name, text in (("new", "--status-fd <N>  JSON lines"), ("old", "--log <FILE>")):
            path = os.path.join(d, name)
            with open(path, "w") as f:
                f.write(f"#!/bin/sh\necho '{text}'\n")
            os.chmod(path, 0o755)
        old = os.environ.pop("TARTAROS_LAB_STATUS_FD", None)
        try:
            self.assertTrue(T.supports_status_fd(os.path.join(d, "new")))
            self.assertFalse(T.supports_status_fd(os.path.join(d, "old")))
        finally:
            if old is not None:
                os.environ["TARTAROS_LAB_STATUS_FD"] = old

    def test_binary_from_env(self):
        old = os.environ.get("TARTAROS_BIN")
        os.environ["TARTAROS_BIN"] = "/opt/x/tartaros"
        try:
            self.assertEqual(get("tartaros").binary(), "/opt/x/tartaros")
        finally:
            if old is None:
                del os.environ["TARTAROS_BIN"]
            else:
                os.environ["TARTAROS_BIN"] = old


class PeerMappings(unittest.TestCase):
    def test_only_tartaros_declares_conflict_of_interest_and_a_log(self):
        for name, cls in ADAPTERS.items():
            self.assertEqual(cls.conflict_of_interest, name == "tartaros", name)
            self.assertEqual(cls.has_effect_log, name == "tartaros", name)
        self.assertEqual(set(ADAPTERS), {"tartaros", "bwrap", "firejail", "nsjail", "sandlock", "codex", "srt"})

    def test_bwrap_strict_line_and_read_deny(self):
        p, work, secrets, _ = sample()
        a = get("bwrap").argv(p, work, "true")
        self.assertEqual(a[1:5], ["--unshare-all", "--die-with-parent", "--new-session", "--ro-bind"])
        j = " ".join(a)
        self.assertIn(f"--bind {work} {work}", j)
        self.assertIn(f"--tmpfs {secrets}", j)
        self.assertIn("--clearenv", a)
        self.assertEqual(a[-4:], ["--", "/bin/sh", "-c", "true"])

    def test_bwrap_write_deny_after_bind(self):
        p, work, _, _ = sample()
        os.makedirs(os.path.join(work, ".git"))
        p = Policy.from_dict({"writable_roots": [work], "write_denies": [work + "/.git"]})
        a = get("bwrap").argv(p, work, "true")
        self.assertGreater(a.index(work + "/.git"), a.index("--bind"))

    def test_nsjail_strict_line(self):
        p, work, secrets, _ = sample()
        a = get("nsjail").argv(p, work, "true")
        j = " ".join(a)
        for frag in ("-Mo -Q --chroot /", f"-B {work}", f"-T {secrets}", f"--cwd {work}"):
            self.assertIn(frag, j)

    def test_firejail_strict_line(self):
        p, work, secrets, _ = sample()
        a = get("firejail").argv(p, work, "true")
        for frag in ("--quiet", "--noprofile", "--net=none", "--read-only=/", f"--read-write={work}",
                     "--caps.drop=all", "--seccomp", "--nonewprivs", f"--blacklist={secrets}"):
            self.assertIn(frag, a)

    def test_sandlock_strict_line(self):
        p, work, secrets, _ = sample(local_ports=[8080])
        a = get("sandlock").argv(p, work, "true")
        j = " ".join(a)
        for frag in ("run -r /", f"-w {work}", f"--fs-deny {secrets}", "--net-allow 127.0.0.1:8080", f"--cwd {work}"):
            self.assertIn(frag, j)

    def test_codex_profile(self):
        p, work, secrets, d = sample(write_denies=[])
        scratch = tempfile.mkdtemp()
        ctx = Context(scratch=scratch)
        a = get("codex").argv(p, work, "true", ctx)
        self.assertIn("sandbox", a)
        self.assertEqual(a[a.index("-P") + 1], "strict")
        with open(os.path.join(scratch, "codex-home", "config.toml")) as f:
            prof = tomllib.loads(f.read())
        fs = prof["permissions"]["strict"]["filesystem"]
        self.assertEqual(fs["/"], "read")
        self.assertEqual(fs[work], "write")
        self.assertEqual(fs[secrets], "none")
        self.assertFalse(prof["permissions"]["strict"]["network"]["enabled"])
        env = get("codex").env(p, ctx)
        self.assertTrue(env["TMPDIR"].startswith(scratch))  # the harness keeps scratch out of /tmp

    def test_codex_domains_and_glob_denies(self):
        # 0.171's permission profiles: domain rules through the managed proxy,
        # glob entries with "none" only.
        p, work, secrets, d = sample(allow_domains=["a.example.org", "*.b.example.org"],
                                     glob_read_denies=[os.path.join(d0 := tempfile.mkdtemp(), "*.conf")])
        scratch = tempfile.mkdtemp()
        get("codex").argv(p, work, "true", Context(scratch=scratch))
        with open(os.path.join(scratch, "codex-home", "config.toml")) as f:
            prof = tomllib.loads(f.read())
        self.assertTrue(prof["features"]["network_proxy"])
        net = prof["permissions"]["strict"]["network"]
        self.assertTrue(net["enabled"])
        self.assertEqual(net["domains"], {"a.example.org": "allow", "*.b.example.org": "allow"})
        self.assertNotIn("allow_local_binding", net)  # would open loopback through the proxy
        self.assertEqual(prof["permissions"]["strict"]["filesystem"][os.path.join(d0, "*.conf")], "none")
        r = get("codex").argv(Policy.from_dict({"writable_roots": [work], "glob_denies": [work + "/*.lock"]}),
                              work, "true", Context(scratch=tempfile.mkdtemp()))
        self.assertIsInstance(r, Unsupported)

    def test_srt_settings(self):
        p, work, secrets, _ = sample(allow_domains=["example.org"])
        scratch = tempfile.mkdtemp()
        a = get("srt").argv(p, work, "true", Context(scratch=scratch))
        with open(a[a.index("-s") + 1]) as f:
            s = json.load(f)
        self.assertEqual(s["filesystem"]["allowWrite"], [work])
        self.assertEqual(s["filesystem"]["denyRead"], [secrets])
        self.assertEqual(s["network"]["allowedDomains"], ["example.org"])
        self.assertTrue(s["network"]["strictAllowlist"])

    def test_unsupported_fields(self):
        _, work, _, _ = sample()
        cases = {
            "bwrap": [("local_ports", [80]), ("allow_domains", ["x.org"]), ("max_processes", 8),
                      ("deny_unix", True), ("materialize_absent_handoff", True), ("harden_syscalls", True)],
            "firejail": [("read_allows", [work]), ("read_scope", "granted"), ("local_ports", [80]),
                         ("materialize_absent_handoff", True)],
            "nsjail": [("local_ports", [80]), ("deny_unix", True), ("harden_syscalls", True)],
            "sandlock": [("write_denies", [work]), ("private_tmp", True), ("deny_unix", True)],
            "codex": [("local_ports", [80]), ("max_processes", 8), ("private_tmp", True)],
            "srt": [("local_ports", [80]), ("max_processes", 8), ("env_passthrough", ["X"]),
                    ("inherit_env", False)],
        }
        for sandbox, fields in cases.items():
            for name, value in fields:
                p = Policy.from_dict({"writable_roots": [work], name: value})
                r = get(sandbox).argv(p, work, "true", Context(scratch=tempfile.mkdtemp()))
                self.assertIsInstance(r, Unsupported, f"{sandbox} {name}")
                self.assertEqual(r.field, name)
        # broker is TartarOS-only
        for sandbox in ADAPTERS:
            if sandbox == "tartaros":
                continue
            p = Policy.from_dict({"writable_roots": [work], "broker": {"port": 1, "token_env": "T"}})
            self.assertIsInstance(get(sandbox).argv(p, work, "true", Context(scratch=tempfile.mkdtemp())),
                                  Unsupported, sandbox)

    def test_inherit_env_default_is_not_unsupported(self):
        # a contract that does not mention inherit_env runs on sandboxes that cannot clear it
        _, work, _, _ = sample()
        p = Policy.from_dict({"writable_roots": [work]})
        for sandbox in ("firejail", "srt"):
            self.assertIsInstance(get(sandbox).argv(p, work, "true", Context(scratch=tempfile.mkdtemp())), list)


if __name__ == "__main__":
    unittest.main()
