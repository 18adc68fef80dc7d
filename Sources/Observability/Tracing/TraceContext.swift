import Tracing

/// A W3C Trace Context (`traceparent` and `tracestate`, https://www.w3.org/TR/trace-context/):
/// which trace a span belongs to, which span it is, and whether the trace is sampled.
///
/// Parsing is strict, as the recommendation asks: version `00` only, exactly
/// `00-<32 lowercase hex>-<16 lowercase hex>-<2 lowercase hex>`, neither id all zeros. A header
/// that does not pass is ignored (the call starts a new trace; it never fails for it).
public struct TraceContext: Sendable, Hashable {
    /// The 16-byte trace id as two big-endian halves.
    public var traceIDHigh: UInt64
    public var traceIDLow: UInt64
    /// The span this context names: a span of ours, or the caller's span for a remote parent.
    public var spanID: UInt64
    /// Trace flags; only `sampled` (bit 0) is known and passed on.
    public var flags: UInt8
    /// The `tracestate` header as received (vendor entries), passed on unchanged; nil when absent
    /// or not well formed.
    public var traceState: String?

    public init(traceIDHigh: UInt64, traceIDLow: UInt64, spanID: UInt64, sampled: Bool, traceState: String? = nil) {
        self.traceIDHigh = traceIDHigh
        self.traceIDLow = traceIDLow
        self.spanID = spanID
        self.flags = sampled ? 1 : 0
        self.traceState = traceState
    }

    public var sampled: Bool { flags & 1 != 0 }

    /// The 32 lowercase hex digits of the trace id.
    public var traceIDHex: String { Hex.string(traceIDHigh, traceIDLow) }
    /// The 16 lowercase hex digits of the span id.
    public var spanIDHex: String { Hex.string(spanID) }

    /// The `traceparent` header naming this context: `00-<trace id>-<span id>-<flags>`.
    public var traceparent: String {
        // Written straight into the string's storage, eight digits per store: one allocation.
        String(unsafeUninitializedCapacity: 55) { b in
            let p = UnsafeMutableRawPointer(b.baseAddress!)
            b[0] = UInt8(ascii: "0")
            b[1] = UInt8(ascii: "0")
            b[2] = UInt8(ascii: "-")
            Hex.store(traceIDHigh, at: p + 3)
            Hex.store(traceIDLow, at: p + 19)
            b[35] = UInt8(ascii: "-")
            Hex.store(spanID, at: p + 36)
            b[52] = UInt8(ascii: "-")
            b[53] = UInt8(ascii: "0")
            b[54] = sampled ? UInt8(ascii: "1") : UInt8(ascii: "0")
            return 55
        }
    }

    /// The longest `tracestate` passed on (the recommendation lets a vendor drop a longer one).
    public static let maxTraceStateLength = 512

    /// The context a `traceparent` (and optional `tracestate`) header carries, or nil when the
    /// `traceparent` is absent or not valid version-00 text. A malformed `tracestate` is dropped
    /// and the `traceparent` kept.
    public static func parse(traceparent: String?, tracestate: String? = nil) -> TraceContext? {
        guard var header = traceparent else { return nil }
        return header.withUTF8 { b -> TraceContext? in
            guard b.count == 55, b[0] == UInt8(ascii: "0"), b[1] == UInt8(ascii: "0"), b[2] == UInt8(ascii: "-"),
                b[35] == UInt8(ascii: "-"), b[52] == UInt8(ascii: "-"),
                let high = Hex.parse(b, 3), let low = Hex.parse(b, 19), let span = Hex.parse(b, 36),
                let f1 = Hex.digit(b[53]), let f2 = Hex.digit(b[54])
            else { return nil }
            guard high | low != 0, span != 0 else { return nil }
            var c = TraceContext(traceIDHigh: high, traceIDLow: low, spanID: span, sampled: (f1 << 4 | f2) & 1 != 0)
            c.traceState = tracestate.flatMap(validTraceState)
            return c
        }
    }

    /// `tracestate` when it is printable ASCII of at most `maxTraceStateLength` characters with
    /// at least one non-blank character; nil otherwise (it is then not passed on).
    static func validTraceState(_ value: String) -> String? {
        let utf8 = value.utf8
        guard utf8.count <= maxTraceStateLength, utf8.contains(where: { $0 != 0x20 && $0 != 0x09 && $0 != UInt8(ascii: ",") }) else {
            return nil
        }
        for b in utf8 where b < 0x20 || b > 0x7E { return nil }
        return value
    }
}

/// Where a `TraceContext` lives in the task-local `ServiceContext` (swift-distributed-tracing's
/// `InstrumentationContext`).
public enum TraceContextKey: ServiceContextKey {
    public typealias Value = TraceContext
    public static var nameOverride: String? { "w3c-trace-context" }
}

extension ServiceContext {
    /// The trace context of the current span (ours), or of the remote parent a call came with.
    public var traceContext: TraceContext? {
        get { self[TraceContextKey.self] }
        set { self[TraceContextKey.self] = newValue }
    }
}

extension TraceContext {
    /// The trace context of the task's current span, if any: what the outbox stores with an event
    /// and what a peer call carries on. A `ServiceContext` bound by code using the Tracing API
    /// (inside a handler: nested in it) wins over the handler's own binding (`withCurrent`).
    public static var current: TraceContext? { ServiceContext.current?.traceContext ?? TraceTaskLocal.context }

