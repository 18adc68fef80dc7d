internal import CSQLite

/// One SQLite connection with its prepared-statement cache.
///
/// A connection belongs to one worker thread of a `Database` (SQLite is opened in multi-thread
/// mode, without its own mutexes): it is lent to a `read` or `write` body for the duration of the
/// call and must not escape it. It is deliberately not `Sendable`.
public final class Connection {
    let handle: OpaquePointer
    /// The database file.
    public let path: String
    private var statements: [String: Statement] = [:]
    /// Dynamically built SQL (IN lists of varying length) must not grow the cache without bound.
    static let statementCacheLimit = 256

    /// - Parameter readOnly: open an existing file without ever writing it (backups read a
    ///   running service's file this way); otherwise read-write, creating the file.
    init(path: String, readOnly: Bool = false) throws {
        var db: OpaquePointer?
        let flags = readOnly ? SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let reason = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close_v2(db)
            throw StorageError.cannotOpen(path: path, reason: reason)
        }
        sqlite3_extended_result_codes(db, 1)
        self.handle = db
        self.path = path
    }

    private var isClosed = false

    deinit { close() }

    /// Finalizes the cached statements and closes the handle (idempotent).
    func close() {
        guard !isClosed else { return }
        isClosed = true
        statements.removeAll()  // finalize before closing
        sqlite3_close_v2(handle)
    }

    /// fsyncs the write-ahead log through SQLite's own file handle (group commit).
    func syncWAL() -> StorageError? {
        let rc = csqlite_sync_wal(handle)
        guard rc != SQLITE_OK else { return nil }
        return .sqlite(code: rc, message: "fsync of the write-ahead log failed: the last commits may not be durable (check the disk)", sql: nil)
    }

    // MARK: Statements

    /// Runs one statement, discarding any rows.
    public func execute(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws {
        _ = try run(sql, Self.values(arguments), collect: false)
    }

    /// Runs one statement with arguments given as values.
    public func execute(_ sql: String, arguments: [DatabaseValue]) throws {
        _ = try run(sql, arguments, collect: false)
    }

    /// Runs one statement and returns all its rows.
    public func query(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> [Row] {
        try run(sql, Self.values(arguments), collect: true)
    }

    public func query(_ sql: String, arguments: [DatabaseValue]) throws -> [Row] {
        try run(sql, arguments, collect: true)
    }

    /// The first row, or nil when there is none.
    public func queryOne(_ sql: String, _ arguments: (any DatabaseValueConvertible)?...) throws -> Row? {
        try run(sql, Self.values(arguments), collect: true, limit: 1).first
    }

    public func queryOne(_ sql: String, arguments: [DatabaseValue]) throws -> Row? {
        try run(sql, arguments, collect: true, limit: 1).first
    }

    /// Runs several `;`-separated statements without arguments (migrations, scripts).
    public func executeScript(_ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(handle, sql, nil, nil, &message)
        if rc != SQLITE_OK {
            let text = message.map { String(cString: $0) }
            sqlite3_free(message)
            throw error(rc, sql: sql, message: text)
        }
    }

    /// The rowid of the last row inserted on this connection.
    public var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// Rows changed by the last INSERT, UPDATE or DELETE on this connection.
    public var changes: Int { Int(sqlite3_changes64(handle)) }

    /// True while a transaction is open on this connection.
    var inTransaction: Bool { sqlite3_get_autocommit(handle) == 0 }

    static func values(_ arguments: [(any DatabaseValueConvertible)?]) -> [DatabaseValue] {
        arguments.map { $0?.databaseValue ?? .null }
    }

    // MARK: Execution

    private func statement(for sql: String) throws -> Statement {
        if let cached = statements[sql] { return cached }
        var raw: OpaquePointer?
        // `tail` points into the C string, which lives only inside withCString: look at it there.
        let (rc, trailing) = try sql.withCString { text -> (Int32, Bool) in
            var tail: UnsafePointer<CChar>?
            let rc = sqlite3_prepare_v3(handle, text, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &raw, &tail)
            guard rc == SQLITE_OK, let tail, tail.pointee != 0 else { return (rc, false) }
            return (rc, try hasStatement(tail))
        }
        guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
        guard let raw else { throw StorageError.misuse("no statement in SQL: \(sql)") }
        let statement = Statement(handle: raw)
        if trailing {
            throw StorageError.misuse("several statements in one execute/query (use executeScript): \(sql)")
        }
        if statements.count >= Self.statementCacheLimit { statements.removeAll() }
        statements[sql] = statement
        return statement
    }

    /// Whether the rest of an SQL string holds another statement (and not just whitespace or comments).
    private func hasStatement(_ tail: UnsafePointer<CChar>) throws -> Bool {
        var raw: OpaquePointer?
        let rc = sqlite3_prepare_v2(handle, tail, -1, &raw, nil)
        defer { sqlite3_finalize(raw) }
        return rc != SQLITE_OK || raw != nil
    }

    func run(_ sql: String, _ arguments: [DatabaseValue], collect: Bool, limit: Int = .max) throws -> [Row] {
        let statement = try statement(for: sql)
        let stmt = statement.handle
        defer {
            // Reset at once: a statement left mid-step would keep its read snapshot (and WAL pages) alive.
            sqlite3_reset(stmt)
            sqlite3_clear_bindings(stmt)
        }
        guard arguments.count == statement.parameterCount else {
            throw StorageError.misuse("statement expects \(statement.parameterCount) arguments, got \(arguments.count): \(sql)")
        }
        for (i, value) in arguments.enumerated() {
            let rc = bind(value, at: Int32(i + 1), in: stmt)
            guard rc == SQLITE_OK else { throw error(rc, sql: sql) }
        }
        var rows: [Row] = []
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { break }
            guard rc == SQLITE_ROW else { throw error(rc, sql: sql) }
            guard collect else { continue }
            rows.append(readRow(stmt, columns: statement.columns))
            if rows.count >= limit { break }
        }
        return rows
    }

    private func bind(_ value: DatabaseValue, at index: Int32, in stmt: OpaquePointer) -> Int32 {
        switch value {
        case .null:
            return sqlite3_bind_null(stmt, index)
        case .integer(let v):
            return sqlite3_bind_int64(stmt, index, v)
        case .real(let v):
            return sqlite3_bind_double(stmt, index, v)
        case .text(let s):
            var s = s
            // An empty buffer may have no base address, and a NULL pointer would bind NULL.
            if s.isEmpty { return csqlite_bind_text(stmt, index, "", 0) }
            return s.withUTF8 { utf8 in
                utf8.withMemoryRebound(to: CChar.self) { chars in
                    csqlite_bind_text(stmt, index, chars.baseAddress, Int32(chars.count))
                }
            }
        case .blob(let bytes):
            return bytes.withUnsafeBytes { raw in
                csqlite_bind_blob(stmt, index, raw.baseAddress, Int32(raw.count))
            }
        }
    }

    private func readRow(_ stmt: OpaquePointer, columns: ColumnNames) -> Row {
        let count = Int32(columns.names.count)
        var values: [DatabaseValue] = []
        values.reserveCapacity(Int(count))
        for i in 0..<count {
            switch sqlite3_column_type(stmt, i) {
            case SQLITE_INTEGER:
                values.append(.integer(sqlite3_column_int64(stmt, i)))
            case SQLITE_FLOAT:
                values.append(.real(sqlite3_column_double(stmt, i)))
            case SQLITE_TEXT:
                let bytes = sqlite3_column_text(stmt, i)
                let n = Int(sqlite3_column_bytes(stmt, i))
                let text = bytes.map { String(decoding: UnsafeBufferPointer(start: $0, count: n), as: UTF8.self) } ?? ""
                values.append(.text(text))
            case SQLITE_BLOB:
                let bytes = sqlite3_column_blob(stmt, i)
                let n = Int(sqlite3_column_bytes(stmt, i))
                let blob = bytes.map { Array(UnsafeRawBufferPointer(start: $0, count: n)) } ?? []
                values.append(.blob(blob))
            default:
                values.append(.null)
            }
        }
        return Row(values: values, columns: columns)
    }

    // MARK: Errors

    /// Maps an SQLite result code to a `StorageError`, naming the columns of a unique violation.
    func error(_ rc: Int32, sql: String?, message: String? = nil) -> StorageError {
        let extended = sqlite3_extended_errcode(handle)
        let code = (rc & 0xFF) == (extended & 0xFF) ? extended : rc
        let text = message ?? String(cString: sqlite3_errmsg(handle))
        switch code & 0xFF {
        case SQLITE_CONSTRAINT:
            if code == Self.constraintUnique || code == Self.constraintPrimaryKey {
                return Self.uniqueViolation(from: text)
            }
            return .constraintViolation(message: text)
        case SQLITE_BUSY, SQLITE_LOCKED:
            return .busy(message: text)
        case SQLITE_FULL:
            return .diskFull(path: path)
        case SQLITE_NOTADB:
            return .notADatabase(path: path)
        case SQLITE_CORRUPT:
            return .corrupt(path: path, message: text)
        case SQLITE_CANTOPEN:
            return .cannotOpen(path: path, reason: text)
        default:
            return .sqlite(code: code, message: text, sql: sql)
        }
    }

    // Extended codes are `SQLITE_CONSTRAINT | (n << 8)`; spelled out to not depend on macro import.
    static let constraintUnique: Int32 = 19 | (8 << 8)
    static let constraintPrimaryKey: Int32 = 19 | (6 << 8)

    /// Parses "UNIQUE constraint failed: users.email, users.tenant" or "…: index 'users_email_ci'".
    static func uniqueViolation(from message: String) -> StorageError {
        guard let colon = message.range(of: "failed: ") else { return .uniqueViolation(columns: [], index: nil) }
        let rest = message[colon.upperBound...]
        if rest.hasPrefix("index ") {
            let name = rest.dropFirst("index ".count).trimmingCharacters(in: "'\"")
            return .uniqueViolation(columns: [], index: name)
        }
        let columns = rest.split(separator: ",").map { $0.trimmingCharacters(in: " ") }
        return .uniqueViolation(columns: columns, index: nil)
    }
}

extension Substring {
    fileprivate func trimmingCharacters(in set: String) -> String {
        var s = self
        while let f = s.first, set.contains(f) { s.removeFirst() }
        while let l = s.last, set.contains(l) { s.removeLast() }
        return String(s)
    }
}

/// A prepared statement, finalized when the cache drops it.
final class Statement {
    let handle: OpaquePointer
    let parameterCount: Int
    let columns: ColumnNames

    init(handle: OpaquePointer) {
        self.handle = handle
        self.parameterCount = Int(sqlite3_bind_parameter_count(handle))
        let n = sqlite3_column_count(handle)
        self.columns = ColumnNames((0..<n).map { i in sqlite3_column_name(handle, i).map { String(cString: $0) } ?? "" })
    }

    deinit { sqlite3_finalize(handle) }
}
