import RPCCore
import RPCTransport

/// The browser protocols on top of the route table: gRPC-Web (`GRPCWeb`), Connect streaming and
/// Connect's unary GET. Every call goes through `admit` (metadata from the headers, the
/// deadline, the header-time refusals) and then the same interceptors' chain as gRPC (address
/// limit, token, user limit) around the request's decoding and the method's own handler (the
/// relay, which strips reserved headers and caps the deadline), so the policy is the gRPC
/// path's, not a copy of it, and it runs before the body is decoded. Only the envelope differs.
extension ConnectHandler {
    /// The request message limit of a method: the contracts' within the gateway's.
    func requestLimit(_ method: ServerMethod) -> Int {
        min(method.descriptor.maxRequestBytes ?? maxRequestBytes, maxRequestBytes)
    }

    /// The call's context from the request, and the refusals at the headers (the gRPC path's);
    /// the interceptors' chain runs next (`interceptors.chain`), around the decoding and the call.
    func admit(_ method: ServerMethod, _ request: HTTPRequest, deadline: ContinuousClock.Instant?) throws -> ServerContext {
        let context = try Self.context(method, request, deadline: deadline)
        if let error = interceptors.rejectAtHeaders(method.descriptor, context.requestMetadata) {
            observing?.refused(method.descriptor, peer: request.peer, error)
            throw error
        }
        return context
    }

    /// The call's context: metadata from the headers (protocol headers left out), the deadline.
    static func context(_ method: ServerMethod, _ request: HTTPRequest, deadline: ContinuousClock.Instant?) throws -> ServerContext {
        ServerContext(
            method: method.descriptor, requestMetadata: try metadata(request.headers), deadline: deadline, peer: request.peer,
            authority: request.header("host") ?? "")
    }

    /// The media type of the request's content type, lower-cased, without parameters.
    static func mediaType(_ request: HTTPRequest) -> String {
        guard let contentType = request.header("content-type") else { return "" }
        // Byte-wise first: most clients send a bare, lower-case type (this runs for every call).
        if !contentType.utf8.contains(where: { $0 == UInt8(ascii: ";") || $0 == 32 || ($0 >= 65 && $0 <= 90) }) { return contentType }
        return (contentType.lowercased().split(separator: ";").first ?? "").trimmingCharacters(in: " ")
    }

    // MARK: gRPC-Web

