internal import COpenSSL
import Foundation

/// An Ed25519 public key (RFC 8032): verifies signatures made by the matching `Ed25519KeyPair`.
public struct Ed25519PublicKey: Sendable, Hashable, CustomStringConvertible {
    /// The 32-byte encoded point.
    public let rawRepresentation: [UInt8]
    let key: EVPKey

    /// From the 32 raw bytes (what accounts publishes to the other services).
    public init(rawRepresentation raw: [UInt8]) throws {
        guard raw.count == 32 else { throw SecurityError.invalidKey("an Ed25519 public key is 32 bytes, got \(raw.count)") }
        guard let pkey = raw.withUnsafeBufferPointer({ EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, $0.baseAddress, 32) }) else {
            throw openSSLErrors("EVP_PKEY_new_raw_public_key(Ed25519)")
        }
        self.key = EVPKey(pkey)
        self.rawRepresentation = raw
    }

    /// From a PEM `PUBLIC KEY` (SubjectPublicKeyInfo), as `openssl pkey -pubout` writes it.
    public init(pem: String) throws {
        let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
            guard let pkey = PEM_read_bio_PUBKEY(bio, nil, nil, nil) else { throw SecurityError.invalidKey("not a PEM public key") }
            return pkey
        }
        let key = EVPKey(pkey)
        guard EVP_PKEY_is_a(pkey, "ED25519") == 1 else { throw SecurityError.invalidKey("the PEM public key is not Ed25519") }
        try self.init(rawRepresentation: Self.rawPublic(key.pointer))
    }

    static func rawPublic(_ pkey: OpaquePointer) throws -> [UInt8] {
        var raw = [UInt8](repeating: 0, count: 32)
        var length = 32
        guard EVP_PKEY_get_raw_public_key(pkey, &raw, &length) == 1, length == 32 else {
            throw openSSLErrors("EVP_PKEY_get_raw_public_key")
        }
        return raw
    }

    /// PEM `PUBLIC KEY` (SubjectPublicKeyInfo).
    public var pemRepresentation: String {
        let bio = BIO_new(BIO_s_mem())!
        defer { BIO_free(bio) }
        precondition(PEM_write_bio_PUBKEY(bio, key.pointer) == 1, "\(openSSLErrors("PEM_write_bio_PUBKEY"))")
        return String(decoding: readAll(bio), as: UTF8.self)
    }

    /// The key's RFC 7638 JWK thumbprint (SHA-256, base64url): a stable key id for the `kid` of
    /// tokens it verifies, which any JOSE tool computes the same way.
    public var keyID: String {
        let jwk = #"{"crv":"Ed25519","kty":"OKP","x":"\#(Base64URL.encode(rawRepresentation))"}"#
        return Base64URL.encode(SHA256.hash(jwk))
    }

    /// True when `signature` is this key's Ed25519 signature of `message`.
    public func verify(signature: [UInt8], message: [UInt8]) -> Bool {
        guard signature.count == 64 else { return false }
        return message.withUnsafeBufferPointer { m in
            verify(signature: signature, message: UnsafeRawBufferPointer(m))
        }
    }

    /// Verifies over borrowed bytes (a slice of a token), without copying them.
    func verify(signature: [UInt8], message: UnsafeRawBufferPointer) -> Bool {
        guard signature.count == 64, let ctx = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(ctx) }
        // Ed25519 hashes internally: no digest (NULL), one-shot DigestVerify.
        guard EVP_DigestVerifyInit(ctx, nil, nil, nil, key.pointer) == 1 else {
            ERR_clear_error()
            return false
        }
        var zero: UInt8 = 0
        let ok = signature.withUnsafeBufferPointer { sig in
            withUnsafePointer(to: &zero) { empty in
                EVP_DigestVerify(
                    ctx, sig.baseAddress, 64,
                    message.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty, message.count
                )
            }
        }
        if ok != 1 { ERR_clear_error() }
        return ok == 1
    }

    public static func == (a: Ed25519PublicKey, b: Ed25519PublicKey) -> Bool { a.rawRepresentation == b.rawRepresentation }
    public func hash(into hasher: inout Hasher) { hasher.combine(rawRepresentation) }
    public var description: String { "Ed25519PublicKey(\(Base64URL.encode(rawRepresentation)))" }
}

/// An Ed25519 signing key with its public key: accounts signs access tokens with it.
public final class Ed25519KeyPair: Sendable {
    let key: EVPKey
    public let publicKey: Ed25519PublicKey

