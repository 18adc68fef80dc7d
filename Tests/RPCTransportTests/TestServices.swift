import RPCCore
import Synchronization

/// Request texts of Sleep handlers that have started ("<seconds>#<tag>"), so a test can wait
/// until its own call is really in flight.
let sleepsStarted = Mutex<Set<String>>([])

/// A message whose wire form is its bytes: lets transport tests run without generated code.
struct Bytes: ProtoMessage {
    static var protoMessageName: String { "test.Bytes" }
    var data: [UInt8] = []
    init() {}
    init(_ data: [UInt8]) { self.data = data }
    init(_ s: String) { self.data = Array(s.utf8) }
    init(serializedBytes: [UInt8]) throws {
        if serializedBytes.first == 0xFF { throw MessageDecodingError(messageName: Self.protoMessageName) }
        data = serializedBytes
    }
    func serializedBytes() -> [UInt8] { data }
    var text: String { String(decoding: data, as: UTF8.self) }
}

/// Echo service covering the four call kinds and the transport's edge cases.
struct EchoService: RPCService {
    var serviceName: String { "test.Echo" }
    static func d(_ m: String, _ k: CallKind) -> MethodDescriptor { MethodDescriptor(service: "test.Echo", method: m, kind: k) }
    static let unaryMethod = d("Unary", .unary)
    static let serverStreamMethod = d("Expand", .serverStreaming)
    static let clientStreamMethod = d("Collect", .clientStreaming)
    static let bidiMethod = d("Chat", .bidirectionalStreaming)
    static let sleepMethod = d("Sleep", .unary)
    static let failMethod = d("Fail", .unary)

    var methods: [ServerMethod] {
        [
            ServerMethod(
                Self.unaryMethod,
                .unary(Bytes.self, Bytes.self) { req, ctx in
                    if let echo = ctx.requestMetadata["x-echo-initial"] { ctx.initialMetadata.add("x-echo-initial", echo) }
                    if let bin = ctx.requestMetadata.binary("x-echo-trailing-bin") { ctx.trailers.add("x-echo-trailing-bin", binary: bin) }
                    return req
                }),
            ServerMethod(
                Self.serverStreamMethod,
                .serverStreaming(Bytes.self, Bytes.self) { req, out, _ in
                    // "n:size" → n messages of size bytes
                    let parts = req.text.split(separator: ":").compactMap { Int($0) }
                    for i in 0..<(parts.first ?? 0) {
                        try await out.write(Bytes([UInt8](repeating: UInt8(i % 256), count: parts.count > 1 ? parts[1] : 1)))
                    }
                }),
            ServerMethod(
                Self.clientStreamMethod,
                .clientStreaming(Bytes.self, Bytes.self) { reqs, _ in
                    var total = 0
                    for try await r in reqs { total += r.data.count }
                    return Bytes("\(total)")
                }),
            ServerMethod(
                Self.bidiMethod,
                .bidirectionalStreaming(Bytes.self, Bytes.self) { reqs, out, _ in
                    for try await r in reqs { try await out.write(r) }
                }),
            ServerMethod(
                Self.sleepMethod,
                .unary(Bytes.self, Bytes.self) { req, _ in
                    sleepsStarted.withLock { _ = $0.insert(req.text) }
                    try await Task.sleep(for: .seconds(Int(req.text.split(separator: "#").first ?? "") ?? 10))
                    return req
                }),
            ServerMethod(
                Self.failMethod,
                .unary(Bytes.self, Bytes.self) { req, ctx in
                    ctx.trailers.add("x-detail", "kept")
                    throw RPCError(.invalidArgument, req.text)
                }),
        ]
    }
}
