import Contracts
import Foundation
import Logging
import Observability
import RPCCore
import RPCTransport
import ServiceKitTesting
import Storage
import Synchronization
import Testing
import Tracing

@testable import ServiceKit

/// Issue 19, traces: the W3C header rules, the sampler, the span file, and an outbox event that
/// continues the trace it was enqueued in.
@Suite struct TraceparentTests {
    static let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @Test func aValidHeaderParsesAndFormatsBackTheSame() throws {
        let c = try #require(TraceContext.parse(traceparent: Self.valid))
        #expect(c.traceIDHex == "4bf92f3577b34da6a3ce929d0e0e4736")
        #expect(c.spanIDHex == "00f067aa0ba902b7")
        #expect(c.sampled)
        #expect(c.traceparent == Self.valid)
        let unsampled = try #require(TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"))
        #expect(!unsampled.sampled)
        #expect(unsampled.traceparent.hasSuffix("-00"))
    }

    @Test func onlyTheSampledFlagIsKeptAndPassedOn() throws {
        let c = try #require(TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09"))
        #expect(c.sampled)
        #expect(c.traceparent.hasSuffix("-01"))
        let d = try #require(TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-fe"))
        #expect(!d.sampled)
    }

    @Test(arguments: [
        "",  // empty
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",  // short
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",  // long
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",  // trailing part on version 00
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // another version
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // the forbidden version
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",  // uppercase span id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",  // uppercase flags
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // all-zero span id
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",  // not hex
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // wrong separator
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",  // leading blank
        "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",  // not ASCII
    ])
    func malformedHeadersAreIgnored(_ header: String) {
        #expect(TraceContext.parse(traceparent: header) == nil, "\(header)")
    }

    @Test func tracestateIsKeptWhenWellFormedAndDroppedOtherwise() throws {
        let kept = try #require(TraceContext.parse(traceparent: Self.valid, tracestate: "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"))
        #expect(kept.traceState == "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        let long = try #require(TraceContext.parse(traceparent: Self.valid, tracestate: String(repeating: "a=b,", count: 200)))
        #expect(long.traceState == nil, "over 512 characters: dropped, the traceparent kept")
        let control = try #require(TraceContext.parse(traceparent: Self.valid, tracestate: "a=b\nc=d"))
        #expect(control.traceState == nil)
        #expect(TraceContext.parse(traceparent: "nope", tracestate: "a=b") == nil, "no tracestate without a valid traceparent")
    }

    @Test func severalTracestateHeadersAreJoined() throws {
        var m = Metadata()
        m.add("traceparent", Self.valid)
        m.add("tracestate", "a=1")
        m.add("tracestate", "b=2")
        #expect(RPCTracing.remoteParent(m)?.traceState == "a=1,b=2")
        m.set("traceparent", "garbage")
        #expect(RPCTracing.remoteParent(m) == nil)
    }
}

