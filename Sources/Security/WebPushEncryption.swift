internal import COpenSSL

/// Why a Web Push message could not be encrypted or decrypted.
public enum WebPushError: Error, Sendable, Hashable, CustomStringConvertible {
    /// More plaintext than one 4096-byte push message holds (`WebPushEncryption.maximumPlaintextByteCount`).
    case payloadTooLarge(byteCount: Int, maximum: Int)
    /// The subscription's `p256dh` is not an uncompressed point on P-256.
    case invalidSubscriptionKey
    /// The subscription's `auth` secret is not 16 bytes.
    case invalidAuthSecret(byteCount: Int)
    /// A message that is not one RFC 8291 `aes128gcm` record: what is wrong with it.
    case malformedMessage(String)
    /// The record does not authenticate: another key or secret, or altered on the way.
    case decryptionFailed

    public var description: String {
        switch self {
        case .payloadTooLarge(let n, let max): "push payload of \(n) bytes exceeds the \(max) bytes one Web Push message holds"
        case .invalidSubscriptionKey: "the subscription's p256dh is not an uncompressed P-256 point"
        case .invalidAuthSecret(let n): "the subscription's auth secret is \(n) bytes, not 16"
        case .malformedMessage(let why): "malformed Web Push message: \(why)"
        case .decryptionFailed: "the Web Push message does not decrypt with this key and auth secret"
        }
    }
}

/// Message encryption for Web Push (RFC 8291) in the `aes128gcm` content coding (RFC 8188): what
/// the body of a push to a browser must be, since the push service may not read it.
///
/// Per message a new P-256 key pair and a random 16-byte salt; ECDH with the subscription's
/// `p256dh`, HKDF-SHA-256 keyed by its `auth` secret, AES-128-GCM over the plaintext and the
/// delimiter 0x02, all in one record. The body is
/// `salt (16) ‖ rs = 4096 (4, big endian) ‖ idlen = 65 ‖ keyid = our public key (65) ‖ ciphertext ‖ tag (16)`.
/// The primitives are OpenSSL's (ECDH, HKDF, AES-GCM); only the framing is ours.
public enum WebPushEncryption {
    /// The record size written in the header. RFC 8291 §4 allows a single record only.
    public static let recordSize = 4096
    /// The largest body push services must accept (RFC 8030 §7.2).
    public static let maximumBodyByteCount = 4096
    /// 4096 less the header (86), the delimiter (1) and the tag (16): 3993 bytes (RFC 8291 §4).
    /// Longer plaintext is refused with `payloadTooLarge`, not split or truncated.
    public static let maximumPlaintextByteCount = maximumBodyByteCount - headerByteCount - 1 - tagByteCount

    static let saltByteCount = 16
    static let authSecretByteCount = 16
    static let tagByteCount = 16
    static let headerByteCount = 16 + 4 + 1 + P256.uncompressedPointByteCount

    /// The body of a push carrying `plaintext` to the subscription (`p256dh`, `auth`).
    public static func encrypt(_ plaintext: [UInt8], p256dh: [UInt8], auth: [UInt8]) throws(WebPushError) -> [UInt8] {
        try encrypt(plaintext, p256dh: p256dh, auth: auth, ephemeralKey: P256.PrivateKey(), salt: SecureRandom.bytes(saltByteCount))
    }

