"""Changes N existing files in DIR through shared mappings, no write(2),
while a second thread flips the first letter of the name buffer each open
reads its path from: python3 mapped.py DIR N.

Each file `m-NNNNN` (made by the contract's setup, before the run) ends
with `MAPPED` at its start. A log that takes an open's path from agent
memory names some of them `n-NNNNN` (a file that never existed), and one
that knows a file changed only from write notifications misses the change.
"""

import ctypes
import mmap
import os
import sys
import threading

sys.setswitchinterval(1e-6)  # hand the GIL over often: flips land while an open is in the kernel

libc = ctypes.CDLL(None, use_errno=True)


def main() -> None:
    d, n = sys.argv[1], int(sys.argv[2])
    buf = ctypes.create_string_buffer(len(d) + 64)
    flip_at = len(d) + 1
    stop = threading.Event()

    def flipper() -> None:
        letters = (ord("m"), ord("n"))
        i = 0
        while not stop.is_set():
            ctypes.memset(ctypes.addressof(buf) + flip_at, letters[i & 1], 1)
            i += 1

    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    for i in range(n):
        fd = -1
        for _ in range(1000):
            buf.value = f"{d}/m-{i:05d}".encode()
            fd = libc.open(buf, os.O_RDWR | os.O_CLOEXEC)
            if fd >= 0:
                break
        if fd < 0:
            continue
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[:6] = b"MAPPED"
        os.close(fd)
    stop.set()
    t.join()


main()
