"""Creates N files in DIR while a second thread keeps flipping the name
buffer the create reads its path from: python3 race.py DIR N.

Every file that exists afterwards was created under its real name; a log
that reads paths from agent memory at syscall exit records some of them
under the other spelling (a file that never existed).
"""

import ctypes
import os
import sys
import threading

sys.setswitchinterval(1e-6)  # hand the GIL over often: flips land while a create is in the kernel

libc = ctypes.CDLL(None, use_errno=True)
O_FLAGS = os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC


def main() -> None:
    d, n = sys.argv[1], int(sys.argv[2])
    os.makedirs(d, exist_ok=True)
    buf = ctypes.create_string_buffer(len(d) + 64)
    flip_at = len(d) + 1  # the first letter of the file name
    stop = threading.Event()

    def flipper() -> None:
        letters = (ord("f"), ord("g"))
        i = 0
        while not stop.is_set():
            ctypes.memset(ctypes.addressof(buf) + flip_at, letters[i & 1], 1)
            i += 1

    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    for i in range(n):
        buf.value = f"{d}/f-{i:05d}".encode()
        fd = libc.open(buf, O_FLAGS, 0o644)
        if fd >= 0:
            os.close(fd)
    stop.set()
    t.join()


main()
