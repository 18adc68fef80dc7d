import ContractsC

/// Plugin options (`--swiftpbc_opt=module=Contracts,import=GRPCContracts`): `module=<Swift module>`
/// (required), `import=<A>+<B>` (modules to import, for types generated elsewhere),
/// `cmodule=<A>+<B>` (C modules with the protoc-c structs; default `ContractsC`).
struct Options {
    /// The Swift module the output is compiled into; names `<Module>Descriptors`.
    var module = ""
    /// Modules the generated files import: where types from files not generated here live
    /// (the well-known types come from GRPCContracts).
    var imports: [String] = []
    /// The C modules holding the protoc-c structs (`internal import`ed).
    var cModules: [String] = ["ContractsC"]

    init(_ parameter: String) throws {
        for item in parameter.split(separator: ",") {
            let kv = item.split(separator: "=", maxSplits: 1).map(String.init)
            guard kv.count == 2 else { throw GeneratorError("bad option '\(item)'") }
            switch kv[0] {
            case "module": module = kv[1]
            case "import": imports.append(contentsOf: kv[1].split(separator: "+").map(String.init))
            case "cmodule": cModules = kv[1].split(separator: "+").map(String.init)
            default: throw GeneratorError("unknown option '\(kv[0])'")
            }
        }
        guard !module.isEmpty else { throw GeneratorError("missing option module=<SwiftModule>") }
    }
}

struct Generator {
    let options: Options
    let model: ModelBuilder
    let filesToGenerate: [String]

    init(request: UnsafeMutablePointer<Google__Protobuf__Compiler__CodeGeneratorRequest>) throws {
        let r = request.pointee
        options = try Options(cString(r.parameter))
        var builder = ModelBuilder()
        for i in 0..<r.n_proto_file { builder.add(r.proto_file[i]!) }
        try builder.resolve()
        model = builder
        filesToGenerate = cStrings(r.file_to_generate, r.n_file_to_generate)
        assignNames()
    }

    /// Output files, name → content, in a stable order.
    func generate() throws -> [(String, String)] {
        var out: [(String, String)] = []
        for name in filesToGenerate {
            guard let file = model.files.first(where: { $0.name == name }) else { throw GeneratorError("\(name) not in request") }
            if file.syntax != "proto3" {
                throw GeneratorError("\(name): only proto3 files are supported (syntax is \(file.syntax))")
            }
            out.append((SwiftNames.outputFileName(name), try FileEmitter(file: file, options: options).emit()))
        }
        out.append(("Descriptors.swift", DescriptorsEmitter(generator: self).emit()))
        return out
    }

    // MARK: - Names

    private func assignNames() {
        for file in model.files {
            let prefix = SwiftNames.packagePrefix(file.package)
            for m in file.messages {
                m.swiftName =
                    prefix + (prefix.isEmpty ? SwiftNames.nestedTypeName(m.name, suffix: "Message") : SwiftNames.upperCamelKeepingCase(m.name))
                nameNested(m)
            }
            for e in file.enums {
                e.swiftName = prefix + (prefix.isEmpty ? SwiftNames.nestedTypeName(e.name, suffix: "Enum") : SwiftNames.upperCamelKeepingCase(e.name))
                nameValues(e)
            }
            for s in file.services {
                var used = Set(["serviceName", "methods", "all", "client"])
                for m in s.methods {
                    var n = SwiftNames.lowerCamel(m.name)
                    if SwiftNames.reservedMembers.contains(n) { n += "_" }
                    while used.contains(n) || used.contains(n + "WithMetadata") { n += "_" }
                    used.insert(n)
                    used.insert(n + "WithMetadata")
                    m.swiftName = n
                }
            }
        }
    }

    private func nameNested(_ m: MessageModel) {
        for n in m.nested {
            n.swiftName = m.swiftName + "." + SwiftNames.nestedTypeName(n.name, suffix: "Message")
            nameNested(n)
        }
        for e in m.enums {
            e.swiftName = m.swiftName + "." + SwiftNames.nestedTypeName(e.name, suffix: "Enum")
            nameValues(e)
        }
        var used = Set<String>()
        func claim(_ base: String, extras: (String) -> [String]) -> String {
            var n = base
            while used.contains(n) || extras(n).contains(where: used.contains) { n += "_p" }
            used.insert(n)
            for e in extras(n) { used.insert(e) }
            return n
        }
        for f in m.fields where f.oneof == nil {
            let singularMessage = f.message != nil && !f.isRepeated
            f.swiftName = claim(SwiftNames.fieldName(f.name)) { n in
                singularMessage ? ["has" + upperFirst(n), "clear" + upperFirst(n), "_" + n] : []
            }
        }
        for o in m.oneofs {
            o.swiftName = claim(SwiftNames.fieldName(o.name)) { _ in [] }
            o.swiftTypeName = "OneOf_" + SwiftNames.upperCamel(o.name)
            for f in o.fields { f.swiftName = claim(SwiftNames.fieldName(f.name)) { _ in [] } }
        }
    }

    private func nameValues(_ e: EnumModel) {
        var used = Set<String>()
        for i in e.values.indices {
            var n = SwiftNames.enumCaseName(e.values[i].name, enumName: e.name)
            while used.contains(n) { n += "_" }
            used.insert(n)
            e.values[i].swiftName = n
        }
    }
}

func upperFirst(_ s: String) -> String {
    let t = s.hasPrefix("`") ? String(s.dropFirst().dropLast()) : s
    return t.prefix(1).uppercased() + t.dropFirst()
}
