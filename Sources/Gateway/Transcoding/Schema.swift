import RPCCore
import RPCProtobuf

/// Protobuf field types, numbered as `google.protobuf.FieldDescriptorProto.Type`.
enum FieldType: Int32, Sendable {
    case double = 1, float = 2, int64 = 3, uint64 = 4, int32 = 5, fixed64 = 6, fixed32 = 7, bool = 8
    case string = 9, group = 10, message = 11, bytes = 12, uint32 = 13, `enum` = 14, sfixed32 = 15
    case sfixed64 = 16, sint32 = 17, sint64 = 18

    /// The wire type a singular value of this type uses.
    var wireType: WireType {
        switch self {
        case .double, .fixed64, .sfixed64: .fixed64
        case .float, .fixed32, .sfixed32: .fixed32
        case .string, .bytes, .message: .lengthDelimited
        case .group: .startGroup
        default: .varint
        }
    }
    /// Repeated fields of these types may be packed.
    var isPackable: Bool { wireType == .varint || wireType == .fixed32 || wireType == .fixed64 }
}

/// One field of a message, as the descriptor declares it.
struct FieldSchema: Sendable {
    var name: String
    var jsonName: String
    var number: Int32
    var isRepeated: Bool
    var type: FieldType
    /// Fully qualified message or enum name, without the leading dot.
    var typeName: String
    var oneofIndex: Int?
    /// proto3 `optional` (synthetic oneof): presence tracked, not a real oneof.
    var isProto3Optional: Bool
    var packed: Bool
}

/// A message type: its fields by number and by name (proto and JSON).
final class MessageSchema: Sendable {
    let fullName: String
    let fields: [FieldSchema]
    let oneofNames: [String]
    let isMapEntry: Bool
    let byNumber: [Int32: Int]
    let byName: [String: Int]
    /// `byNumber` for field numbers below 64 (nearly all of them) as an array: no hashing on
    /// the decoding path. -1: no such field.
    let denseByNumber: [Int]
    /// A `google.protobuf.` type (maybe well-known: `decodeWellKnown` decides), decided once.
    let isWellKnown: Bool

    /// The index of field `number`, nil when the message has none.
    @inline(__always) func index(ofNumber number: Int32) -> Int? {
        if number >= 0 && Int(number) < denseByNumber.count {
            let i = denseByNumber[Int(number)]
            return i < 0 ? nil : i
        }
        return byNumber[number]
    }

    init(fullName: String, fields: [FieldSchema], oneofNames: [String], isMapEntry: Bool) {
        self.fullName = fullName
        self.fields = fields
        self.oneofNames = oneofNames
        self.isMapEntry = isMapEntry
        var byNumber: [Int32: Int] = [:]
        var byName: [String: Int] = [:]
        for (i, f) in fields.enumerated() {
            byNumber[f.number] = i
            byName[f.name] = i
            byName[f.jsonName] = byName[f.jsonName] ?? i
        }
        self.byNumber = byNumber
        self.byName = byName
        var dense = [Int](repeating: -1, count: min(64, Int(fields.map(\.number).max() ?? 0) + 1))
        for (i, f) in fields.enumerated() where f.number >= 0 && Int(f.number) < dense.count { dense[Int(f.number)] = i }
        self.denseByNumber = dense
        self.isWellKnown = fullName.hasPrefix("google.protobuf.")
    }
}

/// An enum type: value names by number and numbers by name.
final class EnumSchema: Sendable {
    let fullName: String
    let names: [Int32: String]
    let numbers: [String: Int32]
    init(fullName: String, values: [(String, Int32)]) {
        self.fullName = fullName
        var names: [Int32: String] = [:]
        var numbers: [String: Int32] = [:]
        for (n, v) in values {
            if names[v] == nil { names[v] = n }  // aliases: the first name is canonical
            numbers[n] = v
        }
        self.names = names
        self.numbers = numbers
    }
}

