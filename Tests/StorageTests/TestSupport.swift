import Foundation
import Logging
import Storage

/// A fresh directory under the system temp dir, removed by `cleanup()`.
struct TempDirectory {
    let path: String

    init() {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("storage-tests-\(UUID().uuidString)").path
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func cleanup() { try? FileManager.default.removeItem(atPath: path) }

    func file(_ name: String) -> String { path + "/" + name }
}

/// The `storage-crash-helper` executable, built next to the test bundle.
func crashHelperPath() -> String {
    let exe = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")) ?? CommandLine.arguments[0]
    var dir = URL(fileURLWithPath: exe).deletingLastPathComponent()
    // Inside an .xctest bundle directory on some platforms: climb out of it.
    while dir.path.contains(".xctest") { dir = dir.deletingLastPathComponent() }
    return dir.appendingPathComponent("storage-crash-helper").path
}

/// A child process whose stdout is read line by line.
final class ChildProcess {
    let process = Process()
    private let pipe = Pipe()
    private var buffer = Data()

    init(_ executable: String, _ arguments: [String]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        process.standardOutput = pipe
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }

    /// Reads lines until `stop` returns true or the stream ends; returns every line read.
    func readLines(until stop: (String) -> Bool) -> [String] {
        var lines: [String] = []
        while true {
            while let nl = buffer.firstIndex(of: 0x0A) {
                let line = String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self)
                buffer = Data(buffer[buffer.index(after: nl)...])
                lines.append(line)
                if stop(line) { return lines }
            }
            let chunk = pipe.fileHandleForReading.availableData
            if chunk.isEmpty { return lines }  // EOF
            buffer.append(chunk)
        }
    }

    func kill(_ signal: Int32 = SIGKILL) {
        Foundation.kill(process.processIdentifier, signal)
        process.waitUntilExit()
    }
}

let testMigrations = [
    Migration(name: "001-users", sql: "CREATE TABLE users (id INTEGER PRIMARY KEY, email TEXT NOT NULL UNIQUE, name TEXT)"),
    Migration(
        name: "002-notes",
        sql: """
            CREATE TABLE notes (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id), body TEXT NOT NULL);
            CREATE INDEX notes_user ON notes(user_id);
            """),
]

extension Database {
    /// `open` with a logger that only prints warnings, so test output stays readable.
    static func openQuiet(
        directory: String, fileName: String, migrations: [Migration], options: Options = Options()
    ) throws -> Database {
        var logger = Logger(label: "storage-test")
        logger.logLevel = .warning
        return try open(directory: directory, fileName: fileName, migrations: migrations, options: options, logger: logger)
    }

    /// `open(directory:schema:)`, as quietly.
    static func openQuiet(directory: String, schema: DatabaseSchema) throws -> Database {
        var logger = Logger(label: "storage-test")
        logger.logLevel = .warning
        return try open(directory: directory, schema: schema, logger: logger)
    }
}
