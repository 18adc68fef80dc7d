import RPCCore
import Synchronization

/// Per-call server metrics, in the names go-grpc-prometheus made usual (so existing dashboards
/// and alerts apply):
///
/// - `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}`: calls ended, by status;
/// - `grpc_server_handling_seconds{grpc_service,grpc_method}`: latency histogram, headers in to
///   status out;
/// - `grpc_server_msg_received_total` / `grpc_server_msg_sent_total` and
///   `grpc_server_received_bytes_total` / `grpc_server_sent_bytes_total` per method;
/// - `grpc_server_calls_in_flight`, `grpc_server_connections`: gauges per process.
///
/// Labels are bounded: methods the server routes (made at start), codes from the 17 statuses;
/// calls refused before routing count under `grpc_service="unknown", grpc_method="unknown"`.
///
/// **No shared writes per call.** The transport tells each event loop's calls to that loop's
/// own `LoopCounters` (`ServerCallObserver.onLoop`): one writer per loop, so a count is a plain
/// relaxed load and store, with no locked instruction, no lock and no cache line shared with the
/// other loops (the swift-prometheus counters and histogram this replaced cost a lock and about
/// ten contended atomic operations per call, measured at ≈ 0.65 µs per call on each side of a
/// relay). The totals are summed at scrape time (`RPCCallTotals`), across loops and across the
/// servers of the process (tests run several; a server that is gone leaves its totals behind),
/// and written as Prometheus text after the registry's. Calls told from elsewhere (the gateway's
/// browser protocols, through `ObservingInterceptor`) go to a shared set under a lock.
public final class RPCServerMetrics: ServerCallObserver, Sendable {
    let store: RPCCallStore

    public init() {
        ProcessMetrics.bootstrap()
        store = RPCCallStore()
        RPCCallTotals.register(store)
    }

    /// The server is gone: its totals stay in the process's (counters never go back).
    deinit { RPCCallTotals.retire(store) }

    public func prepare(_ methods: [MethodDescriptor]) { store.prepare(methods) }

    public func onLoop(_ loop: ObjectIdentifier) -> any ServerCallObserver { store.counters(for: loop) }

    public func callStarted() { store.shared.withLock { $0.started += 1 } }

    public func callEnded(_ call: ServerCallRecord) {
        let slot = store.slot(of: call.method)
        store.shared.withLock { cells in
            cells.ended += 1
            if let slot { cells.add(call, at: slot) }
        }
        if slot == nil, let method = call.method { store.late.add(call, method) }
    }

    public func connection(opened: Bool) { store.connections.add(opened ? 1 : -1, ordering: .relaxed) }

    /// Counts read nothing but the counted fields.
    public var readsCallDetails: Bool { false }

    /// Calls in flight on the server this observes.
    public var callsInFlight: Int { store.totals().inFlight }
}

/// The layout of one method's counts, the same in every set of cells.
enum CallCells {
    /// Calls ended, by status code (0…16).
    static let handled = 0
    static let received = 17
    static let sent = 18
    static let receivedBytes = 19
    static let sentBytes = 20
    /// Calls per latency bucket, not cumulative: `buckets + i` counts durations in
    /// (bound[i-1], bound[i]], the last one those past every bound (`+Inf`).
    static let buckets = 21
    static let bucketCount = ProcessMetrics.latencyBuckets.count + 1
    static let sumNanoseconds = buckets + bucketCount
    static let stride = sumNanoseconds + 1

    /// The latency buckets' upper bounds in nanoseconds.
    static let bounds: [Int] = ProcessMetrics.latencyBuckets.map(\.wholeNanoseconds)

    @inline(__always)
    static func bucket(_ nanoseconds: Int, in bounds: [Int] = bounds) -> Int {
        var i = 0
        let n = bounds.count
        while i < n && nanoseconds > bounds[i] { i += 1 }
        return i
    }
}

