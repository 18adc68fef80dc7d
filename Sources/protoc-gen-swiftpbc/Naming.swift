/// protoc-c's naming rules (protobuf-c 1.4 `c_helpers.cc`), so generated Swift can name the C
/// structs, members and init functions `protoc-c` emitted for the same `.proto`.
enum CNames {
    /// `FullNameToC`: components joined by `__`, each `ToCamel`ed (`grpc.testing.SimpleRequest` →
    /// `Grpc__Testing__SimpleRequest`, `foo_bar` → `FooBar`).
    static func fullNameToC(_ fullName: String) -> String {
        fullName.split(separator: ".").map { toCamel(String($0)) }.joined(separator: "__")
    }

    /// `FullNameToLower`: components joined by `__`, each `CamelToLower`ed
    /// (`grpc.testing.SimpleRequest` → `grpc__testing__simple_request`).
    static func fullNameToLower(_ fullName: String) -> String {
        fullName.split(separator: ".").map { camelToLower(String($0)) }.joined(separator: "__")
    }

    /// `ToCamel`: drops `_` and upper-cases the letter after it and the first letter.
    static func toCamel(_ s: String) -> String {
        var out = ""
        var nextUpper = true
        for c in s {
            if c == "_" { nextUpper = true } else if nextUpper { out += c.uppercased(); nextUpper = false } else { out.append(c) }
        }
        return out
    }

    /// `CamelToLower`: `_` before an upper-case letter that follows a non-upper-case one, then
    /// lower case (`SimpleRequest` → `simple_request`, `HTTPThing` → `httpthing`).
    static func camelToLower(_ s: String) -> String {
        var out = ""
        var wasUpper = true
        for c in s.unicodeScalars {
            let isUpper = c.value >= 65 && c.value <= 90
            if isUpper {
                if !wasUpper { out += "_" }
                out.unicodeScalars.append(Unicode.Scalar(c.value + 32)!)
            } else {
                out.unicodeScalars.append(c)
            }
            wasUpper = isUpper
        }
        return out
    }

    static let keywords: Set<String> = [
        "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool", "break", "case", "catch", "char", "class",
        "compl", "const", "const_cast", "continue", "default", "delete", "do", "double", "dynamic_cast", "else",
        "enum", "explicit", "extern", "false", "float", "for", "friend", "goto", "if", "inline", "int", "long",
        "mutable", "namespace", "new", "not", "not_eq", "operator", "or", "or_eq", "private", "protected",
        "public", "register", "reinterpret_cast", "return", "short", "signed", "sizeof", "static",
        "static_cast", "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typeid",
        "typename", "union", "unsigned", "using", "virtual", "void", "volatile", "wchar_t", "while", "xor",
        "xor_eq",
    ]

    /// `FieldName`: the proto name lower-cased, `_` appended to C/C++ keywords. As Swift sees
    /// it: back-quoted when it is a Swift keyword.
    static func fieldName(_ name: String) -> String {
        var n = name.lowercased()
        if keywords.contains(n) { n += "_" }
        return SwiftNames.escaped(n)
    }
}

/// Swift naming, following swift-protobuf where it has a rule.
enum SwiftNames {
    static let keywords: Set<String> = [
        "associatedtype", "class", "deinit", "enum", "extension", "fileprivate", "func", "import", "init", "inout",
        "internal", "let", "open", "operator", "private", "precedencegroup", "protocol", "public", "rethrows",
        "static", "struct", "subscript", "typealias", "var", "break", "case", "catch", "continue", "default",
        "defer", "do", "else", "fallthrough", "for", "guard", "if", "in", "repeat", "return", "throw", "switch",
        "where", "while", "Any", "as", "await", "false", "is", "nil", "self", "Self", "super", "throws", "true",
        "try", "async", "some", "any", "consume", "borrowing", "consuming", "copy", "discard", "each",
        "macro", "package", "Type", "Protocol",
    ]
    /// Names that cannot be used even back-quoted, or that would shadow members every message has.
    static let reservedMembers: Set<String> = [
        "self", "Self", "Type", "Protocol", "init", "deinit", "subscript", "super", "true", "false", "nil",
        "protoMessageName", "serializedBytes", "hashValue", "description", "debugDescription",
        "_protobufCDescriptor", "_protobufCRecursive", "_protobufCMake",
    ]
    static let reservedTypes: Set<String> = ["Type", "Protocol", "Self", "Any", "Sendable", "Equatable", "Error"]

