import Contracts
import Logging
import Observability
import RPCCore
import RPCTransport
import Security
import ServiceKit

/// The Connect protocol's unary calls (https://connectrpc.com/docs/protocol), for clients that do
/// not speak gRPC: `POST /<package>.<Service>/<Method>` with a JSON (or binary protobuf) body,
/// over HTTP/1.1 or HTTP/2 on the gateway's port. A call goes through the same router, policy
/// and proxy as gRPC; only the envelope differs. JSON is transcoded generically from the
/// descriptors (`JSONTranscoder`), so no method has code of its own.
///
/// Also serves `GET /` (a short text page), `GET /healthz` (200 while serving, else 503),
/// `GET /status` and `/status.json` (`StatusPage`), `GET /metrics`, and the
/// web pages of `TaskPages` (`/t/<link token>`, `/upload`), which call their methods through
/// the same router and policy (`invoke`).
struct ConnectHandler: HTTPHandler {
    let router: Router
    /// The policy's chain, run by each protocol around its decoding and the handler (the router's
    /// methods are not wrapped: the request is decoded after the policy).
    let interceptors: ServerInterceptors
    /// Tells the metrics and the access log of browser calls refused at their headers (the
    /// others it sees as the first of `interceptors`).
    var observing: ObservingInterceptor?
    let transcoder: JSONTranscoder
    let logger: Logger
    let statusPage: @Sendable () async -> (serving: Bool, text: String)
    /// Serves `GET /metrics` (off with the gateway's metrics), to whom `metricsAccess` lets in.
    var metrics = true
    var metricsAccess = MetricsAccess(token: nil)
    /// Serves `GET /status` and `/status.json` from it.
    var status: StatusBoard?
    /// The gateway's own cap on any request message (`GatewayConfiguration.maxRequestBytes`).
    var maxRequestBytes = Int.max
    /// Which web origins may call from a page (`GATEWAY_CORS_ORIGINS`).
    var cors = CORSPolicy()
    /// Unary methods the contracts mark free of side effects: Connect GET serves them.
    var sideEffectFree: Set<String> = []

    /// Request headers that belong to HTTP or Connect, not to the call's metadata.
    static let protocolHeaders: Set<String> = [
        "content-type", "content-length", "content-encoding", "accept-encoding", "accept", "host", "connection",
        "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "user-agent", "proxy-connection", "expect",
        "origin", "referer", "accept-language", "cache-control", "pragma", "http2-settings",
        "grpc-timeout", "grpc-encoding", "grpc-accept-encoding", "x-grpc-web", "x-user-agent", "priority", "dnt",
    ]

    /// A Connect call's body may be its message limit twice over plus 4 KiB: JSON spells field
    /// names and base64-encodes bytes (4/3), so the same message is larger than its protobuf
    /// encoding. The message limit is the method's (from the contracts), within the gateway's.
    /// Asked at the request head: a larger declared body is refused (`resource_exhausted`, HTTP
    /// 429 in Connect's table) before it is read.
    /// Other requests (unknown paths, pages): the server's limit.
    func maxBodyBytes(method: String, path: Substring) -> Int? {
        if status != nil && StatusPage.serves(path) { return 0 }
        if TaskPages.serves(path) { return TaskPages.maxBodyBytes(method: method, path: path) }
        guard method == "POST", case .success(let m) = router.lookup(String(path)),
            let limit = m.descriptor.maxRequestBytes
        else { return nil }
        return Self.bodyLimit(forRequestLimit: min(limit, maxRequestBytes))
    }

    static func bodyLimit(forRequestLimit limit: Int) -> Int { limit * 2 + 4 * 1024 }

    /// The gateway's own pages (not its methods): `/`, `/healthz`, the status page, `/metrics`,
    /// the task pages.
    func servesPage(_ path: Substring) -> Bool {
        path == "/" || path == "/healthz" || (status != nil && StatusPage.serves(path)) || (metrics && path == MetricsEndpoint.path[...])
            || TaskPages.serves(path)
    }

