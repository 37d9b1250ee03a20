#!/usr/bin/env python3
"""N requests that become readable at once on one HTTP server thread: each is answered at once.

usage: http_burst.py URL PID N PATH

Opens N connections to URL, waits until the server holds them idle, stops the server (SIGSTOP, PID),
sends a GET PATH on every connection, lets the server go on (SIGCONT) and requires every answer to be
a 200 within 15 s. libmicrohttpd's epoll loop took 128 events (its MAX_EVENTS), then waited again, up
to the connection timeout, before serving them: one thread's 128 connections whose requests arrived
together sat unanswered (tk serve-model's 500 connections test, once in CI). Start the server with
--threads 1 so that every connection lands on one thread.
"""
import concurrent.futures as cf
import os
import re
import signal
import socket
import sys
import time


def main():
    url, pid, n, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    host, port = re.match(r"http://([^:/]+):(\d+)", url).groups()
    socks = [socket.create_connection((host, int(port)), timeout=60) for _ in range(n)]
    time.sleep(1.0)  # every connection accepted and idle in the server's event loop
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)  # stopped for sure: no thread wakes on the first request
        req = b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode()
        for s in socks:
            s.sendall(req)
        time.sleep(0.3)
    finally:
        os.kill(pid, signal.SIGCONT)
    t0 = time.time()

    def read(s):
        data = b""
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    break
                data += d
        except OSError as e:
            return "%s after %.1f s" % (type(e).__name__, time.time() - t0)
        finally:
            s.close()
        if data.startswith(b"HTTP/1.1 200"):
            return None
        return "%r after %.1f s" % (data[:40], time.time() - t0)

    with cf.ThreadPoolExecutor(64) as ex:
        bad = [w for w in ex.map(read, socks) if w]
    took = time.time() - t0
    if bad or took > 15:
        print("FAIL %d requests readable at once: %d unanswered (%s); all ended after %.1f s" %
              (n, len(bad), "; ".join(bad[:3]), took))
        return 1
    print("%d requests readable at once: all answered in %.1f s: ok" % (n, took))
    return 0


if __name__ == "__main__":
    sys.exit(main())
