"""scripts/bench helper (run by gateway-streams.sh): what a relayed server stream costs a proxy.

Holds N SubscribeNotifications streams (social.v1.Social) open through one port (the gateway,
nghttpx, or social-service itself as the reference), PER streams on each HTTP/2 connection, and
then has social push ROUNDS notifications to every stream. The client is raw HTTP/2 on sockets
(HPACK from the `hpack` package, no per-frame library work): it announces 2^31-1 bytes of flow-
control window for the connection and every stream, so it never sends WINDOW_UPDATE and reading
a message costs it a few Python operations (it must not be what limits the relay). A stream is
open once its first message (`started`) arrived; a stream that ends (HEADERS with END_STREAM, or
RST_STREAM) fails the run.

Measured on the processes PIDS (comma-separated: the proxy's, e.g. nghttpx's master and worker;
for the reference, social's):
  - VmRSS before the streams and with all of them open and idle (2 s after the last opened):
    KiB per stream; open descriptors and threads while held;
  - CPU (/proc/PID/stat utime+stime) over the ROUNDS notifications: µs per relayed message
    (N × ROUNDS messages, each counted by the client from the gRPC length prefixes); the same
    for social (SERVICE_PID), which produces them.

Usage: relay_streams.py PORT PIDS SERVICE_PID TOKENS_FILE USER_IDS_FILE N PER ROUNDS SOCIAL_PORT SERVICE_TOKEN
Prints key=value lines: rss_before, rss_held, kib_per_stream, fds, threads, messages, seconds,
cpu_us_per_message, service_cpu_us_per_message. Needs social's Python stubs on PYTHONPATH."""
import os
import selectors
import socket
import struct
import sys
import threading
import time

import grpc
import hpack
from social.v1 import social_pb2 as spb, social_pb2_grpc as srpc

(port, pids, service_pid, tokens_file, users_file, n, per, rounds, social_port, service_token) = sys.argv[1:11]
port, n, per, rounds, service_pid = int(port), int(n), int(per), int(rounds), int(service_pid)
pids = [int(p) for p in pids.split(",") if p]
tokens = [t.strip() for t in open(tokens_file) if t.strip()]
user_ids = [u.strip() for u in open(users_file) if u.strip()]
streams_per_user = (n + len(tokens) - 1) // len(tokens)
PATH = "/social.v1.Social/SubscribeNotifications"
TICK_US = 1e6 / os.sysconf("SC_CLK_TCK")
MAX_WINDOW = 2**31 - 1


def rss():
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


def ticks(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def threads():
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("Threads:"):
                total += int(line.split()[1])
    return total


def fds():
    return sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in pids)


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Conn:
    """One client connection: its socket, unread bytes, and per stream the bytes still missing
    of the current message (-k: k bytes of its 5-byte prefix read so far)."""

    def __init__(self, index, count):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.want = {}      # stream id -> bytes missing of the current message
        self.prefix = {}    # stream id -> bytes of a length prefix split across frames
        self.got = {}       # stream id -> messages received
        self.bytes = 0      # DATA payload bytes
        enc = hpack.Encoder()
        out = [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
               frame(4, 0, 0, struct.pack(">HI", 2, 0) + struct.pack(">HI", 4, MAX_WINDOW)),  # no push; window
               frame(8, 0, 0, struct.pack(">I", MAX_WINDOW - 65535))]
        for k in range(count):
            sid = 1 + 2 * k
            i = index * per + k
            block = enc.encode([(":method", "POST"), (":scheme", "http"), (":authority", "127.0.0.1"), (":path", PATH),
                                ("content-type", "application/grpc"), ("te", "trailers"),
                                ("authorization", f"Bearer {tokens[i // streams_per_user]}")])
            out.append(frame(1, 4, sid, block))                 # HEADERS, END_HEADERS
            out.append(frame(0, 1, sid, b"\x00\x00\x00\x00\x00"))  # empty request, END_STREAM
            self.want[sid] = 0
            self.got[sid] = 0
        self.sock.sendall(b"".join(out))
        self.sock.setblocking(False)

    def data(self, sid, payload):
        want = self.want.get(sid)
        if want is None:
            return 0
        self.bytes += len(payload)
        pre = self.prefix.pop(sid, b"")
        pos, end, messages = 0, len(payload), 0
        while pos < end:
            if want > 0:
                take = min(want, end - pos)
                want -= take
                pos += take
                continue
            need = 5 - len(pre)
            pre += payload[pos:pos + need]
            pos += min(need, end - pos)
            if len(pre) < 5:
                break
            want = int.from_bytes(pre[1:5], "big")
            pre = b""
            messages += 1
        if pre:
            self.prefix[sid] = pre
        self.want[sid] = want
        self.got[sid] += messages
        return messages

    def pump(self):
        """Reads what is there; returns messages completed. Fails on an ended stream."""
        try:
            chunk = self.sock.recv(1 << 20)
        except BlockingIOError:
            return 0
        if not chunk:
            raise SystemExit("bench: a relayed-stream connection closed")
        self.buf += chunk
        buf, pos, messages, reply = self.buf, 0, 0, []
        while len(buf) - pos >= 9:
            length = int.from_bytes(buf[pos:pos + 3], "big")
            if len(buf) - pos < 9 + length:
                break
            kind, flags = buf[pos + 3], buf[pos + 4]
            sid = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            payload = bytes(buf[pos + 9:pos + 9 + length])
            pos += 9 + length
            if kind == 0:  # DATA
                if flags & 0x8:  # PADDED
                    payload = payload[1:len(payload) - payload[0]]
                messages += self.data(sid, payload)
                if flags & 1:
                    raise SystemExit(f"bench: stream {sid} ended (DATA with END_STREAM)")
            elif kind == 1 and flags & 1 and sid in self.want:
                raise SystemExit(f"bench: stream {sid} ended (trailers: refused or closed; {self.got[sid]} messages)")
            elif kind == 3:
                raise SystemExit(f"bench: stream {sid} reset, error {int.from_bytes(payload[:4], 'big')}")
            elif kind == 4 and not flags & 1:
                reply.append(frame(4, 1, 0))  # SETTINGS ACK
            elif kind == 6 and not flags & 1:
                reply.append(frame(6, 1, 0, payload))  # PING ACK
            elif kind == 7:
                raise SystemExit(f"bench: GOAWAY, error {int.from_bytes(payload[4:8], 'big')}")
        del buf[:pos]
        if reply:
            self.sock.setblocking(True)
            self.sock.sendall(b"".join(reply))
            self.sock.setblocking(False)
        return messages


