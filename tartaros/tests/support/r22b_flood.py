# The other user's agent (adversarial round 22b): keeps N intercepted connects
# in flight (non-blocking connects to 203.0.113.x:80, redirected to its own
# transparent proxy, where they wait in the backlog or in SYN_SENT), closing the
# oldest and opening a new one all the time, for DUR seconds. Writes WORK/ready
# once N are in flight. In the service's shared LRU maps of 4,096 entries this
# evicted the entries of the victim's connections waiting in its own backlog.
import os, resource, socket, sys, time
work, n, dur = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
live, made, ready = [], 0, False
end = time.time() + dur
while time.time() < end:
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(('203.0.113.%d' % (made % 250 + 1), 80))
    except (BlockingIOError, OSError):
        pass
    live.append(c)
    made += 1
    if len(live) > n:
        live.pop(0).close()
    if not ready and len(live) >= n:
        open(os.path.join(work, 'ready'), 'w').close()
        ready = True
print('flooded', made, 'live', len(live))