/// The prepared methods, found by descriptor identity in an open-addressed table (no hashing
/// of strings, no retain): slot 0 is "unknown" (calls refused before routing).
final class MethodSlots: Sendable {
    let descriptors: [MethodDescriptor]
    private let keys: [UInt]
    private let values: [Int]
    private let mask: Int

    init(_ methods: [MethodDescriptor]) {
        var unique: [MethodDescriptor] = []
        var seen = Set<ObjectIdentifier>()
        for m in methods where seen.insert(ObjectIdentifier(m)).inserted { unique.append(m) }
        descriptors = unique
        var size = 8
        while size < unique.count * 2 { size *= 2 }
        var keys = [UInt](repeating: 0, count: size)
        var values = [Int](repeating: 0, count: size)
        for (i, m) in unique.enumerated() {
            let key = UInt(bitPattern: ObjectIdentifier(m))
            var h = Self.hash(key) & (size - 1)
            while keys[h] != 0 { h = (h + 1) & (size - 1) }
            keys[h] = key
            values[h] = i + 1
        }
        self.keys = keys
        self.values = values
        mask = size - 1
    }

    @inline(__always)
    static func hash(_ key: UInt) -> Int { Int(truncatingIfNeeded: ((key >> 4) &* 0x9E37_79B9_7F4A_7C15) >> 40) }

    /// The slot of `method`: 0 for nil, nil for a method not prepared.
    @inline(__always)
    func slot(of method: MethodDescriptor?) -> Int? {
        guard let method else { return 0 }
        let key = UInt(bitPattern: ObjectIdentifier(method))
        var h = Self.hash(key) & mask
        while true {
            let k = keys[h]
            if k == key { return values[h] }
            if k == 0 { return nil }
            h = (h + 1) & mask
        }
    }

    var slotCount: Int { descriptors.count + 1 }
}

/// One event loop's counts: written only from that loop's thread (the transport's promise for
/// `onLoop`), read by the scrape from any thread. A count is a relaxed load and store, which is
/// one `mov` each: no locked instruction, since nothing else writes it.
final class LoopCounters: ServerCallObserver, @unchecked Sendable {
    let slots: MethodSlots
    let cells: UnsafeMutablePointer<Atomic<Int>>
    let count: Int
    /// Calls started and ended here (in flight: their difference, summed over the loops).
    static let started = 0
    static let ended = 1
    static let header = 2
    /// Where calls of methods not prepared go (rare: a server that did not prepare them).
    let late: RPCCallStore.Late
    /// `CallCells`' layout and bounds as this loop's own: read on every call, they would
    /// otherwise be lazily initialized globals (a `swift_once` check for each) and one array that
    /// every loop reads.
    let stride: Int
    let sumOffset: Int
    let bounds: [Int]

    init(slots: MethodSlots, late: RPCCallStore.Late) {
        self.slots = slots
        self.late = late
        stride = CallCells.stride
        sumOffset = CallCells.sumNanoseconds
        bounds = CallCells.bounds.map { $0 }  // storage of its own
        count = Self.header + slots.slotCount * CallCells.stride
        cells = .allocate(capacity: count)
        for i in 0..<count { (cells + i).initialize(to: Atomic(0)) }
    }

    deinit {
        cells.deinitialize(count: count)
        cells.deallocate()
    }

    @inline(__always)
    func bump(_ i: Int, by n: Int = 1) {
        let c = cells + i
        c.pointee.store(c.pointee.load(ordering: .relaxed) &+ n, ordering: .relaxed)
    }

    func load(_ i: Int) -> Int { (cells + i).pointee.load(ordering: .relaxed) }

    func callStarted() { bump(Self.started) }

    func callEnded(_ call: ServerCallRecord) {
        callEnded(
            method: call.method, code: call.code, nanoseconds: call.nanoseconds, requestMessages: call.requestMessages,
            requestBytes: call.requestBytes, responseMessages: call.responseMessages, responseBytes: call.responseBytes)
    }