/// The header's hot path (issue 19's cost goal): the parser and the formatter work eight bytes at
/// a time; they must accept, reject and write exactly what the byte-by-byte rules say.
@Suite struct TraceparentFastPathTests {
    /// The rules as the recommendation states them, one byte at a time (the parser before the
    /// fast one): the reference the fast parser is held to.
    static func referenceParse(_ header: String) -> (high: UInt64, low: UInt64, span: UInt64, sampled: Bool)? {
        let b = Array(header.utf8)
        func digit(_ c: UInt8) -> UInt64? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): UInt64(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): UInt64(c - UInt8(ascii: "a") + 10)
            default: nil
            }
        }
        func hex(_ from: Int, _ count: Int) -> UInt64? {
            var v: UInt64 = 0
            for i in from..<from + count {
                guard let d = digit(b[i]) else { return nil }
                v = v << 4 | d
            }
            return v
        }
        guard b.count == 55, b[0] == UInt8(ascii: "0"), b[1] == UInt8(ascii: "0"), b[2] == UInt8(ascii: "-"),
            b[35] == UInt8(ascii: "-"), b[52] == UInt8(ascii: "-"),
            let high = hex(3, 16), let low = hex(19, 16), let span = hex(36, 16), let flags = hex(53, 2),
            high | low != 0, span != 0
        else { return nil }
        return (high, low, span, flags & 1 != 0)
    }

    static func referenceHex(_ v: UInt64) -> String {
        let s = String(v, radix: 16)
        return String(repeating: "0", count: 16 - s.count) + s
    }

    func agrees(_ header: String) -> Bool {
        let fast = TraceContext.parse(traceparent: header)
        let reference = Self.referenceParse(header)
        guard let fast, let reference else { return fast == nil && reference == nil }
        return fast.traceIDHigh == reference.high && fast.traceIDLow == reference.low && fast.spanID == reference.span
            && fast.sampled == reference.sampled
    }

    @Test func everySingleByteChangeIsJudgedAsTheReferenceJudgesIt() {
        // Each of the 55 positions of a valid header set to each of the 256 byte values (a byte
        // that is not UTF-8 on its own becomes U+FFFD, three bytes: too long, rejected by both).
        let valid = Array(TraceparentTests.valid.utf8)
        var accepted = 0
        for i in valid.indices {
            for v in 0...255 {
                var b = valid
                b[i] = UInt8(v)
                let header = String(decoding: b, as: UTF8.self)
                #expect(agrees(header), "\(header)")
                if TraceContext.parse(traceparent: header) != nil { accepted += 1 }
            }
        }
        // 16 hex digits at each of the 48 id and 2 flag positions; the 5 fixed positions keep
        // only their own byte.
        #expect(accepted == 50 * 16 + 5)
    }

    @Test(arguments: [
        "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0", "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        // Bytes next to the hex ranges, where a range check would be off by one.
        "00-/bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-:bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-`bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-gbf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b\u{7F}-01",
    ])
    func theMalformedHeadersAreRejectedByBoth(_ header: String) {
        #expect(TraceContext.parse(traceparent: header) == nil, "\(header)")
        #expect(Self.referenceParse(header) == nil, "\(header)")
    }

    @Test func idsFormatAsTheReferenceAndParseBack() throws {
        var rng = SystemRandomNumberGenerator()
        let edges: [UInt64] = [1, 0x0F, 0x10, 0x9, 0xA, 0xFFFF_FFFF, 0x1_0000_0000, .max, 0x0123_4567_89AB_CDEF, 0xFEDC_BA98_7654_3210]
        for i in 0..<5000 {
            let high = i < edges.count ? edges[i] : rng.next()
            let low = i < edges.count ? edges[edges.count - 1 - i] : rng.next()
            let span = i < edges.count ? edges[i] : rng.next() | 1
            let c = TraceContext(traceIDHigh: high, traceIDLow: low, spanID: span, sampled: i % 2 == 0)
            let header = c.traceparent
            #expect(header == "00-\(Self.referenceHex(high))\(Self.referenceHex(low))-\(Self.referenceHex(span))-0\(i % 2 == 0 ? 1 : 0)")
            #expect(c.traceIDHex == Self.referenceHex(high) + Self.referenceHex(low))
            #expect(c.spanIDHex == Self.referenceHex(span))
            let back = try #require(TraceContext.parse(traceparent: header))
            #expect(back == c)
        }
    }

    @Test func theTracersIdsAreValidNonZeroAndDistinct() throws {
        let tracer = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 0.01), exporter: nil)
        var traces = Set<String>(), spans = Set<UInt64>()
        for _ in 0..<50_000 {
            let (root, _) = tracer.start("x", parent: nil, kind: .server)
            let (child, _) = tracer.start("y", parent: root, kind: .client)
            #expect(root.traceIDHigh | root.traceIDLow != 0 && root.spanID != 0 && child.spanID != 0)
            #expect(child.traceIDHigh == root.traceIDHigh && child.traceIDLow == root.traceIDLow)
            traces.insert(root.traceIDHex)
            spans.insert(root.spanID)
            spans.insert(child.spanID)
            #expect(TraceContext.parse(traceparent: child.traceparent) == child)
        }
        #expect(traces.count == 50_000)
        #expect(spans.count == 100_000)
        // Two generators seeded from the system's random source do not repeat each other.
        let a = TraceIDGenerator(), b = TraceIDGenerator()
        #expect(Set((0..<1000).map { _ in a.next() }).isDisjoint(with: (0..<1000).map { _ in b.next() }))
    }

    @Test func idsMadeOnManyThreadsAreDistinct() {
        // One generator serves every event loop of a process: threads drawing at once never get
        // the same id.
        let ids = TraceIDGenerator()
        let made = Mutex<[UInt64]>([])
        let threads = (0..<6).map { _ in
            Thread {
                var mine: [UInt64] = []
                for _ in 0..<10_000 {
                    mine.append(ids.next())
                    let (a, b, c) = ids.nextThree()
                    mine += [a, b, c]
                }
                made.withLock { $0 += mine }
            }
        }
        threads.forEach { $0.start() }
        while made.withLock({ $0.count }) < 6 * 40_000 { usleep(1000) }
        let all = made.withLock { $0 }
        #expect(!all.contains(0))
        #expect(Set(all).count == all.count)
    }

    @Test func aRelayWithoutATraceparentIsNotTraced() throws {
        // The gateway sends no traceparent for a trace it started and did not sample; a service
        // seeing such a relay (it carries x-gateway-token) traces nothing for it.
        let tracer = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 1), exporter: nil, notesCalls: true)
        func call(_ m: [(String, String)]) -> ServerContext {
            ServerContext(
                method: MethodDescriptor(service: "a.v1.A", method: "M", kind: .unary), requestMetadata: Metadata(m),
                deadline: nil, peer: "127.0.0.1:1")
        }
        let relayed = call([("x-forwarded-for", "1.2.3.4"), ("x-gateway-token", "t")])
        #expect(RPCTracing.startServiceCall(tracer, "a.v1.A/M", relayed.method, relayed) == nil)
        #expect(RPCTracing.traceContext(of: relayed) == nil, "nothing noted for the access log")
        let withParent = call([("x-gateway-token", "t"), ("traceparent", TraceparentTests.valid), ("tracestate", "a=1")])
        let continued = try #require(RPCTracing.startServiceCall(tracer, "a.v1.A/M", withParent.method, withParent))
        #expect(continued.trace.traceIDHex == "4bf92f3577b34da6a3ce929d0e0e4736" && continued.trace.traceState == "a=1")
        #expect(continued.span != nil)
        let malformed = call([("traceparent", "garbage"), ("x-gateway-token", "t")])
        #expect(RPCTracing.startServiceCall(tracer, "a.v1.A/M", malformed.method, malformed) == nil)
        // Not a relay (a peer's call, a direct client): a new trace, as before.
        let direct = call([("x-service-token", "s")])
        let root = try #require(RPCTracing.startServiceCall(tracer, "a.v1.A/M", direct.method, direct))
        #expect(root.span?.parentSpanID == nil)
        #expect(RPCTracing.traceContext(of: direct) == root.trace)
    }
}

