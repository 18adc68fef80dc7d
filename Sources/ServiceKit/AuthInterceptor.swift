import Logging
import RPCCore
import RPCServices
import Security
import Synchronization

/// The policy every service (and the gateway) applies before a handler runs, from the method's
/// access marking in the contracts:
/// - public: no credential needed; a valid token, if sent, still identifies the caller;
/// - authenticated: `authorization: Bearer <access token>` verified with accounts' keys;
/// - internal: the cluster's service credential (`x-service-token`), which only services have.
///
/// Two credentials, two principals. The service credential marks a call from another service
/// (`isServiceCall`): internal methods open. The gateway's credential (`x-gateway-token`) marks a
/// user's call relayed by the gateway (`isGatewayCall`): only public and authenticated methods
/// open (internal ones are PERMISSION_DENIED, as for any client), and the call's
/// `x-forwarded-for` is the address the gateway saw. Neither header: a client calling directly.
/// Health and reflection are infrastructure and need nothing.
///
/// Erased accounts: a token of a user this service erased (`ErasedUsers`, accounts' deletion
/// event) is UNAUTHENTICATED from then on, although it would verify until it expires.
///
/// Token keys: verified with the keys `keys` supplies, refetched when a token names an unknown
/// key id (rotation) and, so that a key accounts removed stops verifying, at least every
/// `keyRefreshInterval` (the keys' own cache time when shorter).
public final class AuthInterceptor: CallCheck {
    public static let serviceTokenHeader = "x-service-token"
    public static let gatewayTokenHeader = CredentialCheck.gatewayTokenHeader
    /// Infrastructure services: no credential needed (load balancers poll health). The per-call
    /// checks read `MethodDescriptor.isInfrastructure` (the same three); this set is for what is
    /// decided once per method (the tracing interceptor's `untraced`).
    public static let open = Set(MethodDescriptor.infrastructureServices)
    /// The longest a removed token key keeps verifying here (plus one fetch).
    public static let defaultKeyRefreshInterval: Duration = .seconds(300)

    let keys: any SigningKeySource
    let serviceToken: [UInt8]
    let gatewayToken: [UInt8]
    let verifier = AccessTokenVerifier(keys: [:])
    let keyRefreshSeconds: Int64
    let erased: ErasedUsers?
    /// Unix seconds after which the next verification refreshes the keys (in the background).
    private let refreshAt = Atomic<Int64>(0)
    private let refreshing = Atomic<Bool>(false)

    /// - Parameters:
    ///   - serviceToken: the credential that opens internal methods ("" → none does).
    ///   - gatewayToken: the gateway's credential ("" → no call is taken as relayed).
    ///   - erased: the users whose tokens are refused (the service's erased accounts).
    public init(
        keys: any SigningKeySource, serviceToken: String, gatewayToken: String = "",
        keyRefreshInterval: Duration = AuthInterceptor.defaultKeyRefreshInterval, erased: ErasedUsers? = nil
    ) {
        self.erased = erased
        self.keys = keys
        self.serviceToken = Array(serviceToken.utf8)
        self.gatewayToken = Array(gatewayToken.utf8)
        self.keyRefreshSeconds = max(1, keyRefreshInterval.components.seconds)
    }

    public func check(_ context: ServerContext) async throws {
        if context.method.isInfrastructure { return }
        if let presented = context.requestMetadata[Self.serviceTokenHeader] {
            guard !serviceToken.isEmpty, ConstantTime.equals(presented, serviceToken) else {
                throw RPCError(.permissionDenied, "invalid service credential")
            }
            context.setValue(true, forKey: ServerContext.serviceCallerKey)
            // A service may act for a user by forwarding the user's token too.
            if let token = CredentialCheck.bearerToken(context.requestMetadata) { try await attachIdentity(token, context) }
            return
        }
        if let presented = context.requestMetadata[Self.gatewayTokenHeader] {
            guard !gatewayToken.isEmpty, ConstantTime.equals(presented, gatewayToken) else {
                throw RPCError(.permissionDenied, "invalid gateway credential")
            }
            context.setValue(true, forKey: ServerContext.gatewayCallerKey)
        }
        switch context.method.visibility {
        case .internal:
            throw RPCError(.permissionDenied, "\(context.method.path) is internal: only other services may call it")
        case .publicAnonymous:
            if let token = CredentialCheck.bearerToken(context.requestMetadata) { try await attachIdentity(token, context) }
        case .publicAuthenticated:
            guard let token = CredentialCheck.bearerToken(context.requestMetadata) else {
                throw RPCError(.unauthenticated, "\(context.method.path) needs 'authorization: Bearer <access token>'")
            }
            try await attachIdentity(token, context)
        }
    }

    /// At the request headers, before any body is read: a call that carries no credential at all
    /// where its method needs one is refused now (an anonymous client cannot make the process
    /// buffer a large request that `intercept` would refuse afterwards). Verifies nothing.
    public func rejectAtHeaders(_ method: MethodDescriptor, _ metadata: Metadata) -> RPCError? {
        CredentialCheck.missingCredential(method, metadata, serviceCredential: !serviceToken.isEmpty)
    }

    /// The token of `authorization: Bearer <token>`; nil when absent, empty or another scheme.
    public static func bearer(_ metadata: Metadata) -> String? { CredentialCheck.bearerToken(metadata).map(String.init) }

