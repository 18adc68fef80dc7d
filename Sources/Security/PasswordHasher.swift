internal import COpenSSL
import Foundation

/// Password hashing with scrypt (RFC 7914) through OpenSSL's `EVP_KDF` "SCRYPT".
///
/// A stored hash is self-describing — `scrypt$N$r$p$<salt>$<hash>` (salt and hash in unpadded
/// base64url) — so the cost can be raised later: `verify` uses the parameters in the string, and
/// `needsRehash` tells the caller to store a fresh hash after a successful login.
///
/// Passwords are normalized to Unicode NFKC before hashing (NIST SP 800-63B §5.1.1.2), so the same
/// password typed on keyboards that compose accents differently verifies.
///
/// scrypt is deliberately slow and memory-hard (32 MiB, tens of ms at the defaults): call the
/// `async` variants from request handlers. They run on a small dedicated thread pool that also
/// bounds the memory a burst of logins can take.
public struct PasswordHasher: Sendable {
    /// scrypt cost parameters.
    public struct Parameters: Sendable, Hashable, CustomStringConvertible {
        /// CPU/memory cost, a power of two. Memory is 128 · r · N bytes.
        public var n: UInt64
        /// Block size.
        public var r: UInt32
        /// Parallelization.
        public var p: UInt32
        /// Derived key bytes stored.
        public var keyLength: Int
        /// Random salt bytes per hash.
        public var saltLength: Int

        /// N = 2^15, r = 8, p = 1: 32 MiB per hash (the scrypt paper's interactive-login setting,
        /// still OWASP's minimum recommendation); 32-byte hash, 16-byte salt.
        public static let `default` = Parameters(n: 1 << 15, r: 8, p: 1, keyLength: 32, saltLength: 16)

        public init(n: UInt64, r: UInt32, p: UInt32, keyLength: Int = 32, saltLength: Int = 16) {
            self.n = n
            self.r = r
            self.p = p
            self.keyLength = keyLength
            self.saltLength = saltLength
        }

        /// What `verify` accepts from a stored string: bounded so a tampered or corrupt database row
        /// cannot make one login allocate gigabytes or run for minutes.
        func validate() throws {
            guard n >= 2, n & (n - 1) == 0, n <= 1 << 20 else {
                throw SecurityError.invalidParameters("scrypt N must be a power of two in 2...2^20, got \(n)")
            }
            guard (1...32).contains(r) else { throw SecurityError.invalidParameters("scrypt r must be in 1...32, got \(r)") }
            guard (1...16).contains(p) else { throw SecurityError.invalidParameters("scrypt p must be in 1...16, got \(p)") }
            guard 128 * UInt64(r) * n <= 256 << 20 else { throw SecurityError.invalidParameters("scrypt memory 128·r·N exceeds 256 MiB") }
            guard (16...64).contains(keyLength) else { throw SecurityError.invalidParameters("key length must be in 16...64") }
            guard (8...64).contains(saltLength) else { throw SecurityError.invalidParameters("salt length must be in 8...64") }
        }

        public var description: String { "scrypt(N=\(n), r=\(r), p=\(p), \(keyLength)-byte key, \(saltLength)-byte salt)" }
    }

    public let parameters: Parameters

    /// A hasher with the default parameters.
    public init() {
        self.parameters = .default
    }

    /// - Throws: `invalidParameters` for costs `verify` would not accept back.
    public init(parameters: Parameters) throws {
        try parameters.validate()
        self.parameters = parameters
    }

    // MARK: Hashing

    /// A new encoded hash of `password` with a fresh random salt. Blocks for the scrypt time.
    public func hash(_ password: String) throws -> String {
        let salt = SecureRandom.bytes(parameters.saltLength)
        let key = try Self.scrypt(
            password: Self.normalized(password), salt: salt, n: parameters.n, r: parameters.r, p: parameters.p, length: parameters.keyLength)
        return Self.encode(parameters, salt: salt, key: key)
    }

    /// True when `password` matches `encoded`. Malformed or out-of-bounds stored strings are false,
    /// never a crash. The comparison is constant-time. Blocks for the scrypt time.
    public func verify(_ password: String, against encoded: String) -> Bool {
        guard let stored = Self.decode(encoded), (try? stored.parameters.validate()) != nil else { return false }
        guard
            let key = try? Self.scrypt(
                password: Self.normalized(password), salt: stored.salt,
                n: stored.parameters.n, r: stored.parameters.r, p: stored.parameters.p, length: stored.key.count
            )
        else { return false }
        return ConstantTime.equals(key, stored.key)
    }

    /// True when `encoded` was made with other parameters than this hasher's (or is unreadable):
    /// after a successful `verify`, store `hash(password)` instead.
    public func needsRehash(_ encoded: String) -> Bool {
        guard let stored = Self.decode(encoded) else { return true }
        return stored.parameters != parameters
    }

    /// Spends the time of a `verify` without a stored hash: for a login with an unknown user, so
    /// response time does not reveal which usernames exist.
    public func simulateVerify(_ password: String) {
        _ = try? Self.scrypt(
            password: Self.normalized(password), salt: [UInt8](repeating: 0, count: parameters.saltLength), n: parameters.n, r: parameters.r,
            p: parameters.p, length: parameters.keyLength)
    }

    // MARK: Off the caller's thread

    /// `hash` on the password-hashing threads.
    public func hash(_ password: String) async throws -> String {
        try await HashingThreads.shared.run { try self.hash(password) }
    }

    /// `verify` on the password-hashing threads.
    public func verify(_ password: String, against encoded: String) async -> Bool {
        (try? await HashingThreads.shared.run { self.verify(password, against: encoded) }) ?? false
    }

