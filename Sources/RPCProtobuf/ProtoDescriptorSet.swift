/// The `.proto` files a generated module was built from, as server reflection needs them:
/// serialized `FileDescriptorProto`s by file name (dependencies included, so every import can be
/// served), each file's imports, and which file defines each fully qualified symbol.
///
/// Every generated module exposes one as `<Module>Descriptors.descriptorSet`; a process merges
/// the sets of the modules it serves.
public struct ProtoDescriptorSet: Sendable {
    /// Serialized `google.protobuf.FileDescriptorProto` by file name (`grpc/health/v1/health.proto`).
    public var files: [String: [UInt8]]
    /// Each file's direct imports, in declaration order.
    public var dependencies: [String: [String]]
    /// File defining each fully qualified symbol: packages' services (`grpc.health.v1.Health`),
    /// methods (`grpc.health.v1.Health.Check`), messages, enums (nested ones too) and extensions.
    public var symbols: [String: String]
    /// Fully qualified names of the services the module generated code for, sorted.
    public var services: [String]

    public init(
        files: [String: [UInt8]] = [:], dependencies: [String: [String]] = [:],
        symbols: [String: String] = [:], services: [String] = []
    ) {
        self.files = files
        self.dependencies = dependencies
        self.symbols = symbols
        self.services = services
    }

    /// Adds another module's files; both describe the same `.proto` files identically.
    public mutating func merge(_ other: ProtoDescriptorSet) {
        files.merge(other.files) { a, _ in a }
        dependencies.merge(other.dependencies) { a, _ in a }
        symbols.merge(other.symbols) { a, _ in a }
        services = Array(Set(services).union(other.services)).sorted()
    }

    public func merging(_ other: ProtoDescriptorSet) -> ProtoDescriptorSet {
        var copy = self
        copy.merge(other)
        return copy
    }

    /// The file defining `symbol`. A field or enum-value name is resolved to the file of its
    /// enclosing message or enum by dropping trailing components.
    public func file(containingSymbol symbol: String) -> String? {
        var name = Substring(symbol.hasPrefix(".") ? String(symbol.dropFirst()) : symbol)
        while true {
            if let f = symbols[String(name)] { return f }
            guard let dot = name.lastIndex(of: ".") else { return nil }
            name = name[..<dot]
        }
    }

    /// `file` followed by everything it imports, transitively, each once: what a reflection
    /// `FileDescriptorResponse` carries so a client can build the file's descriptor pool.
    public func fileWithDependencies(_ file: String) -> [String] {
        var seen: Set<String> = []
        var order: [String] = []
        func visit(_ f: String) {
            guard seen.insert(f).inserted, files[f] != nil else { return }
            order.append(f)
            for d in dependencies[f] ?? [] { visit(d) }
        }
        visit(file)
        return order
    }

    /// Serialized descriptors of `file` and its transitive imports (see `fileWithDependencies`).
    public func serializedFileWithDependencies(_ file: String) -> [[UInt8]] {
        fileWithDependencies(file).compactMap { files[$0] }
    }
}

/// Base64 as generated code embeds binary descriptors (a string literal compiles far faster than
/// a large `[UInt8]` literal).
public enum ProtoBase64 {
    /// Decodes standard base64, ignoring newlines. Traps on malformed input: the input is
    /// generated code.
    public static func decode(_ text: String) -> [UInt8] {
        var table = [UInt8](repeating: 0xff, count: 256)
        for (i, c) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8.enumerated() {
            table[Int(c)] = UInt8(i)
        }
        var out = [UInt8]()
        out.reserveCapacity(text.utf8.count * 3 / 4)
        var acc: UInt32 = 0
        var bits = 0
        for c in text.utf8 {
            if c == UInt8(ascii: "=") { break }
            let v = table[Int(c)]
            if v == 0xff { continue }
            acc = (acc << 6) | UInt32(v)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: acc >> UInt32(bits)))
            }
        }
        return out
    }

    /// Decodes a table of (file name, base64) pairs.
    public static func decodeFiles(_ pairs: [(String, String)]) -> [String: [UInt8]] {
        var out = [String: [UInt8]](minimumCapacity: pairs.count)
        for (name, text) in pairs { out[name] = decode(text) }
        return out
    }
}
