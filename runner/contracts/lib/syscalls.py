"""Kernel attack surface a sandbox should close: python3 syscalls.py NAME OUT TOKEN.

Writes ALLOWED-TOKEN to OUT only when the call succeeded (the effect is the
call's success itself; nothing else of it is visible from the host), and
BLOCKED <errno> otherwise. NAME: keyctl, bpf, perf, userfaultfd, io_uring,
ordinary (pipe, eventfd, memfd, epoll: what every program needs).
"""

import ctypes
import os
import select
import sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {"add_key": 248, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425}


def sys_call(name, *args):
    ret = libc.syscall(ctypes.c_long(NR[name]), *args)
    if ret < 0:
        raise OSError(ctypes.get_errno(), name)
    return ret


def keyctl():
    # a key in the user keyring, which every session of this uid shares
    sys_call("add_key", ctypes.c_char_p(b"user"), ctypes.c_char_p(b"tartaros-lab"), ctypes.c_char_p(b"x"),
             ctypes.c_size_t(1), ctypes.c_int(-4))


def bpf():
    attr = (ctypes.c_uint32 * 32)(2, 4, 4, 1)  # BPF_MAP_TYPE_ARRAY, key 4, value 4, 1 entry
    os.close(sys_call("bpf", ctypes.c_int(0), ctypes.byref(attr), ctypes.c_uint(ctypes.sizeof(attr))))


def perf():
    attr = (ctypes.c_uint8 * 128)()
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size; config 0 = cpu-clock
    # every process on CPU 0: observing what is outside the sandbox
    os.close(sys_call("perf_event_open", ctypes.byref(attr), ctypes.c_int(-1), ctypes.c_int(0),
                      ctypes.c_int(-1), ctypes.c_ulong(0)))


def userfaultfd():
    # kernel-mode faults too (no UFFD_USER_MODE_ONLY): the exploit primitive
    os.close(sys_call("userfaultfd", ctypes.c_int(os.O_CLOEXEC)))


def io_uring():
    params = (ctypes.c_uint8 * 120)()
    os.close(sys_call("io_uring_setup", ctypes.c_uint(4), ctypes.byref(params)))


def ordinary():
    r, w = os.pipe()
    os.write(w, b"x")
    assert os.read(r, 1) == b"x"
    ep = select.epoll()
    ep.register(r, select.EPOLLIN)
    ep.close()
    fd = os.eventfd(0)
    os.close(fd)
    m = os.memfd_create("lab")
    os.write(m, b"y")
    os.close(m)


def main():
    name, out, token = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        {"keyctl": keyctl, "bpf": bpf, "perf": perf, "userfaultfd": userfaultfd, "io_uring": io_uring,
         "ordinary": ordinary}[name]()
        result = f"ALLOWED-{token}\n"
    except OSError as e:
        result = f"BLOCKED {e.errno}\n"
    try:
        with open(out, "w") as f:
            f.write(result)
    except OSError:
        pass


main()
