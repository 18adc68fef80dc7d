import NIOCore
import NIOPosix
import Synchronization
import Testing

@testable import RPCTLS

/// Loopback server and client, both running `OpenSSLHandler`.
@Suite struct OpenSSLHandlerTests {
    @Test func developmentCertificateLoadsAsServerConfiguration() throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        _ = try TLSConfiguration.server(
            certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"])
        #expect(DevelopmentCertificate.subjectAlternativeNames("api.local") == "DNS:localhost,IP:127.0.0.1,IP:::1,DNS:api.local")
        #expect(DevelopmentCertificate.subjectAlternativeNames("10.0.0.1") == "DNS:localhost,IP:127.0.0.1,IP:::1,IP:10.0.0.1")
    }

    @Test func configurationErrorsAreClear() throws {
        let error = #expect(throws: TLSError.self) {
            try TLSConfiguration.server(certificateChainPEMFile: "/nonexistent.pem", privateKeyPEMFile: "/x", alpn: [])
        }
        #expect(error?.kind == .configuration)
        #expect(error?.message.contains("/nonexistent.pem") == true)
        #expect(throws: TLSError.self) { try TLSConfiguration.client(alpn: [""], serverName: nil) }
    }

    @Test(
        arguments: [
            (["h2", "http/1.1"], "h2"),
            (["http/1.1"], "http/1.1"),
            ([], nil),
        ] as [([String], String?)])
    func alpnSelection(clientOffers: [String], expected: String?) async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2", "http/1.1"]))
        let client = try await TestClient.connect(
            port: server.port,
            .client(alpn: clientOffers, trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: ByteBuffer(string: "ping"), expected: 4)
        let negotiated = try await withTimeout { try await client.handshake.get() }
        #expect(negotiated == expected)
        let echoed = try await withTimeout { try await client.received.get() }
        #expect(echoed == ByteBuffer(string: "ping"))
        await server.log.wait { $0 == .handshake(expected) }
        try await client.channel.close()
        await server.stop()
    }

    @Test func serverPreferenceWinsOverClientOrder() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2", "http/1.1"]))
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["http/1.1", "h2"], trustRootsPEMFile: certificate.certFile, serverName: "127.0.0.1"))
        #expect(try await withTimeout { try await client.handshake.get() } == "h2")
        try await client.channel.close()
        await server.stop()
    }

    @Test func noCommonProtocolIsAHandshakeFailure() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["spdy/3"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"))
        let error = await #expect(throws: TLSError.self) { try await withTimeout { try await client.handshake.get() } }
        #expect(error?.kind == .handshakeFailed)
        #expect(error?.message.contains("no application protocol") == true, "\(String(describing: error))")
        let serverError = await server.log.wait { if case .error = $0 { true } else { false } }
        if case .error(let e) = serverError { #expect(e.kind == .handshakeFailed) }
        await server.log.wait { $0 == .inactive }
        await server.stop()
    }

    @Test func oneMebibyteEchoesIntactBothWays() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let payload = patternBuffer()
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: payload, expected: payload.readableBytes)
        let echoed = try await withTimeout { try await client.received.get() }
        #expect(echoed.readableBytes == payload.readableBytes)
        #expect(echoed == payload)
        try await client.channel.close()
        await server.log.wait { $0 == .inactive }
        await server.stop()
    }

    @Test func readsOnDemandWithAutoReadOff() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        // The client handler asks for a read only on activation and after each plaintext read:
        // reads that yield no plaintext (handshake flights, tickets, partial records) are the TLS
        // handler's to re-issue.
        let payload = patternBuffer(300_000)
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: payload, expected: payload.readableBytes, autoRead: false)
        #expect(try await withTimeout { try await client.handshake.get() } == "h2")
        #expect(try await withTimeout { try await client.received.get() } == payload)
        try await client.channel.close()
        await server.stop()
    }

    @Test func recordsCutIntoTinyPiecesStillDecrypt() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]),
            splitInbound: true)
        let payload = patternBuffer(40_000)
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: payload, expected: payload.readableBytes)
        #expect(try await withTimeout { try await client.received.get() } == payload)
        try await client.channel.close()
        await server.stop()
    }

    @Test func halfCloseSendsCloseNotifyAndKeepsReading() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            expected: 3, halfClosure: true)
        _ = try await withTimeout { try await client.handshake.get() }
        try await client.channel.writeAndFlush(ByteBuffer(string: "abc"))
        try await client.channel.close(mode: .output)
        // The server saw close_notify as inputClosed (and closed); we still read its echo.
        #expect(try await withTimeout { try await client.received.get() } == ByteBuffer(string: "abc"))
        await server.log.wait { $0 == .inputClosed }
        try await withTimeout { try await client.channel.closeFuture.get() }
        #expect(!server.log.all.contains { if case .error = $0 { true } else { false } })
        await server.stop()
    }

    @Test func untrustedCertificateFailsClearly() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        // System trust store: our self-signed certificate is not in it.
        let client = try await TestClient.connect(port: server.port, .client(alpn: ["h2"], serverName: "localhost"))
        let error = await #expect(throws: TLSError.self) { try await withTimeout { try await client.handshake.get() } }
        #expect(error?.kind == .certificateVerificationFailed)
        #expect(error?.message.contains("self-signed") == true, "\(String(describing: error))")
        try await withTimeout { try await client.channel.closeFuture.get() }
        await server.log.wait { $0 == .inactive }
        await server.stop()
    }

    @Test func wrongHostNameFailsClearly() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let config = try TLSConfiguration.client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost")
        let client = try await TestClient.connect(port: server.port, config, serverName: "example.com")
        let error = await #expect(throws: TLSError.self) { try await withTimeout { try await client.handshake.get() } }
        #expect(error?.kind == .certificateVerificationFailed)
        #expect(error?.message.contains("hostname mismatch") == true, "\(String(describing: error))")
        #expect(error?.message.contains("example.com") == true)
        await server.stop()
    }

    @Test func verifyPeerOffAcceptsAnyCertificate() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], verifyPeer: false, serverName: "example.com"))
        #expect(try await withTimeout { try await client.handshake.get() } == "h2")
        try await client.channel.close()
        await server.stop()
    }

    @Test func garbageBeforeTheHandshakeIsAnErrorAndAClose() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let raw = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: server.port).get()
        try await raw.writeAndFlush(ByteBuffer(string: "GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"))
        try await withTimeout { try await raw.closeFuture.get() }  // the server hung up
        let event = await server.log.wait { if case .error = $0 { true } else { false } }
        if case .error(let error) = event { #expect(error.kind == .handshakeFailed, "\(error)") }
        await server.log.wait { $0 == .inactive }
        await server.stop()
    }

    @Test func stalledHandshakeTimesOut() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]),
            handshakeTimeout: .milliseconds(100))
        // Connects, sends half a ClientHello record header, then nothing.
        let raw = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connect(host: "127.0.0.1", port: server.port).get()
        try? await raw.writeAndFlush(ByteBuffer(bytes: [0x16, 0x03]))  // may race the timeout
        try await withTimeout { try await raw.closeFuture.get() }
        let event = await server.log.wait { if case .error = $0 { true } else { false } }
        if case .error(let error) = event { #expect(error.kind == .handshakeTimeout, "\(error)") }
        await server.stop()
    }

    @Test func garbageAfterTheHandshakeIsAnErrorAndAClose() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let server = try await TestServer.start(
            .server(certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"]))
        let client = try await TestClient.connect(
            port: server.port, .client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost"),
            payload: ByteBuffer(string: "hi"), expected: 2)
        _ = try await withTimeout { try await client.received.get() }
        // An application-data record with a bogus MAC, written under the TLS handler, raw.
        let channel = client.channel
        try await channel.eventLoop.submit {
            let context = try channel.pipeline.syncOperations.context(handlerType: OpenSSLHandler.self)
            var garbage = ByteBuffer(bytes: [0x17, 0x03, 0x03, 0x00, 0x20])
            garbage.writeBytes((0..<32).map { UInt8($0) })
            context.writeAndFlush(NIOAny(garbage), promise: nil)
        }.get()
        let event = await server.log.wait { if case .error = $0 { true } else { false } }
        if case .error(let error) = event { #expect(error.kind == .protocolError, "\(error)") }
        try await withTimeout { try await client.channel.closeFuture.get() }
        await server.stop()
    }

    @Test func sessionsAreFreedWhenConnectionsClose() async throws {
        let certificate = try TestCertificate.make()
        defer { certificate.remove() }
        let serverConfig = try TLSConfiguration.server(
            certificateChainPEMFile: certificate.certFile, privateKeyPEMFile: certificate.keyFile, alpn: ["h2"])
        let server = try await TestServer.start(serverConfig)
        let clientConfig = try TLSConfiguration.client(alpn: ["h2"], trustRootsPEMFile: certificate.certFile, serverName: "localhost")
        for _ in 0..<10 {
            let client = try await TestClient.connect(port: server.port, clientConfig, payload: ByteBuffer(string: "x"), expected: 1)
            _ = try await withTimeout { try await client.received.get() }
            try await client.channel.close()
        }
        await server.stop()
        let deadline = ContinuousClock.now + .seconds(10)
        func live() -> Int {
            serverConfig.liveSessions.load(ordering: .relaxed) + clientConfig.liveSessions.load(ordering: .relaxed)
        }
        while live() != 0, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(10)) }
        #expect(serverConfig.liveSessions.load(ordering: .relaxed) == 0)
        #expect(clientConfig.liveSessions.load(ordering: .relaxed) == 0)
    }
}
