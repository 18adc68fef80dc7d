/// A connection's streams by id: an open-addressed table indexed by the id itself. HTTP/2 stream
/// ids of one side are odd (or even) and increasing, so `id >> 1` of the streams alive at once
/// are nearly consecutive and land in distinct slots: a lookup is a mask, a compare and a load,
/// with no hashing (a `Dictionary<Int32, _>` hashes every key with SipHash: about 3% of a
/// relayed call's CPU, several lookups per call: each header, each frame, the data, the close).
/// Collisions (ids far apart) probe linearly; removal shifts the run back, so there are no
/// tombstones. Touched only on the connection's event loop.
struct StreamTable<Stream: AnyObject> {
    /// 0: an empty slot (stream ids are never 0).
    private var keys: [Int32]
    private var values: [Stream?]
    private var mask: Int
    private(set) var count = 0

    init(capacity: Int = 32) {
        var n = 8
        while n < capacity { n <<= 1 }
        keys = Array(repeating: 0, count: n)
        values = Array(repeating: nil, count: n)
        mask = n - 1
    }

    @inline(__always)
    private func home(_ id: Int32) -> Int { Int(id >> 1) & mask }

    @inline(__always)
    private func slot(of id: Int32) -> Int? {
        var i = home(id)
        while true {
            let k = keys[i]
            if k == id { return i }
            if k == 0 { return nil }
            i = (i + 1) & mask
        }
    }

    subscript(id: Int32) -> Stream? {
        get {
            guard id != 0, let i = slot(of: id) else { return nil }
            return values[i]
        }
        set {
            guard id != 0 else { return }
            guard let newValue else {
                removeValue(forKey: id)
                return
            }
            if let i = slot(of: id) {
                values[i] = newValue
                return
            }
            if (count + 1) * 2 > keys.count { grow() }
            var i = home(id)
            while keys[i] != 0 { i = (i + 1) & mask }
            keys[i] = id
            values[i] = newValue
            count += 1
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: Int32) -> Stream? {
        guard id != 0, var i = slot(of: id) else { return nil }
        let removed = values[i]
        // Backward-shift deletion: move later members of the run into the gap when their home
        // slot is not after it (cyclically), so every key stays reachable from its home.
        var j = i
        while true {
            j = (j + 1) & mask
            let k = keys[j]
            if k == 0 { break }
            let h = home(k)
            let between = i <= j ? (i < h && h <= j) : (i < h || h <= j)
            if !between {
                keys[i] = k
                values[i] = values[j]
                i = j
            }
        }
        keys[i] = 0
        values[i] = nil
        count -= 1
        return removed
    }

    private mutating func grow() {
        let oldKeys = keys
        let oldValues = values
        let n = keys.count * 2
        keys = Array(repeating: 0, count: n)
        values = Array(repeating: nil, count: n)
        mask = n - 1
        for (k, v) in zip(oldKeys, oldValues) where k != 0 {
            var i = home(k)
            while keys[i] != 0 { i = (i + 1) & mask }
            keys[i] = k
            values[i] = v
        }
    }

    mutating func removeAll() {
        for i in keys.indices where keys[i] != 0 {
            keys[i] = 0
            values[i] = nil
        }
        count = 0
    }

    /// Every stream, in no particular order (a copy: safe to change the table while iterating).
    var all: [Stream] { values.compactMap { $0 } }
    var isEmpty: Bool { count == 0 }
}