    /// As above with a given key pair and salt: for RFC 8291's test vector only. A key or salt used
    /// twice for one subscription gives away both messages.
    static func encrypt(
        _ plaintext: [UInt8], p256dh: [UInt8], auth: [UInt8], ephemeralKey: P256.PrivateKey, salt: [UInt8]
    ) throws(WebPushError) -> [UInt8] {
        guard plaintext.count <= maximumPlaintextByteCount else {
            throw .payloadTooLarge(byteCount: plaintext.count, maximum: maximumPlaintextByteCount)
        }
        guard auth.count == authSecretByteCount else { throw .invalidAuthSecret(byteCount: auth.count) }
        precondition(salt.count == saltByteCount, "a 16-byte salt")
        guard let userAgentKey = try? P256.PublicKey(uncompressedRepresentation: p256dh),
            let secret = try? ephemeralKey.sharedSecret(with: userAgentKey)
        else { throw .invalidSubscriptionKey }
        let ours = ephemeralKey.publicKey.uncompressedRepresentation
        let (key, nonce) = contentKeys(sharedSecret: secret, auth: auth, userAgentPublic: p256dh, applicationServerPublic: ours, salt: salt)
        let record = AES128GCM.seal(plaintext + [0x02], key: key, nonce: nonce)
        let rs = UInt32(recordSize)
        var body = salt
        body.reserveCapacity(headerByteCount + record.count)
        body += [UInt8(rs >> 24), UInt8(rs >> 16 & 0xFF), UInt8(rs >> 8 & 0xFF), UInt8(rs & 0xFF)]
        body.append(UInt8(ours.count))
        body += ours
        body += record
        return body
    }

    /// The plaintext of a push body, as the browser holding the subscription's private key and
    /// `auth` secret reads it: for our tests and the local Web Push test server. Accepts exactly
    /// what RFC 8291 allows: a 65-byte key id and one record ending in the delimiter 0x02.
    public static func decrypt(_ body: [UInt8], privateKey: P256.PrivateKey, auth: [UInt8]) throws(WebPushError) -> [UInt8] {
        guard auth.count == authSecretByteCount else { throw .invalidAuthSecret(byteCount: auth.count) }
        guard body.count >= headerByteCount + 1 + tagByteCount else {
            throw .malformedMessage("\(body.count) bytes: shorter than a header and one record")
        }
        let salt = Array(body[0..<16])
        let rs = Int(body[16]) << 24 | Int(body[17]) << 16 | Int(body[18]) << 8 | Int(body[19])
        guard body[20] == P256.uncompressedPointByteCount else {
            throw .malformedMessage("the key id is \(body[20]) bytes, not the sender's 65-byte public key")
        }
        let senderPublic = Array(body[21..<headerByteCount])
        let record = Array(body[headerByteCount...])
        guard rs > tagByteCount + 1 else { throw .malformedMessage("record size \(rs) is below 18") }
        guard record.count <= rs else { throw .malformedMessage("more than one record (record size \(rs), \(record.count) bytes)") }
        guard let senderKey = try? P256.PublicKey(uncompressedRepresentation: senderPublic) else {
            throw .malformedMessage("the key id is not a point on P-256")
        }
        guard let secret = try? privateKey.sharedSecret(with: senderKey) else { throw .decryptionFailed }
        let (key, nonce) = contentKeys(
            sharedSecret: secret, auth: auth, userAgentPublic: privateKey.publicKey.uncompressedRepresentation,
            applicationServerPublic: senderPublic, salt: salt)
        guard let padded = AES128GCM.open(record, key: key, nonce: nonce) else { throw .decryptionFailed }
        // RFC 8188 §2: the plaintext, the delimiter (0x02 in the last record), then zero padding.
        guard let delimiter = padded.lastIndex(where: { $0 != 0 }), padded[delimiter] == 0x02 else {
            throw .malformedMessage("the record does not end in the last-record delimiter 0x02")
        }
        return Array(padded[..<delimiter])
    }

    /// RFC 8291 §3.3–3.4 and RFC 8188 §2.2–2.3: IKM from the ECDH secret keyed by `auth`, then the
    /// content encryption key and the nonce from IKM and the salt.
    static func contentKeys(
        sharedSecret: [UInt8], auth: [UInt8], userAgentPublic: [UInt8], applicationServerPublic: [UInt8], salt: [UInt8]
    ) -> (key: [UInt8], nonce: [UInt8]) {
        let keyInfo = Array("WebPush: info".utf8) + [0] + userAgentPublic + applicationServerPublic
        let ikm = HKDF.sha256(inputKeyMaterial: sharedSecret, salt: auth, info: keyInfo, byteCount: 32)
        let key = HKDF.sha256(inputKeyMaterial: ikm, salt: salt, info: Array("Content-Encoding: aes128gcm".utf8) + [0], byteCount: 16)
        let nonce = HKDF.sha256(inputKeyMaterial: ikm, salt: salt, info: Array("Content-Encoding: nonce".utf8) + [0], byteCount: 12)
        return (key, nonce)
    }
}

