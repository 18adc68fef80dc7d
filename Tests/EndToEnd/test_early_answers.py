"""Issue 35 against the real gateway (accounts and social behind it): what clients from outside
met first.

- Answers sent before a request's body was read (no token: UNAUTHENTICATED; a body over the
  limit: RESOURCE_EXHAUSTED) reach a client that is still sending, over HTTP/1.1 (the gateway
  used to close at once, the kernel reset the connection under the client's write: EPIPE or
  ECONNRESET in connect-node, net::ERR_CONNECTION_RESET in Chromium for a 3 MiB UploadAvatar) and
  over HTTP/2 (RST_STREAM(NO_ERROR) after the answer asks the client to stop; the connection
  serves on).
- HTTP/1.1 framing: a chunk size past the limit is refused at once (it used to hold the
  connection 75 s), CONNECT is answered and closed (its answer had no length on a kept-alive
  connection), HEAD says what GET would.
- The gateway's own Health/Watch ends at the deadline over gRPC-Web and Connect as over gRPC.
- A spent rate limit says when to come back: RetryInfo over gRPC, Retry-After and the RateLimit
  fields over HTTP."""
import math
import socket
import time

import grpc
import pytest

BODY = 3 * 1024 * 1024  # the avatar Chromium failed to upload
LARGE = 8 * 1024 * 1024  # written at once, a body this large outlasts the old close nearly every time
UPLOAD_AVATAR = "/accounts.v1.Accounts/UploadAvatar"  # authenticated, 1 MiB + 16 KiB
SIGN_UP = "/accounts.v1.Accounts/SignUp"  # public, 64 KiB: a JSON body of at most 132 KiB


def frame(payload=b"", flag=0):
    return bytes([flag]) + len(payload).to_bytes(4, "big") + payload


def first_response(data):
    """(status, headers lower-cased) of the first HTTP/1.1 response in data, or None."""
    if b"\r\n\r\n" not in data:
        return None
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in head[1:]:
        k, v = line.split(":", 1)
        headers[k.strip().lower()] = v.strip()
    return int(head[0].split()[1]), headers


