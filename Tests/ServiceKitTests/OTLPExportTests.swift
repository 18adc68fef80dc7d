import Contracts
import Foundation
import OTLPContracts
import OTLPExport
import Observability
import RPCCore
import RPCTLS
import RPCTransport
import ServiceKitTesting
import Synchronization
import Testing
import Tracing

@testable import ServiceKit

typealias ExportRequest = Opentelemetry_Proto_Collector_Trace_V1_ExportTraceServiceRequest
typealias ExportResponse = Opentelemetry_Proto_Collector_Trace_V1_ExportTraceServiceResponse

/// An OTLP collector on loopback, served by our own server: it decodes each Export with the
/// generated types and keeps it. `failures` are answered first, one per call, before any is kept;
/// `rejected` is answered as a partial success.
final class TestCollector: Sendable {
    final class Service: Opentelemetry_Proto_Collector_Trace_V1_TraceService, Sendable {
        let requests = Mutex<[ExportRequest]>([])
        let calls = Mutex(0)
        /// `traceparent` headers the Export calls carried (none: the exporter's calls are not traced).
        let traceparents = Mutex<[String]>([])
        let failures: Mutex<[StatusCode]>
        let rejected: Int64
        init(failures: [StatusCode], rejected: Int64) {
            self.failures = Mutex(failures)
            self.rejected = rejected
        }

        func export(request: ExportRequest, context: ServerContext) async throws -> ExportResponse {
            calls.withLock { $0 += 1 }
            if let t = context.requestMetadata["traceparent"] { traceparents.withLock { $0.append(t) } }
            if let code = failures.withLock({ $0.isEmpty ? nil : $0.removeFirst() }) { throw RPCError(code, "test collector says \(code)") }
            requests.withLock { $0.append(request) }
            var response = ExportResponse()
            if rejected > 0 {
                response.partialSuccess.rejectedSpans = rejected
                response.partialSuccess.errorMessage = "some refused"
            }
            return response
        }
    }

    let service: Service
    let server: RPCServer
    let port: Int

    init(failures: [StatusCode] = [], rejected: Int64 = 0, tls: TLSConfiguration? = nil) async throws {
        service = Service(failures: failures, rejected: rejected)
        var config = ServerConfiguration(host: "127.0.0.1", port: 0, tls: tls)
        config.threads = 1
        server = RPCServer(configuration: config, services: [service])
        port = try await server.start()
    }

    /// Every span received, with the `service.name` of its resource.
    var spans: [(service: String, span: Opentelemetry_Proto_Trace_V1_Span)] {
        service.requests.withLock { $0 }.flatMap { request in
            request.resourceSpans.flatMap { rs in
                let service = rs.resource.attributes.first { $0.key == "service.name" }?.value.stringValue ?? ""
                return rs.scopeSpans.flatMap { $0.spans.map { (service, $0) } }
            }
        }
    }

    func stop() async { await server.shutdownGracefully() }
}

func droppedSpans() -> Double { ProcessMetrics.sample("tracing_spans_dropped_total", in: ProcessMetrics.exposition()) ?? 0 }

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

/// Issue 19: spans exported with OTLP/gRPC to a collector (`TRACE_EXPORT=otlp://host:port`).
@Suite(.serialized) struct OTLPExportTests {
    /// An exporter quick to give up (tests of failure).
    static func quick(port: Int, attempts: Int = 3) -> OTLPExporter.Configuration {
        var c = OTLPExporter.Configuration(host: "127.0.0.1", port: port)
        c.attempts = attempts
        c.initialBackoff = .milliseconds(20)
        c.timeout = .seconds(2)
        c.shutdownTimeout = .seconds(3)
        return c
    }

