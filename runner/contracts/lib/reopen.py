"""Opens a file read-only, then writes it through a reopen of
/proc/self/fd/N: python3 reopen.py PATH TOKEN. A log that names the write
by the path the agent passed sees only /proc/self/fd/N."""

import os
import sys

fd = os.open(sys.argv[1], os.O_RDONLY)
w = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_APPEND)
os.write(w, sys.argv[2].encode() + b"\n")
os.close(w)
os.close(fd)
