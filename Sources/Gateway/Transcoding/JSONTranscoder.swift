import RPCCore
import RPCTransport

/// A request or response that does not fit its message type, with the offending field's path
/// (proto names joined by `.`, `[i]` for list items, `["k"]` for map entries).
public struct TranscodingError: Error, Sendable, CustomStringConvertible {
    public var field: String
    public var reason: String
    public var description: String { field.isEmpty ? reason : "\(field): \(reason)" }
}

/// Generic proto3 JSON ⇄ protobuf binary, driven only by the descriptors in a `SchemaRegistry`
/// (https://protobuf.dev/programming-guides/proto3/#json): lowerCamelCase names out, both names
/// in; 64-bit integers as strings; bytes as base64; enums by name (numbers accepted);
/// Timestamp/Duration/FieldMask as strings; wrappers as plain values; Struct/Value/ListValue as
/// JSON; Any with `@type`. Fields with default values are left out of the output; unknown JSON
/// fields are rejected.
public struct JSONTranscoder: Sendable {
    public let registry: SchemaRegistry
    static let maxDepth = 100

    public init(registry: SchemaRegistry) { self.registry = registry }

    // MARK: JSON → binary

    /// Encodes a JSON document as the binary form of message `typeName`.
    public func encode(json bytes: [UInt8], as typeName: String) throws(TranscodingError) -> [UInt8] {
        let value: JSONValue
        do { value = try JSONParser.parse(bytes) } catch { throw TranscodingError(field: "", reason: error.description) }
        return try encode(value, as: typeName)
    }

    func encode(_ value: JSONValue, as typeName: String) throws(TranscodingError) -> [UInt8] {
        guard let schema = registry.message(typeName) else {
            throw TranscodingError(field: "", reason: "unknown message type \(typeName)")
        }
        return try encodeMessage(value, schema, path: "", depth: 0)
    }

    private func fail(_ path: String, _ reason: String) -> TranscodingError { TranscodingError(field: path, reason: reason) }

    private func join(_ path: String, _ name: String) -> String { path.isEmpty ? name : "\(path).\(name)" }

    /// Runs `body` (which names fields relative to `segment`) and, only if it fails, puts
    /// `segment` in front of the failing field's path: decoding builds no path strings while
    /// all goes well (one per field and element was a fifth of a Connect answer's cost).
    @inline(__always)
    func within<T>(_ segment: @autoclosure () -> String, _ body: () throws(TranscodingError) -> T) throws(TranscodingError) -> T {
        do { return try body() } catch {
            let inner = error.field, seg = segment()
            let field = seg.isEmpty ? inner : inner.isEmpty ? seg : inner.hasPrefix("[") ? seg + inner : "\(seg).\(inner)"
            throw TranscodingError(field: field, reason: error.reason)
        }
    }

    func encodeMessage(_ value: JSONValue, _ schema: MessageSchema, path: String, depth: Int) throws(TranscodingError) -> [UInt8] {
        guard depth < Self.maxDepth else { throw fail(path, "message nested more than \(Self.maxDepth) levels") }
        if let wkt = try encodeWellKnown(value, schema, path: path, depth: depth) { return wkt }
        guard case .object(let members) = value else {
            throw fail(path, "expected an object for \(schema.fullName), got \(value.kindName)")
        }
        var chunks = [[UInt8]?](repeating: nil, count: schema.fields.count)
        var oneofSet: [Int: String] = [:]
        for (key, member) in members {
            guard let index = schema.byName[key] else {
                throw fail(join(path, key), "unknown field \"\(key)\" in \(schema.fullName)")
            }
            let field = schema.fields[index]
            let fieldPath = join(path, field.name)
            if chunks[index] != nil { throw fail(fieldPath, "field given twice (\"\(field.name)\" and \"\(field.jsonName)\")") }
            // null means "not set", except where null is itself a value (google.protobuf.Value).
            if case .null = member, !(field.type == .message && field.typeName == "google.protobuf.Value" && !field.isRepeated) {
                continue
            }
            if let o = field.oneofIndex, !field.isProto3Optional {
                if let other = oneofSet[o] {
                    throw fail(fieldPath, "only one of the oneof \"\(schema.oneofNames[o])\" may be set (\(other) is set too)")
                }
                oneofSet[o] = field.name
            }
            var w = WireWriter()
            try encodeField(member, field, path: fieldPath, depth: depth, into: &w)
            chunks[index] = w.bytes
        }
        var out: [UInt8] = []
        for c in chunks { if let c { out.append(contentsOf: c) } }
        return out
    }

