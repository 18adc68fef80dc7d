/// The well-known types whose JSON form is not an object of their fields.
extension JSONTranscoder {
    static let wrappers: Set<String> = [
        "google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
        "google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
        "google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue",
    ]
    /// Types whose JSON inside an `Any` goes in a `value` member.
    static let specialJSON: Set<String> = wrappers.union([
        "google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask",
        "google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue", "google.protobuf.Any",
        "google.protobuf.Empty",
    ])

    /// Seconds of 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z (the range Timestamp allows).
    static let minTimestamp: Int64 = -62_135_596_800
    static let maxTimestamp: Int64 = 253_402_300_799
    static let maxDurationSeconds: Int64 = 315_576_000_000

    // MARK: JSON → binary

    func encodeWellKnown(_ v: JSONValue, _ schema: MessageSchema, path: String, depth: Int) throws(TranscodingError) -> [UInt8]? {
        guard schema.isWellKnown else { return nil }
        let name = schema.fullName
        var w = WireWriter()
        switch name {
        case "google.protobuf.Timestamp":
            guard case .string(let s) = v, let (secs, nanos) = Self.parseTimestamp(s) else {
                throw TranscodingError(field: path, reason: "expected an RFC 3339 timestamp string like \"2024-01-31T12:00:00Z\"")
            }
            if secs != 0 { w.tag(1, .varint); w.varint(UInt64(bitPattern: secs)) }
            if nanos != 0 { w.tag(2, .varint); w.varint(UInt64(bitPattern: Int64(nanos))) }
            return w.bytes
        case "google.protobuf.Duration":
            guard case .string(let s) = v, let (secs, nanos) = Self.parseDuration(s) else {
                throw TranscodingError(field: path, reason: "expected a duration string like \"1.5s\"")
            }
            if secs != 0 { w.tag(1, .varint); w.varint(UInt64(bitPattern: secs)) }
            if nanos != 0 { w.tag(2, .varint); w.varint(UInt64(bitPattern: Int64(nanos))) }
            return w.bytes
        case "google.protobuf.FieldMask":
            guard case .string(let s) = v else { throw TranscodingError(field: path, reason: "expected a field mask string like \"a.b,c\"") }
            for p in s.split(separator: ",", omittingEmptySubsequences: true) {
                var snake = ""
                for c in p {
                    if c == "_" { throw TranscodingError(field: path, reason: "field mask paths are lowerCamelCase in JSON") }
                    if c.isUppercase { snake.append("_"); snake.append(Character(c.lowercased())) } else { snake.append(c) }
                }
                w.lengthDelimited(1, Array(snake.utf8))
            }
            return w.bytes
        case "google.protobuf.Struct":
            guard case .object(let members) = v else { throw TranscodingError(field: path, reason: "expected an object, got \(v.kindName)") }
            for (k, item) in members {
                var e = WireWriter()
                e.lengthDelimited(1, Array(k.utf8))
                e.lengthDelimited(2, try encodeJSONValue(item, path: "\(path)[\"\(k)\"]", depth: depth + 1))
                w.lengthDelimited(1, e.bytes)
            }
            return w.bytes
        case "google.protobuf.Value":
            return try encodeJSONValue(v, path: path, depth: depth)
        case "google.protobuf.ListValue":
            guard case .array(let items) = v else { throw TranscodingError(field: path, reason: "expected an array, got \(v.kindName)") }
            for (i, item) in items.enumerated() {
                w.lengthDelimited(1, try encodeJSONValue(item, path: "\(path)[\(i)]", depth: depth + 1))
            }
            return w.bytes
        case "google.protobuf.Any":
            return try encodeAny(v, path: path, depth: depth)
        default:
            guard Self.wrappers.contains(name), let field = schema.fields.first else { return nil }
            if case .null = v { return [] }
            try encodeFieldValue(v, field, path: path, depth: depth, into: &w)
            return w.bytes
        }
    }

    /// A wrapper's single value, written only when not the default.
    private func encodeFieldValue(
        _ v: JSONValue, _ field: FieldSchema, path: String, depth: Int,
        into w: inout WireWriter
    ) throws(TranscodingError) {
        let probe = MessageSchema(fullName: "", fields: [field], oneofNames: [], isMapEntry: false)
        let bytes = try encodeMessage(.object([(field.name, v)]), probe, path: path, depth: depth)
        w.bytes.append(contentsOf: bytes)
    }

