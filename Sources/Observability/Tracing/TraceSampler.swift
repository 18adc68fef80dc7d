import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

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

/// Random trace and span ids, cheaply: SplitMix64 sequences over atomic counters seeded from
/// the system's random source once. Not secret (ids are written to logs and headers), only
/// unique and uniformly spread; no lock, no system call per id.
///
/// The counter is striped: a thread draws from one of 64 counters, chosen by a hash of its thread
/// id, each on cache lines of its own, so that the event loops do not pass one cache line between
/// cores on every call (a shared counter cost a contended atomic add per relayed call). With 16
/// stripes two of four loops shared one a third of the time (88% with eight loops), so the saving
/// depended on the process's luck at start; with 64, 9% and 36% (8 KiB for the process). Each stripe
/// starts at its own random point; two stripes could only repeat an id if their sequences met
/// within the number of ids drawn, about one chance in 10⁷ per pair after 10¹² ids.
public final class TraceIDGenerator: @unchecked Sendable {
    static let stripes = 64
    /// 16 × 8 bytes: a stripe and the next are 128 bytes apart (adjacent-line prefetch too).
    static let spacing = 16
    private let states: UnsafeMutablePointer<Atomic<UInt64>>

    public init(seed: UInt64 = UInt64.random(in: .min ... .max)) {
        let count = Self.stripes * Self.spacing
        states = .allocate(capacity: count)
        for i in 0..<count {
            let start = i % Self.spacing == 0 ? Self.mix(seed &+ UInt64(i / Self.spacing) &* 0xD1B5_4A32_D192_ED03) : 0
            (states + i).initialize(to: Atomic(start))
        }
    }

    deinit {
        states.deinitialize(count: Self.stripes * Self.spacing)
        states.deallocate()
    }

    static let gamma: UInt64 = 0x9E37_79B9_7F4A_7C15

    /// This thread's counter.
    @inline(__always)
    private var stripe: UnsafeMutablePointer<Atomic<UInt64>> {
        #if canImport(Darwin)
        let thread = UInt64(UInt(bitPattern: pthread_self()))
        #else
        let thread = UInt64(pthread_self())  // an integer on Linux
        #endif
        return states + Int(truncatingIfNeeded: Self.mix(thread) & UInt64(Self.stripes - 1)) * Self.spacing
    }

    /// A non-zero 64-bit id.
    @inline(__always)
    public func next() -> UInt64 {
        Self.mix(stripe.pointee.wrappingAdd(Self.gamma, ordering: .relaxed).newValue)
    }

    /// Three ids (a new trace's two halves and its first span) for one atomic add.
    @inline(__always)
    public func nextThree() -> (UInt64, UInt64, UInt64) {
        let last = stripe.pointee.wrappingAdd(Self.gamma &* 3, ordering: .relaxed).newValue
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