    private func encodeField(
        _ value: JSONValue, _ field: FieldSchema, path: String, depth: Int,
        into w: inout WireWriter
    ) throws(TranscodingError) {
        if field.isRepeated, field.type == .message, let entry = registry.message(field.typeName), entry.isMapEntry {
            guard case .object(let members) = value else { throw fail(path, "expected an object (map), got \(value.kindName)") }
            guard entry.fields.count == 2, let kf = entry.byNumber[1].map({ entry.fields[$0] }),
                let vf = entry.byNumber[2].map({ entry.fields[$0] })
            else { throw fail(path, "malformed map entry type") }
            for (key, v) in members {
                let itemPath = "\(path)[\"\(key)\"]"
                var e = WireWriter()
                try encodeScalar(try mapKey(key, kf, path: itemPath), kf, path: itemPath, depth: depth, emitDefault: true, into: &e)
                if case .null = v, !(vf.type == .message && vf.typeName == "google.protobuf.Value") {
                    throw fail(itemPath, "map values cannot be null")
                }
                try encodeScalar(v, vf, path: itemPath, depth: depth, emitDefault: true, into: &e)
                w.lengthDelimited(field.number, e.bytes)
            }
            return
        }
        if field.isRepeated {
            guard case .array(let items) = value else { throw fail(path, "expected an array, got \(value.kindName)") }
            if field.packed {
                var packed = WireWriter()
                for (i, item) in items.enumerated() {
                    try encodePackedElement(item, field, path: "\(path)[\(i)]", into: &packed)
                }
                if !items.isEmpty { w.lengthDelimited(field.number, packed.bytes) }
            } else {
                for (i, item) in items.enumerated() {
                    if case .null = item, field.typeName != "google.protobuf.Value" { throw fail("\(path)[\(i)]", "list items cannot be null") }
                    try encodeScalar(item, field, path: "\(path)[\(i)]", depth: depth, emitDefault: true, into: &w)
                }
            }
            return
        }
        let hasPresence = field.oneofIndex != nil || field.type == .message
        try encodeScalar(value, field, path: path, depth: depth, emitDefault: hasPresence, into: &w)
    }

    /// A map key arrives as a JSON object member name; turn it into the JSON value its type reads.
    private func mapKey(_ key: String, _ field: FieldSchema, path: String) throws(TranscodingError) -> JSONValue {
        switch field.type {
        case .string: return .string(key)
        case .bool:
            if key == "true" { return .bool(true) }
            if key == "false" { return .bool(false) }
            throw fail(path, "map key must be \"true\" or \"false\"")
        default: return .string(key)  // integers: parsed from the string like quoted numbers
        }
    }

    private func encodePackedElement(
        _ v: JSONValue, _ field: FieldSchema, path: String,
        into w: inout WireWriter
    ) throws(TranscodingError) {
        switch field.type.wireType {
        case .varint: w.varint(try varintValue(v, field, path: path))
        case .fixed32: w.fixed32(try fixed32Value(v, field, path: path))
        case .fixed64: w.fixed64(try fixed64Value(v, field, path: path))
        default: throw fail(path, "cannot pack \(field.type)")
        }
    }

