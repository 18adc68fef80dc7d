import Foundation
import Testing

@testable import Security

// The cryptography of push (issue 36): ES256 and RS256 JWTs, VAPID, RFC 8291 Web Push encryption.
// Known answers first (RFC 8291's example, RFC 5869's HKDF), then the same operations checked by
// implementations we did not write (PyPI's http_ece, PyJWT, py_vapid and cryptography, from the
// project's .venv) and keys made by the `openssl` command.

/// Runs `openssl` with `arguments` (key generation for the tests: nothing private is committed).
func openSSLCommand(_ arguments: [String]) throws -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = ["openssl"] + arguments
    let out = Pipe()
    process.standardOutput = out
    process.standardError = out
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self))
}

/// A fresh temporary directory, removed by `body`'s end.
func withTemporaryDirectory<T>(_ body: (String) throws -> T) throws -> T {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("push-crypto-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
    defer { try? FileManager.default.removeItem(atPath: path) }
    return try body(path)
}

/// An Apple-style `.p8` (PKCS #8 PEM of a P-256 key) made by `openssl genpkey`, at `directory/AuthKey_TEST.p8`.
func makeP8(in directory: String) throws -> String {
    let path = directory + "/AuthKey_TEST.p8"
    let result = try openSSLCommand(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path])
    try #require(result.status == 0, "\(result.output)")
    return path
}

