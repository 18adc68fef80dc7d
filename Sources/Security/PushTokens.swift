import Foundation

/// Signing JWTs (RFC 7519, compact JWS, RFC 7515) for the push providers' credentials: the APNs
/// provider token and VAPID (ES256), the FCM service account's assertion (RS256). Only signing:
/// the providers verify them. The members are written in the order given, with no whitespace.
public enum JWT {
    /// A header or claim value: the providers' tokens need nothing but strings and integers.
    public enum Value: Sendable, Hashable {
        case string(String)
        case integer(Int64)
    }

    /// `base64url(header).base64url(claims).base64url(ES256 signature)`; `alg` is not added:
    /// put `"alg": "ES256"` in `header`.
    public static func signES256(header: KeyValuePairs<String, Value>, claims: KeyValuePairs<String, Value>, key: P256.PrivateKey) -> String {
        let input = signingInput(header: header, claims: claims)
        return input + "." + Base64URL.encode(key.signES256(Array(input.utf8)))
    }

    /// As `signES256`, signed with RS256 (RSASSA-PKCS1-v1_5, SHA-256).
    public static func signRS256(header: KeyValuePairs<String, Value>, claims: KeyValuePairs<String, Value>, key: RSAPrivateKey) -> String {
        let input = signingInput(header: header, claims: claims)
        return input + "." + Base64URL.encode(key.signRS256(Array(input.utf8)))
    }

    static func signingInput(header: KeyValuePairs<String, Value>, claims: KeyValuePairs<String, Value>) -> String {
        func json(_ members: KeyValuePairs<String, Value>) -> String {
            TokenJSON.object(
                members.map { member -> (String, TokenJSON.Member) in
                    switch member.value {
                    case .string(let s): (member.key, .string(s))
                    case .integer(let n): (member.key, .integer(n))
                    }
                })
        }
        return Base64URL.encode(Array(json(header).utf8)) + "." + Base64URL.encode(Array(json(claims).utf8))
    }

    // MARK: APNs

    /// Apple's provider authentication token: header `{"alg":"ES256","kid":<key id>}`, claims
    /// `{"iss":<team id>,"iat":<unix seconds>}`, signed with the `.p8` key of that key id. APNs
    /// refuses a token issued more than an hour ago (`ExpiredProviderToken`) and one renewed more
    /// often than every 20 minutes (`TooManyProviderTokenUpdates`), so the caller keeps one token
    /// for a while rather than signing per request.
    public static func apnsProviderToken(teamID: String, keyID: String, issuedAt: Int64, key: P256.PrivateKey) -> String {
        signES256(header: ["alg": .string("ES256"), "kid": .string(keyID)], claims: ["iss": .string(teamID), "iat": .integer(issuedAt)], key: key)
    }

    // MARK: Google service accounts (FCM HTTP v1)

    /// Where a service account's assertion is exchanged for an access token (the `aud` claim).
    public static let googleTokenURI = "https://oauth2.googleapis.com/token"
    /// Google accepts assertions valid for at most an hour.
    public static let googleMaximumLifetime: Int64 = 3600

    /// The signed assertion of Google's OAuth 2.0 JWT bearer grant (RFC 7523) for a service
    /// account: header `{"alg":"RS256","typ":"JWT"}` (plus `kid`, the account's `private_key_id`,
    /// when given), claims `iss` (the account's `client_email`), `scope`, `aud`, `iat`, `exp`.
    /// `audience` is the account's `token_uri` (a test server's in the tests).
    public static func googleServiceAccountAssertion(
        clientEmail: String,
        scope: String,
        issuedAt: Int64,
        lifetime: Int64 = googleMaximumLifetime,
        audience: String = googleTokenURI,
        keyID: String? = nil,
        key: RSAPrivateKey
    ) throws -> String {
        guard (1...googleMaximumLifetime).contains(lifetime) else {
            throw SecurityError.invalidParameters("a service account assertion lives 1 to \(googleMaximumLifetime) s, not \(lifetime)")
        }
        guard !clientEmail.isEmpty, !scope.isEmpty, !audience.isEmpty else {
            throw SecurityError.invalidParameters("a service account assertion needs iss, scope and aud")
        }
        let claims: KeyValuePairs<String, Value> = [
            "iss": .string(clientEmail), "scope": .string(scope), "aud": .string(audience),
            "iat": .integer(issuedAt), "exp": .integer(issuedAt + lifetime),
        ]
        if let keyID {
            return signRS256(header: ["alg": .string("RS256"), "typ": .string("JWT"), "kid": .string(keyID)], claims: claims, key: key)
        }
        return signRS256(header: ["alg": .string("RS256"), "typ": .string("JWT")], claims: claims, key: key)
    }
}

/// VAPID (RFC 8292): the application server identifies itself to a Web Push service with an
/// ES256 JWT for the endpoint's origin and its public key, in one `Authorization` header.
public enum VAPID {
    /// RFC 8292 §2: `exp` no more than 24 hours after the request.
    public static let maximumLifetime: Int64 = 24 * 3600

    /// The `aud` claim: the push endpoint's origin (`https://host[:port]`, the port only when it is
    /// not the scheme's default; `http` allowed for local test servers).
    public static func audience(ofEndpoint endpoint: String) throws -> String {
        guard let url = URLComponents(string: endpoint), let scheme = url.scheme?.lowercased(), scheme == "https" || scheme == "http",
            let rawHost = url.host, !rawHost.isEmpty
        else { throw SecurityError.invalidParameters("the push endpoint is not an http(s) URL with a host") }
        var host = rawHost.lowercased()
        if host.contains(":"), !host.hasPrefix("[") { host = "[\(host)]" }  // an IPv6 literal
        let defaultPort = scheme == "https" ? 443 : 80
        if let port = url.port, port != defaultPort { return "\(scheme)://\(host):\(port)" }
        return "\(scheme)://\(host)"
    }

    /// The JWT: header `{"typ":"JWT","alg":"ES256"}`, claims `{"aud","exp","sub"}`. `subject` is
    /// the operator's contact, a `mailto:` or an `https:` URL (§2.1); `expiresAt` lies after `now`
    /// and at most 24 hours ahead.
    public static func token(
        endpoint: String, subject: String, expiresAt: Int64, now: Int64 = AccessToken.currentTime(), key: P256.PrivateKey
    ) throws -> String {
        let audience = try audience(ofEndpoint: endpoint)
        guard subject.hasPrefix("mailto:") || subject.hasPrefix("https://"), subject.count > "mailto:".count else {
            throw SecurityError.invalidParameters("the VAPID subject must be a mailto: or https: URL")
        }
        guard expiresAt > now, expiresAt - now <= maximumLifetime else {
            throw SecurityError.invalidParameters("a VAPID token expires within \(maximumLifetime) s, not \(expiresAt - now) s ahead")
        }
        return JWT.signES256(
            header: ["typ": .string("JWT"), "alg": .string("ES256")],
            claims: ["aud": .string(audience), "exp": .integer(expiresAt), "sub": .string(subject)],
            key: key)
    }

    /// The `Authorization` header's value (RFC 8292 §3): `vapid t=<jwt>, k=<base64url of the
    /// uncompressed public key>`.
    public static func authorization(
        endpoint: String, subject: String, expiresAt: Int64, now: Int64 = AccessToken.currentTime(), key: P256.PrivateKey
    ) throws -> String {
        let jwt = try token(endpoint: endpoint, subject: subject, expiresAt: expiresAt, now: now, key: key)
        return "vapid t=\(jwt), k=\(Base64URL.encode(key.publicKey.uncompressedRepresentation))"
    }
}
