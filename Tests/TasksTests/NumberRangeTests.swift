import Contracts
import Foundation
import RPCCore
import ServiceKit
import ServiceKitTesting
import Testing

@testable import Tasks

/// Issue 35: every date, number and coordinate a client sends tasks (team tasks, chores, habits,
/// marketplace) is checked for range before it is used, answered INVALID_ARGUMENT naming the
/// field. A trap (overflow, a range with its bounds reversed, an index out of range) would end this
/// test process, and in production the service; afterwards the service still serves.
@Suite("Tasks: numbers at their extremes")
struct NumberRangeTests {
    static let pageSizes: [Int32] = [-1, .min]
    /// Dates that are not real dates of 2000..2100 (2030 is no leap year).
    static let badDates: [(Int32, Int32, Int32)] = [
        (0, 1, 1), (1999, 12, 31), (2101, 1, 1), (10000, 1, 1), (.max, .max, .max), (.min, .min, .min), (-1, -1, -1),
        (2030, 13, 1), (2030, 0, 1), (2030, 1, 32), (2030, 1, 0), (2030, 2, 29), (2030, 2, 30), (2030, 4, 31), (2030, .max, 1),
        (2030, 1, .min),
    ]
    static let badCoordinates: [(Double, Double, [String])] = [
        (.nan, 0, ["latitude"]), (0, .nan, ["longitude"]), (.infinity, -.infinity, ["latitude", "longitude"]),
        (90.000_001, -180.000_001, ["latitude", "longitude"]), (-.greatestFiniteMagnitude, .greatestFiniteMagnitude, ["latitude", "longitude"]),
        (.signalingNaN, 0, ["latitude"]),
    ]

    static func point(_ latitude: Double, _ longitude: Double) -> Common_V1_GeoPoint {
        var p = Common_V1_GeoPoint()
        p.latitude = latitude
        p.longitude = longitude
        return p
    }

    static func cal(_ d: (Int32, Int32, Int32)) -> Common_V1_Date {
        var r = Common_V1_Date()
        (r.year, r.month, r.day) = d
        return r
    }

