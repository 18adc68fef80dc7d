import RPCCore
import Synchronization

/// Token buckets by key (a user id, a client address): each key may make `burst` calls at once
/// and `rate` per second on average. Buckets that have refilled are forgotten when the table
/// grows, so idle keys cost nothing.
public final class RateLimiter: Sendable {
    public let rate: Double
    public let burst: Double
    private let maxKeys: Int

    private struct Bucket {
        var tokens: Double
        var updated: ContinuousClock.Instant
    }
    private struct State {
        var buckets: [String: Bucket] = [:]
        var insertsSincePrune = 0
    }
    private let state = Mutex(State())

    /// `rate` calls per second, bursts of `burst`.
    public init(rate: Double, burst: Double, maxKeys: Int = 100_000) {
        self.rate = max(rate, 0.000_001)
        self.burst = max(burst, 1)
        self.maxKeys = maxKeys
    }

    /// Takes one token for `key`; nil when allowed, else how long until a token is available.
    public func acquire(_ key: String, now: ContinuousClock.Instant = .now) -> Duration? {
        state.withLock { s in
            if var b = s.buckets[key] {
                let elapsed = now - b.updated
                let seconds = elapsed.inSeconds
                b.tokens = min(burst, b.tokens + max(0, seconds) * rate)
                b.updated = now
                if b.tokens >= 1 {
                    b.tokens -= 1
                    s.buckets[key] = b
                    return nil
                }
                s.buckets[key] = b
                return .nanoseconds(Int64(((1 - b.tokens) / rate * 1e9).rounded(.up)))
            }
            s.buckets[key] = Bucket(tokens: burst - 1, updated: now)
            s.insertsSincePrune += 1
            if s.buckets.count > maxKeys && s.insertsSincePrune > maxKeys / 10 {
                s.insertsSincePrune = 0
                let full = burst
                let rate = rate
                s.buckets = s.buckets.filter { _, b in
                    let e = now - b.updated
                    return b.tokens + e.inSeconds * rate < full
                }
            }
            return nil
        }
    }
}
