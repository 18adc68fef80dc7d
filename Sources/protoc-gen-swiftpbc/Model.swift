import CProtobufC
import ContractsC

// The generator's view of the request: Swift classes built once from the protobuf-c structs of
// the CodeGeneratorRequest, with names resolved, so the emitters never touch C.

/// `google.protobuf.FieldDescriptorProto.Type` numbers.
enum ProtoType: Int {
    case double = 1, float, int64, uint64, int32, fixed64, fixed32, bool, string, group, message, bytes,
        uint32, `enum`, sfixed32, sfixed64, sint32, sint64
}

enum ProtoLabel: Int { case optional = 1, required, repeated }

final class FileModel {
    let name: String
    let package: String
    let syntax: String
    let dependencies: [String]
    var messages: [MessageModel] = []
    var enums: [EnumModel] = []
    var services: [ServiceModel] = []
    /// Fully qualified names of extensions declared in the file (any scope).
    var extensionNames: [String] = []
    /// Leading comments by source path (`[4, 0, 2, 1]` = message 0, field 1).
    var comments: [[Int32]: String] = [:]
    let raw: UnsafeMutablePointer<Google__Protobuf__FileDescriptorProto>

    init(_ raw: UnsafeMutablePointer<Google__Protobuf__FileDescriptorProto>) {
        self.raw = raw
        let f = raw.pointee
        name = cString(f.name)
        package = cString(f.package)
        syntax = f.syntax.map { String(cString: $0) } ?? "proto2"
        dependencies = cStrings(f.dependency, f.n_dependency)
    }

    var allMessages: [MessageModel] { messages.flatMap { [$0] + $0.allNested } }
    var allEnums: [EnumModel] { enums + allMessages.flatMap(\.enums) }
}

final class MessageModel {
    let name: String
    let fullName: String
    unowned let file: FileModel
    let path: [Int32]
    var fields: [FieldModel] = []
    var oneofs: [OneofModel] = []
    var nested: [MessageModel] = []
    var enums: [EnumModel] = []
    var isMapEntry = false
    /// Whether the message can contain itself (through any fields): decoding checks nesting depth.
    var mayRecurse = false
    var swiftName = ""

    init(name: String, fullName: String, file: FileModel, path: [Int32]) {
        self.name = name
        self.fullName = fullName
        self.file = file
        self.path = path
    }

    var allNested: [MessageModel] { nested.flatMap { [$0] + $0.allNested } }
    /// The `protoc-c` struct name (`Grpc__Testing__SimpleRequest`).
    var cType: String { CNames.fullNameToC(fullName) }
    /// The `protoc-c` init function (`grpc__testing__simple_request__init`).
    var cInit: String { CNames.fullNameToLower(fullName) + "__init" }
    /// The last component of the Swift name (how the type is declared).
    var swiftDeclName: String { String(swiftName.split(separator: ".").last!) }
    var regularFields: [FieldModel] { fields.filter { $0.oneof == nil } }
}

final class FieldModel {
    let name: String
    let number: Int32
    let label: ProtoLabel
    let type: ProtoType
    let typeName: String
    let oneofIndex: Int?
    let path: [Int32]
    var message: MessageModel?
    var enumType: EnumModel?
    weak var oneof: OneofModel?
    /// Singular message field whose type can contain this field's message: stored in a box.
    var boxed = false
    var swiftName = ""

    init(_ f: Google__Protobuf__FieldDescriptorProto, path: [Int32]) {
        name = cString(f.name)
        number = f.number
        label = ProtoLabel(rawValue: Int(f.label.rawValue)) ?? .optional
        type = ProtoType(rawValue: Int(f.type.rawValue)) ?? .int32
        typeName = cString(f.type_name)
        oneofIndex = f.has_oneof_index != 0 ? Int(f.oneof_index) : nil
        self.path = path
    }

    var isRepeated: Bool { label == .repeated }
    var isMap: Bool { isRepeated && (message?.isMapEntry ?? false) }
    /// The C member name: the proto name lower-cased, `_` appended to C/C++ keywords (protoc-c's
    /// `FieldName`).
    var cName: String { CNames.fieldName(name) }
    var mapKey: FieldModel { message!.fields.first { $0.number == 1 }! }
    var mapValue: FieldModel { message!.fields.first { $0.number == 2 }! }
}

final class OneofModel {
    let name: String
    var fields: [FieldModel] = []
    var swiftName = ""
    var swiftTypeName = ""
    init(name: String) { self.name = name }
    /// The C member holding the selected field number (`message_request_case`).
    var cCaseName: String { CNames.camelToLower(name) + "_case" }
}

