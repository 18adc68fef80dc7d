/// The random-opponent queue's pairing, as pure functions (the contract's JoinQueueRequest
/// comment): closest ratings first; a pair needs each player inside the other's window; the
/// window starts at ±50 and widens by 50 every 10 s up to ±400, and is unlimited after 60 s;
/// blocked pairs are never matched; nobody is paired with themselves.
///
/// One pass is O(n log n): the tickets sorted by rating; each one's window from its wait; the
/// candidate pairs are each ticket's nearest `neighbors` on the higher side whose distance both
/// windows accept (a farther one cannot be closer); the candidates sorted by distance; then
/// taken greedily, closest first, skipping tickets already taken. Ties go to the pair that has
/// waited longest.
public enum QueuePairing {
    /// Half-width of the window after waiting `waitedMilliseconds`; `.infinity` when unlimited.
    public static func halfWidth(waitedMilliseconds: Int64) -> Double {
        if waitedMilliseconds >= 60_000 { return .infinity }
        let steps = Double(max(0, waitedMilliseconds) / 10_000)
        return min(400, 50 + 50 * steps)
    }

    public struct Ticket: Sendable, Equatable {
        public var id: UInt64
        public var userID: String
        public var rating: Double
        /// Unix ms; the waiting time (and so the window) counts from here.
        public var joinedAt: Int64
        public init(id: UInt64, userID: String, rating: Double, joinedAt: Int64) {
            self.id = id
            self.userID = userID
            self.rating = rating
            self.joinedAt = joinedAt
        }
    }

    /// What is known about a pair: `nil` = not known yet (ask social first).
    public typealias BlockLookup = (String, String) -> Bool?

    public struct Plan: Sendable {
        /// Pairs as indices into the tickets given, the earlier joiner first (it takes FIRST).
        public var pairs: [(first: Int, second: Int)] = []
        /// Pairs that would have been formed but whose relationship is unknown: ask, then pass again.
        /// Both tickets are held back from other pairs in this pass (closest first).
        public var unknown: [(String, String)] = []
    }

    /// One pairing pass over `tickets` at `now`.
    public static func plan(_ tickets: [Ticket], now: Int64, neighbors: Int = 8, blocked: BlockLookup) -> Plan {
        let n = tickets.count
        guard n >= 2 else { return Plan() }
        let order = tickets.indices.sorted { a, b in
            let x = tickets[a], y = tickets[b]
            if x.rating != y.rating { return x.rating < y.rating }
            if x.joinedAt != y.joinedAt { return x.joinedAt < y.joinedAt }
            return x.id < y.id
        }
        var window = [Double](repeating: 0, count: n)
        for i in 0..<n { window[i] = halfWidth(waitedMilliseconds: now - tickets[i].joinedAt) }

        struct Edge {
            var a: Int32
            var b: Int32
            var distance: Double
            var since: Int64
        }
        var edges: [Edge] = []
        edges.reserveCapacity(n * 2)
        for p in 0..<n {
            let i = order[p]
            var q = p + 1
            while q < n && q <= p + neighbors {
                let j = order[q]
                let d = tickets[j].rating - tickets[i].rating
                if d > window[i] { break }  // farther ones are farther still
                if d <= window[j] && tickets[i].userID != tickets[j].userID {
                    edges.append(Edge(a: Int32(i), b: Int32(j), distance: d, since: min(tickets[i].joinedAt, tickets[j].joinedAt)))
                }
                q += 1
            }
        }
        edges.sort { x, y in
            if x.distance != y.distance { return x.distance < y.distance }
            if x.since != y.since { return x.since < y.since }
            return (x.a, x.b) < (y.a, y.b)
        }
        var taken = [Bool](repeating: false, count: n)
        var plan = Plan()
        for e in edges {
            let a = Int(e.a), b = Int(e.b)
            if taken[a] || taken[b] { continue }
            switch blocked(tickets[a].userID, tickets[b].userID) {
            case true?: continue
            case nil:
                plan.unknown.append((tickets[a].userID, tickets[b].userID))
                taken[a] = true
                taken[b] = true
            case false?:
                taken[a] = true
                taken[b] = true
                let aFirst = (tickets[a].joinedAt, tickets[a].id) <= (tickets[b].joinedAt, tickets[b].id)
                plan.pairs.append(aFirst ? (a, b) : (b, a))
            }
        }
        return plan
    }
}
