import RPCCore
import Synchronization
import Testing

@testable import RPCTransport

/// What an interceptor saw of one call.
struct SeenCall: Sendable, Equatable {
    var path: String
    var code: StatusCode
    var requestMessages: Int
    var requestBytes: Int
    var responseMessages: Int
    var responseBytes: Int
}

/// Keeps every call an `ObservingInterceptor` reports (the interceptor under test: it sees the
/// outcome of every call, on both paths, task and task-free, as metrics or an access log would).
final class OutcomeRecorder: ServerCallObserver {
    let seen = Mutex<[SeenCall]>([])
    let durations = Mutex<[Duration]>([])
    let inFlight = Mutex(0)
    func callStarted() { inFlight.withLock { $0 += 1 } }
    func callEnded(_ call: ServerCallRecord) {
        inFlight.withLock { $0 -= 1 }
        seen.withLock {
            $0.append(
                SeenCall(
                    path: call.method?.path ?? "", code: call.code, requestMessages: call.requestMessages, requestBytes: call.requestBytes,
                    responseMessages: call.responseMessages, responseBytes: call.responseBytes))
        }
        durations.withLock { $0.append(call.duration) }
    }
    var interceptor: ObservingInterceptor { ObservingInterceptor(self) }
}

/// Notes the order interceptors and the handler run in.
final class Trail: Sendable {
    let steps = Mutex<[String]>([])
    func add(_ s: String) { steps.withLock { $0.append(s) } }
}

struct Named: ServerInterceptor {
    let name: String
    let trail: Trail
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        trail.add("\(name) in")
        defer { trail.add("\(name) out") }
        return try await next(call)
    }
}

/// `Named`, passing over calls that carry `x-pass-<name>`.
struct Passing: ServerInterceptor {
    let named: Named
    func passes(_ context: ServerContext) -> Bool { context.requestMetadata["x-pass-\(named.name)"] != nil }
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] { try await named.intercept(call, next: next) }
}

/// Refuses calls whose metadata says so, before they reach the handler.
struct Refuser: CallCheck {
    func check(_ context: ServerContext) async throws { try refuse(context) }
    func checkImmediately(_ context: ServerContext) throws -> Bool {
        if context.requestMetadata["x-slow-check"] != nil { return false }  // only `check` decides
        try refuse(context)
        return true
    }
    func refuse(_ context: ServerContext) throws {
        if context.requestMetadata["x-refuse"] != nil { throw RPCError(.permissionDenied, "refused by the test") }
    }
}

/// Upper-cases a unary request and reverses the response: an interceptor changes what the
/// handler sees and what the client gets.
struct Rewriter: ServerInterceptor {
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        var call = call
        if case .message(let m) = call.request { call.request = .message(m.map { $0 >= 97 && $0 <= 122 ? $0 - 32 : $0 }) }
        return try await next(call).reversed()
    }
}

/// Forwarding handlers (as the gateway's relay), noting whether they ran inside a task.
final class ForwardingService: RPCService {
    var serviceName: String { "test.Forward" }
    static let unaryMethod = MethodDescriptor(service: "test.Forward", method: "Unary", kind: .unary)
    static let streamMethod = MethodDescriptor(service: "test.Forward", method: "Stream", kind: .serverStreaming)
    let inTask = Mutex<[Bool]>([])

    var methods: [ServerMethod] {
        [
            ServerMethod(
                Self.unaryMethod,
                .unaryForwarding { request, _, responder in
                    self.inTask.withLock { $0.append(withUnsafeCurrentTask { $0 != nil }) }
                    responder.respond(.success(request))
                    return nil
                }),
            ServerMethod(
                Self.streamMethod,
                .serverStreamingForwarding { request, _, responses in
                    self.inTask.withLock { $0.append(withUnsafeCurrentTask { $0 != nil }) }
                    responses.sendHeaders()
                    for _ in 0..<3 { _ = responses.forward(request) }
                    responses.end(.success(()))
                    return nil
                }),
        ]
    }
}

