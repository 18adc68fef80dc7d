internal import COpenSSL
import Foundation

extension P256 {
    /// A P-256 public key: checks ES256 signatures (the APNs provider token, VAPID) and is the
    /// `p256dh` / `k=` value of Web Push. Held as an OpenSSL key, exchanged as the 65-byte
    /// uncompressed point.
    public struct PublicKey: Sendable, Hashable, CustomStringConvertible {
        /// 0x04 ‖ X ‖ Y (65 bytes), as Web Push (`p256dh`, VAPID `k=`) carries it.
        public let uncompressedRepresentation: [UInt8]
        let key: EVPKey

        /// From the 65-byte uncompressed point; refused unless it is a point on P-256.
        public init(uncompressedRepresentation bytes: [UInt8]) throws {
            guard P256.isValidUncompressedPublicKey(bytes) else {
                throw SecurityError.invalidKey("not an uncompressed point on P-256 (\(bytes.count) bytes)")
            }
            // A SubjectPublicKeyInfo around the point (id-ecPublicKey, prime256v1): d2i_PUBKEY is
            // OpenSSL 3's non-deprecated way in from bytes (the EC_KEY setters are deprecated).
            let der = P256.subjectPublicKeyInfoPrefix + bytes
            let pkey = der.withUnsafeBufferPointer { buffer -> OpaquePointer? in
                var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
                return d2i_PUBKEY(nil, &cursor, buffer.count)
            }
            guard let pkey else { throw openSSLErrors("d2i_PUBKEY(P-256)") }
            self.key = EVPKey(pkey)
            self.uncompressedRepresentation = bytes
        }

        /// From a PEM `PUBLIC KEY` (SubjectPublicKeyInfo), as `openssl pkey -pubout` writes it.
        public init(pem: String) throws {
            let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
                guard let pkey = PEM_read_bio_PUBKEY(bio, nil, nil, nil) else {
                    ERR_clear_error()
                    throw SecurityError.invalidKey("not a PEM public key")
                }
                return pkey
            }
            let key = EVPKey(pkey)
            try P256.requireP256(pkey)
            try self.init(uncompressedRepresentation: P256.uncompressedPoint(of: key.pointer))
        }

        init(owning key: EVPKey) throws {
            self.key = key
            self.uncompressedRepresentation = try P256.uncompressedPoint(of: key.pointer)
        }

        /// PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
        public var pemRepresentation: String {
            let bio = BIO_new(BIO_s_mem())!
            defer { BIO_free(bio) }
            precondition(PEM_write_bio_PUBKEY(bio, key.pointer) == 1, "\(openSSLErrors("PEM_write_bio_PUBKEY"))")
            return String(decoding: readAll(bio), as: UTF8.self)
        }

        /// True when `signature` is this key's ES256 signature (JWS, RFC 7518 §3.4: ECDSA with
        /// SHA-256, r ‖ s as 32 bytes each) of `message`.
        public func isValidES256Signature(_ signature: [UInt8], for message: [UInt8]) -> Bool {
            guard signature.count == 64, let der = P256.derSignature(fromRaw: signature) else { return false }
            return key.verifySHA256(der, for: message)
        }

