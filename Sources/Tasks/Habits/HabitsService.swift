import Contracts
import Foundation
import RPCCore
import ServiceKit
import Storage

/// Habits and habit events (seed C), `tasks.v1.Tasks` habit RPCs. A habit is its owner's; the
/// users who follow the owner (social) read it and its events, nobody else sees it (NOT_FOUND).
/// Metrics are `HabitRules`' pure functions of the event days and "today" in the request's zone.
extension TasksService {
    static let habitNotFound = "no such habit (or you do not follow its owner)"
    static let habitEventNotFound = "no such habit event (or you do not follow its owner)"
    static let maxHabitPhotoBytes = 65_535

    static func today(_ zone: TimeZone, now: Int64) -> LocalDate { LocalDate.at(milliseconds: now, in: zone) }

    /// Whether `me` may read `owner`'s habits (themselves, or a follower not blocked either way).
    func mayRead(owner: String, me: String) async throws -> Bool {
        owner == me ? true : try await core.peers.follows(me, owner)
    }

    /// The habit if `me` may read it (NOT_FOUND otherwise).
    func readableHabit(_ id: String, me: String) async throws -> HabitStore.Habit {
        guard let h = try await core.read({ c in try HabitStore.one(c, id: id) }), try await mayRead(owner: h.ownerID, me: me) else {
            throw RPCError(.notFound, Self.habitNotFound)
        }
        return h
    }

    /// For a change only the owner makes: NOT_FOUND for those who cannot see the habit,
    /// PERMISSION_DENIED for followers.
    func requireHabitOwner(_ owner: String, me: String, notFound: String) async throws {
        guard owner != me else { return }
        if try await core.peers.follows(me, owner) { throw RPCError(.permissionDenied, "only the owner can change a habit or its events") }
        throw RPCError(.notFound, notFound)
    }

    /// The habits as messages for `viewer` (their reminders shown to their owner only).
    func habitMessages(_ habits: [HabitStore.Habit], today: LocalDate, viewer: String) async throws -> [Tasks_V1_Habit] {
        let staleBefore = core.users.staleBefore
        let owners = habits.map(\.ownerID)
        let users = try await core.read { c in try UserDirectory.cached(c, owners, staleBefore: staleBefore) }
        core.users.refreshIfStale(users.stale)
        return habits.map { HabitStore.proto($0, users: users.refs, today: today, viewer: viewer) }
    }

    /// A reminder time the client sent ("HH:MM"; empty: none), or the problem named at `field`.
    static func reminderTime(_ raw: String, field: String, into errors: inout FieldErrors) -> TimeOfDay? {
        guard !raw.isEmpty else { return nil }
        guard let t = TimeOfDay(raw) else {
            errors.add(field, "must be a 24-hour time \"HH:MM\" from 00:00 to 23:59 (e.g. \"07:30\"), or empty for none")
            return nil
        }
        return t
    }

    /// The zone name a reminder set by this request is reckoned in ("UTC" for an empty one).
    static func reminderZoneName(_ raw: String) -> String {
        let trimmed = FieldRules.trimmed(raw)
        return trimmed.isEmpty ? "UTC" : trimmed
    }

    static func weekdays(_ raw: [Common_V1_Weekday], field: String, into errors: inout FieldErrors) -> Set<Int> {
        var out = Set<Int>()
        for (i, d) in raw.enumerated() {
            if (1...7).contains(d.rawValue) {
                out.insert(Int(d.rawValue))
            } else {
                errors.add("\(field)[\(i)]", "must be a weekday (MONDAY … SUNDAY)")
            }
        }
        if raw.isEmpty { errors.add(field, "choose at least one weekday") }
        return out
    }

    static func habitPhoto(_ bytes: [UInt8], field: String, into errors: inout FieldErrors) {
        if bytes.count > maxHabitPhotoBytes {
            errors.add(field, "must be smaller than 65536 bytes")
        } else if !bytes.isEmpty, ImageBytes.contentType(bytes) == nil {
            errors.add(field, "is not a JPEG, PNG or WebP image")
        }
    }

