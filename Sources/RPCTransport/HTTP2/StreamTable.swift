/// A connection's streams by id, remembering the last one looked up: nghttp2 calls back several
/// times in a row for one stream (each header, then the frame, then its data), and a hit skips
/// hashing the id. Touched only on the connection's event loop.
struct StreamTable<Stream: AnyObject> {
    private var byID: [Int32: Stream] = [:]
    private var lastID: Int32 = 0
    private var last: Stream?

    subscript(id: Int32) -> Stream? {
        mutating get {
            if id == lastID, let last { return last }
            guard let s = byID[id] else { return nil }
            lastID = id
            last = s
            return s
        }
        set {
            byID[id] = newValue
            if id == lastID { last = newValue }
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: Int32) -> Stream? {
        if id == lastID { last = nil }
        return byID.removeValue(forKey: id)
    }

    mutating func removeAll() {
        byID.removeAll()
        last = nil
    }

    var all: Dictionary<Int32, Stream>.Values { byID.values }
    var isEmpty: Bool { byID.isEmpty }
}
