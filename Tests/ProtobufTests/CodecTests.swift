import Contracts
import GRPCContracts
import ProtobufTestContracts
import RPCCore
import RPCProtobuf
import Testing

/// Our encoding (Swift value → protobuf-c) against `protoc --encode` of the same message in text
/// format: byte for byte where protobuf fixes the bytes, and through `protoc --decode` where only
/// the order may differ (map entries).
@Suite struct CodecExactnessTests {
    func expectExact<M: ProtoMessage>(
        _ value: M, _ text: String, file: String = Protoc.codecTestProto,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let reference = try Protoc.encode(M.protoMessageName, text, file: file)
        #expect(value.serializedBytes() == reference, "encoding of \(text)", sourceLocation: sourceLocation)
        #expect(try M(serializedBytes: reference) == value, "decoding of \(text)", sourceLocation: sourceLocation)
    }

    @Test func scalars() throws {
        try expectExact(CodecSamples.scalars(), CodecSamples.scalarsText)
    }

    @Test func eachScalarAloneAndDefaultsOmitted() throws {
        var s = Codectest_V1_Scalars()
        try expectExact(s, "")
        #expect(s.serializedBytes() == [])
        s.fInt32 = -1  // ten-byte varint
        try expectExact(s, "f_int32: -1")
        s = Codectest_V1_Scalars()
        s.fUint64 = 1 << 63
        try expectExact(s, "f_uint64: 9223372036854775808")
        s = Codectest_V1_Scalars()
        s.fFloat = .infinity
        try expectExact(s, "f_float: inf")
        s = Codectest_V1_Scalars()
        s.fDouble = -.infinity
        try expectExact(s, "f_double: -inf")
        s = Codectest_V1_Scalars()
        s.fSigned = .small
        try expectExact(s, "f_signed: SIGNED_SMALL")
        s = Codectest_V1_Scalars()
        s.fSigned = .big
        try expectExact(s, "f_signed: SIGNED_BIG")
        s = Codectest_V1_Scalars()
        s.fBytes = Array(repeating: 0xab, count: 300)  // two-byte length prefix
        try expectExact(s, "f_bytes: \"" + String(repeating: "\\253", count: 300) + "\"")
    }

    @Test func nested() throws {
        try expectExact(CodecSamples.nested(), CodecSamples.nestedText)
        var n = Codectest_V1_Nested()
        n.deep = .init()  // present but empty: encoded as an empty submessage
        try expectExact(n, "deep {}")
        #expect(try Codectest_V1_Nested(serializedBytes: n.serializedBytes()).hasDeep)
        #expect(try !Codectest_V1_Nested(serializedBytes: []).hasDeep)
    }

    @Test func repeatedPackedAndUnpacked() throws {
        try expectExact(CodecSamples.repeated(), CodecSamples.repeatedText)
    }

    @Test func oneofs() throws {
        for (value, text) in CodecSamples.choices() {
            try expectExact(value, text)
        }
        var c = Codectest_V1_Choice()
        c.text = "x"
        c.number = 5  // setting another member replaces the first
        #expect(c.value == .number(5))
        #expect(c.text == "")
    }