    func serveGRPCWeb(_ request: HTTPRequest, _ method: ServerMethod, mediaType: String) async -> HTTPResponse {
        let path = method.descriptor.path
        guard let format = GRPCWeb.format(mediaType: mediaType) else {
            return Self.grpcWebTrailersOnly(
                RPCError(.invalidArgument, "unsupported content-type '\(mediaType)': use \(GRPCWeb.supportedTypes)"),
                format: .binary, initial: Metadata(), httpStatus: 415)
        }
        guard request.method == "POST" else {
            var r = Self.grpcWebTrailersOnly(
                RPCError(.unimplemented, "gRPC-Web calls use POST, not \(request.method)"), format: format, initial: Metadata(), httpStatus: 405)
            r.headers.append(("allow", "POST"))
            return r
        }
        let kind = method.handler.kind
        guard kind == .unary || kind == .serverStreaming else {
            return Self.grpcWebTrailersOnly(
                RPCError(.unimplemented, "\(path) streams requests from the client, which gRPC-Web cannot: call it with gRPC"),
                format: format, initial: Metadata())
        }
        // The policy first (as for gRPC and Connect), then the body is read.
        let context: ServerContext
        do {
            context = try admit(method, request, deadline: try Self.grpcWebDeadline(request))
        } catch {
            return Self.grpcWebTrailersOnly(Self.rpcError(error), format: format, initial: Metadata())
        }

        switch method.handler.asyncServerStreaming {
        case let body?:
            let outputType = method.descriptor.outputType
            let transcoder = self.transcoder
            let relay = StreamRelay { message in
                format.wire(GRPCWeb.frame(format == .json ? try Self.json(message, as: outputType, transcoder) : message))
            }
            let chain = interceptors.chain { call in
                try await body(try self.grpcWebMessage(request, body: call.message(), method, format), call.sink(), call.context)
                return []
            }
            relay.start { sink in
                try await Self.bounded(by: context.deadline) {
                    _ = try await chain(ServerCall(context: context, request: .message(request.body), responses: sink))
                }
            }
            switch await relay.awaitHead() {
            case .ended(let error):
                // Nothing was sent: the status goes in the headers (trailers-only).
                let status = error.map { Self.rpcError($0) } ?? RPCError(.ok, "")
                return Self.grpcWebTrailersOnly(status, format: format, initial: context.initialMetadata, trailers: context.trailers)
            case .started:
                var headers: [(name: String, value: String)] = [("content-type", format.contentType)]
                Self.append(context.initialMetadata, to: &headers, prefix: "")
                return HTTPResponse(
                    status: 200, headers: headers,
                    stream: relay.body { status in format.wire(GRPCWeb.trailersFrame(status, trailers: context.trailers)) })
            }
        default:
            guard let unary = method.handler.asyncUnary else {
                return Self.grpcWebTrailersOnly(
                    RPCError(.unimplemented, "\(path) is not callable with gRPC-Web"), format: format, initial: Metadata())
            }
            let chain = interceptors.chain { call in
                try await unary(try self.grpcWebMessage(request, body: call.message(), method, format), call.context)
            }
            do {
                let output = try await chain(ServerCall(context: context, request: .message(request.body)))
                return Self.grpcWebUnaryResponse(
                    .success(output), context, format, acceptEncoding: request.header("accept-encoding"), transcoder: transcoder)
            } catch {
                return Self.grpcWebUnaryResponse(.failure(error), context, format, acceptEncoding: nil, transcoder: transcoder)
            }
        }
    }

    /// The one request message of a gRPC-Web call, from the body.
    func grpcWebMessage(_ request: HTTPRequest, body: [UInt8], _ method: ServerMethod, _ format: GRPCWeb.Format) throws -> [UInt8] {
        var body = body
        if let encoding = request.header("content-encoding"), encoding != "identity" {
            guard encoding == "gzip" else {
                throw RPCError(.unimplemented, "content-encoding '\(encoding)' is not supported: send gzip or identity")
            }
            body = try Gzip.inflateRequest(
                body, limit: ConnectHandler.bodyLimit(forRequestLimit: requestLimit(method)), what: "the request body", path: method.descriptor.path)
        }
        if format == .text {
            guard let decoded = GRPCWeb.decodeText(body) else {
                throw RPCError(.invalidArgument, "the application/grpc-web-text body is not base64")
            }
            body = decoded
        }
        let limit = requestLimit(method)
        let path = method.descriptor.path
        guard format == .json else {
            return try GRPCWeb.singleMessage(body, limit: limit, path: path, encoding: request.header("grpc-encoding"))
        }
        // JSON spells a message out: its frame may be as large as a Connect JSON body.
        let text = try GRPCWeb.singleMessage(
            body, limit: Self.bodyLimit(forRequestLimit: limit), path: path, encoding: request.header("grpc-encoding"))
        let input: [UInt8]
        do { input = try transcoder.encode(json: text, as: method.descriptor.inputType) } catch {
            throw Self.badRequest(error, message: method.descriptor.inputType)
        }
        if input.count > limit {
            throw RPCError(.resourceExhausted, "request message of \(input.count) bytes exceeds the limit of \(limit) bytes for \(path)")
        }
        return input
    }

    /// A response message as JSON (gRPC-Web's `+json`).
    static func json(_ message: [UInt8], as type: String, _ transcoder: JSONTranscoder) throws -> [UInt8] {
        do { return try transcoder.decode(message, as: type) } catch {
            throw RPCError(.internal, "a response could not be shown as JSON: \(error)")
        }
    }

