/// Emits, per service: the method table (`<Pkg>_<Service>Methods`), the server protocol
/// (`<Pkg>_<Service>Service`) with its `RPCService` extension, and the client stub
/// (`<Pkg>_<Service>Client`).
struct ServiceEmitter {
    let service: ServiceModel
    let file: FileModel

    var base: String { SwiftNames.packagePrefix(file.package) + service.name }
    var protocolName: String { service.name.hasSuffix("Service") ? base : base + "Service" }
    var methodsName: String { base + "Methods" }
    var clientName: String { base + "Client" }

    /// `, maxRequestBytes: N` for methods of files that use our options (`common/v1/options.proto`):
    /// the option's value, else the contracts' default (`MethodDescriptor.defaultMaxRequestBytes`,
    /// 64 KiB). Nothing for other protos (gRPC's own), which only the server's limit governs.
    func maxRequestBytesArgument(_ m: MethodModel) -> String {
        guard file.dependencies.contains("common/v1/options.proto") else { return "" }
        if let n = m.maxRequestBytes { return ", maxRequestBytes: \(n)" }
        return ", maxRequestBytes: RPCCore.MethodDescriptor.defaultMaxRequestBytes"
    }

    func emit(_ p: inout Printer) {
        let comment = file.comments[service.path]
        // Method table.
        p.line()
        p.line("/// Method descriptors of `\(service.fullName)`: paths, call kinds (from the `.proto`'s `stream`")
        p.line("/// markers) and visibility (from the `(common.v1.access)` option).")
        p.block("public enum \(methodsName) {") { p in
            p.line("public static let serviceName = \(service.fullName.swiftLiteral)")
            for m in service.methods {
                p.doc(file.comments[m.path])
                p.line("public static let \(SwiftNames.escaped(m.swiftName)) = RPCCore.MethodDescriptor(")
                p.line("    service: serviceName, method: \(m.name.swiftLiteral), kind: .\(m.kind), visibility: .\(m.visibility),")
                p.line("    inputType: \(m.input.fullName.swiftLiteral), outputType: \(m.output.fullName.swiftLiteral)\(maxRequestBytesArgument(m)))")
            }
            let all = service.methods.map { SwiftNames.escaped($0.swiftName) }.joined(separator: ", ")
            p.line("/// Every method, in `.proto` order.")
            p.line("public static let all: [RPCCore.MethodDescriptor] = [\(all)]")
        }

        // Server protocol.
        p.line()
        p.doc(comment)
        if comment != nil { p.line("///") }
        p.line("/// Server side of `\(service.fullName)`: implement the methods, register the value with a router.")
        p.block("public protocol \(protocolName): RPCCore.RPCService {") { p in
            for m in service.methods {
                p.doc(file.comments[m.path])
                p.line(
                    "func \(SwiftNames.escaped(m.swiftName))(\(serverParameters(m))) async throws\(!m.serverStreaming ? " -> " + m.output.swiftName : "")"
                )
            }
        }
        p.line()
        p.block("extension \(protocolName) {") { p in
            p.line("public var serviceName: String { \(methodsName).serviceName }")
            p.line()
            p.block("public var methods: [RPCCore.ServerMethod] {") { p in
                p.block("[", "]") { p in
                    for m in service.methods {
                        let req = m.input.swiftName, res = m.output.swiftName, fn = SwiftNames.escaped(m.swiftName)
                        let d = "\(methodsName).\(fn)"
                        switch (m.clientStreaming, m.serverStreaming) {
                        case (false, false):
                            p.line("RPCCore.ServerMethod(\(d), .unary(\(req).self, \(res).self) { try await self.\(fn)(request: $0, context: $1) }),")
                        case (false, true):
                            p.line(
                                "RPCCore.ServerMethod(\(d), .serverStreaming(\(req).self, \(res).self) { try await self.\(fn)(request: $0, responses: $1, context: $2) }),"
                            )
                        case (true, false):
                            p.line(
                                "RPCCore.ServerMethod(\(d), .clientStreaming(\(req).self, \(res).self) { try await self.\(fn)(requests: $0, context: $1) }),"
                            )
                        case (true, true):
                            p.line(
                                "RPCCore.ServerMethod(\(d), .bidirectionalStreaming(\(req).self, \(res).self) { try await self.\(fn)(requests: $0, responses: $1, context: $2) }),"
                            )
                        }
                    }
                }
            }
        }

        // Client stub.
        p.line()
        p.line("/// Typed client for `\(service.fullName)`. Failures throw `RPCError` with the server's status.")
        p.block("public struct \(clientName): Sendable {") { p in
            p.line("public let client: RPCCore.RPCClient")
            p.line("public init(_ client: RPCCore.RPCClient) { self.client = client }")
            for m in service.methods {
                p.line()
                emitClientMethod(m, &p)
            }
        }
    }

