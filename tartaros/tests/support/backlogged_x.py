# Shared by the gateway-owner tests: X, the real actor, connects to the proxy
# and waits in its listen backlog while the proxy's slots are held by idle
# connections, so that what the parent does next happens before the proxy
# accepts X and looks X's owner up.
import os, socket, sys, time


def hold_slots(count):
    holders = [socket.create_connection(('127.0.0.1', 3128)) for _ in range(count)]
    time.sleep(0.5)
    return holders


def start_x(directory, holders, bind=None, timeout=30):
    """Forks X, which leaves X_marker (its pid in the log), sends one GET
    through the proxy from `bind` (an (address, port) or None) and prints
    the answer. Returns X's pid once its request is sent."""
    r, w = os.pipe()
    x = os.fork()
    if x == 0:
        for h in holders:
            h.close()  # else X keeps the slots' connections open
        open(os.path.join(directory, 'X_marker'), 'w').close()
        print('X pid', os.getpid())
        s = socket.socket()
        if bind is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(bind)
        s.connect(('127.0.0.1', 3128))
        s.sendall(b'GET http://localhost:18080/by-X HTTP/1.1\r\nHost: localhost:18080\r\nConnection: close\r\n\r\n')
        os.write(w, b'x')
        s.settimeout(timeout)
        try:
            print('X got', s.recv(4096)[:12])
        except OSError as e:
            print('X error', e)
        sys.stdout.flush()
        os._exit(0)
    os.read(r, 1)
    return x