    /// Counts read nothing but these (no record is made for them).
    var readsCallDetails: Bool { false }

    func callEnded(
        method: MethodDescriptor?, code: StatusCode, nanoseconds: Int, requestMessages: Int, requestBytes: Int,
        responseMessages: Int, responseBytes: Int
    ) {
        // Released, and read first with acquire (`add(to:)`): a scrape that sees a call's end sees
        // its start, so the in-flight gauge never goes below zero. (Plain `mov`s on x86 still.)
        let e = cells + Self.ended
        e.pointee.store(e.pointee.load(ordering: .relaxed) &+ 1, ordering: .releasing)
        guard let slot = slots.slot(of: method) else {
            if let method {
                late.add(
                    ServerCallRecord(
                        method: method, code: code, nanoseconds: nanoseconds, requestMessages: requestMessages,
                        requestBytes: requestBytes, responseMessages: responseMessages, responseBytes: responseBytes), method)
            }
            return
        }
        let base = Self.header + slot * stride
        bump(base + CallCells.handled + code.rawValue)
        if requestMessages > 0 {
            bump(base + CallCells.received, by: requestMessages)
            bump(base + CallCells.receivedBytes, by: requestBytes)
        }
        if responseMessages > 0 {
            bump(base + CallCells.sent, by: responseMessages)
            bump(base + CallCells.sentBytes, by: responseBytes)
        }
        let ns = max(0, nanoseconds)
        bump(base + CallCells.buckets + CallCells.bucket(ns, in: bounds))
        bump(base + sumOffset, by: ns)
    }

    /// Adds this loop's counts to `totals`.
    func add(to totals: inout RPCCallTotals.Snapshot) {
        let ended = (cells + Self.ended).pointee.load(ordering: .acquiring)
        totals.inFlight += load(Self.started) - ended
        for (slot, key) in RPCCallTotals.keys(slots).enumerated() {
            let base = Self.header + slot * CallCells.stride
            totals.add(key) { i in load(base + i) }
        }
    }
}

/// One server's (one `RPCServerMetrics`') counts: its loops', the shared ones, its connections.
final class RPCCallStore: Sendable {
    /// Counts told outside the loops, under a lock.
    struct Shared: Sendable {
        var started = 0
        var ended = 0
        var cells: [Int] = []

        mutating func add(_ call: ServerCallRecord, at slot: Int) {
            let base = slot * CallCells.stride
            if cells.count < base + CallCells.stride {
                cells += [Int](repeating: 0, count: base + CallCells.stride - cells.count)
            }
            cells.withUnsafeMutableBufferPointer { c in RPCCallTotals.add(call, into: c.baseAddress! + base) }
        }
    }

    /// Calls of methods that were not prepared, from any loop.
    final class Late: Sendable {
        let cells = Mutex<[RPCCallTotals.Key: [Int]]>([:])
        func add(_ call: ServerCallRecord, _ method: MethodDescriptor) {
            let key = RPCCallTotals.Key(service: method.service, method: method.method)
            cells.withLock { late in
                var c = late[key] ?? [Int](repeating: 0, count: CallCells.stride)
                c.withUnsafeMutableBufferPointer { c in RPCCallTotals.add(call, into: c.baseAddress!) }
                late[key] = c
            }
        }
    }

    private let prepared = AtomicLazyReference<MethodSlots>()
    /// Each loop's counters, and any a loop had before `prepare` (still counted).
    private let loops = Mutex<(current: [ObjectIdentifier: LoopCounters], earlier: [LoopCounters])>(([:], []))
    let shared = Mutex(Shared())
    let late = Late()
    let connections = Atomic<Int>(0)

    init() {}

    /// Set once, before the first connection (a server prepares before it accepts); methods of
    /// a later `prepare` count as not prepared.
    func prepare(_ methods: [MethodDescriptor]) { _ = prepared.storeIfNil(MethodSlots(methods)) }

