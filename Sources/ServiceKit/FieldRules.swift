import GRPCContracts

/// The field rules every contract shares (Proto/README.md, "Field rules"): text is trimmed and
/// counted in Unicode scalars, control characters are refused, ids are at most 64 characters,
/// page sizes and idempotency keys follow one rule everywhere. Each check adds to a `FieldErrors`
/// and returns the normalised value, so a handler validates the whole request and rejects it once,
/// naming every bad field.
///
/// Numbers a client sends (times, spans, counts, amounts) are checked for range here, before any
/// arithmetic: an overflow in Swift traps and stops the whole process.
public enum FieldRules {
    /// Ids (ULIDs today) are opaque strings of at most this many characters.
    public static let maxIDLength = 64
    /// Page sizes: 0 means the method's default; larger than this is clamped.
    public static let maxPageSize = 100

    /// Leading and trailing white space removed (lengths are counted after trimming).
    public static func trimmed(_ s: String) -> String {
        var sub = Substring(s)
        while let f = sub.unicodeScalars.first, f.properties.isWhitespace { sub = Substring(sub.unicodeScalars.dropFirst()) }
        while let l = sub.unicodeScalars.last, l.properties.isWhitespace { sub = Substring(sub.unicodeScalars.dropLast()) }
        return String(sub)
    }

    /// Length in Unicode scalars, the unit every contract counts in.
    public static func length(_ s: String) -> Int { s.unicodeScalars.count }

    /// Control or format characters (zero-width joiner allowed: emoji sequences need it).
    public static func hasControlCharacters(_ s: String) -> Bool {
        s.unicodeScalars.contains { $0.properties.generalCategory == .control || $0.properties.generalCategory == .format && $0.value != 0x200D }
    }

    /// Like `hasControlCharacters`, but line breaks and tabs are allowed (descriptions, comments).
    public static func hasControlCharactersExceptLineBreaks(_ s: String) -> Bool {
        s.unicodeScalars.contains { c in
            c != "\n" && c != "\r" && c != "\t"
                && (c.properties.generalCategory == .control || c.properties.generalCategory == .format && c.value != 0x200D)
        }
    }

    /// A trimmed text field of `range` scalars (an empty range start of 0 makes it optional);
    /// `multiline` allows line breaks and tabs.
    @discardableResult
    public static func text(
        _ raw: String, field: String, _ range: ClosedRange<Int>, multiline: Bool = false,
        into errors: inout FieldErrors
    ) -> String {
        let v = trimmed(raw)
        let n = length(v)
        if n == 0 && range.lowerBound > 0 {
            errors.add(field, "required")
        } else if !range.contains(n) {
            errors.add(
                field,
                range.lowerBound <= 1
                    ? "must be at most \(range.upperBound) characters"
                    : "must be \(range.lowerBound) to \(range.upperBound) characters")
        } else if multiline ? hasControlCharactersExceptLineBreaks(v) : hasControlCharacters(v) {
            errors.add(field, "must not contain control characters")
        }
        return v
    }

    /// `s` cut to at most `maximum` Unicode scalars (the unit every contract counts in), ending in
    /// "…" when it was cut: text one service builds for a field another service validates (a
    /// notification's title and body). The cut falls between characters, so an emoji sequence is
    /// kept whole or left out whole. Unchanged when it fits.
    public static func clip(_ s: String, to maximum: Int) -> String {
        guard length(s) > maximum else { return s }
        guard maximum > 1 else { return maximum == 1 ? "…" : "" }
        var out = String.UnicodeScalarView()
        var kept = 0
        for c in s {
            let n = c.unicodeScalars.count
            if kept + n > maximum - 1 { break }
            out.append(contentsOf: c.unicodeScalars)
            kept += n
        }
        out.append("…")
        return String(out)
    }

    /// An id naming something (never parsed: only presence and length are checked).
    @discardableResult
    public static func id(_ raw: String, field: String, required: Bool = true, into errors: inout FieldErrors) -> String {
        let v = trimmed(raw)
        if v.isEmpty {
            if required { errors.add(field, "required") }
        } else if length(v) > maxIDLength || hasControlCharacters(v) {
            errors.add(field, "is not an id (at most \(maxIDLength) characters)")
        }
        return v
    }