    static func escaped(_ name: String) -> String { keywords.contains(name) ? "`\(name)`" : name }

    /// `grpc.reflection.v1alpha` → `Grpc_Reflection_V1alpha_`; `foo_bar` → `FooBar`.
    static func packagePrefix(_ package: String) -> String {
        if package.isEmpty { return "" }
        return package.split(separator: ".").map { upperCamel(String($0)) }.joined(separator: "_") + "_"
    }

    /// `foo_bar` → `FooBar`; `fooBar` → `FooBar`.
    static func upperCamel(_ s: String) -> String {
        var out = ""
        for part in s.split(separator: "_") where !part.isEmpty {
            out += part.prefix(1).uppercased() + part.dropFirst()
        }
        return out
    }

    /// `fill_oauth_scope` → `fillOauthScope`, `URL` → `url`, `HTTPServer` → `httpServer`,
    /// `UnaryCall` → `unaryCall`.
    static func lowerCamel(_ s: String) -> String {
        let parts = s.split(separator: "_").filter { !$0.isEmpty }
        guard let first = parts.first else { return "_" }
        var out = lowerLeading(String(first))
        for part in parts.dropFirst() { out += part.prefix(1).uppercased() + part.dropFirst() }
        if let c = out.first, c.isNumber { out = "_" + out }
        return out
    }

    /// Lower-cases a leading run of capitals, keeping the last one when a lower-case letter
    /// follows it (the start of the next word).
    static func lowerLeading(_ s: String) -> String {
        let chars = Array(s)
        var run = 0
        while run < chars.count, chars[run].isUppercase { run += 1 }
        if run == 0 { return s }
        if run > 1, run < chars.count, chars[run].isLowercase { run -= 1 }
        return String(chars[..<run]).lowercased() + String(chars[run...])
    }

    /// A property name for a proto field: lowerCamelCase, `_p` appended when it would collide
    /// with a member every message has.
    static func fieldName(_ protoName: String) -> String {
        let n = lowerCamel(protoName)
        return reservedMembers.contains(n) ? n + "_p" : n
    }

    /// A nested type name; Swift-reserved ones get `Message`/`Enum` appended (swift-protobuf).
    static func nestedTypeName(_ name: String, suffix: String) -> String {
        let n = upperCamelKeepingCase(name)
        return reservedTypes.contains(n) ? n + suffix : n
    }

    /// Message and enum names keep their spelling (they are CamelCase already); only a leading
    /// lower-case letter is raised.
    static func upperCamelKeepingCase(_ s: String) -> String { s.prefix(1).uppercased() + s.dropFirst() }

    /// Enum case names as swift-protobuf makes them: the enum's name as a prefix is dropped
    /// (`SERVING_STATUS_UNKNOWN` in `ServingStatus` → `unknown`), then lowerCamelCase.
    static func enumCaseName(_ value: String, enumName: String) -> String {
        var name = value
        if let stripped = strippingPrefix(value, enumName) { name = stripped }
        var out = lowerCamel(name.lowercased())
        if out == "unrecognized" || out == "allCases" || out == "rawValue" || out == "protoName" { out += "_" }
        return out
    }

    private static func strippingPrefix(_ value: String, _ enumName: String) -> String? {
        let target = Array(enumName.lowercased().filter { $0 != "_" })
        let chars = Array(value)
        var i = 0
        var j = 0
        while i < chars.count, j < target.count {
            if chars[i] == "_" { i += 1; continue }
            guard Character(chars[i].lowercased()) == target[j] else { return nil }
            i += 1
            j += 1
        }
        guard j == target.count, i < chars.count, chars[i] == "_" else { return nil }
        let rest = String(chars[(i + 1)...])
        guard let first = rest.first, !first.isNumber, !rest.allSatisfy({ $0 == "_" }) else { return nil }
        return rest
    }

    /// The file a `.proto` generates: its path flattened (`grpc/health/v1/health.proto` →
    /// `grpc_health_v1_health.pb.swift`), because Swift rejects two files of one name in a module.
    static func outputFileName(_ protoPath: String) -> String {
        var base = protoPath
        if base.hasSuffix(".proto") { base.removeLast(6) }
        return base.replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "-", with: "_") + ".pb.swift"
    }
}

extension String {
    func replacingOccurrences(of target: String, with replacement: String) -> String {
        split(separator: Substring(target), omittingEmptySubsequences: false).joined(separator: replacement)
    }
}