def read_until(conns, total, limit):
    sel = selectors.DefaultSelector()
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    got = 0
    deadline = time.monotonic() + limit
    while got < total:
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {got} of {total} messages within {limit} s")
        for key, _ in sel.select(1):
            got += key.data.pump()
    sel.close()
    return got


time.sleep(1)
rss_before = rss()
t_open = time.monotonic()
conns = [Conn(c, min(per, n - c * per)) for c in range((n + per - 1) // per)]
read_until(conns, n, 120)  # every stream's `started`
assert all(v == 1 for c in conns for v in c.got.values()), "a stream got more than its first message"
open_s = time.monotonic() - t_open
time.sleep(2)
rss_held, held_fds, held_threads = rss(), fds(), threads()

# ROUNDS notifications to every user: each reaches every stream of theirs.
social = srpc.SocialInternalStub(grpc.insecure_channel(f"127.0.0.1:{social_port}"))
stamp = time.time_ns()
errors = []


def send():
    try:
        for r in range(rounds):
            for i in range(0, len(user_ids), 100):
                social.SendNotification(
                    spb.SendNotificationRequest(event_id=f"relay:{stamp}:{r}:{i}", recipient_user_ids=user_ids[i:i + 100],
                                                kind=spb.NOTIFICATION_KIND_TASK_REMINDER, title="Bench", body="x" * 40),
                    metadata=[("x-service-token", service_token)], timeout=60)
    except Exception as e:  # noqa: BLE001 (reported by the main thread)
        errors.append(e)


bytes0 = sum(c.bytes for c in conns)
ticks0 = [ticks(p) for p in pids]
service0 = ticks(service_pid)
t0 = time.monotonic()
sender = threading.Thread(target=send)
sender.start()
messages = n * rounds
try:
    if messages:
        read_until(conns, messages, 120)
finally:
    sender.join()
seconds = time.monotonic() - t0
cpu = sum(ticks(p) for p in pids) - sum(ticks0)
service_cpu = ticks(service_pid) - service0
if errors:
    raise SystemExit(f"bench: SendNotification failed: {errors[0]}")
for c in conns:
    c.sock.close()
print(f"rss_before={rss_before}")
print(f"rss_held={rss_held}")
print(f"kib_per_stream={(rss_held - rss_before) / n:.2f}")
print(f"fds={held_fds}")
print(f"threads={held_threads}")
print(f"open_seconds={open_s:.1f}")
print(f"messages={messages}")
print(f"seconds={seconds:.2f}")
if messages:
    print(f"bytes_per_message={(sum(c.bytes for c in conns) - bytes0) / messages:.1f}")
if messages:
    print(f"cpu_us_per_message={cpu * TICK_US / messages:.2f}")
    print(f"service_cpu_us_per_message={service_cpu * TICK_US / messages:.2f}")
time.sleep(1)  # the closed streams leave before the next target starts
