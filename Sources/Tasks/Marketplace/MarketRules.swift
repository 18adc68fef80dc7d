import Contracts
import Foundation
import ServiceKit

/// The marketplace's request rules (seed D, `marketplace.proto`) as pure functions: field checks
/// that name every bad field, keywords, statuses and scopes.
enum MarketRules {
    static let maxPhotos = 5
    static let maxPhotoBytes = 262_144
    static let maxBidCents: Int64 = 100_000_000

    /// Photos of a request: each 1..262144 bytes, JPEG/PNG/WebP by magic bytes; the content types
    /// in order (nil entries for rejected photos).
    static func photos(_ photos: [[UInt8]], field: String, into errors: inout FieldErrors) -> [String?] {
        photos.enumerated().map { i, p in
            if p.isEmpty || p.count > maxPhotoBytes {
                errors.add("\(field)[\(i)]", "must be 1 to \(maxPhotoBytes) bytes")
                return nil
            }
            guard let type = ImageBytes.contentType(p) else {
                errors.add("\(field)[\(i)]", "is not a JPEG, PNG or WebP image")
                return nil
            }
            return type
        }
    }

    /// The active ISO 4217 currency codes (list one, 2024; without the funds codes and the
    /// precious metals, testing and "no currency" codes — X** — that no one bids in). A bid in
    /// anything else is refused: the first bid fixes a task's currency, so a made-up one ("ZZZ")
    /// would lock out every honest bidder.
    static let currencies: Set<String> = [
        "AED", "AFN", "ALL", "AMD", "ANG", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BGN", "BHD", "BIF", "BMD", "BND",
        "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF", "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF",
        "DKK", "DOP", "DZD", "EGP", "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ", "GYD", "HKD",
        "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD", "JOD", "JPY", "KES", "KGS", "KHR", "KMF", "KPW", "KRW",
        "KWD", "KYD", "KZT", "LAK", "LBP", "LKR", "LRD", "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR",
        "MVR", "MWK", "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK", "PHP", "PKR", "PLN",
        "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR", "SDG", "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN",
        "SVC", "SYP", "SZL", "THB", "TJS", "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS", "VED",
        "VES", "VND", "VUV", "WST", "XAF", "XCD", "XOF", "XPF", "YER", "ZAR", "ZMW", "ZWG",
    ]

    /// An amount of a bid: 1..100000000 cents, currency an active ISO 4217 code (`currencies`).
    static func amount(_ m: Common_V1_Money?, field: String = "amount", into errors: inout FieldErrors) -> (cents: Int64, currency: String)? {
        guard let m else {
            errors.add(field, "required (amount_cents and currency)")
            return nil
        }
        var ok = true
        if !(1...maxBidCents).contains(m.amountCents) {
            errors.add("\(field).amount_cents", "must be 1 to \(maxBidCents) cents")
            ok = false
        }
        if m.currency.utf8.count != 3 || !m.currency.utf8.allSatisfy({ (0x41...0x5A).contains($0) }) {
            errors.add("\(field).currency", "must be a 3-letter upper-case ISO 4217 code (e.g. \"EUR\")")
            ok = false
        } else if !currencies.contains(m.currency) {
            errors.add("\(field).currency", "\(m.currency) is not an ISO 4217 currency code (e.g. \"EUR\")")
            ok = false
        }
        return ok ? (m.amountCents, m.currency) : nil
    }

    /// Keywords: 0..10 space-separated words of 1..30 characters, as sent; a word equal to an
    /// earlier one once folded (`TextFold`) is dropped.
    static func keywords(_ raw: String, into errors: inout FieldErrors) -> [String] {
        let words = raw.split(whereSeparator: { $0.isWhitespace }).map(String.init)
        if words.count > 10 { errors.add("keywords", "at most 10 words") }
        if words.contains(where: { FieldRules.length($0) > 30 }) { errors.add("keywords", "each word must be at most 30 characters") }
        if FieldRules.hasControlCharacters(raw.filter { !$0.isWhitespace }) { errors.add("keywords", "must not contain control characters") }
        var seen = Set<String>()
        return words.prefix(10).filter { seen.insert(TextFold.fold($0)).inserted }
    }

    /// The FTS5 query of the (folded) words of three or more Unicode scalars (each a quoted
    /// phrase: a substring under the trigram tokenizer), or nil when none is that long.
    static func ftsQuery(_ words: [String]) -> String? {
        let long = words.filter { $0.unicodeScalars.count >= 3 }
        guard !long.isEmpty else { return nil }
        return long.map { "\"" + $0.replacingOccurrences(of: "\"", with: "\"\"") + "\"" }.joined(separator: " AND ")
    }

    /// Statuses of a filter: `allowed` only, no UNSPECIFIED; empty → `defaults`.
    static func statuses(
        _ raw: [Tasks_V1_MarketTaskStatus], allowed: Set<Int64>, defaults: Set<Int64>, what: String, into errors: inout FieldErrors
    ) -> [Int64] {
        var out = Set<Int64>()
        for (i, s) in raw.enumerated() {
            let v = Int64(s.rawValue)
            if allowed.contains(v) { out.insert(v) } else { errors.add("statuses[\(i)]", what) }
        }
        return (out.isEmpty ? defaults : out).sorted()
    }
}