    /// The prepared methods; none yet before `prepare` (nothing is fixed by reading it).
    var slots: MethodSlots { prepared.load() ?? Self.none }
    private static let none = MethodSlots([])

    func slot(of method: MethodDescriptor?) -> Int? { slots.slot(of: method) }

    /// The counters of the loop `loop` (made when its first connection opens; made again, the
    /// earlier ones kept, when the methods were prepared after that).
    func counters(for loop: ObjectIdentifier) -> LoopCounters {
        let slots = self.slots
        return loops.withLock { loops in
            if let c = loops.current[loop], c.slots === slots { return c }
            if let old = loops.current[loop] { loops.earlier.append(old) }
            let c = LoopCounters(slots: slots, late: late)
            loops.current[loop] = c
            return c
        }
    }

    /// Everything counted so far.
    func totals() -> RPCCallTotals.Snapshot {
        var t = RPCCallTotals.Snapshot()
        for c in loops.withLock({ Array($0.current.values) + $0.earlier }) { c.add(to: &t) }
        let slots = self.slots
        shared.withLock { s in
            t.inFlight += s.started - s.ended
            let keys = RPCCallTotals.keys(slots)
            for slot in 0..<(s.cells.count / CallCells.stride) where slot < keys.count {
                let base = slot * CallCells.stride
                t.add(keys[slot]) { i in s.cells[base + i] }
            }
        }
        for (key, c) in late.cells.withLock({ $0 }) { t.add(key) { i in c[i] } }
        t.connections += connections.load(ordering: .relaxed)
        return t
    }
}

/// The process's RPC call counts, summed at scrape time over every server's stores (live, and
/// those retired when their server went), written as Prometheus text.
public enum RPCCallTotals {
    struct Key: Hashable, Sendable, Comparable {
        let service: String
        let method: String
        static func < (a: Key, b: Key) -> Bool { (a.service, a.method) < (b.service, b.method) }
    }

    static let unknown = Key(service: "unknown", method: "unknown")

    /// Label keys of a table's slots (slot 0: unknown).
    static func keys(_ slots: MethodSlots) -> [Key] {
        [unknown] + slots.descriptors.map { Key(service: $0.service, method: $0.method) }
    }

    /// Adds one call to a method's cells.
    static func add(_ call: ServerCallRecord, into c: UnsafeMutablePointer<Int>) {
        c[CallCells.handled + call.code.rawValue] += 1
        c[CallCells.received] += call.requestMessages
        c[CallCells.receivedBytes] += call.requestBytes
        c[CallCells.sent] += call.responseMessages
        c[CallCells.sentBytes] += call.responseBytes
        let ns = max(0, call.nanoseconds)
        c[CallCells.buckets + CallCells.bucket(ns)] += 1
        c[CallCells.sumNanoseconds] += ns
    }

    /// Totals by method, and the process's gauges.
    struct Snapshot: Sendable {
        var methods: [Key: [Int]] = [:]
        var inFlight = 0
        var connections = 0

        mutating func add(_ key: Key, _ cell: (Int) -> Int) {
            var c = methods[key] ?? [Int](repeating: 0, count: CallCells.stride)
            for i in 0..<CallCells.stride { c[i] += cell(i) }
            methods[key] = c
        }

        mutating func add(_ other: Snapshot) {
            for (key, c) in other.methods { add(key) { c[$0] } }
        }
    }

    /// The live servers' stores, and what servers that are gone counted, under one lock: a store
    /// moves from the one to the other in a single step, so no scrape sees it in neither (a
    /// counter that dipped for one scrape would read as a reset).
    private static let registry = Mutex<(stores: [ObjectIdentifier: RPCCallStore], retired: Snapshot)>(([:], Snapshot()))

