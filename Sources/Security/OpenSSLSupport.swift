internal import COpenSSL

/// Drains OpenSSL's thread-local error queue into one message (and leaves it empty, so a later
/// failure on this thread does not report stale errors).
func openSSLErrors(_ operation: String) -> SecurityError {
    var messages: [String] = []
    while true {
        let code = ERR_get_error()
        if code == 0 { break }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        messages.append(String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
    }
    return .openSSL(messages.isEmpty ? "\(operation) failed" : "\(operation) failed: \(messages.joined(separator: "; "))")
}

/// An owned `EVP_PKEY`. OpenSSL 3 keys are immutable once built and safe to use from several
/// threads at once for signing and verifying, hence `@unchecked Sendable`.
final class EVPKey: @unchecked Sendable {
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) { self.pointer = pointer }

    deinit { EVP_PKEY_free(pointer) }

    /// Whether `signature` (in OpenSSL's form for the key: DER for ECDSA, the block for RSA) is
    /// this key's signature of SHA-256(`message`). ES256 and RS256 verify through this.
    func verifySHA256(_ signature: [UInt8], for message: [UInt8]) -> Bool {
        guard !signature.isEmpty, let ctx = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestVerifyInit(ctx, nil, EVP_sha256(), nil, pointer) == 1 else {
            ERR_clear_error()
            return false
        }
        let ok = signature.withUnsafeBufferPointer { sig in
            withNonNullBytes(message) { m, count in EVP_DigestVerify(ctx, sig.baseAddress, sig.count, m, count) }
        }
        if ok != 1 { ERR_clear_error() }
        return ok == 1
    }
}

/// Reads everything from a memory BIO.
func readAll(_ bio: OpaquePointer) -> [UInt8] {
    var out: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = chunk.withUnsafeMutableBytes { BIO_read(bio, $0.baseAddress, Int32($0.count)) }
        if n <= 0 { break }
        out.append(contentsOf: chunk[0..<Int(n)])
    }
    return out
}

/// A memory BIO over `bytes` for the duration of `body`.
func withReadBIO<T>(_ bytes: [UInt8], _ body: (OpaquePointer) throws -> T) throws -> T {
    try bytes.withUnsafeBytes { raw in
        guard let bio = BIO_new_mem_buf(raw.baseAddress, Int32(raw.count)) else { throw openSSLErrors("BIO_new_mem_buf") }
        defer { BIO_free(bio) }
        return try body(bio)
    }
}
