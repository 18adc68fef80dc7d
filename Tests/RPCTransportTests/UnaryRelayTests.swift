import Dispatch
import RPCCore
import Synchronization
import Testing

@testable import RPCTransport

/// A check that must be a class to be the relay's own (`UnaryRelay.check` is matched by identity).
final class Gate: CallCheck {
    func check(_ context: ServerContext) async throws { try refuse(context.requestMetadata) }
    func checkImmediately(_ context: ServerContext) throws -> Bool {
        try refuse(context.requestMetadata)
        return true
    }
    func refuse(_ metadata: Metadata) throws {
        if metadata["x-refuse"] != nil { throw RPCError(.permissionDenied, "refused by the gate") }
    }
}

/// Stands for the gateway's relay: answers with the request reversed, the response headers and
/// trailers an upstream would send, or an upstream's error; applies its gate itself. Notes which
/// path each call took.
final class Counter {
    var n = 0
}

final class TestRelay: UnaryRelay {
    let gate: Gate?
    let paths = Mutex<[String]>([])
    /// Each relayed call's metadata: clean, its count, as text.
    let seen = Mutex<[(clean: Bool, count: Int, metadata: Metadata)]>([])
    let cancelled = Atomic<Int>(0)
    init(gate: Gate?) { self.gate = gate }

    var check: (any CallCheck)? { gate }

    final class Work: Cancellable {
        let relay: TestRelay
        init(_ relay: TestRelay) { self.relay = relay }
        func cancel() { relay.cancelled.add(1, ordering: .relaxed) }
    }

    static let method = MethodDescriptor(service: "test.Relay", method: "Unary", kind: .unary)

    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RPCError? {
        metadata.withFirstValue(of: "x-refuse-at-headers") { $0 == nil ? nil : RPCError(.permissionDenied, "refused at the headers") }
    }

    /// The bytes as `Metadata` (text entries), as a check reads them.
    static func text(_ bytes: MetadataBytes) -> Metadata {
        var m = Metadata()
        bytes.forEach { n, v in
            m.add(String(decoding: n, as: UTF8.self), String(decoding: v, as: UTF8.self))
            return true
        }
        return m
    }

    func relay(
        _ request: [UInt8], _ method: MethodDescriptor, _ bytes: MetadataBytes, deadline: ContinuousClock.Instant?,
        _ connection: RelayConnection, _ responder: any RelayResponder
    ) -> (any Cancellable)? {
        let metadata = Self.text(bytes)
        seen.withLock { $0.append((bytes.isClean, bytes.count, metadata)) }
        // The connection's state lives as long as the connection: count its calls there.
        let calls = (connection.state as? Counter) ?? Counter()
        connection.state = calls
        calls.n += 1
        paths.withLock { $0.append("relay \(method.path) deadline:\(deadline != nil) peer:\(connection.peerHost) call:\(calls.n)") }
        do { try gate?.refuse(metadata) } catch {
            responder.respond(.failure(error), headers: Metadata(), trailers: Metadata())
            return nil
        }
        if metadata["x-hang"] != nil { return Work(self) }  // never answers: the call ends from the client's side
        var headers = Metadata()
        headers.add("x-upstream-header", "h")
        if metadata["x-fail"] != nil {
            var trailers = Metadata()
            trailers.add("x-why", "upstream said so")
            responder.respond(
                .failure(RPCError(.notFound, "no such thing", trailers: trailers, details: [1, 2, 3])), headers: headers, trailers: Metadata())
            return nil
        }
        var trailers = Metadata()
        trailers.add("x-upstream-trailer", "t")
        let answer = Array(request.reversed())
        if metadata["x-off-loop"] != nil {
            // Answered from another thread, as an upstream on another loop would.
            let (h, t) = (headers, trailers)
            DispatchQueue.global().async { responder.respond(.success(answer), headers: h, trailers: t) }
        } else {
            responder.respond(.success(answer), headers: headers, trailers: trailers)
        }
        return Work(self)
    }

