import Foundation
import Testing

@testable import Tasks

/// The chore rules as pure functions: calendar arithmetic, recurrence, rotation, finish and skip.
@Suite("Tasks: chore rules (pure)")
struct ChoreRulesTests {
    func d(_ y: Int, _ m: Int, _ day: Int) -> LocalDate { LocalDate(year: y, month: m, day: day) }

    @Test func dayNumbersRoundTripAndWeekdays() {
        #expect(d(1970, 1, 1).dayNumber == 0)
        #expect(d(2000, 3, 1).dayNumber == 11017)
        #expect(LocalDate(dayNumber: -1) == d(1969, 12, 31))
        for n in stride(from: -800_000, through: 800_000, by: 997) { #expect(LocalDate(dayNumber: n).dayNumber == n) }
        #expect(d(1970, 1, 1).weekday == 4)  // Thursday
        #expect(d(2025, 3, 17).weekday == 1)  // Monday
        #expect(d(2024, 2, 29).weekday == 4)
        #expect(d(2100, 12, 31).weekday == 5)
        #expect(d(2025, 12, 31).adding(days: 1) == d(2026, 1, 1))
        #expect(d(2024, 2, 28).adding(days: 1) == d(2024, 2, 29))
        #expect(d(2023, 2, 28).adding(days: 1) == d(2023, 3, 1))
    }

    @Test func leapYearsAndValidDates() {
        #expect(LocalDate.isLeap(2024) && LocalDate.isLeap(2000) && !LocalDate.isLeap(2100) && !LocalDate.isLeap(2023))
        #expect(LocalDate.valid(year: 2024, month: 2, day: 29) != nil)
        #expect(LocalDate.valid(year: 2023, month: 2, day: 29) == nil)
        #expect(LocalDate.valid(year: 2100, month: 2, day: 29) == nil)
        #expect(LocalDate.valid(year: 2025, month: 4, day: 31) == nil)
        #expect(LocalDate.valid(year: 2025, month: 13, day: 1) == nil)
        #expect(LocalDate.valid(year: 1999, month: 12, day: 31) == nil)
        #expect(LocalDate.valid(year: 2025, month: 0, day: 1) == nil)
    }

    @Test func monthlyClampsToShortMonthsAndComesBack() {
        let monthly = ChoreRecurrence.monthly(anchorDay: 31)
        var due = d(2024, 1, 31)
        var seen: [LocalDate] = []
        for _ in 0..<13 {
            due = monthly.next(after: due, today: d(2024, 1, 1))!
            seen.append(due)
        }
        #expect(
            seen == [
                d(2024, 2, 29), d(2024, 3, 31), d(2024, 4, 30), d(2024, 5, 31), d(2024, 6, 30), d(2024, 7, 31), d(2024, 8, 31), d(2024, 9, 30),
                d(2024, 10, 31), d(2024, 11, 30), d(2024, 12, 31), d(2025, 1, 31), d(2025, 2, 28),
            ])
        #expect(ChoreRecurrence.monthly(anchorDay: 29).next(after: d(2023, 1, 29), today: d(2023, 1, 1)) == d(2023, 2, 28))
        #expect(ChoreRecurrence.monthly(anchorDay: 15).next(after: d(2025, 12, 15), today: d(2025, 12, 1)) == d(2026, 1, 15))
    }

    @Test func nextIsCountedFromTheLaterOfDueAndTodayNeverInThePast() {
        // Finished on time: from the due date.
        #expect(ChoreRecurrence.everyNDays(3).next(after: d(2025, 3, 17), today: d(2025, 3, 16)) == d(2025, 3, 20))
        // Finished three weeks late: from today, so the next turn is not already overdue.
        #expect(ChoreRecurrence.weekly(weekdays: []).next(after: d(2025, 3, 17), today: d(2025, 4, 7)) == d(2025, 4, 14))
        #expect(ChoreRecurrence.monthly(anchorDay: 17).next(after: d(2025, 1, 17), today: d(2025, 5, 2)) == d(2025, 6, 17))
        // Whatever the dates, the next one is after today.
        for gap in [-40, -7, -1, 0, 1, 7, 40] {
            for r in [ChoreRecurrence.everyNDays(1), .everyNDays(365), .weekly(weekdays: []), .weekly(weekdays: [3]), .monthly(anchorDay: 31)] {
                let today = d(2025, 3, 1), due = today.adding(days: gap)
                let next = r.next(after: due, today: today)!
                #expect(next > today && next > due, "\(r) due \(due) today \(today) → \(next)")
            }
        }
        #expect(ChoreRecurrence.oneTime.next(after: d(2025, 1, 1), today: d(2025, 1, 1)) == nil)
        #expect(ChoreRecurrence.onDemand.next(after: d(2025, 1, 1), today: d(2025, 1, 1)) == nil)
    }

