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
public struct MethodDescriptor: Sendable, Hashable, CustomStringConvertible {
    /// Fully qualified service name (`accounts.v1.Accounts`).
    public var service: String
    /// Method name as in the `.proto` (`SignUp`).
    public var method: String
    public var kind: CallKind
    public var visibility: MethodVisibility
    public var inputType: String
    public var outputType: String

    public init(service: String, method: String, kind: CallKind, visibility: MethodVisibility = .internal,
                inputType: String = "", outputType: String = "") {
        self.service = service
        self.method = method
        self.kind = kind
        self.visibility = visibility
        self.inputType = inputType
        self.outputType = outputType
    }

    /// The HTTP/2 `:path`: `/package.Service/Method`.
    public var path: String { "/\(service)/\(method)" }
    public var description: String { path }
}