    private func encodeJSONValue(_ v: JSONValue, path: String, depth: Int) throws(TranscodingError) -> [UInt8] {
        guard depth < Self.maxDepth else { throw TranscodingError(field: path, reason: "value nested more than \(Self.maxDepth) levels") }
        var w = WireWriter()
        switch v {
        case .null: w.tag(1, .varint); w.varint(0)
        case .number(let n):
            guard let d = Double(n), d.isFinite else { throw TranscodingError(field: path, reason: "number out of range") }
            w.tag(2, .fixed64); w.fixed64(d.bitPattern)
        case .string(let s): w.lengthDelimited(3, Array(s.utf8))
        case .bool(let b): w.tag(4, .varint); w.varint(b ? 1 : 0)
        case .object:
            let s = registry.message("google.protobuf.Struct")!
            w.lengthDelimited(5, try encodeMessage(v, s, path: path, depth: depth + 1))
        case .array:
            let s = registry.message("google.protobuf.ListValue")!
            w.lengthDelimited(6, try encodeMessage(v, s, path: path, depth: depth + 1))
        }
        return w.bytes
    }

    private func encodeAny(_ v: JSONValue, path: String, depth: Int) throws(TranscodingError) -> [UInt8] {
        guard case .object(let members) = v else { throw TranscodingError(field: path, reason: "expected an object with \"@type\"") }
        if members.isEmpty { return [] }
        guard
            let typeURL = members.first(where: { $0.0 == "@type" }).flatMap({ m -> String? in
                if case .string(let s) = m.1 { return s } else { return nil }
            })
        else { throw TranscodingError(field: path, reason: "an Any needs a string \"@type\"") }
        let typeName = String(typeURL.split(separator: "/").last ?? "")
        guard let schema = registry.message(typeName) else {
            throw TranscodingError(field: path, reason: "unknown type \(typeURL) in Any")
        }
        let rest = members.filter { $0.0 != "@type" }
        let payload: [UInt8]
        if Self.specialJSON.contains(typeName) {
            guard rest.count == 1, rest[0].0 == "value" else {
                throw TranscodingError(field: path, reason: "an Any holding \(typeName) carries it in \"value\"")
            }
            payload = try encodeMessage(rest[0].1, schema, path: path, depth: depth + 1)
        } else {
            payload = try encodeMessage(.object(rest), schema, path: path, depth: depth + 1)
        }
        var w = WireWriter()
        w.lengthDelimited(1, Array(typeURL.utf8))
        if !payload.isEmpty { w.lengthDelimited(2, payload) }
        return w.bytes
    }

    // MARK: binary → JSON

    func decodeWellKnown(_ bytes: ArraySlice<UInt8>, _ schema: MessageSchema, path: String, depth: Int) throws(TranscodingError) -> JSONValue? {
        guard schema.isWellKnown else { return nil }
        let name = schema.fullName
        switch name {
        case "google.protobuf.Timestamp", "google.protobuf.Duration":
            let values = try readFields(bytes, schema, path: path)
            var secs: Int64 = 0, nanos: Int32 = 0
            if let si = schema.index(ofNumber: 1), case .varint(let s)? = values[si].last { secs = Int64(bitPattern: s) }
            if let ni = schema.index(ofNumber: 2), case .varint(let n)? = values[ni].last { nanos = Int32(truncatingIfNeeded: n) }
            if name == "google.protobuf.Timestamp" {
                guard let s = Self.formatTimestamp(secs, nanos) else {
                    throw TranscodingError(field: path, reason: "timestamp out of range")
                }
                return .string(s)
            }
            guard let s = Self.formatDuration(secs, nanos) else { throw TranscodingError(field: path, reason: "duration out of range") }
            return .string(s)
        case "google.protobuf.FieldMask":
            let values = try readFields(bytes, schema, path: path)
            let paths = (schema.byNumber[1].map { values[$0] } ?? []).compactMap { raw -> String? in
                if case .bytes(let b) = raw { return FileParser.jsonName(String(decoding: b, as: UTF8.self)) } else { return nil }
            }
            return .string(paths.joined(separator: ","))
        case "google.protobuf.Struct":
            let values = try readFields(bytes, schema, path: path)
            guard let fi = schema.byNumber[1], let entry = registry.message(schema.fields[fi].typeName) else { return .object([]) }
            var object: [(String, JSONValue)] = []
            var positions: [String: Int] = [:]
            for raw in values[fi] {
                guard case .bytes(let b) = raw else { continue }
                let (k, v) = try decodeMapEntry(b, entry, path: path, depth: depth)
                if let p = positions[k] { object[p].1 = v } else { positions[k] = object.count; object.append((k, v)) }
            }
            return .object(object)
        case "google.protobuf.ListValue":
            let values = try readFields(bytes, schema, path: path)
            guard let fi = schema.byNumber[1] else { return .array([]) }
            var items: [JSONValue] = []
            for (i, raw) in values[fi].enumerated() {
                items.append(try decodeScalar(raw, schema.fields[fi], path: "\(path)[\(i)]", depth: depth))
            }
            return .array(items)
        case "google.protobuf.Value":
            let values = try readFields(bytes, schema, path: path)
            guard let fi = values.indices.last(where: { !values[$0].isEmpty }) else {
                throw TranscodingError(field: path, reason: "a google.protobuf.Value must have a kind set")
            }
            let field = schema.fields[fi]
            if field.type == .message {
                let merged = Self.merged(values[fi])
                return try decodeScalar(merged, field, path: path, depth: depth)
            }
            return try decodeScalar(values[fi][values[fi].count - 1], field, path: path, depth: depth)
        case "google.protobuf.Any":
            return try decodeAny(bytes, schema, path: path, depth: depth)
        default:
            guard Self.wrappers.contains(name), let field = schema.fields.first else { return nil }
            let values = try readFields(bytes, schema, path: path)
            guard let raw = values[0].last else { return Self.defaultJSON(field) }
            return try decodeScalar(raw, field, path: path, depth: depth)
        }
    }

