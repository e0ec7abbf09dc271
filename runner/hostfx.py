"""Host-side fixtures: listeners, a victim process, a terminal, host aliases,
and containment of everything a run starts. All are torn down after a run."""

from __future__ import annotations

import base64
import fcntl
import itertools
import os
import select
import signal
import socket
import ssl
import subprocess
import termios
import threading
import time
import tty
from pathlib import Path

HOSTS_FILE = "/etc/hosts"
CGROUP_BASE = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() else Path("/sys/fs/cgroup")
HTTP_METHODS = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"CONNECT ", b"DELETE ", b"PATCH ")


class Listener:
    """A host listener that records every byte it receives."""

    def __init__(self, name: str, proto: str, host: str = "127.0.0.1", port: int = 0, path: str | None = None,
                 netns: str | None = None, hold: bool = False, tls: "ssl.SSLContext | None" = None,
                 echo: "bool | str" = False):
        self.name, self.proto, self.host, self.port, self.path = name, proto, host, port, path
        # tls: terminate TLS with this context, so that what is recorded is
        # the plaintext request (path, headers) an upstream would act on
        self.tls = tls
        # hold: never close an accepted connection (a service that keeps a
        # relay connection open after the agent is gone)
        self.hold = hold
        # echo: answer an HTTP request with the request itself as the body
        # (an upstream's debug endpoint), so what a broker injected comes
        # back to the agent unless the broker keeps it out; "base64": the
        # request base64-encoded (a token-inspection endpoint)
        self.echo = echo
        self.data = bytearray()
        self.connections = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        if proto == "unix":
            # a socket made in another network namespace is listed only in
            # that namespace's /proc/net/unix, yet its path reaches it
            self.sock = (socket_in_netns(netns, socket.AF_UNIX, socket.SOCK_STREAM) if netns
                         else socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
            self.sock.bind(path)
            os.chmod(path, 0o777)
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
            self.sock = socket_in_netns(netns, family, kind) if netns else socket.socket(family, kind)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((host, port))
            self.port = self.sock.getsockname()[1]
        if proto != "udp":
            self.sock.listen(64)
        self.sock.setblocking(False)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _record(self, b: bytes) -> None:
        with self._lock:
            self.data += b

    def _serve(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.sock], [], [], 0.05)
            if not r:
                continue
            try:
                if self.proto == "udp":
                    b, _ = self.sock.recvfrom(65536)
                    self.connections += 1
                    self._record(b)
                else:
                    conn, _ = self.sock.accept()
                    self.connections += 1
                    threading.Thread(target=self._conn, args=(conn,), daemon=True).start()
            except OSError:
                continue

    def _conn(self, conn: socket.socket) -> None:
        conn.settimeout(0.5)
        if self.tls is not None:
            try:
                conn.settimeout(3)
                conn = self.tls.wrap_socket(conn, server_side=True)
                conn.settimeout(0.5)
            except (OSError, ssl.SSLError):
                conn.close()
                return
        got = bytearray()
        deadline = time.monotonic() + (3600 if self.hold else 3)
        try:
            while time.monotonic() < deadline and not self._stop.is_set():
                try:
                    b = conn.recv(65536)
                except socket.timeout:
                    if got and not self.hold:
                        break
                    continue
                if not b:
                    if self.hold:
                        time.sleep(0.1)  # peer closed its side; keep ours open
                        continue
                    break
                got += b
                self._record(b)
                if got.startswith(HTTP_METHODS) and b"\r\n\r\n" in got:
                    body = (base64.b64encode(bytes(got)) if self.echo == "base64"
                            else bytes(got) if self.echo else b"ok\n")
                    conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
                    break
        except OSError:
            pass
        finally:
            conn.close()

    def received(self) -> bytes:
        with self._lock:
            return bytes(self.data)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        self.sock.close()
        if self.path:
            try:
                os.unlink(self.path)
            except OSError:
                pass


class Victim:
    """A host process outside the sandbox that the agent must not touch."""

    def __init__(self, cwd: str, env: dict[str, str]):
        self.proc = subprocess.Popen(["sleep", "300"], cwd=cwd, env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.pid = self.proc.pid

    def alive(self) -> bool:
        time.sleep(0.05)
        return self.proc.poll() is None

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class Terminal:
    """A pty that becomes the sandbox's controlling terminal. Whatever lands in
    its input queue (TIOCSTI) is read back here, outside the sandbox."""

    def __init__(self) -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        attrs = termios.tcgetattr(self.slave)
        attrs[3] &= ~termios.ECHO
        termios.tcsetattr(self.slave, termios.TCSANOW, attrs)
        self.reader = os.dup(self.slave)
        self.injected = bytearray()
        self.output = bytearray()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.reader, self.master], [], [], 0.05)
            for fd in r:
                try:
                    b = os.read(fd, 4096)
                except OSError:
                    continue
                (self.injected if fd == self.reader else self.output).extend(b)

    def preexec(self) -> None:
        # Runs in the child after setsid(): make the pty the controlling tty.
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    def close(self) -> None:
        time.sleep(0.1)
        self._stop.set()
        self.thread.join(timeout=2)
        for fd in (self.master, self.slave, self.reader):
            try:
                os.close(fd)
            except OSError:
                pass