@Suite struct SamplerTests {
    @Test func ratiosZeroAndOneAreNeverAndAlways() {
        let ids = TraceIDGenerator(seed: 42)
        let never = RatioSampler(ratio: 0), always = RatioSampler(ratio: 1)
        for _ in 0..<10_000 {
            let id = ids.next()
            #expect(!never.samples(traceIDLow: id))
            #expect(always.samples(traceIDLow: id))
        }
        #expect(!never.samples(traceIDLow: 0) || never.ratio > 0)
    }

    @Test func aRatioSamplesThatShareOfNewTracesDeterministically() {
        let ids = TraceIDGenerator(seed: 7)
        let sampler = RatioSampler(ratio: 0.25)
        let all = (0..<40_000).map { _ in ids.next() }
        let share = Double(all.filter { sampler.samples(traceIDLow: $0) }.count) / Double(all.count)
        #expect(abs(share - 0.25) < 0.02, "\(share)")
        #expect(all.allSatisfy { sampler.samples(traceIDLow: $0) == sampler.samples(traceIDLow: $0) })
        #expect(RatioSampler(ratio: 7).ratio == 1)
        #expect(RatioSampler(ratio: -1).ratio == 0)
    }

    @Test func childrenFollowTheirParentsFlagWhateverTheRatio() throws {
        let tracer = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 1), exporter: nil)
        let unsampled = try #require(TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"))
        let child = tracer.startSpan("x", parent: unsampled, kind: .server)
        #expect(!child.isRecording)
        #expect(child.trace.traceIDHex == unsampled.traceIDHex)
        #expect(child.parentSpanID == unsampled.spanID)
        #expect(child.trace.spanID != unsampled.spanID)
        let none = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 0), exporter: nil)
        let sampledParent = try #require(TraceContext.parse(traceparent: TraceparentTests.valid))
        #expect(none.startSpan("y", parent: sampledParent, kind: .server).isRecording)
        #expect(!none.startSpan("z", parent: nil, kind: .server).isRecording)
    }

    @Test func settingsAreReadStrictly() throws {
        #expect(try TracingSettings.parse(export: nil, ratio: nil) == .off)
        #expect(try TracingSettings.parse(export: "off", ratio: "0.5").export == .off)
        let on = try TracingSettings.parse(export: "file:/tmp/spans.jsonl", ratio: nil)
        #expect(on.export == .file("/tmp/spans.jsonl"))
        #expect(on.sampleRatio == 0.01)
        #expect(try TracingSettings.parse(export: "file:/x", ratio: "1").sampleRatio == 1)
        #expect(throws: TracingSettingsError.self) { try TracingSettings.parse(export: "http://collector:4318", ratio: nil) }
        #expect(throws: TracingSettingsError.self) { try TracingSettings.parse(export: "file:", ratio: nil) }
        #expect(throws: TracingSettingsError.self) { try TracingSettings.parse(export: "file:/x", ratio: "1.5") }
        #expect(throws: TracingSettingsError.self) { try TracingSettings.parse(export: "file:/x", ratio: "some") }
    }

    @Test func serviceSettingsTakeTheFlagsOverTheEnvironment() throws {
        let env = [
            "TRACE_EXPORT": "file:/tmp/env.jsonl", "TRACE_SAMPLE_RATIO": "0.5", "SERVICE_TOKEN": String(repeating: "s", count: 40),
            "GATEWAY_TOKEN": String(repeating: "g", count: 40),
        ]
        let fromEnv = try ServiceSettings(name: "accounts", options: ServiceOptions.parse([]), environment: env)
        #expect(fromEnv.tracing == TracingSettings(export: .file("/tmp/env.jsonl"), sampleRatio: 0.5))
        let flagged = try ServiceSettings(
            name: "accounts", options: ServiceOptions.parse(["--trace-export", "file:/tmp/flag.jsonl", "--trace-sample-ratio", "1"]),
            environment: env)
        #expect(flagged.tracing == TracingSettings(export: .file("/tmp/flag.jsonl"), sampleRatio: 1))
        #expect(
            try ServiceSettings(
                name: "accounts", options: ServiceOptions.parse([]),
                environment: ["SERVICE_TOKEN": env["SERVICE_TOKEN"]!, "GATEWAY_TOKEN": env["GATEWAY_TOKEN"]!]
            ).tracing == .off)
        #expect(throws: (any Error).self) {
            try ServiceSettings(name: "accounts", options: ServiceOptions.parse([]), environment: env.merging(["TRACE_EXPORT": "jaeger"]) { $1 })
        }
    }
}

