"""Issue 13: an ACL set through a descriptor, then another file put at that
number.

`xattrswap.py DIR`: in DIR, sets an access ACL (the same bits as mode
0755: the hook becomes executable) and a `user.lab` attribute on
.git/hooks/pre-commit through its descriptor (fsetxattr), then dup2s
notes.txt's descriptor onto that number while the process lives on. A log
that names fd-only calls by a later /proc lookup says the attributes of
notes.txt were set; the kernel's file at the call is the hook.
"""
import os
import struct
import sys
import time

os.chdir(sys.argv[1])
y = os.open("notes.txt", os.O_RDONLY)
x = os.open(".git/hooks/pre-commit", os.O_RDONLY)
# struct posix_acl_xattr_header { u32 a_version = 2; } then entries
# { u16 e_tag, u16 e_perm, u32 e_id }: USER_OBJ rwx, GROUP_OBJ r-x, OTHER r-x.
acl = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, perm, 0xFFFFFFFF) for tag, perm in ((0x01, 7), (0x04, 5), (0x20, 5))
)
try:
    os.setxattr(x, "system.posix_acl_access", acl)
except OSError as e:
    print(f"acl: {e}")
os.setxattr(x, "user.lab", b"set")
os.dup2(y, x)
time.sleep(1)
