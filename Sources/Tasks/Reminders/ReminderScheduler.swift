import Contracts
import Foundation
import ServiceKit
import Storage
import Synchronization

/// Set by a write that changed a pending reminder, taken by the scanner (it then reads the
/// earliest pending instant again instead of sleeping on the old one).
final class ReminderSignal: Sendable {
    private let flag = Atomic<Bool>(false)
    func raise() { flag.store(true, ordering: .releasing) }
    func take() -> Bool { flag.exchange(false, ordering: .acquiringAndReleasing) }
}

/// What one scan did.
public struct ReminderPass: Sendable, Equatable {
    /// Notifications queued (to social, through the outbox).
    public var sent = 0
    /// Occurrences more than `ReminderRules.staleAfterMilliseconds` late, dropped.
    public var stale = 0
    /// Occurrences with nothing to send: a habit already done that day, a chore that changed
    /// without its row following, an event id queued before.
    public var skipped = 0
    /// Transactions written.
    public var batches = 0

    public var handled: Int { sent + stale + skipped }
}

/// The reminder scanner: sleeps until the earliest pending instant (`reminders_due`), or until a
/// write raises the signal, or at most `reminderPoll`; then fires every due row. Firing one
/// occurrence is one transaction (a batch of them shares it) that queues the TASK_REMINDER
/// notification in the outbox with a deterministic event id and advances the row: a crash before
/// the commit fires it at the next start, a crash after it never fires it again, and social's
/// receiveOnce drops a redelivery.
extension TasksCore {
    /// Wakes the scanner after a write that may have moved a reminder earlier.
    func remindersChanged() { reminderSignal.raise() }

    /// The background loop (one per process: `backgroundJobs`).
    func runReminders() async {
        let tick = configuration.reminderTick, poll = configuration.reminderPoll
        var earliest: Int64? = nil
        var lastLook: ContinuousClock.Instant? = nil
        while !Task.isCancelled {
            let woken = reminderSignal.take()
            let due = earliest.map { $0 <= now } ?? false
            if woken || due || lastLook.map({ $0.duration(to: .now) >= poll }) ?? true {
                lastLook = .now
                do {
                    let pass = try await fireDueReminders()
                    if pass.handled > 0 {
                        logger.info("reminders fired", metadata: ["sent": "\(pass.sent)", "stale": "\(pass.stale)", "skipped": "\(pass.skipped)"])
                    }
                    earliest = try await read { c in try ReminderStore.earliest(c) }
                } catch {
                    logger.error("reminder scan failed", metadata: ["error": "\(error)"])
                    earliest = now + 5000  // try again in 5 s
                }
            }
            try? await Task.sleep(for: tick)
        }
    }

    /// Fires every reminder due at the clock's now, `reminderBatch` rows per transaction (the last
    /// one finds none), and returns what it did. Safe to run concurrently with writes (rows are read again inside
    /// each write transaction) and with itself.
    @discardableResult
    public func fireDueReminders() async throws -> ReminderPass {
        var total = ReminderPass()
        let limit = configuration.reminderBatch, core = self
        for _ in 0..<10_000 {
            let now = self.now
            let batch = try await write { tx in try Self.fireBatch(tx, core, now: now, limit: limit) }
            total.sent += batch.pass.sent
            total.stale += batch.pass.stale
            total.skipped += batch.pass.skipped
            total.batches += 1
            // Until nothing is due: a row may have moved on to an occurrence that is due too (the
            // overdue one after a stale due-day one). Each row only ever moves forward.
            if batch.examined == 0 { break }
        }
        return total
    }

    static func fireBatch(_ tx: Transaction, _ core: TasksCore, now: Int64, limit: Int) throws -> (pass: ReminderPass, examined: Int) {
        var pass = ReminderPass()
        let due = try ReminderStore.due(tx, now: now, limit: limit)
        for p in due {
            let outcome: FireOutcome
            switch p.subject {
            case .chore: outcome = try fireChore(tx, core, p, now: now)
            case .habit: outcome = try fireHabit(tx, core, p, now: now)
            }
            switch outcome {
            case .sent: pass.sent += 1
            case .stale: pass.stale += 1
            case .skipped: pass.skipped += 1
            }
            // Whatever happened, the row must have moved past `p`: never the same due row twice.
            if let after = try ReminderStore.pending(tx, p.subject, p.id), after == p {
                var stopped = after
                stopped.fireAt = nil
                try ReminderStore.save(tx, stopped)
            }
        }
        return (pass, due.count)
    }

    enum FireOutcome { case sent, stale, skipped }

    /// Whether an outbox event with this id was queued before (and not yet purged).
    static func queued(_ tx: Transaction, _ eventID: String) throws -> Bool {
        try tx.queryOne("SELECT 1 FROM outbox WHERE event_id = ?", eventID) != nil
    }

