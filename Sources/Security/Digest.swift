internal import COpenSSL

/// SHA-256 (FIPS 180-4) through OpenSSL's EVP interface.
public enum SHA256 {
    public static let byteCount = 32

    public static func hash(_ bytes: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: byteCount)
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBytes { input in
            out.withUnsafeMutableBytes { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress!.assumingMemoryBound(to: UInt8.self), &length, EVP_sha256(), nil)
            }
        }
        precondition(ok == 1 && length == 32, "\(openSSLErrors("EVP_Digest(SHA-256)"))")
        return out
    }

    public static func hash(_ text: String) -> [UInt8] { hash(Array(text.utf8)) }
}

/// HMAC-SHA-256 (RFC 2104): message authentication with a shared secret (service credentials,
/// signed links).
public enum HMACSHA256 {
    public static let byteCount = 32

    public static func authenticationCode(for message: [UInt8], key: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: byteCount)
        var length: UInt32 = 0
        let result = withNonNullBytes(key) { k, kCount in
            withNonNullBytes(message) { m, mCount in
                out.withUnsafeMutableBytes { o in
                    HMAC(EVP_sha256(), k, Int32(kCount), m, mCount, o.baseAddress!.assumingMemoryBound(to: UInt8.self), &length)
                }
            }
        }
        precondition(result != nil && length == 32, "\(openSSLErrors("HMAC-SHA-256"))")
        return out
    }

    public static func authenticationCode(for message: String, key: [UInt8]) -> [UInt8] {
        authenticationCode(for: Array(message.utf8), key: key)
    }

    /// Checks a MAC in constant time.
    public static func isValid(_ code: [UInt8], for message: [UInt8], key: [UInt8]) -> Bool {
        ConstantTime.equals(code, authenticationCode(for: message, key: key))
    }
}

/// Calls `body` with a non-NULL pointer even for an empty array: some OpenSSL entry points reject
/// NULL with a zero length.
func withNonNullBytes<T>(_ bytes: [UInt8], _ body: (UnsafePointer<UInt8>, Int) throws -> T) rethrows -> T {
    if bytes.isEmpty {
        var zero: UInt8 = 0
        return try withUnsafePointer(to: &zero) { try body($0, 0) }
    }
    return try bytes.withUnsafeBufferPointer { try body($0.baseAddress!, $0.count) }
}
