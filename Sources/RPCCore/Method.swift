/// The four gRPC call shapes.
public enum CallKind: String, Sendable, Hashable {
    case unary
    case serverStreaming
    case clientStreaming
    case bidirectionalStreaming

    public var clientStreams: Bool { self == .clientStreaming || self == .bidirectionalStreaming }
    public var serverStreams: Bool { self == .serverStreaming || self == .bidirectionalStreaming }
}

/// Whether a method may be called from outside the cluster, as the contracts mark it
/// (see `Proto/README.md`).
public enum MethodVisibility: String, Sendable, Hashable {
    /// Reachable through the gateway without a token (sign up, log in, ...).
    case publicAnonymous
    /// Reachable through the gateway with a valid access token.
    case publicAuthenticated
    /// Only callable by another service, with a service credential.
    case `internal`
}

/// Describes one RPC: its path on the wire and its shape. Generated code builds one per method.
/// A class: every call carries its method's descriptor around, and a reference is one retain
/// where a struct of five strings is five.
public final class MethodDescriptor: Sendable, Hashable, CustomStringConvertible {
    /// Fully qualified service name (`accounts.v1.Accounts`).
    public let service: String
    /// Method name as in the `.proto` (`SignUp`).
    public let method: String
    public let kind: CallKind
    public let visibility: MethodVisibility
    public let inputType: String
    public let outputType: String
    /// The HTTP/2 `:path`: `/package.Service/Method`.
    public let path: String
    /// Largest request message this method accepts (bytes of the protobuf encoding), from the
    /// contracts' `(common.v1.max_request_bytes)` option; for our contracts an unset option means
    /// `defaultMaxRequestBytes`. nil (methods of protos without our options: health, reflection,
    /// the interop test service): only the server's own limit applies. A server refuses a larger
    /// message from its length prefix: the limit is `min(server limit, this)`.
    public let maxRequestBytes: Int?
    /// A method of the standard infrastructure services (health, reflection: `infrastructureServices`),
    /// which need no credential anywhere. Decided once here, so the per-call checks (the gateway's
    /// policy, every service's credential check) read a flag instead of comparing or hashing the
    /// service name, or retaining a shared set, on every call.
    public let isInfrastructure: Bool

    /// The services whose calls need no credential: load balancers poll health, tools read
    /// reflection (`RPCServices.StandardServices.standardNames` names the same three).
    public static let infrastructureServices = [
        "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
    ]

    /// What `(common.v1.max_request_bytes)` means when a method of our contracts does not set it.
    public static let defaultMaxRequestBytes = 64 * 1024

    public init(
        service: String, method: String, kind: CallKind, visibility: MethodVisibility = .internal,
        inputType: String = "", outputType: String = "", maxRequestBytes: Int? = nil
    ) {
        self.service = service
        self.method = method
        self.kind = kind
        self.visibility = visibility
        self.inputType = inputType
        self.outputType = outputType
        self.maxRequestBytes = maxRequestBytes
        self.path = "/\(service)/\(method)"
        self.isInfrastructure = Self.infrastructureServices.contains(service)
    }

    public var description: String { path }

    public static func == (a: MethodDescriptor, b: MethodDescriptor) -> Bool {
        a === b
            || (a.path == b.path && a.kind == b.kind && a.visibility == b.visibility
                && a.inputType == b.inputType && a.outputType == b.outputType && a.maxRequestBytes == b.maxRequestBytes)
    }

    public func hash(into h: inout Hasher) { h.combine(path) }
}
