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

/// Comparison whose time does not depend on where the inputs differ, for secrets (MACs, hashes,
/// credentials). Eight bytes at a time, every byte read, differences OR-ed together and tested
/// once at the end: no branch depends on the bytes (OpenSSL's `CRYPTO_memcmp` goes byte by byte
/// through a call into libcrypto; a service checks a credential this way on every call).
public enum ConstantTime {
    /// True when `a` and `b` are equal. Only the lengths may leak through timing.
    public static func equals(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in equals(pa, pb) } }
    }

    /// A presented string (a header value) against secret bytes, without copying the string.
    public static func equals(_ a: String, _ b: [UInt8]) -> Bool {
        var a = a
        return a.withUTF8 { pa in b.withUnsafeBytes { pb in equals(UnsafeRawBufferPointer(pa), pb) } }
    }

    /// True when the two byte ranges are equal. Only the lengths may leak through timing.
    public static func equals(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Bool {
        guard a.count == b.count else { return false }
        guard let pa = a.baseAddress, let pb = b.baseAddress else { return true }
        let n = a.count
        var diff: UInt64 = 0
        var i = 0
        // 32 bytes a step into four accumulators (no step waits for the one before it).
        var d0: UInt64 = 0, d1: UInt64 = 0, d2: UInt64 = 0, d3: UInt64 = 0
        while i + 32 <= n {
            d0 |= pa.loadUnaligned(fromByteOffset: i, as: UInt64.self) ^ pb.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            d1 |= pa.loadUnaligned(fromByteOffset: i + 8, as: UInt64.self) ^ pb.loadUnaligned(fromByteOffset: i + 8, as: UInt64.self)
            d2 |= pa.loadUnaligned(fromByteOffset: i + 16, as: UInt64.self) ^ pb.loadUnaligned(fromByteOffset: i + 16, as: UInt64.self)
            d3 |= pa.loadUnaligned(fromByteOffset: i + 24, as: UInt64.self) ^ pb.loadUnaligned(fromByteOffset: i + 24, as: UInt64.self)
            i += 32
        }
        diff = d0 | d1 | d2 | d3
        while i + 8 <= n {
            diff |= pa.loadUnaligned(fromByteOffset: i, as: UInt64.self) ^ pb.loadUnaligned(fromByteOffset: i, as: UInt64.self)
            i += 8
        }
        while i < n {
            diff |= UInt64(pa.load(fromByteOffset: i, as: UInt8.self) ^ pb.load(fromByteOffset: i, as: UInt8.self))
            i += 1
        }
        return diff == 0
    }
}
