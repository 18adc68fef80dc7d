import Logging
import RPCCore
import ServiceKit

/// What the gateway checks before relaying a call, from the method's marking in the contracts:
/// the client address's rate limit; then the token (required on authenticated methods, verified
/// with accounts' published keys whenever one is sent); then the user's rate limit. Internal
/// methods are never routed, so they never get here (the router answers UNIMPLEMENTED).
public final class GatewayPolicy: ServerInterceptor {
    /// Infrastructure services: no token, no limits (load balancers poll health).
    static let open: Set<String> = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                                    "grpc.reflection.v1alpha.ServerReflection"]
    static let identityKey = "gateway.identity"

    let verifier: AuthInterceptor
    let addressLimiter: RateLimiter?
    let userLimiter: RateLimiter?

    public init(verifier: AuthInterceptor, addressLimiter: RateLimiter?, userLimiter: RateLimiter?) {
        self.verifier = verifier
        self.addressLimiter = addressLimiter
        self.userLimiter = userLimiter
    }

    public func intercept(_ context: ServerContext) async throws {
        if try interceptImmediately(context) { return }
        // The token names a key not loaded yet: the address's limit first (so a flood of such
        // tokens cannot make the gateway refetch keys), then fetch accounts' keys and decide.
        try limitAddress(context)
        let token = Self.bearer(context.requestMetadata)
        var identity: CallerIdentity? = nil
        if let token { identity = try await verifier.verify(token) }
        try admit(context, identity: identity, addressCharged: true)
    }

    /// Decides at once unless the token names a key the gateway has not loaded yet.
    public func interceptImmediately(_ context: ServerContext) throws -> Bool {
        if Self.open.contains(context.method.service) { return true }
        let token = Self.bearer(context.requestMetadata)
        switch context.method.visibility {
        case .internal:
            throw RPCError(.unimplemented, "Method not found: \(context.method.path)")
        case .publicAnonymous:
            break
        case .publicAuthenticated:
            if token == nil {
                try limitAddress(context)
                throw RPCError(.unauthenticated, "\(context.method.path) needs 'authorization: Bearer <access token>'")
            }
        }
        // A token sent to a public method must still be valid (the service verifies it too).
        var identity: CallerIdentity? = nil
        if let token {
            let verified: CallerIdentity?
            do { verified = try verifier.verifyImmediately(token) } catch {
                try limitAddress(context)
                throw error
            }
            guard let verified else { return false }
            identity = verified
        }
        try admit(context, identity: identity)
        return true
    }

    /// The address's rate limit, then the user's; the identity goes on to the relay.
    private func admit(_ context: ServerContext, identity: CallerIdentity?, addressCharged: Bool = false) throws {
        if !addressCharged { try limitAddress(context) }
        if let identity {
            context[key: Self.identityKey] = identity
            if let limiter = userLimiter, let wait = limiter.acquire(identity.userID) {
                throw RPCError.retryLater("too many requests for this user: retry in \(Self.describe(wait))", after: wait)
            }
        }
    }

    private func limitAddress(_ context: ServerContext) throws {
        guard let limiter = addressLimiter else { return }
        let address = HeaderPolicy.host(ofPeer: context.peer)
        if let wait = limiter.acquire(address) {
            throw RPCError.retryLater("too many requests from \(address): retry in \(Self.describe(wait))", after: wait)
        }
    }

    /// The token of `authorization: Bearer <token>`; nil when absent or another scheme.
    static func bearer(_ metadata: Metadata) -> String? {
        guard let value = metadata["authorization"] else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = parts[1].trimmingCharacters(in: " ")
        return token.isEmpty ? nil : token
    }

    static func describe(_ d: Duration) -> String {
        let ms = d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000
        return ms >= 1000 ? "\(ms / 1000) s" : "\(max(ms, 1)) ms"
    }
}

extension ServerContext {
    /// The caller the gateway verified (nil for anonymous calls).
    public var gatewayIdentity: CallerIdentity? { self[key: GatewayPolicy.identityKey, as: CallerIdentity.self] }
}

extension Substring {
    func trimmingCharacters(in set: Character) -> String {
        var s = self
        while s.first == set { s = s.dropFirst() }
        while s.last == set { s = s.dropLast() }
        return String(s)
    }
}