    @Test func spansArriveWithTheirIdsParentAttributesStatusEventsLinksAndResource() async throws {
        let collector = try await TestCollector()
        let exporter = OTLPExporter(configuration: OTLPExporter.Configuration(host: "127.0.0.1", port: collector.port), serviceName: "accounts")
        let tracer = SpanTracer(serviceName: "accounts", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let remote = try #require(
            TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", tracestate: "congo=t61rcWkgMzE"))
        let server = tracer.startSpan("accounts.v1.Accounts/SignUp", parent: remote, kind: .server)
        server.setAttribute("rpc.system", .string("grpc"))
        server.setAttribute("rpc.grpc.status_code", .int64(5))
        server.setAttribute("small", .int32(-3))
        server.setAttribute("ratio", .double(0.25))
        server.setAttribute("retried", .bool(true))
        server.setAttribute("tags", .stringArray(["a", "b"]))
        server.setAttribute("sizes", .int64Array([1, 2]))
        server.setStatus(SpanStatus(code: .error, message: "not found"))
        server.addEvent(SpanEvent(name: "cache miss", attributes: ["key": .string("user-1")]))
        let other = TraceContext(traceIDHigh: 1, traceIDLow: 2, spanID: 3, sampled: true)
        var linked = ServiceContext.topLevel
        linked.traceContext = other
        server.addLink(SpanLink(context: linked, attributes: [:]))
        // Ended, and flushed, while the server span is the current one: the Export still goes out
        // outside any trace (no `traceparent`; its channel has no tracing interceptor).
        TraceContext.withCurrent(server.trace) {
            let child = tracer.startSpan("accounts.v1.Accounts/store", parent: server.trace, kind: .client)
            child.end()
            server.end()
            exporter.flush()
        }
        #expect(collector.service.traceparents.withLock { $0 }.isEmpty, "the exporter's calls are not traced")

        let spans = collector.spans
        #expect(spans.count == 2)
        #expect(Set(spans.map(\.service)) == ["accounts"])
        let s = try #require(spans.first { $0.span.name == "accounts.v1.Accounts/SignUp" }?.span)
        let c = try #require(spans.first { $0.span.name == "accounts.v1.Accounts/store" }?.span)
        #expect(hex(s.traceId) == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(hex(s.spanId) == server.trace.spanIDHex)
        #expect(hex(s.parentSpanId) == "00f067aa0ba902b7", "the remote caller's span is the parent")
        #expect(s.traceState == "congo=t61rcWkgMzE")
        #expect(s.flags & 0xFF == 1)
        #expect(s.kind == .server)
        #expect(s.startTimeUnixNano > 1_700_000_000 * 1_000_000_000 && s.endTimeUnixNano >= s.startTimeUnixNano)
        var attributes: [String: Opentelemetry_Proto_Common_V1_AnyValue.OneOf_Value] = [:]
        for kv in s.attributes { attributes[kv.key] = kv.value.value }
        #expect(attributes["rpc.system"] == .stringValue("grpc"))
        #expect(attributes["rpc.grpc.status_code"] == .intValue(5))
        #expect(attributes["small"] == .intValue(-3))
        #expect(attributes["ratio"] == .doubleValue(0.25))
        #expect(attributes["retried"] == .boolValue(true))
        var strings = Opentelemetry_Proto_Common_V1_ArrayValue()
        strings.values = ["a", "b"].map {
            var v = Opentelemetry_Proto_Common_V1_AnyValue(); v.value = .stringValue($0); return v
        }
        #expect(attributes["tags"] == .arrayValue(strings))
        #expect(attributes["sizes"].map { if case .arrayValue(let a) = $0 { a.values.map(\.intValue) } else { [] } } == [Int64(1), 2])
        #expect(s.status.code == .error)
        #expect(s.status.message == "not found")
        #expect(s.events.map(\.name) == ["cache miss"])
        #expect(s.events.first?.attributes.first?.value.stringValue == "user-1")
        #expect(s.links.map { hex($0.traceId) } == ["00000000000000010000000000000002"])
        #expect(s.links.map { hex($0.spanId) } == ["0000000000000003"])
        #expect(hex(c.traceId) == hex(s.traceId))
        #expect(c.parentSpanId == s.spanId)
        #expect(c.kind == .client)
        #expect(!c.hasStatus, "a span without a status has none on the wire (UNSET)")
        exporter.shutdown()
        await collector.stop()
    }

    /// A real traced server whose exporter points at a port nobody listens on: its calls answer
    /// as fast as ever, the spans are counted as dropped, and flush and shutdown return.
    @Test func aCollectorThatIsDownCostsTheCallsNothing() async throws {
        let (fd, port) = try loopbackSocket()  // bound, not listening: connections are refused
        defer { close(fd) }
        let exporter = OTLPExporter(configuration: Self.quick(port: port), serviceName: "tasks")
        let tracer = SpanTracer(serviceName: "tasks", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let seen = OutboxTraceTests.Seen()
        let server = try await TestServer(services: [OutboxTraceTests.Receiver(seen: seen)], keys: TestTokens().source) {
            $0.interceptors.insert(TracingInterceptor(tracer: tracer), at: 0)
        }
        let before = droppedSpans()
        let client = Tasks_V1_TasksInternalClient(server.service)
        let clock = ContinuousClock()
        let took = try await clock.measure {
            for i in 0..<50 {
                var request = Tasks_V1_EraseUserRequest()
                request.eventId = "e-\(i)"
                _ = try await client.eraseUser(request, options: CallOptions(timeout: .seconds(5)))
            }
        }
        #expect(took < .seconds(5), "50 calls took \(took)")
        #expect(seen.contexts.withLock { $0.count } == 50)
        let flushed = clock.measure { exporter.flush() }
        #expect(flushed < .seconds(5), "flush gave up on the batch after its retries (\(flushed))")
        #expect(droppedSpans() - before == 50, "every span counted as dropped")
        let stopped = clock.measure { exporter.shutdown() }
        #expect(stopped < .seconds(5))
        await server.stop()
    }

    /// A flush waits for the spans buffered when it was asked, not for an empty buffer: spans
    /// that keep arriving while the collector is down (each batch then takes its retries) do not
    /// hold it (they did, for as long as they came faster than a batch a round).
    @Test func aFlushUnderSteadySpansWaitsOnlyForWhatWasBuffered() async throws {
        let (fd, port) = try loopbackSocket()  // bound, not listening: connections are refused
        defer { close(fd) }
        let exporter = OTLPExporter(configuration: Self.quick(port: port), serviceName: "tasks")
        let tracer = SpanTracer(serviceName: "tasks", sampler: RatioSampler(ratio: 1), exporter: exporter)
        for _ in 0..<10 { tracer.startSpan("before", parent: nil, kind: .internal).end() }
        let producing = Atomic<Bool>(true)
        let producer = Thread {
            while producing.load(ordering: .relaxed) {
                for _ in 0..<600 { tracer.startSpan("steady", parent: nil, kind: .internal).end() }
                usleep(20_000)
            }
        }
        producer.start()
        // On a thread of its own, so that a flush that never returns fails the test (once the
        // producer stops, the buffer empties and it returns) instead of hanging the suite.
        let done = DispatchSemaphore(value: 0)
        Thread {
            exporter.flush()
            done.signal()
        }.start()
        let returned = done.wait(timeout: .now() + 10) == .success
        producing.store(false, ordering: .relaxed)
        #expect(returned, "flush still waiting after 10 s while spans kept coming")
        if !returned { done.wait() }
        exporter.shutdown()
    }

    /// A collector that takes the connection and never answers (a listening socket nobody
    /// serves): a call already on its way when the process stops does not hold the shutdown past
    /// its timeout, however long the call's own deadline.
    @Test func aCollectorThatNeverAnswersHoldsTheShutdownForItsTimeoutAtMost() async throws {
        let (fd, port) = try loopbackSocket(listening: 8)
        defer { close(fd) }
        var config = Self.quick(port: port)
        config.timeout = .seconds(60)
        config.shutdownTimeout = .milliseconds(500)
        config.batch = 1  // sent at once: on its way before the shutdown
        let exporter = OTLPExporter(configuration: config, serviceName: "tasks")
        let tracer = SpanTracer(serviceName: "tasks", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let before = droppedSpans()
        tracer.startSpan("stuck", parent: nil, kind: .internal).end()
        try await Task.sleep(for: .milliseconds(300))
        let clock = ContinuousClock()
        let took = clock.measure { exporter.shutdown() }
        #expect(took < .seconds(2), "shutdown took \(took)")
        #expect(droppedSpans() - before == 1)
    }

    @Test func aBatchAnsweredUnavailableIsSentAgainAndArrivesOnce() async throws {
        let collector = try await TestCollector(failures: [.unavailable, .unavailable])
        let exporter = OTLPExporter(configuration: Self.quick(port: collector.port), serviceName: "social")
        let tracer = SpanTracer(serviceName: "social", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let before = droppedSpans()
        for i in 0..<3 { tracer.startSpan("span-\(i)", parent: nil, kind: .internal).end() }
        exporter.flush()
        #expect(collector.service.calls.withLock { $0 } == 3, "two UNAVAILABLE answers, then OK")
        #expect(collector.service.requests.withLock { $0.count } == 1)
        #expect(collector.spans.map(\.span.name).sorted() == ["span-0", "span-1", "span-2"])
        #expect(droppedSpans() == before)
        exporter.shutdown()
        await collector.stop()
    }

    @Test func aBatchRefusedForGoodOrRetriedTooOftenIsDroppedAndCounted() async throws {
        // INVALID_ARGUMENT is not retryable: one call, the batch dropped.
        let refusing = try await TestCollector(failures: [.invalidArgument])
        let exporter = OTLPExporter(configuration: Self.quick(port: refusing.port), serviceName: "social")
        let tracer = SpanTracer(serviceName: "social", sampler: RatioSampler(ratio: 1), exporter: exporter)
        var before = droppedSpans()
        for i in 0..<4 { tracer.startSpan("span-\(i)", parent: nil, kind: .internal).end() }
        exporter.flush()
        #expect(refusing.service.calls.withLock { $0 } == 1)
        #expect(droppedSpans() - before == 4)
        exporter.shutdown()
        await refusing.stop()

        // RESOURCE_EXHAUSTED every time: `attempts` calls, then dropped.
        let busy = try await TestCollector(failures: Array(repeating: .resourceExhausted, count: 10))
        let again = OTLPExporter(configuration: Self.quick(port: busy.port, attempts: 3), serviceName: "social")
        let tracer2 = SpanTracer(serviceName: "social", sampler: RatioSampler(ratio: 1), exporter: again)
        before = droppedSpans()
        for i in 0..<2 { tracer2.startSpan("span-\(i)", parent: nil, kind: .internal).end() }
        again.flush()
        #expect(busy.service.calls.withLock { $0 } == 3)
        #expect(droppedSpans() - before == 2)
        again.shutdown()
        await busy.stop()
    }

    @Test func spansAPartialSuccessRejectsAreCountedAsDropped() async throws {
        let collector = try await TestCollector(rejected: 2)
        let exporter = OTLPExporter(configuration: Self.quick(port: collector.port), serviceName: "finance")
        let tracer = SpanTracer(serviceName: "finance", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let before = droppedSpans()
        for i in 0..<5 { tracer.startSpan("span-\(i)", parent: nil, kind: .internal).end() }
        exporter.flush()
        #expect(collector.spans.count == 5)
        #expect(droppedSpans() - before == 2)
        exporter.shutdown()
        await collector.stop()
    }

    @Test func batchesHoldAtMostTheBatchSizeAndTheBufferIsBounded() async throws {
        let collector = try await TestCollector()
        var config = Self.quick(port: collector.port)
        config.batch = 100
        config.capacity = 250
        config.interval = .seconds(60)  // only a full batch, flush or shutdown sends
        let exporter = OTLPExporter(configuration: config, serviceName: "matchmaking")
        let tracer = SpanTracer(serviceName: "matchmaking", sampler: RatioSampler(ratio: 1), exporter: exporter)
        let before = droppedSpans()
        // Ended together, faster than a batch is sent: at most 250 wait, the rest are dropped.
        for i in 0..<1000 { tracer.startSpan("span-\(i)", parent: nil, kind: .internal).end() }
        exporter.shutdown()
        let sizes = collector.service.requests.withLock { $0 }.map { $0.resourceSpans.first?.scopeSpans.first?.spans.count ?? 0 }
        #expect(sizes.allSatisfy { $0 <= 100 }, "\(sizes)")
        let received = sizes.reduce(0, +)
        #expect(received >= 250, "\(received)")
        #expect(Double(received) + droppedSpans() - before == 1000, "each span either arrived or was counted")
        tracer.startSpan("late", parent: nil, kind: .internal).end()
        #expect(Double(received) + droppedSpans() - before == 1001, "after shutdown spans are dropped")
        await collector.stop()
    }

    /// `otlps://`: TLS to the collector, its certificate checked against the cluster CA the
    /// process trusts for its peers (`PEER_TLS_CA`): a collector whose certificate another CA
    /// signed gets nothing, and the spans are counted as dropped.
    @Test func overTLSTheCollectorIsCheckedAgainstTheClusterCA() async throws {
        let certs = try TestCertificates(names: ["collector"], foreign: ["rogue"])
        defer { certs.remove() }
        func collector(_ name: String) async throws -> TestCollector {
            try await TestCollector(
                tls: try TLSConfiguration.server(certificateChainPEMFile: certs.certFile(name), privateKeyPEMFile: certs.keyFile(name), alpn: ["h2"]))
        }
        func exporter(port: Int) throws -> OTLPExporter {
            var env = certs.peerEnvironment(as: nil)
            env["TRACE_EXPORT"] = "otlps://127.0.0.1:\(port)"
            env["SERVICE_TOKEN"] = String(repeating: "s", count: 40)
            env["GATEWAY_TOKEN"] = String(repeating: "g", count: 40)
            let settings = try ServiceSettings(name: "accounts", options: ServiceOptions.parse([]), environment: env)
            guard case .otlp(let endpoint) = settings.tracing.export else { throw TracingSettingsError("not otlp") }
            #expect(endpoint.tls)
            return try OTLPExporter(endpoint: endpoint, serviceName: settings.name, clusterTLS: settings.peerTLS)
        }

        let trusted = try await collector("collector")
        let good = try exporter(port: trusted.port)
        let tracer = SpanTracer(serviceName: "accounts", sampler: RatioSampler(ratio: 1), exporter: good)
        tracer.startSpan("over-tls", parent: nil, kind: .internal).end()
        good.flush()
        #expect(trusted.spans.map(\.span.name) == ["over-tls"])
        good.shutdown()
        await trusted.stop()

        let rogue = try await collector("rogue")
        let bad = try exporter(port: rogue.port)
        let tracer2 = SpanTracer(serviceName: "accounts", sampler: RatioSampler(ratio: 1), exporter: bad)
        let before = droppedSpans()
        tracer2.startSpan("refused", parent: nil, kind: .internal).end()
        bad.flush()
        #expect(rogue.spans.isEmpty, "a certificate the cluster CA did not sign is refused")
        #expect(droppedSpans() - before == 1)
        bad.shutdown()
        await rogue.stop()
    }

    @Test func theSettingNamesTheCollector() throws {
        #expect(
            try TracingSettings.parse(export: "otlp://collector:4317", ratio: nil).export
                == .otlp(OTLPEndpoint(host: "collector", port: 4317, tls: false)))
        #expect(
            try TracingSettings.parse(export: "otlps://otel.example:443/", ratio: nil).export
                == .otlp(OTLPEndpoint(host: "otel.example", port: 443, tls: true)))
        #expect(try TracingSettings.parse(export: "otlp://[::1]:4317", ratio: nil).export == .otlp(OTLPEndpoint(host: "::1", port: 4317, tls: false)))
        #expect(
            try TracingSettings.parse(export: "otlp://collector", ratio: nil).export == .otlp(OTLPEndpoint(host: "collector", port: 4317, tls: false))
        )
        for bad in [
            "otlp://", "otlp://:4317", "otlp://host:0", "otlp://host:70000", "otlp://host:x", "otlp://host:4317/v1/traces", "otlp://::1:4317",
            "http://host:4317",
        ] {
            #expect(throws: TracingSettingsError.self, "\(bad)") { try TracingSettings.parse(export: bad, ratio: nil) }
        }
        do {
            _ = try TracingSettings.parse(export: "otlp://host:x", ratio: nil)
        } catch {
            #expect("\(error)".contains("TRACE_EXPORT"))
        }
        #expect(OTLPEndpoint(host: "::1", port: 4317, tls: true).description == "otlps://[::1]:4317")
    }
}
