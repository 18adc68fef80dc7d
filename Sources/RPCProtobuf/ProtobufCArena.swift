import CProtobufC

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Owns every C allocation made while one message is packed or unpacked, and frees them all at
/// once when the operation ends.
///
/// Why: building the protobuf-c struct tree for a message needs many small allocations (the
/// struct, nested structs, NUL-terminated strings, repeated arrays). Allocating each with
/// `malloc` and walking the tree again to free it costs more than the encoding itself. The arena
/// bump-allocates from a first block on the stack (`withUnsafeTemporaryAllocation`) and only
/// falls back to `malloc`ed chunks for large messages, so a typical message costs no heap
/// allocation at all besides the result. Decoding hands the same arena to
/// `protobuf_c_message_unpack` as its `ProtobufCAllocator`, so `free_unpacked` is never needed.
///
/// Used by generated code only; not thread-safe (one arena per operation, on one thread).
public struct ProtobufCArena {
    @usableFromInline var cursor: UnsafeMutableRawPointer
    @usableFromInline var end: UnsafeMutableRawPointer
    /// Singly linked list of malloc'ed chunks; each chunk starts with the pointer to the next.
    @usableFromInline var chunks: UnsafeMutableRawPointer?
    @usableFromInline var nextChunkSize: Int

    /// Bytes of the stack block each operation starts with.
    public static let initialBlockSize = 1024
    @usableFromInline static let chunkHeader = 16

    @usableFromInline
    init(block: UnsafeMutableRawBufferPointer) {
        cursor = block.baseAddress!
        end = block.baseAddress! + block.count
        chunks = nil
        nextChunkSize = 8192
    }

    /// Runs `body` with a fresh arena and frees everything it allocated afterwards.
    @inlinable
    public static func with<R>(_ body: (inout ProtobufCArena) throws -> R) rethrows -> R {
        try withUnsafeTemporaryAllocation(byteCount: initialBlockSize, alignment: 16) { block in
            var arena = ProtobufCArena(block: block)
            defer { arena.releaseChunks() }
            return try body(&arena)
        }
    }

    @usableFromInline
    mutating func releaseChunks() {
        var c = chunks
        while let chunk = c {
            c = chunk.load(as: UnsafeMutableRawPointer?.self)
            free(chunk)
        }
        chunks = nil
    }

    /// Uninitialised memory that lives until the operation ends. Never fails: running out of
    /// memory traps, as everywhere in Swift.
    @inlinable
    public mutating func allocate(byteCount: Int, alignment: Int) -> UnsafeMutableRawPointer {
        let start = (Int(bitPattern: cursor) &+ (alignment &- 1)) & ~(alignment &- 1)
        if start &+ byteCount <= Int(bitPattern: end) {
            cursor = UnsafeMutableRawPointer(bitPattern: start &+ byteCount)!
            return UnsafeMutableRawPointer(bitPattern: start)!
        }
        return allocateSlow(byteCount: byteCount, alignment: alignment)
    }

    @usableFromInline
    mutating func allocateSlow(byteCount: Int, alignment: Int) -> UnsafeMutableRawPointer {
        let needed = byteCount + alignment + Self.chunkHeader
        let size = max(nextChunkSize, needed)
        nextChunkSize = min(nextChunkSize * 2, 1 << 20)
        guard let chunk = malloc(size) else { fatalError("protobuf-c arena: out of memory (\(size) bytes)") }
        chunk.storeBytes(of: chunks, as: UnsafeMutableRawPointer?.self)
        chunks = chunk
        cursor = chunk + Self.chunkHeader
        end = chunk + size
        return allocate(byteCount: byteCount, alignment: alignment)
    }

    /// Uninitialised storage for one `T`.
    @inlinable
    public mutating func allocate<T>(_ type: T.Type) -> UnsafeMutablePointer<T> {
        allocate(byteCount: MemoryLayout<T>.stride, alignment: MemoryLayout<T>.alignment)
            .bindMemory(to: T.self, capacity: 1)
    }

    /// Uninitialised storage for `count` values of `T`.
    @inlinable
    public mutating func allocate<T>(_ type: T.Type, count: Int) -> UnsafeMutablePointer<T> {
        allocate(byteCount: MemoryLayout<T>.stride * count, alignment: MemoryLayout<T>.alignment)
            .bindMemory(to: T.self, capacity: count)
    }

    /// The allocator protobuf-c's unpack uses: allocation from this arena, `free` a no-op.
    /// `self` must stay at `data` for as long as protobuf-c may call it.
    @usableFromInline
    static func allocator(_ data: UnsafeMutablePointer<ProtobufCArena>) -> ProtobufCAllocator {
        ProtobufCAllocator(
            alloc: { data, size in
                data!.assumingMemoryBound(to: ProtobufCArena.self).pointee
                    .allocate(byteCount: max(size, 1), alignment: 16)
            },
            free: { _, _ in },
            allocator_data: UnsafeMutableRawPointer(data)
        )
    }
}
