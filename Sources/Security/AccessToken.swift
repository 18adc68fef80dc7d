import Foundation
import Synchronization

/// What an access token says: who, which session, until when, and signed with which key.
public struct AccessTokenClaims: Sendable, Hashable {
    /// Whose token: a signed-up user, a guest account, or another service.
    public enum Kind: String, Sendable, Hashable, CaseIterable {
        case user, guest, service
    }

    /// The account id (`sub`).
    public var userID: String
    /// The session it belongs to (`sid`): logging out revokes the session's refresh token.
    public var sessionID: String
    /// Unix seconds (`exp`).
    public var expiresAt: Int64
    /// Unix seconds (`iat`).
    public var issuedAt: Int64
    /// The signing key's id (header `kid`).
    public var keyID: String
    /// `kind`.
    public var kind: Kind

    public init(userID: String, sessionID: String, expiresAt: Int64, issuedAt: Int64, keyID: String, kind: Kind) {
        self.userID = userID
        self.sessionID = sessionID
        self.expiresAt = expiresAt
        self.issuedAt = issuedAt
        self.keyID = keyID
        self.kind = kind
    }
}

/// Why a token was refused. Every case maps to UNAUTHENTICATED on the wire; the case is for logs
/// and for a client deciding to refresh (`expired`) or to log in again (the rest).
public enum AccessTokenError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Not three base64url segments of the expected JSON, wrong algorithm, missing claims.
    case malformed(String)
    /// Signed with a key id we do not know (rotated out, or forged).
    case unknownKeyID(String)
    /// The signature does not match: tampered, or signed by another key.
    case badSignature
    /// `exp` has passed (beyond the leeway).
    case expired(expiresAt: Int64, now: Int64)
    /// `iat` is in the future (beyond the leeway): a clock problem or a forged token.
    case notYetValid(issuedAt: Int64, now: Int64)

    public var description: String {
        switch self {
        case .malformed(let why): "malformed access token: \(why)"
        case .unknownKeyID(let kid): "access token signed with unknown key id \(kid)"
        case .badSignature: "access token signature is invalid"
        case .expired(let exp, let now): "access token expired \(now - exp) s ago"
        case .notYetValid(let iat, let now): "access token issued \(iat - now) s in the future"
        }
    }
}

/// Our access tokens: JWTs (RFC 7519) signed with Ed25519 (`alg: EdDSA`, RFC 8037), so standard
/// tools (jwt.io, PyJWT, `jose`) can read and check them:
///
///     base64url({"alg":"EdDSA","typ":"JWT","kid":"<key id>"})
///     . base64url({"sub":"<user>","sid":"<session>","iat":<unix s>,"exp":<unix s>,"kind":"user"})
///     . base64url(Ed25519 signature of the two segments above, joined by ".")
public enum AccessToken {
    /// Tokens longer than this are refused before any parsing.
    public static let maximumLength = 4096