    /// Encodes one value (singular field, list item or map key/value) with its tag.
    private func encodeScalar(
        _ v: JSONValue, _ field: FieldSchema, path: String, depth: Int, emitDefault: Bool,
        into w: inout WireWriter
    ) throws(TranscodingError) {
        switch field.type {
        case .message, .group:
            guard let schema = registry.message(field.typeName) else { throw fail(path, "unknown message type \(field.typeName)") }
            let bytes = try encodeMessage(v, schema, path: path, depth: depth + 1)
            w.lengthDelimited(field.number, bytes)
        case .string:
            guard case .string(let s) = v else { throw fail(path, "expected a string, got \(v.kindName)") }
            if s.isEmpty && !emitDefault { return }
            w.lengthDelimited(field.number, Array(s.utf8))
        case .bytes:
            guard case .string(let s) = v else { throw fail(path, "expected base64 bytes as a string, got \(v.kindName)") }
            guard let bytes = Base64.decode(s) else { throw fail(path, "not valid base64") }
            if bytes.isEmpty && !emitDefault { return }
            w.lengthDelimited(field.number, bytes)
        default:
            switch field.type.wireType {
            case .varint:
                let x = try varintValue(v, field, path: path)
                if x == 0 && !emitDefault { return }
                w.tag(field.number, .varint)
                w.varint(x)
            case .fixed32:
                let x = try fixed32Value(v, field, path: path)
                if x == 0 && !emitDefault { return }
                w.tag(field.number, .fixed32)
                w.fixed32(x)
            case .fixed64:
                let x = try fixed64Value(v, field, path: path)
                if x == 0 && !emitDefault { return }
                w.tag(field.number, .fixed64)
                w.fixed64(x)
            default:
                throw fail(path, "unsupported field type \(field.type)")
            }
        }
    }

    private func varintValue(_ v: JSONValue, _ field: FieldSchema, path: String) throws(TranscodingError) -> UInt64 {
        switch field.type {
        case .bool:
            guard case .bool(let b) = v else { throw fail(path, "expected true or false, got \(v.kindName)") }
            return b ? 1 : 0
        case .enum:
            return UInt64(bitPattern: Int64(try enumValue(v, field, path: path)))
        case .int32: return UInt64(bitPattern: Int64(try integer(v, path: path, Int32.self)))
        case .sint32: return zigZag32(try integer(v, path: path, Int32.self))
        case .uint32: return UInt64(try integer(v, path: path, UInt32.self))
        case .int64: return UInt64(bitPattern: try integer(v, path: path, Int64.self))
        case .sint64: return zigZag64(try integer(v, path: path, Int64.self))
        case .uint64: return try integer(v, path: path, UInt64.self)
        default: throw fail(path, "not a varint type")
        }
    }

    private func fixed32Value(_ v: JSONValue, _ field: FieldSchema, path: String) throws(TranscodingError) -> UInt32 {
        switch field.type {
        case .fixed32: return try integer(v, path: path, UInt32.self)
        case .sfixed32: return UInt32(bitPattern: try integer(v, path: path, Int32.self))
        case .float:
            let d = try floating(v, path: path)
            if d.isFinite && abs(d) > Double(Float.greatestFiniteMagnitude) { throw fail(path, "value out of range for a float") }
            return Float(d).bitPattern
        default: throw fail(path, "not a 32-bit type")
        }
    }

    private func fixed64Value(_ v: JSONValue, _ field: FieldSchema, path: String) throws(TranscodingError) -> UInt64 {
        switch field.type {
        case .fixed64: return try integer(v, path: path, UInt64.self)
        case .sfixed64: return UInt64(bitPattern: try integer(v, path: path, Int64.self))
        case .double: return try floating(v, path: path).bitPattern
        default: throw fail(path, "not a 64-bit type")
        }
    }

    private func enumValue(_ v: JSONValue, _ field: FieldSchema, path: String) throws(TranscodingError) -> Int32 {
        if case .string(let name) = v {
            guard let e = registry.enumType(field.typeName) else { throw fail(path, "unknown enum \(field.typeName)") }
            if let n = e.numbers[name] { return n }
            if let n = Int32(name) { return n }
            throw fail(path, "unknown value \"\(name)\" for enum \(field.typeName)")
        }
        if case .null = v, field.typeName == "google.protobuf.NullValue" { return 0 }
        return try integer(v, path: path, Int32.self)
    }

    /// An integer from a JSON number or a string holding one; exponents allowed when integral.
    func integer<T: FixedWidthInteger>(_ v: JSONValue, path: String, _: T.Type) throws(TranscodingError) -> T {
        let text: String
        switch v {
        case .number(let n): text = n
        case .string(let s): text = s
        default: throw fail(path, "expected an integer, got \(v.kindName)")
        }
        if let x = T(text) { return x }
        if text.contains(where: { $0 == "." || $0 == "e" || $0 == "E" }), let d = Double(text), d.isFinite {
            guard d == d.rounded(), let x = T(exactly: d) else { throw fail(path, "\(text) is not an integer in range for \(T.self)") }
            return x
        }
        throw fail(path, "\"\(text)\" is not a valid \(T.self == Int64.self || T.self == Int32.self ? "signed " : "")integer in range")
    }

