import Contracts
import Foundation
import Logging
import RPCCore
import RPCTransport
import ServiceCluster
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@testable import Tasks

/// Automatic reminders over real gRPC (real accounts and social; what tasks queued is read from
/// social's inboxes), on a manual clock that the tests move; each scan is run by the test
/// (`fireDueReminders`) so that "not before" and "once" are exact, and one test lets the
/// background loop do it by itself. 2027-03-15 is a Monday; Berlin is UTC+1 until 2027-03-28.
@Suite("Tasks: automatic reminders")
struct ReminderTests {
    static let monday = utc(2027, 3, 15, 6)  // 07:00 in Berlin

    static func pending(_ w: World, _ subject: ReminderStore.Subject, _ id: String) throws -> ReminderStore.Pending? {
        try w.core.database.readSync { c in try ReminderStore.pending(c, subject, id) }
    }

    static func settings(_ household: String, time: String = "", off: Bool = false) -> Tasks_V1_SetChoreReminderSettingsRequest {
        var r = Tasks_V1_SetChoreReminderSettingsRequest()
        r.householdId = household
        r.reminderTime = time
        r.remindersOff = off
        return r
    }

    /// The TASK_REMINDER notifications `user` received, oldest first, once everything queued was delivered.
    static func reminders(_ w: World, _ user: User) async throws -> [Social_V1_Notification] {
        #expect(try await w.outboxDrained())
        return try await w.notifications(to: user, kind: .taskReminder)
    }

    @Test func aChoreRemindsItsAssigneeOnceOnTheDueDateAndOnceWhenOverdue() async throws {
        try await withWorld(now: Self.monday) { w in
            let a = try await w.user("a"), b = try await w.user("b")
            let hh = try await w.household([a, b])
            let chore = try await w.tasks.createChore(
                createChore(household: hh, name: "Dishes", due: date(2027, 3, 16), assignees: [b.id, a.id], zone: "Europe/Berlin"),
                options: a.options
            ).chore
            let row = try #require(try Self.pending(w, .chore, chore.choreId))
            #expect(row.fireAt == utc(2027, 3, 16, 8) && row.phase == 0 && row.day == LocalDate(year: 2027, month: 3, day: 16))

            // Not a millisecond before 09:00 in Berlin.
            w.clock.set(milliseconds: utc(2027, 3, 16, 8) - 1)
            #expect(try await w.core.fireDueReminders().sent == 0)
            w.clock.set(milliseconds: utc(2027, 3, 16, 8))
            #expect(try await w.core.fireDueReminders().sent == 1)
            #expect(try await w.core.fireDueReminders().handled == 0)
            w.clock.advance(by: .seconds(3600))
            #expect(try await w.core.fireDueReminders().handled == 0)
            var got = try await Self.reminders(w, b)
            #expect(got.count == 1)
            #expect(got.first?.title == "Chore due today: Dishes")
            #expect(got.first?.actor.userId == "" && got.first?.target.taskId == chore.choreId)
            #expect(got.first?.data["reminder"] == "due" && got.first?.data["due_date"] == "2027-03-16")
            #expect(try await w.notifications(to: a, kind: .taskReminder).isEmpty)
            let queued = try await w.core.database.read { c in
                try c.query("SELECT event_id FROM outbox WHERE event_id LIKE 'tasks:chore-%due:%'").map { try $0.get(0, as: String.self) }
            }
            #expect(queued == ["tasks:chore-due:\(chore.choreId):2027-03-16"])

            // Still not done the next day at 09:00: once more, "Overdue".
            w.clock.set(milliseconds: utc(2027, 3, 17, 8) - 1)
            #expect(try await w.core.fireDueReminders().sent == 0)
            w.clock.set(milliseconds: utc(2027, 3, 17, 8))
            #expect(try await w.core.fireDueReminders().sent == 1)
            w.clock.set(milliseconds: utc(2027, 3, 25, 8))
            #expect(try await w.core.fireDueReminders().handled == 0)
            got = try await Self.reminders(w, b)
            #expect(got.map(\.title) == ["Chore due today: Dishes", "Overdue: Dishes"])
            #expect(got.last?.actor.userId == "" && got.last?.data["reminder"] == "overdue")
            let done = try #require(try Self.pending(w, .chore, chore.choreId))
            #expect(done.fireAt == nil && done.phase == 2)

            // The manual reminder still works beside them (with its actor).
            var remind = Tasks_V1_RemindChoreAssigneeRequest()
            remind.choreId = chore.choreId
            _ = try await w.tasks.remindChoreAssignee(remind, options: a.options)
            got = try await Self.reminders(w, b)
            #expect(got.count == 3 && got.last?.actor.userId == a.id)
        }
    }

