/// The column names of one prepared statement, shared by every row it produces.
final class ColumnNames: Sendable {
    let names: [String]
    let indexByName: [String: Int]

    init(_ names: [String]) {
        self.names = names
        var map: [String: Int] = [:]
        // The first column wins on duplicates, as SQLite's own name lookup does.
        for (i, n) in names.enumerated() where map[n.lowercased()] == nil { map[n.lowercased()] = i }
        self.indexByName = map
    }
}

/// One result row, fully read out of SQLite (no live statement behind it), so it is `Sendable` and
/// may be returned from `Database.read` to any task.
public struct Row: Sendable, CustomStringConvertible {
    public let values: [DatabaseValue]
    let columns: ColumnNames

    init(values: [DatabaseValue], columns: ColumnNames) {
        self.values = values
        self.columns = columns
    }

    public var count: Int { values.count }
    public var columnNames: [String] { columns.names }

    /// The raw value at a column index (0-based).
    public subscript(index: Int) -> DatabaseValue { values[index] }

    /// The raw value of a named column (case-insensitive, as SQL names are), or nil if absent.
    public subscript(name: String) -> DatabaseValue? {
        columns.indexByName[name.lowercased()].map { values[$0] }
    }

    /// The value at `index` as `T`; a stored class that does not fit throws `typeMismatch`.
    public func get<T: DatabaseValueConvertible>(_ index: Int, as type: T.Type = T.self) throws -> T {
        guard index >= 0, index < values.count else {
            throw StorageError.noSuchColumn("#\(index)")
        }
        guard let v = T(databaseValue: values[index]) else {
            throw StorageError.typeMismatch(column: columns.names[index], expected: "\(T.self)", actual: values[index].typeName)
        }
        return v
    }

    /// The value of the named column as `T`.
    public func get<T: DatabaseValueConvertible>(_ name: String, as type: T.Type = T.self) throws -> T {
        guard let index = columns.indexByName[name.lowercased()] else { throw StorageError.noSuchColumn(name) }
        return try get(index, as: type)
    }

    public var description: String {
        "[" + zip(columns.names, values).map { "\($0)=\($1)" }.joined(separator: ", ") + "]"
    }
}
