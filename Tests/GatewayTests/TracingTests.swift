import Contracts
import Foundation
import Observability
import RPCCore
import RPCTransport
import ServiceKitTesting
import Testing

@testable import Gateway

/// Issue 19: relayed calls as spans. With a tracer the gateway's span is the child of the
/// client's `traceparent` (or the root of a new trace) and the upstream call carries the gateway
/// span's context; without one the client's header goes up unchanged.
@Suite struct GatewayTracingTests {
    static let clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
    static let clientSpan = "00f067aa0ba902b7"

    func logIn(_ h: Harness, traceparent: String?) async throws {
        var req = Accounts_V1_LogInRequest()
        req.username = "ada"
        req.password = "pw"
        var options = CallOptions(timeout: .seconds(10))
        if let traceparent { options.metadata.add("traceparent", traceparent) }
        options.metadata.add("tracestate", "client=1")
        _ = try await h.client.unary(Accounts_V1_AccountsMethods.logIn, req, as: Accounts_V1_LogInResponse.self, options: options)
    }

    /// The gateway's span is outside its policy: a call refused for a bad token is a span with
    /// that status, and nothing goes upstream.
    @Test func aCallThePolicyRefusesIsASpan() async throws {
        let file = try TestSpanFile(serviceName: "gateway", fileName: "gateway.jsonl", notesCalls: false)
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        let h = try await Harness { $0.tracer = tracer }
        defer { Task { await h.stop() } }
        var options = CallOptions(timeout: .seconds(10), metadata: h.bearer("not-a-token"))
        options.metadata.add("traceparent", "00-\(Self.clientTrace)-\(Self.clientSpan)-01")
        let error = await #expect(throws: RPCError.self) {
            _ = try await Accounts_V1_AccountsClient(h.client).getMyProfile(Accounts_V1_GetMyProfileRequest(), options: options)
        }
        #expect(error?.code == .unauthenticated)
        #expect(h.recorder.last(Accounts_V1_AccountsMethods.getMyProfile.path) == nil, "nothing went upstream")
        exporter.flush()
        let span = try #require(try readSpans(path).last)
        #expect(span["name"] as? String == "accounts.v1.Accounts/GetMyProfile")
        #expect(span["traceId"] as? String == Self.clientTrace)
        #expect(attributes(span)["rpc.grpc.status_code"] as? String == "16")
        exporter.shutdown()
    }

    @Test func aRelayedCallIsASpanAndTheUpstreamGetsItsContext() async throws {
        let file = try TestSpanFile(serviceName: "gateway", fileName: "gateway.jsonl", notesCalls: false)
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        let h = try await Harness { $0.tracer = tracer }
        defer { Task { await h.stop() } }
        let logInPath = Accounts_V1_AccountsMethods.logIn.path

        // A client's sampled trace: the gateway's span is its child, the upstream the span's.
        try await logIn(h, traceparent: "00-\(Self.clientTrace)-\(Self.clientSpan)-01")
        exporter.flush()
        let first = try #require(try readSpans(path).last)
        #expect(first["traceId"] as? String == Self.clientTrace)
        #expect(first["parentSpanId"] as? String == Self.clientSpan)
        #expect(first["name"] as? String == "accounts.v1.Accounts/LogIn")
        #expect(first["kind"] as? Int == 2)
        let up = try #require(h.recorder.last(logInPath))
        #expect(up["traceparent"] == "00-\(Self.clientTrace)-\(first["spanId"] as! String)-01")
        #expect(up["tracestate"] == "client=1")
        #expect(up.values("traceparent").count == 1, "the client's header is replaced, not added to")

        // None: a new trace starts at the gateway (sampled: ratio 1).
        try await logIn(h, traceparent: nil)
        exporter.flush()
        let second = try #require(try readSpans(path).last)
        #expect(second["parentSpanId"] == nil)
        #expect(second["traceId"] as? String != Self.clientTrace)
        #expect(h.recorder.last(logInPath)?["traceparent"] == "00-\(second["traceId"] as! String)-\(second["spanId"] as! String)-01")

        // Malformed: ignored, a new trace, the call goes through.
        try await logIn(h, traceparent: "00-\(Self.clientTrace.uppercased())-\(Self.clientSpan)-01")
        exporter.flush()
        let third = try #require(try readSpans(path).last)
        #expect(third["parentSpanId"] == nil && third["traceId"] as? String != Self.clientTrace)

        // A streaming relay is a span too, ended with the upstream's status.
        let n = try await h.client.serverStreaming(Fake.expand, Bytes("3:4"), as: Bytes.self) { stream in
            var n = 0
            for try await _ in stream.messages { n += 1 }
            return n
        }
        #expect(n == 3)
        exporter.flush()
        let stream = try #require(try readSpans(path).last)
        #expect(stream["name"] as? String == "test.v1.Echo/Expand")
        exporter.shutdown()
    }

    @Test func aTraceTheGatewayStartsAndDoesNotSampleIsNotSentUp() async throws {
        // Ratio 0: every trace the gateway starts is unsampled. It sends no traceparent for
        // those (the service then traces nothing either); a client's trace still goes up,
        // unsampled flags and all, with the gateway's span as the parent.
        let tracer = SpanTracer(serviceName: "gateway", sampler: RatioSampler(ratio: 0), exporter: nil)
        let h = try await Harness { $0.tracer = tracer }
        defer { Task { await h.stop() } }
        let logInPath = Accounts_V1_AccountsMethods.logIn.path

        try await logIn(h, traceparent: nil)
        let started = try #require(h.recorder.last(logInPath))
        #expect(started["traceparent"] == nil)
        #expect(started["x-gateway-token"] != nil, "the relay is recognisable as one (RPCTracing.startServiceCall)")

        try await logIn(h, traceparent: "00-\(Self.clientTrace)-\(Self.clientSpan)-00")
        let continued = try #require(h.recorder.last(logInPath)?["traceparent"])
        let c = try #require(TraceContext.parse(traceparent: continued))
        #expect(c.traceIDHex == Self.clientTrace && c.spanIDHex != Self.clientSpan && !c.sampled)
        #expect(h.recorder.last(logInPath)?["tracestate"] == "client=1")

        // A malformed header starts a new (unsampled) trace: nothing valid goes up.
        try await logIn(h, traceparent: "00-\(Self.clientTrace.uppercased())-\(Self.clientSpan)-01")
        #expect(h.recorder.last(logInPath)?["traceparent"].flatMap { TraceContext.parse(traceparent: $0) } == nil)
    }

    /// With a tracer and no access log, the gateway relays the calls it does not trace without a
    /// context (`TracingInterceptor` is a `RelayGate`), and draws a new trace's sampling once: at
    /// a ratio of one half, about half the calls without a `traceparent` are spans (a second draw
    /// on the traced path would make it a quarter), and exactly those carry a `traceparent` up.
    @Test func atARatioTheSampledCallsAreSpansAndTheRestAreRelayedUntraced() async throws {
        let file = try TestSpanFile(serviceName: "gateway", fileName: "gateway.jsonl", ratio: 0.5, notesCalls: false)
        defer { file.remove() }
        let h = try await Harness { $0.tracer = file.tracer }
        defer { Task { await h.stop() } }
        let logInPath = Accounts_V1_AccountsMethods.logIn.path
        let calls = 200
        var upstreamTraces = Set<String>()
        for _ in 0..<calls {
            try await logIn(h, traceparent: nil)
            if let header = h.recorder.last(logInPath)?["traceparent"] {
                let c = try #require(TraceContext.parse(traceparent: header))
                #expect(c.sampled, "only sampled traces the gateway starts go up")
                upstreamTraces.insert(c.traceIDHex)
            }
        }
        #expect(h.recorder.count(logInPath) == calls)
        file.exporter.flush()
        let spans = try readSpans(file.path).filter { $0["name"] as? String == "accounts.v1.Accounts/LogIn" }
        // Binomial(200, 0.5): 100 ± 7; 60...140 fails once in 10^7 runs, and a quarter (50) fails.
        #expect((60...140).contains(spans.count), "\(spans.count) of \(calls) sampled at a ratio of 0.5")
        #expect(Set(spans.compactMap { $0["traceId"] as? String }) == upstreamTraces, "a span exactly for each trace sent up")
        #expect(spans.allSatisfy { $0["parentSpanId"] == nil })
        file.exporter.shutdown()
    }

    @Test func withoutATracerTheClientsHeaderGoesUpUnchanged() async throws {
        let h = try await Harness()
        defer { Task { await h.stop() } }
        let header = "00-\(Self.clientTrace)-\(Self.clientSpan)-01"
        try await logIn(h, traceparent: header)
        #expect(h.recorder.last(Accounts_V1_AccountsMethods.logIn.path)?["traceparent"] == header)
        #expect(h.recorder.last(Accounts_V1_AccountsMethods.logIn.path)?["tracestate"] == "client=1")
    }
}
