import Contracts
import Foundation
import RPCCore
import Security
import ServiceKit
import Storage

/// `finance.v1.Finance`: payments, charges and repayments between housemates, balances,
/// histories and the settle-up plan. Every handler validates the whole request first (one
/// INVALID_ARGUMENT naming every bad field); a write confirms membership with social first and
/// records the money, its balances, its chain entry, its idempotency key and its notification in
/// one transaction.
public struct FinanceService: Finance_V1_FinanceService {
    let core: FinanceCore

    // MARK: Payments and charges

    public func createPayment(request: Finance_V1_CreatePaymentRequest, context: ServerContext) async throws -> Finance_V1_CreatePaymentResponse {
        let (transaction, replayed) = try await record(.payment, MoneyForm(request), request: request, method: "CreatePayment", context: context)
        var response = Finance_V1_CreatePaymentResponse()
        response.transaction = transaction
        response.replayed = replayed
        return response
    }

    public func createCharge(request: Finance_V1_CreateChargeRequest, context: ServerContext) async throws -> Finance_V1_CreateChargeResponse {
        let (transaction, replayed) = try await record(.charge, MoneyForm(request), request: request, method: "CreateCharge", context: context)
        var response = Finance_V1_CreateChargeResponse()
        response.transaction = transaction
        response.replayed = replayed
        return response
    }

    /// The idempotency scope of a user's money requests: one per caller, shared by payments,
    /// charges and repayments (a key names one logical operation, whichever it was).
    static func idempotencyScope(_ user: String) -> String { "finance:\(user)" }

    /// What a key is bound to: the method and the request's bytes.
    static func fingerprint(_ method: String, _ request: some ProtoMessage) -> [UInt8] {
        SHA256.hash(Array(method.utf8) + [0] + request.serializedBytes())
    }

    /// A payment or charge: validate, answer a retry from its key, confirm membership, record.
    func record(
        _ kind: Finance_V1_TransactionKind, _ form: MoneyForm, request: some ProtoMessage, method: String,
        context: ServerContext
    ) async throws -> (Finance_V1_Transaction, Bool) {
        let caller = try core.caller(context)
        let valid = try form.validate(caller: caller)
        let scope = Self.idempotencyScope(caller), fingerprint = Self.fingerprint(method, request)
        let key = valid.idempotencyKey
        if let earlier = try await core.store.read({ c in
            try c.storedAnswer(scope: scope, key: key, fingerprint: fingerprint, as: Finance_V1_Transaction.self)
        }) {
            return (earlier, true)
        }

        // Every listed housemate must be a current member of the active household, and so must
        // the caller; while social cannot say, nothing is recorded.
        let household = try await core.peers.household(
            valid.householdID, users: [caller] + valid.shares.map(\.userID),
            purpose: .write)
        try Self.requireCurrentMember(household, caller)
        var errors = FieldErrors()
        for share in valid.shares where household.state(of: share.userID) != .member {
            errors.add(valid.fields[share.userID] ?? "housemate_user_ids", "is not a current member of this household")
        }
        try errors.throwIfAny()

        let clock = core.clock
        let new = Ledger.NewTransaction(
            scope: valid.householdID, kind: kind, currency: valid.currency, totalCents: valid.totalCents, splitMode: valid.splitMode,
            createdBy: caller, taskID: "", description: valid.description,
            debts: valid.shares.map {
                kind == .payment ? LedgerChain.Debt(caller, $0.userID, $0.cents) : LedgerChain.Debt($0.userID, caller, $0.cents)
            })
        let (transaction, replayed) = try await core.store.write { tx in
            try tx.idempotent(scope: scope, key: key, fingerprint: fingerprint, now: clock.nowMilliseconds()) {
                try Self.requireHouseholdCurrency(tx, scope: new.scope, currency: new.currency)
                let t = try Ledger.append(tx, new, clock: clock)
                try Notifications.enqueue(tx, for: t, recipients: new.debts.map { kind == .payment ? $0.creditor : $0.debtor }, actor: caller)
                return t
            }
        }
        if !replayed {
            core.logger.info(
                "money recorded",
                metadata: [
                    "transaction": "\(transaction.transactionId)", "kind": "\(kind)",
                    "household": "\(valid.householdID)",
                ])
        }
        return (transaction, replayed)
    }

    /// One currency per household, fixed by its first transaction.
    static func requireHouseholdCurrency(_ tx: Transaction, scope: String, currency: String, field: String = "amount.currency") throws {
        if let fixed = try Ledger.currency(tx, scope: scope), fixed != currency {
            throw FieldErrors.single(
                .invalidArgument, field: field,
                "this household's money is in \(fixed) (fixed by its first transaction): use \(fixed)")
        }
    }