    @Test func maps() throws {
        let m = CodecSamples.maps()
        let reference = try Protoc.encode(Codectest_V1_Maps.protoMessageName, CodecSamples.mapsText)
        // Entry order is unspecified (we sort keys): compare what protobuf reads from both.
        #expect(
            try Protoc.decode(Codectest_V1_Maps.protoMessageName, m.serializedBytes())
                == Protoc.decode(Codectest_V1_Maps.protoMessageName, reference))
        #expect(try Codectest_V1_Maps(serializedBytes: reference) == m)
        // One entry per map: the bytes are fixed, except that protobuf-c leaves default keys and
        // values out of an entry (proto3 rules) where C++ writes them; both decode alike.
        var single = Codectest_V1_Maps()
        single.stringToInt32 = ["k": 3]
        try expectExact(single, #"string_to_int32 { key: "k" value: 3 }"#)
        single = Codectest_V1_Maps()
        single.int64ToNested = [1: CodecSamples.nested()]
        try expectExact(single, "int64_to_nested { key: 1 value { \(CodecSamples.nestedText) } }")
        single = Codectest_V1_Maps()
        single.stringToInt32 = ["": 0]
        let cxx = try Protoc.encode(Codectest_V1_Maps.protoMessageName, #"string_to_int32 { key: "" value: 0 }"#)
        #expect(try Codectest_V1_Maps(serializedBytes: cxx) == single)
        #expect(try Codectest_V1_Maps(serializedBytes: single.serializedBytes()) == single)
    }

    @Test func mapEncodingIsDeterministic() {
        var m = Codectest_V1_Maps()
        for i in 0..<200 { m.stringToString["k\(i)"] = "v\(i)" }
        let first = m.serializedBytes()
        var copy = Codectest_V1_Maps()
        for i in (0..<200).reversed() { copy.stringToString["k\(i)"] = "v\(i)" }
        #expect(copy.serializedBytes() == first)
    }

    @Test func everythingWithWellKnownTypesFromAnotherModule() throws {
        let e = CodecSamples.everything()
        let reference = try Protoc.encode(
            Codectest_V1_Everything.protoMessageName,
            try Protoc.decode(
                Codectest_V1_Everything.protoMessageName, e.serializedBytes()))
        #expect(e.serializedBytes() == reference)
        #expect(try Codectest_V1_Everything(serializedBytes: reference) == e)
        var partial = Codectest_V1_Everything()
        partial.at.seconds = 5
        partial.maybeName.value = ""
        try expectExact(partial, "at { seconds: 5 } maybe_name {}")
    }

    @Test func keywordNames() throws {
        try expectExact(CodecSamples.awkward(), CodecSamples.awkwardText)
    }

    @Test func emptyMessage() throws {
        try expectExact(Codectest_V1_Empty(), "")
        #expect(try Codectest_V1_Empty(serializedBytes: []) == Codectest_V1_Empty())
        // Unknown fields are accepted (and dropped).
        let withUnknown: [UInt8] = [0x08, 0x01, 0x12, 0x01, 0x61]
        #expect(try Codectest_V1_Empty(serializedBytes: withUnknown) == Codectest_V1_Empty())
    }

    @Test func grpcInteropMessages() throws {
        var r = Grpc_Testing_SimpleRequest()
        r.responseType = .compressable
        r.responseSize = 314_159
        r.payload.body = Array(repeating: 0, count: 271_828)
        r.fillUsername = true
        r.responseStatus.code = 2
        r.responseStatus.message = "error ✓"
        r.expectCompressed.value = false
        let text =
            #"response_size: 314159 payload { body: "\#(String(repeating: "\\000", count: 271_828))" } fill_username: true response_status { code: 2 message: "error \342\234\223" } expect_compressed {}"#
        try expectExact(r, text, file: "grpc/testing/messages.proto")

        var stats = Grpc_Testing_LoadBalancerStatsResponse()
        stats.rpcsByPeer = ["peer": 3]
        var byPeer = Grpc_Testing_LoadBalancerStatsResponse.RpcsByPeer()
        byPeer.rpcsByPeer = ["p": 1]
        stats.rpcsByMethod = ["UnaryCall": byPeer]
        stats.numFailures = 4
        try expectExact(
            stats,
            #"rpcs_by_peer { key: "peer" value: 3 } num_failures: 4 rpcs_by_method { key: "UnaryCall" value { rpcs_by_peer { key: "p" value: 1 } } }"#,
            file: "grpc/testing/messages.proto")
    }

    @Test func wellKnownTypes() throws {
        var ts = Google_Protobuf_Timestamp()
        ts.seconds = -62_135_596_800
        ts.nanos = 999_999_999
        try expectExact(ts, "seconds: -62135596800 nanos: 999999999", file: "google/protobuf/timestamp.proto")
        var d = Google_Protobuf_Duration()
        d.seconds = -1
        d.nanos = -5
        try expectExact(d, "seconds: -1 nanos: -5", file: "google/protobuf/duration.proto")
        var v = Google_Protobuf_Value()
        var list = Google_Protobuf_ListValue()
        var inner = Google_Protobuf_Value()
        inner.nullValue = .nullValue
        var s = Google_Protobuf_Struct()
        var str = Google_Protobuf_Value()
        str.stringValue = "x"
        s.fields = ["a": str]
        var structValue = Google_Protobuf_Value()
        structValue.structValue = s
        list.values = [inner, structValue]
        v.listValue = list
        try expectExact(
            v, #"list_value { values { null_value: NULL_VALUE } values { struct_value { fields { key: "a" value { string_value: "x" } } } } }"#,
            file: "google/protobuf/struct.proto")
        var any = Google_Protobuf_Any()
        any.typeUrl = "type.googleapis.com/google.protobuf.Duration"
        any.value = d.serializedBytes()
        #expect(try Google_Protobuf_Any(serializedBytes: any.serializedBytes()) == any)
    }
}

/// Values protobuf defines but this build does not know.
@Suite struct UnknownValueTests {
    @Test func unknownEnumValuesRoundTrip() throws {
        let bytes = try Protoc.encode(Codectest_V1_Scalars.protoMessageName, "f_color: 99 f_signed: -77")
        let s = try Codectest_V1_Scalars(serializedBytes: bytes)
        #expect(s.fColor == .unrecognized(99))
        #expect(s.fColor.rawValue == 99)
        #expect(s.fColor.protoName == nil)
        #expect(s.fSigned == .unrecognized(-77))
        #expect(s.serializedBytes() == bytes)
        #expect(Codectest_V1_Color(rawValue: 2) == .green)
        #expect(Codectest_V1_Color.green.protoName == "COLOR_GREEN")
        #expect(Codectest_V1_Color.allCases == [.unspecified, .red, .green, .blue])
        #expect(Codectest_V1_Signed.aliasOfZero == .zero)
        #expect(Codectest_V1_Signed() == .zero)
    }

