import Contracts
import Foundation
import Logging
import RPCCore
import Security
import Storage

/// A service's database as its handlers use it: `read` and `write` with every storage failure
/// mapped to the wire's vocabulary in one place, idempotent requests, and received events applied
/// once.
///
/// **Unique constraints name their field.** A unique violation is a race lost to a concurrent
/// request (the handler checked before writing); the client should hear which of *its* fields
/// collided. Each service declares which constraint protects which request field
/// (`uniqueFields`, keyed by the column as SQLite names it, `table.column`, or by index name);
/// an undeclared one is logged and answered ALREADY_EXISTS without a field.
public final class ServiceStore: Sendable {
    /// A unique constraint and the request field it protects.
    public struct UniqueField: Sendable {
        public var field: String
        public var message: String
        public init(field: String, message: String = "already exists") {
            self.field = field
            self.message = message
        }
    }

    public let database: Database
    public let logger: Logger
    public let uniqueFields: [String: UniqueField]

    public init(database: Database, uniqueFields: [String: UniqueField] = [:], logger: Logger) {
        self.database = database
        self.uniqueFields = uniqueFields
        self.logger = logger
    }

    /// What every service opens at startup: its database file (migrated, and recording which
    /// service owns it: `Database.open(directory:schema:)`), the store over it and
    /// its page-token secret. The database is closed again when anything after the open fails.
    /// Blocking: call at startup.
    public struct Opened: Sendable {
        public let database: Database
        public let store: ServiceStore
        public let pageTokens: PageTokens
    }

    public static func open(
        directory: String, schema: DatabaseSchema, uniqueFields: [String: UniqueField] = [:], logger: Logger
    ) throws -> Opened {
        let database = try Database.open(directory: directory, schema: schema, logger: logger)
        do {
            let tokens = try PageTokens.load(from: database)
            return Opened(database: database, store: ServiceStore(database: database, uniqueFields: uniqueFields, logger: logger), pageTokens: tokens)
        } catch {
            database.close()
            throw error
        }
    }

    /// One read transaction; storage failures become `RPCError`s (with the failure as cause).
    public func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        do { return try await database.read(body) } catch let e as StorageError { throw rpcError(e) }
    }

    /// One write transaction; storage failures become `RPCError`s (with the failure as cause).
    /// An `RPCError` thrown by the body rolls the transaction back and reaches the client as is.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> T) async throws -> T {
        do { return try await database.write(body) } catch let e as StorageError { throw rpcError(e) }
    }

    /// The error a client sees for a storage failure (the one mapping of every service).
    public func rpcError(_ e: StorageError) -> RPCError {
        switch e {
        case .uniqueViolation(let columns, let index):
            if let declared = (index.flatMap { uniqueFields[$0] }) ?? columns.lazy.compactMap({ self.uniqueFields[$0] }).first {
                return FieldErrors.single(.alreadyExists, field: declared.field, declared.message).causedBy(e)
            }
            logger.warning("unique constraint not declared in uniqueFields", metadata: ["error": "\(e)"])
            return RPCError(.alreadyExists, "a record with the same key already exists", cause: e)
        case .overloaded:
            return RPCError.retryLater("the service is overloaded: retry in a second", after: .seconds(1), code: .unavailable)
                .causedBy(e)
        case .busy, .diskFull, .closed, .locked:
            logger.warning("storage unavailable", metadata: ["error": "\(e)"])
            return e.rpcError.causedBy(e)
        default:
            // Internals are logged once by the server (the error's cause), never sent.
            return e.rpcError.causedBy(e)
        }
    }

    // MARK: Events received from other services' outboxes

    /// Applies an event's effect at most once: `effect` runs in a write transaction only the first
    /// time `eventID` is seen, and the id is recorded in the same transaction (needs
    /// `Migration.inbox`). Returns true when it was a redelivery (the `replayed` of the answer).
    public func receiveOnce(eventID: String, _ effect: @escaping @Sendable (Transaction) throws -> Void) async throws -> Bool {
        try await applyOnce(eventID: eventID, effect) == nil
    }

    /// `receiveOnce` for an effect with a result: nil when it was a redelivery (nothing done).
    public func applyOnce<T: Sendable>(eventID: String, _ effect: @escaping @Sendable (Transaction) throws -> T) async throws -> T? {
        try await write { tx in
            guard try tx.markProcessedOnce(eventID: eventID) else { return nil }
            return try effect(tx)
        }
    }

    /// The answer stored for an earlier request with `key` (`SQLReader.storedAnswer`), read before
    /// a handler's slow part (a retry costs no peer call); nil when there is no key or it is new.
    public func storedAnswer<Response: ProtoMessage>(_ key: Idempotency.Key?, as _: Response.Type = Response.self) async throws -> Response? {
        guard let key else { return nil }
        return try await storedAnswer(scope: key.scope, key: key.key, fingerprint: key.fingerprint, as: Response.self)
    }

    public func storedAnswer<Response: ProtoMessage>(
        scope: String, key: String, fingerprint: [UInt8], as _: Response.Type = Response.self
    ) async throws -> Response? {
        try await read { c in try c.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Response.self) }
    }

    // MARK: Upkeep

    /// Deletes delivered outbox events, processed-event ids, idempotency records and erased users'
    /// ids past their keeping time (7, 30, `keepIdempotencyKeys` and 30 days): the tables that only grow otherwise.
    /// `keepIdempotencyKeys: nil` keeps them for ever (finance: a retry months later must still
    /// find its key, and a record costs a few hundred bytes).
    public func purgeKitTables(
        now: Int64 = SystemClock.nowMilliseconds(), keepIdempotencyKeys: Duration? = Idempotency.keepFor
    ) async throws {
        let day: Int64 = 24 * 3600 * 1000
        try await write { tx in
            if try tx.tableExists("outbox") { try tx.purgeDeliveredOutbox(deliveredBefore: Date(unixMilliseconds: now - 7 * day)) }
            if try tx.tableExists("inbox_processed") {
                try tx.execute("DELETE FROM inbox_processed WHERE processed_at < ?", now - 30 * day)
            }
            if let keep = keepIdempotencyKeys, try tx.tableExists("idempotency_keys") {
                try tx.execute("DELETE FROM idempotency_keys WHERE created_at < ?", now - keep.milliseconds)
            }
            if try tx.tableExists("kit_erased_users") {
                try tx.execute("DELETE FROM kit_erased_users WHERE erased_at < ?", now - ErasedUsers.keepFor.milliseconds)
            }
        }
        try ErasedUsers.of(database).forget(erasedBefore: now - ErasedUsers.keepFor.milliseconds)
    }
}

