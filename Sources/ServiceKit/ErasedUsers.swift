import RPCCore
import Storage
import Synchronization

/// The users a service erased (accounts' account-deletion event, `EraseUser.receive`), so that
/// their access tokens — still valid until they expire — are refused at once: by the access
/// policy on every call (`AuthInterceptor`, from memory: no query per call). The set is updated
/// before the erasure commits, so a call that passes the policy after the erasure is impossible;
/// one already past it when the erasure ran is the only window.
///
/// Durable: recorded in `kit_erased_users` in the erasure's own transaction and loaded when the
/// process starts. Kept `keepFor` (far longer than any access token lives), then purged with the
/// kit's tables.
///
/// One set per database, shared by whoever asks with the same `Database` (`of`): the erasure
/// receiver writes it through the service's store, the process host hands it to the access
/// policy through the outbox's database.
public final class ErasedUsers: Sendable {
    /// How long an erased id is kept: access tokens live 15 minutes; a month is what the kit keeps
    /// processed event ids for too.
    public static let keepFor: Duration = .seconds(30 * 24 * 3600)

    /// What a caller whose account was erased hears.
    public static let refusal = RPCError(.unauthenticated, "the account of this access token no longer exists")

    /// user id → erased at (Unix ms).
    private let ids = Mutex<[String: Int64]>([:])

    init() {}

    /// Whether `user` was erased here.
    public func contains(_ user: String) -> Bool { ids.withLock { $0[user] != nil } }

    /// Notes `user` as erased at `at` (Unix ms).
    func insert(_ user: String, at: Int64) { ids.withLock { $0[user] = $0[user] ?? at } }

    /// Forgets the ids erased before `before` (Unix ms), as the purge of the table does.
    func forget(erasedBefore before: Int64) { ids.withLock { $0 = $0.filter { $0.value >= before } } }

    var count: Int { ids.withLock { $0.count } }

    // MARK: One set per database

    private final class Entry: Sendable {
        weak let database: Database?
        let users: ErasedUsers
        init(_ database: Database, _ users: ErasedUsers) {
            self.database = database
            self.users = users
        }
    }

    private static let registry = Mutex<[ObjectIdentifier: Entry]>([:])

    /// The set of `database`, loaded from its `kit_erased_users` the first time it is asked for
    /// (blocking: at startup, or the first erasure). A database without the table (not on the
    /// kit's migrations) has an empty set.
    public static func of(_ database: Database) throws -> ErasedUsers {
        let key = ObjectIdentifier(database)
        if let e = registry.withLock({ $0[key] }), e.database === database { return e.users }
        let users = ErasedUsers()
        let rows = try database.readSync { c -> [(String, Int64)] in
            guard try c.tableExists("kit_erased_users") else { return [] }
            return try c.query("SELECT user_id, erased_at FROM kit_erased_users").map { (try $0.get(0), try $0.get(1)) }
        }
        for (id, at) in rows { users.insert(id, at: at) }
        return registry.withLock { r in
            if let e = r[key], e.database === database { return e.users }  // loaded meanwhile by another caller
            r = r.filter { $0.value.database != nil }  // closed databases' sets go
            r[key] = Entry(database, users)
            return users
        }
    }
}

extension Migration {
    /// `kit_erased_users`: the users the service erased (`ErasedUsers`).
    public static let erasedUsers = Migration(
        name: "kit.erased-users",
        sql: """
            CREATE TABLE kit_erased_users (
                user_id TEXT PRIMARY KEY NOT NULL,
                erased_at INTEGER NOT NULL
            ) WITHOUT ROWID;
            CREATE INDEX kit_erased_users_at ON kit_erased_users(erased_at);
            """)
}
