import Observability
import Prometheus
import RPCCore
import Synchronization

/// Sliding-window counters: "at most `limit` attempts per key within `window`" (failed log-ins per
/// account and address, reset requests, sign-ups per address, invite-code guesses).
///
/// **Attempts are reserved before the slow check, atomically.** A password check takes ~50 ms of
/// scrypt: counting a failure only after it lets 40 concurrent guesses all pass a check made
/// before any of them failed. `reserve` counts the attempt under the lock and hands back a
/// `Reservation`; the caller then `release`s it when the attempt turned out not to count (a
/// correct password) or `keep`s it (a failure). A reservation is an attempt in flight, so at most
/// `limit` are evaluated at once per key, whatever the concurrency.
///
/// Kept in memory (see the services' READMEs for why), bounded to `maxKeys` keys, the stalest
/// evicted first.
///
/// Every refused attempt counts in `throttle_rejections_total{limit="<name>"}`: the name is a
/// fixed one from the code (`login_failures_per_account`), never the key.
public final class SlidingWindowThrottle: Sendable {
    private struct State {
        var events: [String: [Int64]] = [:]
        var sweepAt: Int64 = 0
    }

    /// Which limit this is, for the metrics (a fixed name: a bounded label).
    public let name: String
    public let limit: Int
    public let windowMilliseconds: Int64
    private let maxKeys: Int
    private let clock: any WallClock
    private let state = Mutex(State())
    private let rejections: Prometheus.Counter

    public init(name: String, limit: Int, window: Duration, maxKeys: Int = 100_000, clock: any WallClock = SystemClock()) {
        self.name = name
        rejections = Self.rejectionsCounter(name)
        self.limit = max(1, limit)
        self.windowMilliseconds = max(1, window.milliseconds)
        self.maxKeys = maxKeys
        self.clock = clock
    }

    /// An attempt counted in advance: `release` takes it back, `keep` (or doing nothing) leaves
    /// it counted.
    public struct Reservation: Sendable {
        let throttle: SlidingWindowThrottle
        let key: String
        let at: Int64

        /// The attempt does not count (it succeeded, or never happened).
        public func release() { throttle.remove(key, at: at) }
        /// The attempt counts (it failed): nothing to do, spelled out at call sites.
        public func keep() {}
    }

    /// Counts an attempt for `key` now and returns it, or the milliseconds until one is possible
    /// (nothing is counted then).
    public func reserve(_ key: String) -> Result<Reservation, Wait> {
        let now = clock.nowMilliseconds()
        let result = state.withLock { s -> Result<Reservation, Wait> in
            var list = s.events[key] ?? []
            list.removeAll { $0 <= now - windowMilliseconds }
            if list.count >= limit {
                s.events[key] = list
                return .failure(Wait(milliseconds: max(1, list[list.count - limit] + windowMilliseconds - now)))
            }
            list.append(now)
            s.events[key] = list
            if s.events.count > maxKeys || now >= s.sweepAt { sweep(&s, now: now) }
            return .success(Reservation(throttle: self, key: key, at: now))
        }
        if case .failure = result { rejections.increment() }
        return result
    }

    /// `throttle_rejections_total` for the limit `name` (the registry keeps one per name).
    static func rejectionsCounter(_ name: String) -> Prometheus.Counter {
        ProcessMetrics.registry.makeCounter(
            descriptor: MetricNameDescriptor(
                metricName: "throttle_rejections", unitName: "total", helpText: "Attempts refused by a service's sliding-window throttle, by limit."),
            labels: [("limit", name)])
    }

    /// How long until `key` may make an attempt.
    public struct Wait: Error, Sendable, Equatable {
        public var milliseconds: Int64
        public init(milliseconds: Int64) { self.milliseconds = milliseconds }
    }