    /// `simulateVerify` on the password-hashing threads.
    public func simulateVerify(_ password: String) async {
        _ = try? await HashingThreads.shared.run { self.simulateVerify(password) }
    }

    // MARK: scrypt

    /// Raw scrypt (RFC 7914) through `EVP_KDF` "SCRYPT".
    public static func scrypt(password: [UInt8], salt: [UInt8], n: UInt64, r: UInt32, p: UInt32, length: Int) throws -> [UInt8] {
        guard length > 0 else { throw SecurityError.invalidParameters("scrypt output length must be positive") }
        guard let kdf = scryptKDF.pointer else { throw openSSLErrors("EVP_KDF_fetch(SCRYPT)") }
        guard let ctx = EVP_KDF_CTX_new(kdf) else { throw openSSLErrors("EVP_KDF_CTX_new") }
        defer { EVP_KDF_CTX_free(ctx) }
        var n = n, r = r, p = p
        // OpenSSL refuses anything above `maxmem` (default 32 MiB, just below what N=2^15, r=8
        // needs): allow what these parameters need, B + V = 128·r·p + 128·r·(N+2), plus slack.
        var maxmem: UInt64 = 128 * UInt64(r) * UInt64(p) + 128 * UInt64(r) * (n + 2) + (1 << 20)
        var key = [UInt8](repeating: 0, count: length)
        let rc = withNonNullBytes(password) { pw, pwCount in
            withNonNullBytes(salt) { s, sCount in
                var params: [OSSL_PARAM] = [
                    OSSL_PARAM_construct_octet_string(ParamName.password, UnsafeMutableRawPointer(mutating: pw), pwCount),
                    OSSL_PARAM_construct_octet_string(ParamName.salt, UnsafeMutableRawPointer(mutating: s), sCount),
                    OSSL_PARAM_construct_uint64(ParamName.n, &n),
                    OSSL_PARAM_construct_uint32(ParamName.r, &r),
                    OSSL_PARAM_construct_uint32(ParamName.p, &p),
                    OSSL_PARAM_construct_uint64(ParamName.maxmem, &maxmem),
                    OSSL_PARAM_construct_end(),
                ]
                return key.withUnsafeMutableBufferPointer { out in
                    EVP_KDF_derive(ctx, out.baseAddress, out.count, &params)
                }
            }
        }
        guard rc == 1 else { throw openSSLErrors("scrypt(N=\(n), r=\(r), p=\(p))") }
        return key
    }

    /// OSSL_PARAM keeps the key-name pointer: names must be static C strings (string literals' storage
    /// is constant for the life of the process).
    private enum ParamName {
        static var password: UnsafePointer<CChar> { cString("pass") }
        static var salt: UnsafePointer<CChar> { cString("salt") }
        static var n: UnsafePointer<CChar> { cString("n") }
        static var r: UnsafePointer<CChar> { cString("r") }
        static var p: UnsafePointer<CChar> { cString("p") }
        static var maxmem: UnsafePointer<CChar> { cString("maxmem_bytes") }

        static func cString(_ s: StaticString) -> UnsafePointer<CChar> {
            UnsafeRawPointer(s.utf8Start).assumingMemoryBound(to: CChar.self)
        }
    }

    /// The SCRYPT algorithm, fetched once (a fetch costs a lock and a lookup per call otherwise).
    private static let scryptKDF = FetchedKDF(name: "SCRYPT")

    // MARK: Encoding

    static func normalized(_ password: String) -> [UInt8] {
        Array(password.precomposedStringWithCompatibilityMapping.utf8)
    }

    static func encode(_ parameters: Parameters, salt: [UInt8], key: [UInt8]) -> String {
        "scrypt$\(parameters.n)$\(parameters.r)$\(parameters.p)$\(Base64URL.encode(salt))$\(Base64URL.encode(key))"
    }

    static func decode(_ encoded: String) -> (parameters: Parameters, salt: [UInt8], key: [UInt8])? {
        let parts = encoded.split(separator: "$", omittingEmptySubsequences: false)
        guard parts.count == 6, parts[0] == "scrypt",
            let n = UInt64(parts[1]), let r = UInt32(parts[2]), let p = UInt32(parts[3]),
            let salt = Base64URL.decode(parts[4]), let key = Base64URL.decode(parts[5])
        else { return nil }
        return (Parameters(n: n, r: r, p: p, keyLength: key.count, saltLength: salt.count), salt, key)
    }
}

/// An `EVP_KDF` fetched once and kept for the life of the process.
final class FetchedKDF: @unchecked Sendable {
    let pointer: OpaquePointer?
    init(name: String) { pointer = EVP_KDF_fetch(nil, name, nil) }
    deinit { EVP_KDF_free(pointer) }
}

/// Threads for password hashing: scrypt is CPU- and memory-bound for tens of milliseconds, which
/// must not run on a NIO event loop or hog the cooperative pool; and a fixed number of threads
/// bounds the memory (32 MiB each at the defaults) a burst of logins can take.
final class HashingThreads: @unchecked Sendable {
    static let shared = HashingThreads(count: max(1, min(2, ProcessInfo.processInfo.activeProcessorCount)))

    private let condition = NSCondition()
    private var jobs: [@Sendable () -> Void] = []

    init(count: Int) {
        for i in 0..<count {
            let thread = Thread { [self] in self.loop() }
            thread.name = "password-hashing-\(i)"
            thread.start()
        }
    }

    private func loop() {
        while true {
            condition.lock()
            while jobs.isEmpty { condition.wait() }
            let job = jobs.removeFirst()
            condition.unlock()
            job()
        }
    }

    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, Error>) in
            condition.lock()
            jobs.append { continuation.resume(with: Result { try body() }) }
            condition.signal()
            condition.unlock()
        }
    }
}
