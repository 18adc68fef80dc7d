import Logging
import RPCCore
import ServiceKit

/// What the gateway checks before relaying a call, from the method's marking in the contracts:
/// the client address's rate limit; then the token (required on authenticated methods, verified
/// with accounts' published keys whenever one is sent); then the user's rate limit. Internal
/// methods are never routed, so they never get here (the router answers UNIMPLEMENTED).
public final class GatewayPolicy: ServerInterceptor {

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
        let token = AuthInterceptor.bearer(context.requestMetadata)
        var identity: CallerIdentity? = nil
        if let token { identity = try await verifier.verify(token) }
        try admit(context, identity: identity, addressCharged: true)
    }

    /// Decides at once unless the token names a key the gateway has not loaded yet.
    public func interceptImmediately(_ context: ServerContext) throws -> Bool {
        if AuthInterceptor.open.contains(context.method.service) { return true }
        let token = AuthInterceptor.bearer(context.requestMetadata)
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

    /// The address's rate limit, then the user's. (The identity itself is not passed on: the
    /// relay forwards `authorization` and each service verifies the token again.)
    private func admit(_ context: ServerContext, identity: CallerIdentity?, addressCharged: Bool = false) throws {
        if !addressCharged { try limitAddress(context) }
        if let identity, let limiter = userLimiter, let wait = limiter.acquire(identity.userID) {
            throw RPCError.retryLater("too many requests for this user: retry in \(Self.describe(wait))", after: wait)
        }
    }

    private func limitAddress(_ context: ServerContext) throws {
        guard let limiter = addressLimiter else { return }
        let address = context.peerHost
        if let wait = limiter.acquire(address) {
            throw RPCError.retryLater("too many requests from \(address): retry in \(Self.describe(wait))", after: wait)
        }
    }

    static func describe(_ d: Duration) -> String {
        let ms = d.components.seconds * 1000 + d.components.attoseconds / 1_000_000_000_000_000
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