extension SQLReader {
    func tableExists(_ name: String) throws -> Bool {
        try queryOne("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", name) != nil
    }
}

extension Date {
    init(unixMilliseconds ms: Int64) { self.init(timeIntervalSince1970: Double(ms) / 1000) }
}

// MARK: Idempotency keys

/// Client-retried requests (`idempotency_key`, Proto/README.md "Idempotency"): the first request
/// with a key stores its answer in the same transaction as its effect; a retry with the same key
/// and the same request gets that answer again (`replayed = true`) and changes nothing; the same
/// key with another request is FAILED_PRECONDITION. Concurrent retries are safe: the writer runs
/// one transaction at a time, so the second finds the first's record inside its own transaction.
/// Keys are scoped (method and caller) and kept `keepFor`.
public enum Idempotency {
    /// How long a key is remembered (clients retry within minutes; a week covers a phone that
    /// was offline for days).
    public static let keepFor: Duration = .seconds(7 * 24 * 3600)

    /// A request's key: scoped to the method and the caller (the caller's id last, which erasure
    /// relies on), bound to the request's bytes.
    public struct Key: Sendable {
        public let scope: String
        public let key: String
        public let fingerprint: [UInt8]

        /// Nil when the request has no key (where the key is optional, every such request is a new one).
        public init?(_ method: String, caller: String, key: String, request: some ProtoMessage) {
            guard !key.isEmpty else { return nil }
            scope = "\(method):\(caller)"
            self.key = key
            fingerprint = Idempotency.fingerprint(request)
        }
    }

    /// The fingerprint a key is bound to: SHA-256 of the request's bytes (our encoder writes
    /// fields in number order and map entries sorted, so equal requests give equal bytes).
    public static func fingerprint(_ request: some ProtoMessage) -> [UInt8] { SHA256.hash(request.serializedBytes()) }
}

extension Migration {
    /// `idempotency_keys`: what `Transaction.idempotent` reads and writes.
    public static let idempotency = Migration(
        name: "kit.idempotency-keys",
        sql: """
            CREATE TABLE idempotency_keys (
                scope TEXT NOT NULL,            -- the method and the caller
                key TEXT NOT NULL,
                request_hash BLOB NOT NULL,     -- SHA-256 of the first request's bytes
                response BLOB NOT NULL,         -- the answer it got (replayed = false)
                created_at INTEGER NOT NULL,
                PRIMARY KEY (scope, key)
            ) WITHOUT ROWID;
            CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
            """)

    /// The tables every service on the kit has: outbox (with its per-destination index), inbox of
    /// processed events, secrets, idempotency keys. List them first in a new service's migrations.
    public static let kit: [Migration] = [
        .outbox, .outboxByDestination, .inbox, .secrets, .idempotency, .outboxParking, .outboxTraceContext, .erasedUsers,
    ]
}

extension Transaction {
    /// Runs `make` once per (`scope`, `key`): the first time it runs and its answer is stored in
    /// this transaction; later the stored answer is returned with `replayed` true and `make` does
    /// not run. The same key with another request (by `fingerprint`) throws FAILED_PRECONDITION
    /// naming `field`.
    public func idempotent<Response: ProtoMessage>(
        scope: String, key: String, fingerprint: [UInt8], field: String = "idempotency_key",
        now: Int64 = SystemClock.nowMilliseconds(), _ make: () throws -> Response
    ) throws -> (response: Response, replayed: Bool) {
        if let stored = try storedAnswer(scope: scope, key: key, fingerprint: fingerprint, field: field, as: Response.self) {
            return (stored, true)
        }
        let response = try make()
        try execute(
            "INSERT INTO idempotency_keys (scope, key, request_hash, response, created_at) VALUES (?, ?, ?, ?, ?)",
            scope, key, fingerprint, response.serializedBytes(), now)
        return (response, false)
    }
}
