import Contracts
import RPCCore
import Security
import ServiceKit
import Storage
import Synchronization

/// A session about to be created: its id and refresh token are drawn before the write
/// transaction, the row is inserted inside it, and the access token is signed after it commits.
struct NewSession: Sendable {
    let sessionID: String
    let userID: String
    let guest: Bool
    let refreshToken: String
    let refreshHash: [UInt8]
    let now: Int64
    let refreshExpiresAt: Int64

    init(userID: String, guest: Bool, sessionID: String = ULID.make(), refreshLifetime: Duration) {
        self.sessionID = sessionID
        self.userID = userID
        self.guest = guest
        refreshToken = SecureRandom.token(bytes: 32)
        refreshHash = SHA256.hash(refreshToken)
        now = SystemClock.nowMilliseconds()
        refreshExpiresAt = now + refreshLifetime.milliseconds
    }

    /// Inserts the session and its first refresh token.
    func insert(_ tx: Transaction) throws {
        try tx.execute("INSERT INTO sessions (id, user_id, created_at, refreshed_at) VALUES (?, ?, ?, ?)", sessionID, userID, now, now)
        try insertToken(tx)
    }

    /// Inserts the refresh token only (a rotation of an existing session).
    func insertToken(_ tx: Transaction) throws {
        try tx.execute(
            "INSERT INTO refresh_tokens (token_hash, session_id, issued_at, expires_at) VALUES (?, ?, ?, ?)",
            refreshHash, sessionID, now, refreshExpiresAt)
    }

    /// The token pair the client keeps, with a freshly signed access token.
    func proto(keys: SigningKeyRing, accessLifetime: Duration) -> Accounts_V1_Session {
        let (pair, keyID) = keys.current
        let issuedAt = now / 1000
        let expiresAt = issuedAt + accessLifetime.components.seconds
        let claims = AccessTokenClaims(
            userID: userID, sessionID: sessionID, expiresAt: expiresAt, issuedAt: issuedAt,
            keyID: keyID, kind: guest ? .guest : .user)
        var s = Accounts_V1_Session()
        s.sessionId = sessionID
        s.accessToken = AccessToken.sign(claims, with: pair)
        s.accessTokenExpiresAt = Google_Protobuf_Timestamp(unixSeconds: expiresAt)
        s.refreshToken = refreshToken
        s.refreshTokenExpiresAt = Google_Protobuf_Timestamp(milliseconds: refreshExpiresAt)
        return s
    }
}

enum SessionQueries {
    /// Revokes the user's live sessions (all, or all but `except`) and their refresh tokens; returns
    /// the revoked session ids (for the in-memory list that stops their access tokens here).
    static func revokeAll(_ tx: Transaction, userID: String, except: String? = nil, reason: String, now: Int64) throws -> [String] {
        let ids = try tx.query("SELECT id FROM sessions WHERE user_id = ? AND revoked_at IS NULL", arguments: [.text(userID)])
            .map { try $0.get(0, as: String.self) }
            .filter { $0 != except }
        for id in ids { try revoke(tx, sessionID: id, reason: reason, now: now) }
        return ids
    }

    /// Ends one session: its row is marked, its refresh tokens deleted (none of them can be used
    /// again, and nothing secret-derived is kept longer than needed).
    static func revoke(_ tx: Transaction, sessionID: String, reason: String, now: Int64) throws {
        try tx.execute("UPDATE sessions SET revoked_at = ?, revoke_reason = ? WHERE id = ? AND revoked_at IS NULL", now, reason, sessionID)
        try tx.execute("DELETE FROM refresh_tokens WHERE session_id = ?", sessionID)
    }
}

/// Sessions revoked recently, kept in memory so accounts' own handlers refuse their access tokens
/// at once (other services accept an access token until it expires, as the contract says).
///
/// Exact, not a cache: one process owns the database, every revocation goes through it, and an
/// entry only has to outlive the access tokens issued before the revocation (their lifetime plus
/// leeway); startup reloads the revocations of that period from the database.
final class RevokedSessions: Sendable {
    private let state = Mutex<[String: Int64]>([:])
    private let retention: Int64

    init(accessTokenLifetime: Duration) {
        retention = accessTokenLifetime.milliseconds + 120_000
    }

    func load(from database: Database) throws {
        let since = SystemClock.nowMilliseconds() - retention
        let rows = try database.readSync { c in
            try c.query("SELECT id, revoked_at FROM sessions WHERE revoked_at IS NOT NULL AND revoked_at > ?", since)
        }
        let entries = try rows.map { (try $0.get(0, as: String.self), try $0.get(1, as: Int64.self)) }
        state.withLock { s in for (id, at) in entries { s[id] = at } }
    }

    func add(_ ids: [String], at now: Int64 = SystemClock.nowMilliseconds()) {
        guard !ids.isEmpty else { return }
        state.withLock { s in
            for id in ids { s[id] = now }
            if s.count > 1024 { s = s.filter { $0.value > now - retention } }
        }
    }

    func contains(_ id: String) -> Bool { state.withLock { $0[id] != nil } }
}
