import Foundation

/// A calendar date with no time and no zone (a chore's due date, "today" in a household): what the
/// contracts call `common.v1.Date`. Arithmetic goes through the day number (days since
/// 1970-01-01, proleptic Gregorian), so adding days never meets a clock: a daylight-saving change
/// cannot move a date.
public struct LocalDate: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var year: Int
    public var month: Int
    public var day: Int

    public init(year: Int, month: Int, day: Int) {
        self.year = year
        self.month = month
        self.day = day
    }

    /// A real date of the years `years` (the contracts' 2000..2100 unless said otherwise), or nil.
    public static func valid(year: Int, month: Int, day: Int, years: ClosedRange<Int> = 2000...2100) -> LocalDate? {
        guard years.contains(year), (1...12).contains(month), (1...daysIn(month: month, year: year)).contains(day) else { return nil }
        return LocalDate(year: year, month: month, day: day)
    }

    public static func isLeap(_ y: Int) -> Bool { y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) }

    public static func daysIn(month: Int, year: Int) -> Int {
        switch month {
        case 2: isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    /// Days since 1970-01-01 (Howard Hinnant's days_from_civil).
    public var dayNumber: Int {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = (month + 9) % 12
        let doy = (153 * mp + 2) / 5 + day - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }

    /// The date of a day number (civil_from_days).
    public init(dayNumber z0: Int) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        self.init(year: yoe + era * 400 + (m <= 2 ? 1 : 0), month: m, day: d)
    }

    public func adding(days: Int) -> LocalDate { LocalDate(dayNumber: dayNumber + days) }

    /// ISO weekday: 1 = Monday … 7 = Sunday (1970-01-01 was a Thursday).
    public var weekday: Int { ((dayNumber % 7) + 7 + 3) % 7 + 1 }

    /// The same day of month `months` later, clamped to that month's last day; `anchorDay` (the
    /// day the series started on) is used instead of `day` when given, so Jan 31 → Feb 28 → Mar 31.
    public func adding(months: Int, anchorDay: Int? = nil) -> LocalDate {
        let total = year * 12 + (month - 1) + months
        let y = total / 12, m = total % 12 + 1
        return LocalDate(year: y, month: m, day: min(anchorDay ?? day, Self.daysIn(month: m, year: y)))
    }

    public static func < (l: LocalDate, r: LocalDate) -> Bool { (l.year, l.month, l.day) < (r.year, r.month, r.day) }

    public var description: String { String(format: "%04d-%02d-%02d", year, month, day) }

    /// `yyyymmdd` as one integer: sortable, and what the store keeps.
    public var key: Int64 { Int64(year * 10000 + month * 100 + day) }
    public init(key: Int64) { self.init(year: Int(key / 10000), month: Int(key / 100 % 100), day: Int(key % 100)) }

    /// The date at `milliseconds` (Unix) in `zone`: the household's "today". Uses the zone's
    /// offset at that instant, so the date changes at local midnight whatever the season.
    public static func at(milliseconds: Int64, in zone: TimeZone) -> LocalDate {
        let seconds = milliseconds >= 0 ? milliseconds / 1000 : (milliseconds - 999) / 1000
        let offset = zone.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(seconds)))
        let local = seconds + Int64(offset)
        let day = local >= 0 ? local / 86400 : (local - 86399) / 86400
        return LocalDate(dayNumber: Int(day))
    }
}

/// A chore's time zone: an IANA name Foundation knows, or UTC.
public enum ChoreZone {
    /// The zone of `name` ("" → UTC); nil when unknown.
    public static func zone(named name: String) -> TimeZone? {
        if name.isEmpty || name == "UTC" { return TimeZone(identifier: "UTC") }
        // Only region names: "GMT+2"-style abbreviations are ambiguous and have no DST rules.
        guard name.count <= 64, name.contains("/") || name == "GMT", let z = TimeZone(identifier: name) else { return nil }
        return z
    }
}