/// HKDF with SHA-256 (RFC 5869, extract then expand), OpenSSL's implementation.
enum HKDF {
    static func sha256(inputKeyMaterial ikm: [UInt8], salt: [UInt8], info: [UInt8], byteCount: Int) -> [UInt8] {
        precondition(byteCount > 0 && byteCount <= 255 * 32, "HKDF-SHA-256 output length")
        guard let ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nil) else { fatalError("\(openSSLErrors("EVP_PKEY_CTX_new_id(HKDF)"))") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var out = [UInt8](repeating: 0, count: byteCount)
        var length = byteCount
        let ok =
            EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) == 1
            && withNonNullBytes(salt) { EVP_PKEY_CTX_set1_hkdf_salt(ctx, $0, Int32($1)) } == 1
            && withNonNullBytes(ikm) { EVP_PKEY_CTX_set1_hkdf_key(ctx, $0, Int32($1)) } == 1
            && withNonNullBytes(info) { EVP_PKEY_CTX_add1_hkdf_info(ctx, $0, Int32($1)) } == 1
            && EVP_PKEY_derive(ctx, &out, &length) == 1 && length == byteCount
        precondition(ok, "\(openSSLErrors("HKDF-SHA-256"))")
        return out
    }
}

/// AES-128-GCM with a 12-byte nonce and a 16-byte tag appended to the ciphertext, no associated
/// data: the AEAD_AES_128_GCM of RFC 8188.
enum AES128GCM {
    static func seal(_ plaintext: [UInt8], key: [UInt8], nonce: [UInt8]) -> [UInt8] {
        precondition(key.count == 16 && nonce.count == 12, "AES-128-GCM key and nonce sizes")
        guard let ctx = EVP_CIPHER_CTX_new() else { fatalError("EVP_CIPHER_CTX_new: out of memory") }
        defer { EVP_CIPHER_CTX_free(ctx) }
        var out = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written: Int32 = 0
        var final: Int32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o in
            EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1
                && withNonNullBytes(plaintext) { EVP_EncryptUpdate(ctx, o.baseAddress, &written, $0, Int32($1)) } == 1
                && EVP_EncryptFinal_ex(ctx, o.baseAddress! + Int(written), &final) == 1
                && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, o.baseAddress! + plaintext.count) == 1
        }
        precondition(ok && Int(written + final) == plaintext.count, "\(openSSLErrors("AES-128-GCM encrypt"))")
        return out
    }

    /// The plaintext, or nil when the tag does not authenticate.
    static func open(_ sealed: [UInt8], key: [UInt8], nonce: [UInt8]) -> [UInt8]? {
        precondition(key.count == 16 && nonce.count == 12, "AES-128-GCM key and nonce sizes")
        guard sealed.count >= 16, let ctx = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(ctx) }
        let count = sealed.count - 16
        var tag = Array(sealed[count...])
        var out = [UInt8](repeating: 0, count: count + 16)
        var written: Int32 = 0
        var final: Int32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o in
            EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), nil, key, nonce) == 1
                && sealed.withUnsafeBufferPointer { EVP_DecryptUpdate(ctx, o.baseAddress, &written, $0.baseAddress, Int32(count)) } == 1
                && EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, &tag) == 1
                && EVP_DecryptFinal_ex(ctx, o.baseAddress! + Int(written), &final) == 1
        }
        ERR_clear_error()
        guard ok, Int(written + final) == count else { return nil }
        return Array(out.prefix(count))
    }
}