    @Test func unknownEnumInRepeatedMapAndOneof() throws {
        let text = "r_color: [1, 1000, -1]"
        let bytes = try Protoc.encode(Codectest_V1_Repeated.protoMessageName, text)
        let r = try Codectest_V1_Repeated(serializedBytes: bytes)
        #expect(r.rColor == [.red, .unrecognized(1000), .unrecognized(-1)])
        #expect(r.serializedBytes() == bytes)
        let mapBytes = try Protoc.encode(Codectest_V1_Maps.protoMessageName, "uint32_to_color { key: 4 value: 12345 }")
        #expect(try Codectest_V1_Maps(serializedBytes: mapBytes).uint32ToColor == [4: .unrecognized(12345)])
        let choiceBytes = try Protoc.encode(Codectest_V1_Choice.protoMessageName, "color: 8")
        #expect(try Codectest_V1_Choice(serializedBytes: choiceBytes).value == .color(.unrecognized(8)))
    }

    @Test func unknownFieldsAreSkipped() throws {
        // A newer Nested with field 99 (string) and 100 (fixed64).
        var bytes = CodecSamples.nested().serializedBytes()
        bytes += [0x9a, 0x06, 0x02, 0x68, 0x69, 0xa1, 0x06, 1, 2, 3, 4, 5, 6, 7, 8]
        #expect(try Codectest_V1_Nested(serializedBytes: bytes) == CodecSamples.nested())
    }
}

/// protobuf-c's representation limits, pinned so a change is noticed (see docs/codegen.md).
@Suite struct ProtobufCLimitsTests {
    @Test func negativeZeroIsADefault() throws {
        // protobuf-c compares floats with 0, so -0.0 counts as the default and is not written.
        var s = Codectest_V1_Scalars()
        s.fDouble = -0.0
        #expect(s.serializedBytes() == [])
        // Decoding C++'s encoding keeps the sign.
        let cxx = try Protoc.encode(Codectest_V1_Scalars.protoMessageName, "f_double: -0.0")
        #expect(try Codectest_V1_Scalars(serializedBytes: cxx).fDouble.sign == .minus)
    }