    func forward(_ request: [UInt8], _ context: ServerContext, _ responder: any UnaryResponder) -> (any Cancellable)? {
        paths.withLock { $0.append("forward \(context.method.path)") }
        context.initialMetadata = Metadata([("x-upstream-header", "h")])
        responder.respond(.success(Array(request.reversed())))
        return nil
    }
}

/// `Named`, and a `RelayGate`: takes part only in calls that carry `x-take-part` (noting its
/// value on their context as "gate.note"), so the relay relays the rest without a context.
struct TakingPart: RelayGate {
    let named: Named
    func relayPart(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RelayPart {
        metadata.withFirstValue(of: "x-take-part") { value in
            guard let value else { return .passes }
            return .takesPart(note: ("gate.note", String(decoding: value, as: UTF8.self)))
        }
    }
    func intercept(_ call: ServerCall, next: ServerCall.Next) async throws -> [UInt8] {
        named.trail.add("note \(call.context.value(forKey: "gate.note") as? String ?? "none")")
        return try await named.intercept(call, next: next)
    }
}

final class RelayService: RPCService {
    let relay: TestRelay
    init(_ relay: TestRelay) { self.relay = relay }
    var serviceName: String { "test.Relay" }
    var methods: [ServerMethod] { [ServerMethod(TestRelay.method, .unaryRelay(relay))] }
}

@Suite struct UnaryRelayTests {
    func options(_ pairs: [(String, String)]) -> CallOptions {
        var o = CallOptions()
        for (k, v) in pairs { o.metadata.add(k, v) }
        return o
    }

    @Test func aRelayWhoseCheckIsTheWholeChainAnswersWithoutAContext() async throws {
        let gate = Gate()
        let relay = TestRelay(gate: gate)
        let recorder = OutcomeRecorder()
        var config = ServerConfiguration(host: "127.0.0.1", port: 0)
        config.threads = 1
        config.interceptors = [gate]
        config.observer = recorder
        let server = RPCServer(configuration: config, services: [RelayService(relay)])
        let port = try await server.start()
        let channel = RPCChannel(configuration: ChannelConfiguration(host: "127.0.0.1", port: port))
        defer {
            Task {
                await channel.close(); await server.shutdownGracefully()
            }
        }
        let client = channel.client

        let r = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
        #expect(r.message.text == "cba")
        #expect(r.initialMetadata["x-upstream-header"] == "h")
        #expect(r.trailers["x-upstream-trailer"] == "t")

        let off = try await client.unary(TestRelay.method, Bytes("xyz"), as: Bytes.self, options: options([("x-off-loop", "1")]))
        #expect(off.message.text == "zyx")
        #expect(off.trailers["x-upstream-trailer"] == "t")

        let refused = await #expect(throws: RPCError.self) {
            _ = try await client.unary(TestRelay.method, Bytes("no"), as: Bytes.self, options: options([("x-refuse", "1")]))
        }
        #expect(refused?.code == .permissionDenied)

        let failed = await #expect(throws: RPCError.self) {
            _ = try await client.unary(TestRelay.method, Bytes("f"), as: Bytes.self, options: options([("x-fail", "1")]))
        }
        #expect(failed?.code == .notFound)
        #expect(failed?.message == "no such thing")
        #expect(failed?.trailers["x-why"] == "upstream said so")
        #expect(failed?.trailers.binary("grpc-status-details-bin") == [1, 2, 3])

        var timed = CallOptions()
        timed.timeout = .seconds(30)
        _ = try await client.unary(TestRelay.method, Bytes("t"), as: Bytes.self, options: timed)