/// An RSA key as a service account's (PKCS #8 PEM), made by `openssl genpkey`.
func makeRSAKey(in directory: String, bits: Int = 2048) throws -> String {
    let path = directory + "/service-account-\(bits).pem"
    let result = try openSSLCommand(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:\(bits)", "-out", path])
    try #require(result.status == 0, "\(result.output)")
    return path
}

/// A JSON number from `JSONSerialization` as Int64.
func int64(_ value: Any?) -> Int64? {
    if let n = value as? Int { return Int64(n) }
    if let n = value as? Int64 { return n }
    return (value as? NSNumber)?.int64Value
}

/// The three segments of a compact JWS, decoded.
func jwtParts(_ token: String) throws -> (header: String, claims: String, signature: [UInt8]) {
    let parts = token.split(separator: ".", omittingEmptySubsequences: false)
    try #require(parts.count == 3)
    let header = try #require(Base64URL.decode(parts[0]))
    let claims = try #require(Base64URL.decode(parts[1]))
    let signature = try #require(Base64URL.decode(parts[2]))
    return (String(decoding: header, as: UTF8.self), String(decoding: claims, as: UTF8.self), signature)
}

/// `token` with one bit of its signature flipped, and with one bit of its claims flipped (the
/// last byte of the first string value, so the JSON stays valid).
func tamperedTokens(_ token: String) throws -> [String] {
    let parts = token.split(separator: ".").map(String.init)
    var signature = try #require(Base64URL.decode(parts[2]))
    signature[10] ^= 0x01
    var claims = try #require(Base64URL.decode(parts[1]))
    let colon = try #require(claims.firstIndex(of: UInt8(ascii: ":")))
    let closingQuote = try #require(claims[(colon + 2)...].firstIndex(of: UInt8(ascii: "\"")))
    claims[closingQuote - 1] ^= 0x01
    return [
        parts[0] + "." + parts[1] + "." + Base64URL.encode(signature),
        parts[0] + "." + Base64URL.encode(claims) + "." + parts[2],
    ]
}

@Suite struct PushCryptoTests {
    // MARK: Web Push encryption, RFC 8291

    /// RFC 8291 Section 5 and Appendix A: the example's keys, salt and exact message.
    enum RFC8291 {
        static let plaintext = Array("When I grow up, I want to be a watermelon".utf8)
        static let applicationServerPrivate = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"
        static let applicationServerPublic = "BP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A8"
        static let userAgentPrivate = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94"
        static let userAgentPublic = "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"
        static let salt = "DGv6ra1nlYgDCS1FRnbzlw"
        static let auth = "BTBZMqHH6r4Tts7J_aSIgg"
        static let body =
            "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN"
    }

    static func b64(_ text: String) -> [UInt8] { Base64URL.decode(text)! }

    @Test func rfc8291ExampleIsReproducedByteForByte() throws {
        let asKey = try P256.PrivateKey(rawRepresentation: Self.b64(RFC8291.applicationServerPrivate))
        let uaKey = try P256.PrivateKey(rawRepresentation: Self.b64(RFC8291.userAgentPrivate))
        #expect(asKey.publicKey.uncompressedRepresentation == Self.b64(RFC8291.applicationServerPublic))
        #expect(uaKey.publicKey.uncompressedRepresentation == Self.b64(RFC8291.userAgentPublic))

        let body = try WebPushEncryption.encrypt(
            RFC8291.plaintext, p256dh: Self.b64(RFC8291.userAgentPublic), auth: Self.b64(RFC8291.auth),
            ephemeralKey: asKey, salt: Self.b64(RFC8291.salt))
        #expect(Base64URL.encode(body) == RFC8291.body)

        let plaintext = try WebPushEncryption.decrypt(Self.b64(RFC8291.body), privateKey: uaKey, auth: Self.b64(RFC8291.auth))
        #expect(plaintext == RFC8291.plaintext)
    }

    /// RFC 5869 Appendix A.1 and A.3 (no salt, no info): the HKDF under the key schedule.
    @Test func hkdfMatchesRFC5869() {
        let okm = HKDF.sha256(
            inputKeyMaterial: [UInt8](repeating: 0x0B, count: 22), salt: hex("000102030405060708090a0b0c"),
            info: hex("f0f1f2f3f4f5f6f7f8f9"), byteCount: 42)
        #expect(okm == hex("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"))
        let noSalt = HKDF.sha256(inputKeyMaterial: [UInt8](repeating: 0x0B, count: 22), salt: [], info: [], byteCount: 42)
        #expect(noSalt == hex("8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"))
    }

    @Test func eachMessageHasItsOwnKeyAndSaltAndRoundTrips() throws {
        let subscriber = P256.PrivateKey()
        let auth = SecureRandom.bytes(16)
        let message = Array(#"{"title":"Help requested","body":"Zoë asks: water the plants ✓"}"#.utf8)
        let a = try WebPushEncryption.encrypt(message, p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth)
        let b = try WebPushEncryption.encrypt(message, p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth)
        #expect(a.count == 86 + message.count + 1 + 16)
        #expect(a[16..<21] == [0x00, 0x00, 0x10, 0x00, 65])
        #expect(a[0..<16] != b[0..<16])  // salt
        #expect(a[21..<86] != b[21..<86])  // the ephemeral public key
        #expect(try WebPushEncryption.decrypt(a, privateKey: subscriber, auth: auth) == message)
        #expect(try WebPushEncryption.decrypt(b, privateKey: subscriber, auth: auth) == message)
        #expect(
            try WebPushEncryption.decrypt(
                WebPushEncryption.encrypt([], p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth), privateKey: subscriber, auth: auth
            ) == [])
    }

    @Test func thePayloadIsBoundedToOneFourKilobyteMessage() throws {
        let subscriber = P256.PrivateKey()
        let auth = SecureRandom.bytes(16)
        #expect(WebPushEncryption.maximumPlaintextByteCount == 3993)
        let largest = [UInt8](repeating: 0x61, count: 3993)
        let body = try WebPushEncryption.encrypt(largest, p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth)
        #expect(body.count == 4096)
        #expect(try WebPushEncryption.decrypt(body, privateKey: subscriber, auth: auth) == largest)
        #expect(throws: WebPushError.payloadTooLarge(byteCount: 3994, maximum: 3993)) {
            try WebPushEncryption.encrypt(largest + [0x61], p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth)
        }
    }

    @Test func badSubscriptionsAndAlteredMessagesAreRefused() throws {
        let subscriber = P256.PrivateKey()
        let p256dh = subscriber.publicKey.uncompressedRepresentation
        let auth = SecureRandom.bytes(16)
        var offCurve = p256dh
        offCurve[64] ^= 1
        #expect(throws: WebPushError.invalidSubscriptionKey) { try WebPushEncryption.encrypt([1], p256dh: offCurve, auth: auth) }
        #expect(throws: WebPushError.invalidSubscriptionKey) { try WebPushEncryption.encrypt([1], p256dh: Array(p256dh.prefix(33)), auth: auth) }
        #expect(throws: WebPushError.invalidAuthSecret(byteCount: 15)) {
            try WebPushEncryption.encrypt([1], p256dh: p256dh, auth: Array(auth.prefix(15)))
        }

        let body = try WebPushEncryption.encrypt(Array("hello".utf8), p256dh: p256dh, auth: auth)
        #expect(throws: WebPushError.decryptionFailed) { try WebPushEncryption.decrypt(body, privateKey: subscriber, auth: SecureRandom.bytes(16)) }
        #expect(throws: WebPushError.decryptionFailed) { try WebPushEncryption.decrypt(body, privateKey: P256.PrivateKey(), auth: auth) }
        for index in [0, 15, 90, body.count - 1] {  // the salt, the ciphertext, the tag
            var altered = body
            altered[index] ^= 0x80
            #expect(throws: WebPushError.decryptionFailed) { try WebPushEncryption.decrypt(altered, privateKey: subscriber, auth: auth) }
        }
        var otherKeyID = body
        otherKeyID[20] = 64
        #expect(throws: WebPushError.self) { try WebPushEncryption.decrypt(otherKeyID, privateKey: subscriber, auth: auth) }
        var offCurveKeyID = body
        offCurveKeyID[85] ^= 1
        #expect(throws: WebPushError.malformedMessage("the key id is not a point on P-256")) {
            try WebPushEncryption.decrypt(offCurveKeyID, privateKey: subscriber, auth: auth)
        }
        var smallRecords = body
        smallRecords[18] = 0
        smallRecords[19] = 18  // rs = 18: the 22-byte record would have to be two
        #expect(throws: WebPushError.self) { try WebPushEncryption.decrypt(smallRecords, privateKey: subscriber, auth: auth) }
        #expect(throws: WebPushError.self) { try WebPushEncryption.decrypt(Array(body.prefix(102)), privateKey: subscriber, auth: auth) }
    }

    // MARK: P-256 keys and ES256

    @Test func es256SignaturesAreRawAndVerify() throws {
        let key = P256.PrivateKey()
        let message = Array("header.claims".utf8)
        let a = key.signES256(message)
        let b = key.signES256(message)
        #expect(a.count == 64 && b.count == 64)
        #expect(a != b)  // ECDSA is randomized
        #expect(key.publicKey.isValidES256Signature(a, for: message))
        #expect(key.publicKey.isValidES256Signature(b, for: message))
        var flipped = a
        flipped[63] ^= 1
        #expect(!key.publicKey.isValidES256Signature(flipped, for: message))
        #expect(!key.publicKey.isValidES256Signature(a, for: message + [0]))
        #expect(!P256.PrivateKey().publicKey.isValidES256Signature(a, for: message))
        #expect(!key.publicKey.isValidES256Signature(Array(a.prefix(63)), for: message))
        #expect(!key.publicKey.isValidES256Signature([UInt8](repeating: 0, count: 64), for: message))
        #expect(!key.publicKey.isValidES256Signature([UInt8](repeating: 0xFF, count: 64), for: message))
    }

    @Test func keysRoundTripThroughRawPEMAndFiles() throws {
        try withTemporaryDirectory { directory in
            let p8 = try makeP8(in: directory)
            let pem = try String(contentsOfFile: p8, encoding: .utf8)
            #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
            let key = try P256.PrivateKey.load(path: p8)
            #expect(key.pemRepresentation.hasPrefix("-----BEGIN PRIVATE KEY-----"))

            let again = try P256.PrivateKey(rawRepresentation: key.rawRepresentation)
            #expect(again.publicKey == key.publicKey)
            #expect(try P256.PrivateKey(pem: key.pemRepresentation).rawRepresentation == key.rawRepresentation)
            #expect(try P256.PublicKey(pem: key.publicKey.pemRepresentation) == key.publicKey)
            #expect(try P256.PublicKey(uncompressedRepresentation: key.publicKey.uncompressedRepresentation) == key.publicKey)

            // The public key `openssl` derives from the .p8 is ours.
            #expect(try openSSLCommand(["pkey", "-in", p8, "-pubout", "-out", directory + "/pub.pem"]).status == 0)
            #expect(try P256.PublicKey(pem: String(contentsOfFile: directory + "/pub.pem", encoding: .utf8)) == key.publicKey)

            // A VAPID key as the web-push tools print it (base64url of the scalar), and raw.
            let text = directory + "/vapid.txt"
            try (Base64URL.encode(key.rawRepresentation) + "\n").write(toFile: text, atomically: true, encoding: .utf8)
            #expect(try P256.PrivateKey.load(path: text).publicKey == key.publicKey)
            let raw = directory + "/vapid.raw"
            try Data(key.rawRepresentation).write(to: URL(fileURLWithPath: raw))
            #expect(try P256.PrivateKey.load(path: raw).publicKey == key.publicKey)

            // SEC 1 "EC PRIVATE KEY" is read too.
            #expect(try openSSLCommand(["ec", "-in", p8, "-out", directory + "/sec1.pem"]).status == 0)
            let sec1 = try String(contentsOfFile: directory + "/sec1.pem", encoding: .utf8)
            #expect(sec1.hasPrefix("-----BEGIN EC PRIVATE KEY-----"))
            #expect(try P256.PrivateKey(pem: sec1).publicKey == key.publicKey)
        }
    }

    @Test func otherKeysAndOutOfRangeScalarsAreRefused() throws {
        let order = hex("FFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551")
        #expect(throws: SecurityError.self) { try P256.PrivateKey(rawRepresentation: [UInt8](repeating: 0, count: 32)) }
        #expect(throws: SecurityError.self) { try P256.PrivateKey(rawRepresentation: order) }
        #expect(throws: SecurityError.self) { try P256.PrivateKey(rawRepresentation: [UInt8](repeating: 1, count: 31)) }
        var nMinusOne = order
        nMinusOne[31] -= 1
        #expect(try P256.PrivateKey(rawRepresentation: nMinusOne).rawRepresentation == nMinusOne)
        #expect(
            try P256.PrivateKey(rawRepresentation: [UInt8](repeating: 0, count: 31) + [1]).publicKey.uncompressedRepresentation == P256Tests.generator
        )

        #expect(throws: SecurityError.self) { try P256.PrivateKey(pem: Ed25519KeyPair().pemRepresentation) }
        #expect(throws: SecurityError.self) { try P256.PrivateKey(pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n") }
        try withTemporaryDirectory { directory in
            let p384 = directory + "/p384.pem"
            #expect(try openSSLCommand(["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384", "-out", p384]).status == 0)
            #expect(throws: SecurityError.invalidKey("the EC key is on secp384r1, not P-256")) { try P256.PrivateKey.load(path: p384) }
            #expect(throws: SecurityError.self) { try RSAPrivateKey.load(path: p384) }
            let small = try makeRSAKey(in: directory, bits: 1024)
            #expect(throws: SecurityError.self) { try RSAPrivateKey.load(path: small) }
            #expect(throws: SecurityError.self) { try P256.PrivateKey.load(path: small) }
        }
    }

    // MARK: JWTs

    @Test func apnsProviderTokenHasAppleShape() throws {
        let key = P256.PrivateKey()
        let token = JWT.apnsProviderToken(teamID: "TEAM123456", keyID: "KEY1234567", issuedAt: 1_700_000_000, key: key)
        let parts = try jwtParts(token)
        #expect(parts.header == #"{"alg":"ES256","kid":"KEY1234567"}"#)
        #expect(parts.claims == #"{"iss":"TEAM123456","iat":1700000000}"#)
        let input = Array(token[..<token.lastIndex(of: ".")!].utf8)
        #expect(key.publicKey.isValidES256Signature(parts.signature, for: input))
    }

    @Test func vapidTokenAndHeader() throws {
        let key = P256.PrivateKey()
        let endpoint = "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABk?x=1"
        let header = try VAPID.authorization(
            endpoint: endpoint, subject: "mailto:ops@example.org", expiresAt: 1_700_043_200, now: 1_700_000_000, key: key)
        #expect(header.hasPrefix("vapid t="))
        let pieces = header.dropFirst("vapid ".count).components(separatedBy: ", ")
        try #require(pieces.count == 2 && pieces[0].hasPrefix("t=") && pieces[1].hasPrefix("k="))
        #expect(Base64URL.decode(pieces[1].dropFirst(2)) == key.publicKey.uncompressedRepresentation)
        let parts = try jwtParts(String(pieces[0].dropFirst(2)))
        #expect(parts.header == #"{"typ":"JWT","alg":"ES256"}"#)
        #expect(parts.claims == #"{"aud":"https://updates.push.services.mozilla.com","exp":1700043200,"sub":"mailto:ops@example.org"}"#)

        #expect(try VAPID.audience(ofEndpoint: "https://fcm.googleapis.com/fcm/send/abc:def") == "https://fcm.googleapis.com")
        #expect(try VAPID.audience(ofEndpoint: "HTTPS://Push.Example.NET:443/p") == "https://push.example.net")
        #expect(try VAPID.audience(ofEndpoint: "https://push.example.net:8443/p") == "https://push.example.net:8443")
        #expect(try VAPID.audience(ofEndpoint: "http://127.0.0.1:9000/push/1") == "http://127.0.0.1:9000")
        #expect(throws: SecurityError.self) { try VAPID.audience(ofEndpoint: "ftp://push.example.net/p") }
        #expect(throws: SecurityError.self) { try VAPID.audience(ofEndpoint: "not a url") }

        let now: Int64 = 1_700_000_000
        #expect(throws: SecurityError.self) {
            try VAPID.token(endpoint: endpoint, subject: "mailto:ops@example.org", expiresAt: now + 86_401, now: now, key: key)
        }
        #expect(throws: SecurityError.self) {
            try VAPID.token(endpoint: endpoint, subject: "mailto:ops@example.org", expiresAt: now, now: now, key: key)
        }
        #expect(throws: SecurityError.self) {
            try VAPID.token(endpoint: endpoint, subject: "ops@example.org", expiresAt: now + 60, now: now, key: key)
        }
        _ = try VAPID.token(endpoint: endpoint, subject: "https://example.org/contact", expiresAt: now + 86_400, now: now, key: key)
    }

    @Test func googleServiceAccountAssertionIsRS256() throws {
        try withTemporaryDirectory { directory in
            let key = try RSAPrivateKey.load(path: makeRSAKey(in: directory))
            #expect(key.publicKey.bitCount == 2048)
            let token = try JWT.googleServiceAccountAssertion(
                clientEmail: "push@project.iam.gserviceaccount.com", scope: "https://www.googleapis.com/auth/firebase.messaging",
                issuedAt: 1_700_000_000, keyID: "abc123", key: key)
            let parts = try jwtParts(token)
            #expect(parts.header == #"{"alg":"RS256","typ":"JWT","kid":"abc123"}"#)
            #expect(
                parts.claims
                    == #"{"iss":"push@project.iam.gserviceaccount.com","scope":"https://www.googleapis.com/auth/firebase.messaging","aud":"https://oauth2.googleapis.com/token","iat":1700000000,"exp":1700003600}"#
            )
            #expect(parts.signature.count == 256)
            let input = Array(token[..<token.lastIndex(of: ".")!].utf8)
            #expect(key.publicKey.isValidRS256Signature(parts.signature, for: input))
            var flipped = parts.signature
            flipped[0] ^= 1
            #expect(!key.publicKey.isValidRS256Signature(flipped, for: input))
            #expect(try RSAPublicKey(pem: key.publicKey.pemRepresentation).isValidRS256Signature(parts.signature, for: input))
            #expect(throws: SecurityError.self) {
                try JWT.googleServiceAccountAssertion(clientEmail: "a@b", scope: "s", issuedAt: 0, lifetime: 3601, key: key)
            }
        }
    }
}

