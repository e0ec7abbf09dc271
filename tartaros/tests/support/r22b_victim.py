# The victim's agent (adversarial round 22b): fills its proxy's slots with idle
# connections, explicit (127.0.0.1:3128) and intercepted (to 198.51.100.7:PORT,
# redirected to 3129), so that N explicit and N intercepted GETs wait in the
# backlogs for WAIT seconds while another user's agent floods; then lets them
# through and prints how many got the host server's answer.
import socket, sys, threading, time
port, n, wait, slots = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
far = ('198.51.100.7', port)
holders = [socket.create_connection(('127.0.0.1', 3128)) for _ in range(slots)]
holders += [socket.create_connection(far) for _ in range(slots)]
time.sleep(0.5)
answers = {}


def get(name, dest, target):
    s = socket.socket()
    s.settimeout(20)
    try:
        s.connect(dest)
        s.sendall(b'GET %s HTTP/1.1\r\nHost: localhost:%d\r\nConnection: close\r\n\r\n'
                  % (target.encode(), port))
        answers[name] = s.recv(200).split(b'\r\n')[0]
    except Exception as e:
        answers[name] = repr(e).encode()


threads = []
for i in range(n):
    url = 'http://localhost:%d/explicit-%d' % (port, i)
    threads.append(threading.Thread(target=get, args=('x%d' % i, ('127.0.0.1', 3128), url)))
    threads.append(threading.Thread(target=get, args=('t%d' % i, far, '/intercepted-%d' % i)))
for t in threads:
    t.start()
time.sleep(wait)
for h in holders:
    h.close()
for t in threads:
    t.join()
ok = sum(1 for v in answers.values() if v.startswith(b'HTTP/1.1 200'))
print('victim ok=%d of %d' % (ok, len(answers)), sorted(set(answers.values())))