    /// Reserves an attempt in every throttle (key, throttle) or in none: the longest wait when any
    /// is over its limit.
    public static func reserveAll(_ pairs: [(SlidingWindowThrottle, String)]) -> Result<[Reservation], Wait> {
        var taken: [Reservation] = []
        var wait: Int64 = 0
        for (throttle, key) in pairs {
            switch throttle.reserve(key) {
            case .success(let r): taken.append(r)
            case .failure(let w): wait = max(wait, w.milliseconds)
            }
        }
        if wait > 0 {
            for r in taken { r.release() }
            return .failure(Wait(milliseconds: wait))
        }
        return .success(taken)
    }

    /// When `key` is over its limit: the milliseconds until the oldest counted attempt leaves the
    /// window. Nil when an attempt is allowed. (A check only: `reserve` is the atomic form.)
    public func retryAfter(_ key: String) -> Int64? {
        let now = clock.nowMilliseconds()
        return state.withLock { s in
            guard var list = s.events[key] else { return nil }
            list.removeAll { $0 <= now - windowMilliseconds }
            if list.isEmpty {
                s.events[key] = nil
                return nil
            }
            s.events[key] = list
            guard list.count >= limit else { return nil }
            return max(1, list[list.count - limit] + windowMilliseconds - now)
        }
    }

    /// Counts an attempt if one is allowed: nil = counted; otherwise the wait (nothing counted).
    public func attempt(_ key: String) -> Int64? {
        switch reserve(key) {
        case .success: nil
        case .failure(let w): w.milliseconds
        }
    }

    /// Counts an attempt made at `at` (Unix ms) earlier: a limit kept in storage, loaded at start.
    public func record(_ key: String, at: Int64) {
        state.withLock { s in
            var list = s.events[key] ?? []
            list.insert(at, at: list.firstIndex { $0 > at } ?? list.count)
            s.events[key] = list
        }
    }

    /// Forgets `key` (a successful log-in clears the account's failures).
    public func reset(_ key: String) {
        _ = state.withLock { $0.events.removeValue(forKey: key) }
    }

    /// Attempts counted for `key` within the window (tests, logs).
    public func count(_ key: String) -> Int {
        let now = clock.nowMilliseconds()
        return state.withLock { s in (s.events[key] ?? []).filter { $0 > now - windowMilliseconds }.count }
    }

    private func remove(_ key: String, at: Int64) {
        state.withLock { s in
            guard var list = s.events[key], let i = list.lastIndex(of: at) else { return }
            list.remove(at: i)
            s.events[key] = list.isEmpty ? nil : list
        }
    }

    private func sweep(_ s: inout State, now: Int64) {
        s.sweepAt = now + windowMilliseconds
        s.events = s.events.filter { $0.value.last.map { $0 > now - windowMilliseconds } ?? false }
        if s.events.count > maxKeys {
            let keep = s.events.sorted { ($0.value.last ?? 0) > ($1.value.last ?? 0) }.prefix(maxKeys * 9 / 10)  // headroom: not one sort per new key
            s.events = Dictionary(uniqueKeysWithValues: keep.map { ($0.key, $0.value) })
        }
    }
}

extension RPCError {
    /// RESOURCE_EXHAUSTED with RetryInfo for a throttle's wait: "`what`: try again in N s".
    public static func throttled(_ what: String, wait: SlidingWindowThrottle.Wait) -> RPCError {
        let seconds = max(1, (wait.milliseconds + 999) / 1000)
        return RPCError.retryLater("\(what): try again in \(seconds) s", after: .seconds(seconds))
    }
}

/// Keys with a request in flight, so two concurrent requests for one key do not both do the work
/// (SendMail by event id: one mail, not two). `claim` is atomic; `release` when done.
public final class InFlightKeys: Sendable {
    private let keys = Mutex<Set<String>>([])
    public init() {}
    public func claim(_ key: String) -> Bool { keys.withLock { $0.insert(key).inserted } }
    public func release(_ key: String) { _ = keys.withLock { $0.remove(key) } }
}
