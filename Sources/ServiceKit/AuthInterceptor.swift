import Logging
import RPCCore
import RPCServices
import Security

/// The policy every service (and the gateway) applies before a handler runs, from the method's
/// access marking in the contracts:
/// - public: no credential needed; a valid token, if sent, still identifies the caller;
/// - authenticated: `authorization: Bearer <access token>` verified with accounts' keys;
/// - internal: the cluster's service credential (`x-service-token`), which clients never have.
/// Health and reflection are infrastructure and need nothing.
public final class AuthInterceptor: ServerInterceptor {
    public static let serviceTokenHeader = "x-service-token"
    /// Infrastructure services: no credential needed (load balancers poll health). The gateway's
    /// policy uses the same list.
    public static let open = Set(StandardServices.standardNames)

    let keys: any SigningKeySource
    let serviceToken: [UInt8]
    let verifier = AccessTokenVerifier(keys: [:])

    public init(keys: any SigningKeySource, serviceToken: String) {
        self.keys = keys
        self.serviceToken = Array(serviceToken.utf8)
    }

    public func intercept(_ context: ServerContext) async throws {
        if Self.open.contains(context.method.service) { return }
        if let presented = context.requestMetadata[Self.serviceTokenHeader] {
            guard !serviceToken.isEmpty, ConstantTime.equals(presented, serviceToken) else {
                throw RPCError(.permissionDenied, "invalid service credential")
            }
            context[key: ServerContext.serviceCallerKey] = true
            // A service may act for a user by forwarding the user's token too.
            if let token = Self.bearer(context) { try await attachIdentity(token, context) }
            return
        }
        switch context.method.visibility {
        case .internal:
            throw RPCError(.permissionDenied, "\(context.method.path) is internal: only other services may call it")
        case .publicAnonymous:
            if let token = Self.bearer(context) { try await attachIdentity(token, context) }
        case .publicAuthenticated:
            guard let token = Self.bearer(context) else {
                throw RPCError(.unauthenticated, "\(context.method.path) needs 'authorization: Bearer <access token>'")
            }
            try await attachIdentity(token, context)
        }
    }

    static func bearer(_ context: ServerContext) -> String? { bearer(context.requestMetadata) }

    /// The token of `authorization: Bearer <token>`; nil when absent, empty or another scheme.
    public static func bearer(_ metadata: Metadata) -> String? {
        guard let value = metadata["authorization"] else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = String(parts[1]).trimmingSpaces
        return token.isEmpty ? nil : token
    }

    /// Verifies a token and stores the identity; a bad token is UNAUTHENTICATED even on public
    /// methods (a client that sends a token expects it to count).
    public func verify(_ token: String) async throws -> CallerIdentity {
        if let identity = try verifyImmediately(token) { return identity }
        // First use, or accounts rotated its key: (re)load the keys once, then retry.
        await keys.refresh()
        verifier.setKeys(try await keys.keys())
        do { return try CallerIdentity(verifier.verify(token)) } catch { throw Self.describe(error) }
    }

    /// `verify` without suspending: nil when the token names a key not loaded yet (only `verify`
    /// can fetch it).
    public func verifyImmediately(_ token: String) throws -> CallerIdentity? {
        do {
            return try CallerIdentity(verifier.verify(token))
        } catch .unknownKeyID {
            return nil
        } catch {
            throw Self.describe(error)
        }
    }

    private func attachIdentity(_ token: String, _ context: ServerContext) async throws {
        context[key: ServerContext.identityKey] = try await verify(token)
    }

    static func describe(_ error: AccessTokenError) -> RPCError {
        switch error {
        case .expired: RPCError(.unauthenticated, "access token expired: refresh the session")
        case .unknownKeyID: RPCError(.unauthenticated, "access token signed with an unknown key")
        case .badSignature: RPCError(.unauthenticated, "access token signature is invalid")
        case .malformed: RPCError(.unauthenticated, "access token is malformed")
        case .notYetValid: RPCError(.unauthenticated, "access token is not valid yet")
        }
    }
}

extension String {
    var trimmingSpaces: String {
        var s = Substring(self)
        while s.first == " " { s = s.dropFirst() }
        while s.last == " " { s = s.dropLast() }
        return String(s)
    }
}
