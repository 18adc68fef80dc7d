import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Storage
import Testing

@testable import Tasks

func newHabit(
    _ title: String = "Morning run", reason: String = "", days: [Common_V1_Weekday] = [.monday, .wednesday, .friday], start: Common_V1_Date? = nil,
    zone: String = "America/Edmonton", key: String = UUID().uuidString
) -> Tasks_V1_CreateHabitRequest {
    var r = Tasks_V1_CreateHabitRequest()
    r.idempotencyKey = key
    r.title = title
    r.reason = reason
    r.days = days
    if let start { r.startDate = start }
    r.timeZone = zone
    return r
}

func newEvent(
    _ habit: String, comment: String = "", photo: [UInt8] = [], at location: Common_V1_GeoPoint? = nil, zone: String = "America/Edmonton",
    key: String = UUID().uuidString
) -> Tasks_V1_CreateHabitEventRequest {
    var r = Tasks_V1_CreateHabitEventRequest()
    r.idempotencyKey = key
    r.habitId = habit
    r.comment = comment
    r.photo = photo
    if let location { r.location = location }
    r.timeZone = zone
    return r
}

extension World {
    func habit(_ who: User, _ r: Tasks_V1_CreateHabitRequest) async throws -> Tasks_V1_Habit {
        try await tasks.createHabit(r, options: who.options).habit
    }
    func event(_ who: User, _ r: Tasks_V1_CreateHabitEventRequest) async throws -> Tasks_V1_HabitEvent {
        try await tasks.createHabitEvent(r, options: who.options).event
    }
    func history(_ who: User, _ r: Tasks_V1_ListHabitHistoryRequest) async throws -> [Tasks_V1_HabitEvent] {
        var r = r
        var out: [Tasks_V1_HabitEvent] = []
        repeat {
            let page = try await tasks.listHabitHistory(r, options: who.options)
            out += page.events
            r.pageToken = page.nextPageToken
        } while !r.pageToken.isEmpty
        return out
    }
}

@Suite("Tasks: habits over gRPC", .serialized)
struct HabitTests {
    /// 2025-03-03 (a Monday) 15:00 UTC = 08:00 in Edmonton.
    static let monday = utc(2025, 3, 3, 15)
    static let day: Duration = .seconds(86400)

