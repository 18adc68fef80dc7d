import Foundation
import Logging
import Security
import ServiceKit
import Storage
import Synchronization

/// accounts' token signing keys: the current Ed25519 key pair, which signs every new access token,
/// and the retired public keys that may still verify unexpired tokens.
///
/// The current private key is `<data-dir>/signing-key.pem` (mode 0600, written atomically); the
/// public halves of every key, with creation and retirement times, are in the `signing_keys` table,
/// which is what GetSigningKeys publishes. Key ids are RFC 7638 thumbprints, so a verifier can
/// recompute them. Rotation writes the new key file first and then records it: after a crash in
/// between, startup finds a key file the table does not know and completes the rotation.
public final class SigningKeyRing: Sendable {
    public struct PublishedKey: Sendable, Equatable {
        public var keyID: String
        public var publicKey: Ed25519PublicKey
        public var createdAt: Int64
        /// After this instant no token signed with the key can be valid; nil for the current key.
        public var retiredAt: Int64?
    }

    private struct State {
        var current: Ed25519KeyPair
        var currentID: String
        var published: [PublishedKey]
    }

    private let state: Mutex<State>
    private let database: Database
    private let keyPath: String
    private let tokenLifetime: Duration
    private let logger: Logger

    /// Loads (or creates) the key file and reconciles the table with it. Blocking: call at startup.
    init(database: Database, dataDirectory: String, tokenLifetime: Duration, logger: Logger) throws {
        self.database = database
        self.keyPath = dataDirectory + "/signing-key.pem"
        self.tokenLifetime = tokenLifetime
        self.logger = logger
        let pair = try Ed25519KeyPair.loadOrCreate(path: keyPath)
        chmod(keyPath, 0o600)
        let published = try Self.record(pair, in: database, tokenLifetime: tokenLifetime)
        state = Mutex(State(current: pair, currentID: pair.publicKey.keyID, published: published))
    }

    /// Makes `pair` the current key in the table (retiring any other current key) and returns the
    /// keys to publish.
    private static func record(_ pair: Ed25519KeyPair, in database: Database, tokenLifetime: Duration) throws -> [PublishedKey] {
        let id = pair.publicKey.keyID
        let raw = pair.publicKey.rawRepresentation
        let now = SystemClock.nowMilliseconds()
        // A retired key verifies tokens it signed until they expire (plus the verifiers' leeway).
        let retireAt = now + tokenLifetime.milliseconds + 60_000
        try database.writeSync { tx in
            // A key that comes back (an older key file restored, or the file of before a rotation
            // that a crash did not persist) is current again, not retired.
            try tx.execute(
                """
                INSERT INTO signing_keys (key_id, public_key, created_at) VALUES (?, ?, ?)
                ON CONFLICT(key_id) DO UPDATE SET retired_at = NULL
                """, id, raw, now)
            try tx.execute("UPDATE signing_keys SET retired_at = ? WHERE key_id != ? AND retired_at IS NULL", retireAt, id)
            // Tokens that were valid when the key retired have all expired once retired_at passed.
            try tx.execute("DELETE FROM signing_keys WHERE retired_at IS NOT NULL AND retired_at < ?", now - 24 * 3600 * 1000)
        }
        return try load(database)
    }

    private static func load(_ database: Database) throws -> [PublishedKey] {
        let now = SystemClock.nowMilliseconds()
        return try database.readSync { c in
            try c.query(
                "SELECT key_id, public_key, created_at, retired_at FROM signing_keys WHERE retired_at IS NULL OR retired_at > ? ORDER BY retired_at IS NOT NULL, created_at DESC",
                now
            ).map { row in
                PublishedKey(
                    keyID: try row.get("key_id"),
                    publicKey: try Ed25519PublicKey(rawRepresentation: try row.get("public_key")),
                    createdAt: try row.get("created_at"),
                    retiredAt: try row.get("retired_at")
                )
            }
        }
    }

    /// The key that signs new tokens, and its id.
    var current: (pair: Ed25519KeyPair, keyID: String) {
        state.withLock { ($0.current, $0.currentID) }
    }

    /// What GetSigningKeys publishes: the current key first, then retired keys still in use.
    public var published: [PublishedKey] {
        let now = SystemClock.nowMilliseconds()
        return state.withLock { s in s.published.filter { $0.retiredAt.map { $0 > now } ?? true } }
    }

    /// Public keys by id: what accounts' own interceptor verifies with.
    public var verificationKeys: [String: Ed25519PublicKey] {
        Dictionary(published.map { ($0.keyID, $0.publicKey) }, uniquingKeysWith: { a, _ in a })
    }

    /// When the current key was created.
    var currentCreatedAt: Int64 {
        state.withLock { s in s.published.first { $0.keyID == s.currentID }?.createdAt ?? 0 }
    }

    /// Replaces the current key with a new one. The old key stays published until every token it
    /// signed has expired. Blocking (file write, fsync, database write): not on an event loop.
    public func rotate() throws {
        let pair = Ed25519KeyPair()
        try pair.save(to: keyPath)
        let published = try Self.record(pair, in: database, tokenLifetime: tokenLifetime)
        let old = state.withLock { s in
            defer {
                s.current = pair
                s.currentID = pair.publicKey.keyID
                s.published = published
            }
            return s.currentID
        }
        logger.notice("rotated the token signing key", metadata: ["retired": "\(old)", "current": "\(pair.publicKey.keyID)"])
    }

    /// Rotates when the current key is older than `maxAge`; also drops expired retired keys.
    func maintain(maxAge: Duration?) throws {
        if let maxAge, SystemClock.nowMilliseconds() - currentCreatedAt > maxAge.milliseconds {
            try rotate()
        }
    }
}
