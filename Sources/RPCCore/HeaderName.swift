/// The header names gRPC gives a meaning to, recognised from raw bytes (HTTP/2 names arrive
/// lower-case) without making a String: the transports classify every header they receive, and
/// only metadata needs its name as a String.
public enum HeaderName: Sendable {
    case method, path, authority, scheme, status
    /// Any other pseudo-header.
    case otherPseudo
    case contentType, te, userAgent, host
    case grpcTimeout, grpcEncoding, grpcAcceptEncoding, grpcStatus, grpcMessage, grpcStatusDetailsBin
    /// Any other `grpc-*` name (reserved by the protocol).
    case otherGRPC
    /// Hop-by-hop and content headers that are never metadata (`content-length`, `connection`, ...).
    case otherReserved
    /// Everything else: application metadata.
    case metadata

    /// Whether the name is never application metadata.
    @inlinable public var isReserved: Bool { self != .metadata }

    public static func classify(_ name: UnsafeRawBufferPointer) -> HeaderName {
        guard let first = name.first else { return .metadata }
        switch first {
        case UInt8(ascii: ":"):
            if matches(name, ":path") { return .path }
            if matches(name, ":method") { return .method }
            if matches(name, ":authority") { return .authority }
            if matches(name, ":scheme") { return .scheme }
            if matches(name, ":status") { return .status }
            return .otherPseudo
        case UInt8(ascii: "g"):
            guard name.count >= 5, matches(UnsafeRawBufferPointer(rebasing: name[0..<5]), "grpc-") else { return .metadata }
            if matches(name, "grpc-timeout") { return .grpcTimeout }
            if matches(name, "grpc-encoding") { return .grpcEncoding }
            if matches(name, "grpc-accept-encoding") { return .grpcAcceptEncoding }
            if matches(name, "grpc-status") { return .grpcStatus }
            if matches(name, "grpc-message") { return .grpcMessage }
            if matches(name, "grpc-status-details-bin") { return .grpcStatusDetailsBin }
            return .otherGRPC
        case UInt8(ascii: "c"):
            if matches(name, "content-type") { return .contentType }
            if matches(name, "content-length") || matches(name, "connection") { return .otherReserved }
            return .metadata
        case UInt8(ascii: "t"):
            if matches(name, "te") { return .te }
            if matches(name, "transfer-encoding") { return .otherReserved }
            return .metadata
        case UInt8(ascii: "u"):
            if matches(name, "user-agent") { return .userAgent }
            if matches(name, "upgrade") { return .otherReserved }
            return .metadata
        case UInt8(ascii: "h"):
            return matches(name, "host") ? .host : .metadata
        case UInt8(ascii: "k"):
            return matches(name, "keep-alive") ? .otherReserved : .metadata
        case UInt8(ascii: "p"):
            return matches(name, "proxy-connection") ? .otherReserved : .metadata
        case UInt8(ascii: "a"):
            return matches(name, "accept-encoding") ? .otherReserved : .metadata
        default:
            return .metadata
        }
    }

    public static func classify(_ name: String) -> HeaderName {
        var name = name
        return name.withUTF8 { classify(UnsafeRawBufferPointer($0)) }
    }

    @inline(__always)
    static func matches(_ bytes: UnsafeRawBufferPointer, _ literal: StaticString) -> Bool {
        let n = literal.utf8CodeUnitCount
        guard bytes.count == n else { return false }
        let p = literal.utf8Start
        for i in 0..<n where bytes[i] != p[i] { return false }
        return true
    }

    /// Whether a metadata name carries binary values (`…-bin`, base64 on the wire).
    public static func isBinary(_ name: UnsafeRawBufferPointer) -> Bool {
        name.count > 4 && matches(UnsafeRawBufferPointer(rebasing: name[(name.count - 4)...]), "-bin")
    }

    /// Whether a `content-type` value is gRPC's: `application/grpc`, alone or followed by `+`
    /// (a codec, `+proto`) or `;` (parameters). `application/grpc-web` is another protocol.
    public static func isGRPCContentType(_ value: UnsafeRawBufferPointer) -> Bool {
        let prefix: StaticString = "application/grpc"
        let n = prefix.utf8CodeUnitCount
        guard value.count >= n, matches(UnsafeRawBufferPointer(rebasing: value[0..<n]), prefix) else { return false }
        return value.count == n || value[n] == UInt8(ascii: "+") || value[n] == UInt8(ascii: ";")
    }

    /// Whether a comma-separated encoding list (`grpc-accept-encoding`) names gzip.
    public static func listsGzip(_ value: UnsafeRawBufferPointer) -> Bool {
        var i = 0
        while i < value.count {
            while i < value.count && (value[i] == UInt8(ascii: " ") || value[i] == UInt8(ascii: ",")) { i += 1 }
            let start = i
            while i < value.count && value[i] != UInt8(ascii: ",") { i += 1 }
            var end = i
            while end > start && value[end - 1] == UInt8(ascii: " ") { end -= 1 }
            if end - start == 4 && matches(UnsafeRawBufferPointer(rebasing: value[start..<end]), "gzip") { return true }
        }
        return false
    }

    /// A non-negative decimal number (`:status`, `grpc-status`), nil when it is anything else.
    public static func decimal(_ value: UnsafeRawBufferPointer) -> Int? {
        guard !value.isEmpty, value.count <= 9 else { return nil }
        var n = 0
        for c in value {
            guard c >= UInt8(ascii: "0"), c <= UInt8(ascii: "9") else { return nil }
            n = n * 10 + Int(c - UInt8(ascii: "0"))
        }
        return n
    }
}
