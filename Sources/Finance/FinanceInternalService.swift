import Contracts
import RPCCore
import ServiceKit
import Storage

/// `finance.v1.FinanceInternal`: marketplace settlements from tasks, account erasure from
/// accounts, and ledger verification for operators. Only callers with the service credential
/// reach it (the kit's access policy).
public struct FinanceInternalService: Finance_V1_FinanceInternalService {
    let core: FinanceCore

    public func recordTaskSettlement(
        request: Finance_V1_RecordTaskSettlementRequest, context: ServerContext
    ) async throws -> Finance_V1_RecordTaskSettlementResponse {
        var errors = FieldErrors()
        FieldRules.eventID(request.idempotencyKey, field: "idempotency_key", into: &errors)
        let task = FieldRules.id(request.taskId, field: "task_id", into: &errors)
        let requester = FieldRules.id(request.requesterUserId, field: "requester_user_id", into: &errors)
        let provider = FieldRules.id(request.providerUserId, field: "provider_user_id", into: &errors)
        if !provider.isEmpty && provider == requester { errors.add("provider_user_id", "must differ from requester_user_id") }
        let (cents, currency) = MoneyForm.amount(request.hasAmount ? request.amount : nil, field: "amount", into: &errors)
        let description = FieldRules.text(request.description_p, field: "description", 1...100, into: &errors)
        try errors.throwIfAny()
        guard let cents, let currency else { throw RPCError(.invalidArgument, "invalid request: amount") }

        let clock = core.clock
        let (transaction, replayed) = try await core.store.write { tx -> (Finance_V1_Transaction, Bool) in
            // Exactly once per task: the unique index on task_id guards it even against a
            // concurrent delivery (which then loses its write and is answered as a repeat).
            if let id = try tx.queryOne("SELECT id FROM ledger_transactions WHERE task_id = ?", task)?.get(0, as: String.self),
                let earlier = try Ledger.transaction(tx, id: id)
            {
                let debt = earlier.debts.first
                guard debt?.debtorUserId == requester, debt?.creditorUserId == provider, earlier.total.amountCents == cents,
                    earlier.total.currency == currency
                else {
                    throw FieldErrors.single(
                        .failedPrecondition, field: "task_id",
                        "this task was settled already with other parties or another amount")
                }
                return (earlier, true)
            }
            let new = Ledger.NewTransaction(
                scope: "", kind: .settlement, currency: currency, totalCents: cents, splitMode: .unspecified, createdBy: "",
                taskID: task, description: description, debts: [LedgerChain.Debt(requester, provider, cents)])
            let t = try Ledger.append(tx, new, clock: clock)
            try Notifications.enqueue(tx, for: t, recipients: [requester, provider], actor: "")
            return (t, false)
        }
        core.logger.info(
            replayed ? "settlement replayed" : "task settled",
            metadata: ["task": "\(task)", "transaction": "\(transaction.transactionId)", "event": "\(request.idempotencyKey)"])
        var response = Finance_V1_RecordTaskSettlementResponse()
        response.transaction = transaction
        response.replayed = replayed
        return response
    }

    /// The erased user's own view (idempotency keys) is deleted; the descriptions they wrote are
    /// erased (text and salt; the chain keeps only their commitments, so it still verifies);
    /// their id stays on every entry, shown to counterparts as "Deleted user".
    public func eraseUser(request: Finance_V1_EraseUserRequest, context: ServerContext) async throws -> Finance_V1_EraseUserResponse {
        let now = core.clock.nowMilliseconds()
        let replayed = try await EraseUser.receive(eventID: request.eventId, userID: request.userId, store: core.store) { tx, user in
            try tx.execute("UPDATE ledger_transactions SET description = NULL, description_salt = NULL WHERE created_by = ?", user)
            try tx.execute("INSERT OR IGNORE INTO erased_users (user_id, erased_at) VALUES (?, ?)", user, now)
        }
        var response = Finance_V1_EraseUserResponse()
        response.replayed = replayed
        return response
    }

    public func verifyLedger(request: Finance_V1_VerifyLedgerRequest, context: ServerContext) async throws -> Finance_V1_VerifyLedgerResponse {
        var errors = FieldErrors()
        let scope = FieldRules.id(request.householdId, field: "household_id", required: false, into: &errors)
        try errors.throwIfAny()
        let response = try await core.store.read { c in try Ledger.verify(c, scope: scope) }
        if !response.verified {
            core.logger.error(
                "ledger does not verify",
                metadata: [
                    "scope": "\(scope)", "entry": "\(response.firstBadTransactionId)",
                    "problem": "\(response.problem)",
                ])
        }
        return response
    }
}
