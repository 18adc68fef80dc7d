/// gRPC status codes, numbered as the gRPC protocol numbers them on the wire (`grpc-status`).
public enum StatusCode: Int, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case ok = 0
    case cancelled = 1
    case unknown = 2
    case invalidArgument = 3
    case deadlineExceeded = 4
    case notFound = 5
    case alreadyExists = 6
    case permissionDenied = 7
    case resourceExhausted = 8
    case failedPrecondition = 9
    case aborted = 10
    case outOfRange = 11
    case unimplemented = 12
    case `internal` = 13
    case unavailable = 14
    case dataLoss = 15
    case unauthenticated = 16

    /// The canonical upper-case name (`INVALID_ARGUMENT`), as grpc-go and grpcio print it.
    public var name: String {
        switch self {
        case .ok: "OK"
        case .cancelled: "CANCELLED"
        case .unknown: "UNKNOWN"
        case .invalidArgument: "INVALID_ARGUMENT"
        case .deadlineExceeded: "DEADLINE_EXCEEDED"
        case .notFound: "NOT_FOUND"
        case .alreadyExists: "ALREADY_EXISTS"
        case .permissionDenied: "PERMISSION_DENIED"
        case .resourceExhausted: "RESOURCE_EXHAUSTED"
        case .failedPrecondition: "FAILED_PRECONDITION"
        case .aborted: "ABORTED"
        case .outOfRange: "OUT_OF_RANGE"
        case .unimplemented: "UNIMPLEMENTED"
        case .internal: "INTERNAL"
        case .unavailable: "UNAVAILABLE"
        case .dataLoss: "DATA_LOSS"
        case .unauthenticated: "UNAUTHENTICATED"
        }
    }

    public var description: String { name }

    /// Maps an HTTP status to a gRPC code, per gRPC's `http-grpc-status-mapping.md`,
    /// for responses that are not gRPC at all.
    public init(httpStatus: Int) {
        switch httpStatus {
        case 400: self = .internal
        case 401: self = .unauthenticated
        case 403: self = .permissionDenied
        case 404: self = .unimplemented
        case 429, 502, 503, 504: self = .unavailable
        default: self = .unknown
        }
    }
}

/// The one error type that reaches the wire. Every failure a handler wants a client to see is an
/// `RPCError`; any other error thrown by a handler becomes `INTERNAL` with a generic message (its
/// text is logged, never sent, so internals do not leak).
public struct RPCError: Error, Sendable, Hashable, CustomStringConvertible {
    public var code: StatusCode
    public var message: String
    /// Extra trailing metadata sent with the status.
    public var trailers: Metadata
    /// Serialized `google.rpc.Status`, sent as `grpc-status-details-bin` when present.
    public var details: [UInt8]?
    /// What caused it (a storage failure, a peer's error): logged by the server, never sent.
    /// Not part of equality: two errors with the same status are the same answer.
    public var cause: (any Error & Sendable)?

    public init(
        _ code: StatusCode, _ message: String, trailers: Metadata = Metadata(), details: [UInt8]? = nil,
        cause: (any Error & Sendable)? = nil
    ) {
        self.code = code
        self.message = message
        self.trailers = trailers
        self.details = details
        self.cause = cause
    }

    public var description: String {
        guard let cause else { return "\(code.name): \(message)" }
        return "\(code.name): \(message) (cause: \(cause))"
    }

    /// The same error with `cause` attached.
    public func causedBy(_ cause: any Error & Sendable) -> RPCError {
        var e = self
        e.cause = cause
        return e
    }

    public static func == (a: RPCError, b: RPCError) -> Bool {
        a.code == b.code && a.message == b.message && a.trailers == b.trailers && a.details == b.details
    }

    public func hash(into h: inout Hasher) {
        h.combine(code)
        h.combine(message)
        h.combine(details)
    }

    public static func invalidArgument(_ m: String) -> RPCError { .init(.invalidArgument, m) }
    public static func notFound(_ m: String) -> RPCError { .init(.notFound, m) }
    public static func alreadyExists(_ m: String) -> RPCError { .init(.alreadyExists, m) }
    public static func permissionDenied(_ m: String) -> RPCError { .init(.permissionDenied, m) }
    public static func unauthenticated(_ m: String) -> RPCError { .init(.unauthenticated, m) }
    public static func failedPrecondition(_ m: String) -> RPCError { .init(.failedPrecondition, m) }
    public static func resourceExhausted(_ m: String) -> RPCError { .init(.resourceExhausted, m) }
    public static func unavailable(_ m: String) -> RPCError { .init(.unavailable, m) }
    public static func unimplemented(_ m: String) -> RPCError { .init(.unimplemented, m) }
    public static func `internal`(_ m: String) -> RPCError { .init(.internal, m) }
    public static func deadlineExceeded(_ m: String = "deadline exceeded") -> RPCError { .init(.deadlineExceeded, m) }
    public static func cancelled(_ m: String = "call cancelled") -> RPCError { .init(.cancelled, m) }
}

/// A call's final status, as read from trailers.
public struct RPCStatus: Sendable, Hashable {
    public var code: StatusCode
    public var message: String
    public init(_ code: StatusCode, _ message: String = "") { self.code = code; self.message = message }
    public static let ok = RPCStatus(.ok)
}
