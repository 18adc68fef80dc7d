import RPCCore
import Synchronization
import Testing

@testable import RPCTransport

/// A unary method that holds its call until the test opens the gate, and one with a request limit.
final class HoldService: RPCService, Sendable {
    static let hold = MethodDescriptor(service: "test.Hold", method: "Hold", kind: .unary)
    static let limited = MethodDescriptor(service: "test.Hold", method: "Limited", kind: .unary, maxRequestBytes: 1024)
    static let secret = MethodDescriptor(service: "test.Hold", method: "Secret", kind: .unary, visibility: .publicAuthenticated)
    let open = Mutex(false)
    let started = Mutex(0)
    let secretCalls = Mutex(0)
    var serviceName: String { "test.Hold" }
    var methods: [ServerMethod] {
        [
            ServerMethod(
                Self.hold,
                .unary(Bytes.self, Bytes.self) { [self] req, _ in
                    started.withLock { $0 += 1 }
                    while !open.withLock({ $0 }) && !Task.isCancelled { try? await Task.sleep(for: .milliseconds(5)) }
                    return Bytes("\(req.data.count)")
                }),
            ServerMethod(Self.limited, .unary(Bytes.self, Bytes.self) { req, _ in Bytes("\(req.data.count)") }),
            ServerMethod(
                Self.secret,
                .unary(Bytes.self, Bytes.self) { [self] req, _ in
                    secretCalls.withLock { $0 += 1 }
                    return Bytes("\(req.data.count)")
                }),
        ]
    }
}

/// Refuses calls without credentials at their headers, as the gateway and services do.
final class HeaderCheck: CallCheck {
    let intercepted = Mutex(0)
    func check(_ context: ServerContext) async throws { intercepted.withLock { $0 += 1 } }
    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError? {
        CredentialCheck.missingCredential(method, metadata)
    }
}

func withHoldServer(
    _ configure: (inout ServerConfiguration) -> Void = { _ in },
    _ body: (HoldService, RPCServer, Int) async throws -> Void
) async throws {
    var config = ServerConfiguration(host: "127.0.0.1", port: 0)
    config.threads = 1
    config.requestBudget = RequestBudget()  // not shared with other tests of the process
    configure(&config)
    let service = HoldService()
    let server = RPCServer(configuration: config, services: [service])
    let port = try await server.start()
    do {
        try await body(service, server, port)
    } catch {
        service.open.withLock { $0 = true }
        await server.shutdownGracefully()
        throw error
    }
    service.open.withLock { $0 = true }
    await server.shutdownGracefully()
}

@Suite struct RequestLimitTests {
    @Test func aMethodsLimitRefusesFromTheLengthPrefix() async throws {
        try await withHoldServer { _, _, port in
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            defer { Task { await channel.close() } }
            let ok = try await channel.client.unary(HoldService.limited, Bytes([UInt8](repeating: 1, count: 1024)), as: Bytes.self)
            #expect(ok.message.text == "1024")
            do {
                _ = try await channel.client.unary(HoldService.limited, Bytes([UInt8](repeating: 1, count: 4 << 20)), as: Bytes.self)
                Issue.record("a 4 MiB request passed a 1 KiB limit")
            } catch let e as RPCError {
                #expect(e.code == .resourceExhausted)
                #expect(e.message.contains("limit of 1024 bytes"), "\(e.message)")
            }
        }
    }

    @Test func callsWithoutCredentialsAreRefusedAtTheirHeaders() async throws {
        let check = HeaderCheck()
        try await withHoldServer({ $0.interceptors = [check] }) { service, _, port in
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            defer { Task { await channel.close() } }
            do {
                _ = try await channel.client.unary(HoldService.secret, Bytes([UInt8](repeating: 1, count: 1 << 20)), as: Bytes.self)
                Issue.record("an anonymous call passed")
            } catch let e as RPCError {
                #expect(e.code == .unauthenticated)
            }
            #expect(check.intercepted.withLock { $0 } == 0)
            #expect(service.secretCalls.withLock { $0 } == 0)
            var options = CallOptions()
            options.metadata.add("authorization", "Bearer something")
            let r = try await channel.client.unary(HoldService.secret, Bytes("x"), as: Bytes.self, options: options)
            #expect(r.message.text == "1")
            #expect(check.intercepted.withLock { $0 } == 1)
        }
    }

