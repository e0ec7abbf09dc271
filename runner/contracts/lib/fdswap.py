"""Issue 13: a change by descriptor, then another file put at that number.

`fdswap.py DIR`: in DIR, changes hook.sh's mode (sticky; setuid is refused) through its descriptor
(fchmod), then dup2s notes.txt's descriptor onto that number while the
process lives on. A log that names fd-only calls by a later /proc lookup
says `chmod notes.txt 01755`; the kernel's file at the call is hook.sh.
"""
import os
import sys
import time

os.chdir(sys.argv[1])
y = os.open("notes.txt", os.O_RDONLY)
os.utime(y)
x = os.open("hook.sh", os.O_RDONLY)
os.fchmod(x, 0o1755)
os.dup2(y, x)
time.sleep(1)
