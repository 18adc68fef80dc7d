import Foundation
import Testing

@testable import Security

@Suite struct AccessTokenTests {
    static let pair = try! Ed25519KeyPair(rawPrivateKey: hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"))
    static let kid = pair.publicKey.keyID
    static let keys = [kid: pair.publicKey]
    static let now: Int64 = 1_800_000_000

    static func claims(expiresIn: Int64 = 900, kind: AccessTokenClaims.Kind = .user) -> AccessTokenClaims {
        AccessTokenClaims(userID: "u-42", sessionID: "s-7", expiresAt: now + expiresIn, issuedAt: now, keyID: kid, kind: kind)
    }

    @Test func signAndVerifyRoundTrip() throws {
        for kind in AccessTokenClaims.Kind.allCases {
            let token = AccessToken.sign(Self.claims(kind: kind), with: Self.pair)
            #expect(try AccessToken.verify(token, keys: Self.keys, now: Self.now + 10) == Self.claims(kind: kind))
        }
        let token = AccessToken.sign(Self.claims(), with: Self.pair)
        let segments = token.split(separator: ".")
        #expect(segments.count == 3)
        #expect(String(decoding: Base64URL.decode(segments[0])!, as: UTF8.self) == #"{"alg":"EdDSA","typ":"JWT","kid":"\#(Self.kid)"}"#)
        #expect(
            String(decoding: Base64URL.decode(segments[1])!, as: UTF8.self)
                == #"{"sub":"u-42","sid":"s-7","iat":1800000000,"exp":1800000900,"kind":"user"}"#)
    }

    @Test func claimsWithCharactersThatNeedEscaping() throws {
        var claims = Self.claims()
        claims.userID = "quote\" back\\slash \u{1} é 🎉"
        let token = AccessToken.sign(claims, with: Self.pair)
        #expect(try AccessToken.verify(token, keys: Self.keys, now: Self.now) == claims)
    }

    @Test func tamperedTokensAreRejected() throws {
        let token = AccessToken.sign(Self.claims(), with: Self.pair)
        let parts = token.split(separator: ".").map(String.init)
        // Another payload under the original signature (a user id swapped in).
        let forgedPayload = Base64URL.encode(Array(#"{"sub":"admin","sid":"s-7","iat":1800000000,"exp":1800000900,"kind":"user"}"#.utf8))
        #expect(throws: AccessTokenError.badSignature) {
            try AccessToken.verify(parts[0] + "." + forgedPayload + "." + parts[2], keys: Self.keys, now: Self.now)
        }
        // One flipped signature bit.
        var signature = Base64URL.decode(parts[2])!
        signature[10] ^= 0x20
        #expect(throws: AccessTokenError.badSignature) {
            try AccessToken.verify(parts[0] + "." + parts[1] + "." + Base64URL.encode(signature), keys: Self.keys, now: Self.now)
        }
        // Signed by someone else's key under our kid.
        let intruder = Ed25519KeyPair()
        #expect(throws: AccessTokenError.badSignature) {
            try AccessToken.verify(AccessToken.sign(Self.claims(), with: intruder), keys: Self.keys, now: Self.now)
        }
        // alg "none" and friends.
        let none = Base64URL.encode(Array(#"{"alg":"none","typ":"JWT","kid":"\#(Self.kid)"}"#.utf8))
        #expect(throws: AccessTokenError.malformed("algorithm must be EdDSA")) {
            try AccessToken.verify(none + "." + parts[1] + ".", keys: Self.keys, now: Self.now)
        }
        for garbage in ["", "a.b", "a.b.c.d", "....", parts[0] + "." + parts[1], token + "x", " " + token, String(repeating: "a", count: 5000)] {
            #expect(throws: AccessTokenError.self) { try AccessToken.verify(garbage, keys: Self.keys, now: Self.now) }
        }
    }

    @Test func expiredAndFutureTokensAreRejected() throws {
        let token = AccessToken.sign(Self.claims(expiresIn: 900), with: Self.pair)
        #expect(throws: AccessTokenError.expired(expiresAt: Self.now + 900, now: Self.now + 900)) {
            try AccessToken.verify(token, keys: Self.keys, now: Self.now + 900, leeway: 0)
        }
        #expect(throws: AccessTokenError.expired(expiresAt: Self.now + 900, now: Self.now + 906)) {
            try AccessToken.verify(token, keys: Self.keys, now: Self.now + 906)
        }
        #expect(try AccessToken.verify(token, keys: Self.keys, now: Self.now + 904).userID == "u-42")  // within the 5 s leeway
        #expect(throws: AccessTokenError.notYetValid(issuedAt: Self.now, now: Self.now - 60)) {
            try AccessToken.verify(token, keys: Self.keys, now: Self.now - 60)
        }
    }

    @Test func unknownKeyIDIsRejected() throws {
        let other = Ed25519KeyPair()
        var claims = Self.claims()
        claims.keyID = other.publicKey.keyID
        let token = AccessToken.sign(claims, with: other)
        #expect(throws: AccessTokenError.unknownKeyID(other.publicKey.keyID)) {
            try AccessToken.verify(token, keys: Self.keys, now: Self.now)
        }
        // Once the key is trusted (rotation), the token verifies.
        #expect(try AccessToken.verify(token, keys: [other.publicKey.keyID: other.publicKey], now: Self.now) == claims)
    }

    @Test func verifierCachesVerifiedTokensButStillChecksExpiryAndKeys() throws {
        let verifier = AccessTokenVerifier(keys: Self.keys, leeway: 0)
        let token = AccessToken.sign(Self.claims(expiresIn: 60), with: Self.pair)
        #expect(try verifier.verify(token, now: Self.now) == Self.claims(expiresIn: 60))
        #expect(try verifier.verify(token, now: Self.now + 30) == Self.claims(expiresIn: 60))  // cached
        #expect(throws: AccessTokenError.expired(expiresAt: Self.now + 60, now: Self.now + 61)) { try verifier.verify(token, now: Self.now + 61) }
        verifier.setKeys([:])
        #expect(throws: AccessTokenError.unknownKeyID(Self.kid)) { try verifier.verify(token, now: Self.now) }
        // A tampered copy of a cached token is verified in full.
        verifier.setKeys(Self.keys)
        _ = try verifier.verify(token, now: Self.now)
        var bytes = Array(token.utf8)
        bytes[bytes.count - 5] = bytes[bytes.count - 5] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(throws: AccessTokenError.self) { try verifier.verify(String(decoding: bytes, as: UTF8.self), now: Self.now) }
    }

    /// The cache hashes a token on its length and last 32 bytes (its signature's tail): tokens that
    /// share them are still told apart by the whole string. A forged token carrying a cached
    /// token's signature, with other claims of the same length, is verified in full and refused;
    /// the cached one still answers from the cache.
    @Test func tokensSharingTheCachedOnesSignatureAreVerifiedInFull() throws {
        let verifier = AccessTokenVerifier(keys: Self.keys, leeway: 0)
        let token = AccessToken.sign(Self.claims(), with: Self.pair)
        _ = try verifier.verify(token, now: Self.now)
        let parts = token.split(separator: ".").map(String.init)
        // Same length, same signature: another user id of the same length in the claims.
        let forgedClaims = AccessTokenClaims(
            userID: "u-43", sessionID: "s-7", expiresAt: Self.now + 900, issuedAt: Self.now, keyID: Self.kid, kind: .user)
        let forgedPayload = AccessToken.sign(forgedClaims, with: Self.pair).split(separator: ".")[1]
        let forged = "\(parts[0]).\(forgedPayload).\(parts[2])"
        #expect(forged.utf8.count == token.utf8.count && forged != token)
        #expect(forged.utf8.suffix(32).elementsEqual(token.utf8.suffix(32)))
        #expect(throws: AccessTokenError.self) { try verifier.verify(forged, now: Self.now) }
        #expect(try verifier.verify(token, now: Self.now) == Self.claims())
        #expect(AccessTokenVerifier.TokenKey(token: forged[...]).hashValue == AccessTokenVerifier.TokenKey(token: token[...]).hashValue)
        #expect(AccessTokenVerifier.TokenKey(token: forged[...]) != AccessTokenVerifier.TokenKey(token: token[...]))
        // A token read from its header (a slice of "Bearer <token>") is the same key, and is
        // answered from the cache.
        let slice = ("Bearer " + token).dropFirst(7)
        #expect(AccessTokenVerifier.TokenKey(token: slice) == AccessTokenVerifier.TokenKey(token: token[...]))
        #expect(AccessTokenVerifier.TokenKey(token: slice).hashValue == AccessTokenVerifier.TokenKey(token: token[...]).hashValue)
        #expect(try verifier.verify(slice, now: Self.now) == Self.claims())
        #expect(throws: AccessTokenError.self) { try verifier.verify(("Bearer " + forged).dropFirst(7), now: Self.now) }
    }

    /// Prints the figures; asserts nothing about them (timing belongs in benchmarks).
    @Test func verificationCost() throws {
        let token = AccessToken.sign(Self.claims(), with: Self.pair)
        let clock = ContinuousClock()
        let n = 2000
        var sink = 0
        let full = try clock.measure {
            for _ in 0..<n { sink &+= try AccessToken.verify(token, keys: Self.keys, now: Self.now).userID.count }
        }
        let signing = clock.measure {
            for _ in 0..<n { sink &+= AccessToken.sign(Self.claims(), with: Self.pair).count }
        }
        let verifier = AccessTokenVerifier(keys: Self.keys)
        _ = try verifier.verify(token, now: Self.now)
        let cached = try clock.measure {
            for _ in 0..<(n * 10) { sink &+= try verifier.verify(token, now: Self.now).userID.count }
        }
        let rawVerify = clock.measure {
            let message = Array("x".utf8), signature = Self.pair.sign(message)
            for _ in 0..<n { sink &+= Self.pair.publicKey.verify(signature: signature, message: message) ? 1 : 0 }
        }
        #expect(sink > 0)
        func us(_ d: Duration, _ count: Int) -> String { String(format: "%.2f", d.seconds * 1e6 / Double(count)) }
        print(
            "security: token verify \(us(full, n)) µs (Ed25519 verify alone \(us(rawVerify, n)) µs), cached verify \(us(cached, n * 10)) µs, sign \(us(signing, n)) µs; token \(token.utf8.count) bytes"
        )
    }
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