_SEQ = itertools.count()


class HostAliases:
    """Names in /etc/hosts for domain tests, pointing at addresses in a network
    namespace the runner creates (joined to the host by a veth pair), so the
    upstreams are neither loopback nor one of the host's own addresses."""

    NET = "203.0.113"  # TEST-NET-3 (documentation); the host side is .1

    def __init__(self, aliases: list[dict[str, str]], tag: str):
        self.tag = f"# tartaros-lab {tag}"
        self.lines: list[str] = []
        self.addrs: set[str] = set()
        self.netns: str | None = None
        if not aliases:
            return
        for a in aliases:
            if not a["addr"].startswith(self.NET + ".") or a["addr"] == self.NET + ".1":
                raise ValueError(f"host_alias addresses are in {self.NET}.2-254, not {a['addr']}")
            self.addrs.add(a["addr"])
        n = f"{os.getpid() % 10000}x{next(_SEQ) % 10000}"
        self.netns, host_if, ns_if = f"tlab{n}", f"tlabh{n}", f"tlabn{n}"
        self.host_if = host_if
        run = lambda *cmd: subprocess.run(cmd, check=True, capture_output=True)  # noqa: E731
        try:
            run("ip", "netns", "add", self.netns)
            run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            run("ip", "link", "set", ns_if, "netns", self.netns)
            run("ip", "addr", "add", f"{self.NET}.1/24", "dev", host_if)
            run("ip", "link", "set", host_if, "up")
            for addr in sorted(self.addrs):
                run("ip", "-n", self.netns, "addr", "add", f"{addr}/24", "dev", ns_if)
            run("ip", "-n", self.netns, "link", "set", ns_if, "up")
            run("ip", "-n", self.netns, "link", "set", "lo", "up")
        except subprocess.CalledProcessError as e:
            self.close()
            raise RuntimeError(f"network namespace setup failed: {e.stderr.decode(errors='replace').strip()}") from None
        self.lines = [f"{a['addr']} {a['name']} {self.tag}\n" for a in aliases]
        with open(HOSTS_FILE, "a") as f:
            f.writelines(self.lines)

    def netns_path(self, addr: str) -> str | None:
        return f"/var/run/netns/{self.netns}" if self.netns and addr in self.addrs else None

    def close(self) -> None:
        if self.lines:
            with open(HOSTS_FILE) as f:
                kept = [line for line in f if not line.rstrip("\n").endswith(self.tag)]
            with open(HOSTS_FILE, "w") as f:
                f.writelines(kept)
            self.lines = []
        if self.netns:
            # deleting one end deletes the pair; then the namespace itself
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
            self.netns = None


def socket_in_netns(netns_path: str, family: int, kind: int) -> socket.socket:
    """A socket created inside another network namespace (a socket stays in
    the namespace it was created in); setns() is done in a throwaway thread."""
    import ctypes

    box: dict[str, object] = {}

    def work() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(netns_path, os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            box["sock"] = socket.socket(family, kind)
        except Exception as e:  # noqa: BLE001
            box["err"] = e

    t = threading.Thread(target=work)
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]  # type: ignore[misc]
    return box["sock"]  # type: ignore[return-value]


class Containment:
    """A cgroup v2 directory holding the launched sandbox, so that everything
    it starts can be killed at the end (cgroup.kill), plus its process group."""

    def __init__(self, tag: str, use_cgroup: bool):
        self.dir: Path | None = None
        if use_cgroup:
            try:
                base = CGROUP_BASE / "tartaros-lab"
                base.mkdir(exist_ok=True)
                self.dir = base / tag
                self.dir.mkdir()
            except OSError:
                self.dir = None

    def preexec(self) -> None:
        if self.dir is not None:
            with open(self.dir / "cgroup.procs", "w") as f:
                f.write("0")

    def pids(self) -> list[int]:
        if self.dir is None:
            return []
        try:
            return [int(x) for x in (self.dir / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self, pgid: int | None) -> None:
        if pgid is not None:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.dir is None:
            return
        deadline = time.monotonic() + 5
        while self.pids() and time.monotonic() < deadline:
            try:
                (self.dir / "cgroup.kill").write_text("1")
            except OSError:
                for pid in self.pids():
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)

    def close(self) -> None:
        if self.dir is None:
            return
        for _ in range(50):
            try:
                self.dir.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        try:
            self.dir.parent.rmdir()
        except OSError:
            pass


def processes_matching(text: str, exclude: set[int]) -> list[int]:
    hits = []
    needle = text.encode()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in exclude:
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state != "Z":
            hits.append(int(d.name))
    return hits


