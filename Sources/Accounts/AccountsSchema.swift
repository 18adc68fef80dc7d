import Security
import ServiceKit
import Storage

/// The accounts database (`<data-dir>/accounts.sqlite`). Times are Unix milliseconds; secrets
/// (refresh tokens, reset tokens) are stored only as SHA-256 hashes, passwords only as scrypt
/// hashes. Migrations are never edited once shipped: changes are new entries at the end.
public enum AccountsSchema {
    static let fileName = "accounts.sqlite"

    static let migrations: [Migration] = [
        Migration(
            name: "accounts.001-users",
            sql: """
                CREATE TABLE users (
                    id TEXT PRIMARY KEY NOT NULL,
                    -- NULL once deleted (usernames and emails are freed, see README).
                    username TEXT,
                    username_key TEXT,          -- lower(username): case-insensitive uniqueness and order
                    email TEXT,                 -- as given; NULL for guests and deleted users
                    email_key TEXT,             -- lower(email)
                    password_hash TEXT,         -- scrypt$N$r$p$salt$hash; NULL for guests
                    display_name TEXT NOT NULL DEFAULT '',
                    phone_number TEXT NOT NULL DEFAULT '',
                    public_email TEXT NOT NULL DEFAULT '',
                    has_contact INTEGER NOT NULL DEFAULT 0,
                    guest INTEGER NOT NULL DEFAULT 0,
                    -- Avatar: a built-in id, or an uploaded image (bytes in avatar_images).
                    avatar_builtin TEXT,
                    avatar_format INTEGER,
                    avatar_size INTEGER,
                    avatar_uploaded_at INTEGER,
                    created_at INTEGER NOT NULL,
                    updated_at INTEGER NOT NULL,
                    deleted_at INTEGER
                );
                CREATE UNIQUE INDEX users_username_key ON users(username_key) WHERE username_key IS NOT NULL;
                CREATE UNIQUE INDEX users_email_key ON users(email_key) WHERE email_key IS NOT NULL;

                CREATE TABLE avatar_images (
                    user_id TEXT PRIMARY KEY NOT NULL REFERENCES users(id),
                    data BLOB NOT NULL
                );

                -- A login: one family of refresh tokens. Revoking it ends every token of the family.
                CREATE TABLE sessions (
                    id TEXT PRIMARY KEY NOT NULL,
                    user_id TEXT NOT NULL REFERENCES users(id),
                    created_at INTEGER NOT NULL,
                    refreshed_at INTEGER NOT NULL,
                    revoked_at INTEGER,
                    revoke_reason TEXT
                );
                CREATE INDEX sessions_user ON sessions(user_id) WHERE revoked_at IS NULL;
                CREATE INDEX sessions_revoked ON sessions(revoked_at) WHERE revoked_at IS NOT NULL;

                -- Every refresh token ever issued for a live session, by SHA-256 hash. A token with
                -- rotated_at set was exchanged already: presenting it again revokes the session.
                CREATE TABLE refresh_tokens (
                    token_hash BLOB PRIMARY KEY NOT NULL,
                    session_id TEXT NOT NULL REFERENCES sessions(id),
                    issued_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    rotated_at INTEGER
                ) WITHOUT ROWID;
                CREATE INDEX refresh_tokens_session ON refresh_tokens(session_id);

                CREATE TABLE password_resets (
                    token_hash BLOB PRIMARY KEY NOT NULL,
                    user_id TEXT NOT NULL REFERENCES users(id),
                    created_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    used_at INTEGER
                ) WITHOUT ROWID;
                CREATE INDEX password_resets_user ON password_resets(user_id);

                -- Public halves of the token signing keys, current and retired (the current private
                -- key lives in <data-dir>/signing-key.pem, 0600).
                CREATE TABLE signing_keys (
                    key_id TEXT PRIMARY KEY NOT NULL,
                    public_key BLOB NOT NULL,
                    created_at INTEGER NOT NULL,
                    retired_at INTEGER
                );

                -- SendMail idempotency: one row per sender event id.
                CREATE TABLE mail_events (
                    event_id TEXT PRIMARY KEY NOT NULL,
                    mail_id TEXT NOT NULL,
                    state TEXT NOT NULL,        -- 'pending' until the sink took the mail, then 'sent'
                    created_at INTEGER NOT NULL
                );

                -- Server secrets that are not keys (the page-token MAC key).
                CREATE TABLE secrets (
                    name TEXT PRIMARY KEY NOT NULL,
                    value BLOB NOT NULL
                );
                """
        ),
        Migration(name: "accounts.002-page-token-secret") { tx in
            try tx.execute("INSERT INTO secrets (name, value) VALUES ('page-token', ?)", SecureRandom.bytes(32))
        },
        .outbox,
        .outboxByDestination,
        .inbox,
        .idempotency,
        .outboxParking,
        .outboxTraceContext,
        Migration(
            name: "accounts.003-accounts-by-address",
            sql: """
                -- Accounts made per client address (sign-ups, guests), kept for the limits' window so
                -- that a restart does not reset them; older rows are purged hourly.
                CREATE TABLE accounts_by_address (
                    address TEXT NOT NULL,
                    guest INTEGER NOT NULL,
                    made_at INTEGER NOT NULL
                );
                CREATE INDEX accounts_by_address_made_at ON accounts_by_address(made_at);
                """),
    ]
}

extension AccountsSchema: ServiceDatabase {
    /// accounts's database as a whole: what the core opens and what `accounts-service backup` and
    /// `restore` work on.
    public static let schema = DatabaseSchema(service: "accounts", fileName: fileName, migrations: migrations)
}
