import CNGHTTP2
import NIOCore

/// Drains nghttp2's pending output into the channel, in buffers of up to 64 KiB, while the channel
/// is writable (DATA is pulled lazily from stream buffers, so stopping here is the backpressure).
/// Returns nghttp2's error code on a fatal send error, else nil. Shared by client and server.
func drainSessionOutput(_ session: OpaquePointer, into context: ChannelHandlerContext) -> Int32? {
    var buffer: ByteBuffer?
    var wrote = false
    let channel = context.channel
    while channel.isWritable || !channel.isActive {
        var ptr: UnsafePointer<UInt8>?
        let n = nghttp2_session_mem_send(session, &ptr)
        if n < 0 { return Int32(n) }
        if n == 0 { break }
        if buffer == nil { buffer = channel.allocator.buffer(capacity: max(n, 16384)) }
        buffer!.writeBytes(UnsafeRawBufferPointer(start: ptr, count: n))
        if buffer!.readableBytes >= 65536 {
            context.write(NIOAny(buffer!), promise: nil)
            buffer = nil
            wrote = true
        }
    }
    if let buffer {
        context.write(NIOAny(buffer), promise: nil)
        wrote = true
    }
    if wrote { context.flush() }
    return nil
}
