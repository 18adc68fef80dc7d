import NIOCore

/// A stream's bytes waiting for nghttp2 to pull them into DATA frames. The first uncompressed
/// message written while nothing waits is kept as the caller's array and framed as it is read
/// (its 5-byte prefix made on the fly): a unary call's one message costs no buffer and no copy
/// of its own. Anything written behind it goes to a `ByteBuffer`, made on the first such write.
/// (Not a shared empty buffer to start with: every stream of both event loops would retain and
/// release that one object, and its reference count's cache line would move between the cores
/// on every call.)
struct OutboundBytes {
    private var message: [UInt8]?
    /// Bytes of `message` already read, counting its 5-byte prefix.
    private var offset = 0
    private var buffer: ByteBuffer?

    var readableBytes: Int { (message.map { 5 + $0.count - offset } ?? 0) + (buffer?.readableBytes ?? 0) }

    mutating func writeMessage(_ bytes: [UInt8], compress: Bool) {
        if !compress, message == nil, (buffer?.readableBytes ?? 0) == 0 {
            message = bytes
            offset = 0
        } else {
            // Sized for the message as it is (compressed, it is usually smaller).
            withBuffer(5 + bytes.count) { $0.writeGRPCMessage(bytes, compress: compress) }
        }
    }

    mutating func writeBytes(_ bytes: [UInt8]) { withBuffer(bytes.count) { $0.writeBytes(bytes) } }

    private mutating func withBuffer(_ size: Int, _ body: (inout ByteBuffer) -> Void) {
        if buffer == nil { buffer = ByteBufferAllocator().buffer(capacity: size) }
        body(&buffer!)
    }

    /// Copies up to `max` bytes into `out`; returns how many.
    mutating func read(into out: UnsafeMutablePointer<UInt8>, max: Int) -> Int {
        var n = 0
        if let m = message {
            while n < max, offset < 5 {
                out[n] = Self.prefixByte(offset, m.count)
                offset += 1
                n += 1
            }
            let take = min(max - n, m.count - (offset - 5))
            if take > 0 {
                m.withUnsafeBufferPointer { src in
                    (out + n).update(from: src.baseAddress! + (offset - 5), count: take)
                }
                offset += take
                n += take
            }
            if offset - 5 == m.count {
                message = nil
                offset = 0
            }
        }
        let fromBuffer = min(max - n, buffer?.readableBytes ?? 0)
        if fromBuffer > 0 {
            buffer!.readWithUnsafeReadableBytes { src in
                (out + n).update(from: src.baseAddress!.assumingMemoryBound(to: UInt8.self), count: fromBuffer)
                return fromBuffer
            }
            n += fromBuffer
            if buffer!.readableBytes == 0 { buffer!.clear() }
        }
        return n
    }

    /// Byte `i` of the gRPC prefix of an uncompressed message of `length` bytes.
    @inline(__always)
    private static func prefixByte(_ i: Int, _ length: Int) -> UInt8 {
        i == 0 ? 0 : UInt8(truncatingIfNeeded: UInt32(truncatingIfNeeded: length) >> (8 * (4 - i)))
    }
}
