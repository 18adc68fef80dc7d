import Foundation
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
    static let gatewayCallerKey = "servicekit.gateway-caller"

    /// The verified caller, when the call carried a valid access token.
    public var identity: CallerIdentity? { self.value(forKey: Self.identityKey) as? CallerIdentity }

    /// Notes a caller verified outside the kit's interceptor (the gateway's policy), for the
    /// access log.
    public func noteIdentity(_ identity: CallerIdentity) { setValue(identity, forKey: Self.identityKey) }

    /// The verified caller, or UNAUTHENTICATED.
    public func requireIdentity() throws -> CallerIdentity {
        guard let id = identity else { throw RPCError(.unauthenticated, "this call needs a valid access token") }
        return id
    }

    /// True when the call carried the cluster's service credential.
    public var isServiceCall: Bool { (self.value(forKey: Self.serviceCallerKey) as? Bool) ?? false }

    /// True when the call is a user's call relayed by the gateway (it carried the gateway's
    /// credential).
    public var isGatewayCall: Bool { (self.value(forKey: Self.gatewayCallerKey) as? Bool) ?? false }

    /// The client's address for throttling and logs: the last `x-forwarded-for` entry (the
    /// address the gateway itself saw) when the gateway relayed the call, else the TCP peer. A
    /// client's own `x-forwarded-for` is never believed (the gateway strips it, and a direct
    /// caller has no gateway credential).
    public var clientAddress: String {
        if isGatewayCall, let forwarded = requestMetadata["x-forwarded-for"], let last = forwarded.split(separator: ",").last {
            let a = last.trimmingCharacters(in: .whitespaces)
            if !a.isEmpty { return a }
        }
        return peerHost
    }
}
