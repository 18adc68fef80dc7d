import Foundation

/// A local time of day, minutes after midnight (0..1439): when a reminder goes out.
public struct TimeOfDay: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let minutes: Int

    /// nil outside 0..1439.
    public init?(minutes: Int) {
        guard (0..<1440).contains(minutes) else { return nil }
        self.minutes = minutes
    }

    /// Exactly "HH:MM" on a 24-hour clock (five ASCII characters, 00:00..23:59), else nil.
    public init?(_ text: String) {
        let u = Array(text.utf8)
        guard u.count == 5, u[2] == UInt8(ascii: ":") else { return nil }
        var digits: [Int] = []
        for i in [0, 1, 3, 4] {
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(u[i]) else { return nil }
            digits.append(Int(u[i] - UInt8(ascii: "0")))
        }
        let h = digits[0] * 10 + digits[1], m = digits[2] * 10 + digits[3]
        guard h < 24, m < 60 else { return nil }
        self.init(minutes: h * 60 + m)
    }

    /// The contract's default chore reminder time.
    public static let nineAM = TimeOfDay(minutes: 540)!

    public var description: String { String(format: "%02d:%02d", minutes / 60, minutes % 60) }
    public static func < (l: TimeOfDay, r: TimeOfDay) -> Bool { l.minutes < r.minutes }
}

/// The reminder rules of `chores.proto` (ChoreReminderSettings) and `habits.proto` (HabitReminder)
/// as pure functions of dates, times of day, zones and "now": when an occurrence fires, which is
/// the next one, and what is too late to send. No storage, no clock.
public enum ReminderRules {
    /// A reminder more than this late (the service was down) is dropped, not sent.
    public static let staleAfterMilliseconds: Int64 = 12 * 3_600_000

