"""Metadata changes Landlock has no right for: python3 meta.py OP PATH [TOKEN].

OP: chmod (world-writable), setuid (chmod 4755), utimes (mtime 1000000000), xattr
(user.lab = TOKEN), acl (a POSIX access ACL granting another user rwx),
chattr (FS_NODUMP_FL through a read-only fd), generation (PATH a new directory:
a file written in it before and after an FS_IOC_SETVERSION of the directory,
which makes the kernel's file handles of it stale). Failures are silent: the
runner checks the file's metadata from outside.
"""

import array
import fcntl
import os
import struct
import sys

FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_NODUMP_FL = 0x80086601, 0x40086602, 0x40
FS_IOC_SETVERSION = 0x40087602


def generation(path: str, token: str) -> None:
    os.mkdir(path)
    for name in ("before", "after"):
        with open(os.path.join(path, name), "w") as f:
            f.write(token)
        if name == "before":
            fd = os.open(path, os.O_RDONLY)
            try:
                fcntl.ioctl(fd, FS_IOC_SETVERSION, struct.pack("l", 4242))
            except OSError as e:
                print(f"generation: {e}", file=sys.stderr)
            os.close(fd)


def acl_blob() -> bytes:
    # POSIX ACL xattr: version 2, then (tag u16, perm u16, id u32) entries
    # sorted by tag: USER_OBJ, USER(65533) rwx, GROUP_OBJ, MASK rwx, OTHER.
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 7, 65533), (0x04, 4, 0xFFFFFFFF), (0x10, 7, 0xFFFFFFFF),
               (0x20, 4, 0xFFFFFFFF)]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def main() -> None:
    op, path = sys.argv[1], sys.argv[2]
    token = sys.argv[3] if len(sys.argv) > 3 else "x"
    try:
        if op == "chmod":
            os.chmod(path, 0o777)
        elif op == "setuid":
            os.chmod(path, 0o4755)
        elif op == "utimes":
            os.utime(path, (1000000000, 1000000000))
        elif op == "xattr":
            os.setxattr(path, "user.lab", token.encode())
        elif op == "acl":
            os.setxattr(path, "system.posix_acl_access", acl_blob())
        elif op == "chattr":
            fd = os.open(path, os.O_RDONLY)
            buf = array.array("l", [0])
            fcntl.ioctl(fd, FS_IOC_GETFLAGS, buf, True)
            buf[0] |= FS_NODUMP_FL
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, buf, True)
            os.close(fd)
        elif op == "generation":
            generation(path, token)
        else:
            raise SystemExit(f"unknown op {op}")
    except OSError as e:
        print(f"{op}: {e}", file=sys.stderr)


main()
