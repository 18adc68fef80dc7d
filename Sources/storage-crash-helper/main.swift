import Logging
import Storage

// Test helper for StorageTests' crash-durability and backup tests: writes acknowledged rows until
// killed.
//
// usage: storage-crash-helper <directory> [normal|full]
// Opens <directory>/crash.sqlite through Storage (as the service "crash") and commits one row per
// transaction, printing "ack <n>" only after the commit returned. The crash test SIGKILLs it
// mid-stream and checks that every acknowledged row survived; the backup tests copy its database
// while it writes.
#if canImport(Glibc)
import Glibc
#endif

/// Unbuffered: a line is in the pipe before the next commit starts.
func emit(_ line: String, to fd: Int32 = 1) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
}

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    emit("usage: storage-crash-helper <directory> [normal|full]", to: 2)
    exit(2)
}
let synchronous: Database.Options.Synchronous = arguments.count > 2 && arguments[2] == "normal" ? .normal : .full
do {
    let db = try Database.open(
        directory: arguments[1],
        schema: DatabaseSchema(
            service: "crash", migrations: [Migration(name: "001-acks", sql: "CREATE TABLE acks (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")]),
        options: Database.Options(synchronous: synchronous),
        logger: Logger(label: "storage-crash-helper", factory: { _ in SwiftLogNoOpLogHandler() })
    )
    emit("ready")
    let payload = [UInt8](repeating: 0xAB, count: 512)
    var n = 0
    while true {
        n += 1
        let id = n
        try db.writeSync { tx in try tx.execute("INSERT INTO acks (id, payload) VALUES (?, ?)", id, payload) }
        emit("ack \(id)")
    }
} catch {
    emit("storage-crash-helper: \(error)", to: 2)
    exit(1)
}
