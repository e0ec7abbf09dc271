"""Kills the processes above the agent, up to and including the launcher
(the process whose environment holds LAB_LAUNCHER_MARK=TOKEN):
python3 kill_ancestors.py TOKEN. It never walks past that process, and
stops at the first ancestor it cannot identify, so it cannot reach the
runner. The runner checks whether the launcher died of a signal.
"""

import os
import signal
import sys


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("PPid:"):
                return int(line.split()[1])
    return 0


def main() -> None:
    mark = f"LAB_LAUNCHER_MARK={sys.argv[1]}".encode()
    chain = []
    pid = os.getpid()
    while True:
        pid = parent_of(pid)
        if pid <= 1:
            return  # the launcher is not visible: nothing to kill
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            return  # cannot tell what it is: stop
        chain.append(pid)
        if mark in env:
            break
    for pid in chain:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError as e:
            print(f"kill {pid}: {e}", file=sys.stderr)


main()
