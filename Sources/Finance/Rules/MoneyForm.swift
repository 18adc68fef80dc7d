import Contracts
import ServiceKit

/// The payment and charge form (CreatePaymentRequest and CreateChargeRequest have the same
/// fields), validated as a whole: every rejected field named in one INVALID_ARGUMENT with its
/// proto path (`amount.currency`, `housemate_user_ids[2]`, `custom_shares[1].amount`).
struct MoneyForm: Sendable {
    var householdID: String
    var description: String
    var amount: Common_V1_Money?
    var splitMode: Finance_V1_SplitMode
    var housemateUserIDs: [String]
    var customShares: [Finance_V1_Share]
    var idempotencyKey: String

    init(_ r: Finance_V1_CreatePaymentRequest) {
        householdID = r.householdId
        description = r.description_p
        amount = r.hasAmount ? r.amount : nil
        splitMode = r.splitMode
        housemateUserIDs = r.housemateUserIds
        customShares = r.customShares
        idempotencyKey = r.idempotencyKey
    }

    init(_ r: Finance_V1_CreateChargeRequest) {
        householdID = r.householdId
        description = r.description_p
        amount = r.hasAmount ? r.amount : nil
        splitMode = r.splitMode
        housemateUserIDs = r.housemateUserIds
        customShares = r.customShares
        idempotencyKey = r.idempotencyKey
    }

    /// A form that passed every field rule.
    struct Valid: Sendable {
        var householdID: String
        var description: String
        var currency: String
        /// What the transaction's total is (the amount, or amount × housemates for EACH).
        var totalCents: Int64
        var splitMode: Finance_V1_SplitMode
        /// One per housemate, in request order.
        var shares: [Splits.Share]
        /// The request field naming each housemate (for "not a member" errors).
        var fields: [String: String]
        var idempotencyKey: String
    }

    static let maxHousemates = 20

    /// Checks every field (the caller may not list themselves) and splits the amount.
    func validate(caller: String) throws -> Valid {
        var errors = FieldErrors()
        let household = FieldRules.id(householdID, field: "household_id", into: &errors)
        let text = FieldRules.text(description, field: "description", 1...100, into: &errors)
        let (cents, currency) = Self.amount(amount, field: "amount", into: &errors)

        var users: [String] = []
        var fields: [String: String] = [:]
        var customCents: [Int64] = []
        var sharesValid = true
        func user(_ raw: String, field: String) -> String? {
            let id = FieldRules.id(raw, field: field, into: &errors)
            guard !id.isEmpty, FieldRules.length(id) <= FieldRules.maxIDLength else { sharesValid = false; return nil }
            if id == caller {
                errors.add(field, "must be a housemate, not you")
            } else if fields[id] != nil {
                errors.add(field, "lists this housemate twice")
            } else {
                fields[id] = field
                return id
            }
            sharesValid = false
            return nil
        }
        switch splitMode {
        case .equal, .each:
            if housemateUserIDs.isEmpty { errors.add("housemate_user_ids", "at least one housemate is required") }
            if housemateUserIDs.count > Self.maxHousemates { errors.add("housemate_user_ids", "at most \(Self.maxHousemates) housemates") }
            for (i, raw) in housemateUserIDs.prefix(Self.maxHousemates).enumerated() {
                if let id = user(raw, field: "housemate_user_ids[\(i)]") { users.append(id) }
            }
            if !customShares.isEmpty { errors.add("custom_shares", "must be empty unless split_mode is SPLIT_MODE_CUSTOM") }
        case .custom:
            if customShares.isEmpty { errors.add("custom_shares", "at least one share is required") }
            if customShares.count > Self.maxHousemates { errors.add("custom_shares", "at most \(Self.maxHousemates) shares") }
            for (i, share) in customShares.prefix(Self.maxHousemates).enumerated() {
                let id = user(share.userId, field: "custom_shares[\(i)].user_id")
                let (c, cur) = Self.amount(
                    share.hasAmount ? share.amount : nil, field: "custom_shares[\(i)].amount",
                    currencyOptional: true, into: &errors)
                if let cur, let currency, !cur.isEmpty, cur != currency {
                    errors.add("custom_shares[\(i)].amount.currency", "must be the request's currency (\(currency))")
                }
                if let id, let c { users.append(id); customCents.append(c) } else { sharesValid = false }
            }
            if !housemateUserIDs.isEmpty {
                errors.add("housemate_user_ids", "must be empty for SPLIT_MODE_CUSTOM (name housemates in custom_shares)")
            }
        case .unspecified:
            errors.add("split_mode", "required: SPLIT_MODE_EQUAL, SPLIT_MODE_EACH or SPLIT_MODE_CUSTOM")
        case .unrecognized(let n):
            errors.add("split_mode", "unknown split mode \(n)")
        }
        FieldRules.idempotencyKey(idempotencyKey, into: &errors)

        // The split itself, once its inputs are valid.
        var shares: [Splits.Share] = []
        var total: Int64 = cents ?? 0
        if let cents, !users.isEmpty, sharesValid {
            switch splitMode {
            case .equal:
                switch Splits.equal(total: cents, among: users) {
                case .success(let s): shares = s
                case .failure: errors.add("amount", "must be at least 1 cent per housemate (\(users.count) housemates)")
                }
            case .each:
                switch Splits.each(amount: cents, among: users) {
                case .success(let r): (shares, total) = r
                case .failure: errors.add("amount", "times the number of housemates is too large")
                }
            case .custom:
                switch Splits.custom(total: cents, shares: zip(users, customCents).map { Splits.Share($0, $1) }) {
                case .success(let s): shares = s
                case .failure(.customSumMismatch(let sum)):
                    errors.add(
                        "custom_shares",
                        sum.map { "sum to \($0) cents, but amount is \(cents) cents: they must be equal" }
                            ?? "sum is too large")
                case .failure: errors.add("custom_shares", "cannot be added up")
                }
            default: break
            }
        }
        try errors.throwIfAny()
        return Valid(
            householdID: household, description: text, currency: currency ?? "", totalCents: total, splitMode: splitMode,
            shares: shares, fields: fields, idempotencyKey: idempotencyKey)
    }

    /// An amount field: present, > 0, ≤ the maximum, and (unless optional and empty) a currency
    /// of ISO 4217's shape. Returns the cents and currency when valid.
    static func amount(
        _ money: Common_V1_Money?, field: String, currencyOptional: Bool = false,
        into errors: inout FieldErrors
    ) -> (cents: Int64?, currency: String?) {
        guard let money else {
            errors.add(field, "required")
            return (nil, nil)
        }
        var cents: Int64? = money.amountCents
        if money.amountCents == 0 {
            errors.add(field, "required: an amount > 0 cents")
            cents = nil
        } else if money.amountCents < 0 {
            errors.add(field, "must be more than 0 cents")
            cents = nil
        } else if money.amountCents > MoneyRules.maxRequestCents {
            errors.add(field, "must be at most \(MoneyRules.maxRequestCents) cents")
            cents = nil
        }
        var currency: String? = money.currency
        if currencyOptional && money.currency.isEmpty {
            currency = ""
        } else if !MoneyRules.isCurrencyCode(money.currency) {
            errors.add(
                "\(field).currency",
                money.currency.isEmpty
                    ? "required: an ISO 4217 code such as EUR"
                    : "must be an ISO 4217 code: three upper-case letters such as EUR")
            currency = nil
        }
        return (cents, currency)
    }
}