        let paths = relay.paths.withLock { $0 }
        #expect(paths.count == 5)
        #expect(paths.allSatisfy { $0.hasPrefix("relay /test.Relay/Unary") && $0.contains("peer:127.0.0.1 ") })
        // One connection, one state for the relay, kept from call to call.
        #expect(paths.map { $0.split(separator: " ").last! } == ["call:1", "call:2", "call:3", "call:4", "call:5"])
        #expect(paths.last?.contains("deadline:true") == true && paths.first?.contains("deadline:false") == true)
        // Observed like any call.
        #expect(try await eventually { recorder.seen.withLock { $0.count } == 5 })
        #expect(recorder.seen.withLock { $0.map(\.code) } == [.ok, .ok, .permissionDenied, .notFound, .ok])
    }

    @Test func aRelayBehindOtherInterceptorsRunsWithAContextThroughTheChain() async throws {
        let trail = Trail()
        let gate = Gate()
        let relay = TestRelay(gate: gate)
        try await withServer([RelayService(relay)], interceptors: [Named(name: "outer", trail: trail), gate]) { client in
            let r = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
            #expect(r.message.text == "cba")
            #expect(r.initialMetadata["x-upstream-header"] == "h")
            let refused = await #expect(throws: RPCError.self) {
                _ = try await client.unary(TestRelay.method, Bytes("no"), as: Bytes.self, options: options([("x-refuse", "1")]))
            }
            #expect(refused?.code == .permissionDenied)
        }
        #expect(relay.paths.withLock { $0 } == ["forward /test.Relay/Unary"])
        #expect(trail.steps.withLock { $0 }.first == "outer in")
    }

    @Test func aRelayBehindRelayGatesRelaysTheCallsTheyPassAndSendsTheOthersThroughTheChain() async throws {
        let trail = Trail()
        let gate = Gate()
        let relay = TestRelay(gate: gate)
        try await withServer([RelayService(relay)], interceptors: [TakingPart(named: Named(name: "gate", trail: trail)), gate]) { client in
            // Passed by the gate: relayed without a context; the relay's check still applies.
            let r = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
            #expect(r.message.text == "cba")
            #expect(r.trailers["x-upstream-trailer"] == "t")
            let refused = await #expect(throws: RPCError.self) {
                _ = try await client.unary(TestRelay.method, Bytes("no"), as: Bytes.self, options: options([("x-refuse", "1")]))
            }
            #expect(refused?.code == .permissionDenied)
            // Taken part in: through the chain, its note on the context, the check after it.
            let t = try await client.unary(TestRelay.method, Bytes("xyz"), as: Bytes.self, options: options([("x-take-part", "drawn")]))
            #expect(t.message.text == "zyx")
            #expect(t.initialMetadata["x-upstream-header"] == "h")
            let refusedInChain = await #expect(throws: RPCError.self) {
                _ = try await client.unary(
                    TestRelay.method, Bytes("no"), as: Bytes.self, options: options([("x-take-part", "2"), ("x-refuse", "1")]))
            }
            #expect(refusedInChain?.code == .permissionDenied)
            // And a relay passed by the gate again on the same connection.
            _ = try await client.unary(TestRelay.method, Bytes("d"), as: Bytes.self)
        }
        let paths = relay.paths.withLock { $0 }
        #expect(paths.count == 4)
        #expect(paths.filter { $0.hasPrefix("relay ") }.count == 3)
        #expect(paths.filter { $0 == "forward /test.Relay/Unary" }.count == 1)
        let steps = trail.steps.withLock { $0 }
        #expect(steps == ["note drawn", "gate in", "gate out", "note 2", "gate in", "gate out"])
    }

    @Test func aRelayGetsTheMetadataAsItsHeaderBlockCarriedIt() async throws {
        let relay = TestRelay(gate: nil)
        let token = String(repeating: "t0K3n-", count: 60)
        try await withServer([RelayService(relay)], interceptors: []) { client in
            // In order, repeated names kept, a long value whole, a `-bin` value as its base64,
            // reserved names (grpc-*, te, content-type, user-agent) never among them.
            var o = options([("authorization", "Bearer \(token)"), ("x-a", "1"), ("x-a", "2")])
            o.metadata.add("x-blob-bin", binary: [0, 1, 2, 250])
            _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self, options: o)
            // Refused at the headers by the relay, from the bytes.
            let refused = await #expect(throws: RPCError.self) {
                _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self, options: options([("x-refuse-at-headers", "1")]))
            }
            #expect(refused?.code == .permissionDenied && refused?.message == "refused at the headers")
        }
        let seen = relay.seen.withLock { $0 }
        #expect(seen.count == 1)
        #expect(seen[0].clean && seen[0].count == 4)
        #expect(seen[0].metadata.entries.map(\.key) == ["authorization", "x-a", "x-a", "x-blob-bin"])
        #expect(seen[0].metadata["authorization"] == "Bearer \(token)")
        #expect(seen[0].metadata.values("x-a") == [.string("1"), .string("2")])
        #expect(seen[0].metadata["x-blob-bin"] == "AAEC+g")
    }

    @Test func aRelayedCallWithBadBinaryMetadataIsRefused() async throws {
        let relay = TestRelay(gate: nil)
        try await withServer([RelayService(relay)], interceptors: []) { client in
            // Written as text under a -bin name, so it goes out as it is: not base64.
            let error = await #expect(throws: RPCError.self) {
                _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self, options: options([("x-bad-bin", "not*base64!")]))
            }
            #expect(error?.code == .internal)
            #expect(error?.message == "metadata 'x-bad-bin' is not valid base64")
        }
        #expect(relay.paths.withLock { $0 }.isEmpty)
    }

    @Test func aRelayWithADifferentCheckThanTheChainsRunsThroughTheChain() async throws {
        // The chain's check is another instance: the relay cannot stand in for it.
        let relay = TestRelay(gate: Gate())
        try await withServer([RelayService(relay)], interceptors: [Gate()]) { client in
            _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
        }
        #expect(relay.paths.withLock { $0 } == ["forward /test.Relay/Unary"])

        // No chain and no check of its own: relayed.
        let bare = TestRelay(gate: nil)
        try await withServer([RelayService(bare)], interceptors: []) { client in
            _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
        }
        #expect(bare.paths.withLock { $0 }.count == 1 && bare.paths.withLock { $0 }[0].hasPrefix("relay"))
    }

    @Test func aRelayedCallEndingEarlyCancelsTheRelaysWork() async throws {
        let relay = TestRelay(gate: nil)
        try await withServer([RelayService(relay)], interceptors: []) { client in
            var o = options([("x-hang", "1")])
            o.timeout = .milliseconds(100)
            let error = await #expect(throws: RPCError.self) {
                _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self, options: o)
            }
            #expect(error?.code == .deadlineExceeded)
            #expect(try await eventually { relay.cancelled.load(ordering: .relaxed) == 1 })
            // A call answered in full is not cancelled afterwards.
            _ = try await client.unary(TestRelay.method, Bytes("abc"), as: Bytes.self)
        }
        #expect(relay.cancelled.load(ordering: .relaxed) == 1)
    }

    @Test func theContextFormOfARelayIsItsForward() {
        let relay = TestRelay(gate: nil)
        let handler = RawHandler.unaryRelay(relay)
        #expect(handler.kind == .unary)
        guard case .unaryForwarding = handler.withContext else {
            Issue.record("withContext is not unaryForwarding")
            return
        }
        #expect(handler.asyncUnary != nil)
    }
}

/// Polls `condition` until it holds or `timeout` passes.
private func eventually(timeout: Duration = .seconds(5), _ condition: () throws -> Bool) async throws -> Bool {
    let end = ContinuousClock.now + timeout
    while ContinuousClock.now < end {
        if try condition() { return true }
        try await Task.sleep(for: .milliseconds(10))
    }
    return try condition()
}
