import NIOCore
import RPCCore

/// Reassembles gRPC length-prefixed messages (1-byte compressed flag, 4-byte big-endian length,
/// payload) from DATA chunks of any size. Rejects a message longer than `maxMessageSize` as soon
/// as its prefix arrives, before buffering any of it. A declared length is never reserved ahead of
/// its bytes: the buffer starts at `initialCapacity` at most and grows as bytes arrive (never past
/// the declared length), so a client that declares 4 MiB and sends nothing costs nothing.
struct MessageDeframer {
    struct Frame {
        var payload: [UInt8]
        var compressed: Bool
        var wireSize: Int { payload.count + 5 }
    }
    enum Failure: Error {
        case tooLarge(Int)
        case badFlag(UInt8)
        /// The server's budget refused a large message (see `feedServer`).
        case overBudget(Int)
    }
    /// What the server decides for a large message when its prefix arrives.
    enum Admission { case admitted, wait, refused }

    /// The largest message accepted; a server narrows it to the method's limit once the route
    /// is known (before any DATA).
    var maxMessageSize: Int
    /// The buffer a message starts with (exactly the message when it is smaller).
    static let initialCapacity = 16 * 1024
    private var prefix: (UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0)
    private var prefixCount = 0
    private var payload: [UInt8] = []
    private var expected = 0

    // Server flow-control accounting of the unfinished message (`feedServer`).
    /// Its bytes received but not yet released to flow control.
    private(set) var partialHeld = 0
    /// It is a large message admitted against the budgets: its bytes are released as they come.
    private(set) var partialAdmitted = false
    /// Budget bytes charged for it (its declared length once admitted, else 0).
    private(set) var partialCharged = 0
    private var toRelease = 0

    init(maxMessageSize: Int) { self.maxMessageSize = maxMessageSize }

    /// True when bytes of an unfinished message are buffered (a truncated message at end of stream).
    var hasPartialMessage: Bool { prefixCount > 0 }
    /// Bytes of the unfinished message received so far (prefix included).
    var partialCount: Int { prefixCount + payload.count }
    /// Memory its buffer holds now (tests: a declared length is not reserved).
    var bufferedCapacity: Int { payload.capacity }

    /// Feeds a DATA chunk and splits its bytes for flow control: each completed frame comes with the
    /// part of its bytes that arrived in *this* chunk (`deferred`); the chunk's other bytes belong to
    /// a message still incomplete and are returned, to be released at once. Releasing a partial
    /// message's bytes immediately is what lets a message larger than the window arrive at all;
    /// holding back only completed, unread messages is the backpressure. (The client's way: what
    /// a server sends it is bounded by its own limit.)
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
                if try takePrefixByte(chunk[i]) {
                    if expected == 0 {
                        emit(Frame(payload: [], compressed: prefix.0 == 1))
                        prefixCount = 0
                    }
                }
                i += 1
                continue
            }
            let take = min(expected - payload.count, n - i)
            append(chunk, i, take)
            i += take
            if payload.count == expected {
                emit(Frame(payload: payload, compressed: prefix.0 == 1))
                payload = []
                prefixCount = 0
            }
        }
    }

    /// The server's feed. A message whose wire size is at most `smallLimit` (half the stream's
    /// flow-control window: it can always arrive whole) is held: its
    /// bytes stay unconsumed until it is handed over (`emit`'s `held`). A larger one is put to
    /// `admit` when its prefix arrives: `.admitted` → its bytes are released as they arrive, so
    /// it always completes; `.wait` → held like a small one until the server calls
    /// `admitPartial`; `.refused` → throws `overBudget`. Bytes to release now accumulate for
    /// `takeRelease()` (also after a throw, which adds the chunk's unread rest). `emit` gets each
    /// completed message with its bytes still held and the budget charged for it, both to give
    /// back when the handler takes it.
    mutating func feedServer(
        _ chunk: UnsafeRawBufferPointer, smallLimit: Int, admit: (Int) -> Admission,
        emit: (Frame, _ held: Int, _ charged: Int) -> Void
    ) throws(Failure) {
        var i = 0
        let n = chunk.count
        do throws(Failure) {
            while i < n {
                if prefixCount < 5 {
                    let b = chunk[i]
                    i += 1
                    partialHeld += 1
                    guard try takePrefixByte(b) else { continue }
                    if expected + 5 > smallLimit {
                        switch admit(expected) {
                        case .admitted:
                            partialAdmitted = true
                            partialCharged = expected
                            toRelease += partialHeld
                            partialHeld = 0
                        case .wait:
                            break
                        case .refused:
                            throw .overBudget(expected)
                        }
                    }
                    if expected == 0 { completeServerMessage(emit) }
                    continue
                }
                let take = min(expected - payload.count, n - i)
                append(chunk, i, take)
                if partialAdmitted { toRelease += take } else { partialHeld += take }
                i += take
                if payload.count == expected { completeServerMessage(emit) }
            }
        } catch {
            toRelease += n - i
            throw error
        }
    }

    /// Bytes `feedServer` set aside to release to flow control now.
    mutating func takeRelease() -> Int {
        defer { toRelease = 0 }
        return toRelease
    }

    /// The waiting message was admitted (charged `charged`): its bytes held so far are returned
    /// to be released, and the rest will be released as they arrive.
    mutating func admitPartial(charged: Int) -> Int {
        let held = partialHeld
        partialHeld = 0
        partialAdmitted = true
        partialCharged = charged
        return held
    }

    /// Forgets the unfinished message (its stream failed); returns its held bytes and charge.
    mutating func dropPartial() -> (held: Int, charged: Int) {
        defer {
            partialHeld = 0
            partialAdmitted = false
            partialCharged = 0
            payload = []
            prefixCount = 0
        }
        return (partialHeld, partialCharged)
    }

    private mutating func completeServerMessage(_ emit: (Frame, _ held: Int, _ charged: Int) -> Void) {
        let frame = Frame(payload: payload, compressed: prefix.0 == 1)
        let (held, charged) = (partialHeld, partialCharged)
        payload = []
        prefixCount = 0
        partialHeld = 0
        partialAdmitted = false
        partialCharged = 0
        emit(frame, held, charged)
    }

    /// Takes one prefix byte; true once the prefix is complete (and checked).
    private mutating func takePrefixByte(_ b: UInt8) throws(Failure) -> Bool {
        switch prefixCount {
        case 0: prefix.0 = b
        case 1: prefix.1 = b
        case 2: prefix.2 = b
        case 3: prefix.3 = b
        default: prefix.4 = b
        }
        prefixCount += 1
        guard prefixCount == 5 else { return false }
        guard prefix.0 <= 1 else { throw .badFlag(prefix.0) }
        expected = Int(prefix.1) << 24 | Int(prefix.2) << 16 | Int(prefix.3) << 8 | Int(prefix.4)
        guard expected <= maxMessageSize else { throw .tooLarge(expected) }
        if expected > 0 { payload.reserveCapacity(min(expected, Self.initialCapacity)) }
        return true
    }

    /// Appends `take` bytes at `i`, growing the buffer by doubling but never past the message.
    private mutating func append(_ chunk: UnsafeRawBufferPointer, _ i: Int, _ take: Int) {
        let needed = payload.count + take
        if needed > payload.capacity {
            payload.reserveCapacity(min(expected, max(needed, payload.capacity * 2)))
        }
        payload.append(contentsOf: UnsafeRawBufferPointer(rebasing: chunk[i..<(i + take)]))
    }
}

extension ByteBuffer {
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
