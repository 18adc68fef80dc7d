import Contracts
import Foundation
import ServiceKit

/// The push preferences' rules (pure): validation, quiet hours in the user's zone, and which
/// kinds are stale soon (PushPreferences in the contract states them).
public enum PushPreferenceRules {
    /// Quiet hours as stored: minutes after local midnight in a zone.
    public struct QuietHours: Sendable, Hashable {
        public var start: Int
        public var end: Int
        public var zone: TimeZone
        /// The zone's name as the user gave it (Foundation may name "UTC" "GMT").
        public var zoneName: String

        public init(start: Int, end: Int, zone: TimeZone, zoneName: String? = nil) {
            self.start = start
            self.end = end
            self.zone = zone
            self.zoneName = zoneName ?? zone.identifier
        }
    }

    /// Kinds that would be stale after a night: dropped in quiet hours, short-lived otherwise.
    public static func isShortLived(_ kind: Social_V1_NotificationKind) -> Bool {
        kind == .matchFound || kind == .rematchRequest || kind == .matchChatMessage
    }

    /// How long a push stays worth sending after its notification was stored.
    public static func lifetime(_ kind: Social_V1_NotificationKind) -> Int64 {
        isShortLived(kind) ? 15 * 60 * 1000 : 24 * 3600 * 1000
    }

    /// Validates a request's preferences: the disabled kinds (known, each once) and the quiet hours.
    static func validate(
        _ p: Social_V1_PushPreferences, field: String, into errors: inout FieldErrors
    ) -> (
        disabled: [Int32], quiet: QuietHours?
    ) {
        var seen = Set<Int32>()
        var disabled: [Int32] = []
        for (i, kind) in p.disabledKinds.enumerated() {
            let path = "\(field).disabled_kinds[\(i)]"
            guard kind != .unspecified, kind.protoName != nil else {
                errors.add(path, "must be a known notification kind")
                continue
            }
            guard seen.insert(Int32(kind.rawValue)).inserted else {
                errors.add(path, "repeats a kind")
                continue
            }
            disabled.append(Int32(kind.rawValue))
        }
        guard p.hasQuietHours else { return (disabled.sorted(), nil) }
        let q = p.quietHours
        let path = "\(field).quiet_hours"
        var ok = true
        if !(0...1439).contains(q.startMinute) {
            errors.add("\(path).start_minute", "must be 0..1439 (minutes after local midnight)")
            ok = false
        }
        if !(0...1439).contains(q.endMinute) {
            errors.add("\(path).end_minute", "must be 0..1439 (minutes after local midnight)")
            ok = false
        } else if q.endMinute == q.startMinute {
            errors.add("\(path).end_minute", "must differ from start_minute")
            ok = false
        }
        let zone = zone(named: q.timeZone)
        if zone == nil { errors.add("\(path).time_zone", "must be an IANA time zone name such as Europe/Berlin") }
        guard ok, let zone else { return (disabled.sorted(), nil) }
        return (disabled.sorted(), QuietHours(start: Int(q.startMinute), end: Int(q.endMinute), zone: zone, zoneName: q.timeZone))
    }

    /// A zone of the IANA database by its name ("Europe/Berlin", "UTC", "GMT", "Japan"); nil for
    /// anything else (offsets, abbreviations Foundation would guess at, paths).
    static func zone(named name: String) -> TimeZone? {
        guard !name.isEmpty, name.count <= 64, name == "UTC" || knownZones.contains(name) else { return nil }
        return TimeZone(identifier: name)
    }

    static let knownZones = Set(TimeZone.knownTimeZoneIdentifiers)

    /// When the quiet hours around `now` (ms) end, or nil when `now` is not in them. The local
    /// wall clock decides: on a day whose clock jumps over the end, they end at the first
    /// instant after the jump.
    public static func quietUntil(_ q: QuietHours, now: Int64) -> Int64? {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = q.zone
        let date = Date(timeIntervalSince1970: Double(now) / 1000)
        let parts = calendar.dateComponents([.hour, .minute], from: date)
        let minute = (parts.hour ?? 0) * 60 + (parts.minute ?? 0)
        let inside = q.start < q.end ? (minute >= q.start && minute < q.end) : (minute >= q.start || minute < q.end)
        guard inside else { return nil }
        guard
            let end = calendar.nextDate(
                after: date, matching: DateComponents(hour: q.end / 60, minute: q.end % 60, second: 0), matchingPolicy: .nextTime)
        else { return nil }
        return Int64((end.timeIntervalSince1970 * 1000).rounded())
    }

    /// Stored form of the disabled kinds: "4,10,12" (empty = none).
    static func encode(_ kinds: [Int32]) -> String { kinds.map(String.init).joined(separator: ",") }

    static func decode(_ text: String?) -> [Int32] {
        (text ?? "").split(separator: ",").compactMap { Int32($0) }
    }
}
