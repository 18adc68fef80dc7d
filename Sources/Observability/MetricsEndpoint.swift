import RPCCore

/// `GET /metrics` (and `HEAD`) in the Prometheus text format, on a process's own port, over
/// HTTP/1.1 or HTTP/2 (Prometheus scrapes with HTTP/1.1). A service's only plain-HTTP route:
/// anything else is 404, another method on /metrics 405. Bodies are never read (limit 0).
public struct MetricsEndpoint: HTTPHandler {
    public static let path = "/metrics"

    public init() { ProcessMetrics.bootstrap() }

    /// The answer to a metrics request, or nil when the request is not for /metrics (the
    /// gateway's own handler asks first).
    public static func respond(to request: HTTPRequest) -> HTTPResponse? {
        guard request.path == Self.path[...] else { return nil }
        guard request.method == "GET" || request.method == "HEAD" else {
            return HTTPResponse(
                status: 405, headers: [("allow", "GET, HEAD"), ("content-type", "text/plain")],
                body: Array("\(Self.path) answers GET and HEAD only\n".utf8))
        }
        let body = ProcessMetrics.expositionBytes()
        return HTTPResponse(
            status: 200, headers: [("content-type", ProcessMetrics.contentType), ("cache-control", "no-store")],
            body: request.method == "HEAD" ? [] : body)
    }

    public func maxBodyBytes(method: String, path: Substring) -> Int? { 0 }

    public func respondAtHead(_ request: HTTPRequest) -> HTTPResponse? {
        if request.path == Self.path[...] { return nil }
        return HTTPResponse(
            status: 404, headers: [("content-type", "text/plain")],
            body: Array("not found: this port serves gRPC, and GET \(Self.path)\n".utf8))
    }

    public func handle(_ request: HTTPRequest) async -> HTTPResponse {
        Self.respond(to: request)
            ?? HTTPResponse(status: 404, headers: [("content-type", "text/plain")], body: Array("not found\n".utf8))
    }
}
