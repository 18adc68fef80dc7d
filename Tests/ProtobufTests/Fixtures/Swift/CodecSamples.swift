import GRPCContracts

/// Sample values of every field kind, with their text-format equivalents, shared by ProtobufTests
/// (which compares our encoding with `protoc --encode` of the text) and protobuf-leakcheck.
public enum CodecSamples {
    public static func scalars() -> Codectest_V1_Scalars {
        var s = Codectest_V1_Scalars()
        s.fInt32 = -42
        s.fInt64 = -9_000_000_000
        s.fUint32 = 4_000_000_000
        s.fUint64 = 18_000_000_000_000_000_000
        s.fSint32 = -2_147_483_648
        s.fSint64 = Int64.min
        s.fFixed32 = UInt32.max
        s.fFixed64 = 1
        s.fSfixed32 = -7
        s.fSfixed64 = Int64.max
        s.fBool = true
        s.fFloat = 1.5
        s.fDouble = -2.25e300
        s.fString = "héllo, wörld ✓ 🎉"
        s.fBytes = [0, 1, 2, 0xff, 0x80, 0x7f]
        s.fColor = .blue
        s.fSigned = .minusOne
        return s
    }

    public static let scalarsText = #"""
        f_int32: -42 f_int64: -9000000000 f_uint32: 4000000000 f_uint64: 18000000000000000000
        f_sint32: -2147483648 f_sint64: -9223372036854775808 f_fixed32: 4294967295 f_fixed64: 1
        f_sfixed32: -7 f_sfixed64: 9223372036854775807 f_bool: true f_float: 1.5 f_double: -2.25e300
        f_string: "h\303\251llo, w\303\266rld \342\234\223 \360\237\216\211"
        f_bytes: "\000\001\002\377\200\177" f_color: COLOR_BLUE f_signed: SIGNED_MINUS_ONE
        """#

    public static func nested() -> Codectest_V1_Nested {
        var n = Codectest_V1_Nested()
        n.id = 7
        n.label = "seven"
        n.level = .high
        n.deep.notes = ["a", "", "c"]
        return n
    }

    public static let nestedText = #"id: 7 label: "seven" level: LEVEL_HIGH deep { notes: "a" notes: "" notes: "c" }"#

    public static func repeated() -> Codectest_V1_Repeated {
        var r = Codectest_V1_Repeated()
        r.rInt32 = [0, 1, -1, Int32.max, Int32.min]
        r.rInt64 = [0, -1, Int64.max]
        r.rUint32 = [0, 300, UInt32.max]
        r.rUint64 = [UInt64.max, 0]
        r.rSint32 = [-1, 1, -64]
        r.rSint64 = [Int64.min, 5]
        r.rFixed32 = [1, 2]
        r.rFixed64 = [3]
        r.rSfixed32 = [-3, 3]
        r.rSfixed64 = [-4]
        r.rBool = [true, false, true]
        r.rFloat = [0.5, -0.25]
        r.rDouble = [1e-300, 0]
        r.rString = ["x", "", "ÿ"]
        r.rBytes = [[], [0], [1, 2]]
        r.rColor = [.red, .unspecified, .unrecognized(42)]
        r.rNested = [nested(), Codectest_V1_Nested()]
        r.rUnpackedInt32 = [5, 0, -5]
        r.rSigned = [.small, .big, .zero]
        r.rEmpty = [Codectest_V1_Empty(), Codectest_V1_Empty()]
        return r
    }

    public static let repeatedText = #"""
        r_int32: [0, 1, -1, 2147483647, -2147483648] r_int64: [0, -1, 9223372036854775807]
        r_uint32: [0, 300, 4294967295] r_uint64: [18446744073709551615, 0] r_sint32: [-1, 1, -64]
        r_sint64: [-9223372036854775808, 5] r_fixed32: [1, 2] r_fixed64: [3] r_sfixed32: [-3, 3]
        r_sfixed64: [-4] r_bool: [true, false, true] r_float: [0.5, -0.25] r_double: [1e-300, 0]
        r_string: ["x", "", "\303\277"] r_bytes: ["", "\000", "\001\002"] r_color: [COLOR_RED, COLOR_UNSPECIFIED, 42]
        r_nested { id: 7 label: "seven" level: LEVEL_HIGH deep { notes: "a" notes: "" notes: "c" } } r_nested {}
        r_unpacked_int32: [5, 0, -5] r_signed: [SIGNED_SMALL, SIGNED_BIG, SIGNED_ZERO] r_empty {} r_empty {}
        """#

    public static func maps() -> Codectest_V1_Maps {
        var m = Codectest_V1_Maps()
        m.stringToInt32 = ["one": 1, "two": 2, "minus": -1]
        m.int32ToString = [1: "a", -2: "b"]
        m.int64ToNested = [5: nested(), 6: Codectest_V1_Nested()]
        m.boolToBytes = [true: [1, 2], false: [3]]
        m.uint32ToColor = [1: .green, 2: .unrecognized(77)]
        m.sint64ToDouble = [-3: 0.5]
        m.fixed32ToFloat = [9: -1.5]
        m.sfixed64ToBool = [-9: true]
        m.uint64ToUint64 = [UInt64.max: 1]
        m.sint32ToSint32 = [-5: -6]
        m.fixed64ToFixed64 = [8: 9]
        m.sfixed32ToEmpty = [-1: Codectest_V1_Empty()]
        m.stringToString = ["k": "v", "é": "ü"]
        return m
    }

    public static let mapsText = #"""
        string_to_int32 { key: "one" value: 1 } string_to_int32 { key: "two" value: 2 }
        string_to_int32 { key: "minus" value: -1 }
        int32_to_string { key: 1 value: "a" } int32_to_string { key: -2 value: "b" }
        int64_to_nested { key: 5 value { id: 7 label: "seven" level: LEVEL_HIGH deep { notes: "a" notes: "" notes: "c" } } }
        int64_to_nested { key: 6 value {} }
        bool_to_bytes { key: true value: "\001\002" } bool_to_bytes { key: false value: "\003" }
        uint32_to_color { key: 1 value: COLOR_GREEN } uint32_to_color { key: 2 value: 77 }
        sint64_to_double { key: -3 value: 0.5 } fixed32_to_float { key: 9 value: -1.5 }
        sfixed64_to_bool { key: -9 value: true } uint64_to_uint64 { key: 18446744073709551615 value: 1 }
        sint32_to_sint32 { key: -5 value: -6 } fixed64_to_fixed64 { key: 8 value: 9 }
        sfixed32_to_empty { key: -1 value {} }
        string_to_string { key: "k" value: "v" } string_to_string { key: "\303\251" value: "\303\274" }
        """#

    /// Each oneof member set in turn (default values included: presence is what a oneof carries),
    /// with its text format.
    public static func choices() -> [(Codectest_V1_Choice, String)] {
        func make(_ v: Codectest_V1_Choice.OneOf_Value?, _ o: Codectest_V1_Choice.OneOf_Other? = nil) -> Codectest_V1_Choice {
            var c = Codectest_V1_Choice()
            c.name = "c"
            c.value = v
            c.other = o
            return c
        }
        return [
            (make(nil), #"name: "c""#),
            (make(.number(0)), #"name: "c" number: 0"#),
            (make(.number(-3)), #"name: "c" number: -3"#),
            (make(.text("")), #"name: "c" text: """#),
            (make(.text("t")), #"name: "c" text: "t""#),
            (make(.blob([])), #"name: "c" blob: """#),
            (make(.blob([9])), #"name: "c" blob: "\011""#),
            (make(.color(.unspecified)), #"name: "c" color: COLOR_UNSPECIFIED"#),
            (make(.color(.unrecognized(-5))), #"name: "c" color: -5"#),
            (make(.nested(Codectest_V1_Nested())), #"name: "c" nested {}"#),
            (make(.nested(nested())), #"name: "c" nested { id: 7 label: "seven" level: LEVEL_HIGH deep { notes: "a" notes: "" notes: "c" } }"#),
            (make(.flag(false)), #"name: "c" flag: false"#),
            (make(.real(0)), #"name: "c" real: 0"#),
            (make(.nothing(Codectest_V1_Empty())), #"name: "c" nothing {}"#),
            (make(.flag(true), .big(0)), #"name: "c" flag: true big: 0"#),
            (make(nil, .word("w")), #"name: "c" word: "w""#),
        ]
    }

    public static func everything() -> Codectest_V1_Everything {
        var e = Codectest_V1_Everything()
        e.scalars = scalars()
        e.repeated = repeated()
        e.choice = choices()[10].0
        e.nested = nested()
        e.at.seconds = 1_700_000_000
        e.at.nanos = 123_456_789
        e.maybeName.value = ""
        e.choices = choices().map(\.0)
        e.empty = Codectest_V1_Empty()
        return e
    }

    /// A tree `depth` levels deep, each level holding the one below through a different kind of
    /// edge (singular field, repeated, map, oneof), plus small siblings.
    public static func tree(depth: Int) -> Codectest_V1_Tree {
        var t = Codectest_V1_Tree()
        t.name = "leaf"
        for i in 0..<depth {
            var parent = Codectest_V1_Tree()
            parent.name = "n\(i)"
            switch i % 5 {
            case 0: parent.left = t
            case 1: parent.children = [t, Codectest_V1_Tree()]
            case 2: parent.named = ["k": t]
            case 3: parent.alternative = t
            default:
                var forest = Codectest_V1_Forest()
                forest.first = t
                forest.trees = [Codectest_V1_Tree()]
                parent.forest = forest
            }
            parent.right.name = "r"
            t = parent
        }
        return t
    }

    public static func awkward() -> Codectest_V1_Awkward {
        var a = Codectest_V1_Awkward()
        a.default = 1
        a.class = "c"
        a.in = true
        a.self_p = 4
        a.type.id = 5
        a.hasType_p = true
        a.protocol = ["p"]
        a.description_p = 8
        a.serializedBytes_p = "s"
        a.return = 10
        a.switch = "w"
        a.theType.x = 12
        return a
    }

    public static let awkwardText = #"""
        default: 1 class: "c" in: true self: 4 type { id: 5 } has_type: true protocol: "p" description: 8
        serialized_bytes: "s" return: 10 switch: "w" the_type { x: 12 }
        """#
}
