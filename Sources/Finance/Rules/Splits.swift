/// How a payment or charge is divided among housemates (Proto: `SplitMode`). Pure functions; the
/// handlers validate the request's fields before calling them.
public enum Splits {
    /// One housemate's share, in cents (> 0).
    public struct Share: Equatable, Sendable {
        public var userID: String
        public var cents: Int64
        public init(_ userID: String, _ cents: Int64) {
            self.userID = userID
            self.cents = cents
        }
    }

    public enum Failure: Error, Equatable, Sendable {
        /// An equal split would give someone 0 cents (fewer cents than housemates).
        case lessThanOneCentEach
        /// The total would overflow Int64.
        case overflow
        /// Custom shares sum to `sum`, not to the amount.
        case customSumMismatch(sum: Int64?)
    }

    /// EQUAL: `total` divided among `users`; the remainder cents go one each to the first users in
    /// request order (10.00 among 3 → 3.34, 3.33, 3.33). The shares always sum to `total`.
    public static func equal(total: Int64, among users: [String]) -> Result<[Share], Failure> {
        precondition(!users.isEmpty && total > 0)
        let n = Int64(users.count)
        guard total >= n else { return .failure(.lessThanOneCentEach) }
        let base = total / n, remainder = total % n
        return .success(users.enumerated().map { i, u in Share(u, base + (Int64(i) < remainder ? 1 : 0)) })
    }

    /// EACH: every user owes (or is owed) `amount`; the total is amount × users.
    public static func each(amount: Int64, among users: [String]) -> Result<(shares: [Share], total: Int64), Failure> {
        precondition(!users.isEmpty && amount > 0)
        guard let total = MoneyRules.multiply(amount, Int64(users.count)) else { return .failure(.overflow) }
        return .success((users.map { Share($0, amount) }, total))
    }

    /// CUSTOM: the given shares, which must sum exactly to `total` (no cent created or lost).
    public static func custom(total: Int64, shares: [Share]) -> Result<[Share], Failure> {
        let sum = MoneyRules.sum(shares.map(\.cents))
        guard sum == total else { return .failure(.customSumMismatch(sum: sum)) }
        return .success(shares)
    }
}
