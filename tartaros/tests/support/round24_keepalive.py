# Adversarial round 24a, F1: later requests on one intercepted plain-HTTP
# connection (to 192.0.2.1:PORT, redirected to the transparent listener)
# that name another host than their Host header, or none. Each case is one
# connection: an allowed first request, then the probe, pipelined.
import socket, sys
PORT = int(sys.argv[2])
HOST = f'localhost:{PORT}'
FIRST = f'GET /first HTTP/1.1\r\nHost: {HOST}\r\n\r\n'
CASES = {
    'absolute': f'GET http://evil.test:{PORT}/second-absolute HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n',
    'scheme': f'GET https://evil.test/second-scheme HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n',
    'nohost': f'GET http://evil.test:{PORT}/second-nohost HTTP/1.1\r\nConnection: close\r\n\r\n',
    'connect': 'CONNECT evil.test:443 HTTP/1.1\r\n\r\n',
}
for name, probe in CASES.items():
    s = socket.create_connection(('192.0.2.1', PORT), timeout=10)
    s.sendall((FIRST + probe).encode())
    answer = b''
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
    except OSError as e:
        print(name, 'error', e)
    s.close()
    print(name, answer.count(b'HTTP/1.1 200'), answer.count(b'HTTP/1.1 403'), flush=True)
