import Contracts

/// Message shapes read from the descriptor sets embedded in the generated code
/// (`ContractsDescriptors.files`): enough to resolve `# generated:` paths and to tell repeated
/// and map fields apart in diffs. Read with a small wire-format walker, because the generated
/// Swift has no type for `google.protobuf.FileDescriptorProto`.
public struct ProtoSchema: Sendable {
    public struct Field: Sendable {
        public let name: String
        public let number: Int
        public let isRepeated: Bool
        /// Full name of the message type (no leading dot) for message and map fields, else nil.
        public let messageType: String?
    }
    public struct Message: Sendable {
        public let fullName: String
        public let fields: [Field]
        /// A synthesized `<Field>Entry` message of a map field (fields `key` and `value`).
        public let isMapEntry: Bool
        public func field(_ name: String) -> Field? { fields.first { $0.name == name } }
    }

    public private(set) var messages: [String: Message] = [:]

    /// The schema of every `.proto` in `Proto/` and the well-known types they import.
    public static let contracts: ProtoSchema = {
        do { return try ProtoSchema(fileDescriptors: Array(ContractsDescriptors.files.values)) } catch {
            fatalError("embedded descriptors of Contracts do not parse: \(error)")
        }
    }()

    /// Parses serialized `google.protobuf.FileDescriptorProto`s.
    public init(fileDescriptors: [[UInt8]]) throws {
        for file in fileDescriptors {
            var package = ""
            var messageBytes: [[UInt8]] = []
            try WireReader.fields(file) { number, value in
                switch (number, value) {
                case (2, .bytes(let b)): package = String(decoding: b, as: UTF8.self)
                case (4, .bytes(let b)): messageBytes.append(b)
                default: break
                }
            }
            for m in messageBytes { try addMessage(m, scope: package) }
        }
    }

    private mutating func addMessage(_ bytes: [UInt8], scope: String) throws {
        var name = "", fields: [Field] = [], nested: [[UInt8]] = [], isMapEntry = false
        try WireReader.fields(bytes) { number, value in
            switch (number, value) {
            case (1, .bytes(let b)): name = String(decoding: b, as: UTF8.self)
            case (2, .bytes(let b)): fields.append(try Self.field(b))
            case (3, .bytes(let b)): nested.append(b)
            case (7, .bytes(let options)):  // MessageOptions.map_entry = 7
                try WireReader.fields(options) { n, v in
                    if n == 7, case .varint(let flag) = v { isMapEntry = flag != 0 }
                }
            default: break
            }
        }
        let fullName = scope.isEmpty ? name : scope + "." + name
        messages[fullName] = Message(fullName: fullName, fields: fields, isMapEntry: isMapEntry)
        for n in nested { try addMessage(n, scope: fullName) }
    }

    private static func field(_ bytes: [UInt8]) throws -> Field {
        var name = "", number = 0, label = 0, type = 0, typeName = ""
        try WireReader.fields(bytes) { n, v in
            switch (n, v) {
            case (1, .bytes(let b)): name = String(decoding: b, as: UTF8.self)
            case (3, .varint(let x)): number = Int(truncatingIfNeeded: x)
            case (4, .varint(let x)): label = Int(truncatingIfNeeded: x)
            case (5, .varint(let x)): type = Int(truncatingIfNeeded: x)
            case (6, .bytes(let b)): typeName = String(decoding: b, as: UTF8.self)
            default: break
            }
        }
        // FieldDescriptorProto: LABEL_REPEATED = 3; TYPE_GROUP = 10, TYPE_MESSAGE = 11.
        let isMessage = type == 11 || type == 10
        let resolved = typeName.hasPrefix(".") ? String(typeName.dropFirst()) : typeName
        return Field(name: name, number: number, isRepeated: label == 3, messageType: isMessage ? resolved : nil)
    }

    public func message(_ fullName: String) -> Message? { messages[fullName] }

    /// Resolves a `# generated:` path (`user.created_at`, `notifications.created_at`,
    /// `users_by_username.value.user_id`) from `messageName`; returns why it does not resolve.
    public func checkPath(_ path: String, in messageName: String) -> String? {
        var current = messageName
        let parts = path.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        for (i, part) in parts.enumerated() {
            guard let message = messages[current] else { return "unknown message \(current)" }
            guard let field = message.field(part) else {
                return "\(current) has no field `\(part)`"
            }
            if i < parts.count - 1 {
                guard let next = field.messageType else {
                    return "`\(parts[...i].joined(separator: "."))` is not a message field, `\(parts[i + 1])` cannot follow"
                }
                current = next
            }
        }
        return nil
    }
}

/// A minimal protobuf wire-format reader: top-level fields of one message, values undecoded.
enum WireReader {
    enum Value {
        case varint(UInt64)
        case fixed64(UInt64)
        case bytes([UInt8])
        case fixed32(UInt32)
    }

    static func fields(_ bytes: [UInt8], _ body: (Int, Value) throws -> Void) throws {
        var i = 0
        func varint() throws -> UInt64 {
            var result: UInt64 = 0, shift: UInt64 = 0
            while true {
                guard i < bytes.count, shift < 64 else { throw ContractError("truncated varint") }
                let b = bytes[i]; i += 1
                result |= UInt64(b & 0x7F) << shift
                if b & 0x80 == 0 { return result }
                shift += 7
            }
        }
        func take(_ n: Int) throws -> [UInt8] {
            guard n >= 0, i + n <= bytes.count else { throw ContractError("truncated field") }
            defer { i += n }
            return Array(bytes[i..<(i + n)])
        }
        func little(_ b: [UInt8]) -> UInt64 { b.reversed().reduce(0) { $0 << 8 | UInt64($1) } }
        while i < bytes.count {
            let key = try varint()
            let number = Int(key >> 3)
            switch key & 7 {
            case 0: try body(number, .varint(try varint()))
            case 1: try body(number, .fixed64(little(try take(8))))
            case 2: try body(number, .bytes(try take(Int(try varint()))))
            case 5: try body(number, .fixed32(UInt32(little(try take(4)))))
            default: throw ContractError("unsupported wire type \(key & 7) for field \(number)")
            }
        }
    }
}