    /// A new random key pair.
    public convenience init() {
        guard let ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nil) else { fatalError("\(openSSLErrors("EVP_PKEY_CTX_new_id(Ed25519)"))") }
        defer { EVP_PKEY_CTX_free(ctx) }
        var pkey: OpaquePointer?
        guard EVP_PKEY_keygen_init(ctx) == 1, EVP_PKEY_keygen(ctx, &pkey) == 1, let pkey else {
            fatalError("\(openSSLErrors("Ed25519 key generation"))")
        }
        try! self.init(owning: pkey)
    }

    /// From the 32-byte private key (the RFC 8032 "secret key" seed).
    public convenience init(rawPrivateKey raw: [UInt8]) throws {
        guard raw.count == 32 else { throw SecurityError.invalidKey("an Ed25519 private key is 32 bytes, got \(raw.count)") }
        guard let pkey = raw.withUnsafeBufferPointer({ EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, $0.baseAddress, 32) }) else {
            throw openSSLErrors("EVP_PKEY_new_raw_private_key(Ed25519)")
        }
        try self.init(owning: pkey)
    }

    /// From a PEM `PRIVATE KEY` (PKCS #8), as `openssl genpkey -algorithm ed25519` writes it.
    public convenience init(pem: String) throws {
        let pkey = try withReadBIO(Array(pem.utf8)) { bio -> OpaquePointer in
            guard let pkey = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
                ERR_clear_error()
                throw SecurityError.invalidKey("not an unencrypted PEM private key")
            }
            return pkey
        }
        guard EVP_PKEY_is_a(pkey, "ED25519") == 1 else {
            EVP_PKEY_free(pkey)
            throw SecurityError.invalidKey("the PEM private key is not Ed25519")
        }
        try self.init(owning: pkey)
    }

    private init(owning pkey: OpaquePointer) throws {
        let key = EVPKey(pkey)
        self.key = key
        self.publicKey = try Ed25519PublicKey(rawRepresentation: Ed25519PublicKey.rawPublic(pkey))
    }

    /// The 32-byte private key. Handle as a secret.
    public var rawPrivateKey: [UInt8] {
        var raw = [UInt8](repeating: 0, count: 32)
        var length = 32
        precondition(
            EVP_PKEY_get_raw_private_key(key.pointer, &raw, &length) == 1 && length == 32, "\(openSSLErrors("EVP_PKEY_get_raw_private_key"))")
        return raw
    }

    /// PEM `PRIVATE KEY` (unencrypted PKCS #8). Handle as a secret.
    public var pemRepresentation: String {
        let bio = BIO_new(BIO_s_mem())!
        defer { BIO_free(bio) }
        precondition(PEM_write_bio_PrivateKey(bio, key.pointer, nil, nil, 0, nil, nil) == 1, "\(openSSLErrors("PEM_write_bio_PrivateKey"))")
        return String(decoding: readAll(bio), as: UTF8.self)
    }

    /// The 64-byte Ed25519 signature of `message` (deterministic: same key and message, same bytes).
    public func sign(_ message: [UInt8]) -> [UInt8] {
        message.withUnsafeBufferPointer { sign(UnsafeRawBufferPointer($0)) }
    }

    func sign(_ message: UnsafeRawBufferPointer) -> [UInt8] {
        guard let ctx = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new: out of memory") }
        defer { EVP_MD_CTX_free(ctx) }
        precondition(EVP_DigestSignInit(ctx, nil, nil, nil, key.pointer) == 1, "\(openSSLErrors("EVP_DigestSignInit"))")
        var signature = [UInt8](repeating: 0, count: 64)
        var length = 64
        var zero: UInt8 = 0
        let ok = withUnsafePointer(to: &zero) { empty in
            EVP_DigestSign(ctx, &signature, &length, message.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty, message.count)
        }
        precondition(ok == 1 && length == 64, "\(openSSLErrors("EVP_DigestSign"))")
        return signature
    }

    // MARK: Files

    /// Loads a key file: PEM (`PRIVATE KEY`) or the raw 32 bytes.
    public static func load(path: String) throws -> Ed25519KeyPair {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw SecurityError.io("cannot read \(path)")
        }
        let bytes = [UInt8](data)
        if bytes.starts(with: Array("-----BEGIN".utf8)) {
            return try Ed25519KeyPair(pem: String(decoding: bytes, as: UTF8.self))
        }
        guard bytes.count == 32 else {
            throw SecurityError.invalidKey("\(path) is neither a PEM private key nor a raw 32-byte Ed25519 key (\(bytes.count) bytes)")
        }
        return try Ed25519KeyPair(rawPrivateKey: bytes)
    }

    /// Writes the key as PEM with mode 0600, atomically (a temporary file renamed over `path`), so a
    /// crash never leaves a half-written key and no other user can ever read it.
    public func save(to path: String) throws {
        let bytes = Array(pemRepresentation.utf8)
        let temporary = "\(path).tmp-\(getpid())"
        unlink(temporary)  // left by a crash of an earlier process with this pid
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw SecurityError.io("cannot create \(temporary): \(String(cString: strerror(errno)))") }
        let written = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        let synced = fsync(fd)
        close(fd)
        guard written == bytes.count, synced == 0, rename(temporary, path) == 0 else {
            let reason = String(cString: strerror(errno))
            unlink(temporary)
            throw SecurityError.io("cannot write \(path): \(reason)")
        }
        // The rename itself is durable only once the directory is synced.
        let directory = open(
            (path as NSString).deletingLastPathComponent.isEmpty ? "." : (path as NSString).deletingLastPathComponent,
            O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directory >= 0 {
            fsync(directory)
            close(directory)
        }
    }

    /// Loads the key at `path`, or creates, saves and returns a new one if there is none: what a
    /// service does at startup with its signing key.
    public static func loadOrCreate(path: String) throws -> Ed25519KeyPair {
        if FileManager.default.fileExists(atPath: path) { return try load(path: path) }
        let pair = Ed25519KeyPair()
        try pair.save(to: path)
        return pair
    }
}
