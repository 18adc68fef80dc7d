/// One SQLite value: the five storage classes SQLite has.
public enum DatabaseValue: Sendable, Hashable, CustomStringConvertible {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])

    /// The storage class name, for error messages.
    public var typeName: String {
        switch self {
        case .null: "NULL"
        case .integer: "INTEGER"
        case .real: "REAL"
        case .text: "TEXT"
        case .blob: "BLOB"
        }
    }

    public var description: String {
        switch self {
        case .null: "NULL"
        case .integer(let v): String(v)
        case .real(let v): String(v)
        case .text(let v): "'\(v)'"
        case .blob(let v): "<\(v.count) bytes>"
        }
    }
}

/// A Swift type that binds to a statement parameter and reads back from a column.
///
/// `init?(databaseValue:)` returns nil when the stored class does not fit, which the row accessors
/// turn into `StorageError.typeMismatch` naming the column.
public protocol DatabaseValueConvertible: Sendable {
    var databaseValue: DatabaseValue { get }
    init?(databaseValue: DatabaseValue)
}

extension DatabaseValue: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { self }
    public init?(databaseValue: DatabaseValue) { self = databaseValue }
}

extension Int64: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .integer(self) }
    public init?(databaseValue: DatabaseValue) {
        guard case .integer(let v) = databaseValue else { return nil }
        self = v
    }
}

extension Int: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .integer(Int64(self)) }
    public init?(databaseValue: DatabaseValue) {
        guard case .integer(let v) = databaseValue, let i = Int(exactly: v) else { return nil }
        self = i
    }
}

extension Int32: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .integer(Int64(self)) }
    public init?(databaseValue: DatabaseValue) {
        guard case .integer(let v) = databaseValue, let i = Int32(exactly: v) else { return nil }
        self = i
    }
}

extension Double: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .real(self) }
    /// Integers read as doubles: SQLite stores integral REAL values in REAL columns as integers.
    public init?(databaseValue: DatabaseValue) {
        switch databaseValue {
        case .real(let v): self = v
        case .integer(let v): self = Double(v)
        default: return nil
        }
    }
}

extension Bool: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .integer(self ? 1 : 0) }
    public init?(databaseValue: DatabaseValue) {
        guard case .integer(let v) = databaseValue else { return nil }
        self = v != 0
    }
}

extension String: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .text(self) }
    public init?(databaseValue: DatabaseValue) {
        guard case .text(let v) = databaseValue else { return nil }
        self = v
    }
}

extension Substring: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue { .text(String(self)) }
    public init?(databaseValue: DatabaseValue) {
        guard case .text(let v) = databaseValue else { return nil }
        self = Substring(v)
    }
}

extension Array: DatabaseValueConvertible where Element == UInt8 {
    public var databaseValue: DatabaseValue { .blob(self) }
    /// TEXT reads as its UTF-8 bytes, so a column written by the `sqlite3` shell still decodes.
    public init?(databaseValue: DatabaseValue) {
        switch databaseValue {
        case .blob(let v): self = v
        case .text(let s): self = Array(s.utf8)
        default: return nil
        }
    }
}

extension Optional: DatabaseValueConvertible where Wrapped: DatabaseValueConvertible {
    public var databaseValue: DatabaseValue {
        switch self {
        case .none: .null
        case .some(let v): v.databaseValue
        }
    }
    public init?(databaseValue: DatabaseValue) {
        if case .null = databaseValue {
            self = .none
            return
        }
        guard let v = Wrapped(databaseValue: databaseValue) else { return nil }
        self = .some(v)
    }
}