    /// Past the process budget a large message is refused with RESOURCE_EXHAUSTED and a retry
    /// hint; its charge lasts until its call ends, then the next one gets in.
    @Test func theProcessBudgetRefusesWithARetryHint() async throws {
        try await withHoldServer({ $0.maxBufferedRequestBytesPerProcess = 150_000 }) { service, server, port in
            let first = RPCChannel(host: "127.0.0.1", port: port)
            let second = RPCChannel(host: "127.0.0.1", port: port)
            defer {
                Task {
                    await first.close(); await second.close()
                }
            }
            let held = Task { try await first.client.unary(HoldService.hold, Bytes([UInt8](repeating: 1, count: 100_000)), as: Bytes.self) }
            #expect(try await waitFor { service.started.withLock { $0 } == 1 })
            #expect(server.bufferedRequestBytes == 100_000)
            do {
                _ = try await second.client.unary(HoldService.hold, Bytes([UInt8](repeating: 1, count: 100_000)), as: Bytes.self)
                Issue.record("admitted past the budget")
            } catch let e as RPCError {
                #expect(e.code == .resourceExhausted, "\(e)")
                #expect(e.trailers["retry-after"] == "1")
                #expect(e.trailers.binary("grpc-status-details-bin") != nil)
            }
            service.open.withLock { $0 = true }
            #expect(try await held.value.message.text == "100000")
            let again = try await second.client.unary(HoldService.hold, Bytes([UInt8](repeating: 1, count: 100_000)), as: Bytes.self)
            #expect(again.message.text == "100000")
            #expect(try await waitFor { server.bufferedRequestBytes == 0 })
        }
    }

    /// Past the connection budget a large message waits (its window closed) instead of failing,
    /// and goes on once the earlier one's call has ended.
    @Test func theConnectionBudgetMakesLaterMessagesWait() async throws {
        try await withHoldServer({ $0.maxBufferedRequestBytesPerConnection = 150_000 }) { service, server, port in
            let channel = RPCChannel(host: "127.0.0.1", port: port)
            defer { Task { await channel.close() } }
            let a = Task { try await channel.client.unary(HoldService.hold, Bytes([UInt8](repeating: 1, count: 100_000)), as: Bytes.self) }
            #expect(try await waitFor { service.started.withLock { $0 } == 1 })
            let b = Task { try await channel.client.unary(HoldService.hold, Bytes([UInt8](repeating: 2, count: 100_000)), as: Bytes.self) }
            // Give b time to arrive: it must wait, not start and not fail.
            try await Task.sleep(for: .milliseconds(300))
            #expect(service.started.withLock { $0 } == 1)
            service.open.withLock { $0 = true }
            #expect(try await a.value.message.text == "100000")
            #expect(try await b.value.message.text == "100000")
            #expect(try await waitFor { server.bufferedRequestBytes == 0 })
        }
    }

    /// Messages just under and over half the window, as the interop client_streaming case sends
    /// them: the window reopens only once half of it is consumed, so a "small" message must fit
    /// in the other half (a 45 KiB one used to wait forever behind 29 KiB read but not reopened).
    @Test func messagesAroundHalfTheWindowFlow() async throws {
        try await withEchoServer({ $0.requestBudget = RequestBudget() }) { _, client in
            let sizes = [27182, 8, 1828, 45904, 32760, 32763, 40000, 65531, 65536, 1]
            var options = CallOptions()
            options.timeout = .seconds(30)
            let total = try await client.clientStreaming(EchoService.clientStreamMethod, as: Bytes.self, options: options) {
                (writer: RequestWriter<Bytes>) in
                for n in sizes { try await writer.write(Bytes([UInt8](repeating: 5, count: n))) }
            }
            #expect(total.message.text == "\(sizes.reduce(0, +))")
        }
    }

    /// A client-streaming call of many large messages through small windows: each is admitted,
    /// read, and released in turn.
    @Test func largeStreamingMessagesFlowThroughTheBudgets() async throws {
        try await withEchoServer({ c in
            c.requestBudget = RequestBudget()
            c.maxBufferedRequestBytesPerConnection = 300_000
        }) { _, client in
            let total = try await client.clientStreaming(EchoService.clientStreamMethod, as: Bytes.self) { (writer: RequestWriter<Bytes>) in
                for _ in 0..<20 { try await writer.write(Bytes([UInt8](repeating: 9, count: 200_000))) }
            }
            #expect(total.message.text == "4000000")
        }
    }
}

/// An HTTP handler whose POST bodies may be 1,000 bytes.
struct SmallBodies: HTTPHandler {
    func maxBodyBytes(method: String, path: Substring) -> Int? { method == "POST" ? 1000 : nil }
    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        HTTPResponse(status: 200, headers: [("content-type", "text/plain")], body: Array("got \(request.body.count)".utf8))
    }
}

@Suite struct HTTPBodyLimitTests {
    /// The handler's limit applies per request, over HTTP/1.1 and h2c alike: a larger declared
    /// body is answered 413 before it is read.
    @Test func theHandlersLimitAppliesOverBothProtocols() async throws {
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.acceptHTTP1 = true
        config.httpHandler = SmallBodies()
        config.requestBudget = RequestBudget()
        let server = RPCServer(configuration: config, services: [EchoService()])
        let port = try await server.start()
        defer { Task { await server.shutdownGracefully() } }
        let url = "http://127.0.0.1:\(port)/x"
        for proto in ["--http1.1", "--http2-prior-knowledge"] {
            let ok = try curl([proto, "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", String(repeating: "a", count: 1000), url])
            #expect(ok == "200", "\(proto)")
            let big = try curl([proto, "-o", "/dev/null", "-w", "%{http_code}", "--data-binary", String(repeating: "a", count: 5000), url])
            #expect(big == "413", "\(proto)")
        }
    }
}