    @Test func finishingCancelsSkippingPassesDeletingAndEndingCancel() async throws {
        try await withWorld(now: Self.monday) { w in
            let a = try await w.user("a"), b = try await w.user("b"), c = try await w.user("c")
            let hh = try await w.household([a, b, c])
            func make(_ name: String, _ assignees: [User]) async throws -> String {
                try await w.tasks.createChore(
                    createChore(household: hh, name: name, due: date(2027, 3, 16), assignees: assignees.map(\.id), zone: "Europe/Berlin"),
                    options: a.options
                ).chore.choreId
            }
            let finished = try await make("Finished", [b, c])
            let skipped = try await make("Skipped", [b, c])
            let deleted = try await make("Deleted", [b])
            let skippedLate = try await make("Skipped late", [b, c])

            // Before 09:00 on the 16th: b finishes one (weekly: due the 23rd, c's turn), skips one,
            // deletes one.
            w.clock.set(milliseconds: utc(2027, 3, 16, 7))
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = finished
            #expect(try await w.tasks.finishChore(finish, options: b.options).chore.dueDate == date(2027, 3, 23))
            #expect(try Self.pending(w, .chore, finished)?.fireAt == utc(2027, 3, 23, 8))
            var skip = Tasks_V1_SkipChoreRequest()
            skip.choreId = skipped
            _ = try await w.tasks.skipChore(skip, options: b.options)
            var delete = Tasks_V1_DeleteChoreRequest()
            delete.choreId = deleted
            _ = try await w.tasks.deleteChore(delete, options: a.options)
            #expect(try Self.pending(w, .chore, deleted) == nil)

            w.clock.set(milliseconds: utc(2027, 3, 16, 8))
            // "Skipped" (to c) and "Skipped late" (still b's) fire; "Finished" and "Deleted" do not.
            #expect(try await w.core.fireDueReminders().sent == 2)
            #expect(try await Self.reminders(w, b).map(\.title) == ["Chore due today: Skipped late"])
            #expect(try await Self.reminders(w, c).map(\.title) == ["Chore due today: Skipped"])

            // b skips "Skipped late" after its due-day reminder: c does not get a second "due
            // today" (c was told TASK_ASSIGNED), only the overdue one tomorrow.
            w.clock.set(milliseconds: utc(2027, 3, 16, 10))
            skip.choreId = skippedLate
            _ = try await w.tasks.skipChore(skip, options: b.options)
            #expect(try Self.pending(w, .chore, skippedLate)?.fireAt == utc(2027, 3, 17, 8))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // c finishes "Skipped" before its overdue reminder: cancelled (the next turn, b's on the 23rd, has its own).
            finish.choreId = skipped
            _ = try await w.tasks.finishChore(finish, options: c.options)
            w.clock.set(milliseconds: utc(2027, 3, 17, 8))
            #expect(try await w.core.fireDueReminders().sent == 1)
            #expect(try await Self.reminders(w, c).map(\.title) == ["Chore due today: Skipped", "Overdue: Skipped late"])
            #expect(try await Self.reminders(w, b).count == 1)

            // The household is deleted: its chores end and their reminders with them.
            #expect(try Self.pending(w, .chore, finished)?.fireAt != nil)
            try await w.deleteHousehold(hh, by: a)
            #expect(
                await eventually {
                    guard let p = try? Self.pending(w, .chore, finished) else { return false }
                    return p.fireAt == nil
                })
            w.clock.set(milliseconds: utc(2027, 3, 23, 8))
            #expect(try await w.core.fireDueReminders().handled == 0)
        }
    }

    @Test func theHouseholdSettingMovesPendingRemindersAndCanTurnThemOff() async throws {
        try await withWorld(now: Self.monday) { w in
            let a = try await w.user("a"), b = try await w.user("b"), outsider = try await w.user("o")
            let hh = try await w.household([a, b])
            var get = Tasks_V1_GetChoreReminderSettingsRequest()
            get.householdId = hh
            let defaults = try await w.tasks.getChoreReminderSettings(get, options: b.options).settings
            #expect(defaults.householdId == hh && defaults.reminderTime == "09:00" && !defaults.remindersOff && !defaults.hasUpdatedAt)

            await expectFailure(.invalidArgument, fields: ["reminder_time"]) {
                try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "7:30"), options: a.options)
            }
            await expectFailure(.invalidArgument, fields: ["reminder_time"]) {
                try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "24:00"), options: a.options)
            }
            await expectFailure(.invalidArgument, fields: ["household_id"]) {
                try await w.tasks.setChoreReminderSettings(Self.settings(""), options: a.options)
            }
            await expectFailure(.notFound) { try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "07:30"), options: outsider.options) }
            await expectFailure(.notFound) { try await w.tasks.getChoreReminderSettings(get, options: outsider.options) }

            let chore = try await w.tasks.createChore(
                createChore(household: hh, name: "Plants", due: date(2027, 3, 16), assignees: [a.id], zone: "Europe/Berlin"), options: b.options
            ).chore.choreId
            #expect(try Self.pending(w, .chore, chore)?.fireAt == utc(2027, 3, 16, 8))
            // b moves the household's reminders to 18:30: the pending one moves with them.
            let set = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "18:30"), options: b.options).settings
            #expect(set.reminderTime == "18:30" && !set.remindersOff && set.updatedBy.userId == b.id && set.hasUpdatedAt)
            #expect(try Self.pending(w, .chore, chore)?.fireAt == utc(2027, 3, 16, 17, 30))
            #expect(try await w.tasks.getChoreReminderSettings(get, options: a.options).settings == set)
            w.clock.set(milliseconds: utc(2027, 3, 16, 8))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // Off: nothing pending, nothing sent; the time is kept.
            let off = try await w.tasks.setChoreReminderSettings(Self.settings(hh, off: true), options: a.options).settings
            #expect(off.remindersOff && off.reminderTime == "18:30")
            #expect(try Self.pending(w, .chore, chore)?.fireAt == nil)
            w.clock.set(milliseconds: utc(2027, 3, 16, 17, 30))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // On again at 18:30 with 20:00: today's reminder at 20:00 (19:00 UTC).
            _ = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "20:00"), options: a.options)
            #expect(try Self.pending(w, .chore, chore)?.fireAt == utc(2027, 3, 16, 19))
            // The same again is harmless (a retry).
            _ = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "20:00"), options: a.options)
            w.clock.set(milliseconds: utc(2027, 3, 16, 19))
            #expect(try await w.core.fireDueReminders().sent == 1)
            #expect(try await Self.reminders(w, a).map(\.title) == ["Chore due today: Plants"])
            // Moved to 07:00 after today's went out: tomorrow's overdue one at 07:00 (06:00 UTC), once.
            _ = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "07:00"), options: a.options)
            #expect(try Self.pending(w, .chore, chore)?.fireAt == utc(2027, 3, 17, 6))
            w.clock.set(milliseconds: utc(2027, 3, 17, 6))
            #expect(try await w.core.fireDueReminders().sent == 1)
            _ = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "23:00"), options: a.options)
            w.clock.set(milliseconds: utc(2027, 3, 17, 22))
            #expect(try await w.core.fireDueReminders().handled == 0)
            #expect(try await Self.reminders(w, a).map(\.title) == ["Chore due today: Plants", "Overdue: Plants"])
        }
    }

    /// A household in Berlin whose reminders are at 02:30: on 2027-03-28 there is no 02:30 (it
    /// fires at 03:00 CEST, 01:00 UTC, once); on 2027-10-31 there are two (the first, 00:30 UTC).
    @Test func daylightSavingDaysFireOnce() async throws {
        try await withWorld(now: utc(2027, 3, 26, 12)) { w in
            let a = try await w.user("a"), b = try await w.user("b")
            let hh = try await w.household([a, b])
            _ = try await w.tasks.setChoreReminderSettings(Self.settings(hh, time: "02:30"), options: a.options)
            var request = createChore(
                household: hh, name: "Spring", due: date(2027, 3, 28), assignees: [b.id], recurrence: recurrence(.oneTime(.init())),
                zone: "Europe/Berlin")
            let spring = try await w.tasks.createChore(request, options: a.options).chore.choreId
            #expect(try Self.pending(w, .chore, spring)?.fireAt == utc(2027, 3, 28, 1))
            w.clock.set(milliseconds: utc(2027, 3, 28, 0, 59))
            #expect(try await w.core.fireDueReminders().handled == 0)
            w.clock.set(milliseconds: utc(2027, 3, 28, 1))
            #expect(try await w.core.fireDueReminders().sent == 1)
            w.clock.set(milliseconds: utc(2027, 3, 28, 1, 30))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // The overdue one: 02:30 CEST on the 29th = 00:30 UTC.
            #expect(try Self.pending(w, .chore, spring)?.fireAt == utc(2027, 3, 29, 0, 30))

            w.clock.set(milliseconds: utc(2027, 10, 29, 12))
            request.name = "Autumn"
            request.dueDate = date(2027, 10, 31)
            request.idempotencyKey = "autumn"
            let autumn = try await w.tasks.createChore(request, options: a.options).chore.choreId
            #expect(try Self.pending(w, .chore, autumn)?.fireAt == utc(2027, 10, 31, 0, 30))
            w.clock.set(milliseconds: utc(2027, 10, 31, 0, 30))
            let autumnPass = try await w.core.fireDueReminders()
            #expect(autumnPass.sent == 1 && autumnPass.stale == 1)  // and the spring one's overdue, long stale by now
            // 02:30 again (CET, 01:30 UTC): nothing.
            w.clock.set(milliseconds: utc(2027, 10, 31, 1, 30))
            #expect(try await w.core.fireDueReminders().handled == 0)
            #expect(try Self.pending(w, .chore, autumn)?.fireAt == utc(2027, 11, 1, 1, 30))
            let titles = try await Self.reminders(w, b).map(\.title)
            #expect(titles == ["Chore due today: Spring", "Chore due today: Autumn"])
        }
    }

    /// Down for two days: each pending occurrence fires at most once, and not when more than 12 h late.
    @Test func aServiceThatWasDownDropsStaleRemindersAndSendsTheRestOnce() async throws {
        try await withWorld(now: Self.monday) { w in
            let a = try await w.user("a"), b = try await w.user("b")
            let hh = try await w.household([a, b])
            func make(_ name: String) async throws -> String {
                try await w.tasks.createChore(
                    createChore(household: hh, name: name, due: date(2027, 3, 16), assignees: [b.id], zone: "Europe/Berlin"), options: a.options
                ).chore.choreId
            }
            let twoDays = try await make("Two days")
            // Back on the 18th at 10:00: the due-day reminder (49 h late) is dropped, and so is the
            // overdue one (25 h late) without being tried.
            w.clock.set(milliseconds: utc(2027, 3, 18, 9))
            let pass = try await w.core.fireDueReminders()
            #expect(pass.sent == 0 && pass.stale == 1)
            #expect(try Self.pending(w, .chore, twoDays).map { $0.fireAt == nil && $0.phase == 2 } == true)
            // A chore due on the 19th, and the service down from before its 09:00 until the 20th at
            // 10:00 UTC: the due-day reminder is 26 h late (dropped), the overdue one 2 h late (sent, once).
            let late = try await w.tasks.createChore(
                createChore(household: hh, name: "Late", due: date(2027, 3, 19), assignees: [b.id], zone: "Europe/Berlin", key: "late"),
                options: a.options
            ).chore.choreId
            #expect(try Self.pending(w, .chore, late)?.fireAt == utc(2027, 3, 19, 8))
            w.clock.set(milliseconds: utc(2027, 3, 20, 10))
            let second = try await w.core.fireDueReminders()
            #expect(second.sent == 1 && second.stale == 1)
            #expect(try await w.core.fireDueReminders().handled == 0)
            #expect(try await Self.reminders(w, b).map(\.title) == ["Overdue: Late"])
        }
    }

    @Test func habitRemindersOnScheduledDaysOnlyUnlessDone() async throws {
        try await withWorld(now: Self.monday) { w in
            let owner = try await w.user("owner"), follower = try await w.user("f")
            try await w.follow(follower, owner)
            var create = newHabit("Stretch", reason: "back", days: [.monday, .wednesday], zone: "Europe/Berlin")
            create.reminderTime = "7:30"
            await expectFailure(.invalidArgument, fields: ["reminder_time"]) { try await w.tasks.createHabit(create, options: owner.options) }
            create.reminderTime = "07:30"
            let habit = try await w.tasks.createHabit(create, options: owner.options).habit
            #expect(habit.reminder.time == "07:30" && habit.reminder.timeZone == "Europe/Berlin")
            var get = Tasks_V1_GetHabitRequest()
            get.habitId = habit.habitId
            #expect(!(try await w.tasks.getHabit(get, options: follower.options).habit.hasReminder))
            #expect(try await w.tasks.getHabit(get, options: owner.options).habit.reminder.time == "07:30")
            // Monday 07:30 in Berlin = 06:30 UTC.
            #expect(try Self.pending(w, .habit, habit.habitId)?.fireAt == utc(2027, 3, 15, 6, 30))
            w.clock.set(milliseconds: utc(2027, 3, 15, 6, 30) - 1)
            #expect(try await w.core.fireDueReminders().handled == 0)
            w.clock.set(milliseconds: utc(2027, 3, 15, 6, 30))
            #expect(try await w.core.fireDueReminders().sent == 1)
            // Tuesday is not scheduled: nothing; Wednesday is next.
            #expect(try Self.pending(w, .habit, habit.habitId)?.fireAt == utc(2027, 3, 17, 6, 30))
            w.clock.set(milliseconds: utc(2027, 3, 16, 6, 30))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // Wednesday's is already done at 07:00 local: not reminded.
            w.clock.set(milliseconds: utc(2027, 3, 17, 6))
            _ = try await w.tasks.createHabitEvent(newEvent(habit.habitId, zone: "Europe/Berlin"), options: owner.options)
            w.clock.set(milliseconds: utc(2027, 3, 17, 6, 30))
            let wednesday = try await w.core.fireDueReminders()
            #expect(wednesday.sent == 0 && wednesday.skipped == 1)
            #expect(try Self.pending(w, .habit, habit.habitId)?.fireAt == utc(2027, 3, 22, 6, 30))
            let got = try await Self.reminders(w, owner)
            #expect(got.map(\.title) == ["Today: Stretch"] && got.first?.actor.userId == "" && got.first?.target.taskId == habit.habitId)
            #expect(got.first?.data["date"] == "2027-03-15")

            // Moved to 21:00 in New York, and to Fridays only: next Friday 21:00 EDT = Saturday 01:00 UTC.
            var update = Tasks_V1_UpdateHabitRequest()
            update.habitId = habit.habitId
            update.timeZone = "America/New_York"
            update.reminder.time = "21:00"
            var days = Tasks_V1_WeekdaySet()
            days.days = [.friday]
            update.days = days
            let updated = try await w.tasks.updateHabit(update, options: owner.options).habit
            #expect(updated.reminder.time == "21:00" && updated.reminder.timeZone == "America/New_York")
            #expect(try Self.pending(w, .habit, habit.habitId)?.fireAt == utc(2027, 3, 20, 1))
            // Another edit from another zone leaves the reminder as it is.
            var rename = Tasks_V1_UpdateHabitRequest()
            rename.habitId = habit.habitId
            rename.timeZone = "Asia/Tokyo"
            rename.title.value = "Stretch!"
            #expect(try await w.tasks.updateHabit(rename, options: owner.options).habit.reminder.timeZone == "America/New_York")
            var bad = Tasks_V1_UpdateHabitRequest()
            bad.habitId = habit.habitId
            bad.reminder.time = "21h00"
            await expectFailure(.invalidArgument, fields: ["reminder.time"]) { try await w.tasks.updateHabit(bad, options: owner.options) }
            // Cleared: nothing pending.
            var clear = Tasks_V1_UpdateHabitRequest()
            clear.habitId = habit.habitId
            clear.reminder = Tasks_V1_HabitReminderUpdate()
            #expect(!(try await w.tasks.updateHabit(clear, options: owner.options).habit.hasReminder))
            #expect(try Self.pending(w, .habit, habit.habitId)?.fireAt == nil)
            w.clock.set(milliseconds: utc(2027, 3, 20, 1))
            #expect(try await w.core.fireDueReminders().handled == 0)
            // Deleting the habit removes its row.
            var delete = Tasks_V1_DeleteHabitRequest()
            delete.habitId = habit.habitId
            _ = try await w.tasks.deleteHabit(delete, options: owner.options)
            #expect(try Self.pending(w, .habit, habit.habitId) == nil)
        }
    }

    /// The background loop fires by itself when the clock reaches a pending instant, and a write
    /// that makes an earlier one wakes it.
    @Test func theBackgroundLoopFiresByItself() async throws {
        try await withWorld(now: Self.monday, { $0.reminderTick = .milliseconds(20) }) { w in
            let a = try await w.user("a"), b = try await w.user("b")
            let hh = try await w.household([a, b])
            let core = w.core
            let loop = Task { await core.runReminders() }
            defer { loop.cancel() }
            let chore = try await w.tasks.createChore(
                createChore(household: hh, name: "Loop", due: date(2027, 3, 16), assignees: [b.id], zone: "Europe/Berlin"), options: a.options
            ).chore.choreId
            try await Task.sleep(for: .milliseconds(200))
            #expect(try Self.pending(w, .chore, chore)?.phase == 0)
            w.clock.set(milliseconds: utc(2027, 3, 16, 8))
            #expect(await eventually { (try? Self.pending(w, .chore, chore)?.phase) == 1 })
            #expect(await eventually { (try? await w.notifications(to: b, kind: .taskReminder).count) == 1 })
            loop.cancel()
            await loop.value
        }
    }

    /// The scan reads only due rows through `reminders_due` (never a scan of chores, habits or
    /// every reminder), and the earliest instant comes from the same index.
    @Test func theDueScanUsesItsIndex() async throws {
        let dir = TemporaryDirectory("tasks-reminders-plan")
        defer { dir.remove() }
        var logger = Logger(label: "tasks-reminders-plan")
        logger.logLevel = .warning
        let db = try Database.open(directory: dir.path, schema: TasksSchema.schema, logger: logger)
        defer { db.close() }
        try db.writeSync { tx in
            for i in 0..<2000 {
                try tx.execute(
                    "INSERT INTO reminders (subject, subject_id, occurrence_day, phase, fire_at) VALUES ('chore', ?, 20270316, 0, ?)", "c\(i)",
                    i % 3 == 0 ? nil : Int64(i))
            }
            try tx.execute("ANALYZE")
        }
        try db.readSync { c in
            func plan(_ sql: String, _ args: [DatabaseValue]) throws -> String {
                try c.query("EXPLAIN QUERY PLAN " + sql, arguments: args).map { try $0.get("detail", as: String.self) }.joined(separator: " | ")
            }
            let due = try plan(ReminderStore.dueSQL, [.integer(100), .integer(200)])
            #expect(due.contains("USING INDEX reminders_due") || due.contains("USING COVERING INDEX reminders_due"), "\(due)")
            #expect(due.contains("fire_at<?)"), "a range of the index: \(due)")
            #expect(!due.contains("TEMP B-TREE") && !due.contains("chores") && !due.contains("habits"), "\(due)")
            let earliest = try plan(ReminderStore.earliestSQL, [])
            #expect(earliest.contains("reminders_due"), "\(earliest)")
            #expect(try ReminderStore.due(c, now: 100, limit: 1000).count == 67)
            #expect(try ReminderStore.earliest(c) == 1)
        }
    }

    /// Chores stored before reminders existed get theirs at the start; a restart (a new core over
    /// the same files) never fires an occurrence twice; a crash before the firing transaction
    /// commits (here: the outbox refusing the insert) leaves it to fire after the restart.
    @Test func upgradeAndRestartsFireEachOccurrenceOnce() async throws {
        let dir = TemporaryDirectory("tasks-reminders-restart")
        defer { dir.remove() }
        var logger = Logger(label: "tasks-reminders-restart")
        logger.logLevel = .warning
        let nowhere = try ClosedPort()
        defer { nowhere.close() }
        let clock = ManualClock(milliseconds: Self.monday)
        func open() throws -> (TasksCore, PeerClients) {
            let peers = PeerClients(serviceToken: TestCredentials.serviceToken) { _ in
                var c = ChannelConfiguration(host: "127.0.0.1", port: nowhere.port)
                c.connectTimeout = .milliseconds(200)
                return c
            }
            return (try TasksCore(configuration: TasksConfiguration(dataDirectory: dir.path), peers: peers, clock: clock, logger: logger), peers)
        }
        // A database of the version before reminders, with two open chores and a finished one.
        let before = Array(TasksSchema.migrations.prefix { $0.name != ReminderStore.migration.name })
        #expect(before.count == TasksSchema.migrations.count - 1)
        let old = try Database.open(directory: dir.path, fileName: TasksSchema.fileName, migrations: before, logger: logger)
        try old.writeSync { tx in
            for (id, due, status) in [("c1", Int64(20_270_316), Int64(1)), ("c2", 20_270_315, 1), ("c3", 20_270_316, 3)] {
                try tx.execute(
                    """
                    INSERT INTO chores (id, household_id, name, description, time_zone, recurrence, status, due_day, current_index,
                        current_user_id, revision, created_by, created_at)
                    VALUES (?, 'hh', ?, '', 'Europe/Berlin', 2, ?, ?, 0, 'u1', 1, 'u1', 0)
                    """, id, "Chore \(id)", status, due)
                try tx.execute("INSERT INTO chore_assignees (chore_id, position, user_id) VALUES (?, 0, 'u1')", id)
            }
        }
        old.close()

        func sent(_ core: TasksCore) throws -> [String] {
            try core.database.readSync { c in
                try c.query("SELECT event_id FROM outbox WHERE event_id LIKE 'tasks:chore-%' ORDER BY id").map { try $0.get(0, as: String.self) }
            }
        }
        var (core, peers) = try open()
        // c1 due tomorrow (09:00 → 08:00 UTC), c2 due today (09:00 is ahead), c3 done: nothing.
        #expect(try core.database.readSync { c in try ReminderStore.pending(c, .chore, "c1")?.fireAt } == utc(2027, 3, 16, 8))
        #expect(try core.database.readSync { c in try ReminderStore.pending(c, .chore, "c2")?.fireAt } == utc(2027, 3, 15, 8))
        #expect(try core.database.readSync { c in try ReminderStore.pending(c, .chore, "c3") } == nil)

        // c2 falls due; the firing transaction fails before its commit: nothing queued, nothing advanced.
        clock.set(milliseconds: utc(2027, 3, 15, 8))
        try core.database.writeSync { tx in
            try tx.execute("CREATE TRIGGER crash BEFORE INSERT ON outbox BEGIN SELECT RAISE(ABORT, 'crash before commit'); END")
        }
        await #expect(throws: (any Error).self) { try await core.fireDueReminders() }
        #expect(try sent(core).isEmpty)
        try core.database.writeSync { tx in try tx.execute("DROP TRIGGER crash") }
        core.close()
        await peers.close()

        // Restarted: it fires now, once.
        (core, peers) = try open()
        #expect(try await core.fireDueReminders().sent == 1)
        #expect(try sent(core) == ["tasks:chore-due:c2:2027-03-15"])
        core.close()
        await peers.close()
        // Restarted again at the same instant: nothing more (the commit advanced the row).
        (core, peers) = try open()
        #expect(try await core.fireDueReminders().handled == 0)
        clock.set(milliseconds: utc(2027, 3, 16, 8))
        #expect(try await core.fireDueReminders().sent == 2)  // c1 due, c2 overdue
        core.close()
        await peers.close()
        (core, peers) = try open()
        #expect(try await core.fireDueReminders().handled == 0)
        #expect(
            try sent(core) == ["tasks:chore-due:c2:2027-03-15", "tasks:chore-due:c1:2027-03-16", "tasks:chore-overdue:c2:2027-03-15"]
                || sent(core) == ["tasks:chore-due:c2:2027-03-15", "tasks:chore-overdue:c2:2027-03-15", "tasks:chore-due:c1:2027-03-16"])
        core.close()
        await peers.close()
    }
}