@Suite struct SpanFileTests {
    @Test func aSpanIsOneJSONLineInOTLPFieldNames() throws {
        let file = try TestSpanFile(serviceName: "accounts")
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        let root = tracer.startSpan("accounts.v1.Accounts/SignUp", parent: nil, kind: .server)
        root.setAttribute("rpc.system", .string("grpc"))
        root.setAttribute("odd \"key\"\n", .int64(42))
        let child = tracer.startSpan("social.v1.SocialInternal/SendNotification", parent: root.trace, kind: .client)
        RPCTracing.end(child, .unavailable, message: "peer down")
        RPCTracing.end(root, .ok)
        tracer.startSpan(
            "unsampled", parent: TraceContext.parse(traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"), kind: .server
        )
        .end()
        exporter.flush()
        let spans = try readSpans(path)
        #expect(spans.count == 2, "the unsampled span is not written")
        let c = spans[0], r = spans[1]
        #expect(r["traceId"] as? String == root.trace.traceIDHex)
        #expect(r["spanId"] as? String == root.trace.spanIDHex)
        #expect(r["parentSpanId"] == nil, "a root has no parent")
        #expect(r["name"] as? String == "accounts.v1.Accounts/SignUp")
        #expect(r["kind"] as? Int == 2)
        let start = try #require(UInt64(r["startTimeUnixNano"] as? String ?? ""))
        let end = try #require(UInt64(r["endTimeUnixNano"] as? String ?? ""))
        #expect(end >= start && start > 1_700_000_000 * 1_000_000_000)
        #expect(attributes(r)["rpc.system"] as? String == "grpc")
        #expect(attributes(r)["rpc.grpc.status_code"] as? String == "0")
        #expect(attributes(r)["odd \"key\"\n"] as? String == "42")
        #expect((r["status"] as? [String: Any])?["code"] as? Int == 0, "a server span that answered is not an error")
        let resource = try #require(r["resource"] as? [String: Any])
        #expect(attributes(resource)["service.name"] as? String == "accounts")
        #expect(c["parentSpanId"] as? String == root.trace.spanIDHex)
        #expect(c["traceId"] as? String == root.trace.traceIDHex)
        #expect(c["kind"] as? Int == 3)
        #expect((c["status"] as? [String: Any])?["code"] as? Int == 2)
        #expect((c["status"] as? [String: Any])?["message"] as? String == "peer down")
        exporter.shutdown()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text.split(separator: "\n").count == 2 && text.hasSuffix("\n"))
    }

