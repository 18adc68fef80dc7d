import Contracts
import Foundation
import GRPCContracts
import ProtobufTestContracts
import RPCCore
import Testing

@testable import Gateway

@Suite struct TranscoderTests {
    static let transcoder: JSONTranscoder = {
        let set = Gateway.descriptors.merging(ProtobufTestContractsDescriptors.descriptorSet)
        return JSONTranscoder(registry: try! SchemaRegistry(set))
    }()

    /// A malformed binary message names the failing field by its whole path, though decoding
    /// builds the path only when something fails.
    @Test func decodingErrorsNameTheWholePath() {
        // A key whose key_id says 5 bytes where 1 follows: the key cannot be read.
        let bad: [UInt8] = [0x0A, 0x03, 0x0A, 0x05, 0x41]
        let badSecond: [UInt8] = [0x0A, 0x00, 0x0A, 0x03, 0x0A, 0x05, 0x41]
        for (bytes, path) in [(bad, "keys[0]"), (badSecond, "keys[1]")] {
            do {
                _ = try Self.transcoder.decode(bytes, as: "accounts.v1.GetSigningKeysResponse")
                Issue.record("decoded malformed bytes")
            } catch {
                #expect(error.field == path, "\(error)")
            }
        }
    }

    /// The JSON of `m`; the direct writer (`decode`) must give exactly what serializing the value
    /// tree (`decodeValue`, used for error details) gives, for every message the tests show.
    func toJSON<M: ProtoMessage>(_ m: M) throws -> String {
        let direct = try Self.transcoder.decode(m.serializedBytes(), as: M.protoMessageName)
        let viaTree = JSONWriter.serialize(try Self.transcoder.decodeValue(m.serializedBytes()[...], as: M.protoMessageName))
        #expect(direct == viaTree)
        return String(decoding: direct, as: UTF8.self)
    }
    func fromJSON<M: ProtoMessage>(_ s: String, as: M.Type = M.self) throws -> M {
        try M(serializedBytes: try Self.transcoder.encode(json: Array(s.utf8), as: M.protoMessageName))
    }
    /// binary → JSON → binary gives the same message.
    func roundTrip<M: ProtoMessage>(_ m: M, sourceLocation: SourceLocation = #_sourceLocation) throws {
        let j = try toJSON(m)
        let back: M = try fromJSON(j)
        #expect(back == m, "\(j)", sourceLocation: sourceLocation)
    }