    static func register(_ store: RPCCallStore) {
        registry.withLock { $0.stores[ObjectIdentifier(store)] = store }
    }

    static func retire(_ store: RPCCallStore) {
        registry.withLock { r in
            guard r.stores.removeValue(forKey: ObjectIdentifier(store)) != nil else { return }
            r.retired.add(store.totals())
        }
    }

    /// Every live server's counts plus the retired ones.
    static func snapshot() -> (totals: Snapshot, live: Bool) {
        let (stores, retired) = registry.withLock { r in (Array(r.stores.values), r.retired) }
        var t = retired
        t.inFlight = 0
        t.connections = 0
        for s in stores {
            let st = s.totals()
            t.add(st)
            t.inFlight += st.inFlight
            t.connections += st.connections
        }
        return (t, !stores.isEmpty)
    }

    /// The Prometheus text of the RPC families (nothing when no server observes calls).
    public static func exposition() -> String {
        let (t, live) = snapshot()
        if !live && t.methods.isEmpty { return "" }
        var out = ""
        out.reserveCapacity(256 + t.methods.count * 2400)
        let keys = t.methods.keys.sorted()
        func labels(_ k: Key) -> String { "grpc_service=\"\(escape(k.service))\",grpc_method=\"\(escape(k.method))\"" }
        func family(_ name: String, _ type: String, _ help: String) {
            out += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
        }

        family("grpc_server_handled_total", "counter", "gRPC calls completed on the server, by status code.")
        for k in keys {
            let c = t.methods[k]!
            for code in StatusCode.allCases where code == .ok || c[CallCells.handled + code.rawValue] > 0 {
                out += "grpc_server_handled_total{\(labels(k)),grpc_code=\"\(code.name)\"} \(c[CallCells.handled + code.rawValue])\n"
            }
        }
        family("grpc_server_handling_seconds", "histogram", "Time from a call's request headers to its status, by method.")
        let les = ProcessMetrics.latencyBucketSeconds.map { "\($0)" } + ["+Inf"]
        for k in keys {
            let c = t.methods[k]!
            let l = labels(k)
            var cumulative = 0
            for (i, le) in les.enumerated() {
                cumulative += c[CallCells.buckets + i]
                out += "grpc_server_handling_seconds_bucket{\(l),le=\"\(le)\"} \(cumulative)\n"
            }
            out += "grpc_server_handling_seconds_sum{\(l)} \(Double(c[CallCells.sumNanoseconds]) / 1e9)\n"
            out += "grpc_server_handling_seconds_count{\(l)} \(cumulative)\n"
        }
        for (name, cell, help) in [
            ("grpc_server_msg_received_total", CallCells.received, "Request messages received."),
            ("grpc_server_msg_sent_total", CallCells.sent, "Response messages sent."),
            (
                "grpc_server_received_bytes_total", CallCells.receivedBytes,
                "Request message bytes received (as sent: compressed when compressed)."
            ),
            (
                "grpc_server_sent_bytes_total", CallCells.sentBytes,
                "Response message bytes handed to the transport (before compression)."
            ),
        ] {
            family(name, "counter", help)
            for k in keys { out += "\(name){\(labels(k))} \(t.methods[k]![cell])\n" }
        }
        family("grpc_server_calls_in_flight", "gauge", "gRPC calls started and not yet ended.")
        out += "grpc_server_calls_in_flight \(t.inFlight)\n"
        family("grpc_server_connections", "gauge", "Open client connections (any protocol).")
        out += "grpc_server_connections \(t.connections)\n"
        return out
    }

    /// A label value as the text format writes it (`\\`, `\"` and `\n` escaped).
    static func escape(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 == 0x5C || $0 == 0x22 || $0 == 0x0A }) else { return s }
        var out = ""
        for ch in s.unicodeScalars {
            switch ch {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case "\n": out += "\\n"
            default: out.unicodeScalars.append(ch)
            }
        }
        return out
    }
}
