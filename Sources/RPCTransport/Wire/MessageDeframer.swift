import NIOCore
import RPCCore

/// Reassembles gRPC length-prefixed messages (1-byte compressed flag, 4-byte big-endian length,
/// payload) from DATA chunks of any size. Rejects a message longer than `maxMessageSize` as soon
/// as its prefix arrives, before buffering any of it.
struct MessageDeframer {
    struct Frame {
        var payload: [UInt8]
        var compressed: Bool
        var wireSize: Int { payload.count + 5 }
    }
    enum Failure: Error {
        case tooLarge(Int)
        case badFlag(UInt8)
    }

    let maxMessageSize: Int
    private var prefix: (UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0)
    private var prefixCount = 0
    private var payload: [UInt8] = []
    private var expected = 0

    init(maxMessageSize: Int) { self.maxMessageSize = maxMessageSize }

    /// True when bytes of an unfinished message are buffered (a truncated message at end of stream).
    var hasPartialMessage: Bool { prefixCount > 0 }
    /// Bytes of the unfinished message received so far (prefix included).
    var partialCount: Int { prefixCount + payload.count }

    /// Feeds a DATA chunk and splits its bytes for flow control: each completed frame comes with the
    /// part of its bytes that arrived in *this* chunk (`deferred`); the chunk's other bytes belong to
    /// a message still incomplete and are returned, to be released at once. Releasing a partial
    /// message's bytes immediately is what lets a message larger than the window arrive at all;
    /// holding back only completed, unread messages is the backpressure.
    mutating func feed(_ chunk: UnsafeRawBufferPointer, _ emit: (Frame, _ deferred: Int) -> Void) throws(Failure) -> Int {
        var earlier = partialCount
        var completed = 0
        try feed(chunk) { frame in
            let deferred = frame.wireSize - earlier
            earlier = 0
            completed += deferred
            emit(frame, deferred)
        }
        return chunk.count - completed
    }

    mutating func feed(_ chunk: UnsafeRawBufferPointer, _ emit: (Frame) -> Void) throws(Failure) {
        var i = 0
        let n = chunk.count
        while i < n {
            if prefixCount < 5 {
                let b = chunk[i]
                switch prefixCount {
                case 0: prefix.0 = b
                case 1: prefix.1 = b
                case 2: prefix.2 = b
                case 3: prefix.3 = b
                default: prefix.4 = b
                }
                prefixCount += 1
                i += 1
                if prefixCount == 5 {
                    guard prefix.0 <= 1 else { throw .badFlag(prefix.0) }
                    expected = Int(prefix.1) << 24 | Int(prefix.2) << 16 | Int(prefix.3) << 8 | Int(prefix.4)
                    guard expected <= maxMessageSize else { throw .tooLarge(expected) }
                    if expected == 0 {
                        emit(Frame(payload: [], compressed: prefix.0 == 1))
                        prefixCount = 0
                    } else {
                        payload.reserveCapacity(expected)
                    }
                }
                continue
            }
            let take = min(expected - payload.count, n - i)
            payload.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[i..<(i + take)]))
            i += take
            if payload.count == expected {
                emit(Frame(payload: payload, compressed: prefix.0 == 1))
                payload = []
                prefixCount = 0
            }
        }
    }
}

extension ByteBuffer {
    /// An empty buffer with no storage of its own: a stream's outbound buffer starts as this and
    /// allocates on its first write, at the size that write needs.
    static let empty = ByteBufferAllocator().buffer(capacity: 0)

    /// Appends one gRPC length-prefixed message (gzip-compressed when `compress`): the framing
    /// `MessageDeframer` undoes.
    mutating func writeGRPCMessage(_ message: [UInt8], compress: Bool) {
        let payload = compress ? Gzip.compress(message) : message
        reserveCapacity(minimumWritableBytes: 5 + payload.count)  // one allocation, not one per part
        writeInteger(UInt8(compress ? 1 : 0))
        writeInteger(UInt32(truncatingIfNeeded: payload.count))
        writeBytes(payload)
    }
}
