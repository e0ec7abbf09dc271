# Eviction of a gateway connection's owner entry by a flood of other connects
# (adversarial round 7). X connects to the proxy and waits in its listen backlog
# (the proxy's slots are held by idle connections). While it waits, the parent
# opens FLOOD more TCP connections: to its own server on loopback ("local"), or
# to the proxy itself, whose backlog it has filled, each abandoned before the
# proxy could accept it ("abandoned"). When every connect left an owner entry in
# an LRU of 4,096, X's entry was evicted and X's request was logged without a pid.
import errno, socket, os, sys, time
D, HOLD, MODE, FLOOD = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
holders = [socket.create_connection(('127.0.0.1', 3128)) for _ in range(HOLD)]
time.sleep(0.5)
r, w = os.pipe()
x = os.fork()
if x == 0:  # X: the real actor
    for h in holders:
        h.close()  # else X keeps the slots' connections open
    open(os.path.join(D, 'X_marker'), 'w').close()
    s = socket.create_connection(('127.0.0.1', 3128))
    s.sendall(b'GET http://localhost:18080/by-X HTTP/1.1\r\nHost: localhost:18080\r\nConnection: close\r\n\r\n')
    os.write(w, b'x')
    s.settimeout(30)
    try:
        print('X got', s.recv(4096)[:12])
    except OSError as e:
        print('X error', e)
    sys.stdout.flush()
    os._exit(0)
os.read(r, 1)
time.sleep(0.2)
done = 0
if MODE == 'local':
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(('127.0.0.1', 47011)); srv.listen(64)
    for _ in range(FLOOD):
        c = socket.create_connection(('127.0.0.1', 47011))
        a, _ = srv.accept()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b'\x01\x00\x00\x00\x00\x00\x00\x00')
        a.close(); c.close()
        done += 1
else:
    # Fill the backlog behind X, so that further SYNs are dropped.
    fillers = []
    for _ in range(200):
        f = socket.socket(); f.setblocking(False)
        try:
            f.connect(('127.0.0.1', 3128))
        except BlockingIOError:
            pass
        fillers.append(f)
    time.sleep(0.3)
    for _ in range(FLOOD):
        c = socket.socket(); c.setblocking(False)
        try:
            c.connect(('127.0.0.1', 3128))
        except BlockingIOError:
            pass
        c.close()
        done += 1
    for f in fillers:
        f.close()
print('flooded', done); sys.stdout.flush()
for h in holders:
    h.close()
os.waitpid(x, 0)