    func handle(_ request: HTTPRequest) async -> HTTPResponse {
        if request.method == "HEAD", servesPage(request.path) {
            // What GET would answer, length included; the transport sends no body (RFC 9110
            // §9.3.2: a HEAD's content-length is GET's).
            var get = request
            get.method = "GET"
            return await handle(get)
        }
        let path = String(request.path)
        if request.method == "GET" || request.method == "HEAD" {
            if path == "/" || path == "/healthz" { return await page(path) }
        }
        if let status, StatusPage.serves(request.path) { return StatusPage.respond(request, board: status) }
        if metrics, request.path == MetricsEndpoint.path[...], metricsAccess.allows(request),
            let response = MetricsEndpoint.respond(to: request)
        {
            return response
        }
        if TaskPages.serves(request.path) {
            let pages = TaskPages { path, input, request in try await self.invoke(path, input, request: request) }
            return await pages.handle(request)
        }
        let parts = path.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0].isEmpty, !parts[1].isEmpty, !parts[2].isEmpty else {
            return Self.text(404, "not found: \(path)\n")
        }
        let method: ServerMethod
        switch router.lookup(path) {
        case .failure(let e):
            if request.method == "OPTIONS" { return Self.text(404, "not found: \(path)\n") }
            var r = Self.error(e, status: 404)
            r.headers.append(contentsOf: cors.responseHeaders(origin: request.header("origin")))
            return r
        case .success(let m): method = m
        }
        if request.method == "OPTIONS" {
            return cors.preflight(request, methods: sideEffectFree.contains(path) ? ["GET", "POST"] : ["POST"])
        }
        var response = await serveRPC(request, method)
        response.headers.append(contentsOf: cors.responseHeaders(origin: request.header("origin")))
        return response
    }

    /// A routed method, in whichever protocol the request speaks: gRPC-Web, Connect streaming,
    /// Connect unary (POST, or GET for methods free of side effects).
    private func serveRPC(_ request: HTTPRequest, _ method: ServerMethod) async -> HTTPResponse {
        let path = method.descriptor.path
        let contentType = request.header("content-type") ?? ""
        let media = Self.mediaType(request)
        if GRPCWeb.isGRPCWeb(mediaType: media) { return await serveGRPCWeb(request, method, mediaType: media) }
        if media == "application/connect+json" || media == "application/connect+proto" {
            return await serveConnectStream(request, method, json: media == "application/connect+json")
        }
        if request.method == "GET" {
            guard method.handler.kind == .unary else {
                var r = Self.error(RPCError(.unimplemented, "\(path) is a streaming method: Connect GET is for unary methods"), status: 405)
                r.headers.append(("allow", "POST"))
                return r
            }
            do {
                let (body, json) = try connectGetRequest(request, method)
                return await serveConnectUnary(request, method, body: body, json: json)
            } catch let unsupported as UnsupportedCodec {
                return Self.error(unsupported.error, status: 415)
            } catch {
                var r = Self.error(Self.rpcError(error))
                if !sideEffectFree.contains(path) {
                    r.status = 405
                    r.headers.append(("allow", "POST"))
                }
                return r
            }
        }
        guard request.method == "POST" else {
            var r = Self.error(RPCError(.unimplemented, "\(request.method) is not supported: Connect unary calls use POST"), status: 405)
            r.headers.append(("allow", sideEffectFree.contains(path) ? "GET, POST" : "POST"))
            return r
        }
        guard method.handler.kind == .unary else {
            return Self.error(
                RPCError(.unimplemented, "\(path) is a streaming method: call it with application/connect+json, gRPC-Web or gRPC"), status: 415)
        }

        // Envelope: content type, compression.
        let json: Bool
        switch media {
        case "application/json": json = true
        case "application/proto": json = false
        default:
            var r = Self.error(
                RPCError(
                    .unimplemented,
                    "unsupported content-type '\(contentType)': use application/json or application/proto (unary), application/connect+json or application/connect+proto (streaming), application/grpc-web(-text)"
                ),
                status: 415)
            r.headers.append(
                ("accept-post", "application/json, application/proto, application/connect+json, application/connect+proto, application/grpc-web"))
            return r
        }
        if json, contentType.utf8.contains(UInt8(ascii: ";")),
            let charset = contentType.lowercased().split(separator: ";").dropFirst().map({ $0.trimmingCharacters(in: " ") })
                .first(where: { $0.hasPrefix("charset=") }),
            !["charset=utf-8", "charset=\"utf-8\""].contains(charset)
        {
            return Self.error(RPCError(.unimplemented, "JSON must be UTF-8 (got \(charset))"), status: 415)
        }
        if let encoding = request.header("content-encoding"), encoding != "identity" {
            var r = Self.error(RPCError(.unimplemented, "content-encoding '\(encoding)' is not supported: send identity"))
            r.headers.append(("accept-encoding", "identity"))
            return r
        }
        return await serveConnectUnary(request, method, body: request.body, json: json)
    }

    /// A Connect unary call whose body (JSON or protobuf) has been read from the request.
    private func serveConnectUnary(_ request: HTTPRequest, _ method: ServerMethod, body requestBody: [UInt8], json: Bool) async -> HTTPResponse {
        let path = method.descriptor.path
        guard let body = method.handler.asyncUnary else {
            return Self.error(RPCError(.unimplemented, "\(path) is a streaming method: call it with application/connect+json"))
        }
        let context: ServerContext
        do { context = try admit(method, request, deadline: try Self.connectDeadline(request)) } catch {
            return Self.connectUnaryResponse(.failure(error), nil, json: json, transcoder: transcoder, logger: logger)
        }
        let transcoder = self.transcoder
        let chain = interceptors.chain { call in
            var input = try call.message()
            if json {
                do { input = try transcoder.encode(json: input, as: call.method.inputType) } catch let e as TranscodingError {
                    throw Self.badRequest(e, message: call.method.inputType)
                }
            }
            return try await body(input, call.context)
        }
        let result: Result<[UInt8], any Error>
        do { result = .success(try await chain(ServerCall(context: context, request: .message(requestBody)))) } catch { result = .failure(error) }
        return Self.connectUnaryResponse(result, context, json: json, transcoder: transcoder, logger: logger)
    }

    /// A Connect unary call's answer: the message (JSON or binary) with the headers and the
    /// trailers as `trailer-` headers, or the error body.
    static func connectUnaryResponse(
        _ result: Result<[UInt8], any Error>, _ context: ServerContext?, json: Bool, transcoder: JSONTranscoder, logger: Logger
    ) -> HTTPResponse {
        switch result {
        case .success(let output):
            guard let context else { return error(RPCError(.internal, "internal error")) }
            var headers: [(name: String, value: String)] = [("content-type", json ? "application/json" : "application/proto")]
            append(context.initialMetadata, to: &headers, prefix: "")
            append(context.trailers, to: &headers, prefix: "trailer-")
            guard json else { return HTTPResponse(status: 200, headers: headers, body: output) }
            do {
                return HTTPResponse(status: 200, headers: headers, body: try transcoder.decode(output, as: context.method.outputType))
            } catch {
                return Self.error(RPCError(.internal, "the response could not be shown as JSON: \(error)"))
            }
        case .failure(let e as RPCError):
            var r = error(e, transcoder: transcoder)
            if let context { append(context.initialMetadata, to: &r.headers, prefix: "") }
            return r
        case .failure(is CancellationError):
            return error(RPCError.cancelled())
        case .failure(let e):
            logger.error("Connect call \(context?.method.path ?? "") failed: \(e)")
            return error(RPCError(.internal, "internal error"))
        }
    }

    /// Calls the unary method at `path` with `input` (protobuf) for a page, through the same
    /// interceptors (the address's rate limit, the method's marking) and relay as a Connect call.
    func invoke(_ path: String, _ input: [UInt8], request: HTTPRequest) async throws -> [UInt8] {
        guard case .success(let method) = router.lookup(path), let body = method.handler.asyncUnary else {
            throw RPCError(.unimplemented, "\(path) is not routed by this gateway")
        }
        let context = ServerContext(
            method: method.descriptor, requestMetadata: Metadata(), deadline: .now + .seconds(30), peer: request.peer,
            authority: request.header("host") ?? "")
        return try await interceptors.chain { call in try await body(call.message(), call.context) }(
            ServerCall(context: context, request: .message(input)))
    }

    /// INVALID_ARGUMENT naming the field, with a `google.rpc.BadRequest` for programs.
    static func badRequest(_ error: TranscodingError, message: String) -> RPCError {
        var violation = Google_Rpc_BadRequest.FieldViolation()
        violation.field = error.field.isEmpty ? "(body)" : error.field
        violation.description_p = error.reason
        var bad = Google_Rpc_BadRequest()
        bad.fieldViolations = [violation]
        return RPCError.withDetails(
            .invalidArgument, "invalid \(message) JSON: \(error)",
            details: [("type.googleapis.com/google.rpc.BadRequest", bad.serializedBytes())])
    }

    /// A header of HTTP, CORS, Connect or gRPC-Web rather than of the call. Prefixes first, by
    /// their first byte (cheap), then the set.
    static func isProtocolHeader(_ name: String) -> Bool {
        switch name.utf8.first {
        case UInt8(ascii: ":"): return true
        case UInt8(ascii: "c"): if name.hasPrefix("connect-") { return true }
        case UInt8(ascii: "s"): if name.hasPrefix("sec-") { return true }
        case UInt8(ascii: "a"): if name.hasPrefix("access-control-") { return true }
        default: break
        }
        return protocolHeaders.contains(name)
    }

    /// Connect headers → call metadata (`-bin` values are base64).
    static func metadata(_ headers: [(name: String, value: String)]) throws -> Metadata {
        var m = Metadata()
        for (name, value) in headers {
            if Self.isProtocolHeader(name) || Metadata.isReserved(name) { continue }
            if name.hasSuffix("-bin") {
                guard let bytes = Base64.decode(value) else { throw RPCError(.invalidArgument, "header '\(name)' is not valid base64") }
                m.add(name, binary: bytes)
            } else {
                m.add(name, value)
            }
        }
        return m
    }

    static func append(_ metadata: Metadata, to headers: inout [(name: String, value: String)], prefix: String) {
        for (key, value) in metadata where !Metadata.isReserved(key) {
            switch value {
            case .string(let s): headers.append((prefix + key, s))
            case .binary(let b): headers.append((prefix + key, Base64.encode(b)))
            }
        }
    }

    // MARK: Errors

    /// Connect's name for a code (`canceled` is spelt the American way).
    static func connectCode(_ code: StatusCode) -> String {
        code == .cancelled ? "canceled" : code.name.lowercased()
    }

    /// The HTTP status the Connect protocol gives each code.
    static func httpStatus(_ code: StatusCode) -> Int {
        switch code {
        case .ok: 200
        case .cancelled: 499
        case .unknown: 500
        case .invalidArgument: 400
        case .deadlineExceeded: 504
        case .notFound: 404
        case .alreadyExists: 409
        case .permissionDenied: 403
        case .resourceExhausted: 429
        case .failedPrecondition: 400
        case .aborted: 409
        case .outOfRange: 400
        case .unimplemented: 501
        case .internal: 500
        case .unavailable: 503
        case .dataLoss: 500
        case .unauthenticated: 401
        }
    }

    /// `{"code": "...", "message": "...", "details": [{"type", "value", "debug"}]}` with the
    /// code's HTTP status; trailers become `trailer-` headers, a limit's `retry-after` and
    /// RateLimit fields plain ones too.
    static func error(_ e: RPCError, status: Int? = nil, transcoder: JSONTranscoder? = nil) -> HTTPResponse {
        var headers: [(name: String, value: String)] = [("content-type", "application/json")]
        append(e.trailers, to: &headers, prefix: "trailer-")
        headers.append(contentsOf: limitHeaders(e))
        return HTTPResponse(status: status ?? httpStatus(e.code), headers: headers, body: JSONWriter.serialize(errorValue(e, transcoder: transcoder)))
    }

    /// A spent limit's `retry-after`, `ratelimit-policy` and `ratelimit` (`GatewayPolicy.limited`),
    /// as the HTTP headers they are for every protocol over HTTP (the RateLimit fields may not be
    /// trailers).
    static func limitHeaders(_ e: RPCError) -> [(name: String, value: String)] {
        guard e.code == .resourceExhausted else { return [] }
        return ["retry-after", "ratelimit-policy", "ratelimit"].compactMap { name in e.trailers[name].map { (name, $0) } }
    }

    /// `{"code": "...", "message": "...", "details": [...]}`: a unary error's body, a streaming
    /// end message's `error`.
    static func errorValue(_ e: RPCError, transcoder: JSONTranscoder?) -> JSONValue {
        var members: [(String, JSONValue)] = [("code", .string(connectCode(e.code)))]
        if !e.message.isEmpty { members.append(("message", .string(e.message))) }
        if let details = e.details {
            let items = Self.details(details, transcoder: transcoder)
            if !items.isEmpty { members.append(("details", .array(items))) }
        }
        return .object(members)
    }

    /// The `google.protobuf.Any`s of a serialized `google.rpc.Status`, as Connect error details.
    static func details(_ status: [UInt8], transcoder: JSONTranscoder?) -> [JSONValue] {
        var out: [JSONValue] = []
        var r = WireReader(status[...])
        while let (n, t) = try? r.tag() {
            guard n == 3, t == .lengthDelimited, let any = try? r.lengthDelimited() else {
                if (try? r.skip(t, number: n)) == nil { break }
                continue
            }
            var a = WireReader(any)
            var url = ""
            var value = ArraySlice<UInt8>()
            while let (an, at) = try? a.tag() {
                if an == 1, at == .lengthDelimited, let b = try? a.lengthDelimited() {
                    url = String(decoding: b, as: UTF8.self)
                } else if an == 2, at == .lengthDelimited, let b = try? a.lengthDelimited() {
                    value = b
                } else if (try? a.skip(at, number: an)) == nil {
                    break
                }
            }
            let type = String(url.split(separator: "/").last ?? "")
            var item: [(String, JSONValue)] = [("type", .string(type)), ("value", .string(Base64.encode(value)))]
            if let transcoder, let debug = try? transcoder.decodeValue(value, as: type) { item.append(("debug", debug)) }
            out.append(.object(item))
        }
        return out
    }

    static func text(_ status: Int, _ body: String) -> HTTPResponse {
        HTTPResponse(status: status, headers: [("content-type", "text/plain; charset=utf-8")], body: Array(body.utf8))
    }

    private func page(_ path: String) async -> HTTPResponse {
        let (serving, text) = await statusPage()
        if path == "/healthz" { return Self.text(serving ? 200 : 503, serving ? "ok\n" : "not serving\n") }
        return Self.text(200, text)
    }
}

/// Who may read the gateway's `/metrics`: the gateway's port is public, and its metrics say how
/// much each method is used and how it fails. With `GATEWAY_METRICS_TOKEN` set, a request bearing
/// that token (`Authorization: Bearer …`, compared in constant time); without it, loopback
/// clients only. Everyone else gets the 404 of an unknown path. (The services' ports are
/// internal: their `/metrics` is open to whoever reaches them.)
struct MetricsAccess: Sendable {
    let token: [UInt8]?
    init(token: String?) { self.token = token.map { Array($0.utf8) } }

    func allows(_ request: HTTPRequest) -> Bool {
        if let token {
            var headers = Metadata()
            if let value = request.header("authorization") { headers.add("authorization", value) }
            guard let presented = CredentialCheck.bearerToken(headers) else { return false }
            return ConstantTime.equals(String(presented), token)
        }
        let host = ServerContext.host(ofPeer: request.peer)
        return host == "::1" || host.hasPrefix("127.") || host.hasPrefix("::ffff:127.")
    }
}
