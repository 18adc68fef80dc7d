import RPCProtobuf

/// Answers server-reflection questions from embedded descriptor sets (our generated code carries
/// every `.proto` file it was built from, imports included). Shared by the v1 and v1alpha services.
public struct ReflectionIndex: Sendable {
    public let descriptors: ProtoDescriptorSet
    /// Services to list (the ones this server actually serves).
    public let services: [String]

    public init(descriptors: ProtoDescriptorSet, services: [String]) {
        self.descriptors = descriptors
        self.services = services.sorted()
    }

    public enum Answer: Sendable {
        case files([[UInt8]])
        case services([String])
        case extensionNumbers(type: String, numbers: [Int32])
        case error(code: Int32, message: String)
    }

    /// The file and every file it imports, transitively, the requested one first.
    func withDependencies(_ name: String) -> [[UInt8]]? {
        guard descriptors.files[name] != nil else { return nil }
        var order: [String] = []
        var seen: Set<String> = []
        func visit(_ f: String) {
            guard seen.insert(f).inserted else { return }
            order.append(f)
            for d in descriptors.dependencies[f] ?? [] { visit(d) }
        }
        visit(name)
        return order.compactMap { descriptors.files[$0] }
    }

    public func fileByName(_ name: String) -> Answer {
        if let files = withDependencies(name) { return .files(files) }
        return .error(code: 5, message: "file '\(name)' not found")
    }

    public func fileContainingSymbol(_ symbol: String) -> Answer {
        var s = symbol.hasPrefix(".") ? String(symbol.dropFirst()) : symbol
        // A method is also accepted as `pkg.Service/Method`.
        s = String(s.map { $0 == "/" ? "." : $0 })
        if let file = descriptors.symbols[s], let files = withDependencies(file) { return .files(files) }
        return .error(code: 5, message: "symbol '\(symbol)' not found")
    }

    public func fileContainingExtension(type: String, number: Int32) -> Answer {
        if type == "google.protobuf.MethodOptions" && number == 50001, let file = descriptors.symbols["common.v1.access"],
            let files = withDependencies(file)
        {
            return .files(files)
        }
        return .error(code: 5, message: "extension \(number) of '\(type)' not found")
    }

    public func extensionNumbers(of type: String) -> Answer {
        let t = type.hasPrefix(".") ? String(type.dropFirst()) : type
        guard descriptors.symbols[t] != nil || t == "google.protobuf.MethodOptions" else {
            return .error(code: 5, message: "type '\(type)' not found")
        }
        let numbers: [Int32] = t == "google.protobuf.MethodOptions" && descriptors.symbols["common.v1.access"] != nil ? [50001] : []
        return .extensionNumbers(type: t, numbers: numbers)
    }

    public var listServices: Answer { .services(services) }
}
