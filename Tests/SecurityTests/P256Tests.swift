import Testing

@testable import Security

@Suite struct P256Tests {
    /// The base point G of P-256 (SEC 2 §2.4.2), uncompressed.
    static let generator = hex(
        "04 6B17D1F2 E12C4247 F8BCE6E5 63A440F2 77037D81 2DEB33A0 F4A13945 D898C296 4FE342E2 FE1A7F9B 8EE7EB4A 7C0F9E16 2BCE3357 6B315ECE CBB64068 37BF51F5"
    )

    @Test func pointsOnTheCurveAreAcceptedAndEverythingElseRefused() throws {
        #expect(P256.isValidUncompressedPublicKey(Self.generator))
        // RFC 8291 §5: the user agent's public key of the example.
        let rfc = try #require(Base64URL.decode("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"))
        #expect(P256.isValidUncompressedPublicKey(rfc))

        var offCurve = Self.generator
        offCurve[64] ^= 1
        #expect(!P256.isValidUncompressedPublicKey(offCurve))
        var hybrid = Self.generator
        hybrid[0] = 0x07  // X9.62 hybrid form: not what Web Push sends
        #expect(!P256.isValidUncompressedPublicKey(hybrid))
        #expect(!P256.isValidUncompressedPublicKey([0x04] + [UInt8](repeating: 0, count: 64)))  // (0, 0)
        #expect(!P256.isValidUncompressedPublicKey([0x04] + [UInt8](repeating: 0xFF, count: 64)))  // outside the field
        #expect(!P256.isValidUncompressedPublicKey([0x00]))  // the point at infinity
        #expect(!P256.isValidUncompressedPublicKey(Array(Self.generator.prefix(33))))
        #expect(!P256.isValidUncompressedPublicKey(Array(Self.generator.prefix(64))))
        #expect(!P256.isValidUncompressedPublicKey(Self.generator + [0]))
        #expect(!P256.isValidUncompressedPublicKey([]))
        // A refused point leaves nothing on OpenSSL's error queue for the next caller.
        #expect(P256.isValidUncompressedPublicKey(Self.generator))
    }
}
