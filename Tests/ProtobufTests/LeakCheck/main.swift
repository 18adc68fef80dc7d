// protobuf-leakcheck: encodes and decodes messages of every field kind many times, including
// inputs that fail to decode, so that valgrind can prove the protobuf-c codec path frees all it
// allocates. Run by scripts/leakcheck:
//   valgrind --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=1 \
//     .build/debug/protobuf-leakcheck
// `protobuf-leakcheck --bench` instead prints encode/decode costs (build with -c release).

import GRPCContracts
import ProtobufTestContracts
import RPCCore
import RPCProtobuf

#if canImport(Glibc)
import Glibc
#endif

func roundTrip<M: ProtoMessage>(_ m: M) {
    let bytes = m.serializedBytes()
    guard let back = try? M(serializedBytes: bytes), back == m else {
        print("round trip failed for \(M.protoMessageName)")
        exit(2)
    }
}

func varint(_ n: Int) -> [UInt8] {
    var n = UInt64(n)
    var out: [UInt8] = []
    while n >= 0x80 {
        out.append(UInt8(n & 0x7f) | 0x80)
        n >>= 7
    }
    return out + [UInt8(n)]
}

func exercise(iterations: Int) {
    let everything = CodecSamples.everything()
    let maps = CodecSamples.maps()
    let tree = CodecSamples.tree(depth: 40)
    let choices = CodecSamples.choices().map(\.0)
    var request = Grpc_Testing_SimpleRequest()
    request.payload.body = Array(repeating: 7, count: 64)
    request.responseSize = 64
    var big = Codectest_V1_Scalars()
    big.fBytes = Array(repeating: 1, count: 100_000)  // beyond the arena's stack block
    big.fString = String(repeating: "é", count: 10_000)
    var value = Google_Protobuf_Value()
    value.structValue.fields = ["a": Google_Protobuf_Value(), "b": value]
    let garbage: [[UInt8]] = [
        [0xff], [0x72, 0x05, 0x61], [0x0a, 0x02, 0x72, 0x05], [0x72, 0x02, 0xc3, 0x28],
        Array(everything.serializedBytes().dropLast(3)),
    ]
    // 200 nested `left` fields: over the recursion limit, rejected before protobuf-c sees it.
    var deep: [UInt8] = []
    for _ in 0..<200 { deep = [0x12] + varint(deep.count) + deep }

    for i in 0..<iterations {
        roundTrip(everything)
        roundTrip(maps)
        roundTrip(tree)
        roundTrip(choices[i % choices.count])
        roundTrip(request)
        roundTrip(CodecSamples.awkward())
        roundTrip(value)
        roundTrip(Codectest_V1_Empty())
        if i % 10 == 0 { roundTrip(big) }
        for g in garbage {
            _ = try? Codectest_V1_Everything(serializedBytes: g)
            _ = try? Codectest_V1_Scalars(serializedBytes: g)
        }
        _ = try? Codectest_V1_Tree(serializedBytes: deep)
    }
}

func bench() {
    var request = Grpc_Testing_SimpleRequest()
    request.payload.body = Array(repeating: 7, count: 64)
    request.responseSize = 64
    let everything = CodecSamples.everything()
    func measure(_ name: String, _ n: Int, _ body: () -> Void) {
        let clock = ContinuousClock()
        let t = clock.measure { for _ in 0..<n { body() } }
        let ns = Double(t.components.seconds) * 1e9 + Double(t.components.attoseconds) / 1e9
        print("\(name): \(Int(ns / Double(n))) ns")
    }
    let requestBytes = request.serializedBytes()
    let everythingBytes = everything.serializedBytes()
    var sink = 0
    measure("encode SimpleRequest(64 B payload)", 1_000_000) { sink &+= request.serializedBytes().count }
    measure("decode SimpleRequest(64 B payload)", 1_000_000) {
        sink &+= (try! Grpc_Testing_SimpleRequest(serializedBytes: requestBytes)).payload.body.count
    }
    measure("encode Everything (\(everythingBytes.count) B)", 100_000) { sink &+= everything.serializedBytes().count }
    measure("decode Everything", 100_000) { sink &+= (try! Codectest_V1_Everything(serializedBytes: everythingBytes)).choices.count }
    if sink == 42 { print(sink) }
}

if CommandLine.arguments.contains("--bench") {
    bench()
} else {
    let n = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 200
    exercise(iterations: n)
    print("protobuf-leakcheck: \(n) iterations done")
}
