import RPCCore

/// Which request headers reach the services and which the gateway sets itself.
///
/// Services trust a few headers only when the call carries the cluster's service credential
/// (`x-service-token`), which the gateway adds: the client's address (`x-forwarded-for`) and,
/// in general, anything naming an identity. A client must never be able to set those, so every
/// reserved name is removed from what the client sent before the gateway adds its own values.
/// The caller's `authorization` passes unchanged: each service verifies the token again.
public enum HeaderPolicy {
    /// Names removed from client requests.
    public static let strippedNames: Set<String> = [
        "x-service-token", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip",
        "forwarded", "x-user-id", "x-session-id", "x-caller", "x-caller-id", "x-client-address",
    ]
    /// Prefixes removed from client requests (`x-identity-user`, `x-internal-debug`, ...).
    public static let strippedPrefixes: [String] = ["x-identity", "x-internal-", "x-gateway-", "x-service-", "x-user-"]

    public static func isStripped(_ key: String) -> Bool {
        if strippedNames.contains(key) { return true }
        for p in strippedPrefixes where key.hasPrefix(p) { return true }
        return false
    }

    /// The metadata an upstream call carries: the client's, minus reserved names, plus the
    /// client's address and the service credential.
    public static func upstreamMetadata(_ client: Metadata, clientAddress: String, serviceToken: String) -> Metadata {
        var out = Metadata()
        for (key, value) in client where !isStripped(key) { out.add(key, value) }
        out.add("x-forwarded-for", clientAddress)
        if !serviceToken.isEmpty { out.add("x-service-token", serviceToken) }
        return out
    }

    /// `127.0.0.1:5000` → `127.0.0.1`, `[::1]:5000` → `::1`.
    public static func host(ofPeer peer: String) -> String {
        let u = peer.utf8
        if u.first == UInt8(ascii: "["), let close = u.firstIndex(of: UInt8(ascii: "]")) {
            return String(peer[u.index(after: u.startIndex)..<close])
        }
        var colon: String.Index? = nil
        var i = u.startIndex
        while i < u.endIndex {
            if u[i] == UInt8(ascii: ":") {
                if colon != nil { return peer }  // a bare IPv6 address
                colon = i
            }
            i = u.index(after: i)
        }
        if let colon { return String(peer[..<colon]) }
        return peer
    }
}
