internal import COpenSSL
import Foundation

/// An RSA public key: checks RS256 signatures (what a test server for FCM's token endpoint does
/// with a service account's assertion).
public struct RSAPublicKey: Sendable, CustomStringConvertible {
    let key: EVPKey

    /// From a PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
    public init(pem: String) throws {
        let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
            guard let pkey = PEM_read_bio_PUBKEY(bio, nil, nil, nil) else {
                ERR_clear_error()
                throw SecurityError.invalidKey("not a PEM public key")
            }
            return pkey
        }
        let key = EVPKey(pkey)
        guard EVP_PKEY_is_a(pkey, "RSA") == 1 else { throw SecurityError.invalidKey("the PEM public key is not RSA") }
        self.key = key
    }

    init(owning key: EVPKey) { self.key = key }

    /// PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
    public var pemRepresentation: String {
        let bio = BIO_new(BIO_s_mem())!
        defer { BIO_free(bio) }
        precondition(PEM_write_bio_PUBKEY(bio, key.pointer) == 1, "\(openSSLErrors("PEM_write_bio_PUBKEY"))")
        return String(decoding: readAll(bio), as: UTF8.self)
    }

    /// The modulus size in bits.
    public var bitCount: Int { Int(EVP_PKEY_get_bits(key.pointer)) }

    /// True when `signature` is this key's RS256 signature (RSASSA-PKCS1-v1_5 with SHA-256,
    /// RFC 7518 §3.3) of `message`.
    public func isValidRS256Signature(_ signature: [UInt8], for message: [UInt8]) -> Bool {
        key.verifySHA256(signature, for: message)
    }

    public var description: String { "RSAPublicKey(\(bitCount) bits)" }
}

/// An RSA private key: signs the RS256 assertion of a Google service account (FCM HTTP v1's
/// OAuth 2.0 token exchange), whose JSON file carries the key as PKCS #8 PEM.
public final class RSAPrivateKey: Sendable {
    /// Keys shorter than this are refused (RFC 7518 §3.3 requires 2048 bits or more).
    public static let minimumBitCount = 2048

    let key: EVPKey
    public let publicKey: RSAPublicKey

    /// From a PEM private key: `PRIVATE KEY` (PKCS #8, as in a service account's `private_key`)
    /// or `RSA PRIVATE KEY` (PKCS #1). Unencrypted only.
    public init(pem: String) throws {
        let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
            guard let pkey = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
                ERR_clear_error()
                throw SecurityError.invalidKey("not an unencrypted PEM private key")
            }
            return pkey
        }
        let key = EVPKey(pkey)
        guard EVP_PKEY_is_a(pkey, "RSA") == 1 else { throw SecurityError.invalidKey("the PEM private key is not RSA") }
        let bits = Int(EVP_PKEY_get_bits(pkey))
        guard bits >= Self.minimumBitCount else {
            throw SecurityError.invalidKey("an RSA key of \(bits) bits; RS256 needs at least \(Self.minimumBitCount)")
        }
        self.key = key
        self.publicKey = RSAPublicKey(owning: key)
    }

    /// Loads a PEM key file.
    public static func load(path: String) throws -> RSAPrivateKey {
        guard let data = FileManager.default.contents(atPath: path) else { throw SecurityError.io("cannot read \(path)") }
        return try RSAPrivateKey(pem: String(decoding: data, as: UTF8.self))
    }

    /// The RS256 signature (RSASSA-PKCS1-v1_5 with SHA-256, RFC 7518 §3.3) of `message`:
    /// deterministic, as long as the modulus.
    public func signRS256(_ message: [UInt8]) -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new: out of memory") }
        defer { EVP_MD_CTX_free(ctx) }
        // PKCS #1 v1.5 is OpenSSL's default padding for RSA signatures.
        precondition(EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, key.pointer) == 1, "\(openSSLErrors("EVP_DigestSignInit(RS256)"))")
        var signature = [UInt8](repeating: 0, count: Int(EVP_PKEY_get_size(key.pointer)))
        var length = signature.count
        let ok = withNonNullBytes(message) { m, count in EVP_DigestSign(ctx, &signature, &length, m, count) }
        precondition(ok == 1, "\(openSSLErrors("EVP_DigestSign(RS256)"))")
        return Array(signature.prefix(length))
    }
}
