import Security
import Storage

/// Opaque page tokens: the cursor (the last item's sort key) and a fingerprint of the request's
/// filters, MACed with a server secret so a token cannot be forged or reused with other filters
/// (both → INVALID_ARGUMENT naming `page_token`, as Proto/README.md asks).
///
/// A list handler names its filters in one string (`"search-users:\(prefix)"`), opens the
/// request's token with them (`cursor(_:filters:parts:into:)`), and makes the next token from the
/// last item's sort key.
public struct PageTokens: Sendable {
    let key: [UInt8]

    public init(key: [UInt8]) { self.key = key }

    /// Tokens keyed with the secret `name` of `database` (made on first use; needs
    /// `Migration.secrets` or a table of the same shape). Blocking: call at startup.
    public static func load(from database: Database, secret name: String = "page-token") throws -> PageTokens {
        PageTokens(key: try Secrets.getOrCreate(database, name: name))
    }

    /// `base64url(cursor parts joined by NUL) . base64url(first 16 bytes of HMAC)`.
    public func make(cursor: [String], filters: String) -> String {
        let body = Array(cursor.joined(separator: "\u{0}").utf8)
        return Base64URL.encode(body) + "." + Base64URL.encode(mac(body, filters))
    }

    /// The cursor of a token made for the same filters; nil for a forged or foreign token.
    public func open(_ token: String, filters: String, parts: Int) -> [String]? {
        let pieces = token.split(separator: ".", omittingEmptySubsequences: false)
        guard pieces.count == 2, let body = Base64URL.decode(pieces[0]), let tag = Base64URL.decode(pieces[1]),
            ConstantTime.equals(tag, mac(body, filters))
        else { return nil }
        let cursor = String(decoding: body, as: UTF8.self).split(separator: "\u{0}", omittingEmptySubsequences: false).map(String.init)
        return cursor.count == parts ? cursor : nil
    }

    /// The request's cursor: nil for the first page (empty token); a bad token is recorded as a
    /// `page_token` violation (and nil returned).
    public func cursor(_ token: String, filters: String, parts: Int, into errors: inout FieldErrors) -> [String]? {
        guard !token.isEmpty else { return nil }
        guard let cursor = open(token, filters: filters, parts: parts) else {
            errors.add("page_token", "not a page token of this listing (forged, or made for other filters)")
            return nil
        }
        return cursor
    }

    private func mac(_ body: [UInt8], _ filters: String) -> [UInt8] {
        Array(HMACSHA256.authenticationCode(for: body + [0] + Array(filters.utf8), key: key).prefix(16))
    }
}

/// Named server secrets kept in the service's own database (page-token keys, invite-code
/// peppers): random bytes made once and kept across restarts.
public enum Secrets {
    /// The secret `name`, made (32 random bytes) and stored the first time. Blocking.
    public static func getOrCreate(_ database: Database, name: String) throws -> [UInt8] {
        if let existing = try database.readSync({ c in
            try c.queryOne("SELECT value FROM secrets WHERE name = ?", name)?.get(0, as: [UInt8].self)
        }) {
            return existing
        }
        return try database.writeSync { tx in
            try tx.execute("INSERT OR IGNORE INTO secrets (name, value) VALUES (?, ?)", name, SecureRandom.bytes(32))
            return try tx.queryOne("SELECT value FROM secrets WHERE name = ?", name)!.get(0, as: [UInt8].self)
        }
    }
}

extension Migration {
    /// `secrets(name, value)`: what `Secrets` and `PageTokens.load` read.
    public static let secrets = Migration(
        name: "kit.secrets",
        sql: "CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY NOT NULL, value BLOB NOT NULL)")
}