    /// A list of ids: at least `minimum`, at most `maximum`, each an id; exact duplicates removed
    /// (request order kept).
    public static func ids(
        _ raw: [String], field: String, minimum: Int = 1, maximum: Int = 200,
        into errors: inout FieldErrors
    ) -> [String] {
        if raw.count < minimum { errors.add(field, minimum == 1 ? "at least one is required" : "at least \(minimum) are required") }
        if raw.count > maximum { errors.add(field, "at most \(maximum) are allowed") }
        var seen = Set<String>()
        var out: [String] = []
        for (i, value) in raw.prefix(maximum).enumerated() {
            let v = id(value, field: "\(field)[\(i)]", into: &errors)
            if !v.isEmpty, seen.insert(v).inserted { out.append(v) }
        }
        return out
    }

    /// Page size rule of every list: negative rejected, 0 = `defaultSize`, clamped to `maximum`
    /// (100 unless the contract allows more for the list).
    public static func pageSize(
        _ requested: Int32, field: String = "page_size", defaultSize: Int = 20, maximum: Int = maxPageSize,
        into errors: inout FieldErrors
    ) -> Int {
        if requested < 0 {
            errors.add(field, "must not be negative")
            return defaultSize
        }
        return requested == 0 ? defaultSize : min(Int(requested), maximum)
    }

    /// `idempotency_key`: 1..64 printable ASCII characters (0x20...0x7E, space included, as the
    /// contracts say), chosen by the client per logical operation. Not trimmed: the client's bytes
    /// are the key.
    @discardableResult
    public static func idempotencyKey(
        _ v: String, field: String = "idempotency_key", required: Bool = true,
        into errors: inout FieldErrors
    ) -> String {
        if v.isEmpty {
            if required { errors.add(field, "required (1 to 64 printable ASCII characters, one per logical operation)") }
        } else if v.utf8.count > 64 || !v.utf8.allSatisfy({ (0x20...0x7E).contains($0) }) {
            errors.add(field, "must be 1 to 64 printable ASCII characters")
        }
        return v
    }

    /// `event_id` of an outbox-driven internal call: 1..64 characters, no control characters.
    @discardableResult
    public static func eventID(_ v: String, field: String = "event_id", into errors: inout FieldErrors) -> String {
        if v.isEmpty || length(v) > 64 || hasControlCharacters(v) { errors.add(field, "must be 1 to 64 characters") }
        return v
    }

    // MARK: Times and spans

    /// The seconds google.protobuf.Timestamp allows: 0001-01-01T00:00:00Z to
    /// 9999-12-31T23:59:59Z (Unix seconds).
    public static let timestampSeconds: ClosedRange<Int64> = -62_135_596_800...253_402_300_799
    /// The seconds google.protobuf.Duration allows: ±10,000 years.
    public static let durationSeconds: ClosedRange<Int64> = -315_576_000_000...315_576_000_000
    /// `nanos` of a Timestamp.
    public static let timestampNanos: ClosedRange<Int32> = 0...999_999_999

    /// A client's Timestamp as Unix milliseconds (nanoseconds below a millisecond dropped), after
    /// the checks google.protobuf.Timestamp documents: `seconds` within 0001-01-01T00:00:00Z ..
    /// 9999-12-31T23:59:59Z, `nanos` 0..999,999,999. A bad one adds `<field>.seconds` or
    /// `<field>.nanos` to `errors` and returns the nearest valid time, so the request is then
    /// refused by `throwIfAny` before the value is used; the result never overflows.
    /// `range`, in Unix milliseconds, is the method's own range (`rule` says it for the client).
    @discardableResult
    public static func timestamp(
        _ t: Google_Protobuf_Timestamp, field: String, range: ClosedRange<Int64>? = nil, rule: String? = nil,
        into errors: inout FieldErrors
    ) -> Int64 {
        var bad = false
        if !timestampSeconds.contains(t.seconds) {
            errors.add(
                "\(field).seconds",
                "must be within 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z (\(timestampSeconds.lowerBound) to \(timestampSeconds.upperBound) Unix seconds)"
            )
            bad = true
        }
        if !timestampNanos.contains(t.nanos) {
            errors.add("\(field).nanos", "must be 0 to 999999999")
            bad = true
        }
        let seconds = min(max(t.seconds, timestampSeconds.lowerBound), timestampSeconds.upperBound)
        let nanos = min(max(t.nanos, timestampNanos.lowerBound), timestampNanos.upperBound)
        let ms = seconds * 1000 + Int64(nanos) / 1_000_000
        if !bad, let range, !range.contains(ms) {
            errors.add(field, rule ?? "must be within \(range.lowerBound) to \(range.upperBound) Unix milliseconds")
        }
        return ms
    }