/// One RPC as its service descriptor declares it, with the `(common.v1.access)` marking.
struct MethodSchema: Sendable {
    var service: String
    var name: String
    var inputType: String
    var outputType: String
    var clientStreaming: Bool
    var serverStreaming: Bool
    /// `common.v1.Access` value: 1 public, 2 authenticated, 3 internal, 0 when absent.
    var access: Int32
    /// `(common.v1.max_request_bytes)`, 0 when absent.
    var maxRequestBytes: UInt64 = 0
    /// `google.protobuf.MethodOptions.idempotency_level`: 1 NO_SIDE_EFFECTS, 2 IDEMPOTENT, 0 unknown.
    var idempotencyLevel: UInt64 = 0
    /// The method's file imports `common/v1/options.proto`: our contracts, where an absent
    /// `max_request_bytes` means the default (as the generated method tables say).
    var usesContractOptions = false

    var descriptor: MethodDescriptor {
        let kind: CallKind =
            switch (clientStreaming, serverStreaming) {
            case (false, false): .unary
            case (false, true): .serverStreaming
            case (true, false): .clientStreaming
            case (true, true): .bidirectionalStreaming
            }
        let visibility: MethodVisibility =
            switch access {
            case 1: .publicAnonymous
            case 2: .publicAuthenticated
            default: .internal
            }
        let limit: Int? =
            maxRequestBytes > 0
            ? Int(clamping: maxRequestBytes)
            : usesContractOptions ? MethodDescriptor.defaultMaxRequestBytes : nil
        return MethodDescriptor(
            service: service, method: name, kind: kind, visibility: visibility,
            inputType: inputType, outputType: outputType, maxRequestBytes: limit)
    }
}

/// Every message, enum and service of a descriptor set, read from the serialized
/// `FileDescriptorProto`s the generated code embeds (the same bytes server reflection serves).
/// Built once at start; read-only afterwards.
public final class SchemaRegistry: Sendable {
    let messages: [String: MessageSchema]
    let enums: [String: EnumSchema]
    /// Services by fully qualified name, methods in declaration order.
    let services: [String: [MethodSchema]]

    /// Field number of the `(common.v1.access)` extension of `google.protobuf.MethodOptions`.
    static let accessExtension: Int32 = 50001
    /// Field number of `(common.v1.max_request_bytes)`.
    static let maxRequestBytesExtension: Int32 = 50002

    /// Paths (`/pkg.Service/Method`) of the unary methods the contracts mark
    /// `idempotency_level = NO_SIDE_EFFECTS`: the ones Connect clients may call with GET.
    public var sideEffectFreePaths: Set<String> {
        var out: Set<String> = []
        for (service, methods) in services {
            for m in methods where m.idempotencyLevel == 1 && !m.clientStreaming && !m.serverStreaming {
                out.insert("/\(service)/\(m.name)")
            }
        }
        return out
    }

    public init(_ set: ProtoDescriptorSet) throws {
        var messages: [String: MessageSchema] = [:]
        var enums: [String: EnumSchema] = [:]
        var services: [String: [MethodSchema]] = [:]
        for name in set.files.keys.sorted() {
            let file = try FileParser.parse(set.files[name]!)
            for m in file.messages { messages[m.fullName] = m }
            for e in file.enums { enums[e.fullName] = e }
            for (s, methods) in file.services { services[s] = methods }
        }
        self.messages = messages
        self.enums = enums
        self.services = services
    }

    func message(_ name: String) -> MessageSchema? { messages[name] }
    func enumType(_ name: String) -> EnumSchema? { enums[name] }

    /// The methods of `service`, as `MethodDescriptor`s with call kind and visibility.
    public func methods(of service: String) -> [MethodDescriptor] {
        (services[service] ?? []).map(\.descriptor)
    }
}

/// Decodes the parts of `descriptor.proto` the transcoder needs.
enum FileParser {
    struct File {
        var messages: [MessageSchema] = []
        var enums: [EnumSchema] = []
        var services: [(String, [MethodSchema])] = []
    }