final class EnumModel {
    struct Value {
        let name: String
        let number: Int32
        let path: [Int32]
        var swiftName = ""
        /// Alias of an earlier value with the same number (`allow_alias`).
        var isAlias = false
    }
    let name: String
    let fullName: String
    unowned let file: FileModel
    let path: [Int32]
    var values: [Value] = []
    var swiftName = ""
    init(name: String, fullName: String, file: FileModel, path: [Int32]) {
        self.name = name
        self.fullName = fullName
        self.file = file
        self.path = path
    }
    var swiftDeclName: String { String(swiftName.split(separator: ".").last!) }
    var defaultValue: Value { values.first { $0.number == 0 } ?? values[0] }
}

final class ServiceModel {
    let name: String
    let fullName: String
    let path: [Int32]
    var methods: [MethodModel] = []
    init(name: String, fullName: String, path: [Int32]) {
        self.name = name
        self.fullName = fullName
        self.path = path
    }
}

final class MethodModel {
    let name: String
    let inputType: String
    let outputType: String
    let clientStreaming: Bool
    let serverStreaming: Bool
    /// `(common.v1.access)`: 1 public, 2 authenticated, anything else internal.
    let access: UInt64?
    /// `(common.v1.max_request_bytes)`, when set (and not 0).
    let maxRequestBytes: UInt64?
    let path: [Int32]
    var input: MessageModel!
    var output: MessageModel!
    var swiftName = ""

    init(_ m: Google__Protobuf__MethodDescriptorProto, path: [Int32]) {
        name = cString(m.name)
        inputType = cString(m.input_type)
        outputType = cString(m.output_type)
        clientStreaming = m.has_client_streaming != 0 && m.client_streaming != 0
        serverStreaming = m.has_server_streaming != 0 && m.server_streaming != 0
        access = m.options.flatMap { MethodModel.varintOption(&$0.pointee.base, field: 50001) }
        maxRequestBytes = m.options.flatMap { MethodModel.varintOption(&$0.pointee.base, field: 50002) }.flatMap { $0 == 0 ? nil : $0 }
        self.path = path
    }

    /// A varint custom option: protobuf-c keeps extensions of `MethodOptions` as unknown fields.
    static func varintOption(_ base: UnsafeMutablePointer<ProtobufCMessage>, field: UInt32) -> UInt64? {
        var found: UInt64? = nil
        for i in 0..<Int(base.pointee.n_unknown_fields) {
            let u = base.pointee.unknown_fields[i]
            guard u.tag == field, u.wire_type == PROTOBUF_C_WIRE_TYPE_VARINT, let data = u.data else { continue }
            var v: UInt64 = 0
            var shift: UInt64 = 0
            for j in 0..<u.len where shift < 64 {
                v |= UInt64(data[j] & 0x7f) << shift
                shift += 7
            }
            found = v  // the last occurrence wins, as for any scalar
        }
        return found
    }

    var kind: String {
        switch (clientStreaming, serverStreaming) {
        case (false, false): "unary"
        case (false, true): "serverStreaming"
        case (true, false): "clientStreaming"
        case (true, true): "bidirectionalStreaming"
        }
    }
    var visibility: String {
        switch access {
        case 1: "publicAnonymous"
        case 2: "publicAuthenticated"
        default: "internal"
        }
    }
}

func cString(_ p: UnsafeMutablePointer<CChar>?) -> String { p.map { String(cString: $0) } ?? "" }

func cStrings(_ p: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?, _ n: Int) -> [String] {
    (0..<n).map { cString(p![$0]) }
}

/// Builds the models of every file in the request and resolves type references.
struct ModelBuilder {
    var files: [FileModel] = []
    var messagesByName: [String: MessageModel] = [:]
    var enumsByName: [String: EnumModel] = [:]

    mutating func add(_ raw: UnsafeMutablePointer<Google__Protobuf__FileDescriptorProto>) {
        let file = FileModel(raw)
        let f = raw.pointee
        if let info = f.source_code_info {
            for i in 0..<info.pointee.n_location {
                let loc = info.pointee.location[i]!.pointee
                let path = (0..<loc.n_path).map { loc.path[$0] }
                var text = cString(loc.leading_comments)
                if text.isEmpty { text = cString(loc.trailing_comments) }
                if !text.isEmpty { file.comments[path] = text }
            }
        }
        let scope = file.package.isEmpty ? "" : file.package + "."
        for i in 0..<f.n_message_type {
            file.messages.append(message(f.message_type[i]!.pointee, scope: scope, file: file, path: [4, Int32(i)]))
        }
        for i in 0..<f.n_enum_type {
            file.enums.append(enumModel(f.enum_type[i]!.pointee, scope: scope, file: file, path: [5, Int32(i)]))
        }
        for i in 0..<f.n_extension {
            file.extensionNames.append(scope + cString(f.extension[i]!.pointee.name))
        }
        for i in 0..<f.n_service {
            let s = f.service[i]!.pointee
            let name = cString(s.name)
            let service = ServiceModel(name: name, fullName: scope + name, path: [6, Int32(i)])
            for j in 0..<s.n_method {
                service.methods.append(MethodModel(s.method[j]!.pointee, path: [6, Int32(i), 2, Int32(j)]))
            }
            file.services.append(service)
        }
        files.append(file)
    }