    /// A client's Duration as milliseconds (truncated toward zero), after the checks
    /// google.protobuf.Duration documents: `seconds` within ±315,576,000,000 (10,000 years),
    /// `nanos` within ±999,999,999 and of the same sign as `seconds`. Then `range` (milliseconds)
    /// is the method's own range, `rule` how the error says it ("must be 1 minute to 7 days").
    /// A bad one adds to `errors` and returns a value clamped into range; nothing overflows.
    @discardableResult
    public static func duration(
        _ d: Google_Protobuf_Duration, field: String, range: ClosedRange<Int64>? = nil, rule: String? = nil,
        into errors: inout FieldErrors
    ) -> Int64 {
        var bad = false
        if !durationSeconds.contains(d.seconds) {
            errors.add("\(field).seconds", "must be within -315576000000 to 315576000000 (10,000 years)")
            bad = true
        }
        if !(-999_999_999...999_999_999).contains(d.nanos) {
            errors.add("\(field).nanos", "must be -999999999 to 999999999")
            bad = true
        } else if d.seconds > 0 && d.nanos < 0 || d.seconds < 0 && d.nanos > 0 {
            errors.add("\(field).nanos", "must have the sign of seconds")
            bad = true
        }
        let seconds = min(max(d.seconds, durationSeconds.lowerBound), durationSeconds.upperBound)
        let nanos = min(max(d.nanos, -999_999_999), 999_999_999)
        var ms = seconds * 1000 + Int64(nanos) / 1_000_000
        if let range {
            if !bad, !range.contains(ms) {
                errors.add(field, rule ?? "must be \(range.lowerBound) to \(range.upperBound) milliseconds")
            }
            ms = min(max(ms, range.lowerBound), range.upperBound)
        }
        return ms
    }

    /// A client's count or amount: `value` must be within `range` (`rule` words it). Returns the
    /// value clamped into the range, so arithmetic on it stays within the range's bounds.
    @discardableResult
    public static func number<T: FixedWidthInteger>(
        _ value: T, field: String, _ range: ClosedRange<T>, rule: String? = nil, into errors: inout FieldErrors
    ) -> T {
        if !range.contains(value) {
            errors.add(field, rule ?? "must be \(range.lowerBound) to \(range.upperBound)")
        }
        return min(max(value, range.lowerBound), range.upperBound)
    }

    // MARK: Email

    public static let emailMax = 254

    /// An email address, trimmed: one "@", a non-empty local part (≤ 64 bytes), a dotted domain of
    /// non-empty labels, no white space or control characters, ≤ 254 characters.
    public static func email(_ raw: String, field: String = "email", required: Bool = true, into errors: inout FieldErrors) -> String {
        let v = trimmed(raw)
        if v.isEmpty {
            if required { errors.add(field, "required") }
        } else if length(v) > emailMax {
            errors.add(field, "must be at most 254 characters")
        } else if !isWellFormedEmail(v) {
            errors.add(field, "is not a well-formed email address (name@example.com)")
        }
        return v
    }

    /// Deliberately loose beyond the shape: the only real check of an address is a mail.
    public static func isWellFormedEmail(_ v: String) -> Bool {
        let parts = v.split(separator: "@", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, parts[0].utf8.count <= 64 else { return false }
        guard !v.unicodeScalars.contains(where: { $0.properties.isWhitespace }), !hasControlCharacters(v) else { return false }
        let labels = parts[1].split(separator: ".", omittingEmptySubsequences: false)
        guard labels.count >= 2, labels.allSatisfy({ !$0.isEmpty && !$0.hasPrefix("-") && !$0.hasSuffix("-") }) else { return false }
        return parts[1].unicodeScalars.allSatisfy { $0.value > 0x7F || isDomainScalar($0) }
    }

    static func isDomainScalar(_ c: Unicode.Scalar) -> Bool {
        switch c {
        case "a"..."z", "A"..."Z", "0"..."9", "-", ".": true
        default: false
        }
    }

    /// The case-insensitive comparison key of usernames and emails.
    public static func key(_ s: String) -> String { s.lowercased() }
}
