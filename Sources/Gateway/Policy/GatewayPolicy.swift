import Contracts
import Logging
import Observability
import Prometheus
import RPCCore
import ServiceKit

/// What the gateway checks before relaying a call, from the method's marking in the contracts:
/// the client address's rate limit; then the token (required on authenticated methods, verified
/// with accounts' published keys whenever one is sent); then the user's rate limit. Internal
/// methods are never routed, so they never get here (the router answers UNIMPLEMENTED).
///
/// Calls a limiter refuses count in `gateway_rate_limit_rejections_total{scope="address"|"user"}`
/// (never the address or the user itself: the label set stays bounded).
public final class GatewayPolicy: CallCheck {

    let verifier: AuthInterceptor
    let addressLimiter: RateLimiter?
    let userLimiter: RateLimiter?
    /// Keeps the verified caller on the call's context (the access log names the user); off,
    /// it is not stored at all (a lock and a list per call saved).
    let notesIdentity: Bool
    let addressRejections = GatewayPolicy.rejections(scope: "address")
    let userRejections = GatewayPolicy.rejections(scope: "user")

    public init(verifier: AuthInterceptor, addressLimiter: RateLimiter?, userLimiter: RateLimiter?, notesIdentity: Bool = false) {
        self.verifier = verifier
        self.addressLimiter = addressLimiter
        self.userLimiter = userLimiter
        self.notesIdentity = notesIdentity
    }

    static func rejections(scope: String) -> Prometheus.Counter {
        ProcessMetrics.registry.makeCounter(
            descriptor: MetricNameDescriptor(
                metricName: "gateway_rate_limit_rejections", unitName: "total",
                helpText: "Calls the gateway refused with RESOURCE_EXHAUSTED because a rate limit (per client address, per user) was spent."),
            labels: [("scope", scope)])
    }

    /// The standard services (health, reflection) are the services' own business: the policy
    /// stays out of their calls. The gRPC chain leaves it out for their methods altogether; the
    /// browser chain, built once for every method, reads the method's `isInfrastructure`.
    public func specialized(for method: MethodDescriptor) -> (any ServerInterceptor)? {
        method.isInfrastructure ? nil : self
    }

    public func check(_ context: ServerContext) async throws {
        if context.method.isInfrastructure { return }
        let charged = (context.value(forKey: Self.addressChargedKey) as? Bool) == true
        let token = CredentialCheck.bearerToken(context.requestMetadata)
        try admit(context.method, hasToken: token != nil, peerHost: context.peerHost, chargeAddress: !charged)
        if let token { try limitUser(try await verifier.verify(token), context) }
    }

    /// Decides at once unless the token names a key the gateway has not loaded yet; then
    /// `check` decides, fetching accounts' keys (the address, charged already, is not
    /// charged again).
    public func checkImmediately(_ context: ServerContext) throws -> Bool {
        if context.method.isInfrastructure { return true }
        if try decideNow(context.method, context.requestMetadata, peerHost: context.peerHost, noting: context) { return true }
        context.setValue(true, forKey: Self.addressChargedKey)
        return false
    }

    /// `checkImmediately` without a context (the relay's, `ProxyRelay`): true when the call may
    /// go on, a thrown error to refuse it, false when the token names a key not loaded yet; the
    /// address is charged then, and `decideLater` finishes the decision.
    func decideNow(_ method: MethodDescriptor, _ metadata: Metadata, peerHost: String, noting context: ServerContext? = nil) throws -> Bool {
        if method.isInfrastructure { return true }
        let token = CredentialCheck.bearerToken(metadata)
        try admit(method, hasToken: token != nil, peerHost: peerHost)
        guard let token else { return true }
        guard let identity = try verifier.verifyImmediately(token) else { return false }
        try limitUser(identity, context)
        return true
    }

    /// `decideNow` for the relay, from the metadata as its header block carried it: the token
    /// is checked as those bytes, first against the verification `remembered` for the client's
    /// connection (`AuthInterceptor.verifyImmediately(_:remembering:)`).
    func decideNow(
        _ method: MethodDescriptor, _ metadata: MetadataBytes, peerHost: String, remembering remembered: inout AuthInterceptor.RememberedToken?
    ) throws -> Bool {
        if method.isInfrastructure { return true }
        return try metadata.withFirstValue(of: "authorization") { value in
            let range = value.flatMap { CredentialCheck.bearerTokenRange($0) }
            try admit(method, hasToken: range != nil, peerHost: peerHost)
            guard let value, let range else { return true }
            let token = UnsafeRawBufferPointer(rebasing: value[range])
            guard try verifier.admits(token, remembering: &remembered) else { return false }
            // The identity is read only for a per-user limit (the relay notes no caller).
            if userLimiter != nil { try limitUser(remembered?.identity, nil) }
            return true
        }
    }

