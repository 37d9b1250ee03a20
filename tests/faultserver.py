#!/usr/bin/env python3
"""faultserver.py — a small fault-injecting HTTP/1.1 server for tk's HTTP client tests.

Usage: faultserver.py [--port 0]. Listens on 127.0.0.1 only and prints its port as the first line of
stdout. A second listener on another 127.0.0.1 port (a different origin) serves the same routes; the
redirect routes use it. The server exits when its parent process goes away.

Routes (GET unless noted; <key> makes per-test state independent):
  /ok/<n>                 n bytes of pattern data (byte i = (31*i + 7) % 251); honours Range;
                          sends ETag and X-Repo-Commit
  /norange/<n>            the same, but ignores Range (always 200 with the whole body)
  /drop/<n>/<key>         first request: Content-Length n, half the body, then closes the connection;
                          later requests: like /ok/<n> (so a Range request resumes)
  /503-then-ok/<key>      503 with Retry-After: 1 the first time, then 200 "ok"
  /429-then-ok/<key>      429 with Retry-After: 0 the first time, then 200 "ok"
  /500-always             500 with a JSON error body
  /404, /410              that status, with X-Error-Code: EntryNotFound and X-Error-Message
  /403                    403 with a body
  /slow                   announces 100000 bytes, then drips 10 bytes every 0.2 s (for at most 10 s)
  /garbage                answers with bytes that are not HTTP, then closes
  /big, /big-chunked      2 MiB (with Content-Length / chunked, no length)
  /redirect-same          302 to /echo-auth on this origin (relative Location)
  /redirect-other-host    302 to the other listener's /echo-auth (a different origin)
  /redirect-localhost     302 to http://localhost:<port>/echo-auth (a different host name)
  /redirect-away-and-back 302 to the other listener, which redirects back to /echo-auth here
  /redirect-loop          302 to itself
  /redirect-file          302 to file:///etc/hostname (must be refused)
  /echo-auth              body: the Authorization header received, or "none"
  /echo (PUT/POST)        body: "<method> <length> <sha256 of body> <content-type>"
  /last-headers           the request line and headers of the last request (other than this one)
  /conn                   body: the client's port, so two requests on one connection get the same
"""
import argparse
import hashlib
import http.server
import os
import sys
import threading
import time

PATTERN = bytes((i * 31 + 7) % 251 for i in range(251))


def data(n):
    reps = n // len(PATTERN) + 1
    return (PATTERN * reps)[:n]


