/// Money as the ledger keeps it: integer cents (`Int64`) and an ISO 4217 code. Never floating
/// point; every sum is checked for overflow, so an amount that would wrap is refused instead of
/// silently turning a debt into a credit.
public enum MoneyRules {
    /// The largest amount one request may carry (contract: at most 1 000 000 000 cents).
    public static let maxRequestCents: Int64 = 1_000_000_000

    /// ISO 4217's shape: three upper-case ASCII letters ("EUR", "USD").
    public static func isCurrencyCode(_ s: String) -> Bool {
        s.utf8.count == 3 && s.utf8.allSatisfy { (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains($0) }
    }

    /// `a + b`, or nil when it would overflow.
    public static func add(_ a: Int64, _ b: Int64) -> Int64? {
        let (r, o) = a.addingReportingOverflow(b)
        return o ? nil : r
    }

    /// `a × n`, or nil when it would overflow.
    public static func multiply(_ a: Int64, _ n: Int64) -> Int64? {
        let (r, o) = a.multipliedReportingOverflow(by: n)
        return o ? nil : r
    }

    /// The sum of `values`, or nil when any partial sum would overflow.
    public static func sum(_ values: some Sequence<Int64>) -> Int64? {
        var total: Int64 = 0
        for v in values {
            guard let t = add(total, v) else { return nil }
            total = t
        }
        return total
    }

    /// "12.34 EUR" (for notifications and messages; minus sign for negatives).
    public static func format(_ cents: Int64, _ currency: String) -> String {
        let m = cents.magnitude
        let frac = m % 100
        let number = "\(cents < 0 ? "-" : "")\(m / 100).\(frac < 10 ? "0" : "")\(frac)"
        return currency.isEmpty ? number : "\(number) \(currency)"
    }
}
