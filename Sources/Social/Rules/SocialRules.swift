import Contracts
import Security
import ServiceKit

/// Invite codes (B UC-5, UC-9): 8 characters of Crockford base32 (40 random bits from the system
/// CSPRNG), shown as "XXXX-XXXX", matched case-insensitively with the hyphen optional. Crockford's
/// reading rules apply: O→0, I/L→1, so a code read aloud or retyped still matches.
public enum InviteCode {
    static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    public static let length = 8

    /// A new random code, normalised ("K7P29XQM").
    public static func make() -> String {
        // 5 random bytes = 40 bits = 8 symbols of 5 bits.
        let bytes = SecureRandom.bytes(5)
        var bits: UInt64 = 0
        for b in bytes { bits = bits << 8 | UInt64(b) }
        var out = ""
        for i in (0..<8).reversed() { out.append(alphabet[Int((bits >> UInt64(i * 5)) & 31)]) }
        return out
    }

    /// As shown to people: "K7P2-9XQM".
    public static func display(_ normalised: String) -> String {
        guard normalised.count == length else { return normalised }
        return String(normalised.prefix(4)) + "-" + String(normalised.suffix(4))
    }

    /// The stored form of what a person typed, or nil when it cannot be a code: white space and
    /// hyphens dropped, upper-cased, O→0, I/L→1; then exactly 8 symbols of the alphabet.
    public static func normalise(_ typed: String) -> String? {
        var out = ""
        for c in typed.uppercased() {
            switch c {
            case "-", " ", "\t": continue
            case "O": out.append("0")
            case "I", "L": out.append("1")
            default:
                guard alphabet.contains(c) else { return nil }
                out.append(c)
            }
            if out.count > length { return nil }
        }
        return out.count == length ? out : nil
    }
}

/// Which notifications are kept from the live stream (A UC13, B UC-24).
public enum NotificationRules {
    /// Help requests and offers: the kinds MuteHelpNotifications silences.
    public static func isHelpKind(_ kind: Social_V1_NotificationKind) -> Bool {
        kind == .helpRequest || kind == .helpOffer
    }

    /// A notification created `now` is silenced (stored, not pushed) while help is muted for a
    /// help kind, or while a snooze lasts (`snoozedUntil` in the future).
    public static func silenced(kind: Social_V1_NotificationKind, helpMuted: Bool, snoozedUntil: Int64?, now: Int64) -> Bool {
        (helpMuted && isHelpKind(kind)) || (snoozedUntil.map { now < $0 } ?? false)
    }

    /// SnoozeNotifications' duration: zero ends the snooze; else 1 minute..7 days.
    public static let snoozeRange: ClosedRange<Int64> = 60_000...(7 * 24 * 3600 * 1000)
}

/// The team ranking order (A UC10): score descending; ties by who reached the score first, then
/// by team id. Total, so pages never skip or repeat and ranks are consecutive.
public struct RankKey: Comparable, Sendable {
    public var score: Int64
    public var reachedAt: Int64
    public var teamID: String
    public init(score: Int64, reachedAt: Int64, teamID: String) {
        self.score = score
        self.reachedAt = reachedAt
        self.teamID = teamID
    }
    /// `a < b` when `a` ranks better (comes first).
    public static func < (a: RankKey, b: RankKey) -> Bool {
        if a.score != b.score { return a.score > b.score }
        if a.reachedAt != b.reachedAt { return a.reachedAt < b.reachedAt }
        return a.teamID < b.teamID
    }
    var cursor: [String] { [String(score), String(reachedAt), teamID] }
    init?(cursor: [String]) {
        guard cursor.count == 3, let s = Int64(cursor[0]), let r = Int64(cursor[1]) else { return nil }
        self.init(score: s, reachedAt: r, teamID: cursor[2])
    }
}

/// Text and list rules of the social requests (on the kit's FieldRules).
enum SocialRules {
    /// Team and household names: 1..50 characters, no control characters.
    static func name(_ raw: String, field: String = "name", into errors: inout FieldErrors) -> String {
        FieldRules.text(raw, field: field, 1...50, into: &errors)
    }

    /// A UserSelector: exactly one of user_id / username (usernames compared case-insensitively).
    enum Selector: Sendable, Equatable {
        case id(String)
        case username(String)
    }

    static func selector(_ s: Social_V1_UserSelector?, field: String = "user", into errors: inout FieldErrors) -> Selector? {
        switch s?.selector {
        case .userId(let id)?:
            let v = FieldRules.id(id, field: "\(field).user_id", into: &errors)
            return v.isEmpty ? nil : .id(v)
        case .username(let name)?:
            let v = FieldRules.trimmed(name)
            if v.isEmpty {
                errors.add("\(field).username", "required")
            } else if FieldRules.length(v) > 64 || FieldRules.hasControlCharacters(v) {
                errors.add("\(field).username", "is not a username")
            } else {
                return .username(v)
            }
            return nil
        case nil:
            errors.add(field, "required: set user_id or username")
            return nil
        }
    }
}