    /// Runs a browser stream's work until `deadline`, then ends it with DEADLINE_EXCEEDED, as the
    /// gRPC transport's timer ends a gRPC call. A relayed call would end upstream at its deadline
    /// anyway; the gateway's own streams (health's `Watch`) would not. Unary calls need none: the
    /// gateway's own unary handlers answer at once. The timer sleeps on the
    /// global executor (a sleep on the event loop's executor does not wake when cancelled).
    static func bounded<T: Sendable>(
        by deadline: ContinuousClock.Instant?, _ work: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        guard let deadline else { return try await work() }
        return try await withThrowingTaskGroup(of: T?.self) { group in
            group.addTask { try await work() }
            group.addTask(executorPreference: globalConcurrentExecutor) {
                try await Task.sleep(until: deadline, clock: .continuous)
                return nil
            }
            defer { group.cancelAll() }
            guard case let value?? = try await group.next() else { throw RPCError.deadlineExceeded("deadline exceeded") }
            return value
        }
    }

    /// `grpc-timeout`: the call's deadline.
    static func grpcWebDeadline(_ request: HTTPRequest) throws -> ContinuousClock.Instant? {
        guard let t = request.header("grpc-timeout") else { return nil }
        guard let d = GRPCTimeout.parse(t) else {
            throw RPCError(.invalidArgument, "malformed grpc-timeout '\(t)': up to 8 digits and a unit (H, M, S, m, u, n)")
        }
        return .now + d
    }

    /// Connect's headers of a call: `connect-protocol-version` (1 when sent) and the deadline,
    /// `connect-timeout-ms`.
    static func connectDeadline(_ request: HTTPRequest) throws -> ContinuousClock.Instant? {
        if let version = request.header("connect-protocol-version"), version != "1" {
            throw RPCError(.invalidArgument, "connect-protocol-version must be 1, got '\(version)'")
        }
        guard let t = request.header("connect-timeout-ms") else { return nil }
        guard t.utf8.count <= 10, let ms = Int64(t), ms >= 0 else {
            throw RPCError(.invalidArgument, "connect-timeout-ms must be a non-negative integer of at most 10 digits")
        }
        return .now + .milliseconds(ms)
    }

    /// A unary call's answer: its message and the trailers frame, or trailers-only on failure.
    static func grpcWebUnaryResponse(
        _ result: Result<[UInt8], any Error>, _ context: ServerContext, _ format: GRPCWeb.Format, acceptEncoding: String?,
        transcoder: JSONTranscoder
    ) -> HTTPResponse {
        var output: [UInt8]
        switch result {
        case .success(let o): output = o
        case .failure(let error): return grpcWebTrailersOnly(rpcError(error), format: format, initial: context.initialMetadata)
        }
        if format == .json {
            do { output = try json(output, as: context.method.outputType, transcoder) } catch {
                return grpcWebTrailersOnly(rpcError(error), format: format, initial: context.initialMetadata)
            }
        }
        var body = GRPCWeb.frame(output)
        body.append(contentsOf: GRPCWeb.trailersFrame(RPCError(.ok, ""), trailers: context.trailers))
        var headers: [(name: String, value: String)] = [("content-type", format.contentType)]
        append(context.initialMetadata, to: &headers, prefix: "")
        var wire = format.wire(body)
        if wire.count > 1024, let acceptEncoding, acceptsGzip(acceptEncoding) {
            wire = Gzip.compress(wire)
            headers.append(("content-encoding", "gzip"))
            headers.append(("vary", "Accept-Encoding"))
        }
        return HTTPResponse(status: 200, headers: headers, body: wire)
    }

    // MARK: At the head, before the body