    @Test func createViewEditDeleteWithMetricsDayByDay() async throws {
        try await withWorld(now: Self.monday) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let key = UUID().uuidString
            let created = try await w.tasks.createHabit(newHabit(" Morning run ", reason: "Half marathon", key: key), options: alice.options)
            let h = created.habit
            #expect(h.title == "Morning run" && h.days == [.monday, .wednesday, .friday] && h.startDate == date(2025, 3, 3))
            #expect(h.metrics.dueToday && !h.metrics.doneToday && h.metrics.scheduledDays == 1 && h.metrics.completionRate == 0)
            #expect(try await w.tasks.createHabit(newHabit(" Morning run ", reason: "Half marathon", key: key), options: alice.options).replayed)
            await expectFailure(.failedPrecondition, fields: ["idempotency_key"]) {
                try await w.tasks.createHabit(newHabit("Other", key: key), options: alice.options)
            }
            var bad = newHabit(String(repeating: "t", count: 21), reason: String(repeating: "r", count: 31), days: [.unspecified], zone: "Mars/Base")
            bad.startDate = date(2025, 2, 30)
            bad.idempotencyKey = ""
            await expectFailure(.invalidArgument, fields: ["idempotency_key", "title", "reason", "days[0]", "time_zone", "start_date"]) {
                try await w.tasks.createHabit(bad, options: alice.options)
            }
            await expectFailure(.invalidArgument, fields: ["days"]) { try await w.tasks.createHabit(newHabit(days: []), options: alice.options) }

            // Mon, Wed done; Fri missed; Mon done: current 1, longest 2, 3 of 4.
            _ = try await w.event(alice, newEvent(h.habitId, comment: "5k"))
            await expectFailure(.alreadyExists) { try await w.event(alice, newEvent(h.habitId)) }
            w.clock.advance(by: Self.day)  // Tuesday: not scheduled
            await expectFailure(.failedPrecondition) { try await w.event(alice, newEvent(h.habitId)) }
            w.clock.advance(by: Self.day)  // Wednesday
            _ = try await w.event(alice, newEvent(h.habitId))
            w.clock.advance(by: Self.day * 5)  // Monday 10
            _ = try await w.event(alice, newEvent(h.habitId))
            var get = Tasks_V1_GetHabitRequest()
            get.habitId = h.habitId
            get.timeZone = "America/Edmonton"
            let m = try await w.tasks.getHabit(get, options: alice.options).habit.metrics
            #expect(m.scheduledDays == 4 && m.completedDays == 3 && m.currentStreak == 1 && m.longestStreak == 2 && m.doneToday)
            #expect(m.weeks.map(\.completedDays) == [2, 1] && m.weeks.map(\.scheduledDays) == [3, 1])

            // Only followers read it; only the owner changes it.
            await expectFailure(.notFound) { try await w.tasks.getHabit(get, options: bob.options) }
            try await w.follow(bob, alice)
            #expect(try await w.tasks.getHabit(get, options: bob.options).habit.habitId == h.habitId)
            var edit = Tasks_V1_UpdateHabitRequest()
            edit.habitId = h.habitId
            edit.reason.value = "Full marathon"
            edit.days.days = [.monday, .tuesday, .wednesday, .friday]
            edit.timeZone = "America/Edmonton"
            await expectFailure(.permissionDenied) { try await w.tasks.updateHabit(edit, options: bob.options) }
            let edited = try await w.tasks.updateHabit(edit, options: alice.options).habit
            #expect(edited.reason == "Full marathon" && edited.days.count == 4 && edited.title == "Morning run")
            #expect(edited.metrics.scheduledDays == 5)  // Tuesday 4 counts now (missed)
            var badEdit = Tasks_V1_UpdateHabitRequest()
            badEdit.habitId = h.habitId
            badEdit.title.value = ""
            badEdit.days = Tasks_V1_WeekdaySet()
            badEdit.startDate = date(1999, 1, 1)
            await expectFailure(.invalidArgument, fields: ["title", "days.days", "start_date"]) {
                try await w.tasks.updateHabit(badEdit, options: alice.options)
            }

            // Blocked: gone.
            try await w.block(alice, bob)
            await expectFailure(.notFound) { try await w.tasks.getHabit(get, options: bob.options) }

            var del = Tasks_V1_DeleteHabitRequest()
            del.habitId = h.habitId
            await expectFailure(.notFound) { try await w.tasks.deleteHabit(del, options: bob.options) }
            #expect(try await w.tasks.deleteHabit(del, options: alice.options).deletedEventCount == 3)
            await expectFailure(.notFound) { try await w.tasks.getHabit(get, options: alice.options) }
            #expect(try await w.core.read { c in try c.queryOne("SELECT COUNT(*) FROM habit_events")!.get(0, as: Int64.self) } == 0)
        }
    }

    /// Staying in Berlin across the spring-forward change and skipping Sunday is a missed day; a
    /// real flight from New York to Tokyo over the same night still excuses the skipped day.
    @Test func daylightSavingInOneZoneExcusesNothingButATripEastDoes() async throws {
        try await withWorld(now: utc(2025, 3, 27, 11)) { w in  // Thursday 12:00 in Berlin, 07:00 in New York
            let alice = try await w.user("alice")
            let daily: [Common_V1_Weekday] = [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday]
            let home = try await w.habit(alice, newHabit("Stretch", days: daily, zone: "Europe/Berlin"))
            let trip = try await w.habit(alice, newHabit("Read", days: daily, zone: "America/New_York"))
            for _ in 0..<3 {  // Thursday, Friday, Saturday
                _ = try await w.event(alice, newEvent(home.habitId, zone: "Europe/Berlin"))
                _ = try await w.event(alice, newEvent(trip.habitId, zone: "America/New_York"))
                w.clock.advance(by: Self.day)
            }
            // Monday 31 at 00:30 in Berlin (+2 since Sunday; Saturday's event was at +1) = Sunday
            // 22:30 UTC = Sunday 18:30 in New York = Monday 07:30 in Tokyo.
            w.clock.set(milliseconds: utc(2025, 3, 30, 22, 30))
            let stayed = try await w.event(alice, newEvent(home.habitId, zone: "Europe/Berlin"))
            let flew = try await w.event(alice, newEvent(trip.habitId, zone: "Asia/Tokyo"))
            #expect(stayed.date == date(2025, 3, 31) && flew.date == date(2025, 3, 31))
            var get = Tasks_V1_GetHabitRequest()
            get.habitId = home.habitId
            get.timeZone = "Europe/Berlin"
            let m = try await w.tasks.getHabit(get, options: alice.options).habit.metrics
            #expect(m.currentStreak == 1 && m.longestStreak == 3 && m.scheduledDays == 5 && m.completedDays == 4, "\(m)")
            get.habitId = trip.habitId
            get.timeZone = "Asia/Tokyo"
            let t = try await w.tasks.getHabit(get, options: alice.options).habit.metrics
            #expect(t.currentStreak == 4 && t.longestStreak == 4 && t.scheduledDays == 4 && t.completedDays == 4, "\(t)")
            let zones = try await w.core.read { c in
                try c.query("SELECT DISTINCT time_zone FROM habit_events ORDER BY 1").map { try $0.get(0, as: String.self) }
            }
            #expect(zones == ["America/New_York", "Asia/Tokyo", "Europe/Berlin"])
        }
    }

    /// FOLLOWING (the latest event of each followed habit, filters first) answers, page by page,
    /// what numbering every event with a window function answers (the former query).
    @Test func followingHistoryMatchesTheWindowFunctionReference() async throws {
        try await withWorld(now: Self.monday) { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            try await w.follow(alice, bob)
            try await w.follow(alice, carol)
            let daily: [Common_V1_Weekday] = [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday]
            var habits: [String] = []
            for (who, n) in [(bob, 4), (carol, 3), (alice, 2)] {
                for i in 0..<n { habits.append(try await w.habit(who, newHabit("H\(who.id.suffix(3))\(i)", days: daily)).habitId) }
            }
            for d in 0..<6 {
                for (i, h) in habits.enumerated() where (i + d) % 3 != 0 {
                    let owner = i < 4 ? bob : i < 7 ? carol : alice
                    _ = try await w.event(owner, newEvent(h, comment: (i * d) % 2 == 0 ? "run 5k" : "rest"))
                }
                w.clock.advance(by: Self.day)
            }
            let followed = [bob.id, carol.id]
            for (comment, pageSize) in [("", 2), ("5K", 3), ("rest", 1)] {
                var h = Tasks_V1_ListHabitHistoryRequest()
                h.scope = .following
                h.commentContains = comment
                h.pageSize = Int32(pageSize)
                let got = try await w.history(alice, h).map(\.eventId)
                let expected = try await w.core.read { c in
                    var sql = """
                        SELECT id FROM (SELECT e.id, e.day, e.created_at, ROW_NUMBER() OVER (PARTITION BY e.habit_id
                            ORDER BY e.day DESC, e.created_at DESC, e.id DESC) AS rn FROM habit_events e WHERE e.owner_id IN (?, ?)
                        """
                    var args: [DatabaseValue] = followed.map { .text($0) }
                    if !comment.isEmpty {
                        sql += " AND e.comment LIKE ?"
                        args.append(.text("%\(comment)%"))
                    }
                    sql += ") WHERE rn = 1 ORDER BY day DESC, created_at DESC, id DESC"
                    return try c.query(sql, arguments: args).map { try $0.get(0, as: String.self) }
                }
                #expect(got == expected && got.count == (comment.isEmpty ? 7 : got.count), "\(comment)")
                #expect(!got.isEmpty)
                h.habitIds = [habits[1], habits[5]]
                let some = try await w.history(alice, h).map(\.eventId)
                let (h1, h5) = (habits[1], habits[5])
                let inThose = try await w.core.read { c in
                    try c.query("SELECT id FROM habit_events WHERE habit_id IN (?, ?)", h1, h5).map { try $0.get(0, as: String.self) }
                }
                #expect(some == expected.filter { inThose.contains($0) }, "\(comment) habit_ids")
            }
        }
    }

    @Test func listsTodayAndFollowedHabitsInTheCallersZone() async throws {
        // 2025-03-03 04:00 UTC: still Sunday 2 in Edmonton, Monday 3 in Berlin.
        try await withWorld(now: utc(2025, 3, 3, 4)) { w in
            let (alice, bob, carol) = (try await w.user("alice"), try await w.user("bob"), try await w.user("carol"))
            let run = try await w.habit(alice, newHabit("Run", start: date(2025, 3, 1), zone: "Europe/Berlin"))
            let read = try await w.habit(alice, newHabit("read", days: [.sunday, .monday], start: date(2025, 3, 1), zone: "Europe/Berlin"))
            _ = try await w.habit(alice, newHabit("Yoga", days: [.tuesday], start: date(2025, 3, 1), zone: "Europe/Berlin"))
            _ = try await w.event(alice, newEvent(read.habitId, zone: "Europe/Berlin"))

            var today = Tasks_V1_ListTodayHabitsRequest()
            today.timeZone = "Europe/Berlin"
            let berlin = try await w.tasks.listTodayHabits(today, options: alice.options)
            #expect(berlin.today == date(2025, 3, 3))
            #expect(berlin.habits.map(\.habit.title) == ["Run", "read"])  // not done first, then title
            #expect(berlin.habits[0].todayEventId.isEmpty && !berlin.habits[1].todayEventId.isEmpty)
            today.timeZone = "America/Edmonton"
            let edmonton = try await w.tasks.listTodayHabits(today, options: alice.options)
            #expect(edmonton.today == date(2025, 3, 2) && edmonton.habits.map(\.habit.title) == ["read"])
            today.timeZone = "Nowhere/City"
            today.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["time_zone", "page_size"]) {
                try await w.tasks.listTodayHabits(today, options: alice.options)
            }

            var mine = Tasks_V1_ListMyHabitsRequest()
            mine.pageSize = 2
            let p1 = try await w.tasks.listMyHabits(mine, options: alice.options)
            mine.pageToken = p1.nextPageToken
            let p2 = try await w.tasks.listMyHabits(mine, options: alice.options)
            #expect((p1.habits + p2.habits).map(\.title) == ["read", "Run", "Yoga"] && p2.nextPageToken.isEmpty)
            #expect(try await w.tasks.listMyHabits(Tasks_V1_ListMyHabitsRequest(), options: bob.options).habits.isEmpty)

            // Followed: by owner username then title; a named owner must be followed.
            _ = try await w.habit(carol, newHabit("Swim", zone: "Europe/Berlin"))
            try await w.follow(bob, alice)
            try await w.follow(bob, carol)
            var f = Tasks_V1_ListFollowedHabitsRequest()
            let followed = try await w.tasks.listFollowedHabits(f, options: bob.options).habits
            #expect(followed.map(\.title) == ["read", "Run", "Yoga", "Swim"])
            f.ownerUserId = carol.id
            #expect(try await w.tasks.listFollowedHabits(f, options: bob.options).habits.map(\.title) == ["Swim"])
            f.ownerUserId = bob.id
            await expectFailure(.permissionDenied) { try await w.tasks.listFollowedHabits(f, options: carol.options) }
            // A block removes the follow (social): carol's habits leave bob's feed.
            try await w.block(carol, bob)
            f.ownerUserId = ""
            #expect(try await w.tasks.listFollowedHabits(f, options: bob.options).habits.map(\.title) == ["read", "Run", "Yoga"])
            // Social down: a clear UNAVAILABLE.
            w.setSocialDown(true)
            await expectFailure(.unavailable) { try await w.tasks.listFollowedHabits(f, options: bob.options) }
            w.setSocialDown(false)
            _ = run
        }
    }

    @Test func eventsWithPhotosAndPlacesAndTheirHistory() async throws {
        try await withWorld(now: Self.monday) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let daily: [Common_V1_Weekday] = [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday]
            let run = try await w.habit(alice, newHabit("Run", days: daily))
            let read = try await w.habit(alice, newHabit("Read", days: daily))
            let bobs = try await w.habit(bob, newHabit("Bob's", days: daily))
            let office = point(53.5271, -113.5301)
            let key = UUID().uuidString
            let first = try await w.tasks.createHabitEvent(
                newEvent(run.habitId, comment: "5k easy pace", photo: png, at: office, key: key), options: alice.options)
            #expect(first.event.photo == png && first.event.photoSizeBytes == Int32(png.count) && first.event.date == date(2025, 3, 3))
            #expect(first.event.habitTitle == "Run" && first.event.location == office && first.event.owner.userId == alice.id)
            #expect(
                try await w.tasks.createHabitEvent(
                    newEvent(run.habitId, comment: "5k easy pace", photo: png, at: office, key: key), options: alice.options
                ).replayed)
            await expectFailure(.invalidArgument, fields: ["comment", "photo", "location.latitude", "time_zone"]) {
                try await w.event(
                    alice,
                    newEvent(read.habitId, comment: String(repeating: "c", count: 21), photo: Array("GIF89a".utf8), at: point(-91, 0), zone: "x"))
            }
            await expectFailure(.invalidArgument, fields: ["photo"]) {
                try await w.event(alice, newEvent(read.habitId, photo: [0xFF, 0xD8, 0xFF] + [UInt8](repeating: 1, count: 65_533)))
            }
            try await w.follow(bob, alice)
            await expectFailure(.permissionDenied, "a follower cannot add events") { try await w.event(bob, newEvent(run.habitId)) }
            let far = try await w.event(alice, newEvent(read.habitId, comment: "Chapter 3", at: point(53.6, -113.3)))  // ~15 km away
            _ = try await w.event(bob, newEvent(bobs.habitId, comment: "5k too", at: office))
            w.clock.advance(by: Self.day)
            let second = try await w.event(alice, newEvent(run.habitId, comment: "5K tempo"))
            _ = try await w.event(bob, newEvent(bobs.habitId, comment: "again"))

            // View, edit (comment, photo removed, place removed), delete.
            var g = Tasks_V1_GetHabitEventRequest()
            g.eventId = first.event.eventId
            #expect(try await w.tasks.getHabitEvent(g, options: bob.options).event.photo == png)
            var u = Tasks_V1_UpdateHabitEventRequest()
            u.eventId = first.event.eventId
            u.comment.value = "5k in 26:40, PB"
            u.photo = Tasks_V1_HabitEventPhotoUpdate()
            await expectFailure(.permissionDenied) { try await w.tasks.updateHabitEvent(u, options: bob.options) }
            let edited = try await w.tasks.updateHabitEvent(u, options: alice.options).event
            #expect(edited.comment == "5k in 26:40, PB" && edited.photo.isEmpty && edited.photoSizeBytes == 0 && edited.location == office)
            u = Tasks_V1_UpdateHabitEventRequest()
            u.eventId = first.event.eventId
            u.photo.photo = jpeg
            let withJPEG = try await w.tasks.updateHabitEvent(u, options: alice.options).event
            #expect(withJPEG.photo == jpeg && withJPEG.comment == "5k in 26:40, PB")

            // History: mine, newest first; by habit; by comment; within 5 km; following; all.
            var h = Tasks_V1_ListHabitHistoryRequest()
            h.pageSize = 1
            #expect(try await w.history(alice, h).map(\.eventId) == [second.eventId, far.eventId, first.event.eventId])
            h.habitIds = [run.habitId]
            #expect(try await w.history(alice, h).map(\.eventId) == [second.eventId, first.event.eventId])
            h.habitIds = []
            h.commentContains = "5K"
            #expect(try await w.history(alice, h).map(\.eventId) == [second.eventId, first.event.eventId])
            h.commentContains = ""
            h.near.center = point(53.5232, -113.5263)
            h.near.radiusKm = 0  // 5 km
            let nearMe = try await w.history(alice, h)
            #expect(nearMe.map(\.eventId) == [first.event.eventId] && nearMe[0].photo.isEmpty && nearMe[0].photoSizeBytes > 0)
            h.near.radiusKm = 20
            #expect(try await w.history(alice, h).count == 2)
            h.clearNear()
            h.scope = .following
            let feed = try await w.history(bob, h)
            #expect(feed.map(\.habitTitle) == ["Run", "Read"])  // the latest event of each followed habit
            h.scope = .all
            #expect(try await w.history(bob, h).count == 5)
            h.includePhotos = true
            h.pageSize = 100
            let withPhotos = try await w.tasks.listHabitHistory(h, options: bob.options)
            #expect(withPhotos.events.count == 5 && withPhotos.events.contains { $0.photo == jpeg })
            // Errors: named together; unreadable habits NOT_FOUND.
            var bad = Tasks_V1_ListHabitHistoryRequest()
            bad.commentContains = String(repeating: "c", count: 21)
            bad.near.radiusKm = 51
            bad.pageSize = -1
            await expectFailure(.invalidArgument, fields: ["comment_contains", "near.radius_km", "near.center", "page_size"]) {
                try await w.tasks.listHabitHistory(bad, options: alice.options)
            }
            var foreign = Tasks_V1_ListHabitHistoryRequest()
            foreign.habitIds = [bobs.habitId, "nope"]
            await expectFailure(.notFound, fields: ["habit_ids[0]", "habit_ids[1]"]) {
                try await w.tasks.listHabitHistory(foreign, options: alice.options)
            }

            var d = Tasks_V1_DeleteHabitEventRequest()
            d.eventId = far.eventId
            await expectFailure(.permissionDenied) { try await w.tasks.deleteHabitEvent(d, options: bob.options) }
            _ = try await w.tasks.deleteHabitEvent(d, options: alice.options)
            await expectFailure(.notFound) { try await w.tasks.deleteHabitEvent(d, options: alice.options) }
            g.eventId = far.eventId
            await expectFailure(.notFound) { try await w.tasks.getHabitEvent(g, options: alice.options) }

            // Account deletion: the user's habits and events go.
            var e = Tasks_V1_EraseUserRequest()
            e.eventId = "erase-alice"
            e.userId = alice.id
            _ = try await w.internalAPI.eraseUser(e)
            let left = try await w.core.read { c in
                try c.queryOne("SELECT (SELECT COUNT(*) FROM habits), (SELECT COUNT(*) FROM habit_events), (SELECT COUNT(*) FROM habit_event_geo)")!
            }
            #expect(try left.get(0, as: Int64.self) == 1 && left.get(1, as: Int64.self) == 2 && left.get(2, as: Int64.self) == 1)
        }
    }
}
