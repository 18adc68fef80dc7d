import Testing

@testable import RPCTransport

/// The connection's stream table against a dictionary, under the patterns HTTP/2 gives it
/// (increasing odd ids, most short-lived, a few long-lived) and under ids far apart that collide.
@Suite struct StreamTableTests {
    final class Box {
        let id: Int32
        init(_ id: Int32) { self.id = id }
    }

    /// Knuth's MMIX linear congruential sequence, high bits: a replayable order of operations.
    struct Steps {
        var x: UInt64
        mutating func next() -> UInt64 {
            x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return x >> 17
        }
    }

    func check(_ table: StreamTable<Box>, _ model: [Int32: Box], probes: [Int32]) {
        #expect(table.count == model.count)
        #expect(table.isEmpty == model.isEmpty)
        for id in probes {
            #expect(table[id] === model[id], "id \(id)")
            // The unretained lookup finds the same stream (or none), in the table or its overflow.
            #expect(table.unretained(id)?.takeUnretainedValue() === model[id], "unretained id \(id)")
        }
        #expect(Set(table.all.map(\.id)) == Set(model.keys))
    }

    @Test func increasingIdsWithLongLivedStreams() {
        var table = StreamTable<Box>(capacity: 8)
        var model: [Int32: Box] = [:]
        var rng = Steps(x: 1)
        var next: Int32 = 1
        var live: [Int32] = []
        for round in 0..<20_000 {
            if model.count < 300 && rng.next() % 3 != 0 {
                let b = Box(next)
                table[next] = b
                model[next] = b
                live.append(next)
                next += 2
            } else if !live.isEmpty {
                // Mostly the oldest (short calls end in order), sometimes any.
                let i = rng.next() % 4 == 0 ? Int(rng.next() % UInt64(live.count)) : 0
                let id = live.remove(at: i)
                #expect(table.removeValue(forKey: id) === model.removeValue(forKey: id))
            }
            if round % 997 == 0 { check(table, model, probes: Array(model.keys) + [next, next + 2, 0, -1]) }
        }
        check(table, model, probes: Array(model.keys) + [next])
        table.removeAll()
        model.removeAll()
        check(table, model, probes: [1, 3, next - 2])
    }

    @Test func idsThatCollideStayReachableAfterRemovals() {
        var table = StreamTable<Box>(capacity: 8)
        var model: [Int32: Box] = [:]
        var rng = Steps(x: 7)
        // Ids whose home slots coincide (multiples of a large power of two, plus a little),
        // inserted and removed in random order, including removal of absent ids.
        for _ in 0..<50_000 {
            let id = Int32(truncatingIfNeeded: (rng.next() % 64) * 1024 * 2 + 1 + (rng.next() % 3) * 2)
            if rng.next() % 2 == 0 {
                let b = Box(id)
                table[id] = b
                model[id] = b
            } else {
                #expect(table.removeValue(forKey: id) === model.removeValue(forKey: id))
            }
        }
        var probes: [Int32] = []
        for k in 0..<64 {
            for j in 0..<3 { probes.append(Int32(j * 2 + 1 + k * 2048)) }
        }
        check(table, model, probes: probes)
        // Setting nil removes.
        for id in model.keys { table[id] = nil }
        model.removeAll()
        check(table, model, probes: probes)
    }
}

extension StreamTableTests {
    /// Ids spaced to collide at every size the table may take: it stops growing at its cap and
    /// keeps them all reachable through its dictionary.
    @Test func idsSpacedFarApartDoNotGrowTheTablePastItsCap() {
        var table = StreamTable<Box>(capacity: 8)
        var model: [Int32: Box] = [:]
        for k in 0..<100 {
            let id = Int32(1 + k * (1 << 24))
            let b = Box(id)
            table[id] = b
            model[id] = b
        }
        check(table, model, probes: Array(model.keys) + [3, 1 + (1 << 23)])
        #expect(table.slotCount <= StreamTable<Box>.maxSlots)
        for id in model.keys.sorted() where id % 3 == 0 { #expect(table.removeValue(forKey: id) === model.removeValue(forKey: id)) }
        check(table, model, probes: Array(model.keys))
    }
}
