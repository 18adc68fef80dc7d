import RPCCore
import Synchronization

/// Sliding-window counters: "at most `limit` events per key within `window`". Used for failed
/// logins (per account, per client address) and password-reset requests (per address, per email).
///
/// Kept in memory, not in SQLite (see README): one process owns the database (its file lock), the
/// windows are minutes long, and writing every failed login to disk would turn a password-guessing
/// attack into a write (and fsync) load. A restart forgets the counters, which gives an attacker at
/// most one extra window per restart. Memory is bounded: at most `maxKeys` keys, the stalest
/// evicted first.
final class SlidingWindowThrottle: Sendable {
    private struct State {
        var events: [String: [Int64]] = [:]
        var sweepAt: Int64 = 0
    }

    let limit: Int
    let windowMilliseconds: Int64
    private let maxKeys: Int
    private let state = Mutex(State())

    init(limit: Int, window: Duration, maxKeys: Int = 100_000) {
        self.limit = max(1, limit)
        self.windowMilliseconds = max(1, window.milliseconds)
        self.maxKeys = maxKeys
    }

    /// When `key` is over its limit: the milliseconds until the oldest counted event leaves the
    /// window (when one more attempt becomes possible). Nil when an attempt is allowed.
    func retryAfter(_ key: String, now: Int64 = Clock.nowMilliseconds()) -> Int64? {
        state.withLock { s in
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

    /// Counts one event for `key`.
    func record(_ key: String, now: Int64 = Clock.nowMilliseconds()) {
        state.withLock { s in
            var list = s.events[key] ?? []
            list.removeAll { $0 <= now - windowMilliseconds }
            list.append(now)
            if list.count > limit { list.removeFirst(list.count - limit) }
            s.events[key] = list
            if s.events.count > maxKeys || now >= s.sweepAt { sweep(&s, now: now) }
        }
    }

    /// Counts an event and tells whether it was allowed (for requests that count themselves, like
    /// reset requests): nil = allowed and counted; otherwise the wait, and nothing is counted.
    func attempt(_ key: String, now: Int64 = Clock.nowMilliseconds()) -> Int64? {
        if let wait = retryAfter(key, now: now) { return wait }
        record(key, now: now)
        return nil
    }

    /// Forgets `key` (a successful login clears the account's failures).
    func reset(_ key: String) {
        _ = state.withLock { $0.events.removeValue(forKey: key) }
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