class State:
    lock = threading.Lock()
    counts = {}
    last = "none\n"
    main_port = 0
    alt_port = 0

    @classmethod
    def hit(cls, key):
        with cls.lock:
            cls.counts[key] = cls.counts.get(key, 0) + 1
            return cls.counts[key]


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "faultserver/1"

    def log_message(self, fmt, *args):
        pass

    def do_GET(self):
        self.route()

    def do_PUT(self):
        self.route()

    def do_POST(self):
        self.route()

    # -- helpers ------------------------------------------------------------------------------
    def reply(self, status, body=b"", headers=None):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def serve_data(self, n, ranges=True):
        body = data(n)
        hdrs = {"ETag": '"etag-%d"' % n, "X-Repo-Commit": "0123456789abcdef0123456789abcdef01234567",
                "Accept-Ranges": "bytes" if ranges else "none"}
        rng = self.headers.get("Range")
        if ranges and rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            if start >= n:
                hdrs["Content-Range"] = "bytes */%d" % n
                return self.reply(416, b"range not satisfiable", hdrs)
            hdrs["Content-Range"] = "bytes %d-%d/%d" % (start, n - 1, n)
            return self.reply(206, body[start:], hdrs)
        return self.reply(200, body, hdrs)

    def redirect(self, location):
        self.reply(302, b"moved", {"Location": location})

    # -- routes -------------------------------------------------------------------------------
    def route(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = self.path.split("?")[0]
        parts = [p for p in path.split("/") if p]
        if path != "/last-headers":
            with State.lock:
                State.last = "%s %s\n%s" % (self.command, self.path, str(self.headers))
        name = parts[0] if parts else ""
        me = "http://127.0.0.1:%d" % State.main_port
        other = "http://127.0.0.1:%d" % State.alt_port

        if name == "ok" and len(parts) == 2:
            return self.serve_data(int(parts[1]))
        if path == "/conn":
            return self.reply(200, str(self.client_address[1]).encode())
        if name == "norange" and len(parts) == 2:
            return self.serve_data(int(parts[1]), ranges=False)
        if name == "drop" and len(parts) == 3:
            n = int(parts[1])
            if State.hit(path) == 1:
                self.send_response(200)
                self.send_header("Content-Length", str(n))
                self.end_headers()
                self.wfile.write(data(n)[: n // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            return self.serve_data(n)
        if name == "503-then-ok" and len(parts) == 2:
            if State.hit(path) == 1:
                return self.reply(503, b"busy", {"Retry-After": "1"})
            return self.reply(200, b"ok")
        if name == "429-then-ok" and len(parts) == 2:
            if State.hit(path) == 1:
                return self.reply(429, b"slow down", {"Retry-After": "0"})
            return self.reply(200, b"ok")
        if name == "500-always":
            return self.reply(500, b'{"error": "boom"}', {"Content-Type": "application/json"})
        if name in ("404", "410"):
            return self.reply(int(name), b"Entry not found",
                              {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"})
        if name == "403":
            return self.reply(403, b"forbidden: bad token")
        if name == "slow":
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(50):
                    self.wfile.write(b"x" * 10)
                    self.wfile.flush()
                    time.sleep(0.2)
            except OSError:
                pass
            self.close_connection = True
            return
        if name == "garbage":
            self.wfile.write(b"this is not http at all\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True
            return
        if name == "big":
            return self.reply(200, data(2 << 20))
        if name == "big-chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            blob = data(2 << 20)
            try:
                for off in range(0, len(blob), 65536):
                    chunk = blob[off:off + 65536]
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                self.close_connection = True
            return
        if name == "redirect-same":
            return self.redirect("/echo-auth")
        if name == "redirect-other-host":
            return self.redirect(other + "/echo-auth")
        if name == "redirect-localhost":
            return self.redirect("http://localhost:%d/echo-auth" % State.main_port)
        if name == "redirect-away-and-back":
            return self.redirect(other + "/redirect-back")
        if name == "redirect-back":
            return self.redirect(me + "/echo-auth")
        if name == "redirect-loop":
            return self.redirect("/redirect-loop")
        if name == "redirect-file":
            return self.redirect("file:///etc/hostname")
        if name == "echo-auth":
            return self.reply(200, self.headers.get("Authorization") or "none")
        if name == "echo" and self.command in ("PUT", "POST"):
            text = "%s %d %s %s" % (self.command, len(body), hashlib.sha256(body).hexdigest(),
                                    self.headers.get("Content-Type") or "-")
            return self.reply(200, text)
        if name == "last-headers":
            with State.lock:
                text = State.last
            return self.reply(200, text)
        return self.reply(404, b"no such route")


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # clients that abort on purpose (size caps, timeouts) reset connections: not worth a traceback
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def watch_parent(ppid):
    while True:
        if os.getppid() != ppid:
            os._exit(0)
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=300.0)
    args = ap.parse_args()
    main_srv = Server(("127.0.0.1", args.port), Handler)
    alt_srv = Server(("127.0.0.1", 0), Handler)
    State.main_port = main_srv.server_address[1]
    State.alt_port = alt_srv.server_address[1]
    threading.Thread(target=alt_srv.serve_forever, daemon=True).start()
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    stop = threading.Timer(args.max_seconds, lambda: os._exit(0))
    stop.daemon = True
    stop.start()
    print(State.main_port, flush=True)
    try:
        main_srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