    @Test func namesAndValuesAreEscapedAndPlainOnesCopied() throws {
        let file = try TestSpanFile(serviceName: "accounts")
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        let odd = "q\"b\\n\nr\rt\tc\u{1}d\u{7F}é\u{85}\u{2028}\u{2029}ü→end"
        let span = tracer.startSpan(odd, parent: nil, kind: .internal)
        span.setAttribute("plain", .string("accounts.v1.Accounts/GetSigningKeys"))
        span.setAttribute(odd, .string(odd))
        span.end()
        exporter.shutdown()
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text.split(separator: "\n").count == 1, "one line, whatever the names hold")
        #expect(text.contains(#"q\"b\\n\nr\rt\tc\u0001d\u007fé\u0085\u2028\u2029ü→end"#))
        let r = try #require(try readSpans(path).first)
        #expect(r["name"] as? String == odd)
        #expect(attributes(r)[odd] as? String == odd)
        #expect(attributes(r)["plain"] as? String == "accounts.v1.Accounts/GetSigningKeys")
    }

    @Test func theBufferIsBoundedAndShutdownWritesWhatIsLeft() throws {
        let dir = TemporaryDirectory()
        defer { dir.remove() }
        let path = "\(dir.path)/spans.jsonl"
        let exporter = try SpanFileExporter(path: path, serviceName: "t", capacity: 3, batch: 100, interval: .seconds(3600))
        let tracer = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 1), exporter: exporter)
        func dropped() -> Double { ProcessMetrics.sample("tracing_spans_dropped_total", in: ProcessMetrics.exposition()) ?? 0 }
        let droppedBefore = dropped()
        for i in 0..<10 { tracer.startSpan("s\(i)", parent: nil, kind: .internal).end() }
        // Counted in the process's registry, the one `/metrics` serves (other tests may drop
        // spans meanwhile: at least these).
        #expect(dropped() >= droppedBefore + 7)
        #expect(try readSpans(path).isEmpty, "nothing written before the interval, the batch or a flush")
        exporter.shutdown()
        #expect(try readSpans(path).map { $0["name"] as? String } == ["s0", "s1", "s2"], "past capacity spans are dropped")
        tracer.startSpan("late", parent: nil, kind: .internal).end()
        exporter.flush()
        #expect(try readSpans(path).count == 3, "nothing after shutdown")
    }

    @Test func theTracerServesTheTracingAPI() throws {
        let file = try TestSpanFile(serviceName: "t")
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        var carrier: [String: String] = [:]
        tracer.withSpan("outer", ofKind: .internal) { span in
            span.attributes["k"] = "v"
            tracer.inject(ServiceContext.current!, into: &carrier, using: DictionaryInjector())
            var extracted = ServiceContext.topLevel
            tracer.extract(carrier, into: &extracted, using: DictionaryExtractor())
            #expect(extracted.traceContext == span.context.traceContext)
        }
        tracer.forceFlush()
        let spans = try readSpans(path)
        #expect(spans.count == 1)
        #expect(carrier["traceparent"] == "00-\(spans[0]["traceId"] as! String)-\(spans[0]["spanId"] as! String)-01")
        #expect(attributes(spans[0])["k"] as? String == "v")
        exporter.shutdown()
    }
}