    /// Verifies a token and stores the identity; a bad token is UNAUTHENTICATED even on public
    /// methods (a client that sends a token expects it to count).
    public func verify(_ token: String) async throws -> CallerIdentity { try await verify(token[...]) }

    /// `verify` for a token read from its header (`CredentialCheck.bearerToken`: no copy).
    public func verify(_ token: Substring) async throws -> CallerIdentity {
        if let identity = try verifyImmediately(token) { return identity }
        // First use, or accounts rotated its key: (re)load the keys once, then retry.
        await keys.refresh()
        try await loadKeys()
        do { return try CallerIdentity(verifier.verify(token)) } catch { throw Self.describe(error) }
    }

    /// `verify` without suspending: nil when the token names a key not loaded yet (only `verify`
    /// can fetch it). Starts a background refresh of the keys when the refresh interval passed.
    public func verifyImmediately(_ token: String) throws -> CallerIdentity? { try verifyImmediately(token[...]) }

    /// `verifyImmediately` for a token read from its header (`CredentialCheck.bearerToken`: no copy).
    public func verifyImmediately(_ token: Substring) throws -> CallerIdentity? {
        let now = AccessToken.currentTime()
        if now >= refreshAt.load(ordering: .relaxed) { refreshInBackground(now: now) }
        do {
            return try CallerIdentity(verifier.verify(token, now: now))
        } catch .unknownKeyID {
            return nil
        } catch {
            throw Self.describe(error)
        }
    }

    /// A verification remembered for one client connection (the gateway's relay keeps one per
    /// connection: a client sends the same token on every call). It holds while the verifier's
    /// keys are the ones it was made under and, like any verification, until the token expires.
    /// Its strings are its own, not the shared cache's: the calls of a connection retain them on
    /// its event loop alone.
    public struct RememberedToken: Sendable {
        let owner: ObjectIdentifier
        let token: [UInt8]
        /// Who the token says the caller is.
        public let identity: CallerIdentity
        let generation: UInt64
    }

    /// `verifyImmediately` for a token as its header's bytes carry it, checked first against
    /// `remembered` (the same bytes, verified under the current keys: no lock, no hashing, no
    /// string; expiry still checked), which a verification made here replaces.
    public func verifyImmediately(_ token: UnsafeRawBufferPointer, remembering remembered: inout RememberedToken?) throws -> CallerIdentity? {
        try admits(token, remembering: &remembered) ? remembered?.identity : nil
    }

    /// `verifyImmediately(_:remembering:)` for a caller that needs only the verdict: true when
    /// the token is valid (its identity is then `remembered`'s), false when it names a key not
    /// loaded yet. A remembered verification's identity is not copied out (a relay with no
    /// per-user limit never reads it).
    public func admits(_ token: UnsafeRawBufferPointer, remembering remembered: inout RememberedToken?) throws -> Bool {
        let now = AccessToken.currentTime()
        if now >= refreshAt.load(ordering: .relaxed) { refreshInBackground(now: now) }
        let generation = verifier.generation
        if let r = remembered, r.generation == generation, r.owner == ObjectIdentifier(self),
            r.token.withUnsafeBytes({ ConstantTime.equals($0, token) })
        {
            do { try verifier.checkExpiry(r.identity.expiresAt, now: now) } catch { throw Self.describe(error) }
            return true
        }
        guard let identity = try verifyImmediately(Substring(String(decoding: token, as: UTF8.self))) else { return false }
        remembered = RememberedToken(
            owner: ObjectIdentifier(self), token: Array(token),
            identity: CallerIdentity(
                userID: String(copying: identity.userID), sessionID: String(copying: identity.sessionID), isGuest: identity.isGuest,
                expiresAt: identity.expiresAt),
            generation: generation)
        return true
    }

    /// Loads the current keys into the verifier (which forgets cached verifications when they
    /// changed) and schedules the next periodic refresh.
    private func loadKeys() async throws {
        let current = try await keys.keys()
        verifier.setKeys(current)
        refreshAt.store(AccessToken.currentTime() + keyRefreshSeconds, ordering: .relaxed)
    }

    /// One refresh at a time, off the caller's path: until it lands, the keys in use stay (a
    /// removed key verifies at most `keyRefreshInterval` plus one fetch longer). When accounts
    /// is unreachable the keys in use are kept and the next try is a minute later.
    private func refreshInBackground(now: Int64) {
        guard refreshing.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        // Nothing loaded yet: the first `verify` loads (no background fetch at startup).
        guard refreshAt.load(ordering: .relaxed) != 0 else {
            refreshing.store(false, ordering: .releasing)
            return
        }
        refreshAt.store(now + min(60, keyRefreshSeconds), ordering: .relaxed)
        Task {
            defer { self.refreshing.store(false, ordering: .releasing) }
            await self.keys.refresh()
            try? await self.loadKeys()
        }
    }

    private func attachIdentity(_ token: Substring, _ context: ServerContext) async throws {
        let identity = try await verify(token)
        if let erased, erased.contains(identity.userID) { throw ErasedUsers.refusal }
        context.setValue(identity, forKey: ServerContext.identityKey)
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
    /// The same text in storage of its own (a copy of a string both event loops would retain).
    init(copying other: String) {
        let utf8 = other.utf8
        self.init(unsafeUninitializedCapacity: utf8.count) { buffer in
            _ = buffer.initialize(fromContentsOf: utf8)
            return utf8.count
        }
    }
}
