/// `grpc-timeout` as the gRPC protocol defines it: at most 8 ASCII digits and a unit
/// (H, M, S, m, u, n).
public enum GRPCTimeout {
    /// Parses a header value; nil when malformed.
    public static func parse(_ value: String) -> Duration? {
        let utf8 = Array(value.utf8)
        guard utf8.count >= 2, utf8.count <= 9 else { return nil }
        var amount: Int64 = 0
        for c in utf8.dropLast() {
            guard c >= 48, c <= 57 else { return nil }
            amount = amount * 10 + Int64(c - 48)
        }
        switch utf8.last! {
        case UInt8(ascii: "H"): return .seconds(amount * 3600)
        case UInt8(ascii: "M"): return .seconds(amount * 60)
        case UInt8(ascii: "S"): return .seconds(amount)
        case UInt8(ascii: "m"): return .milliseconds(amount)
        case UInt8(ascii: "u"): return .microseconds(amount)
        case UInt8(ascii: "n"): return .nanoseconds(amount)
        default: return nil
        }
    }

    /// Formats a duration with the finest unit that fits in 8 digits (rounding up so the server
    /// never sees a shorter deadline than the client's).
    static func format(_ d: Duration) -> String {
        let (s, atto) = d.components
        // Past ~285 years the sum below could overflow Int64 nanoseconds: that is the cap anyway.
        if s >= 9_000_000_000 { return "99999999H" }
        let totalNanos = max(0, s) * 1_000_000_000 + max(0, atto) / 1_000_000_000
        let units: [(Int64, String)] = [
            (1, "n"), (1_000, "u"), (1_000_000, "m"), (1_000_000_000, "S"),
            (60_000_000_000, "M"), (3_600_000_000_000, "H"),
        ]
        for (div, unit) in units {
            let v = (totalNanos + div - 1) / div
            if v < 100_000_000 { return "\(v)\(unit)" }
        }
        return "99999999H"
    }
}