    /// Refusals that need only the head, sent before any of the body is read, in the request's
    /// protocol: a client-streaming or bidirectional method over a browser protocol (neither can
    /// stream a request, so waiting for the body's end would only hold the client), and an
    /// authenticated method without any credential (the gRPC path's header-time check: an
    /// anonymous client cannot make the gateway buffer a body it would refuse anyway).
    func respondAtHead(_ request: HTTPRequest) -> HTTPResponse? {
        guard request.method == "POST", let method = router.methods[String(request.path)] else { return nil }
        let media = Self.mediaType(request)
        guard let browser = BrowserProtocol(media: media) else { return nil }
        var refusal: RPCError?
        if case .grpcWeb = browser, GRPCWeb.format(mediaType: media) == nil {
            var r = Self.grpcWebTrailersOnly(
                RPCError(.invalidArgument, "unsupported content-type '\(media)': use \(GRPCWeb.supportedTypes)"),
                format: .binary, initial: Metadata(), httpStatus: 415)
            r.headers.append(contentsOf: cors.responseHeaders(origin: request.header("origin")))
            return r
        }
        if method.handler.kind.clientStreams {
            refusal = RPCError(
                .unimplemented, "\(method.descriptor.path) streams requests from the client, which browser protocols cannot: call it with gRPC")
        } else if method.descriptor.visibility == .publicAuthenticated, request.header("authorization") == nil,
            let metadata = try? Self.metadata(request.headers)
        {
            refusal = interceptors.rejectAtHeaders(method.descriptor, metadata)
            if let refusal { observing?.refused(method.descriptor, peer: request.peer, refusal) }
        }
        guard let refusal else { return nil }
        var r = protocolError(refusal, browser)
        r.headers.append(contentsOf: cors.responseHeaders(origin: request.header("origin")))
        return r
    }

    /// A body over the limit, answered in the request's protocol (a plain 413 would reach a
    /// gRPC-Web client as UNKNOWN, and a page without CORS headers as a network error).
    func bodyTooLarge(_ request: HTTPRequest, limit: Int) -> HTTPResponse {
        guard let method = router.methods[String(request.path)], let browser = BrowserProtocol(media: Self.mediaType(request)) else {
            return .bodyTooLarge(limit: limit)
        }
        let e = RPCError(
            .resourceExhausted,
            "request message exceeds the limit of \(requestLimit(method)) bytes for \(method.descriptor.path) (a body of more than \(limit) bytes)")
        var r = protocolError(e, browser)
        r.headers.append(contentsOf: cors.responseHeaders(origin: request.header("origin")))
        return r
    }

    /// An error before any message, in the form each protocol gives it.
    func protocolError(_ e: RPCError, _ browser: BrowserProtocol) -> HTTPResponse {
        switch browser {
        case .grpcWeb(let format): Self.grpcWebTrailersOnly(e, format: format, initial: Metadata())
        case .connectStream(let json):
            HTTPResponse(
                status: 200, headers: [("content-type", json ? "application/connect+json" : "application/connect+proto")],
                body: ConnectEnvelope.endStream(e, trailers: Metadata(), transcoder: transcoder))
        case .connectUnary: Self.error(e, status: e.code == .unimplemented ? 415 : nil, transcoder: transcoder)
        }
    }

    // MARK: Without a task

