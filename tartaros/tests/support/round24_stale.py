# Adversarial round 24a, F2: a direct connection to the transparent
# listener from the ends of an earlier intercepted connection that was
# reset while it waited in the listener's backlog. argv: work dir, the
# upstream port, the local port to reuse, "control" to skip the reset one.
import socket, struct, sys, time
D, PORT, P = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
control = len(sys.argv) > 4
# Fill the listener's slots with idle intercepted connections (each waits
# for its first bytes), so that the next ones wait in its backlog.
hold = [socket.create_connection(('192.0.2.1', PORT)) for _ in range(256)]
time.sleep(0.5)
if not control:
    v = socket.socket()
    v.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    v.bind(('127.0.0.1', P))
    v.settimeout(3)
    v.connect(('192.0.2.99', PORT))
    v.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
    v.close()
time.sleep(0.2)
d = socket.socket()
d.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
d.bind(('127.0.0.1', P))
d.settimeout(15)
d.connect(('127.0.0.1', 3129))
d.sendall(f'GET /stale HTTP/1.1\r\nHost: localhost:{PORT}\r\nConnection: close\r\n\r\n'.encode())
for s in hold:
    s.close()
answer = b''
try:
    while True:
        chunk = d.recv(65536)
        if not chunk:
            break
        answer += chunk
except OSError as e:
    print('direct error', e)
print('direct got', answer[:12], flush=True)
