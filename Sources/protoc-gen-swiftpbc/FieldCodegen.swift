/// Per-field Swift types and the statements that move a field between its Swift value and its
/// protobuf-c struct member.
extension FieldModel {
    /// The Swift type of one value.
    var swiftElementType: String {
        switch type {
        case .double: "Double"
        case .float: "Float"
        case .int64, .sint64, .sfixed64: "Int64"
        case .uint64, .fixed64: "UInt64"
        case .int32, .sint32, .sfixed32: "Int32"
        case .uint32, .fixed32: "UInt32"
        case .bool: "Bool"
        case .string: "String"
        case .bytes: "[UInt8]"
        case .enum: enumType!.swiftName
        case .message, .group: message!.swiftName
        }
    }

    /// The Swift type of the property.
    var swiftType: String {
        if isMap { return "[\(mapKey.swiftElementType): \(mapValue.swiftElementType)]" }
        if isRepeated { return "[\(swiftElementType)]" }
        return swiftElementType
    }

    /// proto3 default of one value.
    var swiftElementDefault: String {
        switch type {
        case .bool: "false"
        case .string: "\"\""
        case .bytes: "[]"
        case .enum: "." + SwiftNames.escaped(enumType!.defaultValue.swiftName)
        case .message, .group: message!.swiftName + "()"
        default: "0"
        }
    }

    var swiftDefault: String {
        if isMap { return "[:]" }
        if isRepeated { return "[]" }
        return swiftElementDefault
    }

    /// `self.name` (escaped).
    var selfRef: String { "self." + SwiftNames.escaped(swiftName) }

    // MARK: Swift → C

    /// Sets C member `dst` from Swift value `src`. `always`: write even the default (oneof members,
    /// where presence is the point). Singular message values are handled by the caller.
    func encodeValue(_ src: String, into dst: String, always: Bool) -> [String] {
        switch type {
        case .bool: return ["\(dst) = \(src) ? 1 : 0"]
        case .enum: return ["\(dst) = ProtobufC.cEnum(\(src).rawValue)"]
        case .string:
            return always ? ["\(dst) = arena.string(\(src))"] : ["if !\(src).isEmpty { \(dst) = arena.string(\(src)) }"]
        case .bytes:
            return always ? ["\(dst) = arena.bytes(\(src))"] : ["if !\(src).isEmpty { \(dst) = arena.bytes(\(src)) }"]
        case .message, .group: return ["\(dst) = arena.message(\(src), as: \(message!.cType).self)"]
        default: return ["\(dst) = \(src)"]
        }
    }

    /// The arena call building a repeated field's C array from Swift array `src`.
    func encodeArray(_ src: String) -> String {
        switch type {
        case .bool: "arena.bools(\(src))"
        case .enum: "arena.array(\(src)) { ProtobufC.cEnum($0.rawValue) }"
        case .string: "arena.strings(\(src))"
        case .bytes: "arena.bytesArray(\(src))"
        case .message, .group: "arena.messages(\(src), as: \(message!.cType).self)"
        default: "arena.array(\(src))"
        }
    }

    // MARK: C → Swift

    /// Whether reading this value can throw (strings are UTF-8 checked; messages contain strings).
    var decodeThrows: Bool {
        switch type {
        case .string, .message, .group: true
        default: false
        }
    }

    /// A Swift expression reading one value from C expression `src`.
    func decodeValue(_ src: String) -> String {
        switch type {
        case .bool: "\(src) != 0"
        case .enum: "\(enumType!.swiftName)(rawValue: ProtobufC.number(\(src)))"
        case .string: "try ProtobufC.string(\(src))"
        case .bytes: "ProtobufC.bytes(\(src))"
        case .message, .group:
            "try \(src).map { try ProtobufC.message($0, as: \(message!.swiftName).self) } ?? \(message!.swiftName)()"
        default: src
        }
    }

    /// A Swift expression reading a repeated field from C array `p` with `n` elements.
    func decodeArray(_ p: String, _ n: String) -> String {
        switch type {
        case .bool: "ProtobufC.bools(\(p), \(n))"
        case .enum: "ProtobufC.array(\(p), \(n)) { \(enumType!.swiftName)(rawValue: ProtobufC.number($0)) }"
        case .string: "try ProtobufC.strings(\(p), \(n))"
        case .bytes: "ProtobufC.bytesArray(\(p), \(n))"
        case .message, .group: "try ProtobufC.messages(\(p), \(n), as: \(message!.swiftName).self)"
        default: "ProtobufC.array(\(p), \(n))"
        }
    }
}