    private mutating func message(
        _ d: Google__Protobuf__DescriptorProto, scope: String, file: FileModel,
        path: [Int32]
    ) -> MessageModel {
        let name = cString(d.name)
        let m = MessageModel(name: name, fullName: scope + name, file: file, path: path)
        m.isMapEntry = d.options.map { $0.pointee.has_map_entry != 0 && $0.pointee.map_entry != 0 } ?? false
        for i in 0..<d.n_oneof_decl {
            m.oneofs.append(OneofModel(name: cString(d.oneof_decl[i]!.pointee.name)))
        }
        for i in 0..<d.n_field {
            let field = FieldModel(d.field[i]!.pointee, path: path + [2, Int32(i)])
            if let o = field.oneofIndex {
                field.oneof = m.oneofs[o]
                m.oneofs[o].fields.append(field)
            }
            m.fields.append(field)
        }
        for i in 0..<d.n_extension {
            file.extensionNames.append(m.fullName + "." + cString(d.extension[i]!.pointee.name))
        }
        for i in 0..<d.n_nested_type {
            m.nested.append(
                message(
                    d.nested_type[i]!.pointee, scope: m.fullName + ".", file: file,
                    path: path + [3, Int32(i)]))
        }
        for i in 0..<d.n_enum_type {
            m.enums.append(enumModel(d.enum_type[i]!.pointee, scope: m.fullName + ".", file: file, path: path + [4, Int32(i)]))
        }
        messagesByName["." + m.fullName] = m
        return m
    }

    private mutating func enumModel(
        _ d: Google__Protobuf__EnumDescriptorProto, scope: String, file: FileModel,
        path: [Int32]
    ) -> EnumModel {
        let name = cString(d.name)
        let e = EnumModel(name: name, fullName: scope + name, file: file, path: path)
        var seen = Set<Int32>()
        for i in 0..<d.n_value {
            let v = d.value[i]!.pointee
            var value = EnumModel.Value(name: cString(v.name), number: v.number, path: path + [2, Int32(i)])
            value.isAlias = !seen.insert(v.number).inserted
            e.values.append(value)
        }
        enumsByName["." + e.fullName] = e
        return e
    }

    /// Links fields and methods to their types and decides where messages need boxes.
    func resolve() throws {
        for file in files {
            for m in file.allMessages {
                for f in m.fields {
                    switch f.type {
                    case .message:
                        guard let t = messagesByName[f.typeName] else { throw GeneratorError("\(m.fullName).\(f.name): unknown type \(f.typeName)") }
                        f.message = t
                    case .enum:
                        guard let t = enumsByName[f.typeName] else { throw GeneratorError("\(m.fullName).\(f.name): unknown type \(f.typeName)") }
                        f.enumType = t
                    default: break
                    }
                }
            }
            for s in file.services {
                for method in s.methods {
                    guard let i = messagesByName[method.inputType], let o = messagesByName[method.outputType] else {
                        throw GeneratorError("\(s.fullName).\(method.name): unknown message type")
                    }
                    method.input = i
                    method.output = o
                }
            }
        }
        let all = files.flatMap(\.allMessages)
        // Edges a struct stores inline (singular message fields, oneof members) must not form a
        // cycle; edges through arrays and dictionaries are heap-allocated already.
        func inlineTargets(_ m: MessageModel) -> [MessageModel] {
            m.fields.compactMap { !$0.isRepeated ? $0.message : nil }
        }
        func allTargets(_ m: MessageModel) -> [MessageModel] {
            m.fields.compactMap { f in f.isMap ? f.mapValue.message : f.message }
        }
        func reach(_ start: [MessageModel], _ next: (MessageModel) -> [MessageModel]) -> Set<ObjectIdentifier> {
            var seen = Set<ObjectIdentifier>()
            var stack = start
            while let m = stack.popLast() {
                if seen.insert(ObjectIdentifier(m)).inserted { stack.append(contentsOf: next(m)) }
            }
            return seen
        }
        var cyclic = Set<ObjectIdentifier>()
        for m in all {
            for f in m.fields where !f.isRepeated {
                if let t = f.message, reach([t], inlineTargets).contains(ObjectIdentifier(m)) { f.boxed = true }
            }
            if reach(allTargets(m), allTargets).contains(ObjectIdentifier(m)) { cyclic.insert(ObjectIdentifier(m)) }
        }
        for m in all {
            m.mayRecurse = !reach([m], allTargets).isDisjoint(with: cyclic)
        }
    }
}

struct GeneratorError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
