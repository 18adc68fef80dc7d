import Foundation
import Testing

@testable import Storage

@Suite(.serialized) struct CrashDurabilityTests {
    /// A child commits rows one transaction at a time and prints "ack n" after each commit
    /// returned; it is SIGKILLed mid-stream. Every acknowledged row must be there after reopening.
    @Test(arguments: ["full", "normal"]) func acknowledgedWritesSurviveKill9(mode: String) throws {
        let dir = TempDirectory()
        defer { dir.cleanup() }
        let child = try ChildProcess(crashHelperPath(), [dir.path, mode])
        let lines = child.readLines { $0 == "ack 300" }
        child.kill(SIGKILL)
        let acked = lines.compactMap { $0.hasPrefix("ack ") ? Int($0.dropFirst(4)) : nil }.max() ?? 0
        try #require(acked >= 300, "child output: \(lines.suffix(3))")
        #expect(child.process.terminationReason == .uncaughtSignal)

        let db = try Database.openQuiet(
            directory: dir.path, fileName: "crash.sqlite",
            migrations: [
                Migration(name: "001-acks", sql: "CREATE TABLE acks (id INTEGER PRIMARY KEY, payload BLOB NOT NULL)")
            ])
        defer { db.close() }
        let (count, maxID, integrity) = try db.readSync { c in
            (
                try c.queryOne("SELECT count(*) FROM acks WHERE id <= ?", acked)!.get(0, as: Int.self),
                try c.queryOne("SELECT max(id) FROM acks")!.get(0, as: Int.self),
                try c.query("PRAGMA integrity_check").map { try $0.get(0, as: String.self) }
            )
        }
        #expect(count == acked)
        #expect(maxID >= acked)  // possibly one more: committed, killed before printing
        #expect(integrity == ["ok"])
        print("storage crash test (\(mode)): \(acked) acknowledged rows before SIGKILL, \(maxID) rows after reopening, integrity ok")
    }
}
