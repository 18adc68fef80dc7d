import CNGHTTP2
import NIOCore

/// Drains nghttp2's pending output into the channel, in buffers of up to 64 KiB, while the channel
/// is writable (DATA is pulled lazily from stream buffers, so stopping here is the backpressure).
/// Returns nghttp2's error code on a fatal send error, and the buffer to reuse next time.
/// Shared by client and server.
///
/// `reusing` is the connection's output buffer from the last flush: once the socket has taken a
/// write, the channel lets go of the buffer and the next flush fills it again in place. It grows
/// to what a flush needs (no fixed 16 KiB per flush, which glibc serves from its slow path) and
/// is dropped past 64 KiB, so an idle connection holds little. It is passed by value, not inout:
/// the flush can re-enter the handler (writability changes), which flushes again.
func drainSessionOutput(
    _ session: OpaquePointer, into context: ChannelHandlerContext,
    reusing scratch: ByteBuffer?
) -> (error: Int32?, reuse: ByteBuffer?) {
    var scratch = scratch
    let channel = context.channel
    var buffer: ByteBuffer? = nil
    var wrote = false
    defer { if wrote { context.flush() } }
    while channel.isWritable || !channel.isActive {
        var ptr: UnsafePointer<UInt8>?
        let n = nghttp2_session_mem_send(session, &ptr)
        if n < 0 { return (Int32(n), nil) }
        if n == 0 { break }
        if buffer == nil {
            if var reused = scratch.take() {
                reused.clear()
                buffer = reused
            } else {
                buffer = channel.allocator.buffer(capacity: n)
            }
        }
        buffer!.writeBytes(UnsafeRawBufferPointer(start: ptr, count: n))
        if buffer!.readableBytes >= 65536 {
            context.write(NIOAny(buffer!), promise: nil)
            buffer = nil
            wrote = true
        }
    }
    guard let b = buffer else { return (nil, scratch) }
    // The last (most often the only) buffer goes with the flush, which also sends any written
    // above: one trip down the pipeline, and no second flush from the `defer`.
    wrote = false
    context.writeAndFlush(NIOAny(b), promise: nil)
    return (nil, b.capacity <= 65536 ? b : nil)
}
