internal import CSQLite
import Foundation
import Logging
import Observability
import RPCCore
import Synchronization

/// A service's SQLite database: one file in its data directory, one writer connection and a few
/// readers, each on a thread of its own.
///
/// WAL lets readers run while the writer writes; there is exactly one writer, so write
/// transactions never fight over the lock (`BEGIN IMMEDIATE` never waits on ourselves). `read` and
/// `write` run the blocking SQLite calls on those threads and resume the caller, so an async handler
/// on a NIO event loop or the cooperative pool never blocks on disk.
public final class Database: Sendable {
    /// How the database is opened.
    public struct Options: Sendable {
        /// Durability of an acknowledged write (one that `write` returned). Both survive a process
        /// crash (kill -9): by then the commit is in the WAL, in the OS page cache. They differ on
        /// power loss or a kernel crash:
        /// - `.normal`: SQLite's `synchronous=NORMAL`; the WAL is fsynced only at checkpoints, so
        ///   the last acknowledged commits may roll back (the file stays consistent).
        /// - `.full`: acknowledged writes survive power loss too. Implemented as group commit:
        ///   SQLite runs at NORMAL and the writer thread fsyncs the WAL once after each batch of
        ///   queued transactions, before resuming their callers. One fsync then covers every write
        ///   that arrived meanwhile, instead of one fsync per commit (`synchronous=FULL`), which
        ///   caps a service at one write per fsync. A reader may see a commit up to one fsync
        ///   before it is durable; the outbox only delivers durable events.
        public enum Synchronous: String, Sendable {
            case normal = "NORMAL"
            case full = "FULL"
        }

        /// Default `.full`: a service acknowledges a write to a client (money, accounts) only when
        /// it would survive a power cut; group commit keeps that cheap under load.
        public var synchronous: Synchronous
        /// How long a statement waits for a lock held by another connection (checkpoints, a
        /// `sqlite3` shell an operator opened) before failing with `busy`.
        public var busyTimeout: Duration
        /// Reader connections (and threads). Reads are short, so a few suffice.
        public var readerCount: Int
        /// Jobs that may wait for the writer thread, and for the reader threads: past it a call
        /// fails at once with `overloaded` (UNAVAILABLE, retry shortly) instead of queueing
        /// without bound. A few thousand is tens of milliseconds of work at this store's speed.
        public var maxQueuedJobs: Int

        public init(
            synchronous: Synchronous = .full, busyTimeout: Duration = .seconds(5), readerCount: Int = 3,
            maxQueuedJobs: Int = 2048
        ) {
            self.synchronous = synchronous
            self.busyTimeout = busyTimeout
            self.readerCount = readerCount
            self.maxQueuedJobs = maxQueuedJobs
        }
    }

    /// The database file.
    public let path: String
    public let options: Options
    let logger: Logger
    let writer: ConnectionWorkers
    let readers: ConnectionWorkers
    let lock: FileLock
    let outboxSignal = OutboxSignal()
    /// The service that owns the database (`open(directory:schema:)`), nil when opened without one.
    public let service: String?
    /// What the metrics call this database (their `database` label): the service, else the file's
    /// name without its extension.
    let metricsName: String
    let metrics: StorageMetrics
    private let isClosed = Mutex(false)

    private init(
        path: String, service: String?, options: Options, logger: Logger, writer: Connection, readers: [Connection], lock: FileLock
    ) {
        self.path = path
        self.service = service
        self.options = options
        self.logger = logger
        self.lock = lock
        let name = URL(fileURLWithPath: path).deletingPathExtension().lastPathComponent
        metricsName = service ?? name
        metrics = StorageMetrics(database: metricsName, path: path)
        self.writer = ConnectionWorkers(
            name: "db-\(name)-writer", connections: [writer], groupCommit: options.synchronous == .full,
            maxQueued: options.maxQueuedJobs, metrics: metrics)
        self.readers = ConnectionWorkers(name: "db-\(name)-reader", connections: readers, maxQueued: options.maxQueuedJobs)
    }

    deinit { close() }

    // MARK: Opening

    /// Opens (creating if needed) `directory/fileName`, takes its process lock, configures WAL,
    /// foreign keys and durability, and applies the migrations not yet applied.
    ///
    /// Throws `StorageError` — never crashes — when the file cannot be opened or is not a
    /// database, another process holds it, it was migrated by a newer version, or a migration
    /// fails. Blocks: call it at startup, before serving.
    public static func open(
        directory: String,
        fileName: String,
        migrations: [Migration],
        options: Options = Options(),
        logger: Logger = Logger(label: "storage")
    ) throws -> Database {
        try open(directory: directory, fileName: fileName, migrations: migrations, service: nil, options: options, logger: logger)
    }