    @Test func stringsEndAtNUL() throws {
        // protobuf-c strings are NUL-terminated `char *`.
        var s = Codectest_V1_Scalars()
        s.fString = "a\u{0}b"
        #expect(try Codectest_V1_Scalars(serializedBytes: s.serializedBytes()).fString == "a")
        let cxx = try Protoc.encode(Codectest_V1_Scalars.protoMessageName, #"f_string: "a\000b""#)
        #expect(try Codectest_V1_Scalars(serializedBytes: cxx).fString == "a")
    }
}

/// Bad input must fail the decode (`MessageDecodingError`), never crash.
@Suite struct MalformedInputTests {
    func expectRejected<M: ProtoMessage>(_ type: M.Type, _ bytes: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(throws: MessageDecodingError.self, sourceLocation: sourceLocation) { try M(serializedBytes: bytes) }
    }

    @Test func garbage() {
        expectRejected(Codectest_V1_Scalars.self, [0xff])  // truncated tag varint
        expectRejected(Codectest_V1_Scalars.self, [0x08])  // tag without value
        expectRejected(Codectest_V1_Scalars.self, [0x08, 0x80])  // unterminated varint
        expectRejected(Codectest_V1_Scalars.self, [0x0f, 0x00])  // wire type 7
        expectRejected(Codectest_V1_Scalars.self, [0x72, 0x05, 0x61])  // string longer than the input
        expectRejected(Codectest_V1_Scalars.self, [0x3d, 0x01])  // fixed32 cut short
        expectRejected(Codectest_V1_Scalars.self, [0x08] + Array(repeating: 0xff, count: 11))  // varint too long
        expectRejected(Codectest_V1_Everything.self, [0x0a, 0x02, 0x72, 0x05])  // bad submessage
        expectRejected(Grpc_Health_V1_HealthCheckRequest.self, [0x0a, 0x03, 0x61, 0x62])
    }

    @Test func invalidUTF8InStrings() {
        expectRejected(Codectest_V1_Scalars.self, [0x72, 0x02, 0xc3, 0x28])
        expectRejected(Codectest_V1_Repeated.self, [0x72, 0x01, 0xff])
        expectRejected(Codectest_V1_Choice.self, [0x1a, 0x01, 0x80])
        expectRejected(Codectest_V1_Maps.self, [0x0a, 0x03, 0x0a, 0x01, 0xfe])
        // bytes fields take anything.
        #expect(throws: Never.self) { try Codectest_V1_Scalars(serializedBytes: [0x7a, 0x02, 0xc3, 0x28]) }
    }

    /// What a client is told: the field (with its path through nested messages) and what was wrong.
    func problem<M: ProtoMessage>(_ type: M.Type, _ bytes: [UInt8]) -> String? {
        do {
            _ = try M(serializedBytes: bytes)
            return "decoded"
        } catch let e as MessageDecodingError {
            #expect(e.description.hasPrefix("could not decode \(M.protoMessageName)"))
            return e.problem
        } catch {
            return "\(error)"
        }
    }

