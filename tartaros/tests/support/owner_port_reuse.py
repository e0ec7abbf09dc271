# Misattribution of a gateway connection's pid by sharing its local port: X connects
# to the proxy from port P and waits in the listen backlog (the proxy's slots are held
# by idle connections). While X's connection is open, Y binds the same port P
# (SO_REUSEADDR, from 127.0.0.1 or 127.0.0.2) and connects to another destination: to
# its own server, or to the proxy itself from another address. When the map of owners
# is keyed by the local port alone, Y's connect overwrites X's entry, and the proxy,
# which looks the owner up on accept, names Y for X's request.
import socket, os, sys, time
from backlogged_x import hold_slots, start_x
D, HOLD, MODE = sys.argv[1], int(sys.argv[2]), sys.argv[3]
P = 25200 if MODE == "server" else 25201
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 47010)); srv.listen(5)
holders = hold_slots(HOLD)
x = start_x(D, holders, bind=('127.0.0.1', P), timeout=20)
y = os.fork()
if y == 0:  # Y: shares X's local port while X waits to be accepted
    for h in holders:
        h.close()
    open(os.path.join(D, 'Y_marker'), 'w').close(); print('Y pid', os.getpid())
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if MODE == 'server':
        s.bind(('127.0.0.1', P)); s.connect(('127.0.0.1', 47010))
    else:
        s.bind(('127.0.0.2', P)); s.connect(('127.0.0.1', 3128))
    print('Y connected'); sys.stdout.flush()
    time.sleep(0.3)
    os._exit(0)
os.waitpid(y, 0)
for h in holders:
    h.close()
os.waitpid(x, 0)