    static func parse(_ bytes: [UInt8]) throws -> File {
        var r = WireReader(bytes[...])
        var package = ""
        var messageBlobs: [ArraySlice<UInt8>] = []
        var enumBlobs: [ArraySlice<UInt8>] = []
        var serviceBlobs: [ArraySlice<UInt8>] = []
        var syntax = "proto2"
        var usesContractOptions = false
        while let (n, t) = try r.tag() {
            switch (n, t) {
            case (2, .lengthDelimited): package = string(try r.lengthDelimited())
            case (3, .lengthDelimited):
                if string(try r.lengthDelimited()) == "common/v1/options.proto" { usesContractOptions = true }
            case (4, .lengthDelimited): messageBlobs.append(try r.lengthDelimited())
            case (5, .lengthDelimited): enumBlobs.append(try r.lengthDelimited())
            case (6, .lengthDelimited): serviceBlobs.append(try r.lengthDelimited())
            case (12, .lengthDelimited): syntax = string(try r.lengthDelimited())
            default: try r.skip(t, number: n)
            }
        }
        var file = File()
        let prefix = package.isEmpty ? "" : package + "."
        for m in messageBlobs { try parseMessage(m, prefix: prefix, proto3: syntax == "proto3", into: &file) }
        for e in enumBlobs { file.enums.append(try parseEnum(e, prefix: prefix)) }
        for s in serviceBlobs {
            var (name, methods) = try parseService(s, prefix: prefix)
            for i in methods.indices { methods[i].usesContractOptions = usesContractOptions }
            file.services.append((name, methods))
        }
        return file
    }

    static func string(_ s: ArraySlice<UInt8>) -> String { String(decoding: s, as: UTF8.self) }

    static func parseMessage(_ bytes: ArraySlice<UInt8>, prefix: String, proto3: Bool, into file: inout File) throws {
        var r = WireReader(bytes)
        var name = ""
        var fieldBlobs: [ArraySlice<UInt8>] = []
        var nested: [ArraySlice<UInt8>] = []
        var enumBlobs: [ArraySlice<UInt8>] = []
        var oneofs: [String] = []
        var isMapEntry = false
        while let (n, t) = try r.tag() {
            switch (n, t) {
            case (1, .lengthDelimited): name = string(try r.lengthDelimited())
            case (2, .lengthDelimited): fieldBlobs.append(try r.lengthDelimited())
            case (3, .lengthDelimited): nested.append(try r.lengthDelimited())
            case (4, .lengthDelimited): enumBlobs.append(try r.lengthDelimited())
            case (7, .lengthDelimited):
                var o = WireReader(try r.lengthDelimited())
                while let (on, ot) = try o.tag() {
                    if on == 7 && ot == .varint { isMapEntry = try o.varint() != 0 } else { try o.skip(ot, number: on) }
                }
            case (8, .lengthDelimited):
                var o = WireReader(try r.lengthDelimited())
                var oneofName = ""
                while let (on, ot) = try o.tag() {
                    if on == 1 && ot == .lengthDelimited { oneofName = string(try o.lengthDelimited()) } else { try o.skip(ot, number: on) }
                }
                oneofs.append(oneofName)
            default: try r.skip(t, number: n)
            }
        }
        let fullName = prefix + name
        let fields = try fieldBlobs.map { try parseField($0, proto3: proto3) }
        file.messages.append(MessageSchema(fullName: fullName, fields: fields, oneofNames: oneofs, isMapEntry: isMapEntry))
        for m in nested { try parseMessage(m, prefix: fullName + ".", proto3: proto3, into: &file) }
        for e in enumBlobs { file.enums.append(try parseEnum(e, prefix: fullName + ".")) }
    }

    static func parseField(_ bytes: ArraySlice<UInt8>, proto3: Bool) throws -> FieldSchema {
        var r = WireReader(bytes)
        var name = "", jsonName: String? = nil, typeName = ""
        var number: Int32 = 0, label: Int32 = 1, type: Int32 = 0
        var oneofIndex: Int? = nil
        var proto3Optional = false
        var packedOption: Bool? = nil
        while let (n, t) = try r.tag() {
            switch (n, t) {
            case (1, .lengthDelimited): name = string(try r.lengthDelimited())
            case (3, .varint): number = Int32(truncatingIfNeeded: try r.varint())
            case (4, .varint): label = Int32(truncatingIfNeeded: try r.varint())
            case (5, .varint): type = Int32(truncatingIfNeeded: try r.varint())
            case (6, .lengthDelimited):
                typeName = string(try r.lengthDelimited())
                if typeName.hasPrefix(".") { typeName.removeFirst() }
            case (8, .lengthDelimited):
                var o = WireReader(try r.lengthDelimited())
                while let (on, ot) = try o.tag() {
                    if on == 2 && ot == .varint { packedOption = try o.varint() != 0 } else { try o.skip(ot, number: on) }
                }
            case (9, .varint): oneofIndex = Int(truncatingIfNeeded: try r.varint())
            case (10, .lengthDelimited): jsonName = string(try r.lengthDelimited())
            case (17, .varint): proto3Optional = try r.varint() != 0
            default: try r.skip(t, number: n)
            }
        }
        guard let fieldType = FieldType(rawValue: type) else { throw WireError("field \(name) has unknown type \(type)") }
        let repeated = label == 3
        return FieldSchema(
            name: name, jsonName: jsonName ?? Self.jsonName(name), number: number, isRepeated: repeated,
            type: fieldType, typeName: typeName, oneofIndex: oneofIndex, isProto3Optional: proto3Optional,
            packed: repeated && fieldType.isPackable && (packedOption ?? proto3))
    }

