/// Settling up a household (pure functions, one currency): the debts between its members as a
/// graph, the suggested plan of transfers, and how a repayment moves the balances.
///
/// **Why the plan is stable.** It matches net positions (each member's sum of balances):
/// debtors and creditors each in user-id order, two pointers, every step clearing at least one of
/// the two (the "north-west corner" of the transport table). That gives at most k − 1 transfers
/// for k members with a non-zero position, depends on nothing but the positions and the ids, and
/// recording one of its transfers (which moves the payer's and the payee's positions by its
/// amount and nobody else's) leaves exactly the other transfers: every other debtor–creditor
/// overlap on the two cumulative lines keeps its length.
///
/// **Why a repayment never moves a balance past zero.** It is a flow from payer to payee along
/// existing debts (max flow, shortest paths first, so the payer's own debt to the payee is used
/// first): each debt on the way is reduced by the flow through it and never reversed. Only what
/// cannot travel along debts is paid directly, and only while it keeps both parties' positions on
/// their side of zero. Then debts that only go round a circle are netted (each reduced by the
/// circle's smallest, never reversed). So after the plan's transfers every position is zero and no
/// circle is left: every balance is zero.
public enum SettleUp {
    /// "debtor owes creditor cents" (cents > 0).
    public struct Edge: Hashable, Sendable, Comparable {
        public var debtor: String
        public var creditor: String
        public init(_ debtor: String, _ creditor: String) {
            self.debtor = debtor
            self.creditor = creditor
        }
        public static func < (l: Edge, r: Edge) -> Bool { (l.debtor, l.creditor) < (r.debtor, r.creditor) }
    }

    /// One suggested or recorded money movement: payer pays payee cents.
    public struct Transfer: Equatable, Sendable, CustomStringConvertible {
        public var payer: String
        public var payee: String
        public var cents: Int64
        public init(_ payer: String, _ payee: String, _ cents: Int64) {
            self.payer = payer
            self.payee = payee
            self.cents = cents
        }
        public var description: String { "\(payer)→\(payee) \(cents)" }
    }

    /// One pair's change: `debtor` owes `creditor` `cents` more (as a `Debt` of a transaction).
    public struct Delta: Equatable, Sendable {
        public var debtor: String
        public var creditor: String
        public var cents: Int64
        public init(_ debtor: String, _ creditor: String, _ cents: Int64) {
            self.debtor = debtor
            self.creditor = creditor
            self.cents = cents
        }
    }

    /// The debts of a household: at most one edge per pair, amounts > 0.
    public struct Graph: Equatable, Sendable {
        public private(set) var edges: [Edge: Int64] = [:]
        public init() {}

        /// From pair balances (a, b, cents: positive = b owes a).
        public init(pairs: [(a: String, b: String, cents: Int64)]) {
            for p in pairs where p.cents != 0 {
                if p.cents > 0 { edges[Edge(p.b, p.a)] = p.cents } else { edges[Edge(p.a, p.b)] = -p.cents }
            }
        }

        public var isEmpty: Bool { edges.isEmpty }
        public func debt(_ debtor: String, _ creditor: String) -> Int64 { edges[Edge(debtor, creditor)] ?? 0 }

        /// Applies "debtor owes creditor cents more" to the pair (netting against the reverse debt).
        public mutating func apply(_ d: Delta) {
            let reverse = debt(d.creditor, d.debtor)
            if reverse > 0 {
                let left = reverse - d.cents
                edges[Edge(d.creditor, d.debtor)] = left > 0 ? left : nil
                if left < 0 { edges[Edge(d.debtor, d.creditor)] = -left }
            } else {
                edges[Edge(d.debtor, d.creditor), default: 0] += d.cents
            }
        }

        /// Each member's position (sum of balances: positive = is owed overall), or nil on overflow.
        public var positions: [String: Int64]? {
            var p: [String: Int64] = [:]
            for (e, c) in edges {
                guard let cr = MoneyRules.add(p[e.creditor] ?? 0, c), let dr = MoneyRules.add(p[e.debtor] ?? 0, -c) else { return nil }
                p[e.creditor] = cr
                p[e.debtor] = dr
            }
            return p
        }

