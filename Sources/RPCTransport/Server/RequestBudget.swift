import Synchronization

/// Bytes of large request messages a process holds at once, across all its connections (see
/// `ServerConfiguration.maxBufferedRequestBytesPerProcess`). A message is charged its declared
/// length when its prefix arrives (no memory is taken then: the bytes are buffered as they come)
/// and released when its handler takes it or its stream ends. One atomic add per large message;
/// small messages never touch it.
final class RequestBudget: Sendable {
    /// The one every server of the process shares unless a test gives it its own.
    static let process = RequestBudget()

    private let used = Atomic<Int>(0)

    init() {}

    /// Charges `bytes` if the total stays within `limit`, or if nothing else is charged (one
    /// message is always let through, whatever its size: the per-method and server limits cap
    /// it, and a budget smaller than a message must not refuse it forever).
    func tryCharge(_ bytes: Int, limit: Int) -> Bool {
        let total = used.wrappingAdd(bytes, ordering: .relaxed).newValue
        if total <= limit || total == bytes { return true }
        used.wrappingSubtract(bytes, ordering: .relaxed)
        return false
    }

    func release(_ bytes: Int) {
        if bytes > 0 { used.wrappingSubtract(bytes, ordering: .relaxed) }
    }

    /// Bytes charged now (tests, metrics).
    var inUse: Int { used.load(ordering: .relaxed) }
}

/// One connection's share: large messages admitted in arrival order while their declared
/// lengths fit `limit`; the others wait, first come first served, their bytes held unconsumed by
/// HTTP/2 flow control (each stream's window bounds them), until messages admitted earlier are
/// handed to their handlers. A connection with nothing admitted admits its next message whatever
/// its size, so a message larger than the budget still gets through, alone. Pure state: the
/// connection handler applies its decisions.
struct ConnectionRequestBudget {
    let limit: Int
    private(set) var admitted = 0
    /// Streams whose message waits for room, oldest first, with its declared length.
    private(set) var waiting: [(stream: Int32, bytes: Int)] = []

    init(limit: Int) { self.limit = limit }

    enum Decision: Equatable { case admitted, wait }

    /// A large message's prefix arrived on `stream`. A message never overtakes one that waits.
    mutating func request(stream: Int32, bytes: Int) -> Decision {
        if waiting.isEmpty && fits(bytes) {
            admitted += bytes
            return .admitted
        }
        waiting.append((stream, bytes))
        return .wait
    }

    private func fits(_ bytes: Int) -> Bool { admitted == 0 || admitted + bytes <= limit }

    /// An admitted message was handed over (or its stream ended): its bytes leave the budget.
    mutating func release(_ bytes: Int) {
        admitted = max(0, admitted - bytes)
    }

    /// A waiting stream no longer waits (its message completed within its window, or the stream
    /// ended).
    mutating func cancelWait(stream: Int32) {
        waiting.removeAll { $0.stream == stream }
    }

    /// The waiting streams that fit now, oldest first; they count as admitted from here on.
    mutating func admitWaiting() -> [(stream: Int32, bytes: Int)] {
        var out: [(stream: Int32, bytes: Int)] = []
        while let first = waiting.first, fits(first.bytes) {
            waiting.removeFirst()
            admitted += first.bytes
            out.append(first)
        }
        return out
    }
}
