import Foundation

/// One event as the metrics see it: its day, and — when it was added after the calendar jumped
/// over days (the owner flew east across many zones: "today" moved on by more than the clock
/// did) — the first of the days the jump skipped, which then never break a streak.
public struct HabitEventDay: Sendable, Equatable {
    public var day: LocalDate
    public var excusedFrom: LocalDate?
    public init(day: LocalDate, excusedFrom: LocalDate? = nil) {
        self.day = day
        self.excusedFrom = excusedFrom
    }
}

/// Completion in one ISO week.
public struct HabitWeek: Sendable, Equatable {
    public var weekStart: LocalDate
    public var scheduled: Int
    public var completed: Int
}

/// The metrics of `habits.proto`'s HabitMetrics.
public struct HabitMetricsValue: Sendable, Equatable {
    public var scheduled = 0
    public var completed = 0
    public var completionRate: Double { scheduled == 0 ? 0 : Double(completed) / Double(scheduled) }
    public var currentStreak = 0
    public var longestStreak = 0
    public var dueToday = false
    public var doneToday = false
    public var weeks: [HabitWeek] = []
}

/// The habit rules as pure functions over calendar dates — never instants, so a daylight-saving
/// change cannot move a day — with "today" given by the caller in the zone the request names.
///
/// - Only scheduled days count: a day whose weekday is not in the schedule (or before the start
///   date) is neither missed nor completed, and never breaks a streak (as in Habitica).
/// - Today without an event yet does not break the current streak (it ends at the last scheduled
///   day before today).
/// - An event dated after "today" (added where the date was already later: the owner flew west
///   since) moves "today" of the metrics to its date (at most two days on: the widest gap between
///   zones), so travelling never hides an event.
/// - Scheduled days the calendar skipped (an event's `excusedFrom`) are neither missed nor
///   completed.
public enum HabitRules {
    /// `weekdays`: ISO 1 (Monday) … 7 (Sunday).
    public static func isScheduled(_ day: LocalDate, weekdays: Set<Int>, start: LocalDate) -> Bool {
        day >= start && weekdays.contains(day.weekday)
    }

    public static func metrics(weekdays: Set<Int>, start: LocalDate, events: [HabitEventDay], today: LocalDate) -> HabitMetricsValue {
        var m = HabitMetricsValue()
        let done = Set(events.map(\.day.dayNumber))
        let todayN = today.dayNumber
        // The latest event up to two days ahead of today (a zone further east) is "today" too.
        let end = max(todayN, events.map(\.day.dayNumber).filter { $0 <= todayN + 2 }.max() ?? todayN)
        var excused = Set<Int>()
        for e in events {
            guard let from = e.excusedFrom, from < e.day else { continue }
            for d in from.dayNumber..<e.day.dayNumber where !done.contains(d) { excused.insert(d) }
        }
        m.dueToday = isScheduled(today, weekdays: weekdays, start: start)
        m.doneToday = done.contains(todayN)
        let startN = start.dayNumber
        guard startN <= end else {
            m.weeks = weeks(weekdays: weekdays, start: start, done: done, today: today, end: end)
            return m
        }
        // One pass from the start: totals, and runs of completed days for the longest streak.
        var run = 0
        var d = startN
        while d <= end {
            defer { d += 1 }
            guard weekdays.contains(LocalDate(dayNumber: d).weekday) else { continue }
            if done.contains(d) {
                m.scheduled += 1
                m.completed += 1
                run += 1
                m.longestStreak = max(m.longestStreak, run)
            } else if excused.contains(d) {
                continue  // skipped by the calendar: neither missed nor completed
            } else if d >= todayN {
                m.scheduled += d == todayN ? 1 : 0  // today (or later) still open: not missed yet
            } else {
                m.scheduled += 1
                run = 0
            }
        }
        // The current streak: back from the end, over scheduled days only.
        d = end
        while d >= startN {
            defer { d -= 1 }
            guard weekdays.contains(LocalDate(dayNumber: d).weekday) else { continue }
            if done.contains(d) {
                m.currentStreak += 1
            } else if excused.contains(d) || d >= todayN {
                continue
            } else {
                break
            }
        }
        m.weeks = weeks(weekdays: weekdays, start: start, done: done, today: today, end: end)
        return m
    }

    /// The last 12 ISO weeks up to the week of `today`, oldest first, without the weeks wholly
    /// before `start`; each counts scheduled days from the start up to `end`.
    static func weeks(weekdays: Set<Int>, start: LocalDate, done: Set<Int>, today: LocalDate, end: Int) -> [HabitWeek] {
        let monday = today.dayNumber - (today.weekday - 1)
        var out: [HabitWeek] = []
        for k in stride(from: 11, through: 0, by: -1) {
            let ws = monday - 7 * k
            guard ws + 6 >= start.dayNumber else { continue }
            var w = HabitWeek(weekStart: LocalDate(dayNumber: ws), scheduled: 0, completed: 0)
            for d in ws...(ws + 6) where d >= start.dayNumber && d <= end && weekdays.contains(LocalDate(dayNumber: d).weekday) {
                w.scheduled += 1
                if done.contains(d) { w.completed += 1 }
            }
            out.append(w)
        }
        return out
    }

    /// The largest change of a zone's UTC offset that daylight saving makes in the tz database
    /// (one hour nearly everywhere; two at Antarctica/Troll).
    public static let maxDaylightSavingShiftSeconds = 2 * 3600

    /// The first day the calendar skipped when an event is added on `day` at `instant` (Unix ms):
    /// the date the previous event's zone's clock shows now, if it is before `day` (the owner
    /// moved east far enough to lose a date). nil when no day was skipped.
    ///
    /// The previous zone's clock is read with that zone's offset *at this instant*
    /// (`previousZone`, an IANA name), daylight saving included: staying in one zone — across a
    /// daylight-saving change too — shows the same date as `day`, so it never excuses a day; only
    /// a change of zone can. Events stored before their zone was recorded (`previousZone` nil) have
    /// only the offset they were added at: then a jump from it to `offsetSeconds` (the current
    /// zone's offset now) of at most `maxDaylightSavingShiftSeconds` is taken for a daylight-saving
    /// change and excuses nothing; a larger jump east is a trip, measured with the stored offset.
    public static func excusedFrom(
        day: LocalDate, instantMilliseconds: Int64, previousOffsetSeconds: Int?, previousDay: LocalDate?, previousZone: String? = nil,
        offsetSeconds: Int? = nil
    ) -> LocalDate? {
        guard let stored = previousOffsetSeconds, let previousDay else { return nil }
        let offset: Int
        if let previousZone, let zone = TimeZone(identifier: previousZone) {
            offset = zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(instantMilliseconds) / 1000))
        } else {
            if let offsetSeconds, offsetSeconds - stored <= maxDaylightSavingShiftSeconds { return nil }
            offset = stored
        }
        let seconds = (instantMilliseconds >= 0 ? instantMilliseconds / 1000 : (instantMilliseconds - 999) / 1000) + Int64(offset)
        let clockDay = LocalDate(dayNumber: Int(seconds >= 0 ? seconds / 86400 : (seconds - 86399) / 86400))
        let from = max(clockDay, previousDay.adding(days: 1))
        return from < day ? from : nil
    }
}