        var nodes: [String] { Array(Set(edges.keys.flatMap { [$0.debtor, $0.creditor] })).sorted() }

        /// Out-neighbours in id order (deterministic paths).
        func creditors(of u: String) -> [String] { edges.keys.filter { $0.debtor == u }.map(\.creditor).sorted() }
    }

    // MARK: The plan

    /// The north-west-corner matching of `positions` (debtors and creditors in id order).
    public static func match(_ positions: [String: Int64]) -> [Transfer] {
        var debtors = positions.filter { $0.value < 0 }.map { ($0.key, -$0.value) }.sorted { $0.0 < $1.0 }
        var creditors = positions.filter { $0.value > 0 }.map { ($0.key, $0.value) }.sorted { $0.0 < $1.0 }
        var out: [Transfer] = []
        var i = 0, j = 0
        while i < debtors.count && j < creditors.count {
            let x = min(debtors[i].1, creditors[j].1)
            out.append(Transfer(debtors[i].0, creditors[j].0, x))
            debtors[i].1 -= x
            creditors[j].1 -= x
            if debtors[i].1 == 0 { i += 1 }
            if creditors[j].1 == 0 { j += 1 }
        }
        return out
    }

    /// The suggested plan for `graph`, ordered by payer then payee; nil when positions overflow.
    public static func plan(_ graph: Graph) -> [Transfer]? {
        guard let positions = graph.positions else { return nil }
        if !positions.values.allSatisfy({ $0 == 0 }) { return match(positions) }
        // Every position is zero: either settled, or debts that only go round circles. Paying the
        // smallest debt (by ids) back breaks its circle; what is left is one debt the other way.
        guard let first = graph.edges.keys.min() else { return [] }
        let t = Transfer(first.debtor, first.creditor, graph.edges[first]!)
        guard case .success(let deltas) = repay(graph, t) else { return nil }
        var after = graph
        for d in deltas { after.apply(d) }
        guard let rest = after.positions else { return nil }
        return ([t] + match(rest)).sorted { ($0.payer, $0.payee) < ($1.payer, $1.payee) }
    }

    // MARK: Repayments

    public enum RepayFailure: Error, Equatable, Sendable {
        /// More than can be repaid: at most `maximum` cents (0 = nothing is owed).
        case tooMuch(maximum: Int64)
        case overflow
    }

    /// The most `payer` can repay `payee` now.
    public static func maximumRepayment(_ graph: Graph, payer: String, payee: String) -> Int64 {
        guard let positions = graph.positions else { return 0 }
        let flow = maxFlow(graph, from: payer, to: payee, limit: .max).value
        let direct = max(0, min(-(positions[payer] ?? 0), positions[payee] ?? 0))
        return max(flow, direct)
    }

    /// The pair changes that record `t` (payer paid payee t.cents): the flow along debts, what is
    /// left paid directly (allowed only within both positions), then circles netted. Aggregated to
    /// one delta per pair, in the order pairs were first touched.
    public static func repay(_ graph: Graph, _ t: Transfer) -> Result<[Delta], RepayFailure> {
        precondition(t.cents > 0 && t.payer != t.payee)
        guard let positions = graph.positions else { return .failure(.overflow) }
        let (flowed, flows) = maxFlow(graph, from: t.payer, to: t.payee, limit: t.cents)
        let left = t.cents - flowed
        var deltas: [Delta] = flows.map { Delta($0.key.creditor, $0.key.debtor, $0.value) }
        var g = graph
        for d in deltas { g.apply(d) }
        if left > 0 {
            let bound = min(-(positions[t.payer] ?? 0), positions[t.payee] ?? 0)
            guard t.cents <= bound else {
                return .failure(.tooMuch(maximum: maximumRepayment(graph, payer: t.payer, payee: t.payee)))
            }
            let direct = Delta(t.payee, t.payer, left)
            deltas.append(direct)
            g.apply(direct)
        }
        deltas += cancelCircles(&g)
        return .success(aggregate(deltas))
    }