    @Test func weeklyOnChosenWeekdays() {
        let monThu = ChoreRecurrence.weekly(weekdays: [1, 4])
        // Monday 2025-03-17 → Thursday 20 → Monday 24 → Thursday 27.
        var due = d(2025, 3, 17)
        var seen: [LocalDate] = []
        for _ in 0..<3 {
            due = monThu.next(after: due, today: d(2025, 3, 1))!
            seen.append(due)
        }
        #expect(seen == [d(2025, 3, 20), d(2025, 3, 24), d(2025, 3, 27)])
        // A first due date that is not a chosen day (Wednesday) → the next chosen one.
        #expect(monThu.next(after: d(2025, 3, 19), today: d(2025, 3, 19)) == d(2025, 3, 20))
        // Sunday only, across a year end.
        #expect(ChoreRecurrence.weekly(weekdays: [7]).next(after: d(2025, 12, 28), today: d(2025, 12, 28)) == d(2026, 1, 4))
        // Empty = every 7 days, whatever weekday.
        #expect(ChoreRecurrence.weekly(weekdays: []).next(after: d(2025, 3, 19), today: d(2025, 3, 19)) == d(2025, 3, 26))
    }

    @Test func todayInAZoneAcrossDaylightSavingChanges() throws {
        let berlin = try #require(TimeZone(identifier: "Europe/Berlin"))
        let ny = try #require(TimeZone(identifier: "America/New_York"))
        let apia = try #require(TimeZone(identifier: "Pacific/Apia"))
        let lordHowe = try #require(TimeZone(identifier: "Australia/Lord_Howe"))
        func ms(_ y: Int, _ m: Int, _ day: Int, _ h: Int, _ min: Int = 0) -> Int64 {
            Int64(d(y, m, day).dayNumber) * 86_400_000 + Int64(h * 3_600_000 + min * 60_000)
        }
        // Berlin springs forward on 2025-03-30 at 01:00 UTC: 23:30 UTC on the 29th is 00:30 on the 30th (CET+1).
        #expect(LocalDate.at(milliseconds: ms(2025, 3, 29, 23, 30), in: berlin) == d(2025, 3, 30))
        // After the change the offset is +2: 22:30 UTC on the 30th is 00:30 on the 31st.
        #expect(LocalDate.at(milliseconds: ms(2025, 3, 30, 22, 30), in: berlin) == d(2025, 3, 31))
        #expect(LocalDate.at(milliseconds: ms(2025, 3, 30, 21, 59), in: berlin) == d(2025, 3, 30))
        // Falls back on 2025-10-26: 22:59 UTC on the 26th is 23:59 (CET), still the 26th.
        #expect(LocalDate.at(milliseconds: ms(2025, 10, 26, 22, 59), in: berlin) == d(2025, 10, 26))
        // New York: 2025-03-09 04:30 UTC is 23:30 EST on the 8th; 2025-11-02 04:30 UTC is 00:30 EDT on the 2nd.
        #expect(LocalDate.at(milliseconds: ms(2025, 3, 9, 4, 30), in: ny) == d(2025, 3, 8))
        #expect(LocalDate.at(milliseconds: ms(2025, 11, 2, 4, 30), in: ny) == d(2025, 11, 2))
        // Samoa skipped 2011-12-30 entirely: the day after the 29th is the 31st.
        #expect(LocalDate.at(milliseconds: ms(2011, 12, 30, 9, 59), in: apia) == d(2011, 12, 29))
        #expect(LocalDate.at(milliseconds: ms(2011, 12, 30, 10, 0), in: apia) == d(2011, 12, 31))
        // Lord Howe moves by half an hour.
        #expect(LocalDate.at(milliseconds: ms(2025, 4, 5, 13, 15), in: lordHowe) == d(2025, 4, 6))
        // A weekly chore finished on every day around a DST change lands a week later in dates,
        // never 6 or 8 days: dates are calendar days, the clock never enters.
        for h in stride(from: 0, to: 72, by: 1) {
            let at = ms(2025, 3, 29, 0) + Int64(h) * 3_600_000
            let today = LocalDate.at(milliseconds: at, in: berlin)
            let next = ChoreRecurrence.weekly(weekdays: []).next(after: d(2025, 3, 29), today: today)!
            #expect(next == max(d(2025, 3, 29), today).adding(days: 7))
            #expect(next > today)
        }
    }

