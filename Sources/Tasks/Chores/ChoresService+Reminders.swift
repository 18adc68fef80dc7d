import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// A household's automatic chore reminder settings (chores.proto, ChoreReminderSettings): read
/// and changed by its members, checked with social like every chore call.
extension TasksService {
    static let householdNotFound = "no such household (or you are not a member of it)"

    public func getChoreReminderSettings(
        request: Tasks_V1_GetChoreReminderSettingsRequest, context: ServerContext
    ) async throws -> Tasks_V1_GetChoreReminderSettingsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        try errors.throwIfAny()
        try await core.peers.requireMember(household: household, user: me, what: Self.householdNotFound)
        let staleBefore = core.users.staleBefore
        let (settings, users) = try await core.read { c in
            let s = try ReminderStore.settings(c, household: household)
            return (s, try UserDirectory.cached(c, [s.updatedBy].compactMap { $0 }, staleBefore: staleBefore))
        }
        core.users.refreshIfStale(users.stale)
        var response = Tasks_V1_GetChoreReminderSettingsResponse()
        response.settings = ReminderStore.proto(settings, household: household, users: users.refs)
        return response
    }

    public func setChoreReminderSettings(
        request: Tasks_V1_SetChoreReminderSettingsRequest, context: ServerContext
    ) async throws -> Tasks_V1_SetChoreReminderSettingsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let household = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        var time: TimeOfDay?
        if !request.reminderTime.isEmpty {
            time = TimeOfDay(request.reminderTime)
            if time == nil { errors.add("reminder_time", "must be a 24-hour time \"HH:MM\" from 00:00 to 23:59 (e.g. \"07:30\")") }
        }
        try errors.throwIfAny()
        let state = try await core.peers.requireMember(household: household, user: me, what: Self.householdNotFound)
        guard state != .deleted else { throw RPCError(.failedPrecondition, "this household was deleted: its chores have ended") }
        let users = try await core.users.lookUp([me])
        let now = core.now, off = request.remindersOff, newTime = time
        let (settings, refs) = try await core.write { tx -> (ReminderStore.Settings, [String: Common_V1_UserRef]) in
            let before = try ReminderStore.settings(tx, household: household)
            let after = ReminderStore.Settings(time: newTime ?? before.time, off: off, updatedBy: me, updatedAt: now)
            if after.time != before.time || after.off != before.off || before.updatedAt == nil {
                try tx.execute(
                    """
                    INSERT INTO chore_reminder_settings (household_id, minute_of_day, reminders_off, updated_by, updated_at) VALUES (?, ?, ?, ?, ?)
                    ON CONFLICT (household_id) DO UPDATE SET minute_of_day = excluded.minute_of_day, reminders_off = excluded.reminders_off,
                        updated_by = excluded.updated_by, updated_at = excluded.updated_at
                    """, household, Int64(after.time.minutes), off ? Int64(1) : Int64(0), me, now)
                try UserDirectory.remember(tx, users.values, now: now)
                _ = try ReminderStore.scheduleHousehold(tx, household: household, now: now)
            }
            let settings = try ReminderStore.settings(tx, household: household)
            return (settings, try UserDirectory.cached(tx, [settings.updatedBy].compactMap { $0 }))
        }
        core.remindersChanged()
        var response = Tasks_V1_SetChoreReminderSettingsResponse()
        response.settings = ReminderStore.proto(settings, household: household, users: refs)
        return response
    }
}
