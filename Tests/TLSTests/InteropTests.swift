import Foundation
import NIOCore
import NIOPosix
import Testing

@testable import RPCTLS

/// Peers we did not write: Python's `ssl` module (OpenSSL through CPython's own bindings) and the
/// `openssl s_client` tool, against our server; a Python TLS server against our client.
@Suite(.serialized) struct InteropTests {
    static let python = executable("python3")
    static let openssl = executable("openssl")

    /// Connects with `ssl.create_default_context(cafile=…)` (verification and host name checks on),
    /// offers ALPN h2, sends 1 MiB, reads the echo, then closes with close_notify (`unwrap`).
    static let pythonClient = """
        import socket, ssl, sys
        cafile, port, version = sys.argv[1], int(sys.argv[2]), sys.argv[3]
        ctx = ssl.create_default_context(cafile=cafile)
        ctx.set_alpn_protocols(["h2"])
        if version == "1.2":
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        payload = bytes((i * 7 + (i >> 8)) & 0xFF for i in range(1 << 20))
        with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(payload)
                got = bytearray()
                while len(got) < len(payload):
                    chunk = tls.recv(1 << 16)
                    if not chunk:
                        break
                    got += chunk
                print(tls.selected_alpn_protocol(), tls.version(), len(got), bytes(got) == payload)
                tls.unwrap()
        print("closed")
        """

    @Test(.enabled(if: python != nil), arguments: ["1.3", "1.2"])
    func pythonClientEchoesThroughOurServer(version: String) async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2", "http/1.1"]))
        let result = try await withTimeout {
            try await run(Self.python!, ["-c", Self.pythonClient, certificate.certFile, "\(server.port)", version])
        }
        #expect(result.status == 0, "\(result.stderr)")
        let lines = result.stdout.split(separator: "\n")
        #expect(lines.first == "h2 TLSv\(version) 1048576 True", "\(result.stdout)\(result.stderr)")
        #expect(lines.last == "closed")
        await server.log.wait { $0 == .handshake("h2") }
        await server.log.wait { $0 == .inputClosed }  // Python's close_notify
        #expect(!server.log.all.contains { if case .error = $0 { true } else { false } }, "\(server.log.all)")
        await server.stop()
    }

    @Test(.enabled(if: openssl != nil)) func opensslSClientNegotiatesH2AndVerifies() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let result = try await withTimeout {
            try await run(
                Self.openssl!,
                [
                    "s_client", "-connect", "127.0.0.1:\(server.port)", "-alpn", "h2", "-servername", "localhost",
                    "-verify_hostname", "localhost", "-CAfile", certificate.certFile, "-verify_return_error",
                ],
                stdin: "")
        }
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("ALPN protocol: h2"), "\(result.stdout)")
        #expect(result.stdout.contains("Verify return code: 0 (ok)"), "\(result.stdout)")
        await server.log.wait { $0 == .handshake("h2") }
        await server.log.wait { $0 == .inactive }
        await server.stop()
    }

    /// Python's TLS server (server preference `["http/1.1", "h2"]`, like a gateway that prefers
    /// HTTP/1.1) reads 200 000 bytes, echoes them and closes.
    static let pythonServer = """
        import os, socket, ssl, sys
        cert, key, portfile, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["http/1.1", "h2"])
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(15)
        with open(portfile + ".tmp", "w") as f:
            f.write(str(srv.getsockname()[1]))
        os.rename(portfile + ".tmp", portfile)
        conn, _ = srv.accept()
        conn.settimeout(15)
        tls = ctx.wrap_socket(conn, server_side=True)
        got = bytearray()
        while len(got) < count:
            chunk = tls.recv(1 << 16)
            if not chunk:
                break
            got += chunk
        tls.sendall(bytes(got))
        print(tls.selected_alpn_protocol(), tls.version(), len(got))
        tls.unwrap()
        tls.close()
        """

    @Test(.enabled(if: python != nil)) func ourClientAgainstPythonServer() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let portFile = certificate.directory + "/port"
        let count = 200_000
        async let serverRun = withTimeout {
            try await run(Self.python!, ["-c", Self.pythonServer, certificate.certFile, certificate.keyFile, portFile, "\(count)"])
        }
        var port: Int? = nil
        let deadline = ContinuousClock.now + .seconds(15)
        while port == nil, ContinuousClock.now < deadline {
            port = (try? String(contentsOfFile: portFile, encoding: .utf8)).flatMap { Int($0) }
            if port == nil { try await Task.sleep(for: .milliseconds(20)) }
        }
        let payload = patternBuffer(count)
        let client = try await TestClient.connect(
            port: try #require(port),
            .client(alpn: ["h2", "http/1.1"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: payload, expected: count)
        #expect(try await withTimeout { try await client.handshake.get() } == "http/1.1")
        #expect(try await withTimeout { try await client.received.get() } == payload)
        // Python unwraps (close_notify); our handler answers and closes.
        try await withTimeout { try await client.channel.closeFuture.get() }
        let result = try await serverRun
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.hasPrefix("http/1.1 TLSv1.3 \(count)"), "\(result.stdout)")
    }
}
