internal import COpenSSL

/// Cryptographically secure random bytes from OpenSSL's DRBG (seeded from the kernel).
public enum SecureRandom {
    /// `count` random bytes. OpenSSL's generator failing means the process cannot produce safe
    /// secrets at all; that is a fatal condition, not an error to handle.
    public static func bytes(_ count: Int) -> [UInt8] {
        precondition(count >= 0, "negative byte count")
        var out = [UInt8](repeating: 0, count: count)
        if count == 0 { return out }
        let rc = out.withUnsafeMutableBytes { RAND_bytes($0.baseAddress!.assumingMemoryBound(to: UInt8.self), Int32($0.count)) }
        guard rc == 1 else { fatalError("\(openSSLErrors("RAND_bytes")): no secure randomness available") }
        return out
    }

    /// An unguessable token: `bytes` random bytes (default 32 = 256 bits) as unpadded base64url,
    /// safe in URLs, headers and file names (refresh tokens, reset tokens, public links).
    public static func token(bytes count: Int = 32) -> String {
        Base64URL.encode(bytes(count))
    }
}

/// Comparison whose time does not depend on where the inputs differ, for secrets (MACs, hashes).
public enum ConstantTime {
    /// True when `a` and `b` are equal. Only the lengths may leak through timing.
    public static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in CRYPTO_memcmp(pa.baseAddress, pb.baseAddress, pa.count) == 0 } }
    }

    /// A presented string (a header value) against secret bytes, without copying the string.
    public static func equals(_ a: String, _ b: [UInt8]) -> Bool {
        var a = a
        return a.withUTF8 { pa in
            guard pa.count == b.count else { return false }
            if pa.isEmpty { return true }
            return b.withUnsafeBytes { pb in CRYPTO_memcmp(pa.baseAddress, pb.baseAddress, pa.count) == 0 }
        }
    }
}
