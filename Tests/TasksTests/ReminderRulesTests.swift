import Foundation
import Testing

@testable import Tasks

/// The reminder rules as pure functions, and what Foundation's time zones (swift-corelibs-foundation
/// on Linux) answer around daylight-saving changes: checked here rather than assumed.
@Suite("Tasks: reminder rules")
struct ReminderRulesTests {
    static func zone(_ name: String) throws -> TimeZone { try #require(TimeZone(identifier: name)) }
    static func t(_ s: String) throws -> TimeOfDay { try #require(TimeOfDay(s)) }
    static func fire(_ y: Int, _ m: Int, _ d: Int, _ time: String, _ zone: String) throws -> Int64 {
        ReminderRules.nextFireInstant(localDate: LocalDate(year: y, month: m, day: d), timeOfDay: try t(time), zone: try Self.zone(zone))
    }

    @Test func timesOfDayAreExactlyHHMM() {
        for (text, minutes) in [("00:00", 0), ("09:00", 540), ("07:30", 450), ("23:59", 1439), ("12:05", 725)] {
            #expect(TimeOfDay(text)?.minutes == minutes, "\(text)")
            #expect(TimeOfDay(text)?.description == text)
        }
        for bad in ["", "9:00", "09:0", "24:00", "12:60", "99:99", "09-00", "09:00 ", " 09:00", "0900", "ab:cd", "１２:００", "+9:00", "09:00:00"] {
            #expect(TimeOfDay(bad) == nil, "\(bad)")
        }
        #expect(TimeOfDay(minutes: -1) == nil && TimeOfDay(minutes: 1440) == nil && TimeOfDay(minutes: Int.max) == nil)
    }

    /// The tz database as Foundation has it here: the offsets and change days the tests below
    /// rely on (Berlin +1/+2, New York -5/-4, Lord Howe +10:30/+11, a 30-minute shift).
    @Test func foundationKnowsTheChanges() throws {
        func offset(_ zone: String, _ ms: Int64) throws -> Int {
            try Self.zone(zone).secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(ms / 1000)))
        }
        #expect(try offset("Europe/Berlin", utc(2027, 3, 28, 0, 59)) == 3600)
        #expect(try offset("Europe/Berlin", utc(2027, 3, 28, 1, 0)) == 7200)
        #expect(try offset("Europe/Berlin", utc(2027, 10, 31, 0, 59)) == 7200)
        #expect(try offset("Europe/Berlin", utc(2027, 10, 31, 1, 0)) == 3600)
        #expect(try offset("America/New_York", utc(2027, 3, 14, 6, 59)) == -18000)
        #expect(try offset("America/New_York", utc(2027, 3, 14, 7, 0)) == -14400)
        #expect(try offset("America/New_York", utc(2027, 11, 7, 5, 59)) == -14400)
        #expect(try offset("America/New_York", utc(2027, 11, 7, 6, 0)) == -18000)
        // Lord Howe: 02:00 +10:30 → 02:30 +11 on the first Sunday of October (15:30 UTC the day
        // before); 02:00 +11 → 01:30 +10:30 on the first Sunday of April (15:00 UTC the day before).
        #expect(try offset("Australia/Lord_Howe", utc(2027, 10, 2, 15, 29)) == 37800)
        #expect(try offset("Australia/Lord_Howe", utc(2027, 10, 2, 15, 30)) == 39600)
        #expect(try offset("Australia/Lord_Howe", utc(2027, 4, 3, 14, 59)) == 39600)
        #expect(try offset("Australia/Lord_Howe", utc(2027, 4, 3, 15, 0)) == 37800)
        for d in [LocalDate(year: 2027, month: 3, day: 28), LocalDate(year: 2027, month: 10, day: 31), LocalDate(year: 2027, month: 3, day: 14)] {
            #expect(d.weekday == 7, "\(d) is a Sunday")
        }
    }