    /// What `decideNow` left undecided: the token verified (accounts' keys fetched) and the
    /// user's limit; the address is not charged again.
    func decideLater(_ method: MethodDescriptor, _ metadata: MetadataBytes, peerHost: String) async throws {
        let token = metadata.withFirstValue(of: "authorization") { value -> Substring? in
            guard let value, let range = CredentialCheck.bearerTokenRange(value) else { return nil }
            return Substring(String(decoding: UnsafeRawBufferPointer(rebasing: value[range]), as: UTF8.self))
        }
        try admit(method, hasToken: token != nil, peerHost: peerHost, chargeAddress: false)
        if let token { try limitUser(try await verifier.verify(token), nil) }
    }

    /// At the request headers, before any body byte is read: an authenticated method without a
    /// token is refused at once (so an anonymous client cannot make the gateway buffer large
    /// requests it would refuse anyway). The gateway accepts no service credential from outside.
    public func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError? {
        CredentialCheck.missingCredential(method, metadata, serviceCredential: false)
    }

    /// `rejectAtHeaders` for the relay (the metadata as its header block carried it).
    func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: MetadataBytes) -> RPCError? {
        CredentialCheck.missingCredential(method, metadata, serviceCredential: false)
    }

    /// Set when `checkImmediately` deferred a call it had charged to the address.
    static let addressChargedKey = "gateway.address-charged"

    /// What comes before any signature check, so a flood of forged tokens is limited like any
    /// other call: the address's limit, then the method's marking (`hasToken`: the call carries
    /// a bearer token, which the caller verifies next).
    private func admit(_ method: MethodDescriptor, hasToken: Bool, peerHost: String, chargeAddress: Bool = true) throws {
        if chargeAddress { try limitAddress(peerHost) }
        switch method.visibility {
        case .internal:
            throw RPCError(.unimplemented, "Method not found: \(method.path)")
        case .publicAnonymous:
            break  // a token sent to a public method must still be valid (the service verifies it too)
        case .publicAuthenticated:
            guard hasToken else {
                throw RPCError(.unauthenticated, "\(method.path) needs 'authorization: Bearer <access token>'")
            }
        }
    }

    /// The user's rate limit. (The identity itself is not passed on: the relay forwards
    /// `authorization` and each service verifies the token again.) Noted on `context` for the
    /// access log when there is one.
    private func limitUser(_ identity: CallerIdentity?, _ context: ServerContext?) throws {
        if notesIdentity, let identity, let context { context.noteIdentity(identity) }
        if let identity, let limiter = userLimiter, let wait = limiter.acquire(identity.userID) {
            userRejections.increment()
            throw Self.limited("user", limiter, wait: wait, "too many requests for this user: retry in \(Self.describe(wait))")
        }
    }

    private func limitAddress(_ address: String) throws {
        guard let limiter = addressLimiter else { return }
        if let wait = limiter.acquire(address) {
            addressRejections.increment()
            throw Self.limited("address", limiter, wait: wait, "too many requests from \(address): retry in \(Self.describe(wait))")
        }
    }

    /// A spent limit: RESOURCE_EXHAUSTED with a `google.rpc.RetryInfo` holding the wait, and, as
    /// metadata the HTTP protocols turn into headers (`ConnectHandler.limitHeaders`),
    /// `retry-after` (whole seconds, rounded up) and the RateLimit fields of the IETF draft
    /// (draft-ietf-httpapi-ratelimit-headers-10): `ratelimit-policy: "user";q=50;w=1` (the rate;
    /// the burst is not expressible there) and `ratelimit: "user";r=0;t=1` (nothing left, more in
    /// `t` seconds).
    static func limited(_ scope: String, _ limiter: RateLimiter, wait: Duration, _ message: String) -> RPCError {
        var info = Google_Rpc_RetryInfo()
        var delay = Google_Protobuf_Duration()
        let (seconds, attoseconds) = wait.components
        delay.seconds = seconds
        delay.nanos = Int32(attoseconds / 1_000_000_000)
        info.retryDelay = delay
        var error = RPCError.withDetails(
            .resourceExhausted, message, details: [("type.googleapis.com/google.rpc.RetryInfo", info.serializedBytes())])
        let after = max(1, seconds + (attoseconds > 0 ? 1 : 0))
        error.trailers.add("retry-after", String(after))
        error.trailers.add("ratelimit-policy", policy(scope, limiter))
        error.trailers.add("ratelimit", "\"\(scope)\";r=0;t=\(after)")
        return error
    }

    /// The limit as a quota policy: whole requests (`q`) per whole seconds (`w`).
    static func policy(_ scope: String, _ limiter: RateLimiter) -> String {
        let rate = limiter.rate
        if rate >= 1 { return "\"\(scope)\";q=\(Int(min(rate, 1e9)));w=1" }
        return "\"\(scope)\";q=1;w=\(Int((1 / rate).rounded(.up)))"
    }

    static func describe(_ d: Duration) -> String {
        let ms = d.milliseconds
        return ms >= 1000 ? "\(ms / 1000) s" : "\(max(ms, 1)) ms"
    }
}

extension Substring {
    func trimmingCharacters(in set: Character) -> String {
        var s = self
        while s.first == set { s = s.dropFirst() }
        while s.last == set { s = s.dropLast() }
        return String(s)
    }
}
