import Contracts
import Foundation
import RPCCore
import Security
import Synchronization

/// ULIDs (https://github.com/ulid/spec): 48 bits of Unix milliseconds then 80 random bits, as 26
/// Crockford base32 characters. They sort by creation time as plain strings, which stores rely on
/// for "newest first" and for stable tie-breaks.
///
/// Monotonic within one process: two ids made in the same millisecond increment the random part,
/// so ids from one process never sort out of creation order.
public enum ULID {
    private static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
    private static let last = Mutex<(ms: Int64, random: [UInt8])>((0, []))

    /// A new id at `now` (Unix milliseconds; the system clock by default).
    public static func make(now: Int64 = SystemClock.nowMilliseconds()) -> String {
        let (ms, random) = last.withLock { state -> (Int64, [UInt8]) in
            if now <= state.ms, state.random.count == 10 {
                var r = state.random
                var i = 9
                while i >= 0 {
                    r[i] &+= 1
                    if r[i] != 0 { break }
                    i -= 1
                }
                if i < 0 {  // 2^80 ids in one millisecond: move to the next one
                    state.ms += 1
                    r = SecureRandom.bytes(10)
                }
                state.random = r
                return (state.ms, r)
            }
            state = (now, SecureRandom.bytes(10))
            return state
        }
        return encode(ms: ms, random: random)
    }

    /// True for 26 characters of the Crockford alphabet (what `make` produces).
    public static func isValid(_ s: String) -> Bool {
        s.utf8.count == 26 && s.utf8.allSatisfy { alphabet.contains($0) }
    }

    static func encode(ms: Int64, random: [UInt8]) -> String {
        // 128 bits: 48 time + 80 random, written as 26 five-bit groups (the first holds 3 bits).
        var bytes = [UInt8](repeating: 0, count: 16)
        for i in 0..<6 { bytes[i] = UInt8(truncatingIfNeeded: ms >> (8 * (5 - i))) }
        for i in 0..<10 { bytes[6 + i] = random[i] }
        var out = [UInt8](repeating: 0, count: 26)
        var bitIndex = 128 - 130  // 130 bits of output, the 2 leading ones are zero
        for i in 0..<26 {
            var v = 0
            for _ in 0..<5 {
                v <<= 1
                if bitIndex >= 0 {
                    let byte = bytes[bitIndex / 8]
                    v |= Int((byte >> (7 - UInt8(bitIndex % 8))) & 1)
                }
                bitIndex += 1
            }
            out[i] = alphabet[v]
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// Wall-clock time as stores keep it: Unix milliseconds. Services hold one (`SystemClock` in
/// production) so tests can move time (invite expiry, snoozes, streaks) with `ManualClock`
/// instead of sleeping.
public protocol WallClock: Sendable {
    func nowMilliseconds() -> Int64
}

extension WallClock {
    /// The current time as a protobuf timestamp.
    public func nowTimestamp() -> Google_Protobuf_Timestamp { Google_Protobuf_Timestamp(milliseconds: nowMilliseconds()) }
}

/// The system clock.
public struct SystemClock: WallClock {
    public init() {}
    public func nowMilliseconds() -> Int64 { Self.nowMilliseconds() }
    public static func nowMilliseconds() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }
}

/// A clock tests set and advance.
public final class ManualClock: WallClock {
    private let now: Mutex<Int64>
    public init(milliseconds: Int64 = SystemClock.nowMilliseconds()) { now = Mutex(milliseconds) }
    public func nowMilliseconds() -> Int64 { now.withLock { $0 } }
    public func advance(by d: Duration) { now.withLock { $0 += d.milliseconds } }
    public func set(milliseconds: Int64) { now.withLock { $0 = milliseconds } }
}

extension Google_Protobuf_Timestamp {
    /// The timestamp of Unix milliseconds (negative ones floor to the second before). Defined for
    /// every `Int64`.
    public init(milliseconds ms: Int64) {
        self.init()
        let (q, r) = ms.quotientAndRemainder(dividingBy: 1000)
        seconds = r < 0 ? q - 1 : q
        nanos = Int32(r < 0 ? r + 1000 : r) * 1_000_000
    }

    public init(unixSeconds s: Int64) {
        self.init()
        seconds = s
    }

    /// Unix milliseconds (nanoseconds below a millisecond are dropped), saturating at
    /// `Int64.min`/`.max`: a client's timestamp must never trap the process. Handlers check a
    /// client's timestamp with `FieldRules.timestamp` first; this is the second line of defence.
    public var milliseconds: Int64 {
        var s = seconds
        var n = Int64(nanos) / 1_000_000
        if s < 0 && n > 0 {  // the same value, so that every Int64 near .min comes back whole
            s += 1
            n -= 1000
        }
        let (ms, overflow) = s.multipliedReportingOverflow(by: 1000)
        if overflow { return s < 0 ? .min : .max }
        let (sum, overflow2) = ms.addingReportingOverflow(n)
        return overflow2 ? (n < 0 ? .min : .max) : sum
    }
}
