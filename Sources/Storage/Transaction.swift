import Observability

/// The one write transaction of a `Database.write` call (`BEGIN IMMEDIATE … COMMIT`).
///
/// Everything done through it commits together, or — when the body throws — nothing does. It is
/// only valid inside the body it was passed to; using it afterwards throws `misuse`.
public final class Transaction {
    let connection: Connection
    private(set) var isActive = true
    /// Set when the body queued outbox events, so the database can wake the delivery loop on commit.
    var enqueuedOutbox = false
    /// The trace context of the task that asked for this write (`TraceContext.current` there):
    /// what the outbox events queued here keep (`enqueueOutbox`).
    let trace: TraceContext?

    init(connection: Connection, trace: TraceContext? = nil) {
        self.connection = connection
        self.trace = trace
    }

    func end() { isActive = false }

    private func live() throws -> Connection {
        guard isActive else { throw StorageError.misuse("transaction used after its write body returned") }
        return connection
    }

    /// The database file.
    public var path: String { connection.path }

    public func execute(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws {
        try live().execute(sql, arguments: Connection.values(arguments))
    }

    public func execute(_ sql: String, arguments: [DatabaseValue]) throws {
        try live().execute(sql, arguments: arguments)
    }

    public func query(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> [Row] {
        try live().query(sql, arguments: Connection.values(arguments))
    }

    public func query(_ sql: String, arguments: [DatabaseValue]) throws -> [Row] {
        try live().query(sql, arguments: arguments)
    }

    public func queryOne(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> Row? {
        try live().queryOne(sql, arguments: Connection.values(arguments))
    }

    public func queryOne(_ sql: String, arguments: [DatabaseValue]) throws -> Row? {
        try live().queryOne(sql, arguments: arguments)
    }

    /// Several `;`-separated statements without arguments (migrations).
    public func executeScript(_ sql: String) throws {
        try live().executeScript(sql)
    }

    /// The rowid of the last row inserted in this transaction.
    public var lastInsertRowID: Int64 { connection.lastInsertRowID }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    public var changes: Int { connection.changes }
}

/// What both reads (`Connection`) and writes (`Transaction`) can query, so a store's lookups are
/// written once and used inside either.
public protocol SQLReader {
    func query(_ sql: String, arguments: [DatabaseValue]) throws -> [Row]
    func queryOne(_ sql: String, arguments: [DatabaseValue]) throws -> Row?
}

extension SQLReader {
    public func query(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> [Row] {
        try query(sql, arguments: Connection.values(arguments))
    }

    public func queryOne(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> Row? {
        try queryOne(sql, arguments: Connection.values(arguments))
    }
}

extension Connection: SQLReader {}
extension Transaction: SQLReader {}