    /// Unary gRPC-Web and Connect calls the relay forwards are answered without a task of their
    /// own, as gRPC's are: the request is checked on the event loop, the policy decides
    /// synchronously when it can (`interceptForwarded`; otherwise the rest of it runs in a
    /// task), the relay forwards, and the upstream's answer completes the response from its
    /// connection's read. Anything unusual (a header to refuse, a GET, a stream, a page) is left
    /// to `handle`, which answers it with its detailed error.
    func handleImmediately(
        _ request: HTTPRequest, cancellation: CallCancellation, respond: @escaping @Sendable (HTTPResponse) -> Void
    ) -> Bool {
        // Bodies over 64 KiB are decoded in handle()'s task, not on the event loop.
        guard request.method == "POST", request.body.count <= 64 * 1024, let method = router.methods[String(request.path)],
            case .unaryForwarding(let forward) = method.handler.withContext
        else { return false }
        let media = Self.mediaType(request)
        let corsHeaders = cors.isEnabled ? cors.responseHeaders(origin: request.header("origin")) : []
        let send: @Sendable (HTTPResponse) -> Void
        if corsHeaders.isEmpty {
            send = respond
        } else {
            send = { (r: HTTPResponse) in
                var r = r
                r.headers.append(contentsOf: corsHeaders)
                respond(r)
            }
        }
        let context: ServerContext
        let finish: @Sendable (Result<[UInt8], any Error>) -> HTTPResponse
        // Reads the request message (the body) once the policy has let the call through (as for gRPC).
        let message: @Sendable ([UInt8]) throws -> [UInt8]
        if let format = GRPCWeb.format(mediaType: media) {
            do { context = try Self.context(method, request, deadline: try Self.grpcWebDeadline(request)) } catch {
                send(Self.grpcWebTrailersOnly(Self.rpcError(error), format: format, initial: Metadata()))
                return true
            }
            let acceptEncoding = request.header("accept-encoding")
            let transcoder = self.transcoder
            finish = { result in Self.grpcWebUnaryResponse(result, context, format, acceptEncoding: acceptEncoding, transcoder: transcoder) }
            message = { body in try self.grpcWebMessage(request, body: body, method, format) }
        } else if media == "application/json" || media == "application/proto" {
            // The plain case only; anything else gets handle()'s detailed answer.
            guard request.header("content-encoding").map({ $0 == "identity" }) ?? true,
                request.header("content-type").map({ !$0.utf8.contains(UInt8(ascii: ";")) }) ?? true
            else { return false }
            let json = media == "application/json"
            let transcoder = self.transcoder
            do { context = try Self.context(method, request, deadline: try Self.connectDeadline(request)) } catch {
                send(Self.error(Self.rpcError(error), transcoder: transcoder))
                return true
            }
            let logger = self.logger
            finish = { result in Self.connectUnaryResponse(result, context, json: json, transcoder: transcoder, logger: logger) }
            let inputType = method.descriptor.inputType
            message = { body in
                guard json else { return body }
                do { return try transcoder.encode(json: body, as: inputType) } catch let e as TranscodingError {
                    throw Self.badRequest(e, message: inputType)
                }
            }
        } else {
            return false
        }

        // The policy, as the gRPC path runs it: synchronously while each interceptor can decide
        // (`ServerInterceptor.interceptForwarded`), the body decoded once it let the call through.
        if let error = interceptors.rejectAtHeaders(method.descriptor, context.requestMetadata) {
            observing?.refused(method.descriptor, peer: request.peer, error)
            send(finish(.failure(error)))
            return true
        }
        let chain = interceptors.forwardedChain { call in
            guard case .message(let responder) = call.answer else {
                call.fail(RPCError(.internal, "an interceptor gave a unary call a stream's answer"))
                return nil
            }
            let input: [UInt8]
            do { input = try message(call.request) } catch {
                responder.respond(.failure(error))
                return nil
            }
            return forward(input, call.context, responder)
        }
        let work = chain(ForwardedCall(context: context, request: request.body, answer: .message(ClosureResponder { send(finish($0)) })))
        if let work { cancellation.onCancel(cancelling: work) }
        return true
    }

    /// A response with no body: the status (and any metadata) in the headers.
    static func grpcWebTrailersOnly(
        _ status: RPCError, format: GRPCWeb.Format, initial: Metadata, trailers: Metadata = Metadata(), httpStatus: Int = 200
    ) -> HTTPResponse {
        var headers: [(name: String, value: String)] = [("content-type", format.contentType)]
        append(initial, to: &headers, prefix: "")
        // The status lines carry the error's trailers too (retry-after with a limit's RetryInfo).
        headers.append(contentsOf: GRPCWeb.statusLines(status, trailers: trailers))
        return HTTPResponse(status: httpStatus, headers: headers)
    }

