import Synchronization

/// Decides whether a new trace is recorded, from the configured ratio (`TRACE_SAMPLE_RATIO`).
/// A span with a parent follows its parent's `sampled` flag (parent-based sampling), so a trace
/// is recorded whole or not at all, whichever process started it.
///
/// The decision for a new trace is a function of its trace id (the low 64 bits against
/// `ratio × 2⁶⁴`, as OpenTelemetry's `TraceIdRatioBased` does), so it costs a comparison.
public struct RatioSampler: Sendable, Hashable {
    public let ratio: Double
    /// Trace ids whose low half is below this are sampled (all of them at ratio 1).
    let threshold: UInt64
    let always: Bool

    public init(ratio: Double) {
        let r = ratio.isNaN ? 0 : min(max(ratio, 0), 1)
        self.ratio = r
        always = r >= 1
        threshold = r >= 1 ? .max : UInt64(r * 18_446_744_073_709_551_616.0)
    }

    /// Whether a new trace with this id is recorded.
    @inline(__always)
    public func samples(traceIDLow: UInt64) -> Bool { always || traceIDLow < threshold }
}

/// Random trace and span ids, cheaply: a SplitMix64 sequence over an atomic counter seeded
/// from the system's random source once. Not secret (ids are written to logs and headers), only
/// unique and uniformly spread; no lock, no system call per id.
public final class TraceIDGenerator: Sendable {
    private let state: Atomic<UInt64>

    public init(seed: UInt64 = UInt64.random(in: .min ... .max)) {
        state = Atomic(seed)
    }

    static let gamma: UInt64 = 0x9E37_79B9_7F4A_7C15

    /// A non-zero 64-bit id.
    @inline(__always)
    public func next() -> UInt64 {
        Self.mix(state.wrappingAdd(Self.gamma, ordering: .relaxed).newValue)
    }

    /// Three ids (a new trace's two halves and its first span) for one atomic add: the counter
    /// is shared by every event loop, and each add on it is a cache line moving between cores.
    @inline(__always)
    public func nextThree() -> (UInt64, UInt64, UInt64) {
        let last = state.wrappingAdd(Self.gamma &* 3, ordering: .relaxed).newValue
        return (Self.mix(last &- Self.gamma &* 2), Self.mix(last &- Self.gamma), Self.mix(last))
    }

    /// SplitMix64's output function; never 0 (a zero id is invalid in a traceparent).
    @inline(__always)
    static func mix(_ value: UInt64) -> UInt64 {
        var z = value
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        z ^= z >> 31
        return z == 0 ? 1 : z
    }
}