@Suite struct InterceptorTests {
    @Test func anInterceptorSeesTheOutcomeOfEveryCallKind() async throws {
        let recorder = OutcomeRecorder()
        let clientSide = ClientRecorder()
        try await withEchoServer({ $0.interceptors = [recorder.interceptor] }) { _, plain in
            let client = RPCClient(transport: ClientInterceptors(base: plain.transport, [clientSide]))
            _ = try await client.unary(EchoService.unaryMethod, Bytes("ping"), as: Bytes.self)
            let expanded = try await client.serverStreaming(EchoService.serverStreamMethod, Bytes("3:10"), as: Bytes.self) { r in
                var n = 0
                for try await _ in r.messages { n += 1 }
                return n
            }
            #expect(expanded == 3)
            _ = try await client.clientStreaming(EchoService.clientStreamMethod, as: Bytes.self) { (w: RequestWriter<Bytes>) in
                for s in ["a", "bb", "ccc"] { try await w.write(Bytes(s)) }
            }
            _ = try await client.bidirectionalStreaming(EchoService.bidiMethod, as: Bytes.self) { (w: RequestWriter<Bytes>, _) in
                try await w.write(Bytes("one"))
                try await w.write(Bytes("three"))
            }
            await #expect(throws: RPCError.self) { _ = try await client.unary(EchoService.failMethod, Bytes("bad"), as: Bytes.self) }
        }
        let expected = [
            SeenCall(path: "/test.Echo/Unary", code: .ok, requestMessages: 1, requestBytes: 4, responseMessages: 1, responseBytes: 4),
            SeenCall(path: "/test.Echo/Expand", code: .ok, requestMessages: 1, requestBytes: 4, responseMessages: 3, responseBytes: 30),
            SeenCall(path: "/test.Echo/Collect", code: .ok, requestMessages: 3, requestBytes: 6, responseMessages: 1, responseBytes: 1),
            SeenCall(path: "/test.Echo/Chat", code: .ok, requestMessages: 2, requestBytes: 8, responseMessages: 2, responseBytes: 8),
            SeenCall(path: "/test.Echo/Fail", code: .invalidArgument, requestMessages: 1, requestBytes: 3, responseMessages: 0, responseBytes: 0),
        ]
        #expect(recorder.seen.withLock { $0 } == expected)
        #expect(recorder.durations.withLock { $0.allSatisfy { $0 > .zero } })
        #expect(recorder.inFlight.withLock { $0 } == 0)
        // The client's interceptor counts the same messages and bytes, and the same statuses.
        #expect(clientSide.seen.withLock { $0 } == expected)
    }

