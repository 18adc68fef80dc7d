import Foundation
import Logging
import NIOCore
import NIOPosix
import RPCCore
import Synchronization
import Testing

@testable import RPCTransport

/// Connections that never end (issue 11, defect 6): every limit on a connection's life, with
/// short configured timeouts. Deadlines here are generous: they tell "closed" from "left open".
@Suite struct ConnectionManagementTests {
    /// Starts a server (gRPC + HTTP/1.1 with an echo HTTP handler) with every timer off unless
    /// `configure` sets it.
    func withServer(
        _ configure: (inout ServerConfiguration) -> Void,
        _ body: (RPCServer, Int) async throws -> Void
    ) async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.acceptHTTP1 = true
        config.httpHandler = EchoHTTP()
        config.firstRequestTimeout = nil
        config.keepaliveTime = nil
        config.maxConnectionIdle = nil
        config.maxConnectionAge = nil
        config.http1IdleTimeout = nil
        configure(&config)
        var logger = Logger(label: "connection-management")
        logger.logLevel = ProcessInfo.processInfo.environment["CM_DEBUG"] != nil ? .debug : .info
        let server = RPCServer(configuration: config, services: [EchoService()], logger: logger)
        let port = try await server.start()
        do { try await body(server, port) } catch {
            await server.shutdownGracefully()
            throw error
        }
        await server.shutdownGracefully()
    }

    @Test func bytesThatAreNotHTTPAreAnswered400AndClosed() async throws {
        try await withServer({ _ in }) { _, port in
            let s = try RawSocket(port: port)
            s.send("FOO / HTTP/1.1\r\n\r\n")
            let r = await s.readUntilClosed()
            #expect(String(decoding: r.bytes, as: UTF8.self).hasPrefix("HTTP/1.1 400"))
            #expect(r.closed)

            // h2spec's invalid preface: starts like HTTP/2's, then is not.
            let p = try RawSocket(port: port)
            p.send("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
            #expect(await p.readUntilClosed().closed)
        }
    }

    @Test func anInvalidPrefaceClosesAnHTTP2OnlyServer() async throws {
        try await withServer({ $0.acceptHTTP1 = false }) { _, port in
            let p = try RawSocket(port: port)
            p.send("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n" + String(repeating: "x", count: 100))
            #expect(await p.readUntilClosed().closed)
        }
    }

    @Test func connectionCloseResponsesClose() async throws {
        try await withServer({ _ in }) { _, port in
            let s = try RawSocket(port: port)
            s.send("GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            let r = await s.readUntilClosed()
            #expect(String(decoding: r.bytes, as: UTF8.self).hasPrefix("HTTP/1.1 200"))
            #expect(r.closed)
        }
    }

    @Test func connectionsThatSendNoRequestAreClosed() async throws {
        try await withServer({ $0.firstRequestTimeout = .milliseconds(200) }) { server, port in
            let silent = try RawSocket(port: port)
            let slowPreface = try RawSocket(port: port)
            slowPreface.send(Array(H2.preface.prefix(10)))
            let slowHead = try RawSocket(port: port)
            slowHead.send("GET / HTTP/1.1\r\nHost: a\r\n")
            #expect(await silent.readUntilClosed().closed)
            #expect(await slowPreface.readUntilClosed().closed)
            #expect(await slowHead.readUntilClosed().closed)
            // A connection that made a request (sent whole with its preface) is not subject to it.
            let active = try RawSocket(port: port)
            active.send(H2.preface + H2.emptySettings + H2.headers(stream: 1, path: "/test.Echo/Unary", endStream: true))
            let answered = await active.readUntilClosed(timeout: .seconds(2))
            #expect(!answered.closed)
            #expect(http2Frames(answered.bytes).contains { $0.type == 1 && $0.stream == 1 })
            _ = server
        }
    }

    @Test func idleHTTP1KeepAliveConnectionsAreClosed() async throws {
        try await withServer({ $0.http1IdleTimeout = .milliseconds(200) }) { _, port in
            let s = try RawSocket(port: port)
            s.send("GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
            let first = await s.readUntilClosed(timeout: .seconds(10)) { String(decoding: $0, as: UTF8.self).contains("\"path\":\"/x\"") }
            #expect(!first.closed)
            #expect(String(decoding: first.bytes, as: UTF8.self).lowercased().contains("connection: keep-alive"))
            #expect(await s.readUntilClosed().closed)
        }
    }

    @Test func unansweredPingsCloseTheConnection() async throws {
        try await withServer({ c in
            c.keepaliveTime = .milliseconds(100)
            c.keepaliveTimeout = .milliseconds(200)
        }) { _, port in
            let s = try RawSocket(port: port)
            s.send(H2.preface + H2.emptySettings + H2.settingsAck)
            // Never answers: reads (and ignores) the server's PING, then sees the connection end.
            let r = await s.readUntilClosed()
            #expect(http2Frames(r.bytes).contains { $0.type == H2.ping && $0.flags & 1 == 0 })
            #expect(r.closed)
        }
    }

    @Test func answeredPingsKeepTheConnection() async throws {
        try await withServer({ c in
            c.keepaliveTime = .milliseconds(50)
            c.keepaliveTimeout = .seconds(2)
        }) { server, port in
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("a"), as: Bytes.self)
            try await Task.sleep(for: .milliseconds(800))
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("b"), as: Bytes.self)
            #expect(server.openSocketCount == 1)
            await channel.close()
        }
    }

    /// Server-driven only (raw sockets read on their own threads), so a loaded test process
    /// cannot make a client look idle or slow.
    @Test func idleConnectionsGetGoawayAndClose() async throws {
        try await withServer({ $0.maxConnectionIdle = .milliseconds(200) }) { _, port in
            // Never a request.
            let s = try RawSocket(port: port)
            s.send(H2.preface + H2.emptySettings + H2.settingsAck)
            let r = await s.readUntilClosed()
            #expect(http2Frames(r.bytes).contains { $0.type == H2.goaway })
            #expect(r.closed)
            // One request, answered; then idle.
            let t = try RawSocket(port: port)
            t.send(
                H2.preface + H2.emptySettings + H2.settingsAck + H2.headers(stream: 1, path: "/test.Echo/Unary", endStream: false)
                    + H2.data(stream: 1, H2.grpcMessage(Array("hi".utf8)), endStream: true))
            let q = await t.readUntilClosed()
            let frames = http2Frames(q.bytes)
            #expect(frames.contains { $0.type == 0 && $0.stream == 1 })  // the response's DATA
            #expect(frames.contains { $0.type == H2.goaway })
            #expect(q.closed)
        }
    }

    @Test func oldConnectionsGetGoawayThenCloseAfterTheGracePeriod() async throws {
        try await withServer({ c in
            c.maxConnectionAge = .milliseconds(300)
            c.maxConnectionAgeGrace = .milliseconds(300)
        }) { _, port in
            // A call longer than age + grace: GOAWAY first, then the connection is cut.
            let s = try RawSocket(port: port)
            s.send(
                H2.preface + H2.emptySettings + H2.settingsAck + H2.headers(stream: 1, path: "/test.Echo/Sleep", endStream: false)
                    + H2.data(stream: 1, H2.grpcMessage(Array("5#age".utf8)), endStream: true))
            let r = await s.readUntilClosed()
            let frames = http2Frames(r.bytes)
            let goaway = frames.firstIndex { $0.type == H2.goaway }
            #expect(goaway != nil)
            #expect(r.closed)
            // The call had no answer: nothing for stream 1 but, at most, its response headers.
            #expect(!frames.contains { $0.type == 0 && $0.stream == 1 })
        }
    }

    @Test func connectionsPastTheCapAreClosedAtOnce() async throws {
        try await withServer({ $0.maxConnections = 2 }) { server, port in
            let a = try RawSocket(port: port)
            let b = try RawSocket(port: port)
            #expect(try await waitFor { server.openSocketCount == 2 })
            let c = try RawSocket(port: port)
            #expect(await c.readUntilClosed().closed)
            let aOpen = await a.readUntilClosed(timeout: .milliseconds(300))
            let bOpen = await b.readUntilClosed(timeout: .milliseconds(300))
            #expect(!aOpen.closed && !bOpen.closed)
            #expect(server.openSocketCount == 2)
            _ = (a, b)
        }
    }

    /// The guard leaves a connection's pipeline at its first request (its reads and writes stop
    /// passing through it): the connection keeps its place under the cap until it closes, and
    /// later requests on it, HTTP/2 or HTTP/1.1, are served as before.
    @Test func aConnectionHoldsItsPlaceUnderTheCapUntilItCloses() async throws {
        try await withServer({ $0.maxConnections = 1 }) { server, port in
            let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port))
            #expect(try await channel.client.unary(EchoService.unaryMethod, Bytes("one"), as: Bytes.self).message.data == Array("one".utf8))
            let refused = try RawSocket(port: port)
            #expect(await refused.readUntilClosed().closed)
            #expect(try await channel.client.unary(EchoService.unaryMethod, Bytes("two"), as: Bytes.self).message.data == Array("two".utf8))
            #expect(server.openSocketCount == 1)
            await channel.close()
            #expect(try await waitFor { server.openSocketCount == 0 })

            let s = try RawSocket(port: port)
            s.send("GET /a HTTP/1.1\r\nHost: a\r\n\r\n")
            let first = await s.readUntilClosed(timeout: .seconds(10)) { String(decoding: $0, as: UTF8.self).contains("\"path\":\"/a\"") }
            #expect(!first.closed)
            #expect(try await RawSocket(port: port).readUntilClosed().closed)
            s.send("GET /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            let second = await s.readUntilClosed()
            #expect(String(decoding: second.bytes, as: UTF8.self).contains("\"path\":\"/b\""))
            #expect(second.closed)
            #expect(try await waitFor { server.openSocketCount == 0 })
        }
    }

    /// A peer that stops answering (no FIN: a dead host, a dropped NAT entry) is noticed by the
    /// client's keepalive: its calls fail with UNAVAILABLE instead of hanging.
    @Test func theClientNoticesAPeerThatStoppedAnswering() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.pipeline.addHandler(SilentHTTP2Peer()) }
            .bind(host: "127.0.0.1", port: 0).get()
        var config = ChannelConfiguration(host: "127.0.0.1", port: server.localAddress!.port!)
        config.keepaliveTime = .milliseconds(100)
        config.keepaliveTimeout = .milliseconds(200)
        let channel = RPCChannel(configuration: config)
        do {
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("hello?"), as: Bytes.self)
            Issue.record("a call to a silent peer succeeded")
        } catch let e as RPCError {
            #expect(e.code == .unavailable)
            #expect(e.message.contains("keepalive"), "\(e.message)")
        }
        await channel.close()
        try await server.close()
        try await group.shutdownGracefully()
    }
}