    private func decodeAny(_ bytes: ArraySlice<UInt8>, _ schema: MessageSchema, path: String, depth: Int) throws(TranscodingError) -> JSONValue {
        let values = try readFields(bytes, schema, path: path)
        var typeURL = ""
        var payload = ArraySlice<UInt8>()
        if let i = schema.byNumber[1], case .bytes(let b)? = values[i].last { typeURL = String(decoding: b, as: UTF8.self) }
        if let i = schema.byNumber[2], case .bytes(let b)? = values[i].last { payload = b }
        if typeURL.isEmpty { return .object([]) }
        let typeName = String(typeURL.split(separator: "/").last ?? "")
        guard let inner = registry.message(typeName) else {
            throw TranscodingError(field: path, reason: "cannot show an Any holding unknown type \(typeURL)")
        }
        let value = try decodeMessage(payload, inner, path: path, depth: depth + 1)
        if Self.specialJSON.contains(typeName) { return .object([("@type", .string(typeURL)), ("value", value)]) }
        guard case .object(let fields) = value else { return .object([("@type", .string(typeURL))]) }
        return .object([("@type", .string(typeURL))] + fields)
    }

    // MARK: Timestamp and Duration text

    /// Days since 1970-01-01 of a civil date (H. Hinnant's algorithm).
    static func daysFromCivil(_ y: Int64, _ m: Int64, _ d: Int64) -> Int64 {
        let y = m <= 2 ? y - 1 : y
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    static func civilFromDays(_ z: Int64) -> (Int64, Int64, Int64) {
        let z = z + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (m <= 2 ? y + 1 : y, m, d)
    }

    static func fraction(_ nanos: Int32) -> String {
        if nanos == 0 { return "" }
        var digits = String(nanos)
        digits = String(repeating: "0", count: 9 - digits.count) + digits
        if nanos % 1_000_000 == 0 { return "." + digits.prefix(3) }
        if nanos % 1_000 == 0 { return "." + digits.prefix(6) }
        return "." + digits
    }

    static func formatTimestamp(_ secs: Int64, _ nanos: Int32) -> String? {
        guard secs >= minTimestamp, secs <= maxTimestamp, nanos >= 0, nanos < 1_000_000_000 else { return nil }
        let days = secs >= 0 ? secs / 86400 : (secs - 86399) / 86400
        let rem = secs - days * 86400
        let (y, m, d) = civilFromDays(days)
        // Digit by digit into 30 bytes (interpolating padded parts was a fifth of a Connect
        // answer's JSON); years are 0001...9999 here (the range checked above).
        var out = [UInt8]()
        out.reserveCapacity(30)
        func digits(_ v: Int64, _ width: Int) {
            var div: Int64 = 1
            for _ in 1..<width { div *= 10 }
            var v = v
            while div > 0 {
                out.append(UInt8(48 + v / div))
                v %= div
                div /= 10
            }
        }
        digits(y, 4)
        out.append(UInt8(ascii: "-"))
        digits(m, 2)
        out.append(UInt8(ascii: "-"))
        digits(d, 2)
        out.append(UInt8(ascii: "T"))
        digits(rem / 3600, 2)
        out.append(UInt8(ascii: ":"))
        digits(rem / 60 % 60, 2)
        out.append(UInt8(ascii: ":"))
        digits(rem % 60, 2)
        if nanos != 0 {
            out.append(UInt8(ascii: "."))
            let n = Int64(nanos)
            if n % 1_000_000 == 0 {
                digits(n / 1_000_000, 3)
            } else if n % 1_000 == 0 {
                digits(n / 1_000, 6)
            } else {
                digits(n, 9)
            }
        }
        out.append(UInt8(ascii: "Z"))
        return String(decoding: out, as: UTF8.self)
    }

    static func parseTimestamp(_ s: String) -> (Int64, Int32)? {
        let b = Array(s.utf8)
        func num(_ from: Int, _ count: Int) -> Int64? {
            guard from + count <= b.count else { return nil }
            var v: Int64 = 0
            for i in from..<(from + count) {
                guard b[i] >= 0x30 && b[i] <= 0x39 else { return nil }
                v = v * 10 + Int64(b[i] - 0x30)
            }
            return v
        }
        guard b.count >= 20, let y = num(0, 4), b[4] == UInt8(ascii: "-"), let mo = num(5, 2), b[7] == UInt8(ascii: "-"),
            let d = num(8, 2), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t"), let h = num(11, 2),
            b[13] == UInt8(ascii: ":"), let mi = num(14, 2), b[16] == UInt8(ascii: ":"), let se = num(17, 2)
        else { return nil }
        guard (1...12).contains(mo), d >= 1, h < 24, mi < 60, se < 60 else { return nil }
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
        let monthDays: [Int64] = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard d <= monthDays[Int(mo) - 1], y >= 1 else { return nil }
        var i = 19
        var nanos: Int64 = 0
        if i < b.count, b[i] == UInt8(ascii: ".") {
            i += 1
            var digits = 0
            while i < b.count, b[i] >= 0x30 && b[i] <= 0x39 {
                guard digits < 9 else { return nil }
                nanos = nanos * 10 + Int64(b[i] - 0x30)
                digits += 1
                i += 1
            }
            guard digits > 0 else { return nil }
            for _ in digits..<9 { nanos *= 10 }
        }
        guard i < b.count else { return nil }
        var offset: Int64 = 0
        if b[i] == UInt8(ascii: "Z") || b[i] == UInt8(ascii: "z") {
            i += 1
        } else if b[i] == UInt8(ascii: "+") || b[i] == UInt8(ascii: "-") {
            let sign: Int64 = b[i] == UInt8(ascii: "-") ? -1 : 1
            guard let oh = num(i + 1, 2), i + 3 < b.count, b[i + 3] == UInt8(ascii: ":"), let om = num(i + 4, 2), oh < 24, om < 60 else {
                return nil
            }
            offset = sign * (oh * 3600 + om * 60)
            i += 6
        } else {
            return nil
        }
        guard i == b.count else { return nil }
        let secs = daysFromCivil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - offset
        guard secs >= minTimestamp, secs <= maxTimestamp else { return nil }
        return (secs, Int32(nanos))
    }

    static func formatDuration(_ secs: Int64, _ nanos: Int32) -> String? {
        guard abs(secs) <= maxDurationSeconds, abs(nanos) < 1_000_000_000,
            secs == 0 || nanos == 0 || (secs < 0) == (nanos < 0)
        else { return nil }
        let negative = secs < 0 || nanos < 0
        return "\(negative ? "-" : "")\(abs(secs))\(fraction(abs(nanos)))s"
    }

    static func parseDuration(_ s: String) -> (Int64, Int32)? {
        guard s.hasSuffix("s") else { return nil }
        var body = Substring(s.dropLast())
        var negative = false
        if body.hasPrefix("-") { negative = true; body = body.dropFirst() }
        let parts = body.split(separator: ".", maxSplits: 1, omittingEmptySubsequences: false)
        guard let whole = parts.first, !whole.isEmpty, whole.allSatisfy({ $0.isASCII && $0.isNumber }),
            let secs = Int64(whole), secs <= maxDurationSeconds
        else { return nil }
        var nanos: Int64 = 0
        if parts.count == 2 {
            let frac = parts[1]
            guard !frac.isEmpty, frac.count <= 9, frac.allSatisfy({ $0.isASCII && $0.isNumber }), let f = Int64(frac) else { return nil }
            nanos = f
            for _ in frac.count..<9 { nanos *= 10 }
        }
        return negative ? (-secs, Int32(-nanos)) : (secs, Int32(nanos))
    }
}