    /// Opens a service's database as `open(directory:fileName:migrations:)` does, and records
    /// which service owns it (`schema.service`, in `storage_metadata`): a database that records
    /// another service is refused (`wrongService`) before anything is migrated, and one that
    /// records none (created before the record existed) gets it now. `Database.restore` relies on
    /// the record to refuse another service's file.
    public static func open(
        directory: String,
        schema: DatabaseSchema,
        options: Options = Options(),
        logger: Logger = Logger(label: "storage")
    ) throws -> Database {
        try open(
            directory: directory, fileName: schema.fileName, migrations: schema.migrations, service: schema.service, options: options,
            logger: logger)
    }

    private static func open(
        directory: String, fileName: String, migrations: [Migration], service: String?, options: Options, logger: Logger
    ) throws -> Database {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw StorageError.cannotOpen(path: directory, reason: "cannot create the data directory (\(error.localizedDescription))")
        }
        let path = directory.hasSuffix("/") ? directory + fileName : directory + "/" + fileName
        let lock = try FileLock.acquire(path: path + ".lock", databasePath: path)
        do {
            let writer = try Connection(path: path)
            try configure(writer, options: options, isWriter: true)
            try migrate(writer, migrations: migrations, service: service, logger: logger)
            var readers: [Connection] = []
            for _ in 0..<max(1, options.readerCount) {
                let reader = try Connection(path: path)
                try configure(reader, options: options, isWriter: false)
                readers.append(reader)
            }
            logger.debug("database open", metadata: ["database": "\(path)", "synchronous": "\(options.synchronous.rawValue)"])
            return Database(path: path, service: service, options: options, logger: logger, writer: writer, readers: readers, lock: lock)
        } catch {
            lock.release()
            throw error
        }
    }

    private static func configure(_ connection: Connection, options: Options, isWriter: Bool) throws {
        sqlite3_busy_timeout(connection.handle, Int32(clamping: options.busyTimeout.milliseconds))
        if isWriter {
            // The first statement that reads the file: a garbage file fails here with NOTADB.
            let mode = try connection.queryOne("PRAGMA journal_mode=WAL").flatMap { try $0.get(0, as: String?.self) }
            guard mode?.lowercased() == "wal" else {
                throw StorageError.cannotOpen(
                    path: connection.path,
                    reason: "cannot switch to WAL journal mode (got \(mode ?? "nothing")); the directory must be on a local file system"
                )
            }
        } else {
            // Readers cannot write, even by mistake: every write goes through the one writer.
            try connection.execute("PRAGMA query_only=ON")
        }
        // NORMAL in both modes: `.full` adds the WAL fsync itself, once per batch (group commit).
        try connection.execute("PRAGMA synchronous=NORMAL")
        try connection.execute("PRAGMA foreign_keys=ON")
    }

    /// Applies the migrations not yet recorded, in code order, each in its own transaction. With
    /// a `service`, first checks (and records, when missing) which service owns the database.
    private static func migrate(_ connection: Connection, migrations: [Migration], service: String?, logger: Logger) throws {
        var known = Set<String>()
        for migration in migrations {
            guard known.insert(migration.name).inserted else {
                throw StorageError.misuse("migration name \(migration.name) is listed twice")
            }
        }
        // Before anything is written: another service's tables must not get our migrations.
        let recorded = try service.flatMap { _ in try recordedService(connection) }
        if let service, let recorded, recorded != service {
            throw StorageError.wrongService(path: connection.path, expected: service, found: recorded)
        }
        try connection.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                name TEXT PRIMARY KEY NOT NULL,
                applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
            )
            """
        )
        let applied = try connection.query("SELECT name FROM schema_migrations ORDER BY rowid").map { try $0.get(0, as: String.self) }
        let unknown = applied.filter { !known.contains($0) }
        guard unknown.isEmpty else {
            throw StorageError.newerSchema(path: connection.path, unknownMigrations: unknown)
        }
        if let service, recorded == nil {
            _ = try runWrite(connection) { tx in
                try tx.execute(
                    "CREATE TABLE IF NOT EXISTS storage_metadata (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID")
                try tx.execute("INSERT OR IGNORE INTO storage_metadata (key, value) VALUES ('service', ?)", service)
            }
        }
        let done = Set(applied)
        for migration in migrations where !done.contains(migration.name) {
            do {
                _ = try runWrite(connection) { tx in
                    try migration.apply(tx)
                    try tx.execute("INSERT INTO schema_migrations(name) VALUES (?)", migration.name)
                }
            } catch {
                throw StorageError.migrationFailed(name: migration.name, reason: "\(error)")
            }
            logger.info("applied migration", metadata: ["migration": "\(migration.name)", "database": "\(connection.path)"])
        }
    }

    /// The service a database records as its owner (`storage_metadata`), nil when it records none
    /// (created by `open` without a schema, or before the record existed).
    static func recordedService(_ connection: Connection) throws -> String? {
        guard try connection.queryOne("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'storage_metadata'") != nil else {
            return nil
        }
        return try connection.queryOne("SELECT value FROM storage_metadata WHERE key = 'service'").map { try $0.get(0, as: String.self) }
    }

    /// The migrations a database records, in the order they were applied (none without the table).
    static func recordedMigrations(_ connection: Connection) throws -> [String] {
        guard try connection.queryOne("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'") != nil else {
            return []
        }
        return try connection.query("SELECT name FROM schema_migrations ORDER BY rowid").map { try $0.get(0, as: String.self) }
    }

    // MARK: Reading and writing

    /// Runs `body` on a reader thread inside one read transaction (a consistent snapshot, even
    /// while a write commits) and resumes the caller with its result.
    public func read<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        try await readers.run { connection in try Self.runRead(connection, body) }
    }

    /// Runs `body` on the writer thread as exactly one transaction: `BEGIN IMMEDIATE`, then
    /// `COMMIT` if it returns, `ROLLBACK` if it throws — nothing half-written.
    public func write<T: Sendable>(_ body: @escaping @Sendable (Transaction) throws -> T) async throws -> T {
        let signal = outboxSignal
        let commitDuration = metrics.commitDuration
        let start = ContinuousClock.now
        // The caller's span, for the outbox events the body queues (the body runs on the writer
        // thread, where the caller's task-locals are not).
        let trace = TraceContext.current
        return try await writer.run(afterSync: { result in
            commitDuration.record(start.duration(to: .now))
            if result.1 { signal.fire() }
        }) { connection in
            try Self.runWrite(connection, trace: trace, body)
        }.0
    }

    /// `read`, blocking the calling thread: for tests, tools and startup code, never an event loop.
    public func readSync<T>(_ body: (Connection) throws -> T) throws -> T {
        try readers.runSync { connection in try Self.runRead(connection, body) }
    }

    /// `write`, blocking the calling thread: for tests, tools and startup code, never an event loop.
    public func writeSync<T>(_ body: (Transaction) throws -> T) throws -> T {
        let start = ContinuousClock.now
        let trace = TraceContext.current
        let (value, enqueued) = try writer.runSync { connection in try Self.runWrite(connection, trace: trace, body) }
        metrics.commitDuration.record(start.duration(to: .now))
        if enqueued { outboxSignal.fire() }
        return value
    }

    /// A read on the writer thread that sees only durable commits (it waits for the pending
    /// group-commit fsync): what the outbox delivers from, so no peer ever acts on a commit that
    /// a power cut could still take back.
    func readDurable<T: Sendable>(_ body: @escaping @Sendable (Connection) throws -> T) async throws -> T {
        try await writer.run(durableBarrier: true, commits: false, bypassLimit: true) { connection in try Self.runRead(connection, body) }
    }

    static func runRead<T>(_ connection: Connection, _ body: (Connection) throws -> T) throws -> T {
        try connection.execute("BEGIN")
        defer { if connection.inTransaction { try? connection.execute("COMMIT") } }
        return try body(connection)
    }

    static func runWrite<T>(_ connection: Connection, trace: TraceContext? = nil, _ body: (Transaction) throws -> T) throws -> (T, Bool) {
        try connection.execute("BEGIN IMMEDIATE")
        let tx = Transaction(connection: connection, trace: trace)
        do {
            let value = try body(tx)
            tx.end()
            guard connection.inTransaction else {
                throw StorageError.misuse("the write body ended its transaction itself (COMMIT or ROLLBACK in SQL)")
            }
            try connection.execute("COMMIT")
            return (value, tx.enqueuedOutbox)
        } catch {
            tx.end()
            if connection.inTransaction { try? connection.execute("ROLLBACK") }
            throw error
        }
    }

    // MARK: Lifecycle

    /// The migrations recorded in this database, in the order they were applied.
    public func appliedMigrations() throws -> [String] {
        try readSync { c in try c.query("SELECT name FROM schema_migrations ORDER BY rowid").map { try $0.get(0, as: String.self) } }
    }

    /// Finishes queued work, closes every connection (checkpointing the WAL) and releases the
    /// process lock. Later calls throw `closed`. Idempotent; also done on deinit.
    public func close() {
        let first = isClosed.withLock { closed in
            defer { closed = true }
            return !closed
        }
        guard first else { return }
        readers.shutdown()
        writer.shutdown()
        metrics.sampleWAL()  // the last connection's close checkpoints and removes it, as a rule: 0
        lock.release()
    }
}
