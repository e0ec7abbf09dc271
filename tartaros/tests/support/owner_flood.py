# Eviction of a gateway connection's owner entry by a flood of other connects
# (adversarial round 7). X connects to the proxy and waits in its listen backlog
# (the proxy's slots are held by idle connections). While it waits, the parent
# opens FLOOD more TCP connections: to its own server on loopback ("local"), or
# to the proxy itself, whose backlog it has filled, each abandoned before the
# proxy could accept it ("abandoned"). When every connect left an owner entry in
# an LRU of 4,096, X's entry was evicted and X's request was logged without a pid.
import socket, os, sys, time
from backlogged_x import hold_slots, start_x
D, HOLD, MODE, FLOOD = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
holders = hold_slots(HOLD)
x = start_x(D, holders)
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