    /// Whether an `accept-encoding` value lists gzip (asked only of answers worth compressing).
    static func acceptsGzip(_ accept: String) -> Bool {
        accept.lowercased().split(separator: ",").contains { $0.trimmingCharacters(in: " ").hasPrefix("gzip") }
    }

    /// Any error as the status a client sees (unknown errors are not described).
    static func rpcError(_ error: any Error) -> RPCError {
        if let e = error as? RPCError { return e }
        if error is CancellationError { return RPCError.cancelled("the call was cancelled") }
        return RPCError(.internal, "internal error")
    }

    // MARK: Connect streaming

    /// Server-streaming calls in the Connect protocol: `application/connect+proto` or
    /// `application/connect+json`, one enveloped request message, enveloped response messages,
    /// then the end-of-stream message (flag 0x02, always JSON) with the error, if any, and the
    /// trailers as `metadata`. HTTP 200 whatever the outcome, as the protocol says.
    func serveConnectStream(_ request: HTTPRequest, _ method: ServerMethod, json: Bool) async -> HTTPResponse {
        let path = method.descriptor.path
        let contentType = json ? "application/connect+json" : "application/connect+proto"
        guard request.method == "POST" else {
            var r = Self.error(RPCError(.unimplemented, "\(request.method) is not supported: Connect streaming calls use POST"), status: 405)
            r.headers.append(("allow", "POST"))
            return r
        }
        guard let body = method.handler.asyncServerStreaming else {
            let what =
                method.handler.kind == .unary
                ? "a unary method: call it with application/json or application/proto" : "a client-streaming method: call it with gRPC"
            var r = Self.error(RPCError(.unimplemented, "\(path) is \(what)"), status: 415)
            r.headers.append(("accept-post", method.handler.kind == .unary ? "application/json, application/proto" : "application/grpc"))
            return r
        }
        let transcoder = self.transcoder
        let endOnly = { (error: RPCError, metadata: Metadata) -> HTTPResponse in
            HTTPResponse(
                status: 200, headers: [("content-type", contentType)] + Self.limitHeaders(error),
                body: ConnectEnvelope.endStream(error, trailers: metadata, transcoder: transcoder))
        }
        // The policy first (as for gRPC and Connect unary), then the body is read.
        let context: ServerContext
        do {
            context = try admit(method, request, deadline: try Self.connectDeadline(request))
        } catch {
            return endOnly(Self.rpcError(error), Metadata())
        }
        let limit = requestLimit(method)
        let encoding = request.header("connect-content-encoding")
        let decode = { @Sendable (body: [UInt8]) throws -> [UInt8] in
            let payload = try ConnectEnvelope.single(
                body, limit: json ? ConnectHandler.bodyLimit(forRequestLimit: limit) : limit, path: path, encoding: encoding)
            guard json else { return payload }
            let input: [UInt8]
            do { input = try transcoder.encode(json: payload, as: method.descriptor.inputType) } catch let e as TranscodingError {
                throw Self.badRequest(e, message: method.descriptor.inputType)
            }
            if input.count > limit {
                throw RPCError(.resourceExhausted, "request message of \(input.count) bytes exceeds the limit of \(limit) bytes for \(path)")
            }
            return input
        }
        let chain = interceptors.chain { call in
            try await body(decode(call.message()), call.sink(), call.context)
            return []
        }
        let outputType = method.descriptor.outputType
        let relay = StreamRelay { message in
            if !json { return ConnectEnvelope.frame(message) }
            do { return ConnectEnvelope.frame(try transcoder.decode(message, as: outputType)) } catch {
                throw RPCError(.internal, "a response could not be shown as JSON: \(error)")
            }
        }
        relay.start { sink in
            try await Self.bounded(by: context.deadline) {
                _ = try await chain(ServerCall(context: context, request: .message(request.body), responses: sink))
            }
        }
        let head = await relay.awaitHead()
        var headers: [(name: String, value: String)] = [("content-type", contentType)]
        Self.append(context.initialMetadata, to: &headers, prefix: "")
        if case .ended(let error) = head {
            let status = error.map { Self.rpcError($0) } ?? RPCError(.ok, "")
            var r = endOnly(status, context.trailers)
            r.headers = headers + Self.limitHeaders(status)
            return r
        }
        return HTTPResponse(
            status: 200, headers: headers,
            stream: relay.body { status in ConnectEnvelope.endStream(status, trailers: context.trailers, transcoder: transcoder) })
    }