// MARK: Implementations we did not write

/// The project's virtualenv (scripts/setup installs Tests/requirements.txt there), found from this
/// file like the other suites do; `TEST_PYTHON` overrides it.
let pushCryptoPython: String = {
    if let python = ProcessInfo.processInfo.environment["TEST_PYTHON"] { return python }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    let venv = root.appendingPathComponent(".venv/bin/python").path
    return FileManager.default.isExecutableFile(atPath: venv) ? venv : "python3"
}()

/// Runs `python -c script args…` with the venv's interpreter.
func venvPython(_ script: String, _ arguments: [String] = []) throws -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
    process.arguments = [pushCryptoPython, "-c", script] + arguments
    let out = Pipe()
    process.standardOutput = out
    process.standardError = out
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
}

/// The Python side is there (a developer without `scripts/setup` skips these); under CI it must
/// be, so a missing install fails the run instead of skipping it.
let pushCryptoPythonReady: Bool = {
    if ProcessInfo.processInfo.environment["CI"] == "true" { return true }
    return (try? venvPython("import http_ece, jwt, py_vapid, cryptography"))?.status == 0
}()

/// Common Python helpers for the scripts below.
let pythonPrelude = #"""
    import sys, base64, json
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    def b64d(s): return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    def b64e(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    def private_from_raw(raw): return ec.derive_private_key(int.from_bytes(raw, "big"), ec.SECP256R1())
    def point(key): return key.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)

    """#

@Suite(.enabled(if: pushCryptoPythonReady, "needs .venv with http_ece, PyJWT, py_vapid (scripts/setup)"))
struct PushCryptoPythonTests {
    @Test func httpECEDecryptsOurMessages() throws {
        let subscriber = P256.PrivateKey()
        let auth = SecureRandom.bytes(16)
        let small = Array(#"{"title":"Help requested","body":"Zoë asks: water the plants ✓","badge":3}"#.utf8)
        let largest = (0..<WebPushEncryption.maximumPlaintextByteCount).map { UInt8(truncatingIfNeeded: $0 * 7) }
        for plaintext in [small, largest, []] {
            let body = try WebPushEncryption.encrypt(plaintext, p256dh: subscriber.publicKey.uncompressedRepresentation, auth: auth)
            let script =
                pythonPrelude + #"""
                    import http_ece
                    body, raw, auth = (bytes.fromhex(a) for a in sys.argv[1:4])
                    print(http_ece.decrypt(body, private_key=private_from_raw(raw), auth_secret=auth, version="aes128gcm").hex())
                    """#
            let result = try venvPython(script, [hexString(body), hexString(subscriber.rawRepresentation), hexString(auth)])
            #expect(result.status == 0, "\(result.output)")
            #expect(result.output == hexString(plaintext), "plaintext of \(plaintext.count) bytes")
        }
    }

    @Test func weDecryptHTTPECEMessages() throws {
        let subscriber = P256.PrivateKey()
        let auth = SecureRandom.bytes(16)
        let plaintext = Array("From Python: grüße, 🌱, and a longer line to cross a block boundary or two.".utf8)
        let script =
            pythonPrelude + #"""
                import http_ece
                plaintext, p256dh, auth = (bytes.fromhex(a) for a in sys.argv[1:4])
                sender = ec.generate_private_key(ec.SECP256R1())
                body = http_ece.encrypt(plaintext, private_key=sender, dh=p256dh, auth_secret=auth, version="aes128gcm")
                print(body.hex())
                """#
        let result = try venvPython(script, [hexString(plaintext), hexString(subscriber.publicKey.uncompressedRepresentation), hexString(auth)])
        try #require(result.status == 0, "\(result.output)")
        let body = hex(result.output)
        #expect(body[20] == 65)
        #expect(try WebPushEncryption.decrypt(body, privateKey: subscriber, auth: auth) == plaintext)
        #expect(throws: WebPushError.decryptionFailed) { try WebPushEncryption.decrypt(body, privateKey: subscriber, auth: SecureRandom.bytes(16)) }
    }

    /// PyJWT, with the public key that Python's cryptography reads from the `.p8` that `openssl`
    /// made, accepts our APNs and VAPID tokens and refuses each with a flipped bit; py_vapid accepts
    /// our VAPID `Authorization` header.
    @Test func pyJWTAndPyVAPIDVerifyOurES256Tokens() throws {
        try withTemporaryDirectory { directory in
            let p8 = try makeP8(in: directory)
            let key = try P256.PrivateKey.load(path: p8)
            let now = AccessToken.currentTime()
            let apns = JWT.apnsProviderToken(teamID: "TEAM123456", keyID: "KEY1234567", issuedAt: now, key: key)
            let endpoint = "https://push.example.net/wpush/v2/abc"
            let vapid = try VAPID.authorization(endpoint: endpoint, subject: "mailto:ops@example.org", expiresAt: now + 12 * 3600, key: key)
            let vapidJWT = String(vapid.dropFirst("vapid t=".count).prefix { $0 != "," })
            let script =
                pythonPrelude + #"""
                    import jwt, py_vapid
                    p8, apns, vapid, tampered = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
                    public = serialization.load_pem_private_key(open(p8, "rb").read(), password=None).public_key()
                    out = {}
                    out["apns_header"] = jwt.get_unverified_header(apns)
                    out["apns"] = jwt.decode(apns, public, algorithms=["ES256"], options={"require": ["iss", "iat"]})
                    # The header as RFC 8292 §3 and RFC 7235 §2.1 read it: the scheme, then auth-params
                    # separated by commas with optional whitespace.
                    scheme, params = vapid.split(" ", 1)
                    fields = dict(p.strip().split("=", 1) for p in params.split(","))
                    out["scheme_and_params"] = scheme + " " + ",".join(sorted(fields))
                    t, k = fields["t"], fields["k"]
                    out["vapid_k_is_p8"] = b64d(k) == point(public)
                    out["vapid_header"] = jwt.get_unverified_header(t)
                    out["vapid"] = jwt.decode(t, public, algorithms=["ES256"], audience="https://push.example.net", options={"require": ["exp", "sub", "aud"]})
                    # py_vapid's parser splits at the last space, so it reads only its own "t=…,k=…"
                    # spelling; the signature check against k is what it is asked for here.
                    out["py_vapid"] = bool(py_vapid.Vapid02.verify("vapid t=" + t + ",k=" + k))
                    results = []
                    for token in tampered:
                        try:
                            jwt.decode(token, public, algorithms=["ES256"], options={"verify_aud": False})
                            results.append("accepted")
                        except jwt.InvalidSignatureError:
                            results.append("InvalidSignatureError")
                    out["tampered"] = results
                    out["py_vapid_tampered"] = [bool(py_vapid.Vapid02.verify("vapid t=" + bad + ",k=" + k)) for bad in tampered[2:]]
                    print(json.dumps(out, sort_keys=True))
                    """#
            let tampered = try tamperedTokens(apns) + tamperedTokens(vapidJWT)
            let result = try venvPython(script, [p8, apns, vapid] + tampered)
            try #require(result.status == 0, "\(result.output)")
            let out = try #require(try JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [String: Any], "\(result.output)")
            #expect(out["apns_header"] as? [String: String] == ["alg": "ES256", "kid": "KEY1234567"])
            let apnsClaims = try #require(out["apns"] as? [String: Any])
            #expect(apnsClaims["iss"] as? String == "TEAM123456")
            #expect(int64(apnsClaims["iat"]) == now)
            #expect(out["vapid_k_is_p8"] as? Bool == true)
            #expect(out["vapid_header"] as? [String: String] == ["typ": "JWT", "alg": "ES256"])
            let vapidClaims = try #require(out["vapid"] as? [String: Any])
            #expect(vapidClaims["aud"] as? String == "https://push.example.net")
            #expect(vapidClaims["sub"] as? String == "mailto:ops@example.org")
            #expect(int64(vapidClaims["exp"]) == now + 12 * 3600)
            #expect(out["py_vapid"] as? Bool == true)
            #expect(out["tampered"] as? [String] == Array(repeating: "InvalidSignatureError", count: 4))
            #expect(out["py_vapid_tampered"] as? [Bool] == [false, false])
            #expect(out["scheme_and_params"] as? String == "vapid k,t")
        }
    }

    /// PyJWT, with the public key Python's cryptography derives from the PEM that `openssl` made,
    /// accepts our service account assertion and refuses it with a flipped bit.
    @Test func pyJWTVerifiesOurRS256Assertion() throws {
        try withTemporaryDirectory { directory in
            let pem = try makeRSAKey(in: directory)
            let key = try RSAPrivateKey.load(path: pem)
            let now = AccessToken.currentTime()
            let token = try JWT.googleServiceAccountAssertion(
                clientEmail: "push@project.iam.gserviceaccount.com", scope: "https://www.googleapis.com/auth/firebase.messaging", issuedAt: now,
                key: key)
            let script =
                pythonPrelude + #"""
                    import jwt
                    pem, token, tampered = sys.argv[1], sys.argv[2], sys.argv[3:]
                    public = serialization.load_pem_private_key(open(pem, "rb").read(), password=None).public_key()
                    out = {"header": jwt.get_unverified_header(token)}
                    out["claims"] = jwt.decode(token, public, algorithms=["RS256"], audience="https://oauth2.googleapis.com/token",
                                               options={"require": ["iss", "scope", "aud", "iat", "exp"]})
                    results = []
                    for t in tampered:
                        try:
                            jwt.decode(t, public, algorithms=["RS256"], audience="https://oauth2.googleapis.com/token")
                            results.append("accepted")
                        except jwt.InvalidSignatureError:
                            results.append("InvalidSignatureError")
                    out["tampered"] = results
                    print(json.dumps(out, sort_keys=True))
                    """#
            let result = try venvPython(script, [pem, token] + tamperedTokens(token))
            try #require(result.status == 0, "\(result.output)")
            let out = try #require(try JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [String: Any], "\(result.output)")
            #expect(out["header"] as? [String: String] == ["alg": "RS256", "typ": "JWT"])
            let claims = try #require(out["claims"] as? [String: Any])
            #expect(claims["iss"] as? String == "push@project.iam.gserviceaccount.com")
            #expect(claims["scope"] as? String == "https://www.googleapis.com/auth/firebase.messaging")
            #expect(claims["aud"] as? String == "https://oauth2.googleapis.com/token")
            #expect(int64(claims["iat"]) == now)
            #expect(int64(claims["exp"]) == now + 3600)
            #expect(out["tampered"] as? [String] == ["InvalidSignatureError", "InvalidSignatureError"])
        }
    }
}