    /// The current Unix time in seconds. Read on every verification (the cache's expiry check):
    /// on Linux the kernel's coarse clock (a few ns, as exact as whole seconds need) rather than
    /// `Date`'s precise one.
    public static func currentTime() -> Int64 {
        #if os(Linux)
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME_COARSE, &ts)
        return Int64(ts.tv_sec)
        #else
        return Int64(Date().timeIntervalSince1970)
        #endif
    }

    /// Signs `claims` with `key`; the header's `kid` is `claims.keyID`.
    public static func sign(_ claims: AccessTokenClaims, with key: Ed25519KeyPair) -> String {
        let header = TokenJSON.object([("alg", .string("EdDSA")), ("typ", .string("JWT")), ("kid", .string(claims.keyID))])
        let payload = TokenJSON.object([
            ("sub", .string(claims.userID)), ("sid", .string(claims.sessionID)),
            ("iat", .integer(claims.issuedAt)), ("exp", .integer(claims.expiresAt)),
            ("kind", .string(claims.kind.rawValue)),
        ])
        let signingInput = Base64URL.encode(Array(header.utf8)) + "." + Base64URL.encode(Array(payload.utf8))
        return signingInput + "." + Base64URL.encode(key.sign(Array(signingInput.utf8)))
    }

    /// Checks `token` completely: shape, algorithm, key id, signature, then the claims and the
    /// time (`exp`, `iat`, each with `leeway` seconds for clock skew).
    public static func verify(
        _ token: String,
        keys: [String: Ed25519PublicKey],
        now: Int64 = currentTime(),
        leeway: Int64 = 5
    ) throws(AccessTokenError) -> AccessTokenClaims {
        let claims = try verifySignature(token, keys: keys)
        try checkTime(claims, now: now, leeway: leeway)
        return claims
    }

    /// Everything but the time checks: what `AccessTokenVerifier` caches.
    static func verifySignature(_ token: String, keys: [String: Ed25519PublicKey]) throws(AccessTokenError) -> AccessTokenClaims {
        try verifySignature(token[...], keys: keys)
    }

    static func verifySignature(_ token: Substring, keys: [String: Ed25519PublicKey]) throws(AccessTokenError) -> AccessTokenClaims {
        guard token.utf8.count <= maximumLength else { throw .malformed("longer than \(maximumLength) bytes") }
        var token = token
        let result: Result<AccessTokenClaims, AccessTokenError> = token.withUTF8 { utf8 in
            do throws(AccessTokenError) {
                return .success(try verifySignature(utf8: utf8, keys: keys))
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    private static func verifySignature(
        utf8: UnsafeBufferPointer<UInt8>, keys: [String: Ed25519PublicKey]
    ) throws(AccessTokenError) -> AccessTokenClaims {
        guard let firstDot = utf8.firstIndex(of: UInt8(ascii: ".")),
            let secondDot = utf8[(firstDot + 1)...].firstIndex(of: UInt8(ascii: ".")),
            !utf8[(secondDot + 1)...].contains(UInt8(ascii: "."))
        else { throw .malformed("expected three segments separated by '.'") }
        let headerPart = UnsafeBufferPointer(rebasing: utf8[0..<firstDot])
        let payloadPart = UnsafeBufferPointer(rebasing: utf8[(firstDot + 1)..<secondDot])
        let signaturePart = UnsafeBufferPointer(rebasing: utf8[(secondDot + 1)...])

        // Header: only EdDSA, only with a key id, no extensions we would have to understand.
        guard let headerBytes = Base64URL.decode(utf8: headerPart), let header = TokenJSON.parseObject(headerBytes) else {
            throw .malformed("header is not base64url JSON")
        }
        guard header["alg"] == .string("EdDSA") else { throw .malformed("algorithm must be EdDSA") }
        if let typ = header["typ"], typ != .string("JWT") { throw .malformed("typ must be JWT") }
        guard header["crit"] == nil else { throw .malformed("critical header extensions are not supported") }
        guard case .string(let kid)? = header["kid"] else { throw .malformed("header has no kid") }
        guard let key = keys[kid] else { throw .unknownKeyID(kid) }

        // Signature over the ASCII bytes "header.payload", before the payload is even parsed.
        guard let signature = Base64URL.decode(utf8: signaturePart), signature.count == 64 else {
            throw .malformed("signature is not 64 bytes of base64url")
        }
        let signingInput = UnsafeRawBufferPointer(rebasing: UnsafeRawBufferPointer(utf8)[0..<secondDot])
        guard key.verify(signature: signature, message: signingInput) else { throw .badSignature }

        guard let payloadBytes = Base64URL.decode(utf8: payloadPart), let payload = TokenJSON.parseObject(payloadBytes) else {
            throw .malformed("payload is not base64url JSON")
        }
        guard case .string(let sub)? = payload["sub"], !sub.isEmpty else { throw .malformed("missing sub") }
        guard case .string(let sid)? = payload["sid"], !sid.isEmpty else { throw .malformed("missing sid") }
        guard let exp = numericDate(payload["exp"]) else { throw .malformed("missing or invalid exp") }
        guard let iat = numericDate(payload["iat"]) else { throw .malformed("missing or invalid iat") }
        guard case .string(let kindName)? = payload["kind"], let kind = AccessTokenClaims.Kind(rawValue: kindName) else {
            throw .malformed("missing or unknown kind")
        }
        return AccessTokenClaims(userID: sub, sessionID: sid, expiresAt: exp, issuedAt: iat, keyID: kid, kind: kind)
    }

    /// JWT NumericDate: seconds, possibly fractional (truncated).
    private static func numericDate(_ value: TokenJSON.Value?) -> Int64? {
        switch value {
        case .integer(let n)?: return n
        case .double(let d)? where d.isFinite && abs(d) < 1e15: return Int64(d)
        default: return nil
        }
    }

    static func checkTime(_ claims: AccessTokenClaims, now: Int64, leeway: Int64) throws(AccessTokenError) {
        guard now < claims.expiresAt + leeway else { throw .expired(expiresAt: claims.expiresAt, now: now) }
        guard claims.issuedAt <= now + leeway else { throw .notYetValid(issuedAt: claims.issuedAt, now: now) }
    }
}

/// Verifies access tokens on every request, remembering tokens whose signature it already checked.
///
/// An Ed25519 verification costs about 120 µs with OpenSSL 3.0 on this machine kind — more than
/// our whole per-request budget — while a client sends the same token on every call until it
/// expires. The cache maps the exact token string to its claims, so any other string (one changed
/// byte) is verified in full; expiry is still checked on every hit. Replacing the keys (rotation,
/// revocation) empties the cache.
public final class AccessTokenVerifier: Sendable {
    private struct State {
        var keys: [String: Ed25519PublicKey]
        var cache: [TokenKey: AccessTokenClaims] = [:]
    }

    /// A token as the cache's key: equal when the whole strings are, hashed on the length and the
    /// last 32 bytes only. A token ends with its Ed25519 signature (86 base64url characters), so
    /// those bytes differ between any two tokens the cache can hold (only verified ones get in);
    /// SipHash over a whole token (about 350 bytes) was 0.7% of an authenticated relay's CPU. A
    /// client can make lookups whose suffixes collide, but each then probes only what verified
    /// tokens put there, as any lookup does.
    ///
    /// A `Substring`: the caller's token is usually a slice of its `authorization` header, and
    /// looking it up costs no copy of it (a cached one keeps its header's string, 7 bytes more).
    struct TokenKey: Hashable {
        let token: Substring

        static func == (a: TokenKey, b: TokenKey) -> Bool { a.token == b.token }

        func hash(into hasher: inout Hasher) {
            var token = token
            token.withUTF8 { bytes in
                hasher.combine(bytes.count)
                hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes.suffix(32))))
            }
        }
    }

    private let state: Mutex<State>
    private let leeway: Int64
    private let capacity: Int
    /// Counts the key sets this verifier has had: a verification remembered elsewhere (one per
    /// client connection, `AuthInterceptor.RememberedToken`) holds while it is unchanged.
    private let keyGeneration = Atomic<UInt64>(0)

    /// The current key set's number: it changes whenever `setKeys` brings other keys (a key
    /// removed, added or replaced), so a verification made before no longer holds.
    public var generation: UInt64 { keyGeneration.load(ordering: .acquiring) }

    /// Whether a token verified earlier, expiring at `expiresAt` (Unix seconds), is still live
    /// at `now` (with the verifier's leeway, as `verify` checks it).
    public func checkExpiry(_ expiresAt: Int64, now: Int64) throws(AccessTokenError) {
        guard now < expiresAt + leeway else { throw .expired(expiresAt: expiresAt, now: now) }
    }

    public init(keys: [String: Ed25519PublicKey], leeway: Int64 = 5, cacheCapacity: Int = 10_000) {
        self.state = Mutex(State(keys: keys))
        self.leeway = leeway
        self.capacity = max(0, cacheCapacity)
    }

    /// Replaces the trusted keys and forgets every cached verification (when they changed: a
    /// refetch that brings the same keys, as every forged key id causes, keeps the cache).
    public func setKeys(_ keys: [String: Ed25519PublicKey]) {
        state.withLock { s in
            guard s.keys != keys else { return }
            s.keys = keys
            s.cache.removeAll()
            keyGeneration.add(1, ordering: .releasing)
        }
    }

    public func verify(_ token: String, now: Int64 = AccessToken.currentTime()) throws(AccessTokenError) -> AccessTokenClaims {
        try verify(token[...], now: now)
    }

    /// `verify` for a token that is part of a longer string (`authorization: Bearer <token>`).
    public func verify(_ token: Substring, now: Int64 = AccessToken.currentTime()) throws(AccessTokenError) -> AccessTokenClaims {
        let key = TokenKey(token: token)
        // The keys are read only on a miss (copying the dictionary out costs a retain per call).
        if let cached = state.withLock({ s in s.cache[key] }) {
            try AccessToken.checkTime(cached, now: now, leeway: leeway)
            return cached
        }
        let keys = state.withLock { s in s.keys }
        let claims = try AccessToken.verifySignature(token, keys: keys)
        try AccessToken.checkTime(claims, now: now, leeway: leeway)
        guard capacity > 0 else { return claims }
        state.withLock { s in
            // Keys may have changed while we verified: only cache under the keys we used.
            guard s.keys[claims.keyID] == keys[claims.keyID] else { return }
            if s.cache.count >= capacity {
                s.cache = s.cache.filter { $0.value.expiresAt + leeway > now }
                if s.cache.count >= capacity { s.cache.removeAll(keepingCapacity: true) }
            }
            s.cache[key] = claims
        }
        return claims
    }
}
