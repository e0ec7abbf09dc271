"""Sends one UDP datagram with sendmmsg(2), not sendto/sendmsg:
python3 mmsg.py HOST PORT TEXT. The runner reads the host listener and the log."""

import ctypes
import socket
import struct
import sys

libc = ctypes.CDLL(None, use_errno=True)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32), ("iov", ctypes.POINTER(IoVec)),
                ("iovlen", ctypes.c_size_t), ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", MsgHdr), ("len", ctypes.c_uint)]


def main() -> None:
    host, port, text = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    addr = ctypes.create_string_buffer(struct.pack("<HH4s8x", socket.AF_INET, socket.htons(port),
                                                   socket.inet_aton(host)), 16)
    data = ctypes.create_string_buffer(text, len(text))
    iov = IoVec(ctypes.addressof(data), len(text))
    msg = MMsgHdr(MsgHdr(ctypes.addressof(addr), 16, ctypes.pointer(iov), 1, None, 0, 0), 0)
    n = libc.sendmmsg(s.fileno(), ctypes.byref(msg), 1, 0)
    print(f"sendmmsg: {n} errno {ctypes.get_errno()}", file=sys.stderr)


main()
