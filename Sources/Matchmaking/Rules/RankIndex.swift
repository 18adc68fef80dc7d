import Synchronization

/// The leaderboard's order, kept in memory as an order-statistic structure so that "my rank" is
/// O(log n)-ish instead of counting rows (the ratings table is the truth; this index is rebuilt
/// from it at start and updated after each commit that changes a rating).
///
/// Order: rating descending, deviation ascending, then who reached that rating first
/// (`reachedAt`), then user id: total, so ranks are stable and pages never skip or repeat.
/// Only ranked (non-provisional) players are in it.
///
/// Structure: sorted chunks of at most `chunkLimit` keys. Finding a key is a binary search over
/// the chunks' last keys and one inside the chunk; a rank adds the sizes of the chunks before it
/// (n / chunkLimit additions: ~200 at 100,000 players). Inserting or removing moves at most one
/// chunk's keys.
public final class RankIndex: Sendable {
    public struct Key: Sendable, Comparable, Hashable {
        public var rating: Double
        public var deviation: Double
        public var reachedAt: Int64
        public var userID: String
        public init(rating: Double, deviation: Double, reachedAt: Int64, userID: String) {
            self.rating = rating
            self.deviation = deviation
            self.reachedAt = reachedAt
            self.userID = userID
        }
        /// `a < b` when a ranks before b.
        public static func < (a: Key, b: Key) -> Bool {
            if a.rating != b.rating { return a.rating > b.rating }
            if a.deviation != b.deviation { return a.deviation < b.deviation }
            if a.reachedAt != b.reachedAt { return a.reachedAt < b.reachedAt }
            return a.userID < b.userID
        }
    }

    struct State {
        var chunks: [[Key]] = []
        /// Current key and version of each ranked user (versions only grow: a late update of an
        /// older version is ignored).
        var byUser: [String: (key: Key?, version: Int64)] = [:]
        var count = 0
    }
    let chunkLimit: Int
    private let state = Mutex(State())

    public init(chunkLimit: Int = 512) { self.chunkLimit = max(8, chunkLimit) }

    public var count: Int { state.withLock { $0.count } }

    /// Replaces everything (start-up load); `keys` in any order.
    public func load(_ entries: [(key: Key, version: Int64)]) {
        let sorted = entries.map(\.key).sorted()
        state.withLock { s in
            s.chunks = stride(from: 0, to: sorted.count, by: chunkLimit / 2).map { Array(sorted[$0..<min(sorted.count, $0 + chunkLimit / 2)]) }
            s.byUser = Dictionary(entries.map { ($0.key.userID, (Optional($0.key), $0.version)) }, uniquingKeysWith: { a, b in a.1 >= b.1 ? a : b })
            s.count = sorted.count
        }
    }

    /// Sets `userID`'s key as of `version` (nil: not ranked). Older versions are ignored.
    public func update(userID: String, key: Key?, version: Int64) {
        state.withLock { s in
            if let current = s.byUser[userID], current.version >= version { return }
            if let old = s.byUser[userID]?.key { Self.remove(old, from: &s) }
            if let key { Self.insert(key, into: &s, limit: chunkLimit) }
            s.byUser[userID] = (key, version)
        }
    }

    /// Removes `userID` whatever its version (account erased).
    public func remove(userID: String) {
        state.withLock { s in
            if let old = s.byUser[userID]?.key { Self.remove(old, from: &s) }
            s.byUser[userID] = (nil, Int64.max)
        }
    }

    /// The 1-based rank of `userID`, nil when unranked.
    public func rank(of userID: String) -> Int? {
        state.withLock { s in
            guard let key = s.byUser[userID]?.key else { return nil }
            return Self.position(of: key, in: s) + 1
        }
    }

    /// Number of ranked keys before `key` (its 0-based position if present).
    public func position(of key: Key) -> Int { state.withLock { Self.position(of: key, in: $0) } }

    /// `limit` rows from 0-based position `from`, with their 1-based ranks.
    public func page(from: Int, limit: Int) -> [(rank: Int, key: Key)] {
        state.withLock { s in
            var out: [(Int, Key)] = []
            var skip = max(0, from)
            var rank = skip + 1
            for chunk in s.chunks {
                if skip >= chunk.count {
                    skip -= chunk.count
                    continue
                }
                for k in chunk[skip...] {
                    if out.count >= limit { return out }
                    out.append((rank, k))
                    rank += 1
                }
                skip = 0
                if out.count >= limit { return out }
            }
            return out
        }
    }

    // MARK: Chunk operations (under the lock)

    /// Index of the first chunk whose last key is ≥ `key` (or the last chunk).
    private static func chunkIndex(for key: Key, in s: State) -> Int {
        var lo = 0, hi = s.chunks.count - 1
        while lo < hi {
            let mid = (lo + hi) / 2
            if s.chunks[mid].last! < key { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    private static func lowerBound(_ key: Key, in chunk: [Key]) -> Int {
        var lo = 0, hi = chunk.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if chunk[mid] < key { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    private static func position(of key: Key, in s: State) -> Int {
        guard !s.chunks.isEmpty else { return 0 }
        let c = chunkIndex(for: key, in: s)
        var before = 0
        for i in 0..<c { before += s.chunks[i].count }
        return before + lowerBound(key, in: s.chunks[c])
    }

    private static func insert(_ key: Key, into s: inout State, limit: Int) {
        if s.chunks.isEmpty {
            s.chunks = [[key]]
            s.count = 1
            return
        }
        let c = chunkIndex(for: key, in: s)
        let i = lowerBound(key, in: s.chunks[c])
        s.chunks[c].insert(key, at: i)
        s.count += 1
        if s.chunks[c].count > limit {
            let half = s.chunks[c].count / 2
            let tail = Array(s.chunks[c][half...])
            s.chunks[c].removeSubrange(half...)
            s.chunks.insert(tail, at: c + 1)
        }
    }

    private static func remove(_ key: Key, from s: inout State) {
        guard !s.chunks.isEmpty else { return }
        let c = chunkIndex(for: key, in: s)
        let i = lowerBound(key, in: s.chunks[c])
        guard i < s.chunks[c].count, s.chunks[c][i] == key else { return }
        s.chunks[c].remove(at: i)
        s.count -= 1
        if s.chunks[c].isEmpty { s.chunks.remove(at: c) }
    }
}
