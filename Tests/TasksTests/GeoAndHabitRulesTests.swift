import Foundation
import ServiceKit
import Testing

@testable import Tasks

@Suite("Geo: distances and bounding boxes (pure)")
struct GeoTests {
    @Test func distancesAreGreatCircle() {
        let edmonton = GeoPoint(latitude: 53.5461, longitude: -113.4938), calgary = GeoPoint(latitude: 51.0447, longitude: -114.0719)
        #expect(abs(Geo.distanceKm(edmonton, calgary) - 280.9) < 1.5)
        #expect(Geo.distanceKm(edmonton, edmonton) == 0)
        // Across the antimeridian: 0.2° of longitude at the equator, not 359.8°.
        let d = Geo.distanceKm(GeoPoint(latitude: 0, longitude: 179.9), GeoPoint(latitude: 0, longitude: -179.9))
        #expect(abs(d - 22.24) < 0.05)
        // Antipodes: half the circumference, no NaN.
        let half = Geo.distanceKm(GeoPoint(latitude: 0, longitude: 0), GeoPoint(latitude: 0, longitude: 180))
        #expect(abs(half - .pi * Geo.earthRadiusKm) < 0.001)
    }

    @Test func boxesContainEveryPointOfTheCircleAcrossTheAntimeridianAndThePoles() {
        var rng = SystemRandomNumberGenerator()
        let centers = [
            GeoPoint(latitude: 0, longitude: 179.99), GeoPoint(latitude: -16.5, longitude: -179.95), GeoPoint(latitude: 89.99, longitude: 10),
            GeoPoint(latitude: -89.95, longitude: -120), GeoPoint(latitude: 53.5, longitude: -113.5), GeoPoint(latitude: 64.1, longitude: -21.9),
        ]
        for c in centers {
            for r in [0.5, 5.0, 50.0, 500.0] {
                let box = Geo.boundingBox(center: c, radiusKm: r)
                // Points on and inside the circle, every bearing.
                for _ in 0..<400 {
                    let bearing = Double.random(in: 0..<(2 * .pi), using: &rng), dist = Double.random(in: 0...r, using: &rng)
                    let p = destination(c, bearing: bearing, km: dist)
                    #expect(box.contains(p), "\(c) r=\(r): \(p) at \(Geo.distanceKm(c, p)) km not in \(box)")
                }
            }
        }
        // The antimeridian splits the box in two ranges; a pole opens it to every longitude.
        #expect(Geo.boundingBox(center: GeoPoint(latitude: 0, longitude: 179.99), radiusKm: 5).longitudes.count == 2)
        #expect(Geo.boundingBox(center: GeoPoint(latitude: 89.99, longitude: 0), radiusKm: 5).longitudes == [-180...180])
        #expect(Geo.boundingBox(center: GeoPoint(latitude: 10, longitude: 10), radiusKm: 25000).longitudes == [-180...180])
        // A small circle stays small (the index has something to narrow).
        let small = Geo.boundingBox(center: GeoPoint(latitude: 48.85, longitude: 2.35), radiusKm: 5)
        #expect(small.maxLatitude - small.minLatitude < 0.1 && small.longitudes[0].upperBound - small.longitudes[0].lowerBound < 0.15)
    }

    /// The point `km` from `p` at `bearing` (radians).
    func destination(_ p: GeoPoint, bearing: Double, km: Double) -> GeoPoint {
        let d = km / Geo.earthRadiusKm, lat1 = p.latitude * .pi / 180, lon1 = p.longitude * .pi / 180
        let lat2 = asin(sin(lat1) * cos(d) + cos(lat1) * sin(d) * cos(bearing))
        let lon2 = lon1 + atan2(sin(bearing) * sin(d) * cos(lat1), cos(d) - sin(lat1) * sin(lat2))
        var lon = lon2 * 180 / .pi
        while lon > 180 { lon -= 360 }
        while lon < -180 { lon += 360 }
        return GeoPoint(latitude: lat2 * 180 / .pi, longitude: lon)
    }

    @Test func imagesAreKnownByTheirBytes() {
        #expect(ImageBytes.contentType([0xFF, 0xD8, 0xFF, 0xE0, 1]) == "image/jpeg")
        #expect(ImageBytes.contentType([0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0]) == "image/png")
        #expect(ImageBytes.contentType(Array("RIFF\u{0}\u{0}\u{0}\u{0}WEBPVP8 ".utf8)) == "image/webp")
        #expect(ImageBytes.contentType(Array("<svg xmlns=".utf8)) == nil)
        #expect(ImageBytes.contentType([0xFF, 0xD8]) == nil)
    }