    // MARK: Connect unary GET

    /// Connect's GET form of a unary call, for methods the contracts mark free of side effects
    /// (`idempotency_level = NO_SIDE_EFFECTS`): `?encoding=json|proto&message=...` with
    /// `base64=1` (URL-safe, for proto always), optional `compression=gzip|identity` and
    /// `connect=v1`. Answered as the POST form would be.
    func connectGetRequest(_ request: HTTPRequest, _ method: ServerMethod) throws -> (body: [UInt8], json: Bool) {
        guard sideEffectFree.contains(method.descriptor.path) else {
            throw RPCError(.unimplemented, "\(method.descriptor.path) is not marked free of side effects: call it with POST")
        }
        let query = ConnectQuery(target: request.target)
        if let connect = query["connect"], connect != "v1" {
            throw RPCError(.invalidArgument, "connect must be v1, got '\(connect)'")
        }
        let json: Bool
        switch query["encoding"] {
        case "json": json = true
        case "proto": json = false
        // The spec: a codec the server does not support is 415 (connect-go: a missing one too).
        case nil: throw UnsupportedCodec(RPCError(.unimplemented, "a Connect GET needs encoding=json or encoding=proto"))
        case let other?: throw UnsupportedCodec(RPCError(.unimplemented, "unsupported encoding '\(other)': use json or proto"))
        }
        guard let raw = query.bytes("message") else {
            throw RPCError(.invalidArgument, "a Connect GET needs the message parameter (percent-encoded)")
        }
        var body = raw
        if query["base64"] == "1" {
            guard let decoded = Base64.decode(String(decoding: raw, as: UTF8.self)) else {
                throw RPCError(.invalidArgument, "message is not base64 (URL-safe alphabet)")
            }
            body = decoded
        } else if !json {
            throw RPCError(.invalidArgument, "encoding=proto needs base64=1")
        }
        let limit = Self.bodyLimit(forRequestLimit: requestLimit(method))
        switch query["compression"] {
        case nil, "identity": break
        case "gzip":
            body = try Gzip.inflateRequest(body, limit: limit, what: "message", path: method.descriptor.path)
        case let other?:
            throw RPCError(.unimplemented, "compression '\(other)' is not supported: use gzip or identity")
        }
        guard body.count <= limit else {
            throw RPCError(.resourceExhausted, "message of \(body.count) bytes exceeds the limit of \(limit) bytes for \(method.descriptor.path)")
        }
        return (body, json)
    }
}

/// A Connect GET's `encoding` the gateway does not speak: HTTP 415, as the protocol says.
struct UnsupportedCodec: Error {
    let error: RPCError
    init(_ error: RPCError) { self.error = error }
}

/// Which browser protocol a request's media type speaks.
enum BrowserProtocol {
    case grpcWeb(GRPCWeb.Format)
    case connectStream(json: Bool)
    case connectUnary

    init?(media: String) {
        if let format = GRPCWeb.format(mediaType: media) {
            self = .grpcWeb(format)
        } else if GRPCWeb.isGRPCWeb(mediaType: media) {
            self = .grpcWeb(.binary)
        } else if media == "application/connect+json" || media == "application/connect+proto" {
            self = .connectStream(json: media == "application/connect+json")
        } else if media == "application/json" || media == "application/proto" {
            self = .connectUnary
        } else {
            return nil
        }
    }
}

