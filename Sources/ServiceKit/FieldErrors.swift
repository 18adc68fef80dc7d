import Contracts
import GRPCContracts
import RPCCore

/// Rejected request fields, collected and turned into one error that names them all: the message
/// lists them for people, `google.rpc.BadRequest` in `grpc-status-details-bin` for programs.
public struct FieldErrors: Sendable {
    public private(set) var violations: [(field: String, description: String)] = []
    /// Violations past `maxNamed`, counted but not listed.
    public private(set) var unnamed = 0
    public init() {}

    /// At most this many fields are named in one error, and its message is cut at `maxMessage`
    /// characters: a 64 KiB request of repeated bad values must not make a multi-megabyte answer
    /// (grpc-message and grpc-status-details-bin travel in headers that clients bound, ~8–16 KiB).
    public static let maxNamed = 64
    static let maxMessage = 1000

    public mutating func add(_ field: String, _ description: String) {
        if violations.count < Self.maxNamed { violations.append((field, description)) } else { unnamed += 1 }
    }
    public var isEmpty: Bool { violations.isEmpty }

    /// Throws INVALID_ARGUMENT (or `code`) naming every field, if any was rejected.
    public func throwIfAny(_ code: StatusCode = .invalidArgument, summary: String = "invalid request") throws {
        guard !violations.isEmpty else { return }
        throw error(code, summary: summary)
    }

    public func error(_ code: StatusCode = .invalidArgument, summary: String = "invalid request") -> RPCError {
        var text = violations.map { "\($0.field): \($0.description)" }.joined(separator: "; ")
        if unnamed > 0 { text += "; and \(unnamed) more" }
        if text.count > Self.maxMessage { text = String(text.prefix(Self.maxMessage)) + "…" }
        var bad = Google_Rpc_BadRequest()
        bad.fieldViolations = violations.map { v in
            var f = Google_Rpc_BadRequest.FieldViolation()
            f.field = v.field
            f.description_p = v.description
            return f
        }
        return RPCError.withDetails(code, "\(summary): \(text)", details: [("type.googleapis.com/google.rpc.BadRequest", bad.serializedBytes())])
    }

    /// A single-field error.
    public static func single(_ code: StatusCode, field: String, _ description: String) -> RPCError {
        var e = FieldErrors()
        e.add(field, description)
        return e.error(code, summary: summary(for: code))
    }

    /// The words before the field list, fitting the status ("invalid request: email: …",
    /// "already exists: username: …", "failed precondition: invite_code: …").
    static func summary(for code: StatusCode) -> String {
        switch code {
        case .alreadyExists: "already exists"
        case .failedPrecondition: "failed precondition"
        case .notFound: "not found"
        case .permissionDenied: "permission denied"
        case .resourceExhausted: "too large"
        case .outOfRange: "out of range"
        default: "invalid request"
        }
    }
}

extension RPCError {
    /// An error with typed details (`google.rpc.Status` in `grpc-status-details-bin`).
    public static func withDetails(_ code: StatusCode, _ message: String, details: [(typeURL: String, value: [UInt8])]) -> RPCError {
        var status = Google_Rpc_Status()
        status.code = Int32(code.rawValue)
        status.message = message
        status.details = details.map { d in
            var any = Google_Protobuf_Any()
            any.typeUrl = d.typeURL
            any.value = d.value
            return any
        }
        return RPCError(code, message, details: status.serializedBytes())
    }

    /// RESOURCE_EXHAUSTED (or `code`: UNAVAILABLE for load shedding) with `google.rpc.RetryInfo`
    /// saying when to try again, and a `retry-after` trailer.
    public static func retryLater(_ message: String, after delay: Duration, code: StatusCode = .resourceExhausted) -> RPCError {
        var info = Google_Rpc_RetryInfo()
        var d = Google_Protobuf_Duration()
        d.seconds = max(1, delay.components.seconds)
        info.retryDelay = d
        var error = withDetails(code, message, details: [("type.googleapis.com/google.rpc.RetryInfo", info.serializedBytes())])
        error.trailers.add("retry-after", String(d.seconds))
        return error
    }
}