    @Test func zonesByName() {
        #expect(ChoreZone.zone(named: "")?.secondsFromGMT() == 0)
        #expect(ChoreZone.zone(named: "Europe/London")?.identifier == "Europe/London")
        #expect(ChoreZone.zone(named: "Mars/Olympus") == nil)
        #expect(ChoreZone.zone(named: "EST5EDT;rm -rf") == nil)
    }

    @Test func rotationFinishAndSkip() throws {
        let t = ChoreTurn(assigneeCount: 3, currentIndex: 2, due: d(2025, 3, 17), status: .active)
        let f = try ChoreRules.finish(t, recurrence: .weekly(weekdays: []), today: d(2025, 3, 17))
        #expect(f.currentIndex == 0 && f.due == d(2025, 3, 24) && f.status == .active)
        let once = try ChoreRules.finish(t, recurrence: .oneTime, today: d(2025, 3, 17))
        #expect(once.status == .done && once.currentIndex == 2 && once.due == d(2025, 3, 17))
        let od = try ChoreRules.finish(t, recurrence: .onDemand, today: d(2025, 3, 17))
        #expect(od.status == .waiting && od.due == nil && od.currentIndex == 0)
        #expect(throws: ChoreRuleError.notActive) { try ChoreRules.finish(od, recurrence: .onDemand, today: d(2025, 3, 17)) }
        #expect(throws: ChoreRuleError.notActive) { try ChoreRules.finish(once, recurrence: .oneTime, today: d(2025, 3, 17)) }

        let s = try ChoreRules.skip(t, isCurrentAssignee: true)
        #expect(s.currentIndex == 0 && s.due == t.due && s.status == .active)
        #expect(throws: ChoreRuleError.notCurrentAssignee) { try ChoreRules.skip(t, isCurrentAssignee: false) }
        #expect(throws: ChoreRuleError.singleAssignee) {
            try ChoreRules.skip(ChoreTurn(assigneeCount: 1, currentIndex: 0, due: d(2025, 1, 1), status: .active), isCurrentAssignee: true)
        }
        #expect(throws: ChoreRuleError.notActive) { try ChoreRules.skip(od, isCurrentAssignee: true) }
        // Rotation through three, and one person.
        #expect((0..<7).map { ChoreRules.rotate($0 % 3, count: 3) } == [1, 2, 0, 1, 2, 0, 1])
        #expect(ChoreRules.rotate(0, count: 1) == 0)
    }

    @Test func rotationClosesUpWhenSomeoneLeaves() {
        // [a b c d], current c (2): a leaves → [b c d], still c (1).
        #expect(ChoreRules.indexAfterRemoving(0, current: 2, count: 4) == 1)
        // d leaves → c still (2).
        #expect(ChoreRules.indexAfterRemoving(3, current: 2, count: 4) == 2)
        // c (current) leaves → d, now at 2.
        #expect(ChoreRules.indexAfterRemoving(2, current: 2, count: 4) == 2)
        // d (current, last) leaves → wraps to a (0).
        #expect(ChoreRules.indexAfterRemoving(3, current: 3, count: 4) == 0)
        #expect(ChoreRules.indexAfterRemoving(0, current: 0, count: 1) == nil)
    }
}