struct DictionaryInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) { carrier[key] = value }
}
struct DictionaryExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? { carrier[key] }
}

@Suite struct TraceLogTests {
    @Test func jsonLinesCarryTheCurrentSpansIds() throws {
        let tracer = SpanTracer(serviceName: "t", sampler: RatioSampler(ratio: 1), exporter: nil)
        let span = tracer.startSpan("x", parent: nil, kind: .server)
        let handler = JSONLogHandler(label: "t", metadataProvider: ProcessTracing.metadataProvider)
        let event = LogEvent(level: .info, message: "inside", metadata: nil, source: "Tests", file: #fileID, function: #function, line: #line)
        let line = ServiceContext.withValue(span.context) {
            String(decoding: handler.line(for: event, at: LogTimestamp(seconds: 0, microseconds: 0)), as: UTF8.self)
        }
        #expect(line.contains(#""msg":"inside","trace_id":"\#(span.trace.traceIDHex)","span_id":"\#(span.trace.spanIDHex)""#), "\(line)")
        let outside = String(decoding: handler.line(for: event, at: LogTimestamp(seconds: 0, microseconds: 0)), as: UTF8.self)
        #expect(!outside.contains("trace_id"))
        let entry = AccessLog.entry(method: "/a.B/C", code: .ok, duration: .zero, peer: "p", user: nil, trace: span.trace)
        #expect(entry.metadata["trace_id"] == .string(span.trace.traceIDHex))
        #expect(entry.metadata["span_id"] == .string(span.trace.spanIDHex))
    }
}

/// An outbox event remembers the trace it was enqueued in, and its delivery — a later pass of
/// the delivery loop, with no request around — continues that trace on the receiver.
@Suite(.serialized) struct OutboxTraceTests {
    final class Seen: Sendable {
        let contexts = Mutex<[TraceContext?]>([])
    }

    struct Receiver: RPCService {
        let seen: Seen
        var serviceName: String { Tasks_V1_TasksInternalMethods.serviceName }
        var methods: [ServerMethod] {
            let seen = self.seen
            return [
                ServerMethod(
                    Tasks_V1_TasksInternalMethods.eraseUser,
                    .unary(Tasks_V1_EraseUserRequest.self, Tasks_V1_EraseUserResponse.self) { _, _ in
                        seen.contexts.withLock { $0.append(TraceContext.current) }
                        return Tasks_V1_EraseUserResponse()
                    })
            ]
        }
    }

    /// The tracing interceptor is outside the access policy: a call the policy refuses (a wrong
    /// service credential) is a span with its status, and the handler never runs.
    @Test func aCallThePolicyRefusesIsASpanToo() async throws {
        let file = try TestSpanFile(serviceName: "test")
        defer { file.remove() }
        let (path, exporter, tracer) = (file.path, file.exporter, file.tracer)
        let seen = Seen()
        let server = try await TestServer(services: [Receiver(seen: seen)], keys: TestTokens().source) {
            $0.interceptors.insert(TracingInterceptor(tracer: tracer), at: 0)
        }
        let wrong = Tasks_V1_TasksInternalClient(
            RPCClient(transport: CredentialedTransport(base: server.channel, serviceToken: "not-the-credential")))
        var request = Tasks_V1_EraseUserRequest()
        request.eventId = "refused"
        let error = await #expect(throws: RPCError.self) { _ = try await wrong.eraseUser(request) }
        #expect(error?.code == .permissionDenied)
        _ = try await Tasks_V1_TasksInternalClient(server.service).eraseUser(request)
        await server.stop()
        exporter.flush()
        let spans = try readSpans(path)
        #expect(spans.map { $0["name"] as? String } == ["tasks.v1.TasksInternal/EraseUser", "tasks.v1.TasksInternal/EraseUser"])
        #expect(spans.map { attributes($0)["rpc.grpc.status_code"] as? String } == ["7", "0"])
        #expect(seen.contexts.withLock { $0.count } == 1, "the refused call never reached the handler")
        exporter.shutdown()
    }

