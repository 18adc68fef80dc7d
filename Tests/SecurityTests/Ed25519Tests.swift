import Foundation
import Testing

@testable import Security

@Suite struct Ed25519Tests {
    /// RFC 8032 §7.1, TEST 1 (empty message).
    @Test func rfc8032TestVector1() throws {
        let pair = try Ed25519KeyPair(rawPrivateKey: hex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"))
        #expect(pair.publicKey.rawRepresentation == hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"))
        let expected = hex(
            """
            e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b
            """)
        #expect(pair.sign([]) == expected)
        let publicKey = try Ed25519PublicKey(rawRepresentation: hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"))
        #expect(publicKey.verify(signature: expected, message: []))
        var tampered = expected
        tampered[0] ^= 1
        #expect(!publicKey.verify(signature: tampered, message: []))
        #expect(!publicKey.verify(signature: expected, message: [0]))
        #expect(!publicKey.verify(signature: Array(expected.prefix(63)), message: []))
    }

    @Test func generatedKeysSignAndVerifyAndRoundTrip() throws {
        let pair = Ed25519KeyPair()
        let message = Array("hello".utf8)
        let signature = pair.sign(message)
        #expect(signature.count == 64)
        #expect(pair.publicKey.verify(signature: signature, message: message))
        #expect(!Ed25519KeyPair().publicKey.verify(signature: signature, message: message))

        let fromRaw = try Ed25519KeyPair(rawPrivateKey: pair.rawPrivateKey)
        #expect(fromRaw.publicKey == pair.publicKey)
        let pem = pair.pemRepresentation
        #expect(pem.hasPrefix("-----BEGIN PRIVATE KEY-----"))
        #expect(try Ed25519KeyPair(pem: pem).publicKey == pair.publicKey)
        let publicPEM = pair.publicKey.pemRepresentation
        #expect(publicPEM.hasPrefix("-----BEGIN PUBLIC KEY-----"))
        #expect(try Ed25519PublicKey(pem: publicPEM) == pair.publicKey)
        #expect(pair.publicKey.keyID.count == 43)
        #expect(throws: SecurityError.self) { try Ed25519KeyPair(rawPrivateKey: [1, 2, 3]) }
        #expect(throws: SecurityError.self) { try Ed25519KeyPair(pem: "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n") }
        #expect(throws: SecurityError.self) { try Ed25519PublicKey(rawRepresentation: []) }
    }

    /// RFC 8037 Appendix A.3: the JWK thumbprint of the RFC 8032 test key.
    @Test func keyIDIsTheRFC7638Thumbprint() throws {
        let key = try Ed25519PublicKey(rawRepresentation: hex("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a"))
        #expect(key.keyID == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k")
    }

    @Test func keyFilesAreSavedPrivatelyAndLoad() throws {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("security-tests-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/signing.pem"
        let created = try Ed25519KeyPair.loadOrCreate(path: path)
        let mode = try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int
        #expect(mode == 0o600)
        #expect(try Ed25519KeyPair.loadOrCreate(path: path).publicKey == created.publicKey)
        // A raw 32-byte key file loads too.
        let raw = dir + "/raw.key"
        _ = FileManager.default.createFile(atPath: raw, contents: Data(created.rawPrivateKey))
        #expect(try Ed25519KeyPair.load(path: raw).publicKey == created.publicKey)
        _ = FileManager.default.createFile(atPath: dir + "/bad.key", contents: Data([1, 2, 3]))
        #expect(throws: SecurityError.self) { try Ed25519KeyPair.load(path: dir + "/bad.key") }
        #expect(throws: SecurityError.self) { try Ed25519KeyPair.load(path: dir + "/missing.key") }
    }
}
