import CNGHTTP2
import CNGHTTP2Memory
import Testing

/// nghttp2's allocator (`CNGHTTP2Memory`): per-thread free lists by size class.
@Suite(.serialized) struct NGHTTP2MemoryTests {
    let mem = rpc_nghttp2_memory()!.pointee

    func malloc(_ n: Int) -> UnsafeMutableRawPointer { mem.malloc(n, mem.mem_user_data)! }
    func free(_ p: UnsafeMutableRawPointer?) { mem.free(p, mem.mem_user_data) }

    @Test func blocksOfEverySizeAreAlignedAndWholly() {
        rpc_nghttp2_memory_trim()
        var blocks: [(UnsafeMutableRawPointer, Int)] = []
        for size in [0, 1, 15, 16, 17, 48, 100, 112, 113, 500, 1000, 2032, 2033, 4080, 4081, 10_000] {
            let p = malloc(size)
            #expect(Int(bitPattern: p) % 16 == 0, "\(size)")
            p.initializeMemory(as: UInt8.self, repeating: UInt8(truncatingIfNeeded: size), count: size)
            blocks.append((p, size))
        }
        // No block overlaps another: each still holds its own bytes.
        for (p, size) in blocks {
            let bytes = UnsafeRawBufferPointer(start: p, count: size)
            #expect(bytes.allSatisfy { $0 == UInt8(truncatingIfNeeded: size) }, "\(size)")
            free(p)
        }
        free(nil)
        rpc_nghttp2_memory_trim()
        #expect(rpc_nghttp2_memory_cached() == 0)
    }

    @Test func aFreedBlockIsTheNextOfItsClassAndCallocClearsIt() {
        rpc_nghttp2_memory_trim()
        let p = malloc(300)
        p.initializeMemory(as: UInt8.self, repeating: 0xAB, count: 300)
        free(p)
        #expect(rpc_nghttp2_memory_cached() == 1)
        let q = mem.calloc(30, 10, mem.mem_user_data)!
        #expect(q == p, "reused from its list")
        #expect(UnsafeRawBufferPointer(start: q, count: 300).allSatisfy { $0 == 0 })
        #expect(rpc_nghttp2_memory_cached() == 0)
        free(q)
        // Another class does not take it.
        let r = malloc(40)
        #expect(r != p)
        free(r)
        rpc_nghttp2_memory_trim()
    }

    @Test func reallocKeepsTheBytesAcrossClassesAndIntoMalloc() {
        var p = malloc(10)
        for i in 0..<10 { p.storeBytes(of: UInt8(i), toByteOffset: i, as: UInt8.self) }
        // Within the class's room: the same block.
        #expect(mem.realloc(p, 16, mem.mem_user_data) == p)
        for size in [100, 1000, 5000, 20_000, 50] {
            p = mem.realloc(p, size, mem.mem_user_data)!
            #expect(Int(bitPattern: p) % 16 == 0)
            #expect((0..<10).allSatisfy { p.load(fromByteOffset: $0, as: UInt8.self) == UInt8($0) }, "\(size)")
        }
        free(p)
        // realloc of nil allocates; of size 0 frees.
        let q = mem.realloc(nil, 64, mem.mem_user_data)
        #expect(q != nil)
        #expect(mem.realloc(q, 0, mem.mem_user_data) == nil)
        #expect(mem.calloc(Int.max, 3, mem.mem_user_data) == nil, "n × size overflows")
        #expect(mem.calloc(Int.max, 2, mem.mem_user_data) == nil, "size + header overflows")
        #expect(mem.malloc(Int.max, mem.mem_user_data) == nil)
        rpc_nghttp2_memory_trim()
    }

    /// What a burst frees beyond a class's cap goes back to malloc: the lists stay bounded.
    @Test func theListsKeepAtMostTheirCap() {
        rpc_nghttp2_memory_trim()
        let blocks = (0..<1000).map { _ in malloc(20) }
        for p in blocks { free(p) }
        #expect(rpc_nghttp2_memory_cached() == 256)
        let big = (0..<100).map { _ in malloc(3000) }
        for p in big { free(p) }
        #expect(rpc_nghttp2_memory_cached() == 256 + 32)
        rpc_nghttp2_memory_trim()
        #expect(rpc_nghttp2_memory_cached() == 0)
    }
}