    /// The UTC instant (Unix milliseconds) at which `timeOfDay` on `localDate` happens in `zone`.
    ///
    /// - A time that happens twice (clocks go back: 02:30 in Berlin on 2027-10-31) → the first
    ///   (earlier) instant, at the offset before the change.
    /// - A time that does not happen (clocks jump forward: 02:30 in Berlin on 2027-03-28) → the
    ///   first instant after the gap, i.e. the moment of the change itself (03:00 local, 01:00 UTC).
    ///
    /// Uses only `TimeZone.secondsFromGMT(for:)` (the zone's offset at an instant), never
    /// Calendar's own resolution of skipped or repeated times, which differs between platforms.
    public static func nextFireInstant(localDate: LocalDate, timeOfDay: TimeOfDay, zone: TimeZone) -> Int64 {
        let wall = Int64(localDate.dayNumber) * 86_400 + Int64(timeOfDay.minutes) * 60  // the local clock's reading, as seconds
        func offset(_ utcSeconds: Int64) -> Int64 { Int64(zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(utcSeconds)))) }
        // Every offset the zone has within a day of the wall time: at most two, but any number works.
        let offsets = Set([wall - 86_400, wall, wall + 86_400].map(offset))
        let valid = offsets.map { wall - $0 }.filter { offset($0) == wall - $0 }
        if let first = valid.min() { return first * 1000 }
        // A gap: the wall time is read with the earlier offset before the change and the later
        // one after it, so neither fits. The change lies between the two readings; find its
        // first second (offsets change on whole seconds).
        guard let low = offsets.max(), let high = offsets.min() else { return wall * 1000 }
        var before = wall - low, after = wall - high  // offset(before) is the old one, offset(after) the new one
        let old = offset(before)
        while after - before > 1 {
            let mid = before + (after - before) / 2
            if offset(mid) == old { before = mid } else { after = mid }
        }
        return after * 1000
    }

    /// The local date of `milliseconds` in `zone`.
    public static func localDate(_ milliseconds: Int64, _ zone: TimeZone) -> LocalDate { LocalDate.at(milliseconds: milliseconds, in: zone) }

    // MARK: Chores

    /// The two reminders of a chore's turn, in order: on the due date, and on the day after it
    /// ("overdue").
    public enum ChorePhase: Int, Sendable, Comparable {
        case due = 0
        case overdue = 1
        /// Both handled (sent, dropped or passed): nothing more for this due date.
        case finished = 2

        public static func < (l: ChorePhase, r: ChorePhase) -> Bool { l.rawValue < r.rawValue }

        /// The day this phase fires on, for a turn due `due`.
        public func day(for due: LocalDate) -> LocalDate { self == .due ? due : due.adding(days: 1) }
    }

    /// The pending reminder of a chore, as stored: its due date, the phase that fires next, and
    /// when (nil: nothing pending, the row only remembers what was handled).
    public struct ChorePending: Equatable, Sendable {
        public var due: LocalDate
        public var phase: ChorePhase
        public var fireAt: Int64?

        public init(due: LocalDate, phase: ChorePhase, fireAt: Int64?) {
            self.due = due
            self.phase = phase
            self.fireAt = fireAt
        }
    }

    /// The pending reminder a chore should have after a write (create, finish, skip, request,
    /// a change of the household's settings, ...), given what is stored now.
    ///
    /// - `due` nil (not ACTIVE, reminders off, nobody to remind): nothing pending; the stored
    ///   date and phase are kept so that turning reminders back on never repeats a phase.
    /// - The same due date as stored continues from the stored phase (a phase already handled is
    ///   never sent again: a skip after the due-day reminder leaves only the overdue one).
    /// - A phase whose instant is at or before `now` is passed over (the write itself is what the
    ///   members see then), except the stored pending phase that is already due, unchanged: it is
    ///   waiting for the scanner and still fires.
    public static func chorePlan(
        due: LocalDate?, time: TimeOfDay, zone: TimeZone, stored: ChorePending?, now: Int64
    ) -> ChorePending? {
        guard let due else {
            guard let stored else { return nil }
            return ChorePending(due: stored.due, phase: stored.phase, fireAt: nil)
        }
        var phase = ChorePhase.due
        if let stored, stored.due == due { phase = stored.phase }
        while phase < .finished {
            let at = nextFireInstant(localDate: phase.day(for: due), timeOfDay: time, zone: zone)
            if at > now { return ChorePending(due: due, phase: phase, fireAt: at) }
            if let stored, stored.due == due, stored.phase == phase, stored.fireAt == at { return stored }
            phase = ChorePhase(rawValue: phase.rawValue + 1) ?? .finished
        }
        return ChorePending(due: due, phase: .finished, fireAt: nil)
    }

    /// After the phase stored in `fired` went out (or was dropped) at `now`: the next one, if it is
    /// not already stale itself (down for days: the overdue reminder may be stale too).
    public static func choreAfterFiring(_ fired: ChorePending, time: TimeOfDay, zone: TimeZone, now: Int64) -> ChorePending {
        var phase = ChorePhase(rawValue: fired.phase.rawValue + 1) ?? .finished
        while phase < .finished {
            let at = nextFireInstant(localDate: phase.day(for: fired.due), timeOfDay: time, zone: zone)
            if at > now - staleAfterMilliseconds { return ChorePending(due: fired.due, phase: phase, fireAt: at) }
            phase = ChorePhase(rawValue: phase.rawValue + 1) ?? .finished
        }
        return ChorePending(due: fired.due, phase: .finished, fireAt: nil)
    }

    // MARK: Habits

    /// The first scheduled day (ISO weekday in `weekdays`, on or after `start`) on or after
    /// `from` whose reminder instant is after `after`, with that instant. nil when no weekday is
    /// scheduled. At most a few weeks are looked at: `from` is first moved up to the day before
    /// the date `after` has in `zone`, so a long-unused reminder does not walk through years.
    public static func habitNext(
        from: LocalDate, weekdays: Set<Int>, start: LocalDate, time: TimeOfDay, zone: TimeZone, after: Int64
    ) -> (day: LocalDate, fireAt: Int64)? {
        guard !weekdays.isEmpty, weekdays.allSatisfy({ (1...7).contains($0) }) else { return nil }
        var d = max(from, start, localDate(after, zone).adding(days: -1))
        for _ in 0..<21 {
            if weekdays.contains(d.weekday) {
                let at = nextFireInstant(localDate: d, timeOfDay: time, zone: zone)
                if at > after { return (d, at) }
            }
            d = d.adding(days: 1)
        }
        return nil
    }
}
