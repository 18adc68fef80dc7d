import GRPCContracts
import RPCCore
import Testing

@testable import ServiceKit

/// Times, spans and numbers a client sends: checked for range before arithmetic, and the
/// conversions defined for every input (issue 35: `read_up_to.seconds` past Int64.max / 1000
/// trapped social-service with SIGILL).
@Suite struct TimeRulesTests {
    static func ts(_ seconds: Int64, _ nanos: Int32 = 0) -> Google_Protobuf_Timestamp {
        var t = Google_Protobuf_Timestamp()
        t.seconds = seconds
        t.nanos = nanos
        return t
    }

    static func span(_ seconds: Int64, _ nanos: Int32 = 0) -> Google_Protobuf_Duration {
        var d = Google_Protobuf_Duration()
        d.seconds = seconds
        d.nanos = nanos
        return d
    }

    @Test func timestampsWithinTheDocumentedRangeAreMilliseconds() {
        var e = FieldErrors()
        #expect(FieldRules.timestamp(Self.ts(1_700_000_000, 123_456_789), field: "at", into: &e) == 1_700_000_000_123)
        #expect(FieldRules.timestamp(Self.ts(-62_135_596_800), field: "at", into: &e) == -62_135_596_800_000)  // 0001-01-01T00:00:00Z
        // 9999-12-31T23:59:59.999999999Z
        #expect(FieldRules.timestamp(Self.ts(253_402_300_799, 999_999_999), field: "at", into: &e) == 253_402_300_799_999)
        #expect(e.isEmpty)
    }

    @Test func timestampsOutsideTheRangeNameTheirPart() {
        var e = FieldErrors()
        FieldRules.timestamp(Self.ts(9_223_372_036_854_776), field: "read_up_to", into: &e)  // the fuzzer's request
        FieldRules.timestamp(Self.ts(.min), field: "a", into: &e)
        FieldRules.timestamp(Self.ts(253_402_300_800), field: "year_10000", into: &e)
        FieldRules.timestamp(Self.ts(-62_135_596_801), field: "year_0", into: &e)
        FieldRules.timestamp(Self.ts(0, 1_000_000_000), field: "b", into: &e)
        FieldRules.timestamp(Self.ts(0, -1), field: "c", into: &e)
        FieldRules.timestamp(Self.ts(.max, .min), field: "d", into: &e)
        #expect(
            e.violations.map(\.field) == [
                "read_up_to.seconds", "a.seconds", "year_10000.seconds", "year_0.seconds", "b.nanos", "c.nanos", "d.seconds", "d.nanos",
            ])
        #expect(e.error().code == .invalidArgument)
    }

    @Test func aTimestampsOwnRangeIsCheckedAfterTheDocumentedOne() {
        var e = FieldErrors()
        let ms = FieldRules.timestamp(Self.ts(10), field: "at", range: 0...5_000, rule: "must be in the first 5 s", into: &e)
        #expect(ms == 10_000)
        #expect(e.violations.map(\.field) == ["at"] && e.violations[0].description == "must be in the first 5 s")
    }

    @Test func durationsFollowGoogleProtobufDurationThenTheMethodsRange() {
        var e = FieldErrors()
        #expect(FieldRules.duration(Self.span(90, 500_000_000), field: "d", into: &e) == 90_500)
        #expect(FieldRules.duration(Self.span(-1, -500_000_000), field: "d", into: &e) == -1_500)
        #expect(FieldRules.duration(Self.span(315_576_000_000), field: "d", into: &e) == 315_576_000_000_000)
        #expect(e.isEmpty)
        FieldRules.duration(Self.span(.max), field: "big", into: &e)
        FieldRules.duration(Self.span(.min, .min), field: "small", into: &e)
        FieldRules.duration(Self.span(1, -1), field: "signs", into: &e)
        FieldRules.duration(Self.span(0, 1_000_000_000), field: "nanos", into: &e)
        let clamped = FieldRules.duration(
            Self.span(8 * 86_400), field: "snooze", range: 60_000...604_800_000, rule: "must be 1 minute to 7 days", into: &e)
        #expect(clamped == 604_800_000)
        #expect(e.violations.map(\.field) == ["big.seconds", "small.seconds", "small.nanos", "signs.nanos", "nanos.nanos", "snooze"])
        #expect(e.violations.last?.description == "must be 1 minute to 7 days")
    }

    @Test func numbersOutsideTheirRangeAreNamedAndClamped() {
        var e = FieldErrors()
        #expect(FieldRules.number(Int64(5), field: "n", 1...10, into: &e) == 5)
        #expect(e.isEmpty)
        #expect(
            FieldRules.number(Int64.max, field: "amount_cents", 1...1_000_000_000, rule: "must be 1 to 1000000000 cents", into: &e) == 1_000_000_000)
        #expect(FieldRules.number(Int32.min, field: "count", 0...100, into: &e) == 0)
        #expect(e.violations.map(\.field) == ["amount_cents", "count"])
        #expect(e.violations[1].description == "must be 0 to 100")
    }

    /// The second line of defence: the conversions themselves never trap. Before the fix the
    /// first `milliseconds` here stopped the test process with an overflow trap.
    @Test func conversionsSaturateInsteadOfTrapping() {
        #expect(Self.ts(9_223_372_036_854_776).milliseconds == .max)
        #expect(Self.ts(-9_223_372_036_854_776).milliseconds == .min)
        #expect(Self.ts(.max, .max).milliseconds == .max)
        #expect(Self.ts(.min, .min).milliseconds == .min)
        #expect(Self.ts(9_223_372_036_854_775, 999_999_999).milliseconds == .max)  // 775,807 ms + 999 ms overflows the add
        #expect(Self.ts(1, 5_000_000).milliseconds == 1_005)

        for ms: Int64 in [.min, .min + 1, -1_001, -1, 0, 1, 999, 1_000, .max - 1, .max] {
            let t = Google_Protobuf_Timestamp(milliseconds: ms)
            #expect((0...999_000_000).contains(t.nanos))
            #expect(t.milliseconds == ms)
        }
        #expect(Google_Protobuf_Timestamp(milliseconds: -1).seconds == -1)
        #expect(Google_Protobuf_Timestamp(milliseconds: -1).nanos == 999_000_000)

        #expect(Duration.seconds(Int64.max).milliseconds == .max)
        #expect(Duration.seconds(Int64.min).milliseconds == .min)
        #expect(Duration.milliseconds(-1_500).milliseconds == -1_500)
    }
}