extension ConnectionManagementTests {
    /// A caller with a sign the peer vanished (the gateway, after a health check timed out) asks
    /// for a liveness PING: a silent peer's connection ends within its timeout, and the call
    /// waiting on it fails with UNAVAILABLE then, not at its 30 s deadline (keepalive off here).
    @Test func aLivenessCheckEndsTheConnectionOfASilentPeer() async throws {
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 1)
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { $0.pipeline.addHandler(SilentHTTP2Peer()) }
            .bind(host: "127.0.0.1", port: 0).get()
        var config = ChannelConfiguration(host: "127.0.0.1", port: server.localAddress!.port!)
        config.keepaliveTime = nil
        let channel = RPCChannel(configuration: config)
        let call = Task {
            try await channel.client.unary(EchoService.unaryMethod, Bytes("hello?"), as: Bytes.self, options: CallOptions(timeout: .seconds(30)))
        }
        // Once the call is on the connection, nothing more is read from the silent peer.
        try await Task.sleep(for: .milliseconds(300))
        let start = ContinuousClock.now
        channel.checkLiveness(timeout: .milliseconds(200))
        do {
            _ = try await call.value
            Issue.record("a call to a silent peer succeeded")
        } catch let e as RPCError {
            #expect(e.code == .unavailable)
            #expect(e.message.contains("liveness PING"), "\(e.message)")
        }
        #expect(ContinuousClock.now - start < .seconds(10))
        await channel.close()
        try await server.close()
        try await group.shutdownGracefully()
    }

    /// A peer that answers keeps its connection through a liveness check.
    @Test func aLivenessCheckKeepsAConnectionThatAnswers() async throws {
        try await withServer({ _ in }) { server, port in
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("a"), as: Bytes.self)
            channel.checkLiveness(timeout: .milliseconds(300))
            try await Task.sleep(for: .milliseconds(600))
            _ = try await channel.client.unary(EchoService.unaryMethod, Bytes("b"), as: Bytes.self)
            #expect(server.openSocketCount == 1)
            await channel.close()
        }
    }
}

/// Sends its SETTINGS, then reads and ignores everything: no SETTINGS ACK, no PING ACK, no answer.
final class SilentHTTP2Peer: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    func channelActive(context: ChannelHandlerContext) {
        var b = context.channel.allocator.buffer(capacity: 9)
        b.writeBytes(H2.emptySettings)
        context.writeAndFlush(NIOAny(b), promise: nil)
    }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