    @Test func theDeliveryContinuesTheTraceTheEventWasEnqueuedIn() async throws {
        let file = try TestSpanFile(serviceName: "test")
        defer { file.remove() }
        var quiet = Logger(label: "outbox-trace")
        quiet.logLevel = .critical
        let (dir, path, exporter, tracer) = (file.dir, file.path, file.exporter, file.tracer)
        let db = try Database.open(directory: dir.path, fileName: "o.sqlite", migrations: Migration.kit, logger: quiet)
        defer { db.close() }
        let seen = Seen()
        let peer = try await TestServer(services: [Receiver(seen: seen)], keys: TestTokens().source) {
            $0.interceptors.insert(TracingInterceptor(tracer: tracer), at: 0)
        }
        let port = peer.port

        // The handler that enqueues: a server span current while it writes.
        let handlerSpan = tracer.startSpan("accounts.v1.Accounts/DeleteAccount", parent: nil, kind: .server)
        try await ServiceContext.withValue(handlerSpan.context) {
            try await db.write { tx in
                var r = Tasks_V1_EraseUserRequest()
                r.eventId = "traced-1"
                try tx.enqueueCall(Tasks_V1_TasksInternalMethods.eraseUser, r, eventID: r.eventId)
            }
        }
        handlerSpan.end()
        // And one enqueued outside any trace.
        try await db.write { tx in
            var r = Tasks_V1_EraseUserRequest()
            r.eventId = "untraced-2"
            try tx.enqueueCall(Tasks_V1_TasksInternalMethods.eraseUser, r, eventID: r.eventId)
        }
        let pending = try await db.pendingOutbox()
        #expect(pending.map(\.traceContext) == [handlerSpan.trace.traceparent, nil], "the column holds the enqueuing span's traceparent")

        let peers = PeerClients(make: { _ in TestServer.peerClient(port: port) }, tracer: tracer)
        let delivery = OutboxDelivery(database: db, logger: quiet, deliver: OutboxSenders.rpc(peers: peers, timeout: .seconds(5)).deliver)
        let pass = try await delivery.deliverDue()
        #expect(pass.delivered == 2)
        exporter.flush()

        let contexts = seen.contexts.withLock { $0 }
        #expect(contexts.count == 2)
        let spans = try readSpans(path)
        let byID = Dictionary(spans.map { ($0["spanId"] as! String, $0) }, uniquingKeysWith: { a, _ in a })
        let trace = handlerSpan.trace.traceIDHex
        // handler (server) → delivery (client, parent: the handler's span) → receiver (server).
        let client = try #require(spans.first { $0["kind"] as? Int == 3 })
        #expect(client["traceId"] as? String == trace)
        #expect(client["parentSpanId"] as? String == handlerSpan.trace.spanIDHex)
        #expect(client["name"] as? String == "tasks.v1.TasksInternal/EraseUser")
        let servers = spans.filter { $0["kind"] as? Int == 2 && $0["name"] as? String == "tasks.v1.TasksInternal/EraseUser" }
        #expect(servers.count == 2, "both deliveries are server spans on the receiver")
        let continued = try #require(servers.first { $0["traceId"] as? String == trace })
        #expect(continued["parentSpanId"] as? String == client["spanId"] as? String)
        #expect(byID[handlerSpan.trace.spanIDHex] != nil)
        #expect(contexts.compactMap { $0 }.contains { $0.traceIDHex == trace }, "the receiver's handler runs in the continued trace")
        let fresh = try #require(servers.first { $0["traceId"] as? String != trace })
        #expect(fresh["parentSpanId"] == nil, "the untraced event's delivery starts no client span; the receiver starts its own trace")
        await peer.stop()
        exporter.shutdown()
    }
}