def h1_exchange(port, head, body, wait_for_answer):
    """Writes the head, then the body (at once, or once the answer has come), then reads until
    the answer's head is in or the server closes. Returns (every write went out, bytes read)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    data = b""
    try:
        s.sendall(head)

        def read_answer():
            nonlocal data
            end = time.monotonic() + 5
            while first_response(data) is None and time.monotonic() < end:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not chunk:
                    return
                data += chunk

        if wait_for_answer:
            read_answer()
        try:
            s.sendall(body)
            wrote = True
        except OSError:  # EPIPE, ECONNRESET: the server closed under the write
            wrote = False
        read_answer()
        return wrote, data
    finally:
        s.close()


@pytest.mark.parametrize("wait_for_answer", [False, True])
def test_http1_early_answers_reach_clients_still_sending(system, wait_for_answer):
    port = system["gateway"].port
    def grpc_web(size):
        return (f"POST {UPLOAD_AVATAR} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/grpc-web+proto\r\nX-Grpc-Web: 1\r\n"
                f"Content-Length: {size + 5}\r\n\r\n".encode(), frame(b"\0" * size))

    def connect(size):
        return (f"POST {SIGN_UP} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode(),
                b"{" + b" " * (size - 2) + b"}")

    cases = [
        # (what, (head, body), expected status, expected grpc-status)
        ("gRPC-Web UploadAvatar of 3 MiB (over its limit)", grpc_web(BODY), 200, "8"),
        ("gRPC-Web UploadAvatar of 2 MB without a token", grpc_web(2_000_000), 200, "16"),
        ("Connect JSON SignUp of 3 MiB (over its limit)", connect(BODY), 429, None),
    ]
    if not wait_for_answer:
        cases += [("gRPC-Web UploadAvatar of 8 MiB", grpc_web(LARGE), 200, "8"), ("Connect JSON SignUp of 8 MiB", connect(LARGE), 429, None)]
    failures = {}
    for what, (head, body), status, grpc_status in cases:
        for attempt in range(20):
            wrote, data = h1_exchange(port, head, body, wait_for_answer)
            answer = first_response(data)
            ok = wrote and answer is not None and answer[0] == status and answer[1].get("grpc-status") == grpc_status
            if not ok:
                failures.setdefault(what, []).append((attempt, "wrote" if wrote else "write failed", data[:40]))
    assert not failures, f"waiting for the answer: {wait_for_answer}: " + "; ".join(f"{w}: {len(f)} of 20 failed, {f[:2]}" for w, f in failures.items())


def test_http2_early_answers_stop_the_upload_and_keep_the_connection(system):
    import h2.config
    import h2.connection
    import h2.events as ev
    import h2.exceptions

    port = system["gateway"].port
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    try:
        def call(path, headers, body):
            """Sends as much of body as the windows allow until the stream ends or is reset:
            (response headers, reset code or None, bytes sent)."""
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "gw"), (":path", path),
                                    ("content-length", str(len(body))), *headers])
            sent, response, reset, ended = 0, None, None, False
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and reset is None and not (ended and sent == len(body)):
                while sent < len(body) and reset is None:
                    try:
                        n = min(len(body) - sent, conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    except h2.exceptions.StreamClosedError:
                        break
                    if n <= 0:
                        break
                    conn.send_data(sid, body[sent:sent + n], end_stream=sent + n == len(body))
                    sent += n
                sock.sendall(conn.data_to_send())
                data = sock.recv(65536)
                assert data, "the server closed the connection"
                for e in conn.receive_data(data):
                    if isinstance(e, ev.ConnectionTerminated):
                        raise AssertionError(f"GOAWAY {e.error_code}")
                    if getattr(e, "stream_id", None) != sid:
                        continue
                    if isinstance(e, ev.ResponseReceived):
                        response = dict(e.headers)
                    elif isinstance(e, ev.StreamEnded):
                        ended = True
                    elif isinstance(e, ev.StreamReset):
                        reset = e.error_code
                    elif isinstance(e, ev.DataReceived):
                        conn.acknowledge_received_data(e.flow_controlled_length, sid)
                sock.sendall(conn.data_to_send())
            return response, reset, sent

        for _ in range(10):
            for size, code in [(BODY, "8"), (1_000_000, "16")]:
                response, reset, sent = call(UPLOAD_AVATAR, [("content-type", "application/grpc-web+proto")], frame(b"\0" * size))
                assert response and response[":status"] == "200" and response.get("grpc-status") == code, response
                assert reset == 0 and sent < size, (reset, sent)  # RST_STREAM(NO_ERROR): the client stopped early
            response, reset, sent = call(SIGN_UP, [("content-type", "application/json")], b"{" + b" " * (BODY - 2) + b"}")
            assert response and response[":status"] == "429", response
            assert reset == 0 and sent < BODY, (reset, sent)
        # The same connection still serves a good call.
        response, reset, _ = call("/grpc.health.v1.Health/Check", [("content-type", "application/json")], b"{}")
        assert response[":status"] == "200" and reset is None, response
    finally:
        sock.close()


def read_until_closed(sock, deadline=5):
    sock.settimeout(0.2)
    data, end = b"", time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def test_http1_framing_edge_cases(system):
    port = system["gateway"].port
    head = b"POST /upload HTTP/1.1\r\nHost: gw\r\nContent-Type: multipart/form-data; boundary=x\r\nTransfer-Encoding: chunked\r\n\r\n"
    # A chunk of 2^64 - 1 bytes: over the form's limit, refused at once.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(head + b"ffffffffffffffff\r\nabc")
        data, closed = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 413") and closed and time.monotonic() - t0 < 3, (data[:100], closed)
    # A size past 64 bits is malformed.
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head + b"1ffffffffffffffff\r\nabc")
        data, closed = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 400") and closed, data[:100]
    # CONNECT: answered, then closed (the answer has no length: the close delimits it).
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\nGET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        data, closed = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 501") and closed and time.monotonic() - t0 < 3, (data[:100], closed)
    # HEAD says what GET would.
    for page in ["/", "/healthz", "/status", "/status.json", "/metrics", "/upload"]:
        lengths = []
        for method in ("GET", "HEAD"):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(f"{method} {page} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n".encode())
                data, _ = read_until_closed(s)
            status, headers = first_response(data)
            body = data.split(b"\r\n\r\n", 1)[1]
            lengths.append(int(headers["content-length"]))
            assert status == 200 and len(body) == (lengths[-1] if method == "GET" else 0), (page, method, data[:200])
        get, head_length = lengths
        assert head_length > 0 and abs(head_length - get) * 10 < get, (page, lengths)


def test_health_watch_ends_at_its_deadline_in_every_protocol(system):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    port = system["gateway"].port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        t0 = time.monotonic()
        with pytest.raises(grpc.RpcError) as e:
            for _ in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=3):
                pass
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 2.8 < time.monotonic() - t0 < 5
    for content_type, header, body, ending in [
        ("application/grpc-web+proto", "grpc-timeout: 3S", frame(), b"grpc-status: 4"),
        ("application/connect+json", "connect-timeout-ms: 3000", frame(b"{}"), b"deadline_exceeded"),
    ]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            t0 = time.monotonic()
            s.sendall(f"POST /grpc.health.v1.Health/Watch HTTP/1.1\r\nHost: gw\r\nContent-Type: {content_type}\r\n{header}\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            data = b""
            while not data.endswith(b"0\r\n\r\n") and time.monotonic() - t0 < 10:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        elapsed = time.monotonic() - t0
        assert ending in data and 2.8 < elapsed < 5, (content_type, elapsed, data[-200:])


def test_rate_limits_say_when_to_come_back(system, stubs):
    from google.rpc import error_details_pb2, status_pb2

    gw = system["start_gateway"]({"GATEWAY_ADDRESS_RATE": "0.5", "GATEWAY_ADDRESS_BURST": "1"})
    # The first call spends the burst (the health probe's calls are not limited).
    answers = []
    for _ in range(2):
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
            s.sendall(b"POST /accounts.v1.Accounts/GetSigningKeys HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
            answers.append(read_until_closed(s)[0])
    assert first_response(answers[0])[0] == 200
    status, headers = first_response(answers[1])
    assert status == 429, answers[1][:300]
    after = int(headers["retry-after"])
    assert 1 <= after <= 2
    assert headers["ratelimit-policy"] == '"address";q=1;w=2', headers
    assert headers["ratelimit"] == f'"address";r=0;t={after}', headers
    assert b'"type":"google.rpc.RetryInfo"' in answers[1]

    from accounts.v1 import accounts_pb2, accounts_pb2_grpc
    with grpc.insecure_channel(f"127.0.0.1:{gw.port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            accounts_pb2_grpc.AccountsStub(ch).GetSigningKeys(accounts_pb2.GetSigningKeysRequest(), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(e.value.trailing_metadata())
    st = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
    info = error_details_pb2.RetryInfo()
    assert st.details[0].Unpack(info)
    wait = info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    assert 0 < wait <= 2 and trailers["retry-after"] == str(math.ceil(wait)), (info, trailers)