    @Test func berlinSpringForwardFiresAtTheEndOfTheGap() throws {
        // 2027-03-28: 02:00 CET → 03:00 CEST. 02:30 does not happen: the first instant after the
        // gap is 03:00 CEST = 01:00 UTC.
        #expect(try Self.fire(2027, 3, 28, "02:30", "Europe/Berlin") == utc(2027, 3, 28, 1, 0))
        #expect(try Self.fire(2027, 3, 28, "02:00", "Europe/Berlin") == utc(2027, 3, 28, 1, 0))
        #expect(try Self.fire(2027, 3, 28, "02:59", "Europe/Berlin") == utc(2027, 3, 28, 1, 0))
        #expect(try Self.fire(2027, 3, 28, "01:59", "Europe/Berlin") == utc(2027, 3, 28, 0, 59))
        #expect(try Self.fire(2027, 3, 28, "03:00", "Europe/Berlin") == utc(2027, 3, 28, 1, 0))
        #expect(try Self.fire(2027, 3, 28, "09:00", "Europe/Berlin") == utc(2027, 3, 28, 7, 0))
        #expect(try Self.fire(2027, 3, 27, "09:00", "Europe/Berlin") == utc(2027, 3, 27, 8, 0))
        #expect(try Self.fire(2027, 3, 27, "02:30", "Europe/Berlin") == utc(2027, 3, 27, 1, 30))
        #expect(try Self.fire(2027, 3, 29, "02:30", "Europe/Berlin") == utc(2027, 3, 29, 0, 30))
    }

    @Test func berlinFallBackFiresAtTheFirstOfTwo() throws {
        // 2027-10-31: 03:00 CEST → 02:00 CET. 02:30 happens at 00:30 UTC and again at 01:30 UTC:
        // the first.
        #expect(try Self.fire(2027, 10, 31, "02:30", "Europe/Berlin") == utc(2027, 10, 31, 0, 30))
        #expect(try Self.fire(2027, 10, 31, "02:00", "Europe/Berlin") == utc(2027, 10, 31, 0, 0))
        #expect(try Self.fire(2027, 10, 31, "02:59", "Europe/Berlin") == utc(2027, 10, 31, 0, 59))
        #expect(try Self.fire(2027, 10, 31, "03:00", "Europe/Berlin") == utc(2027, 10, 31, 2, 0))
        #expect(try Self.fire(2027, 10, 31, "01:59", "Europe/Berlin") == utc(2027, 10, 30, 23, 59))
        #expect(try Self.fire(2027, 10, 31, "09:00", "Europe/Berlin") == utc(2027, 10, 31, 8, 0))
        #expect(try Self.fire(2027, 10, 30, "09:00", "Europe/Berlin") == utc(2027, 10, 30, 7, 0))
    }

    @Test func newYork() throws {
        // 2027-03-14 02:00 EST → 03:00 EDT; 2027-11-07 02:00 EDT → 01:00 EST.
        #expect(try Self.fire(2027, 3, 14, "02:30", "America/New_York") == utc(2027, 3, 14, 7, 0))
        #expect(try Self.fire(2027, 3, 13, "09:00", "America/New_York") == utc(2027, 3, 13, 14, 0))
        #expect(try Self.fire(2027, 3, 14, "09:00", "America/New_York") == utc(2027, 3, 14, 13, 0))
        #expect(try Self.fire(2027, 11, 7, "01:30", "America/New_York") == utc(2027, 11, 7, 5, 30))
        #expect(try Self.fire(2027, 11, 7, "09:00", "America/New_York") == utc(2027, 11, 7, 14, 0))
        // 23:30 local is the next day in UTC.
        #expect(try Self.fire(2027, 7, 1, "23:30", "America/New_York") == utc(2027, 7, 2, 3, 30))
    }

    @Test func lordHoweShiftsByThirtyMinutes() throws {
        // 2027-10-03 02:00 +10:30 → 02:30 +11: 02:15 does not happen → 02:30 +11 = 15:30 UTC the day before.
        #expect(try Self.fire(2027, 10, 3, "02:15", "Australia/Lord_Howe") == utc(2027, 10, 2, 15, 30))
        #expect(try Self.fire(2027, 10, 3, "02:00", "Australia/Lord_Howe") == utc(2027, 10, 2, 15, 30))
        #expect(try Self.fire(2027, 10, 3, "02:30", "Australia/Lord_Howe") == utc(2027, 10, 2, 15, 30))
        #expect(try Self.fire(2027, 10, 3, "01:59", "Australia/Lord_Howe") == utc(2027, 10, 2, 15, 29))
        // 2027-04-04 02:00 +11 → 01:30 +10:30: 01:45 happens twice → the first, at +11 = 14:45 UTC the day before.
        #expect(try Self.fire(2027, 4, 4, "01:45", "Australia/Lord_Howe") == utc(2027, 4, 3, 14, 45))
        #expect(try Self.fire(2027, 4, 4, "02:00", "Australia/Lord_Howe") == utc(2027, 4, 3, 15, 30))
        #expect(try Self.fire(2027, 4, 4, "09:00", "Australia/Lord_Howe") == utc(2027, 4, 3, 22, 30))
        #expect(try Self.fire(2027, 4, 3, "09:00", "Australia/Lord_Howe") == utc(2027, 4, 2, 22, 0))
    }