    @Test func interceptorsWrapInOrderAndTheFirstIsOutermost() async throws {
        let trail = Trail()
        try await withEchoServer({ $0.interceptors = [Named(name: "a", trail: trail), Named(name: "b", trail: trail)] }) { _, client in
            _ = try await client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self)
        }
        #expect(trail.steps.withLock { $0 } == ["a in", "b in", "b out", "a out"])
    }

    @Test func anInterceptorThatPassesACallDoesNotRunForIt() async throws {
        let trail = Trail()
        let chain: [any ServerInterceptor] = [
            Passing(named: Named(name: "a", trail: trail)), Passing(named: Named(name: "b", trail: trail)),
        ]
        try await withEchoServer({ $0.interceptors = chain }) { _, client in
            for pass in [[], ["a"], ["b"], ["a", "b"]] {
                var options = CallOptions()
                for p in pass { options.metadata.add("x-pass-\(p)", "1") }
                _ = try await client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self, options: options)
                let n = try await client.serverStreaming(EchoService.serverStreamMethod, Bytes("2:1"), as: Bytes.self, options: options) { r in
                    var n = 0
                    for try await _ in r.messages { n += 1 }
                    return n
                }
                #expect(n == 2)
                trail.add("|")
            }
        }
        #expect(
            trail.steps.withLock { $0 } == [
                "a in", "b in", "b out", "a out", "a in", "b in", "b out", "a out", "|",
                "b in", "b out", "b in", "b out", "|",
                "a in", "a out", "a in", "a out", "|",
                "|",
            ])
    }

    @Test func aRefusalNeverReachesTheHandlerAndOuterInterceptorsSeeIt() async throws {
        let recorder = OutcomeRecorder()
        try await withEchoServer({ $0.interceptors = [recorder.interceptor, Refuser()] }) { _, client in
            var options = CallOptions()
            options.metadata.add("x-refuse", "1")
            let error = await #expect(throws: RPCError.self) {
                _ = try await client.clientStreaming(EchoService.clientStreamMethod, as: Bytes.self, options: options) {
                    (w: RequestWriter<Bytes>) in try await w.write(Bytes("a"))
                }
            }
            #expect(error?.code == .permissionDenied)
            #expect(error?.message == "refused by the test")
        }
        #expect(recorder.seen.withLock { $0.map(\.code) } == [.permissionDenied])
        // Refused before the handler read anything.
        #expect(recorder.seen.withLock { $0.map(\.requestMessages) } == [0])
    }

    @Test func anInterceptorChangesTheRequestAndTheResponse() async throws {
        try await withEchoServer({ $0.interceptors = [Rewriter()] }) { _, client in
            let r = try await client.unary(EchoService.unaryMethod, Bytes("abc1"), as: Bytes.self)
            #expect(r.message.text == "1CBA")
        }
    }

    /// The gateway's relay stays task-free through interceptors that decide at once (a check,
    /// the outcome recorder): the handler runs on the event loop, not in a task.
    @Test func forwardingHandlersStayTaskFreeThroughInterceptorsThatDecideAtOnce() async throws {
        let recorder = OutcomeRecorder()
        let service = ForwardingService()
        try await withServer([service], interceptors: [recorder.interceptor, Refuser()]) { client in
            let r = try await client.unary(ForwardingService.unaryMethod, Bytes("hello"), as: Bytes.self)
            #expect(r.message.text == "hello")
            let n = try await client.serverStreaming(ForwardingService.streamMethod, Bytes("ab"), as: Bytes.self) { r in
                var n = 0
                for try await m in r.messages where m.text == "ab" { n += 1 }
                return n
            }
            #expect(n == 3)
            var refused = CallOptions()
            refused.metadata.add("x-refuse", "1")
            let error = await #expect(throws: RPCError.self) {
                _ = try await client.unary(ForwardingService.unaryMethod, Bytes("no"), as: Bytes.self, options: refused)
            }
            #expect(error?.code == .permissionDenied)
        }
        #expect(service.inTask.withLock { $0 } == [false, false])
        #expect(
            recorder.seen.withLock { $0 } == [
                SeenCall(path: "/test.Forward/Unary", code: .ok, requestMessages: 1, requestBytes: 5, responseMessages: 1, responseBytes: 5),
                SeenCall(path: "/test.Forward/Stream", code: .ok, requestMessages: 1, requestBytes: 2, responseMessages: 3, responseBytes: 6),
                SeenCall(
                    path: "/test.Forward/Unary", code: .permissionDenied, requestMessages: 1, requestBytes: 2, responseMessages: 0, responseBytes: 0),
            ])
    }

    /// An interceptor with only the async form (and a check that cannot decide at once) still
    /// works around forwarding handlers: the rest of the call runs from a task, answers and
    /// counts as before.
    @Test func asyncInterceptorsWorkAroundForwardingHandlers() async throws {
        let trail = Trail()
        let recorder = OutcomeRecorder()
        let service = ForwardingService()
        try await withServer([service], interceptors: [Named(name: "async", trail: trail), Refuser(), recorder.interceptor]) { client in
            var slow = CallOptions()
            slow.metadata.add("x-slow-check", "1")
            let r = try await client.unary(ForwardingService.unaryMethod, Bytes("hello"), as: Bytes.self, options: slow)
            #expect(r.message.text == "hello")
            let n = try await client.serverStreaming(ForwardingService.streamMethod, Bytes("xyz"), as: Bytes.self, options: slow) { r in
                var n = 0
                for try await _ in r.messages { n += 1 }
                return n
            }
            #expect(n == 3)
            slow.metadata.add("x-refuse", "1")
            let error = await #expect(throws: RPCError.self) {
                _ = try await client.unary(ForwardingService.unaryMethod, Bytes("no"), as: Bytes.self, options: slow)
            }
            #expect(error?.code == .permissionDenied)
        }
        #expect(trail.steps.withLock { $0 } == ["async in", "async out", "async in", "async out", "async in", "async out"])
        #expect(service.inTask.withLock { $0.count } == 2)
        #expect(recorder.seen.withLock { $0.map(\.responseMessages) } == [1, 3])
    }

    @Test func clientInterceptorsWrapInOrderAndCanChangeTheCall() async throws {
        let trail = Trail()
        try await withEchoServer { _, plain in
            let client = RPCClient(
                transport: ClientInterceptors(
                    base: plain.transport,
                    [ClientNamed(name: "a", trail: trail), ClientNamed(name: "b", trail: trail), MetadataInterceptor("x-echo-initial", "added")]))
            let r = try await client.unary(EchoService.unaryMethod, Bytes("x"), as: Bytes.self)
            #expect(r.initialMetadata["x-echo-initial"] == "added")
        }
        #expect(trail.steps.withLock { $0 } == ["a", "b"])
    }
}

/// Records each client call's outcome.
final class ClientRecorder: ClientInterceptor {
    let seen = Mutex<[SeenCall]>([])
    func intercept(_ method: MethodDescriptor, _ options: CallOptions, next: ClientInterceptors.Next) async throws -> any RawClientCall {
        ObservedClientCall(try await next(method, options), method: method) { outcome in
            self.seen.withLock {
                $0.append(
                    SeenCall(
                        path: outcome.method.path, code: outcome.status.code, requestMessages: outcome.requestMessages,
                        requestBytes: outcome.requestBytes, responseMessages: outcome.responseMessages, responseBytes: outcome.responseBytes))
            }
        }
    }
}

struct ClientNamed: ClientInterceptor {
    let name: String
    let trail: Trail
    func intercept(_ method: MethodDescriptor, _ options: CallOptions, next: ClientInterceptors.Next) async throws -> any RawClientCall {
        trail.add(name)
        return try await next(method, options)
    }
}

func withServer(_ services: [any RPCService], interceptors: [any ServerInterceptor], _ body: (RPCClient) async throws -> Void) async throws {
    var config = ServerConfiguration(host: "127.0.0.1", port: 0)
    config.threads = 1
    config.interceptors = interceptors
    let server = RPCServer(configuration: config, services: services)
    let port = try await server.start()
    let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port))
    do {
        try await body(channel.client)
    } catch {
        await channel.close()
        await server.shutdownGracefully()
        throw error
    }
    await channel.close()
    await server.shutdownGracefully()
}