class HostPty:
    """Another terminal of the agent's user on the host (a pty whose slave
    the agent could open by permissions alone): whatever reaches its master
    was written into a terminal the sandbox was not given."""

    def __init__(self, uid: int = 65534):
        self.master, self.slave = os.openpty()
        self.path = os.ttyname(self.slave)
        os.chown(self.path, uid, -1)
        os.chmod(self.path, 0o666)
        self.output = bytearray()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    self.output.extend(os.read(self.master, 4096))
                except OSError:
                    continue

    def received(self) -> bytes:
        time.sleep(0.1)
        return bytes(self.output)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
        for fd in (self.master, self.slave):
            try:
                os.close(fd)
            except OSError:
                pass


class UnixDecoys:
    """Many listening unix sockets, so that a host socket the agent wants is
    not among the first few hundred a sandbox may have looked at."""

    def __init__(self, directory: str, count: int):
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.socks = []
        for i in range(count):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(os.path.join(directory, f"decoy-{i}.sock"))
            s.listen(1)
            self.socks.append(s)

    def close(self) -> None:
        for s in self.socks:
            s.close()


class DelayedListener:
    """A unix listener bound only `delay` seconds after the sandbox started
    (a daemon that starts or restarts during the run)."""

    def __init__(self, name: str, path: str, delay: float):
        self.name, self.path, self.delay = name, path, delay
        self.port = 0
        self.inner: Listener | None = None
        self._timer: threading.Timer | None = None

    def start(self) -> None:
        self._timer = threading.Timer(self.delay, self._bind)
        self._timer.daemon = True
        self._timer.start()

    def _bind(self) -> None:
        self.inner = Listener(self.name, "unix", path=self.path)

    def received(self) -> bytes:
        return self.inner.received() if self.inner else b""

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join(timeout=2)
        if self.inner is not None:
            self.inner.close()


def v1_controller_dir(controller: str) -> Path | None:
    """The v1 hierarchy of a controller on a hybrid host, if it has one."""
    p = Path("/sys/fs/cgroup") / controller
    return p if (p / "cgroup.procs").exists() and not (p / "cgroup.controllers").exists() else None


class LauncherLimits:
    """Puts the launcher itself under pids/memory limits (cgroup v1 on hybrid
    hosts, v2 otherwise), the way a CI job or a user slice limits it: every
    cgroup the sandbox makes must nest under these."""

    def __init__(self, tag: str, pids: int | None, memory: int | None):
        self.dirs: list[Path] = []
        wanted = [("pids", "pids.max", pids), ("memory", "memory.limit_in_bytes", memory)]
        for controller, knob, value in wanted:
            if value is None:
                continue
            base = v1_controller_dir(controller)
            if base is None:
                base, knob = CGROUP_BASE, {"pids": "pids.max", "memory": "memory.max"}[controller]
            d = base / f"tartaros-lab-limit-{tag}"
            d.mkdir(exist_ok=True)
            if d not in self.dirs:
                self.dirs.append(d)
            (d / knob).write_text(str(value))
            if controller == "memory" and (d / "memory.memsw.limit_in_bytes").exists():
                try:
                    (d / "memory.memsw.limit_in_bytes").write_text(str(value))
                except OSError:
                    pass

    def preexec(self) -> None:
        for d in self.dirs:
            with open(d / "cgroup.procs", "w") as f:
                f.write("0")

    def close(self) -> None:
        for d in self.dirs:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    pids = [int(x) for x in (d / "cgroup.procs").read_text().split()]
                except OSError:
                    break
                if not pids:
                    break
                if (d / "cgroup.kill").exists():
                    try:
                        (d / "cgroup.kill").write_text("1")
                    except OSError:
                        pass
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.05)
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


class BareNetns:
    """A network namespace with nothing in it, for listeners that must live
    outside the host's namespace."""

    def __init__(self, tag: str):
        self.name = f"tlabu{tag}"
        subprocess.run(["ip", "netns", "add", self.name], check=True, capture_output=True)
        self.path = f"/var/run/netns/{self.name}"

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)


class LogTmpfs:
    """A tiny tmpfs on the run's log directory, so the log's filesystem fills up."""

    def __init__(self, directory: str, size: str):
        self.dir = directory
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tartaros-lab-log", directory],
                       check=True, capture_output=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.dir], capture_output=True)


class HostBind:
    """A bind mount on the host for the run: the same directory at another path."""

    def __init__(self, source: str, target: str):
        self.target = target
        os.makedirs(target, exist_ok=True)
        subprocess.run(["mount", "--bind", source, target], check=True, capture_output=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", self.target], capture_output=True)


class TestCA:
    """A throwaway CA and one server certificate per name (openssl), for
    TLS listeners that a sandbox's gateway is told to trust (ca_file)."""

    def __init__(self, directory: str):
        self.dir = Path(directory)
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.ca = self.dir / "ca.pem"
        self._run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.dir / "ca.key"),
                  "-out", str(self.ca), "-days", "2", "-subj", "/CN=tartaros-lab test CA",
                  "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        os.chmod(self.ca, 0o644)

    def _run(self, *args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    def server_context(self, name: str) -> ssl.SSLContext:
        key, csr, crt = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = self.dir / f"{name}.ext"
        ext.write_text(f"subjectAltName=DNS:{name}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
        self._run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        self._run("x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.dir / "ca.key"),
                  "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(crt), str(key))
        return ctx