    func floating(_ v: JSONValue, path: String) throws(TranscodingError) -> Double {
        switch v {
        case .number(let n):
            guard let d = Double(n) else { throw fail(path, "invalid number \(n)") }
            if !d.isFinite { throw fail(path, "number out of range") }
            return d
        case .string(let s):
            switch s {
            case "NaN": return .nan
            case "Infinity": return .infinity
            case "-Infinity": return -.infinity
            default:
                guard !s.isEmpty, !s.hasSuffix(" "), !s.hasPrefix(" "), let d = Double(s), d.isFinite else {
                    throw fail(path, "\"\(s)\" is not a number")
                }
                return d
            }
        default: throw fail(path, "expected a number, got \(v.kindName)")
        }
    }

    // MARK: binary → JSON

    /// Decodes binary message `typeName` to JSON bytes, written as it goes (no `JSONValue` tree
    /// but for well-known types and maps): the same output as serializing `decodeValue`.
    public func decode(_ bytes: [UInt8], as typeName: String) throws(TranscodingError) -> [UInt8] {
        guard let schema = registry.message(typeName) else { throw fail("", "unknown message type \(typeName)") }
        var w = JSONWriter()
        w.bytes.reserveCapacity(bytes.count * 2 + 16)
        try writeMessage(bytes[...], schema, depth: 0, into: &w)
        return w.bytes
    }

    private func writeMessage(_ bytes: ArraySlice<UInt8>, _ schema: MessageSchema, depth: Int, into w: inout JSONWriter) throws(TranscodingError) {
        guard depth < Self.maxDepth else { throw fail("", "message nested more than \(Self.maxDepth) levels") }
        if let wkt = try decodeWellKnown(bytes, schema, path: "", depth: depth) {
            w.write(wkt)
            return
        }
        let values = try readFields(bytes, schema, path: "")
        w.bytes.append(UInt8(ascii: "{"))
        var first = true
        func member(_ name: String, _ w: inout JSONWriter) {
            if !first { w.bytes.append(UInt8(ascii: ",")) }
            first = false
            w.writeString(name)
            w.bytes.append(UInt8(ascii: ":"))
        }
        for (index, field) in schema.fields.enumerated() {
            let raws = values[index]
            if raws.isEmpty { continue }
            if field.isRepeated, field.type == .message, let entry = registry.message(field.typeName), entry.isMapEntry {
                let object = try mapObject(raws, entry, field, depth: depth)
                member(field.jsonName, &w)
                w.write(object)
            } else if field.isRepeated {
                member(field.jsonName, &w)
                w.bytes.append(UInt8(ascii: "["))
                for (i, raw) in raws.enumerated() {
                    if i > 0 { w.bytes.append(UInt8(ascii: ",")) }
                    try within("\(field.name)[\(i)]") { () throws(TranscodingError) in try writeScalar(raw, field, depth: depth, into: &w) }
                }
                w.bytes.append(UInt8(ascii: "]"))
            } else if field.type == .message {
                let merged = Self.merged(raws)
                member(field.jsonName, &w)
                try within(field.name) { () throws(TranscodingError) in try writeScalar(merged, field, depth: depth, into: &w) }
            } else {
                let last = raws[raws.count - 1]
                let value = try within(field.name) { () throws(TranscodingError) -> JSONValue in try decodeScalar(last, field, path: "", depth: depth)
                }
                if field.oneofIndex == nil && Self.isDefault(last) { continue }
                member(field.jsonName, &w)
                w.write(value)
            }
        }
        w.bytes.append(UInt8(ascii: "}"))
    }

    /// A map field's entries as one object (a repeated key keeps its first place, its last value).
    private func mapObject(_ raws: [RawValue], _ entry: MessageSchema, _ field: FieldSchema, depth: Int) throws(TranscodingError) -> JSONValue {
        var object: [(String, JSONValue)] = []
        var positions: [String: Int] = [:]
        for raw in raws {
            guard case .bytes(let b) = raw else { continue }
            let (k, v) = try within(field.name) { () throws(TranscodingError) -> (String, JSONValue) in
                try decodeMapEntry(b, entry, path: "", depth: depth)
            }
            if let p = positions[k] { object[p].1 = v } else { positions[k] = object.count; object.append((k, v)) }
        }
        return .object(object)
    }