    /// protoc's default JSON name: underscores dropped, the letter after one upper-cased.
    static func jsonName(_ name: String) -> String {
        var out = ""
        var upper = false
        for c in name {
            if c == "_" { upper = true; continue }
            out.append(upper ? Character(c.uppercased()) : c)
            upper = false
        }
        return out
    }

    static func parseEnum(_ bytes: ArraySlice<UInt8>, prefix: String) throws -> EnumSchema {
        var r = WireReader(bytes)
        var name = ""
        var values: [(String, Int32)] = []
        while let (n, t) = try r.tag() {
            switch (n, t) {
            case (1, .lengthDelimited): name = string(try r.lengthDelimited())
            case (2, .lengthDelimited):
                var v = WireReader(try r.lengthDelimited())
                var vn = ""
                var vv: Int32 = 0
                while let (fn, ft) = try v.tag() {
                    switch (fn, ft) {
                    case (1, .lengthDelimited): vn = string(try v.lengthDelimited())
                    case (2, .varint): vv = Int32(truncatingIfNeeded: try v.varint())
                    default: try v.skip(ft, number: fn)
                    }
                }
                values.append((vn, vv))
            default: try r.skip(t, number: n)
            }
        }
        return EnumSchema(fullName: prefix + name, values: values)
    }

    static func parseService(_ bytes: ArraySlice<UInt8>, prefix: String) throws -> (String, [MethodSchema]) {
        var r = WireReader(bytes)
        var name = ""
        var methodBlobs: [ArraySlice<UInt8>] = []
        while let (n, t) = try r.tag() {
            switch (n, t) {
            case (1, .lengthDelimited): name = string(try r.lengthDelimited())
            case (2, .lengthDelimited): methodBlobs.append(try r.lengthDelimited())
            default: try r.skip(t, number: n)
            }
        }
        let service = prefix + name
        var methods: [MethodSchema] = []
        for blob in methodBlobs {
            var m = WireReader(blob)
            var method = MethodSchema(
                service: service, name: "", inputType: "", outputType: "",
                clientStreaming: false, serverStreaming: false, access: 0)
            while let (n, t) = try m.tag() {
                switch (n, t) {
                case (1, .lengthDelimited): method.name = string(try m.lengthDelimited())
                case (2, .lengthDelimited): method.inputType = String(string(try m.lengthDelimited()).trimmingPrefix("."))
                case (3, .lengthDelimited): method.outputType = String(string(try m.lengthDelimited()).trimmingPrefix("."))
                case (4, .lengthDelimited):
                    var o = WireReader(try m.lengthDelimited())
                    while let (on, ot) = try o.tag() {
                        if on == SchemaRegistry.accessExtension && ot == .varint {
                            method.access = Int32(truncatingIfNeeded: try o.varint())
                        } else if on == SchemaRegistry.maxRequestBytesExtension && ot == .varint {
                            method.maxRequestBytes = try o.varint()
                        } else if on == 34 && ot == .varint {  // idempotency_level
                            method.idempotencyLevel = try o.varint()
                        } else {
                            try o.skip(ot, number: on)
                        }
                    }
                case (5, .varint): method.clientStreaming = try m.varint() != 0
                case (6, .varint): method.serverStreaming = try m.varint() != 0
                default: try m.skip(t, number: n)
                }
            }
            methods.append(method)
        }
        return (service, methods)
    }
}