    @Test func scalarsFollowTheProto3JSONMapping() throws {
        let j = try toJSON(CodecSamples.scalars())
        #expect(
            j
                == #"{"fInt32":-42,"fInt64":"-9000000000","fUint32":4000000000,"fUint64":"18000000000000000000","fSint32":-2147483648,"fSint64":"-9223372036854775808","fFixed32":4294967295,"fFixed64":"1","fSfixed32":-7,"fSfixed64":"9223372036854775807","fBool":true,"fFloat":1.5,"fDouble":-2.25e+300,"fString":"héllo, wörld ✓ 🎉","fBytes":"AAEC/4B/","fColor":"COLOR_BLUE","fSigned":"SIGNED_MINUS_ONE"}"#
        )
        try roundTrip(CodecSamples.scalars())
        #expect(try toJSON(Codectest_V1_Scalars()) == "{}", "defaults are left out")
    }

    @Test func everySampleRoundTrips() throws {
        try roundTrip(CodecSamples.repeated())
        try roundTrip(CodecSamples.maps())
        for (c, _) in CodecSamples.choices() { try roundTrip(c) }
        try roundTrip(CodecSamples.everything())
        try roundTrip(CodecSamples.tree(depth: 30))
        try roundTrip(CodecSamples.awkward())
        try roundTrip(CodecSamples.nested())
    }

    @Test func mapsRepeatedAndOneofs() throws {
        var m = Codectest_V1_Maps()
        m.boolToBytes = [true: [1]]
        m.int32ToString = [-2: "b"]
        m.uint64ToUint64 = [UInt64.max: 1]
        #expect(try toJSON(m) == #"{"int32ToString":{"-2":"b"},"boolToBytes":{"true":"AQ=="},"uint64ToUint64":{"18446744073709551615":"1"}}"#)
        var r = Codectest_V1_Repeated()
        r.rColor = [.red, .unrecognized(42)]
        r.rFloat = [0.1]
        #expect(try toJSON(r) == #"{"rFloat":[0.1],"rColor":["COLOR_RED",42]}"#)
        var c = Codectest_V1_Choice()
        c.value = .number(0)
        #expect(try toJSON(c) == #"{"number":0}"#, "a set oneof member is shown even at its default")
        #expect(throws: TranscodingError.self) { let _: Codectest_V1_Choice = try fromJSON(#"{"number":1,"text":"x"}"#) }
    }

    @Test func inputAcceptsTheLenientForms() throws {
        let s: Codectest_V1_Scalars = try fromJSON(
            #"{"f_int32":"7","fInt64":12,"fUint64":"1e3","f_float":"NaN","fDouble":"-Infinity","fBytes":"_-8","fColor":2,"f_signed":"SIGNED_BIG","fBool":false}"#
        )
        #expect(s.fInt32 == 7 && s.fInt64 == 12 && s.fUint64 == 1000)
        #expect(s.fFloat.isNaN && s.fDouble == -.infinity)
        #expect(s.fBytes == [0xFF, 0xEF])
        #expect(s.fColor == .green && s.fSigned == .big)
        let nulls: Codectest_V1_Everything = try fromJSON(#"{"scalars":null,"maybeName":null,"choices":[]}"#)
        #expect(nulls == Codectest_V1_Everything())
    }

    @Test func badInputNamesTheField() throws {
        func error(_ json: String) -> TranscodingError? {
            do { let _: Codectest_V1_Everything = try fromJSON(json); return nil } catch let e as TranscodingError { return e } catch { return nil }
        }
        #expect(error(#"{"bogus":1}"#)?.field == "bogus")
        #expect(error(#"{"scalars":{"fInt32":1.5}}"#)?.field == "scalars.f_int32")
        #expect(error(#"{"scalars":{"fInt32":3000000000}}"#)?.field == "scalars.f_int32")
        #expect(error(#"{"scalars":{"fColor":"PURPLE"}}"#)?.field == "scalars.f_color")
        #expect(error(#"{"scalars":{"fBytes":"***"}}"#)?.field == "scalars.f_bytes")
        #expect(error(#"{"repeated":{"rNested":[{},{"nope":1}]}}"#)?.field == "repeated.r_nested[1].nope")
        #expect(error(#"{"maps":{"int32ToString":{"x":"y"}}}"#)?.field == #"maps.int32_to_string["x"]"#)
        #expect(error(#"{"at":"yesterday"}"#)?.field == "at")
        #expect(error(#"{"scalars":{"fInt32":1,"f_int32":2}}"#) != nil, "one field under two names")
        #expect(error(#"{"scalars":[]}"#)?.field == "scalars")
        #expect(error(#"{"a":1,"a":2}"#) != nil, "duplicate keys")
        #expect(error(String(repeating: "[", count: 200)) != nil)
        #expect(error("") != nil)
    }

    @Test func wellKnownTypes() throws {
        var e = Codectest_V1_Everything()
        e.at.seconds = 1_700_000_000
        e.at.nanos = 5_000_000
        e.maybeName.value = ""
        #expect(try toJSON(e) == #"{"at":"2023-11-14T22:13:20.005Z","maybeName":""}"#)
        let parsed: Codectest_V1_Everything = try fromJSON(#"{"at":"2023-11-15T00:13:20.005+02:00","maybeName":"x"}"#)
        #expect(parsed.at.seconds == 1_700_000_000 && parsed.at.nanos == 5_000_000)
        #expect(parsed.maybeName.value == "x")
        for (secs, nanos, text) in [
            (Int64(0), Int32(0), "1970-01-01T00:00:00Z"), (-1, 999_999_999, "1969-12-31T23:59:59.999999999Z"),
            (253_402_300_799, 0, "9999-12-31T23:59:59Z"), (-62_135_596_800, 1000, "0001-01-01T00:00:00.000001Z"),
        ] {
            #expect(JSONTranscoder.formatTimestamp(secs, nanos) == text)
            #expect(JSONTranscoder.parseTimestamp(text).map { [$0.0, Int64($0.1)] } == [secs, Int64(nanos)])
        }
        #expect(JSONTranscoder.parseTimestamp("2023-02-29T00:00:00Z") == nil)
        #expect(JSONTranscoder.parseTimestamp("2023-01-01 00:00:00Z") == nil)
        for (secs, nanos, text) in [(Int64(1), Int32(500_000_000), "1.500s"), (0, 0, "0s"), (-3, -1, "-3.000000001s"), (0, -20_000_000, "-0.020s")] {
            #expect(JSONTranscoder.formatDuration(secs, nanos) == text)
            #expect(JSONTranscoder.parseDuration(text).map { [$0.0, Int64($0.1)] } == [secs, Int64(nanos)])
        }
        #expect(JSONTranscoder.parseDuration("1.5") == nil)

        // Duration, bytes and repeated messages in a real contract.
        var keys = Accounts_V1_GetSigningKeysResponse()
        var k = Accounts_V1_SigningKey()
        k.keyId = "k1"
        k.algorithm = .ed25519
        k.publicKey = [1, 2, 3]
        keys.keys = [k]
        keys.cacheFor.seconds = 300
        #expect(try toJSON(keys) == #"{"keys":[{"keyId":"k1","algorithm":"SIGNING_ALGORITHM_ED25519","publicKey":"AQID"}],"cacheFor":"300s"}"#)
        try roundTrip(keys)
    }

    @Test func structValueAnyAndFieldMask() throws {
        let doc = #"{"a":[1,"x",true,null,{"b":{}}],"c":-2.5}"#
        let s: Google_Protobuf_Struct = try fromJSON(doc)
        #expect(try toJSON(s) == doc)
        var mask = Google_Protobuf_FieldMask()
        mask.paths = ["display_name", "contact_info.phone_number"]
        #expect(try toJSON(mask) == #""displayName,contactInfo.phoneNumber""#)
        try roundTrip(mask)

        var bad = Google_Rpc_BadRequest()
        var v = Google_Rpc_BadRequest.FieldViolation()
        v.field = "email"
        v.description_p = "taken"
        bad.fieldViolations = [v]
        var status = Google_Rpc_Status()
        status.code = 3
        var any = Google_Protobuf_Any()
        any.typeUrl = "type.googleapis.com/google.rpc.BadRequest"
        any.value = bad.serializedBytes()
        status.details = [any]
        let j = try toJSON(status)
        #expect(
            j
                == #"{"code":3,"details":[{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"email","description":"taken"}]}]}"#
        )
        try roundTrip(status)
        var wrapped = Google_Protobuf_Any()
        var d = Google_Protobuf_Duration()
        d.seconds = 2
        wrapped.typeUrl = "type.googleapis.com/google.protobuf.Duration"
        wrapped.value = d.serializedBytes()
        #expect(try toJSON(wrapped) == #"{"@type":"type.googleapis.com/google.protobuf.Duration","value":"2s"}"#)
        try roundTrip(wrapped)
    }

    @Test func healthResponse() throws {
        var r = Grpc_Health_V1_HealthCheckResponse()
        r.status = .serving
        #expect(try toJSON(r) == #"{"status":"SERVING"}"#)
        let req: Grpc_Health_V1_HealthCheckRequest = try fromJSON("{}")
        #expect(req == Grpc_Health_V1_HealthCheckRequest())
    }
}
