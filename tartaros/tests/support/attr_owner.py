# Misattribution of a proxy connection's pid: process Y leaves an OWNER_PORT entry for
# (AF_INET, port P); process X then connects to the proxy from the same port P through a
# dual-stack IPv6 socket (::ffff:127.0.0.1), which sock_ops keys as AF_INET6. The proxy
# looks up AF_INET first and names Y.
import socket, os, struct, sys, time
D = sys.argv[1]
P = 45123
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(('127.0.0.1', 47000)); srv.listen(5)
pid = os.fork()
if pid == 0:  # Y: innocent process, connects to a local server from port P, then exits
    open(os.path.join(D, 'Y_marker'), 'w').close()
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('127.0.0.1', P)); s.connect(('127.0.0.1', 47000))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0)); s.close()
    os._exit(0)
os.waitpid(pid, 0)
c, _ = srv.accept(); c.close()
time.sleep(0.2)
pid = os.fork()
if pid == 0:  # X: the real actor
    open(os.path.join(D, 'X_marker'), 'w').close()
    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(('::', P)); s.connect(('::ffff:127.0.0.1', 3128))
    s.sendall(b'GET http://localhost:18080/by-X HTTP/1.1\r\nHost: localhost:18080\r\nConnection: close\r\n\r\n')
    print('X got', s.recv(4096)[:12]); sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
