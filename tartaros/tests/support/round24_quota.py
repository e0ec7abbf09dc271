# Adversarial round 24a, F3: B's proxy connection gets no owner entry (its
# user is over the connection quota) on the ends of A's connection, reset
# while it waited in the proxy's backlog. argv: work dir, the upstream
# port, the local port to reuse, the number of connects that use up the
# quota (0: the control).
import os, resource, socket, struct, sys, time
D, PORT, P, FLOOD = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
# The proxy's slots held, so A waits in its backlog.
holders = [socket.create_connection(('127.0.0.1', 3128)) for _ in range(256)]
time.sleep(0.5)
a = os.fork()
if a == 0:
    for h in holders:
        h.close()
    open(os.path.join(D, 'A_marker'), 'w').close()
    v = socket.socket()
    v.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    v.bind(('127.0.0.1', P))
    v.connect(('127.0.0.1', 3128))
    v.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    v.close()
    os._exit(0)
os.waitpid(a, 0)
time.sleep(0.3)
# Connects to the other gateway (the transparent listener), held open:
# each takes one of the user's slots.
flood = []
for _ in range(min(FLOOD, hard - 600)):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect(('127.0.0.1', 3129))
    except BlockingIOError:
        pass
    flood.append(s)
time.sleep(1.0)
print('flood', len(flood), flush=True)
b = os.fork()
if b == 0:
    for s in holders + flood:
        s.close()
    open(os.path.join(D, 'B_marker'), 'w').close()
    d = socket.socket()
    d.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    d.bind(('127.0.0.1', P))
    d.settimeout(20)
    d.connect(('127.0.0.1', 3128))
    d.sendall(f'GET http://localhost:{PORT}/from-B HTTP/1.1\r\nHost: localhost:{PORT}\r\nConnection: close\r\n\r\n'.encode())
    try:
        print('B got', d.recv(12), flush=True)
    except OSError as e:
        print('B error', e, flush=True)
    os._exit(0)
time.sleep(0.5)
for s in flood + holders:
    s.close()
os.waitpid(b, 0)
