"""scripts/bench helper (run by social.sh): the gateway's resident memory per held browser stream.

Holds N SubscribeNotifications streams through the gateway, as browsers would: first N
Connect-streaming (connect+json) streams over HTTP/2 (100 per connection), then N gRPC-Web streams
over HTTP/1.1 (one connection each, as a browser's fetch makes when it cannot share). Each stream
counts as held once its first message (`started`) has arrived. VmRSS of the gateway is read
before and while they are held; the streams are then closed and the gateway must settle back.

Usage: browser_streams.py GATEWAY_PORT GATEWAY_PID TOKENS_FILE N
Prints: h1=<rss before KiB>|<rss held KiB>|<KiB per stream>, h2=... the same, after=<rss KiB>.
Each token may hold at most 4 streams (social's per-user bound is 5)."""
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events

port, gw_pid, tokens_file, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
tokens = [t.strip() for t in open(tokens_file) if t.strip()]
assert len(tokens) * 4 >= n, f"{len(tokens)} users cannot hold {n} streams (4 each)"
PATH = "/social.v1.Social/SubscribeNotifications"


def rss():
    for line in open(f"/proc/{gw_pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def settle():
    time.sleep(1.0)
    return rss()


def http1_streams():
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        body = b"\x00\x00\x00\x00\x00"
        s.sendall(
            f"POST {PATH} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/grpc-web+proto\r\n"
            f"x-grpc-web: 1\r\nauthorization: Bearer {tokens[i // 4]}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        socks.append(s)
    for s in socks:
        got = b""
        while b"\r\n\r\n" not in got or len(got.split(b"\r\n\r\n", 1)[1]) < 8:
            if b"\r\n\r\n" in got and b"grpc-status:" in got.split(b"\r\n\r\n", 1)[0].lower():
                break  # trailers-only: refused (reported below)
            chunk = s.recv(4096)
            if not chunk:
                raise SystemExit(f"bench: an HTTP/1.1 browser stream closed early: {got[:200]!r}")
            got += chunk
        head = got.split(b"\r\n\r\n", 1)[0].lower()
        if not got.startswith(b"HTTP/1.1 200") or b"grpc-status:" in head:
            raise SystemExit(f"bench: HTTP/1.1 browser stream refused: {got[:300]!r}")
    return socks


def http2_streams():
    conns = []
    per = 100
    body = b"\x00\x00\x00\x00\x02{}"
    for c in range((n + per - 1) // per):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        ids = []
        for k in range(min(per, n - c * per)):
            i = c * per + k
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"), (":path", PATH),
                                    ("content-type", "application/connect+json"), ("connect-protocol-version", "1"),
                                    ("authorization", f"Bearer {tokens[i // 4]}")])
            conn.send_data(sid, body, end_stream=True)
            ids.append(sid)
        s.sendall(conn.data_to_send())
        conns.append((s, conn, set(ids)))
    for s, conn, waiting in conns:
        while waiting:
            data = s.recv(65536)
            if not data:
                raise SystemExit("bench: an HTTP/2 browser connection closed early")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if ev.data[:1] == b"\x02":  # Connect's end-of-stream envelope: the call ended
                        raise SystemExit(f"bench: HTTP/2 browser stream ended: {ev.data[5:300]!r}")
                    waiting.discard(ev.stream_id)
                elif isinstance(ev, h2.events.ResponseReceived):
                    status = dict(ev.headers).get(":status")
                    if status != "200":
                        raise SystemExit(f"bench: HTTP/2 browser stream answered {status}")
                elif isinstance(ev, (h2.events.StreamReset, h2.events.ConnectionTerminated)):
                    raise SystemExit(f"bench: HTTP/2 browser stream ended early: {ev}")
            s.sendall(conn.data_to_send())
    return conns


# HTTP/2 first: its streams are the smaller, so what the HTTP/1.1 phase reuses of their freed
# memory hardly hides anything (the other order would hide the HTTP/2 cost almost entirely).
before2 = settle()
conns = http2_streams()
held2 = settle()
print(f"h2={before2}|{held2}|{(held2 - before2) / n:.1f}")
for s, _, _ in conns:
    s.close()
before = settle()
socks = http1_streams()
held = settle()
print(f"h1={before}|{held}|{(held - before) / n:.1f}")
for s in socks:
    s.close()
time.sleep(2)
print(f"after={rss()}")
