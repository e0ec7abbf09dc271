"""Changes files through shared mappings (no write(2), so no modify
notification), then swaps each changed file with its unchanged neighbour
with renameat2(RENAME_EXCHANGE): python3 exchange.py DIR N.

Files `m-NNNNN` are made by the contract's setup. After the run the odd
names hold the changed contents (`MAPPED` at their start). A seal that
learns of the changes only from the opens, and moves a changed name on
each rename notification, ends with the changed files unlisted (the kernel
reports an exchange as two renames, a to b and b to a).
"""

import ctypes
import mmap
import os
import sys

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2


def main() -> None:
    d, n = sys.argv[1], int(sys.argv[2])
    for i in range(0, n - 1, 2):
        a = f"{d}/m-{i:05d}".encode()
        b = f"{d}/m-{i + 1:05d}".encode()
        fd = os.open(a, os.O_RDWR | os.O_CLOEXEC)
        with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
            m[:6] = b"MAPPED"
        os.close(fd)
        if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")


main()
