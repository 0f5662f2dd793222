"""One end of a port forward between two sandboxes (agent-sandbox's PortForward): TCP
connections carried over this process's stdin and stdout as lines, which the host relays
to the other end.

    relay.py listen PORT    accepts on 127.0.0.1:PORT (and [::1]:PORT) in this sandbox
    relay.py connect PORT   connects to PORT in this sandbox for each connection opened

Frames, one per line: "O <id>" a connection was opened (listening end to connecting end),
"D <id> <base64>" bytes on it, "C <id>" its sender sends no more. The listening end's first
line is "L <port>" once it listens, or "E <reason>" (then it exits). When its stdin ends (the
host is gone) the process exits.
"""

import base64
import os
import socket
import sys
import threading

CHUNK = 32 * 1024

_out = threading.Lock()
_conns = {}
_conns_lock = threading.Lock()


def send(line):
    with _out:
        sys.stdout.buffer.write(line.encode("ascii") + b"\n")
        sys.stdout.buffer.flush()


def register(cid, sock):
    with _conns_lock:
        _conns[cid] = {"sock": sock, "read": False, "write": False}
    threading.Thread(target=pump, args=(cid, sock), daemon=True).start()


def done(cid, side):
    """One direction of `cid` is over; the socket closes when both are."""
    with _conns_lock:
        conn = _conns.get(cid)
        if conn is None:
            return
        conn[side] = True
        if conn["read"] and conn["write"]:
            del _conns[cid]
            conn["sock"].close()


def pump(cid, sock):
    try:
        while True:
            data = sock.recv(CHUNK)
            if not data:
                break
            send("D %d %s" % (cid, base64.b64encode(data).decode("ascii")))
    except OSError:
        pass
    send("C %d" % cid)
    done(cid, "read")


def serve_stdin(on_open):
    for raw in sys.stdin.buffer:
        parts = raw.split()
        if len(parts) < 2 or not parts[1].isdigit():
            continue
        kind, cid = parts[0], int(parts[1])
        if kind == b"O" and on_open is not None:
            on_open(cid)
            continue
        with _conns_lock:
            conn = _conns.get(cid)
        if conn is None:
            continue
        if kind == b"D" and len(parts) == 3:
            try:
                conn["sock"].sendall(base64.b64decode(parts[2], validate=True))
            except (OSError, ValueError):
                pass
        elif kind == b"C":
            try:
                conn["sock"].shutdown(socket.SHUT_WR)
            except OSError:
                pass
            done(cid, "write")
    os._exit(0)


def listen(port):
    servers = []
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        try:
            server = socket.socket(family, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((address, port))
            server.listen(64)
            servers.append(server)
        except OSError as error:
            if family == socket.AF_INET:
                send("E %s:%d %s" % (address, port, error.strerror or error))
                sys.exit(1)
    ids = iter(range(1, 1 << 62))
    ids_lock = threading.Lock()

    def accept(server):
        while True:
            try:
                sock, _ = server.accept()
            except OSError:
                return
            with ids_lock:
                cid = next(ids)
            send("O %d" % cid)
            register(cid, sock)

    for server in servers:
        threading.Thread(target=accept, args=(server,), daemon=True).start()
    send("L %d" % port)
    serve_stdin(None)


def connect(port):
    def on_open(cid):
        for address in ("127.0.0.1", "::1"):
            try:
                sock = socket.create_connection((address, port), timeout=10)
                sock.settimeout(None)
                register(cid, sock)
                return
            except OSError:
                continue
        # Nothing listens: the opener sees its connection closed.
        send("C %d" % cid)

    send("L %d" % port)
    serve_stdin(on_open)


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    listen(port) if mode == "listen" else connect(port)