/// Connect streaming's envelopes: a flags byte (0x01 compressed, 0x02 end of stream), a 4-byte
/// big-endian length, the payload.
enum ConnectEnvelope {
    static func frame(_ payload: [UInt8], flags: UInt8 = 0) -> [UInt8] { GRPCWeb.frame(payload, flag: flags) }

    /// The single request message of a server-streaming call.
    static func single(_ body: [UInt8], limit: Int, path: String, encoding: String?) throws -> [UInt8] {
        guard body.count >= 5 else {
            throw RPCError(.invalidArgument, "the body must be one enveloped message (5-byte prefix, then the message); got \(body.count) bytes")
        }
        let flags = body[0]
        let length = Int(body[1]) << 24 | Int(body[2]) << 16 | Int(body[3]) << 8 | Int(body[4])
        guard flags & ~UInt8(1) == 0 else { throw RPCError(.invalidArgument, "invalid envelope flags \(flags) on a request message") }
        if length > limit {
            throw RPCError(.resourceExhausted, "request message of \(length) bytes exceeds the limit of \(limit) bytes for \(path)")
        }
        guard body.count >= 5 + length else {
            throw RPCError(.invalidArgument, "the body ends inside the message: its envelope says \(length) bytes, \(body.count - 5) arrived")
        }
        guard body.count == 5 + length else {
            throw RPCError(.invalidArgument, "\(path) takes exactly one request message, got more")
        }
        let message = Array(body[5...])
        guard flags == 1 else { return message }
        switch encoding {
        case "gzip":
            return try Gzip.inflateRequest(message, limit: limit, what: "the request message", path: path)
        case nil, "identity":
            throw RPCError(.invalidArgument, "a compressed message needs connect-content-encoding")
        case let other?:
            throw RPCError(.unimplemented, "connect-content-encoding '\(other)' is not supported: use gzip or identity")
        }
    }

    /// The end-of-stream message: `{"error": {...}, "metadata": {"name": ["value"]}}`.
    static func endStream(_ status: RPCError, trailers: Metadata, transcoder: JSONTranscoder) -> [UInt8] {
        var members: [(String, JSONValue)] = []
        if status.code != .ok { members.append(("error", ConnectHandler.errorValue(status, transcoder: transcoder))) }
        var metadata: [(String, [JSONValue])] = []
        func add(_ m: Metadata) {
            for (key, value) in m where !Metadata.isReserved(key) {
                let v: String
                switch value {
                case .string(let s): v = s
                case .binary(let b): v = Base64.encode(b)
                }
                if let i = metadata.firstIndex(where: { $0.0 == key }) {
                    metadata[i].1.append(.string(v))
                } else {
                    metadata.append((key, [.string(v)]))
                }
            }
        }
        add(trailers)
        add(status.trailers)
        if !metadata.isEmpty { members.append(("metadata", .object(metadata.map { ($0.0, .array($0.1)) }))) }
        return frame(JSONWriter.serialize(.object(members)), flags: 0x02)
    }
}

/// The query of a request target, percent-decoded (`+` is a space, as in form encoding).
struct ConnectQuery {
    private var items: [(String, [UInt8])] = []

    init(target: String) {
        guard let q = target.split(separator: "?", maxSplits: 1).dropFirst().first else { return }
        for pair in q.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let key = String(decoding: Self.decode(Array(kv[0].utf8)), as: UTF8.self)
            items.append((key, kv.count > 1 ? Self.decode(Array(kv[1].utf8)) : []))
        }
    }

    subscript(name: String) -> String? { bytes(name).map { String(decoding: $0, as: UTF8.self) } }

    func bytes(_ name: String) -> [UInt8]? { items.first { $0.0 == name }?.1 }

    static func decode(_ s: [UInt8]) -> [UInt8] { PercentEncoding.decodeBytes(s, plusIsSpace: true) }
}