    /// Runs `operation` with `context` as the task's current trace context: what the RPC wrappers
    /// bind around a handler. A task-local of its own rather than a `ServiceContext` (a dictionary
    /// of boxed values, looked up through generic code): one small allocation per call.
    public static func withCurrent<T>(
        _ context: TraceContext, isolation: isolated (any Actor)? = #isolation, operation: () async throws -> T
    ) async rethrows -> T {
        try await TraceTaskLocal.$context.withValue(context, operation: operation, isolation: isolation)
    }

    /// `withCurrent` for synchronous code (the forwarding handlers, which run on an event loop).
    public static func withCurrent<T>(_ context: TraceContext, operation: () throws -> T) rethrows -> T {
        try TraceTaskLocal.$context.withValue(context, operation: operation)
    }
}

/// The handler's trace context (`TraceContext.withCurrent`).
public enum TraceTaskLocal {
    @TaskLocal public static var context: TraceContext?
}

/// Lowercase hex for ids: no Foundation, no format strings, eight digits at a time (SWAR: the
/// bytes of a 64-bit word worked on side by side; no table, no branch per digit).
enum Hex {
    static let digits = Array("0123456789abcdef".utf8)

    static func append(_ value: UInt64, to out: inout [UInt8]) {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 16) { b in
            store(value, at: UnsafeMutableRawPointer(b.baseAddress!))
            out.append(contentsOf: b)
        }
    }

    static func string(_ values: UInt64...) -> String {
        String(unsafeUninitializedCapacity: 16 * values.count) { b in
            for (i, v) in values.enumerated() { store(v, at: UnsafeMutableRawPointer(b.baseAddress! + 16 * i)) }
            return 16 * values.count
        }
    }

    /// The 16 lowercase hex digits of `value` written at `p` (unaligned is fine).
    @inline(__always)
    static func store(_ value: UInt64, at p: UnsafeMutableRawPointer) {
        p.storeBytes(of: digits8(UInt32(truncatingIfNeeded: value >> 32)).littleEndian, toByteOffset: 0, as: UInt64.self)
        p.storeBytes(of: digits8(UInt32(truncatingIfNeeded: value)).littleEndian, toByteOffset: 8, as: UInt64.self)
    }

    /// The eight hex digits of `v` as the bytes of a word, the first digit in the lowest byte.
    @inline(__always)
    static func digits8(_ v: UInt32) -> UInt64 {
        let x = UInt64(v)
        // Spread the nibbles, most significant first, one per byte: 16-bit halves to 32-bit
        // lanes, bytes to 16-bit lanes, nibbles to bytes.
        var n = (x >> 16) | ((x & 0xFFFF) << 32)
        n = ((n >> 8) & 0x0000_00FF_0000_00FF) | ((n & 0x0000_00FF_0000_00FF) << 16)
        n = ((n >> 4) & 0x000F_000F_000F_000F) | ((n & 0x000F_000F_000F_000F) << 8)
        // 0...9 → '0'...'9', 10...15 → 'a'...'f' ('a' is '0' + 10 + 39).
        let letters = ((n &+ 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101
        return n &+ 0x3030_3030_3030_3030 &+ letters &* 39
    }

    /// A lowercase hex digit's value (uppercase is not valid in a traceparent).
    @inline(__always)
    static func digit(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): b - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): b - UInt8(ascii: "a") + 10
        default: nil
        }
    }

    /// 16 lowercase hex digits at `offset` as a number, or nil if any byte is not one
    /// (`0`-`9`, `a`-`f`). Two 8-byte loads; every byte checked at once.
    @inline(__always)
    static func parse(_ b: UnsafeBufferPointer<UInt8>, _ offset: Int) -> UInt64? {
        precondition(offset >= 0 && offset + 16 <= b.count)
        let p = UnsafeRawPointer(b.baseAddress! + offset)
        guard let high = value8(UInt64(littleEndian: p.loadUnaligned(as: UInt64.self))),
            let low = value8(UInt64(littleEndian: p.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
        else { return nil }
        return UInt64(high) << 32 | UInt64(low)
    }

    /// Eight hex digits (the first in the lowest byte of `w`) as a number, or nil.
    @inline(__always)
    static func value8(_ w: UInt64) -> UInt32? {
        let high: UInt64 = 0x8080_8080_8080_8080
        // Bytes of 0x80 and above are never digits; below it, adding (0x80 - k) sets a byte's
        // top bit exactly when the byte is >= k, with no carry into the next byte.
        guard w & high == 0 else { return nil }
        @inline(__always) func atLeast(_ k: UInt64) -> UInt64 { (w &+ (0x80 - k) &* 0x0101_0101_0101_0101) & high }
        let digit = atLeast(0x30) & ~atLeast(0x3A)  // '0'...'9'
        let letter = atLeast(0x61) & ~atLeast(0x67)  // 'a'...'f'
        guard digit | letter == high else { return nil }
        // '0'...'9' → low nibble; 'a'...'f' → low nibble (1...6) + 9.
        var n = (w & 0x0F0F_0F0F_0F0F_0F0F) &+ (letter >> 7) &* 9
        // Gather the nibbles, the first digit most significant.
        n = ((n & 0x000F_000F_000F_000F) << 4) | ((n >> 8) & 0x000F_000F_000F_000F)
        n = ((n & 0x0000_00FF_0000_00FF) << 8) | ((n >> 16) & 0x0000_00FF_0000_00FF)
        return UInt32(truncatingIfNeeded: ((n & 0xFFFF) << 16) | ((n >> 32) & 0xFFFF))
    }
}
