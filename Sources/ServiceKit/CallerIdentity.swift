import RPCCore
import Security

/// Who is calling, as established from a verified access token (never from a header a client
/// could write).
public struct CallerIdentity: Sendable, Hashable {
    public var userID: String
    public var sessionID: String
    public var isGuest: Bool
    public var expiresAt: Int64

    public init(userID: String, sessionID: String, isGuest: Bool, expiresAt: Int64) {
        self.userID = userID
        self.sessionID = sessionID
        self.isGuest = isGuest
        self.expiresAt = expiresAt
    }

    init(_ claims: AccessTokenClaims) {
        self.init(userID: claims.userID, sessionID: claims.sessionID, isGuest: claims.kind == .guest, expiresAt: claims.expiresAt)
    }
}

extension ServerContext {
    static let identityKey = "servicekit.identity"
    static let serviceCallerKey = "servicekit.service-caller"

    /// The verified caller, when the call carried a valid access token.
    public var identity: CallerIdentity? { self[key: Self.identityKey, as: CallerIdentity.self] }

    /// The verified caller, or UNAUTHENTICATED.
    public func requireIdentity() throws -> CallerIdentity {
        guard let id = identity else { throw RPCError(.unauthenticated, "this call needs a valid access token") }
        return id
    }

    /// True when the call carried the cluster's service credential.
    public var isServiceCall: Bool { self[key: Self.serviceCallerKey, as: Bool.self] ?? false }
}