    @Test func decodeErrorsNameTheFieldAndTheProblem() {
        typealias Mark = Social_V1_MarkNotificationsReadRequest  // 1: repeated string, 2: Timestamp
        #expect(problem(Mark.self, [0x10, 0x01]) == "field read_up_to: expected a length-delimited value, got a varint")
        #expect(problem(Mark.self, [0x12, 0x02, 0x0a, 0x00]) == "field read_up_to.seconds: expected a varint, got a length-delimited value")
        #expect(problem(Mark.self, [0x12, 0x02, 0x08, 0x80]) == "field read_up_to.seconds: its varint is cut short or longer than 10 bytes")
        #expect(problem(Mark.self, [0x0a, 0x02, 0xff, 0xfe]) == "field notification_ids: not valid UTF-8")
        #expect(problem(Mark.self, [0x0a, 0x05, 0x61]) == "field notification_ids: its length (5 bytes) runs past the end of the message (1 left)")
        #expect(problem(Mark.self, [0x12, 0x03, 0x08, 0x01]) == "field read_up_to: its length (3 bytes) runs past the end of the message (2 left)")
        #expect(problem(Mark.self, [0x1b]) == "field <field 3>: wire type 3 is not supported (proto3 has no groups)")
        #expect(problem(Mark.self, [0x00, 0x00]) == "field number 0 at byte 0 of the message is not valid")
        #expect(problem(Mark.self, [0x80]) == "the field tag at byte 0 of the message is cut short")
        // The malformed inputs above, on the codec's own test messages, are all explained.
        for (bytes, expected) in [
            ([0x08] as [UInt8], "field f_int32: its varint is cut short or longer than 10 bytes"),
            ([0x0f, 0x00], "field f_int32: wire type 7 is not supported (proto3 has no groups)"),
            ([0x72, 0x02, 0xc3, 0x28], "field f_string: not valid UTF-8"),
            ([0x3d, 0x01], "field f_fixed32: its 4-byte value is cut short"),
        ] {
            #expect(problem(Codectest_V1_Scalars.self, bytes) == expected)
        }
    }

    @Test func randomBytesNeverCrash() {
        var rng = SplitMix64(seed: 42)
        var decoded = 0
        for i in 0..<20_000 {
            let n = Int(rng.next() % 64)
            var bytes = (0..<n).map { _ in UInt8(truncatingIfNeeded: rng.next()) }
            if i % 2 == 0, !bytes.isEmpty {
                // Mutate a valid message instead: far more likely to reach deep parser paths.
                bytes = CodecSamples.everything().serializedBytes()
                let at = Int(rng.next() % UInt64(bytes.count))
                bytes[at] = UInt8(truncatingIfNeeded: rng.next())
                if rng.next() % 2 == 0 { bytes.removeLast(Int(rng.next() % UInt64(bytes.count))) }
            }
            if let e = try? Codectest_V1_Everything(serializedBytes: bytes) {
                decoded += 1
                _ = e.serializedBytes()
            }
            _ = try? Codectest_V1_Tree(serializedBytes: bytes)
            _ = try? Google_Protobuf_Value(serializedBytes: bytes)
        }
        #expect(decoded > 0)
    }

    @Test func recursionDepthIsLimited() throws {
        // Within the limit: fine, and equal after a round trip.
        let t = CodecSamples.tree(depth: 60)
        #expect(try Codectest_V1_Tree(serializedBytes: t.serializedBytes()) == t)
        // 100 000 levels of `left { ... }`: rejected before protobuf-c recurses.
        expectRejected(Codectest_V1_Tree.self, nest(100_000, [[0x12]]))
        // Through a struct.proto Value (recursion via oneof and repeated): rejected too.
        expectRejected(Google_Protobuf_Value.self, nest(50_000, [[0x0a], [0x32]]))
        // Just below and just above the limit of 100 nested messages.
        #expect(throws: Never.self) { try Codectest_V1_Tree(serializedBytes: nest(100, [[0x12]])) }
        expectRejected(Codectest_V1_Tree.self, nest(101, [[0x12]]))
    }

    /// `levels` nested length-delimited fields, cycling through `tags` from the inside out,
    /// built back to front in linear time.
    func nest(_ levels: Int, _ tags: [[UInt8]]) -> [UInt8] {
        var reversed: [UInt8] = []
        for i in 0..<levels {
            reversed += varint(reversed.count).reversed()
            reversed += tags[i % tags.count].reversed()
        }
        return reversed.reversed()
    }

    func varint(_ n: Int) -> [UInt8] {
        var n = UInt64(n)
        var out: [UInt8] = []
        while n >= 0x80 {
            out.append(UInt8(n & 0x7f) | 0x80)
            n >>= 7
        }
        out.append(UInt8(n))
        return out
    }
}

struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}