    @Test func utcIsPlain() throws {
        #expect(try Self.fire(2027, 3, 28, "02:30", "UTC") == utc(2027, 3, 28, 2, 30))
        #expect(try Self.fire(2027, 10, 31, "02:30", "UTC") == utc(2027, 10, 31, 2, 30))
        #expect(try Self.fire(2100, 12, 31, "23:59", "UTC") == utc(2100, 12, 31, 23, 59))
        #expect(try Self.fire(2000, 1, 1, "00:00", "UTC") == utc(2000, 1, 1, 0, 0))
    }

    /// Every day of 2027 in zones with changes, at times in and around the changes: the instant
    /// shows the wall time in the zone (or, in a gap, is the first instant after it), and no
    /// earlier instant shows that wall time.
    @Test(arguments: ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata", "UTC"])
    func everyDayOfAYear(_ name: String) throws {
        let zone = try Self.zone(name)
        func offset(_ s: Int64) -> Int64 { Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(s)))) }
        var previous: [Int: Int64] = [:]
        for n in LocalDate(year: 2027, month: 1, day: 1).dayNumber...LocalDate(year: 2027, month: 12, day: 31).dayNumber {
            for minutes in [0, 60, 90, 120, 135, 150, 165, 179, 180, 540, 1439] {
                let time = try #require(TimeOfDay(minutes: minutes))
                let ms = ReminderRules.nextFireInstant(localDate: LocalDate(dayNumber: n), timeOfDay: time, zone: zone)
                #expect(ms % 1000 == 0)
                let s = ms / 1000, wall = Int64(n) * 86400 + Int64(minutes) * 60
                if s + offset(s) == wall {
                    // Not a later one of two: an hour (or half) before does not show it too.
                    for back: Int64 in [1800, 3600] where s - back + offset(s - back) == wall {
                        Issue.record("\(name) \(LocalDate(dayNumber: n)) \(time): \(s - back) shows it earlier")
                    }
                } else {
                    // A gap: the offset changes exactly at s, and the wall time lies in the gap.
                    #expect(offset(s - 1) < offset(s), "\(name) \(LocalDate(dayNumber: n)) \(time)")
                    #expect(s - 1 + offset(s - 1) < wall && s + offset(s) > wall, "\(name) \(LocalDate(dayNumber: n)) \(time)")
                }
                if let p = previous[minutes] { #expect(s > p) }
                previous[minutes] = s
            }
        }
    }

    // MARK: Chore plans

    static let berlin = TimeZone(identifier: "Europe/Berlin")!

    @Test func aChoreIsRemindedOnItsDueDateThenWhenOverdue() {
        let due = LocalDate(year: 2027, month: 3, day: 16)
        let nine = TimeOfDay.nineAM
        let early = ReminderRules.chorePlan(due: due, time: nine, zone: Self.berlin, stored: nil, now: utc(2027, 3, 15, 6))
        #expect(early == .init(due: due, phase: .due, fireAt: utc(2027, 3, 16, 8)))
        // Created on the due date after 09:00: no "due today", the overdue one tomorrow.
        let late = ReminderRules.chorePlan(due: due, time: nine, zone: Self.berlin, stored: nil, now: utc(2027, 3, 16, 10))
        #expect(late == .init(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 8)))
        // Long past: nothing.
        let past = ReminderRules.chorePlan(due: due, time: nine, zone: Self.berlin, stored: nil, now: utc(2027, 3, 20, 10))
        #expect(past == .init(due: due, phase: .finished, fireAt: nil))
        // Not remindable: nothing pending, what was handled is kept.
        let handled = ReminderRules.ChorePending(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 8))
        #expect(
            ReminderRules.chorePlan(due: nil, time: nine, zone: Self.berlin, stored: handled, now: 0)
                == .init(due: due, phase: .overdue, fireAt: nil))
        #expect(ReminderRules.chorePlan(due: nil, time: nine, zone: Self.berlin, stored: nil, now: 0) == nil)
        // The same due date continues from the stored phase (a skip after the due-day reminder):
        // the due-day one is not sent again, even when the time moves later that day.
        #expect(
            ReminderRules.chorePlan(due: due, time: TimeOfDay("20:00")!, zone: Self.berlin, stored: handled, now: utc(2027, 3, 16, 10))
                == .init(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 19)))
        // A stored phase already due (the scanner has not run yet), unchanged: kept, so it still fires.
        let waiting = ReminderRules.ChorePending(due: due, phase: .due, fireAt: utc(2027, 3, 16, 8))
        #expect(ReminderRules.chorePlan(due: due, time: nine, zone: Self.berlin, stored: waiting, now: utc(2027, 3, 16, 8, 1)) == waiting)
        // ... but moved to a time already past: passed over.
        #expect(
            ReminderRules.chorePlan(due: due, time: TimeOfDay("08:30")!, zone: Self.berlin, stored: waiting, now: utc(2027, 3, 16, 8, 1))
                == .init(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 7, 30)))
        // A new due date starts over.
        let next = LocalDate(year: 2027, month: 3, day: 23)
        #expect(
            ReminderRules.chorePlan(due: next, time: nine, zone: Self.berlin, stored: handled, now: utc(2027, 3, 16, 10))
                == .init(due: next, phase: .due, fireAt: utc(2027, 3, 23, 8)))
    }

    @Test func afterFiringTheNextPhaseUnlessStaleToo() {
        let due = LocalDate(year: 2027, month: 3, day: 16)
        let sent = ReminderRules.ChorePending(due: due, phase: .due, fireAt: utc(2027, 3, 16, 8))
        #expect(
            ReminderRules.choreAfterFiring(sent, time: .nineAM, zone: Self.berlin, now: utc(2027, 3, 16, 8))
                == .init(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 8)))
        // Down until the 17th 19:00: the overdue one is 11 h late, still sent.
        #expect(
            ReminderRules.choreAfterFiring(sent, time: .nineAM, zone: Self.berlin, now: utc(2027, 3, 17, 19))
                == .init(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 8)))
        // Down until the 17th 21:00: 13 h late, dropped too.
        #expect(
            ReminderRules.choreAfterFiring(sent, time: .nineAM, zone: Self.berlin, now: utc(2027, 3, 17, 21))
                == .init(due: due, phase: .finished, fireAt: nil))
        let overdue = ReminderRules.ChorePending(due: due, phase: .overdue, fireAt: utc(2027, 3, 17, 8))
        #expect(
            ReminderRules.choreAfterFiring(overdue, time: .nineAM, zone: Self.berlin, now: utc(2027, 3, 17, 8))
                == .init(due: due, phase: .finished, fireAt: nil))
    }

    // MARK: Habits

    @Test func habitsAreRemindedOnTheirScheduledDaysOnly() throws {
        let monday = LocalDate(year: 2027, month: 3, day: 15)
        #expect(monday.weekday == 1)
        let time = try Self.t("07:30")
        // Monday and Wednesday; asked on Monday at 07:00 Berlin (06:00 UTC): today 07:30.
        let first = ReminderRules.habitNext(from: monday, weekdays: [1, 3], start: monday, time: time, zone: Self.berlin, after: utc(2027, 3, 15, 6))
        #expect(first?.day == monday && first?.fireAt == utc(2027, 3, 15, 6, 30))
        // After it: Wednesday (Tuesday is not scheduled).
        let second = ReminderRules.habitNext(
            from: monday.adding(days: 1), weekdays: [1, 3], start: monday, time: time, zone: Self.berlin, after: utc(2027, 3, 15, 6, 30))
        #expect(second?.day == monday.adding(days: 2) && second?.fireAt == utc(2027, 3, 17, 6, 30))
        // Not before the start date.
        let later = ReminderRules.habitNext(
            from: monday, weekdays: [1, 3], start: LocalDate(year: 2027, month: 4, day: 1), time: time, zone: Self.berlin,
            after: utc(2027, 3, 15, 6))
        #expect(later?.day == LocalDate(year: 2027, month: 4, day: 5))
        // A reminder set long ago does not walk through the years: the next is near "after".
        let far = ReminderRules.habitNext(
            from: LocalDate(year: 2000, month: 1, day: 3), weekdays: [1], start: LocalDate(year: 2000, month: 1, day: 3), time: time,
            zone: Self.berlin, after: utc(2027, 3, 15, 7))
        #expect(far?.day == LocalDate(year: 2027, month: 3, day: 22))
        #expect(ReminderRules.habitNext(from: monday, weekdays: [], start: monday, time: time, zone: Self.berlin, after: 0) == nil)
        #expect(ReminderRules.habitNext(from: monday, weekdays: [0, 8], start: monday, time: time, zone: Self.berlin, after: 0) == nil)
    }
}
