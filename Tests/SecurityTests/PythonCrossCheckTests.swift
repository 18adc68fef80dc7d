import Foundation
import Testing

@testable import Security

/// Runs `python3 -c script args…` (the system Python, which has `cryptography`) and returns stdout.
func python(_ script: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    process.arguments = ["-c", script] + arguments
    let out = Pipe()
    process.standardOutput = out
    process.standardError = out
    try process.run()
    let data = out.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return (process.terminationStatus, String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines))
}

let pythonHasCryptography: Bool = {
    (try? python("import cryptography", []))?.status == 0
}()

/// A client we did not write checks what we produce, and we check what it produces.
@Suite(.enabled(if: pythonHasCryptography, "needs /usr/bin/python3 with the cryptography package"))
struct PythonCrossCheckTests {
    @Test func pythonVerifiesOurTokenAndReadsOurKeys() throws {
        let pair = Ed25519KeyPair()
        let claims = AccessTokenClaims(
            userID: "u-1", sessionID: "s-1", expiresAt: 2_000_000_000, issuedAt: 1_999_999_000, keyID: pair.publicKey.keyID, kind: .guest)
        let token = AccessToken.sign(claims, with: pair)
        let script = #"""
            import sys, json, base64, hashlib
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
            from cryptography.hazmat.primitives import serialization
            token, pub_hex, pem = sys.argv[1], sys.argv[2], sys.argv[3]
            def b64(s): return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
            h, p, s = token.split(".")
            pub = Ed25519PublicKey.from_public_bytes(bytes.fromhex(pub_hex))
            pub.verify(b64(s), (h + "." + p).encode())  # raises on a bad signature
            header, claims = json.loads(b64(h)), json.loads(b64(p))
            priv = serialization.load_pem_private_key(pem.encode(), password=None)
            same = priv.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == bytes.fromhex(pub_hex)
            x = base64.urlsafe_b64encode(bytes.fromhex(pub_hex)).rstrip(b"=").decode()
            jwk = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"), sort_keys=True)
            kid = base64.urlsafe_b64encode(hashlib.sha256(jwk.encode()).digest()).rstrip(b"=").decode()
            print(header["alg"], header["kid"] == kid, claims["sub"], claims["sid"], claims["exp"], claims["iat"], claims["kind"], same)
            """#
        let result = try python(script, [token, hexString(pair.publicKey.rawRepresentation), pair.pemRepresentation])
        #expect(result.status == 0, "\(result.output)")
        #expect(result.output == "EdDSA True u-1 s-1 2000000000 1999999000 guest True")
    }

    @Test func weVerifyATokenPythonSigned() throws {
        let script = #"""
            import json, base64
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
            from cryptography.hazmat.primitives import serialization
            def b64(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
            key = Ed25519PrivateKey.generate()
            raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            h = b64(json.dumps({"typ": "JWT", "alg": "EdDSA", "kid": "py-1"}).encode())
            p = b64(json.dumps({"exp": 2000000000, "kind": "service", "sub": "svc-tasks", "iat": 1999999999.5, "sid": "-", "extra": [1, {"a": None}]}).encode())
            sig = key.sign((h + "." + p).encode())
            print(raw.hex(), h + "." + p + "." + b64(sig))
            """#
        let result = try python(script, [])
        #expect(result.status == 0, "\(result.output)")
        let fields = result.output.split(separator: " ")
        try #require(fields.count == 2)
        let key = try Ed25519PublicKey(rawRepresentation: hex(String(fields[0])))
        let claims = try AccessToken.verify(String(fields[1]), keys: ["py-1": key], now: 1_999_999_999)
        #expect(
            claims
                == AccessTokenClaims(
                    userID: "svc-tasks", sessionID: "-", expiresAt: 2_000_000_000, issuedAt: 1_999_999_999, keyID: "py-1", kind: .service))
    }

    @Test func pythonVerifiesOurPasswordHash() throws {
        let hasher = try PasswordHasher(parameters: .init(n: 1 << 14, r: 8, p: 1))
        let encoded = try hasher.hash("hunter2-hunter2")
        let script = #"""
            import sys, hashlib, base64, hmac
            def b64(s): return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
            name, n, r, p, salt, key = sys.argv[2].split("$")
            out = hashlib.scrypt(sys.argv[1].encode(), salt=b64(salt), n=int(n), r=int(r), p=int(p), maxmem=128 * 1024 * 1024, dklen=len(b64(key)))
            print(name, hmac.compare_digest(out, b64(key)))
            """#
        let result = try python(script, ["hunter2-hunter2", encoded])
        #expect(result.output == "scrypt True")
    }
}