    /// A singular message sent in several pieces is their concatenation (protobuf's merge).
    static func merged(_ raws: [RawValue]) -> RawValue {
        if raws.count == 1 { return raws[0] }
        return .bytes(ArraySlice(raws.flatMap { r -> [UInt8] in if case .bytes(let b) = r { return Array(b) } else { return [] } }))
    }

    /// One value: a message written in place, a scalar through `decodeScalar`.
    private func writeScalar(_ raw: RawValue, _ field: FieldSchema, depth: Int, into w: inout JSONWriter) throws(TranscodingError) {
        if field.type == .message || field.type == .group, case .bytes(let b) = raw {
            guard let schema = registry.message(field.typeName) else { throw fail("", "unknown message type \(field.typeName)") }
            try writeMessage(b, schema, depth: depth + 1, into: &w)
            return
        }
        w.write(try decodeScalar(raw, field, path: "", depth: depth))
    }

    func decodeValue(_ bytes: ArraySlice<UInt8>, as typeName: String) throws(TranscodingError) -> JSONValue {
        guard let schema = registry.message(typeName) else { throw fail("", "unknown message type \(typeName)") }
        return try decodeMessage(bytes, schema, path: "", depth: 0)
    }

    enum RawValue {
        case varint(UInt64)
        case fixed32(UInt32)
        case fixed64(UInt64)
        case bytes(ArraySlice<UInt8>)
    }

    /// A message's fields as they arrived, per field index (repeated: every element; singular:
    /// the last one; singular messages: every occurrence, merged when decoded).
    func readFields(_ bytes: ArraySlice<UInt8>, _ schema: MessageSchema, path: String) throws(TranscodingError) -> [[RawValue]] {
        var values = [[RawValue]](repeating: [], count: schema.fields.count)
        var r = WireReader(bytes)
        do {
            while let (number, type) = try r.tag() {
                guard let index = schema.index(ofNumber: number) else { try r.skip(type, number: number); continue }
                let field = schema.fields[index]
                let expected = field.type.wireType
                if field.isRepeated && field.type.isPackable && type == .lengthDelimited {
                    var p = WireReader(try r.lengthDelimited())
                    while !p.isAtEnd {
                        switch expected {
                        case .varint: values[index].append(.varint(try p.varint()))
                        case .fixed32: values[index].append(.fixed32(try p.fixed32()))
                        default: values[index].append(.fixed64(try p.fixed64()))
                        }
                    }
                    continue
                }
                guard type == expected else { try r.skip(type, number: number); continue }
                let raw: RawValue
                switch type {
                case .varint: raw = .varint(try r.varint())
                case .fixed32: raw = .fixed32(try r.fixed32())
                case .fixed64: raw = .fixed64(try r.fixed64())
                case .lengthDelimited: raw = .bytes(try r.lengthDelimited())
                default: try r.skip(type, number: number); continue
                }
                if field.isRepeated || field.type == .message {
                    values[index].append(raw)
                } else {
                    values[index] = [raw]
                }
            }
        } catch {
            throw fail(path, "malformed \(schema.fullName): \(error)")
        }
        return values
    }

    /// A message as a value (for well-known types, maps, `Any` and error details): the direct
    /// writer's output read back, so there is one decoder. Fields are named relative to `path`
    /// as errors rise (`within`), not built on the way down.
    func decodeMessage(_ bytes: ArraySlice<UInt8>, _ schema: MessageSchema, path: String, depth: Int) throws(TranscodingError) -> JSONValue {
        try within(path) { () throws(TranscodingError) -> JSONValue in
            var w = JSONWriter()
            try writeMessage(bytes, schema, depth: depth, into: &w)
            do { return try JSONParser.parse(w.bytes) } catch {
                throw TranscodingError(field: "", reason: "the decoder wrote JSON it cannot read back: \(error)")
            }
        }
    }

    static func isDefault(_ raw: RawValue) -> Bool {
        switch raw {
        case .varint(let v): v == 0
        case .fixed32(let v): v == 0  // +0.0 only: -0.0 is kept, as protobuf-go does
        case .fixed64(let v): v == 0
        case .bytes(let b): b.isEmpty
        }
    }

