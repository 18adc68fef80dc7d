import Contracts
import Foundation
import Security
import Synchronization

/// ULIDs (https://github.com/ulid/spec): 48 bits of Unix milliseconds then 80 random bits, as 26
/// Crockford base32 characters. They sort by creation time as plain strings, which is what the
/// store relies on for "newest first" (mail) and for stable tie-breaks.
///
/// Monotonic within one process: two ids made in the same millisecond increment the random part,
/// so ids from one process never sort out of creation order.
enum ULID {
    private static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ".utf8)
    private static let last = Mutex<(ms: Int64, random: [UInt8])>((0, []))

    /// A new id at the current time.
    static func make(now: Int64 = Clock.nowMilliseconds()) -> String {
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

/// Time as the store keeps it: Unix milliseconds.
enum Clock {
    static func nowMilliseconds() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }
}

extension Google_Protobuf_Timestamp {
    init(milliseconds ms: Int64) {
        self.init()
        seconds = ms >= 0 ? ms / 1000 : (ms - 999) / 1000
        nanos = Int32((ms - seconds * 1000) * 1_000_000)
    }

    init(unixSeconds s: Int64) {
        self.init()
        seconds = s
    }
}
