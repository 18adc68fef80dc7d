import Foundation
import Logging
import RPCTransport
import ServiceKit
import Storage
import Tasks

// The reminder rows of scripts/bench (scripts/bench.d/reminders.sh runs this, release build):
//   tasks-bench reminders [N]   in-process, on a real tasks.sqlite in a temporary directory:
//     N chores (default 100,000) stored as before reminders existed, 1,000 due on every other day
//     from tomorrow on (N/1,000 due dates) in Europe/Berlin at the default 09:00; then
//     - backfill: opening TasksCore gives each its pending reminder (the upgrade path);
//     - idle pass: fireDueReminders() when nothing is due (what the scanner does on a wake-up
//       or a poll), wall time per pass over 200 passes (p50, mean);
//     - firing: the clock set to the instant 1,000 reminders are due, one pass fires them all
//       (each queues its TASK_REMINDER in the outbox and advances its row), three rounds: 09:00
//       on the 16th (1,000 due-day reminders), the 17th (their 1,000 overdue ones), the 18th
//       (the next 1,000 due-day ones); checked: exactly 1,000 sent and 1,000 outbox events each.
// Wall time (ContinuousClock): the work runs on the database's own threads. Every figure is
// printed as `key=value` lines for the script.

func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1e3 + Double(d.components.attoseconds) / 1e15 }

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("tasks-bench: \(message)\n".utf8))
    exit(1)
}

let args = CommandLine.arguments
guard args.count >= 2, args[1] == "reminders" else { fail("usage: tasks-bench reminders [N]") }
let total = args.count > 2 ? Int(args[2]) ?? 0 : 100_000
guard total >= 3000, total <= 10_000_000 else { fail("N must be 3,000 .. 10,000,000") }

var logger = Logger(label: "tasks-bench")
logger.logLevel = .warning
let dir = FileManager.default.temporaryDirectory.appendingPathComponent("tasks-bench-\(UUID().uuidString)").path
try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(atPath: dir) }

// 2027-03-15 06:00 UTC (07:00 in Berlin): the first chores are due the 16th at 09:00 (08:00 UTC).
let start = Int64(LocalDate(year: 2027, month: 3, day: 15).dayNumber) * 86_400_000 + 6 * 3_600_000
let clock = ManualClock(milliseconds: start)

// Seed the chores straight into SQLite (as a database of the version before reminders holds them).
let seedStart = ContinuousClock.now
do {
    let db = try Database.open(directory: dir, schema: TasksSchema.schema, logger: logger)
    try db.writeSync { tx in
        for i in 0..<total {
            let id = String(format: "ch%08d", i), household = String(format: "hh%06d", i / 4)
            let due = LocalDate(year: 2027, month: 3, day: 16).adding(days: 2 * (i % (total / 1000)))
            try tx.execute(
                """
                INSERT INTO chores (id, household_id, name, description, time_zone, recurrence, every_days, status, due_day, current_index,
                    current_user_id, revision, created_by, created_at)
                VALUES (?, ?, ?, '', 'Europe/Berlin', 2, 7, 1, ?, 0, ?, 1, ?, 0)
                """, id, household, "Chore \(i)", due.key, "u\(i % 5000)", "u\(i % 5000)")
            try tx.execute("INSERT INTO chore_assignees (chore_id, position, user_id) VALUES (?, 0, ?)", id, "u\(i % 5000)")
        }
    }
    db.close()
}
let seeded = ContinuousClock.now - seedStart

let peers = PeerClients(serviceToken: "bench") { _ in ChannelConfiguration(host: "127.0.0.1", port: 9) }  // never called
let openStart = ContinuousClock.now
let core = try TasksCore(configuration: TasksConfiguration(dataDirectory: dir), peers: peers, clock: clock, logger: logger)
let backfill = ContinuousClock.now - openStart
let pending = try core.database.readSync { c in
    try c.queryOne("SELECT COUNT(*) FROM reminders WHERE fire_at IS NOT NULL")?.get(0, as: Int64.self) ?? 0
}
guard pending == Int64(total) else { fail("\(pending) pending reminders after the backfill, expected \(total)") }

// Idle passes: nothing is due.
var idle: [Double] = []
for _ in 0..<200 {
    let t = ContinuousClock.now
    let pass = try await core.fireDueReminders()
    idle.append(ms(ContinuousClock.now - t))
    guard pass.handled == 0 else { fail("an idle pass handled \(pass.handled)") }
}
idle.sort()

// Firing rounds: 1,000 due at once.
var firing: [Double] = []
for round in 0..<3 {
    let day = LocalDate(year: 2027, month: 3, day: 16).adding(days: round)
    clock.set(milliseconds: Int64(day.dayNumber) * 86_400_000 + 8 * 3_600_000)  // 09:00 CET
    let before = try core.database.readSync { c in try c.queryOne("SELECT COUNT(*) FROM outbox")?.get(0, as: Int64.self) ?? 0 }
    let t = ContinuousClock.now
    let pass = try await core.fireDueReminders()
    firing.append(ms(ContinuousClock.now - t))
    let after = try core.database.readSync { c in try c.queryOne("SELECT COUNT(*) FROM outbox")?.get(0, as: Int64.self) ?? 0 }
    guard pass.sent == 1000, after - before == 1000 else { fail("round \(round): sent \(pass.sent), \(after - before) outbox events") }
}
core.close()
await peers.close()

print("reminders_chores=\(total)")
print(String(format: "reminders_seed_s=%.1f", ms(seeded) / 1000))
print(String(format: "reminders_backfill_s=%.2f", ms(backfill) / 1000))
print(String(format: "reminders_idle_pass_p50_us=%.0f", idle[idle.count / 2] * 1000))
print(String(format: "reminders_idle_pass_mean_us=%.0f", idle.reduce(0, +) / Double(idle.count) * 1000))
print(String(format: "reminders_fire_1000_ms=%.1f", firing.reduce(0, +) / Double(firing.count)))
print("reminders_fire_1000_rounds_ms=\(firing.map { String(format: "%.1f", $0) }.joined(separator: ","))")
