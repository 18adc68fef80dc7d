import RPCCore

/// Everything that can go wrong in the storage layer, as values a service can match on.
///
/// `description` is written for the operator (it names the file and what to do); `rpcError` is what
/// a client may see: startup failures keep the operator text (no client ever sees them), runtime
/// internals become a generic message so SQL and paths do not leak onto the wire.
public enum StorageError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The file could not be opened or created (permissions, a directory in its place, no disk).
    case cannotOpen(path: String, reason: String)
    /// The file exists but is not an SQLite database (garbage, encrypted, or truncated header).
    case notADatabase(path: String)
    /// Another process owns this database (its `<file>.lock` is held); `holder` is its pid if known.
    case locked(path: String, holder: String?)
    /// The database records migrations this code does not know: it was written by a newer version.
    case newerSchema(path: String, unknownMigrations: [String])
    /// The database records another service as its owner (a file copied or restored into the
    /// wrong data directory): nothing was migrated.
    case wrongService(path: String, expected: String, found: String)
    /// A migration failed; its transaction was rolled back and the service must not start.
    case migrationFailed(name: String, reason: String)
    /// A UNIQUE or PRIMARY KEY constraint failed. `columns` are `table.column` as SQLite names them;
    /// `index` is set instead when the constraint is an expression index (`lower(email)`).
    case uniqueViolation(columns: [String], index: String?)
    /// Another constraint failed (FOREIGN KEY, CHECK, NOT NULL): a bug or a race the caller lost.
    case constraintViolation(message: String)
    /// The database stayed locked longer than the busy timeout.
    case busy(message: String)
    /// The disk (or the file-size limit) is full.
    case diskFull(path: String)
    /// SQLite detected corruption while reading.
    case corrupt(path: String, message: String)
    /// A column did not hold the type the caller asked for.
    case typeMismatch(column: String, expected: String, actual: String)
    /// A row has no column with that name.
    case noSuchColumn(String)
    /// Any other SQLite failure (syntax errors, I/O errors): the extended result code and message.
    case sqlite(code: Int32, message: String, sql: String?)
    /// The API was used in a way that cannot work (wrong argument count, nested `writeSync`, …).
    case misuse(String)
    /// The database was closed.
    case closed
    /// Too many jobs wait for the database threads already: the request is shed at once rather
    /// than queued behind them (the caller retries shortly).
    case overloaded(queued: Int)

    public var description: String {
        switch self {
        case .cannotOpen(let path, let reason):
            return
                "cannot open database \(path): \(reason). Check that the data directory exists, is writable by this user, and that the path is a file."
        case .notADatabase(let path):
            return
                "\(path) is not an SQLite database (garbage, encrypted or truncated). Move it aside and restore the latest backup, or point --data-dir at the right directory."
        case .locked(let path, let holder):
            let who = holder.map { "process \($0)" } ?? "another process"
            return
                "database \(path) is in use by \(who) (its lock file \(path).lock is held). Stop the other instance, or give this one its own --data-dir."
        case .newerSchema(let path, let unknown):
            return
                "database \(path) was migrated by a newer version of this service (unknown migrations: \(unknown.joined(separator: ", "))). Refusing to start so the data is not damaged: run the newer version, or restore a backup taken before the upgrade."
        case .wrongService(let path, let expected, let found):
            return
                "database \(path) belongs to the \(found) service, not \(expected). Refusing to start so neither is damaged: point --data-dir at \(expected)'s own directory, or restore a backup of \(expected)."
        case .migrationFailed(let name, let reason):
            return
                "migration \(name) failed and was rolled back: \(reason). Fix the migration or the data; the service cannot start on a half-migrated schema."
        case .uniqueViolation(let columns, let index):
            if let index { return "unique constraint failed: index \(index)" }
            return "unique constraint failed: \(columns.joined(separator: ", "))"
        case .constraintViolation(let message):
            return "constraint failed: \(message)"
        case .busy(let message):
            return "database busy (locked longer than the busy timeout): \(message)"
        case .diskFull(let path):
            return "disk full while writing \(path): free space on its volume; writes fail until then, reads still work."
        case .corrupt(let path, let message):
            return
                "database \(path) is corrupt (\(message)). Stop the service, run `sqlite3 \(path) 'PRAGMA integrity_check'`, and restore the latest backup."
        case .typeMismatch(let column, let expected, let actual):
            return "column \(column) holds \(actual), not \(expected)"
        case .noSuchColumn(let name):
            return "no column named \(name) in the result row"
        case .sqlite(let code, let message, let sql):
            return "sqlite error \(code): \(message)" + (sql.map { " in: \($0)" } ?? "")
        case .misuse(let message):
            return "storage misuse: \(message)"
        case .closed:
            return "the database is closed"
        case .overloaded(let queued):
            return "storage overloaded: \(queued) jobs already wait for the database threads"
        }
    }

    /// The error a client sees. Services map `uniqueViolation` themselves when they can name the
    /// field; this default still yields ALREADY_EXISTS.
    public var rpcError: RPCError {
        switch self {
        case .cannotOpen, .notADatabase, .newerSchema, .wrongService, .migrationFailed:
            return RPCError(.internal, description)
        case .locked:
            return RPCError(.unavailable, description)
        case .uniqueViolation(let columns, let index):
            let names = columns.map { $0.split(separator: ".").last.map(String.init) ?? $0 }
            if names.isEmpty || index != nil { return RPCError(.alreadyExists, "a record with the same key already exists") }
            return RPCError(.alreadyExists, "a record with the same \(names.joined(separator: ", ")) already exists")
        case .busy:
            return RPCError(.unavailable, "storage is busy; retry shortly")
        case .diskFull:
            return RPCError(.unavailable, "storage is full; retry later")
        case .closed:
            return RPCError(.unavailable, "the service is shutting down; retry")
        case .overloaded:
            var trailers = Metadata()
            trailers.add("retry-after", "1")
            return RPCError(.unavailable, "the service is overloaded; retry in a second", trailers: trailers)
        case .corrupt, .constraintViolation, .typeMismatch, .noSuchColumn, .sqlite, .misuse:
            return RPCError(.internal, "internal storage error")
        }
    }
}

extension RPCError {
    /// Converts a storage failure to the one error type that reaches the wire.
    public init(_ error: StorageError) { self = error.rpcError }
}