    static func fireChore(_ tx: Transaction, _ core: TasksCore, _ p: ReminderStore.Pending, now: Int64) throws -> FireOutcome {
        guard let c = try ChoreStore.load(tx, ids: [p.id]).first, let at = p.fireAt else {
            try tx.execute("DELETE FROM reminders WHERE subject = 'chore' AND subject_id = ?", p.id)
            return .skipped
        }
        let settings = try ReminderStore.settings(tx, household: c.householdID)
        let zone = ReminderStore.zone(c.timeZone)
        let stored = ReminderStore.chorePending(p)
        guard c.status == .active, let due = c.due, due == p.day, !settings.off, !c.currentAssignee.isEmpty, stored.phase < .finished,
            ReminderRules.nextFireInstant(localDate: stored.phase.day(for: due), timeOfDay: settings.time, zone: zone) == at
        else {
            // A write changed the chore without its row following: recompute as that write would have.
            try ReminderStore.scheduleChore(tx, c, now: now, settings: settings)
            return .skipped
        }
        var outcome = FireOutcome.stale
        if now - at <= ReminderRules.staleAfterMilliseconds {
            let overdue = stored.phase == .overdue
            let eventID = "tasks:chore-\(overdue ? "overdue" : "due"):\(c.id):\(due)"
            if try queued(tx, eventID) {
                outcome = .skipped
            } else {
                let today = ReminderRules.localDate(now, zone)
                let title =
                    overdue ? "Overdue: \(c.name)" : today == due ? "Chore due today: \(c.name)" : "Chore due \(due): \(c.name)"
                let body =
                    overdue
                    ? "\"\(c.name)\" was due \(due) and is not done yet: it is your turn."
                    : "It is your turn to do \"\(c.name)\" (due \(due))."
                try core.notify(
                    tx, kind: .taskReminder, recipients: [c.currentAssignee], actor: "", title: title, body: body, target: .taskId(c.id),
                    data: [
                        "chore_id": c.id, "household_id": c.householdID, "area": "chore", "reminder": overdue ? "overdue" : "due",
                        "due_date": "\(due)",
                    ], eventID: eventID)
                outcome = .sent
            }
        }
        let next = ReminderRules.choreAfterFiring(stored, time: settings.time, zone: zone, now: now)
        try ReminderStore.save(tx, ReminderStore.row(c.id, next))
        return outcome
    }

    static func fireHabit(_ tx: Transaction, _ core: TasksCore, _ p: ReminderStore.Pending, now: Int64) throws -> FireOutcome {
        guard let h = try ReminderStore.habitSchedule(tx, id: p.id), let at = p.fireAt, let time = h.time else {
            try ReminderStore.scheduleHabit(tx, id: p.id, now: now)
            return .skipped
        }
        let zone = ReminderStore.zone(h.zone)
        guard p.day >= h.start, h.weekdays.contains(p.day.weekday),
            ReminderRules.nextFireInstant(localDate: p.day, timeOfDay: time, zone: zone) == at
        else {
            try ReminderStore.scheduleHabit(tx, id: p.id, now: now)
            return .skipped
        }
        var outcome = FireOutcome.stale
        if now - at <= ReminderRules.staleAfterMilliseconds {
            let eventID = "tasks:habit-reminder:\(h.id):\(p.day)"
            let done = try tx.queryOne("SELECT 1 FROM habit_events WHERE habit_id = ? AND day = ?", h.id, p.day.key) != nil
            let already = try queued(tx, eventID)
            if done || already {
                outcome = .skipped
            } else {
                try core.notify(
                    tx, kind: .taskReminder, recipients: [h.ownerID], actor: "", title: "Today: \(h.title)",
                    body: h.reason.isEmpty ? "Time for your habit \"\(h.title)\"." : "Time for your habit \"\(h.title)\": \(h.reason).",
                    target: .taskId(h.id), data: ["habit_id": h.id, "area": "habit", "reminder": "scheduled", "date": "\(p.day)"],
                    eventID: eventID)
                outcome = .sent
            }
        }
        var next = ReminderStore.Pending(subject: .habit, id: h.id, day: p.day.adding(days: 1), phase: 0, fireAt: nil, handledThrough: p.day)
        if let n = ReminderRules.habitNext(
            from: p.day.adding(days: 1), weekdays: h.weekdays, start: h.start, time: time, zone: zone,
            after: now - ReminderRules.staleAfterMilliseconds)
        {
            next.day = n.day
            next.fireAt = n.fireAt
        }
        try ReminderStore.save(tx, next)
        return outcome
    }
}