    // MARK: Habits

    public func createHabit(request: Tasks_V1_CreateHabitRequest, context: ServerContext) async throws -> Tasks_V1_CreateHabitResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let title = FieldRules.text(request.title, field: "title", 1...20, into: &errors)
        let reason = FieldRules.text(request.reason, field: "reason", 0...30, into: &errors)
        let days = Self.weekdays(request.days, field: "days", into: &errors)
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        let now = core.now
        let today = Self.today(zone, now: now)
        let start = request.hasStartDate ? Self.date(request.startDate, field: "start_date", into: &errors) : today
        let reminder = Self.reminderTime(request.reminderTime, field: "reminder_time", into: &errors)
        let reminderZone = Self.reminderZoneName(request.timeZone)
        try errors.throwIfAny()
        guard let start else { throw RPCError(.invalidArgument, "invalid request: start_date") }
        let scope = "CreateHabit:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_CreateHabitResponse.self) {
            replay.replayed = true
            return replay
        }
        let users = try await core.users.lookUp([me])
        let (response, replayed) = try await core.write { tx in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                let id = ULID.make(now: now)
                try tx.execute(
                    """
                    INSERT INTO habits (id, owner_id, title, title_key, reason, weekdays, start_day, created_at, updated_at,
                        reminder_minute, reminder_zone)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """, id, me, title, title.lowercased(), reason, HabitStore.mask(days), start.key, now, now,
                    reminder.map { Int64($0.minutes) }, reminder == nil ? nil : reminderZone)
                try UserDirectory.remember(tx, users.values, now: now)
                try ReminderStore.scheduleHabit(tx, id: id, now: now)
                guard let h = try HabitStore.one(tx, id: id) else { throw RPCError(.internal, "habit vanished") }
                var out = Tasks_V1_CreateHabitResponse()
                out.habit = HabitStore.proto(h, users: users, today: today, viewer: me)
                return out
            }
        }
        core.remindersChanged()
        var out = response
        out.replayed = replayed
        return out
    }

    public func getHabit(request: Tasks_V1_GetHabitRequest, context: ServerContext) async throws -> Tasks_V1_GetHabitResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.habitId, field: "habit_id", into: &errors)
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        try errors.throwIfAny()
        let h = try await readableHabit(id, me: me)
        var response = Tasks_V1_GetHabitResponse()
        response.habit = try await habitMessages([h], today: Self.today(zone, now: core.now), viewer: me)[0]
        return response
    }

    public func updateHabit(request: Tasks_V1_UpdateHabitRequest, context: ServerContext) async throws -> Tasks_V1_UpdateHabitResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.habitId, field: "habit_id", into: &errors)
        let title = request.hasTitle ? FieldRules.text(request.title.value, field: "title", 1...20, into: &errors) : nil
        let reason = request.hasReason ? FieldRules.text(request.reason.value, field: "reason", 0...30, into: &errors) : nil
        let days = request.hasDays ? Self.weekdays(request.days.days, field: "days.days", into: &errors) : nil
        let start = request.hasStartDate ? Self.date(request.startDate, field: "start_date", into: &errors) : nil
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        let changesReminder = request.hasReminder
        let reminder = changesReminder ? Self.reminderTime(request.reminder.time, field: "reminder.time", into: &errors) : nil
        let reminderZone = Self.reminderZoneName(request.timeZone)
        try errors.throwIfAny()
        guard let owner = try await core.read({ c in try HabitStore.one(c, id: id)?.ownerID }) else { throw RPCError(.notFound, Self.habitNotFound) }
        try await requireHabitOwner(owner, me: me, notFound: Self.habitNotFound)
        let now = core.now
        let h = try await core.write { tx -> HabitStore.Habit in
            if changesReminder {
                try tx.execute(
                    "UPDATE habits SET reminder_minute = ?, reminder_zone = ? WHERE id = ?", reminder.map { Int64($0.minutes) },
                    reminder == nil ? nil : reminderZone, id)
            }
            if let title { try tx.execute("UPDATE habits SET title = ?, title_key = ? WHERE id = ?", title, title.lowercased(), id) }
            if let reason { try tx.execute("UPDATE habits SET reason = ? WHERE id = ?", reason, id) }
            if let days { try tx.execute("UPDATE habits SET weekdays = ? WHERE id = ?", HabitStore.mask(days), id) }
            if let start { try tx.execute("UPDATE habits SET start_day = ? WHERE id = ?", start.key, id) }
            try tx.execute("UPDATE habits SET updated_at = ? WHERE id = ?", now, id)
            guard let h = try HabitStore.one(tx, id: id) else { throw RPCError(.notFound, Self.habitNotFound) }
            try ReminderStore.scheduleHabit(tx, id: id, now: now)
            return h
        }
        core.remindersChanged()
        var response = Tasks_V1_UpdateHabitResponse()
        response.habit = try await habitMessages([h], today: Self.today(zone, now: now), viewer: me)[0]
        return response
    }

    public func deleteHabit(request: Tasks_V1_DeleteHabitRequest, context: ServerContext) async throws -> Tasks_V1_DeleteHabitResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.habitId, field: "habit_id", into: &errors)
        try errors.throwIfAny()
        guard let owner = try await core.read({ c in try HabitStore.one(c, id: id)?.ownerID }) else { throw RPCError(.notFound, Self.habitNotFound) }
        try await requireHabitOwner(owner, me: me, notFound: Self.habitNotFound)
        let count = try await core.write { tx -> Int in
            let n = try tx.queryOne("SELECT COUNT(*) FROM habit_events WHERE habit_id = ?", id)?.get(0, as: Int64.self) ?? 0
            try tx.execute("DELETE FROM habits WHERE id = ?", id)
            if tx.changes == 0 { throw RPCError(.notFound, Self.habitNotFound) }
            return Int(n)
        }
        var response = Tasks_V1_DeleteHabitResponse()
        response.deletedEventCount = Int32(count)
        return response
    }

    public func listMyHabits(request: Tasks_V1_ListMyHabitsRequest, context: ServerContext) async throws -> Tasks_V1_ListMyHabitsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        let filters = "my-habits:\(me)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 2, into: &errors)
        try errors.throwIfAny()
        let (habits, more) = try await core.read { c -> ([HabitStore.Habit], Bool) in
            var sql = "SELECT id FROM habits WHERE owner_id = ?"
            var args: [DatabaseValue] = [.text(me)]
            if let cursor {
                sql += " AND (title_key, id) > (?, ?)"
                args += [.text(cursor[0]), .text(cursor[1])]
            }
            sql += " ORDER BY title_key, id LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let ids = try c.query(sql, arguments: args).map { try $0.get(0, as: String.self) }
            return (try HabitStore.load(c, ids: Array(ids.prefix(pageSize))), ids.count > pageSize)
        }
        var response = Tasks_V1_ListMyHabitsResponse()
        response.habits = try await habitMessages(habits, today: Self.today(zone, now: core.now), viewer: me)
        if more, let last = habits.last { response.nextPageToken = core.pageTokens.make(cursor: [last.titleKey, last.id], filters: filters) }
        return response
    }

    public func listTodayHabits(request: Tasks_V1_ListTodayHabitsRequest, context: ServerContext) async throws -> Tasks_V1_ListTodayHabitsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        let today = Self.today(zone, now: core.now)
        let filters = "today-habits:\(me):\(today.key)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 3, into: &errors)
        try errors.throwIfAny()
        let (habits, events, more) = try await core.read { c -> ([HabitStore.Habit], [String: String], Bool) in
            var sql = """
                SELECT id, done, title_key, today_event FROM (
                    SELECT h.id, h.title_key, e.id AS today_event, e.id IS NOT NULL AS done FROM habits h
                    LEFT JOIN habit_events e ON e.habit_id = h.id AND e.day = ?
                    WHERE h.owner_id = ? AND h.start_day <= ? AND (h.weekdays & ?) <> 0)
                """
            var args: [DatabaseValue] = [.integer(today.key), .text(me), .integer(today.key), .integer(1 << Int64(today.weekday - 1))]
            if let cursor, let done = Int64(cursor[0]) {
                sql += " WHERE (done, title_key, id) > (?, ?, ?)"
                args += [.integer(done), .text(cursor[1]), .text(cursor[2])]
            }
            sql += " ORDER BY done, title_key, id LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let rows = try c.query(sql, arguments: args)
            var events: [String: String] = [:]
            for r in rows { if let e: String = try r.get("today_event") { events[try r.get("id")] = e } }
            let ids = try rows.prefix(pageSize).map { try $0.get("id", as: String.self) }
            return (try HabitStore.load(c, ids: ids), events, rows.count > pageSize)
        }
        let messages = try await habitMessages(habits, today: today, viewer: me)
        var response = Tasks_V1_ListTodayHabitsResponse()
        response.habits = messages.map { h in
            var t = Tasks_V1_TodayHabit()
            t.habit = h
            t.todayEventId = events[h.habitId] ?? ""
            return t
        }
        response.today = HabitStore.date(today)
        if more, let last = habits.last {
            response.nextPageToken = core.pageTokens.make(
                cursor: [events[last.id] == nil ? "0" : "1", last.titleKey, last.id], filters: filters)
        }
        return response
    }

    public func listFollowedHabits(
        request: Tasks_V1_ListFollowedHabitsRequest, context: ServerContext
    ) async throws -> Tasks_V1_ListFollowedHabitsResponse {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let pageSize = FieldRules.pageSize(request.pageSize, defaultSize: 50, into: &errors)
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        let only = FieldRules.id(request.ownerUserId, field: "owner_user_id", required: false, into: &errors)
        let filters = "followed-habits:\(me):\(only)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 3, into: &errors)
        try errors.throwIfAny()
        let owners: [String]
        if !only.isEmpty {
            guard only != me, try await core.peers.follows(me, only) else {
                throw RPCError(.permissionDenied, "you do not follow this user: follow them (and be accepted) to see their habits")
            }
            owners = [only]
        } else {
            owners = try await core.peers.followed(by: me, limit: core.configuration.maxFollowedUsers)
        }
        var response = Tasks_V1_ListFollowedHabitsResponse()
        guard !owners.isEmpty else { return response }
        let (habits, keys, more) = try await core.read { c -> ([HabitStore.Habit], [String: String], Bool) in
            let marks = owners.map { _ in "?" }.joined(separator: ",")
            var sql = """
                SELECT id, name_key, title_key FROM (
                    SELECT h.id, lower(COALESCE(u.username, '')) AS name_key, h.title_key FROM habits h
                    LEFT JOIN users u ON u.user_id = h.owner_id WHERE h.owner_id IN (\(marks)))
                """
            var args: [DatabaseValue] = owners.map { .text($0) }
            if let cursor {
                sql += " WHERE (name_key, title_key, id) > (?, ?, ?)"
                args += [.text(cursor[0]), .text(cursor[1]), .text(cursor[2])]
            }
            sql += " ORDER BY name_key, title_key, id LIMIT ?"
            args.append(.integer(Int64(pageSize + 1)))
            let rows = try c.query(sql, arguments: args)
            var keys: [String: String] = [:]
            for r in rows { keys[try r.get("id")] = try r.get("name_key") }
            let ids = try rows.prefix(pageSize).map { try $0.get("id", as: String.self) }
            return (try HabitStore.load(c, ids: ids), keys, rows.count > pageSize)
        }
        response.habits = try await habitMessages(habits, today: Self.today(zone, now: core.now), viewer: me)
        if more, let last = habits.last {
            response.nextPageToken = core.pageTokens.make(cursor: [keys[last.id] ?? "", last.titleKey, last.id], filters: filters)
        }
        return response
    }

    // MARK: Events

    public func createHabitEvent(request: Tasks_V1_CreateHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_CreateHabitEventResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        let habitID = FieldRules.id(request.habitId, field: "habit_id", into: &errors)
        let comment = FieldRules.text(request.comment, field: "comment", 0...20, into: &errors)
        Self.habitPhoto(request.photo, field: "photo", into: &errors)
        let location = request.hasLocation ? Geo.point(request.location, field: "location", into: &errors) : nil
        let zone = RequestZone.zone(request.timeZone, into: &errors)
        try errors.throwIfAny()
        let scope = "CreateHabitEvent:\(me)", fingerprint = Idempotency.fingerprint(request)
        if var replay = try await core.store.storedAnswer(
            scope: scope, key: key, fingerprint: fingerprint, as: Tasks_V1_CreateHabitEventResponse.self)
        {
            replay.replayed = true
            return replay
        }
        guard let owner = try await core.read({ c in try HabitStore.one(c, id: habitID)?.ownerID }) else {
            throw RPCError(.notFound, Self.habitNotFound)
        }
        try await requireHabitOwner(owner, me: me, notFound: Self.habitNotFound)
        let now = core.now
        let today = Self.today(zone, now: now)
        let offset = zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(now) / 1000))
        let photo = request.photo
        let (response, replayed) = try await core.write { tx in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: now) {
                guard let h = try HabitStore.one(tx, id: habitID) else { throw RPCError(.notFound, Self.habitNotFound) }
                guard HabitRules.isScheduled(today, weekdays: h.weekdays, start: h.start) else {
                    throw RPCError(
                        .failedPrecondition,
                        today < h.start
                            ? "this habit starts on \(h.start): nothing to record today (\(today))"
                            : "this habit is not scheduled today (\(today)): events are for scheduled days")
                }
                if let existing = try tx.queryOne("SELECT id FROM habit_events WHERE habit_id = ? AND day = ?", habitID, today.key)?.get(
                    0, as: String.self)
                {
                    throw RPCError(.alreadyExists, "today's event of this habit exists already: \(existing) (edit it instead)")
                }
                let previous = try tx.queryOne(
                    "SELECT day, utc_offset, time_zone FROM habit_events WHERE habit_id = ? AND day < ? ORDER BY day DESC LIMIT 1", habitID,
                    today.key)
                let excused = HabitRules.excusedFrom(
                    day: today, instantMilliseconds: now, previousOffsetSeconds: try previous.map { Int(try $0.get("utc_offset", as: Int64.self)) },
                    previousDay: try previous.map { LocalDate(key: try $0.get("day")) },
                    previousZone: try previous.flatMap { try $0.get("time_zone", as: String?.self) }, offsetSeconds: offset)
                let id = ULID.make(now: now)
                try tx.execute(
                    """
                    INSERT INTO habit_events (id, habit_id, owner_id, day, comment, comment_folded, latitude, longitude, utc_offset, excused_from,
                        created_at, updated_at, photo_size, photo, time_zone) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """, id, habitID, me, today.key, comment, TextFold.fold(comment), location?.latitude, location?.longitude, Int64(offset),
                    excused?.key, now, now, Int64(photo.count), photo.isEmpty ? nil : photo, zone.identifier)
                guard let e = try HabitStore.oneEvent(tx, id: id) else { throw RPCError(.internal, "event vanished") }
                var out = Tasks_V1_CreateHabitEventResponse()
                out.event = HabitStore.proto(e, users: try UserDirectory.cached(tx, [me]))
                return out
            }
        }
        var out = response
        out.replayed = replayed
        return out
    }

    /// The event if `me` may read it.
    func readableEvent(_ raw: String, me: String) async throws -> HabitStore.Event {
        var errors = FieldErrors()
        let id = FieldRules.id(raw, field: "event_id", into: &errors)
        try errors.throwIfAny()
        guard let e = try await core.read({ c in try HabitStore.oneEvent(c, id: id) }), try await mayRead(owner: e.ownerID, me: me) else {
            throw RPCError(.notFound, Self.habitEventNotFound)
        }
        return e
    }

    public func getHabitEvent(request: Tasks_V1_GetHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_GetHabitEventResponse {
        let me = try core.caller(context)
        let e = try await readableEvent(request.eventId, me: me)
        let users = try await core.read { c in try UserDirectory.cached(c, [e.ownerID]) }
        var response = Tasks_V1_GetHabitEventResponse()
        response.event = HabitStore.proto(e, users: users)
        return response
    }

    public func updateHabitEvent(request: Tasks_V1_UpdateHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_UpdateHabitEventResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.eventId, field: "event_id", into: &errors)
        let comment = request.hasComment ? FieldRules.text(request.comment.value, field: "comment", 0...20, into: &errors) : nil
        if request.hasPhoto { Self.habitPhoto(request.photo.photo, field: "photo.photo", into: &errors) }
        var newLocation: GeoPoint?? = nil
        if request.hasLocation {
            newLocation = .some(request.location.hasLocation ? Geo.point(request.location.location, field: "location.location", into: &errors) : nil)
        }
        let location = newLocation
        try errors.throwIfAny()
        guard let owner = try await core.read({ c in try HabitStore.oneEvent(c, id: id)?.ownerID }) else {
            throw RPCError(.notFound, Self.habitEventNotFound)
        }
        try await requireHabitOwner(owner, me: me, notFound: Self.habitEventNotFound)
        let now = core.now
        let photo: [UInt8]? = request.hasPhoto ? request.photo.photo : nil
        let e = try await core.write { tx -> HabitStore.Event in
            if let comment {
                try tx.execute("UPDATE habit_events SET comment = ?, comment_folded = ? WHERE id = ?", comment, TextFold.fold(comment), id)
            }
            if let photo {
                try tx.execute(
                    "UPDATE habit_events SET photo = ?, photo_size = ? WHERE id = ?", photo.isEmpty ? nil : photo, Int64(photo.count), id)
            }
            if let location {
                try tx.execute("UPDATE habit_events SET latitude = ?, longitude = ? WHERE id = ?", location?.latitude, location?.longitude, id)
            }
            try tx.execute("UPDATE habit_events SET updated_at = ? WHERE id = ?", now, id)
            guard let e = try HabitStore.oneEvent(tx, id: id) else { throw RPCError(.notFound, Self.habitEventNotFound) }
            return e
        }
        let users = try await core.read { c in try UserDirectory.cached(c, [e.ownerID]) }
        var response = Tasks_V1_UpdateHabitEventResponse()
        response.event = HabitStore.proto(e, users: users)
        return response
    }

    public func deleteHabitEvent(request: Tasks_V1_DeleteHabitEventRequest, context: ServerContext) async throws -> Tasks_V1_DeleteHabitEventResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let id = FieldRules.id(request.eventId, field: "event_id", into: &errors)
        try errors.throwIfAny()
        guard let owner = try await core.read({ c in try HabitStore.oneEvent(c, id: id)?.ownerID }) else {
            throw RPCError(.notFound, Self.habitEventNotFound)
        }
        try await requireHabitOwner(owner, me: me, notFound: Self.habitEventNotFound)
        try await core.write { tx in
            try tx.execute("DELETE FROM habit_events WHERE id = ?", id)
            if tx.changes == 0 { throw RPCError(.notFound, Self.habitEventNotFound) }
        }
        return Tasks_V1_DeleteHabitEventResponse()
    }

    // MARK: History

    /// FOLLOWING without a place: the latest event (matching the comment filter) of each habit of
    /// `owners`, newest first after the page token — one backward seek per habit on
    /// `habit_events_day` (one event per habit and day, so the latest day is the latest event)
    /// instead of numbering every event of every followed user on every page.
    static func latestPerHabit(
        _ c: Connection, owners: [String], habitIDs: [String], comment: String?, after cursor: [String]?, limit: Int, photos: Bool
    ) throws -> ([HabitStore.Event], Bool) {
        var args: [DatabaseValue] = []
        var latest = "SELECT l.id FROM habit_events l WHERE l.habit_id = h.id"
        if let comment {
            latest += " AND instr(l.comment_folded, ?) > 0"
            args.append(.text(TextFold.fold(comment)))
        }
        latest += " ORDER BY l.day DESC LIMIT 1"
        var conditions = ["h.owner_id IN (\(owners.map { _ in "?" }.joined(separator: ",")))"]
        args += owners.map { .text($0) }
        if !habitIDs.isEmpty {
            conditions.append("h.id IN (\(habitIDs.map { _ in "?" }.joined(separator: ",")))")
            args += habitIDs.map { .text($0) }
        }
        if let cursor, let day = Int64(cursor[0]), let at = Int64(cursor[1]) {
            conditions.append("(e.day, e.created_at, e.id) < (?, ?, ?)")
            args += [.integer(day), .integer(at), .text(cursor[2])]
        }
        let sql = """
            SELECT \(HabitStore.eventColumns(photo: photos)) FROM habits h CROSS JOIN habit_events e ON e.id = (\(latest))
            WHERE \(conditions.joined(separator: " AND ")) ORDER BY e.day DESC, e.created_at DESC, e.id DESC LIMIT ?
            """
        args.append(.integer(Int64(limit + 1)))
        let rows = try c.query(sql, arguments: args)
        return (try rows.prefix(limit).map { try HabitStore.event($0, photo: photos) }, rows.count > limit)
    }

    public func listHabitHistory(request: Tasks_V1_ListHabitHistoryRequest, context: ServerContext) async throws -> Tasks_V1_ListHabitHistoryResponse
    {
        let me = try core.caller(context)
        var errors = FieldErrors()
        let scope: Tasks_V1_HabitHistoryScope
        switch request.scope {
        case .unspecified, .mine: scope = .mine
        case .following, .all: scope = request.scope
        default:
            scope = .mine
            errors.add("scope", "unknown scope")
        }
        let habitIDs = FieldRules.ids(request.habitIds, field: "habit_ids", minimum: 0, maximum: 50, into: &errors)
        var commentFilter: String?
        if !request.commentContains.isEmpty {
            commentFilter = FieldRules.text(request.commentContains, field: "comment_contains", 1...20, into: &errors)
        }
        var near: (GeoPoint, Double)?
        if request.hasNear {
            let r = request.near.radiusKm == 0 ? 5 : request.near.radiusKm
            if !r.isFinite || r <= 0 || r > 50 { errors.add("near.radius_km", "must be more than 0 and at most 50 km (0 means 5)") }
            if !request.near.hasCenter { errors.add("near.center", "required") }
            if let c = request.near.hasCenter ? Geo.point(request.near.center, field: "near.center", into: &errors) : nil { near = (c, r) }
        }
        let photos = request.includePhotos
        var pageSize = FieldRules.pageSize(request.pageSize, defaultSize: photos ? 20 : 50, into: &errors)
        if photos { pageSize = min(pageSize, 20) }
        let filters =
            "history:\(me):\(scope.rawValue):\(habitIDs):\(commentFilter ?? ""):\(near.map { "\($0.0.latitude):\($0.0.longitude):\($0.1)" } ?? ""):\(photos)"
        let cursor = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 3, into: &errors)
        try errors.throwIfAny()

        // Whose events: mine, the followed users', or both.
        var owners: [String] = scope == .following ? [] : [me]
        if scope != .mine { owners += try await core.peers.followed(by: me, limit: core.configuration.maxFollowedUsers) }
        // Named habits must be readable (NOT_FOUND naming each one that is not).
        if !habitIDs.isEmpty {
            let found = try await core.read { c in try HabitStore.load(c, ids: habitIDs) }
            // Owners not already known readable are asked of social once each, all at once (not
            // one call after another: up to 50 habits could name 50 owners).
            let known = Set(owners + [me])
            let toAsk = Set(found.map(\.ownerID)).subtracting(known)
            let peers = core.peers
            let followed = try await withThrowingTaskGroup(of: (String, Bool).self) { group in
                for owner in toAsk { group.addTask { (owner, try await peers.follows(me, owner)) } }
                var answers: Set<String> = []
                for try await (owner, follows) in group where follows { answers.insert(owner) }
                return answers
            }
            var missing = FieldErrors()
            for (i, id) in habitIDs.enumerated() {
                guard let h = found.first(where: { $0.id == id }), known.contains(h.ownerID) || followed.contains(h.ownerID) else {
                    missing.add("habit_ids[\(i)]", Self.habitNotFound)
                    continue
                }
            }
            try missing.throwIfAny(.notFound, summary: "not found")
        }
        var response = Tasks_V1_ListHabitHistoryResponse()
        guard !owners.isEmpty else { return response }
        let latestOnly = scope == .following
        let (whose, comment, circle, size) = (owners, commentFilter, near, pageSize)
        let (events, more) = try await core.read { c -> ([HabitStore.Event], Bool) in
            if latestOnly, circle == nil {
                return try Self.latestPerHabit(c, owners: whose, habitIDs: habitIDs, comment: comment, after: cursor, limit: size, photos: photos)
            }
            var conditions = ["e.owner_id IN (\(whose.map { _ in "?" }.joined(separator: ",")))"]
            var args: [DatabaseValue] = whose.map { .text($0) }
            var from = "habit_events e JOIN habits h ON h.id = e.habit_id"
            if !habitIDs.isEmpty {
                conditions.append("e.habit_id IN (\(habitIDs.map { _ in "?" }.joined(separator: ",")))")
                args += habitIDs.map { .text($0) }
            }
            if let comment {
                // TextFold's rule: the folded filter, a substring of the folded comment (instr: no LIKE wildcards).
                conditions.append("instr(e.comment_folded, ?) > 0")
                args.append(.text(TextFold.fold(comment)))
            }
            if let (center, r) = circle {
                // Start from the R*Tree (CROSS JOIN keeps SQLite from scanning the owner's events).
                from = "habit_event_geo g CROSS JOIN habit_events e ON e.n = g.id JOIN habits h ON h.id = e.habit_id"
                let box = Geo.rtreeCondition(Geo.boundingBox(center: center, radiusKm: r), alias: "g")
                conditions.append(box.sql)
                args += box.args
                let d = Geo.sqlDistance(
                    lat: "e.latitude", lon: "e.longitude", latParam: MarketSearch.literal(center.latitude),
                    lonParam: MarketSearch.literal(center.longitude))
                conditions.append("\(d) <= ?")
                args.append(.real(r))
            }
            let rank = latestOnly ? ", ROW_NUMBER() OVER (PARTITION BY e.habit_id ORDER BY e.day DESC, e.created_at DESC, e.id DESC) AS rn" : ""
            var sql =
                "SELECT * FROM (SELECT \(HabitStore.eventColumns(photo: photos))\(rank) FROM \(from) WHERE \(conditions.joined(separator: " AND ")))"
            var outer: [String] = latestOnly ? ["rn = 1"] : []
            if let cursor, let day = Int64(cursor[0]), let at = Int64(cursor[1]) {
                outer.append("(day, created_at, id) < (?, ?, ?)")
                args += [.integer(day), .integer(at), .text(cursor[2])]
            }
            if !outer.isEmpty { sql += " WHERE " + outer.joined(separator: " AND ") }
            sql += " ORDER BY day DESC, created_at DESC, id DESC LIMIT ?"
            args.append(.integer(Int64(size + 1)))
            let rows = try c.query(sql, arguments: args)
            return (try rows.prefix(size).map { try HabitStore.event($0, photo: photos) }, rows.count > size)
        }
        let eventOwners = events.map { $0.ownerID }
        let users = try await core.read { c in try UserDirectory.cached(c, eventOwners) }
        response.events = events.map { HabitStore.proto($0, users: users) }
        if more, let last = events.last {
            response.nextPageToken = core.pageTokens.make(cursor: [String(last.day.key), String(last.createdAt), last.id], filters: filters)
        }
        return response
    }
}