    /// Writes need the caller to be a current member of an active household.
    static func requireCurrentMember(_ h: FinancePeers.Household, _ caller: String) throws {
        switch h.state(of: caller) {
        case .member: break
        case .formerMember: throw RPCError(.failedPrecondition, "you are no longer a member of this household: only its members record money in it")
        default: throw RPCError(.notFound, "no such household")
        }
        if !h.active {
            throw RPCError(.failedPrecondition, "this household was deleted: its history stays readable, but no new money can be recorded in it")
        }
    }

    /// Reads need the caller to be a current or former member (also of a deleted household).
    func visibleHousehold(_ id: String, caller: String, also users: [String] = []) async throws -> FinancePeers.Household {
        let h = try await core.peers.household(id, users: [caller] + users, purpose: .read)
        switch h.state(of: caller) {
        case .member, .formerMember: return h
        default: throw RPCError(.notFound, "no such household")
        }
    }

    // MARK: Balances and history

    public func getBalances(request: Finance_V1_GetBalancesRequest, context: ServerContext) async throws -> Finance_V1_GetBalancesResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let scope = FieldRules.id(request.householdId, field: "household_id", required: false, into: &errors)
        try errors.throwIfAny()

        var members: [String] = []
        if !scope.isEmpty {
            let h = try await visibleHousehold(scope, caller: caller)
            members = h.members.filter { $0 != caller }
        }
        let (rows, currency) = try await core.store.read { c in
            (try Ledger.balances(c, scope: scope, user: caller), try Ledger.currency(c, scope: scope) ?? "")
        }
        struct Line { var user: String, currency: String, cents: Int64, last: Int64?, former: Bool }
        var lines: [Line] = []
        if scope.isEmpty {
            lines = rows.map { Line(user: $0.counterpart, currency: $0.currency, cents: $0.cents, last: $0.lastTransactionAt, former: false) }
        } else {
            let memberSet = Set(members)
            var byUser: [String: Ledger.PairBalance] = [:]
            for r in rows { byUser[r.counterpart] = r }
            lines = members.map { m in
                let r = byUser[m]
                return Line(user: m, currency: r?.currency ?? currency, cents: r?.cents ?? 0, last: r?.lastTransactionAt, former: false)
            }
            lines += rows.filter { !memberSet.contains($0.counterpart) && $0.cents != 0 }
                .map { Line(user: $0.counterpart, currency: $0.currency, cents: $0.cents, last: $0.lastTransactionAt, former: true) }
        }
        let refs = try await core.refs(lines.map(\.user))
        var response = Finance_V1_GetBalancesResponse()
        response.balances = lines.map { line in
            var b = Finance_V1_Balance()
            b.counterpart = refs[line.user] ?? FinancePeers.idOnly(line.user)
            b.amount = Ledger.money(line.cents, line.currency)
            b.formerHousemate = line.former
            if let last = line.last { b.lastTransactionAt = Google_Protobuf_Timestamp(milliseconds: last) }
            return b
        }
        .sorted { l, r in
            let (ln, rn) = (l.counterpart.displayName.lowercased(), r.counterpart.displayName.lowercased())
            return (ln, l.counterpart.userId, l.amount.currency) < (rn, r.counterpart.userId, r.amount.currency)
        }
        return response
    }

    public func listTransactions(
        request: Finance_V1_ListTransactionsRequest, context: ServerContext
    ) async throws -> Finance_V1_ListTransactionsResponse {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let scope = FieldRules.id(request.householdId, field: "household_id", required: false, into: &errors)
        let counterpart = FieldRules.id(request.counterpartUserId, field: "counterpart_user_id", into: &errors)
        if !counterpart.isEmpty && counterpart == caller { errors.add("counterpart_user_id", "must be another user, not you") }
        let pageSize = FieldRules.pageSize(request.pageSize, into: &errors)
        let filters = "transactions:\(scope):\(caller):\(counterpart)"
        let before = core.pageTokens.cursor(request.pageToken, filters: filters, parts: 1, into: &errors)?.first
        try errors.throwIfAny()

        if !scope.isEmpty { _ = try await visibleHousehold(scope, caller: caller) }
        let entries = try await core.store.read { c in
            try Ledger.history(c, scope: scope, user: caller, counterpart: counterpart, before: before, limit: pageSize + 1)
        }
        var response = Finance_V1_ListTransactionsResponse()
        response.entries = Array(entries.prefix(pageSize))
        if entries.count > pageSize, let last = response.entries.last {
            response.nextPageToken = core.pageTokens.make(cursor: [last.transactionId], filters: filters)
        }
        return response
    }

    // MARK: Settling up

    public func getSettleUpPlan(request: Finance_V1_GetSettleUpPlanRequest, context: ServerContext) async throws -> Finance_V1_GetSettleUpPlanResponse
    {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let scope = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        try errors.throwIfAny()
        _ = try await visibleHousehold(scope, caller: caller)
        let (pairs, currency) = try await core.store.read { c -> ([(a: String, b: String, cents: Int64)], String) in
            guard let currency = try Ledger.currency(c, scope: scope) else { return ([], "") }
            return (try Ledger.pairs(c, scope: scope, currency: currency), currency)
        }
        guard let plan = SettleUp.plan(SettleUp.Graph(pairs: pairs)) else {
            throw RPCError(.failedPrecondition, "this household's balances are too large to add up")
        }
        let refs = try await core.refs(plan.flatMap { [$0.payer, $0.payee] })
        var response = Finance_V1_GetSettleUpPlanResponse()
        response.transfers = plan.map { t in
            var transfer = Finance_V1_Transfer()
            transfer.payer = refs[t.payer] ?? FinancePeers.idOnly(t.payer)
            transfer.payee = refs[t.payee] ?? FinancePeers.idOnly(t.payee)
            transfer.amount = Ledger.money(t.cents, currency)
            return transfer
        }
        return response
    }

    public func recordRepayment(request: Finance_V1_RecordRepaymentRequest, context: ServerContext) async throws -> Finance_V1_RecordRepaymentResponse
    {
        let caller = try core.caller(context)
        var errors = FieldErrors()
        let scope = FieldRules.id(request.householdId, field: "household_id", into: &errors)
        let payee = FieldRules.id(request.payeeUserId, field: "payee_user_id", into: &errors)
        if !payee.isEmpty && payee == caller { errors.add("payee_user_id", "must be a housemate, not you") }
        let (cents, currency) = MoneyForm.amount(request.hasAmount ? request.amount : nil, field: "amount", into: &errors)
        var text = FieldRules.text(request.description_p, field: "description", 0...100, into: &errors)
        if text.isEmpty { text = "Repayment" }
        let key = FieldRules.idempotencyKey(request.idempotencyKey, into: &errors)
        try errors.throwIfAny()
        guard let cents, let currency else { throw RPCError(.invalidArgument, "invalid request: amount") }

        let idScope = Self.idempotencyScope(caller), fingerprint = Self.fingerprint("RecordRepayment", request)
        if let earlier = try await core.store.read({ c in
            try c.storedAnswer(scope: idScope, key: key, fingerprint: fingerprint, as: Finance_V1_Transaction.self)
        }) {
            var response = Finance_V1_RecordRepaymentResponse()
            response.transaction = earlier
            response.replayed = true
            return response
        }
        let household = try await visibleHousehold(scope, caller: caller, also: [payee])
        switch household.state(of: payee) {
        case .member, .formerMember: break
        default: throw FieldErrors.single(.invalidArgument, field: "payee_user_id", "is not a member or former member of this household")
        }

        let clock = core.clock
        let description = text
        let (transaction, replayed) = try await core.store.write { tx in
            try tx.idempotent(scope: idScope, key: key, fingerprint: fingerprint, now: clock.nowMilliseconds()) {
                guard let fixed = try Ledger.currency(tx, scope: scope) else {
                    throw FieldErrors.single(.failedPrecondition, field: "amount", "nothing is owed in this household yet")
                }
                try Self.requireHouseholdCurrency(tx, scope: scope, currency: currency)
                let graph = SettleUp.Graph(pairs: try Ledger.pairs(tx, scope: scope, currency: fixed))
                let deltas: [SettleUp.Delta]
                switch SettleUp.repay(graph, SettleUp.Transfer(caller, payee, cents)) {
                case .success(let d): deltas = d
                case .failure(.tooMuch(let maximum)):
                    throw FieldErrors.single(
                        .failedPrecondition, field: "amount",
                        maximum == 0
                            ? "you owe this housemate nothing now (directly or through other housemates): a repayment never moves a balance past zero"
                            : "at most \(MoneyRules.format(maximum, fixed)) can be repaid to this housemate now: a repayment never moves a balance past zero"
                    )
                case .failure(.overflow):
                    throw RPCError(.failedPrecondition, "this household's balances are too large to add up")
                }
                let new = Ledger.NewTransaction(
                    scope: scope, kind: .repayment, currency: fixed, totalCents: cents, splitMode: .unspecified, createdBy: caller,
                    taskID: "", description: description, debts: deltas.map { LedgerChain.Debt($0.debtor, $0.creditor, $0.cents) })
                let t = try Ledger.append(tx, new, clock: clock)
                let affected = Set(deltas.flatMap { [$0.debtor, $0.creditor] }).union([payee]).subtracting([caller])
                try Notifications.enqueue(tx, for: t, recipients: affected.sorted(), actor: caller)
                return t
            }
        }
        var response = Finance_V1_RecordRepaymentResponse()
        response.transaction = transaction
        response.replayed = replayed
        return response
    }
}