    /// Nets every circle of debts in `g` (each edge of a circle reduced by its smallest, until
    /// none is left); returns the changes.
    public static func cancelCircles(_ g: inout Graph) -> [Delta] {
        var out: [Delta] = []
        while let cycle = findCycle(g) {
            let m = cycle.map { g.debt($0.debtor, $0.creditor) }.min()!
            for e in cycle {
                let d = Delta(e.creditor, e.debtor, m)
                g.apply(d)
                out.append(d)
            }
        }
        return out
    }

    /// One delta per pair (signed sum), zero pairs dropped, in first-touch order.
    static func aggregate(_ deltas: [Delta]) -> [Delta] {
        var order: [Edge] = []
        var sums: [Edge: Int64] = [:]
        for d in deltas {
            let key = d.debtor < d.creditor ? Edge(d.debtor, d.creditor) : Edge(d.creditor, d.debtor)
            if sums[key] == nil { order.append(key) }
            // Signed in "key.creditor is owed by key.debtor" units.
            sums[key, default: 0] += d.debtor == key.debtor ? d.cents : -d.cents
        }
        return order.compactMap { k in
            let s = sums[k]!
            if s == 0 { return nil }
            return s > 0 ? Delta(k.debtor, k.creditor, s) : Delta(k.creditor, k.debtor, -s)
        }
    }

    /// Edmonds–Karp from `source` to `sink` along debts (capacity = the debt), up to `limit`.
    /// Returns the value and the flow on each edge (0 < flow ≤ debt).
    static func maxFlow(_ g: Graph, from source: String, to sink: String, limit: Int64) -> (value: Int64, flows: [Edge: Int64]) {
        var flow: [Edge: Int64] = [:]
        var total: Int64 = 0
        let nodes = g.nodes
        guard nodes.contains(source), nodes.contains(sink) else { return (0, [:]) }
        func residual(_ u: String, _ v: String) -> Int64 { g.debt(u, v) - (flow[Edge(u, v)] ?? 0) + (flow[Edge(v, u)] ?? 0) }
        while total < limit {
            // BFS in id order: shortest paths first, so the direct debt goes first.
            var parent: [String: String] = [source: source]
            var queue = [source]
            var head = 0
            while head < queue.count, parent[sink] == nil {
                let u = queue[head]
                head += 1
                for v in nodes where parent[v] == nil && residual(u, v) > 0 {
                    parent[v] = u
                    queue.append(v)
                }
            }
            guard parent[sink] != nil else { break }
            var path: [(String, String)] = []
            var v = sink
            while v != source {
                let u = parent[v]!
                path.append((u, v))
                v = u
            }
            let push = min(limit - total, path.map { residual($0.0, $0.1) }.min()!)
            for (u, v) in path {
                // Cancel reverse flow first, then add forward flow.
                let back = flow[Edge(v, u)] ?? 0
                let cancel = min(back, push)
                if cancel > 0 { flow[Edge(v, u)] = back - cancel == 0 ? nil : back - cancel }
                if push - cancel > 0 { flow[Edge(u, v), default: 0] += push - cancel }
            }
            total += push
        }
        return (total, flow)
    }

    /// A circle of debts, found by depth-first search in id order; nil when there is none.
    static func findCycle(_ g: Graph) -> [Edge]? {
        var state: [String: Int] = [:]  // 1 = on the stack, 2 = done
        var stack: [String] = []
        func visit(_ u: String) -> [Edge]? {
            state[u] = 1
            stack.append(u)
            for v in g.creditors(of: u) {
                if state[v] == 1 {
                    let start = stack.lastIndex(of: v)!
                    let loop = Array(stack[start...]) + [v]
                    return zip(loop, loop.dropFirst()).map { Edge($0, $1) }
                }
                if state[v] == nil, let c = visit(v) { return c }
            }
            stack.removeLast()
            state[u] = 2
            return nil
        }
        for n in g.nodes where state[n] == nil {
            if let c = visit(n) { return c }
        }
        return nil
    }
}
