import Foundation
import Testing

@testable import Security

@Suite struct PasswordHasherTests {
    /// RFC 7914 §12, the third vector.
    @Test func scryptKnownAnswerRFC7914() throws {
        let key = try PasswordHasher.scrypt(password: Array("password".utf8), salt: Array("NaCl".utf8), n: 1024, r: 8, p: 16, length: 64)
        #expect(
            key
                == hex(
                    """
                    fd ba be 1c 9d 34 72 00 78 56 e7 19 0d 01 e9 fe 7c 6a d7 cb c8 23 78 30 e7 73 76 63 4b 37 31 62
                    2e af 30 d9 2e 22 a3 88 6f f1 09 27 9d 98 30 da c7 27 af b9 4a 83 ee 6d 83 60 cb df a2 cc 06 40
                    """))
        // The first vector: empty password and salt.
        let empty = try PasswordHasher.scrypt(password: [], salt: [], n: 16, r: 1, p: 1, length: 64)
        #expect(hexString(empty).hasPrefix("77d6576238657b203b19ca42c18a0497f16b4844e3074ae8dfdffa3fede21442"))
    }

    @Test func hashVerifyAndRehash() throws {
        let hasher = PasswordHasher()
        let clock = ContinuousClock()
        var encoded = ""
        let elapsed = try clock.measure { encoded = try hasher.hash("correct horse battery staple") }
        print("security: scrypt hash at the defaults (\(hasher.parameters)): \(Int(elapsed.seconds * 1000)) ms")
        let parts = encoded.split(separator: "$")
        #expect(parts.count == 6)
        #expect(parts[0] == "scrypt" && parts[1] == "32768" && parts[2] == "8" && parts[3] == "1")
        #expect(Base64URL.decode(parts[4])?.count == 16)
        #expect(Base64URL.decode(parts[5])?.count == 32)
        #expect(hasher.verify("correct horse battery staple", against: encoded))
        #expect(!hasher.verify("correct horse battery stapler", against: encoded))
        #expect(!hasher.verify("", against: encoded))
        #expect(!hasher.needsRehash(encoded))
        // Salted: the same password hashes differently each time.
        #expect(try hasher.hash("correct horse battery staple") != encoded)
    }

    @Test func parametersTravelInTheStringAndCanChange() throws {
        let cheap = try PasswordHasher(parameters: .init(n: 1 << 10, r: 8, p: 1))
        let old = try cheap.hash("pässword")
        let current = PasswordHasher()
        // The current hasher verifies an old hash with the parameters stored in it…
        #expect(current.verify("pässword", against: old))
        // …and asks for a rehash.
        #expect(current.needsRehash(old))
        #expect(current.needsRehash("garbage"))
        // NFKC: a composed and a decomposed "ä" are the same password.
        #expect(current.verify("pa\u{0308}ssword", against: old))
    }

    @Test func malformedOrHostileStoredHashesAreFalseNotCrashes() throws {
        let hasher = PasswordHasher()
        let salt = Base64URL.encode(SecureRandom.bytes(16)), key = Base64URL.encode(SecureRandom.bytes(32))
        for encoded in [
            "", "scrypt", "scrypt$$$$$", "bcrypt$32768$8$1$\(salt)$\(key)", "scrypt$32768$8$1$\(salt)",
            "scrypt$1000$8$1$\(salt)$\(key)",  // N not a power of two
            "scrypt$1073741824$8$1$\(salt)$\(key)",  // N = 2^30: gigabytes
            "scrypt$32768$8$99$\(salt)$\(key)",  // p too large
            "scrypt$32768$8$1$!!!$\(key)", "scrypt$32768$8$1$\(salt)$\(key)=",
        ] {
            #expect(!hasher.verify("x", against: encoded), "\(encoded)")
        }
        #expect(throws: SecurityError.self) { try PasswordHasher(parameters: .init(n: 3, r: 8, p: 1)) }
    }

    @Test func asyncVariantsRunOffTheCallersThread() async throws {
        let hasher = try PasswordHasher(parameters: .init(n: 1 << 12, r: 8, p: 1))
        let encoded = try await hasher.hash("secret-password")
        #expect(await hasher.verify("secret-password", against: encoded))
        #expect(await !hasher.verify("wrong-password", against: encoded))
        await hasher.simulateVerify("anything")
    }
}