    func decodeMapEntry(
        _ bytes: ArraySlice<UInt8>, _ entry: MessageSchema, path: String,
        depth: Int
    ) throws(TranscodingError) -> (String, JSONValue) {
        guard let ki = entry.byNumber[1], let vi = entry.byNumber[2] else { throw fail(path, "malformed map entry type") }
        let kf = entry.fields[ki], vf = entry.fields[vi]
        let values = try readFields(bytes, entry, path: path)
        let keyJSON: JSONValue =
            values[ki].last.map { raw in (try? decodeScalar(raw, kf, path: path, depth: depth)) ?? .null }
            ?? Self.defaultJSON(kf)
        let key: String =
            switch keyJSON {
            case .string(let s): s
            case .number(let n): n
            case .bool(let b): b ? "true" : "false"
            default: ""
            }
        let itemPath = "\(path)[\"\(key)\"]"
        let value: JSONValue
        if vf.type == .message {
            let raws = values[vi]
            let merged = Self.merged(raws)
            value = try decodeScalar(merged, vf, path: itemPath, depth: depth)
        } else if let raw = values[vi].last {
            value = try decodeScalar(raw, vf, path: itemPath, depth: depth)
        } else {
            value = Self.defaultJSON(vf)
        }
        return (key, value)
    }

    static func defaultJSON(_ field: FieldSchema) -> JSONValue {
        switch field.type {
        case .string, .bytes: .string("")
        case .bool: .bool(false)
        case .int64, .uint64, .sint64, .fixed64, .sfixed64: .string("0")
        case .message, .group: .object([])
        default: .number("0")
        }
    }

    func decodeScalar(_ raw: RawValue, _ field: FieldSchema, path: String, depth: Int) throws(TranscodingError) -> JSONValue {
        switch (field.type, raw) {
        case (.message, .bytes(let b)), (.group, .bytes(let b)):
            guard let schema = registry.message(field.typeName) else { throw fail(path, "unknown message type \(field.typeName)") }
            return try decodeMessage(b, schema, path: path, depth: depth + 1)
        case (.string, .bytes(let b)): return .string(String(decoding: b, as: UTF8.self))
        case (.bytes, .bytes(let b)): return .string(Base64.encode(b, padded: true))
        case (.bool, .varint(let v)): return .bool(v != 0)
        case (.int32, .varint(let v)): return .number(String(Int32(truncatingIfNeeded: v)))
        case (.sint32, .varint(let v)): return .number(String(unZigZag32(v)))
        case (.uint32, .varint(let v)): return .number(String(UInt32(truncatingIfNeeded: v)))
        case (.int64, .varint(let v)): return .string(String(Int64(bitPattern: v)))
        case (.sint64, .varint(let v)): return .string(String(unZigZag64(v)))
        case (.uint64, .varint(let v)): return .string(String(v))
        case (.fixed32, .fixed32(let v)): return .number(String(v))
        case (.sfixed32, .fixed32(let v)): return .number(String(Int32(bitPattern: v)))
        case (.fixed64, .fixed64(let v)): return .string(String(v))
        case (.sfixed64, .fixed64(let v)): return .string(String(Int64(bitPattern: v)))
        case (.float, .fixed32(let v)): return Self.floatJSON(Float(bitPattern: v))
        case (.double, .fixed64(let v)): return Self.doubleJSON(Double(bitPattern: v))
        case (.enum, .varint(let v)):
            let n = Int32(truncatingIfNeeded: v)
            if field.typeName == "google.protobuf.NullValue" { return .null }
            if let name = registry.enumType(field.typeName)?.names[n] { return .string(name) }
            return .number(String(n))
        default:
            throw fail(path, "wire type does not match \(field.type)")
        }
    }

    static func doubleJSON(_ d: Double) -> JSONValue {
        if d.isNaN { return .string("NaN") }
        if d.isInfinite { return .string(d < 0 ? "-Infinity" : "Infinity") }
        var s = d.description
        if s.hasSuffix(".0") { s.removeLast(2) }
        return .number(s)
    }
    static func floatJSON(_ f: Float) -> JSONValue {
        if f.isNaN { return .string("NaN") }
        if f.isInfinite { return .string(f < 0 ? "-Infinity" : "Infinity") }
        var s = f.description
        if s.hasSuffix(".0") { s.removeLast(2) }
        return .number(s)
    }
}
