"""Issue 11, defect 6, against the real gateway: bytes that are neither HTTP/2 nor HTTP/1.1 get
400 and the connection is closed at once (it used to stay open until the client left), and a
Connect call whose declared body exceeds its method's limit is refused before the body is sent
(`resource_exhausted`: HTTP 429 in Connect's table; the server's side of the connection ends with
the answer, issue 35)."""
import socket
import time

import pytest

CLOSE_DEADLINE = 10  # generous: separates "closed" from "left open"


def read_until_closed(sock, deadline=CLOSE_DEADLINE):
    """What the server sent, and whether it closed the connection within the deadline."""
    sock.settimeout(0.2)
    data = b""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        except (ConnectionResetError, OSError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


@pytest.mark.parametrize("payload", [
    b"FOO / HTTP/1.1\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n",  # h2spec: an invalid connection preface
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 64,  # a TLS ClientHello to an h2c port
])
def test_gateway_closes_connections_after_400(system, payload):
    gw = system["gateway"]
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        s.sendall(payload)
        data, closed = read_until_closed(s)
    assert closed, f"connection left open after {data[:80]!r}"
    assert data.startswith(b"HTTP/1.1 400"), data[:200]


def test_connect_body_over_the_method_limit_is_refused_from_its_length(system):
    gw = system["gateway"]
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as s:
        # SignUp takes 64 KiB: its JSON body at most 132 KiB. 4 MiB are declared, none sent.
        s.sendall(b"POST /accounts.v1.Accounts/SignUp HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 4194304\r\n\r\n")
        data, closed = read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 429"), data[:200]
    assert b"connection: close" in data.lower()
    assert closed