    func serverParameters(_ m: MethodModel) -> String {
        let req = m.input.swiftName, res = m.output.swiftName
        switch (m.clientStreaming, m.serverStreaming) {
        case (false, false): return "request: \(req), context: RPCCore.ServerContext"
        case (false, true): return "request: \(req), responses: RPCCore.ResponseWriter<\(res)>, context: RPCCore.ServerContext"
        case (true, false): return "requests: RPCCore.MessageStream<\(req)>, context: RPCCore.ServerContext"
        case (true, true): return "requests: RPCCore.MessageStream<\(req)>, responses: RPCCore.ResponseWriter<\(res)>, context: RPCCore.ServerContext"
        }
    }

    func docWithSeparator(_ comment: String?, _ p: inout Printer) {
        guard comment != nil else { return }
        p.doc(comment)
        p.line("///")
    }

    func emitClientMethod(_ m: MethodModel, _ p: inout Printer) {
        let req = m.input.swiftName, res = m.output.swiftName
        let fn = SwiftNames.escaped(m.swiftName)
        let d = "\(methodsName).\(fn)"
        let opts = "options: RPCCore.CallOptions = .defaults"
        switch (m.clientStreaming, m.serverStreaming) {
        case (false, false):
            p.doc(file.comments[m.path])
            p.block("public func \(fn)(_ request: \(req), \(opts)) async throws -> \(res) {") { p in
                p.line("try await client.unary(\(d), request, as: \(res).self, options: options).message")
            }
            p.line("/// `\(m.swiftName)` with the response metadata.")
            p.block("public func \(m.swiftName)WithMetadata(_ request: \(req), \(opts)) async throws -> RPCCore.ClientResponse<\(res)> {") { p in
                p.line("try await client.unary(\(d), request, as: \(res).self, options: options)")
            }
        case (false, true):
            docWithSeparator(file.comments[m.path], &p)
            p.line("/// `body` reads the responses; the call ends when it returns.")
            p.block(
                "public func \(fn)<R: Sendable>(_ request: \(req), \(opts), _ body: (RPCCore.ClientStreamingResponse<\(res)>) async throws -> R) async throws -> R {"
            ) { p in
                p.line("try await client.serverStreaming(\(d), request, as: \(res).self, options: options, body)")
            }
        case (true, false):
            docWithSeparator(file.comments[m.path], &p)
            p.line("/// `send` writes the requests; the request stream is closed when it returns.")
            p.block("public func \(fn)(\(opts), _ send: (RPCCore.RequestWriter<\(req)>) async throws -> Void) async throws -> \(res) {") { p in
                p.line("try await client.clientStreaming(\(d), as: \(res).self, options: options, send).message")
            }
            p.line("/// `\(m.swiftName)` with the response metadata.")
            p.block(
                "public func \(m.swiftName)WithMetadata(\(opts), _ send: (RPCCore.RequestWriter<\(req)>) async throws -> Void) async throws -> RPCCore.ClientResponse<\(res)> {"
            ) { p in
                p.line("try await client.clientStreaming(\(d), as: \(res).self, options: options, send)")
            }
        case (true, true):
            docWithSeparator(file.comments[m.path], &p)
            p.line("/// `body` writes requests and reads responses (concurrently if it wants); the call ends when it returns.")
            p.block(
                "public func \(fn)<R: Sendable>(\(opts), _ body: (RPCCore.RequestWriter<\(req)>, RPCCore.ClientStreamingResponse<\(res)>) async throws -> R) async throws -> R {"
            ) { p in
                p.line("try await client.bidirectionalStreaming(\(d), as: \(res).self, options: options, body)")
            }
        }
    }
}