    @Test func choreDatesIntervalsWeekdaysRevisionsAndPageSizes() async throws {
        try await withWorld(now: utc(2030, 1, 10)) { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            let hh = try await w.household([alice, bob])
            for d in Self.badDates {
                let r = createChore(household: hh, due: Self.cal(d), assignees: [alice.id, bob.id])
                await expectFailure(.invalidArgument, fields: ["due_date"], "due \(d)") { try await w.tasks.createChore(r, options: alice.options) }
            }
            for days: Int32 in [.min, -1, 0, 366, .max] {
                var every = Tasks_V1_ChoreEveryNDays()
                every.days = days
                let r = createChore(household: hh, due: date(2030, 2, 1), assignees: [alice.id], recurrence: recurrence(.everyNDays(every)))
                await expectFailure(.invalidArgument, fields: ["recurrence.every_n_days.days"], "every \(days) days") {
                    try await w.tasks.createChore(r, options: alice.options)
                }
            }
            let weekdays = createChore(
                household: hh, due: date(2030, 2, 1), assignees: [alice.id],
                recurrence: weekly([.monday, .unrecognized(.max), .unrecognized(.min), .unrecognized(8), .unspecified]))
            await expectFailure(
                .invalidArgument,
                fields: (1...4).map { "recurrence.weekly.weekdays[\($0)]" }
            ) { try await w.tasks.createChore(weekdays, options: alice.options) }

            // A real chore: revisions at the Int64 extremes, on-demand dates, the feed's numbers.
            var onDemand = createChore(
                household: hh, due: date(2030, 1, 10), assignees: [alice.id, bob.id], recurrence: recurrence(.onDemand(Tasks_V1_ChoreOnDemand())))
            onDemand.name = "Descale the kettle"
            let chore = try await w.tasks.createChore(onDemand, options: alice.options).chore
            var finish = Tasks_V1_FinishChoreRequest()
            finish.choreId = chore.choreId
            var skip = Tasks_V1_SkipChoreRequest()
            skip.choreId = chore.choreId
            for revision: Int64 in [-1, .min] {
                finish.expectedRevision = revision
                await expectFailure(.invalidArgument, fields: ["expected_revision"]) { try await w.tasks.finishChore(finish, options: alice.options) }
                skip.expectedRevision = revision
                await expectFailure(.invalidArgument, fields: ["expected_revision"]) { try await w.tasks.skipChore(skip, options: alice.options) }
            }
            finish.expectedRevision = .max  // a number, just not this chore's revision
            await expectFailure(.aborted) { try await w.tasks.finishChore(finish, options: alice.options) }
            finish.expectedRevision = chore.revision
            let waiting = try await w.tasks.finishChore(finish, options: alice.options).chore
            #expect(waiting.status == .waiting)
            var again = Tasks_V1_RequestOnDemandChoreRequest()
            again.choreId = chore.choreId
            for d in Self.badDates {
                again.dueDate = Self.cal(d)
                await expectFailure(.invalidArgument, fields: ["due_date"], "due \(d)") {
                    try await w.tasks.requestOnDemandChore(again, options: bob.options)
                }
            }
            again.dueDate = date(2100, 12, 31)  // the last date of the range
            #expect(try await w.tasks.requestOnDemandChore(again, options: bob.options).chore.dueDate == date(2100, 12, 31))

            var list = Tasks_V1_ListChoresRequest()
            list.householdId = hh
            for size in Self.pageSizes {
                list.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listChores(list, options: alice.options) }
            }
            list.pageSize = .max
            list.statuses = [.active, .unrecognized(.max), .unrecognized(.min), .unrecognized(0)]
            await expectFailure(.invalidArgument, fields: ["statuses[1]", "statuses[2]", "statuses[3]"]) {
                try await w.tasks.listChores(list, options: alice.options)
            }
            list.statuses = []
            #expect(try await w.tasks.listChores(list, options: alice.options).chores.map(\.choreId) == [chore.choreId])

            var assigned = Tasks_V1_ListTasksAssignedToUserRequest()
            assigned.householdId = hh
            assigned.userId = alice.id
            for size in Self.pageSizes {
                assigned.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.internalAPI.listTasksAssignedToUser(assigned) }
            }
        }
    }

    @Test func teamTaskPageSizesAndViews() async throws {
        try await withWorld { w in
            let alice = try await w.user("alice")
            let task = try await w.tasks.createTeamTask(createTask(with: []), options: alice.options).task
            var mine = Tasks_V1_ListMyTeamTasksRequest()
            var comments = Tasks_V1_ListTeamTaskCommentsRequest()
            comments.taskId = task.taskId
            for size in Self.pageSizes {
                mine.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listMyTeamTasks(mine, options: alice.options) }
                comments.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) {
                    try await w.tasks.listTeamTaskComments(comments, options: alice.options)
                }
            }
            mine.pageSize = .max
            for view: Int32 in [3, -1, .max, .min] {
                mine.view = .unrecognized(view)
                await expectFailure(.invalidArgument, fields: ["view"]) { try await w.tasks.listMyTeamTasks(mine, options: alice.options) }
            }
            mine.view = .unspecified
            #expect(try await w.tasks.listMyTeamTasks(mine, options: alice.options).tasks.count == 1)
            comments.pageSize = .max
            #expect(try await w.tasks.listTeamTaskComments(comments, options: alice.options).comments.isEmpty)
        }
    }

    @Test func habitDatesWeekdaysPlacesRadiiAndPageSizes() async throws {
        try await withWorld(now: utc(2030, 1, 10)) { w in
            let alice = try await w.user("alice")
            var create = Tasks_V1_CreateHabitRequest()
            create.idempotencyKey = UUID().uuidString
            create.title = "Stretch"
            create.days = [.monday, .unrecognized(.max), .unrecognized(.min), .unspecified]
            await expectFailure(.invalidArgument, fields: ["days[1]", "days[2]", "days[3]"]) {
                try await w.tasks.createHabit(create, options: alice.options)
            }
            create.days = [.monday, .tuesday, .wednesday, .thursday, .friday, .saturday, .sunday]
            for d in Self.badDates {
                create.startDate = Self.cal(d)
                await expectFailure(.invalidArgument, fields: ["start_date"], "start \(d)") {
                    try await w.tasks.createHabit(create, options: alice.options)
                }
            }
            create.clearStartDate()
            let habit = try await w.tasks.createHabit(create, options: alice.options).habit

            var update = Tasks_V1_UpdateHabitRequest()
            update.habitId = habit.habitId
            for d in Self.badDates {
                update.startDate = Self.cal(d)
                await expectFailure(.invalidArgument, fields: ["start_date"], "start \(d)") {
                    try await w.tasks.updateHabit(update, options: alice.options)
                }
            }
            update.clearStartDate()
            var set = Tasks_V1_WeekdaySet()
            set.days = [.unrecognized(.max)]
            update.days = set
            await expectFailure(.invalidArgument, fields: ["days.days[0]"]) { try await w.tasks.updateHabit(update, options: alice.options) }
            // The far ends of the range: metrics from 2000 to today, and a start after today.
            update.clearDays()
            for d in [date(2000, 1, 1), date(2100, 12, 31)] {
                update.startDate = d
                #expect(try await w.tasks.updateHabit(update, options: alice.options).habit.startDate == d)
            }

            var event = Tasks_V1_CreateHabitEventRequest()
            event.idempotencyKey = UUID().uuidString
            event.habitId = habit.habitId
            for (lat, lon, fields) in Self.badCoordinates {
                event.location = Self.point(lat, lon)
                await expectFailure(.invalidArgument, fields: fields.map { "location.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.createHabitEvent(event, options: alice.options)
                }
            }
            update.startDate = date(2030, 1, 1)
            _ = try await w.tasks.updateHabit(update, options: alice.options)
            event.location = Self.point(-90, 180)
            let made = try await w.tasks.createHabitEvent(event, options: alice.options).event
            var move = Tasks_V1_UpdateHabitEventRequest()
            move.eventId = made.eventId
            for (lat, lon, fields) in Self.badCoordinates {
                var change = Tasks_V1_HabitEventLocationUpdate()
                change.location = Self.point(lat, lon)
                move.location = change
                await expectFailure(.invalidArgument, fields: fields.map { "location.location.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.updateHabitEvent(move, options: alice.options)
                }
            }

            var history = Tasks_V1_ListHabitHistoryRequest()
            for radius in [Double.nan, .infinity, -.infinity, -1, -0.000_001, 50.000_001, .greatestFiniteMagnitude, -.greatestFiniteMagnitude] {
                var near = Tasks_V1_HabitHistoryNear()
                near.center = Self.point(0, 0)
                near.radiusKm = radius
                history.near = near
                await expectFailure(.invalidArgument, fields: ["near.radius_km"], "radius \(radius)") {
                    try await w.tasks.listHabitHistory(history, options: alice.options)
                }
            }
            for (lat, lon, fields) in Self.badCoordinates {
                var near = Tasks_V1_HabitHistoryNear()
                near.center = Self.point(lat, lon)
                history.near = near
                await expectFailure(.invalidArgument, fields: fields.map { "near.center.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.listHabitHistory(history, options: alice.options)
                }
            }
            history.clearNear()
            for scope: Int32 in [4, -1, .max, .min] {
                history.scope = .unrecognized(scope)
                await expectFailure(.invalidArgument, fields: ["scope"]) { try await w.tasks.listHabitHistory(history, options: alice.options) }
            }
            history.scope = .mine
            for size in Self.pageSizes {
                history.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listHabitHistory(history, options: alice.options) }
                var my = Tasks_V1_ListMyHabitsRequest()
                my.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listMyHabits(my, options: alice.options) }
                var today = Tasks_V1_ListTodayHabitsRequest()
                today.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listTodayHabits(today, options: alice.options) }
                var followed = Tasks_V1_ListFollowedHabitsRequest()
                followed.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) {
                    try await w.tasks.listFollowedHabits(followed, options: alice.options)
                }
            }
            history.pageSize = .max
            var near = Tasks_V1_HabitHistoryNear()
            near.center = Self.point(-90, 180)
            near.radiusKm = 50
            history.near = near
            #expect(try await w.tasks.listHabitHistory(history, options: alice.options).events.map(\.eventId) == [made.eventId])
            var my = Tasks_V1_ListMyHabitsRequest()
            my.pageSize = .max
            #expect(try await w.tasks.listMyHabits(my, options: alice.options).habits.count == 1)
        }
    }

    @Test func marketPlacesDistancesAmountsFiltersAndPageSizes() async throws {
        try await withWorld { w in
            let (alice, bob) = (try await w.user("alice"), try await w.user("bob"))
            var create = Tasks_V1_CreateMarketTaskRequest()
            create.idempotencyKey = UUID().uuidString
            create.title = "Fix the fence"
            for (lat, lon, fields) in Self.badCoordinates {
                create.location = Self.point(lat, lon)
                await expectFailure(.invalidArgument, fields: fields.map { "location.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.createMarketTask(create, options: alice.options)
                }
            }
            create.location = Self.point(90, -180)
            let task = try await w.tasks.createMarketTask(create, options: alice.options).task

            var update = Tasks_V1_UpdateMarketTaskRequest()
            update.taskId = task.taskId
            for (lat, lon, fields) in Self.badCoordinates {
                var change = Tasks_V1_MarketTaskLocationUpdate()
                change.location = Self.point(lat, lon)
                update.location = change
                await expectFailure(.invalidArgument, fields: fields.map { "location.location.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.updateMarketTask(update, options: alice.options)
                }
            }

            var bid = Tasks_V1_PlaceBidRequest()
            bid.idempotencyKey = UUID().uuidString
            bid.taskId = task.taskId
            for cents: Int64 in [.max, .min, -1, 0, 100_000_001] {
                var m = Common_V1_Money()
                m.amountCents = cents
                m.currency = "EUR"
                bid.amount = m
                await expectFailure(.invalidArgument, fields: ["amount.amount_cents"], "bid \(cents)") {
                    try await w.tasks.placeBid(bid, options: bob.options)
                }
            }

            var search = Tasks_V1_SearchMarketTasksRequest()
            for (lat, lon, fields) in Self.badCoordinates {
                search.near = Self.point(lat, lon)
                await expectFailure(.invalidArgument, fields: fields.map { "near.\($0)" }, "(\(lat), \(lon))") {
                    try await w.tasks.searchMarketTasks(search, options: bob.options)
                }
            }
            search.near = Self.point(0, 0)
            for km in [Double.nan, .infinity, -.infinity, 0, -0.0, -1, 20_000.000_001, .greatestFiniteMagnitude] {
                var d = Google_Protobuf_DoubleValue()
                d.value = km
                search.maxDistanceKm = d
                await expectFailure(.invalidArgument, fields: ["max_distance_km"], "max distance \(km)") {
                    try await w.tasks.searchMarketTasks(search, options: bob.options)
                }
            }
            search.clearMaxDistanceKm()
            search.statuses = [.requested, .unrecognized(.max), .unrecognized(.min)]
            await expectFailure(.invalidArgument, fields: ["statuses[1]", "statuses[2]"]) {
                try await w.tasks.searchMarketTasks(search, options: bob.options)
            }
            search.statuses = []

            var list = Tasks_V1_ListMarketTasksRequest()
            list.scope = .all
            var bids = Tasks_V1_ListBidsRequest()
            bids.taskId = task.taskId
            for size in Self.pageSizes {
                search.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.searchMarketTasks(search, options: bob.options) }
                list.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listMarketTasks(list, options: bob.options) }
                bids.pageSize = size
                await expectFailure(.invalidArgument, fields: ["page_size"]) { try await w.tasks.listBids(bids, options: alice.options) }
            }
            list.pageSize = .max
            for scope: Int32 in [5, -1, .max, .min] {
                list.scope = .unrecognized(scope)
                await expectFailure(.invalidArgument, fields: ["scope"]) { try await w.tasks.listMarketTasks(list, options: bob.options) }
            }
            list.scope = .requestedByMe
            list.statuses = [.unrecognized(.max)]
            await expectFailure(.invalidArgument, fields: ["statuses[0]"]) { try await w.tasks.listMarketTasks(list, options: alice.options) }
            list.statuses = []
            #expect(try await w.tasks.listMarketTasks(list, options: alice.options).tasks.map(\.taskId) == [task.taskId])

            // The largest circle around the map's far corner (the same pole at the other end of the
            // antimeridian) finds the task; the service serves on.
            search.pageSize = .max
            var d = Google_Protobuf_DoubleValue()
            d.value = 20_000
            search.maxDistanceKm = d
            search.near = Self.point(90, 180)
            #expect(try await w.tasks.searchMarketTasks(search, options: bob.options).results.map(\.task.taskId) == [task.taskId])
        }
    }
}
