import RPCCore

/// Cross-origin access for browser clients: which web origins may call the gateway's RPCs from
/// a page (`GATEWAY_CORS_ORIGINS`, comma-separated; none by default, so a page served elsewhere
/// cannot call at all until an operator names its origin).
///
/// - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered from
///   the route table: 204 for a routed method and an allowed origin, with the methods that path
///   takes (`POST`, and `GET` for methods the contracts mark free of side effects), the request
///   headers the protocols need plus the custom ones asked for (never a reserved one), and a
///   bounded `Access-Control-Max-Age`; 403 for an origin not allowed or a method the path does
///   not take; 404 for a path that is not routed.
/// - Responses to an allowed origin carry `Access-Control-Allow-Origin: <that origin>` (never `*`
///   next to credentials), `Access-Control-Allow-Credentials: true`, `Vary: Origin` and the
///   exposed headers each protocol's clients read (`grpc-status`, `grpc-message`, ...).
/// - `*` allows any origin, without credentials: `Access-Control-Allow-Origin: *` and no
///   `Access-Control-Allow-Credentials` (a browser then sends no cookies; the bearer token in
///   `authorization` still works, it is a header the page sets).
public struct CORSPolicy: Sendable {
    /// Exact origins (`https://app.example.com`, `http://127.0.0.1:5173`), lower-cased.
    public private(set) var origins: Set<String> = []
    public private(set) var anyOrigin = false
    /// Seconds a browser may cache a preflight's answer (at most 7,200: Chromium's own cap).
    public var maxAge = 600

    public static let maxMaxAge = 7200

    /// Request headers every browser protocol may send (besides the CORS-safelisted ones).
    static let protocolRequestHeaders = [
        "authorization", "content-type", "accept", "accept-encoding", "content-encoding",
        "connect-protocol-version", "connect-timeout-ms", "connect-content-encoding", "connect-accept-encoding",
        "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "x-grpc-web", "x-user-agent",
    ]
    /// Response headers a page's script may read (the rest are hidden from it by the browser).
    static let exposedHeaders =
        "grpc-status, grpc-message, grpc-status-details-bin, grpc-encoding, grpc-accept-encoding, "
        + "connect-content-encoding, connect-accept-encoding, content-encoding, retry-after, ratelimit-policy, ratelimit"

    public init() {}

    /// From `GATEWAY_CORS_ORIGINS`: each entry `scheme://host[:port]` (no path), or `*`.
    public init(origins list: [String], maxAge: Int = 600) throws(CORSConfigurationError) {
        for raw in list {
            let o = raw[...].trimmingCharacters(in: " ").lowercased()
            if o.isEmpty { continue }
            if o == "*" {
                anyOrigin = true
                continue
            }
            guard Self.isOrigin(o) else { throw CORSConfigurationError(origin: raw) }
            origins.insert(o)
        }
        self.maxAge = min(max(0, maxAge), Self.maxMaxAge)
    }

    /// `http(s)://host[:port]` and nothing more (origins never have a path or a trailing slash).
    static func isOrigin(_ s: String) -> Bool {
        let rest: Substring
        if s.hasPrefix("https://") {
            rest = s.dropFirst(8)
        } else if s.hasPrefix("http://") {
            rest = s.dropFirst(7)
        } else {
            return false
        }
        guard !rest.isEmpty else { return false }
        return rest.utf8.allSatisfy { c in
            (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c == 45 || c == 46 || c == 58 || c == 91 || c == 93
        }
    }

    public var isEnabled: Bool { anyOrigin || !origins.isEmpty }

    public func allows(_ origin: String) -> Bool {
        anyOrigin || origins.contains(origin.lowercased())
    }

    /// The headers of an actual response to `origin` (empty when it is not allowed or absent).
    func responseHeaders(origin: String?) -> [(name: String, value: String)] {
        guard let origin, isEnabled, allows(origin) else {
            // The answer depends on the origin whenever exact origins are listed: a cache must
            // not hand this copy (without allow-origin) to a listed page, or the reverse.
            return origins.isEmpty ? [] : [("vary", "Origin")]
        }
        var h: [(name: String, value: String)] = []
        if origins.contains(origin.lowercased()) {
            h.append(("access-control-allow-origin", origin))
            h.append(("access-control-allow-credentials", "true"))
            h.append(("vary", "Origin"))
        } else {
            h.append(("access-control-allow-origin", "*"))
            // With exact origins listed too, the answer still depends on the origin.
            if !origins.isEmpty { h.append(("vary", "Origin")) }
        }
        h.append(("access-control-expose-headers", Self.exposedHeaders))
        return h
    }

    /// The answer to an `OPTIONS` request for a routed path that takes `methods`.
    func preflight(_ request: HTTPRequest, methods: [String]) -> HTTPResponse {
        let allow = methods.joined(separator: ", ") + ", OPTIONS"
        guard let origin = request.header("origin"), let wanted = request.header("access-control-request-method") else {
            // Not a preflight: what the path takes.
            return HTTPResponse(status: 204, headers: [("allow", allow)])
        }
        guard isEnabled, allows(origin) else {
            return Self.refusal("origin '\(origin)' may not call this gateway from a browser (GATEWAY_CORS_ORIGINS)")
        }
        guard methods.contains(wanted.uppercased()) else {
            return Self.refusal("\(request.path) takes \(methods.joined(separator: " or ")), not \(wanted)")
        }
        var headers = Self.protocolRequestHeaders
        if let asked = request.header("access-control-request-headers") {
            for name in asked.split(separator: ",") {
                let n = name.trimmingCharacters(in: " ").lowercased()
                guard !n.isEmpty, !headers.contains(n), HeaderBlockName.isToken(n), !HeaderPolicy.isStripped(n) else { continue }
                headers.append(n)
            }
        }
        var h: [(name: String, value: String)] = [
            ("access-control-allow-methods", allow),
            ("access-control-allow-headers", headers.joined(separator: ", ")),
            ("access-control-max-age", String(maxAge)),
            ("vary", "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"),
        ]
        if origins.contains(origin.lowercased()) {
            h.insert(("access-control-allow-origin", origin), at: 0)
            h.insert(("access-control-allow-credentials", "true"), at: 1)
        } else {
            h.insert(("access-control-allow-origin", "*"), at: 0)
        }
        return HTTPResponse(status: 204, headers: h)
    }

    static func refusal(_ message: String) -> HTTPResponse {
        HTTPResponse(
            status: 403, headers: [("content-type", "text/plain; charset=utf-8"), ("vary", "Origin")],
            body: Array((message + "\n").utf8))
    }
}

public struct CORSConfigurationError: Error, CustomStringConvertible {
    public let origin: String
    public var description: String {
        "GATEWAY_CORS_ORIGINS: '\(origin)' is not an origin (scheme://host[:port], no path) or *"
    }
}

/// Header-name checks the preflight needs.
enum HeaderBlockName {
    /// An HTTP token (RFC 9110): what a header name may be.
    static func isToken(_ s: String) -> Bool {
        s.utf8.allSatisfy { c in
            (c >= 97 && c <= 122) || (c >= 48 && c <= 57) || c == 45 || c == 95 || c == 46 || c == 33 || c == 35
                || c == 36 || c == 37 || c == 38 || c == 39 || c == 42 || c == 43 || c == 94 || c == 96 || c == 124
                || c == 126
        }
    }
}