        public static func == (a: PublicKey, b: PublicKey) -> Bool { a.uncompressedRepresentation == b.uncompressedRepresentation }
        public func hash(into hasher: inout Hasher) { hasher.combine(uncompressedRepresentation) }
        public var description: String { "P256.PublicKey(\(Base64URL.encode(uncompressedRepresentation)))" }
    }

    /// A P-256 private key: signs ES256 JWTs (APNs provider tokens from Apple's `.p8` AuthKey,
    /// VAPID) and does the ECDH of Web Push encryption. Immutable once built.
    public final class PrivateKey: Sendable {
        let key: EVPKey
        public let publicKey: PublicKey

        /// A new random key (a VAPID key, an ephemeral key per Web Push message, a test key).
        public convenience init() {
            guard let pkey = copenssl_generate_p256_key() else { fatalError("\(openSSLErrors("P-256 key generation"))") }
            try! self.init(owning: pkey)
        }

        /// From the 32-byte private scalar (big endian), the form VAPID keys are usually kept in
        /// (base64url in the web-push tools). Refused unless 0 < d < n.
        public convenience init(rawRepresentation raw: [UInt8]) throws {
            guard raw.count == 32 else { throw SecurityError.invalidKey("a P-256 private key is 32 bytes, got \(raw.count)") }
            let point = try P256.publicPoint(forScalar: raw)
            // SEC 1 ECPrivateKey {version 1, d, [0] prime256v1, [1] Q}: the documented DER that
            // d2i_AutoPrivateKey reads, with the public point included so nothing is recomputed.
            var der: [UInt8] = [0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20] + raw
            der += [0xA0, 0x0A, 0x06, 0x08] + P256.prime256v1OID
            der += [0xA1, 0x44, 0x03, 0x42, 0x00] + point
            let pkey = der.withUnsafeBufferPointer { buffer -> OpaquePointer? in
                var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
                return d2i_AutoPrivateKey(nil, &cursor, buffer.count)
            }
            for i in der.indices { der[i] = 0 }
            guard let pkey else { throw openSSLErrors("d2i_AutoPrivateKey(P-256)") }
            try self.init(owning: pkey)
        }

        /// From a PEM private key: `PRIVATE KEY` (PKCS #8, what Apple's `.p8` AuthKey files and
        /// `openssl genpkey` hold) or `EC PRIVATE KEY` (SEC 1). Unencrypted only.
        public convenience init(pem: String) throws {
            let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
                guard let pkey = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
                    ERR_clear_error()
                    throw SecurityError.invalidKey("not an unencrypted PEM private key")
                }
                return pkey
            }
            try self.init(owning: pkey)
        }

        private init(owning pkey: OpaquePointer) throws {
            let key = EVPKey(pkey)
            try P256.requireP256(pkey)
            self.key = key
            self.publicKey = try PublicKey(owning: key)
        }

        /// Loads a key file: PEM (an Apple `.p8`), the base64url of the 32-byte scalar (as the
        /// web-push tools print a VAPID key), or the raw 32 bytes.
        public static func load(path: String) throws -> PrivateKey {
            guard let data = FileManager.default.contents(atPath: path) else { throw SecurityError.io("cannot read \(path)") }
            let bytes = [UInt8](data)
            let text = String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            if text.hasPrefix("-----BEGIN") { return try PrivateKey(pem: text) }
            if let decoded = Base64URL.decode(text), decoded.count == 32 { return try PrivateKey(rawRepresentation: decoded) }
            if bytes.count == 32 { return try PrivateKey(rawRepresentation: bytes) }
            throw SecurityError.invalidKey("\(path) is neither a PEM private key nor a 32-byte P-256 scalar (raw or base64url)")
        }

        /// The 32-byte private scalar. Handle as a secret.
        public var rawRepresentation: [UInt8] {
            var bn: OpaquePointer?
            precondition(EVP_PKEY_get_bn_param(key.pointer, "priv", &bn) == 1 && bn != nil, "\(openSSLErrors("EVP_PKEY_get_bn_param(priv)"))")
            defer { BN_clear_free(bn) }
            var out = [UInt8](repeating: 0, count: 32)
            precondition(BN_bn2binpad(bn, &out, 32) == 32, "\(openSSLErrors("BN_bn2binpad"))")
            return out
        }

        /// PEM `PRIVATE KEY` (unencrypted PKCS #8, the `.p8` form). Handle as a secret.
        public var pemRepresentation: String {
            let bio = BIO_new(BIO_s_mem())!
            defer { BIO_free(bio) }
            precondition(
                PEM_write_bio_PKCS8PrivateKey(bio, key.pointer, nil, nil, 0, nil, nil) == 1, "\(openSSLErrors("PEM_write_bio_PKCS8PrivateKey"))")
            return String(decoding: readAll(bio), as: UTF8.self)
        }

        /// The ES256 signature of `message` (RFC 7518 §3.4): ECDSA P-256 over SHA-256, as the
        /// 64-byte r ‖ s that JWS requires (OpenSSL produces DER, which JWTs must not carry).
        /// Randomized: two signatures of one message differ, both verify.
        public func signES256(_ message: [UInt8]) -> [UInt8] {
            guard let ctx = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new: out of memory") }
            defer { EVP_MD_CTX_free(ctx) }
            precondition(EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, key.pointer) == 1, "\(openSSLErrors("EVP_DigestSignInit(ES256)"))")
            var der = [UInt8](repeating: 0, count: 80)  // a DER P-256 signature is at most 72 bytes
            var length = der.count
            let ok = withNonNullBytes(message) { m, count in EVP_DigestSign(ctx, &der, &length, m, count) }
            precondition(ok == 1, "\(openSSLErrors("EVP_DigestSign(ES256)"))")
            guard let raw = P256.rawSignature(fromDER: Array(der.prefix(length))) else {
                fatalError("\(openSSLErrors("ES256: OpenSSL returned an unreadable DER signature"))")
            }
            return raw
        }

        /// ECDH (SEC 1 §3.3.1): the 32-byte x coordinate of d·Q for the peer's point Q, the
        /// shared secret of RFC 8291 §3.1.
        func sharedSecret(with peer: PublicKey) throws -> [UInt8] {
            guard let ctx = EVP_PKEY_CTX_new(key.pointer, nil) else { throw openSSLErrors("EVP_PKEY_CTX_new(ECDH)") }
            defer { EVP_PKEY_CTX_free(ctx) }
            var secret = [UInt8](repeating: 0, count: 32)
            var length = secret.count
            guard EVP_PKEY_derive_init(ctx) == 1, EVP_PKEY_derive_set_peer(ctx, peer.key.pointer) == 1,
                EVP_PKEY_derive(ctx, &secret, &length) == 1, length == 32
            else { throw openSSLErrors("ECDH(P-256)") }
            return secret
        }
    }

    // MARK: Encodings

    /// 1.2.840.10045.3.1.7 (prime256v1), DER contents.
    static let prime256v1OID: [UInt8] = [0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]

    /// SubjectPublicKeyInfo {id-ecPublicKey, prime256v1}, BIT STRING header: the 65-byte point follows.
    static let subjectPublicKeyInfoPrefix: [UInt8] =
        [0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01, 0x06, 0x08]
        + prime256v1OID + [0x03, 0x42, 0x00]

    static func requireP256(_ pkey: OpaquePointer) throws {
        guard EVP_PKEY_is_a(pkey, "EC") == 1 else { throw SecurityError.invalidKey("not an EC key") }
        var name = [CChar](repeating: 0, count: 64)
        var length = 0
        guard EVP_PKEY_get_group_name(pkey, &name, name.count, &length) == 1 else {
            ERR_clear_error()
            throw SecurityError.invalidKey("an EC key without a named curve")
        }
        let group = String(decoding: name.prefix(length).map { UInt8(bitPattern: $0) }, as: UTF8.self)
        guard group == "prime256v1" || group == "P-256" else { throw SecurityError.invalidKey("the EC key is on \(group), not P-256") }
    }

    static func uncompressedPoint(of pkey: OpaquePointer) throws -> [UInt8] {
        var point = [UInt8](repeating: 0, count: 65)
        var length = 0
        guard EVP_PKEY_get_octet_string_param(pkey, "encoded-pub-key", &point, point.count, &length) == 1,
            length == 65, point[0] == 0x04
        else { throw openSSLErrors("EVP_PKEY_get_octet_string_param(encoded-pub-key)") }
        return point
    }

    /// Q = d·G as an uncompressed point, after checking 0 < d < n.
    static func publicPoint(forScalar raw: [UInt8]) throws -> [UInt8] {
        guard let group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1) else { throw openSSLErrors("EC_GROUP_new_by_curve_name") }
        defer { EC_GROUP_free(group) }
        guard let d = BN_bin2bn(raw, Int32(raw.count), nil) else { throw openSSLErrors("BN_bin2bn") }
        defer { BN_clear_free(d) }
        guard BN_is_zero(d) == 0, BN_cmp(d, EC_GROUP_get0_order(group)) < 0 else {
            throw SecurityError.invalidKey("the P-256 private scalar is not in 1..n-1")
        }
        guard let q = EC_POINT_new(group) else { throw openSSLErrors("EC_POINT_new") }
        defer { EC_POINT_free(q) }
        var point = [UInt8](repeating: 0, count: 65)
        guard EC_POINT_mul(group, q, d, nil, nil, nil) == 1,
            EC_POINT_point2oct(group, q, POINT_CONVERSION_UNCOMPRESSED, &point, point.count, nil) == 65
        else { throw openSSLErrors("EC_POINT_mul") }
        return point
    }

    /// DER `ECDSA-Sig-Value` → r ‖ s, 32 bytes each.
    static func rawSignature(fromDER der: [UInt8]) -> [UInt8]? {
        let sig = der.withUnsafeBufferPointer { buffer -> OpaquePointer? in
            var cursor: UnsafePointer<UInt8>? = buffer.baseAddress
            return d2i_ECDSA_SIG(nil, &cursor, buffer.count)
        }
        guard let sig else { return nil }
        defer { ECDSA_SIG_free(sig) }
        var out = [UInt8](repeating: 0, count: 64)
        let ok = out.withUnsafeMutableBufferPointer { o in
            BN_bn2binpad(ECDSA_SIG_get0_r(sig), o.baseAddress, 32) == 32
                && BN_bn2binpad(ECDSA_SIG_get0_s(sig), o.baseAddress! + 32, 32) == 32
        }
        return ok ? out : nil
    }

    /// r ‖ s → DER `ECDSA-Sig-Value`, for OpenSSL's verifier.
    static func derSignature(fromRaw raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 64, let sig = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(sig) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, 32, nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress! + 32, 32, nil) }
        guard let r, let s else {
            BN_free(r)
            BN_free(s)
            return nil
        }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else {  // takes ownership of r and s only on success
            BN_free(r)
            BN_free(s)
            return nil
        }
        let length = i2d_ECDSA_SIG(sig, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var cursor: UnsafeMutablePointer<UInt8>? = buffer.baseAddress
            return i2d_ECDSA_SIG(sig, &cursor)
        }
        return written == length ? der : nil
    }
}
