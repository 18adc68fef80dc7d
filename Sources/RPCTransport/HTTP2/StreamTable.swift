/// A connection's streams by id: a direct-mapped table indexed by the id itself, with a
/// dictionary for the rare id whose slot is taken. HTTP/2 stream ids of one side are odd (or
/// even) and increasing, so `id >> 1` of the streams alive at once are nearly consecutive and
/// land in distinct slots: a lookup is a mask, a compare and a load, with no hashing (a
/// `Dictionary<Int32, _>` hashes every key with SipHash: about 3% of a relayed call's CPU, several
/// lookups per call: each header, each frame, the data, the close). A slot is taken by another id
/// only when a long-lived stream (a subscription) is still there a table's length of ids later:
/// that id goes to `overflow`, and a table whose overflow grows past a quarter of it doubles, up
/// to `maxSlots` (ids a client spaces far apart on purpose stay in the dictionary rather than
/// growing the table to their spacing).
/// Touched only on the connection's event loop.
struct StreamTable<Stream: AnyObject> {
    /// 0: an empty slot (stream ids are never 0).
    private var keys: [Int32]
    private var values: [Stream?]
    private var mask: Int
    private var overflow: [Int32: Stream] = [:]
    private(set) var count = 0
    static var maxSlots: Int { 4096 }

    init(capacity: Int = 32) {
        var n = 8
        while n < capacity { n <<= 1 }
        keys = Array(repeating: 0, count: n)
        values = Array(repeating: nil, count: n)
        mask = n - 1
    }

    @inline(__always)
    private func slot(_ id: Int32) -> Int { Int(truncatingIfNeeded: id >> 1) & mask }

    subscript(id: Int32) -> Stream? {
        get { unretained(id)?.takeUnretainedValue() }
        set {
            guard id != 0 else { return }
            guard let newValue else {
                removeValue(forKey: id)
                return
            }
            let i = slot(id)
            if keys[i] == id {
                values[i] = newValue
            } else if keys[i] == 0 && (overflow.isEmpty || overflow[id] == nil) {
                keys[i] = id
                values[i] = newValue
                count += 1
            } else {
                if overflow.updateValue(newValue, forKey: id) == nil { count += 1 }
                if overflow.count * 4 > keys.count && keys.count < Self.maxSlots { grow() }
            }
        }
    }

    /// The stream of `id`, not retained: for a callback that runs often, neither removes a
    /// stream nor keeps the reference past its return (a header: a dozen per relayed call), used
    /// through `Unmanaged._withUnsafeGuaranteedRef`. The table holds the stream meanwhile.
    @inline(__always)
    func unretained(_ id: Int32) -> Unmanaged<Stream>? {
        let i = slot(id)
        if keys[i] == id, id != 0 {
            guard let s = values[i] else { return nil }
            return Unmanaged.passUnretained(s)
        }
        guard !overflow.isEmpty, let s = overflow[id] else { return nil }
        return Unmanaged.passUnretained(s)
    }

    @discardableResult
    mutating func removeValue(forKey id: Int32) -> Stream? {
        let i = slot(id)
        if keys[i] == id, id != 0 {
            // Taken out, not copied: no retain and release of the stream.
            let removed = values[i].take()
            keys[i] = 0
            count -= 1
            return removed
        }
        guard !overflow.isEmpty, let removed = overflow.removeValue(forKey: id) else { return nil }
        count -= 1
        return removed
    }

    /// Doubles the table and places every stream again (those that collide stay in `overflow`).
    private mutating func grow() {
        let streams = allPairs
        let n = keys.count * 2
        keys = Array(repeating: 0, count: n)
        values = Array(repeating: nil, count: n)
        mask = n - 1
        overflow = [:]
        count = 0
        for (id, stream) in streams { self[id] = stream }
    }

    private var allPairs: [(Int32, Stream)] {
        var out: [(Int32, Stream)] = []
        out.reserveCapacity(count)
        for i in keys.indices where keys[i] != 0 { out.append((keys[i], values[i]!)) }
        for (id, stream) in overflow { out.append((id, stream)) }
        return out
    }

    mutating func removeAll() {
        for i in keys.indices where keys[i] != 0 {
            keys[i] = 0
            values[i] = nil
        }
        overflow = [:]
        count = 0
    }

    /// Every stream, in no particular order (a copy: safe to change the table while iterating).
    var all: [Stream] { allPairs.map(\.1) }
    var isEmpty: Bool { count == 0 }
    /// The direct-mapped table's length (tests).
    var slotCount: Int { keys.count }
}

/// A connection's streams lent unretained to its nghttp2 callbacks: several callbacks per call
/// (its headers, frames, data, the bytes it sends) use their stream without a retain and release.
/// Safe because a stream leaves its table only outside a lend: in `onStreamClose` and the
/// connection's teardown, which run inside no other callback (nghttp2 never nests them, and no
/// callback closes the connection synchronously), and after a lend has ended (the client's
/// `onFrameRecv` drops a stream refused at its headers once its lend returns); debug builds
/// count what is lent and stop when a stream leaves its table meanwhile (`checkNoneLent`). Lent through this object, not a method of the table: calling one
/// on a table stored in the connection would hold a copy of it (two retains) while `body` runs.
final class StreamLending {
    #if DEBUG
    private var depth = 0
    #endif

    /// `body` with the stream `u` refers to (nil when there is none).
    @inline(__always)
    func with<Stream: AnyObject, R>(_ u: Unmanaged<Stream>?, _ body: (Stream) -> R) -> R? {
        guard let u else { return nil }
        #if DEBUG
        depth += 1
        defer { depth -= 1 }
        #endif
        return u._withUnsafeGuaranteedRef(body)
    }

    /// Before a stream leaves its table.
    @inline(__always)
    func checkNoneLent() {
        #if DEBUG
        precondition(depth == 0, "a stream was removed while a callback used it unretained")
        #endif
    }
}