    @Test func keywordsBecomeSubstringPhrases() {
        var errors = FieldErrors()
        let words = MarketRules.keywords("  Desk  desk ASSEMBLE a\"b ", into: &errors)
        #expect(errors.isEmpty)
        #expect(words == ["Desk", "ASSEMBLE", "a\"b"])
        #expect(MarketRules.ftsQuery(words) == "\"Desk\" AND \"ASSEMBLE\" AND \"a\"\"b\"")
        #expect(MarketRules.ftsQuery(["ab", "x"]) == nil)
    }
}

@Suite("Habits: metrics (pure)")
struct HabitRulesTests {
    // 2025-03-03 is a Monday.
    let mwf: Set<Int> = [1, 3, 5]
    func d(_ m: Int, _ day: Int, _ y: Int = 2025) -> LocalDate { LocalDate(year: y, month: m, day: day) }
    func events(_ days: [LocalDate]) -> [HabitEventDay] { days.map { HabitEventDay(day: $0) } }

    @Test func completionCountsScheduledDaysOnly() {
        // Mon 3, Wed 5, Fri 7, Mon 10, Wed 12, Fri 14: five done, Fri 7 missed; an event on Tuesday 4 (a day
        // the schedule no longer has) counts for nothing.
        let m = HabitRules.metrics(
            weekdays: mwf, start: d(3, 3), events: events([d(3, 3), d(3, 4), d(3, 5), d(3, 10), d(3, 12), d(3, 14)]), today: d(3, 14))
        #expect(m.scheduled == 6 && m.completed == 5)
        #expect(m.completionRate == 5.0 / 6.0)
        #expect(m.currentStreak == 3 && m.longestStreak == 3)
        #expect(m.dueToday && m.doneToday)
        #expect(
            m.weeks == [HabitWeek(weekStart: d(3, 3), scheduled: 3, completed: 2), HabitWeek(weekStart: d(3, 10), scheduled: 3, completed: 3)])
    }

    @Test func todayStillOpenDoesNotBreakTheStreak() {
        let m = HabitRules.metrics(weekdays: mwf, start: d(3, 3), events: events([d(3, 10), d(3, 12)]), today: d(3, 14))
        #expect(m.currentStreak == 2 && m.longestStreak == 2)
        #expect(m.dueToday && !m.doneToday)
        #expect(m.scheduled == 6 && m.completed == 2)
        // The next scheduled day passes without an event: the streak is over.
        let later = HabitRules.metrics(weekdays: mwf, start: d(3, 3), events: events([d(3, 10), d(3, 12)]), today: d(3, 17))
        #expect(later.currentStreak == 0 && later.longestStreak == 2)
    }

    @Test func unscheduledDaysNeverBreakAStreak() {
        // Weekends only: Sat/Sun for three weekends, the weekdays between never count.
        let weekend: Set<Int> = [6, 7]
        let days = [d(3, 8), d(3, 9), d(3, 15), d(3, 16), d(3, 22), d(3, 23)]
        let m = HabitRules.metrics(weekdays: weekend, start: d(3, 3), events: events(days), today: d(3, 27))  // a Thursday
        #expect(m.currentStreak == 6 && m.longestStreak == 6)
        #expect(!m.dueToday && !m.doneToday)
        #expect(m.scheduled == 6 && m.completed == 6 && m.completionRate == 1)
    }

    @Test func nothingScheduledYetIsZeroNotNaN() {
        let m = HabitRules.metrics(weekdays: mwf, start: d(4, 1), events: [], today: d(3, 14))
        #expect(m.scheduled == 0 && m.completionRate == 0 && m.currentStreak == 0 && !m.dueToday)
        #expect(m.weeks.isEmpty)
        // A single weekday, twelve weeks of history: only weeks on or after the start are listed.
        let w = HabitRules.metrics(weekdays: [1], start: d(1, 6), events: [], today: d(3, 14))
        #expect(w.weeks.count == 10 && w.weeks.first?.weekStart == d(1, 6) && w.weeks.last?.weekStart == d(3, 10))
    }

    @Test func aDaylightSavingChangeMovesNoDay() throws {
        // Europe/Berlin springs forward on 2025-03-30 at 02:00, falls back on 2025-10-26. Events are
        // added at 23:30 and 00:30 local time around both changes; each lands on its own calendar day.
        let berlin = try #require(TimeZone(identifier: "Europe/Berlin"))
        let instants: [(Int, Int, Int, Int)] = [
            (3, 29, 22, 30), (3, 30, 21, 30), (3, 30, 22, 30), (10, 25, 21, 30), (10, 26, 22, 30), (10, 26, 23, 30),
        ]
        let days = instants.map { m, day, h, min in
            LocalDate.at(milliseconds: Int64(d(m, day).dayNumber) * 86_400_000 + Int64(h * 3600 + min * 60) * 1000, in: berlin)
        }
        #expect(days == [d(3, 29), d(3, 30), d(3, 31), d(10, 25), d(10, 26), d(10, 27)])
        let daily: Set<Int> = Set(1...7)
        let m = HabitRules.metrics(weekdays: daily, start: d(3, 29), events: events(Array(days[0...2])), today: d(3, 31))
        #expect(m.currentStreak == 3)
    }

    @Test func travellingWestNeverHidesAnEvent() {
        // Logged Tuesday 18 in Tokyo, now Monday 17 evening in Los Angeles: the event still counts.
        let daily: Set<Int> = Set(1...7)
        let m = HabitRules.metrics(weekdays: daily, start: d(3, 10), events: events((10...18).map { d(3, $0) }), today: d(3, 17))
        #expect(m.currentStreak == 9 && m.longestStreak == 9)
        #expect(m.completed == 9)
    }

    @Test func travellingEastKeepsTheStreakWhenTheCalendarSkipsADay() {
        // Monday 17 at 20:00 in Los Angeles (UTC-7), then the next event after a flight, Wednesday 19
        // at 08:00 in Tokyo (UTC+9) = Tuesday 16:00 in Los Angeles: Tuesday was never "today" for the
        // owner's clock before they logged again. Tuesday is excused; the streak goes on.
        let daily: Set<Int> = Set(1...7)
        let la = -7 * 3600
        let instant = Int64(d(3, 19).dayNumber) * 86_400_000 + Int64(8 - 9) * 3_600_000  // 08:00 JST = 23:00 UTC on the 18th
        let excused = HabitRules.excusedFrom(day: d(3, 19), instantMilliseconds: instant, previousOffsetSeconds: la, previousDay: d(3, 17))
        #expect(excused == d(3, 18))
        let evs = (10...17).map { HabitEventDay(day: d(3, $0)) } + [HabitEventDay(day: d(3, 19), excusedFrom: excused)]
        let m = HabitRules.metrics(weekdays: daily, start: d(3, 10), events: evs, today: d(3, 19))
        #expect(m.currentStreak == 9 && m.longestStreak == 9)
        #expect(m.scheduled == 9 && m.completed == 9)
        // Staying in one zone and skipping Tuesday is a missed day: nothing is excused.
        let home = Int64(d(3, 19).dayNumber) * 86_400_000 + 15 * 3_600_000  // Wed 08:00 in Los Angeles
        #expect(HabitRules.excusedFrom(day: d(3, 19), instantMilliseconds: home, previousOffsetSeconds: la, previousDay: d(3, 17)) == nil)
        let missed = HabitRules.metrics(weekdays: daily, start: d(3, 10), events: events((10...17).map { d(3, $0) } + [d(3, 19)]), today: d(3, 19))
        #expect(missed.currentStreak == 1 && missed.longestStreak == 8)
    }

    /// Milliseconds of `y-m-d h:min` UTC.
    func instant(_ m: Int, _ day: Int, _ h: Int, _ min: Int = 0) -> Int64 {
        Int64(d(m, day).dayNumber) * 86_400_000 + Int64(h * 3600 + min * 60) * 1000
    }

    @Test func aDaylightSavingChangeInOneZoneExcusesNoDay() throws {
        let berlin = try #require(TimeZone(identifier: "Europe/Berlin"))
        // Spring forward (2025-03-30): Saturday 29 at +1, Sunday missed, Monday 31 00:30 at +2
        // (= Sunday 22:30 UTC; +1 would still show Sunday 23:30). Staying put: Sunday is missed.
        let monday = instant(3, 30, 22, 30)
        #expect(LocalDate.at(milliseconds: monday, in: berlin) == d(3, 31))
        let plusOne = 3600, plusTwo = 7200
        #expect(
            HabitRules.excusedFrom(
                day: d(3, 31), instantMilliseconds: monday, previousOffsetSeconds: plusOne, previousDay: d(3, 29), previousZone: "Europe/Berlin",
                offsetSeconds: plusTwo) == nil)
        // An event stored before zones were recorded: a one-hour jump is daylight saving, not a trip.
        #expect(
            HabitRules.excusedFrom(
                day: d(3, 31), instantMilliseconds: monday, previousOffsetSeconds: plusOne, previousDay: d(3, 29), offsetSeconds: plusTwo) == nil)
        let daily: Set<Int> = Set(1...7)
        let m = HabitRules.metrics(weekdays: daily, start: d(3, 27), events: events([d(3, 27), d(3, 28), d(3, 29), d(3, 31)]), today: d(3, 31))
        #expect(m.currentStreak == 1 && m.longestStreak == 3 && m.scheduled == 5 && m.completed == 4)
        // Fall back (2025-10-26): Saturday 25 at +2, Sunday missed, Monday 27 00:30 at +1 (= Sunday
        // 23:30 UTC): nothing excused either.
        let fallMonday = instant(10, 26, 23, 30)
        #expect(LocalDate.at(milliseconds: fallMonday, in: berlin) == d(10, 27))
        #expect(
            HabitRules.excusedFrom(
                day: d(10, 27), instantMilliseconds: fallMonday, previousOffsetSeconds: plusTwo, previousDay: d(10, 25),
                previousZone: "Europe/Berlin", offsetSeconds: plusOne) == nil)
        #expect(
            HabitRules.excusedFrom(
                day: d(10, 27), instantMilliseconds: fallMonday, previousOffsetSeconds: plusTwo, previousDay: d(10, 25), offsetSeconds: plusOne)
                == nil)
        // Any hour of the day after the change, in one zone: never excused.
        for h in 0..<24 {
            let at = instant(3, 30, 22) + Int64(h) * 3_600_000
            let day = LocalDate.at(milliseconds: at, in: berlin)
            #expect(
                HabitRules.excusedFrom(
                    day: day, instantMilliseconds: at, previousOffsetSeconds: plusOne, previousDay: d(3, 29), previousZone: "Europe/Berlin",
                    offsetSeconds: berlin.secondsFromGMT(for: Date(timeIntervalSince1970: TimeInterval(at) / 1000))) == nil)
        }
    }

    @Test func aRealTripEastIsStillExcusedAcrossDaylightSaving() throws {
        // Monday 2025-03-10 at 20:00 in New York (EDT, -4, two days after its own change), then
        // Wednesday 12 at 08:00 in Tokyo (+9) = Tuesday 23:00 UTC = Tuesday 19:00 in New York:
        // Tuesday was skipped by the calendar and is excused.
        let tokyo = try #require(TimeZone(identifier: "Asia/Tokyo"))
        let wednesday = instant(3, 11, 23)
        #expect(LocalDate.at(milliseconds: wednesday, in: tokyo) == d(3, 12))
        let excused = HabitRules.excusedFrom(
            day: d(3, 12), instantMilliseconds: wednesday, previousOffsetSeconds: -4 * 3600, previousDay: d(3, 10),
            previousZone: "America/New_York", offsetSeconds: 9 * 3600)
        #expect(excused == d(3, 11))
        // The same trip recorded before zones were stored (offsets only): a 13-hour jump is a trip.
        #expect(
            HabitRules.excusedFrom(
                day: d(3, 12), instantMilliseconds: wednesday, previousOffsetSeconds: -4 * 3600, previousDay: d(3, 10), offsetSeconds: 9 * 3600)
                == d(3, 11))
        let daily: Set<Int> = Set(1...7)
        let evs = (3...10).map { HabitEventDay(day: d(3, $0)) } + [HabitEventDay(day: d(3, 12), excusedFrom: excused)]
        let m = HabitRules.metrics(weekdays: daily, start: d(3, 3), events: evs, today: d(3, 12))
        #expect(m.currentStreak == 9 && m.longestStreak == 9)
        // Back home in New York, skipping a day is missed again.
        #expect(
            HabitRules.excusedFrom(
                day: d(3, 14), instantMilliseconds: instant(3, 14, 12), previousOffsetSeconds: 9 * 3600, previousDay: d(3, 12),
                previousZone: "Asia/Tokyo", offsetSeconds: -4 * 3600) == nil)
    }
}
